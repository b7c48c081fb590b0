/* The mirrored strategy: replica threads, mirrored variables, run, reduce and
 * the training step.
 *
 * Replicas 1 .. N-1 have a host thread each for the strategy's lifetime, with
 * the device pushed and marked as that replica (lib/core/replica.c), so reads of
 * mirrored variables there give its copy; replica 0 runs on the caller's own
 * thread, set up the same way for the length of the call (one thread hand-off
 * fewer each way). A call hands one job to all of them and waits for all; inside
 * a job the threads meet at barriers
 * that also agree on success, so a failure anywhere makes every replica skip
 * what follows (never a hang, never a partial update). Errors are moved off the
 * replica threads and raised on the caller's, naming the replica and device. */
#include "distribute_impl.h"
#include "world.h"
#include "lib/core/capture.h"

#include "lib/optim/optimizer_impl.h"
#include "lib/variable/variable_impl.h"
#include "tape/set_aside.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

/* p grown to n elements of size bytes (n >= 1); NULL, with p freed, when memory runs out. */
static void *realloc_array(void *p, size_t n, size_t size)
{
    void *q = realloc(p, n * size);
    if (!q)
        free(p);
    return q;
}

/* ---- waiting ---------------------------------------------------------------------- */

#include <sched.h>
#include <time.h>

/* Replicas usually meet within this at a barrier, and a training loop's next
 * step usually comes within the second. Threads spin only while the replicas do
 * not outnumber the cores (replica 0 is the caller's own thread, so none of
 * them then takes a core another needs). */
#define BARRIER_SPIN_NS 200000
#define JOB_SPIN_NS 200000

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins for at most ns until done(arg); true when it came. Between looks it
 * yields, so that a thread it waits for that shares its core is not kept from
 * running. */
static bool spin_until(bool (*done)(const void *arg), const void *arg, int64_t ns)
{
    int64_t end = now_ns() + ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (done(arg))
                return true;
            cpu_relax();
        }
        sched_yield();
        if (now_ns() > end)
            return false;
    }
}

/* A generation counter that has moved on from the value seen. */
typedef struct moved_on {
    atomic_uint_fast64_t *word;
    uint64_t seen;
} moved_on;

static bool has_moved_on(const void *arg)
{
    const moved_on *m = arg;
    return atomic_load_explicit(m->word, memory_order_acquire) != m->seen;
}

static bool is_zero(const void *arg) { return atomic_load_explicit((atomic_int *)arg, memory_order_acquire) == 0; }

/* ---- the barrier ----------------------------------------------------------------- */

bool nb__mirrored_barrier(nb_mirrored *s, bool ok, bool (*last)(nb_mirrored *s, void *arg), void *arg)
{
    nb_barrier *b = &s->barrier;
    pthread_mutex_lock(&b->lock);
    if (!ok)
        b->all_ok = false;
    uint64_t gen = atomic_load(&b->generation);
    if (++b->arrived == b->n) {
        bool all = b->all_ok;
        if (all && last)
            all = last(s, arg);
        b->result = all;
        b->all_ok = true;
        b->arrived = 0;
        atomic_store_explicit(&b->generation, gen + 1, memory_order_release);
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->lock);
        return all;
    }
    pthread_mutex_unlock(&b->lock);
    /* result is written before the generation moves and is not touched again
     * until this thread has arrived at the next barrier. */
    if (!s->spin || !spin_until(has_moved_on, &(moved_on){&b->generation, gen}, BARRIER_SPIN_NS)) {
        pthread_mutex_lock(&b->lock);
        while (atomic_load(&b->generation) == gen)
            pthread_cond_wait(&b->cv, &b->lock);
        pthread_mutex_unlock(&b->lock);
    }
    return b->result;
}

/* ---- errors on replica threads ------------------------------------------------------ */

bool nb__replica_failed(nb_replica_state *rs, nb_status code, const char *fmt, ...)
{
    if (rs->status == NB_OK) {
        char what[NB_REPLICA_MESSAGE / 2] = "";
        if (fmt && fmt[0]) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(what, sizeof what, fmt, ap);
            va_end(ap);
        }
        if (nb_error()) {
            rs->status = nb_error();
            snprintf(rs->message, sizeof rs->message, "%s%s%s", what, what[0] ? ": " : "", nb_error_message());
        } else {
            rs->status = code ? code : NB_ERR_INTERNAL;
            snprintf(rs->message, sizeof rs->message, "%s", what[0] ? what : "failed");
        }
    }
    nb_error_clear();
    return false;
}

/* Raises, on the caller's thread, the error of the first replica that failed. */
static nb_status raise_replica_error(nb_mirrored *s, const char *who)
{
    for (int r = 0; r < s->n; r++) {
        nb_replica_state *rs = &s->reps[r];
        if (rs->status)
            return nb__fail(rs->status, "%s: replica %d (%s): %s", who, r, rs->dev->name, rs->message);
    }
    return NB_OK;
}

/* ---- replica threads ------------------------------------------------------------------ */

/* Runs one job for rs on the calling thread (already set up as that replica),
 * moving any error it leaves into rs. */
static void do_job(nb_replica_state *rs, nb_job_fn fn, void *job, bool device_ok)
{
    rs->status = NB_OK;
    rs->message[0] = '\0';
    if (!device_ok)
        nb__replica_failed(rs, NB_ERR_DEVICE, "could not make %s the thread's device", rs->dev->name);
    fn(rs, job);
    if (nb_error()) /* an error the job left pending still fails it */
        nb__replica_failed(rs, nb_error(), "%s", "");
}

/* Replicas 1 .. N-1 each live on a thread of their own. */
static void *replica_main(void *arg)
{
    nb_replica_state *rs = arg;
    nb_mirrored *s = rs->s;
    /* The device and the replica mark stay for the thread's life. */
    bool pushed = nb_device_push(rs->dev->name) == NB_OK;
    nb_error_clear();
    nb__replica_enter(s->id, rs->index);
    nb__thread_set_serial(rs->serial);
    uint64_t seen = 0;
    for (;;) {
        /* Steps usually come back to back: look a while before sleeping. */
        if (s->spin)
            spin_until(has_moved_on, &(moved_on){&s->generation, seen}, JOB_SPIN_NS);
        pthread_mutex_lock(&s->lock);
        while (atomic_load(&s->generation) == seen && !s->quit)
            pthread_cond_wait(&s->work_cv, &s->lock);
        if (s->quit)
            break;
        seen = atomic_load(&s->generation);
        nb_job_fn fn = s->job_fn;
        void *job = s->job;
        pthread_mutex_unlock(&s->lock);
        do_job(rs, fn, job, pushed);
        if (atomic_fetch_sub(&s->remaining, 1) == 1) {
            pthread_mutex_lock(&s->lock);
            pthread_cond_signal(&s->done_cv);
            pthread_mutex_unlock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (pushed)
        nb_device_pop();
    nb__replica_leave();
    return NULL;
}

/* Runs replica 0's part of a job on the caller's thread, as if on a thread of
 * its own: the caller's tapes record none of it, its pending error survives,
 * and its device stack, replica mark and serial mode come back as they were. */
static void run_here(nb_mirrored *s, nb_job_fn fn, void *job)
{
    nb_replica_state *rs = &s->reps[0];
    nb_error_saved err;
    nb__error_stash(&err);
    nb_tapes_aside tapes;
    nb__tapes_set_aside(&tapes);
    uint64_t prev_strategy = nb__replica_strategy();
    int prev_index = nb__replica_of(prev_strategy);
    bool prev_serial = nb__thread_serial();
    bool pushed = nb_device_push(rs->dev->name) == NB_OK;
    nb__replica_enter(s->id, 0);
    nb__thread_set_serial(rs->serial);
    do_job(rs, fn, job, pushed);
    if (pushed)
        nb_device_pop();
    nb__thread_set_serial(prev_serial);
    if (prev_strategy)
        nb__replica_enter(prev_strategy, prev_index);
    else
        nb__replica_leave();
    nb__tapes_restore(&tapes);
    nb__error_unstash(&err);
}

/* Runs fn on every replica (0 on this thread, the others on theirs) and waits
 * until all have finished. */
static void dispatch(nb_mirrored *s, nb_job_fn fn, void *job)
{
    if (s->n > 1) {
        pthread_mutex_lock(&s->lock);
        s->job_fn = fn;
        s->job = job;
        atomic_store(&s->remaining, s->n - 1);
        atomic_fetch_add(&s->generation, 1);
        pthread_cond_broadcast(&s->work_cv);
        pthread_mutex_unlock(&s->lock);
    }
    run_here(s, fn, job);
    if (s->n > 1) {
        if (s->spin)
            spin_until(is_zero, &s->remaining, BARRIER_SPIN_NS);
        pthread_mutex_lock(&s->lock);
        while (atomic_load(&s->remaining) > 0)
            pthread_cond_wait(&s->done_cv, &s->lock);
        pthread_mutex_unlock(&s->lock);
    }
}

/* ---- creation --------------------------------------------------------------------------- */

/* The devices a strategy takes when none are named: every GPU, else every CPU. */
static int default_devices(int n, nb_device **out, const char *who)
{
    nb_device_kind kind = nb_device_count(NB_DEVICE_GPU) > 0 ? NB_DEVICE_GPU : NB_DEVICE_CPU;
    int have = nb_device_count(kind);
    if (n == 0)
        n = have < NB_MIRRORED_MAX ? have : NB_MIRRORED_MAX;
    if (n > have) {
        nb__fail(NB_ERR_DEVICE, "%s: %d replicas asked for, but there are %d %s devices (%s)", who, n, have,
                 kind == NB_DEVICE_GPU ? "GPU" : "CPU",
                 kind == NB_DEVICE_GPU ? "nb_set_logical_gpu_devices splits a GPU"
                                       : "nb_set_logical_cpu_devices splits the CPU");
        return -1;
    }
    for (int r = 0; r < n; r++)
        if (!(out[r] = nb__device_find(nb_device_name(kind, r), who)))
            return -1;
    return n;
}

/* Opens the collective when every replica is a device of its own card and the
 * backend has one; otherwise (or when it fails to start, with a warning) the
 * strategy reduces through device copies. */
static void open_collective(nb_mirrored *s)
{
    const nb_collective *c = s->devices[0]->backend->collective;
    if (!c || s->n < 2)
        return;
    for (int r = 0; r < s->n; r++) {
        if (s->devices[r]->backend != s->devices[0]->backend)
            return;
        for (int q = 0; q < r; q++)
            if (s->devices[q]->physical == s->devices[r]->physical)
                return; /* logical devices of one card */
    }
    bool had_error = nb_error() != NB_OK;
    if (c->comm_new(s->n, s->devices, &s->comm) == NB_OK) {
        s->collective = c;
        return;
    }
    nb__log(NB_LOG_WARNING, "nb_mirrored_new: %s could not start (%s); reducing through device copies", c->name,
            nb_error_message());
    if (!had_error)
        nb_error_clear();
    s->comm = NULL;
}

static void strategy_destroy(nb_mirrored *s)
{
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->lock);
    for (int r = 0; r < s->n; r++) {
        nb_replica_state *rs = &s->reps[r];
        if (rs->started)
            pthread_join(rs->thread, NULL);
        nb__bucket_cache_free(&rs->cache);
        free(rs->grads);
        free(rs->copies);
        free(rs->places);
    }
    if (s->comm)
        s->collective->comm_free(s->comm);
    if (s->world_comm)
        s->world_collective->world_comm_free(s->world_comm);
    nb__bucket_plan_free(&s->plan);
    free(s->present);
    free(s->dtypes);
    free(s->numels);
    free(s->host);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->call_lock);
    pthread_mutex_destroy(&s->barrier.lock);
    pthread_cond_destroy(&s->barrier.cv);
    free(s->reps);
    free(s);
}

nb_mirrored *nb_mirrored_new(int n, const char *const *devices)
{
    const char *who = "nb_mirrored_new";
    if (n < 0 || n > NB_MIRRORED_MAX)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d replicas is outside [0, %d]", who, n, NB_MIRRORED_MAX);
    if (devices && n == 0)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: a device list with n = 0 names no device", who);
    nb_device *devs[NB_MIRRORED_MAX];
    if (devices) {
        for (int r = 0; r < n; r++) {
            if (!(devs[r] = nb__device_find(devices[r], who)))
                return NULL;
            for (int q = 0; q < r; q++)
                if (devs[q] == devs[r])
                    return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: device %s is given twice (replicas %d and %d)",
                                         who, devs[r]->name, q, r);
        }
    } else if ((n = default_devices(n, devs, who)) < 0) {
        return NULL;
    }

    nb_mirrored *s = calloc(1, sizeof *s);
    nb_replica_state *reps = calloc((size_t)n, sizeof *reps);
    if (!s || !reps) {
        free(s);
        free(reps);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    s->id = nb__replica_owner_new();
    s->n = n;
    s->reps = reps;
    s->bucket_bytes = DEFAULT_BUCKET_BYTES;
    memcpy(s->devices, devs, sizeof *devs * (size_t)n);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_mutex_init(&s->call_lock, NULL);
    pthread_mutex_init(&s->barrier.lock, NULL);
    pthread_cond_init(&s->barrier.cv, NULL);
    s->barrier.n = n;
    s->barrier.all_ok = true;
    s->spin = n <= nb__thread_count();
    /* CPU replicas that fill the cores each keep their kernels to their own thread. */
    int cpu_replicas = 0;
    for (int r = 0; r < n; r++)
        cpu_replicas += devs[r]->kind == NB_DEVICE_CPU;
    for (int r = 0; r < n; r++) {
        nb_replica_state *rs = &reps[r];
        rs->s = s;
        rs->index = r;
        rs->dev = devs[r];
        rs->ctx = (struct nb_replica){.index = r, .count = n, .device = devs[r]->name};
        rs->serial = devs[r]->kind == NB_DEVICE_CPU && cpu_replicas >= nb__thread_count();
    }
    for (int r = 1; r < n; r++) { /* replica 0 runs on the caller's thread */
        nb_replica_state *rs = &reps[r];
        if (pthread_create(&rs->thread, NULL, replica_main, rs) != 0) {
            strategy_destroy(s);
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: could not start the thread of replica %d", who, r);
        }
        rs->started = true;
    }
    open_collective(s);
    return s;
}

/* The processes' own collective (NCCL) where every process's replica 0 is a
 * GPU and the backend has one: all processes agree first whether they can,
 * then rank 0's id is broadcast, each makes its rank, and all agree it
 * worked; otherwise (or when it fails anywhere) the sums go through host
 * memory with MPI, with a warning. Fails only when the processes stop
 * agreeing (a timeout or a mismatch). */
static nb_status open_world_collective(nb_mirrored *s, const char *who)
{
    const nb_collective *c = s->devices[0]->backend->collective;
    bool able = c && c->world_comm_new && s->devices[0]->kind == NB_DEVICE_GPU && c->world_id_bytes <= 256;
    int64_t all_able = 0, all_made = 0;
    nb_status st = nb__world_handshake(who, "choosing the collective", "", able, NULL, &all_able);
    if (!st && all_able) {
        unsigned char id[256] = {0};
        bool had_error = nb_error() != NB_OK;
        nb_status made = nb__world_rank() == 0 ? c->world_make_id(id) : NB_OK;
        /* every rank takes part in the broadcast, even after rank 0 failed (its id is then zeros) */
        st = nb__world_broadcast(who, id, c->world_id_bytes);
        void *comm = NULL;
        if (!st && !made)
            made = c->world_comm_new(s->devices[0], nb__world_rank(), nb__world_size(), id, nb__world_timeout(),
                                     &comm);
        if (!st)
            st = nb__world_handshake(who, "starting the collective", c->name, made == NB_OK, NULL, &all_made);
        if (!st && all_made) {
            s->world_collective = c;
            s->world_comm = comm;
        } else {
            if (comm)
                c->world_comm_free(comm);
            if (!st) {
                nb__log(NB_LOG_WARNING, "%s: %s across the processes could not start (%s); summing through host "
                        "memory with MPI", who, c->name, made ? nb_error_message() : "on another process");
                if (!had_error)
                    nb_error_clear();
            }
        }
    }
    return st;
}

nb_mirrored *nb_mirrored_new_world(int n, const char *const *devices)
{
    const char *who = "nb_mirrored_new_world";
    if (nb__world_join(who))
        return NULL;
    nb_mirrored *s = nb_mirrored_new(n, devices);
    if (!s)
        return NULL;
    s->world = nb__world_size() > 1;
    s->world_replicas = s->n;
    if (!s->world)
        return s;
    int64_t replicas = 0;
    nb_status st = nb__world_handshake(who, who, "", s->n, &replicas, NULL);
    s->world_replicas = (int)replicas;
    if (!st)
        st = open_world_collective(s, who);
    if (st) {
        nb_mirrored_free(s);
        return NULL;
    }
    return s;
}

int nb_mirrored_world_rank(const nb_mirrored *s) { return s && s->world ? nb__world_rank() : 0; }
int nb_mirrored_world_size(const nb_mirrored *s) { return s ? (s->world ? nb__world_size() : 1) : 0; }
int nb_mirrored_world_replicas(const nb_mirrored *s) { return s ? (s->world ? s->world_replicas : s->n) : 0; }

nb_status nb_mirrored_set_timeout(nb_mirrored *s, double seconds)
{
    if (!s || !(seconds > 0))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_set_timeout: %s",
                        !s ? "strategy is NULL" : "the timeout must be a positive number of seconds");
    nb__world_set_timeout(seconds);
    return NB_OK;
}

/* Fails (and returns true) when the caller is one of s's own replica threads:
 * waiting for s there would wait for itself. */
static bool called_from_replica(const nb_mirrored *s, const char *who)
{
    if (nb__replica_strategy() != s->id)
        return false;
    nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: called from inside a replica function of the same strategy", who);
    return true;
}

void nb_mirrored_free(nb_mirrored *s)
{
    if (!s || called_from_replica(s, "nb_mirrored_free"))
        return;
    /* A call running on another thread finishes first. */
    pthread_mutex_lock(&s->call_lock);
    pthread_mutex_unlock(&s->call_lock);
    strategy_destroy(s);
}

int nb_mirrored_replicas(const nb_mirrored *s) { return s ? s->n : 0; }

const char *nb_mirrored_device(const nb_mirrored *s, int replica)
{
    return s && replica >= 0 && replica < s->n ? s->devices[replica]->name : NULL;
}

nb_status nb_mirrored_set_bucket_bytes(nb_mirrored *s, size_t bytes)
{
    if (!s || bytes == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_set_bucket_bytes: %s",
                        !s ? "strategy is NULL" : "a bucket of 0 bytes holds nothing");
    s->bucket_bytes = bytes;
    return NB_OK;
}

nb_status nb_mirrored_get_stats(const nb_mirrored *s, nb_mirrored_stats *out)
{
    if (!s || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_get_stats: %s is NULL", !s ? "strategy" : "out");
    *out = (nb_mirrored_stats){.steps = s->steps,
                               .collective_calls = s->collective_calls,
                               .last_buckets = s->last_buckets,
                               .bucket_bytes = s->bucket_bytes,
                               .algorithm = s->comm ? s->collective->name : "copies",
                               .world_algorithm = !s->world ? NULL : s->world_comm ? s->world_collective->name : "mpi",
                               .world_sums = s->world_sums,
                               .world_seconds = (double)s->world_ns * 1e-9};
    return NB_OK;
}

/* ---- mirrored variables -------------------------------------------------------------------- */

nb_variable *nb_mirrored_variable_new(nb_mirrored *s, const char *name, const nb_tensor *initial)
{
    const char *who = "nb_mirrored_variable_new";
    if (!s)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: strategy is NULL", who);
    if (!s->world || !initial || !name)
        return nb__variable_mirrored_new(s->id, name, s->n, s->devices, initial, who);
    /* Every process makes the same variable (checked: name, dtype, shape), and
     * all start from rank 0's value. */
    char desc[200], sh[NB_SHAPE_STR_MAX];
    snprintf(desc, sizeof desc, "'%s' %s %s", name, nb_dtype_name(initial->dtype),
             nb__shape_str(initial->ndim, initial->shape, sh, sizeof sh));
    if (nb__world_handshake(who, who, desc, 0, NULL, NULL))
        return NULL;
    size_t bytes = (size_t)initial->numel * nb_dtype_size(initial->dtype);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for '%s'", who, name);
    nb_variable *v = NULL;
    if (nb_tensor_read(initial, buf, bytes) == NB_OK && nb__world_broadcast(who, buf, bytes) == NB_OK) {
        nb_scope *scope = nb_scope_begin();
        nb_device_push(initial->device->name);
        nb_shape shape = {initial->ndim, {0}};
        memcpy(shape.dims, initial->shape, sizeof(int64_t) * (size_t)initial->ndim);
        nb_tensor *same = nb_from_buffer(initial->dtype, shape, buf);
        nb_device_pop();
        v = same ? nb__variable_mirrored_new(s->id, name, s->n, s->devices, same, who) : NULL;
        nb_scope_end(scope);
    }
    free(buf);
    return v;
}

nb_tensor *nb_mirrored_variable_read(nb_variable *v, int replica)
{
    const char *who = "nb_mirrored_variable_read";
    if (!v)
        return nb__null_input(who, 0);
    int n = nb_variable_replicas(v);
    if (n == 0)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: '%s' is a plain variable, not a mirrored one", who,
                             nb_variable_name(v));
    if (replica < 0 || replica >= n)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: replica %d of '%s' is outside [0, %d)", who, replica,
                             nb_variable_name(v), n);
    nb_tensor *t = nb__variable_value(nb__variable_copy(v, replica));
    nb__retain(t);
    return nb__own(t);
}

/* ---- the replica context --------------------------------------------------------------------- */

int nb_replica_index(const nb_replica *r) { return r ? r->index : -1; }
int nb_replica_count(const nb_replica *r) { return r ? r->count : 0; }
const char *nb_replica_device(const nb_replica *r) { return r ? r->device : NULL; }
int64_t nb_replica_rows(const nb_replica *r) { return r ? r->rows : 0; }
int64_t nb_replica_global_rows(const nb_replica *r) { return r ? r->global_rows : 0; }

/* ---- splitting the batch ---------------------------------------------------------------------- */

/* Checks the inputs of a call (non-NULL, at least one dim, one first dim) and
 * gives every replica its rows; global rows to *rows. */
static nb_status split_batch(nb_mirrored *s, const char *who, int n_inputs, nb_tensor *const *inputs, int64_t *rows)
{
    int64_t b = 0;
    nb_status st = nb__batch_check(who, n_inputs, inputs, &b);
    if (st)
        return st;
    int64_t start = 0;
    for (int r = 0; r < s->n; r++) {
        struct nb_replica *c = &s->reps[r].ctx;
        c->rows = b / s->n + (r < b % s->n ? 1 : 0);
        c->start = start;
        c->global_rows = b;
        start += c->rows;
    }
    *rows = b;
    return NB_OK;
}

/* The replica's share of each input, on its device, owned by its scope. */
static bool make_shares(nb_replica_state *rs, int n, nb_tensor *const *inputs, nb_tensor **shares)
{
    for (int i = 0; i < n; i++)
        if (!(shares[i] = nb__batch_rows(inputs[i], rs->ctx.start, rs->ctx.rows, rs->dev)))
            return nb__replica_failed(rs, NB_ERR_INTERNAL, "splitting input %d", i);
    return true;
}

bool nb__shares_init(nb_shares *sh, nb_replica_state *rs, int n, nb_tensor *const *inputs)
{
    sh->t = n <= 16 ? sh->small : malloc(sizeof *sh->t * (size_t)n);
    if (!sh->t)
        return nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    return make_shares(rs, n, inputs, sh->t);
}

void nb__shares_free(nb_shares *sh)
{
    if (sh->t && sh->t != sh->small)
        free(sh->t);
}

/* ---- run ------------------------------------------------------------------------------------------ */

typedef struct run_job {
    nb_replica_fn fn;
    void *user;
    int n_inputs;
    nb_tensor *const *inputs;
    int n_outputs;
    nb_tensor **outputs; /* N * n_outputs, replica-major */
} run_job;

static void run_on_replica(nb_replica_state *rs, void *arg)
{
    run_job *j = arg;
    nb_scope *scope = nb_scope_begin();
    nb_tensor **outs = j->outputs ? j->outputs + (size_t)rs->index * (size_t)j->n_outputs : NULL;
    nb_shares sh = {0};
    if (!scope) {
        nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory");
        return;
    }
    if (rs->status == NB_OK && nb__shares_init(&sh, rs, j->n_inputs, j->inputs)) {
        nb_status st = j->fn(&rs->ctx, j->n_inputs, sh.t, j->n_outputs, outs, j->user);
        if (st || nb_error())
            nb__replica_failed(rs, st, "the replica function failed");
    }
    /* Outputs outlive the replica's scope: the caller's scope takes them. */
    for (int k = 0; k < j->n_outputs; k++)
        nb__retain(outs[k]);
    nb__shares_free(&sh);
    nb_scope_end(scope);
}

/* Gives the replicas' outputs to the caller's scope, or (after a failure,
 * including one while handing them over) releases the rest and NULLs them all. */
static nb_status hand_out(nb_status st, size_t n, nb_tensor **outputs)
{
    for (size_t i = 0; i < n; i++) {
        if (st) {
            nb__release(outputs[i]);
        } else if (outputs[i] && !nb__own(outputs[i])) { /* nb__own released it */
            st = nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        }
    }
    if (st)
        for (size_t i = 0; i < n; i++)
            outputs[i] = NULL; /* those handed out already belong to the scope */
    return st;
}

nb_status nb_mirrored_run(nb_mirrored *s, nb_replica_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                          int n_outputs, nb_tensor **outputs)
{
    const char *who = "nb_mirrored_run";
    if (nb__capture_check(NULL, who, "a mirrored strategy's call"))
        return nb_error();
    if (n_outputs > 0 && outputs && s)
        for (size_t i = 0; i < (size_t)s->n * (size_t)n_outputs; i++)
            outputs[i] = NULL;
    if (!s || !fn)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !s ? "strategy" : "fn");
    if (n_outputs < 0 || (n_outputs > 0 && !outputs))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, n_outputs < 0 ? "n_outputs is negative" : "outputs is NULL");
    if (called_from_replica(s, who))
        return NB_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->call_lock);
    int64_t rows;
    nb_status st = split_batch(s, who, n_inputs, inputs, &rows);
    if (!st) {
        run_job j = {fn, user, n_inputs, inputs, n_outputs, outputs};
        dispatch(s, run_on_replica, &j);
        st = raise_replica_error(s, who);
    }
    /* s may be freed by another thread once the lock is let go. */
    size_t n_out = (size_t)s->n * (size_t)n_outputs;
    pthread_mutex_unlock(&s->call_lock);
    return hand_out(st, n_out, outputs);
}

/* scale * the sum over r of w[r] * xs[r] (w NULL: all 1; a NULL xs[r] is left
 * out), added in replica order on the caller's current device; as_loss makes
 * each term an f64 scalar first. Owned by the current scope; NULL on failure. */
static nb_tensor *sum_in_order(int n, nb_tensor *const *xs, const double *w, double scale, bool as_loss)
{
    const char *here = nb_device_current();
    nb_scope *scope = nb_scope_begin(); /* for the temporaries */
    if (!scope)
        return NULL;
    nb_tensor *sum = NULL;
    for (int r = 0; r < n; r++) {
        if (!xs[r])
            continue;
        nb_tensor *x = nb_to_device(xs[r], here);
        if (as_loss)
            x = nb_reshape(nb_cast(x, NB_F64), NB_SCALAR);
        if (w && w[r] != 1.0)
            x = nb_mul_scalar(x, w[r]);
        sum = sum ? nb_add(sum, x) : x;
    }
    if (scale != 1.0)
        sum = nb_mul_scalar(sum, scale);
    sum = nb_keep(sum);
    nb_scope_end(scope);
    return sum;
}

/* ---- reduce --------------------------------------------------------------------------------------- */

nb_tensor *nb_mirrored_reduce(nb_mirrored *s, nb_reduction reduction, nb_tensor *const *per_replica)
{
    const char *who = "nb_mirrored_reduce";
    if (nb__capture_check(NULL, who, "a mirrored strategy's call"))
        return NULL;
    if (!s || !per_replica)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !s ? "strategy" : "per_replica");
    if (reduction != NB_REDUCE_SUM && reduction != NB_REDUCE_MEAN)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", who, (int)reduction);
    for (int r = 0; r < s->n; r++) {
        const nb_tensor *x = per_replica[r], *x0 = per_replica[0];
        if (!x)
            return nb__null_input(who, r);
        if (x->dtype != x0->dtype)
            return nb__fail_null(NB_ERR_DTYPE, "%s: replica %d's value is %s but replica 0's is %s", who, r,
                                 nb_dtype_name(x->dtype), nb_dtype_name(x0->dtype));
        if (!nb__same_shape(x, x0)) {
            char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
            return nb__fail_null(NB_ERR_SHAPE, "%s: replica %d's value has shape %s but replica 0's has %s", who, r,
                                 nb__shape_str(x->ndim, x->shape, a, sizeof a),
                                 nb__shape_str(x0->ndim, x0->shape, b, sizeof b));
        }
    }
    if (reduction == NB_REDUCE_MEAN && !nb__is_floating(per_replica[0]->dtype))
        return nb__fail_null(NB_ERR_DTYPE, "%s: MEAN of %s values; cast them to a floating dtype first", who,
                             nb_dtype_name(per_replica[0]->dtype));
    return sum_in_order(s->n, per_replica, NULL, reduction == NB_REDUCE_MEAN ? 1.0 / s->n : 1.0, false);
}

/* ---- all-reduce ------------------------------------------------------------------------------------ */

typedef struct all_reduce_job {
    nb_tensor *const *in;
    nb_tensor **out;
    double scale;
} all_reduce_job;

static void all_reduce_on_replica(nb_replica_state *rs, void *arg)
{
    all_reduce_job *j = arg;
    nb_scope *scope = nb_scope_begin();
    /* A replica that failed already (no device) still meets the others at every barrier. */
    bool ok = rs->status == NB_OK && (scope || nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory"));
    nb_tensor *x = NULL, *y = NULL;
    if (ok) {
        x = j->in[rs->index];
        if (x->device != rs->dev)
            x = nb_to_device(x, rs->dev->name);
        x = nb_contiguous(x);
        y = x ? nb__tensor_new("nb_mirrored_all_reduce", rs->dev, x->dtype, x->ndim, x->shape) : NULL;
        ok = y || nb__replica_failed(rs, NB_ERR_INTERNAL, "preparing the buffers");
    }
    ok = nb__all_reduce_buckets(rs, "nb_mirrored_all_reduce", ok, 1, &x, &y, j->scale);
    if (ok)
        j->out[rs->index] = y; /* the reference nb__tensor_new gave */
    else
        nb__release(y);
    if (scope)
        nb_scope_end(scope);
}

nb_status nb_mirrored_all_reduce(nb_mirrored *s, nb_reduction reduction, nb_tensor *const *per_replica, nb_tensor **out)
{
    const char *who = "nb_mirrored_all_reduce";
    if (nb__capture_check(NULL, who, "a mirrored strategy's call"))
        return nb_error();
    if (s && out)
        for (int r = 0; r < s->n; r++)
            out[r] = NULL;
    if (!s || !per_replica || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !s ? "strategy" : !out ? "out" : "per_replica");
    if (reduction != NB_REDUCE_SUM && reduction != NB_REDUCE_MEAN)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", who, (int)reduction);
    for (int r = 0; r < s->n; r++) {
        const nb_tensor *x = per_replica[r], *x0 = per_replica[0];
        if (!x)
            return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: replica %d's tensor is NULL", who, r);
        if (x->dtype != x0->dtype)
            return nb__fail(NB_ERR_DTYPE, "%s: replica %d's tensor is %s but replica 0's is %s", who, r,
                            nb_dtype_name(x->dtype), nb_dtype_name(x0->dtype));
        if (!nb__same_shape(x, x0)) {
            char a[NB_SHAPE_STR_MAX], b[NB_SHAPE_STR_MAX];
            return nb__fail(NB_ERR_SHAPE, "%s: replica %d's tensor has shape %s but replica 0's has %s", who, r,
                            nb__shape_str(x->ndim, x->shape, a, sizeof a), nb__shape_str(x0->ndim, x0->shape, b, sizeof b));
        }
    }
    nb_dtype d = per_replica[0]->dtype;
    if (d == NB_BOOL || (reduction == NB_REDUCE_MEAN && !nb__is_floating(d)))
        return nb__fail(NB_ERR_DTYPE, "%s: cannot %s %s tensors", who, reduction == NB_REDUCE_MEAN ? "average" : "sum",
                        nb_dtype_name(d));
    if (called_from_replica(s, who))
        return NB_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->call_lock);
    all_reduce_job j = {per_replica, out, reduction == NB_REDUCE_MEAN ? 1.0 / nb_mirrored_world_replicas(s) : 1.0};
    dispatch(s, all_reduce_on_replica, &j);
    nb_status st = raise_replica_error(s, who);
    if (!st) {
        s->collective_calls++;
        s->last_buckets = 1;
    }
    size_t n_out = (size_t)s->n;
    pthread_mutex_unlock(&s->call_lock);
    return hand_out(st, n_out, out);
}

/* ---- the training step ------------------------------------------------------------------------------ */

typedef nb_step_job step_job;

/* Runs the user's step on shares (rs's, on its device) and checks what it gave. */
bool nb__step_compute_on(nb_replica_state *rs, nb_step_job *j, nb_tensor *const *shares)
{
    nb_status st = j->fn(&rs->ctx, j->n_inputs, shares, j->n_vars, j->vars, &rs->loss, rs->grads, j->user);
    bool ok = !(st || nb_error()) || nb__replica_failed(rs, st, "the step function failed");
    const nb_tensor *loss = rs->loss;
    if (ok && (!loss || !nb__is_floating(loss->dtype) || loss->numel != 1)) {
        char sh_[NB_SHAPE_STR_MAX] = "";
        nb_status code = !loss ? NB_ERR_INVALID_ARGUMENT : !nb__is_floating(loss->dtype) ? NB_ERR_DTYPE : NB_ERR_SHAPE;
        ok = nb__replica_failed(rs, code,
                                "the step function's loss must be a floating scalar; it gave %s%s%s",
                                loss ? nb_dtype_name(loss->dtype) : "NULL", loss ? " " : "",
                                loss ? nb__shape_str(loss->ndim, loss->shape, sh_, sizeof sh_) : "");
    }
    for (int i = 0; i < j->n_vars && ok; i++) {
        nb_tensor *g = rs->grads[i];
        if (!g)
            continue;
        const nb_tensor *x = nb__variable_value(nb__variable_copy(j->vars[i], rs->index));
        bool same_shape = nb__same_shape(g, x);
        if (!same_shape || g->dtype != x->dtype) {
            char sx[NB_SHAPE_STR_MAX], sg[NB_SHAPE_STR_MAX];
            ok = nb__replica_failed(rs, !same_shape ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                                    "gradient %d for '%s' is %s %s, the variable is %s %s", i,
                                    nb_variable_name(j->vars[i]), nb_dtype_name(g->dtype),
                                    nb__shape_str(g->ndim, g->shape, sg, sizeof sg), nb_dtype_name(x->dtype),
                                    nb__shape_str(x->ndim, x->shape, sx, sizeof sx));
        } else if (g->device != rs->dev && !(rs->grads[i] = nb_to_device(g, rs->dev->name))) {
            ok = nb__replica_failed(rs, NB_ERR_DEVICE, "moving gradient %d to %s", i, rs->dev->name);
        }
    }
    return ok;
}

/* Runs the user's step on rs's share and checks what it gave. */
static bool step_compute(nb_replica_state *rs, step_job *j)
{
    nb_shares sh = {0};
    bool ok = nb__shares_init(&sh, rs, j->n_inputs, j->inputs) && nb__step_compute_on(rs, j, sh.t);
    nb__shares_free(&sh);
    return ok;
}

/* Run once, by the last replica to finish its step: which variables have a
 * gradient anywhere, and the buckets they go in. */
bool nb__step_plan(nb_mirrored *s, void *arg)
{
    step_job *j = arg;
    for (int i = 0; i < j->n_vars; i++) {
        const nb_tensor *x = nb__variable_value(nb__variable_copy(j->vars[i], 0));
        s->dtypes[i] = x->dtype;
        s->numels[i] = x->numel;
        s->present[i] = false;
        for (int r = 0; r < s->n; r++)
            s->present[i] |= s->reps[r].grads[i] != NULL;
    }
    return nb__bucket_plan_make(&s->plan, j->n_vars, s->dtypes, s->numels, s->present, s->bucket_bytes);
}

/* The view, shaped like variable i, of its place in bucket tensor b. */
static nb_tensor *place_of(const nb_bucket_plan *plan, nb_tensor *const *buckets, int i, const nb_tensor *like)
{
    const nb_tensor *b = buckets[plan->bucket_of[i]];
    int64_t strides[NB_MAX_DIMS];
    nb__contiguous_strides(like->ndim, like->shape, nb_dtype_size(like->dtype), strides);
    return nb__tensor_view(b, like->ndim, like->shape, strides,
                           b->offset + plan->offset_of[i] * (int64_t)nb_dtype_size(like->dtype));
}

/* Packs rs's gradients into its buckets, weighted for MEAN (zeros where it has
 * none). */
bool nb__step_pack(nb_replica_state *rs, nb_step_job *j)
{
    const nb_bucket_plan *plan = &rs->s->plan;
    nb_status st = nb__bucket_cache_fit(rs, plan);
    if (st)
        return nb__replica_failed(rs, st, "allocating the gradient buckets");
    double w = j->reduction == NB_REDUCE_MEAN ? (double)rs->ctx.rows / (double)rs->ctx.global_rows : 1.0;
    const nb_backend *be = rs->dev->backend;
    for (int i = 0; i < j->n_vars && !st; i++) {
        if (plan->bucket_of[i] < 0)
            continue;
        const nb_tensor *x = nb__variable_value(nb__variable_copy(j->vars[i], rs->index));
        nb_tensor *place = place_of(plan, rs->cache.tensors, i, x);
        if (!place)
            return nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "packing gradient %d", i);
        nb_view pv = nb__view(place);
        const nb_tensor *g = rs->grads[i];
        if (!g) {
            st = be->fill(rs->dev, &pv, 0.0);
        } else {
            nb_view gv = nb__view(g);
            st = w == 1.0 ? be->copy(rs->dev, &pv, &gv) : be->unary(rs->dev, NB_UN_MUL_SCALAR, &pv, &gv, w);
        }
        nb__release(place);
    }
    return st == NB_OK || nb__replica_failed(rs, st, "packing the gradients");
}

/* Applies the reduced gradients to rs's copies. */
bool nb__step_apply(nb_replica_state *rs, nb_step_job *j)
{
    const nb_bucket_plan *plan = &rs->s->plan;
    nb_variable **copies = rs->copies;
    nb_tensor **places = rs->places;
    bool ok = true;
    for (int i = 0; i < j->n_vars; i++)
        places[i] = NULL;
    for (int i = 0; i < j->n_vars && ok; i++) {
        copies[i] = nb__variable_copy(j->vars[i], rs->index);
        if (plan->bucket_of[i] >= 0 &&
            !(places[i] = place_of(plan, rs->cache.tensors, i, nb__variable_value(copies[i]))))
            ok = nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    if (ok) {
        nb_status st = nb__optimizer_update_at(j->opt, j->n_vars, copies, places, j->step, j->device_params,
                                               j->who ? j->who : "nb_mirrored_step");
        ok = st == NB_OK || nb__replica_failed(rs, st, "applying the update (the replicas may now differ)");
    }
    for (int i = 0; i < j->n_vars; i++)
        nb__release(places[i]);
    return ok;
}

static void step_on_replica(nb_replica_state *rs, void *arg)
{
    step_job *j = arg;
    nb_mirrored *s = rs->s;
    for (int i = 0; i < j->n_vars; i++)
        rs->grads[i] = NULL;
    rs->loss = NULL;
    nb_scope *scope = nb_scope_begin();
    /* A replica that failed already (no device) still meets the others at every barrier. */
    bool ok = rs->status == NB_OK && (scope || nb__replica_failed(rs, NB_ERR_OUT_OF_MEMORY, "out of host memory"));
    /* A replica with no rows has nothing to learn from: it only adds zeros. */
    if (ok && rs->ctx.rows > 0)
        ok = step_compute(rs, j);
    if (!nb__mirrored_barrier(s, ok, nb__step_plan, j))
        goto out;
    ok = nb__step_pack(rs, j);
    if (!nb__all_reduce_buckets(rs, j->who, ok, s->plan.n_buckets, rs->cache.tensors, rs->cache.tensors, 1.0))
        goto out;
    nb__step_apply(rs, j);
out:
    nb__retain(rs->loss); /* for the caller, past the replica's scope */
    for (int i = 0; i < j->n_vars; i++)
        rs->grads[i] = NULL;
    if (scope)
        nb_scope_end(scope);
}

/* Checks that every variable is a mirrored one of s. */
static nb_status check_vars(nb_mirrored *s, const char *who, int n, nb_variable *const *vars)
{
    if (n < 0 || (n > 0 && !vars))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, n < 0 ? "n_vars is negative" : "vars is NULL");
    for (int i = 0; i < n; i++) {
        if (!vars[i])
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: variable %d is NULL", who, i);
        uint64_t owner = nb__variable_mirror_owner(vars[i]);
        if (owner != s->id)
            return nb__fail(NB_ERR_INVALID_ARGUMENT,
                            owner ? "%s: variable %d ('%s') belongs to another strategy"
                                  : "%s: variable %d ('%s') is a plain variable; make it with nb_mirrored_variable_new",
                            who, i, nb_variable_name(vars[i]));
        if (!nb__is_floating(nb_variable_dtype(vars[i])))
            return nb__fail(NB_ERR_DTYPE, "%s: variable %d ('%s') is %s: only floating variables can be trained", who, i,
                            nb_variable_name(vars[i]), nb_dtype_name(nb_variable_dtype(vars[i])));
    }
    return NB_OK;
}

/* Makes the optimizer's slots for every copy, on this thread, before the
 * replicas update concurrently. */
static nb_status prepare_slots(nb_mirrored *s, nb_optimizer *opt, int n, nb_variable *const *vars, const char *who)
{
    nb_status st = NB_OK;
    for (int r = 0; r < s->n && !st; r++) {
        nb_variable **copies = s->reps[r].copies;
        for (int i = 0; i < n; i++)
            copies[i] = nb__variable_copy(vars[i], r);
        st = nb__optimizer_prepare(opt, n, copies, who);
    }
    return st;
}

/* Grows the per-variable scratch of the strategy and its replicas to n
 * variables: a training loop then allocates none of it after its first step. */
static nb_status reserve_vars(nb_mirrored *s, int n, const char *who)
{
    if (n <= s->cap_vars)
        return NB_OK;
    size_t k = (size_t)n;
    bool ok = (s->present = realloc_array(s->present, k, sizeof *s->present)) &&
              (s->dtypes = realloc_array(s->dtypes, k, sizeof *s->dtypes)) &&
              (s->numels = realloc_array(s->numels, k, sizeof *s->numels));
    for (int r = 0; r < s->n && ok; r++) {
        nb_replica_state *rs = &s->reps[r];
        ok = (rs->grads = realloc_array(rs->grads, k, sizeof *rs->grads)) &&
             (rs->copies = realloc_array(rs->copies, k, sizeof *rs->copies)) &&
             (rs->places = realloc_array(rs->places, k, sizeof *rs->places));
    }
    if (!ok) {
        s->cap_vars = 0; /* a failed grow freed its array: grow all again next time */
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    s->cap_vars = n;
    return NB_OK;
}

/* The loss of the whole batch as f64 on the caller's device: replica losses
 * weighted like the gradients, added in replica order. */
nb_tensor *nb__mirrored_combine_losses(nb_mirrored *s, nb_reduction reduction)
{
    nb_tensor *losses[NB_MIRRORED_MAX];
    double w[NB_MIRRORED_MAX];
    for (int r = 0; r < s->n; r++) {
        const struct nb_replica *c = &s->reps[r].ctx;
        losses[r] = s->reps[r].loss; /* NULL where a replica had no rows */
        w[r] = reduction == NB_REDUCE_MEAN ? (double)c->rows / (double)c->global_rows : 1.0;
    }
    return sum_in_order(s->n, losses, w, 1.0, true);
}

/* Across processes: every process says how many rows it has (its local
 * batch), and each replica's global rows become the sum over the processes,
 * so MEAN weighs every row of the global batch alike. *rows: the global count. */
static nb_status world_rows(nb_mirrored *s, const char *who, int n_vars, nb_reduction reduction, int64_t *rows)
{
    char desc[64];
    snprintf(desc, sizeof desc, "%d variables, %s", n_vars, reduction == NB_REDUCE_MEAN ? "MEAN" : "SUM");
    int64_t total = 0;
    nb_status st = nb__world_handshake(who, who, desc, *rows, &total, NULL);
    if (!st) {
        for (int r = 0; r < s->n; r++)
            s->reps[r].ctx.global_rows = total;
        *rows = total;
    }
    return st;
}

/* The loss of the whole global batch: this process's (its replicas' losses
 * already weighted by the global rows) summed with the other processes',
 * whether the caller asked for it or not, since every rank must make the same
 * calls. To *loss (when not NULL) as an f64 scalar on the current device. */
nb_status nb__mirrored_world_loss(nb_mirrored *s, const char *who, nb_reduction reduction, nb_tensor **loss)
{
    double v = 0; /* a process with no rows adds nothing */
    bool had_error = nb_error() != NB_OK;
    nb_scope *scope = nb_scope_begin();
    nb_tensor *local = nb__mirrored_combine_losses(s, reduction);
    if (local)
        v = nb_tensor_item(local);
    nb_scope_end(scope);
    nb_status st = had_error ? NB_OK : nb_error();
    if (!st)
        st = nb__world_sum(who, &v, 1, NB_F64, NULL); /* v is on this stack: the world's copy */
    if (!st && loss && !(*loss = nb_scalar(NB_F64, v)))
        st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    return st;
}

nb_status nb__mirrored_step_check(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                                  const void *fn, int n_inputs, nb_reduction reduction, const char *who)
{
    if (nb__capture_check(NULL, who, "a mirrored strategy's call"))
        return nb_error();
    if (!s || !opt || !fn)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, !s ? "strategy" : !opt ? "optimizer" : "fn");
    if (reduction != NB_REDUCE_SUM && reduction != NB_REDUCE_MEAN)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", who, (int)reduction);
    if (n_inputs < 1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: a step needs at least one input to split", who);
    if (called_from_replica(s, who))
        return NB_ERR_INVALID_ARGUMENT;
    return check_vars(s, who, n_vars, vars);
}

nb_status nb__mirrored_step_prepare(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                                    int n_inputs, nb_tensor *const *inputs, nb_reduction reduction, const char *who)
{
    int64_t rows = 0;
    nb_status st = reserve_vars(s, n_vars, who);
    if (!st)
        st = split_batch(s, who, n_inputs, inputs, &rows);
    if (!st && s->world)
        st = world_rows(s, who, n_vars, reduction, &rows);
    if (!st && rows == 0)
        st = nb__fail(NB_ERR_SHAPE, "%s: the batch has no rows", who);
    if (!st)
        st = prepare_slots(s, opt, n_vars, vars, who);
    return st;
}

void nb__mirrored_dispatch(nb_mirrored *s, nb_job_fn fn, void *job) { dispatch(s, fn, job); }

nb_status nb__mirrored_raise(nb_mirrored *s, const char *who) { return raise_replica_error(s, who); }

nb_status nb_mirrored_step(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                           nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                           nb_reduction reduction, nb_tensor **loss)
{
    const char *who = "nb_mirrored_step";
    if (loss)
        *loss = NULL;
    nb_status st = nb__mirrored_step_check(s, opt, n_vars, vars, (const void *)fn, n_inputs, reduction, who);
    if (st)
        return st;

    pthread_mutex_lock(&s->call_lock);
    st = nb__mirrored_step_prepare(s, opt, n_vars, vars, n_inputs, inputs, reduction, who);
    if (!st) {
        step_job j = {opt, n_vars, vars, fn, user, n_inputs, inputs, reduction, nb__optimizer_next_step(opt), NULL,
                      who};
        dispatch(s, step_on_replica, &j);
        st = raise_replica_error(s, who);
        if (!st) {
            nb__optimizer_advance(opt);
            s->steps++;
            s->collective_calls += s->plan.n_buckets;
            s->last_buckets = s->plan.n_buckets;
            if (s->world)
                st = nb__mirrored_world_loss(s, who, reduction, loss);
            else if (loss && !(*loss = nb__mirrored_combine_losses(s, reduction)))
                st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        }
        for (int r = 0; r < s->n; r++) {
            nb__release(s->reps[r].loss);
            s->reps[r].loss = NULL;
        }
    }
    pthread_mutex_unlock(&s->call_lock);
    return st;
}
