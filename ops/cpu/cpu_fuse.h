/* nabla internal — elementwise chains of a recorded CPU step run as one pass
 * (cpu_fuse.c, for cpu_graph.c).
 *
 * A recorded step such as exp((a + b) * c) is three kernel calls, each a pass
 * over memory. Fused, the chain walks its operands once, in tiles small
 * enough to stay in the L1 cache: every call of the chain runs on one tile
 * before the next tile is read, a value the chain makes and the step never
 * reads again is not written to memory at all, and each call runs the very
 * loop its kernel runs (nb__cpu_unary_loop, nb__cpu_binary_loop, nb__cpu_fill_loop: a fill
 * joins a chain where a debug build poisons each new output), so the
 * chain's results are the same bits as the calls' one by one. */
#ifndef NB_CPU_FUSE_H
#define NB_CPU_FUSE_H

#include "cpu_internal.h"

/* A recorded fill, unary or binary call, as the planner sees it. */
typedef enum nb_cpu_fuse_kind { NB_CPU_FUSE_FILL, NB_CPU_FUSE_UNARY, NB_CPU_FUSE_BINARY } nb_cpu_fuse_kind;
typedef struct nb_cpu_fuse_call {
    nb_cpu_fuse_kind kind;
    int op;       /* nb_unary_op or nb_binary_op */
    double alpha; /* unary: the scalar; fill: the value */
    const nb_view *out, *x, *y; /* x: not for a fill; y: binary only */
    int64_t index; /* the call's position in its recording */
} nb_cpu_fuse_call;

/* Whether the memory under v is dead once the recording's call number last
 * has run: no later call reads it and nothing outside the recording sees it
 * (its tensor was made and let go during the recording, before any call
 * after last was recorded). */
typedef bool (*nb_cpu_fuse_dead_fn)(void *user, const nb_view *v, int64_t last);

typedef struct nb_cpu_fused nb_cpu_fused;

/* Plans the longest head of calls[0 .. n) that runs as one pass: the calls
 * share one shape (no broadcast between them), every one has a kernel for its
 * dtypes, any two of their operands that share memory are the same view, and
 * the chain has at most 32 calls and 12 distinct operands. Returns its length
 * k, 2 <= k <= n, with the plan in *out (the caller frees it with
 * nb__cpu_fused_free), or 0 with *out NULL where fewer than two calls fuse or
 * host memory ran out (the calls then run one by one). Records no error. */
int nb__cpu_fuse_plan(const nb_cpu_fuse_call *calls, int n, nb_cpu_fuse_dead_fn dead, void *user,
                      nb_cpu_fused **out);

/* Runs the planned chain (split across the thread pool as its kernels would
 * be). Cannot fail: the plan's kernels were resolved when it was made. */
void nb__cpu_fused_run(const nb_cpu_fused *f);

/* How many of the chain's results the pass never writes to memory. */
int nb__cpu_fused_elided(const nb_cpu_fused *f);

/* Frees a plan. NULL is ignored. */
void nb__cpu_fused_free(nb_cpu_fused *f);

#endif
