/* The processes a strategy spans, over MPI (world.h says what each call
 * promises). Every wait is a nonblocking MPI call polled against the deadline,
 * never a blocking one: a dead or silent rank becomes an error on the others
 * instead of a hang.
 *
 * After a timeout. A wait that times out leaves MPI operations pending, and a
 * rank that was only slow may answer later, when its message lands in
 * whatever the receive names, or MPI reads what a send names. So no pending
 * operation may name memory that somebody frees:
 * - every pending receive is cancelled and its completion awaited for at most
 *   SETTLE_S (an unmatched receive cancels at once; one matched part-way
 *   through a message cannot be), then its handle is let go;
 * - sends are not cancelled (OpenMPI cannot, MPI 4 deprecates it), and a
 *   send to a dead rank may never complete: what a send reads must outlive
 *   it, as below;
 * - the handshake sends and receives headers in the world's own memory, and
 *   a broadcast (which cannot be cancelled at all) and a sum the caller cannot
 *   keep go through a copy the world owns: after a timeout that memory is
 *   kept to the end of the process (never freed while a rank is stuck);
 * - a message between two ranks is sent from the world's copy, which a send
 *   that timed out keeps until a later look finds it complete (the
 *   asynchronous trainer goes on after a worker stops taking its messages);
 * - a sum in place in the caller's buffer (the gradient buckets: no copy on
 *   the hot path), and a message received into the caller's buffer whose
 *   receive could not be cancelled, tell the caller through *kept that an
 *   operation on it is still pending, and the caller then hands that memory
 *   to nb__world_keep instead of freeing it.
 * A collective that times out breaks the world for good: every later
 * collective, and every later message, fails at once, and MPI_Finalize is not
 * called at exit (it would wait for the dead rank). */
#include "world.h"

#include "nb_config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if NB_HAVE_MPI
#include <mpi.h>
#include <sched.h>
#endif

#define DEFAULT_TIMEOUT 300.0

static struct {
    pthread_mutex_t lock;
    bool joined, we_initialised, broken;
    bool stuck; /* requests left pending for a rank that never answered: no MPI_Finalize */
    int rank, size;
    double timeout;
    int64_t calls; /* collectives made so far: each handshake carries the count */
    nb_status broken_code;
    char broken_message[512];
} W = {PTHREAD_MUTEX_INITIALIZER, false, false, false, false, 0, 1, 0, 0, NB_OK, ""};

int nb__world_rank(void) { return W.rank; }
int nb__world_size(void) { return W.size; }

double nb__world_timeout(void)
{
    if (W.timeout > 0)
        return W.timeout;
    const char *e = getenv("NB_WORLD_TIMEOUT");
    double t = e && *e ? strtod(e, NULL) : 0;
    return t > 0 ? t : DEFAULT_TIMEOUT;
}

void nb__world_set_timeout(double seconds) { W.timeout = seconds > 0 ? seconds : 0; }

#if NB_HAVE_MPI

/* Buffers kept from one collective to the next (collectives come from one
 * thread at a time): the ring's receive buffer, and the handshake's headers,
 * requests and flags for every rank. */
static void *g_ring_tmp;
static size_t g_ring_bytes;
static struct hs_header *g_headers, *g_mine;
static MPI_Request *g_reqs;
static bool *g_done;

/* How long a timed-out wait waits for its receives' cancels: an unmatched
 * receive cancels at once, so this only bounds the rare one that cannot. */
#define SETTLE_S 0.05

/* Memory a pending operation may still read or write, handed over at a
 * timeout: kept reachable (and never freed) until the process ends. */
static pthread_mutex_t g_keep_lock = PTHREAD_MUTEX_INITIALIZER;
static void **g_kept;
static size_t g_n_kept, g_kept_cap;

/* Messages between two ranks whose sends timed out: each with the world's
 * copy of what it sends, freed when a later look finds the send complete
 * (under g_p2p, below). */
typedef struct pending_send {
    MPI_Request req;
    void *copy;
} pending_send;
static pending_send *g_pending;
static size_t g_n_pending, g_pending_cap;

/* Finalises MPI at exit when the library started it, unless a rank stopped
 * answering: MPI_Finalize would wait for it for ever, so the process then
 * simply ends (mpirun reports that it did not finalise). */
static void world_exit(void)
{
    if (W.stuck) /* requests may still point into the buffers */
        return;
    free(g_ring_tmp), free(g_headers), free(g_mine), free(g_reqs), free(g_done), free(g_pending);
    g_ring_tmp = NULL, g_headers = NULL, g_mine = NULL, g_reqs = NULL, g_done = NULL, g_pending = NULL;
    int finalized = 0;
    if (W.we_initialised && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
        MPI_Finalize();
}

/* Whether a process launcher (mpirun, mpiexec, srun) started this process:
 * the variables their process managers set. Without one, MPI is not started
 * (a singleton MPI_Init costs time and leaves its allocations behind). */
static bool launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK",
                                       "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

nb_status nb__world_join(const char *who)
{
    pthread_mutex_lock(&W.lock);
    if (!W.joined) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited && !launched()) {
            W.joined = true; /* one process: MPI stays off */
            pthread_mutex_unlock(&W.lock);
            return NB_OK;
        }
        if (!inited) {
            int provided = 0;
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
                pthread_mutex_unlock(&W.lock);
                return nb__fail(NB_ERR_BACKEND, "%s: MPI could not start (MPI_Init_thread failed)", who);
            }
            W.we_initialised = true;
            atexit(world_exit);
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &W.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &W.size);
        W.joined = true;
    }
    pthread_mutex_unlock(&W.lock);
    return NB_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Records a failure that breaks the world; returns its code. */
static nb_status world_fail(nb_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static nb_status world_fail(nb_status code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code == NB_ERR_TIMEOUT || code == NB_ERR_BACKEND)
        W.stuck = true;
    if (!W.broken) {
        W.broken = true;
        W.broken_code = code;
        snprintf(W.broken_message, sizeof W.broken_message, "%s", msg);
    }
    return nb__fail(code, "%s", msg);
}

static nb_status already_broken(const char *who)
{
    return nb__fail(W.broken_code, "%s: the processes can no longer work together after an earlier failure: %s", who,
                    W.broken_message);
}

/* Tests each request not yet done once; done[i] says which completed.
 * Returns how many are still pending. */
static int test_each(int n, MPI_Request *reqs, bool *done)
{
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (done[i])
            continue;
        int flag = 0;
        if (MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            flag = 0;
        done[i] = flag != 0;
        left += !done[i];
    }
    return left;
}

/* Polls reqs until all are complete or the deadline passes. MPI moves a
 * nonblocking collective on only inside its calls, so for the first second the
 * looks come back to back (yielding the core between them); after that a rank
 * is late, and it sleeps a millisecond between looks so as to leave the core
 * to others. done[i] says which completed. */
static bool wait_all(int n, MPI_Request *reqs, bool *done, double deadline)
{
    int left = 0;
    for (int i = 0; i < n; i++)
        left += !done[i];
    const double patient = now_s() + 1.0;
    for (int spins = 0; left > 0; spins++) {
        left = test_each(n, reqs, done);
        if (left == 0)
            break;
        if ((spins & 63) == 0) {
            double t = now_s();
            if (t > deadline)
                return false;
            if (t > patient) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        sched_yield();
    }
    return true;
}

void nb__world_keep(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_keep_lock);
    if (g_n_kept == g_kept_cap) {
        size_t cap = g_kept_cap ? 2 * g_kept_cap : 16;
        void **k = realloc(g_kept, cap * sizeof *k);
        if (k)
            g_kept = k, g_kept_cap = cap;
    }
    if (g_n_kept < g_kept_cap) /* else it is merely leaked: still never freed */
        g_kept[g_n_kept++] = p;
    pthread_mutex_unlock(&g_keep_lock);
}

/* After a wait that timed out (or a post that failed part-way): cancels every
 * pending receive among reqs (the even indices; the odd ones are sends, which
 * are left to run), waits at most SETTLE_S for the cancels to complete, then
 * lets go of the handles still pending, whose memory the caller must keep.
 * A request never posted must be MPI_REQUEST_NULL. lock, when not NULL, is
 * held around each MPI call. done[i] says afterwards which ended; returns
 * whether any is still pending. */
static bool settle(int n, MPI_Request *reqs, bool *done, pthread_mutex_t *lock)
{
    if (lock)
        pthread_mutex_lock(lock);
    for (int i = 0; i < n; i += 2)
        if (!done[i] && reqs[i] != MPI_REQUEST_NULL)
            MPI_Cancel(&reqs[i]);
    if (lock)
        pthread_mutex_unlock(lock);
    const double until = now_s() + SETTLE_S;
    int left;
    do {
        if (lock)
            pthread_mutex_lock(lock);
        left = test_each(n, reqs, done);
        if (lock)
            pthread_mutex_unlock(lock);
        if (left)
            sched_yield();
    } while (left && now_s() < until);
    if (lock)
        pthread_mutex_lock(lock);
    for (int i = 0; i < n; i++)
        if (!done[i] && reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&reqs[i]); /* it runs on: its memory stays kept */
    if (lock)
        pthread_mutex_unlock(lock);
    return left > 0;
}

struct hs_header {
    uint32_t magic;
    int32_t rank;
    int64_t call;
    int64_t value;
    char kind[40];
    char desc[208];
};
typedef struct hs_header hs_header;

#define HS_MAGIC 0x6E62776Cu /* "nbwl" */
#define HS_TAG 7301

nb_status nb__world_handshake(const char *who, const char *kind, const char *desc, int64_t value, int64_t *sum,
                              int64_t *min)
{
    if (W.broken)
        return already_broken(who);
    if (sum)
        *sum = value;
    if (min)
        *min = value;
    if (W.size <= 1)
        return NB_OK;
    const int n = W.size, me = W.rank;
    if (!g_headers) { /* the world's size never changes: made once */
        g_headers = malloc(sizeof *g_headers * (size_t)n);
        g_mine = malloc(sizeof *g_mine);
        g_reqs = malloc(sizeof *g_reqs * (size_t)(2 * n));
        g_done = malloc(sizeof *g_done * (size_t)(2 * n));
        if (!g_headers || !g_mine || !g_reqs || !g_done) {
            free(g_headers), free(g_mine), free(g_reqs), free(g_done);
            g_headers = NULL, g_mine = NULL, g_reqs = NULL, g_done = NULL;
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        }
    }
    /* the world's memory, not this frame's: a send to a rank that never takes
     * it stays pending after a timeout */
    hs_header *mine = g_mine;
    memset(mine, 0, sizeof *mine);
    mine->magic = HS_MAGIC;
    mine->rank = me;
    mine->call = W.calls++;
    mine->value = value;
    snprintf(mine->kind, sizeof mine->kind, "%s", kind);
    snprintf(mine->desc, sizeof mine->desc, "%s", desc ? desc : "");
    hs_header *theirs = g_headers;
    MPI_Request *reqs = g_reqs;
    bool *done = g_done;
    memset(done, 0, sizeof *done * (size_t)(2 * n));
    int bad_post = 0;
    for (int r = 0; r < n; r++) {
        reqs[2 * r] = reqs[2 * r + 1] = MPI_REQUEST_NULL;
        if (r == me) {
            done[2 * r] = done[2 * r + 1] = true;
            continue;
        }
        bad_post |= MPI_Irecv(&theirs[r], (int)sizeof(hs_header), MPI_BYTE, r, HS_TAG, MPI_COMM_WORLD, &reqs[2 * r]);
        bad_post |= MPI_Isend(mine, (int)sizeof(hs_header), MPI_BYTE, r, HS_TAG, MPI_COMM_WORLD, &reqs[2 * r + 1]);
    }
    nb_status st = NB_OK;
    const double t = nb__world_timeout();
    if (bad_post) {
        settle(2 * n, reqs, done, NULL); /* the headers are the world's: kept while stuck */
        st = world_fail(NB_ERR_BACKEND, "%s: MPI could not send to the other processes", who);
    } else if (!wait_all(2 * n, reqs, done, now_s() + t)) {
        char names[160] = "";
        int missing = 0;
        /* A rank not heard from is the one to name (the sends may be stuck
         * too when nobody answered); when every rank was heard from, the one
         * that never took this rank's header: it died just after sending its
         * own. */
        for (int pass = 0; pass < 2 && !missing; pass++)
            for (int r = 0; r < n; r++)
                if (r != me && !done[2 * r + pass]) {
                    size_t len = strlen(names);
                    if (missing++ < 8)
                        snprintf(names + len, sizeof names - len, "%s%d", len ? ", " : "", r);
                }
        settle(2 * n, reqs, done, NULL);
        st = world_fail(NB_ERR_TIMEOUT,
                        "%s: rank %s of %d did not answer within %g s at %s (call %lld): it died or stopped "
                        "answering (this is rank %d)",
                        who, missing ? names : "?", n, t, kind, (long long)mine->call, me);
    } else {
        for (int r = 0; r < n && !st; r++) {
            if (r == me)
                continue;
            const hs_header *h = &theirs[r];
            if (h->magic != HS_MAGIC) {
                st = world_fail(NB_ERR_BACKEND, "%s: rank %d sent a message that is not nabla's", who, r);
            } else if (h->call != mine->call || strcmp(h->kind, mine->kind) != 0 ||
                       strcmp(h->desc, mine->desc) != 0) {
                st = world_fail(NB_ERR_INVALID_ARGUMENT,
                                "%s: the processes differ: rank %d is at %s %s (call %lld) while rank %d is at %s %s "
                                "(call %lld); every process must make the same calls in the same order",
                                who, r, h->kind, h->desc, (long long)h->call, me, mine->kind, mine->desc,
                                (long long)mine->call);
            } else {
                if (sum)
                    *sum += h->value;
                if (min && h->value < *min)
                    *min = h->value;
            }
        }
    }
    return st;
}

static MPI_Datatype mpi_type(nb_dtype d)
{
    switch (d) {
    case NB_F32: return MPI_FLOAT;
    case NB_F64: return MPI_DOUBLE;
    case NB_I32: return MPI_INT32_T;
    case NB_I64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
    }
}

/* Waits for one request against the deadline; what names the operation. */
static nb_status wait_one(const char *who, MPI_Request *req, const char *what)
{
    bool done = false;
    double t = nb__world_timeout();
    if (!wait_all(1, req, &done, now_s() + t))
        return world_fail(NB_ERR_TIMEOUT,
                          "%s: %s across %d processes did not finish within %g s: a rank died or stopped answering "
                          "(this is rank %d)",
                          who, what, W.size, t, W.rank);
    return NB_OK;
}

/* dst[i] += src[i] for n elements of dtype (integers wrap, as unsigned). */
static void add_into(void *dst, const void *src, int64_t n, nb_dtype dtype)
{
    switch (dtype) {
    case NB_F32: {
        float *d = dst;
        const float *a = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += a[i];
        break;
    }
    case NB_F64: {
        double *d = dst;
        const double *a = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += a[i];
        break;
    }
    case NB_I32: {
        uint32_t *d = dst;
        const uint32_t *a = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += a[i];
        break;
    }
    default: {
        uint64_t *d = dst;
        const uint64_t *a = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += a[i];
        break;
    }
    }
}

/* One exchange of the ring: receives rc_n elements from prev into into, sends
 * sc_n from from to next; waits against the deadline. On failure *kept says
 * whether an operation on the caller's memory (anything but g_ring_tmp) is
 * still pending. */
static nb_status ring_exchange(const char *who, const char *phase, MPI_Datatype type, void *into, int64_t rc_n,
                               const void *from, int64_t sc_n, int prev, int next, int tag, double deadline,
                               bool *kept)
{
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    bool done[2] = {false, false};
    if (MPI_Irecv(into, (int)rc_n, type, prev, tag, MPI_COMM_WORLD, &reqs[0]) != MPI_SUCCESS)
        return world_fail(NB_ERR_BACKEND, "%s: MPI could not receive from rank %d", who, prev);
    if (MPI_Isend((void *)from, (int)sc_n, type, next, tag, MPI_COMM_WORLD, &reqs[1]) != MPI_SUCCESS) {
        done[1] = true;
        settle(2, reqs, done, NULL);
        *kept = !done[0] && into != g_ring_tmp;
        return world_fail(NB_ERR_BACKEND, "%s: MPI could not send to rank %d", who, next);
    }
    if (!wait_all(2, reqs, done, deadline)) {
        const bool got = done[0];
        settle(2, reqs, done, NULL);
        *kept = !done[1] || (!done[0] && into != g_ring_tmp);
        return world_fail(NB_ERR_TIMEOUT,
                          "%s: rank %d did not %s within %g s during the sum across %d processes (%s): it died or "
                          "stopped answering (this is rank %d)",
                          who, got ? next : prev, got ? "take its part" : "send its part", nb__world_timeout(),
                          W.size, phase, W.rank);
    }
    return NB_OK;
}

/* The sum as a ring over the ranks, on nonblocking point-to-point calls:
 * reduce-scatter (W - 1 exchanges, each rank ending with the full sum of one
 * W-th of the buffer), then all-gather (W - 1 more). Every element is added in
 * an order fixed by the ranks' count, so two runs give the same bits; each
 * rank sends and receives about two buffers' worth whatever W is. (OpenMPI's
 * own MPI_Iallreduce took 2.5 times as long as its blocking MPI_Allreduce on
 * 25 MiB; this ring takes as long as the blocking call.) */
static nb_status ring_sum(const char *who, char *buf, int64_t count, nb_dtype dtype, MPI_Datatype type, bool *kept)
{
    const int n = W.size, r = W.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t es = nb_dtype_size(dtype);
    const int64_t most = count / n + 1;
    if ((size_t)most * es > g_ring_bytes) {
        void *t = realloc(g_ring_tmp, (size_t)most * es);
        if (!t)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for the sum across processes", who);
        g_ring_tmp = t;
        g_ring_bytes = (size_t)most * es;
    }
    const double deadline = now_s() + nb__world_timeout();
#define PART_LO(c) (count * (int64_t)(c) / n)
#define PART_N(c) (PART_LO((c) + 1) - PART_LO(c))
    for (int step = 0; step < n - 1; step++) {
        int sc = (r - step + n) % n, rc = (r - step - 1 + n) % n;
        nb_status st = ring_exchange(who, "reduce-scatter", type, g_ring_tmp, PART_N(rc), buf + PART_LO(sc) * es,
                                     PART_N(sc), prev, next, 7401, deadline, kept);
        if (st)
            return st;
        add_into(buf + PART_LO(rc) * es, g_ring_tmp, PART_N(rc), dtype);
    }
    for (int step = 0; step < n - 1; step++) {
        int sc = (r + 1 - step + n) % n, rc = (r - step + n) % n;
        nb_status st = ring_exchange(who, "all-gather", type, buf + PART_LO(rc) * es, PART_N(rc),
                                     buf + PART_LO(sc) * es, PART_N(sc), prev, next, 7402, deadline, kept);
        if (st)
            return st;
    }
#undef PART_LO
#undef PART_N
    return NB_OK;
}

nb_status nb__world_sum(const char *who, void *buf, int64_t count, nb_dtype dtype, bool *kept)
{
    if (kept)
        *kept = false;
    if (W.broken)
        return already_broken(who);
    if (W.size <= 1 || count <= 0)
        return NB_OK;
    MPI_Datatype type = mpi_type(dtype);
    if (type == MPI_DATATYPE_NULL)
        return nb__fail(NB_ERR_DTYPE, "%s: %s gradients cannot be summed across processes (f32, f64, i32, i64 can)",
                        who, nb_dtype_name(dtype));
    const size_t es = nb_dtype_size(dtype), bytes = (size_t)count * es;
    /* a caller that cannot keep buf after a timeout sums in the world's copy */
    char *work = buf, *copy = NULL;
    if (!kept) {
        if (!(copy = malloc(bytes)))
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for the sum across processes", who);
        memcpy(copy, buf, bytes);
        work = copy;
    }
    char desc[96];
    snprintf(desc, sizeof desc, "%lld %s", (long long)count, nb_dtype_name(dtype));
    nb_status st = nb__world_handshake(who, "a sum", desc, 0, NULL, NULL);
    /* pieces whose parts each fit an int count */
    const int64_t piece = ((int64_t)1 << 30) * W.size;
    bool held = false;
    for (int64_t done = 0; done < count && !st; done += piece) {
        int64_t k = count - done < piece ? count - done : piece;
        st = ring_sum(who, work + (size_t)done * es, k, dtype, type, &held);
    }
    if (copy) {
        if (!st)
            memcpy(buf, copy, bytes);
        if (held)
            nb__world_keep(copy);
        else
            free(copy);
    } else {
        *kept = held;
    }
    return st;
}

nb_status nb__world_broadcast(const char *who, void *buf, size_t bytes)
{
    if (W.broken)
        return already_broken(who);
    if (W.size <= 1 || bytes == 0)
        return NB_OK;
    /* through the world's copy: a broadcast cannot be cancelled, so after a
     * timeout it stays pending on that copy, which is then kept */
    char *copy = malloc(bytes);
    if (!copy)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for a broadcast of %zu bytes", who, bytes);
    if (W.rank == 0)
        memcpy(copy, buf, bytes);
    char desc[64];
    snprintf(desc, sizeof desc, "%zu bytes", bytes);
    nb_status st = nb__world_handshake(who, "a broadcast", desc, 0, NULL, NULL);
    bool pending = false;
    for (size_t done = 0; done < bytes && !st;) {
        size_t k = bytes - done < ((size_t)1 << 30) ? bytes - done : ((size_t)1 << 30);
        MPI_Request req;
        if (MPI_Ibcast(copy + done, (int)k, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS) {
            st = world_fail(NB_ERR_BACKEND, "%s: MPI_Ibcast failed", who);
            break;
        }
        st = wait_one(who, &req, "the broadcast");
        pending = st != NB_OK;
        done += k;
    }
    if (!st)
        memcpy(buf, copy, bytes);
    if (pending)
        nb__world_keep(copy);
    else
        free(copy);
    return st;
}

/* ---- messages between two ranks (the asynchronous trainer's) ------------------------ */

/* Several threads of a process send and receive at once (the trainer's
 * workers), while MPI runs MPI_THREAD_SERIALIZED: one of them in MPI at a time. */
static pthread_mutex_t g_p2p = PTHREAD_MUTEX_INITIALIZER;

/* Polls one request until it completes (its status to *status, which may be
 * MPI_STATUS_IGNORE) or the deadline passes, holding the lock only inside MPI. */
static bool wait_request(MPI_Request *req, MPI_Status *status, double deadline)
{
    const double patient = now_s() + 1.0;
    for (int spins = 0;; spins++) {
        int flag = 0;
        pthread_mutex_lock(&g_p2p);
        if (MPI_Test(req, &flag, status) != MPI_SUCCESS)
            flag = 0;
        pthread_mutex_unlock(&g_p2p);
        if (flag)
            return true;
        if ((spins & 15) == 0) {
            double t = now_s();
            if (t > deadline)
                return false;
            if (t > patient) {
                nanosleep(&(struct timespec){0, 200000}, NULL);
                continue;
            }
        }
        sched_yield();
    }
}

/* Frees the copies of the timed-out sends that have completed since. Called
 * with g_p2p held. */
static void reap_pending(void)
{
    size_t kept = 0;
    for (size_t i = 0; i < g_n_pending; i++) {
        int flag = 0;
        if (MPI_Test(&g_pending[i].req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            flag = 0;
        if (flag)
            free(g_pending[i].copy);
        else
            g_pending[kept++] = g_pending[i];
    }
    g_n_pending = kept;
}

nb_status nb__world_send(const char *who, int dest, int tag, const void *buf, size_t bytes)
{
    if (W.broken)
        return already_broken(who);
    if (bytes > (size_t)INT32_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: a message of %zu bytes to rank %d is over MPI's 2 GiB", who,
                        bytes, dest);
    /* sent from the world's copy, which outlives a timeout: the caller's
     * buffer (often on its stack) is free once this returns, whatever happened */
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for a message of %zu bytes", who, bytes);
    memcpy(copy, buf, bytes);
    MPI_Request req;
    pthread_mutex_lock(&g_p2p);
    if (g_n_pending)
        reap_pending();
    int rc = MPI_Isend(copy, (int)bytes, MPI_BYTE, dest, tag, MPI_COMM_WORLD, &req);
    pthread_mutex_unlock(&g_p2p);
    if (rc != MPI_SUCCESS) {
        free(copy);
        return world_fail(NB_ERR_BACKEND, "%s: MPI could not send to rank %d", who, dest);
    }
    double t = nb__world_timeout();
    if (!wait_request(&req, MPI_STATUS_IGNORE, now_s() + t)) {
        W.stuck = true;
        /* the rank may still take it: the copy lives until the send completes */
        pthread_mutex_lock(&g_p2p);
        if (g_n_pending == g_pending_cap) {
            size_t cap = g_pending_cap ? 2 * g_pending_cap : 8;
            pending_send *p = realloc(g_pending, cap * sizeof *p);
            if (p)
                g_pending = p, g_pending_cap = cap;
        }
        if (g_n_pending < g_pending_cap) {
            g_pending[g_n_pending++] = (pending_send){req, copy};
        } else { /* no room to watch it: it runs on, its copy kept for good */
            MPI_Request_free(&req);
            nb__world_keep(copy);
        }
        pthread_mutex_unlock(&g_p2p);
        return nb__fail(NB_ERR_TIMEOUT, "%s: rank %d did not take a message within %g s: it died or stopped answering "
                        "(this is rank %d)", who, dest, t, W.rank);
    }
    free(copy);
    return NB_OK;
}

nb_status nb__world_recv(const char *who, int src, int tag, void *buf, size_t bytes, size_t *got, bool *kept)
{
    *kept = false;
    if (W.broken)
        return already_broken(who);
    if (bytes > (size_t)INT32_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: a message of %zu bytes from rank %d is over MPI's 2 GiB", who,
                        bytes, src);
    MPI_Request req;
    MPI_Status status;
    pthread_mutex_lock(&g_p2p);
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, MPI_COMM_WORLD, &req);
    pthread_mutex_unlock(&g_p2p);
    if (rc != MPI_SUCCESS)
        return world_fail(NB_ERR_BACKEND, "%s: MPI could not receive from rank %d", who, src);
    double t = nb__world_timeout();
    if (!wait_request(&req, &status, now_s() + t)) {
        bool done = false;
        *kept = settle(1, &req, &done, &g_p2p);
        return world_fail(NB_ERR_TIMEOUT, "%s: rank %d did not answer within %g s: it died or stopped answering "
                          "(this is rank %d)", who, src, t, W.rank);
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (got)
        *got = (size_t)count;
    return NB_OK;
}

void nb__world_lost(void) { W.stuck = true; }

bool nb__world_probe(int tag, int *src, size_t *bytes)
{
    if (W.broken || W.size <= 1)
        return false;
    int flag = 0, count = 0;
    MPI_Status status;
    pthread_mutex_lock(&g_p2p);
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &flag, &status) != MPI_SUCCESS)
        flag = 0;
    if (flag)
        MPI_Get_count(&status, MPI_BYTE, &count);
    pthread_mutex_unlock(&g_p2p);
    if (flag) {
        *src = status.MPI_SOURCE;
        *bytes = (size_t)count;
    }
    return flag != 0;
}

#else /* no MPI: one process */

nb_status nb__world_join(const char *who)
{
    (void)who;
    W.joined = true;
    return NB_OK;
}

nb_status nb__world_handshake(const char *who, const char *kind, const char *desc, int64_t value, int64_t *sum,
                              int64_t *min)
{
    (void)who, (void)kind, (void)desc;
    if (sum)
        *sum = value;
    if (min)
        *min = value;
    return NB_OK;
}

nb_status nb__world_sum(const char *who, void *buf, int64_t count, nb_dtype dtype, bool *kept)
{
    (void)who, (void)buf, (void)count, (void)dtype;
    if (kept)
        *kept = false;
    return NB_OK;
}

nb_status nb__world_broadcast(const char *who, void *buf, size_t bytes)
{
    (void)who, (void)buf, (void)bytes;
    return NB_OK;
}

nb_status nb__world_send(const char *who, int dest, int tag, const void *buf, size_t bytes)
{
    (void)tag, (void)buf, (void)bytes;
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: there is no rank %d: this build has no MPI", who, dest);
}

nb_status nb__world_recv(const char *who, int src, int tag, void *buf, size_t bytes, size_t *got, bool *kept)
{
    (void)tag, (void)buf, (void)bytes, (void)got;
    *kept = false;
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: there is no rank %d: this build has no MPI", who, src);
}

void nb__world_lost(void) {}

void nb__world_keep(void *p) { (void)p; /* never called without MPI: nothing times out */ }

bool nb__world_probe(int tag, int *src, size_t *bytes)
{
    (void)tag, (void)src, (void)bytes;
    return false;
}

#endif
