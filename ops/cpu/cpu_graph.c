/* Recording a step on a CPU device (the CPU's nb_graph_kernels, for
 * lib/graph): the CPU's answer to a CUDA graph.
 *
 * While a step is recorded, the device's table is swapped for one whose
 * kernel entries append the call, its arguments copied, to a list instead of
 * running it; a replay runs the list on the calling thread, without the ops'
 * checks, allocations, tape or scopes. So on the CPU, as on a GPU, the step's
 * host code runs only at capture, and the hooks of lib/core/capture.h (device
 * numbers refreshed before each replay, variables bound to the recording) do
 * the work a rerun would have done.
 *
 * Memory: the list writes and reads the blocks it found, so they must stay
 * the graph's. Every block freed during the recording is kept until the
 * graph is destroyed; a block allocated during the recording and still alive
 * after it (an output, a variable's fresh value) is registered, and freeing it
 * while the graph lives hands it to the graph (nb__cpu_graph_keeps, asked by
 * nb__cpu_free), which frees it when it is destroyed.
 *
 * The contract of nb_graph_kernels holds: only the recording thread uses the
 * device while it is recorded (the table swap is seen by it alone in
 * practice); a call from another thread, or on another device, runs as usual. */
#include "cpu_fuse.h"
#include "cpu_internal.h"
#include "lib/core/capture.h"
#include "lib/core/optim_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct call call;
typedef nb_status (*call_fn)(nb_device *dev, const call *c);
struct call {
    call *next;
    call_fn run;
    void (*drop)(call *c); /* frees what the call owns besides itself; NULL: nothing */
    int64_t index;         /* its position in the recording */
};

typedef struct block {
    void *p;
    size_t n;
    int64_t at; /* freed blocks: how many calls were recorded before the free */
} block;

typedef struct blocks {
    block *at;
    size_t n, cap;
} blocks;

typedef struct cpu_rec {
    nb_device *dev;
    const nb_backend *table; /* the device's table before the swap */
    call *head, **tail;
    int64_t n_calls;
    blocks made;  /* allocated during the recording */
    blocks freed; /* freed during the recording: kept until destroy */
    bool failed;  /* a call could not be recorded: the error is recorded */
} cpu_rec;

static _Thread_local cpu_rec *tl_rec;

static bool blocks_add(blocks *b, void *p, size_t n)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        block *at = realloc(b->at, cap * sizeof *at);
        if (!at)
            return false;
        b->at = at;
        b->cap = cap;
    }
    b->at[b->n++] = (block){p, n, 0};
    return true;
}

/* ---- blocks alive after the recording, while their graph lives --------------------- */

typedef struct kept {
    void *p;
    size_t n;
    const cpu_rec *owner;
    bool freed; /* its owner freed it: the graph frees it when destroyed */
} kept;

static pthread_mutex_t g_kept_lock = PTHREAD_MUTEX_INITIALIZER;
static kept *g_kept;
static size_t g_n_kept, g_cap_kept;

/* Every nb__cpu_free asks whether a graph keeps its block. While any graph
 * lived, asking under the lock (a scan of the list) made a one-element eager
 * add half as slow again with 256 blocks kept, and made the replicas' threads
 * queue on one lock. So a filter of the kept addresses, one bit per address
 * hash, is read first without the lock: a clear bit (the common case) means
 * no graph keeps the block; a set bit may be another's, and the list decides.
 * Bits are set, under the lock, before a block is registered, and when a
 * graph lets go the filter is rebuilt from the blocks left, whose bits were
 * set before and stay set, so a kept block's bit never reads clear. */
#define FILTER_BITS_LOG2 13
#define FILTER_WORDS ((1u << FILTER_BITS_LOG2) / 64)
static _Atomic uint64_t g_filter[FILTER_WORDS];

static size_t filter_bit(const void *p)
{
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> (64 - FILTER_BITS_LOG2));
}

bool nb__cpu_graph_keeps(void *p)
{
    size_t b = filter_bit(p);
    if (!(atomic_load_explicit(&g_filter[b / 64], memory_order_acquire) & ((uint64_t)1 << (b % 64))))
        return false;
    bool keeps = false;
    pthread_mutex_lock(&g_kept_lock);
    for (size_t i = 0; i < g_n_kept; i++) {
        if (g_kept[i].p == p && !g_kept[i].freed) {
            g_kept[i].freed = true;
            keeps = true;
            break;
        }
    }
    pthread_mutex_unlock(&g_kept_lock);
    return keeps;
}

/* Registers the blocks r made and did not free; false when out of memory
 * (then none is registered). */
static bool keep_alive(const cpu_rec *r)
{
    pthread_mutex_lock(&g_kept_lock);
    size_t need = g_n_kept + r->made.n;
    bool ok = true;
    if (need > g_cap_kept) {
        size_t cap = g_cap_kept ? g_cap_kept : 64;
        while (cap < need)
            cap *= 2;
        kept *k = realloc(g_kept, cap * sizeof *k);
        if (k) {
            g_kept = k;
            g_cap_kept = cap;
        } else {
            ok = false;
        }
    }
    for (size_t i = 0; ok && i < r->made.n; i++) {
        bool freed = false;
        for (size_t j = 0; j < r->freed.n && !freed; j++)
            freed = r->freed.at[j].p == r->made.at[i].p;
        if (!freed) {
            size_t b = filter_bit(r->made.at[i].p);
            atomic_fetch_or_explicit(&g_filter[b / 64], (uint64_t)1 << (b % 64), memory_order_release);
            g_kept[g_n_kept++] = (kept){r->made.at[i].p, r->made.at[i].n, r, false};
        }
    }
    pthread_mutex_unlock(&g_kept_lock);
    return ok;
}

/* Takes r's registered blocks out: those their owners freed are freed now. */
static void let_go(const cpu_rec *r)
{
    blocks to_free = {0};
    pthread_mutex_lock(&g_kept_lock);
    size_t w = 0;
    for (size_t i = 0; i < g_n_kept; i++) {
        if (g_kept[i].owner != r)
            g_kept[w++] = g_kept[i];
        else if (g_kept[i].freed && !blocks_add(&to_free, g_kept[i].p, g_kept[i].n))
            g_kept[w++] = g_kept[i]; /* no memory to list it: stays kept (leaks) rather than be lost */
    }
    g_n_kept = w;
    uint64_t filter[FILTER_WORDS] = {0};
    for (size_t i = 0; i < g_n_kept; i++) {
        size_t b = filter_bit(g_kept[i].p);
        filter[b / 64] |= (uint64_t)1 << (b % 64);
    }
    for (size_t i = 0; i < FILTER_WORDS; i++) /* a subset of each word's bits: the kept ones stay set */
        atomic_store_explicit(&g_filter[i], filter[i], memory_order_release);
    pthread_mutex_unlock(&g_kept_lock);
    for (size_t i = 0; i < to_free.n; i++)
        nb__cpu_free(r->dev, to_free.at[i].p, to_free.at[i].n);
    free(to_free.at);
}

/* ---- the list -------------------------------------------------------------------------- */

/* A call of size bytes appended to the recording of dev, or NULL when dev is
 * not being recorded by this thread (*eager: run it now) or out of memory. */
static void *append(nb_device *dev, size_t size, call_fn run, bool *eager)
{
    cpu_rec *r = tl_rec;
    *eager = !r || r->dev != dev;
    if (*eager)
        return NULL;
    call *c = calloc(1, size);
    if (!c) {
        r->failed = true;
        nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory recording a kernel on %s", dev->name);
        return NULL;
    }
    c->run = run;
    c->index = r->n_calls;
    *r->tail = c;
    r->tail = &c->next;
    r->n_calls++;
    return c;
}

/* The usual table (what a call runs with). */
#define CPU (&nb__cpu_backend)

/* A view argument, copied; NULL where the entry allows it. */
typedef struct vw {
    nb_view v;
    bool set;
} vw;

static vw vw_of(const nb_view *p)
{
    vw o = {.set = p != NULL};
    if (p)
        o.v = *p;
    return o;
}

#define V(o) ((o).set ? &(o).v : NULL)

/* Each entry: its arguments, its replay (run_*) and its recording wrapper
 * (rec_*), which runs the call as usual when this thread records no step on
 * dev. Views and descriptors are copied; pointers to device memory kept;
 * op names are static strings. */
#define RECORD(T, run, eager_call)                      \
    bool eager;                                         \
    T *a = append(dev, sizeof *a, run, &eager);         \
    if (eager)                                          \
        return eager_call;                              \
    if (!a)                                             \
        return NB_ERR_OUT_OF_MEMORY

typedef struct { call h; vw out; double value; } fill_call;
static nb_status run_fill(nb_device *dev, const call *c)
{
    const fill_call *a = (const fill_call *)c;
    return CPU->fill(dev, V(a->out), a->value);
}
static nb_status rec_fill(nb_device *dev, const nb_view *out, double value)
{
    RECORD(fill_call, run_fill, CPU->fill(dev, out, value));
    a->out = vw_of(out), a->value = value;
    return NB_OK;
}

typedef struct { call h; vw out; double start, step; } arange_call;
static nb_status run_arange(nb_device *dev, const call *c)
{
    const arange_call *a = (const arange_call *)c;
    return CPU->arange(dev, V(a->out), a->start, a->step);
}
static nb_status rec_arange(nb_device *dev, const nb_view *out, double start, double step)
{
    RECORD(arange_call, run_arange, CPU->arange(dev, out, start, step));
    a->out = vw_of(out), a->start = start, a->step = step;
    return NB_OK;
}

typedef struct {
    call h;
    vw out;
    nb_random_dist dist;
    double lo, hi;
    uint64_t seed;
    const double *seed_add;
} random_call;
static nb_status run_random(nb_device *dev, const call *c)
{
    const random_call *a = (const random_call *)c;
    return CPU->random(dev, V(a->out), a->dist, a->lo, a->hi, a->seed, a->seed_add);
}
static nb_status rec_random(nb_device *dev, const nb_view *out, nb_random_dist dist, double lo, double hi,
                            uint64_t seed, const double *seed_add)
{
    RECORD(random_call, run_random, CPU->random(dev, out, dist, lo, hi, seed, seed_add));
    a->out = vw_of(out), a->dist = dist, a->lo = lo, a->hi = hi, a->seed = seed, a->seed_add = seed_add;
    return NB_OK;
}

typedef struct { call h; vw out, in; } copy_call;
static nb_status run_copy(nb_device *dev, const call *c)
{
    const copy_call *a = (const copy_call *)c;
    return CPU->copy(dev, V(a->out), V(a->in));
}
static nb_status rec_copy(nb_device *dev, const nb_view *out, const nb_view *in)
{
    RECORD(copy_call, run_copy, CPU->copy(dev, out, in));
    a->out = vw_of(out), a->in = vw_of(in);
    return NB_OK;
}

typedef struct { call h; nb_unary_op op; vw out, x; double alpha; } unary_call;
static nb_status run_unary(nb_device *dev, const call *c)
{
    const unary_call *a = (const unary_call *)c;
    return CPU->unary(dev, a->op, V(a->out), V(a->x), a->alpha);
}
static nb_status rec_unary(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x, double alpha)
{
    RECORD(unary_call, run_unary, CPU->unary(dev, op, out, x, alpha));
    a->op = op, a->out = vw_of(out), a->x = vw_of(x), a->alpha = alpha;
    return NB_OK;
}

typedef struct { call h; nb_binary_op op; vw out, x, y; } binary_call;
static nb_status run_binary(nb_device *dev, const call *c)
{
    const binary_call *a = (const binary_call *)c;
    return CPU->binary(dev, a->op, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_binary(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *x, const nb_view *y)
{
    RECORD(binary_call, run_binary, CPU->binary(dev, op, out, x, y));
    a->op = op, a->out = vw_of(out), a->x = vw_of(x), a->y = vw_of(y);
    return NB_OK;
}

typedef struct { call h; vw out, cond, x, y; } where_call;
static nb_status run_where(nb_device *dev, const call *c)
{
    const where_call *a = (const where_call *)c;
    return CPU->where(dev, V(a->out), V(a->cond), V(a->x), V(a->y));
}
static nb_status rec_where(nb_device *dev, const nb_view *out, const nb_view *cond, const nb_view *x,
                           const nb_view *y)
{
    RECORD(where_call, run_where, CPU->where(dev, out, cond, x, y));
    a->out = vw_of(out), a->cond = vw_of(cond), a->x = vw_of(x), a->y = vw_of(y);
    return NB_OK;
}

typedef struct { call h; nb_reduce_op op; vw out, x; } reduce_call;
static nb_status run_reduce(nb_device *dev, const call *c)
{
    const reduce_call *a = (const reduce_call *)c;
    return CPU->reduce(dev, a->op, V(a->out), V(a->x));
}
static nb_status rec_reduce(nb_device *dev, nb_reduce_op op, const nb_view *out, const nb_view *x)
{
    RECORD(reduce_call, run_reduce, CPU->reduce(dev, op, out, x));
    a->op = op, a->out = vw_of(out), a->x = vw_of(x);
    return NB_OK;
}

typedef struct { call h; bool is_max; vw out, x; int axis; } arg_reduce_call;
static nb_status run_arg_reduce(nb_device *dev, const call *c)
{
    const arg_reduce_call *a = (const arg_reduce_call *)c;
    return CPU->arg_reduce(dev, a->is_max, V(a->out), V(a->x), a->axis);
}
static nb_status rec_arg_reduce(nb_device *dev, bool is_max, const nb_view *out, const nb_view *x, int axis)
{
    RECORD(arg_reduce_call, run_arg_reduce, CPU->arg_reduce(dev, is_max, out, x, axis));
    a->is_max = is_max, a->out = vw_of(out), a->x = vw_of(x), a->axis = axis;
    return NB_OK;
}

typedef struct { call h; vw out, x; int axis; bool exclusive, reverse; } cumsum_call;
static nb_status run_cumsum(nb_device *dev, const call *c)
{
    const cumsum_call *a = (const cumsum_call *)c;
    return CPU->cumsum(dev, V(a->out), V(a->x), a->axis, a->exclusive, a->reverse);
}
static nb_status rec_cumsum(nb_device *dev, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                            bool reverse)
{
    RECORD(cumsum_call, run_cumsum, CPU->cumsum(dev, out, x, axis, exclusive, reverse));
    a->out = vw_of(out), a->x = vw_of(x), a->axis = axis, a->exclusive = exclusive, a->reverse = reverse;
    return NB_OK;
}

typedef struct { call h; vw out, x, y; } matmul_call;
static nb_status run_matmul(nb_device *dev, const call *c)
{
    const matmul_call *a = (const matmul_call *)c;
    return CPU->matmul(dev, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_matmul(nb_device *dev, const nb_view *out, const nb_view *x, const nb_view *y)
{
    RECORD(matmul_call, run_matmul, CPU->matmul(dev, out, x, y));
    a->out = vw_of(out), a->x = vw_of(x), a->y = vw_of(y);
    return NB_OK;
}

typedef struct { call h; bool log; vw out, x; } softmax_call;
static nb_status run_softmax(nb_device *dev, const call *c)
{
    const softmax_call *a = (const softmax_call *)c;
    return CPU->softmax(dev, a->log, V(a->out), V(a->x));
}
static nb_status rec_softmax(nb_device *dev, bool log, const nb_view *out, const nb_view *x)
{
    RECORD(softmax_call, run_softmax, CPU->softmax(dev, log, out, x));
    a->log = log, a->out = vw_of(out), a->x = vw_of(x);
    return NB_OK;
}

typedef struct { call h; vw v[5]; } xent_call;
static nb_status run_softmax_xent(nb_device *dev, const call *c)
{
    const xent_call *a = (const xent_call *)c;
    return CPU->softmax_xent(dev, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]));
}
static nb_status rec_softmax_xent(nb_device *dev, const nb_view *loss, const nb_view *stats, const nb_view *x,
                                  const nb_view *labels)
{
    RECORD(xent_call, run_softmax_xent, CPU->softmax_xent(dev, loss, stats, x, labels));
    a->v[0] = vw_of(loss), a->v[1] = vw_of(stats), a->v[2] = vw_of(x), a->v[3] = vw_of(labels);
    return NB_OK;
}
static nb_status run_softmax_xent_grad(nb_device *dev, const call *c)
{
    const xent_call *a = (const xent_call *)c;
    return CPU->softmax_xent_grad(dev, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]), V(a->v[4]));
}
static nb_status rec_softmax_xent_grad(nb_device *dev, const nb_view *dx, const nb_view *g, const nb_view *x,
                                       const nb_view *stats, const nb_view *labels)
{
    RECORD(xent_call, run_softmax_xent_grad, CPU->softmax_xent_grad(dev, dx, g, x, stats, labels));
    a->v[0] = vw_of(dx), a->v[1] = vw_of(g), a->v[2] = vw_of(x), a->v[3] = vw_of(stats), a->v[4] = vw_of(labels);
    return NB_OK;
}

typedef struct { call h; const char *op; vw out, x, y; } indexed_call;
static nb_status run_gather(nb_device *dev, const call *c)
{
    const indexed_call *a = (const indexed_call *)c;
    return CPU->gather(dev, a->op, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_gather(nb_device *dev, const char *op, const nb_view *out, const nb_view *params,
                            const nb_view *indices)
{
    RECORD(indexed_call, run_gather, CPU->gather(dev, op, out, params, indices));
    a->op = op, a->out = vw_of(out), a->x = vw_of(params), a->y = vw_of(indices);
    return NB_OK;
}
static nb_status run_scatter_add(nb_device *dev, const call *c)
{
    const indexed_call *a = (const indexed_call *)c;
    return CPU->scatter_add(dev, a->op, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_scatter_add(nb_device *dev, const char *op, const nb_view *out, const nb_view *indices,
                                 const nb_view *updates)
{
    RECORD(indexed_call, run_scatter_add, CPU->scatter_add(dev, op, out, indices, updates));
    a->op = op, a->out = vw_of(out), a->x = vw_of(indices), a->y = vw_of(updates);
    return NB_OK;
}

typedef struct { call h; vw out, indices; double on, off; } one_hot_call;
static nb_status run_one_hot(nb_device *dev, const call *c)
{
    const one_hot_call *a = (const one_hot_call *)c;
    return CPU->one_hot(dev, V(a->out), V(a->indices), a->on, a->off);
}
static nb_status rec_one_hot(nb_device *dev, const nb_view *out, const nb_view *indices, double on, double off)
{
    RECORD(one_hot_call, run_one_hot, CPU->one_hot(dev, out, indices, on, off));
    a->out = vw_of(out), a->indices = vw_of(indices), a->on = on, a->off = off;
    return NB_OK;
}

/* Checked at each replay: a replay whose indices are out of range fails. */
typedef struct { call h; const char *op; vw indices; int64_t limit; } check_indices_call;
static nb_status run_check_indices(nb_device *dev, const call *c)
{
    const check_indices_call *a = (const check_indices_call *)c;
    return CPU->check_indices(dev, a->op, V(a->indices), a->limit);
}
static nb_status rec_check_indices(nb_device *dev, const char *op, const nb_view *indices, int64_t limit)
{
    RECORD(check_indices_call, run_check_indices, CPU->check_indices(dev, op, indices, limit));
    a->op = op, a->indices = vw_of(indices), a->limit = limit;
    return NB_OK;
}

typedef struct { call h; nb_pool2d_desc d; vw out, x, y; } pool_call;
static nb_status run_max_pool2d(nb_device *dev, const call *c)
{
    const pool_call *a = (const pool_call *)c;
    return CPU->max_pool2d(dev, &a->d, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_max_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                const nb_view *sel)
{
    RECORD(pool_call, run_max_pool2d, CPU->max_pool2d(dev, d, out, x, sel));
    a->d = *d, a->out = vw_of(out), a->x = vw_of(x), a->y = vw_of(sel);
    return NB_OK;
}
static nb_status run_max_pool2d_grad(nb_device *dev, const call *c)
{
    const pool_call *a = (const pool_call *)c;
    return CPU->max_pool2d_grad(dev, &a->d, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_max_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out,
                                     const nb_view *x, const nb_view *dy)
{
    RECORD(pool_call, run_max_pool2d_grad, CPU->max_pool2d_grad(dev, d, out, x, dy));
    a->d = *d, a->out = vw_of(out), a->x = vw_of(x), a->y = vw_of(dy);
    return NB_OK;
}
static nb_status run_avg_pool2d(nb_device *dev, const call *c)
{
    const pool_call *a = (const pool_call *)c;
    return CPU->avg_pool2d(dev, &a->d, V(a->out), V(a->x));
}
static nb_status rec_avg_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x)
{
    RECORD(pool_call, run_avg_pool2d, CPU->avg_pool2d(dev, d, out, x));
    a->d = *d, a->out = vw_of(out), a->x = vw_of(x);
    return NB_OK;
}
static nb_status run_avg_pool2d_grad(nb_device *dev, const call *c)
{
    const pool_call *a = (const pool_call *)c;
    return CPU->avg_pool2d_grad(dev, &a->d, V(a->out), V(a->x));
}
static nb_status rec_avg_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy)
{
    RECORD(pool_call, run_avg_pool2d_grad, CPU->avg_pool2d_grad(dev, d, out, dy));
    a->d = *d, a->out = vw_of(out), a->x = vw_of(dy);
    return NB_OK;
}

typedef struct { call h; int64_t shape[3]; vw v[6]; } channel_call;
static nb_status run_channel_moments(nb_device *dev, const call *c)
{
    const channel_call *a = (const channel_call *)c;
    return CPU->channel_moments(dev, a->shape, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]), V(a->v[4]));
}
static nb_status rec_channel_moments(nb_device *dev, const int64_t shape[3], const nb_view *sum,
                                     const nb_view *moment, const nb_view *x, const nb_view *y,
                                     const nb_view *center)
{
    RECORD(channel_call, run_channel_moments, CPU->channel_moments(dev, shape, sum, moment, x, y, center));
    memcpy(a->shape, shape, sizeof a->shape);
    a->v[0] = vw_of(sum), a->v[1] = vw_of(moment), a->v[2] = vw_of(x), a->v[3] = vw_of(y), a->v[4] = vw_of(center);
    return NB_OK;
}
static nb_status run_channel_affine(nb_device *dev, const call *c)
{
    const channel_call *a = (const channel_call *)c;
    return CPU->channel_affine(dev, a->shape, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]), V(a->v[4]),
                               V(a->v[5]));
}
static nb_status rec_channel_affine(nb_device *dev, const int64_t shape[3], const nb_view *out, const nb_view *x,
                                    const nb_view *s, const nb_view *y, const nb_view *t, const nb_view *u)
{
    RECORD(channel_call, run_channel_affine, CPU->channel_affine(dev, shape, out, x, s, y, t, u));
    memcpy(a->shape, shape, sizeof a->shape);
    a->v[0] = vw_of(out), a->v[1] = vw_of(x), a->v[2] = vw_of(s), a->v[3] = vw_of(y), a->v[4] = vw_of(t);
    a->v[5] = vw_of(u);
    return NB_OK;
}

typedef struct { call h; int64_t rows, D; vw v[7]; double epsilon; } rows_call;
static nb_status run_layer_norm_rows(nb_device *dev, const call *c)
{
    const rows_call *a = (const rows_call *)c;
    return CPU->layer_norm_rows(dev, a->rows, a->D, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]), V(a->v[4]),
                                V(a->v[5]), a->epsilon);
}
static nb_status rec_layer_norm_rows(nb_device *dev, int64_t rows, int64_t D, const nb_view *out,
                                     const nb_view *mean, const nb_view *rstd, const nb_view *x,
                                     const nb_view *gamma, const nb_view *beta, double epsilon)
{
    RECORD(rows_call, run_layer_norm_rows,
           CPU->layer_norm_rows(dev, rows, D, out, mean, rstd, x, gamma, beta, epsilon));
    a->rows = rows, a->D = D, a->epsilon = epsilon;
    a->v[0] = vw_of(out), a->v[1] = vw_of(mean), a->v[2] = vw_of(rstd), a->v[3] = vw_of(x);
    a->v[4] = vw_of(gamma), a->v[5] = vw_of(beta);
    return NB_OK;
}
static nb_status run_layer_norm_rows_grad(nb_device *dev, const call *c)
{
    const rows_call *a = (const rows_call *)c;
    return CPU->layer_norm_rows_grad(dev, a->rows, a->D, V(a->v[0]), V(a->v[1]), V(a->v[2]), V(a->v[3]),
                                     V(a->v[4]), V(a->v[5]), V(a->v[6]));
}
static nb_status rec_layer_norm_rows_grad(nb_device *dev, int64_t rows, int64_t D, const nb_view *dx,
                                          const nb_view *dgamma, const nb_view *dbeta, const nb_view *g,
                                          const nb_view *x, const nb_view *rstd, const nb_view *gamma)
{
    RECORD(rows_call, run_layer_norm_rows_grad,
           CPU->layer_norm_rows_grad(dev, rows, D, dx, dgamma, dbeta, g, x, rstd, gamma));
    a->rows = rows, a->D = D;
    a->v[0] = vw_of(dx), a->v[1] = vw_of(dgamma), a->v[2] = vw_of(dbeta), a->v[3] = vw_of(g);
    a->v[4] = vw_of(x), a->v[5] = vw_of(rstd), a->v[6] = vw_of(gamma);
    return NB_OK;
}

typedef struct { call h; nb_conv2d_desc d; vw out, x, y; } conv_call;
static nb_status run_conv2d(nb_device *dev, const call *c)
{
    const conv_call *a = (const conv_call *)c;
    return CPU->conv2d(dev, &a->d, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_conv2d(nb_device *dev, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                            const nb_view *w)
{
    RECORD(conv_call, run_conv2d, CPU->conv2d(dev, d, y, x, w));
    a->d = *d, a->out = vw_of(y), a->x = vw_of(x), a->y = vw_of(w);
    return NB_OK;
}
static nb_status run_conv2d_backward_data(nb_device *dev, const call *c)
{
    const conv_call *a = (const conv_call *)c;
    return CPU->conv2d_backward_data(dev, &a->d, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_conv2d_backward_data(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dx,
                                          const nb_view *dy, const nb_view *w)
{
    RECORD(conv_call, run_conv2d_backward_data, CPU->conv2d_backward_data(dev, d, dx, dy, w));
    a->d = *d, a->out = vw_of(dx), a->x = vw_of(dy), a->y = vw_of(w);
    return NB_OK;
}
static nb_status run_conv2d_backward_filter(nb_device *dev, const call *c)
{
    const conv_call *a = (const conv_call *)c;
    return CPU->conv2d_backward_filter(dev, &a->d, V(a->out), V(a->x), V(a->y));
}
static nb_status rec_conv2d_backward_filter(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dw,
                                            const nb_view *x, const nb_view *dy)
{
    RECORD(conv_call, run_conv2d_backward_filter, CPU->conv2d_backward_filter(dev, d, dw, x, dy));
    a->d = *d, a->out = vw_of(dw), a->x = vw_of(x), a->y = vw_of(dy);
    return NB_OK;
}

/* ---- the fused optimizer updates ---- */

typedef struct { call h; vw param, grad, slot1, slot2; nb_update_params p; } update_call;
static nb_status run_sgd_update(nb_device *dev, const call *c)
{
    const update_call *a = (const update_call *)c;
    return CPU->optim->sgd_update(dev, V(a->param), V(a->grad), V(a->slot1), &a->p);
}
static nb_status rec_sgd_update(nb_device *dev, const nb_view *param, const nb_view *grad, const nb_view *slot1,
                                const nb_update_params *p)
{
    RECORD(update_call, run_sgd_update, CPU->optim->sgd_update(dev, param, grad, slot1, p));
    a->param = vw_of(param), a->grad = vw_of(grad), a->slot1 = vw_of(slot1), a->p = *p;
    return NB_OK;
}
static nb_status run_adam_update(nb_device *dev, const call *c)
{
    const update_call *a = (const update_call *)c;
    return CPU->optim->adam_update(dev, V(a->param), V(a->grad), V(a->slot1), V(a->slot2), &a->p);
}
static nb_status rec_adam_update(nb_device *dev, const nb_view *param, const nb_view *grad, const nb_view *slot1,
                                 const nb_view *slot2, const nb_update_params *p)
{
    RECORD(update_call, run_adam_update, CPU->optim->adam_update(dev, param, grad, slot1, slot2, p));
    a->param = vw_of(param), a->grad = vw_of(grad), a->slot1 = vw_of(slot1), a->slot2 = vw_of(slot2), a->p = *p;
    return NB_OK;
}

typedef struct { call h; double *state, *count; const double *check; nb_scaler_params p; } scaler_call;
static nb_status run_scaler_update(nb_device *dev, const call *c)
{
    const scaler_call *a = (const scaler_call *)c;
    return CPU->optim->scaler_update(dev, a->state, a->check, a->count, &a->p);
}
static nb_status rec_scaler_update(nb_device *dev, double *state, const double *check, double *count,
                                   const nb_scaler_params *p)
{
    RECORD(scaler_call, run_scaler_update, CPU->optim->scaler_update(dev, state, check, count, p));
    a->state = state, a->check = check, a->count = count, a->p = *p;
    return NB_OK;
}

/* ---- memory while recording ---- */

static void *rec_alloc(nb_device *dev, size_t nbytes)
{
    void *p = nb__cpu_alloc(dev, nbytes);
    cpu_rec *r = tl_rec;
    if (p && r && r->dev == dev && !blocks_add(&r->made, p, nbytes)) {
        nb__cpu_free(dev, p, nbytes);
        r->failed = true;
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory recording on %s", dev->name);
    }
    return p;
}

/* Kept until the graph goes: a recorded call may still write it. */
static void rec_free(nb_device *dev, void *ptr, size_t nbytes)
{
    cpu_rec *r = tl_rec;
    if (!ptr)
        return;
    if (!r || r->dev != dev) {
        nb__cpu_free(dev, ptr, nbytes);
        return;
    }
    if (blocks_add(&r->freed, ptr, nbytes)) {
        r->freed.at[r->freed.n - 1].at = r->n_calls;
    } else {
        /* Out of host memory to keep it: leaked rather than handed out again. */
        r->failed = true;
        nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory recording on %s", dev->name);
    }
}

/* Host data copied in now (a replay copies the same bytes again). */
typedef struct { call h; void *dst; size_t n; unsigned char bytes[]; } upload_call;
static nb_status run_upload(nb_device *dev, const call *c)
{
    const upload_call *a = (const upload_call *)c;
    return CPU->copy_from_host(dev, a->dst, a->bytes, a->n);
}
static nb_status rec_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    bool eager;
    if (nbytes > SIZE_MAX - sizeof(upload_call))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: %zu bytes from the host is too many", nbytes);
    upload_call *a = append(dev, sizeof *a + nbytes, run_upload, &eager);
    if (eager)
        return CPU->copy_from_host(dev, dst, src, nbytes);
    if (!a)
        return NB_ERR_OUT_OF_MEMORY;
    a->dst = dst, a->n = nbytes;
    memcpy(a->bytes, src, nbytes);
    return NB_OK;
}

/* Reads to the host and copies from other devices cannot be repeated by a
 * replay (the capture rules refuse them before they get here). */
static nb_status rec_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    cpu_rec *r = tl_rec;
    if (!r || r->dev != dev)
        return CPU->copy_to_host(dev, dst, src, nbytes);
    r->failed = true;
    return nb__fail(NB_ERR_UNSUPPORTED, "graph capture: a read to the host cannot be recorded on %s", dev->name);
}

static nb_status rec_copy_between(nb_device *dev, void *dst, nb_device *src_dev, const void *src, size_t nbytes)
{
    cpu_rec *r = tl_rec;
    if (!r || (r->dev != dev && r->dev != src_dev))
        return CPU->copy_between(dev, dst, src_dev, src, nbytes);
    r->failed = true;
    return nb__fail(NB_ERR_UNSUPPORTED, "graph capture: a copy between %s and %s cannot be recorded on %s",
                    src_dev ? src_dev->name : "?", dev->name, r->dev->name);
}

/* ---- the table while recording --------------------------------------------------------- */

static nb_backend g_table;
static nb_optim_kernels g_optim;
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    g_table = nb__cpu_backend;
    g_optim = (nb_optim_kernels){
        .sgd_update = rec_sgd_update, .adam_update = rec_adam_update, .scaler_update = rec_scaler_update,
        /* these call the single entries through the table: recorded one by one */
        .sgd_update_many = nb__cpu_sgd_update_many, .adam_update_many = nb__cpu_adam_update_many};
    g_table.optim = &g_optim;
    g_table.alloc = rec_alloc;
    g_table.free = rec_free;
    g_table.copy_from_host = rec_copy_from_host;
    g_table.copy_to_host = rec_copy_to_host;
    g_table.copy_between = rec_copy_between;
    g_table.fill = rec_fill;
    g_table.arange = rec_arange;
    g_table.random = rec_random;
    g_table.copy = rec_copy;
    g_table.unary = rec_unary;
    g_table.binary = rec_binary;
    g_table.where = rec_where;
    g_table.reduce = rec_reduce;
    g_table.arg_reduce = rec_arg_reduce;
    g_table.cumsum = rec_cumsum;
    g_table.matmul = rec_matmul;
    g_table.softmax = rec_softmax;
    g_table.softmax_xent = rec_softmax_xent;
    g_table.softmax_xent_grad = rec_softmax_xent_grad;
    g_table.gather = rec_gather;
    g_table.scatter_add = rec_scatter_add;
    g_table.one_hot = rec_one_hot;
    g_table.check_indices = rec_check_indices;
    g_table.max_pool2d = rec_max_pool2d;
    g_table.max_pool2d_grad = rec_max_pool2d_grad;
    g_table.avg_pool2d = rec_avg_pool2d;
    g_table.avg_pool2d_grad = rec_avg_pool2d_grad;
    g_table.channel_moments = rec_channel_moments;
    g_table.channel_affine = rec_channel_affine;
    g_table.layer_norm_rows = nb__cpu_backend.layer_norm_rows ? rec_layer_norm_rows : NULL;
    g_table.layer_norm_rows_grad = nb__cpu_backend.layer_norm_rows_grad ? rec_layer_norm_rows_grad : NULL;
    g_table.conv2d = rec_conv2d;
    g_table.conv2d_backward_data = rec_conv2d_backward_data;
    g_table.conv2d_backward_filter = rec_conv2d_backward_filter;
}

/* ---- elementwise chains fused (cpu_fuse.h) ------------------------------------------------ */

typedef struct { call h; nb_cpu_fused *plan; } fused_call;
static nb_status run_fused(nb_device *dev, const call *c)
{
    (void)dev;
    nb__cpu_fused_run(((const fused_call *)c)->plan);
    return NB_OK;
}
static void drop_fused(call *c) { nb__cpu_fused_free(((fused_call *)c)->plan); }

/* v lies in a block made during the recording and freed before any call
 * after last was recorded: no later call reads it, and nothing outside the
 * step can (the graph keeps freed blocks, so no later allocation reuses it). */
static bool dead_after(void *user, const nb_view *v, int64_t last)
{
    const cpu_rec *r = user;
    const char *p = v->data;
    for (size_t i = 0; i < r->freed.n; i++) {
        const block *b = &r->freed.at[i];
        if (p < (const char *)b->p || p >= (const char *)b->p + b->n)
            continue;
        if (b->at > last + 1)
            return false;
        for (size_t j = 0; j < r->made.n; j++)
            if (r->made.at[j].p == b->p)
                return true;
        return false;
    }
    return false;
}

static bool is_elementwise(const call *c)
{
    return c->run == run_unary || c->run == run_binary || c->run == run_fill || c->run == run_copy ||
           c->run == run_where;
}

static nb_fuse_call fuse_call_of(const call *c)
{
    if (c->run == run_fill) {
        const fill_call *a = (const fill_call *)c;
        return (nb_fuse_call){.kind = NB_FUSE_FILL, .alpha = a->value, .out = V(a->out), .index = c->index};
    }
    if (c->run == run_unary) {
        const unary_call *a = (const unary_call *)c;
        return (nb_fuse_call){.kind = NB_FUSE_UNARY, .op = (int)a->op, .alpha = a->alpha, .out = V(a->out),
                              .x = V(a->x), .index = c->index};
    }
    if (c->run == run_copy) {
        const copy_call *a = (const copy_call *)c;
        return (nb_fuse_call){.kind = NB_FUSE_COPY, .out = V(a->out), .x = V(a->in), .index = c->index};
    }
    if (c->run == run_where) {
        const where_call *a = (const where_call *)c;
        return (nb_fuse_call){.kind = NB_FUSE_WHERE, .out = V(a->out), .cond = V(a->cond), .x = V(a->x),
                              .y = V(a->y), .index = c->index};
    }
    const binary_call *a = (const binary_call *)c;
    return (nb_fuse_call){.kind = NB_FUSE_BINARY, .op = (int)a->op, .out = V(a->out), .x = V(a->x), .y = V(a->y),
                          .index = c->index};
}

/* Plans run[0 .. n) with the reduce call red right after it as one call
 * (nb__cpu_fuse_plan_reduce). A fill of red's output between them (a debug
 * build's poison) does not stop it: it writes no operand of the chain, so it
 * moves ahead of the chain (*hoist). Returns the calls the chain takes, or 0. */
static int plan_reduce(cpu_rec *r, const nb_fuse_call *run, int n, const call *red, nb_cpu_fused **plan, bool *hoist)
{
    const reduce_call *a = (const reduce_call *)red;
    nb_fuse_feed feed = {.out = V(a->out), .x = V(a->x), .index = red->index};
    *hoist = n >= 2 && run[n - 1].kind == NB_FUSE_FILL && nb__fuse_same_place(run[n - 1].out, feed.out);
    int m = n - *hoist;
    if (!feed.out || !feed.x || nb__cpu_fuse_plan_reduce(run, m, a->op, &feed, dead_after, r, plan) != m) {
        *hoist = false;
        return 0;
    }
    return m;
}

/* Replaces each run of elementwise calls that fuses by one call, and with it
 * the reduce call right after the run where the run's last result only feeds
 * that reduction. NB_GRAPH_FUSE_REDUCE=0 in the environment keeps reduce
 * calls apart (what bench_fusion and the tests compare with). Out of host
 * memory, a run stays as it was. */
static void fuse(cpu_rec *r)
{
    enum { MAX_RUN = 32 };
    nb_fuse_call run[MAX_RUN];
    const char *env = getenv("NB_GRAPH_FUSE_REDUCE");
    const bool into_reduces = !env || strcmp(env, "0") != 0;
    call **link = &r->head;
    while (*link) {
        int n = 0;
        call *after = *link;
        for (; after && is_elementwise(after) && n < MAX_RUN; after = after->next)
            run[n++] = fuse_call_of(after);
        nb_cpu_fused *plan = NULL;
        bool hoist = false;
        int k = into_reduces && n >= 1 && after && after->run == run_reduce
                    ? plan_reduce(r, run, n, after, &plan, &hoist)
                    : 0;
        bool into_reduce = k > 0;
        if (!into_reduce)
            k = n >= 2 ? nb__cpu_fuse_plan(run, n, dead_after, r, &plan) : 0;
        fused_call *f = k >= 1 ? calloc(1, sizeof *f) : NULL;
        if (!f) {
            nb__cpu_fused_free(plan);
            link = &(*link)->next;
            continue;
        }
        f->h.run = run_fused;
        f->h.drop = drop_fused;
        f->h.index = (*link)->index;
        f->plan = plan;
        call *c = *link, *fill = NULL;
        for (int i = 0; i < k; i++) {
            call *next = c->next;
            free(c);
            c = next;
        }
        if (into_reduce) { /* [fill] reduce: the fill stays, ahead of the chain */
            if (hoist)
                fill = c, c = c->next;
            call *next = c->next;
            free(c);
            c = next;
        }
        f->h.next = c;
        if (fill)
            fill->next = &f->h, *link = fill;
        else
            *link = &f->h;
        link = &f->h.next;
        r->n_calls -= k - 1 + into_reduce;
    }
    r->tail = link;
}

/* ---- nb_graph_kernels ------------------------------------------------------------------ */

static void rec_destroy(cpu_rec *r, bool registered)
{
    for (call *c = r->head, *next; c; c = next) {
        next = c->next;
        if (c->drop)
            c->drop(c);
        free(c);
    }
    if (registered)
        let_go(r);
    for (size_t i = 0; i < r->freed.n; i++)
        nb__cpu_free(r->dev, r->freed.at[i].p, r->freed.at[i].n);
    free(r->made.at);
    free(r->freed.at);
    free(r);
}

static nb_status cpu_graph_begin(nb_device *dev, void **out)
{
    *out = NULL;
    if (tl_rec)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "graph capture: this thread already records a step on %s",
                        tl_rec->dev->name);
    if (pthread_once(&g_table_once, table_init) != 0)
        return nb__fail(NB_ERR_INTERNAL, "graph capture: the recording table could not be set up");
    cpu_rec *r = calloc(1, sizeof *r);
    if (!r)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory on %s", dev->name);
    r->dev = dev;
    r->table = dev->backend;
    r->tail = &r->head;
    tl_rec = r;
    dev->backend = &g_table;
    *out = r;
    return NB_OK;
}

static nb_status cpu_graph_end(nb_device *dev, void *rec, bool keep, void **exec)
{
    cpu_rec *r = rec;
    *exec = NULL;
    dev->backend = r->table;
    tl_rec = NULL;
    nb_status st = NB_OK;
    if (keep && r->failed)
        st = nb_error() ? nb_error() : nb__fail(NB_ERR_BACKEND, "graph capture: recording on %s failed", dev->name);
    else if (keep && !keep_alive(r))
        st = nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory ending a recording on %s", dev->name);
    if (!keep || st) {
        rec_destroy(r, false);
        return st;
    }
    if (nb__graph_fusion())
        fuse(r);
    *exec = r;
    return NB_OK;
}

static nb_status cpu_graph_launch(nb_device *dev, void *exec, double *dev_params, int n, const double *params)
{
    const cpu_rec *r = exec;
    if (n > 0)
        memcpy(dev_params, params, sizeof(double) * (size_t)n);
    for (const call *c = r->head; c; c = c->next) {
        nb_status st = c->run(dev, c);
        if (st)
            return st;
    }
    return NB_OK;
}

static int64_t cpu_graph_nodes(const void *exec) { return ((const cpu_rec *)exec)->n_calls; }

static void cpu_graph_destroy(nb_device *dev, void *exec)
{
    (void)dev;
    rec_destroy(exec, true);
}

const nb_graph_kernels nb__cpu_graph = {
    .begin = cpu_graph_begin,
    .end = cpu_graph_end,
    .launch = cpu_graph_launch,
    .nodes = cpu_graph_nodes,
    .destroy = cpu_graph_destroy,
};
