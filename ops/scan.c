/* Scans: the running sum along an axis (nb_cumsum), with its gradient. */
#include "op.h"

/* attrs: i[0] = the axis (normalised), i[1] = exclusive, i[2] = reverse. */

/* y[i] sums x[j] over j <= i (forward) or j >= i (reverse), the bound left out
 * when exclusive; so x[j] reaches exactly the y[i] with i >= j (forward) or
 * i <= j (reverse), bound excluded the same way: the gradient is the running
 * sum of g the other way round, with the same exclusiveness. Built from
 * nb_cumsum itself, so every order of gradient follows. */
static nb_status cumsum_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb_cumsum(g[0], (int)n->attrs.i[0], n->attrs.i[1] != 0, n->attrs.i[2] == 0);
    return nb__ok(gi[0]);
}

static const nb_op_def cumsum_def = {.name = "cumsum", .grad = cumsum_grad};

nb_tensor *nb_cumsum(const nb_tensor *x, int axis, bool exclusive, bool reverse)
{
    const char *op = "cumsum";
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_NUMERIC))
        return NULL;
    /* A 0-d tensor is one element along axis 0 (or -1), as in PyTorch. */
    if (x->ndim == 0 && axis != 0 && axis != -1)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is out of range for a 0-d tensor (0 or -1)",
                             op, axis);
    int a = x->ndim == 0 ? 0 : nb__axis(op, axis, x->ndim);
    if (a < 0)
        return NULL;
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_CUMSUM, 0, x->dtype);
    if (!dev)
        return NULL;
    nb_tensor *out = nb__out(op, dev, x->dtype, x->ndim, x->shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(in[0]);
    if (x->ndim == 0) { /* kernels see a 1-d tensor of one element */
        vo.ndim = vx.ndim = 1;
        vo.shape[0] = vx.shape[0] = 1;
        vo.strides[0] = vx.strides[0] = (int64_t)nb_dtype_size(x->dtype);
    }
    nb_status st = out->numel == 0 ? NB_OK : dev->backend->cumsum(dev, &vo, &vx, a, exclusive, reverse);
    if (!nb__kernel_done(st, out))
        return NULL;
    nb_op_attrs attrs = {0};
    attrs.i[0] = a;
    attrs.i[1] = exclusive;
    attrs.i[2] = reverse;
    return nb__finish(&cumsum_def, 1, in, out, &attrs);
}
