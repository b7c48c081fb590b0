/* The asynchronous trainer over four logical CPU devices: linear regression
 * reaches the true weights asynchronously and stale-synchronously; no update
 * is lost or torn (a counter that every update moves by exactly one); the
 * staleness bound holds; bound 0 equals the mirrored strategy's steps; the
 * observer sees every update; a failing worker is an error naming it, never a
 * hang, and the trainer works afterwards; bad arguments are clear errors. */
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#define NDEV 4

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static nb_tensor *random_f64(int64_t rows, int64_t cols, double *h)
{
    double *d = malloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        d[i] = rnd();
    nb_tensor *t = nb_from_buffer(NB_F64, NB_SHAPE(rows, cols), d);
    if (h)
        memcpy(h, d, sizeof(double) * (size_t)(rows * cols));
    free(d);
    return t;
}

static void read_f64(nb_variable *v, double *out, size_t n)
{
    nb_tensor *t = nb_read(v);
    CHECK_OK(nb_tensor_read(t, out, n * sizeof(double)));
}

/* ---- linear regression ------------------------------------------------------ */

#define IN 8

static const double w_true[IN] = {0.5, -1.25, 2.0, 0.75, -0.5, 1.5, -2.0, 0.25};
static const double b_true = 0.3;

typedef struct model {
    nb_variable *w, *b;
} model;

/* The mean squared error of x w + b against y, and its gradients. */
static nb_status regression_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                                 nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *pred = nb_add(nb_matmul(inputs[0], nb_read(vars[0])), nb_read(vars[1]));
    nb_tensor *d = nb_sub(pred, inputs[1]);
    *loss = nb_mean_all(nb_mul(d, d));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

/* x [rows, IN] and y = x w_true + b_true exactly. */
static void regression_data(int64_t rows, nb_tensor **x, nb_tensor **y)
{
    double *hx = malloc(sizeof(double) * (size_t)(rows * IN));
    double *hy = malloc(sizeof(double) * (size_t)rows);
    *x = random_f64(rows, IN, hx);
    for (int64_t i = 0; i < rows; i++) {
        hy[i] = b_true;
        for (int k = 0; k < IN; k++)
            hy[i] += hx[i * IN + k] * w_true[k];
    }
    *y = nb_from_buffer(NB_F64, NB_SHAPE(rows, 1), hy);
    free(hx);
    free(hy);
}

static model regression_model(nb_async *a)
{
    model m;
    m.w = nb_async_variable_new(a, "w", nb_zeros(NB_F64, NB_SHAPE(IN, 1)));
    m.b = nb_async_variable_new(a, "b", nb_zeros(NB_F64, NB_SHAPE(1)));
    CHECK(m.w && m.b);
    return m;
}

/* Largest distance of the trained weights from the true ones. */
static double regression_error(model m)
{
    double w[IN], b;
    read_f64(m.w, w, IN);
    read_f64(m.b, &b, 1);
    double e = fabs(b - b_true);
    for (int k = 0; k < IN; k++)
        e = fmax(e, fabs(w[k] - w_true[k]));
    return e;
}

static void converges_with_bound(int64_t bound)
{
    nb_async *a = nb_async_new(NDEV, NULL, NULL);
    CHECK(a && nb_async_workers(a) == NDEV);
    CHECK_OK(nb_async_set_staleness_bound(a, bound));
    model m = regression_model(a);
    nb_tensor *x, *y;
    regression_data(1024, &x, &y);
    /* bound 0 makes a quarter of the updates, each the mean of four */
    nb_optimizer *opt = nb_sgd_new(bound == 0 ? 0.2 : 0.05);
    for (int epoch = 0; epoch < 12; epoch++)
        CHECK_OK(nb_async_train(a, opt, NB_VARS(m.w, m.b), regression_step, NULL, NB_TENSORS(x, y), 16));
    double err = regression_error(m);
    if (!(err < 1e-6))
        fprintf(stderr, "bound %lld: largest weight error %g\n", (long long)bound, err);
    CHECK(err < 1e-6);
    nb_async_stats st;
    CHECK_OK(nb_async_get_stats(a, &st));
    CHECK(st.gradients == 12 * 64);
    CHECK(st.examples == 12 * 1024);
    CHECK(st.updates == (bound == 0 ? 12 * 64 / NDEV : st.gradients));
    if (bound == 0)
        CHECK(st.max_staleness == 0);
    if (bound > 0)
        CHECK(st.max_staleness <= (NDEV - 1) * (2 * bound + 1));
    CHECK(st.mean_staleness <= (double)st.max_staleness);
    nb_optimizer_free(opt);
    nb_variable_free(m.w);
    nb_variable_free(m.b);
    nb_async_free(a);
}

static void test_regression_async(void) { converges_with_bound(-1); }
static void test_regression_bounded(void) { converges_with_bound(1); }
static void test_regression_synchronous(void) { converges_with_bound(0); }

/* ---- no update lost -------------------------------------------------------------- */

/* The loss -sum(v) has gradient -1 for every element: with SGD at rate 1 each
 * update adds exactly one to every element, so after N gradients every
 * element is N (exact in f64), whatever order they land in, and only if no
 * update was lost or torn. The worker spins a little so that the updates
 * overlap the reads. */
static nb_status counting_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                               nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = nb_neg(nb_sum_all(nb_read(vars[0])));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

static void test_no_lost_updates(void)
{
    for (int64_t bound = -1; bound <= 2; bound++) {
        nb_async *a = nb_async_new(NDEV, NULL, "/cpu:3");
        CHECK_OK(nb_async_set_staleness_bound(a, bound));
        nb_variable *v = nb_async_variable_new(a, "counter", nb_zeros(NB_F64, NB_SHAPE(4096)));
        nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(999, 1));
        nb_optimizer *opt = nb_sgd_new(1.0);
        CHECK_OK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(x), 1));
        nb_async_stats st;
        CHECK_OK(nb_async_get_stats(a, &st));
        CHECK(st.gradients == 999);
        double *h = malloc(sizeof(double) * 4096);
        read_f64(v, h, 4096);
        /* bound 0 averages each round of 4 into one update of +1 */
        double want = bound == 0 ? (double)st.updates : 999.0;
        int wrong = 0;
        for (int i = 0; i < 4096; i++)
            wrong += h[i] != want;
        if (wrong)
            fprintf(stderr, "bound %lld: %d elements differ from %g (first %g)\n", (long long)bound, wrong, want, h[0]);
        CHECK(wrong == 0);
        CHECK(bound != 0 || st.updates == 250);
        free(h);
        nb_optimizer_free(opt);
        nb_variable_free(v);
        nb_async_free(a);
    }
}

/* ---- bound 0 is the mirrored strategy ------------------------------------------------------- */

static void test_synchronous_equals_mirrored(void)
{
    nb_tensor *x, *y;
    regression_data(96, &x, &y);
    nb_tensor *w0 = random_f64(IN, 1, NULL), *b0 = nb_zeros(NB_F64, NB_SHAPE(1));
    /* 4 workers, batches of 6: rounds of 24 rows; the mirrored strategy steps on 24 */
    nb_async *a = nb_async_new(NDEV, NULL, NULL);
    CHECK_OK(nb_async_set_staleness_bound(a, 0));
    nb_variable *aw = nb_async_variable_new(a, "aw", w0), *ab = nb_async_variable_new(a, "ab", b0);
    nb_optimizer *aopt = nb_adam_new(0.01, 0.9, 0.999, 1e-8);
    CHECK_OK(nb_async_train(a, aopt, NB_VARS(aw, ab), regression_step, NULL, NB_TENSORS(x, y), 6));

    nb_mirrored *s = nb_mirrored_new(NDEV, NULL);
    nb_variable *mw = nb_mirrored_variable_new(s, "mw", w0), *mb = nb_mirrored_variable_new(s, "mb", b0);
    nb_optimizer *mopt = nb_adam_new(0.01, 0.9, 0.999, 1e-8);
    for (int64_t start = 0; start < 96; start += 24) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *bx = nb_slice(x, NB_SHAPE(start, 0), NB_SHAPE(24, -1));
        nb_tensor *by = nb_slice(y, NB_SHAPE(start, 0), NB_SHAPE(24, -1));
        CHECK_OK(nb_mirrored_step(s, mopt, NB_VARS(mw, mb), regression_step, NULL, NB_TENSORS(bx, by),
                                  NB_REDUCE_MEAN, NULL));
        nb_scope_end(sc);
    }
    double wa[IN], wm[IN], ba, bm;
    read_f64(aw, wa, IN);
    read_f64(mw, wm, IN);
    read_f64(ab, &ba, 1);
    read_f64(mb, &bm, 1);
    double worst = fabs(ba - bm) / fmax(1.0, fabs(bm));
    for (int k = 0; k < IN; k++)
        worst = fmax(worst, fabs(wa[k] - wm[k]) / fmax(1.0, fabs(wm[k])));
    if (!(worst <= 1e-12))
        fprintf(stderr, "bound 0 against mirrored: largest difference %g\n", worst);
    CHECK(worst <= 1e-12);
    nb_optimizer_free(aopt);
    nb_optimizer_free(mopt);
    nb_variable_free(aw);
    nb_variable_free(ab);
    nb_variable_free(mw);
    nb_variable_free(mb);
    nb_async_free(a);
    nb_mirrored_free(s);
}

/* ---- the observer ------------------------------------------------------------------------- */

typedef struct seen {
    int64_t calls, last_update, max_staleness, rows;
    bool in_order;
    double first_loss, last_loss;
} seen;

static void observe(const nb_async_update *u, void *user)
{
    seen *s = user;
    if (u->update != s->last_update + 1)
        s->in_order = false;
    s->last_update = u->update;
    if (u->staleness > s->max_staleness)
        s->max_staleness = u->staleness;
    if (s->calls == 0)
        s->first_loss = u->loss;
    s->last_loss = u->loss;
    s->rows += u->rows;
    s->calls++;
}

static void test_observer(void)
{
    nb_async *a = nb_async_new(NDEV, NULL, NULL);
    model m = regression_model(a);
    nb_tensor *x, *y;
    regression_data(200, &x, &y);
    seen s = {.in_order = true};
    CHECK_OK(nb_async_set_observer(a, observe, &s));
    nb_optimizer *opt = nb_sgd_new(0.05);
    for (int epoch = 0; epoch < 5; epoch++)
        CHECK_OK(nb_async_train(a, opt, NB_VARS(m.w, m.b), regression_step, NULL, NB_TENSORS(x, y), 16));
    nb_async_stats st;
    CHECK_OK(nb_async_get_stats(a, &st));
    CHECK(s.calls == st.updates && s.calls == 5 * 13);
    CHECK(s.in_order);
    CHECK(s.rows == 5 * 200);
    CHECK(s.max_staleness == st.max_staleness);
    CHECK(s.last_loss < s.first_loss);
    CHECK_OK(nb_async_set_observer(a, NULL, NULL));
    CHECK_OK(nb_async_train(a, opt, NB_VARS(m.w, m.b), regression_step, NULL, NB_TENSORS(x, y), 16));
    CHECK(s.calls == 5 * 13);
    nb_optimizer_free(opt);
    nb_variable_free(m.w);
    nb_variable_free(m.b);
    nb_async_free(a);
}

/* ---- settings changed while a call trains ----------------------------------------------------- */

/* nb_async_train on a thread of its own, while the caller changes the bound
 * and the observer again and again: the call keeps what it started with (no
 * bound of 0 halfway, no update seen by the other observer), nothing races
 * (the ThreadSanitizer build runs this), and the next call takes the last
 * settings. */
typedef struct setter_run {
    nb_async *a;
    nb_optimizer *opt;
    nb_variable *v;
    nb_tensor *x;
    nb_status st;
    int done;
} setter_run;

static void *train_thread(void *arg)
{
    setter_run *r = arg;
    r->st = nb_async_train(r->a, r->opt, NB_VARS(r->v), counting_step, NULL, NB_TENSORS(r->x), 1);
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void count_update(const nb_async_update *u, void *user)
{
    (void)u;
    __atomic_add_fetch((int64_t *)user, 1, __ATOMIC_RELAXED);
}

static void test_settings_during_training(void)
{
    nb_async *a = nb_async_new(NDEV, NULL, NULL);
    setter_run r = {.a = a, .opt = nb_sgd_new(1.0), .x = nb_zeros(NB_F64, NB_SHAPE(999, 1))};
    r.v = nb_async_variable_new(a, "counter", nb_zeros(NB_F64, NB_SHAPE(64)));
    int64_t first = 0, second = 0;
    CHECK_OK(nb_async_set_staleness_bound(a, -1));
    CHECK_OK(nb_async_set_observer(a, count_update, &first));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, train_thread, &r) == 0);
    /* the call has taken its settings once its first update is seen */
    while (!__atomic_load_n(&first, __ATOMIC_RELAXED) && !__atomic_load_n(&r.done, __ATOMIC_ACQUIRE))
        sched_yield();
    int changes = 0;
    while (!__atomic_load_n(&r.done, __ATOMIC_ACQUIRE)) {
        CHECK_OK(nb_async_set_staleness_bound(a, changes % 3 - 1)); /* -1, 0, 1 */
        CHECK_OK(nb_async_set_observer(a, changes % 2 ? count_update : NULL, &second));
        changes++;
    }
    pthread_join(t, NULL);
    CHECK_OK(r.st);
    CHECK(changes > 0);
    /* the call kept bound -1 and its observer: 999 updates of +1, all seen by the first */
    if (!(first == 999 && second == 0))
        fprintf(stderr, "during the call: the first observer saw %lld updates (999 wanted), the second %lld\n",
                (long long)first, (long long)second);
    CHECK(__atomic_load_n(&first, __ATOMIC_RELAXED) == 999 && __atomic_load_n(&second, __ATOMIC_RELAXED) == 0);
    double h[64];
    read_f64(r.v, h, 64);
    CHECK(h[0] == 999 && h[63] == 999);
    /* the next call takes the last settings: bound 0, rounds of 4 averaged */
    CHECK_OK(nb_async_set_staleness_bound(a, 0));
    CHECK_OK(nb_async_set_observer(a, count_update, &second));
    CHECK_OK(nb_async_train(a, r.opt, NB_VARS(r.v), counting_step, NULL, NB_TENSORS(r.x), 1));
    if (!(second == 250 && first == 999))
        fprintf(stderr, "next call: %lld updates seen (250 wanted), the first observer %lld (999)\n",
                (long long)second, (long long)first);
    CHECK(second == 250 && first == 999);
    nb_optimizer_free(r.opt);
    nb_variable_free(r.v);
    nb_async_free(a);
}

/* ---- reads ------------------------------------------------------------------------------------- */

/* Inside a worker nb_read gives that worker's copy (on its device); outside,
 * the master. */
static nb_status device_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                             nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)n_inputs, (void)inputs, (void)grads, (void)n_vars;
    int *bad = user;
    nb_tensor *t = nb_read(vars[0]);
    if (strcmp(nb_tensor_device(t), nb_replica_device(r)) != 0 || nb_replica_count(r) != NDEV)
        __atomic_add_fetch(bad, 1, __ATOMIC_RELAXED);
    *loss = nb_sum_all(t);
    return NB_OK;
}

static void test_reads(void)
{
    nb_async *a = nb_async_new(NDEV, NULL, "/cpu:2");
    nb_variable *v = nb_async_variable_new(a, "v", nb_zeros(NB_F32, NB_SHAPE(3)));
    CHECK(strcmp(nb_tensor_device(nb_read(v)), "/cpu:2") == 0);
    CHECK(nb_variable_replicas(v) == NDEV + 1);
    int bad = 0;
    nb_optimizer *opt = nb_sgd_new(0.1);
    CHECK_OK(nb_async_train(a, opt, NB_VARS(v), device_step, &bad, NB_TENSORS(nb_zeros(NB_F32, NB_SHAPE(8, 1))), 1));
    CHECK(bad == 0);
    nb_optimizer_free(opt);
    nb_variable_free(v);
    nb_async_free(a);
}

/* ---- failures ---------------------------------------------------------------------------------- */

typedef struct failing {
    int64_t batch; /* the batch to fail on */
    bool pending;  /* leave an error pending instead of returning one */
} failing;

static nb_status failing_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                              nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    failing *f = user;
    if (nb_replica_rows(r) > 0 && f && nb_replica_index(r) == (int)(f->batch % NDEV)) {
        /* the batch's first row holds its number */
        double first = 0;
        nb_tensor_read(nb_slice(inputs[0], NB_SHAPE(0, 0), NB_SHAPE(1, 1)), &first, sizeof first);
        if ((int64_t)first == f->batch) {
            if (f->pending) {
                nb_matmul(nb_zeros(NB_F64, NB_SHAPE(2, 3)), nb_zeros(NB_F64, NB_SHAPE(2, 3)));
                *loss = nb_scalar(NB_F64, 0);
                return NB_OK;
            }
            return NB_ERR_INTERNAL;
        }
    }
    return counting_step(r, n_inputs, inputs, n_vars, vars, loss, grads, NULL);
}

static void test_failing_worker(void)
{
    for (int64_t bound = -1; bound <= 1; bound++) {
        for (int pending = 0; pending < 2; pending++) {
            nb_async *a = nb_async_new(NDEV, NULL, NULL);
            CHECK_OK(nb_async_set_staleness_bound(a, bound));
            nb_variable *v = nb_async_variable_new(a, "v", nb_zeros(NB_F64, NB_SHAPE(2)));
            double rows[40];
            for (int i = 0; i < 40; i++)
                rows[i] = i;
            nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(40, 1), rows);
            nb_optimizer *opt = nb_sgd_new(1.0);
            failing f = {13, pending != 0};
            nb_status st = nb_async_train(a, opt, NB_VARS(v), failing_step, &f, NB_TENSORS(x), 1);
            CHECK(st == (pending ? NB_ERR_SHAPE : NB_ERR_INTERNAL));
            CHECK_ERROR(st, "nb_async_train", "worker 1", "/cpu:1", "batch 13");
            /* the trainer still works */
            CHECK_OK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(x), 1));
            nb_optimizer_free(opt);
            nb_variable_free(v);
            nb_async_free(a);
        }
    }
}

static nb_status wrong_gradient_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                                     nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)inputs, (void)n_vars, (void)vars;
    int kind = *(int *)user;
    *loss = kind == 2 ? nb_zeros(NB_F64, NB_SHAPE(2)) : kind == 3 ? NULL : nb_scalar(NB_F64, 1);
    grads[0] = kind == 0 ? nb_zeros(NB_F64, NB_SHAPE(3)) : kind == 1 ? nb_zeros(NB_F32, NB_SHAPE(2)) : NULL;
    return NB_OK;
}

static void test_bad_results(void)
{
    nb_async *a = nb_async_new(2, (const char *const[]){"/cpu:0", "/cpu:1"}, NULL);
    nb_variable *v = nb_async_variable_new(a, "v", nb_zeros(NB_F64, NB_SHAPE(2)));
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(4, 1));
    nb_optimizer *opt = nb_sgd_new(1.0);
    static const nb_status codes[] = {NB_ERR_SHAPE, NB_ERR_DTYPE, NB_ERR_SHAPE, NB_ERR_INVALID_ARGUMENT};
    static const char *const words[] = {"gradient of 'v'", "gradient of 'v'", "scalar", "no loss"};
    for (int kind = 0; kind < 4; kind++) {
        CHECK(nb_async_train(a, opt, NB_VARS(v), wrong_gradient_step, &kind, NB_TENSORS(x), 1) == codes[kind]);
        CHECK_ERROR(codes[kind], "nb_async_train", "worker", words[kind]);
    }
    double h[2];
    read_f64(v, h, 2);
    CHECK(h[0] == 0 && h[1] == 0);
    nb_optimizer_free(opt);
    nb_variable_free(v);
    nb_async_free(a);
}

static nb_status free_inside_step(nb_replica *r, int n_inputs, nb_tensor *const *inputs, int n_vars,
                                  nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    nb_async *a = user;
    nb_async_free(a); /* refused */
    nb_status st = nb_error();
    nb_error_clear();
    if (st != NB_ERR_INVALID_ARGUMENT)
        return NB_ERR_INTERNAL;
    st = nb_async_train(a, NULL, 0, NULL, NULL, NULL, 0, NULL, 1);
    nb_error_clear();
    if (st != NB_ERR_INVALID_ARGUMENT)
        return NB_ERR_INTERNAL;
    return counting_step(r, n_inputs, inputs, n_vars, vars, loss, grads, NULL);
}

static void test_bad_arguments(void)
{
    CHECK(!nb_async_new(-1, NULL, NULL));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_async_new", "-1 workers");
    CHECK(!nb_async_new(65, NULL, NULL));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_async_new", "65 workers");
    CHECK(!nb_async_new(0, (const char *const[]){"/cpu:0"}, NULL));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_async_new", "n = 0");
    CHECK(!nb_async_new(NDEV + 1, NULL, NULL));
    CHECK_ERROR(NB_ERR_DEVICE, "nb_async_new", "5 workers", "nb_set_logical_cpu_devices");
    CHECK(!nb_async_new(1, (const char *const[]){"/cpu:9"}, NULL));
    CHECK_ERROR(NB_ERR_DEVICE, "/cpu:9");
    CHECK(!nb_async_new(1, (const char *const[]){"/tpu:0"}, NULL));
    CHECK_ERROR(NB_ERR_DEVICE, "/tpu:0");
    CHECK(!nb_async_new(1, NULL, "/cpu:7"));
    CHECK_ERROR(NB_ERR_DEVICE, "/cpu:7");
    CHECK(!nb_async_new_world(1, NULL, NULL, 0));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_async_new_world", "0 servers");

    nb_async *a = nb_async_new(2, NULL, NULL);
    nb_async *other = nb_async_new(2, NULL, NULL);
    CHECK(nb_async_workers(a) == 2 && nb_async_world_workers(a) == 2 && !nb_async_is_server(a));
    CHECK(strcmp(nb_async_device(a, 1), "/cpu:1") == 0 && !nb_async_device(a, 2) && !nb_async_device(a, -1));
    CHECK(nb_async_set_staleness_bound(a, -2) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_async_set_staleness_bound");
    CHECK(nb_async_set_staleness_bound(NULL, 1) == NB_ERR_INVALID_ARGUMENT);
    nb_error_clear();
    CHECK(!nb_async_variable_new(a, "i", nb_zeros(NB_I32, NB_SHAPE(2))));
    CHECK_ERROR(NB_ERR_DTYPE, "nb_async_variable_new", "'i'", "i32");
    CHECK(!nb_async_variable_new(a, "n", NULL));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "initial");
    CHECK(!nb_async_variable_new(NULL, "n", nb_zeros(NB_F32, NB_SHAPE(2))));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "trainer");

    nb_variable *v = nb_async_variable_new(a, "v", nb_zeros(NB_F64, NB_SHAPE(2)));
    nb_variable *theirs = nb_async_variable_new(other, "theirs", nb_zeros(NB_F64, NB_SHAPE(2)));
    nb_variable *plain = nb_variable_new("plain", nb_zeros(NB_F64, NB_SHAPE(2)));
    nb_tensor *x = nb_zeros(NB_F64, NB_SHAPE(4, 1)), *y3 = nb_zeros(NB_F64, NB_SHAPE(3, 1));
    nb_optimizer *opt = nb_sgd_new(1.0);
    CHECK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(x), 0) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "batch_rows is 0");
    CHECK(nb_async_train(a, opt, NB_VARS(plain), counting_step, NULL, NB_TENSORS(x), 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'plain'", "nb_async_variable_new");
    CHECK(nb_async_train(a, opt, NB_VARS(theirs), counting_step, NULL, NB_TENSORS(x), 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'theirs'");
    CHECK(nb_async_train(a, NULL, NB_VARS(v), counting_step, NULL, NB_TENSORS(x), 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "optimizer");
    CHECK(nb_async_train(a, opt, NB_VARS(v), NULL, NULL, NB_TENSORS(x), 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "fn");
    CHECK(nb_async_train(NULL, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(x), 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "trainer");
    CHECK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, 0, NULL, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "at least one input");
    CHECK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(x, y3), 1) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "input 1", "[3, 1]", "[4, 1]");
    CHECK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(nb_scalar(NB_F64, 1)), 1) ==
          NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "scalar");
    CHECK(nb_async_train(a, opt, NB_VARS(v), counting_step, NULL, NB_TENSORS(nb_zeros(NB_F64, NB_SHAPE(0, 1))), 1) ==
          NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "no rows");
    /* calls from inside a worker are refused; the step goes on */
    CHECK_OK(nb_async_train(a, opt, NB_VARS(v), free_inside_step, a, NB_TENSORS(x), 1));
    nb_async_stats st;
    CHECK(nb_async_get_stats(a, NULL) == NB_ERR_INVALID_ARGUMENT);
    nb_error_clear();
    CHECK_OK(nb_async_get_stats(a, &st));
    CHECK(st.gradients == 4);
    nb_optimizer_free(opt);
    nb_variable_free(v);
    nb_variable_free(theirs);
    nb_variable_free(plain);
    nb_async_free(a);
    nb_async_free(other);
    nb_async_free(NULL);
}

#define RUN_T(fn) RUN_WITHIN(fn, 120)

int main(void)
{
    if (nb_set_logical_cpu_devices(NDEV) != NB_OK)
        return 1;
    RUN_T(test_regression_async);
    RUN_T(test_regression_bounded);
    RUN_T(test_regression_synchronous);
    RUN_T(test_no_lost_updates);
    RUN_T(test_synchronous_equals_mirrored);
    RUN_T(test_observer);
    RUN_T(test_settings_during_training);
    RUN_T(test_reads);
    RUN_T(test_failing_worker);
    RUN_T(test_bad_results);
    RUN_T(test_bad_arguments);
    return check_finish();
}
