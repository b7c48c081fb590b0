/* Layers (include/nabla/layers.h): each a few variables made in a scope named
 * after the layer, and a function of them built from public ops. */
#include "lib/core/capture.h"
#include "lib/core/core.h"
#include "lib/core/recording.h"
#include "ops/op.h"
#include <nabla/layers.h>

#include <stdlib.h>
#include <string.h>

/* ---- variables in the layer's scope -------------------------------------------- */

/* Opens the variable scope "name" for a layer's variables. */
static nb_status layer_begin(const char *who, const char *name)
{
    if (!name || !*name)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the layer needs a name", who);
    return nb_variable_scope_push(name, false);
}

/* Makes "<scope>/<name>/<var>": NULL and the error (left recorded) on failure. */
static nb_variable *make(const char *var, nb_shape shape, nb_dtype dtype, nb_initializer init, bool trainable)
{
    nb_variable *v = nb_get_variable(var, shape, dtype, init);
    if (v && !trainable)
        nb_variable_set_trainable(v, false);
    return v;
}

static void free_fields(nb_variable **first, int count)
{
    for (int i = 0; i < count; i++) {
        nb_variable_free(first[i]);
        first[i] = NULL;
    }
}

/* Closes the scope; on failure frees the fields made so far (count variables
 * from first) and returns the pending error. */
static nb_status layer_end(nb_variable **first, int count, bool ok)
{
    nb_status err = ok ? NB_OK : nb_error() ? nb_error() : NB_ERR_INTERNAL;
    nb_variable_scope_pop();
    if (err)
        free_fields(first, count);
    return err;
}

static bool positive(const char *who, const char *name, const char *what, int64_t v)
{
    if (v > 0)
        return true;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s '%s': %s is %lld; it must be positive", who, name ? name : "", what,
             (long long)v);
    return false;
}

static const nb_initializer zeros = {NB_INIT_ZEROS, 0, 0, 0};
static const nb_initializer ones = {NB_INIT_CONSTANT, 1, 0, 0};

/* ---- dense ------------------------------------------------------------------- */

nb_status nb_dense_init(nb_dense_layer *layer, const char *name, int64_t in, int64_t out, bool use_bias,
                        nb_dtype dtype, uint64_t seed)
{
    const char *who = "nb_dense_init";
    memset(layer, 0, sizeof *layer);
    if (!positive(who, name, "in", in) || !positive(who, name, "out", out))
        return nb_error();
    nb_status st = layer_begin(who, name);
    if (st)
        return st;
    nb_variable **f = &layer->kernel;
    bool ok = (layer->kernel = make("kernel", NB_SHAPE(in, out), dtype,
                                    (nb_initializer){NB_INIT_GLOROT_UNIFORM, 0, 0, seed}, true)) != NULL;
    if (ok && use_bias)
        ok = (layer->bias = make("bias", NB_SHAPE(out), dtype, zeros, true)) != NULL;
    return layer_end(f, 2, ok);
}

/* ---- mixed precision ------------------------------------------------------------ */

static atomic_int g_compute_dtype = NB_F32;

nb_status nb_set_compute_dtype(nb_dtype dtype)
{
    if (dtype != NB_F32 && dtype != NB_BF16 && dtype != NB_F16)
        return nb__fail(NB_ERR_DTYPE, "nb_set_compute_dtype: %s is not a compute dtype (f32, bf16 or f16)",
                        (unsigned)dtype < NB_DTYPE_COUNT ? nb_dtype_name(dtype) : "that");
    atomic_store(&g_compute_dtype, (int)dtype);
    return NB_OK;
}

nb_dtype nb_compute_dtype(void) { return (nb_dtype)atomic_load(&g_compute_dtype); }

/* A layer's product (matmul or conv2d) of x and w. */
typedef nb_tensor *(*product_fn)(const nb_tensor *x, const nb_tensor *w, const void *ctx);

/* t rounded to dtype c and back: an f32 tensor whose values c holds. */
static nb_tensor *rounded(const nb_tensor *t, nb_dtype c) { return nb_cast(nb_cast(t, c), NB_F32); }

/* fn(x, w) in the compute dtype: natively where the device multiplies in it
 * (kernel k), else emulated; plain for f32 and for other dtypes. */
static nb_tensor *product(nb_kernel k, product_fn fn, const nb_tensor *x, const nb_tensor *w, const void *ctx)
{
    nb_dtype c = nb_compute_dtype();
    if (c == NB_F32 || !x || !w || x->dtype != NB_F32 || w->dtype != NB_F32)
        return fn(x, w, ctx);
    nb_device *pushed = nb__device_pushed(), *dev = pushed ? pushed : x->device;
    if (nb__supports(dev, k, 0, c))
        return nb_cast(fn(nb_cast(x, c), nb_cast(w, c), ctx), NB_F32);
    return rounded(fn(rounded(x, c), rounded(w, c), ctx), c);
}

static nb_tensor *matmul_of(const nb_tensor *x, const nb_tensor *w, const void *ctx)
{
    (void)ctx;
    return nb_matmul(x, w);
}

static nb_tensor *conv2d_of(const nb_tensor *x, const nb_tensor *w, const void *ctx)
{
    return nb_conv2d(x, w, ctx);
}

nb_tensor *nb_dense_apply(const nb_dense_layer *layer, const nb_tensor *x)
{
    if (!layer->kernel)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_dense_apply: the layer is not initialised");
    nb_tensor *y = product(NB_K_MATMUL, matmul_of, x, nb_read(layer->kernel), NULL);
    return layer->bias ? nb_add(y, nb_read(layer->bias)) : y;
}

void nb_dense_free(nb_dense_layer *layer)
{
    if (layer)
        free_fields(&layer->kernel, 2);
}

/* ---- conv2d ------------------------------------------------------------------ */

nb_status nb_conv2d_init(nb_conv2d_layer *layer, const char *name, int64_t in_channels, int64_t out_channels,
                         int kernel_h, int kernel_w, const nb_conv2d_opts *opts, bool use_bias, nb_dtype dtype,
                         uint64_t seed)
{
    const char *who = "nb_conv2d_init";
    memset(layer, 0, sizeof *layer);
    if (opts) {
        layer->opts = *opts;
    } else {
        layer->opts.padding = NB_PAD_SAME;
    }
    int groups = layer->opts.groups > 0 ? layer->opts.groups : 1;
    if (!positive(who, name, "in_channels", in_channels) || !positive(who, name, "out_channels", out_channels) ||
        !positive(who, name, "kernel_h", kernel_h) || !positive(who, name, "kernel_w", kernel_w))
        return nb_error();
    if (in_channels % groups || out_channels % groups)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s '%s': %lld in and %lld out channels do not split into %d groups",
                        who, name ? name : "", (long long)in_channels, (long long)out_channels, groups);
    nb_status st = layer_begin(who, name);
    if (st)
        return st;
    nb_variable **f = &layer->kernel;
    bool ok = (layer->kernel = make("kernel", NB_SHAPE(kernel_h, kernel_w, in_channels / groups, out_channels),
                                    dtype, (nb_initializer){NB_INIT_HE_NORMAL, 0, 0, seed}, true)) != NULL;
    if (ok && use_bias)
        ok = (layer->bias = make("bias", NB_SHAPE(out_channels), dtype, zeros, true)) != NULL;
    return layer_end(f, 2, ok);
}

/* The bias as a tensor that broadcasts over x's channel axis. */
static nb_tensor *channel_vector(nb_tensor *v, nb_data_format format)
{
    return format == NB_NCHW ? nb_reshape(v, NB_SHAPE(1, -1, 1, 1)) : v;
}

nb_tensor *nb_conv2d_apply(const nb_conv2d_layer *layer, const nb_tensor *x)
{
    if (!layer->kernel)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_conv2d_apply: the layer is not initialised");
    nb_tensor *y = product(NB_K_CONV2D, conv2d_of, x, nb_read(layer->kernel), &layer->opts);
    return layer->bias ? nb_add(y, channel_vector(nb_read(layer->bias), layer->opts.format)) : y;
}

void nb_conv2d_free(nb_conv2d_layer *layer)
{
    if (layer)
        free_fields(&layer->kernel, 2);
}

/* ---- batch normalisation ---------------------------------------------------- */

nb_status nb_batch_norm_init(nb_batch_norm_layer *layer, const char *name, int64_t channels, double momentum,
                             double epsilon, nb_data_format format, nb_dtype dtype)
{
    const char *who = "nb_batch_norm_init";
    memset(layer, 0, sizeof *layer);
    if (!positive(who, name, "channels", channels))
        return nb_error();
    if (momentum >= 1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s '%s': momentum %g is not below 1", who, name ? name : "",
                        momentum);
    layer->momentum = momentum > 0 ? momentum : 0.99;
    layer->epsilon = epsilon > 0 ? epsilon : 1e-3;
    layer->format = format;
    nb_status st = layer_begin(who, name);
    if (st)
        return st;
    nb_variable **f = &layer->gamma;
    bool ok = (layer->gamma = make("gamma", NB_SHAPE(channels), dtype, ones, true)) &&
              (layer->beta = make("beta", NB_SHAPE(channels), dtype, zeros, true)) &&
              (layer->moving_mean = make("moving_mean", NB_SHAPE(channels), dtype, zeros, false)) &&
              (layer->moving_variance = make("moving_variance", NB_SHAPE(channels), dtype, ones, false));
    return layer_end(f, 4, ok);
}

/* moving = momentum moving + (1 - momentum) batch. */
static nb_status move_average(nb_variable *moving, nb_tensor *batch, double momentum)
{
    return nb_variable_assign(moving, nb_add(nb_mul_scalar(nb_read(moving), momentum),
                                             nb_mul_scalar(batch, 1.0 - momentum)));
}

nb_tensor *nb_batch_norm_apply(nb_batch_norm_layer *layer, const nb_tensor *x, bool training)
{
    if (!layer->gamma)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_batch_norm_apply: the layer is not initialised");
    nb_tensor *gamma = nb_read(layer->gamma), *beta = nb_read(layer->beta);
    if (!training)
        return nb_batch_norm_infer(x, gamma, beta, nb_read(layer->moving_mean), nb_read(layer->moving_variance),
                                   layer->epsilon, layer->format);
    nb_tensor *mean = NULL, *var = NULL;
    nb_tensor *y = nb_batch_norm_train(x, gamma, beta, layer->epsilon, layer->format, &mean, &var);
    if (!y)
        return NULL;
    /* The moving averages are bookkeeping, not part of the model's function:
     * no tape records them. */
    int token = nb__tapes_pause();
    nb_status st = move_average(layer->moving_mean, mean, layer->momentum);
    if (!st)
        st = move_average(layer->moving_variance, var, layer->momentum);
    nb__tapes_resume(token);
    return st ? NULL : y;
}

void nb_batch_norm_free(nb_batch_norm_layer *layer)
{
    if (layer)
        free_fields(&layer->gamma, 4);
}

/* ---- layer normalisation ----------------------------------------------------- */

nb_status nb_layer_norm_init(nb_layer_norm_layer *layer, const char *name, int64_t dim, double epsilon,
                             nb_dtype dtype)
{
    const char *who = "nb_layer_norm_init";
    memset(layer, 0, sizeof *layer);
    if (!positive(who, name, "dim", dim))
        return nb_error();
    layer->epsilon = epsilon > 0 ? epsilon : 1e-3;
    nb_status st = layer_begin(who, name);
    if (st)
        return st;
    nb_variable **f = &layer->gamma;
    bool ok = (layer->gamma = make("gamma", NB_SHAPE(dim), dtype, ones, true)) &&
              (layer->beta = make("beta", NB_SHAPE(dim), dtype, zeros, true));
    return layer_end(f, 2, ok);
}

nb_tensor *nb_layer_norm_apply(const nb_layer_norm_layer *layer, const nb_tensor *x)
{
    if (!layer->gamma)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_layer_norm_apply: the layer is not initialised");
    return nb_layer_norm(x, nb_read(layer->gamma), nb_read(layer->beta), 1, layer->epsilon);
}

void nb_layer_norm_free(nb_layer_norm_layer *layer)
{
    if (layer)
        free_fields(&layer->gamma, 2);
}

/* ---- embedding --------------------------------------------------------------- */

nb_status nb_embedding_init(nb_embedding_layer *layer, const char *name, int64_t vocabulary, int64_t dim,
                            nb_dtype dtype, uint64_t seed)
{
    const char *who = "nb_embedding_init";
    memset(layer, 0, sizeof *layer);
    if (!positive(who, name, "vocabulary", vocabulary) || !positive(who, name, "dim", dim))
        return nb_error();
    nb_status st = layer_begin(who, name);
    if (st)
        return st;
    bool ok = (layer->table = make("embeddings", NB_SHAPE(vocabulary, dim), dtype,
                                   (nb_initializer){NB_INIT_UNIFORM, 0.05, 0, seed}, true)) != NULL;
    return layer_end(&layer->table, 1, ok);
}

nb_tensor *nb_embedding_apply(const nb_embedding_layer *layer, const nb_tensor *ids)
{
    if (!layer->table)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_embedding_apply: the layer is not initialised");
    return nb_embedding_lookup(nb_read(layer->table), ids);
}

void nb_embedding_free(nb_embedding_layer *layer)
{
    if (layer)
        free_fields(&layer->table, 1);
}

/* ---- dropout ----------------------------------------------------------------- */

nb_status nb_dropout_init(nb_dropout_layer *layer, double rate, uint64_t seed)
{
    memset(layer, 0, sizeof *layer);
    if (!(rate >= 0 && rate < 1))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_dropout_init: rate %g is outside [0, 1)", rate);
    layer->rate = rate;
    layer->seed = seed;
    return NB_OK;
}

/* ---- dropout in a recorded step ------------------------------------------------
 * The recording runs nothing and a replay repeats its kernels, so a mask drawn
 * from a seed on the host would be the same at every replay. A recorded
 * dropout draws from its recorded seed plus a device double that each replay
 * refreshes: the layer's seed then, plus the applies before it in the step.
 * The seed the recording advanced is taken back when it ends, and each replay
 * advances it as many times as the step applies the layer, as eager steps do,
 * so replays draw the masks eager steps would. */

typedef struct recorded_dropout {
    nb_dropout_layer *layer;
    uint64_t seed; /* the seed it was recorded with */
    int first;     /* its double in the replay's array */
} recorded_dropout;

/* Before each replay, in the order of the applies: this apply's offset from
 * its recorded seed, and the layer's seed moves on. */
static void dropout_fill(void *ctx, double *params)
{
    recorded_dropout *r = ctx;
    const uint64_t add = r->layer->seed - r->seed; /* its 64 bits as they are: a double would round it */
    memcpy(&params[r->first], &add, sizeof add);
    r->layer->seed++;
}

/* The hooks end in reverse order: the first apply leaves the oldest seed. */
static void dropout_end(void *ctx, bool kept)
{
    (void)kept;
    recorded_dropout *r = ctx;
    r->layer->seed = r->seed;
}

/* The apply recorded now: the mask drawn from the layer's seed plus a device
 * double the replays refresh. */
static nb_tensor *dropout_recorded(nb_dropout_layer *layer, const nb_tensor *x, nb__capture *c)
{
    recorded_dropout *r = malloc(sizeof *r);
    if (!r)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_dropout_apply: out of host memory");
    *r = (recorded_dropout){layer, layer->seed, 0};
    const double *seed_add = nb__capture_params(c, 1, &r->first);
    if (!seed_add) {
        free(r);
        return NULL;
    }
    static const nb__capture_hooks hooks = {.at_end = dropout_end, .before_replay = dropout_fill, .release = free};
    if (nb__capture_hook(c, &hooks, r) != NB_OK)
        return NULL;
    /* The recording reads 0: the replays' offsets start from this seed. */
    return nb__dropout_at(x, layer->rate, layer->seed++, seed_add);
}

nb_tensor *nb_dropout_apply(nb_dropout_layer *layer, const nb_tensor *x, bool training)
{
    if (!x)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_dropout_apply: input 0 is NULL");
    if (!training || layer->rate == 0)
        return nb_retain((nb_tensor *)x);
    nb__capture *c = nb__capture_current();
    if (nb__capture_recording(c))
        return dropout_recorded(layer, x, c);
    return nb_dropout(x, layer->rate, layer->seed++);
}
