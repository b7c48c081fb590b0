/* Normalisation and the other neural-network helpers: batch_norm (training
 * and inference), layer_norm, dropout and embedding_lookup.
 *
 * batch_norm_train is a composite recorded as one op: its forward runs its
 * ops unrecorded, and its gradient is the closed form (the mean and variance
 * recomputed from x), written with ops so that it differentiates again.
 * layer_norm runs each row in one go where the device has the row kernels
 * (the CPU), forward and backward. batch_norm_infer works out a [C] scale and
 * shift with ops, then makes one pass over x as a recorded op of its own.
 * Where the kernels are missing, each is a composition of differentiable
 * ops, as dropout is; embedding_lookup is gather under its own name. */
#include "op.h"

#include <math.h>
#include <string.h>

/* ---- batch normalisation ---------------------------------------------------------- */

/* The channel axis of x for a format: the last for NHWC and 2-d inputs, 1 for
 * NCHW. The reduced axes are every other one. */
static int channel_axis(const nb_tensor *x, nb_data_format format)
{
    return format == NB_NCHW && x->ndim > 2 ? 1 : x->ndim - 1;
}

static nb_axes reduced_axes(int ndim, int ca)
{
    nb_axes a = {0, {0}};
    for (int i = 0; i < ndim; i++)
        if (i != ca)
            a.axes[a.n++] = i;
    return a;
}

/* The shape of a per-channel [C] tensor broadcast against x: 1 on every axis
 * but ca. */
static nb_shape channel_shape(const nb_tensor *x, int ca)
{
    nb_shape s = {x->ndim, {0}};
    for (int i = 0; i < x->ndim; i++)
        s.dims[i] = i == ca ? x->shape[ca] : 1;
    return s;
}

/* NULL when t is NULL; else t as [1, .., C, .., 1]. */
static nb_tensor *per_channel(const nb_tensor *t, const nb_tensor *x, int ca)
{
    return t ? nb_reshape(t, channel_shape(x, ca)) : NULL;
}

static bool check_bn_input(const char *op, const nb_tensor *x, nb_data_format format)
{
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return false;
    if (format != NB_NHWC && format != NB_NCHW) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: data format %d is neither NB_NHWC nor NB_NCHW", op, (int)format);
        return false;
    }
    if (x->ndim < 2) {
        char s[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "%s: input %s needs at least 2 dims (batch and channels)", op,
                 nb__shape_str(SHAPE_OF(x), s, sizeof s));
        return false;
    }
    return true;
}

/* A per-channel parameter (gamma, beta, mean, var): NULL is allowed when
 * optional; else [C] of x's dtype. */
static bool check_param(const char *op, const char *what, const nb_tensor *p, const nb_tensor *x, int64_t C,
                        bool optional)
{
    if (!p) {
        if (!optional)
            nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
        return optional;
    }
    if (nb__check_same_dtype(op, x, p))
        return false;
    if (p->ndim != 1 || p->shape[0] != C) {
        char s[NB_SHAPE_STR_MAX], sx[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "%s: %s %s must be [%lld], the channels of input %s", op, what,
                 nb__shape_str(SHAPE_OF(p), s, sizeof s), (long long)C, nb__shape_str(SHAPE_OF(x), sx, sizeof sx));
        return false;
    }
    return true;
}

/* The checks every form of batch norm makes first: x, its layout, and the
 * optional gamma and beta. Returns x's channel axis, or -1 (error recorded). */
static int check_bn_args(const char *op, const nb_tensor *x, nb_data_format format, const nb_tensor *gamma,
                         const nb_tensor *beta)
{
    if (!x) {
        nb__null_input(op, 0);
        return -1;
    }
    if (!check_bn_input(op, x, format))
        return -1;
    int ca = channel_axis(x, format);
    int64_t C = x->shape[ca];
    if (!check_param(op, "gamma", gamma, x, C, true) || !check_param(op, "beta", beta, x, C, true))
        return -1;
    return ca;
}

/* y = x * scale + shift with per-channel scale = gamma rsqrt(var + eps) and
 * shift = beta - mean scale (keepdims shapes): two passes over x. */
static nb_tensor *bn_apply(const nb_tensor *x, const nb_tensor *gamma_b, const nb_tensor *beta_b,
                           const nb_tensor *mean, const nb_tensor *var, double eps)
{
    nb_tensor *scale = nb_rsqrt(nb_add_scalar(var, eps));
    if (gamma_b)
        scale = nb_mul(scale, gamma_b);
    nb_tensor *shift = nb_neg(nb_mul(mean, scale));
    if (beta_b)
        shift = nb_add(shift, beta_b);
    return nb_add(nb_mul(x, scale), shift);
}

/* ---- the fused path: two passes forward, two backward ---- */

/* t itself when contiguous, else a contiguous copy owned by the current scope. */
static const nb_tensor *dense(const nb_tensor *t)
{
    return t && !t->contiguous ? nb_contiguous(t) : t;
}

/* x as [outer, C, inner] around the channel axis ca. */
static void shape3(const nb_tensor *x, int ca, int64_t s[3])
{
    s[0] = s[2] = 1;
    s[1] = x->shape[ca];
    for (int i = 0; i < x->ndim; i++)
        if (i != ca)
            s[i < ca ? 0 : 2] *= x->shape[i];
}

/* Whether the per-channel kernels can run batch_norm_train on x's device: no
 * other device pushed, gamma and beta there too, and the device runs both
 * kernels for the dtype. Otherwise the op runs as a composition of ops. */
static bool fused_ok(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta)
{
    nb_device *dev = x->device, *pushed = nb__device_pushed();
    return (!pushed || pushed == dev) && (!gamma || gamma->device == dev) && (!beta || beta->device == dev) &&
           nb__supports(dev, NB_K_CHANNEL_MOMENTS, 0, x->dtype) && nb__supports(dev, NB_K_CHANNEL_AFFINE, 0, x->dtype);
}

/* The per-channel sums of a (and a (b - center), or (a - center)^2): two [C]
 * tensors owned by the current scope; false on failure. */
static bool moments(const char *op, const int64_t s[3], const nb_tensor *a, const nb_tensor *b,
                    const nb_tensor *center, nb_tensor **sum, nb_tensor **moment)
{
    nb_device *dev = a->device;
    const nb_tensor *ad = dense(a), *bd = dense(b), *cd = dense(center);
    if (!ad || (b && !bd) || (center && !cd))
        return false;
    nb_tensor *s0 = nb__out(op, dev, a->dtype, 1, &s[1]);
    nb_tensor *s1 = s0 ? nb__out(op, dev, a->dtype, 1, &s[1]) : NULL;
    if (!s1) {
        nb__release(s0);
        return false;
    }
    nb_view v0 = nb__view(s0), v1 = nb__view(s1), va = nb__view(ad), vb = bd ? nb__view(bd) : (nb_view){0},
            vc = cd ? nb__view(cd) : (nb_view){0};
    nb_status st = dev->backend->channel_moments(dev, s, &v0, &v1, &va, bd ? &vb : NULL, cd ? &vc : NULL);
    *sum = nb__own(s0);
    *moment = nb__own(s1);
    return st == NB_OK;
}

/* a sc + b t + u per channel: a tensor of a's shape owned by the current scope. */
static nb_tensor *affine(const char *op, const int64_t s[3], const nb_tensor *a, const nb_tensor *sc,
                         const nb_tensor *b, const nb_tensor *t, const nb_tensor *u)
{
    nb_device *dev = a->device;
    const nb_tensor *ad = dense(a), *sd = dense(sc), *bd = dense(b), *td = dense(t), *ud = dense(u);
    if (!ad || !sd || !ud || (b && (!bd || !td)))
        return NULL;
    nb_tensor *out = nb__out(op, dev, a->dtype, a->ndim, a->shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), va = nb__view(ad), vs = nb__view(sd), vu = nb__view(ud),
            vb = bd ? nb__view(bd) : (nb_view){0}, vt = td ? nb__view(td) : (nb_view){0};
    if (out->numel)
        out = nb__kernel_done(dev->backend->channel_affine(dev, s, &vo, &va, &vs, bd ? &vb : NULL, td ? &vt : NULL, &vu),
                              out);
    return nb__own(out);
}

/* f16 and bf16 as f32 (their channel sums would overflow or round away in
 * their own dtype); other tensors, and NULL, as they are. */
static const nb_tensor *as_f32(const nb_tensor *t)
{
    return t && (t->dtype == NB_F16 || t->dtype == NB_BF16) ? nb_cast(t, NB_F32) : t;
}
static nb_tensor *to_dtype(nb_tensor *t, nb_dtype dt)
{
    return t && t->dtype != dt ? nb_cast(t, dt) : t;
}

/* The fused gradient (nothing records it): from the saved mean and rstd,
 * dbeta = sum g, dgamma = rstd sum g (x - mean), and
 * dx = k g + t x + u with k = gamma rstd, t = -k rstd^2 sum g (x - mean) / m,
 * u = -k sum(g) / m - t mean. */
static nb_status batch_norm_grad_fused(const nb_node *n, nb_tensor *g, nb_tensor **gi)
{
    const char *op = n->op->name;
    const nb_tensor *x = n->in[0], *gamma = n->in[1];
    const nb_tensor *mean = n->out[1], *rstd = n->out[2];
    /* f16 and bf16 work in f32 (see batch_norm_fused) */
    nb_dtype dt = x->dtype;
    const nb_tensor *xw = as_f32(x), *gw = as_f32(gamma);
    nb_tensor *gg = (nb_tensor *)as_f32(g);
    if (!xw || !gg || (gamma && !gw))
        return nb__ok(NULL);
    int64_t s[3];
    shape3(x, (int)n->attrs.i[0], s);
    double m = (double)(s[0] * s[2]);
    nb_tensor *sg = NULL, *sgx = NULL;
    if (!moments(op, s, gg, xw, mean, &sg, &sgx))
        return nb__ok(NULL);
    if (n->in[2] && nb__needs_grad(n, 2) && !(gi[2] = to_dtype(sg, dt)))
        return nb__ok(NULL);
    if (gamma && nb__needs_grad(n, 1) && !(gi[1] = to_dtype(nb_mul(sgx, rstd), dt)))
        return nb__ok(NULL);
    if (!nb__needs_grad(n, 0))
        return NB_OK;
    nb_tensor *k = gamma ? nb_mul(rstd, gw) : (nb_tensor *)rstd;
    nb_tensor *t = nb_mul_scalar(nb_mul(nb_mul(k, nb_square(rstd)), sgx), -1.0 / m);
    nb_tensor *u = nb_sub(nb_mul_scalar(nb_mul(k, sg), -1.0 / m), nb_mul(t, mean));
    gi[0] = t && u ? to_dtype(affine(op, s, gg, k, xw, t, u), dt) : NULL;
    return nb__ok(gi[0]);
}

/* attrs: i[0] the channel axis; d[0] epsilon. Inputs x, gamma, beta (either
 * of the last two may be NULL). */
static nb_status batch_norm_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const nb_tensor *x = n->in[0], *gamma = n->in[1];
    int ca = (int)n->attrs.i[0];
    double eps = n->attrs.d[0];
    nb_axes axes = reduced_axes(x->ndim, ca);
    nb_shape cs = {1, {x->shape[ca]}};
    gi[0] = gi[1] = gi[2] = NULL;
    if (n->n_out == 3 && !nb__tape_recording() && fused_ok(x, gamma, n->in[2]) && g[0]->device == x->device)
        return batch_norm_grad_fused(n, g[0], gi);
    nb_tensor *mean = nb_mean(x, axes, true);
    nb_tensor *xc = nb_sub(x, mean);
    nb_tensor *rstd = nb_rsqrt(nb_add_scalar(nb_mean(nb_square(xc), axes, true), eps));
    nb_tensor *xhat = nb_mul(xc, rstd);
    nb_tensor *gsum = nb_sum(g[0], axes, true);
    nb_tensor *gxsum = nb_sum(nb_mul(g[0], xhat), axes, true);
    if (!gxsum)
        return nb__ok(NULL);
    if (n->in[2] && nb__needs_grad(n, 2) && !(gi[2] = nb_reshape(gsum, cs)))
        return nb__ok(NULL);
    if (gamma && nb__needs_grad(n, 1) && !(gi[1] = nb_reshape(gxsum, cs)))
        return nb__ok(NULL);
    if (!nb__needs_grad(n, 0))
        return NB_OK;
    /* dx = gamma rstd (g - mean(g) - xhat mean(g xhat)) = g k + xhat k2 + k3 */
    double m = (double)(x->numel / (x->shape[ca] ? x->shape[ca] : 1));
    nb_tensor *k = gamma ? nb_mul(rstd, per_channel(gamma, x, ca)) : rstd;
    nb_tensor *k2 = nb_mul_scalar(nb_mul(k, gxsum), -1.0 / m);
    nb_tensor *k3 = nb_mul_scalar(nb_mul(k, gsum), -1.0 / m);
    gi[0] = nb_add(nb_add(nb_mul(g[0], k), nb_mul(xhat, k2)), k3);
    return nb__ok(gi[0]);
}

static const nb_op_def batch_norm_def = {.name = "batch_norm_train", .grad = batch_norm_grad};

/* Records batch norm of in (x, gamma, beta) with outputs out[0..n_out), out[0]
 * being y, and hands the batch statistics bm and bv to the caller's pointers.
 * Returns y, or NULL when y or an asked-for statistic is missing or the
 * recording fails (error recorded). The statistics are the caller's moving
 * averages' inputs: they are not outputs, so no gradient flows through them. */
static nb_tensor *batch_norm_finish(const nb_tensor *const in[3], int ca, double epsilon, int n_out,
                                    nb_tensor **out, nb_tensor *bm, nb_tensor *bv, nb_tensor **batch_mean,
                                    nb_tensor **batch_var)
{
    nb_tensor *y = out[0];
    if (!y || (batch_mean && !bm) || (batch_var && !bv))
        return NULL;
    nb_op_attrs attrs = {0};
    attrs.i[0] = ca;
    attrs.d[0] = epsilon;
    if (nb__record(&batch_norm_def, 3, in, n_out, out, &attrs))
        return NULL;
    if (batch_mean)
        *batch_mean = bm;
    if (batch_var)
        *batch_var = bv;
    return y;
}

/* The fused forward: the channel sums, the sums of squared deviations, then
 * y = x scale + shift. Recorded with the mean and rstd as two more outputs
 * (nobody else sees them), which the fused gradient reads back. */
static nb_tensor *batch_norm_fused(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta,
                                   double epsilon, int ca, nb_tensor **batch_mean, nb_tensor **batch_var)
{
    const char *op = batch_norm_def.name;
    int64_t s[3];
    shape3(x, ca, s);
    double m = (double)(s[0] * s[2]);
    int token = nb__tapes_pause();
    nb_tensor *sum = NULL, *sq = NULL, *dev = NULL, *y = NULL, *mean = NULL, *rstd = NULL, *bm = NULL, *bv = NULL;
    /* f16 and bf16 are normalised in f32 (one rounding at the end), with the
     * mean and rstd kept in f32 for the gradient. */
    nb_dtype dt = x->dtype;
    const nb_tensor *xw = as_f32(x), *gw = as_f32(gamma), *bw = as_f32(beta);
    /* f32 sums are accumulated in double, so the deviations about the mean
     * come from the same pass (the kernel's sum x^2 - sum^2 / m, in double);
     * f64 takes a second pass about the mean. */
    bool one_pass = xw && xw->dtype == NB_F32;
    if (xw && (!gamma || gw) && (!beta || bw) && moments(op, s, xw, NULL, NULL, &sum, &dev) &&
        (mean = nb_mul_scalar(sum, 1.0 / m)) && (one_pass || moments(op, s, xw, NULL, mean, &sq, &dev))) {
        rstd = nb_rsqrt(nb_add_scalar(nb_mul_scalar(dev, 1.0 / m), epsilon));
        nb_tensor *scale = gw && rstd ? nb_mul(rstd, gw) : rstd;
        nb_tensor *shift = nb_neg(nb_mul(mean, scale));
        if (bw && shift)
            shift = nb_add(shift, bw);
        y = scale && shift ? to_dtype(affine(op, s, xw, scale, NULL, NULL, shift), dt) : NULL;
        if (y && batch_mean)
            bm = dt != mean->dtype ? nb_cast(mean, dt) : nb_mul_scalar(mean, 1.0);
        if (y && batch_var)
            bv = to_dtype(nb_mul_scalar(dev, 1.0 / (m - 1)), dt);
    }
    nb__tapes_resume(token);
    const nb_tensor *in[3] = {x, gamma, beta};
    nb_tensor *out[3] = {y, mean, rstd};
    return batch_norm_finish(in, ca, epsilon, 3, out, bm, bv, batch_mean, batch_var);
}

nb_tensor *nb_batch_norm_train(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta, double epsilon,
                               nb_data_format format, nb_tensor **batch_mean, nb_tensor **batch_var)
{
    const char *op = batch_norm_def.name;
    if (batch_mean)
        *batch_mean = NULL;
    if (batch_var)
        *batch_var = NULL;
    int ca = check_bn_args(op, x, format, gamma, beta);
    if (ca < 0)
        return NULL;
    int64_t C = x->shape[ca];
    if (!(epsilon >= 0))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: epsilon %g must be at least 0", op, epsilon);
    int64_t m = C ? x->numel / C : 0;
    if (m < 2) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: input %s has %lld value(s) per channel; training needs 2 or more",
                             op, nb__shape_str(SHAPE_OF(x), s, sizeof s), (long long)m);
    }
    nb_axes axes = reduced_axes(x->ndim, ca);
    nb_shape cs = {1, {C}};
    if (fused_ok(x, gamma, beta))
        return batch_norm_fused(x, gamma, beta, epsilon, ca, batch_mean, batch_var);
    int token = nb__tapes_pause();
    nb_tensor *mean = nb_mean(x, axes, true);
    nb_tensor *var = nb_mean(nb_square(nb_sub(x, mean)), axes, true);
    nb_tensor *y = bn_apply(x, per_channel(gamma, x, ca), per_channel(beta, x, ca), mean, var, epsilon);
    nb_tensor *bm = NULL, *bv = NULL;
    if (y && batch_mean)
        bm = nb_reshape(mean, cs);
    if (y && batch_var)
        bv = nb_reshape(nb_mul_scalar(var, (double)m / (double)(m - 1)), cs);
    nb__tapes_resume(token);
    const nb_tensor *in[3] = {x, gamma, beta};
    return batch_norm_finish(in, ca, epsilon, 1, &y, bm, bv, batch_mean, batch_var);
}

/* ---- inference: one pass over x ---- */

/* attrs: i[0] the channel axis. Inputs x, s, u ([C] each): y = x s[c] + u[c].
 * dx = g s, ds = sum g x, du = sum g over every axis but the channel's. */
static nb_status channel_scale_shift_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const nb_tensor *x = n->in[0], *sc = n->in[1];
    int ca = (int)n->attrs.i[0];
    nb_axes axes = reduced_axes(x->ndim, ca);
    nb_shape cs = {1, {x->shape[ca]}};
    gi[0] = gi[1] = gi[2] = NULL;
    if (nb__needs_grad(n, 0) && !(gi[0] = nb_mul(g[0], per_channel(sc, x, ca))))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb_reshape(nb_sum(nb_mul(g[0], x), axes, false), cs)))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 2) && !(gi[2] = nb_reshape(nb_sum(g[0], axes, false), cs)))
        return nb__ok(NULL);
    return NB_OK;
}

static const nb_op_def channel_scale_shift_def = {.name = "batch_norm_infer", .grad = channel_scale_shift_grad};

/* y = x sc[c] + u[c] over the channel axis ca in one channel_affine pass,
 * recorded as one op (sc and u carry the gradients of gamma, beta, mean and
 * var through the ops that made them). NULL on failure. */
static nb_tensor *channel_scale_shift(const nb_tensor *x, const nb_tensor *sc, const nb_tensor *u, int ca)
{
    const char *op = channel_scale_shift_def.name;
    int64_t s[3];
    shape3(x, ca, s);
    int token = nb__tapes_pause();
    nb_tensor *y = sc && u ? affine(op, s, x, sc, NULL, NULL, u) : NULL;
    nb__tapes_resume(token);
    if (!y)
        return NULL;
    nb_op_attrs attrs = {0};
    attrs.i[0] = ca;
    const nb_tensor *in[3] = {x, sc, u};
    return nb__record(&channel_scale_shift_def, 3, in, 1, &y, &attrs) ? NULL : y;
}

nb_tensor *nb_batch_norm_infer(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta,
                               const nb_tensor *mean, const nb_tensor *var, double epsilon, nb_data_format format)
{
    const char *op = "batch_norm_infer";
    int ca = check_bn_args(op, x, format, gamma, beta);
    if (ca < 0)
        return NULL;
    int64_t C = x->shape[ca];
    if (!check_param(op, "mean", mean, x, C, false) || !check_param(op, "var", var, x, C, false))
        return NULL;
    if (!(epsilon >= 0))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: epsilon %g must be at least 0", op, epsilon);
    if (!fused_ok(x, gamma, beta) || mean->device != x->device || var->device != x->device)
        return bn_apply(x, per_channel(gamma, x, ca), per_channel(beta, x, ca), per_channel(mean, x, ca),
                        per_channel(var, x, ca), epsilon);
    /* The [C] scale and shift first (recorded ops), then one pass over x. */
    nb_tensor *scale = nb_rsqrt(nb_add_scalar(var, epsilon));
    if (gamma)
        scale = nb_mul(scale, gamma);
    nb_tensor *shift = beta ? nb_sub(beta, nb_mul(mean, scale)) : nb_neg(nb_mul(mean, scale));
    return channel_scale_shift(x, scale, shift, ca);
}

/* ---- layer normalisation ---------------------------------------------------------- */

/* x as rows of D values: D the product of the last n_axes dims. */
static int64_t ln_dim(const nb_tensor *x, int n_axes)
{
    int64_t D = 1;
    for (int i = x->ndim - n_axes; i < x->ndim; i++)
        D *= x->shape[i];
    return D;
}

static nb_axes ln_axes(const nb_tensor *x, int n_axes)
{
    nb_axes axes = {0, {0}};
    for (int i = x->ndim - n_axes; i < x->ndim; i++)
        axes.axes[axes.n++] = i;
    return axes;
}

/* Whether x's device has the row kernels (optional entries: the pointers
 * first) and runs them for x's dtype, with fused_ok's other conditions. */
static bool rows_ok(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta)
{
    nb_device *dev = x->device, *pushed = nb__device_pushed();
    const nb_backend *b = dev->backend;
    return (!pushed || pushed == dev) && (!gamma || gamma->device == dev) && (!beta || beta->device == dev) &&
           b->layer_norm_rows && b->layer_norm_rows_grad && nb__supports(dev, NB_K_LAYER_NORM_ROWS, 0, x->dtype) &&
           nb__supports(dev, NB_K_LAYER_NORM_ROWS_GRAD, 0, x->dtype);
}

/* The row kernel's gradient (nothing records it), from the saved rstd: dx,
 * dgamma and dbeta in one pass over g and x. */
static nb_status layer_norm_grad_rows(const nb_node *n, nb_tensor *g, nb_tensor **gi)
{
    const char *op = n->op->name;
    const nb_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    nb_device *dev = x->device;
    nb_dtype dt = x->dtype;
    int64_t D = ln_dim(x, (int)n->attrs.i[0]), rows = x->numel / D;
    bool want_x = nb__needs_grad(n, 0), want_gamma = gamma && nb__needs_grad(n, 1),
         want_beta = beta && nb__needs_grad(n, 2);
    if (!want_x && !want_gamma && !want_beta)
        return NB_OK;
    const nb_tensor *xd = dense(x), *gd = dense(g), *gmd = dense(gamma), *rd = dense(n->out[1]);
    if (!xd || !gd || !rd || (gamma && !gmd))
        return nb__ok(NULL);
    nb_tensor *dx = NULL, *dgamma = NULL, *dbeta = NULL;
    bool made = (!want_x || (dx = nb__out(op, dev, dt, x->ndim, x->shape))) &&
                (!want_gamma || (dgamma = nb__out(op, dev, dt, gamma->ndim, gamma->shape))) &&
                (!want_beta || (dbeta = nb__out(op, dev, dt, beta->ndim, beta->shape)));
    nb_status st = made ? NB_OK : nb__ok(NULL);
    if (made) {
        nb_view vdx = dx ? nb__view(dx) : (nb_view){0}, vdg = dgamma ? nb__view(dgamma) : (nb_view){0},
                vdb = dbeta ? nb__view(dbeta) : (nb_view){0}, vg = nb__view(gd), vx = nb__view(xd),
                vr = nb__view(rd), vgm = gmd ? nb__view(gmd) : (nb_view){0};
        st = dev->backend->layer_norm_rows_grad(dev, rows, D, dx ? &vdx : NULL, dgamma ? &vdg : NULL,
                                                dbeta ? &vdb : NULL, &vg, &vx, &vr, gmd ? &vgm : NULL);
    }
    if (st) {
        nb__release(dx), nb__release(dgamma), nb__release(dbeta);
        return st;
    }
    gi[0] = nb__own(dx);
    gi[1] = nb__own(dgamma);
    gi[2] = nb__own(dbeta);
    return nb__ok((!want_x || gi[0]) && (!want_gamma || gi[1]) && (!want_beta || gi[2]) ? gi : NULL);
}

/* attrs: i[0] n_axes; d[0] epsilon. Inputs x, gamma, beta (either of the last
 * two may be NULL); outputs y and rstd. Under a recording tape, or off the
 * row kernels' device, the closed form in ops:
 * dx = rstd (h - mean(h) - xhat mean(h xhat)) with h = g gamma. */
static nb_status layer_norm_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const nb_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    int n_axes = (int)n->attrs.i[0];
    gi[0] = gi[1] = gi[2] = NULL;
    if (!nb__tape_recording() && g[0]->device == x->device && rows_ok(x, gamma, beta))
        return layer_norm_grad_rows(n, g[0], gi);
    nb_axes axes = ln_axes(x, n_axes);
    nb_tensor *mean = nb_mean(x, axes, true);
    nb_tensor *xc = nb_sub(x, mean);
    nb_tensor *rstd = nb_rsqrt(nb_add_scalar(nb_mean(nb_square(xc), axes, true), n->attrs.d[0]));
    nb_tensor *xhat = nb_mul(xc, rstd);
    if (!xhat)
        return nb__ok(NULL);
    if (beta && nb__needs_grad(n, 2) && !(gi[2] = nb__sum_to(g[0], beta->ndim, beta->shape)))
        return nb__ok(NULL);
    if (gamma && nb__needs_grad(n, 1) && !(gi[1] = nb__sum_to(nb_mul(g[0], xhat), gamma->ndim, gamma->shape)))
        return nb__ok(NULL);
    if (!nb__needs_grad(n, 0))
        return NB_OK;
    nb_tensor *h = gamma ? nb_mul(g[0], gamma) : g[0];
    nb_tensor *hc = nb_sub(nb_sub(h, nb_mean(h, axes, true)), nb_mul(xhat, nb_mean(nb_mul(h, xhat), axes, true)));
    gi[0] = nb_mul(hc, rstd);
    return nb__ok(gi[0]);
}

static const nb_op_def layer_norm_def = {.name = "layer_norm", .grad = layer_norm_grad, .n_grad_outputs = 1}; /* not rstd */

/* The row kernel: one pass over each row while it sits in cache, writing y
 * and each row's rstd. Recorded with rstd as a second output (nobody else
 * sees it), which the gradient reads back; the gradient sums each row's mean
 * again, in double. */
static nb_tensor *layer_norm_rows(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta, int n_axes,
                                  double epsilon)
{
    const char *op = layer_norm_def.name;
    nb_device *dev = x->device;
    nb_dtype dt = x->dtype;
    int64_t D = ln_dim(x, n_axes), rows = x->numel / D;
    int token = nb__tapes_pause();
    const nb_tensor *xd = dense(x), *gd = dense(gamma), *bd = dense(beta);
    nb_tensor *y = NULL, *rstd = NULL;
    /* rstd in f32 for f16 and bf16, whose own precision would blur the gradient */
    const nb_dtype stat_dt = dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt;
    bool ok = xd && (!gamma || gd) && (!beta || bd) && (y = nb__out(op, dev, dt, x->ndim, x->shape)) &&
              (rstd = nb__out(op, dev, stat_dt, 1, &rows));
    if (ok) {
        nb_view vy = nb__view(y), vr = nb__view(rstd), vx = nb__view(xd), vg = gd ? nb__view(gd) : (nb_view){0},
                vb = bd ? nb__view(bd) : (nb_view){0};
        ok = dev->backend->layer_norm_rows(dev, rows, D, &vy, NULL, &vr, &vx, gd ? &vg : NULL, bd ? &vb : NULL,
                                           epsilon) == NB_OK;
    }
    nb__tapes_resume(token);
    if (!ok) {
        nb__release(y), nb__release(rstd);
        return NULL;
    }
    y = nb__own(y);
    rstd = nb__own(rstd);
    if (!y || !rstd)
        return NULL;
    nb_op_attrs attrs = {0};
    attrs.i[0] = n_axes;
    attrs.d[0] = epsilon;
    const nb_tensor *in[3] = {x, gamma, beta};
    nb_tensor *out[2] = {y, rstd};
    return nb__record(&layer_norm_def, 3, in, 2, out, &attrs) ? NULL : y;
}

nb_tensor *nb_layer_norm(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta, int n_axes,
                         double epsilon)
{
    const char *op = layer_norm_def.name;
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return NULL;
    char s[NB_SHAPE_STR_MAX], sp[NB_SHAPE_STR_MAX];
    if (n_axes < 1 || n_axes > x->ndim)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: n_axes %d must lie in [1, %d] for input %s", op, n_axes,
                             x->ndim, nb__shape_str(SHAPE_OF(x), s, sizeof s));
    if (!(epsilon >= 0))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: epsilon %g must be at least 0", op, epsilon);
    const nb_tensor *params[2] = {gamma, beta};
    for (int k = 0; k < 2; k++) {
        const nb_tensor *p = params[k];
        if (!p)
            continue;
        if (nb__check_same_dtype(op, x, p))
            return NULL;
        bool ok = p->ndim == n_axes;
        for (int i = 0; ok && i < n_axes; i++)
            ok = p->shape[i] == x->shape[x->ndim - n_axes + i];
        if (!ok)
            return nb__fail_null(NB_ERR_SHAPE, "%s: %s %s must have the last %d dim(s) of input %s", op,
                                 k ? "beta" : "gamma", nb__shape_str(SHAPE_OF(p), sp, sizeof sp), n_axes,
                                 nb__shape_str(SHAPE_OF(x), s, sizeof s));
    }
    /* Empty inputs, and devices without the row kernels, take the
     * composition of ops. */
    if (x->numel && rows_ok(x, gamma, beta))
        return layer_norm_rows(x, gamma, beta, n_axes, epsilon);
    nb_axes axes = ln_axes(x, n_axes);
    nb_tensor *mean = nb_mean(x, axes, true);
    nb_tensor *xc = nb_sub(x, mean);
    nb_tensor *y = nb_mul(xc, nb_rsqrt(nb_add_scalar(nb_mean(nb_square(xc), axes, true), epsilon)));
    if (gamma)
        y = nb_mul(y, gamma);
    if (beta)
        y = nb_add(y, beta);
    return y;
}

/* ---- dropout ------------------------------------------------------------------------ */

nb_tensor *nb_dropout(const nb_tensor *x, double rate, uint64_t seed) { return nb__dropout_at(x, rate, seed, NULL); }

nb_tensor *nb__dropout_at(const nb_tensor *x, double rate, uint64_t seed, const double *seed_add)
{
    const char *op = "dropout";
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return NULL;
    if (!(rate >= 0 && rate < 1))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: rate %g must lie in [0, 1)", op, rate);
    if (rate == 0) { /* x itself, a new reference */
        nb__retain((nb_tensor *)x);
        return nb__own((nb_tensor *)x);
    }
    /* The uniform draws in f32 on x's device whatever x's dtype: element i's
     * draw depends only on (seed, i), so the mask is the same everywhere. */
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_RANDOM, 0, NB_F32);
    if (!dev)
        return NULL;
    nb_tensor *u = nb__out(op, dev, NB_F32, x->ndim, x->shape);
    if (!u)
        return NULL;
    if (u->numel) {
        nb_view vu = nb__view(u);
        if (!(u = nb__kernel_done(dev->backend->random(dev, &vu, NB_RAND_UNIFORM, 0.0, 1.0, seed, seed_add), u)))
            return NULL;
    }
    u = nb__own(u);
    nb_tensor *keep = nb_greater_equal(u, nb__scalar_on(op, dev, NB_F32, rate));
    nb_tensor *mask = nb_where(keep, nb__scalar_on(op, dev, x->dtype, 1.0 / (1.0 - rate)),
                               nb__scalar_on(op, dev, x->dtype, 0.0));
    return nb_mul(in[0], mask);
}

/* ---- embeddings ------------------------------------------------------------------- */

nb_tensor *nb_embedding_lookup(const nb_tensor *table, const nb_tensor *ids)
{
    const char *op = "embedding_lookup";
    if (!table)
        return nb__null_input(op, 0);
    if (!ids)
        return nb__null_input(op, 1);
    if (nb__check_dtype(op, "table", table, NB_FLOATS) || nb__check_dtype(op, "ids", ids, NB_INTS))
        return NULL;
    if (table->ndim != 2) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: table %s must be [V, D]", op,
                             nb__shape_str(SHAPE_OF(table), s, sizeof s));
    }
    if (ids->numel) {
        /* Checked under this op's name (queued on a GPU) before gather runs. */
        nb_tensor *flat = nb_contiguous(ids);
        if (!flat)
            return NULL;
        nb_view vi = nb__view(flat);
        if (flat->device->backend->check_indices(flat->device, op, &vi, table->shape[0]))
            return NULL;
    }
    return nb_gather(table, ids);
}
