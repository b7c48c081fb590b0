/* nabla — neural-network ops: convolutions, pooling, normalisation, dropout,
 * embeddings.
 *
 * They are ordinary ops (include/nabla/ops.h's conventions): eager, on the
 * device placement picks, recorded on tapes, returning a tensor owned by the
 * current scope or NULL with the error recorded (NB_ERR_SHAPE for shapes that
 * do not fit, naming both; NB_ERR_INVALID_ARGUMENT for a bad stride,
 * dilation, padding, window or group count; NB_ERR_DTYPE for a non-floating
 * input). Gradients of every order work: each gradient is itself built from
 * these ops (conv2d's gradient is a conv2d_transpose and a filter gradient,
 * each differentiable again).
 *
 * Images are NHWC by default, as in TensorFlow ([batch, height, width,
 * channels]); NCHW is accepted with format = NB_NCHW. Filters are HWIO
 * ([height, width, in_channels / groups, out_channels]), as tf.nn.conv2d's,
 * whatever the image format. */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_data_format { NB_NHWC = 0, NB_NCHW = 1 } nb_data_format;

/* VALID: no padding, windows wholly inside. SAME: output size ceil(in / stride),
 * the padding split as TensorFlow does (the extra row/column at the bottom and
 * right). EXPLICIT: pad[] = {top, bottom, left, right}. */
typedef enum nb_padding { NB_PAD_VALID = 0, NB_PAD_SAME = 1, NB_PAD_EXPLICIT = 2 } nb_padding;

/* Options of a 2-D convolution. Zero means the default: stride 1, dilation 1,
 * groups 1; a zeroed struct (or NULL) is a stride-1 VALID NHWC convolution. */
typedef struct nb_conv2d_opts {
    int stride[2];   /* height, width */
    int dilation[2]; /* height, width */
    nb_padding padding;
    int pad[4];      /* EXPLICIT only: top, bottom, left, right (>= 0) */
    int groups;      /* in_channels and out_channels must be multiples of it;
                        groups = in_channels with a [R, S, 1, M * in] filter is
                        a depthwise convolution (channel multiplier M) */
    nb_data_format format;
} nb_conv2d_opts;

/* y = x (*) filter: x [N, H, W, C] (NHWC) or [N, C, H, W], filter
 * [R, S, C / groups, K]; y [N, P, Q, K] (or [N, K, P, Q]) with
 * P = (H + pads - dilation (R - 1) - 1) / stride + 1 (floor), the same for Q.
 * A cross-correlation, as tf.nn.conv2d: y[n, p, q, k] sums x[n, p stride -
 * top + r dilation, q stride - left + s dilation, g C/groups + c] times
 * filter[r, s, c, k] over r, s and c, where g = k / (K / groups) is output
 * channel k's group and positions outside the image count as zeros.
 * opts may be NULL (stride 1, VALID, NHWC). x and filter share one floating
 * dtype and one device (f32 and f64 on the CPU; f16 and bf16 too on a GPU).
 * Errors name the op and the shapes: NB_ERR_SHAPE for a tensor that is not
 * 4-d, channels that do not match the filter, or an output smaller than 1x1;
 * NB_ERR_INVALID_ARGUMENT for a negative stride, dilation, group count or
 * explicit pad, or groups that do not divide C and K. */
nb_tensor *nb_conv2d(const nb_tensor *x, const nb_tensor *filter, const nb_conv2d_opts *opts);

/* The transpose of nb_conv2d with the same filter and options (its gradient
 * with respect to x; a "deconvolution"): dy [N, P, Q, K] -> [N, H, W, C],
 * where input_hw = {H, W} picks the output size (several sizes give the same
 * P, Q when stride > 1; tf.nn.conv2d_transpose's output_shape), and SAME
 * padding is worked out from it. NB_ERR_SHAPE when input_hw is not one of
 * them or dy's channels are not the filter's K; NULL input_hw is
 * NB_ERR_INVALID_ARGUMENT. Its gradients are a conv2d (for dy) and a filter
 * gradient (for the filter). */
nb_tensor *nb_conv2d_transpose(const nb_tensor *dy, const nb_tensor *filter, const int64_t input_hw[2],
                               const nb_conv2d_opts *opts);

/* The gradient of nb_conv2d with respect to its filter: from x [N, H, W, C]
 * and dy [N, P, Q, K], the [R, S, C / groups, K] filter gradient (summed over
 * the batch), with filter_hw = {R, S} and opts.groups giving C / groups.
 * NB_ERR_SHAPE when x with that filter size would not give dy's P and Q, or
 * the batch sizes differ. Used by conv2d's gradient; public for custom
 * layers. Its gradients are a conv2d_transpose (for x) and a conv2d (for
 * dy). */
nb_tensor *nb_conv2d_filter_grad(const nb_tensor *x, const nb_tensor *dy, const int64_t filter_hw[2],
                                 const nb_conv2d_opts *opts);

/* Options of 2-D pooling: window (at least 1x1; NULL options are
 * NB_ERR_INVALID_ARGUMENT) and stride (0: the window's), padding as above
 * (EXPLICIT pads each smaller than the window, so that every window holds an
 * element of the image). x is [N, H, W, C] (or [N, C, H, W]), floating; the
 * result [N, P, Q, C] (or [N, C, P, Q]). */
typedef struct nb_pool2d_opts {
    int window[2];
    int stride[2];
    nb_padding padding;
    int pad[4];
    nb_data_format format;
} nb_pool2d_opts;

/* Max over each window (padding never wins; a NaN in the window is its max);
 * the gradient goes to the first maximum of each window in row-major window
 * order (ties are not shared, unlike nb_max's). Its gradient's gradient with
 * respect to the incoming gradient reads it at the same positions; with
 * respect to x it is 0. */
nb_tensor *nb_max_pool2d(const nb_tensor *x, const nb_pool2d_opts *opts);
/* Mean over each window, counting only the elements inside the image (as
 * TensorFlow's SAME padding does; PyTorch's count_include_pad = false). */
nb_tensor *nb_avg_pool2d(const nb_tensor *x, const nb_pool2d_opts *opts);
/* Mean over height and width: [N, H, W, C] -> [N, C] (NCHW: [N, C, H, W] -> [N, C]);
 * nb_mean over those axes. */
nb_tensor *nb_global_avg_pool2d(const nb_tensor *x, nb_data_format format);

/* Batch normalisation in training: over every axis but the channel axis (the
 * last for NHWC or a 2-d [N, C] input, axis 1 for NCHW), y = gamma (x - mean)
 * / sqrt(var + epsilon) + beta with the batch's mean and biased variance.
 * gamma and beta are [C] (either may be NULL: 1 and 0). When batch_mean /
 * batch_var are not NULL, the statistics are written there (new tensors owned
 * by the current scope, [C], variance unbiased as TensorFlow's moving
 * variance uses), for the caller's running averages; no gradient flows through
 * them. Training needs at least 2 values per channel (NB_ERR_SHAPE). The
 * gradient is exact (batch statistics included) and differentiable again. */
nb_tensor *nb_batch_norm_train(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta, double epsilon,
                               nb_data_format format, nb_tensor **batch_mean, nb_tensor **batch_var);
/* Batch normalisation in inference: the same with given mean and (biased)
 * var [C], both required; a composition of differentiable ops. */
nb_tensor *nb_batch_norm_infer(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta,
                               const nb_tensor *mean, const nb_tensor *var, double epsilon, nb_data_format format);

/* Layer normalisation over the last n_axes dims: y = gamma (x - mean) /
 * sqrt(var + epsilon) + beta, gamma and beta (either NULL) of those dims'
 * shape; n_axes in [1, ndim]. A composition of differentiable ops. */
nb_tensor *nb_layer_norm(const nb_tensor *x, const nb_tensor *gamma, const nb_tensor *beta, int n_axes,
                         double epsilon);

/* Inverted dropout: each element kept with probability 1 - rate and scaled by
 * 1 / (1 - rate), or zeroed. The mask depends only on (seed, element index),
 * so the same seed gives the same mask on every call, device and floating
 * dtype. rate in [0, 1) (else NB_ERR_INVALID_ARGUMENT); rate 0 returns x
 * itself (a new reference). The gradient is g * mask / (1 - rate). Off in
 * inference: simply do not call it. */
nb_tensor *nb_dropout(const nb_tensor *x, double rate, uint64_t seed);

/* Rows of a floating embedding table [V, D] for integer ids of any shape:
 * ids.shape + [D] (nb_gather, its errors naming embedding_lookup). Its
 * gradient accumulates repeated ids (a scatter-add); an id outside [0, V) is
 * NB_ERR_INVALID_ARGUMENT (on a GPU, from the next synchronising call, as
 * nb_gather). */
nb_tensor *nb_embedding_lookup(const nb_tensor *table, const nb_tensor *ids);

#ifdef __cplusplus
}
#endif

#endif
