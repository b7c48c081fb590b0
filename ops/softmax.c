/* Softmax and log-softmax over one axis, with their gradients. */
#include "op.h"

static nb_status softmax_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    /* y (g - sum(g y)) over the last axis */
    nb_tensor *y = n->out[0];
    nb_tensor *dot = nb_sum(nb_mul(g[0], y), NB_AXES(-1), true);
    gi[0] = nb_mul(y, nb_sub(g[0], dot));
    return nb__ok(gi[0]);
}

static nb_status log_softmax_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    /* g - exp(y) sum(g) over the last axis */
    nb_tensor *y = n->out[0];
    gi[0] = nb_sub(g[0], nb_mul(nb_exp(y), nb_sum(g[0], NB_AXES(-1), true)));
    return nb__ok(gi[0]);
}

static const nb_op_def softmax_def = {.name = "softmax", .grad = softmax_grad};
static const nb_op_def log_softmax_def = {.name = "log_softmax", .grad = log_softmax_grad};

static nb_tensor *softmax_last(const nb_op_def *def, bool log, const nb_tensor *x)
{
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(def->name, 1, in, NB_K_SOFTMAX, 0, x->dtype);
    if (!dev)
        return NULL;
    if (!in[0]->contiguous && !(in[0] = nb_contiguous(in[0])))
        return NULL;
    nb_tensor *out = nb__out(def->name, dev, x->dtype, x->ndim, x->shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(in[0]);
    out = nb__kernel_done(x->numel ? dev->backend->softmax(dev, log, &vo, &vx) : NB_OK, out);
    return nb__finish(def, 1, in, out, NULL);
}

static nb_tensor *softmax_any(const nb_op_def *def, bool log, const nb_tensor *x, int axis)
{
    const char *op = def->name;
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return NULL;
    if (x->ndim == 0)
        return nb__fail_null(NB_ERR_SHAPE, "%s: input must have at least 1 dim", op);
    int a = nb__axis(op, axis, x->ndim);
    if (a < 0)
        return NULL;
    if (a == x->ndim - 1)
        return softmax_last(def, log, x);
    /* Move the axis last, work there, and move it back (all recorded views). */
    nb_tensor *t = nb_transpose(x, a, -1);
    return nb_transpose(t ? softmax_last(def, log, t) : NULL, a, -1);
}

nb_tensor *nb_softmax(const nb_tensor *x, int axis) { return softmax_any(&softmax_def, false, x, axis); }
nb_tensor *nb_log_softmax(const nb_tensor *x, int axis) { return softmax_any(&log_softmax_def, true, x, axis); }
