/* nabla internal — elementwise chains of a recorded step, planned for fusion
 * on any device (the CPU runs a plan in cache-sized tiles, ops/cpu/cpu_fuse.c;
 * a GPU compiles it into one kernel, gpu/gpu_fuse.c).
 *
 * A recorded step such as exp((a + b) * c) is three kernel calls, each a pass
 * over memory. A plan runs them as one: every element goes through the whole
 * chain before the next is read, and a result the chain makes that nothing
 * reads after it (its tensor was let go) is never written to memory. A chain
 * holds fill, unary, binary, copy (a cast, x.to(dtype)) and where calls. Each
 * call keeps its own formula, dtypes and conversions, so a fused chain
 * computes the same bits as its calls one by one. On the CPU a chain with a
 * result that only the reduction after it (sum, mean, max, min, prod) reads
 * also runs into that reduction, and that result is never stored
 * (nb__fuse_plan_feed); a GPU stores it and reduces as usual. */
#ifndef NB_CORE_FUSION_H
#define NB_CORE_FUSION_H

#include "core.h"

/* The calls a chain holds and their operands, in the step's order (out first):
 * fill (out), unary (out, x), binary (out, x, y), copy (out, x: x converted
 * to out's dtype, which may differ) and where (out, cond, x, y: cond ? x : y,
 * cond NB_BOOL or NB_U8). */
typedef enum nb_fuse_kind { NB_FUSE_FILL, NB_FUSE_UNARY, NB_FUSE_BINARY, NB_FUSE_COPY, NB_FUSE_WHERE } nb_fuse_kind;

/* A recorded fill, unary, binary, copy or where call. */
typedef struct nb_fuse_call {
    nb_fuse_kind kind;
    int op;       /* nb_unary_op or nb_binary_op */
    double alpha; /* unary: the scalar; fill: the value */
    const nb_view *out, *x, *y; /* x: not for a fill; y: binary and where only */
    int64_t index; /* the call's position in its recording */
    const nb_view *cond; /* where only */
} nb_fuse_call;

enum {
    NB_FUSE_MAX_CALLS = 32,
    NB_FUSE_MAX_SLOTS = 12, /* distinct operands of a chain */
};

/* A distinct operand of a chain. */
typedef struct nb_fuse_slot {
    nb_view v;
    char *lo, *hi;    /* the bytes it spans */
    bool first_write; /* the chain writes it before it reads it */
    bool internal;    /* never read or written in memory: it lives in the chain */
} nb_fuse_slot;

typedef struct nb_fuse_step {
    nb_fuse_kind kind;
    int op;
    double alpha;
    int n_ops;   /* 1 (fill), 2 (unary, copy), 3 (binary) or 4 (where) */
    int slot[4]; /* the operands' slots in nb_fuse_kind's order, out first */
} nb_fuse_step;

typedef struct nb_fuse_plan {
    int n_steps, n_slots, n_internal;
    int fed; /* the slot a reduction reads as the chain makes it (nb__fuse_plan_feed), or -1 */
    nb_fuse_step steps[NB_FUSE_MAX_CALLS];
    nb_fuse_slot slots[NB_FUSE_MAX_SLOTS];
} nb_fuse_plan;

/* Whether the device can run c inside a chain (its kernel exists for c's ops
 * and dtypes). */
typedef bool (*nb_fuse_supported_fn)(void *user, const nb_fuse_call *c);
/* Whether the memory under v is dead once the recording's call number last
 * has run: nothing reads it afterwards and nothing outside the step sees it. */
typedef bool (*nb_fuse_dead_fn)(void *user, const nb_view *v, int64_t last);

/* Plans the longest head of calls[0 .. n) that runs as one chain: the calls
 * share one shape and at least one element (no broadcast between them; an
 * operand may be broadcast into it), every one is supported, any two of their
 * operands that share memory are the same view (in-place calls are), and the
 * chain has at most NB_FUSE_MAX_CALLS calls and max_slots distinct operands
 * (<= NB_FUSE_MAX_SLOTS). A result the chain writes before reading it and
 * that dead says is dead after the chain's last call is internal, except
 * that of the results the chain writes first one at least stays in memory. Returns the chain's length k
 * (the plan in *out) when k >= 2, else 0. Records no error. */
int nb__fuse_plan(const nb_fuse_call *calls, int n, int max_slots, nb_fuse_supported_fn supported,
                  nb_fuse_dead_fn dead, void *user, nb_fuse_plan *out);

/* Whether a and b (either may be NULL: no) are the same elements of the same
 * memory in the same order: one dtype and shape, the strides of dims longer
 * than 1 equal. */
bool nb__fuse_same_place(const nb_view *a, const nb_view *b);

/* A reduction right after a chain, reading x (a result of the chain) and
 * writing out: the recording's call number index. */
typedef struct nb_fuse_feed {
    const nb_view *out, *x;
    int64_t index;
} nb_fuse_feed;

/* Plans all of calls[0 .. n) (n >= 1) as one chain whose result feed->x
 * goes straight into the reduction after it instead of to memory: the device
 * runs the chain range by range into a scratch the reduction reads (the CPU,
 * ops/cpu/cpu_fuse.c; a GPU does not: it plans with nb__fuse_plan and stores
 * the last result). Every call must join the chain (nb__fuse_plan's rules),
 * x must be the same view as a result the chain writes before reading it,
 * dense (row-major, no gaps) and dead after the reduction, and the
 * reduction's out must share no memory with any operand of the chain. The
 * other results are internal as nb__fuse_plan says, and none need stay in
 * memory. Returns n with p->fed the slot of x, else 0. Whether the device
 * can run that reduction fed is the caller's question. Records no error. */
int nb__fuse_plan_feed(const nb_fuse_call *calls, int n, int max_slots, nb_fuse_supported_fn supported,
                       nb_fuse_dead_fn dead, void *user, const nb_fuse_feed *feed, nb_fuse_plan *p);

#endif
