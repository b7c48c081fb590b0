/* nabla — dynamic loss scaling (nabla/optimizer.h): the scale goes up after a
 * run of applied steps and down at a step whose gradients overflowed, which
 * is skipped. The finiteness check is one reduction per gradient and one
 * number read back: sum(g * 0) is 0 exactly when every element of g is
 * finite (an infinity times 0, and a NaN, give NaN). */
#include "lib/core/core.h"

#include <math.h>
#include <stdlib.h>

#define SCALE_MIN 0x1p-64
#define SCALE_MAX 0x1p64

struct nb_loss_scaler {
    double scale, growth, backoff;
    int64_t interval, good, skipped;
};

static bool scale_ok(double s) { return s >= SCALE_MIN && s <= SCALE_MAX; }

nb_loss_scaler *nb_loss_scaler_new(double initial_scale, double growth, double backoff, int64_t growth_interval)
{
    const char *who = "nb_loss_scaler_new";
    if (!scale_ok(initial_scale))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: initial scale %g is outside [2^-64, 2^64]", who,
                             initial_scale);
    if (!(growth > 1 && isfinite(growth)))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: growth %g must be finite and more than 1", who, growth);
    if (!(backoff > 0 && backoff < 1))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: backoff %g must be in (0, 1)", who, backoff);
    if (growth_interval < 1)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: growth interval %lld must be at least 1", who,
                             (long long)growth_interval);
    nb_loss_scaler *ls = calloc(1, sizeof *ls);
    if (!ls)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    *ls = (nb_loss_scaler){initial_scale, growth, backoff, growth_interval, 0, 0};
    return ls;
}

nb_tensor *nb_loss_scaler_scale(nb_loss_scaler *ls, const nb_tensor *loss)
{
    if (!ls || !loss)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_scale: the %s is NULL", !ls ? "scaler" : "loss");
    return nb_mul_scalar(loss, ls->scale);
}

/* The unscaled gradients into out (NULL stays NULL) and whether all are
 * finite; in a scope the caller ends after the update. */
static nb_status unscale(nb_loss_scaler *ls, int n, nb_tensor *const *grads, nb_tensor **out, bool *finite)
{
    nb_tensor *bad = NULL; /* the sum of every g * 0, on the first gradient's device */
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!grads[i])
            continue;
        if (!(out[i] = nb_mul_scalar(grads[i], 1.0 / ls->scale)))
            return nb_error();
        nb_tensor *z = nb_cast(nb_sum_all(nb_mul_scalar(out[i], 0.0)), NB_F64);
        if (z && bad)
            z = nb_to_device(z, nb_tensor_device(bad)); /* itself when already there */
        bad = !z ? NULL : bad ? nb_add(bad, z) : z;
        if (!bad)
            return nb_error();
    }
    double v = 0;
    if (bad) {
        nb_status st = nb_tensor_read(bad, &v, sizeof v);
        if (st)
            return st;
    }
    *finite = v == 0;
    return NB_OK;
}

nb_status nb_loss_scaler_step(nb_loss_scaler *ls, nb_optimizer *opt, int n, nb_variable *const *vars,
                              nb_tensor *const *grads, bool *stepped)
{
    const char *who = "nb_loss_scaler_step";
    if (stepped)
        *stepped = false;
    if (!ls || !opt || n < 0 || (n > 0 && (!vars || !grads)))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who,
                        !ls ? "the scaler is NULL" : !opt ? "the optimizer is NULL" : n < 0 ? "n is negative"
                                                                                         : "an array is NULL");
    nb_tensor **g = calloc((size_t)(n > 0 ? n : 1), sizeof *g);
    if (!g)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    nb_scope *s = nb_scope_begin();
    bool finite = false;
    nb_status st = s ? unscale(ls, n, grads, g, &finite) : nb_error();
    if (!st && finite)
        st = nb_optimizer_apply(opt, n, vars, g);
    nb_scope_end(s);
    free(g);
    if (st)
        return st;
    if (finite) {
        if (++ls->good >= ls->interval) {
            ls->scale = fmin(ls->scale * ls->growth, SCALE_MAX);
            ls->good = 0;
        }
    } else {
        ls->scale = fmax(ls->scale * ls->backoff, SCALE_MIN);
        ls->good = 0;
        ls->skipped++;
    }
    if (stepped)
        *stepped = finite;
    return NB_OK;
}

double nb_loss_scaler_get_scale(const nb_loss_scaler *ls) { return ls ? ls->scale : 0; }
int64_t nb_loss_scaler_skipped(const nb_loss_scaler *ls) { return ls ? ls->skipped : 0; }
int64_t nb_loss_scaler_good_steps(const nb_loss_scaler *ls) { return ls ? ls->good : 0; }

nb_status nb_loss_scaler_set_state(nb_loss_scaler *ls, double scale, int64_t good_steps)
{
    if (!ls || !scale_ok(scale) || good_steps < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_set_state: %s",
                        !ls ? "the scaler is NULL" : !scale_ok(scale) ? "the scale is outside [2^-64, 2^64]"
                                                                       : "the count is negative");
    ls->scale = scale;
    ls->good = good_steps;
    return NB_OK;
}

void nb_loss_scaler_free(nb_loss_scaler *ls) { free(ls); }
