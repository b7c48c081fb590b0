/* Shared front-end helpers: checks, placement, broadcasting, finishing an op. */
#include "op.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

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

nb_device *nb__op_place(const char *op, int n, const nb_tensor **inputs)
{
    nb_device *pushed = nb__device_pushed();
    nb_device *dev = pushed ? pushed : inputs[0]->device;
    for (int i = 0; i < n; i++) {
        if (inputs[i]->device == dev)
            continue;
        if (!pushed)
            return nb__fail_null(NB_ERR_DEVICE,
                                 "%s: inputs are on two devices, %s and %s; push a device to have them copied there",
                                 op, dev->name, inputs[i]->device->name);
        nb_tensor *moved = nb__copy_to_device(inputs[i], dev);
        if (!moved)
            return NULL;
        inputs[i] = moved;
    }
    if (nb__log_placement_enabled())
        nb__log_op(op, dev);
    return dev;
}

bool nb__supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype)
{
    const nb_backend *b = dev->backend;
    if (b->supports)
        return b->supports(dev, k, variant, dtype);
    return (unsigned)dtype < NB_DTYPE_COUNT && (b->dtypes & NB_MASK(dtype));
}

/* One warning per (device kind, kernel, variant, dtype) a fallback served: a
 * training loop would otherwise repeat it every step. */
#define WARN_VARIANTS 32
static atomic_uchar g_warned[2][NB_K_COUNT][WARN_VARIANTS][NB_DTYPE_COUNT];

nb_device *nb__op_place_kernel(const char *op, int n, const nb_tensor **inputs, nb_kernel k, int variant,
                               nb_dtype dtype)
{
    nb_device *dev = nb__op_place(op, n, inputs);
    if (!dev || nb__supports(dev, k, variant, dtype))
        return dev;
    nb_device *cpu = nb__device_cpu0();
    bool can_fall_back = dev != cpu && nb__supports(cpu, k, variant, dtype);
    if (!can_fall_back || !nb__soft_placement()) {
        return nb__fail_null(NB_ERR_UNSUPPORTED, "%s: %s does not run it for dtype %s%s", op, dev->name,
                             nb_dtype_name(dtype),
                             can_fall_back ? " (placement is strict; soft placement would use /cpu:0)" : "");
    }
    if ((unsigned)dev->kind < 2 && (unsigned)variant < WARN_VARIANTS &&
        !atomic_exchange(&g_warned[dev->kind][k][variant][dtype], 1))
        nb__log(NB_LOG_WARNING, "%s: %s does not run it for dtype %s; running it on /cpu:0", op, dev->name,
                nb_dtype_name(dtype));
    for (int i = 0; i < n; i++) {
        if (inputs[i]->device == cpu)
            continue;
        nb_tensor *moved = nb__copy_to_device(inputs[i], cpu);
        if (!moved)
            return NULL;
        inputs[i] = moved;
    }
    return cpu;
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
    if (nb__tape_recording() && nb__record(def, n_in, inputs, 1, &out, attrs)) {
        nb__release(out);
        return NULL;
    }
    return nb__own(out);
}

nb_tensor *nb__sum_to(nb_tensor *g, int ndim, const int64_t *shape)
{
    if (!g)
        return NULL;
    bool same = g->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = g->shape[i] == shape[i];
    if (same)
        return g;
    nb_axes axes = {0, {0}};
    int lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1))
            axes.axes[axes.n++] = i;
    nb_tensor *s = axes.n ? nb_sum(g, axes, true) : g;
    nb_shape target = {ndim, {0}};
    memcpy(target.dims, shape, sizeof(int64_t) * (size_t)ndim);
    return nb_reshape(s, target);
}

nb_tensor *nb__expand_reduced(nb_tensor *g, const nb_tensor *x, int mask)
{
    nb_shape keep = {x->ndim, {0}};
    for (int i = 0; i < x->ndim; i++)
        keep.dims[i] = (mask & (1 << i)) ? 1 : x->shape[i];
    return nb_broadcast_to(nb_reshape(g, keep), nb_tensor_shape(x));
}
