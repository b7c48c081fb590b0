/* Copying ops on one device: cast, pad, stop_gradient. Copies between devices
 * are in placement.c. */
#include "op.h"

#include <string.h>

/* ---- cast --------------------------------------------------------------------- */

static nb_status cast_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_dtype from = n->in[0]->dtype;
    if (!nb__is_floating(from) || !nb__is_floating(g[0]->dtype)) {
        gi[0] = NULL; /* no gradient through an integer dtype */
        return NB_OK;
    }
    gi[0] = nb_cast(g[0], from);
    return nb__ok(gi[0]);
}

static const nb_op_def cast_def = {.name = "cast", .grad = cast_grad};

nb_tensor *nb_cast(const nb_tensor *x, nb_dtype dtype)
{
    const char *op = cast_def.name;
    if (!x)
        return nb__null_input(op, 0);
    if ((unsigned)dtype >= NB_DTYPE_COUNT)
        return nb__fail_null(NB_ERR_DTYPE, "%s: %d is not a dtype", op, (int)dtype);
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_COPY, 0, x->dtype);
    if (!dev)
        return NULL;
    nb_tensor *out = nb__out(op, dev, dtype, SHAPE_OF(x));
    if (out && out->numel) {
        nb_view vo = nb__view(out), vi = nb__view(in[0]);
        out = nb__kernel_done(dev->backend->copy(dev, &vo, &vi), out);
    }
    /* Recorded only when both sides are floating (the tape skips integer outputs;
     * integer inputs are never watched). */
    return nb__finish(&cast_def, 1, in, out, NULL);
}

/* ---- pad ---------------------------------------------------------------------- */

static nb_status pad_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const nb_tensor *x = n->in[0];
    nb_shape begin = {x->ndim, {0}}, size = {x->ndim, {0}};
    for (int i = 0; i < x->ndim; i++) {
        begin.dims[i] = n->attrs.i[i];
        size.dims[i] = x->shape[i];
    }
    gi[0] = nb_slice(g[0], begin, size);
    return nb__ok(gi[0]);
}

static const nb_op_def pad_def = {.name = "pad", .grad = pad_grad};

nb_tensor *nb_pad(const nb_tensor *x, nb_shape before, nb_shape after, double value)
{
    const char *op = pad_def.name;
    if (!x)
        return nb__null_input(op, 0);
    char sx[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX], sa[NB_SHAPE_STR_MAX];
    if (before.ndim != x->ndim || after.ndim != x->ndim)
        return nb__fail_null(NB_ERR_SHAPE, "%s: before %s and after %s must each have one entry per dim of %s", op,
                             nb__shape_str(before.ndim, before.dims, sb, sizeof sb),
                             nb__shape_str(after.ndim, after.dims, sa, sizeof sa),
                             nb__shape_str(SHAPE_OF(x), sx, sizeof sx));
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) {
        if (before.dims[i] < 0 || after.dims[i] < 0)
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: dim %d: negative padding (before %lld, after %lld)", op,
                                 i, (long long)before.dims[i], (long long)after.dims[i]);
        if (__builtin_add_overflow(before.dims[i], x->shape[i], &shape[i]) ||
            __builtin_add_overflow(shape[i], after.dims[i], &shape[i]))
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: dim %d of %s padded by %lld and %lld is past what "
                                 "int64 can count", op, i, nb__shape_str(SHAPE_OF(x), sx, sizeof sx),
                                 (long long)before.dims[i], (long long)after.dims[i]);
    }
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place(op, 1, in);
    if (!dev)
        return NULL;
    nb_tensor *out = nb__out(op, dev, x->dtype, x->ndim, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out);
    if (out->numel)
        out = nb__kernel_done(dev->backend->fill(dev, &vo, value), out);
    if (out && x->numel) {
        /* x goes into the interior: a strided view of out's storage. */
        nb_view part = vo;
        for (int i = 0; i < x->ndim; i++) {
            part.data = (char *)part.data + before.dims[i] * vo.strides[i];
            part.shape[i] = x->shape[i];
        }
        part.numel = x->numel;
        part.contiguous = nb__view_is_contiguous(&part);
        nb_view vi = nb__view(in[0]);
        out = nb__kernel_done(dev->backend->copy(dev, &part, &vi), out);
    }
    nb_op_attrs attrs = {0};
    for (int i = 0; i < x->ndim; i++)
        attrs.i[i] = before.dims[i];
    return nb__finish(&pad_def, 1, in, out, &attrs);
}

/* ---- stop_gradient ------------------------------------------------------------ */

nb_tensor *nb_stop_gradient(const nb_tensor *x)
{
    if (!x)
        return nb__null_input("stop_gradient", 0);
    /* A new tensor (a new id, so no tape knows it) over the same storage. */
    return nb__own(nb__tensor_view(x, SHAPE_OF(x), x->strides, x->offset));
}
