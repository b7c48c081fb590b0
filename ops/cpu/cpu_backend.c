/* The CPU kernel table. */
#include "cpu_internal.h"

#include <stdio.h>
#include <string.h>

nb_status nb__cpu_unsupported(const nb_device *dev, const char *op, nb_dtype d)
{
    return nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", op, nb_dtype_name(d),
                    nb__cpu_dev_name(dev));
}

/* The CPU's logical devices /cpu:0 .. /cpu:n-1 share the host's memory and
 * kernels; each has its own worker when a mirrored strategy runs replicas. */
static int cpu_discover(nb_device *devices, int max, int logical)
{
    int n = logical < 1 ? 1 : logical > max ? max : logical;
    for (int i = 0; i < n; i++) {
        memset(&devices[i], 0, sizeof devices[i]);
        devices[i].kind = NB_DEVICE_CPU;
        devices[i].index = i;
        devices[i].physical = 0;
        snprintf(devices[i].name, sizeof devices[i].name, "/cpu:%d", i);
        devices[i].backend = &nb__cpu_backend;
    }
    return n;
}

static int cpu_physical_count(void) { return 1; }

/* Every op in ops.def for every dtype the list allows and the CPU holds (all
 * but f16 and bf16). */
static bool cpu_supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype)
{
    (void)dev;
    if (!nb__list_defines(k, variant, dtype) || !(nb__cpu_backend.dtypes & NB_MASK(dtype)))
        return false;
    /* f16 and bf16 are stored and converted, never computed in */
    if (dtype == NB_F16 || dtype == NB_BF16)
        return k == NB_K_COPY || k == NB_K_FILL;
    switch (k) {
    case NB_K_CONV2D:
    case NB_K_CONV2D_BACKWARD_DATA:
    case NB_K_CONV2D_BACKWARD_FILTER:
    case NB_K_SOFTMAX_XENT:
    case NB_K_SOFTMAX_XENT_GRAD:
    case NB_K_LAYER_NORM_ROWS:
    case NB_K_LAYER_NORM_ROWS_GRAD: return dtype == NB_F32 || dtype == NB_F64;
    default: return true;
    }
}

static const nb_optim_kernels cpu_optim = {
    .sgd_update = nb__cpu_sgd_update,
    .adam_update = nb__cpu_adam_update,
    .sgd_update_many = nb__cpu_sgd_update_many,
    .adam_update_many = nb__cpu_adam_update_many,
    .scaler_update = nb__cpu_scaler_update,
};

const nb_backend nb__cpu_backend = {
    .name = "cpu",
    .kind = NB_DEVICE_CPU,
    .optim = &cpu_optim,
    .graph = &nb__cpu_graph,
    .discover = cpu_discover,
    .physical_count = cpu_physical_count,
    .unavailable = NULL,
    .supports = cpu_supports,
    .dtypes = (1u << NB_DTYPE_COUNT) - 1, /* f16 and bf16: storage and conversion (cpu_supports) */
    .alloc = nb__cpu_alloc,
    .free = nb__cpu_free,
    .copy_from_host = nb__cpu_copy_from_host,
    .copy_to_host = nb__cpu_copy_to_host,
    .copy_between = nb__cpu_copy_between,
    .synchronize = nb__cpu_synchronize,
    .fill = nb__cpu_fill,
    .arange = nb__cpu_arange,
    .random = nb__cpu_random,
    .copy = nb__cpu_copy,
    .unary = nb__cpu_unary,
    .binary = nb__cpu_binary,
    .where = nb__cpu_where,
    .reduce = nb__cpu_reduce,
    .arg_reduce = nb__cpu_arg_reduce,
    .cumsum = nb__cpu_cumsum,
    .matmul = nb__cpu_matmul,
    .softmax = nb__cpu_softmax,
    .softmax_xent = nb__cpu_softmax_xent,
    .softmax_xent_grad = nb__cpu_softmax_xent_grad,
    .gather = nb__cpu_gather,
    .scatter_add = nb__cpu_scatter_add,
    .one_hot = nb__cpu_one_hot,
    .check_indices = nb__cpu_check_indices,
    .conv2d = nb__cpu_conv2d,
    .conv2d_backward_data = nb__cpu_conv2d_backward_data,
    .conv2d_backward_filter = nb__cpu_conv2d_backward_filter,
    .max_pool2d = nb__cpu_max_pool2d,
    .max_pool2d_grad = nb__cpu_max_pool2d_grad,
    .avg_pool2d = nb__cpu_avg_pool2d,
    .avg_pool2d_grad = nb__cpu_avg_pool2d_grad,
    .channel_moments = nb__cpu_channel_moments,
    .channel_affine = nb__cpu_channel_affine,
    .layer_norm_rows = nb__cpu_layer_norm_rows,
    .layer_norm_rows_grad = nb__cpu_layer_norm_rows_grad,
};
