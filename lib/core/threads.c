/* A small fixed thread pool for splitting large kernels across cores. */
#include "core.h"
#include "op_phases.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define NB_MAX_THREADS 64

typedef struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work_cv, done_cv;
    int n_threads;                 /* workers, not counting the caller */
    atomic_uint_fast64_t generation; /* bumped for each job (read unlocked while a worker spins) */
    nb_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_int_fast64_t next; /* next chunk start */
    int open;                 /* the current job still takes workers */
    int active;               /* workers in the current job's chunks */
    pthread_mutex_t job_lock; /* one job at a time */
} pool;

static pool g_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
                      0, 0, NULL, NULL, 0, 0, 0, 0, 0, PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t g_pool_once = PTHREAD_ONCE_INIT;

static void run_chunks(pool *p)
{
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n)
            break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e);
    }
}

/* How long a worker looks for the next job before it sleeps (about 0.1 ms
 * on an Intel Xeon): a sleeping thread takes tens of microseconds to wake,
 * as long as a kernel the pool splits may take, and ops come one after
 * another. */
#define NB_POOL_SPINS 4096

static inline void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A worker joins a job only while it is open: one that wakes after the
 * caller has run out of chunks leaves it alone, so the caller never waits
 * for a thread that is slow to wake. */
static void *worker(void *arg)
{
    pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        for (int i = 0; i < NB_POOL_SPINS && atomic_load(&p->generation) == seen; i++)
            spin_pause();
        pthread_mutex_lock(&p->lock);
        while (atomic_load(&p->generation) == seen)
            pthread_cond_wait(&p->work_cv, &p->lock);
        seen = atomic_load(&p->generation);
        if (!p->open) {
            pthread_mutex_unlock(&p->lock);
            continue;
        }
        p->active++;
        pthread_mutex_unlock(&p->lock);
        run_chunks(p);
        pthread_mutex_lock(&p->lock);
        if (--p->active == 0)
            pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

static void pool_init(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("NB_NUM_THREADS");
    if (env && atoi(env) > 0)
        cores = atoi(env);
    if (cores < 1)
        cores = 1;
    if (cores > NB_MAX_THREADS)
        cores = NB_MAX_THREADS;
    int started = 0;
    for (int i = 0; i < cores - 1; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker, &g_pool) == 0)
            started++;
        pthread_attr_destroy(&attr);
    }
    g_pool.n_threads = started;
}

/* ---- per-thread caches ---- */

static pthread_key_t g_exit_key;
static pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;
static _Thread_local bool tl_tracked;

/* The upper rooms' drains (nb__thread_exit_hook): written under the lock, a
 * slot before the count that publishes it. */
static pthread_mutex_t g_hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*g_hooks[NB_THREAD_EXIT_HOOKS])(void);
static atomic_int g_n_hooks;

bool nb__thread_exit_hook(void (*fn)(void))
{
    pthread_mutex_lock(&g_hooks_lock);
    int n = atomic_load_explicit(&g_n_hooks, memory_order_relaxed);
    bool ok = true;
    for (int i = 0; i < n && fn; i++)
        if (g_hooks[i] == fn)
            fn = NULL;
    if (fn && n == NB_THREAD_EXIT_HOOKS)
        ok = false;
    else if (fn) {
        g_hooks[n] = fn;
        atomic_store_explicit(&g_n_hooks, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_hooks_lock);
    return ok;
}

static void thread_exit(void *unused)
{
    (void)unused;
    int n = atomic_load_explicit(&g_n_hooks, memory_order_acquire);
    for (int i = 0; i < n; i++)
        g_hooks[i](); /* before the core's drains: they may release tensors into its pools */
    nb__scope_spares_drain();
    nb__tensor_pool_drain();
    nb__storage_pool_drain();
    nb__phase_thread_exit();
}

static void exit_key_init(void) { (void)pthread_key_create(&g_exit_key, thread_exit); }

void nb__thread_track(void)
{
    if (tl_tracked)
        return;
    tl_tracked = true;
    pthread_once(&g_exit_once, exit_key_init);
    /* Any non-NULL value makes the destructor run at thread exit. */
    (void)pthread_setspecific(g_exit_key, &tl_tracked);
}

/* Set on threads whose kernels must not fan out (CPU replicas that already
 * occupy every core): their parallel loops run inline. */
static _Thread_local bool tl_serial;

void nb__thread_set_serial(bool on) { tl_serial = on; }

bool nb__thread_serial(void) { return tl_serial; }

int nb__thread_count(void)
{
    pthread_once(&g_pool_once, pool_init);
    return g_pool.n_threads + 1;
}

void nb__parallel_for(int64_t n, int64_t grain, nb_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    pthread_once(&g_pool_once, pool_init);
    pool *p = &g_pool;
    /* Small jobs, single-core machines, serial threads and nested calls run inline. */
    if (n < 2 * grain || p->n_threads == 0 || tl_serial || pthread_mutex_trylock(&p->job_lock) != 0) {
        fn(ctx, 0, n);
        return;
    }
    /* Four chunks a thread, so that the caller takes more of them while a
     * worker is still waking. */
    int64_t parts = ((int64_t)p->n_threads + 1) * 4;
    int64_t chunk = (n + parts - 1) / parts;
    if (chunk < grain)
        chunk = grain;
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->open = 1;
    p->active = 0;
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->lock);
    run_chunks(p);
    pthread_mutex_lock(&p->lock);
    p->open = 0; /* no chunk is left to claim: only those running are waited for */
    while (p->active > 0)
        pthread_cond_wait(&p->done_cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->job_lock);
}
