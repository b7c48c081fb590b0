/* The GPU's kernel table: each entry makes its device current (creating its
 * stream on first use) and hands over to the kernel file that does the work. */
#include "gpu_fuse.h"
#include "gpu_internal.h"
#include "nb_config.h"

#define ENTER(dev, who)                                                                \
    nb_gpu_ctx *c;                                                                     \
    do {                                                                               \
        nb_status st_ = nb__gpu_enter((dev), (who), &c);                               \
        if (st_)                                                                       \
            return st_;                                                                \
    } while (0)

/* While this thread records a step with fusion on, an elementwise call (fill,
 * unary, binary, copy, where) joins the pending chain instead of launching
 * (gpu_fuse.h). */
#define DEFER(dev, ...)                                                                \
    do {                                                                               \
        nb_gpu_ctx *dc_ = (dev)->ctx;                                                  \
        if (nb__gpu_fuse_deferring(dc_)) {                                             \
            bool deferred_;                                                            \
            nb_fuse_call call_ = __VA_ARGS__;                                          \
            nb_status sd_ = nb__gpu_fuse_defer(dc_, &call_, &deferred_);               \
            if (sd_ || deferred_)                                                      \
                return sd_;                                                            \
        }                                                                              \
    } while (0)

static void *gpu_alloc(nb_device *dev, size_t nbytes)
{
    /* A block from the cache takes no CUDA call, so the card need not be made
     * current for it: nb__gpu_malloc does that itself before it asks CUDA.
     * Only a context without its stream yet is entered (created) here. */
    nb_gpu_ctx *c = dev->ctx;
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE) && nb__gpu_enter(dev, "alloc", &c) != NB_OK)
        return NULL;
    void *p = nb__gpu_malloc(c, nbytes);
    nb__gpu_fuse_note_alloc(c, p, nbytes);
    return p;
}

static void gpu_free(nb_device *dev, void *ptr, size_t nbytes)
{
    /* the allocator knows the block's size; a pending chain wants it */
    nb__gpu_fuse_note_free(dev->ctx, ptr, nbytes);
    nb__gpu_free(dev->ctx, ptr);
}

static nb_status gpu_fill(nb_device *dev, const nb_view *out, double value)
{
    DEFER(dev, {.kind = NB_FUSE_FILL, .alpha = value, .out = out});
    ENTER(dev, "fill");
    return nb__gpu_fill(c, out, value);
}

static nb_status gpu_arange(nb_device *dev, const nb_view *out, double start, double step)
{
    ENTER(dev, "arange");
    return nb__gpu_arange(c, out, start, step);
}

static nb_status gpu_random(nb_device *dev, const nb_view *out, nb_random_dist dist, double a, double b,
                            uint64_t seed, const double *seed_add)
{
    ENTER(dev, "random");
    return nb__gpu_random(c, out, dist, a, b, seed, seed_add);
}

static nb_status gpu_copy(nb_device *dev, const nb_view *out, const nb_view *in)
{
    DEFER(dev, {.kind = NB_FUSE_COPY, .out = out, .x = in});
    ENTER(dev, "copy");
    return nb__gpu_copy(c, out, in);
}

static nb_status gpu_unary(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x, double alpha)
{
    DEFER(dev, {.kind = NB_FUSE_UNARY, .op = (int)op, .alpha = alpha, .out = out, .x = x});
    ENTER(dev, "unary");
    return nb__gpu_unary(c, op, out, x, alpha);
}

static nb_status gpu_binary(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *a,
                            const nb_view *b)
{
    DEFER(dev, {.kind = NB_FUSE_BINARY, .op = (int)op, .out = out, .x = a, .y = b});
    ENTER(dev, "binary");
    return nb__gpu_binary(c, op, out, a, b);
}

static nb_status gpu_where(nb_device *dev, const nb_view *out, const nb_view *cond, const nb_view *a,
                           const nb_view *b)
{
    DEFER(dev, {.kind = NB_FUSE_WHERE, .out = out, .cond = cond, .x = a, .y = b});
    ENTER(dev, "where");
    return nb__gpu_where(c, out, cond, a, b);
}

static nb_status gpu_reduce(nb_device *dev, nb_reduce_op op, const nb_view *out, const nb_view *x)
{
    ENTER(dev, "reduce");
    return nb__gpu_reduce(c, op, out, x);
}

static nb_status gpu_arg_reduce(nb_device *dev, bool is_max, const nb_view *out, const nb_view *x, int axis)
{
    ENTER(dev, is_max ? "argmax" : "argmin");
    return nb__gpu_arg_reduce(c, is_max, out, x, axis);
}

static nb_status gpu_matmul(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b)
{
    ENTER(dev, "matmul");
    return nb__gpu_matmul(c, out, a, b);
}

static nb_status gpu_softmax(nb_device *dev, bool log, const nb_view *out, const nb_view *x)
{
    ENTER(dev, log ? "log_softmax" : "softmax");
    return nb__gpu_softmax(c, log, out, x);
}

static nb_status gpu_softmax_xent(nb_device *dev, const nb_view *loss, const nb_view *stats, const nb_view *x,
                                  const nb_view *labels)
{
    ENTER(dev, "sparse_softmax_cross_entropy");
    return nb__gpu_softmax_xent(c, loss, stats, x, labels);
}

static nb_status gpu_softmax_xent_grad(nb_device *dev, const nb_view *dx, const nb_view *g, const nb_view *x,
                                       const nb_view *stats, const nb_view *labels)
{
    ENTER(dev, "sparse_softmax_cross_entropy gradient");
    return nb__gpu_softmax_xent_grad(c, dx, g, x, stats, labels);
}

static nb_status gpu_layer_norm_rows(nb_device *dev, int64_t rows, int64_t D, const nb_view *out,
                                     const nb_view *mean, const nb_view *rstd, const nb_view *x, const nb_view *gamma,
                                     const nb_view *beta, double epsilon)
{
    ENTER(dev, "layer_norm");
    return nb__gpu_layer_norm_rows(c, rows, D, out, mean, rstd, x, gamma, beta, epsilon);
}

static nb_status gpu_layer_norm_rows_grad(nb_device *dev, int64_t rows, int64_t D, const nb_view *dx,
                                          const nb_view *dgamma, const nb_view *dbeta, const nb_view *g,
                                          const nb_view *x, const nb_view *rstd, const nb_view *gamma)
{
    ENTER(dev, "layer_norm_grad");
    return nb__gpu_layer_norm_rows_grad(c, rows, D, dx, dgamma, dbeta, g, x, rstd, gamma);
}

static nb_status gpu_gather(nb_device *dev, const char *op, const nb_view *out, const nb_view *params,
                            const nb_view *indices)
{
    ENTER(dev, op);
    return nb__gpu_gather(c, op, out, params, indices);
}

static nb_status gpu_scatter_add(nb_device *dev, const char *op, const nb_view *out, const nb_view *indices,
                                 const nb_view *updates)
{
    ENTER(dev, op);
    return nb__gpu_scatter_add(c, op, out, indices, updates);
}

static nb_status gpu_one_hot(nb_device *dev, const nb_view *out, const nb_view *indices, double on, double off)
{
    ENTER(dev, "one_hot");
    return nb__gpu_one_hot(c, out, indices, on, off);
}

static nb_status gpu_check_indices(nb_device *dev, const char *op, const nb_view *indices, int64_t limit)
{
    ENTER(dev, op);
    return nb__gpu_check_indices(c, op, indices, limit);
}

static nb_status gpu_cumsum(nb_device *dev, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                             bool reverse)
{
    ENTER(dev, "cumsum");
    return nb__gpu_cumsum(c, out, x, axis, exclusive, reverse);
}

static nb_status gpu_max_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                const nb_view *sel)
{
    ENTER(dev, "max_pool2d");
    return nb__gpu_max_pool2d(c, d, out, x, sel);
}

static nb_status gpu_max_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                     const nb_view *dy)
{
    ENTER(dev, "max_pool2d_grad");
    return nb__gpu_max_pool2d_grad(c, d, out, x, dy);
}

static nb_status gpu_avg_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x)
{
    ENTER(dev, "avg_pool2d");
    nb_status st = nb__cudnn_avg_pool2d(c, d, out, x);
    return st == NB_ERR_UNSUPPORTED ? nb__gpu_avg_pool2d(c, d, out, x) : st;
}

static nb_status gpu_avg_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy)
{
    ENTER(dev, "avg_pool2d_grad");
    nb_status st = nb__cudnn_avg_pool2d_grad(c, d, out, dy);
    return st == NB_ERR_UNSUPPORTED ? nb__gpu_avg_pool2d_grad(c, d, out, dy) : st;
}

static nb_status gpu_channel_moments(nb_device *dev, const int64_t shape[3], const nb_view *sum,
                                     const nb_view *moment, const nb_view *a, const nb_view *b, const nb_view *center)
{
    ENTER(dev, "channel_moments");
    return nb__gpu_channel_moments(c, shape, sum, moment, a, b, center);
}

static nb_status gpu_channel_affine(nb_device *dev, const int64_t shape[3], const nb_view *out, const nb_view *a,
                                    const nb_view *s, const nb_view *b, const nb_view *t, const nb_view *u)
{
    ENTER(dev, "channel_affine");
    return nb__gpu_channel_affine(c, shape, out, a, s, b, t, u);
}

static nb_status gpu_conv2d(nb_device *dev, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                            const nb_view *w)
{
    ENTER(dev, "conv2d");
    return nb__gpu_conv2d(c, d, y, x, w);
}

static nb_status gpu_conv2d_backward_data(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dx,
                                          const nb_view *dy, const nb_view *w)
{
    ENTER(dev, "conv2d_backward_data");
    return nb__gpu_conv2d_backward_data(c, d, dx, dy, w);
}

static nb_status gpu_conv2d_backward_filter(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dw,
                                            const nb_view *x, const nb_view *dy)
{
    ENTER(dev, "conv2d_backward_filter");
    return nb__gpu_conv2d_backward_filter(c, d, dw, x, dy);
}

/* The ops.def list says which dtypes an elementwise op is defined for; the GPU
 * runs all of them, f16 and bf16 included (computed in float). */
bool nb__gpu_supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype)
{
    if (!nb__list_defines(k, variant, dtype))
        return false;
    const nb_gpu_ctx *c = dev->ctx;
    switch (k) {
    case NB_K_CONV2D:
    case NB_K_CONV2D_BACKWARD_DATA:
    case NB_K_CONV2D_BACKWARD_FILTER: /* cuDNN: floating dtypes, bf16 from Ampere (8.0) on */
        return dtype == NB_F32 || dtype == NB_F64 || dtype == NB_F16 || (dtype == NB_BF16 && c->phys->cc_major >= 8);
    default: return true;
    }
}

static nb_status gpu_sgd_update(nb_device *dev, const nb_view *param, const nb_view *grad, const nb_view *slot1,
                                const nb_update_params *p)
{
    ENTER(dev, "sgd_update");
    return nb__gpu_sgd_update(c, param, grad, slot1, p);
}

static nb_status gpu_adam_update(nb_device *dev, const nb_view *param, const nb_view *grad, const nb_view *slot1,
                                 const nb_view *slot2, const nb_update_params *p)
{
    ENTER(dev, "adam_update");
    return nb__gpu_adam_update(c, param, grad, slot1, slot2, p);
}

static nb_status gpu_scaler_update(nb_device *dev, double *state, const double *check, double *count,
                                   const nb_scaler_params *p)
{
    ENTER(dev, "scaler_update");
    return nb__gpu_scaler_update(c, state, check, count, p);
}

static nb_status gpu_sgd_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                     const nb_view *slot1, const void *const *sources, const nb_update_params *p)
{
    ENTER(dev, "sgd_update");
    return nb__gpu_sgd_update_many(c, n, param, grad, slot1, sources, p);
}

static nb_status gpu_adam_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                      const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                      const nb_update_params *p)
{
    ENTER(dev, "adam_update");
    return nb__gpu_adam_update_many(c, n, param, grad, slot1, slot2, sources, p);
}

static const nb_optim_kernels gpu_optim = {
    .sgd_update = gpu_sgd_update,
    .adam_update = gpu_adam_update,
    .sgd_update_many = gpu_sgd_update_many,
    .adam_update_many = gpu_adam_update_many,
    .scaler_update = gpu_scaler_update,
};

const nb_backend nb__gpu_backend = {
    .name = "cuda",
    .kind = NB_DEVICE_GPU,
    .dtypes = (1u << NB_DTYPE_COUNT) - 1,
#if NB_HAVE_NCCL
    .collective = &nb__gpu_nccl,
#else
    .collective = NULL, /* built without NCCL: the strategy reduces through copies */
#endif
    .optim = &gpu_optim,
    .graph = &nb__gpu_graph_kernels,
    .discover = nb__gpu_discover,
    .physical_count = nb__gpu_physical_count,
    .unavailable = nb__gpu_unavailable,
    .supports = nb__gpu_supports,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .copy_from_host = nb__gpu_copy_from_host,
    .copy_to_host = nb__gpu_copy_to_host,
    .copy_between = nb__gpu_copy_between,
    .synchronize = nb__gpu_synchronize,
    .fill = gpu_fill,
    .arange = gpu_arange,
    .random = gpu_random,
    .copy = gpu_copy,
    .unary = gpu_unary,
    .binary = gpu_binary,
    .where = gpu_where,
    .reduce = gpu_reduce,
    .arg_reduce = gpu_arg_reduce,
    .cumsum = gpu_cumsum,
    .matmul = gpu_matmul,
    .softmax = gpu_softmax,
    .softmax_xent = gpu_softmax_xent,
    .softmax_xent_grad = gpu_softmax_xent_grad,
    .layer_norm_rows = gpu_layer_norm_rows,
    .layer_norm_rows_grad = gpu_layer_norm_rows_grad,
    .gather = gpu_gather,
    .scatter_add = gpu_scatter_add,
    .one_hot = gpu_one_hot,
    .check_indices = gpu_check_indices,
    .max_pool2d = gpu_max_pool2d,
    .max_pool2d_grad = gpu_max_pool2d_grad,
    .avg_pool2d = gpu_avg_pool2d,
    .avg_pool2d_grad = gpu_avg_pool2d_grad,
    .channel_moments = gpu_channel_moments,
    .channel_affine = gpu_channel_affine,
    .conv2d = gpu_conv2d,
    .conv2d_backward_data = gpu_conv2d_backward_data,
    .conv2d_backward_filter = gpu_conv2d_backward_filter,
};
