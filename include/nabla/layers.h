/* nabla — layers: a few named variables and the function that uses them.
 *
 * A layer is a plain struct the caller owns (on the stack or inside a model
 * struct), made by nb_<layer>_init and undone by nb_<layer>_free. Its
 * variables are made with nb_get_variable inside a variable scope named after
 * the layer, so they are called as TensorFlow calls them ("conv1/kernel",
 * "conv1/bias", "bn1/moving_mean") and nest under any scope the caller has
 * pushed; they are on the device current at init. The variables are public
 * fields: read them, save them (nb_checkpoint_save), or hand the trainable
 * ones to an optimizer (nb_trainable_variables lists every one registered).
 *
 * init returns NB_OK or the error (a name already used outside reuse, a bad
 * size: NB_ERR_INVALID_ARGUMENT naming the layer), leaving the struct empty
 * (free is still safe). apply returns a tensor owned by the current scope, or
 * NULL with the error recorded (a wrong input shape names the layer and both
 * shapes). free frees the variables (NULL fields are skipped) and zeroes the
 * struct; under a reusing scope the variables are shared, so free them once. */
#ifndef NABLA_LAYERS_H
#define NABLA_LAYERS_H

#include <nabla/nn.h>
#include <nabla/variable.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mixed precision -------------------------------------------------------- */

/* The dtype dense and conv2d layers multiply in, process-wide: NB_F32 (the
 * default: a layer's own dtype), NB_BF16 or NB_F16. With a 16-bit compute
 * dtype an f32 layer casts its input and kernel to it, multiplies (matmul,
 * conv2d, accumulating in f32) and casts the product back to f32 before its
 * bias, so the variables, their gradients and the optimizer's slots stay f32
 * (the master weights), as do every other layer and the loss; gradients pass
 * back through the casts, rounded to the compute dtype on the way as the
 * product's are. Where the device does not compute in that dtype (the CPU)
 * it is emulated: operands and product are rounded to it (cast there and
 * back) around an f32 product, which gives the device's values but for the
 * order of the f32 sums, at the cost of the extra passes. f64 layers are left
 * alone. With f16, scale the loss (nb_loss_scaler in nabla/optimizer.h): its
 * gradients overflow or vanish otherwise. Takes effect from the next apply.
 * NB_OK, or NB_ERR_DTYPE (the setting unchanged) for any other dtype. */
nb_status nb_set_compute_dtype(nb_dtype dtype);

/* The compute dtype now (NB_F32 unless set). */
nb_dtype nb_compute_dtype(void);

/* ---- dense: y = x @ kernel + bias ----------------------------------------------- */

typedef struct nb_dense_layer {
    nb_variable *kernel; /* [in, out], Glorot uniform */
    nb_variable *bias;   /* [out], zeros; NULL without a bias */
} nb_dense_layer;

nb_status nb_dense_init(nb_dense_layer *layer, const char *name, int64_t in, int64_t out, bool use_bias,
                        nb_dtype dtype, uint64_t seed);
/* x [..., in] -> [..., out]. */
nb_tensor *nb_dense_apply(const nb_dense_layer *layer, const nb_tensor *x);
void nb_dense_free(nb_dense_layer *layer);

/* ---- conv2d: y = conv2d(x, kernel) + bias ------------------------------------------ */

typedef struct nb_conv2d_layer {
    nb_variable *kernel;  /* [R, S, in / groups, out], He normal (for a relu after it) */
    nb_variable *bias;    /* [out], zeros; NULL without a bias */
    nb_conv2d_opts opts;  /* strides, padding, groups, format, as given at init */
} nb_conv2d_layer;

/* opts NULL: stride 1, SAME padding, NHWC (Keras's Conv2D with padding="same"). */
nb_status nb_conv2d_init(nb_conv2d_layer *layer, const char *name, int64_t in_channels, int64_t out_channels,
                         int kernel_h, int kernel_w, const nb_conv2d_opts *opts, bool use_bias, nb_dtype dtype,
                         uint64_t seed);
nb_tensor *nb_conv2d_apply(const nb_conv2d_layer *layer, const nb_tensor *x);
void nb_conv2d_free(nb_conv2d_layer *layer);

/* ---- batch normalisation ---------------------------------------------------------- */

typedef struct nb_batch_norm_layer {
    nb_variable *gamma, *beta;                   /* [C]: ones and zeros, trainable */
    nb_variable *moving_mean, *moving_variance;  /* [C]: zeros and ones, not trainable */
    double momentum, epsilon;
    nb_data_format format;
} nb_batch_norm_layer;

/* momentum: the moving averages keep that share of themselves each training
 * step (Keras: 0.99); epsilon (Keras: 1e-3). Either <= 0 takes Keras's. */
nb_status nb_batch_norm_init(nb_batch_norm_layer *layer, const char *name, int64_t channels, double momentum,
                             double epsilon, nb_data_format format, nb_dtype dtype);
/* Training: normalises with the batch's statistics and moves the moving
 * averages toward them (moving = momentum moving + (1 - momentum) batch, the
 * variance unbiased); inference: normalises with the moving averages. */
nb_tensor *nb_batch_norm_apply(nb_batch_norm_layer *layer, const nb_tensor *x, bool training);
void nb_batch_norm_free(nb_batch_norm_layer *layer);

/* ---- layer normalisation (over the last dim) -------------------------------------- */

typedef struct nb_layer_norm_layer {
    nb_variable *gamma, *beta; /* [D]: ones and zeros */
    double epsilon;
} nb_layer_norm_layer;

/* epsilon <= 0 takes Keras's 1e-3. */
nb_status nb_layer_norm_init(nb_layer_norm_layer *layer, const char *name, int64_t dim, double epsilon,
                             nb_dtype dtype);
nb_tensor *nb_layer_norm_apply(const nb_layer_norm_layer *layer, const nb_tensor *x);
void nb_layer_norm_free(nb_layer_norm_layer *layer);

/* ---- embedding ------------------------------------------------------------------- */

typedef struct nb_embedding_layer {
    nb_variable *table; /* [vocabulary, dim], uniform in +-0.05 (Keras's default) */
} nb_embedding_layer;

nb_status nb_embedding_init(nb_embedding_layer *layer, const char *name, int64_t vocabulary, int64_t dim,
                            nb_dtype dtype, uint64_t seed);
/* ids (i32 or i64, any shape) -> ids.shape + [dim]. */
nb_tensor *nb_embedding_apply(const nb_embedding_layer *layer, const nb_tensor *ids);
void nb_embedding_free(nb_embedding_layer *layer);

/* ---- dropout ---------------------------------------------------------------------- */

typedef struct nb_dropout_layer {
    double rate;
    uint64_t seed;  /* the next training call's mask seed */
} nb_dropout_layer;

/* rate in [0, 1), NB_ERR_INVALID_ARGUMENT otherwise. It has no variables. */
nb_status nb_dropout_init(nb_dropout_layer *layer, double rate, uint64_t seed);
/* Training: nb_dropout with the layer's seed, which then moves on, so each
 * step draws a new mask (and a rerun from the same seed the same masks).
 * Inference: x's values. */
nb_tensor *nb_dropout_apply(nb_dropout_layer *layer, const nb_tensor *x, bool training);

#ifdef __cplusplus
}
#endif

#endif
