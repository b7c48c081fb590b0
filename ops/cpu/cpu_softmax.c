/* softmax / log_softmax over the last dim (f32, f64), numerically stable: the
 * row's max is subtracted before exp; f32 rows sum their exps in double. Rows
 * may have any strides (the inner dim too); large inputs split by rows.
 * The max and the sum run in 8 lanes (element i in lane i % 8 of each whole
 * block of 8, the rest after, in order; the lanes combined pairwise), the same
 * order for every stride, and the exps are written before they are summed, so
 * the contiguous loops vectorise (this file's flags: ops/cpu/meson.build);
 * f32 exp is nb_expf (lib/core/formulas.h) for that reason. */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

#include <math.h>

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

/* One row, through X(i) and O(i), the lvalues of element i of x and out. */
#define SM_ROW(T, ACC, EXP, LOG, X, O)                                                        \
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
        T m = lm[0];                                                                          \
        for (; i < n; i++)                                                                    \
            m = X(i) > m ? X(i) : m;                                                          \
        if (m != m || m == -INFINITY || m == INFINITY)                                        \
            m = m != m ? m : (m > 0 ? m : 0);                                                 \
        for (i = 0; i < n; i++)                                                               \
            O(i) = EXP(X(i) - m);                                                             \
        ACC ls[SM_LANES] = {0};                                                               \
        for (i = 0; i + SM_LANES <= n; i += SM_LANES)                                         \
            for (int j = 0; j < SM_LANES; j++)                                                \
                ls[j] += (ACC)O(i + j);                                                       \
        for (int w = SM_LANES / 2; w > 0; w /= 2)                                             \
            for (int j = 0; j < w; j++)                                                       \
                ls[j] += ls[j + w];                                                           \
        ACC sum = ls[0];                                                                      \
        for (; i < n; i++)                                                                    \
            sum += (ACC)O(i);                                                                 \
        if (pl->log) {                                                                        \
            const T lsum = (T)LOG(sum);                                                       \
            for (i = 0; i < n; i++)                                                           \
                O(i) = (X(i) - m) - lsum;                                                     \
        } else {                                                                              \
            const T inv = (T)(1 / sum);                                                       \
            for (i = 0; i < n; i++)                                                           \
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
                SM_ROW(T, ACC, EXP, LOG, SM_AT, SM_OUT_AT);                                   \
            } else {                                                                          \
                char *op = pl->out + off[0];                                                  \
                const char *xp = pl->x + off[1];                                              \
                SM_ROW(T, ACC, EXP, LOG, SM_STRIDED_X, SM_STRIDED_O);                         \
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
