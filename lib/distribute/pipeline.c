/* Pipeline parallelism: stage threads, the GPipe and 1F1B schedules, and the
 * mailboxes the stages pass activations and gradients through.
 *
 * Each stage has a host thread for the pipeline's life, with its device pushed
 * (and, for CPU stages that fill the cores, its kernels kept to itself, as
 * the mirrored strategy's replicas do). A call hands one job to every stage
 * thread and waits for all. Within the job a stage runs its schedule: a
 * forward records the stage function on a tape of its own, stops the tape (so
 * the next micro-batch is not recorded on it) and posts the output to the next
 * stage; a backward takes the tape's gradient seeded with what the next stage
 * posted back (the last stage: the micro-batch's weight) and posts the
 * gradient of its input to the previous stage. Mailboxes are per link and per
 * micro-batch, so a post never waits: capacity M bounds them. A failure sets
 * the abort flag and wakes every waiter, so each stage stops where it is: the
 * call never hangs and the caller sees the failing stage's error. */
#include "distribute_impl.h"
#include "lib/core/capture.h"
#include "lib/variable/variable_impl.h"
#include "tape/sources.h"

#include <nabla/pipeline.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STAGE_MESSAGE 1024

struct nb_stage {
    int index, count, micro_batch, micro_batches;
    int64_t rows;
    const char *device;
    struct stage_state *ss;
};

/* What a stage holds of one micro-batch between its forward and backward. */
typedef struct held {
    nb_tape *tape;
    nb_tensor *x; /* its input, watched (stages after the first); one reference of ours */
    nb_tensor *y; /* its output; one reference of ours */
} held;

typedef struct stage_state {
    nb_pipeline *p;
    int index;
    nb_device *dev;
    pthread_t thread;
    bool started;
    bool serial; /* its kernels keep to its thread */
    nb_stage_fn fn;
    void *user;
    int n_vars;
    nb_variable **vars;
    nb_stage ctx;
    /* the current call */
    nb_status status;
    int failed_mb;
    char message[STAGE_MESSAGE];
    held *held;            /* per micro-batch */
    nb_tensor **acc;       /* per variable: the gradient so far (our reference) */
    nb_tensor *loss;       /* last stage: the weighted loss so far (our reference) */
    nb_tensor **in_cache;  /* per input: the current micro-batch's rows here (our reference) */
    int64_t busy_ns;
    int in_flight, peak;
} stage_state;

struct nb_pipeline {
    int n;
    nb_device *devices[NB_PIPELINE_MAX_STAGES];
    stage_state *stages;
    nb_pipeline_schedule schedule;

    /* handing jobs to the stage threads */
    pthread_mutex_t lock;
    pthread_cond_t work_cv, done_cv;
    uint64_t generation;
    int remaining;
    bool quit;
    pthread_mutex_t call_lock; /* one call at a time; free waits on it */

    /* the mailboxes of the current call: link s carries stage s's output to
     * s + 1 (act) and the gradient of stage s + 1's input back (grad), one
     * slot per micro-batch; a slot is ready once posted (a posted gradient
     * may be NULL: nothing flowed back) */
    pthread_mutex_t mail_lock;
    pthread_cond_t mail_cv;
    bool abort;
    nb_tensor **act, **grad;
    bool *act_ready, *grad_ready;

    /* the current call */
    int m;
    int n_inputs;
    nb_tensor *const *inputs;
    nb_reduction reduction;
    int64_t batch;
    int64_t *mb_start, *mb_rows;

    nb_pipeline_stats stats;
};

/* The pipeline whose stage the calling thread runs (NULL elsewhere): a call
 * into it from there would wait for itself. */
static _Thread_local const nb_pipeline *tl_pipeline;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- failing and waiting ---------------------------------------------------------- */

/* Records on the stage's thread that it failed on micro-batch mb (the pending
 * error, or code and the message), then stops every stage. Returns false. */
static bool stage_failed(stage_state *ss, int mb, nb_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool stage_failed(stage_state *ss, int mb, nb_status code, const char *fmt, ...)
{
    if (ss->status == NB_OK) {
        char what[STAGE_MESSAGE / 2] = "";
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        ss->failed_mb = mb;
        if (nb_error()) {
            ss->status = nb_error();
            snprintf(ss->message, sizeof ss->message, "%s%s%s", what, what[0] ? ": " : "", nb_error_message());
        } else {
            ss->status = code ? code : NB_ERR_INTERNAL;
            snprintf(ss->message, sizeof ss->message, "%s", what[0] ? what : "failed");
        }
    }
    nb_error_clear();
    nb_pipeline *p = ss->p;
    pthread_mutex_lock(&p->mail_lock);
    p->abort = true;
    pthread_cond_broadcast(&p->mail_cv);
    pthread_mutex_unlock(&p->mail_lock);
    return false;
}

/* Posts t (one reference, now the mailbox's; NULL allowed) to a slot. */
static void post(nb_pipeline *p, nb_tensor **slot, bool *ready, nb_tensor *t)
{
    pthread_mutex_lock(&p->mail_lock);
    *slot = t;
    *ready = true;
    pthread_cond_broadcast(&p->mail_cv);
    pthread_mutex_unlock(&p->mail_lock);
}

/* Waits for a slot to be posted and takes what it holds (the reference comes
 * with it). false when the call was aborted first. */
static bool take(nb_pipeline *p, nb_tensor **slot, bool *ready, nb_tensor **out)
{
    pthread_mutex_lock(&p->mail_lock);
    while (!*ready && !p->abort)
        pthread_cond_wait(&p->mail_cv, &p->mail_lock);
    bool got = *ready && !p->abort;
    if (got) {
        *out = *slot;
        *slot = NULL;
    }
    pthread_mutex_unlock(&p->mail_lock);
    return got;
}

/* ---- the stage context ------------------------------------------------------------ */

int nb_stage_index(const nb_stage *st) { return st ? st->index : -1; }
int nb_stage_count(const nb_stage *st) { return st ? st->count : 0; }
int nb_stage_micro_batch(const nb_stage *st) { return st ? st->micro_batch : -1; }
int nb_stage_micro_batches(const nb_stage *st) { return st ? st->micro_batches : 0; }
int64_t nb_stage_rows(const nb_stage *st) { return st ? st->rows : 0; }
const char *nb_stage_device(const nb_stage *st) { return st ? st->device : NULL; }

nb_tensor *nb_stage_input(nb_stage *st, int k)
{
    const char *who = "nb_stage_input";
    if (!st)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: stage is NULL", who);
    stage_state *ss = st->ss;
    nb_pipeline *p = ss->p;
    if (k < 0 || k >= p->n_inputs)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: input %d is outside [0, %d)", who, k, p->n_inputs);
    if (ss->in_cache[k])
        return ss->in_cache[k];
    /* The pipeline keeps it, whatever scope the stage function has open. */
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        return NULL;
    nb_tensor *t = nb__batch_rows(p->inputs[k], p->mb_start[st->micro_batch], st->rows, ss->dev);
    nb__retain(t);
    nb_scope_end(scope);
    ss->in_cache[k] = t;
    return t;
}

static void clear_inputs(stage_state *ss)
{
    for (int k = 0; k < ss->p->n_inputs; k++) {
        nb__release(ss->in_cache[k]);
        ss->in_cache[k] = NULL;
    }
}

/* ---- one micro-batch forward and backward ---------------------------------------------- */

static size_t link_slot(const nb_pipeline *p, int s, int mb) { return (size_t)s * (size_t)p->m + (size_t)mb; }

static bool forward(stage_state *ss, int mb)
{
    nb_pipeline *p = ss->p;
    int s = ss->index;
    bool last = s == p->n - 1;
    held *h = &ss->held[mb];
    nb_tensor *x = NULL;
    int64_t t0 = now_ns();
    if (s > 0) {
        nb_tensor *in = NULL;
        size_t k = link_slot(p, s - 1, mb);
        if (!take(p, &p->act[k], &p->act_ready[k], &in))
            return false; /* another stage failed */
        t0 = now_ns(); /* waiting is not work */
        x = nb_to_device(in, ss->dev->name);
        nb__retain(x);
        nb__release(in);
        if (!x)
            return stage_failed(ss, mb, NB_ERR_DEVICE, "copying stage %d's output to %s", s - 1, ss->dev->name);
    }
    clear_inputs(ss);
    ss->ctx.micro_batch = mb;
    ss->ctx.rows = p->mb_rows[mb];
    if (s == 0) {
        x = nb_stage_input(&ss->ctx, 0);
        nb__retain(x);
        if (!x)
            return stage_failed(ss, mb, NB_ERR_INTERNAL, "splitting input 0");
    }
    h->x = x;
    h->tape = nb_tape_begin();
    if (!h->tape)
        return stage_failed(ss, mb, NB_ERR_OUT_OF_MEMORY, "beginning its tape");
    if (s > 0 && nb_tape_watch(h->tape, x))
        return stage_failed(ss, mb, NB_ERR_DTYPE, "stage %d's output cannot carry a gradient", s - 1);
    /* The function's temporaries go when it is done; the tape keeps what it saved. */
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        return stage_failed(ss, mb, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    nb_tensor *y = NULL;
    nb_status st = ss->fn(&ss->ctx, x, &y, ss->user);
    nb_tape_stop(h->tape);
    bool ok = true;
    char sh[NB_SHAPE_STR_MAX] = "";
    if (st || nb_error()) {
        ok = stage_failed(ss, mb, st, "the stage function failed");
    } else if (!y) {
        ok = stage_failed(ss, mb, NB_ERR_INVALID_ARGUMENT, "the stage function gave no output");
    } else if (!nb__is_floating(y->dtype) || (last && y->numel != 1)) {
        ok = stage_failed(ss, mb, !nb__is_floating(y->dtype) ? NB_ERR_DTYPE : NB_ERR_SHAPE,
                          last ? "the last stage's output must be a floating scalar (the loss); it gave %s %s"
                               : "a stage's output must be floating to carry a gradient; it gave %s %s",
                          nb_dtype_name(y->dtype), nb__shape_str(y->ndim, y->shape, sh, sizeof sh));
    }
    if (ok) {
        nb__retain(y);
        h->y = y;
    }
    nb_scope_end(scope);
    if (!ok)
        return false;
    if (++ss->in_flight > ss->peak)
        ss->peak = ss->in_flight;
    if (last) {
        /* loss += w_m * y_m, in f64, in micro-batch order */
        double w = p->reduction == NB_REDUCE_MEAN ? (double)p->mb_rows[mb] / (double)p->batch : 1.0;
        nb_scope *ls = nb_scope_begin();
        nb_tensor *term = ls ? nb_mul_scalar(nb_reshape(nb_cast(y, NB_F64), NB_SCALAR), w) : NULL;
        nb_tensor *sum = term && ss->loss ? nb_add(ss->loss, term) : term;
        nb__retain(sum);
        if (ls)
            nb_scope_end(ls);
        if (!sum)
            return stage_failed(ss, mb, NB_ERR_INTERNAL, "adding up the loss");
        nb__release(ss->loss);
        ss->loss = sum;
    } else {
        size_t k = link_slot(p, s, mb);
        nb__retain(y); /* the mailbox's reference */
        post(p, &p->act[k], &p->act_ready[k], y);
    }
    ss->busy_ns += now_ns() - t0;
    return true;
}

/* Lets go of what the stage held for micro-batch mb. */
static void drop(held *h)
{
    nb_tape_free(h->tape);
    nb__release(h->x);
    nb__release(h->y);
    *h = (held){0};
}

/* Adds g to the gradient of variable i so far (both on the stage's device). */
static bool accumulate(stage_state *ss, int i, nb_tensor *g)
{
    nb_tensor *sum = ss->acc[i] ? nb_add(ss->acc[i], g) : g;
    if (!sum)
        return false;
    nb__retain(sum);
    nb__release(ss->acc[i]);
    ss->acc[i] = sum;
    return true;
}

static bool backward(stage_state *ss, int mb)
{
    nb_pipeline *p = ss->p;
    int s = ss->index;
    bool last = s == p->n - 1;
    held *h = &ss->held[mb];
    nb_tensor *from_next = NULL;
    if (!last) {
        size_t k = link_slot(p, s, mb);
        if (!take(p, &p->grad[k], &p->grad_ready[k], &from_next))
            return false;
    }
    int64_t t0 = now_ns();
    nb_scope *scope = nb_scope_begin();
    if (!scope) {
        nb__release(from_next);
        return stage_failed(ss, mb, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    bool ok = true;
    nb_tensor *seed = NULL;
    if (last) {
        double w = p->reduction == NB_REDUCE_MEAN ? (double)p->mb_rows[mb] / (double)p->batch : 1.0;
        seed = nb__full_on("nb_pipeline_gradients", ss->dev, h->y->dtype, h->y->ndim, h->y->shape, w);
    } else if (from_next) {
        seed = nb_to_device(from_next, ss->dev->name);
    }
    nb__release(from_next);
    if ((last || from_next) && !seed)
        ok = stage_failed(ss, mb, NB_ERR_INTERNAL, "preparing the output gradient");
    /* Sources: the input (stages after the first), then every variable this
     * micro-batch's tape saw read. Nothing flowed back: no gradient at all. */
    uint64_t small_ids[17];
    int small_of[17];
    nb_tensor *small_out[17];
    int n_src = (s > 0) + ss->n_vars;
    uint64_t *ids = n_src <= 17 ? small_ids : malloc(sizeof *ids * (size_t)n_src);
    int *var_of = n_src <= 17 ? small_of : malloc(sizeof *var_of * (size_t)n_src);
    nb_tensor **out = n_src <= 17 ? small_out : malloc(sizeof *out * (size_t)n_src);
    if (ok && (!ids || !var_of || !out))
        ok = stage_failed(ss, mb, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    nb_tensor *dx = NULL;
    if (ok && seed) {
        int n = 0;
        if (s > 0) {
            ids[n] = h->x->id;
            var_of[n++] = -1;
        }
        for (int i = 0; i < ss->n_vars; i++) {
            uint64_t id = nb__tape_read_id(h->tape, ss->vars[i]);
            if (id) {
                ids[n] = id;
                var_of[n++] = i;
            }
        }
        nb_status st = nb__tape_gradient_ids(h->tape, h->y, seed, n, ids, NULL, out, NB_UNCONNECTED_NULL);
        if (st)
            ok = stage_failed(ss, mb, st, "its backward pass failed");
        for (int j = 0; j < n && ok; j++) {
            if (!out[j])
                continue;
            if (var_of[j] < 0)
                dx = out[j];
            else if (!accumulate(ss, var_of[j], out[j]))
                ok = stage_failed(ss, mb, NB_ERR_INTERNAL, "adding up the gradient of '%s'",
                                  nb_variable_name(ss->vars[var_of[j]]));
        }
    }
    if (ids != small_ids)
        free(ids);
    if (var_of != small_of)
        free(var_of);
    if (out != small_out)
        free(out);
    if (ok && s > 0) {
        nb__retain(dx); /* the mailbox's reference; NULL: nothing flows further back */
        size_t k = link_slot(p, s - 1, mb);
        post(p, &p->grad[k], &p->grad_ready[k], dx);
    }
    nb_scope_end(scope);
    drop(h);
    ss->in_flight--;
    ss->busy_ns += now_ns() - t0;
    return ok;
}

/* ---- the schedules --------------------------------------------------------------------- */

/* The stage's part of one call: GPipe runs every forward, then every backward;
 * 1F1B warms up with S-1-s forwards, then alternates, then drains. Backwards
 * go in micro-batch order under both, so the sums come out the same. */
static void run_stage(stage_state *ss)
{
    nb_pipeline *p = ss->p;
    int m = p->m, s = ss->index;
    bool ok = true;
    if (p->schedule == NB_PIPELINE_GPIPE) {
        for (int i = 0; i < m && ok; i++)
            ok = forward(ss, i);
        for (int i = 0; i < m && ok; i++)
            ok = backward(ss, i);
    } else {
        int warm = p->n - 1 - s < m ? p->n - 1 - s : m;
        int f = 0, b = 0;
        while (f < warm && ok)
            ok = forward(ss, f++);
        while (f < m && ok) {
            ok = forward(ss, f++);
            if (ok)
                ok = backward(ss, b++);
        }
        while (b < m && ok)
            ok = backward(ss, b++);
    }
}

static void stage_job(stage_state *ss)
{
    nb_pipeline *p = ss->p;
    ss->status = NB_OK;
    ss->message[0] = '\0';
    ss->failed_mb = -1;
    ss->busy_ns = 0;
    ss->in_flight = ss->peak = 0;
    ss->loss = NULL;
    ss->ctx.micro_batches = p->m;
    nb_error_clear();
    size_t m = (size_t)p->m;
    ss->held = calloc(m, sizeof *ss->held);
    ss->acc = calloc(ss->n_vars ? (size_t)ss->n_vars : 1, sizeof *ss->acc);
    ss->in_cache = calloc((size_t)p->n_inputs, sizeof *ss->in_cache);
    nb_scope *scope = nb_scope_begin();
    if (!ss->held || !ss->acc || !ss->in_cache || !scope)
        stage_failed(ss, -1, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    else
        run_stage(ss);
    if (nb_error())
        stage_failed(ss, ss->ctx.micro_batch, nb_error(), "%s", "");
    for (size_t i = 0; ss->held && i < m; i++)
        drop(&ss->held[i]);
    if (ss->in_cache)
        clear_inputs(ss);
    if (scope)
        nb_scope_end(scope);
    free(ss->held);
    free(ss->in_cache);
    ss->held = NULL;
    ss->in_cache = NULL;
    /* acc and loss stay for the caller, who takes or releases them. */
}

/* ---- stage threads ------------------------------------------------------------------------ */

static void *stage_main(void *arg)
{
    stage_state *ss = arg;
    nb_pipeline *p = ss->p;
    bool pushed = nb_device_push(ss->dev->name) == NB_OK;
    nb_error_clear();
    nb__thread_set_serial(ss->serial);
    tl_pipeline = p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->generation == seen && !p->quit)
            pthread_cond_wait(&p->work_cv, &p->lock);
        if (p->quit)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);
        if (pushed) {
            stage_job(ss);
        } else {
            ss->acc = NULL;
            ss->loss = NULL;
            ss->status = NB_ERR_DEVICE;
            ss->failed_mb = -1;
            snprintf(ss->message, sizeof ss->message, "could not make %s the thread's device", ss->dev->name);
            pthread_mutex_lock(&p->mail_lock);
            p->abort = true;
            pthread_cond_broadcast(&p->mail_cv);
            pthread_mutex_unlock(&p->mail_lock);
        }
        pthread_mutex_lock(&p->lock);
        if (--p->remaining == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->lock);
    if (pushed)
        nb_device_pop();
    return NULL;
}

/* ---- creation --------------------------------------------------------------------------- */

static void pipeline_destroy(nb_pipeline *p)
{
    pthread_mutex_lock(&p->lock);
    p->quit = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->lock);
    for (int s = 0; s < p->n; s++) {
        stage_state *ss = &p->stages[s];
        if (ss->started)
            pthread_join(ss->thread, NULL);
        free(ss->vars);
    }
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->call_lock);
    pthread_mutex_destroy(&p->mail_lock);
    pthread_cond_destroy(&p->mail_cv);
    free(p->stages);
    free(p);
}

nb_pipeline *nb_pipeline_new(int n_stages, const char *const *devices)
{
    const char *who = "nb_pipeline_new";
    if (n_stages < 1 || n_stages > NB_PIPELINE_MAX_STAGES)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d stages is outside [1, %d]", who, n_stages,
                             NB_PIPELINE_MAX_STAGES);
    if (!devices)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the device list is NULL", who);
    nb_device *devs[NB_PIPELINE_MAX_STAGES];
    for (int s = 0; s < n_stages; s++) {
        if (!devices[s])
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the device of stage %d is NULL", who, s);
        if (!(devs[s] = nb__device_find(devices[s], who)))
            return NULL;
    }
    nb_pipeline *p = calloc(1, sizeof *p);
    stage_state *stages = calloc((size_t)n_stages, sizeof *stages);
    if (!p || !stages) {
        free(p);
        free(stages);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    p->n = n_stages;
    p->stages = stages;
    p->schedule = NB_PIPELINE_GPIPE;
    memcpy(p->devices, devs, sizeof *devs * (size_t)n_stages);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    pthread_mutex_init(&p->call_lock, NULL);
    pthread_mutex_init(&p->mail_lock, NULL);
    pthread_cond_init(&p->mail_cv, NULL);
    /* CPU stages that fill the cores each keep their kernels to their own thread. */
    int cpu_stages = 0;
    for (int s = 0; s < n_stages; s++)
        cpu_stages += devs[s]->kind == NB_DEVICE_CPU;
    for (int s = 0; s < n_stages; s++) {
        stage_state *ss = &stages[s];
        ss->p = p;
        ss->index = s;
        ss->dev = devs[s];
        ss->serial = devs[s]->kind == NB_DEVICE_CPU && cpu_stages >= nb__thread_count();
        ss->ctx = (nb_stage){.index = s, .count = n_stages, .device = devs[s]->name, .ss = ss};
    }
    for (int s = 0; s < n_stages; s++) {
        if (pthread_create(&stages[s].thread, NULL, stage_main, &stages[s]) != 0) {
            pipeline_destroy(p);
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: could not start the thread of stage %d", who, s);
        }
        stages[s].started = true;
    }
    return p;
}

/* Fails (and returns true) when called from one of p's stage threads. */
static bool called_from_stage(const nb_pipeline *p, const char *who)
{
    if (tl_pipeline != p)
        return false;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: called from inside a stage function of the same pipeline", who);
    return true;
}

void nb_pipeline_free(nb_pipeline *p)
{
    if (!p || called_from_stage(p, "nb_pipeline_free"))
        return;
    pthread_mutex_lock(&p->call_lock); /* a call on another thread finishes first */
    pthread_mutex_unlock(&p->call_lock);
    pipeline_destroy(p);
}

int nb_pipeline_stages(const nb_pipeline *p) { return p ? p->n : 0; }

const char *nb_pipeline_device(const nb_pipeline *p, int stage)
{
    return p && stage >= 0 && stage < p->n ? p->devices[stage]->name : NULL;
}

nb_status nb_pipeline_set_stage(nb_pipeline *p, int stage, nb_stage_fn fn, void *user, int n_vars,
                                nb_variable *const *vars)
{
    const char *who = "nb_pipeline_set_stage";
    if (!p || !fn)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !p ? "pipeline" : "the stage function");
    if (stage < 0 || stage >= p->n)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stage %d is outside [0, %d)", who, stage, p->n);
    if (n_vars < 0 || (n_vars > 0 && !vars))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, n_vars < 0 ? "n_vars is negative" : "vars is NULL");
    if (called_from_stage(p, who))
        return NB_ERR_INVALID_ARGUMENT;
    const char *dev = p->devices[stage]->name;
    for (int i = 0; i < n_vars; i++) {
        nb_variable *v = vars[i];
        if (!v)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stage %d's variable %d is NULL", who, stage, i);
        const char *name = nb_variable_name(v);
        if (nb_variable_replicas(v) > 0)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stage %d's variable '%s' is a mirrored variable", who,
                            stage, name);
        if (!nb__is_floating(nb_variable_dtype(v)))
            return nb__fail(NB_ERR_DTYPE, "%s: stage %d's variable '%s' is %s: only floating variables can be trained",
                            who, stage, name, nb_dtype_name(nb_variable_dtype(v)));
        if (strcmp(nb_variable_device(v), dev) != 0)
            return nb__fail(NB_ERR_DEVICE, "%s: stage %d runs on %s but its variable '%s' is on %s", who, stage, dev,
                            name, nb_variable_device(v));
        for (int j = 0; j < i; j++)
            if (vars[j] == v)
                return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stage %d is given variable '%s' twice", who, stage, name);
    }
    nb_variable **copy = malloc(sizeof *copy * (size_t)(n_vars ? n_vars : 1));
    if (!copy)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    if (n_vars)
        memcpy(copy, vars, sizeof *copy * (size_t)n_vars);
    /* The other stages' variables are read under the lock that guards them. */
    pthread_mutex_lock(&p->call_lock);
    for (int i = 0; i < n_vars; i++)
        for (int s = 0; s < p->n; s++)
            for (int j = 0; j < p->stages[s].n_vars && s != stage; j++)
                if (p->stages[s].vars[j] == vars[i]) {
                    pthread_mutex_unlock(&p->call_lock);
                    free(copy);
                    return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable '%s' already belongs to stage %d", who,
                                    nb_variable_name(vars[i]), s);
                }
    stage_state *ss = &p->stages[stage];
    free(ss->vars);
    ss->vars = copy;
    ss->n_vars = n_vars;
    ss->fn = fn;
    ss->user = user;
    pthread_mutex_unlock(&p->call_lock);
    return NB_OK;
}

nb_status nb_pipeline_set_schedule(nb_pipeline *p, nb_pipeline_schedule schedule)
{
    if (!p || (schedule != NB_PIPELINE_GPIPE && schedule != NB_PIPELINE_1F1B))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_pipeline_set_schedule: %s",
                        !p ? "pipeline is NULL" : "unknown schedule");
    pthread_mutex_lock(&p->call_lock);
    p->schedule = schedule;
    pthread_mutex_unlock(&p->call_lock);
    return NB_OK;
}

int nb_pipeline_variables(const nb_pipeline *p, nb_variable **out, int cap)
{
    if (!p)
        return 0;
    int n = 0;
    for (int s = 0; s < p->n; s++)
        for (int i = 0; i < p->stages[s].n_vars; i++, n++)
            if (out && n < cap)
                out[n] = p->stages[s].vars[i];
    return n;
}

nb_status nb_pipeline_get_stats(const nb_pipeline *p, nb_pipeline_stats *out)
{
    if (!p || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_pipeline_get_stats: %s is NULL", !p ? "pipeline" : "out");
    *out = p->stats;
    return NB_OK;
}

/* ---- a call ---------------------------------------------------------------------------------- */

/* Checks the inputs and splits the batch into micro-batches of consecutive rows. */
static nb_status split(nb_pipeline *p, const char *who, int m, int n_inputs, nb_tensor *const *inputs)
{
    if (n_inputs < 1 || !inputs)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who,
                        n_inputs < 1 ? "a call needs at least one input to split" : "inputs is NULL");
    int64_t b = 0;
    nb_status st = nb__batch_check(who, n_inputs, inputs, &b);
    if (st)
        return st;
    if (m < 1 || m > b)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d micro-batches of a batch of %lld rows (each needs a row)",
                        who, m, (long long)b);
    p->m = m;
    p->n_inputs = n_inputs;
    p->inputs = inputs;
    p->batch = b;
    int64_t start = 0;
    for (int i = 0; i < m; i++) {
        p->mb_start[i] = start;
        p->mb_rows[i] = b / m + (i < b % m ? 1 : 0);
        start += p->mb_rows[i];
    }
    return NB_OK;
}

/* Hands one job to every stage thread and waits for all. */
static void dispatch(nb_pipeline *p)
{
    pthread_mutex_lock(&p->lock);
    p->remaining = p->n;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    while (p->remaining > 0)
        pthread_cond_wait(&p->done_cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* The per-call arrays: mailboxes (S links by M micro-batches) and the split. */
static nb_status call_arrays(nb_pipeline *p, int m, const char *who)
{
    size_t slots = (size_t)p->n * (size_t)m;
    p->act = calloc(slots, sizeof *p->act);
    p->grad = calloc(slots, sizeof *p->grad);
    p->act_ready = calloc(slots, sizeof *p->act_ready);
    p->grad_ready = calloc(slots, sizeof *p->grad_ready);
    p->mb_start = calloc((size_t)m, sizeof *p->mb_start);
    p->mb_rows = calloc((size_t)m, sizeof *p->mb_rows);
    if (!p->act || !p->grad || !p->act_ready || !p->grad_ready || !p->mb_start || !p->mb_rows)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for %d micro-batches", who, m);
    return NB_OK;
}

static void free_call_arrays(nb_pipeline *p)
{
    size_t slots = (size_t)p->n * (size_t)p->m;
    for (size_t i = 0; p->act && i < slots; i++)
        nb__release(p->act[i]); /* posted but not taken: the call was aborted */
    for (size_t i = 0; p->grad && i < slots; i++)
        nb__release(p->grad[i]);
    free(p->act);
    free(p->grad);
    free(p->act_ready);
    free(p->grad_ready);
    free(p->mb_start);
    free(p->mb_rows);
    p->act = p->grad = NULL;
    p->act_ready = p->grad_ready = NULL;
    p->mb_start = p->mb_rows = NULL;
}

/* Raises the error of the first stage that failed, naming it. */
static nb_status raise_stage_error(nb_pipeline *p, const char *who)
{
    for (int s = 0; s < p->n; s++) {
        stage_state *ss = &p->stages[s];
        if (!ss->status)
            continue;
        if (ss->failed_mb >= 0)
            return nb__fail(ss->status, "%s: stage %d (%s), micro-batch %d: %s", who, s, ss->dev->name,
                            ss->failed_mb, ss->message);
        return nb__fail(ss->status, "%s: stage %d (%s): %s", who, s, ss->dev->name, ss->message);
    }
    return NB_OK;
}

/* Gives the stages' results to the caller's scope (grads in stage order, the
 * loss on the caller's device), or releases them after a failure. */
static nb_status hand_out(nb_pipeline *p, nb_status st, nb_tensor **loss, nb_tensor **grads)
{
    int k = 0;
    for (int s = 0; s < p->n; s++) {
        stage_state *ss = &p->stages[s];
        for (int i = 0; i < ss->n_vars; i++, k++) {
            nb_tensor *g = ss->acc ? ss->acc[i] : NULL;
            if (st || !g)
                nb__release(g);
            else if (!(grads[k] = nb__own(g)))
                st = nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        }
        free(ss->acc);
        ss->acc = NULL;
    }
    stage_state *last = &p->stages[p->n - 1];
    nb_tensor *l = last->loss;
    last->loss = NULL;
    if (!st && loss) {
        nb_tensor *mine = nb__own(l);
        if (!mine || !(*loss = nb_to_device(mine, nb_device_current())))
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    } else {
        nb__release(l);
    }
    if (st) {
        if (loss)
            *loss = NULL;
        for (int i = 0; i < k; i++)
            grads[i] = NULL; /* those handed out already belong to the scope */
    }
    return st;
}

static nb_status run_call(nb_pipeline *p, const char *who, int micro_batches, int n_inputs, nb_tensor *const *inputs,
                          nb_reduction reduction, nb_tensor **loss, nb_tensor **grads)
{
    for (int s = 0; s < p->n; s++)
        if (!p->stages[s].fn)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: stage %d (%s) has no function (nb_pipeline_set_stage)", who,
                            s, p->devices[s]->name);
    nb_status st = micro_batches < 1
                       ? nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d micro-batches; at least 1", who, micro_batches)
                       : call_arrays(p, micro_batches, who);
    if (!st)
        st = split(p, who, micro_batches, n_inputs, inputs);
    if (st) {
        p->m = 0;
        free_call_arrays(p);
        return st;
    }
    p->reduction = reduction;
    p->abort = false;
    int64_t t0 = now_ns();
    dispatch(p);
    int64_t wall = now_ns() - t0;
    st = raise_stage_error(p, who);
    st = hand_out(p, st, loss, grads);
    free_call_arrays(p);
    if (!st) {
        nb_pipeline_stats *t = &p->stats;
        t->steps++;
        t->stages = p->n;
        t->micro_batches = p->m;
        t->schedule = p->schedule;
        t->wall_seconds = (double)wall * 1e-9;
        double busy = 0;
        for (int s = 0; s < p->n; s++) {
            t->stage_busy_seconds[s] = (double)p->stages[s].busy_ns * 1e-9;
            t->stage_peak_in_flight[s] = p->stages[s].peak;
            busy += t->stage_busy_seconds[s];
        }
        t->bubble = wall > 0 ? 1.0 - busy / p->n / t->wall_seconds : 0.0;
        t->ideal_bubble = (double)(p->n - 1) / (double)(p->m + p->n - 1);
    }
    return st;
}

/* The checks both entry points make before taking the call lock. */
static nb_status check_call(nb_pipeline *p, const char *who, nb_reduction reduction, nb_tensor **grads, bool need_grads)
{
    if (nb__capture_check(NULL, who, "a pipeline's call"))
        return nb_error();
    if (!p)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: pipeline is NULL", who);
    if (need_grads && !grads && nb_pipeline_variables(p, NULL, 0) > 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: grads is NULL", who);
    if (reduction != NB_REDUCE_SUM && reduction != NB_REDUCE_MEAN)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", who, (int)reduction);
    if (called_from_stage(p, who))
        return NB_ERR_INVALID_ARGUMENT;
    return NB_OK;
}

nb_status nb_pipeline_gradients(nb_pipeline *p, int micro_batches, int n_inputs, nb_tensor *const *inputs,
                                nb_reduction reduction, nb_tensor **loss, nb_tensor **grads)
{
    const char *who = "nb_pipeline_gradients";
    if (loss)
        *loss = NULL;
    int n = nb_pipeline_variables(p, NULL, 0);
    for (int i = 0; grads && i < n; i++)
        grads[i] = NULL;
    nb_status st = check_call(p, who, reduction, grads, true);
    if (st)
        return st;
    pthread_mutex_lock(&p->call_lock);
    st = run_call(p, who, micro_batches, n_inputs, inputs, reduction, loss, grads);
    pthread_mutex_unlock(&p->call_lock);
    return st;
}

nb_status nb_pipeline_step(nb_pipeline *p, nb_optimizer *opt, int micro_batches, int n_inputs,
                           nb_tensor *const *inputs, nb_reduction reduction, nb_tensor **loss)
{
    const char *who = "nb_pipeline_step";
    if (loss)
        *loss = NULL;
    nb_status st = check_call(p, who, reduction, NULL, false);
    if (st)
        return st;
    if (!opt)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: optimizer is NULL", who);
    pthread_mutex_lock(&p->call_lock);
    int n = nb_pipeline_variables(p, NULL, 0);
    nb_variable **vars = malloc(sizeof *vars * (size_t)(n ? n : 1));
    nb_tensor **grads = calloc((size_t)(n ? n : 1), sizeof *grads);
    nb_scope *scope = vars && grads ? nb_scope_begin() : NULL; /* for the gradients */
    if (!scope) {
        st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    } else {
        nb_pipeline_variables(p, vars, n);
        st = run_call(p, who, micro_batches, n_inputs, inputs, reduction, loss, grads);
        if (!st)
            st = nb_optimizer_apply(opt, n, vars, grads);
        if (!st && loss)
            nb_keep(*loss);
        else if (loss)
            *loss = NULL;
        nb_scope_end(scope);
    }
    pthread_mutex_unlock(&p->call_lock);
    free(vars);
    free(grads);
    return st;
}
