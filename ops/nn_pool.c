/* 2-d pooling: max_pool2d and avg_pool2d, their gradients, and global
 * average pooling.
 *
 * Gradients of every order:
 *   max_pool2d(x)            -> max_pool2d_grad(x, g): g summed into each
 *                               window's first maximum of x;
 *   max_pool2d_grad(x, dy)   -> for dy, max_pool2d_select(x, g): g read at
 *                               each window's first maximum (the transpose);
 *                               for x, none (it is piecewise constant in x);
 *   max_pool2d_select(x, s)  -> for s, max_pool2d_grad(x, g); for x, none.
 *   avg_pool2d(x)            -> avg_pool2d_grad(g) (linear), whose gradient
 *                               is avg_pool2d(g) again.
 * The descriptor of the pooling travels in the node's attributes. */
#include "op.h"

#include <string.h>

/* ---- the descriptor ------------------------------------------------------------ */

static void desc_to_attrs(const nb_pool2d_desc *d, nb_op_attrs *a)
{
    memset(a, 0, sizeof *a);
    int64_t v[13] = {d->N, d->H, d->W, d->C, d->P, d->Q, d->R, d->S, d->sh, d->sw, d->pt, d->pl, d->nchw};
    memcpy(a->i, v, sizeof v);
}

static nb_pool2d_desc desc_of(const nb_op_attrs *a)
{
    const int64_t *v = a->i;
    return (nb_pool2d_desc){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12] != 0};
}

/* Checks x and opts and works out the pooling; false with the error recorded. */
static bool pool_desc(const char *op, const nb_tensor *x, const nb_pool2d_opts *o, nb_pool2d_desc *d)
{
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return false;
    char s[NB_SHAPE_STR_MAX];
    if (!o) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: options are needed (at least the window)", op);
        return false;
    }
    if (o->format != NB_NHWC && o->format != NB_NCHW) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: data format %d is neither NB_NHWC nor NB_NCHW", op, (int)o->format);
        return false;
    }
    if (x->ndim != 4) {
        nb__fail(NB_ERR_SHAPE, "%s: input %s must be 4-d (%s)", op, nb__shape_str(SHAPE_OF(x), s, sizeof s),
                 o->format == NB_NCHW ? "[N, C, H, W]" : "[N, H, W, C]");
        return false;
    }
    if (o->window[0] < 1 || o->window[1] < 1) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: window %dx%d must be at least 1x1", op, o->window[0], o->window[1]);
        return false;
    }
    if (o->stride[0] < 0 || o->stride[1] < 0) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stride %dx%d must be positive (0: the window's)", op, o->stride[0],
                 o->stride[1]);
        return false;
    }
    bool nchw = o->format == NB_NCHW;
    d->nchw = nchw;
    d->N = x->shape[0];
    d->C = x->shape[nchw ? 1 : 3];
    d->H = x->shape[nchw ? 2 : 1];
    d->W = x->shape[nchw ? 3 : 2];
    d->R = o->window[0];
    d->S = o->window[1];
    d->sh = o->stride[0] ? o->stride[0] : o->window[0];
    d->sw = o->stride[1] ? o->stride[1] : o->window[1];
    int64_t pad[4] = {0, 0, 0, 0}; /* top, bottom, left, right */
    switch (o->padding) {
    case NB_PAD_VALID: break;
    case NB_PAD_SAME: {
        int64_t P = (d->H + d->sh - 1) / d->sh, Q = (d->W + d->sw - 1) / d->sw;
        int64_t th = (P - 1) * d->sh + d->R - d->H, tw = (Q - 1) * d->sw + d->S - d->W;
        th = th > 0 ? th : 0;
        tw = tw > 0 ? tw : 0;
        pad[0] = th / 2, pad[1] = th - th / 2, pad[2] = tw / 2, pad[3] = tw - tw / 2;
        break;
    }
    case NB_PAD_EXPLICIT:
        for (int i = 0; i < 4; i++) {
            int64_t w = i < 2 ? d->R : d->S;
            if (o->pad[i] < 0 || o->pad[i] >= w) {
                nb__fail(NB_ERR_INVALID_ARGUMENT,
                         "%s: padding {%d, %d, %d, %d} must lie in [0, window) on each side (window %dx%d)", op,
                         o->pad[0], o->pad[1], o->pad[2], o->pad[3], o->window[0], o->window[1]);
                return false;
            }
            pad[i] = o->pad[i];
        }
        break;
    default:
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: padding %d is not VALID, SAME or EXPLICIT", op, (int)o->padding);
        return false;
    }
    int64_t hp = d->H + pad[0] + pad[1], wp = d->W + pad[2] + pad[3];
    if (hp < d->R || wp < d->S || d->H == 0 || d->W == 0) {
        nb__fail(NB_ERR_SHAPE, "%s: window %dx%d does not fit input %s (%lldx%lld with padding)", op, o->window[0],
                 o->window[1], nb__shape_str(SHAPE_OF(x), s, sizeof s), (long long)hp, (long long)wp);
        return false;
    }
    d->P = (hp - d->R) / d->sh + 1;
    d->Q = (wp - d->S) / d->sw + 1;
    d->pt = pad[0];
    d->pl = pad[2];
    return true;
}

static void out_shape(const nb_pool2d_desc *d, bool pooled, int64_t *shape)
{
    int64_t h = pooled ? d->P : d->H, w = pooled ? d->Q : d->W;
    if (d->nchw) {
        shape[0] = d->N, shape[1] = d->C, shape[2] = h, shape[3] = w;
    } else {
        shape[0] = d->N, shape[1] = h, shape[2] = w, shape[3] = d->C;
    }
}

/* ---- the ops ------------------------------------------------------------------- */

static nb_tensor *max_pool(const nb_op_def *def, const nb_tensor *x, const nb_tensor *sel, const nb_pool2d_desc *d);
static nb_tensor *max_pool_grad(const nb_tensor *x, const nb_tensor *dy, const nb_pool2d_desc *d);
static nb_tensor *avg_pool(const nb_tensor *x, const nb_pool2d_desc *d);
static nb_tensor *avg_pool_grad(const nb_tensor *dy, const nb_pool2d_desc *d);

static nb_status max_pool2d_gradient(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_pool2d_desc d = desc_of(&n->attrs);
    gi[0] = max_pool_grad(n->in[0], g[0], &d);
    return nb__ok(gi[0]);
}

static nb_status max_pool2d_select_gradient(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_pool2d_desc d = desc_of(&n->attrs);
    gi[0] = NULL; /* piecewise constant in x */
    gi[1] = nb__needs_grad(n, 1) ? max_pool_grad(n->in[0], g[0], &d) : NULL;
    return nb__needs_grad(n, 1) ? nb__ok(gi[1]) : NB_OK;
}

static const nb_op_def max_pool2d_def = {.name = "max_pool2d", .grad = max_pool2d_gradient};
static const nb_op_def max_pool2d_select_def = {.name = "max_pool2d_select", .grad = max_pool2d_select_gradient};

static nb_status max_pool2d_grad_gradient(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_pool2d_desc d = desc_of(&n->attrs);
    gi[0] = NULL; /* piecewise constant in x */
    gi[1] = nb__needs_grad(n, 1) ? max_pool(&max_pool2d_select_def, n->in[0], g[0], &d) : NULL;
    return nb__needs_grad(n, 1) ? nb__ok(gi[1]) : NB_OK;
}

static const nb_op_def max_pool2d_grad_def = {.name = "max_pool2d_grad", .grad = max_pool2d_grad_gradient};

static nb_status avg_pool2d_gradient(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_pool2d_desc d = desc_of(&n->attrs);
    gi[0] = avg_pool_grad(g[0], &d);
    return nb__ok(gi[0]);
}

static nb_status avg_pool2d_grad_gradient(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_pool2d_desc d = desc_of(&n->attrs);
    gi[0] = avg_pool(g[0], &d);
    return nb__ok(gi[0]);
}

static const nb_op_def avg_pool2d_def = {.name = "avg_pool2d", .grad = avg_pool2d_gradient};
static const nb_op_def avg_pool2d_grad_def = {.name = "avg_pool2d_grad", .grad = avg_pool2d_grad_gradient};

/* Checks that t (the gradient-side input) has the shape the descriptor gives. */
static bool fits(const char *op, const char *what, const nb_tensor *t, const nb_pool2d_desc *d, bool pooled)
{
    int64_t want[4];
    out_shape(d, pooled, want);
    bool ok = t->ndim == 4;
    for (int i = 0; ok && i < 4; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char s[NB_SHAPE_STR_MAX], w[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "%s: %s %s should be %s", op, what, nb__shape_str(SHAPE_OF(t), s, sizeof s),
                 nb__shape_str(4, want, w, sizeof w));
    }
    return ok;
}

/* Runs one pooling kernel: n inputs (made contiguous), an output of the pooled
 * (or image) shape, recorded with def. */
typedef enum pool_kind { K_MAX, K_MAX_GRAD, K_AVG, K_AVG_GRAD } pool_kind;

static nb_tensor *run_pool(const nb_op_def *def, pool_kind kind, int n, const nb_tensor *a, const nb_tensor *b,
                           const nb_pool2d_desc *d)
{
    const char *op = def->name;
    static const nb_kernel kernels[] = {NB_K_MAX_POOL2D, NB_K_MAX_POOL2D_GRAD, NB_K_AVG_POOL2D, NB_K_AVG_POOL2D_GRAD};
    const nb_tensor *in[2] = {a, b};
    nb_device *dev = nb__op_place_kernel(op, n, in, kernels[kind], 0, a->dtype);
    if (!dev)
        return NULL;
    int64_t shape[4];
    bool pooled = kind == K_MAX || kind == K_AVG;
    out_shape(d, pooled, shape);
    nb_tensor *out = nb__out(op, dev, a->dtype, 4, shape);
    if (!out)
        return NULL;
    if (out->numel) {
        nb_tensor *ta = NULL, *tb = NULL;
        const nb_tensor *ca = nb__dense(op, in[0], &ta);
        const nb_tensor *cb = ca && n > 1 ? nb__dense(op, in[1], &tb) : NULL;
        if (!ca || (n > 1 && !cb)) {
            nb__release(ta);
            nb__release(out);
            return NULL;
        }
        nb_view vo = nb__view(out), va = nb__view(ca), vb = n > 1 ? nb__view(cb) : (nb_view){0};
        const nb_backend *be = dev->backend;
        nb_status st;
        switch (kind) {
        case K_MAX: st = be->max_pool2d(dev, d, &vo, &va, n > 1 ? &vb : NULL); break;
        case K_MAX_GRAD: st = be->max_pool2d_grad(dev, d, &vo, &va, &vb); break;
        case K_AVG: st = be->avg_pool2d(dev, d, &vo, &va); break;
        default: st = be->avg_pool2d_grad(dev, d, &vo, &va); break;
        }
        out = nb__kernel_done(st, out);
        nb__release(ta);
        nb__release(tb);
    }
    nb_op_attrs attrs;
    desc_to_attrs(d, &attrs);
    return nb__finish(def, n, in, out, &attrs);
}

static bool gradient_input(const char *op, const nb_tensor *x, const nb_tensor *g, const nb_pool2d_desc *d,
                           bool pooled)
{
    if (!x || !g) {
        nb__null_input(op, x ? 1 : 0);
        return false;
    }
    return !nb__check_dtype(op, "gradient", g, NB_FLOATS) && !nb__check_same_dtype(op, x, g) &&
           fits(op, "gradient", g, d, pooled);
}

static nb_tensor *max_pool(const nb_op_def *def, const nb_tensor *x, const nb_tensor *sel, const nb_pool2d_desc *d)
{
    if (sel && !gradient_input(def->name, x, sel, d, false))
        return NULL;
    return run_pool(def, K_MAX, sel ? 2 : 1, x, sel, d);
}

static nb_tensor *max_pool_grad(const nb_tensor *x, const nb_tensor *dy, const nb_pool2d_desc *d)
{
    if (!gradient_input(max_pool2d_grad_def.name, x, dy, d, true))
        return NULL;
    return run_pool(&max_pool2d_grad_def, K_MAX_GRAD, 2, x, dy, d);
}

static nb_tensor *avg_pool(const nb_tensor *x, const nb_pool2d_desc *d)
{
    if (!x)
        return nb__null_input(avg_pool2d_def.name, 0);
    if (!fits(avg_pool2d_def.name, "input", x, d, false))
        return NULL;
    return run_pool(&avg_pool2d_def, K_AVG, 1, x, NULL, d);
}

static nb_tensor *avg_pool_grad(const nb_tensor *dy, const nb_pool2d_desc *d)
{
    if (!dy)
        return nb__null_input(avg_pool2d_grad_def.name, 0);
    if (nb__check_dtype(avg_pool2d_grad_def.name, "gradient", dy, NB_FLOATS) ||
        !fits(avg_pool2d_grad_def.name, "gradient", dy, d, true))
        return NULL;
    return run_pool(&avg_pool2d_grad_def, K_AVG_GRAD, 1, dy, NULL, d);
}

/* The forward pooling of x by def (K_MAX or K_AVG). Returns the new tensor,
 * or NULL (error recorded) when x or opts is refused or the kernel fails. */
static nb_tensor *pool_forward(const nb_op_def *def, pool_kind kind, const nb_tensor *x, const nb_pool2d_opts *opts)
{
    if (!x)
        return nb__null_input(def->name, 0);
    nb_pool2d_desc d;
    if (!pool_desc(def->name, x, opts, &d))
        return NULL;
    return run_pool(def, kind, 1, x, NULL, &d);
}

nb_tensor *nb_max_pool2d(const nb_tensor *x, const nb_pool2d_opts *opts)
{
    return pool_forward(&max_pool2d_def, K_MAX, x, opts);
}

nb_tensor *nb_avg_pool2d(const nb_tensor *x, const nb_pool2d_opts *opts)
{
    return pool_forward(&avg_pool2d_def, K_AVG, x, opts);
}

nb_tensor *nb_global_avg_pool2d(const nb_tensor *x, nb_data_format format)
{
    const char *op = "global_avg_pool2d";
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, NB_FLOATS))
        return NULL;
    if (format != NB_NHWC && format != NB_NCHW)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: data format %d is neither NB_NHWC nor NB_NCHW", op,
                             (int)format);
    if (x->ndim != 4) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: input %s must be 4-d (%s)", op, nb__shape_str(SHAPE_OF(x), s, sizeof s),
                             format == NB_NCHW ? "[N, C, H, W]" : "[N, H, W, C]");
    }
    return format == NB_NCHW ? nb_mean(x, NB_AXES(2, 3), false) : nb_mean(x, NB_AXES(1, 2), false);
}
