/* softmax / log_softmax over the last dim (f32, f64), numerically stable: the
 * row's max is subtracted before exp; f32 rows sum their exps in double. Rows
 * may have any strides (the inner dim too); large inputs split by rows. */
#include "cpu_internal.h"

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

#define SM_IMPL(NAME, T, ACC, EXP, LOG)                                                       \
    static void NAME##_row(const sm_plan *pl, char *op, const char *xp)                       \
    {                                                                                         \
        const int64_t n = pl->len;                                                            \
        if (pl->so == (int64_t)sizeof(T) && pl->sx == (int64_t)sizeof(T)) {                  \
            T *restrict o = (T *)op;                                                          \
            const T *restrict x = (const T *)xp;                                              \
            T m = x[0];                                                                       \
            for (int64_t i = 1; i < n; i++)                                                   \
                m = x[i] > m ? x[i] : m;                                                      \
            if (m != m || m == -INFINITY || m == INFINITY)                                    \
                m = m != m ? m : (m > 0 ? m : 0);                                             \
            ACC sum = 0;                                                                      \
            if (pl->log) {                                                                    \
                for (int64_t i = 0; i < n; i++)                                               \
                    sum += (ACC)EXP(x[i] - m);                                                \
                const T ls = (T)LOG(sum);                                                     \
                for (int64_t i = 0; i < n; i++)                                               \
                    o[i] = (x[i] - m) - ls;                                                   \
            } else {                                                                          \
                for (int64_t i = 0; i < n; i++) {                                             \
                    T e = EXP(x[i] - m);                                                      \
                    o[i] = e;                                                                 \
                    sum += (ACC)e;                                                            \
                }                                                                             \
                const T inv = (T)(1 / sum);                                                   \
                for (int64_t i = 0; i < n; i++)                                               \
                    o[i] *= inv;                                                              \
            }                                                                                 \
        } else {                                                                              \
            const int64_t so = pl->so, sx = pl->sx;                                           \
            T m = *(const T *)xp;                                                             \
            for (int64_t i = 1; i < n; i++) {                                                 \
                T v = *(const T *)(xp + i * sx);                                              \
                m = v > m ? v : m;                                                            \
            }                                                                                 \
            if (m != m || m == -INFINITY || m == INFINITY)                                    \
                m = m != m ? m : (m > 0 ? m : 0);                                             \
            ACC sum = 0;                                                                      \
            for (int64_t i = 0; i < n; i++)                                                   \
                sum += (ACC)EXP(*(const T *)(xp + i * sx) - m);                               \
            if (pl->log) {                                                                    \
                const T ls = (T)LOG(sum);                                                     \
                for (int64_t i = 0; i < n; i++)                                               \
                    *(T *)(op + i * so) = (*(const T *)(xp + i * sx) - m) - ls;               \
            } else {                                                                          \
                const T inv = (T)(1 / sum);                                                   \
                for (int64_t i = 0; i < n; i++)                                               \
                    *(T *)(op + i * so) = EXP(*(const T *)(xp + i * sx) - m) * inv;           \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void NAME(void *ctx, int64_t b, int64_t e)                                         \
    {                                                                                         \
        const sm_plan *pl = ctx;                                                              \
        int64_t idx[NB_MAX_DIMS], off[2];                                                     \
        nb__cpu_index_at(pl->nd, pl->shape, b, idx, 2, off, pl->st);                          \
        for (int64_t r = b; r < e; r++) {                                                     \
            NAME##_row(pl, pl->out + off[0], pl->x + off[1]);                                 \
            if (r + 1 < e)                                                                    \
                nb__cpu_index_next(pl->nd, pl->shape, idx, 2, off, pl->st);                   \
        }                                                                                     \
    }
SM_IMPL(softmax_f32, float, double, expf, log)
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
