/* softmax / log_softmax over the last dim (f32, f64), and the rows of sparse
 * softmax cross-entropy with its gradient (at the end), numerically stable: the
 * row's max is subtracted before exp; f32 rows sum their exps in double. Rows
 * may have any strides (the inner dim too); large inputs split by rows.
 * The sum runs in 8 lanes (element i in lane i % 8 of each whole block of 8,
 * the rest after, in order; the lanes combined pairwise), the same order for
 * every stride; the max of a contiguous row in four vectors of 8 (its value,
 * and the bits of every output, are the same); the exps are written before
 * they are summed, so the contiguous loops vectorise (this file's flags: ops/cpu/meson.build);
 * f32 exp is nb_expf (lib/core/formulas.h) for that reason. */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

#include <math.h>
#include <string.h>

typedef struct sm_plan {
    int nd;                          /* outer dims */
    int64_t shape[NB_MAX_DIMS];
    int64_t st[2][NB_MAX_DIMS];      /* outer byte strides: out, x */
    int64_t len, so, sx;             /* the last dim: length, byte strides of out and x */
    char *out;
    const char *x;
    bool log;
} sm_plan;

#define SM_LANES 8

/* m = the max of a row of n elements X(i), the way softmax takes it: 8 lanes
 * combined pairwise, then the tail; a row of -inf gives 0 and one whose max
 * is +inf keeps it (its exps are NaN then). */
#define SM_MAX(T, X, m)                                                                       \
    do {                                                                                      \
        T lm[SM_LANES];                                                                       \
        for (int j = 0; j < SM_LANES; j++)                                                    \
            lm[j] = X(0);                                                                     \
        int64_t i = 0;                                                                        \
        for (; i + SM_LANES <= n; i += SM_LANES)                                              \
            for (int j = 0; j < SM_LANES; j++)                                                \
                lm[j] = X(i + j) > lm[j] ? X(i + j) : lm[j];                                  \
        for (int w = SM_LANES / 2; w > 0; w /= 2)                                             \
            for (int j = 0; j < w; j++)                                                       \
                lm[j] = lm[j + w] > lm[j] ? lm[j + w] : lm[j];                                \
        m = lm[0];                                                                            \
        for (; i < n; i++)                                                                    \
            m = X(i) > m ? X(i) : m;                                                          \
        if (m != m || m == -INFINITY || m == INFINITY)                                        \
            m = m != m ? m : (m > 0 ? m : 0);                                                 \
    } while (0)

/* SM_MAX's m for a contiguous row, faster: GCC leaves SM_MAX's lanes scalar
 * inside the kernels, one chain of vmaxss per lane. Here four vectors of
 * SM_LANES lanes fold x > a ? x : a over the row's blocks in turn, so the
 * value is SM_MAX's, and the bits too but for the sign of a zero max, which
 * shows in no output: with one zero it is that zero's, with more, exps
 * summing to at least 2 hide it. A NaN max is x[0]'s NaN here as there (both
 * skip every later NaN, which the exps then meet). */
#define SM_MAX_CONTIG(T, X, m)                                                                \
    do {                                                                                      \
        typedef T smv_t __attribute__((vector_size(SM_LANES * sizeof(T))));                   \
        typedef __typeof__((smv_t){0} > (smv_t){0}) smm_t;                                    \
        if (n < 4 * SM_LANES) {                                                               \
            SM_MAX(T, X, m);                                                                  \
            break;                                                                            \
        }                                                                                     \
        smv_t a0, a1, a2, a3, v;                                                              \
        for (int j = 0; j < SM_LANES; j++)                                                    \
            a0[j] = X(0);                                                                     \
        a1 = a2 = a3 = a0;                                                                    \
        int64_t i = 0;                                                                        \
        for (; i + 4 * SM_LANES <= n; i += 4 * SM_LANES) {                                    \
            SM_VMAX(a0, &X(i));                                                               \
            SM_VMAX(a1, &X(i + SM_LANES));                                                    \
            SM_VMAX(a2, &X(i + 2 * SM_LANES));                                                \
            SM_VMAX(a3, &X(i + 3 * SM_LANES));                                                \
        }                                                                                     \
        SM_VMAX(a0, &a1);                                                                     \
        SM_VMAX(a2, &a3);                                                                     \
        SM_VMAX(a0, &a2);                                                                     \
        m = a0[0];                                                                            \
        for (int j = 1; j < SM_LANES; j++)                                                    \
            m = a0[j] > m ? a0[j] : m;                                                        \
        for (; i < n; i++)                                                                    \
            m = X(i) > m ? X(i) : m;                                                          \
        if (m == -INFINITY)                                                                   \
            m = 0;                                                                            \
    } while (0)
/* a = x > a ? x : a, lane by lane, x read from p (any alignment). */
#define SM_VMAX(a, p)                                                                         \
    do {                                                                                      \
        memcpy(&v, (p), sizeof v);                                                            \
        const smm_t gt = v > a;                                                               \
        a = (smv_t)((gt & (smm_t)v) | (~gt & (smm_t)a));                                      \
    } while (0)

/* sum = the sum over a row of n of E, an expression in the element's index
 * k, in ACC: 8 lanes combined pairwise, then the tail. */
#define SM_SUM(ACC, E, sum)                                                                   \
    do {                                                                                      \
        ACC ls[SM_LANES] = {0};                                                               \
        int64_t i = 0;                                                                        \
        for (; i + SM_LANES <= n; i += SM_LANES)                                              \
            for (int j = 0; j < SM_LANES; j++) {                                              \
                const int64_t k = i + j;                                                      \
                ls[j] += (ACC)(E);                                                            \
            }                                                                                 \
        for (int w = SM_LANES / 2; w > 0; w /= 2)                                             \
            for (int j = 0; j < w; j++)                                                       \
                ls[j] += ls[j + w];                                                           \
        sum = ls[0];                                                                          \
        for (; i < n; i++) {                                                                  \
            const int64_t k = i;                                                              \
            sum += (ACC)(E);                                                                  \
        }                                                                                     \
    } while (0)

/* One row, through X(i) and O(i), the lvalues of element i of x and out. */
#define SM_ROW(T, ACC, EXP, LOG, X, O, MAX)                                                   \
    do {                                                                                      \
        T m;                                                                                  \
        MAX(T, X, m);                                                                         \
        for (int64_t i = 0; i < n; i++)                                                       \
            O(i) = EXP(X(i) - m);                                                             \
        ACC sum;                                                                              \
        SM_SUM(ACC, O(k), sum);                                                               \
        if (pl->log) {                                                                        \
            const T lsum = (T)LOG(sum);                                                       \
            for (int64_t i = 0; i < n; i++)                                                   \
                O(i) = (X(i) - m) - lsum;                                                     \
        } else {                                                                              \
            const T inv = (T)(1 / sum);                                                       \
            for (int64_t i = 0; i < n; i++)                                                   \
                O(i) *= inv;                                                                  \
        }                                                                                     \
    } while (0)

/* out is written before x is read for the last time: out and x may not overlap
 * (the op gives a new tensor). */
#define SM_IMPL(NAME, T, ACC, EXP, LOG)                                                       \
    __attribute__((always_inline)) static inline void NAME##_body(void *ctx, int64_t b,       \
                                                                  int64_t e)                  \
    {                                                                                         \
        typedef T sm_t; /* for SM_STRIDED_X, SM_STRIDED_O */                                  \
        const sm_plan *pl = ctx;                                                              \
        const int64_t n = pl->len, so = pl->so, sx = pl->sx;                                  \
        int64_t idx[NB_MAX_DIMS], off[2];                                                     \
        nb__cpu_index_at(pl->nd, pl->shape, b, idx, 2, off, pl->st);                          \
        for (int64_t r = b; r < e; r++) {                                                     \
            if (so == (int64_t)sizeof(T) && sx == (int64_t)sizeof(T)) {                       \
                T *restrict o = (T *)(pl->out + off[0]);                                      \
                const T *restrict x = (const T *)(pl->x + off[1]);                            \
                SM_ROW(T, ACC, EXP, LOG, SM_AT, SM_OUT_AT, SM_MAX_CONTIG);                    \
            } else {                                                                          \
                char *op = pl->out + off[0];                                                  \
                const char *xp = pl->x + off[1];                                              \
                SM_ROW(T, ACC, EXP, LOG, SM_STRIDED_X, SM_STRIDED_O, SM_MAX);                 \
            }                                                                                 \
            if (r + 1 < e)                                                                    \
                nb__cpu_index_next(pl->nd, pl->shape, idx, 2, off, pl->st);                   \
        }                                                                                     \
    }                                                                                         \
    NB_CPU_SIMD_RANGE(NAME)
#define SM_AT(i) x[i]
#define SM_OUT_AT(i) o[i]
#define SM_STRIDED_X(i) (*(const sm_t *)(xp + (i) * sx))
#define SM_STRIDED_O(i) (*(sm_t *)(op + (i) * so))
SM_IMPL(softmax_f32, float, double, nb_expf, log)
SM_IMPL(softmax_f64, double, double, exp, log)

nb_status nb__cpu_softmax(nb_device *dev, bool log, const nb_view *out, const nb_view *x)
{
    const char *name = log ? "log_softmax" : "softmax";
    nb_range_fn fn;
    switch (x->dtype) {
    case NB_F32: fn = softmax_f32; break;
    case NB_F64: fn = softmax_f64; break;
    default: return nb__cpu_unsupported(dev, name, x->dtype);
    }
    if (out->dtype != x->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s differs from input dtype %s", name,
                        nb_dtype_name(out->dtype), nb_dtype_name(x->dtype));
    if (x->numel == 0)
        return NB_OK;
    sm_plan pl;
    pl.log = log;
    pl.out = out->data;
    pl.x = x->data;
    pl.nd = 0;
    int64_t rows = 1;
    if (x->ndim == 0) {
        pl.len = 1;
        pl.so = pl.sx = nb__cpu_esize(x->dtype);
    } else {
        pl.len = x->shape[x->ndim - 1];
        pl.so = out->strides[x->ndim - 1];
        pl.sx = x->strides[x->ndim - 1];
        for (int d = 0; d < x->ndim - 1; d++) {
            if (x->shape[d] == 1)
                continue;
            nb__cpu_append_dim(&pl.nd, pl.shape, pl.st, x->shape[d], out->strides[d], x->strides[d]);
            rows *= x->shape[d];
        }
    }
    nb__cpu_one_dim_at_least(&pl.nd, pl.shape, pl.st);
    if (x->numel < 2 * NB_CPU_GRAIN_HEAVY)
        fn(&pl, 0, rows);
    else
        nb__parallel_for(rows, NB_CPU_GRAIN_HEAVY / pl.len + 1, fn, &pl);
    return NB_OK;
}

/* ---- sparse softmax cross-entropy (backend.h: softmax_xent, softmax_xent_grad) ----
 * Row by row, each row's max and sum taken as softmax's are (SM_MAX, SM_SUM,
 * the exps not stored), so the loss is log_softmax's element at the label
 * negated, bit for bit, and the gradient the bits of log_softmax's gradient
 * applied to the loss's composition; the gradient's exp is the exp op's. */

typedef struct xent_plan {
    int64_t len;          /* C */
    int64_t gs;           /* g's byte stride (0: one value broadcast) */
    const char *x, *labels, *g;
    char *loss, *stats, *dx;
    bool labels64;
} xent_plan;

static inline int64_t xent_label(const xent_plan *pl, int64_t r)
{
    return pl->labels64 ? ((const int64_t *)pl->labels)[r] : ((const int32_t *)pl->labels)[r];
}

/* EXP: softmax's exp; YEXP: the exp op's (they differ for f64). */
#define XENT_CHUNK 256 /* a multiple of SM_LANES */
#define XENT_IMPL(NAME, T, ACC, EXP, LOG, YEXP)                                               \
    __attribute__((always_inline)) static inline void NAME##_fwd_body(void *ctx, int64_t b,   \
                                                                      int64_t e)              \
    {                                                                                         \
        const xent_plan *pl = ctx;                                                            \
        const int64_t n = pl->len;                                                            \
        for (int64_t r = b; r < e; r++) {                                                     \
            const T *restrict x = (const T *)pl->x + r * n;                                   \
            T m;                                                                              \
            SM_MAX_CONTIG(T, SM_AT, m);                                                       \
            /* SM_SUM's order, the exps made a chunk at a time so that the loop vectorises */ \
            ACC ls[SM_LANES] = {0};                                                           \
            T e[XENT_CHUNK];                                                                  \
            const int64_t whole = n - n % SM_LANES;                                           \
            for (int64_t c = 0; c < whole; c += XENT_CHUNK) {                                 \
                const int64_t len = whole - c < XENT_CHUNK ? whole - c : XENT_CHUNK;          \
                for (int64_t k = 0; k < len; k++)                                             \
                    e[k] = EXP(x[c + k] - m);                                                 \
                for (int64_t i = 0; i < len; i += SM_LANES)                                   \
                    for (int j = 0; j < SM_LANES; j++)                                        \
                        ls[j] += (ACC)e[i + j];                                               \
            }                                                                                 \
            for (int w = SM_LANES / 2; w > 0; w /= 2)                                         \
                for (int j = 0; j < w; j++)                                                   \
                    ls[j] += ls[j + w];                                                       \
            ACC sum = ls[0];                                                                  \
            for (int64_t k = whole; k < n; k++)                                               \
                sum += (ACC)EXP(x[k] - m);                                                    \
            const T lsum = (T)LOG(sum);                                                       \
            T *st = (T *)pl->stats + 2 * r;                                                   \
            st[0] = m, st[1] = lsum;                                                          \
            const int64_t l = xent_label(pl, r);                                              \
            const T y = l >= 0 && l < n ? (x[l] - m) - lsum : (T)NAN;                         \
            /* a NaN as the composition gives it: a row sum's default NaN, negated */         \
            ((T *)pl->loss)[r] = y == y ? -y : -(T)NAN;                                       \
        }                                                                                     \
    }                                                                                         \
    NB_CPU_SIMD_RANGE(NAME##_fwd)                                                             \
    /* dx = G - exp(y) s with G = -g at the label, +0 elsewhere, and s = G's row sum:         \
     * -g + 0 (the sum's +0 start turns -0 into +0). */                                       \
    __attribute__((always_inline)) static inline void NAME##_grad_body(void *ctx, int64_t b,  \
                                                                       int64_t e)             \
    {                                                                                         \
        const xent_plan *pl = ctx;                                                            \
        const int64_t n = pl->len;                                                            \
        for (int64_t r = b; r < e; r++) {                                                     \
            const T *restrict x = (const T *)pl->x + r * n;                                   \
            T *restrict dx = (T *)pl->dx + r * n;                                             \
            const T *st = (const T *)pl->stats + 2 * r;                                       \
            const T m = st[0], lsum = st[1], gn = -*(const T *)(pl->g + r * pl->gs);         \
            const T s = gn + (T)0;                                                            \
            for (int64_t k = 0; k < n; k++)                                                   \
                dx[k] = (T)0 - YEXP((x[k] - m) - lsum) * s;                                   \
            const int64_t l = xent_label(pl, r);                                              \
            if (l >= 0 && l < n)                                                              \
                dx[l] = gn - YEXP((x[l] - m) - lsum) * s;                                     \
        }                                                                                     \
    }                                                                                         \
    NB_CPU_SIMD_RANGE(NAME##_grad)
XENT_IMPL(xent_f32, float, double, nb_expf, log, nb_expf)
XENT_IMPL(xent_f64, double, double, exp, log, NB_MATH_F64(exp))

/* The checks both entries share; fills *pl but for loss, g and dx. */
static nb_status xent_plan_of(const char *name, nb_device *dev, const nb_view *x, const nb_view *labels,
                              const nb_view *stats, xent_plan *pl, int64_t *rows)
{
    if (x->dtype != NB_F32 && x->dtype != NB_F64)
        return nb__cpu_unsupported(dev, name, x->dtype);
    if (labels->dtype != NB_I32 && labels->dtype != NB_I64)
        return nb__fail(NB_ERR_DTYPE, "%s: labels dtype %s is not i32 or i64", name, nb_dtype_name(labels->dtype));
    if (x->ndim != 2 || !x->contiguous || !labels->contiguous || !stats->contiguous ||
        labels->numel != x->shape[0] || stats->numel != 2 * x->shape[0] || stats->dtype != x->dtype)
        return nb__fail(NB_ERR_INTERNAL, "%s: expects contiguous logits [N, C], labels [N] and stats [N, 2]", name);
    *rows = x->shape[0];
    pl->len = x->shape[1];
    pl->x = x->data;
    pl->labels = labels->data;
    pl->labels64 = labels->dtype == NB_I64;
    pl->stats = stats->data;
    return NB_OK;
}

static void xent_run(nb_range_fn fn, xent_plan *pl, int64_t rows)
{
    if (rows * pl->len < 2 * NB_CPU_GRAIN_HEAVY)
        fn(pl, 0, rows);
    else
        nb__parallel_for(rows, NB_CPU_GRAIN_HEAVY / pl->len + 1, fn, pl);
}

nb_status nb__cpu_softmax_xent(nb_device *dev, const nb_view *loss, const nb_view *stats, const nb_view *x,
                               const nb_view *labels)
{
    const char *name = "sparse_softmax_cross_entropy";
    xent_plan pl = {0};
    int64_t rows = 0;
    nb_status st = xent_plan_of(name, dev, x, labels, stats, &pl, &rows);
    if (st)
        return st;
    if (loss->dtype != x->dtype || !loss->contiguous || loss->numel != rows)
        return nb__fail(NB_ERR_INTERNAL, "%s: expects a contiguous loss [N] of the logits' dtype", name);
    if (rows == 0)
        return NB_OK;
    if (pl.len == 0)
        return nb__fail(NB_ERR_INTERNAL, "%s: logits have no classes", name);
    if ((st = nb__cpu_check_indices(dev, name, labels, pl.len)))
        return st;
    pl.loss = loss->data;
    xent_run(x->dtype == NB_F32 ? xent_f32_fwd : xent_f64_fwd, &pl, rows);
    return NB_OK;
}

nb_status nb__cpu_softmax_xent_grad(nb_device *dev, const nb_view *dx, const nb_view *g, const nb_view *x,
                                    const nb_view *stats, const nb_view *labels)
{
    const char *name = "sparse_softmax_cross_entropy gradient";
    xent_plan pl = {0};
    int64_t rows = 0;
    nb_status st = xent_plan_of(name, dev, x, labels, stats, &pl, &rows);
    if (st)
        return st;
    if (dx->dtype != x->dtype || g->dtype != x->dtype || !dx->contiguous || g->ndim != 1 || dx->numel != x->numel ||
        g->numel != rows)
        return nb__fail(NB_ERR_INTERNAL, "%s: expects a contiguous dx of the logits' shape and g [N]", name);
    if (x->numel == 0)
        return NB_OK;
    pl.dx = dx->data;
    pl.g = g->data;
    pl.gs = g->strides[0];
    xent_run(x->dtype == NB_F32 ? xent_f32_grad : xent_f64_grad, &pl, rows);
    return NB_OK;
}
