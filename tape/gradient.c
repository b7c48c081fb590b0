/* The backward pass: walks a tape's record in reverse, summing gradients. */
#include "tape_impl.h"

#include <string.h>

/* Adds g to the gradient accumulated for id (both owned by the pass's scope). */
static nb_status accumulate(nb_idmap *grads, uint64_t id, nb_tensor *g)
{
    nb_tensor *old = nb__idmap_get(grads, id);
    if (old) {
        g = nb_add(old, g);
        if (!g)
            return nb_error();
    }
    if (!nb__idmap_put(grads, id, g))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_tape_gradient: out of host memory");
    return NB_OK;
}

static nb_status check_grad(const nb_node *node, int k, const nb_tensor *g)
{
    const nb_tensor *x = node->in[k];
    if (g->dtype == x->dtype && nb__same_shape(g, x))
        return NB_OK;
    char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
    return nb__fail(NB_ERR_INTERNAL, "nb_tape_gradient: gradient of %s input %d is %s %s, expected %s %s",
                    node->op->name, k, nb_dtype_name(g->dtype), nb__shape_str(g->ndim, g->shape, a, sizeof a),
                    nb_dtype_name(x->dtype), nb__shape_str(x->ndim, x->shape, b, sizeof b));
}

static nb_status backward_node(nb_tape *tape, nb_node *node, nb_idmap *grads)
{
    nb_tensor *out_grads_small[8], *in_grads_small[8];
    nb_tensor **out_grads = out_grads_small, **in_grads = in_grads_small;
    if (node->n_out > 8 || node->n_in > 8) {
        out_grads = calloc((size_t)node->n_out, sizeof *out_grads);
        in_grads = calloc((size_t)node->n_in, sizeof *in_grads);
        if (!out_grads || !in_grads) {
            free(out_grads);
            free(in_grads);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_tape_gradient: out of host memory");
        }
    }
    nb_status st = NB_OK;
    bool any = false;
    for (int j = 0; j < node->n_out; j++)
        any |= (out_grads[j] = nb__idmap_get(grads, node->out_ids[j])) != NULL;
    bool wanted = false;
    node->needs = 0;
    for (int k = 0; k < node->n_in; k++) {
        bool w = node->in_ids[k] && nb__idmap_has(&tape->buf.watched, node->in_ids[k]);
        wanted |= w;
        if (w && k < 32)
            node->needs |= 1u << k;
    }
    if (!any || !wanted)
        goto done;
    if (!node->op->grad) {
        st = nb__fail(NB_ERR_TAPE, "nb_tape_gradient: op %s has no gradient", node->op->name);
        goto done;
    }
    const int n_grad_out = node->op->n_grad_outputs ? node->op->n_grad_outputs : node->n_out;
    for (int j = 0; j < n_grad_out; j++) {
        if (!out_grads[j] && !(out_grads[j] = nb_zeros_like(node->out[j]))) {
            st = nb_error();
            goto done;
        }
    }
    for (int k = 0; k < node->n_in; k++)
        in_grads[k] = NULL;
    st = node->op->grad(node, out_grads, in_grads);
    if (st)
        goto done;
    for (int k = 0; k < node->n_in && !st; k++) {
        if (!in_grads[k] || !nb__idmap_has(&tape->buf.watched, node->in_ids[k]))
            continue;
        st = check_grad(node, k, in_grads[k]);
        if (!st)
            st = accumulate(grads, node->in_ids[k], in_grads[k]);
    }
done:
    if (out_grads != out_grads_small) {
        free(out_grads);
        free(in_grads);
    }
    return st;
}

nb_status nb__tape_gradient_ids(nb_tape *tape, const nb_tensor *target, const nb_tensor *seed, int n,
                                const uint64_t *ids, nb_tensor *const *like, nb_tensor **out,
                                nb_unconnected unconnected)
{
    const char *who = "nb_tape_gradient";
    /* The output array first: everything below writes to it. */
    if (n < 0 || (n > 0 && !out))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, n < 0 ? "%s: source count %d is negative"
                                                       : "%s: the gradient array for %d sources is NULL", who, n);
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (!tape)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: tape is NULL", who);
    if (!target)
        return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: target is NULL", who);
    for (int i = 0; i < n; i++)
        if (!ids[i])
            return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: source %d is NULL", who, i);
    if (tape->used)
        return nb__fail(NB_ERR_TAPE, "%s: this one-shot tape's gradient was already taken; "
                                     "use nb_tape_begin_persistent to ask more than once", who);
    if (!nb__is_floating(target->dtype))
        return nb__fail(NB_ERR_DTYPE, "%s: target is %s: only floating dtypes have gradients", who,
                        nb_dtype_name(target->dtype));
    if (seed) {
        if (seed->dtype != target->dtype || !nb__same_shape(seed, target)) {
            char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
            return nb__fail(NB_ERR_SHAPE, "%s: output gradient %s %s does not match target %s %s", who,
                            nb_dtype_name(seed->dtype), nb__shape_str(seed->ndim, seed->shape, a, sizeof a),
                            nb_dtype_name(target->dtype), nb__shape_str(target->ndim, target->shape, b, sizeof b));
        }
    }

    /* The tape must not record its own backward pass; outer tapes may. */
    bool was_paused = tape->paused;
    nb_tape_pause(tape);
    nb_scope *scope = nb_scope_begin();
    nb_idmap grads = {0};
    nb_status st = scope ? NB_OK : nb_error();
    if (!st && nb__idmap_has(&tape->buf.watched, target->id)) {
        nb_tensor *g = seed ? nb_retain((nb_tensor *)seed) : nb_ones_like(target);
        st = g ? accumulate(&grads, target->id, g) : nb_error();
        for (size_t i = tape->n_nodes; i-- > 0 && !st;) {
            st = backward_node(tape, &tape->buf.nodes[i], &grads);
            /* A one-shot tape lets go of what it saved as soon as it can. */
            if (!tape->persistent)
                nb__tape_node_release(&tape->buf.nodes[i]);
        }
    }
    for (int i = 0; i < n && !st; i++) {
        out[i] = nb__idmap_get(&grads, ids[i]);
        if (!out[i] && unconnected == NB_UNCONNECTED_ZERO && !(out[i] = nb_zeros_like(like[i])))
            st = nb_error();
        if (out[i])
            nb__retain(out[i]); /* survives the pass's scope */
    }
    nb__idmap_free(&grads);
    if (scope)
        nb_scope_end(scope);
    if (!was_paused)
        nb_tape_resume(tape);
    for (int i = 0; i < n; i++) {
        if (out[i] && st) {
            nb__release(out[i]);
            out[i] = NULL;
        } else if (out[i]) {
            out[i] = nb__own(out[i]);
        }
    }
    if (!tape->persistent) {
        tape->used = true;
        nb__tape_clear_nodes(tape);
        nb__tape_unlink(tape);
    }
    return st;
}

nb_status nb_tape_gradient_ex(nb_tape *tape, const nb_tensor *target, const nb_tensor *output_gradient,
                              int n, nb_tensor *const *sources, nb_tensor **grads, nb_unconnected unconnected)
{
    uint64_t small[16] = {0};
    uint64_t *ids = n <= 16 ? small : malloc(sizeof *ids * (size_t)n);
    if (!ids)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_tape_gradient: out of host memory");
    for (int i = 0; i < n; i++)
        ids[i] = sources && sources[i] ? sources[i]->id : 0;
    nb_status st = nb__tape_gradient_ids(tape, target, output_gradient, n, ids, sources, grads, unconnected);
    if (ids != small)
        free(ids);
    return st;
}

nb_status nb_tape_gradient(nb_tape *tape, const nb_tensor *target, int n, nb_tensor *const *sources,
                           nb_tensor **grads)
{
    return nb_tape_gradient_ex(tape, target, NULL, n, sources, grads, NB_UNCONNECTED_NULL);
}
