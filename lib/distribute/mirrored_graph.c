/* A mirrored strategy's training step captured (nb_mirrored_capture in
 * nabla/distribute.h): each replica's part recorded in two graphs of
 * lib/graph, the all-reduce between them run as an eager step runs it.
 *
 * Capture, on every replica thread at once (mirrored.c's dispatch):
 *   A: nb_graph_capture of the step function on the replica's share and the
 *      gradients packed into the buckets. Its step runs twice (step 1, then
 *      the recording), each time meeting the other replicas at the barrier
 *      that plans the buckets: a replica whose capture fails before meeting
 *      them meets them anyway (agreeing on failure), so none waits for ever;
 *   the all-reduce of the buckets, eagerly (step 1's);
 *   B: nb_graph_capture of the update from the reduced buckets: step 1's
 *      update, then its recording, which reads the optimizer's numbers from
 *      device doubles this file refreshes before each replay (one hook per
 *      replica, on its own recording: no optimizer state is shared between
 *      the replica threads).
 * The graph keeps each replica's bucket tensors of the recording: replays
 * all-reduce those, whatever eager steps did to the strategy's own buckets
 * meanwhile. Across processes, the capture and every replay make the calls an
 * eager step makes (the rows' handshake, the sum over the processes, the
 * loss's), so the processes may mix captured and eager steps as long as they
 * all do the same. */
#include "distribute_impl.h"
#include "lib/core/capture.h"
#include "lib/optim/optimizer_impl.h"

#include <nabla/graph.h>

#include <stdlib.h>
#include <string.h>

typedef struct part {
    nb_mirrored_graph *g;
    nb_replica_state *rs;
    nb_graph *a, *b;
    int barriers;        /* the bucket plan's barriers met during A's capture */
    bool others_failed;  /* A failed only because another replica did */
    int n_buckets;
    nb_tensor **buckets; /* the recording's bucket tensors (one reference each) */
} part;

typedef struct input_sig {
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
} input_sig;

struct nb_mirrored_graph {
    nb_mirrored *s;
    nb_variable **vars; /* the job's, owned */
    input_sig *sig;     /* per input, as captured */
    nb_step_job job;    /* what the replicas read; inputs: the current call's */
    part parts[NB_MIRRORED_MAX];
};

/* ---- A: the step function and the packing ---------------------------------------- */

static nb_status part_a(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    part *p = user;
    nb_replica_state *rs = p->rs;
    nb_step_job *j = &p->g->job;
    (void)n_in, (void)n_out;
    for (int i = 0; i < j->n_vars; i++)
        rs->grads[i] = NULL;
    rs->loss = NULL;
    bool ok = nb__step_compute_on(rs, j, in);
    p->barriers++;
    if (!nb__mirrored_barrier(rs->s, ok, nb__step_plan, j)) {
        if (!ok)
            return rs->status;
        if (nb_error()) /* the bucket plan failed on this thread */
            return nb_error();
        p->others_failed = true; /* their error is the one raised */
        return nb__fail(NB_ERR_INTERNAL, "nb_mirrored_capture: another replica failed");
    }
    if (!nb__step_pack(rs, j))
        return rs->status;
    out[0] = rs->loss;
    return NB_OK;
}

/* ---- B: the update ----------------------------------------------------------------- */

typedef struct recorded_numbers {
    nb_optimizer *opt;
    int first;
} recorded_numbers;

/* Before each replay: the numbers of the update the replay makes (the
 * optimizer's step is counted once per replay, after every replica's). */
static void numbers_fill(void *ctx, double *params)
{
    const recorded_numbers *r = ctx;
    nb__optimizer_pack(r->opt, nb__optimizer_next_step(r->opt), params + r->first);
}

static nb_status part_b(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    part *p = user;
    (void)n_in, (void)in, (void)n_out, (void)out;
    nb_step_job j = p->g->job;
    nb__capture *c = nb__capture_current();
    if (nb__capture_recording(c)) {
        recorded_numbers *r = malloc(sizeof *r);
        if (!r)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_mirrored_capture: out of host memory");
        r->opt = j.opt;
        if (!(j.device_params = nb__capture_params(c, NB_UPD_COUNT, &r->first))) {
            free(r);
            return nb_error();
        }
        static const nb__capture_hooks hooks = {.before_replay = numbers_fill, .release = free};
        nb_status st = nb__capture_hook(c, &hooks, r);
        if (st)
            return st;
    }
    return nb__step_apply(p->rs, &j) ? NB_OK : p->rs->status;
}

/* ---- capture ----------------------------------------------------------------------- */

static void capture_on_replica(nb_replica_state *rs, void *arg)
{
    nb_mirrored_graph *g = arg;
    part *p = &g->parts[rs->index];
    nb_mirrored *s = rs->s;
    *p = (part){.g = g, .rs = rs};
    nb_scope *scope = nb_scope_begin();
    nb_shares sh = {0};
    bool ok = rs->status == NB_OK && (scope || nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory"));
    ok = ok && nb__shares_init(&sh, rs, g->job.n_inputs, g->job.inputs);
    nb_tensor *loss = NULL;
    if (ok) {
        nb_status st = nb_graph_capture(rs->dev->name, part_a, p, g->job.n_inputs, sh.t, 1, &loss, &p->a);
        if (st && p->others_failed && rs->status == NB_OK) {
            nb_error_clear();
            ok = false;
        } else {
            ok = st == NB_OK || nb__replica_failed(rs, st, "capturing the step");
        }
    }
    /* The others wait at both runs' bucket plans: meet them, failing. */
    while (p->barriers < 2) {
        p->barriers++;
        nb__mirrored_barrier(s, false, NULL, NULL);
    }
    if (loss) /* step 1's, for the caller, past the replica's scope */
        nb__retain(loss);
    rs->loss = loss;
    for (int i = 0; i < g->job.n_vars; i++)
        rs->grads[i] = NULL;
    if (nb__all_reduce_buckets(rs, g->job.who, ok, s->plan.n_buckets, rs->cache.tensors, rs->cache.tensors, 1.0)) {
        nb_status st = nb_graph_capture(rs->dev->name, part_b, p, 0, NULL, 0, NULL, &p->b);
        ok = st == NB_OK || nb__replica_failed(rs, st, "capturing the update (the replicas may now differ)");
        p->n_buckets = s->plan.n_buckets;
        p->buckets = ok ? calloc((size_t)(p->n_buckets ? p->n_buckets : 1), sizeof *p->buckets) : NULL;
        if (ok && !p->buckets)
            nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int k = 0; p->buckets && k < p->n_buckets; k++) {
            nb__retain(rs->cache.tensors[k]);
            p->buckets[k] = rs->cache.tensors[k];
        }
    }
    nb__shares_free(&sh);
    if (scope)
        nb_scope_end(scope);
}

static void part_free(part *p)
{
    nb_graph_free(p->a);
    nb_graph_free(p->b);
    for (int k = 0; p->buckets && k < p->n_buckets; k++)
        nb__release(p->buckets[k]);
    free(p->buckets);
    *p = (part){0};
}

void nb_mirrored_graph_free(nb_mirrored_graph *g)
{
    if (!g)
        return;
    for (int r = 0; r < NB_MIRRORED_MAX; r++)
        part_free(&g->parts[r]);
    free(g->vars);
    free(g->sig);
    free(g);
}

/* The combined loss and the replicas' losses released; the step counted. who:
 * the public call, for messages. */
static nb_status finish_step(nb_mirrored_graph *g, const char *who, nb_status st, nb_tensor **loss)
{
    nb_mirrored *s = g->s;
    if (!st) {
        nb__optimizer_advance(g->job.opt);
        s->steps++;
        s->collective_calls += g->parts[0].n_buckets;
        s->last_buckets = g->parts[0].n_buckets;
        if (s->world)
            st = nb__mirrored_world_loss(s, who, g->job.reduction, loss);
        else if (loss && !(*loss = nb__mirrored_combine_losses(s, g->job.reduction)))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    }
    for (int r = 0; r < s->n; r++) {
        nb__release(s->reps[r].loss);
        s->reps[r].loss = NULL;
    }
    return st;
}

nb_status nb_mirrored_capture(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                              nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                              nb_reduction reduction, nb_tensor **loss, nb_mirrored_graph **out)
{
    const char *who = "nb_mirrored_capture";
    if (loss)
        *loss = NULL;
    if (out)
        *out = NULL;
    if (!out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
    nb_status st = nb__mirrored_step_check(s, opt, n_vars, vars, (const void *)fn, n_inputs, reduction, who);
    if (st)
        return st;
    nb_mirrored_graph *g = calloc(1, sizeof *g);
    if (!g || !(g->vars = malloc(sizeof *g->vars * (size_t)(n_vars ? n_vars : 1))) ||
        !(g->sig = calloc((size_t)n_inputs, sizeof *g->sig))) {
        nb_mirrored_graph_free(g);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    g->s = s;
    if (n_vars)
        memcpy(g->vars, vars, sizeof *vars * (size_t)n_vars);
    g->job = (nb_step_job){opt, n_vars, g->vars, fn, user, n_inputs, inputs, reduction, 0, NULL, who};

    pthread_mutex_lock(&s->call_lock);
    st = nb__mirrored_step_prepare(s, opt, n_vars, vars, n_inputs, inputs, reduction, who);
    for (int r = 0; r < s->n && !st; r++)
        if (s->reps[r].ctx.rows == 0)
            st = nb__fail(NB_ERR_SHAPE, "%s: a batch of %lld rows leaves replica %d (%s) none; every replica records "
                          "its part", who, (long long)s->reps[r].ctx.global_rows, r, s->devices[r]->name);
    for (int i = 0; i < n_inputs && !st; i++) {
        const nb_tensor *x = inputs[i];
        g->sig[i].dtype = x->dtype;
        g->sig[i].ndim = x->ndim;
        memcpy(g->sig[i].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    }
    if (!st) {
        g->job.step = nb__optimizer_next_step(opt);
        nb__mirrored_dispatch(s, capture_on_replica, g);
        st = nb__mirrored_raise(s, who);
        st = finish_step(g, who, st, loss);
    }
    g->job.inputs = NULL; /* the call's: each replay sets its own */
    pthread_mutex_unlock(&s->call_lock);
    if (st) {
        nb_mirrored_graph_free(g);
        return st;
    }
    *out = g;
    return NB_OK;
}

/* ---- replay ------------------------------------------------------------------------ */

static void replay_on_replica(nb_replica_state *rs, void *arg)
{
    nb_mirrored_graph *g = arg;
    part *p = &g->parts[rs->index];
    nb_scope *scope = nb_scope_begin();
    nb_shares sh = {0};
    bool ok = rs->status == NB_OK && (scope || nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory"));
    ok = ok && nb__shares_init(&sh, rs, g->job.n_inputs, g->job.inputs);
    nb_tensor *loss = NULL;
    if (ok) {
        nb_status st = nb_graph_replay(p->a, sh.t, &loss);
        ok = st == NB_OK || nb__replica_failed(rs, st, "replaying the step");
    }
    if (loss)
        nb__retain(loss);
    rs->loss = loss;
    if (nb__all_reduce_buckets(rs, g->job.who, ok, p->n_buckets, p->buckets, p->buckets, 1.0)) {
        nb_status st = nb_graph_replay(p->b, NULL, NULL);
        if (st)
            nb__replica_failed(rs, st, "replaying the update (the replicas may now differ)");
    }
    nb__shares_free(&sh);
    if (scope)
        nb_scope_end(scope);
}

nb_status nb_mirrored_graph_replay(nb_mirrored_graph *g, nb_tensor *const *inputs, nb_tensor **loss)
{
    const char *who = "nb_mirrored_graph_replay";
    if (loss)
        *loss = NULL;
    if (!g || !inputs)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !g ? "the graph" : "inputs");
    if (nb__capture_check(NULL, who, "a mirrored strategy's call"))
        return nb_error();
    for (int i = 0; i < g->job.n_inputs; i++) {
        const nb_tensor *x = inputs[i];
        const input_sig *sg = &g->sig[i];
        if (!x)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", who, i);
        bool same = x->ndim == sg->ndim && memcmp(x->shape, sg->shape, sizeof(int64_t) * (size_t)x->ndim) == 0;
        if (!same || x->dtype != sg->dtype) {
            char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
            return nb__fail(!same ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                            "%s: input %d is %s %s, the graph was captured with %s %s (capture a new graph for it)",
                            who, i, nb_dtype_name(x->dtype), nb__shape_str(x->ndim, x->shape, a, sizeof a),
                            nb_dtype_name(sg->dtype), nb__shape_str(sg->ndim, sg->shape, b, sizeof b));
        }
    }
    nb_mirrored *s = g->s;
    pthread_mutex_lock(&s->call_lock);
    /* The same rows per replica as at capture (the shapes are). */
    nb_step_job *j = &g->job;
    nb_status st = nb__mirrored_step_prepare(s, j->opt, j->n_vars, j->vars, j->n_inputs, inputs, j->reduction, who);
    if (!st) {
        j->inputs = inputs;
        j->who = who; /* the replay's failures name it, not the capture */
        nb__mirrored_dispatch(s, replay_on_replica, g);
        j->inputs = NULL;
        st = nb__mirrored_raise(s, who);
        st = finish_step(g, who, st, loss);
    }
    pthread_mutex_unlock(&s->call_lock);
    return st;
}

int64_t nb_mirrored_graph_nodes(const nb_mirrored_graph *g)
{
    int64_t n = 0;
    for (int r = 0; g && r < g->s->n; r++)
        n += nb_graph_nodes(g->parts[r].a) + nb_graph_nodes(g->parts[r].b);
    return n;
}
