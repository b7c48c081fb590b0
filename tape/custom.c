/* Custom gradients: a user's forward recorded as one op with the user's backward. */
#include "tape_impl.h"

#include <stdint.h>

static nb_status custom_grad(const nb_node *node, nb_tensor *const *out_grads, nb_tensor **in_grads)
{
    nb_custom_backward_fn backward = (nb_custom_backward_fn)(uintptr_t)node->attrs.i[0];
    nb_status st = backward(node->n_in, node->in, node->n_out, node->out, out_grads, in_grads, node->attrs.ptr);
    if (st)
        return nb_error() ? nb_error() : nb__fail(st, "custom gradient: backward returned %s", nb_status_name(st));
    return NB_OK;
}

static const nb_op_def custom_op = {.name = "custom_gradient", .grad = custom_grad};

nb_status nb_custom_gradient(int n_in, nb_tensor *const *inputs, int n_out, nb_tensor **outputs,
                             nb_custom_forward_fn forward, nb_custom_backward_fn backward, void *user)
{
    if (n_in < 0 || n_out < 1 || (n_in && !inputs) || !outputs || !forward || !backward)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_custom_gradient: need inputs, outputs, forward and backward");
    for (int i = 0; i < n_out; i++)
        outputs[i] = NULL;
    for (int i = 0; i < n_in; i++)
        if (!inputs[i])
            return nb__null_input("nb_custom_gradient", i), nb_error();
    int token = nb__tapes_pause();
    nb_status st = forward(n_in, inputs, n_out, outputs, user);
    nb__tapes_resume(token);
    for (int i = 0; i < n_out && !st; i++)
        if (!outputs[i])
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_custom_gradient: forward left output %d NULL", i);
    if (st)
        return nb_error() ? nb_error() : nb__fail(st, "nb_custom_gradient: forward returned %s", nb_status_name(st));
    nb_op_attrs attrs = {0};
    attrs.i[0] = (int64_t)(uintptr_t)backward;
    attrs.ptr = user;
    return nb__record(&custom_op, n_in, (const nb_tensor *const *)inputs, n_out, outputs, &attrs);
}
