/* The CPU kernel table. */
#include "cpu_internal.h"

nb_status nb__cpu_unsupported(const nb_device *dev, const char *op, nb_dtype d)
{
    return nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", op, nb_dtype_name(d),
                    nb__cpu_dev_name(dev));
}

const nb_backend nb__cpu_backend = {
    .name = "cpu",
    .dtypes = ((1u << NB_DTYPE_COUNT) - 1) & ~((1u << NB_F16) | (1u << NB_BF16)),
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
    .matmul = nb__cpu_matmul,
    .softmax = nb__cpu_softmax,
    .gather = nb__cpu_gather,
    .scatter_add = nb__cpu_scatter_add,
    .one_hot = nb__cpu_one_hot,
    .sgd_update = nb__cpu_sgd_update,
    .adam_update = nb__cpu_adam_update,
};
