/* Reductions over axes and arg reductions, with their gradients. */
#include "op.h"
#include "lib/core/op_phases.h"

#include <math.h>
#include <string.h>

/* attrs: i[0] = mask of reduced dims, i[1] = keepdims. */
static nb_tensor *reduce_body(const nb_op_def *def, nb_reduce_op kop, const nb_tensor *x, nb_axes axes,
                              bool keepdims)
{
    const char *op = def->name;
    if (!x)
        return nb__null_input(op, 0);
    unsigned mask_dt = kop == NB_RED_MEAN ? NB_FLOATS : NB_NUMERIC;
    if (nb__check_dtype(op, "input", x, mask_dt))
        return NULL;
    int mask = nb__axes_mask(op, axes, x->ndim);
    if (mask < 0)
        return NULL;
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_REDUCE, kop, x->dtype);
    if (!dev)
        return NULL;
    int64_t keep[NB_MAX_DIMS], shape[NB_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++) {
        bool r = mask & (1 << i);
        if ((kop == NB_RED_MAX || kop == NB_RED_MIN) && r && x->shape[i] == 0) {
            char s[NB_SHAPE_STR_MAX];
            return nb__fail_null(NB_ERR_SHAPE, "%s: cannot reduce the empty dim %d of %s", op, i,
                                 nb__shape_str(x->ndim, x->shape, s, sizeof s));
        }
        keep[i] = r ? 1 : x->shape[i];
        if (!r || keepdims)
            shape[nd++] = keep[i];
    }
    nb_tensor *out = nb__out(op, dev, x->dtype, x->ndim, keep);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(in[0]);
    int phase = nb__phase_enter(NB_PHASE_KERNEL);
    nb_status st = dev->backend->reduce(dev, kop, &vo, &vx);
    nb__phase_leave(phase);
    if (!nb__kernel_done(st, out))
        return NULL;
    if (!keepdims) {
        /* A contiguous result is reshaped in place. */
        out->ndim = nd;
        for (int i = 0; i < nd; i++)
            out->shape[i] = shape[i];
        nb__contiguous_strides(nd, shape, nb_dtype_size(out->dtype), out->strides);
    }
    nb_op_attrs attrs = {0};
    attrs.i[0] = mask;
    attrs.i[1] = keepdims;
    return nb__finish(def, 1, in, out, &attrs);
}

/* The op timed by phases (nabla/profile.h): every return of the body ends it. */
static nb_tensor *reduce(const nb_op_def *def, nb_reduce_op kop, const nb_tensor *x, nb_axes axes, bool keepdims)
{
    int phase = nb__phase_op_begin();
    nb_tensor *out = reduce_body(def, kop, x, axes, keepdims);
    nb__phase_leave(phase);
    return out;
}

#define MASK ((int)n->attrs.i[0])

static nb_status sum_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__expand_reduced(g[0], n->in[0], MASK);
    return nb__ok(gi[0]);
}

static double reduced_count(const nb_tensor *x, int mask)
{
    double c = 1;
    for (int i = 0; i < x->ndim; i++)
        if (mask & (1 << i))
            c *= (double)x->shape[i];
    return c;
}

static nb_status mean_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    double c = reduced_count(n->in[0], MASK);
    gi[0] = nb__expand_reduced(nb_mul_scalar(g[0], c > 0 ? 1.0 / c : 0.0), n->in[0], MASK);
    return nb__ok(gi[0]);
}

/* Max and min: the gradient is shared equally among tied extremes. */
static nb_status extreme_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *x = n->in[0];
    nb_tensor *y = nb__expand_reduced(n->out[0], x, MASK);
    nb_tensor *hit = nb_cast(nb_equal(x, y), x->dtype);
    nb_axes all = {0, {0}};
    for (int i = 0; i < x->ndim; i++)
        if (MASK & (1 << i))
            all.axes[all.n++] = i;
    nb_tensor *count = nb_sum(hit, all, true);
    nb_tensor *share = nb_div(nb__expand_reduced(g[0], x, MASK), nb_broadcast_to(count, nb_tensor_shape(x)));
    gi[0] = nb_mul(hit, share);
    return nb__ok(gi[0]);
}

/* d prod / d x_i is the product of the other inputs: prod / x_i where no input
 * is 0. Where some are, it is built from the product of the nonzero inputs and
 * the zeros themselves (value 0, slope 1), so that it differentiates right once
 * more, as PyTorch's does: with one zero, at the zero the product of the rest
 * and elsewhere that over x_i times the zero; with two, at each zero the
 * product of the rest times the other zero, and 0 elsewhere; with more, 0. */
static nb_status prod_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *x = n->in[0];
    nb_axes axes = {0, {0}};
    for (int i = 0; i < x->ndim; i++)
        if (MASK & (1 << i))
            axes.axes[axes.n++] = i;
    nb_tensor *zero = nb__scalar_on(n->op->name, x->device, x->dtype, 0.0);
    nb_tensor *one = nb__scalar_on(n->op->name, x->device, x->dtype, 1.0);
    nb_tensor *two = nb__scalar_on(n->op->name, x->device, x->dtype, 2.0);
    nb_tensor *is_zero = nb_equal(x, zero);
    nb_tensor *nonzero = nb_where(is_zero, one, x);
    nb_tensor *others = nb_prod(nonzero, axes, true);                  /* of the nonzero inputs */
    nb_tensor *zeros = nb_sum(nb_cast(is_zero, x->dtype), axes, true);  /* how many are 0 */
    nb_tensor *zsum = nb_sum(nb_where(is_zero, x, zero), axes, true);   /* the zeros: 0, slope 1 */
    nb_tensor *over = nb_div(others, nonzero);
    /* Beside one zero the value is 0 even where the others' product overflows
     * (inf * 0 would be NaN): only the zero's slope needs it, finite. */
    nb_tensor *inf = nb__scalar_on(n->op->name, x->device, x->dtype, INFINITY);
    nb_tensor *finite_over = nb_where(nb_less(nb_abs(over), inf), over, zero);
    nb_tensor *at_nonzero = nb_where(nb_equal(zeros, zero), over,
                                     nb_where(nb_equal(zeros, one), nb_mul(finite_over, zsum), zero));
    nb_tensor *at_zero = nb_where(nb_equal(zeros, one), others,
                                  nb_where(nb_equal(zeros, two), nb_mul(others, nb_sub(zsum, x)), zero));
    nb_tensor *d = nb_where(is_zero, at_zero, at_nonzero);
    gi[0] = nb_mul(nb__expand_reduced(g[0], x, MASK), d);
    return nb__ok(gi[0]);
}

static const nb_op_def sum_def = {.name = "sum", .grad = sum_grad};
static const nb_op_def mean_def = {.name = "mean", .grad = mean_grad};
static const nb_op_def max_def = {.name = "max", .grad = extreme_grad};
static const nb_op_def min_def = {.name = "min", .grad = extreme_grad};
static const nb_op_def prod_def = {.name = "prod", .grad = prod_grad};

nb_tensor *nb_sum(const nb_tensor *x, nb_axes axes, bool keepdims) { return reduce(&sum_def, NB_RED_SUM, x, axes, keepdims); }
nb_tensor *nb_mean(const nb_tensor *x, nb_axes axes, bool keepdims) { return reduce(&mean_def, NB_RED_MEAN, x, axes, keepdims); }
nb_tensor *nb_max(const nb_tensor *x, nb_axes axes, bool keepdims) { return reduce(&max_def, NB_RED_MAX, x, axes, keepdims); }
nb_tensor *nb_min(const nb_tensor *x, nb_axes axes, bool keepdims) { return reduce(&min_def, NB_RED_MIN, x, axes, keepdims); }
nb_tensor *nb_prod(const nb_tensor *x, nb_axes axes, bool keepdims) { return reduce(&prod_def, NB_RED_PROD, x, axes, keepdims); }
nb_tensor *nb_sum_all(const nb_tensor *x) { return nb_sum(x, NB_ALL_AXES, false); }
nb_tensor *nb_mean_all(const nb_tensor *x) { return nb_mean(x, NB_ALL_AXES, false); }

nb_tensor *nb_logsumexp(const nb_tensor *x, nb_axes axes, bool keepdims)
{
    if (!x)
        return nb__null_input("logsumexp", 0);
    if (nb__check_dtype("logsumexp", "input", x, NB_FLOATS))
        return NULL;
    /* Check the axes here so that an error names logsumexp, not max. */
    int mask = nb__axes_mask("logsumexp", axes, x->ndim);
    if (mask < 0)
        return NULL;
    nb_shape shape = {0, {0}}; /* of the result */
    bool empty = false;
    for (int i = 0; i < x->ndim; i++) {
        bool reduced = mask & (1 << i);
        empty |= reduced && x->shape[i] == 0;
        if (!reduced || keepdims)
            shape.dims[shape.ndim++] = reduced ? 1 : x->shape[i];
    }
    if (empty) { /* the log of an empty sum, as PyTorch gives */
        const nb_tensor *in[1] = {x};
        nb_device *dev = nb__op_place("logsumexp", 1, in);
        return dev ? nb__full_on("logsumexp", dev, x->dtype, shape.ndim, shape.dims, -INFINITY) : NULL;
    }
    /* Shifting by the (constant) largest finite input keeps exp in range; the
     * shift cancels exactly in the gradient, so it is cut from the tape. An
     * infinity is no shift (inf - inf would be NaN): all -inf inputs give -inf,
     * any +inf gives +inf, and the finite inputs beside a +inf still get the
     * slope exp(x - m) / inf = 0 (an unshifted exp(x) could overflow to inf / inf). */
    nb_tensor *inf = nb__scalar_on("logsumexp", x->device, x->dtype, INFINITY);
    nb_tensor *ninf = nb__scalar_on("logsumexp", x->device, x->dtype, -INFINITY);
    nb_tensor *zero = nb__scalar_on("logsumexp", x->device, x->dtype, 0.0);
    nb_tensor *finite = nb_less(nb_abs(x), inf); /* false for +-inf and NaN */
    nb_tensor *m = nb_stop_gradient(nb_max(nb_where(finite, x, ninf), axes, true));
    m = nb_where(nb_equal(m, ninf), zero, m);
    nb_tensor *s = nb_add(nb_log(nb_sum(nb_exp(nb_sub(x, m)), axes, true)), m);
    return !s || keepdims ? s : nb_reshape(s, shape);
}

static nb_tensor *arg_reduce(const char *op, bool is_max, const nb_tensor *x, int axis, bool keepdims)
{
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_NUMERIC | NB_MASK(NB_U8)))
        return NULL;
    int a = nb__axis(op, axis, x->ndim);
    if (a < 0)
        return NULL;
    if (x->shape[a] == 0)
        return nb__fail_null(NB_ERR_SHAPE, "%s: axis %d is empty", op, axis);
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_ARG_REDUCE, 0, x->dtype);
    if (!dev)
        return NULL;
    int64_t keep[NB_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        keep[i] = i == a ? 1 : x->shape[i];
    nb_tensor *out = nb__out(op, dev, NB_I64, x->ndim, keep);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(in[0]);
    if (!nb__kernel_done(dev->backend->arg_reduce(dev, is_max, &vo, &vx, a), out))
        return NULL;
    if (!keepdims) {
        for (int i = a; i < x->ndim - 1; i++)
            out->shape[i] = out->shape[i + 1];
        out->ndim--;
        nb__contiguous_strides(out->ndim, out->shape, 8, out->strides);
    }
    return nb__own(out);
}

nb_tensor *nb_argmax(const nb_tensor *x, int axis, bool keepdims) { return arg_reduce("argmax", true, x, axis, keepdims); }
nb_tensor *nb_argmin(const nb_tensor *x, int axis, bool keepdims) { return arg_reduce("argmin", false, x, axis, keepdims); }

/* ---- gradient helpers shared by the ops' gradients -------------------------- */

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
