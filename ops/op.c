/* Shared front-end helpers: dtype and axis checks, contiguous copies for
 * kernels, broadcasting, finishing an op. They call lib/core and the kernels
 * of dev->backend only, never an op: every op file builds on this one. */
#include "op.h"
#include "lib/core/op_phases.h"

#include <stdio.h>

static void dtype_list(unsigned mask, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int d = 0; d < NB_DTYPE_COUNT && n < size; d++)
        if (mask & NB_MASK(d))
            n += (size_t)snprintf(buf + n, size - n, n ? ", %s" : "%s", nb_dtype_name((nb_dtype)d));
}

nb_status nb__check_dtype(const char *op, const char *what, const nb_tensor *t, unsigned mask)
{
    if (mask & NB_MASK(t->dtype))
        return NB_OK;
    char list[96];
    dtype_list(mask, list, sizeof list);
    return nb__fail(NB_ERR_DTYPE, "%s: %s has dtype %s; expected one of %s", op, what, nb_dtype_name(t->dtype), list);
}

nb_status nb__check_same_dtype(const char *op, const nb_tensor *a, const nb_tensor *b)
{
    if (a->dtype == b->dtype)
        return NB_OK;
    return nb__fail(NB_ERR_DTYPE, "%s: dtypes differ: %s and %s (nabla does not promote; use nb_cast)", op,
                    nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
}

int nb__axis(const char *op, int axis, int ndim)
{
    int a = axis < 0 ? axis + ndim : axis;
    if (a < 0 || a >= ndim) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is out of range for a %d-d tensor", op, axis, ndim);
        return -1;
    }
    return a;
}

int nb__axes_mask(const char *op, nb_axes axes, int ndim)
{
    if (axes.n == 0)
        return (1 << ndim) - 1;
    if (axes.n < 0 || axes.n > NB_MAX_DIMS) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d axes given", op, axes.n);
        return -1;
    }
    int mask = 0;
    for (int i = 0; i < axes.n; i++) {
        int a = nb__axis(op, axes.axes[i], ndim);
        if (a < 0)
            return -1;
        if (mask & (1 << a)) {
            nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is repeated", op, axes.axes[i]);
            return -1;
        }
        mask |= 1 << a;
    }
    return mask;
}

const nb_tensor *nb__dense(const char *op, const nb_tensor *t, nb_tensor **tmp)
{
    *tmp = NULL;
    if (t->contiguous)
        return t;
    nb_device *dev = t->device;
    nb_tensor *c = nb__tensor_new(op, dev, t->dtype, t->ndim, t->shape);
    if (!c)
        return NULL;
    if (t->numel) {
        nb_view vo = nb__view(c), vi = nb__view(t);
        if (!(c = nb__kernel_done(dev->backend->copy(dev, &vo, &vi), c)))
            return NULL;
    }
    *tmp = c;
    return c;
}

bool nb__broadcast(const char *op, const nb_tensor *a, const nb_tensor *b, int *ndim, int64_t *out)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX];
            nb__fail(NB_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                     nb__shape_str(a->ndim, a->shape, sa, sizeof sa), nb__shape_str(b->ndim, b->shape, sb, sizeof sb),
                     i, (long long)da, (long long)db);
            return false;
        }
        out[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return true;
}

nb_tensor *nb__finish(const nb_op_def *def, int n_in, const nb_tensor *const *inputs, nb_tensor *out,
                      const nb_op_attrs *attrs)
{
    if (!out)
        return NULL;
    if (nb__tape_recording()) {
        int phase = nb__phase_enter(NB_PHASE_RECORD);
        nb_status st = nb__record(def, n_in, inputs, 1, &out, attrs);
        nb__phase_leave(phase);
        if (st) {
            nb__release(out);
            return NULL;
        }
    }
    return nb__own(out);
}
