/* The conv2d entries through cuDNN.
 *
 * API: cuDNN's convolution API of cudnn_cnn (tensor, filter and convolution
 * descriptors, cudnnGetConvolution*Algorithm_v7, cudnnConvolutionForward,
 * cudnnConvolutionBackwardData, cudnnConvolutionBackwardFilter). cuDNN 9
 * marks these deprecated in favour of the graph API (cudnn_graph /
 * cudnnBackend*): cudnnConvolutionDescriptor_t and its Create/Set/Destroy
 * (cudnnSetConvolution2dDescriptor, cudnnSetConvolutionGroupCount,
 * cudnnSetConvolutionMathType), the three _v7 algorithm queries, the
 * workspace-size queries and the three convolution calls. They remain in
 * cuDNN 9 (libcudnn_cnn) and give the same kernels; the tensor and filter
 * descriptors (cudnn_ops) are not deprecated. Moving to the graph API is a
 * matter of this file alone.
 *
 * Layout: images are passed in their own format (CUDNN_TENSOR_NHWC or
 * CUDNN_TENSOR_NCHW), except f64 NHWC ones, which go through NCHW scratch
 * copies (cuDNN's NHWC support for double is partial). cuDNN has no HWIO
 * filter layout: it wants KRSC for an NHWC filter and KCRS for an NCHW one,
 * so the HWIO filter is transposed into
 * scratch from the caching allocator first (and the filter gradient computed
 * in that layout and transposed back into HWIO); a filter is small next to the
 * images, and the copies are queued on the same stream.
 *
 * Padding: cuDNN pads both sides of a dim alike. When the top/left pad alone
 * does not give the output size (TensorFlow's SAME with an odd total pad puts
 * the extra row at the bottom; explicit pads may differ), the image is copied
 * into a zero-padded scratch block and the convolution runs unpadded (the
 * data gradient is computed padded and its interior copied out).
 *
 * Algorithms: chosen once per (direction, shape, dtype, math, determinism,
 * card) by cuDNN's heuristics (the _v7 queries: the first that works with a
 * workspace of at most an eighth of the card, 1 GiB at most, a deterministic
 * one in deterministic mode) and cached; the workspace comes
 * from the caching allocator, in stream order. f32 uses TF32 tensor cores only
 * when nb_gpu_tf32() (CUDNN_DEFAULT_MATH, else CUDNN_FMA_MATH); f64; f16 and
 * bf16 with float accumulation and tensor-op math. */
#include "gpu_internal.h"

#include <cudnn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *const conv_names[3] = {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"};

static nb_status cudnn_fail(const nb_gpu_ctx *c, const char *call, cudnnStatus_t s)
{
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %s", call, c->dev->name, cudnnGetErrorString(s));
}

#define CUDNN_CALL(c, call)                                                                        \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            st = cudnn_fail((c), #call, s_);                                                       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* The device's cuDNN handle, bound to its stream, made on first use. */
static nb_status handle_of(nb_gpu_ctx *c, cudnnHandle_t *out)
{
    cudnnHandle_t h = __atomic_load_n((cudnnHandle_t *)&c->cudnn, __ATOMIC_ACQUIRE);
    if (h) {
        *out = h;
        return NB_OK;
    }
    nb_status st = NB_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->cudnn) {
        cudnnStatus_t s = cudnnCreate(&h);
        if (s != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(c, "cudnnCreate", s);
        } else if ((s = cudnnSetStream(h, c->stream)) != CUDNN_STATUS_SUCCESS) {
            st = cudnn_fail(c, "cudnnSetStream", s);
            cudnnDestroy(h);
        } else {
            __atomic_store_n((cudnnHandle_t *)&c->cudnn, h, __ATOMIC_RELEASE);
        }
    }
    h = c->cudnn;
    pthread_mutex_unlock(&c->lock);
    *out = h;
    return st;
}

/* ---- the algorithm cache ---- */

typedef struct algo_entry {
    struct algo_entry *next;
    int which, ordinal;
    nb_dtype dtype;
    bool tf32, det;
    nb_conv2d_desc d;
    int algo;            /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    cudnnMathType_t math;
    size_t ws;
} algo_entry;

#define ALGO_BUCKETS 64
static algo_entry *g_algos[ALGO_BUCKETS];
static pthread_mutex_t g_algo_lock = PTHREAD_MUTEX_INITIALIZER;

/* Field by field: a struct's padding bytes are not part of the key. */
static bool same_desc(const nb_conv2d_desc *a, const nb_conv2d_desc *b)
{
    return a->N == b->N && a->H == b->H && a->W == b->W && a->C == b->C && a->K == b->K && a->R == b->R &&
           a->S == b->S && a->P == b->P && a->Q == b->Q && a->stride[0] == b->stride[0] &&
           a->stride[1] == b->stride[1] && a->dilation[0] == b->dilation[0] && a->dilation[1] == b->dilation[1] &&
           a->pad[0] == b->pad[0] && a->pad[1] == b->pad[1] && a->groups == b->groups && a->nchw == b->nchw;
}

static bool same_key(const algo_entry *e, int which, int ordinal, nb_dtype dt, bool tf32, bool det,
                     const nb_conv2d_desc *d)
{
    return e->which == which && e->ordinal == ordinal && e->dtype == dt && e->tf32 == tf32 && e->det == det &&
           same_desc(&e->d, d);
}

static unsigned key_hash(int which, const nb_conv2d_desc *d)
{
    const int64_t v[] = {which, d->N, d->H, d->W, d->C, d->K, d->R, d->S, d->stride[0], d->stride[1],
                         d->dilation[0], d->dilation[1], d->pad[0], d->pad[1], d->groups, d->nchw};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return (unsigned)(h % ALGO_BUCKETS);
}

/* The first usable algorithm of cuDNN's ranking (a deterministic one when
 * det) whose workspace fits under limit; else the usable one needing the
 * least workspace; -1 when none is usable. */
#define PICK_ALGO(perf, found, det, limit, pick)                                                        \
    do {                                                                                                \
        int least_ = -1;                                                                                \
        for (int i_ = 0; i_ < (found) && (pick) < 0; i_++) {                                            \
            if ((perf)[i_].status != CUDNN_STATUS_SUCCESS ||                                            \
                ((det) && (perf)[i_].determinism != CUDNN_DETERMINISTIC))                               \
                continue;                                                                               \
            if ((perf)[i_].memory <= (limit))                                                           \
                (pick) = i_;                                                                            \
            else if (least_ < 0 || (perf)[i_].memory < (perf)[least_].memory)                           \
                least_ = i_;                                                                            \
        }                                                                                               \
        if ((pick) < 0)                                                                                 \
            (pick) = least_;                                                                            \
    } while (0)

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

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static cudnnDataType_t cudnn_dtype(nb_dtype dt)
{
    switch (dt) {
    case NB_F64: return CUDNN_DATA_DOUBLE;
    case NB_F16: return CUDNN_DATA_HALF;
    case NB_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
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
    /* The padding cuDNN can do itself: the top/left pad on both sides gives P and Q. */
    const int64_t span_h = (int64_t)d->dilation[0] * (d->R - 1) + 1, span_w = (int64_t)d->dilation[1] * (d->S - 1) + 1;
    bool sym = d->H + 2 * (int64_t)d->pad[0] >= span_h && d->W + 2 * (int64_t)d->pad[1] >= span_w &&
               (d->H + 2 * (int64_t)d->pad[0] - span_h) / d->stride[0] + 1 == d->P &&
               (d->W + 2 * (int64_t)d->pad[1] - span_w) / d->stride[1] + 1 == d->Q;
    int64_t Hc = d->H, Wc = d->W; /* the image cuDNN sees */
    int pad_h = d->pad[0], pad_w = d->pad[1];
    if (!sym) {
        int64_t bh = (d->P - 1) * d->stride[0] + span_h - d->H - d->pad[0];
        int64_t bw = (d->Q - 1) * d->stride[1] + span_w - d->W - d->pad[1];
        Hc = d->H + d->pad[0] + (bh > 0 ? bh : 0);
        Wc = d->W + d->pad[1] + (bw > 0 ? bw : 0);
        pad_h = pad_w = 0;
    }
    const int64_t Cg = d->C / d->groups;
    if (!fits_int(d->N) || !fits_int(d->C) || !fits_int(d->K) || !fits_int(Hc) || !fits_int(Wc) ||
        !fits_int(d->N * Hc * Wc * d->C) || !fits_int(d->N * d->P * d->Q * d->K) ||
        !fits_int(d->R * d->S * Cg * d->K))
        return nb__fail(NB_ERR_UNSUPPORTED, "%s: a tensor of %lld x %lld x %lld x %lld is too large for cuDNN on %s",
                        op, (long long)d->N, (long long)Hc, (long long)Wc, (long long)d->C, c->dev->name);

    cudnnHandle_t h;
    nb_status st = handle_of(c, &h);
    if (st)
        return st;
    const size_t es = nb_dtype_size(dt);
    const cudnnDataType_t cdt = cudnn_dtype(dt);
    /* The layout cuDNN computes in: the images' own, except f64, which runs
     * NCHW (cuDNN's NHWC support for double is partial, so frameworks keep
     * double convolutions NCHW too): NHWC f64 images go through scratch. */
    const bool cn = d->nchw || dt == NB_F64, relayout = cn != d->nchw;
    const cudnnTensorFormat_t fmt = cn ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
    const bool tf32 = dt == NB_F32 && nb_gpu_tf32(), det = nb_deterministic();
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    cudnnFilterDescriptor_t wd = NULL;
    cudnnConvolutionDescriptor_t cd = NULL;
    void *wbuf = NULL, *xpad = NULL, *ws = NULL, *xtmp = NULL, *ytmp = NULL;
    const size_t wbytes = (size_t)(d->R * d->S * Cg * d->K) * es;
    const size_t xpad_bytes = sym ? 0 : (size_t)(d->N * Hc * Wc * d->C) * es;

    CUDNN_CALL(c, cudnnCreateTensorDescriptor(&xd));
    CUDNN_CALL(c, cudnnCreateTensorDescriptor(&yd));
    CUDNN_CALL(c, cudnnCreateFilterDescriptor(&wd));
    CUDNN_CALL(c, cudnnCreateConvolutionDescriptor(&cd));
    CUDNN_CALL(c, cudnnSetTensor4dDescriptor(xd, fmt, cdt, (int)d->N, (int)d->C, (int)Hc, (int)Wc));
    CUDNN_CALL(c, cudnnSetTensor4dDescriptor(yd, fmt, cdt, (int)d->N, (int)d->K, (int)d->P, (int)d->Q));
    CUDNN_CALL(c, cudnnSetFilter4dDescriptor(wd, cdt, fmt, (int)d->K, (int)Cg, (int)d->R, (int)d->S));
    CUDNN_CALL(c, cudnnSetConvolution2dDescriptor(cd, pad_h, pad_w, d->stride[0], d->stride[1], d->dilation[0],
                                                  d->dilation[1], CUDNN_CROSS_CORRELATION,
                                                  dt == NB_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    CUDNN_CALL(c, cudnnSetConvolutionGroupCount(cd, d->groups));
    const cudnnMathType_t math = dt == NB_F32 ? (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
                                 : dt == NB_F64 ? CUDNN_DEFAULT_MATH
                                                : CUDNN_TENSOR_OP_MATH;
    CUDNN_CALL(c, cudnnSetConvolutionMathType(cd, math));

    /* the algorithm, cached */
    algo_entry *e;
    pthread_mutex_lock(&g_algo_lock);
    unsigned hk = key_hash(which, d);
    for (e = g_algos[hk]; e && !same_key(e, which, c->ordinal, dt, tf32, det, d); e = e->next)
        ;
    pthread_mutex_unlock(&g_algo_lock);
    if (!e) {
        algo_entry ne;
        memset(&ne, 0, sizeof ne);
        ne.which = which, ne.ordinal = c->ordinal, ne.dtype = dt, ne.tf32 = tf32, ne.det = det, ne.d = *d;
        int found = 0, pick = -1;
        /* a workspace of at most an eighth of the card (1 GiB at most) */
        size_t ws_limit = c->phys->total_memory / 8;
        if (ws_limit > ((size_t)1 << 30) || ws_limit == 0)
            ws_limit = (size_t)1 << 30;
        if (which == 0) {
            cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
            CUDNN_CALL(c, cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                 &found, perf));
            PICK_ALGO(perf, found, det, ws_limit, pick);
            if (pick >= 0)
                ne.algo = perf[pick].algo, ne.math = perf[pick].mathType, ne.ws = perf[pick].memory;
        } else if (which == 1) {
            cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
            CUDNN_CALL(c, cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd,
                                                                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found,
                                                                      perf));
            PICK_ALGO(perf, found, det, ws_limit, pick);
            if (pick >= 0)
                ne.algo = perf[pick].algo, ne.math = perf[pick].mathType, ne.ws = perf[pick].memory;
        } else {
            cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
            CUDNN_CALL(c, cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd,
                                                                        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                                        &found, perf));
            PICK_ALGO(perf, found, det, ws_limit, pick);
            if (pick >= 0)
                ne.algo = perf[pick].algo, ne.math = perf[pick].mathType, ne.ws = perf[pick].memory;
        }
        if (pick < 0) {
            st = nb__fail(NB_ERR_UNSUPPORTED, "%s: cuDNN has no %salgorithm for this %s convolution on %s", op,
                          det ? "deterministic " : "", nb_dtype_name(dt), c->dev->name);
            goto done;
        }
        /* f32 without TF32 must not be given a tensor-op algorithm */
        if (dt == NB_F32 && !tf32)
            ne.math = CUDNN_FMA_MATH;
        pthread_mutex_lock(&g_algo_lock);
        for (e = g_algos[hk]; e && !same_key(e, which, c->ordinal, dt, tf32, det, d); e = e->next)
            ;
        if (!e && (e = malloc(sizeof *e))) {
            *e = ne;
            e->next = g_algos[hk];
            g_algos[hk] = e;
        }
        pthread_mutex_unlock(&g_algo_lock);
        if (!e) {
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
            goto done;
        }
    }
    CUDNN_CALL(c, cudnnSetConvolutionMathType(cd, e->math));
    /* the workspace the chosen algorithm needs with these descriptors */
    size_t ws_bytes = 0;
    if (which == 0)
        CUDNN_CALL(c, cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, (cudnnConvolutionFwdAlgo_t)e->algo,
                                                              &ws_bytes));
    else if (which == 1)
        CUDNN_CALL(c, cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd,
                                                                   (cudnnConvolutionBwdDataAlgo_t)e->algo, &ws_bytes));
    else
        CUDNN_CALL(c, cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd,
                                                                     (cudnnConvolutionBwdFilterAlgo_t)e->algo,
                                                                     &ws_bytes));
    if (ws_bytes && !(ws = nb__gpu_malloc(c, ws_bytes))) {
        st = NB_ERR_OUT_OF_MEMORY;
        goto done;
    }

    /* the filter in cuDNN's order */
    if (!(wbuf = nb__gpu_malloc(c, wbytes))) {
        st = NB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    nb_view user_w = filter_as_cudnn(which == 2 ? out->data : b->data, dt, cn, d);
    nb_view cw = contiguous_like(wbuf, &user_w);
    if (which != 2 && (st = nb__gpu_copy(c, &cw, &user_w)))
        goto done;
    /* The images as cuDNN reads them: in the compute layout (a scratch copy
     * when it is not the tensors' own), x zero-padded when cuDNN cannot pad
     * as asked. Logical views in the compute layout over the tensors' data: */
    const nb_view xv = image_logical(which == 1 ? out->data : a->data, dt, d->nchw, cn, d->N, d->H, d->W, d->C);
    const nb_view yv = image_logical(which == 0 ? out->data : which == 1 ? a->data : b->data, dt, d->nchw, cn,
                                     d->N, d->P, d->Q, d->K);
    void *x_for = which == 1 ? out->data : a->data, *y_for = which == 0 ? out->data : which == 1 ? a->data : b->data;
    if (!sym) {
        if (!(xpad = nb__gpu_malloc(c, xpad_bytes))) {
            st = NB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        nb_view full = image_view(xpad, dt, cn, d->N, Hc, Wc, d->C);
        nb_view in = interior(xpad, dt, cn, d->N, Hc, Wc, d->C, d->H, d->W, d->pad[0], d->pad[1]);
        if (which != 1 && ((st = nb__gpu_fill(c, &full, 0.0)) || (st = nb__gpu_copy(c, &in, &xv))))
            goto done;
        x_for = xpad;
    } else if (relayout) {
        if (!(xtmp = nb__gpu_malloc(c, (size_t)xv.numel * es))) {
            st = NB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        nb_view t = contiguous_like(xtmp, &xv);
        if (which != 1 && (st = nb__gpu_copy(c, &t, &xv)))
            goto done;
        x_for = xtmp;
    }
    if (relayout) {
        if (!(ytmp = nb__gpu_malloc(c, (size_t)yv.numel * es))) {
            st = NB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        nb_view t = contiguous_like(ytmp, &yv);
        if (which != 0 && (st = nb__gpu_copy(c, &t, &yv)))
            goto done;
        y_for = ytmp;
    }
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void *one = dt == NB_F64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = dt == NB_F64 ? (const void *)&zero_d : (const void *)&zero_f;
    if (which == 0) {
        CUDNN_CALL(c, cudnnConvolutionForward(h, one, xd, x_for, wd, wbuf, cd, (cudnnConvolutionFwdAlgo_t)e->algo, ws,
                                              ws_bytes, zero, yd, y_for));
        nb_view t = contiguous_like(ytmp, &yv);
        if (relayout && (st = nb__gpu_copy(c, &yv, &t)))
            goto done;
    } else if (which == 1) {
        CUDNN_CALL(c, cudnnConvolutionBackwardData(h, one, wd, wbuf, yd, y_for, cd,
                                                   (cudnnConvolutionBwdDataAlgo_t)e->algo, ws, ws_bytes, zero, xd,
                                                   x_for));
        /* out of the padded block or the scratch copy */
        nb_view from = !sym ? interior(xpad, dt, cn, d->N, Hc, Wc, d->C, d->H, d->W, d->pad[0], d->pad[1])
                            : contiguous_like(xtmp, &xv);
        if ((!sym || relayout) && (st = nb__gpu_copy(c, &xv, &from)))
            goto done;
    } else {
        CUDNN_CALL(c, cudnnConvolutionBackwardFilter(h, one, xd, x_for, yd, y_for, cd,
                                                     (cudnnConvolutionBwdFilterAlgo_t)e->algo, ws, ws_bytes, zero, wd,
                                                     wbuf));
        if ((st = nb__gpu_copy(c, &user_w, &cw)))
            goto done;
    }
done:
    /* stream-ordered frees: the queued work still owns these blocks */
    if (ws)
        nb__gpu_free(c, ws);
    if (wbuf)
        nb__gpu_free(c, wbuf);
    if (xpad)
        nb__gpu_free(c, xpad);
    if (xtmp)
        nb__gpu_free(c, xtmp);
    if (ytmp)
        nb__gpu_free(c, ytmp);
    if (cd)
        cudnnDestroyConvolutionDescriptor(cd);
    if (wd)
        cudnnDestroyFilterDescriptor(wd);
    if (yd)
        cudnnDestroyTensorDescriptor(yd);
    if (xd)
        cudnnDestroyTensorDescriptor(xd);
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
