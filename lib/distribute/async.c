/* The asynchronous trainer: workers on threads of their own that read the
 * shared parameters, compute gradients on their batches and update the
 * parameters without waiting for one another (nabla/async.h says what it
 * promises).
 *
 * One lock guards the master copies, the clocks and the counters. A read
 * takes a reference to every master value under the lock and copies them
 * after it: an update that lands meanwhile finds its value shared and writes a
 * new tensor (nb__variable_update_target), so a read is a snapshot and an
 * update never waits for a copy. Updates run under the lock, whole: none is
 * torn, none is lost. Across processes the masters live on the servers
 * (async_world.c) and the same two calls go there as messages. */
#include "async_impl.h"

#include "lib/core/capture.h"
#include "lib/core/recording.h"
#include "lib/optim/optimizer_impl.h"
#include "lib/variable/variable_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Records on a worker's thread that it failed (the pending error, or code
 * with the message); keeps the first. Returns false. */
static bool worker_failed(nb_async_worker *ws, nb_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool worker_failed(nb_async_worker *ws, nb_status code, const char *fmt, ...)
{
    if (ws->status == NB_OK) {
        char what[NB_REPLICA_MESSAGE / 2] = "";
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        ws->status = nb_error() ? nb_error() : code ? code : NB_ERR_INTERNAL;
        snprintf(ws->message, sizeof ws->message, "%s%s%s", what, nb_error() ? ": " : "",
                 nb_error() ? nb_error_message() : "");
    }
    nb_error_clear();
    return false;
}

/* ---- creation ------------------------------------------------------------------------ */

static nb_status pick_devices(int *n, const char *const *devices, nb_device **devs, const char *who)
{
    if (*n < 0 || *n > NB_ASYNC_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d workers is outside [0, %d]", who, *n, NB_ASYNC_MAX);
    if (devices && *n == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: a device list with n = 0 names no device", who);
    if (devices) {
        for (int w = 0; w < *n; w++)
            if (!(devs[w] = nb__device_find(devices[w], who)))
                return nb_error();
        return NB_OK;
    }
    nb_device_kind kind = nb_device_count(NB_DEVICE_GPU) > 0 ? NB_DEVICE_GPU : NB_DEVICE_CPU;
    int have = nb_device_count(kind);
    if (*n == 0)
        *n = have < NB_ASYNC_MAX ? have : NB_ASYNC_MAX;
    if (*n > have)
        return nb__fail(NB_ERR_DEVICE, "%s: %d workers asked for, but there are %d %s devices (%s)", who, *n, have,
                        kind == NB_DEVICE_GPU ? "GPU" : "CPU",
                        kind == NB_DEVICE_GPU ? "nb_set_logical_gpu_devices splits a GPU"
                                              : "nb_set_logical_cpu_devices splits the CPU");
    for (int w = 0; w < *n; w++)
        if (!(devs[w] = nb__device_find(nb_device_name(kind, w), who)))
            return nb_error();
    return NB_OK;
}

static nb_async *async_make(int n, const char *const *devices, const char *master_device, const char *who)
{
    nb_device *devs[NB_ASYNC_MAX];
    if (pick_devices(&n, devices, devs, who))
        return NULL;
    nb_device *master = master_device ? nb__device_find(master_device, who)
                        : n > 0       ? devs[0]
                                      : nb__device_find("/cpu:0", who);
    if (!master)
        return NULL;
    nb_async *a = calloc(1, sizeof *a);
    nb_async_worker *ws = calloc((size_t)(n > 0 ? n : 1), sizeof *ws);
    if (!a || !ws) {
        free(a);
        free(ws);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    a->id = nb__replica_owner_new();
    a->n = n;
    a->workers = ws;
    a->master = master;
    a->set_bound = -1;
    memcpy(a->devices, devs, sizeof *devs * (size_t)n);
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cv, NULL);
    int cpu_workers = 0;
    for (int w = 0; w < n; w++)
        cpu_workers += devs[w]->kind == NB_DEVICE_CPU;
    for (int w = 0; w < n; w++) {
        ws[w].a = a;
        ws[w].index = w;
        ws[w].dev = devs[w];
        ws[w].serial = devs[w]->kind == NB_DEVICE_CPU && cpu_workers >= nb__thread_count();
    }
    return a;
}

nb_async *nb_async_new(int n, const char *const *devices, const char *master_device)
{
    nb_async *a = async_make(n, devices, master_device, "nb_async_new");
    if (a && a->n == 0) {
        nb_async_free(a);
        return nb__fail_null(NB_ERR_DEVICE, "nb_async_new: no device for a worker");
    }
    return a;
}

nb_async *nb_async_new_world(int n, const char *const *devices, const char *master_device, int servers)
{
    const char *who = "nb_async_new_world";
    if (servers < 1)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d servers: at least one is needed", who, servers);
    nb_async *a = async_make(n, devices, master_device, who);
    if (!a)
        return NULL;
    bool world = false;
    if (nb__async_world_open(a, servers, &world, who)) {
        nb_async_free(a);
        return NULL;
    }
    a->world = world;
    if (!world && a->n == 0) {
        nb_async_free(a);
        return nb__fail_null(NB_ERR_DEVICE, "%s: no device for a worker", who);
    }
    return a;
}

static bool in_worker(const nb_async *a) { return nb__replica_strategy() == a->id; }

void nb_async_free(nb_async *a)
{
    if (!a)
        return;
    if (in_worker(a)) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_async_free: called from one of the trainer's own workers");
        return;
    }
    /* a call on another thread finishes first */
    pthread_mutex_lock(&a->lock);
    while (a->training)
        pthread_cond_wait(&a->cv, &a->lock);
    pthread_mutex_unlock(&a->lock);
    if (a->world)
        nb__async_world_free(a);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cv);
    for (int w = 0; w < a->n; w++)
        free(a->workers[w].grads);
    free(a->workers);
    free(a->masters);
    free(a);
}

int nb_async_workers(const nb_async *a) { return a ? a->n : 0; }
int nb_async_world_workers(const nb_async *a) { return !a ? 0 : a->world ? nb__async_world_workers(a) : a->n; }
bool nb_async_is_server(const nb_async *a) { return a && a->world && nb__async_world_is_server(a); }

const char *nb_async_device(const nb_async *a, int worker)
{
    return a && worker >= 0 && worker < a->n ? a->devices[worker]->name : NULL;
}

nb_status nb_async_set_staleness_bound(nb_async *a, int64_t bound)
{
    if (!a || bound < -1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_async_set_staleness_bound: %s",
                        !a ? "trainer is NULL" : "the bound must be -1 (none), 0 (synchronous) or more");
    pthread_mutex_lock(&a->lock);
    a->set_bound = bound;
    pthread_mutex_unlock(&a->lock);
    return NB_OK;
}

nb_status nb_async_set_observer(nb_async *a, nb_async_observer fn, void *user)
{
    if (!a)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_async_set_observer: trainer is NULL");
    pthread_mutex_lock(&a->lock);
    a->set_observer = fn;
    a->set_observer_user = user;
    pthread_mutex_unlock(&a->lock);
    return NB_OK;
}

nb_status nb_async_get_stats(const nb_async *a, nb_async_stats *out)
{
    if (!a || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_async_get_stats: %s is NULL", !a ? "trainer" : "out");
    nb_async *m = (nb_async *)a; /* the lock only */
    pthread_mutex_lock(&m->lock);
    *out = (nb_async_stats){.updates = a->version,
                            .gradients = a->gradients,
                            .examples = a->examples,
                            .mean_staleness = a->version ? (double)a->staleness_sum / (double)a->version : 0.0,
                            .max_staleness = a->max_staleness,
                            .waits = a->waits,
                            .seconds = (double)a->ns * 1e-9};
    pthread_mutex_unlock(&m->lock);
    return NB_OK;
}

/* ---- variables ------------------------------------------------------------------------ */

nb_variable *nb_async_variable_new(nb_async *a, const char *name, const nb_tensor *initial)
{
    const char *who = "nb_async_variable_new";
    if (!a)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: trainer is NULL", who);
    if (!initial)
        return nb_error() ? NULL : nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: initial is NULL", who);
    if (!name)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: name is NULL", who);
    if (!nb__is_floating(initial->dtype))
        return nb__fail_null(NB_ERR_DTYPE, "%s: '%s' is %s: only floating variables can be trained", who, name,
                             nb_dtype_name(initial->dtype));
    /* copy 0 is the master, copy w + 1 worker w's */
    nb_device *devs[NB_ASYNC_MAX + 1];
    devs[0] = a->master;
    memcpy(devs + 1, a->devices, sizeof *devs * (size_t)a->n);
    if (!a->world)
        return nb__variable_mirrored_new(a->id, name, a->n + 1, devs, initial, who);
    nb_scope *scope = nb_scope_begin();
    nb_tensor *same = NULL;
    nb_variable *v = NULL;
    if (scope && nb__async_world_variable(a, name, initial, &same, who) == NB_OK)
        v = nb__variable_mirrored_new(a->id, name, a->n + 1, devs, same, who);
    nb_scope_end(scope);
    return v;
}

/* ---- the shared parameters in this process -------------------------------------------------- */

/* Worker ws's copies become the masters' values (a snapshot). */
static bool pull(nb_async *a, nb_async_worker *ws, int64_t clock)
{
    if (a->world)
        return nb__async_world_pull(a, ws, clock) == NB_OK || worker_failed(ws, NB_ERR_INTERNAL, "reading the parameters");
    nb_tensor *small[16];
    nb_tensor **values = a->n_vars <= 16 ? small : malloc(sizeof *values * (size_t)a->n_vars);
    if (!values)
        return worker_failed(ws, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < a->n_vars; i++) {
        values[i] = nb__variable_value(a->masters[i]);
        nb__retain(values[i]);
    }
    ws->read_version = a->version;
    pthread_mutex_unlock(&a->lock);
    bool ok = true;
    for (int i = 0; i < a->n_vars; i++) {
        if (ok && nb_variable_assign(nb__variable_copy(a->vars[i], ws->index + 1), values[i]))
            ok = worker_failed(ws, NB_ERR_INTERNAL, "reading variable '%s'", nb_variable_name(a->vars[i]));
        nb__release(values[i]);
    }
    if (values != small)
        free(values);
    return ok;
}

void nb__async_count(nb_async *a, int worker, int64_t batch, int64_t rows, int64_t staleness, double loss)
{
    a->gradients++;
    a->examples += rows;
    a->staleness_sum += staleness;
    if (staleness > a->max_staleness)
        a->max_staleness = staleness;
    if (a->observer)
        a->observer(&(nb_async_update){worker, a->version, batch, rows, staleness, loss}, a->observer_user);
}

nb_status nb__async_apply(nb_async *a, nb_tensor *const *grads, const char *who)
{
    nb_status st = nb__optimizer_update(a->opt, a->n_vars, a->masters, grads, nb__optimizer_next_step(a->opt), who);
    if (!st) {
        nb__optimizer_advance(a->opt);
        a->version++;
    }
    return st;
}

static void release_grads(nb_async_worker *ws)
{
    for (int i = 0; i < ws->a->n_vars; i++) {
        nb__release(ws->grads[i]);
        ws->grads[i] = NULL;
    }
}

/* Bound 0: the round's gradients, weighted by rows, summed in worker order and
 * applied as one update; by the last worker of the round, under the lock. */
static bool apply_round(nb_async *a, nb_async_worker *ws, int64_t clock)
{
    int count = 0;
    int64_t rows = 0;
    for (int w = 0; w < a->n; w++)
        if (a->workers[w].round == clock) {
            count++;
            rows += a->workers[w].rows;
        }
    /* the sums are made where the masters are */
    bool pushed = nb_device_push(a->master->name) == NB_OK;
    nb_scope *scope = pushed ? nb_scope_begin() : NULL;
    bool ok = scope != NULL;
    nb_tensor *small[16];
    nb_tensor **sum = a->n_vars <= 16 ? small : calloc((size_t)a->n_vars, sizeof *sum);
    ok = ok && sum;
    double loss = 0;
    int token = nb__tapes_pause();
    for (int i = 0; ok && i < a->n_vars; i++) {
        sum[i] = NULL;
        for (int w = 0; ok && w < a->n; w++) {
            nb_async_worker *x = &a->workers[w];
            if (x->round != clock || !x->grads[i])
                continue;
            double wt = (double)x->rows / (double)rows;
            nb_tensor *g = wt == 1.0 ? x->grads[i] : nb_mul(x->grads[i], nb_scalar(x->grads[i]->dtype, wt));
            sum[i] = sum[i] ? nb_add(sum[i], g) : g;
            ok = sum[i] != NULL;
        }
    }
    for (int w = 0; w < a->n; w++)
        if (a->workers[w].round == clock)
            loss += (double)a->workers[w].rows / (double)rows * a->workers[w].loss;
    nb__tapes_resume(token);
    if (ok)
        ok = nb__async_apply(a, sum, "nb_async_train") == NB_OK;
    if (ok) {
        a->gradients += count - 1; /* the round's gradients, one update */
        nb__async_count(a, -1, clock * a->n, rows, 0, loss);
        a->rounds_done = clock + 1;
    }
    if (sum != small)
        free(sum);
    if (scope)
        nb_scope_end(scope);
    if (pushed)
        nb_device_pop();
    /* the round's gradients are spent */
    for (int w = 0; w < a->n; w++)
        if (a->workers[w].round == clock) {
            release_grads(&a->workers[w]);
            a->workers[w].round = -1;
        }
    return ok || worker_failed(ws, NB_ERR_OUT_OF_MEMORY, "applying the update of round %lld", (long long)clock);
}

/* How many workers have a batch in round clock (bound 0). */
static int round_size(const nb_async *a, int64_t clock)
{
    int64_t left = a->n_batches - clock * a->n;
    return left >= a->n ? a->n : (int)left;
}

/* Hands ws's gradients over: applied at once, or (bound 0) kept for the
 * round's update, which the round's last worker applies. */
static bool push(nb_async *a, nb_async_worker *ws, int64_t clock)
{
    const char *who = "nb_async_train";
    if (a->world) {
        int64_t staleness = 0;
        if (nb__async_world_push(a, ws, clock, &staleness))
            return worker_failed(ws, NB_ERR_INTERNAL, "sending the gradients");
        pthread_mutex_lock(&a->lock);
        a->version++; /* a worker counts its own updates */
        nb__async_count(a, ws->index, ws->batch, ws->rows, staleness, ws->loss);
        pthread_mutex_unlock(&a->lock);
        return true;
    }
    bool ok = true;
    pthread_mutex_lock(&a->lock);
    if (a->bound == 0) {
        ws->round = clock;
        if (++a->arrived == round_size(a, clock)) {
            a->arrived = 0;
            ok = apply_round(a, ws, clock);
            pthread_cond_broadcast(&a->cv);
        }
    } else {
        int64_t staleness = a->version - ws->read_version;
        nb_status st = nb__async_apply(a, ws->grads, who);
        if (st) {
            ok = worker_failed(ws, st, "applying its update");
        } else {
            nb__async_count(a, ws->index, ws->batch, ws->rows, staleness, ws->loss);
        }
    }
    pthread_mutex_unlock(&a->lock);
    return ok;
}

/* Waits until ws may start its batch number clock: bound 0, once the round
 * before was applied; bound b, once every other worker has finished batch
 * clock - b. false when another worker failed meanwhile. Under the lock. */
static bool wait_turn(nb_async *a, nb_async_worker *ws, int64_t clock)
{
    if (a->world || a->bound < 0)
        return !a->abort;
    bool waited = false;
    for (;;) {
        if (a->abort)
            return false;
        bool ready = true;
        if (a->bound == 0) {
            ready = a->rounds_done >= clock;
        } else {
            for (int w = 0; w < a->n && ready; w++)
                ready = w == ws->index || a->workers[w].clock >= clock - a->bound;
        }
        if (ready)
            return true;
        if (!waited)
            a->waits++;
        waited = true;
        pthread_cond_wait(&a->cv, &a->lock);
    }
}

/* ---- a worker's batches ------------------------------------------------------------------- */

/* Rows [start, start + rows) of every input, on ws's device. */
static bool batch_of(nb_async_worker *ws, int64_t start, int64_t rows, nb_tensor **out)
{
    nb_async *a = ws->a;
    for (int i = 0; i < a->n_inputs; i++)
        if (!(out[i] = nb__batch_rows(a->inputs[i], start, rows, ws->dev)))
            return worker_failed(ws, NB_ERR_INTERNAL, "cutting input %d", i);
    return true;
}

/* Checks what the step function gave and moves the gradients to the masters'
 * device (kept past the batch's scope). */
static bool take_results(nb_async_worker *ws, nb_tensor *loss, nb_tensor **grads)
{
    nb_async *a = ws->a;
    if (!loss)
        return worker_failed(ws, NB_ERR_INVALID_ARGUMENT, "the step function gave no loss");
    if (!nb__is_floating(loss->dtype))
        return worker_failed(ws, NB_ERR_DTYPE, "its loss is %s; a floating scalar is needed", nb_dtype_name(loss->dtype));
    if (loss->numel != 1)
        return worker_failed(ws, NB_ERR_SHAPE, "its loss has %lld elements; a scalar is needed", (long long)loss->numel);
    int token = nb__tapes_pause();
    bool ok = true;
    for (int i = 0; i < a->n_vars && ok; i++) {
        nb_tensor *g = grads[i];
        ws->grads[i] = NULL;
        if (!g)
            continue;
        nb_variable *v = a->vars[i];
        nb_shape vs = nb_variable_shape(v);
        if (g->dtype != nb_variable_dtype(v) || !nb__same_shape(g, nb__variable_value(nb__variable_copy(v, ws->index + 1)))) {
            char sg[NB_SHAPE_STR_MAX], sv[NB_SHAPE_STR_MAX];
            ok = worker_failed(ws, g->dtype != nb_variable_dtype(v) ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                               "its gradient of '%s' is %s %s, the variable %s %s", nb_variable_name(v),
                               nb_dtype_name(g->dtype), nb__shape_str(g->ndim, g->shape, sg, sizeof sg),
                               nb_dtype_name(nb_variable_dtype(v)), nb__shape_str(vs.ndim, vs.dims, sv, sizeof sv));
            break;
        }
        nb_tensor *m = g->device == a->master ? g : nb_to_device(g, a->master->name);
        if (!m) {
            ok = worker_failed(ws, NB_ERR_INTERNAL, "moving the gradient of '%s' to %s", nb_variable_name(v),
                               a->master->name);
            break;
        }
        nb__retain(m);
        ws->grads[i] = m;
    }
    nb__tapes_resume(token);
    if (ok && a->observer) {
        ws->loss = nb_tensor_item(loss);
        ok = !nb_error() || worker_failed(ws, NB_ERR_INTERNAL, "reading its loss");
    }
    return ok;
}

/* One batch: read, compute, hand over. */
static bool run_batch(nb_async_worker *ws, int64_t k, int64_t clock)
{
    nb_async *a = ws->a;
    int64_t start = k * a->batch_rows;
    int64_t rows = a->total_rows - start < a->batch_rows ? a->total_rows - start : a->batch_rows;
    ws->ctx = (struct nb_replica){ws->index, a->n, ws->dev->name, start, rows, rows};
    ws->batch = k;
    ws->loss = 0;
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        return worker_failed(ws, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    nb_tensor *small_in[16], *small_g[16];
    nb_tensor **in = a->n_inputs <= 16 ? small_in : calloc((size_t)a->n_inputs, sizeof *in);
    nb_tensor **g = a->n_vars <= 16 ? small_g : calloc((size_t)a->n_vars, sizeof *g);
    bool ok = in && g ? true : worker_failed(ws, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    ok = ok && pull(a, ws, clock) && batch_of(ws, start, rows, in);
    if (ok) {
        nb_tensor *loss = NULL;
        for (int i = 0; i < a->n_vars; i++)
            g[i] = NULL;
        nb_status st = a->fn(&ws->ctx, a->n_inputs, in, a->n_vars, a->vars, &loss, g, a->user);
        if (st || nb_error())
            ok = worker_failed(ws, st, "the step function failed");
        ok = ok && take_results(ws, loss, g);
    }
    if (ok) {
        ws->rows = rows;
        ok = push(a, ws, clock);
    }
    /* bound 0 keeps the gradients until the round's update */
    if (!ok || a->bound != 0 || a->world)
        release_grads(ws);
    if (in != small_in)
        free(in);
    if (g != small_g)
        free(g);
    nb_scope_end(scope);
    return ok;
}

static void *worker_main(void *arg)
{
    nb_async_worker *ws = arg;
    nb_async *a = ws->a;
    if (nb_device_push(ws->dev->name))
        worker_failed(ws, NB_ERR_DEVICE, "could not make %s the thread's device", ws->dev->name);
    nb__replica_enter(a->id, ws->index + 1);
    nb__thread_set_serial(ws->serial);
    int64_t clock = 0;
    for (int64_t k = ws->index; k < a->n_batches && ws->status == NB_OK; k += a->n, clock++) {
        pthread_mutex_lock(&a->lock);
        bool go = wait_turn(a, ws, clock);
        pthread_mutex_unlock(&a->lock);
        if (!go || !run_batch(ws, k, clock))
            break;
        pthread_mutex_lock(&a->lock);
        ws->clock = clock + 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->lock);
    }
    if (a->world && nb__async_world_done(a, ws))
        worker_failed(ws, NB_ERR_INTERNAL, "saying it is done");
    pthread_mutex_lock(&a->lock);
    if (ws->status) {
        a->abort = true;
    } else {
        ws->clock = INT64_MAX; /* done: the bound no longer waits for it */
    }
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->lock);
    nb_device_pop();
    nb_error_clear();
    nb__replica_leave();
    return NULL;
}

/* ---- training ------------------------------------------------------------------------------- */

static nb_status check_call(nb_async *a, nb_optimizer *opt, int n_vars, nb_variable *const *vars, nb_replica_step_fn fn,
                            int n_inputs, nb_tensor *const *inputs, int64_t batch_rows, bool server, const char *who)
{
    if (!a || !opt || (!fn && !server))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !a ? "trainer" : !opt ? "optimizer" : "fn");
    if (in_worker(a))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: called from one of the trainer's own workers", who);
    if (n_vars < 0 || (n_vars > 0 && !vars))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, n_vars < 0 ? "n_vars is negative" : "vars is NULL");
    for (int i = 0; i < n_vars; i++) {
        if (!vars[i])
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable %d is NULL", who, i);
        if (nb__variable_mirror_owner(vars[i]) != a->id)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable %d ('%s') is not this trainer's; make it with "
                            "nb_async_variable_new", who, i, nb_variable_name(vars[i]));
    }
    if (server)
        return NB_OK;
    if (batch_rows < 1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: batch_rows is %lld; a batch needs a row", who,
                        (long long)batch_rows);
    if (n_inputs < 1 || !inputs)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: training needs at least one input to cut into batches", who);
    int64_t rows = 0;
    return nb__batch_check(who, n_inputs, inputs, &rows);
}

/* Per-variable arrays of the call: the masters and every worker's gradients. */
static nb_status prepare(nb_async *a, int n_vars, nb_variable *const *vars, const char *who)
{
    size_t k = (size_t)(n_vars > 0 ? n_vars : 1);
    nb_variable **masters = realloc(a->masters, k * sizeof *masters);
    if (!masters)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    a->masters = masters;
    for (int i = 0; i < n_vars; i++)
        masters[i] = nb__variable_copy(vars[i], 0);
    for (int w = 0; w < a->n; w++) {
        nb_tensor **g = realloc(a->workers[w].grads, k * sizeof *g);
        if (!g)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        memset(g, 0, k * sizeof *g);
        a->workers[w].grads = g;
    }
    return nb__optimizer_prepare(a->opt, n_vars, masters, who);
}

/* Raises the first failed worker's error (by index) on the caller's thread. */
static nb_status raise_worker_error(nb_async *a, const char *who)
{
    for (int w = 0; w < a->n; w++) {
        nb_async_worker *ws = &a->workers[w];
        if (ws->status)
            return nb__fail(ws->status, "%s: worker %d (%s), batch %lld: %s", who, w, ws->dev->name,
                            (long long)ws->batch, ws->message);
    }
    return NB_OK;
}

/* Runs the workers of this process over the batches; the caller's thread waits. */
static nb_status run_workers(nb_async *a, const char *who)
{
    int started = 0;
    for (int w = 0; w < a->n; w++) {
        nb_async_worker *ws = &a->workers[w];
        ws->clock = 0;
        ws->round = -1;
        ws->rows = 0;
        ws->batch = w;
        ws->status = NB_OK;
        ws->message[0] = '\0';
    }
    for (; started < a->n; started++)
        if (pthread_create(&a->workers[started].thread, NULL, worker_main, &a->workers[started]) != 0)
            break;
    if (started < a->n) {
        pthread_mutex_lock(&a->lock);
        a->abort = true;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->lock);
    }
    for (int w = 0; w < started; w++)
        pthread_join(a->workers[w].thread, NULL);
    /* bound 0 after a failure: gradients of an unfinished round */
    for (int w = 0; w < a->n; w++)
        release_grads(&a->workers[w]);
    if (started < a->n)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: could not start the thread of worker %d", who, started);
    return raise_worker_error(a, who);
}

nb_status nb_async_train(nb_async *a, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                         nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs, int64_t batch_rows)
{
    const char *who = "nb_async_train";
    if (nb__capture_check(NULL, who, "an asynchronous trainer's call"))
        return nb_error();
    bool server = a && nb_async_is_server(a);
    nb_status st = check_call(a, opt, n_vars, vars, fn, n_inputs, inputs, batch_rows, server, who);
    if (st)
        return st;
    pthread_mutex_lock(&a->lock);
    bool busy = a->training;
    if (!busy) { /* the settings hold for the whole call, whatever other threads set meanwhile */
        a->training = true;
        a->bound = a->set_bound;
        a->observer = a->set_observer;
        a->observer_user = a->set_observer_user;
    }
    pthread_mutex_unlock(&a->lock);
    if (busy)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: the trainer is already training on another thread", who);

    int64_t t0 = now_ns();
    a->opt = opt;
    a->n_vars = n_vars;
    a->vars = vars;
    a->fn = fn;
    a->user = user;
    a->n_inputs = n_inputs;
    a->inputs = inputs;
    a->batch_rows = batch_rows;
    a->total_rows = server ? 0 : inputs[0]->shape[0];
    a->n_batches = server ? 0 : (a->total_rows + batch_rows - 1) / batch_rows;
    a->abort = false;
    a->rounds_done = 0;
    a->arrived = 0;
    st = prepare(a, n_vars, vars, who);
    if (!st && a->world)
        st = nb__async_world_begin(a, who);
    if (!st && server) {
        st = nb__async_world_serve(a, who);
    } else if (!st) {
        if (!a->world && a->n_batches == 0)
            st = nb__fail(NB_ERR_SHAPE, "%s: the inputs have no rows", who);
        else
            st = run_workers(a, who);
        if (a->world) {
            nb_status fin = nb__async_world_finish(a, st == NB_OK, who);
            st = st ? st : fin;
        }
    }
    pthread_mutex_lock(&a->lock);
    a->ns += now_ns() - t0;
    a->training = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->lock);
    return st;
}
