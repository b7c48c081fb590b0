/* The conv2d entries through cuDNN's graph API; depthwise ones (groups == C
 * > 1) through gpu_depthwise.cu's kernels instead.
 *
 * API: one convolution operation (forward, backward data or backward filter)
 * per operation graph, planned once per problem through gpu_cudnn.c (the
 * heuristics' first engine the switches allow, cached) and run with the
 * tensors' pointers. No deprecated cuDNN entry point is used.
 *
 * Layout: images are described in their own format (NHWC or NCHW strides),
 * except f64 NHWC ones, which go through NCHW scratch copies (cuDNN's
 * engines for double are NCHW ones). cuDNN's engines want the filter as KRSC
 * beside an NHWC image and KCRS beside an NCHW one, not TensorFlow's HWIO, so
 * the HWIO filter is transposed into scratch from the caching allocator
 * first (and the filter gradient computed in that layout and transposed
 * back); a filter is small next to the images, and the copies are queued on
 * the same stream. Groups need no setting: the filter's input channels
 * (C / groups) say them.
 *
 * Padding: the plan pads both sides of a dim alike. When the top/left pad
 * alone does not give the output size (TensorFlow's SAME with an odd total
 * pad puts the extra row at the bottom; explicit pads may differ), the image
 * is copied into a zero-padded scratch block and the convolution runs
 * unpadded (the data gradient is computed padded and its interior copied
 * out): engines for unequal pre- and post-paddings are few.
 *
 * Numerics: f32 uses tensor-core (TF32) engines only when nb_gpu_tf32();
 * no engine that converts inputs down or reduces in lower precision; f16 and
 * bf16 accumulate in float; deterministic mode refuses engines cuDNN notes
 * as nondeterministic. */
#include "gpu_cudnn.h"

#include <stdlib.h>
#include <string.h>

static const char *const conv_names[3] = {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"};

/* ---- the graph of one convolution ---- */

enum { UID_X = 1, UID_W = 2, UID_Y = 3 };

/* What a plan depends on, as the key gpu_cudnn.c caches it by. */
typedef struct conv_problem {
    int which;               /* 0 forward, 1 backward data, 2 backward filter */
    nb_dtype dtype;
    bool cn;                 /* computed NCHW (else NHWC) */
    int64_t align;           /* bytes every pointer is aligned to */
    int64_t N, C, H, W;      /* the image cuDNN sees (padded when needed) */
    int64_t K, Cg, R, S, P, Q;
    int64_t pad[2], stride[2], dilation[2];
} conv_problem;

#define CONV_KEY_LEN 22
static void conv_key(const conv_problem *p, unsigned flags, int64_t key[CONV_KEY_LEN])
{
    const int64_t k[CONV_KEY_LEN] = {
        'c', p->which, p->dtype, p->cn, p->align, flags, p->N, p->C, p->H, p->W, p->K,
        p->Cg, p->R, p->S, p->P, p->Q, p->pad[0], p->pad[1], p->stride[0], p->stride[1], p->dilation[0],
        p->dilation[1]};
    memcpy(key, k, sizeof k);
}

static nb_status conv_build(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptor_t *ops, int *nops,
                            const void *arg)
{
    const conv_problem *p = arg;
    const cudnnDataType_t dt = nb__cudnn_dtype(p->dtype);
    const cudnnDataType_t comp = p->dtype == NB_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    int64_t dims[4], st[4];
    cudnnBackendDescriptor_t x, w, y, cd, op;
    nb_status s;
    nb__cudnn_dims(p->cn, p->N, p->C, p->H, p->W, dims, st);
    if ((s = nb__cudnn_tensor(c, keep, UID_X, dt, 4, dims, st, p->align, &x)))
        return s;
    nb__cudnn_dims(p->cn, p->K, p->Cg, p->R, p->S, dims, st);
    if ((s = nb__cudnn_tensor(c, keep, UID_W, dt, 4, dims, st, p->align, &w)))
        return s;
    nb__cudnn_dims(p->cn, p->N, p->K, p->P, p->Q, dims, st);
    if ((s = nb__cudnn_tensor(c, keep, UID_Y, dt, 4, dims, st, p->align, &y)))
        return s;

    const int64_t spatial = 2;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    if ((s = nb__cudnn_make(c, keep, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &cd)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, p->dilation)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, p->stride)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, p->pad)) ||
        (s = nb__cudnn_set(c, cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, p->pad)) ||
        (s = nb__cudnn_finalize(c, cd, "the convolution descriptor")))
        return s;

    /* y = 1 * conv + 0 * y: the scalars in the compute type */
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const bool dbl = p->dtype == NB_F64;
    const cudnnBackendAttributeType_t st_type = dbl ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    const void *one = dbl ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = dbl ? (const void *)&zero_d : (const void *)&zero_f;
    static const cudnnBackendDescriptorType_t kinds[3] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                                          CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                          CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    /* per direction: the attributes of x, w, y, the convolution, alpha, beta */
    static const cudnnBackendAttributeName_t attr[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
    };
    const cudnnBackendAttributeName_t *a = attr[p->which];
    if ((s = nb__cudnn_make(c, keep, kinds[p->which], &op)) ||
        (s = nb__cudnn_set(c, op, a[0], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x)) ||
        (s = nb__cudnn_set(c, op, a[1], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w)) ||
        (s = nb__cudnn_set(c, op, a[2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y)) ||
        (s = nb__cudnn_set(c, op, a[3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd)) ||
        (s = nb__cudnn_set(c, op, a[4], st_type, 1, one)) || (s = nb__cudnn_set(c, op, a[5], st_type, 1, zero)) ||
        (s = nb__cudnn_finalize(c, op, "the convolution operation")))
        return s;
    ops[0] = op;
    *nops = 1;
    return NB_OK;
}

/* ---- views for the layout copies ---- */

static nb_view view_of(void *data, nb_dtype dt, const int64_t shape[4], const int64_t estrides[4])
{
    nb_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dt;
    v.ndim = 4;
    v.numel = 1;
    int64_t es = (int64_t)nb_dtype_size(dt);
    for (int i = 0; i < 4; i++) {
        v.shape[i] = shape[i];
        v.strides[i] = estrides[i] * es;
        v.numel *= shape[i];
    }
    int64_t want[4];
    nb__contiguous_strides(4, shape, (size_t)es, want);
    v.contiguous = memcmp(want, v.strides, sizeof want) == 0;
    return v;
}

/* The HWIO filter [R, S, Cg, K] seen as cuDNN's order (KRSC or KCRS). */
static nb_view filter_as_cudnn(void *hwio, nb_dtype dt, bool nchw, const nb_conv2d_desc *d)
{
    const int64_t Cg = d->C / d->groups, K = d->K;
    if (nchw) {
        int64_t shape[4] = {K, Cg, d->R, d->S}, st[4] = {1, K, d->S * Cg * K, Cg * K};
        return view_of(hwio, dt, shape, st);
    }
    int64_t shape[4] = {K, d->R, d->S, Cg}, st[4] = {1, d->S * Cg * K, Cg * K, K};
    return view_of(hwio, dt, shape, st);
}

static nb_view contiguous_like(void *data, const nb_view *v)
{
    nb_view o = *v;
    o.data = data;
    nb__contiguous_strides(4, v->shape, nb_dtype_size(v->dtype), o.strides);
    o.contiguous = true;
    return o;
}

/* An image [N, h, w, ch] (or [N, ch, h, w]) in its format, contiguous. */
static nb_view image_view(void *data, nb_dtype dt, bool nchw, int64_t N, int64_t h, int64_t w, int64_t ch)
{
    int64_t shape[4] = {N, nchw ? ch : h, nchw ? h : w, nchw ? w : ch}, st[4];
    st[3] = 1;
    for (int i = 2; i >= 0; i--)
        st[i] = st[i + 1] * shape[i + 1];
    return view_of(data, dt, shape, st);
}

/* An image [N, h, w, ch] stored NCHW (stored_nchw) or NHWC, seen in the
 * logical order of as_nchw: the strided view a copy converts through. */
static nb_view image_logical(void *data, nb_dtype dt, bool stored_nchw, bool as_nchw, int64_t N, int64_t h,
                             int64_t w, int64_t ch)
{
    int64_t sn = h * w * ch, sc = stored_nchw ? h * w : 1, sh = stored_nchw ? w : w * ch, sw = stored_nchw ? 1 : ch;
    if (as_nchw) {
        int64_t shape[4] = {N, ch, h, w}, st[4] = {sn, sc, sh, sw};
        return view_of(data, dt, shape, st);
    }
    int64_t shape[4] = {N, h, w, ch}, st[4] = {sn, sh, sw, sc};
    return view_of(data, dt, shape, st);
}

/* The [H, W] interior of a padded image block [N, Hp, Wp, C] at (top, left). */
static nb_view interior(void *padded, nb_dtype dt, bool nchw, int64_t N, int64_t Hp, int64_t Wp, int64_t C,
                        int64_t H, int64_t W, int64_t top, int64_t left)
{
    int64_t es = (int64_t)nb_dtype_size(dt);
    if (nchw) {
        int64_t shape[4] = {N, C, H, W}, st[4] = {C * Hp * Wp, Hp * Wp, Wp, 1};
        return view_of((char *)padded + (top * Wp + left) * es, dt, shape, st);
    }
    int64_t shape[4] = {N, H, W, C}, st[4] = {Hp * Wp * C, Wp * C, C, 1};
    return view_of((char *)padded + (top * Wp + left) * C * es, dt, shape, st);
}

/* out/a/b as the table gives them: 0 (y, x, w), 1 (dx, dy, w), 2 (dw, x, dy). */
static nb_status conv(nb_gpu_ctx *c, int which, const nb_conv2d_desc *d, const nb_view *out, const nb_view *a,
                      const nb_view *b)
{
    const char *op = conv_names[which];
    const nb_dtype dt = out->dtype;
    if (dt != NB_F32 && dt != NB_F64 && dt != NB_F16 && dt != NB_BF16)
        return nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", op, nb_dtype_name(dt), c->dev->name);
    if (a->dtype != dt || b->dtype != dt)
        return nb__fail(NB_ERR_DTYPE, "%s: dtypes %s, %s -> %s differ", op, nb_dtype_name(a->dtype),
                        nb_dtype_name(b->dtype), nb_dtype_name(dt));
    if (out->numel == 0)
        return NB_OK;
    /* Depthwise convolutions run on kernels of our own (gpu_depthwise.cu):
     * cuDNN's engines for groups == C are several times slower. */
    if (nb__gpu_depthwise_applies(d)) {
        switch (which) {
        case 0: return nb__gpu_depthwise_forward(c, d, out, a, b);
        case 1: return nb__gpu_depthwise_backward_data(c, d, out, a, b);
        default: return nb__gpu_depthwise_backward_filter(c, d, out, a, b);
        }
    }
    /* The padding the plan can do itself: the top/left pad on both sides gives P and Q. */
    const int64_t span_h = (int64_t)d->dilation[0] * (d->R - 1) + 1, span_w = (int64_t)d->dilation[1] * (d->S - 1) + 1;
    bool sym = d->H + 2 * (int64_t)d->pad[0] >= span_h && d->W + 2 * (int64_t)d->pad[1] >= span_w &&
               (d->H + 2 * (int64_t)d->pad[0] - span_h) / d->stride[0] + 1 == d->P &&
               (d->W + 2 * (int64_t)d->pad[1] - span_w) / d->stride[1] + 1 == d->Q;
    int64_t Hc = d->H, Wc = d->W; /* the image cuDNN sees */
    int64_t pad_h = d->pad[0], pad_w = d->pad[1];
    if (!sym) {
        int64_t bh = (d->P - 1) * d->stride[0] + span_h - d->H - d->pad[0];
        int64_t bw = (d->Q - 1) * d->stride[1] + span_w - d->W - d->pad[1];
        Hc = d->H + d->pad[0] + (bh > 0 ? bh : 0);
        Wc = d->W + d->pad[1] + (bw > 0 ? bw : 0);
        pad_h = pad_w = 0;
    }
    const int64_t Cg = d->C / d->groups;
    const size_t es = nb_dtype_size(dt);
    /* The layout cuDNN computes in: the images' own, except f64, which runs
     * NCHW (cuDNN's engines for double are NCHW ones, as frameworks keep
     * double convolutions NCHW): NHWC f64 images go through scratch. */
    const bool cn = d->nchw || dt == NB_F64, relayout = cn != d->nchw;
    const bool tf32 = dt == NB_F32 && nb_gpu_tf32(), det = nb_deterministic();
    /* f32 and f64 exactly as stored (no input converted down, no reduction
     * in lower precision); f16 and bf16 summed in float where cuDNN has an
     * engine for it (the mixed-precision policy's promise), else as it can */
    const unsigned flags = (dt == NB_F32 || dt == NB_F64 ? NB_CUDNN_EXACT_INPUTS : NB_CUDNN_FLOAT_REDUCTION) |
                           (dt != NB_F32 || tf32 ? NB_CUDNN_ALLOW_TENSOR_CORE : 0) | (det ? NB_CUDNN_DETERMINISTIC : 0);
    /* sizes of the scratch blocks: the callers checked that the tensors' fit */
    const int64_t padded_shape[4] = {d->N, Hc, Wc, d->C};
    int64_t xpad_n = sym ? 0 : nb__shape_numel(4, padded_shape);
    if (xpad_n < 0 || __builtin_mul_overflow(xpad_n, (int64_t)es, &xpad_n))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: a padded image of %lld x %lld x %lld x %lld is too large", op,
                        (long long)d->N, (long long)Hc, (long long)Wc, (long long)d->C);
    const size_t wbytes = (size_t)(d->R * d->S * Cg * d->K) * es;
    void *wbuf = NULL, *xpad = NULL, *xtmp = NULL, *ytmp = NULL;
    nb_status st = NB_OK;

    /* The views in the compute layout over the tensors' data, and the
     * pointers cuDNN reads or writes: scratch copies in the compute layout
     * when it is not the tensors' own, x zero-padded when the plan cannot pad
     * as asked, the filter in cuDNN's order. */
    const nb_view xv = image_logical(which == 1 ? out->data : a->data, dt, d->nchw, cn, d->N, d->H, d->W, d->C);
    const nb_view yv = image_logical(which == 0 ? out->data : which == 1 ? a->data : b->data, dt, d->nchw, cn,
                                     d->N, d->P, d->Q, d->K);
    void *x_for = which == 1 ? out->data : a->data, *y_for = which == 0 ? out->data : which == 1 ? a->data : b->data;
    if (!(wbuf = nb__gpu_malloc(c, wbytes)) || (!sym && !(xpad = nb__gpu_malloc(c, (size_t)xpad_n))) ||
        (sym && relayout && !(xtmp = nb__gpu_malloc(c, (size_t)xv.numel * es))) ||
        (relayout && !(ytmp = nb__gpu_malloc(c, (size_t)yv.numel * es)))) {
        st = NB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    x_for = xpad ? xpad : xtmp ? xtmp : x_for;
    y_for = ytmp ? ytmp : y_for;

    /* the plan, cached per problem */
    void *ptrs[3] = {x_for, wbuf, y_for};
    const conv_problem prob = {
        .which = which, .dtype = dt, .cn = cn, .align = nb__cudnn_alignment(es, 3, ptrs),
        .N = d->N, .C = d->C, .H = Hc, .W = Wc, .K = d->K, .Cg = Cg, .R = d->R, .S = d->S, .P = d->P, .Q = d->Q,
        .pad = {pad_h, pad_w}, .stride = {d->stride[0], d->stride[1]}, .dilation = {d->dilation[0], d->dilation[1]},
    };
    int64_t key[CONV_KEY_LEN];
    conv_key(&prob, flags, key);
    const nb_cudnn_plan *plan;
    const char *why;
    if ((st = nb__cudnn_plan_for(c, op, key, CONV_KEY_LEN, flags, conv_build, &prob, &plan, &why))) {
        if (st == NB_ERR_UNSUPPORTED)
            nb__fail(st, "%s: cuDNN has no %splan for this %s convolution (%lld x %lld x %lld x %lld, %lldx%lld "
                         "filter, %lld groups) on %s: %s",
                     op, det ? "deterministic " : "", nb_dtype_name(dt), (long long)d->N, (long long)d->H,
                     (long long)d->W, (long long)d->C, (long long)d->R, (long long)d->S, (long long)d->groups,
                     c->dev->name, why ? why : "");
        goto done;
    }

    /* inputs into the compute layout */
    nb_view user_w = filter_as_cudnn(which == 2 ? out->data : b->data, dt, cn, d);
    nb_view cw = contiguous_like(wbuf, &user_w);
    if (which != 2 && (st = nb__gpu_copy(c, &cw, &user_w)))
        goto done;
    if (xpad) {
        nb_view full = image_view(xpad, dt, cn, d->N, Hc, Wc, d->C);
        nb_view in = interior(xpad, dt, cn, d->N, Hc, Wc, d->C, d->H, d->W, d->pad[0], d->pad[1]);
        if (which != 1 && ((st = nb__gpu_fill(c, &full, 0.0)) || (st = nb__gpu_copy(c, &in, &xv))))
            goto done;
    } else if (xtmp) {
        nb_view t = contiguous_like(xtmp, &xv);
        if (which != 1 && (st = nb__gpu_copy(c, &t, &xv)))
            goto done;
    }
    if (ytmp) {
        nb_view t = contiguous_like(ytmp, &yv);
        if (which != 0 && (st = nb__gpu_copy(c, &t, &yv)))
            goto done;
    }

    static const int64_t uids[3] = {UID_X, UID_W, UID_Y};
    if ((st = nb__cudnn_run(c, op, plan, 3, uids, ptrs)))
        goto done;

    /* the result out of the compute layout */
    if (which == 0 && ytmp) {
        nb_view t = contiguous_like(ytmp, &yv);
        st = nb__gpu_copy(c, &yv, &t);
    } else if (which == 1 && (xpad || xtmp)) {
        nb_view from = xpad ? interior(xpad, dt, cn, d->N, Hc, Wc, d->C, d->H, d->W, d->pad[0], d->pad[1])
                            : contiguous_like(xtmp, &xv);
        st = nb__gpu_copy(c, &xv, &from);
    } else if (which == 2) {
        st = nb__gpu_copy(c, &user_w, &cw);
    }
done:
    /* stream-ordered frees: the queued work still owns these blocks */
    if (wbuf)
        nb__gpu_free(c, wbuf);
    if (xpad)
        nb__gpu_free(c, xpad);
    if (xtmp)
        nb__gpu_free(c, xtmp);
    if (ytmp)
        nb__gpu_free(c, ytmp);
    return st;
}

nb_status nb__gpu_conv2d(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x, const nb_view *w)
{
    return conv(c, 0, d, y, x, w);
}

nb_status nb__gpu_conv2d_backward_data(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dx, const nb_view *dy,
                                       const nb_view *w)
{
    return conv(c, 1, d, dx, dy, w);
}

nb_status nb__gpu_conv2d_backward_filter(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dw,
                                         const nb_view *x, const nb_view *dy)
{
    return conv(c, 2, d, dw, x, dy);
}
