/* Losses, composed from differentiable ops so that every order of gradient
 * works; sparse softmax cross-entropy runs as one kernel each way where the
 * device has one, its gradient as ops again under a recording tape. */
#include "op.h"

#include <string.h>

static bool check_logits_2d(const char *op, const nb_tensor *logits)
{
    if (nb__check_dtype(op, "logits", logits, NB_FLOATS))
        return false;
    if (logits->ndim != 2) {
        char s[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "%s: logits must be [N, C], got %s", op,
                 nb__shape_str(logits->ndim, logits->shape, s, sizeof s));
        return false;
    }
    return true;
}

static bool same_shape(const char *op, const nb_tensor *a, const char *an, const nb_tensor *b, const char *bn)
{
    bool same = nb__same_shape(a, b);
    if (!same) {
        char sa[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "%s: %s %s and %s %s must have the same shape", op, an,
                 nb__shape_str(a->ndim, a->shape, sa, sizeof sa), bn, nb__shape_str(b->ndim, b->shape, sb, sizeof sb));
    }
    return same;
}

nb_tensor *nb_softmax_cross_entropy(const nb_tensor *logits, const nb_tensor *labels)
{
    const char *op = "softmax_cross_entropy";
    if (!logits)
        return nb__null_input(op, 0);
    if (!labels)
        return nb__null_input(op, 1);
    if (!check_logits_2d(op, logits) || nb__check_same_dtype(op, logits, labels) ||
        !same_shape(op, logits, "logits", labels, "labels"))
        return NULL;
    return nb_neg(nb_sum(nb_mul(labels, nb_log_softmax(logits, -1)), NB_AXES(-1), false));
}

/* ---- sparse softmax cross-entropy ---------------------------------------------------
 * As ops it is neg(sum(where(one_hot(labels), log_softmax(logits), 0))), about
 * 7 kernels forward and 8 backward, the bulk of a small model's step. Where
 * the device has the row kernels (backend.h: softmax_xent) it is one kernel
 * each way, the same values (on the CPU the same bits), recorded as one op
 * whose second output keeps each row's max and log-sum for the gradient. */

/* Whether the row kernels serve logits and labels (optional entries: the
 * pointers first), as layer_norm's rows_ok. */
static bool xent_rows_ok(const nb_tensor *logits, const nb_tensor *labels)
{
    nb_device *dev = logits->device, *pushed = nb__device_pushed();
    const nb_backend *b = dev->backend;
    return (!pushed || pushed == dev) && labels->device == dev && b->softmax_xent && b->softmax_xent_grad &&
           nb__supports(dev, NB_K_SOFTMAX_XENT, 0, logits->dtype) &&
           nb__supports(dev, NB_K_SOFTMAX_XENT_GRAD, 0, logits->dtype);
}

/* The gradient of the logits as ops (differentiable again): G - exp(log_softmax(x))
 * sum(G), G = -g at the label and 0 elsewhere. */
static nb_tensor *xent_grad_ops(const char *op, const nb_tensor *x, const nb_tensor *labels, nb_tensor *g)
{
    nb_tensor *target = nb_one_hot(labels, x->shape[1], NB_BOOL);
    nb_tensor *zero = nb__scalar_on(op, x->device, x->dtype, 0.0);
    nb_tensor *G = nb_where(target, nb_expand_dims(nb_neg(g), -1), zero);
    return nb_sub(G, nb_mul(nb_exp(nb_log_softmax(x, -1)), nb_sum(G, NB_AXES(-1), true)));
}

/* One pass over g, x and the saved stats (nothing records it). */
static nb_tensor *xent_grad_rows(const char *op, const nb_tensor *x, const nb_tensor *labels, const nb_tensor *stats,
                                 nb_tensor *g)
{
    nb_device *dev = x->device;
    nb_tensor *tx, *tl, *dx = NULL;
    const nb_tensor *xd = nb__dense(op, x, &tx), *ld = nb__dense(op, labels, &tl);
    bool ok = xd && ld && (dx = nb__out(op, dev, x->dtype, 2, x->shape));
    if (ok) { /* g as it is: a mean's gradient, one value broadcast, is not copied */
        nb_view vdx = nb__view(dx), vg = nb__view(g), vx = nb__view(xd), vs = nb__view(stats), vl = nb__view(ld);
        ok = dev->backend->softmax_xent_grad(dev, &vdx, &vg, &vx, &vs, &vl) == NB_OK;
    }
    nb__release(tx), nb__release(tl);
    if (!ok) {
        nb__release(dx);
        return NULL;
    }
    return nb__own(dx);
}

/* Inputs logits and labels; outputs the loss and the stats [N, 2]. Under a
 * recording tape, or off the row kernels' device, the ops' form. */
static nb_status xent_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const char *op = n->op->name;
    const nb_tensor *x = n->in[0], *labels = n->in[1];
    gi[0] = gi[1] = NULL;
    if (!nb__needs_grad(n, 0))
        return NB_OK;
    if (!nb__tape_recording() && g[0]->device == x->device && xent_rows_ok(x, labels))
        gi[0] = xent_grad_rows(op, x, labels, n->out[1], g[0]);
    else
        gi[0] = xent_grad_ops(op, x, labels, g[0]);
    return nb__ok(gi[0]);
}

static const nb_op_def xent_def = {.name = "sparse_softmax_cross_entropy", .grad = xent_grad, .n_grad_outputs = 1};

static nb_tensor *xent_rows(const nb_tensor *logits, const nb_tensor *labels)
{
    const char *op = xent_def.name;
    nb_device *dev = logits->device;
    const nb_dtype dt = logits->dtype, stat_dt = dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt;
    const int64_t N = logits->shape[0], stat_shape[2] = {N, 2};
    nb_tensor *tx, *tl, *loss = NULL, *stats = NULL;
    const nb_tensor *xd = nb__dense(op, logits, &tx), *ld = nb__dense(op, labels, &tl);
    bool ok = xd && ld && (loss = nb__out(op, dev, dt, 1, &N)) && (stats = nb__out(op, dev, stat_dt, 2, stat_shape));
    if (ok) {
        nb_view vloss = nb__view(loss), vs = nb__view(stats), vx = nb__view(xd), vl = nb__view(ld);
        ok = dev->backend->softmax_xent(dev, &vloss, &vs, &vx, &vl) == NB_OK;
    }
    nb__release(tx), nb__release(tl);
    if (!ok) {
        nb__release(loss), nb__release(stats);
        return NULL;
    }
    loss = nb__own(loss);
    stats = nb__own(stats);
    if (!loss || !stats)
        return NULL;
    const nb_tensor *in[2] = {logits, labels};
    nb_tensor *out[2] = {loss, stats};
    return nb__record(&xent_def, 2, in, 2, out, NULL) ? NULL : loss;
}

nb_tensor *nb_sparse_softmax_cross_entropy(const nb_tensor *logits, const nb_tensor *labels)
{
    const char *op = xent_def.name;
    if (!logits)
        return nb__null_input(op, 0);
    if (!labels)
        return nb__null_input(op, 1);
    if (!check_logits_2d(op, logits) || nb__check_dtype(op, "labels", labels, NB_INTS))
        return NULL;
    char sa[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX];
    if (labels->ndim != 1 || labels->shape[0] != logits->shape[0])
        return nb__fail_null(NB_ERR_SHAPE, "%s: labels %s must be [N] for logits %s", op,
                             nb__shape_str(labels->ndim, labels->shape, sa, sizeof sa),
                             nb__shape_str(logits->ndim, logits->shape, sb, sizeof sb));
    int64_t C = logits->shape[1];
    /* the row kernel checks the labels itself */
    if (labels->numel > 0 && C > 0 && xent_rows_ok(logits, labels))
        return xent_rows(logits, labels);
    if (labels->numel > 0) {
        /* A label outside [0, C) would silently give a zero row: refused. On a
         * GPU the check is queued, and a bad label is reported at the next
         * synchronising call, so the step does not wait for it. */
        nb_tensor *tmp;
        const nb_tensor *flat = nb__dense(op, labels, &tmp);
        if (!flat)
            return NULL;
        nb_view vl = nb__view(flat);
        nb_status st = flat->device->backend->check_indices(flat->device, op, &vl, C);
        nb__release(tmp);
        if (st)
            return NULL;
    }
    if (C == 0) /* no classes, so no labels (checked above): an empty loss */
        return nb_neg(nb_sum(logits, NB_AXES(-1), false));
    nb_tensor *target = nb_one_hot(labels, C, NB_BOOL);
    if (target && target->device != logits->device && !nb__device_pushed())
        return nb__fail_null(NB_ERR_DEVICE, "%s: logits on %s and labels on %s", op, logits->device->name,
                             labels->device->name);
    /* Picked, not multiplied by the one-hot: a -inf logit of another class
     * would make 0 * -inf = NaN of a finite loss. */
    nb_tensor *zero = nb__scalar_on(op, logits->device, logits->dtype, 0.0);
    return nb_neg(nb_sum(nb_where(target, nb_log_softmax(logits, -1), zero), NB_AXES(-1), false));
}

/* max(x, 0) - x z + log(1 + exp(-|x|)), written max(x, 0) (1 - z) + max(-x, 0) z
 * + ...: accurate for any x, and +inf, not inf - inf = NaN, at an infinite
 * logit. relu and abs have slope 0 at 0, so the gradient of these ops there
 * would be -z: the op records itself instead, with its exact gradient. */
static nb_tensor *sigmoid_ce_forward(const nb_tensor *x, const nb_tensor *z)
{
    nb_tensor *linear = nb_add(nb_mul(nb_relu(x), nb_add_scalar(nb_neg(z), 1.0)), nb_mul(nb_relu(nb_neg(x)), z));
    return nb_add(linear, nb_softplus(nb_neg(nb_abs(x))));
}

/* The exact gradient everywhere, x = 0 included: (sigmoid(x) - z) g for the
 * logits, -x g for the labels; written with ops, so it differentiates again. */
static nb_status sigmoid_ce_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = gi[1] = NULL;
    if (nb__needs_grad(n, 0) && !(gi[0] = nb_mul(nb_sub(nb_sigmoid(n->in[0]), n->in[1]), g[0])))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb_mul(nb_neg(n->in[0]), g[0])))
        return nb__ok(NULL);
    return NB_OK;
}

static const nb_op_def sigmoid_ce_def = {.name = "sigmoid_cross_entropy", .grad = sigmoid_ce_grad};

nb_tensor *nb_sigmoid_cross_entropy(const nb_tensor *logits, const nb_tensor *labels)
{
    const char *op = sigmoid_ce_def.name;
    if (!logits)
        return nb__null_input(op, 0);
    if (!labels)
        return nb__null_input(op, 1);
    if (nb__check_dtype(op, "logits", logits, NB_FLOATS) || nb__check_same_dtype(op, logits, labels) ||
        !same_shape(op, logits, "logits", labels, "labels"))
        return NULL;
    /* A composite: its ops run unrecorded, and it is recorded as one op. */
    int token = nb__tapes_pause();
    nb_tensor *out = sigmoid_ce_forward(logits, labels);
    nb__tapes_resume(token);
    const nb_tensor *in[2] = {logits, labels};
    if (!out || nb__record(&sigmoid_ce_def, 2, in, 1, &out, NULL))
        return NULL;
    return out;
}

nb_tensor *nb_mean_squared_error(const nb_tensor *pred, const nb_tensor *target)
{
    const char *op = "mean_squared_error";
    if (!pred)
        return nb__null_input(op, 0);
    if (!target)
        return nb__null_input(op, 1);
    if (nb__check_dtype(op, "pred", pred, NB_FLOATS) || nb__check_same_dtype(op, pred, target) ||
        !same_shape(op, pred, "pred", target, "target"))
        return NULL;
    return nb_mean_all(nb_square(nb_sub(pred, target)));
}
