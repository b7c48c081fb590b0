/* Model and pipeline parallelism over logical CPU devices: a model whose
 * layers sit on two devices against the same model on one (f64, 1e-12 of the
 * gradients' size); pipelined gradients (GPipe and 1F1B, two and three
 * stages, even and uneven micro-batches) against the unpipelined ones; a
 * pipelined SGD step against one on one device; stages that fail (an error
 * returned, an error left pending) on a given micro-batch, with nothing
 * updated and the next call fine; bad configurations; stages that really run
 * at once; 1F1B holding fewer micro-batches than GPipe; and the seeded
 * gradient of variables (nb_tape_gradient_vars_ex), a loss that sends no
 * gradient back, and freeing a pipeline while another thread calls it. */
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define NDEV 3
#define ROWS 10
#define DIN 5
#define DH 4
#define DOUT 3
#define NLAYERS 3

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state;

static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return u == 0 ? 0.5 : u;
}

/* Random f64 values on the device named dev, from a fixed seed. */
static nb_tensor *random_on(const char *dev, nb_shape shape, uint64_t seed)
{
    rng_state = seed;
    int64_t n = numel_of(shape);
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = rnd();
    nb_device_push(dev);
    nb_tensor *t = nb_from_buffer(NB_F64, shape, d);
    nb_device_pop();
    free(d);
    return t;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether a and b agree to rel of b's largest magnitude, element by element. */
static bool close_to(const nb_tensor *a, const nb_tensor *b, double rel)
{
    if (!a || !b || nb_tensor_numel(a) != nb_tensor_numel(b))
        return false;
    size_t n = (size_t)nb_tensor_numel(a);
    double *pa = malloc(sizeof(double) * n), *pb = malloc(sizeof(double) * n);
    bool ok = nb_tensor_read(a, pa, sizeof(double) * n) == NB_OK && nb_tensor_read(b, pb, sizeof(double) * n) == NB_OK;
    double big = 0, diff = 0;
    for (size_t i = 0; ok && i < n; i++) {
        big = fmax(big, fabs(pb[i]));
        diff = fmax(diff, fabs(pa[i] - pb[i]));
    }
    if (ok && diff > rel * big)
        fprintf(stderr, "  differ by %.3g of %.3g\n", diff, big);
    free(pa);
    free(pb);
    return ok && diff <= rel * big;
}

/* ---- the model: three dense layers, tanh between, a mean squared error ---------- */

typedef struct model {
    nb_variable *w[NLAYERS], *b[NLAYERS];
} model;

static const int64_t dims[NLAYERS + 1] = {DIN, DH, DH, DOUT};

/* Every model starts from the same values; layer l on devs[l]. */
static void model_make(model *m, const char *const *devs)
{
    nb_scope *s = nb_scope_begin();
    for (int l = 0; l < NLAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", l);
        m->w[l] = nb_variable_new(name, random_on(devs[l], NB_SHAPE(dims[l], dims[l + 1]), 100 + (uint64_t)l));
        snprintf(name, sizeof name, "b%d", l);
        m->b[l] = nb_variable_new(name, random_on(devs[l], NB_SHAPE(dims[l + 1]), 200 + (uint64_t)l));
    }
    nb_scope_end(s);
}

static void model_free(model *m)
{
    for (int l = 0; l < NLAYERS; l++) {
        nb_variable_free(m->w[l]);
        nb_variable_free(m->b[l]);
    }
}

/* vars in layer order: w0, b0, w1, b1, w2, b2 */
static void model_vars(const model *m, nb_variable **vars)
{
    for (int l = 0; l < NLAYERS; l++) {
        vars[2 * l] = m->w[l];
        vars[2 * l + 1] = m->b[l];
    }
}

static nb_tensor *layer(const model *m, int l, nb_tensor *x)
{
    nb_tensor *y = nb_add(nb_matmul(x, nb_read(m->w[l])), nb_read(m->b[l]));
    return l < NLAYERS - 1 ? nb_tanh(y) : y;
}

static nb_tensor *mse(nb_tensor *out, nb_tensor *labels) { return nb_mean(nb_square(nb_sub(out, labels)), NB_ALL_AXES, false); }

/* The whole model, layer l run under devs[l] (NULL: wherever the inputs are). */
static nb_tensor *model_loss(const model *m, nb_tensor *x, nb_tensor *labels, const char *const *devs)
{
    for (int l = 0; l < NLAYERS; l++) {
        if (devs)
            nb_device_push(devs[l]);
        x = layer(m, l, x);
        if (devs)
            nb_device_pop();
    }
    if (devs) /* the labels go where the last layer is */
        nb_device_push(devs[NLAYERS - 1]);
    nb_tensor *loss = mse(x, labels);
    if (devs)
        nb_device_pop();
    return loss;
}

static const char *const one_dev[NLAYERS] = {"/cpu:0", "/cpu:0", "/cpu:0"};
static const char *const two_dev[NLAYERS] = {"/cpu:0", "/cpu:1", "/cpu:1"};
static const char *const three_dev[NLAYERS] = {"/cpu:0", "/cpu:1", "/cpu:2"};

/* Gradients of the full-batch loss of m, the layers on devs; loss to *loss. */
static void plain_gradients(const model *m, const char *const *devs, nb_tensor **loss, nb_tensor **grads)
{
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    nb_variable *vars[2 * NLAYERS];
    model_vars(m, vars);
    nb_tape *tape = nb_tape_begin();
    *loss = model_loss(m, x, y, devs);
    CHECK_OK(nb_tape_gradient_vars(tape, *loss, 2 * NLAYERS, vars, grads));
}

/* ---- stages ------------------------------------------------------------------------ */

/* A stage runs layers [first, last]; the last stage adds the loss. */
typedef struct stage_def {
    const model *m;
    int first, last;
    bool is_last;
    /* failing on purpose: on micro-batch fail_mb, return an error (fail_how 1)
     * or leave one pending (2) */
    int fail_mb, fail_how;
    /* timing: sleep this long per forward, and record when each ran */
    int sleep_ms;
    double start[16], end[16];
} stage_def;

static nb_status stage_fn(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    stage_def *d = user;
    int mb = nb_stage_micro_batch(st);
    if (d->sleep_ms) {
        d->start[mb] = now_s();
        struct timespec ts = {0, (long)d->sleep_ms * 1000000L};
        nanosleep(&ts, NULL);
        d->end[mb] = now_s();
    }
    if (mb == d->fail_mb && d->fail_how == 1)
        return NB_ERR_UNSUPPORTED;
    if (mb == d->fail_mb && d->fail_how == 2) {
        nb_matmul(x, x); /* [rows, k] @ [rows, k]: a shape error left pending */
        *y = x;
        return NB_OK;
    }
    for (int l = d->first; l <= d->last; l++)
        x = layer(d->m, l, x);
    *y = d->is_last ? mse(x, nb_stage_input(st, 1)) : x;
    return *y ? NB_OK : nb_error();
}

/* A pipeline of n_stages (2 or 3) over m's layers. */
static nb_pipeline *make_pipeline(const model *m, int n_stages, stage_def *defs)
{
    const char *const *devs = n_stages == 2 ? two_dev : three_dev;
    const char *sdev[3] = {devs[0], devs[1], devs[2]};
    nb_pipeline *p = nb_pipeline_new(n_stages, sdev);
    CHECK(p != NULL);
    if (!p)
        return NULL;
    int first = 0;
    for (int s = 0; s < n_stages; s++) {
        int last = n_stages == 2 ? (s == 0 ? 0 : 2) : s;
        defs[s] = (stage_def){.m = m, .first = first, .last = last, .is_last = s == n_stages - 1, .fail_mb = -1};
        nb_variable *vars[2 * NLAYERS];
        int n = 0;
        for (int l = first; l <= last; l++) {
            vars[n++] = m->w[l];
            vars[n++] = m->b[l];
        }
        CHECK_OK(nb_pipeline_set_stage(p, s, stage_fn, &defs[s], n, vars));
        first = last + 1;
    }
    return p;
}

/* ---- cases ----------------------------------------------------------------------------- */

static void test_model_parallel(void)
{
    model one, two;
    model_make(&one, one_dev);
    model_make(&two, two_dev);
    nb_tensor *l1, *l2, *g1[2 * NLAYERS], *g2[2 * NLAYERS];
    plain_gradients(&one, NULL, &l1, g1);
    plain_gradients(&two, two_dev, &l2, g2);
    CHECK(on_device(l2, "/cpu:1"));
    CHECK(close_to(l2, l1, 1e-12));
    for (int i = 0; i < 2 * NLAYERS; i++) {
        CHECK(on_device(g2[i], two_dev[i / 2]));
        CHECKF(close_to(g2[i], g1[i], 1e-12), "gradient %d", i);
    }
    model_free(&one);
    model_free(&two);
}

static void test_pipelined_gradients(void)
{
    model one;
    model_make(&one, one_dev);
    nb_tensor *l1, *g1[2 * NLAYERS];
    plain_gradients(&one, NULL, &l1, g1);
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    for (int n_stages = 2; n_stages <= 3; n_stages++) {
        model pm;
        model_make(&pm, n_stages == 2 ? two_dev : three_dev);
        stage_def defs[3];
        nb_pipeline *p = make_pipeline(&pm, n_stages, defs);
        CHECK(nb_pipeline_variables(p, NULL, 0) == 2 * NLAYERS);
        nb_tensor *first_bits[2 * NLAYERS] = {0};
        for (int sched = 0; sched < 2; sched++) {
            CHECK_OK(nb_pipeline_set_schedule(p, sched ? NB_PIPELINE_1F1B : NB_PIPELINE_GPIPE));
            int ms[] = {1, 2, 3, 4, 10};
            for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
                nb_tensor *loss = NULL, *g[2 * NLAYERS];
                CHECK_OK(nb_pipeline_gradients(p, ms[k], NB_TENSORS(x, y), NB_REDUCE_MEAN, &loss, g));
                CHECKF(close_to(loss, l1, 1e-12), "%d stages, schedule %d, M = %d: loss", n_stages, sched, ms[k]);
                CHECK(loss && nb_tensor_dtype(loss) == NB_F64 && nb_tensor_ndim(loss) == 0);
                for (int i = 0; i < 2 * NLAYERS; i++) {
                    CHECKF(close_to(g[i], g1[i], 1e-12), "%d stages, schedule %d, M = %d, gradient %d", n_stages,
                           sched, ms[k], i);
                    CHECK(on_device(g[i], nb_variable_device(pm.w[i / 2])));
                }
                /* GPipe and 1F1B add the micro-batches up in one order: the same bits */
                for (int i = 0; ms[k] == 3 && i < 2 * NLAYERS; i++) {
                    if (!sched)
                        first_bits[i] = g[i];
                    else
                        CHECK(same_bits(g[i], first_bits[i]));
                }
                nb_pipeline_stats stats;
                CHECK_OK(nb_pipeline_get_stats(p, &stats));
                CHECK(stats.micro_batches == ms[k] && stats.stages == n_stages);
                CHECK_NEAR(stats.ideal_bubble, (double)(n_stages - 1) / (ms[k] + n_stages - 1), 1e-15);
                CHECK(stats.bubble >= 0 && stats.bubble < 1 && stats.wall_seconds > 0);
            }
        }
        /* SUM: the micro-batch means added up, each weighted 1 */
        nb_tensor *ls = NULL, *gs[2 * NLAYERS];
        CHECK_OK(nb_pipeline_gradients(p, 2, NB_TENSORS(x, y), NB_REDUCE_SUM, &ls, gs));
        CHECK(close_to(ls, nb_mul_scalar(l1, 2.0), 1e-12));
        CHECK(close_to(gs[0], nb_mul_scalar(g1[0], 2.0), 1e-12));
        nb_pipeline_free(p);
        model_free(&pm);
    }
    model_free(&one);
}

static void test_step_sgd(void)
{
    model one, pm;
    model_make(&one, one_dev);
    model_make(&pm, two_dev);
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    nb_optimizer *o1 = nb_sgd_new(0.1), *o2 = nb_sgd_new(0.1);
    stage_def defs[2];
    nb_pipeline *p = make_pipeline(&pm, 2, defs);
    CHECK_OK(nb_pipeline_set_schedule(p, NB_PIPELINE_1F1B));
    nb_variable *vars[2 * NLAYERS];
    model_vars(&one, vars);
    for (int step = 0; step < 3; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *l1, *g1[2 * NLAYERS], *l2 = NULL;
        plain_gradients(&one, NULL, &l1, g1);
        CHECK_OK(nb_optimizer_apply(o1, 2 * NLAYERS, vars, g1));
        CHECK_OK(nb_pipeline_step(p, o2, 3, NB_TENSORS(x, y), NB_REDUCE_MEAN, &l2));
        CHECK(close_to(l2, l1, 1e-12));
        nb_scope_end(s);
    }
    for (int l = 0; l < NLAYERS; l++) {
        CHECK(close_to(nb_read(pm.w[l]), nb_read(one.w[l]), 1e-12));
        CHECK(close_to(nb_read(pm.b[l]), nb_read(one.b[l]), 1e-12));
        CHECK(strcmp(nb_variable_device(pm.w[l]), two_dev[l]) == 0);
    }
    CHECK(nb_optimizer_iterations(o2) == 3);
    nb_pipeline_stats stats;
    CHECK_OK(nb_pipeline_get_stats(p, &stats));
    CHECK(stats.steps == 3 && stats.schedule == NB_PIPELINE_1F1B);
    nb_pipeline_free(p);
    nb_optimizer_free(o1);
    nb_optimizer_free(o2);
    model_free(&one);
    model_free(&pm);
}

/* The values of every variable of m, read now, to compare with later. */
static void snapshot(const model *m, nb_tensor **out)
{
    for (int l = 0; l < NLAYERS; l++) {
        out[2 * l] = nb_read(m->w[l]);
        out[2 * l + 1] = nb_read(m->b[l]);
    }
}

static void test_failing_stage(void)
{
    model pm;
    model_make(&pm, three_dev);
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    stage_def defs[3];
    nb_pipeline *p = make_pipeline(&pm, 3, defs);
    nb_optimizer *opt = nb_sgd_new(0.5);
    nb_tensor *before[2 * NLAYERS];
    snapshot(&pm, before);
    for (int sched = 0; sched < 2; sched++) {
        CHECK_OK(nb_pipeline_set_schedule(p, sched ? NB_PIPELINE_1F1B : NB_PIPELINE_GPIPE));
        for (int s = 0; s < 3; s++) {
            for (int how = 1; how <= 2; how++) {
                defs[s].fail_mb = 2;
                defs[s].fail_how = how;
                nb_tensor *loss = (nb_tensor *)1;
                nb_status st = nb_pipeline_step(p, opt, 4, NB_TENSORS(x, y), NB_REDUCE_MEAN, &loss);
                CHECK(st == (how == 1 ? NB_ERR_UNSUPPORTED : NB_ERR_SHAPE));
                CHECK(loss == NULL);
                char stage[16], dev[16];
                snprintf(stage, sizeof stage, "stage %d", s);
                snprintf(dev, sizeof dev, "(%s)", three_dev[s]);
                CHECK_ERROR(st, "nb_pipeline_step", stage, dev, "micro-batch 2");
                defs[s].fail_mb = -1;
                nb_tensor *g[2 * NLAYERS];
                st = nb_pipeline_gradients(p, 3, NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL, g);
                CHECK(st == NB_OK);
                for (int i = 0; i < 2 * NLAYERS; i++)
                    CHECK(g[i] != NULL);
            }
        }
    }
    nb_tensor *after[2 * NLAYERS];
    snapshot(&pm, after);
    for (int i = 0; i < 2 * NLAYERS; i++)
        CHECK(same_bits(after[i], before[i]));
    CHECK(nb_optimizer_iterations(opt) == 0);
    /* and then a step works */
    CHECK_OK(nb_pipeline_step(p, opt, 4, NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL));
    CHECK(nb_optimizer_iterations(opt) == 1);
    nb_pipeline_free(p);
    nb_optimizer_free(opt);
    model_free(&pm);
}

static nb_status vector_loss(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)st, (void)user;
    *y = nb_sum(x, NB_AXES(1), false); /* one value per row: not a scalar */
    return NB_OK;
}

static nb_status int_output(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)st, (void)user;
    *y = nb_cast(x, NB_I32);
    return NB_OK;
}

static nb_status no_output(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)st, (void)x, (void)user;
    *y = NULL;
    return NB_OK;
}

static nb_status identity(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)st, (void)user;
    *y = x;
    return NB_OK;
}

static nb_status calls_back(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)st;
    nb_pipeline *p = user;
    nb_tensor *g[1];
    nb_status inner = nb_pipeline_gradients(p, 1, NB_TENSORS(x), NB_REDUCE_MEAN, NULL, g);
    nb_pipeline_free(p); /* refused too */
    *y = nb_mean(x, NB_ALL_AXES, false);
    return inner;
}

static void test_bad_configurations(void)
{
    CHECK(nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:7"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_pipeline_new", "/cpu:7");
    CHECK(nb_pipeline_new(1, (const char *const[]){"/tpu:0"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "/tpu:0");
    CHECK(nb_pipeline_new(0, (const char *const[]){"/cpu:0"}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_pipeline_new", "0 stages");
    CHECK(nb_pipeline_new(65, (const char *const[]){"/cpu:0"}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "65 stages");
    CHECK(nb_pipeline_new(2, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "NULL");

    /* one device may host two stages */
    nb_pipeline *p = nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:0"});
    CHECK(p != NULL && nb_pipeline_stages(p) == 2);
    CHECK(nb_pipeline_device(p, 1) && strcmp(nb_pipeline_device(p, 1), "/cpu:0") == 0);
    CHECK(nb_pipeline_device(p, 2) == NULL);
    nb_pipeline_free(p);

    p = nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:1"});
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(4, 3), 5);
    nb_tensor *g[2] = {0}, *loss = NULL;
    CHECK(nb_pipeline_gradients(p, 2, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stage 0 (/cpu:0) has no function");

    nb_variable *v0 = nb_variable_new("v0", random_on("/cpu:0", NB_SHAPE(3), 6));
    nb_variable *vi = nb_variable_new("vi", nb_cast(random_on("/cpu:1", NB_SHAPE(3), 6), NB_I32));
    CHECK(nb_pipeline_set_stage(p, 1, identity, NULL, NB_VARS(v0)) == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "stage 1 runs on /cpu:1", "'v0' is on /cpu:0");
    CHECK(nb_pipeline_set_stage(p, 1, identity, NULL, NB_VARS(vi)) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "'vi'");
    CHECK(nb_pipeline_set_stage(p, 0, identity, NULL, NB_VARS(v0, v0)) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "twice");
    CHECK(nb_pipeline_set_stage(p, 2, identity, NULL, 0, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stage 2 is outside");
    CHECK(nb_pipeline_set_stage(p, 0, NULL, NULL, 0, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "function is NULL");
    CHECK(nb_pipeline_set_stage(NULL, 0, identity, NULL, 0, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "pipeline is NULL");
    CHECK_OK(nb_pipeline_set_stage(p, 0, identity, NULL, NB_VARS(v0)));
    nb_variable *v1 = nb_variable_new("v1", random_on("/cpu:1", NB_SHAPE(3), 6));
    CHECK_OK(nb_pipeline_set_stage(p, 1, identity, NULL, NB_VARS(v1)));
    CHECK(nb_pipeline_set_stage(p, 0, identity, NULL, NB_VARS(v1)) == NB_ERR_DEVICE);
    nb_error_clear();
    nb_variable *v0b = nb_variable_new("v0b", random_on("/cpu:0", NB_SHAPE(3), 6));
    nb_pipeline *q = nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:0"});
    CHECK_OK(nb_pipeline_set_stage(q, 0, identity, NULL, NB_VARS(v0b)));
    CHECK(nb_pipeline_set_stage(q, 1, identity, NULL, NB_VARS(v0, v0b)) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'v0b' already belongs to stage 0");
    nb_pipeline_free(q);
    nb_variable_free(v0b);
    nb_variable_free(v1);
    CHECK(nb_pipeline_set_schedule(p, (nb_pipeline_schedule)7) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "unknown schedule");

    /* the last stage's output must be a floating scalar */
    CHECK_OK(nb_pipeline_set_stage(p, 1, vector_loss, NULL, 0, NULL));
    CHECK(nb_pipeline_gradients(p, 2, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "stage 1 (/cpu:1), micro-batch 0", "floating scalar", "[2]");
    CHECK(loss == NULL && g[0] == NULL);
    CHECK_OK(nb_pipeline_set_stage(p, 1, int_output, NULL, 0, NULL));
    CHECK(nb_pipeline_gradients(p, 2, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "stage 1", "i32");
    CHECK_OK(nb_pipeline_set_stage(p, 1, no_output, NULL, 0, NULL));
    CHECK(nb_pipeline_gradients(p, 2, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stage 1", "no output");
    /* an inner stage's output must be floating */
    CHECK_OK(nb_pipeline_set_stage(p, 0, int_output, NULL, NB_VARS(v0)));
    CHECK(nb_pipeline_gradients(p, 1, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "stage 0", "carry a gradient");

    /* the arguments of a call */
    CHECK_OK(nb_pipeline_set_stage(p, 0, identity, NULL, NB_VARS(v0)));
    CHECK_OK(nb_pipeline_set_stage(p, 1, calls_back, p, 0, NULL));
    CHECK(nb_pipeline_gradients(p, 0, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "0 micro-batches");
    CHECK(nb_pipeline_gradients(p, 5, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "5 micro-batches of a batch of 4 rows");
    CHECK(nb_pipeline_gradients(p, 1, 0, NULL, NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "at least one input");
    CHECK(nb_pipeline_gradients(p, 1, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "grads is NULL");
    CHECK(nb_pipeline_gradients(NULL, 1, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "pipeline is NULL");
    CHECK(nb_pipeline_gradients(p, 1, NB_TENSORS(x), (nb_reduction)9, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "unknown reduction");
    nb_tensor *scalar = nb_scalar(NB_F64, 1.0), *short_x = random_on("/cpu:0", NB_SHAPE(3, 3), 7);
    CHECK(nb_pipeline_gradients(p, 1, NB_TENSORS(scalar), NB_REDUCE_MEAN, &loss, g) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "input 0 is a scalar");
    CHECK(nb_pipeline_gradients(p, 1, NB_TENSORS(x, short_x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "input 1 has shape [3, 3]");
    CHECK(nb_pipeline_step(p, NULL, 1, NB_TENSORS(x), NB_REDUCE_MEAN, &loss) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "optimizer is NULL");
    CHECK(nb_pipeline_get_stats(p, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK(nb_stage_input(NULL, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_stage_input");
    CHECK(nb_stage_index(NULL) == -1 && nb_stage_rows(NULL) == 0);

    /* a call from inside a stage function is refused, not a hang */
    CHECK(nb_pipeline_gradients(p, 2, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stage 1", "from inside a stage function");
    /* and the pipeline still works */
    CHECK_OK(nb_pipeline_set_stage(p, 1, vector_loss, NULL, 0, NULL));
    CHECK_OK(nb_pipeline_set_stage(p, 1, identity, NULL, 0, NULL));
    nb_tensor *col = random_on("/cpu:0", NB_SHAPE(4, 1), 8);
    CHECK_OK(nb_pipeline_gradients(p, 4, NB_TENSORS(col), NB_REDUCE_MEAN, &loss, g));
    CHECK(loss && g[0] == NULL); /* v0 was never read */
    nb_pipeline_free(p);
    nb_pipeline_free(NULL);
    nb_variable_free(v0);
    nb_variable_free(vi);
}

/* Two stages that each sleep 30 ms per micro-batch: with 6 micro-batches some
 * forward of stage 1 must overlap one of stage 0 (in the serial order none
 * would), and the whole call takes well under the 360 ms the stages slept. */
static void test_stages_overlap(void)
{
    model pm;
    model_make(&pm, two_dev);
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    stage_def defs[2];
    nb_pipeline *p = make_pipeline(&pm, 2, defs);
    defs[0].sleep_ms = defs[1].sleep_ms = 30;
    nb_tensor *g[2 * NLAYERS];
    double t0 = now_s();
    CHECK_OK(nb_pipeline_gradients(p, 6, NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL, g));
    double wall = now_s() - t0;
    int overlaps = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            overlaps += defs[0].start[a] < defs[1].end[b] && defs[1].start[b] < defs[0].end[a];
    CHECKF(overlaps > 0, "no forward of stage 1 ran beside one of stage 0");
    CHECKF(wall < 0.330, "the call took %.3f s; the stages slept 0.360 s in all", wall);
    nb_pipeline_stats stats;
    CHECK_OK(nb_pipeline_get_stats(p, &stats));
    CHECK(stats.stage_busy_seconds[0] >= 0.18 && stats.stage_busy_seconds[1] >= 0.18);
    nb_pipeline_free(p);
    model_free(&pm);
}

/* 1F1B holds at most S - s micro-batches on stage s; GPipe holds all M. */
static void test_in_flight(void)
{
    model pm;
    model_make(&pm, three_dev);
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(ROWS, DIN), 1);
    nb_tensor *y = random_on("/cpu:0", NB_SHAPE(ROWS, DOUT), 2);
    stage_def defs[3];
    nb_pipeline *p = make_pipeline(&pm, 3, defs);
    nb_tensor *g[2 * NLAYERS];
    nb_pipeline_stats stats;
    CHECK_OK(nb_pipeline_gradients(p, 8, NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL, g));
    CHECK_OK(nb_pipeline_get_stats(p, &stats));
    CHECK(stats.stage_peak_in_flight[0] == 8 && stats.stage_peak_in_flight[2] == 8);
    CHECK_OK(nb_pipeline_set_schedule(p, NB_PIPELINE_1F1B));
    CHECK_OK(nb_pipeline_gradients(p, 8, NB_TENSORS(x, y), NB_REDUCE_MEAN, NULL, g));
    CHECK_OK(nb_pipeline_get_stats(p, &stats));
    for (int s = 0; s < 3; s++)
        CHECKF(stats.stage_peak_in_flight[s] >= 1 && stats.stage_peak_in_flight[s] <= 3 - s, "stage %d held %d", s,
               stats.stage_peak_in_flight[s]);
    nb_pipeline_free(p);
    model_free(&pm);
}

/* A last stage whose loss ignores its input sends nothing back: stage 0's
 * variable then gets no gradient (NULL), and the loss is still right. */
static nb_status scaled_by_v(nb_stage *st, nb_tensor *x, nb_tensor **y, void *v)
{
    (void)st;
    *y = nb_mul(x, nb_read(v));
    return *y ? NB_OK : nb_error();
}

static nb_status ignores_input(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user)
{
    (void)x, (void)user;
    *y = nb_mean_all(nb_stage_input(st, 0));
    return *y ? NB_OK : nb_error();
}

static void test_nothing_flows_back(void)
{
    nb_variable *v = nb_variable_new("v", random_on("/cpu:0", NB_SHAPE(3), 13));
    nb_tensor *x = random_on("/cpu:0", NB_SHAPE(6, 3), 14);
    nb_pipeline *p = nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:1"});
    CHECK_OK(nb_pipeline_set_stage(p, 0, scaled_by_v, v, NB_VARS(v)));
    CHECK_OK(nb_pipeline_set_stage(p, 1, ignores_input, NULL, 0, NULL));
    for (int sched = 0; sched < 2; sched++) {
        CHECK_OK(nb_pipeline_set_schedule(p, sched ? NB_PIPELINE_1F1B : NB_PIPELINE_GPIPE));
        nb_tensor *loss = NULL, *g[1] = {(nb_tensor *)1};
        CHECK_OK(nb_pipeline_gradients(p, 4, NB_TENSORS(x), NB_REDUCE_MEAN, &loss, g));
        CHECK(g[0] == NULL);
        CHECK(close_to(loss, nb_mean_all(x), 1e-12));
    }
    nb_pipeline_free(p);
    nb_variable_free(v);
}

/* nb_pipeline_free on one thread waits for a call running on another. */
typedef struct free_race {
    nb_pipeline *p;
    nb_tensor *x;
    atomic_int started;
    nb_status st;
} free_race;

static nb_status slow_mean(nb_stage *st, nb_tensor *x, nb_tensor **y, void *race)
{
    (void)st;
    atomic_store(&((free_race *)race)->started, 1);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    *y = nb_mean_all(x);
    return *y ? NB_OK : nb_error();
}

static void *call_in_thread(void *arg)
{
    free_race *r = arg;
    nb_scope *s = nb_scope_begin();
    r->st = nb_pipeline_gradients(r->p, 2, NB_TENSORS(r->x), NB_REDUCE_MEAN, NULL, NULL);
    nb_scope_end(s);
    return NULL;
}

static void test_free_during_call(void)
{
    free_race r = {.x = random_on("/cpu:0", NB_SHAPE(4, 2), 15), .st = NB_ERR_INTERNAL};
    r.p = nb_pipeline_new(2, (const char *const[]){"/cpu:0", "/cpu:1"});
    CHECK_OK(nb_pipeline_set_stage(r.p, 0, identity, NULL, 0, NULL));
    CHECK_OK(nb_pipeline_set_stage(r.p, 1, slow_mean, &r, 0, NULL));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, call_in_thread, &r) == 0);
    while (!atomic_load(&r.started)) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    nb_pipeline_free(r.p); /* waits for the call */
    pthread_join(t, NULL);
    CHECK(r.st == NB_OK);
}

/* The seeded gradient with respect to variables: d(seed . f) / d v. */
static void test_gradient_vars_ex(void)
{
    nb_variable *v = nb_variable_new("v", random_on("/cpu:0", NB_SHAPE(3), 9));
    nb_variable *unused = nb_variable_new("u", random_on("/cpu:0", NB_SHAPE(2), 10));
    nb_tensor *seed = random_on("/cpu:0", NB_SHAPE(3), 11);
    nb_tape *tape = nb_tape_begin();
    nb_tensor *y = nb_mul_scalar(nb_read(v), 3.0);
    nb_tensor *g[2];
    CHECK_OK(nb_tape_gradient_vars_ex(tape, y, seed, NB_VARS(v, unused), g, NB_UNCONNECTED_ZERO));
    CHECK(close_to(g[0], nb_mul_scalar(seed, 3.0), 1e-15));
    CHECK(has_shape(g[1], NB_SHAPE(2)) && nb_tensor_item(nb_sum_all(nb_abs(g[1]))) == 0.0);
    tape = nb_tape_begin();
    y = nb_mul_scalar(nb_read(v), 3.0);
    CHECK(nb_tape_gradient_vars_ex(tape, y, random_on("/cpu:0", NB_SHAPE(2), 12), NB_VARS(v), g,
                                   NB_UNCONNECTED_NULL) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "output gradient");
    CHECK(g[0] == NULL);
    nb_variable_free(v);
    nb_variable_free(unused);
}

/* ---- main ---------------------------------------------------------------------------------- */

#define RUN_T(fn) RUN_WITHIN(fn, 120)

int main(void)
{
    if (nb_set_logical_cpu_devices(NDEV) != NB_OK)
        return 1;
    RUN_T(test_model_parallel);
    RUN_T(test_pipelined_gradients);
    RUN_T(test_step_sgd);
    RUN_T(test_failing_stage);
    RUN_T(test_bad_configurations);
    RUN_T(test_stages_overlap);
    RUN_T(test_in_flight);
    RUN_T(test_nothing_flows_back);
    RUN_T(test_free_during_call);
    RUN_T(test_gradient_vars_ex);
    return check_finish();
}
