/* Fused optimizer updates (f32, f64; param, grad and slots contiguous, one dtype).
 * sgd:  g' = g + weight_decay * p (when weight_decay != 0);
 *       with a momentum slot: m = momentum * m + g'; p -= lr * (nesterov ?
 *       g' + momentum * m : m); without one: p -= lr * g'.
 * adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; mhat = m / (1 - b1^t),
 *       vhat = v / (1 - b2^t); p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)
 *       (decoupled, AdamW, decay). step < 1 counts as 1. f32 works in float.
 * A set skip flag (a loss scaler's check, read when the kernel runs) makes
 * an update copy its source to param and change nothing else.
 * scaler_update: a loss scaler's state after its step (nb_scaler_advance). */
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

typedef struct opt_job {
    char *p;
    const char *src; /* the parameter's current values (p itself when in place) */
    const char *g;
    char *m, *v;
    double lr, mom, wd, b1, b2, eps, bc1, bc2;
    bool nesterov;
} opt_job;

#define SGD_IMPL(NAME, T, SQRT)                                                               \
    static void NAME(void *ctx, int64_t b, int64_t e)                                         \
    {                                                                                         \
        const opt_job *j = ctx;                                                               \
        T *p = (T *)j->p; /* may alias x: element i is read before it is written */          \
        const T *x = (const T *)j->src;                                                       \
        const T *restrict g = (const T *)j->g;                                                \
        T *restrict m = (T *)j->m;                                                            \
        const T lr = (T)j->lr, mom = (T)j->mom, wd = (T)j->wd;                                \
        if (!m) {                                                                             \
            for (int64_t i = b; i < e; i++)                                                   \
                p[i] = x[i] - lr * (g[i] + wd * x[i]);                                        \
        } else if (j->nesterov) {                                                             \
            for (int64_t i = b; i < e; i++) {                                                 \
                const T gi = g[i] + wd * x[i];                                                \
                const T mi = mom * m[i] + gi;                                                 \
                m[i] = mi;                                                                    \
                p[i] = x[i] - lr * (gi + mom * mi);                                           \
            }                                                                                 \
        } else {                                                                              \
            for (int64_t i = b; i < e; i++) {                                                 \
                const T mi = mom * m[i] + g[i] + wd * x[i];                                   \
                m[i] = mi;                                                                    \
                p[i] = x[i] - lr * mi;                                                        \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void NAME##_adam(void *ctx, int64_t b, int64_t e)                                  \
    {                                                                                         \
        const opt_job *j = ctx;                                                               \
        T *p = (T *)j->p;                                                                     \
        const T *x = (const T *)j->src;                                                       \
        const T *restrict g = (const T *)j->g;                                                \
        T *restrict m = (T *)j->m, *restrict v = (T *)j->v;                                   \
        const T lr = (T)j->lr, wd = (T)j->wd, b1 = (T)j->b1, b2 = (T)j->b2, eps = (T)j->eps;  \
        const T c1 = (T)(1 - j->b1), c2 = (T)(1 - j->b2), bc1 = (T)j->bc1, bc2 = (T)j->bc2;   \
        for (int64_t i = b; i < e; i++) {                                                     \
            const T gi = g[i];                                                                \
            const T mi = b1 * m[i] + c1 * gi;                                                 \
            const T vi = b2 * v[i] + c2 * gi * gi;                                            \
            m[i] = mi;                                                                        \
            v[i] = vi;                                                                        \
            p[i] = x[i] - lr * (mi * bc1 / (SQRT(vi * bc2) + eps) + wd * x[i]);               \
        }                                                                                     \
    }
SGD_IMPL(sgd_f32, float, sqrtf)
SGD_IMPL(sgd_f64, double, sqrt)

static nb_status check_same(const char *op, const nb_view *param, const nb_view *other,
                            const char *what)
{
    if (other->dtype != param->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: %s dtype %s differs from the parameter's %s", op, what,
                        nb_dtype_name(other->dtype), nb_dtype_name(param->dtype));
    if (other->numel != param->numel)
        return nb__fail(NB_ERR_SHAPE, "%s: %s has %lld elements, the parameter %lld", op, what,
                        (long long)other->numel, (long long)param->numel);
    if (!other->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: the CPU kernel needs a contiguous %s", op, what);
    return NB_OK;
}

/* Whether p's skip flag is set; then param takes the source's values (a
 * fresh buffer must still hold the parameter). */
static bool skipped(const nb_view *param, const nb_update_params *p)
{
    if (!p->skip || *p->skip == 0)
        return false;
    if (p->source && p->source != param->data)
        memcpy(param->data, p->source, (size_t)param->numel * nb_dtype_size(param->dtype));
    return true;
}

static void run(nb_range_fn fn, opt_job *j, int64_t n)
{
    if (n < 2 * NB_CPU_GRAIN)
        fn(j, 0, n);
    else
        nb__parallel_for(n, NB_CPU_GRAIN, fn, j);
}

nb_status nb__cpu_sgd_update(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_update_params *p)
{
    if (param->dtype != NB_F32 && param->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "sgd_update", param->dtype);
    nb_status st;
    if ((st = check_same("sgd_update", param, param, "parameter")) ||
        (st = check_same("sgd_update", param, grad, "gradient")) ||
        (slot1 && (st = check_same("sgd_update", param, slot1, "momentum slot"))))
        return st;
    if (skipped(param, p))
        return NB_OK;
    opt_job j = {0};
    j.p = param->data;
    j.src = p->source ? p->source : param->data;
    j.g = grad->data;
    j.m = slot1 ? slot1->data : NULL;
    /* a recorded update reads its numbers where each replay refreshes them */
    const double *dp = p->device_params;
    j.lr = dp ? dp[NB_UPD_LR] : p->lr;
    j.mom = dp ? dp[NB_UPD_MOMENTUM] : p->momentum;
    j.wd = dp ? dp[NB_UPD_WEIGHT_DECAY] : p->weight_decay;
    j.nesterov = p->nesterov;
    run(param->dtype == NB_F32 ? sgd_f32 : sgd_f64, &j, param->numel);
    return NB_OK;
}

nb_status nb__cpu_adam_update(nb_device *dev, const nb_view *param, const nb_view *grad,
                              const nb_view *slot1, const nb_view *slot2,
                              const nb_update_params *p)
{
    if (param->dtype != NB_F32 && param->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "adam_update", param->dtype);
    if (!slot1 || !slot2)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "adam_update: both slots are needed");
    nb_status st;
    if ((st = check_same("adam_update", param, param, "parameter")) ||
        (st = check_same("adam_update", param, grad, "gradient")) ||
        (st = check_same("adam_update", param, slot1, "first-moment slot")) ||
        (st = check_same("adam_update", param, slot2, "second-moment slot")))
        return st;
    if (skipped(param, p))
        return NB_OK;
    /* the step: the device count's (a loss scaler's captured step) or the host's */
    int64_t step = p->device_count ? (int64_t)*p->device_count + 1 : p->step;
    opt_job j = {0};
    j.p = param->data;
    j.src = p->source ? p->source : param->data;
    j.g = grad->data;
    j.m = slot1->data;
    j.v = slot2->data;
    const double *dp = p->device_params; /* as in sgd: a recorded update's numbers */
    if (dp) {
        j.lr = dp[NB_UPD_LR];
        j.wd = dp[NB_UPD_WEIGHT_DECAY];
        j.b1 = dp[NB_UPD_BETA1];
        j.b2 = dp[NB_UPD_BETA2];
        j.eps = dp[NB_UPD_EPSILON];
        j.bc1 = 1.0 / (p->device_count ? nb_update_bias(j.b1, step) : dp[NB_UPD_BC1]);
        j.bc2 = 1.0 / (p->device_count ? nb_update_bias(j.b2, step) : dp[NB_UPD_BC2]);
    } else {
        j.lr = p->lr;
        j.wd = p->weight_decay;
        j.b1 = p->beta1;
        j.b2 = p->beta2;
        j.eps = p->epsilon;
        j.bc1 = 1.0 / nb_update_bias(p->beta1, step);
        j.bc2 = 1.0 / nb_update_bias(p->beta2, step);
    }
    run(param->dtype == NB_F32 ? sgd_f32_adam : sgd_f64_adam, &j, param->numel);
    return NB_OK;
}

nb_status nb__cpu_scaler_update(nb_device *dev, double *state, const double *check, double *count,
                                const nb_scaler_params *p)
{
    (void)dev;
    bool finite = *check == 0;
    nb_scaler_advance(state, finite, p);
    if (count && finite)
        *count += 1;
    return NB_OK;
}

/* Several updates: the single entries in turn, called through dev's table so
 * that a recorded step records each (the CPU gains nothing from one call). */
nb_status nb__cpu_sgd_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                  const nb_view *slot1, const void *const *sources, const nb_update_params *p)
{
    nb_update_params q = *p;
    nb_status st = NB_OK;
    for (int k = 0; k < n && !st; k++) {
        q.source = sources[k];
        st = dev->backend->optim->sgd_update(dev, &param[k], &grad[k], slot1 ? &slot1[k] : NULL, &q);
    }
    return st;
}

nb_status nb__cpu_adam_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                   const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                   const nb_update_params *p)
{
    nb_update_params q = *p;
    nb_status st = NB_OK;
    for (int k = 0; k < n && !st; k++) {
        q.source = sources[k];
        st = dev->backend->optim->adam_update(dev, &param[k], &grad[k], &slot1[k], &slot2[k], &q);
    }
    return st;
}
