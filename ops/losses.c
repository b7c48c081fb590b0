/* Losses, composed from differentiable ops so that every order of gradient works. */
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

nb_tensor *nb_sparse_softmax_cross_entropy(const nb_tensor *logits, const nb_tensor *labels)
{
    const char *op = "sparse_softmax_cross_entropy";
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

static const nb_op_def sigmoid_ce_def = {"sigmoid_cross_entropy", sigmoid_ce_grad};

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
