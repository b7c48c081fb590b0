/* The public gradient checker: tape gradients against central differences. */
#include "tape_impl.h"
#include "lib/core/backend.h"

#include <math.h>
#include <stdlib.h>

/* The scalar the checker differentiates: sum(fn(inputs) * weights). */
static nb_tensor *checked_scalar(nb_checked_fn fn, void *user, int n, nb_tensor *const *inputs,
                                 nb_tensor **weights)
{
    nb_tensor *y = fn(n, inputs, user);
    if (!y)
        return nb_error() ? NULL : nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_gradient_check: fn returned NULL");
    if (y->dtype != NB_F64)
        return nb__fail_null(NB_ERR_DTYPE, "nb_gradient_check: fn returned %s, expected f64", nb_dtype_name(y->dtype));
    if (!*weights) {
        /* Fixed weights in [0.5, 1.5] make every output element count, unevenly. */
        nb_device *dev = y->device;
        nb_device_push(dev->name);
        *weights = nb_random_uniform(NB_F64, nb_tensor_shape(y), 0.5, 1.5, 1234567);
        nb_device_pop();
        if (!*weights)
            return NULL;
        nb__retain(*weights);
    }
    return nb_sum_all(nb_mul(y, *weights));
}

static double eval_scalar(nb_checked_fn fn, void *user, int n, nb_tensor *const *inputs, nb_tensor **weights)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *l = checked_scalar(fn, user, n, inputs, weights);
    double v = l ? nb_tensor_item(l) : NAN;
    nb_scope_end(s);
    return v;
}

static nb_status poke(nb_tensor *t, int64_t flat, double value)
{
    int64_t off = 0, rem = flat;
    for (int i = t->ndim - 1; i >= 0; i--) {
        off += (rem % t->shape[i]) * t->strides[i];
        rem /= t->shape[i];
    }
    return t->device->backend->copy_from_host(t->device, (char *)nb__data(t) + off, &value, sizeof value);
}

nb_status nb_gradient_check(nb_checked_fn fn, void *user, int n, nb_tensor *const *inputs, double eps,
                            double tolerance, double *max_error)
{
    const char *who = "nb_gradient_check";
    if (max_error)
        *max_error = INFINITY;
    if (!fn || n < 1 || !inputs || !(eps > 0))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: need fn, at least one input and eps > 0", who);
    for (int i = 0; i < n; i++) {
        if (!inputs[i])
            return nb__null_input(who, i), nb_error();
        if (inputs[i]->dtype != NB_F64)
            return nb__fail(NB_ERR_DTYPE, "%s: input %d is %s; gradient checks need f64", who, i,
                            nb_dtype_name(inputs[i]->dtype));
    }
    nb_tensor *weights = NULL;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    nb_tape *tape = nb_tape_begin();
    nb_tensor **analytic = calloc((size_t)n, sizeof *analytic);
    nb_status st = tape && analytic ? NB_OK : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
    for (int i = 0; i < n && !st; i++)
        st = nb_tape_watch(tape, inputs[i]);
    nb_tensor *l = st ? NULL : checked_scalar(fn, user, n, inputs, &weights);
    if (!st && !l)
        st = nb_error();
    if (!st)
        st = nb_tape_gradient_ex(tape, l, NULL, n, inputs, analytic, NB_UNCONNECTED_ZERO);

    double worst = 0;
    for (int i = 0; i < n && !st; i++) {
        nb_tensor *x = inputs[i];
        for (int64_t e = 0; e < x->numel && !st; e++) {
            double x0 = nb_tensor_get(x, e);
            double a = nb_tensor_get(analytic[i], e);
            st = poke(x, e, x0 + eps);
            double up = st ? NAN : eval_scalar(fn, user, n, inputs, &weights);
            if (!st)
                st = poke(x, e, x0 - eps);
            double down = st ? NAN : eval_scalar(fn, user, n, inputs, &weights);
            if (!st)
                st = poke(x, e, x0);
            if (st || nb_error()) {
                st = nb_error() ? nb_error() : st;
                break;
            }
            double num = (up - down) / (2 * eps);
            double scale = fmax(1.0, fmax(fabs(a), fabs(num)));
            double err = fabs(a - num) / scale;
            if (!(err <= worst))
                worst = isnan(err) ? INFINITY : err;
            if (!(err <= tolerance)) {
                if (max_error)
                    *max_error = worst;
                st = nb__fail(NB_ERR_TAPE, "%s: input %d element %lld: tape gradient %.10g, numeric %.10g (error %.3g > %.3g)",
                              who, i, (long long)e, a, num, err, tolerance);
            }
        }
    }
    if (!st && max_error)
        *max_error = worst;
    free(analytic);
    nb__release(weights);
    nb_scope_end(s);
    return st;
}
