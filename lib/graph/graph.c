/* Step capture (include/nabla/graph.h): a step run under the capture rules
 * (lib/core/capture.h), recorded where the device's backend can record
 * (nb_backend.graph), replayed with fresh inputs. */
#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "lib/core/recording.h"
#include "ops/op.h"

#include <nabla/graph.h>

#include <stdlib.h>
#include <string.h>

struct nb_graph {
    nb_device *dev;
    nb_graph_step_fn fn;
    void *user;
    int n_in, n_out;
    nb_tensor **in;   /* the graph's inputs on dev (contiguous; one reference each) */
    nb_tensor **out;  /* the recorded outputs (one reference each), or NULL */
    /* recorded only */
    void *exec;
    nb__capture *rec;   /* the recording's hooks, kept for the replays */
    double *dev_params; /* NB_CAPTURE_MAX_PARAMS device doubles the replays refresh */
    double *params;     /* their values at the last replay (host) */
    double *next;       /* this replay's */
    int n_params;
    bool params_sent;
};

/* Copies src (any device) into dst (the graph's input on dev), in dev's order. */
static nb_status copy_into(nb_device *dev, nb_tensor *dst, const nb_tensor *src)
{
    if (dst->numel == 0 || src == dst)
        return NB_OK;
    int token = nb__tapes_pause();
    /* The move to dev is an op, owned by a scope: one of our own. */
    nb_scope *scope = NULL;
    nb_status st = NB_OK;
    if (src->device != dev) {
        scope = nb_scope_begin();
        if (!scope || !(src = nb__copy_to_device(src, dev)))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    }
    if (st == NB_OK) {
        nb_view d = nb__view(dst), s = nb__view(src);
        st = dev->backend->copy(dev, &d, &s);
    }
    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    return st;
}

/* A new tensor holding t's values (one reference, in no scope). */
static nb_tensor *copy_out(nb_device *dev, const nb_tensor *t)
{
    int64_t dims[NB_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        dims[i] = t->shape[i];
    nb_tensor *o = nb__tensor_new("nb_graph_replay", dev, t->dtype, t->ndim, dims);
    if (!o)
        return NULL;
    if (o->numel) {
        nb_view d = nb__view(o), s = nb__view(t);
        if (dev->backend->copy(dev, &d, &s) != NB_OK) {
            nb__release(o);
            return NULL;
        }
    }
    return o;
}

/* Runs the step once under the rules: outs gets n_out tensors holding one
 * reference each (unscoped), or the error is returned with none held. */
static nb_status run_step(nb_graph *g, nb__capture *c, nb_tensor **outs, const char *who)
{
    for (int i = 0; i < g->n_out; i++)
        outs[i] = NULL;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    nb_status st = g->fn(g->user, g->n_in, g->in, g->n_out, outs);
    if (st == NB_OK && nb__capture_failed(c))
        st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    for (int i = 0; i < g->n_out && st == NB_OK; i++) {
        if (!outs[i])
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the step returned NB_OK but output %d is NULL", who, i);
        else if (outs[i]->device != g->dev)
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: output %d of the step is on %s, not on the graph's %s", who,
                          i, outs[i]->device->name, g->dev->name);
    }
    if (st != NB_OK && !nb_error())
        st = nb__fail(st, "%s: the step failed (%s) without a message", who, nb_status_name(st));
    for (int i = 0; i < g->n_out; i++) {
        if (st == NB_OK)
            nb__retain(outs[i]);
        else
            outs[i] = NULL;
    }
    nb_scope_end(s);
    return st;
}

/* Hands the references run_step held to the current scope (or the caller). */
static void hand_out(int n, nb_tensor **held, nb_tensor **outputs)
{
    for (int i = 0; i < n; i++) {
        if (outputs)
            outputs[i] = nb__own(held[i]);
        else
            nb__release(held[i]);
    }
}

/* The step under the rules, without recording (the warm-up, and every replay
 * where the device cannot record): outs gets one reference to each output. */
static nb_status run_eager(nb_graph *g, nb_tensor **outs, const char *who)
{
    nb_status st = nb_device_push(g->dev->name);
    if (st == NB_OK) {
        nb__capture *c = nb__capture_enter(g->dev, false, NULL);
        st = c ? run_step(g, c, outs, who) : nb_error();
        if (c)
            nb__capture_leave(c, false);
        nb_device_pop();
    }
    return st;
}

/* run_eager, its outputs handed out (NULL outputs: released). */
static nb_status replay_eager(nb_graph *g, nb_tensor **outputs, const char *who)
{
    nb_tensor *small[8], **outs = g->n_out <= 8 ? small : calloc((size_t)g->n_out, sizeof *outs);
    if (!outs)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    nb_status st = run_eager(g, outs, who);
    if (st == NB_OK)
        hand_out(g->n_out, outs, outputs);
    if (outs != small)
        free(outs);
    return st;
}

/* An output that shares its memory with anything else (a variable's value,
 * read in the step before the step updated the variable) is copied, in the
 * recording, into a tensor of the graph's own: the recording's closing work
 * (a variable copied back where the replays read it) may overwrite the
 * memory it shares, and the step returned the values it had before. */
static nb_status snapshot_shared_outputs(nb_graph *g, nb_device *dev)
{
    for (int i = 0; i < g->n_out; i++) {
        nb_tensor *t = g->out[i];
        if (atomic_load(&t->refs) == 1 && atomic_load(&t->storage->refs) == 1)
            continue;
        nb_tensor *snap = copy_out(dev, t);
        if (!snap)
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        nb__release(t);
        g->out[i] = snap;
    }
    return NB_OK;
}

/* Records the step on a device whose backend can: g->exec and g->rec on success. */
static nb_status record(nb_graph *g, const char *who)
{
    nb_device *dev = g->dev;
    const nb_graph_kernels *k = dev->backend->graph;
    size_t pbytes = sizeof(double) * NB_CAPTURE_MAX_PARAMS;
    g->params = calloc(2 * NB_CAPTURE_MAX_PARAMS, sizeof(double));
    g->out = calloc((size_t)(g->n_out ? g->n_out : 1), sizeof *g->out);
    if (!g->params || !g->out)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    g->next = g->params + NB_CAPTURE_MAX_PARAMS;
    if (!(g->dev_params = dev->backend->alloc(dev, pbytes)))
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    nb_status st = nb_device_push(dev->name);
    if (st)
        return st;
    /* Updates write variables in place where a read holds the old value
     * (lib/core/capture.h); a step that uses that old value after the update,
     * or returns it, reaches a stale storage and is recorded once more with
     * copy-on-write updates. */
    for (int attempt = 0;; attempt++) {
        void *rec = NULL;
        if ((st = k->begin(dev, &rec)) != NB_OK)
            break;
        nb__capture *c = nb__capture_enter(dev, true, g->dev_params);
        if (c && attempt > 0)
            nb__capture_no_in_place(c);
        st = c ? run_step(g, c, g->out, who) : nb_error();
        if (st == NB_OK)
            st = snapshot_shared_outputs(g, dev);
        const bool stale = st == NB_OK && nb__capture_stale_reached(c);
        if (stale && attempt > 0) /* nothing is stale without in-place updates: never loop */
            st = nb__fail(NB_ERR_INTERNAL, "%s: the step reached a stale value in a recording with copies", who);
        const bool again = stale && attempt == 0;
        const bool kept = st == NB_OK && !again;
        if (c) /* the hooks' closing work is recorded while the stream still records */
            nb__capture_leave(c, kept);
        nb_status end = k->end(dev, rec, kept, &g->exec);
        if (st == NB_OK) /* also an abandoned recording's failure: no retry after it */
            st = end;
        if (st == NB_OK && !again) {
            g->rec = c;
            g->n_params = nb__capture_param_count(c);
            break;
        }
        for (int i = 0; i < g->n_out; i++) {
            nb__release(g->out[i]);
            g->out[i] = NULL;
        }
        if (st != NB_OK) {
            if (kept)
                nb__capture_free(c);
            break;
        }
    }
    nb_device_pop();
    return st;
}

nb_status nb_graph_capture(const char *device, nb_graph_step_fn fn, void *user, int n_inputs,
                           nb_tensor *const *inputs, int n_outputs, nb_tensor **outputs, nb_graph **out)
{
    const char *who = "nb_graph_capture";
    if (out)
        *out = NULL;
    if (!fn || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !fn ? "fn" : "out");
    if (n_inputs < 0 || n_outputs < 0 || (n_inputs > 0 && !inputs))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d inputs at %p and %d outputs", who, n_inputs,
                        (const void *)inputs, n_outputs);
    for (int i = 0; i < n_inputs; i++)
        if (!inputs[i])
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", who, i);
    if (nb__capture_current())
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: called inside a captured step on %s", who,
                        nb__capture_device(nb__capture_current())->name);
    nb_device *dev = nb__device_resolve(device, who);
    if (!dev)
        return nb_error() ? nb_error() : NB_ERR_DEVICE;

    nb_graph *g = calloc(1, sizeof *g);
    if (!g || !(g->in = calloc((size_t)(n_inputs ? n_inputs : 1), sizeof *g->in))) {
        free(g);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    *g = (nb_graph){.dev = dev, .fn = fn, .user = user, .n_in = n_inputs, .n_out = n_outputs, .in = g->in};
    nb_status st = NB_OK;
    for (int i = 0; i < n_inputs && st == NB_OK; i++) {
        const nb_tensor *x = inputs[i];
        if (!(g->in[i] = nb__tensor_new(who, dev, x->dtype, x->ndim, x->shape)))
            st = nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        else
            st = copy_into(dev, g->in[i], x);
    }
    /* Step 1's outputs are handed out only once the whole capture succeeded. */
    nb_tensor *small[8], **first = n_outputs <= 8 ? small : calloc((size_t)n_outputs, sizeof *first);
    if (!first)
        st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    bool ran = false;
    const nb_graph_kernels *k = dev->backend->graph;
    if (st == NB_OK) {
        if (k && k->prepare)
            k->prepare(dev, true);
        ran = (st = run_eager(g, first, who)) == NB_OK;
        if (k && k->prepare)
            k->prepare(dev, false);
    }
    if (st == NB_OK && dev->backend->graph)
        st = record(g, who);
    if (ran) {
        if (st == NB_OK)
            hand_out(n_outputs, first, outputs);
        else
            hand_out(n_outputs, first, NULL);
    }
    if (first != small)
        free(first);
    if (st != NB_OK) {
        nb_graph_free(g);
        return st;
    }
    *out = g;
    return NB_OK;
}

nb_status nb_graph_replay(nb_graph *g, nb_tensor *const *inputs, nb_tensor **outputs)
{
    const char *who = "nb_graph_replay";
    if (!g)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: graph is NULL", who);
    if (nb__capture_current())
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: called inside a captured step", who);
    for (int i = 0; i < g->n_in && inputs; i++) {
        const nb_tensor *x = inputs[i], *mine = g->in[i];
        if (!x)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", who, i);
        if (!nb__same_shape(x, mine) || x->dtype != mine->dtype) {
            char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
            return nb__fail(x->dtype != mine->dtype ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                            "%s: input %d is %s %s, the graph was captured with %s %s (capture a new graph for it)",
                            who, i, nb_dtype_name(x->dtype), nb__shape_str(x->ndim, x->shape, a, sizeof a),
                            nb_dtype_name(mine->dtype), nb__shape_str(mine->ndim, mine->shape, b, sizeof b));
        }
    }
    for (int i = 0; i < g->n_in && inputs; i++) {
        nb_status st = copy_into(g->dev, g->in[i], inputs[i]);
        if (st)
            return st;
    }
    if (!g->exec)
        return replay_eager(g, outputs, who);

    /* The recorded step: its host numbers, only when they changed, then the launch. */
    nb__capture_before_replay(g->rec, g->next);
    int n = g->n_params;
    bool same = g->params_sent && memcmp(g->next, g->params, sizeof(double) * (size_t)n) == 0;
    nb_status st = g->dev->backend->graph->launch(g->dev, g->exec, g->dev_params, same ? 0 : n, g->next);
    if (st) { /* some of the numbers may have reached the device: send them all next time */
        g->params_sent = false;
        return st;
    }
    if (!same) {
        memcpy(g->params, g->next, sizeof(double) * (size_t)n);
        g->params_sent = true;
    }
    nb__capture_after_replay(g->rec);
    if (!outputs)
        return NB_OK;
    /* Handed out only once every copy is made, so a failure leaves none behind. */
    for (int i = 0; i < g->n_out; i++) {
        if (!(outputs[i] = copy_out(g->dev, g->out[i]))) {
            for (int j = 0; j < i; j++) {
                nb__release(outputs[j]);
                outputs[j] = NULL;
            }
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        }
    }
    hand_out(g->n_out, outputs, outputs);
    return NB_OK;
}

bool nb_graph_recorded(const nb_graph *g) { return g && g->exec; }

int64_t nb_graph_nodes(const nb_graph *g)
{
    return g && g->exec ? g->dev->backend->graph->nodes(g->exec) : 0;
}

const char *nb_graph_device(const nb_graph *g) { return g ? g->dev->name : NULL; }

void nb_graph_free(nb_graph *g)
{
    if (!g)
        return;
    /* inside a captured step the wait for g's replays cannot be recorded: refused */
    if (nb__capture_check(NULL, "nb_graph_free", "freeing a graph"))
        return;
    if (g->exec)
        g->dev->backend->graph->destroy(g->dev, g->exec); /* waits for the replays */
    nb__capture_free(g->rec);
    if (g->dev_params)
        g->dev->backend->free(g->dev, g->dev_params, sizeof(double) * NB_CAPTURE_MAX_PARAMS);
    for (int i = 0; i < g->n_in; i++)
        nb__release(g->in[i]);
    for (int i = 0; g->out && i < g->n_out; i++)
        nb__release(g->out[i]);
    free(g->in);
    free(g->out);
    free(g->params);
    free(g);
}
