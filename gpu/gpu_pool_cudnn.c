/* Average pooling and its gradient through cuDNN's graph API (its resample
 * operations), when cuDNN has an engine for the problem; the backend falls
 * back to its own kernels (gpu_pool.cu) otherwise, or when NB_POOL_PLAIN=1.
 *
 * Only average pooling: nabla's max pooling promises a NaN in a window wins,
 * the gradient goes to the window's first maximum, and a selection form for
 * the second order. cuDNN's resample promises none of these (its NaN switch
 * is a deprecated enumeration), so max pooling stays on the own kernels, which
 * keep them.
 *
 * The windows: cuDNN's AVGPOOL_EXCLUDE_PADDING mode averages over the
 * elements inside the image, as nabla's avg_pool2d does; the bottom/right
 * padding is what makes P and Q come out, or the problem goes to the own
 * kernels when none does (windows past the image's end that never count),
 * and for NCHW, whose engines pad both sides alike, when it differs from the
 * top/left one. cuDNN's resample engines compute in float, so f64 pooling
 * stays on the own kernels too, and so do bf16 and rows that are not whole
 * 16-byte vectors (avg_pool says why). Any refusal along the way (an
 * attribute, the graph, no engine, the execution itself) is a fallback, never
 * an error. */
#include "gpu_cudnn.h"

#include <stdlib.h>
#include <string.h>

enum { UID_X = 1, UID_Y = 2 };

typedef struct pool_problem {
    bool backward;
    nb_dtype dtype;
    int64_t align;
    nb_pool2d_desc d;
    int64_t post[2]; /* bottom and right padding */
} pool_problem;

static nb_status pool_build(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptor_t *ops, int *nops,
                            const void *arg)
{
    const pool_problem *p = arg;
    const nb_pool2d_desc *d = &p->d;
    const cudnnDataType_t dt = nb__cudnn_dtype(p->dtype);
    const cudnnDataType_t comp = p->dtype == NB_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    int64_t dims[4], st[4];
    cudnnBackendDescriptor_t x, y, rd, op;
    nb_status s;
    nb__cudnn_dims(d->nchw, d->N, d->C, d->H, d->W, dims, st);
    if ((s = nb__cudnn_tensor(c, keep, UID_X, dt, 4, dims, st, p->align, &x)))
        return s;
    nb__cudnn_dims(d->nchw, d->N, d->C, d->P, d->Q, dims, st);
    if ((s = nb__cudnn_tensor(c, keep, UID_Y, dt, 4, dims, st, p->align, &y)))
        return s;

    const cudnnResampleMode_t mode = CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING;
    const cudnnPaddingMode_t pad_mode = CUDNN_ZERO_PAD;
    /* the window, strides and paddings as fractions, the type cuDNN's own
     * front end gives them */
    const int64_t spatial = 2;
    const cudnnFraction_t window[2] = {{d->R, 1}, {d->S, 1}}, stride[2] = {{d->sh, 1}, {d->sw, 1}},
                          pre[2] = {{d->pt, 1}, {d->pl, 1}}, post[2] = {{p->post[0], 1}, {p->post[1], 1}};
    if ((s = nb__cudnn_make(c, keep, CUDNN_BACKEND_RESAMPLE_DESCRIPTOR, &rd)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_MODE, CUDNN_TYPE_RESAMPLE_MODE, 1, &mode)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_PADDING_MODE, CUDNN_TYPE_PADDING_MODE, 1, &pad_mode)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_WINDOW_DIMS, CUDNN_TYPE_FRACTION, 2, window)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_STRIDES, CUDNN_TYPE_FRACTION, 2, stride)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_PRE_PADDINGS, CUDNN_TYPE_FRACTION, 2, pre)) ||
        (s = nb__cudnn_set(c, rd, CUDNN_ATTR_RESAMPLE_POST_PADDINGS, CUDNN_TYPE_FRACTION, 2, post)) ||
        (s = nb__cudnn_finalize(c, rd, "the resample descriptor")))
        return s;
    if (!p->backward) {
        if ((s = nb__cudnn_make(c, keep, CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR, &op)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd)))
            return s;
    } else {
        if ((s = nb__cudnn_make(c, keep, CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR, &op)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DXDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &x)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DYDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &y)) ||
            (s = nb__cudnn_set(c, op, CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd)))
            return s;
    }
    if ((s = nb__cudnn_finalize(c, op, "the resample operation")))
        return s;
    ops[0] = op;
    *nops = 1;
    return NB_OK;
}

/* NB_POOL_PLAIN=1: the own kernels always (to compare the two paths). */
static bool plain_only(void)
{
    static int state; /* 0 unread, 1 cuDNN allowed, 2 plain only */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (!s) {
        const char *env = getenv("NB_POOL_PLAIN");
        s = env && env[0] == '1' ? 2 : 1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s == 2;
}

/* x: the image side (x or dx), y: the pooled side (out or dy). */
static nb_status avg_pool(nb_gpu_ctx *c, bool backward, const nb_pool2d_desc *d, void *x, void *y, nb_dtype dt)
{
    /* cuDNN's resample engines compute in float: f64 stays on the own kernels.
     * bf16 too: its engine (resampleFwd_fort_ffma_grouped) wrote 16-byte
     * vectors up to 33 bytes past a pooled output of 37 channels, with
     * garbage in it. For f32 and f16, the innermost dim (C for NHWC, Q and W
     * for NCHW) must fill whole 16-byte vectors, so that no engine's vector
     * store can reach past a row, and so past the allocation. */
    if (plain_only() || (dt != NB_F32 && dt != NB_F16))
        return NB_ERR_UNSUPPORTED;
    const int64_t es = (int64_t)nb_dtype_size(dt);
    if (d->nchw ? (d->W * es) % 16 || (d->Q * es) % 16 : (d->C * es) % 16)
        return NB_ERR_UNSUPPORTED;
    pool_problem p;
    memset(&p, 0, sizeof p);
    p.backward = backward, p.dtype = dt, p.d = *d;
    void *ptrs[2] = {x, y};
    p.align = nb__cudnn_alignment(nb_dtype_size(dt), 2, ptrs);
    /* the bottom/right padding that gives P and Q, when one does */
    const int64_t post_h = (d->P - 1) * d->sh + d->R - d->H - d->pt, post_w = (d->Q - 1) * d->sw + d->S - d->W - d->pl;
    if (post_h < 0 || post_w < 0 || post_h >= d->R || post_w >= d->S)
        return NB_ERR_UNSUPPORTED;
    /* NCHW engines pad both sides by the pre-padding alone */
    if (d->nchw && (post_h != d->pt || post_w != d->pl))
        return NB_ERR_UNSUPPORTED;
    p.post[0] = post_h, p.post[1] = post_w;
    const unsigned flags = NB_CUDNN_ALLOW_TENSOR_CORE | NB_CUDNN_EXACT_INPUTS |
                           (nb_deterministic() ? NB_CUDNN_DETERMINISTIC : 0);
    const int64_t key[] = {'p', backward, dt, p.align, flags, d->N, d->H, d->W, d->C, d->P, d->Q,
                           d->R, d->S, d->sh, d->sw, d->pt, d->pl, d->nchw};
    const char *op = backward ? "avg_pool2d_grad" : "avg_pool2d";
    const nb_cudnn_plan *plan;
    nb_status st = nb__cudnn_plan_for(c, op, key, (int)(sizeof key / sizeof *key), flags, pool_build, &p, &plan, NULL);
    if (st)
        return st;
    static const int64_t uids[2] = {UID_X, UID_Y};
    /* a refusal at execution (an offset view's pointer) falls back as one at planning */
    return nb__cudnn_run_or_refuse(c, op, plan, 2, uids, ptrs);
}

nb_status nb__cudnn_avg_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x)
{
    if (out->numel == 0 || x->numel == 0)
        return NB_ERR_UNSUPPORTED; /* nothing to plan: the own kernel's early return */
    return avg_pool(c, false, d, x->data, out->data, out->dtype);
}

nb_status nb__cudnn_avg_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy)
{
    if (out->numel == 0 || dy->numel == 0)
        return NB_ERR_UNSUPPORTED;
    return avg_pool(c, true, d, out->data, dy->data, out->dtype);
}
