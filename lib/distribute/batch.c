/* Cutting a batch into ranges of rows, for the mirrored strategy's replicas,
 * the asynchronous trainer's workers and the pipeline's micro-batches: the
 * checks of the inputs, and a range of rows moved to a device. */
#include "distribute_impl.h"

nb_status nb__batch_check(const char *who, int n_inputs, nb_tensor *const *inputs, int64_t *rows)
{
    *rows = 0;
    if (n_inputs < 0 || (n_inputs > 0 && !inputs))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, n_inputs < 0 ? "n_inputs is negative" : "inputs is NULL");
    for (int i = 0; i < n_inputs; i++) {
        const nb_tensor *x = inputs[i];
        if (!x)
            return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", who, i);
        char sh[NB_SHAPE_STR_MAX], s0[NB_SHAPE_STR_MAX];
        if (x->ndim < 1)
            return nb__fail(NB_ERR_SHAPE, "%s: input %d is a scalar; inputs are split along their first dim", who, i);
        if (i > 0 && x->shape[0] != *rows)
            return nb__fail(NB_ERR_SHAPE, "%s: input %d has shape %s but input 0 has %s: the first dims must agree",
                            who, i, nb__shape_str(x->ndim, x->shape, sh, sizeof sh),
                            nb__shape_str(inputs[0]->ndim, inputs[0]->shape, s0, sizeof s0));
        *rows = x->shape[0];
    }
    return NB_OK;
}

nb_tensor *nb__batch_rows(const nb_tensor *x, int64_t start, int64_t rows, nb_device *dev)
{
    nb_shape begin = {x->ndim, {0}}, size = {x->ndim, {0}};
    begin.dims[0] = start;
    size.dims[0] = rows;
    for (int d = 1; d < x->ndim; d++)
        size.dims[d] = -1;
    /* cut where the input is (under another device pushed, the whole input
     * would be copied there first), then move the rows alone */
    if (nb_device_push(x->device->name))
        return NULL;
    nb_tensor *t = nb_slice(x, begin, size);
    nb_device_pop();
    return t && t->device != dev ? nb_to_device(t, dev->name) : t;
}
