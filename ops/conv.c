/* 2-D convolutions: nb_conv2d, its transpose (the gradient for the image) and
 * its filter gradient. Each of the three is the gradient of the others, so
 * gradients of every order are built from them:
 *   conv2d(x, w):             gx = conv2d_transpose(g, w), gw = filter_grad(x, g)
 *   conv2d_transpose(dy, w):  gdy = conv2d(g, w),          gw = filter_grad(g, dy)
 *   filter_grad(x, dy):       gx = conv2d_transpose(dy, g), gdy = conv2d(x, g)
 * The front end works out an nb_conv2d_desc once (sizes, pads, groups) and
 * hands contiguous views to the device's conv2d entries. */
#include "op.h"

#include <nabla/nn.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The options with defaults filled in, and the geometry they give. */
typedef struct conv_geom {
    nb_conv2d_opts o;   /* strides, dilations, groups >= 1 */
    nb_conv2d_desc d;
} conv_geom;

/* Options with zeros replaced by their defaults; NB_ERR_INVALID_ARGUMENT for
 * negative strides, dilations, groups, pads or an unknown padding/format. */
static bool fill_opts(const char *op, const nb_conv2d_opts *opts, nb_conv2d_opts *o)
{
    if (opts)
        *o = *opts;
    else
        memset(o, 0, sizeof *o);
    for (int i = 0; i < 2; i++) {
        if (o->stride[i] < 0 || o->dilation[i] < 0) {
            nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: strides and dilations must be >= 1 (0 means 1), got stride [%d, %d], dilation [%d, %d]",
                     op, o->stride[0], o->stride[1], o->dilation[0], o->dilation[1]);
            return false;
        }
        if (o->stride[i] == 0)
            o->stride[i] = 1;
        if (o->dilation[i] == 0)
            o->dilation[i] = 1;
    }
    if (o->groups < 0) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: groups must be >= 1 (0 means 1), got %d", op, o->groups);
        return false;
    }
    if (o->groups == 0)
        o->groups = 1;
    if (o->padding != NB_PAD_VALID && o->padding != NB_PAD_SAME && o->padding != NB_PAD_EXPLICIT) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: unknown padding %d", op, (int)o->padding);
        return false;
    }
    if (o->padding == NB_PAD_EXPLICIT)
        for (int i = 0; i < 4; i++)
            if (o->pad[i] < 0) {
                nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: explicit pads must be >= 0, got [%d, %d, %d, %d] (top, bottom, left, right)",
                         op, o->pad[0], o->pad[1], o->pad[2], o->pad[3]);
                return false;
            }
    if (o->format != NB_NHWC && o->format != NB_NCHW) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: unknown data format %d", op, (int)o->format);
        return false;
    }
    return true;
}

/* Output size along one dim, with the leading pad in *pad_lo: -1 when the
 * window does not fit (output < 1) or a size overflows. */
static int64_t out_size(const nb_conv2d_opts *o, int dim, int64_t in, int64_t k, int *pad_lo)
{
    int64_t stride = o->stride[dim], dil = o->dilation[dim];
    if (k > (INT64_MAX / 4) / dil || in > INT64_MAX / 4)
        return -1;
    int64_t span = dil * (k - 1) + 1, lo = 0, hi = 0;
    if (o->padding == NB_PAD_EXPLICIT) {
        lo = o->pad[dim * 2];
        hi = o->pad[dim * 2 + 1];
    } else if (o->padding == NB_PAD_SAME) {
        /* TensorFlow: out = ceil(in / stride), the odd pad at the bottom/right */
        int64_t out = (in + stride - 1) / stride;
        int64_t total = (out - 1) * stride + span - in;
        if (total < 0)
            total = 0;
        lo = total / 2;
        hi = total - lo;
        if (lo > INT32_MAX)
            return -1;
    }
    *pad_lo = (int)lo;
    int64_t padded = in + lo + hi;
    if (padded < span)
        return -1;
    return (padded - span) / stride + 1;
}

static char *fmt_hw(const char *what, const int64_t *hw, char *buf, size_t n)
{
    snprintf(buf, n, "%s [%lld, %lld]", what, (long long)hw[0], (long long)hw[1]);
    return buf;
}

/* The geometry of a convolution of x [N, H, W, C] (given as an image shape in
 * its format) with a filter [R, S, C / groups, K]; false with the error
 * recorded. x_shape/w_shape name the tensors in messages. */
static bool geometry(const char *op, const nb_conv2d_opts *o, int64_t N, int64_t H, int64_t W, int64_t C,
                     int64_t R, int64_t S, int64_t Cg, int64_t K, int xnd, const int64_t *xs, int wnd,
                     const int64_t *ws, conv_geom *g)
{
    char sx[NB_SHAPE_STR_MAX], sw[NB_SHAPE_STR_MAX];
    g->o = *o;
    int G = o->groups;
    if (C % G || K % G) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: groups %d must divide the input channels (%lld) and the output channels (%lld); x %s, filter %s",
                 op, G, (long long)C, (long long)K, nb__shape_str(xnd, xs, sx, sizeof sx),
                 nb__shape_str(wnd, ws, sw, sizeof sw));
        return false;
    }
    if (Cg * G != C) {
        nb__fail(NB_ERR_SHAPE, "%s: the filter's input channels (%lld) times groups (%d) must equal x's channels (%lld): x %s, filter %s",
                 op, (long long)Cg, G, (long long)C, nb__shape_str(xnd, xs, sx, sizeof sx),
                 nb__shape_str(wnd, ws, sw, sizeof sw));
        return false;
    }
    if (N < 1 || H < 1 || W < 1 || C < 1 || R < 1 || S < 1 || K < 1) {
        nb__fail(NB_ERR_SHAPE, "%s: every size must be >= 1: x %s, filter %s", op,
                 nb__shape_str(xnd, xs, sx, sizeof sx), nb__shape_str(wnd, ws, sw, sizeof sw));
        return false;
    }
    nb_conv2d_desc *d = &g->d;
    memset(d, 0, sizeof *d);
    d->N = N, d->H = H, d->W = W, d->C = C, d->K = K, d->R = R, d->S = S;
    d->P = out_size(o, 0, H, R, &d->pad[0]);
    d->Q = out_size(o, 1, W, S, &d->pad[1]);
    if (d->P < 1 || d->Q < 1) {
        nb__fail(NB_ERR_SHAPE, "%s: the output would be smaller than 1x1: x %s, filter %s, stride [%d, %d], dilation [%d, %d]%s",
                 op, nb__shape_str(xnd, xs, sx, sizeof sx), nb__shape_str(wnd, ws, sw, sizeof sw), o->stride[0],
                 o->stride[1], o->dilation[0], o->dilation[1],
                 o->padding == NB_PAD_VALID ? ", VALID" : o->padding == NB_PAD_SAME ? ", SAME" : ", explicit pads");
        return false;
    }
    /* every tensor's element count must fit: N*P*Q*K, N*H*W*C, R*S*Cg*K */
    int64_t t;
    if (__builtin_mul_overflow(N, d->P, &t) || __builtin_mul_overflow(t, d->Q, &t) ||
        __builtin_mul_overflow(t, K, &t) || __builtin_mul_overflow(N, H, &t) || __builtin_mul_overflow(t, W, &t) ||
        __builtin_mul_overflow(t, C, &t) || __builtin_mul_overflow(R, S, &t) || __builtin_mul_overflow(t, Cg, &t) ||
        __builtin_mul_overflow(t, K, &t) || __builtin_mul_overflow(t, N, &t) || __builtin_mul_overflow(t, d->P, &t) ||
        __builtin_mul_overflow(t, d->Q, &t)) {
        nb__fail(NB_ERR_SHAPE, "%s: sizes overflow: x %s, filter %s", op, nb__shape_str(xnd, xs, sx, sizeof sx),
                 nb__shape_str(wnd, ws, sw, sizeof sw));
        return false;
    }
    d->stride[0] = o->stride[0], d->stride[1] = o->stride[1];
    d->dilation[0] = o->dilation[0], d->dilation[1] = o->dilation[1];
    d->groups = G;
    d->nchw = o->format == NB_NCHW;
    return true;
}

/* Image dims of a 4-d tensor in the given format: n, h, w, c. */
static void image_dims(const nb_tensor *t, bool nchw, int64_t *n, int64_t *h, int64_t *w, int64_t *c)
{
    *n = t->shape[0];
    *h = t->shape[nchw ? 2 : 1];
    *w = t->shape[nchw ? 3 : 2];
    *c = t->shape[nchw ? 1 : 3];
}

static void image_shape(bool nchw, int64_t n, int64_t h, int64_t w, int64_t c, int64_t *s)
{
    s[0] = n;
    s[1] = nchw ? c : h;
    s[2] = nchw ? h : w;
    s[3] = nchw ? w : c;
}

static bool check_rank(const char *op, const char *what, const nb_tensor *t)
{
    if (t->ndim == 4)
        return true;
    char s[NB_SHAPE_STR_MAX];
    nb__fail(NB_ERR_SHAPE, "%s: %s must be 4-d, got %s", op, what, nb__shape_str(t->ndim, t->shape, s, sizeof s));
    return false;
}

/* Options kept on a node for its gradient. */
static void opts_to_attrs(const nb_conv2d_opts *o, nb_op_attrs *a)
{
    memset(a, 0, sizeof *a);
    a->i[0] = o->stride[0], a->i[1] = o->stride[1];
    a->i[2] = o->dilation[0], a->i[3] = o->dilation[1];
    a->i[4] = o->padding;
    a->i[5] = o->pad[0], a->i[6] = o->pad[1], a->i[7] = o->pad[2], a->i[8] = o->pad[3];
    a->i[9] = o->groups;
    a->i[10] = o->format;
}

static void attrs_to_opts(const nb_op_attrs *a, nb_conv2d_opts *o)
{
    memset(o, 0, sizeof *o);
    o->stride[0] = (int)a->i[0], o->stride[1] = (int)a->i[1];
    o->dilation[0] = (int)a->i[2], o->dilation[1] = (int)a->i[3];
    o->padding = (nb_padding)a->i[4];
    o->pad[0] = (int)a->i[5], o->pad[1] = (int)a->i[6], o->pad[2] = (int)a->i[7], o->pad[3] = (int)a->i[8];
    o->groups = (int)a->i[9];
    o->format = (nb_data_format)a->i[10];
}

/* Runs one of the three kernels on contiguous copies of the inputs. */
typedef enum conv_kind { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } conv_kind;

static const nb_kernel conv_kernels[3] = {NB_K_CONV2D, NB_K_CONV2D_BACKWARD_DATA, NB_K_CONV2D_BACKWARD_FILTER};

/* Places the op and makes both inputs contiguous (recorded copies); NULL on error. */
static nb_device *place(const char *op, const nb_tensor **in, conv_kind kind)
{
    nb_device *dev = nb__op_place_kernel(op, 2, in, conv_kernels[kind], 0, in[0]->dtype);
    if (!dev)
        return NULL;
    for (int i = 0; i < 2; i++)
        if (!in[i]->contiguous && !(in[i] = nb_contiguous(in[i])))
            return NULL;
    return dev;
}

static nb_tensor *run_kernel(const char *op, nb_device *dev, conv_kind kind, const nb_conv2d_desc *d,
                             const nb_tensor *a, const nb_tensor *b, nb_dtype dt, const int64_t *shape)
{
    nb_tensor *out = nb__out(op, dev, dt, 4, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), va = nb__view(a), vb = nb__view(b);
    nb_status st;
    switch (kind) {
    case CONV_FWD: st = dev->backend->conv2d(dev, d, &vo, &va, &vb); break;
    case CONV_BWD_DATA: st = dev->backend->conv2d_backward_data(dev, d, &vo, &va, &vb); break;
    default: st = dev->backend->conv2d_backward_filter(dev, d, &vo, &va, &vb); break;
    }
    return nb__kernel_done(st, out);
}

static nb_status conv2d_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi);
static nb_status conv2d_transpose_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi);
static nb_status conv2d_filter_grad_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi);

static const nb_op_def conv2d_def = {.name = "conv2d", .grad = conv2d_grad};
static const nb_op_def conv2d_transpose_def = {.name = "conv2d_transpose", .grad = conv2d_transpose_grad};
static const nb_op_def conv2d_filter_grad_def = {.name = "conv2d_filter_grad", .grad = conv2d_filter_grad_grad};

/* The common input checks: NULLs, dtypes (one floating dtype), ranks. */
static bool check_inputs(const char *op, const nb_tensor *a, const nb_tensor *b, const char *an, const char *bn)
{
    if (!a) {
        nb__null_input(op, 0);
        return false;
    }
    if (!b) {
        nb__null_input(op, 1);
        return false;
    }
    if (nb__check_dtype(op, an, a, NB_FLOATS) || nb__check_same_dtype(op, a, b))
        return false;
    return check_rank(op, an, a) && check_rank(op, bn, b);
}

nb_tensor *nb_conv2d(const nb_tensor *x, const nb_tensor *filter, const nb_conv2d_opts *opts)
{
    const char *op = "conv2d";
    nb_conv2d_opts o;
    if (!check_inputs(op, x, filter, "x", "filter") || !fill_opts(op, opts, &o))
        return NULL;
    bool nchw = o.format == NB_NCHW;
    int64_t N, H, W, C;
    image_dims(x, nchw, &N, &H, &W, &C);
    const int64_t *fs = filter->shape;
    conv_geom g;
    if (!geometry(op, &o, N, H, W, C, fs[0], fs[1], fs[2], fs[3], 4, x->shape, 4, fs, &g))
        return NULL;
    const nb_tensor *in[2] = {x, filter};
    nb_device *dev = place(op, in, CONV_FWD);
    if (!dev)
        return NULL;
    int64_t shape[4];
    image_shape(nchw, N, g.d.P, g.d.Q, g.d.K, shape);
    nb_tensor *out = run_kernel(op, dev, CONV_FWD, &g.d, in[0], in[1], x->dtype, shape);
    nb_op_attrs a;
    opts_to_attrs(&g.o, &a);
    return nb__finish(&conv2d_def, 2, in, out, &a);
}

nb_tensor *nb_conv2d_transpose(const nb_tensor *dy, const nb_tensor *filter, const int64_t input_hw[2],
                               const nb_conv2d_opts *opts)
{
    const char *op = "conv2d_transpose";
    nb_conv2d_opts o;
    if (!check_inputs(op, dy, filter, "dy", "filter") || !fill_opts(op, opts, &o))
        return NULL;
    if (!input_hw)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: input_hw is NULL", op);
    bool nchw = o.format == NB_NCHW;
    int64_t N, P, Q, K;
    image_dims(dy, nchw, &N, &P, &Q, &K);
    const int64_t *fs = filter->shape;
    char sd[NB_SHAPE_STR_MAX], sf[NB_SHAPE_STR_MAX], sh[64];
    if (fs[3] != K)
        return nb__fail_null(NB_ERR_SHAPE, "%s: dy's channels (%lld) must equal the filter's output channels: dy %s, filter %s",
                             op, (long long)K, nb__shape_str(4, dy->shape, sd, sizeof sd),
                             nb__shape_str(4, fs, sf, sizeof sf));
    int64_t C = fs[2] * o.groups, xs[4];
    image_shape(nchw, N, input_hw[0], input_hw[1], C, xs);
    conv_geom g;
    if (!geometry(op, &o, N, input_hw[0], input_hw[1], C, fs[0], fs[1], fs[2], K, 4, xs, 4, fs, &g))
        return NULL;
    if (g.d.P != P || g.d.Q != Q)
        return nb__fail_null(NB_ERR_SHAPE, "%s: %s gives a [%lld, %lld] output with filter %s, not dy %s's [%lld, %lld]",
                             op, fmt_hw("input_hw", input_hw, sh, sizeof sh), (long long)g.d.P, (long long)g.d.Q,
                             nb__shape_str(4, fs, sf, sizeof sf), nb__shape_str(4, dy->shape, sd, sizeof sd),
                             (long long)P, (long long)Q);
    const nb_tensor *in[2] = {dy, filter};
    nb_device *dev = place(op, in, CONV_BWD_DATA);
    if (!dev)
        return NULL;
    nb_tensor *out = run_kernel(op, dev, CONV_BWD_DATA, &g.d, in[0], in[1], dy->dtype, xs);
    nb_op_attrs a;
    opts_to_attrs(&g.o, &a);
    return nb__finish(&conv2d_transpose_def, 2, in, out, &a);
}

nb_tensor *nb_conv2d_filter_grad(const nb_tensor *x, const nb_tensor *dy, const int64_t filter_hw[2],
                                 const nb_conv2d_opts *opts)
{
    const char *op = "conv2d_filter_grad";
    nb_conv2d_opts o;
    if (!check_inputs(op, x, dy, "x", "dy") || !fill_opts(op, opts, &o))
        return NULL;
    if (!filter_hw)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: filter_hw is NULL", op);
    bool nchw = o.format == NB_NCHW;
    int64_t N, H, W, C, N2, P, Q, K;
    image_dims(x, nchw, &N, &H, &W, &C);
    image_dims(dy, nchw, &N2, &P, &Q, &K);
    char sx[NB_SHAPE_STR_MAX], sd[NB_SHAPE_STR_MAX], sh[64];
    if (N2 != N)
        return nb__fail_null(NB_ERR_SHAPE, "%s: x %s and dy %s have different batch sizes", op,
                             nb__shape_str(4, x->shape, sx, sizeof sx), nb__shape_str(4, dy->shape, sd, sizeof sd));
    if (o.groups > 0 && C % o.groups)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: groups %d must divide x %s's channels (%lld)", op,
                             o.groups, nb__shape_str(4, x->shape, sx, sizeof sx), (long long)C);
    int64_t fs[4] = {filter_hw[0], filter_hw[1], C / o.groups, K};
    conv_geom g;
    if (!geometry(op, &o, N, H, W, C, fs[0], fs[1], fs[2], K, 4, x->shape, 4, fs, &g))
        return NULL;
    if (g.d.P != P || g.d.Q != Q)
        return nb__fail_null(NB_ERR_SHAPE, "%s: x %s with %s gives a [%lld, %lld] output, not dy %s's [%lld, %lld]",
                             op, nb__shape_str(4, x->shape, sx, sizeof sx), fmt_hw("filter_hw", filter_hw, sh, sizeof sh),
                             (long long)g.d.P, (long long)g.d.Q, nb__shape_str(4, dy->shape, sd, sizeof sd),
                             (long long)P, (long long)Q);
    const nb_tensor *in[2] = {x, dy};
    nb_device *dev = place(op, in, CONV_BWD_FILTER);
    if (!dev)
        return NULL;
    nb_tensor *out = run_kernel(op, dev, CONV_BWD_FILTER, &g.d, in[0], in[1], x->dtype, fs);
    nb_op_attrs a;
    opts_to_attrs(&g.o, &a);
    return nb__finish(&conv2d_filter_grad_def, 2, in, out, &a);
}

/* ---- gradients ------------------------------------------------------------------------------- */

/* The image height and width of a 4-d tensor in o's format. */
static void hw_of(const nb_tensor *t, const nb_conv2d_opts *o, int64_t hw[2])
{
    bool nchw = o->format == NB_NCHW;
    hw[0] = t->shape[nchw ? 2 : 1];
    hw[1] = t->shape[nchw ? 3 : 2];
}

static nb_status conv2d_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *x = n->in[0], *w = n->in[1];
    nb_conv2d_opts o;
    attrs_to_opts(&n->attrs, &o);
    int64_t xhw[2], rs[2] = {w->shape[0], w->shape[1]};
    hw_of(x, &o, xhw);
    if (nb__needs_grad(n, 0) && !(gi[0] = nb_conv2d_transpose(g[0], w, xhw, &o)))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb_conv2d_filter_grad(x, g[0], rs, &o)))
        return nb__ok(NULL);
    return NB_OK;
}

static nb_status conv2d_transpose_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *dy = n->in[0], *w = n->in[1];
    nb_conv2d_opts o;
    attrs_to_opts(&n->attrs, &o);
    int64_t rs[2] = {w->shape[0], w->shape[1]};
    if (nb__needs_grad(n, 0) && !(gi[0] = nb_conv2d(g[0], w, &o)))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb_conv2d_filter_grad(g[0], dy, rs, &o)))
        return nb__ok(NULL);
    return NB_OK;
}

static nb_status conv2d_filter_grad_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *x = n->in[0], *dy = n->in[1];
    nb_conv2d_opts o;
    attrs_to_opts(&n->attrs, &o);
    int64_t xhw[2];
    hw_of(x, &o, xhw);
    if (nb__needs_grad(n, 0) && !(gi[0] = nb_conv2d_transpose(dy, g[0], xhw, &o)))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb_conv2d(x, g[0], &o)))
        return nb__ok(NULL);
    return NB_OK;
}
