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
#include <time.h>
#include <unistd.h>

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

typedef struct model {
    nb_mirrored *s;
    nb_variable *w, *b;
    nb_optimizer *opt;
} model;

static int g_kill_at = -1, g_sleep_at = -1, g_step;

static nb_status step_fn(nb_replica *r, int n_in, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                         nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_in, (void)user;
    if (g_step == g_kill_at)
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
        int lo, hi;
        share(k, rank, size, &lo, &hi);
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, FEATURES), g_x + lo * FEATURES);
        nb_tensor *y = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, 1), g_y + lo);
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
        int lo, hi;
        share(k, 0, 1, &lo, &hi);
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, FEATURES), g_x + lo * FEATURES);
        nb_tensor *y = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, 1), g_y + lo);
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
        int lo, hi;
        share(k, rank, size, &lo, &hi);
        nb_scope *sc = nb_scope_begin();
        nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, FEATURES), g_x + lo * FEATURES);
        nb_tensor *y = nb_from_buffer(NB_F64, NB_SHAPE(hi - lo, 1), g_y + lo);
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
        fprintf(stderr, "usage: test_mpi train|capture|mismatch|silent|kill|resume-write DIR|resume-read DIR\n");
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
    if ((!strcmp(sc, "resume-write") || !strcmp(sc, "resume-read")) && argc > 2)
        return scenario_resume(!strcmp(sc, "resume-write"), argv[2]);
    fprintf(stderr, "test_mpi: unknown scenario %s\n", sc);
    return 2;
}
