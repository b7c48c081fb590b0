/* The asynchronous trainer across processes, one scenario per run, started by
 * test/mpi_run.sh under mpirun (worker processes with two logical CPU workers
 * each):
 *
 *   test_mpi_async train         4 processes, 2 servers (the two variables on
 *                                different ones) and 2 worker processes:
 *                                linear regression reaches the true weights
 *                                with no bound, bound 1 and bound 0, and a
 *                                counter that every update moves by one ends
 *                                at the number of gradients sent (none lost)
 *   test_mpi_async kill-worker   3 processes: worker process 2 is killed in
 *                                its step; worker process 1 finishes and gets
 *                                the trained values, the server ends
 *   test_mpi_async slow          3 processes, a 2 s deadline: worker process 2
 *                                takes 4 s (0.25 s a step); with bound 1
 *                                process 1 keeps pace (staleness within the
 *                                bound's), with none it finishes at once and
 *                                waits past the deadline for the end, and
 *                                must not take the server for dead
 *   test_mpi_async kill-server   3 processes: the server is killed after a few
 *                                updates; each worker fails with
 *                                NB_ERR_TIMEOUT naming rank 0 within the
 *                                deadline
 *
 * The rank that can tell prints "test_mpi: async-<scenario> OK", which is
 * what mpi_run.sh looks for. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

#include "nb_config.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#define IN 4
#define ROWS 512

static const double w_true[IN] = {0.5, -1.0, 2.0, 0.25};
static const double b_true = -0.75;

static nb_status regression_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                                 nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs;
    const int *kill_at = user;
    if (kill_at && *kill_at >= 0) {
        double first = 0;
        nb_tensor_read(nb_slice(inputs[0], NB_SHAPE(0, 0), NB_SHAPE(1, 1)), &first, sizeof first);
        static int calls;
        if (__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) == *kill_at)
            raise(SIGKILL);
    }
    nb_tape *tape = nb_tape_begin();
    nb_tensor *pred = nb_add(nb_matmul(inputs[0], nb_read(vars[0])), nb_read(vars[1]));
    nb_tensor *d = nb_sub(pred, inputs[1]);
    *loss = nb_mean_all(nb_mul(d, d));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

/* Each rank's own data (seeded by rank), y = x w_true + b_true exactly. */
static void make_data(int rank, nb_tensor **x, nb_tensor **y)
{
    static double hx[ROWS * IN], hy[ROWS];
    uint64_t s = 0x9E3779B97F4A7C15ull + (uint64_t)rank;
    for (int i = 0; i < ROWS * IN; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        hx[i] = (double)(s >> 11) * 0x1.0p-53 * 2 - 1;
    }
    for (int i = 0; i < ROWS; i++) {
        hy[i] = b_true;
        for (int k = 0; k < IN; k++)
            hy[i] += hx[i * IN + k] * w_true[k];
    }
    *x = nb_from_buffer(NB_F64, NB_SHAPE(ROWS, IN), hx);
    *y = nb_from_buffer(NB_F64, NB_SHAPE(ROWS, 1), hy);
}

static nb_status counting_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                               nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = nb_neg(nb_sum_all(nb_read(vars[0])));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

static int scenario_train(void)
{
    nb_async *a = nb_async_new_world(2, NULL, NULL, 2);
    CHECK(a != NULL);
    if (!a)
        return check_finish();
    bool server = nb_async_is_server(a);
    CHECK(nb_async_world_workers(a) == 4);
    for (int64_t bound = -1; bound <= 1; bound++) {
        nb_scope *sc = nb_scope_begin();
        CHECK_OK(nb_async_set_staleness_bound(a, bound));
        nb_variable *w = nb_async_variable_new(a, "w", nb_zeros(NB_F64, NB_SHAPE(IN, 1)));
        nb_variable *b = nb_async_variable_new(a, "b", nb_zeros(NB_F64, NB_SHAPE(1)));
        nb_tensor *x, *y;
        make_data(0, &x, &y);
        nb_optimizer *opt = nb_sgd_new(bound == 0 ? 0.2 : 0.05);
        for (int epoch = 0; epoch < 8; epoch++)
            CHECK_OK(nb_async_train(a, opt, NB_VARS(w, b), regression_step, NULL, NB_TENSORS(x, y), 16));
        nb_async_stats st;
        CHECK_OK(nb_async_get_stats(a, &st));
        if (!server) {
            double hw[IN], hb;
            CHECK_OK(nb_tensor_read(nb_read(w), hw, sizeof hw));
            CHECK_OK(nb_tensor_read(nb_read(b), &hb, sizeof hb));
            double err = fabs(hb - b_true);
            for (int k = 0; k < IN; k++)
                err = fmax(err, fabs(hw[k] - w_true[k]));
            if (!(err < 1e-6))
                fprintf(stderr, "bound %lld: weights %g from the true ones\n", (long long)bound, err);
            CHECK(err < 1e-6);
        }
        nb_optimizer_free(opt);
        nb_variable_free(w);
        nb_variable_free(b);
        nb_scope_end(sc);
    }
    /* no update lost: every gradient adds one to each element */
    nb_scope *sc = nb_scope_begin();
    CHECK_OK(nb_async_set_staleness_bound(a, -1));
    nb_variable *c = nb_async_variable_new(a, "counter", nb_zeros(NB_F64, NB_SHAPE(1000)));
    nb_variable *d = nb_async_variable_new(a, "counter2", nb_zeros(NB_F64, NB_SHAPE(10)));
    nb_optimizer *opt = nb_sgd_new(1.0);
    nb_async_stats before, after;
    CHECK_OK(nb_async_get_stats(a, &before));
    CHECK_OK(nb_async_train(a, opt, NB_VARS(c, d), counting_step, NULL, NB_TENSORS(nb_zeros(NB_F64, NB_SHAPE(301, 1))),
                            1));
    CHECK_OK(nb_async_get_stats(a, &after));
    if (!server) {
        double h[1000];
        CHECK_OK(nb_tensor_read(nb_read(c), h, sizeof h));
        int wrong = 0;
        for (int i = 0; i < 1000; i++)
            wrong += h[i] != 2 * 301.0; /* two worker processes, 301 batches each */
        CHECKF(wrong == 0, "counter: %d elements are not %g (first %g)", wrong, 602.0, h[0]);
        CHECK(after.gradients - before.gradients == 301);
    } else {
        /* a server counts every gradient of both worker processes */
        CHECK(after.gradients - before.gradients == 602);
    }
    nb_optimizer_free(opt);
    nb_variable_free(c);
    nb_variable_free(d);
    nb_scope_end(sc);
    nb_async_free(a);
    int failures = check_finish();
    if (!failures)
        printf("test_mpi: async-train OK (%s)\n", server ? "server" : "worker");
    return failures;
}

/* What the failure scenarios share: one server, two workers per worker
 * process, the regression model and its data, SGD. */
typedef struct setup {
    nb_async *a;
    nb_scope *sc;
    nb_variable *w, *b;
    nb_tensor *x, *y;
    nb_optimizer *opt;
    bool server;
    int rank;
} setup;

static bool setup_begin(setup *s, const char *timeout)
{
    setenv("NB_WORLD_TIMEOUT", timeout, 1);
    memset(s, 0, sizeof *s);
    s->a = nb_async_new_world(2, NULL, NULL, 1);
    CHECK(s->a != NULL);
    if (!s->a)
        return false;
    s->sc = nb_scope_begin();
    s->w = nb_async_variable_new(s->a, "w", nb_zeros(NB_F64, NB_SHAPE(IN, 1)));
    s->b = nb_async_variable_new(s->a, "b", nb_zeros(NB_F64, NB_SHAPE(1)));
    make_data(0, &s->x, &s->y);
    s->opt = nb_sgd_new(0.05);
    s->server = nb_async_is_server(s->a);
    const char *env = getenv("OMPI_COMM_WORLD_RANK");
    s->rank = env ? atoi(env) : 0;
    return true;
}

static void setup_end(setup *s)
{
    nb_optimizer_free(s->opt);
    nb_variable_free(s->w);
    nb_variable_free(s->b);
    nb_scope_end(s->sc);
    nb_async_free(s->a);
}

/* nb_async_train on the setup with fn, user and batch rows; seconds to *took. */
static nb_status timed_train(setup *s, nb_replica_step_fn fn, void *user, int64_t rows, double *took)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nb_status st = nb_async_train(s->a, s->opt, NB_VARS(s->w, s->b), fn, user, NB_TENSORS(s->x, s->y), rows);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return st;
}

/* Worker process 2 dies in its 5th step: process 1 still finishes. */
static int scenario_kill_worker(void)
{
    setup s;
    if (!setup_begin(&s, "3"))
        return check_finish();
    int kill_at = s.rank == 2 ? 5 : -1; /* rank 2: the second worker process */
    double took;
    nb_status st = timed_train(&s, regression_step, &kill_at, 16, &took);
    CHECKF(st == NB_OK, "%s: %s", nb_status_name(st), nb_error_message());
    nb_async_stats stats;
    nb_async_get_stats(s.a, &stats);
    if (!s.server) {
        CHECK(stats.gradients == ROWS / 16);
        double hb = 0;
        nb_tensor_read(nb_read(s.b), &hb, sizeof hb);
        CHECKF(hb != 0, "the trained b is %g", hb);
    } else {
        CHECKF(stats.gradients >= ROWS / 16 && stats.gradients < 2 * ROWS / 16, "the server applied %lld gradients",
               (long long)stats.gradients);
        CHECKF(took < 20, "the server took %.1f s", took);
    }
    bool server = s.server;
    setup_end(&s);
    int failures = check_finish();
    if (!failures)
        printf("test_mpi: async-kill-worker OK (%s, %.1f s, %lld gradients)\n", server ? "server" : "worker", took,
               (long long)stats.gradients);
    return failures;
}

static nb_status slow_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                           nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    if (*(const bool *)user)
        nanosleep(&(struct timespec){0, 250000000}, NULL);
    return regression_step(r, n_inputs, inputs, n_vars, vars, loss, grads, NULL);
}

static int scenario_slow(void)
{
    setup s;
    if (!setup_begin(&s, "2"))
        return check_finish();
    bool slow = s.rank == 2, server = s.server;
    double took[2] = {0, 0};
    /* bound 1, then none: without a bound process 1 finishes at once and
     * waits for the end for as long as process 2 trains */
    for (int pass = 0; pass < 2; pass++) {
        CHECK_OK(nb_async_set_staleness_bound(s.a, pass == 0 ? 1 : -1));
        nb_async_stats before, after;
        nb_async_get_stats(s.a, &before);
        nb_status st = timed_train(&s, slow_step, &slow, 16, &took[pass]);
        CHECKF(st == NB_OK, "pass %d: %s: %s", pass, nb_status_name(st), nb_error_message());
        CHECKF(took[pass] > 3, "pass %d took %.1f s: the slow worker cannot have been waited for", pass, took[pass]);
        nb_async_get_stats(s.a, &after);
        if (server) {
            CHECK(after.gradients - before.gradients == 2 * ROWS / 16);
            /* 4 workers, bound 1: (4 - 1)(2 + 1) */
            CHECKF(pass == 1 || after.max_staleness <= 9, "largest staleness %lld", (long long)after.max_staleness);
        }
    }
    setup_end(&s);
    int failures = check_finish();
    if (!failures)
        printf("test_mpi: async-slow OK (%s, %.1f s and %.1f s)\n", server ? "server" : "worker", took[0], took[1]);
    return failures;
}

/* The server dies after 20 updates: every worker fails, naming rank 0. */
static int g_updates;

static void kill_server(const nb_async_update *u, void *user)
{
    (void)u, (void)user;
    if (++g_updates == 20)
        raise(SIGKILL);
}

static int scenario_kill_server(void)
{
    setup s;
    if (!setup_begin(&s, "3"))
        return check_finish();
    if (s.server)
        nb_async_set_observer(s.a, kill_server, NULL);
    double took;
    nb_status st = timed_train(&s, regression_step, NULL, 4, &took);
    CHECKF(st == NB_ERR_TIMEOUT, "%s: %s", nb_status_name(st), nb_error_message());
    CHECKF(strstr(nb_error_message(), "rank 0 "), "message: %s", nb_error_message());
    CHECKF(took < 15, "the worker took %.1f s to fail", took);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", nb_error_message());
    nb_error_clear();
    setup_end(&s);
    int failures = check_finish();
    if (!failures)
        printf("test_mpi: async-kill-server OK (a worker failed after %.1f s: %s)\n", took, msg);
    return failures;
}

int main(int argc, char **argv)
{
    if (!NB_HAVE_MPI) {
        printf("test_mpi_async: built without MPI: skipped\n");
        return 77;
    }
    if (argc > 1 && !strcmp(argv[1], "--probe"))
        return 0;
    if (argc < 2) {
        fprintf(stderr, "usage: test_mpi_async async-train|async-kill-worker|async-slow|async-kill-server\n");
        return 2;
    }
    nb_set_logical_cpu_devices(2);
    const char *sc = argv[1];
    if (!strcmp(sc, "async-train"))
        return scenario_train();
    if (!strcmp(sc, "async-kill-worker"))
        return scenario_kill_worker();
    if (!strcmp(sc, "async-slow"))
        return scenario_slow();
    if (!strcmp(sc, "async-kill-server"))
        return scenario_kill_server();
    fprintf(stderr, "test_mpi_async: unknown scenario %s\n", sc);
    return 2;
}
