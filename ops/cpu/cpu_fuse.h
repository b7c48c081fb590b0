/* nabla internal — a fused elementwise chain on the CPU (cpu_fuse.c, for
 * cpu_graph.c): the plan of lib/core/fusion.h run in tiles small enough to
 * stay in the L1 cache. Every call of the chain runs on one tile before the
 * next tile is read, an internal result lives in a tile only, and each call
 * runs the very loop its kernel runs (nb__cpu_unary_loop,
 * nb__cpu_binary_loop, nb__cpu_fill_loop: a fill joins a chain where a debug
 * build poisons each new output; nb__cpu_copy_loop for a cast, every dtype
 * pair; nb__cpu_where_loop), so the chain's results are the same bits as the
 * calls' one by one. A chain whose result only the reduce call after it reads
 * runs into that reduction instead (nb__cpu_fuse_plan_reduce): range by range
 * into the scratch the reduction reads (nb__cpu_reduce_fed). */
#ifndef NB_CPU_FUSE_H
#define NB_CPU_FUSE_H

#include "cpu_internal.h"
#include "lib/core/fusion.h"

typedef struct nb_cpu_fused nb_cpu_fused;

/* Plans the chain at the head of calls[0 .. n) (nb__fuse_plan, with the calls
 * the CPU has loops for). Returns its length k >= 2 with the prepared chain
 * in *out (freed with nb__cpu_fused_free), or 0 with *out NULL where fewer
 * than two calls fuse or host memory ran out (the calls then run one by one).
 * Records no error. */
int nb__cpu_fuse_plan(const nb_fuse_call *calls, int n, nb_fuse_dead_fn dead, void *user, nb_cpu_fused **out);

/* Plans all of calls[0 .. n) (n >= 1) as one chain that runs into the
 * reduction op (feed: its out, its x, its position in the recording) right
 * after it: nb__fuse_plan_feed's rules, and nb__cpu_reduce_can_feed's (x
 * dense, a full reduction, rows or columns). The chain then runs range by range into
 * a thread's scratch that the reduction reads through its own splits, lanes
 * and order, so x is never stored and the result has the unfused bits.
 * Returns n with the prepared call in *out (freed with nb__cpu_fused_free),
 * or 0 with *out NULL (then plan with nb__cpu_fuse_plan). Records no error. */
int nb__cpu_fuse_plan_reduce(const nb_fuse_call *calls, int n, nb_reduce_op op, const nb_fuse_feed *feed,
                             nb_fuse_dead_fn dead, void *user, nb_cpu_fused **out);

/* Runs the chain (split across the thread pool as its kernels would be), and
 * the reduction it feeds, if any (split as that kernel would be). Cannot
 * fail: its loops were resolved when it was planned. */
void nb__cpu_fused_run(const nb_cpu_fused *f);

/* Frees a chain. NULL is ignored. */
void nb__cpu_fused_free(nb_cpu_fused *f);

#endif
