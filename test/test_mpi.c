/* The mirrored strategy across processes, one scenario per run, started by
 * test/mpi_run.sh under mpirun (each process with two logical CPU replicas):
 *
 *   test_mpi train           the world's final variables equal one process's on
 *                            the same global batches (f64, 1e-10), and two runs
 *                            give the same bits
 *   test_mpi capture         the step captured (nb_mirrored_capture) and replayed,
 *                            two steps eager between replays: the variables and
 *                            losses of eager steps, bit for bit, on every rank
 *   test_mpi mismatch        rank 1 makes a variable of another shape: every
 *                            rank fails, naming both
 *   test_mpi silent          rank 1 sleeps through a step: rank 0's step fails
 *                            with NB_ERR_TIMEOUT naming rank 1, within the
 *                            timeout
 *   test_mpi kill            rank 1 is killed in its step function: the same
 *   test_mpi capture-kill K  (3 processes) rank 1 dies during nb_mirrored_capture:
 *                            in its step function's recording (K = 0) or just
 *                            before its K-th message to another rank; ranks 0
 *                            and 2 must fail with NB_ERR_TIMEOUT naming the
 *                            call and a rank, within the deadline, get no
 *                            graph, and end with no tensor alive
 *   test_mpi replay-kill K   (3 processes) rank 1 dies between replays 2 and 3
 *                            (K = 0) or inside replay 3, just before its K-th
 *                            message: the survivors' replay 3 fails so, the
 *                            next fails at once, and the graph is freed
 *                            A K past the call's last message: rank 1 says so
 *                            ("past the end") instead of dying
 *   test_mpi slow eager|replay  rank 1 stalls past the deadline in the middle
 *                            of step 3's all-reduce (eager, or a replay of the
 *                            captured step), then sends on: rank 0 fails with
 *                            NB_ERR_TIMEOUT within the deadline, frees the
 *                            strategy (and graph), fills canary tensors and
 *                            drives MPI while rank 1's late messages arrive,
 *                            and finds the canaries intact; rank 1 fails with
 *                            NB_ERR_TIMEOUT too, and both end
 *   test_mpi resume-write DIR   trains 2K steps, rank 0 checkpointing after K,
 *                            and rank 0 writes the final variables to DIR
 *   test_mpi resume-read DIR    on any number of processes: resumes from DIR's
 *                            checkpoint, trains to 2K, and rank 0 compares with
 *                            the uninterrupted run's variables
 *
 * Rank 0 prints "test_mpi: <scenario> OK" when the scenario's promise held,
 * which is what mpi_run.sh looks for (mpirun's own status says less when a
 * rank was killed on purpose). A linear model on seeded data, f64, SGD, MEAN;
 * global batches of 12 rows, each process taking a contiguous share. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

#include "nb_config.h"

#include <nabla/checkpoint.h>
#include <nabla/distribute.h>

#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#if NB_HAVE_MPI
#include <mpi.h>
#endif

#define ROWS 240
#define FEATURES 5
#define BATCH 12
#define STEPS 8

static double g_x[ROWS * FEATURES], g_y[ROWS];

static void make_data(void)
{
    uint64_t s = 0x1234567ull;
    for (int i = 0; i < ROWS * FEATURES; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        g_x[i] = (double)(s >> 11) * 0x1.0p-53 * 2 - 1;
    }
    for (int i = 0; i < ROWS; i++) {
        double t = 0.5;
        for (int j = 0; j < FEATURES; j++)
            t += g_x[i * FEATURES + j] * (j + 1) * 0.3;
        g_y[i] = t;
    }
}

/* Rows [lo, hi) of global batch k for process rank of size: a contiguous share. */
static void share(int k, int rank, int size, int *lo, int *hi)
{
    int base = (k * BATCH) % ROWS;
    *lo = base + BATCH * rank / size;
    *hi = base + BATCH * (rank + 1) / size;
}

/* That share of batch k: features in *x, targets in *y (the current scope's). */
static void share_batch(int k, int rank, int size, nb_tensor **x, nb_tensor **y)
{
    int lo, hi;
    share(k, rank, size, &lo, &hi);
    *x = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, FEATURES), g_x + lo * FEATURES);
    *y = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, 1), g_y + lo);
}

typedef struct model {
    nb_mirrored *s;
    nb_variable *w, *b;
    nb_optimizer *opt;
} model;

static int g_kill_at = -1, g_sleep_at = -1, g_step;

/* Rank 1's death inside a call: armed, it dies in the step function's
 * g_die_at_call-th run, or just before its g_die_at_send-th message. */
static atomic_bool g_die_armed;
static atomic_int g_fn_calls, g_sends;
static int g_die_at_call = -1, g_die_at_send = -1;

/* Rank 1's stall: armed, its first all-gather message of the ring that sums a
 * bucket (tag 7402 in lib/distribute/world.c; more than one element, which
 * the loss's parts never are) waits g_stall_s before it goes. */
#define RING_GATHER_TAG 7402
static atomic_bool g_stall_armed;
static double g_stall_s;

#if NB_HAVE_MPI
/* Every message the library sends to another rank starts here (the MPI
 * profiling interface): counted, and the point where rank 1 may die. */
int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req)
{
    int n = atomic_fetch_add(&g_sends, 1) + 1;
    if (atomic_load(&g_die_armed) && n == g_die_at_send)
        raise(SIGKILL);
    if (tag == RING_GATHER_TAG && count > 1 && atomic_exchange(&g_stall_armed, false)) {
        struct timespec ts = {(time_t)g_stall_s, (long)((g_stall_s - (double)(time_t)g_stall_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}
#endif

static nb_status step_fn(nb_replica *r, int n_in, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                         nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_in, (void)user;
    if (g_step == g_kill_at)
        raise(SIGKILL);
    if (atomic_fetch_add(&g_fn_calls, 1) + 1 == g_die_at_call && atomic_load(&g_die_armed))
        raise(SIGKILL);
    nb_tape *t = nb_tape_begin();
    nb_tensor *pred = nb_add(nb_matmul(in[0], nb_read(vars[0])), nb_read(vars[1]));
    *loss = nb_mean_all(nb_square(nb_sub(pred, in[1])));
    return nb_tape_gradient_vars(t, *loss, n_vars, vars, grads);
}

static bool model_new(model *m, bool world, int bad_shape)
{
    m->s = world ? nb_mirrored_new_world(2, NULL) : nb_mirrored_new(2, NULL);
    if (!m->s)
        return false;
    nb_scope *sc = nb_scope_begin();
    nb_tensor *w0 = nb_random_normal(NB_F64, NB_SHAPE(FEATURES + bad_shape, 1), 0, 0.1, 7);
    m->w = nb_mirrored_variable_new(m->s, "w", w0);
    m->b = m->w ? nb_mirrored_variable_new(m->s, "b", nb_zeros(NB_F64, NB_SHAPE(1))) : NULL;
    nb_scope_end(sc);
    m->opt = nb_sgd_new(0.1);
    return m->w && m->b;
}

static void model_free(model *m)
{
    if (m->w)
        nb_variable_free(m->w);
    if (m->b)
        nb_variable_free(m->b);
    nb_optimizer_free(m->opt);
    nb_mirrored_free(m->s);
}

/* Steps [from, to) on this process's shares. */
static nb_status train(model *m, int from, int to)
{
    int rank = nb_mirrored_world_rank(m->s), size = nb_mirrored_world_size(m->s);
    for (int k = from; k < to; k++) {
        g_step = k;
        if (k == g_sleep_at && rank == 1)
            sleep(12);
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(k, rank, size, &x, &y);
        nb_status st = nb_mirrored_step(m->s, m->opt, NB_VARS(m->w, m->b), step_fn, NULL,
                                        NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL);
        nb_scope_end(sc);
        if (st)
            return st;
    }
    return NB_OK;
}

/* The variables' values: w then b. */
static void values(const model *m, double *out)
{
    nb_scope *sc = nb_scope_begin();
    nb_tensor_read(nb_read(m->w), out, sizeof(double) * FEATURES);
    nb_tensor_read(nb_read(m->b), out + FEATURES, sizeof(double));
    nb_scope_end(sc);
}

static int rank_of(void)
{
    const char *e = getenv("OMPI_COMM_WORLD_RANK");
    return e ? atoi(e) : 0;
}

static int scenario_train(void)
{
    double world[2][FEATURES + 1], one[FEATURES + 1];
    int rank = 0, size = 1;
    for (int run = 0; run < 2; run++) {
        model m = {0};
        CHECK(model_new(&m, true, 0));
        rank = nb_mirrored_world_rank(m.s), size = nb_mirrored_world_size(m.s);
        nb_mirrored_stats stats;
        CHECK_OK(nb_mirrored_get_stats(m.s, &stats));
        CHECK(stats.world_algorithm && !strcmp(stats.world_algorithm, "mpi")); /* CPU replicas */
        CHECK(nb_mirrored_world_replicas(m.s) == 2 * size);
        CHECK_OK(train(&m, 0, STEPS));
        values(&m, world[run]);
        model_free(&m);
    }
    /* one process, its two replicas on the whole global batches */
    model m = {0};
    CHECK(model_new(&m, false, 0));
    for (int k = 0; k < STEPS; k++) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(k, 0, 1, &x, &y);
        CHECK_OK(nb_mirrored_step(m.s, m.opt, NB_VARS(m.w, m.b), step_fn, NULL, NB_TENSORS(x, y),
                                  NB_REDUCE_MEAN, NULL));
        nb_scope_end(sc);
    }
    values(&m, one);
    model_free(&m);
    CHECKF(size >= 2, "%d process(es): run under mpirun -np 2 or more", size);
    double worst = 0;
    for (int i = 0; i <= FEATURES; i++)
        worst = fmax(worst, fabs(world[0][i] - one[i]));
    CHECKF(worst <= 1e-10, "world vs one process: %g", worst);
    CHECK(memcmp(world[0], world[1], sizeof world[0]) == 0);
    if (rank == 0 && check_failures == 0)
        printf("test_mpi: train OK (%d processes, largest difference from one process %.3g)\n", size, worst);
    return check_finish();
}

/* Steps [0, STEPS), every one eager, or (captured) captured at 0, eager at 3
 * and 4 and replayed otherwise; the losses to loss[]. */
static nb_status train_with_losses(model *m, bool captured, double *loss)
{
    int rank = nb_mirrored_world_rank(m->s), size = nb_mirrored_world_size(m->s);
    nb_mirrored_graph *g = NULL;
    nb_status st = NB_OK;
    for (int k = 0; k < STEPS && !st; k++) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(k, rank, size, &x, &y);
        nb_tensor *l = NULL;
        if (captured && k == 0)
            st = nb_mirrored_capture(m->s, m->opt, NB_VARS(m->w, m->b), step_fn, NULL, NB_TENSORS(x, y),
                                     NB_REDUCE_MEAN, &l, &g);
        else if (!captured || k == 3 || k == 4)
            st = nb_mirrored_step(m->s, m->opt, NB_VARS(m->w, m->b), step_fn, NULL, NB_TENSORS(x, y),
                                  NB_REDUCE_MEAN, &l);
        else
            st = nb_mirrored_graph_replay(g, (nb_tensor *[]){x, y}, &l);
        loss[k] = l ? nb_tensor_item(l) : NAN;
        nb_scope_end(sc);
    }
    nb_mirrored_graph_free(g);
    return st;
}

static int scenario_capture(void)
{
    double eager[FEATURES + 1], captured[FEATURES + 1], loss_e[STEPS], loss_c[STEPS];
    model m = {0};
    CHECK(model_new(&m, true, 0));
    int rank = nb_mirrored_world_rank(m.s), size = nb_mirrored_world_size(m.s);
    CHECK_OK(train_with_losses(&m, false, loss_e));
    values(&m, eager);
    model_free(&m);
    m = (model){0};
    CHECK(model_new(&m, true, 0));
    CHECK_OK(train_with_losses(&m, true, loss_c));
    values(&m, captured);
    nb_mirrored_stats stats;
    CHECK_OK(nb_mirrored_get_stats(m.s, &stats));
    CHECK(stats.steps == STEPS);
    model_free(&m);
    CHECKF(size >= 2, "%d process(es): run under mpirun -np 2 or more", size);
    CHECK(memcmp(eager, captured, sizeof eager) == 0);
    CHECK(memcmp(loss_e, loss_c, sizeof loss_e) == 0);
    CHECK(isfinite(loss_e[STEPS - 1]) && loss_e[STEPS - 1] < loss_e[0]);
    if (rank == 0 && check_failures == 0)
        printf("test_mpi: capture OK (%d processes, %d steps captured, replayed and eager)\n", size, STEPS);
    return check_finish();
}

static int scenario_mismatch(void)
{
    model m = {0};
    int rank = rank_of();
    bool ok = model_new(&m, true, rank == 1 ? 1 : 0);
    CHECK(!ok);
    CHECK(nb_error() == NB_ERR_INVALID_ARGUMENT);
    const char *msg = nb_error_message();
    CHECKF(strstr(msg, "'w' f64 [5, 1]") && strstr(msg, "'w' f64 [6, 1]") && strstr(msg, "rank"), "message: %s", msg);
    if (check_failures == 0)
        printf("test_mpi: mismatch OK on rank %d: %s\n", rank, msg);
    nb_error_clear();
    model_free(&m);
    return check_finish();
}

/* A rank that stops (sleeping, or killed) in step 3: rank 0 must fail within
 * the 3-second deadline plus a little, naming rank 1. */
static int scenario_stop(bool kill_it)
{
    model m = {0};
    if (!model_new(&m, true, 0))
        return 1;
    nb_mirrored_set_timeout(m.s, 3);
    int rank = nb_mirrored_world_rank(m.s);
    if (kill_it && rank == 1)
        g_kill_at = 3;
    else if (!kill_it)
        g_sleep_at = 3;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nb_status st = train(&m, 0, STEPS);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rank == 0) {
        CHECKF(st == NB_ERR_TIMEOUT, "status %s: %s", nb_status_name(st), nb_error_message());
        CHECKF(strstr(nb_error_message(), "rank 1 "), "message: %s", nb_error_message());
        CHECKF(waited < 10, "rank 0 waited %.1f s", waited);
        /* the world is broken for good: the next step fails at once */
        if (st) {
            nb_error_clear();
            CHECK(train(&m, STEPS, STEPS + 1) != NB_OK);
        }
        if (check_failures == 0)
            printf("test_mpi: %s OK (rank 0 failed after %.1f s: %s)\n", kill_it ? "kill" : "silent", waited,
                   nb_error_message());
    }
    nb_error_clear();
    model_free(&m);
    return rank == 0 ? check_finish() : 0;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Whether msg names a rank other than me before "(this is rank me)". */
static bool names_another_rank(const char *msg, int me)
{
    const char *end = strstr(msg, "(this is");
    for (const char *p = strstr(msg, "rank "); p && (!end || p < end); p = strstr(p + 5, "rank ")) {
        char *after;
        long r = strtol(p + 5, &after, 10);
        if (after != p + 5 && r != me)
            return true;
    }
    return false;
}

/* Rank 1 dies inside the capture (in_capture) or inside replay 3 (k == 0:
 * before it): captured at step 0, replayed from step 1 on. The others' call
 * must fail within the deadline, naming the call and a rank that stopped
 * answering (rank 1, or a survivor stuck waiting for it), or, where rank 1
 * had sent this rank all it needed before it died (its last messages go to
 * rank 2 alone), succeed, and then the next call fails so; later calls fail
 * at once; the graph is freed and nothing stays alive. */
static int scenario_die(bool in_capture, int k)
{
    const char *name = in_capture ? "capture-kill" : "replay-kill";
    const int die_step = in_capture ? 0 : 3;
    const double timeout = 2;
    model m = {0};
    if (!model_new(&m, true, 0))
        return 1;
    nb_mirrored_set_timeout(m.s, timeout);
    int rank = nb_mirrored_world_rank(m.s), size = nb_mirrored_world_size(m.s);
    nb_mirrored_graph *g = NULL;
    nb_status st = NB_OK;
    int failed_at = -1, sent = 0;
    double waited = 0;
    for (int step = 0; step < STEPS && !st; step++) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(step, rank, size, &x, &y);
        if (rank == 1 && step == die_step) {
            if (k == 0 && !in_capture)
                raise(SIGKILL); /* between replays 2 and 3 */
            atomic_store(&g_sends, 0);
            atomic_store(&g_fn_calls, 0);
            /* the step function runs once per replica (two) for step 1, then again for the recording */
            g_die_at_call = k == 0 ? 3 : -1;
            g_die_at_send = k;
            atomic_store(&g_die_armed, true);
        }
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (step == 0)
            st = nb_mirrored_capture(m.s, m.opt, NB_VARS(m.w, m.b), step_fn, NULL, NB_TENSORS(x, y), NB_REDUCE_MEAN,
                                     NULL, &g);
        else
            st = nb_mirrored_graph_replay(g, (nb_tensor *[]){x, y}, NULL);
        waited = seconds_since(&t0);
        if (step == die_step) {
            atomic_store(&g_die_armed, false);
            sent = atomic_load(&g_sends);
        }
        if (st)
            failed_at = step;
        nb_scope_end(sc);
    }
    if (rank == 1) { /* alive: k was past the call's last message */
        printf("test_mpi: %s %d past the end (the call sent %d messages)\n", name, k, sent);
        nb_error_clear();
        nb_mirrored_graph_free(g);
        model_free(&m);
        return 0;
    }
    CHECKF(size == 3, "%d processes: run under mpirun -np 3", size);
    if (failed_at < 0) { /* rank 1 lived (k past the end): every rank ends well */
        CHECKF(false, "rank %d: no call failed", rank);
        nb_mirrored_graph_free(g);
        model_free(&m);
        return check_finish();
    }
    const char *msg = nb_error_message();
    CHECKF(failed_at == die_step || failed_at == die_step + 1, "rank %d: step %d failed (rank 1 died in step %d): %s",
           rank, failed_at, die_step, msg);
    const char *who = failed_at == 0 ? "nb_mirrored_capture" : "nb_mirrored_graph_replay";
    CHECKF(st == NB_ERR_TIMEOUT, "rank %d: %s: %s", rank, nb_status_name(st), msg);
    CHECKF(strstr(msg, who) && names_another_rank(msg, rank) && strstr(msg, "died or stopped answering"),
           "rank %d: %s", rank, msg);
    /* two deadlines at most: a survivor may wait for one that waited for rank 1 */
    CHECKF(waited < 2 * timeout + 3, "rank %d waited %.1f s", rank, waited);
    CHECK(failed_at == 0 ? g == NULL : g != NULL);
    char first[512];
    snprintf(first, sizeof first, "%s", msg);
    nb_error_clear();
    if (g) { /* the world is broken for good: the next replay fails at once */
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(failed_at + 1, rank, size, &x, &y);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        nb_status again = nb_mirrored_graph_replay(g, (nb_tensor *[]){x, y}, NULL);
        double at_once = seconds_since(&t0);
        CHECKF(again == NB_ERR_TIMEOUT && strstr(nb_error_message(), "no longer work together"), "rank %d: %s: %s",
               rank, nb_status_name(again), nb_error_message());
        CHECKF(at_once < 1, "rank %d: the replay after the failure took %.1f s", rank, at_once);
        nb_error_clear();
        nb_scope_end(sc);
    }
    nb_mirrored_graph_free(g);
    model_free(&m);
    int failures = check_finish(); /* also: no tensor alive */
    if (failures == 0)
        printf("test_mpi: %s OK on rank %d (rank 1 died at %d; step %d failed after %.1f s: %s)\n", name, rank, k,
               failed_at, waited, first);
    return failures;
}

#if NB_HAVE_MPI
/* Rank 0 and rank 1 tell each other they are done (tag 991, outside the
 * library): rank 0 waits for rank 1's word while it drives MPI, so every late
 * message of rank 1's has arrived by then; each waits at most limit seconds. */
#define DONE_TAG 991
static bool exchange_done(int rank, double limit)
{
    static int word = 1, got = 0; /* static: a request given up on may still name them */
    MPI_Request req;
    if (rank == 1) /* past the stall above */
        PMPI_Isend(&word, 1, MPI_INT, 0, DONE_TAG, MPI_COMM_WORLD, &req);
    else
        MPI_Irecv(&got, 1, MPI_INT, 1, DONE_TAG, MPI_COMM_WORLD, &req);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int flag = 0, probed = 0;
        MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        /* also a look at everything that came: what makes MPI deliver */
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &probed, MPI_STATUS_IGNORE);
        if (flag)
            return true;
        if (seconds_since(&t0) > limit) {
            if (rank == 0)
                MPI_Cancel(&req);
            MPI_Request_free(&req);
            return false;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}
#endif

/* Rank 1 stalls for twice the deadline before its first all-gather message of
 * step 3 (an eager step, or with captured, replay 3 of the step captured at
 * 0), then sends it and goes on. Rank 0 must fail with NB_ERR_TIMEOUT within
 * the deadline and a little, free everything, and then own memory that rank
 * 1's late message must not reach: canary tensors of the freed bucket's size
 * class (the CPU allocator hands its blocks back), filled before rank 1
 * resumes and read after rank 1 said it was done, MPI driven all the while.
 * Rank 1 must fail with NB_ERR_TIMEOUT naming rank 0 within its stall and a
 * deadline. */
static int scenario_slow(bool captured)
{
#if NB_HAVE_MPI
    const char *name = captured ? "slow replay" : "slow eager";
    const double timeout = 2;
    model m = {0};
    if (!model_new(&m, true, 0))
        return 1;
    nb_mirrored_set_timeout(m.s, timeout);
    int rank = nb_mirrored_world_rank(m.s), size = nb_mirrored_world_size(m.s);
    CHECKF(size == 2, "%d processes: run under mpirun -np 2", size);
    g_stall_s = 2 * timeout;
    nb_mirrored_graph *g = NULL;
    nb_status st = NB_OK;
    int failed_at = -1;
    double waited = 0;
    for (int step = 0; step < STEPS && !st; step++) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x, *y;
        share_batch(step, rank, size, &x, &y);
        if (rank == 1 && step == 3)
            atomic_store(&g_stall_armed, true);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (captured && step == 0)
            st = nb_mirrored_capture(m.s, m.opt, NB_VARS(m.w, m.b), step_fn, NULL, NB_TENSORS(x, y), NB_REDUCE_MEAN,
                                     NULL, &g);
        else if (captured)
            st = nb_mirrored_graph_replay(g, (nb_tensor *[]){x, y}, NULL);
        else
            st = nb_mirrored_step(m.s, m.opt, NB_VARS(m.w, m.b), step_fn, NULL, NB_TENSORS(x, y), NB_REDUCE_MEAN,
                                  NULL);
        waited = seconds_since(&t0);
        if (st)
            failed_at = step;
        nb_scope_end(sc);
    }
    CHECKF(!atomic_load(&g_stall_armed), "rank %d: the stall never came", rank);
    char first[512];
    snprintf(first, sizeof first, "%s", nb_error_message());
    CHECKF(st == NB_ERR_TIMEOUT, "rank %d: %s: %s", rank, nb_status_name(st), first);
    CHECKF(names_another_rank(first, rank) && strstr(first, "died or stopped answering"), "rank %d: %s", rank, first);
    if (rank == 0) {
        CHECKF(failed_at == 3, "rank 0 failed at step %d, not 3", failed_at);
        CHECKF(waited < timeout + 2.5, "rank 0 waited %.1f s (deadline %g s)", waited, timeout);
    } else {
        /* its own step 3 or 4 waits for rank 0 after the stall */
        CHECKF(failed_at == 3 || failed_at == 4, "rank 1 failed at step %d", failed_at);
        CHECKF(waited < g_stall_s + timeout + 2.5, "rank 1 waited %.1f s", waited);
    }
    nb_error_clear();
    /* the world is broken for good: the next call fails at once */
    {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(1, FEATURES), g_x);
        nb_tensor *y = nb_from_buffer(NB_F64, NB_SHAPE(1, 1), g_y);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        nb_status again = nb_mirrored_step(m.s, m.opt, NB_VARS(m.w, m.b), step_fn, NULL, NB_TENSORS(x, y),
                                           NB_REDUCE_MEAN, NULL);
        CHECKF(again == NB_ERR_TIMEOUT && strstr(nb_error_message(), "no longer work together"), "rank %d: %s: %s",
               rank, nb_status_name(again), nb_error_message());
        CHECKF(seconds_since(&t0) < 1, "rank %d: the step after the failure took %.1f s", rank, seconds_since(&t0));
        nb_error_clear();
        nb_scope_end(sc);
    }
    nb_mirrored_graph_free(g);
    model_free(&m);
    if (rank == 0) {
        /* memory made after the free: the blocks of the freed buckets among it */
        enum { CANARIES = 4096, PLAIN = 256 };
        const double mark = -1234.5678;
        nb_scope *sc = nb_scope_begin();
        nb_tensor **canary = malloc(sizeof *canary * CANARIES);
        unsigned char *plain[PLAIN];
        CHECK(canary != NULL);
        for (int i = 0; canary && i < CANARIES; i++)
            canary[i] = nb_full(NB_F64, NB_SHAPE(6 + i % 3), mark); /* 48 to 64 bytes: the bucket's class */
        for (int i = 0; i < PLAIN; i++)
            if ((plain[i] = malloc((size_t)(8 + i % 64))))
                memset(plain[i], 0xA5, (size_t)(8 + i % 64));
        bool heard = exchange_done(0, g_stall_s + 3 * timeout + 10);
        CHECKF(heard, "rank 0: rank 1 never said it was done");
        int bad = 0;
        for (int i = 0; canary && i < CANARIES; i++) {
            double v[8];
            int64_t n = nb_tensor_numel(canary[i]);
            CHECK_OK(nb_tensor_read(canary[i], v, sizeof(double) * (size_t)n));
            for (int64_t j = 0; j < n; j++)
                bad += v[j] != mark;
        }
        for (int i = 0; i < PLAIN; i++) {
            for (int j = 0; plain[i] && j < 8 + i % 64; j++)
                bad += plain[i][j] != 0xA5;
            free(plain[i]);
        }
        CHECKF(bad == 0, "rank 0: %d canary elements changed after the strategy was freed", bad);
        free(canary);
        nb_scope_end(sc);
    } else {
        CHECKF(exchange_done(1, 2 * timeout + 10), "rank 1: rank 0 never took its word");
    }
    int failures = check_finish();
    if (failures == 0)
        printf("test_mpi: %s OK on rank %d (step %d failed after %.1f s: %s)\n", name, rank, failed_at, waited, first);
    fflush(stdout);
    return failures;
#else
    (void)captured;
    return 77;
#endif
}

static int scenario_resume(bool write, const char *dir)
{
    char path[1024];
    model m = {0};
    if (!model_new(&m, true, 0))
        return check_finish() ? 1 : 1;
    int rank = nb_mirrored_world_rank(m.s), size = nb_mirrored_world_size(m.s);
    nb_checkpoint_manager *cm = nb_checkpoint_manager_new(dir, "ckpt", 2);
    CHECK(cm != NULL);
    double final[FEATURES + 1];
    snprintf(path, sizeof path, "%s/final.bin", dir);
    if (write) {
        CHECK_OK(train(&m, 0, STEPS));
        if (rank == 0) /* rank 0 alone writes */
            CHECK_OK(nb_checkpoint_manager_save(cm, STEPS, NB_VARS(m.w, m.b), m.opt));
        CHECK_OK(train(&m, STEPS, 2 * STEPS));
        values(&m, final);
        if (rank == 0) {
            FILE *f = fopen(path, "wb");
            CHECK(f && fwrite(final, sizeof final, 1, f) == 1);
            if (f)
                fclose(f);
        }
    } else {
        const char *latest = cm ? nb_checkpoint_manager_latest(cm) : NULL;
        CHECKF(latest != NULL, "no checkpoint in %s", dir);
        if (latest)
            CHECK_OK(nb_checkpoint_restore(latest, NB_VARS(m.w, m.b), m.opt));
        CHECK_OK(train(&m, STEPS, 2 * STEPS));
        values(&m, final);
        double want[FEATURES + 1] = {0};
        FILE *f = fopen(path, "rb");
        CHECK(f && fread(want, sizeof want, 1, f) == 1);
        if (f)
            fclose(f);
        double worst = 0;
        for (int i = 0; i <= FEATURES; i++)
            worst = fmax(worst, fabs(final[i] - want[i]));
        CHECKF(worst <= 1e-10, "resumed on %d processes: %g from the uninterrupted run", size, worst);
        if (rank == 0 && check_failures == 0)
            printf("test_mpi: resume OK on %d process(es) (largest difference %.3g)\n", size, worst);
    }
    if (write && rank == 0 && check_failures == 0)
        printf("test_mpi: resume-write OK (%d processes)\n", size);
    nb_checkpoint_manager_free(cm);
    model_free(&m);
    return check_finish();
}

int main(int argc, char **argv)
{
    if (!NB_HAVE_MPI) {
        printf("test_mpi: built without MPI: skipped\n");
        return 77;
    }
    if (argc > 1 && !strcmp(argv[1], "--probe"))
        return 0; /* mpi_run.sh: built with MPI */
    if (argc < 2) {
        fprintf(stderr, "usage: test_mpi train|capture|mismatch|silent|kill|capture-kill K|replay-kill K|"
                        "slow eager|replay|resume-write DIR|resume-read DIR\n");
        return 2;
    }
    nb_set_logical_cpu_devices(2);
    make_data();
    const char *sc = argv[1];
    if (!strcmp(sc, "train"))
        return scenario_train();
    if (!strcmp(sc, "mismatch"))
        return scenario_mismatch();
    if (!strcmp(sc, "capture"))
        return scenario_capture();
    if (!strcmp(sc, "silent") || !strcmp(sc, "kill"))
        return scenario_stop(!strcmp(sc, "kill"));
    if ((!strcmp(sc, "capture-kill") || !strcmp(sc, "replay-kill")) && argc > 2)
        return scenario_die(!strcmp(sc, "capture-kill"), atoi(argv[2]));
    if (!strcmp(sc, "slow") && argc > 2)
        return scenario_slow(!strcmp(argv[2], "replay"));
    if ((!strcmp(sc, "resume-write") || !strcmp(sc, "resume-read")) && argc > 2)
        return scenario_resume(!strcmp(sc, "resume-write"), argv[2]);
    fprintf(stderr, "test_mpi: unknown scenario %s\n", sc);
    return 2;
}
