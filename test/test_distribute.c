/* The mirrored strategy over four logical CPU devices: one step on N replicas
 * against one step on one device (SGD and Adam, f64 and f32, uneven and empty
 * shares), SUM against MEAN, copies equal bit for bit after many steps and runs
 * that repeat, gradient buckets, replicas that fail, argument errors,
 * nb_mirrored_run / reduce / all_reduce, replicas that really run at once,
 * freeing with a step in flight, calls from inside a replica, and reads and
 * assignments of mirrored variables. */
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define NDEV 4  /* logical CPU devices */
#define MAXR 64 /* most replicas a strategy may have */
#define MAXV 24 /* most variables a test model has */

/* A check that prints a formatted explanation when it fails. */
/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* Uniform in [-1, 1), never exactly zero. */
static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return u == 0 ? 0.5 : u;
}

/* A tensor of random values in (-scale, scale), never zero, on the current
 * device; h (when not NULL) receives them as doubles, rounded to dtype. */
static nb_tensor *host_tensor(nb_dtype dt, nb_shape shape, double scale, double *h)
{
    int64_t n = numel_of(shape);
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    float *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        d[i] = scale * rnd();
        f[i] = (float)d[i];
        if (dt == NB_F32)
            d[i] = f[i];
        if (h)
            h[i] = d[i];
    }
    nb_tensor *t = nb_from_buffer(dt, shape, dt == NB_F32 ? (const void *)f : (const void *)d);
    free(d);
    free(f);
    return t;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Counts the caller in, then waits until n have come in: true when they did
 * within the time given, false when it ran out. */
static bool rendezvous(atomic_int *counter, int n, double seconds)
{
    atomic_fetch_add(counter, 1);
    double end = now_s() + seconds;
    while (atomic_load(counter) < n) {
        if (now_s() > end)
            return false;
        sleep_ms(1);
    }
    return true;
}

static bool same_shape(const nb_tensor *a, const nb_tensor *b)
{
    return a && b && has_shape(b, nb_tensor_shape(a));
}

/* Largest |a - b| / max(|a|, |b|) over the elements (magnitudes below 1e-6
 * compared against 1e-6); INFINITY when either is missing or the shapes differ. */
static double rel_diff(const nb_tensor *a, const nb_tensor *b)
{
    if (!same_shape(a, b))
        return INFINITY;
    double worst = 0;
    for (int64_t i = 0; i < nb_tensor_numel(a); i++) {
        double x = nb_tensor_get(a, i), y = nb_tensor_get(b, i);
        double d = fabs(x - y) / fmax(fmax(fabs(x), fabs(y)), 1e-6);
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

static bool rel_close(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fmax(fabs(a), fabs(b)), 1e-6);
}

/* A strategy over the first n logical CPU devices, named (the default would be
 * the GPUs on a machine that has them). */
static nb_mirrored *cpu_mirrored(int n)
{
    const char *names[NDEV];
    for (int r = 0; r < n && r < NDEV; r++)
        names[r] = nb_device_name(NB_DEVICE_CPU, r);
    return nb_mirrored_new(n, names);
}

static nb_mirrored_stats stats_of(const nb_mirrored *s)
{
    nb_mirrored_stats st;
    memset(&st, 0, sizeof st);
    CHECK_OK(nb_mirrored_get_stats(s, &st));
    return st;
}

/* ---- models --------------------------------------------------------------------
 * MLP_MSE: tanh MLP DIN -> DHID -> DOUT, per-row loss the mean squared error of
 *   its outputs; vars W1, b1, W2, b2; inputs x [rows, DIN], y [rows, DOUT].
 * LINEAR_CE: logits x W + b, per-row softmax cross-entropy against dense
 *   probabilities; vars W, b; inputs x, y.
 * BAG: any number of vector ([cols]) or scalar variables of f32 or f64, each
 *   adding a term tanh(x w) or mean over cols of tanh(x s) to a prediction of y;
 *   inputs x f64 [rows, cols], the same x in f32, y f64 [rows].
 * The loss is the mean over rows of the per-row loss, or the sum (sum_rows). */

enum { MLP_MSE, LINEAR_CE, BAG };
#define DIN 5
#define DHID 6
#define DOUT 3

typedef struct model {
    int kind;
    bool sum_rows;
} model;

static nb_tensor *as_f64(nb_tensor *t)
{
    return t && nb_tensor_dtype(t) != NB_F64 ? nb_cast(t, NB_F64) : t;
}

static nb_tensor *model_loss(const model *m, int nv, nb_variable *const *v, nb_tensor *const *in)
{
    nb_tensor *per_row = NULL;
    if (m->kind == MLP_MSE) {
        nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[0], nb_read(v[0])), nb_read(v[1])));
        nb_tensor *out = nb_add(nb_matmul(h, nb_read(v[2])), nb_read(v[3]));
        per_row = nb_mean(nb_square(nb_sub(out, in[1])), NB_AXES(1), false);
    } else if (m->kind == LINEAR_CE) {
        nb_tensor *logits = nb_add(nb_matmul(in[0], nb_read(v[0])), nb_read(v[1]));
        per_row = nb_softmax_cross_entropy(logits, in[1]);
    } else {
        nb_tensor *pred = NULL;
        for (int k = 0; k < nv; k++) {
            nb_tensor *w = nb_read(v[k]);
            nb_tensor *x = nb_variable_dtype(v[k]) == NB_F32 ? in[1] : in[0];
            nb_tensor *f = nb_variable_shape(v[k]).ndim == 0
                               ? nb_mean(nb_tanh(nb_mul(x, w)), NB_AXES(1), false)
                               : nb_tanh(nb_matmul(x, w));
            f = as_f64(f);
            pred = k == 0 ? f : nb_add(pred, f);
        }
        per_row = nb_square(nb_sub(pred, in[2]));
    }
    return m->sum_rows ? nb_sum_all(per_row) : nb_mean_all(per_row);
}

/* Initial values of the MLP or linear model's variables; returns their count. */
static int model_init(const model *m, nb_dtype dt, uint64_t seed, nb_tensor **init)
{
    if (m->kind == MLP_MSE) {
        init[0] = nb_random_normal(dt, NB_SHAPE(DIN, DHID), 0, 0.5, seed);
        init[1] = nb_random_normal(dt, NB_SHAPE(DHID), 0, 0.5, seed + 1);
        init[2] = nb_random_normal(dt, NB_SHAPE(DHID, DOUT), 0, 0.5, seed + 2);
        init[3] = nb_random_normal(dt, NB_SHAPE(DOUT), 0, 0.5, seed + 3);
        return 4;
    }
    init[0] = nb_random_normal(dt, NB_SHAPE(DIN, DOUT), 0, 0.5, seed);
    init[1] = nb_random_normal(dt, NB_SHAPE(DOUT), 0, 0.5, seed + 1);
    return 2;
}

/* A batch of rows for the MLP or linear model: in[0] = x, in[1] = y. */
static void model_data(const model *m, nb_dtype dt, int64_t rows, uint64_t seed, nb_tensor **in)
{
    in[0] = nb_random_normal(dt, NB_SHAPE(rows, DIN), 0, 1, seed);
    if (m->kind == LINEAR_CE)
        in[1] = nb_softmax(nb_random_normal(dt, NB_SHAPE(rows, DOUT), 0, 2, seed + 1), 1);
    else
        in[1] = nb_random_normal(dt, NB_SHAPE(rows, DOUT), 0, 1, seed + 1);
}

/* A batch for the BAG model with cols columns: x f64, x f32, y f64. */
static void bag_data(int64_t rows, int64_t cols, uint64_t seed, nb_tensor **in)
{
    in[0] = nb_random_normal(NB_F64, NB_SHAPE(rows, cols), 0, 1, seed);
    in[1] = nb_cast(in[0], NB_F32);
    in[2] = nb_random_normal(NB_F64, NB_SHAPE(rows), 0, 1, seed + 1);
}

/* ---- the replica step function -------------------------------------------------- */

enum {
    STEP_PLAIN,       /* the model's loss and gradients */
    STEP_FAIL_OP,     /* target: an op with shapes that do not fit */
    STEP_GRAD_SHAPE,  /* target: gradient 0 of the wrong shape */
    STEP_GRAD_DTYPE,  /* target: gradient 0 of the wrong dtype */
    STEP_VECTOR_LOSS, /* target: a loss with two elements */
    STEP_INT_LOSS,    /* target: an integer scalar loss */
    STEP_WAIT_ALL,    /* every replica waits until `expect` have entered */
    STEP_SLEEP,       /* every replica sleeps 50 ms first */
    STEP_NESTED,      /* target: calls back into the strategy, which must refuse */
    STEP_GRAD_ONLY_0, /* gradient 1 only from replica 0 (NULL elsewhere) */
};

typedef struct step_ctx {
    model m;
    int mode;
    int target; /* the replica the mode applies to */
    int expect; /* STEP_WAIT_ALL: how many replicas to wait for */
    nb_mirrored *s;
    nb_optimizer *opt;
    struct step_ctx *inner; /* STEP_NESTED: the context of the call that must be refused */
    atomic_int calls[MAXR];
    atomic_int started, entered, finished;
    int64_t rows[MAXR], global_rows[MAXR];
    int count[MAXR];
    bool placed[MAXR]; /* its device pushed and its inputs there, with its rows */
    bool waited[MAXR]; /* STEP_WAIT_ALL: the others came in time */
    nb_status nested[MAXR][3];
    bool nested_named[MAXR];
    pthread_t thread[MAXR];
} step_ctx;

static void ctx_init(step_ctx *c, model m, int mode, int target)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->mode = mode;
    c->target = target;
    for (int i = 0; i < MAXR; i++)
        atomic_init(&c->calls[i], 0);
    atomic_init(&c->started, 0);
    atomic_init(&c->entered, 0);
    atomic_init(&c->finished, 0);
}

static nb_status ctx_step(nb_replica *r, int n_in, nb_tensor *const *in, int nv,
                          nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads, void *user)
{
    step_ctx *c = user;
    atomic_fetch_add(&c->started, 1);
    int i = nb_replica_index(r);
    if (i < 0 || i >= MAXR)
        return NB_ERR_INTERNAL;
    atomic_fetch_add(&c->calls[i], 1);
    c->thread[i] = pthread_self();
    c->rows[i] = nb_replica_rows(r);
    c->global_rows[i] = nb_replica_global_rows(r);
    c->count[i] = nb_replica_count(r);
    const char *dev = nb_replica_device(r);
    bool placed = dev && strcmp(nb_device_current(), dev) == 0;
    for (int k = 0; k < n_in; k++)
        placed = placed && on_device(in[k], dev) && nb_tensor_dim(in[k], 0) == c->rows[i];
    c->placed[i] = placed;
    bool target = c->target < 0 || c->target == i;

    if (c->mode == STEP_WAIT_ALL)
        c->waited[i] = rendezvous(&c->entered, c->expect, 2.0);
    if (c->mode == STEP_SLEEP)
        sleep_ms(50);
    if (target && c->mode == STEP_NESTED) {
        c->nested[i][0] = nb_mirrored_step(c->s, c->opt, nv, vars, ctx_step, c->inner, n_in, in,
                                           NB_REDUCE_MEAN, NULL);
        c->nested_named[i] = strstr(nb_error_message(), "nb_mirrored_step") != NULL;
        nb_error_clear();
        nb_mirrored_free(c->s);
        c->nested[i][1] = nb_error_clear();
        c->nested[i][2] = nb_variable_assign(vars[0], nb_zeros_like(nb_read(vars[0])));
        nb_error_clear();
    }
    if (target && c->mode == STEP_FAIL_OP) {
        nb_tensor *bad = nb_add(nb_ones(NB_F64, NB_SHAPE(2)), nb_ones(NB_F64, NB_SHAPE(3)));
        return bad ? NB_ERR_INTERNAL : nb_error();
    }

    nb_tape *tape = nb_tape_begin();
    *loss = model_loss(&c->m, nv, vars, in);
    if (!*loss)
        return nb_error();
    nb_status st = nb_tape_gradient_vars(tape, *loss, nv, vars, grads);
    if (st != NB_OK)
        return st;
    if (target) {
        nb_dtype dt0 = nb_variable_dtype(vars[0]);
        switch (c->mode) {
        case STEP_GRAD_SHAPE:
            grads[0] = nb_zeros(dt0, NB_SHAPE(2, 2));
            break;
        case STEP_GRAD_DTYPE:
            grads[0] = nb_zeros(dt0 == NB_F64 ? NB_F32 : NB_F64, nb_variable_shape(vars[0]));
            break;
        case STEP_VECTOR_LOSS:
            *loss = nb_full(NB_F64, NB_SHAPE(2), 1.0);
            break;
        case STEP_INT_LOSS:
            *loss = nb_scalar(NB_I32, 1);
            break;
        case STEP_GRAD_ONLY_0:
            if (i != 0)
                grads[1] = NULL;
            break;
        default:
            break;
        }
    }
    atomic_fetch_add(&c->finished, 1);
    return NB_OK;
}

/* Checks what the replicas of a step over n replicas and a batch of rows saw:
 * every replica with rows called once, the others not at all, shares that add
 * up and differ by at most one row, and each run on its device. */
static void check_shares(step_ctx *c, int n, int64_t rows, const char *what)
{
    int64_t total = 0, lo = INT64_MAX, hi = 0;
    int called = 0;
    for (int r = 0; r < n; r++) {
        int k = atomic_load(&c->calls[r]);
        CHECKF(k <= 1, "%s: replica %d called %d times", what, r, k);
        int64_t share = k ? c->rows[r] : 0;
        if (k) {
            called++;
            CHECKF(c->rows[r] > 0, "%s: replica %d called with %lld rows", what, r, (long long)c->rows[r]);
            CHECKF(c->global_rows[r] == rows, "%s: replica %d global rows %lld", what, r,
                   (long long)c->global_rows[r]);
            CHECKF(c->count[r] == n, "%s: replica %d count %d", what, r, c->count[r]);
            CHECKF(c->placed[r], "%s: replica %d not on its device or wrong share shape", what, r);
        }
        total += share;
        lo = share < lo ? share : lo;
        hi = share > hi ? share : hi;
    }
    for (int r = n; r < MAXR; r++)
        CHECKF(atomic_load(&c->calls[r]) == 0, "%s: replica index %d out of range", what, r);
    CHECKF(total == rows, "%s: shares add up to %lld", what, (long long)total);
    CHECKF(hi - lo <= 1, "%s: shares from %lld to %lld rows", what, (long long)lo, (long long)hi);
    int want = rows < n ? (int)rows : n;
    CHECKF(called == want, "%s: %d replicas called, expected %d", what, called, want);
}

/* ---- a mirrored model beside the same model on one device ---------------------- */

enum { OPT_SGD, OPT_ADAM };

static nb_optimizer *make_opt(int kind, double lr)
{
    return kind == OPT_ADAM ? nb_adam_new(lr, 0.9, 0.999, 1e-8) : nb_sgd_new(lr);
}

typedef struct twin {
    int nv;
    nb_tensor *init[MAXV];
    nb_variable *mv[MAXV]; /* mirrored */
    nb_variable *pv[MAXV]; /* plain, on /cpu:0 */
    nb_optimizer *mopt, *popt;
} twin;

static void twin_new(twin *t, nb_mirrored *s, int nv, nb_tensor *const *init, nb_optimizer *mopt,
                     nb_optimizer *popt)
{
    memset(t, 0, sizeof *t);
    t->nv = nv;
    t->mopt = mopt;
    t->popt = popt;
    for (int i = 0; i < nv; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%d", i);
        t->init[i] = init[i];
        t->mv[i] = nb_mirrored_variable_new(s, name, init[i]);
        t->pv[i] = nb_variable_new(name, init[i]);
        CHECK(t->mv[i] && t->pv[i]);
    }
}

static void twin_free(twin *t)
{
    for (int i = 0; i < t->nv; i++) {
        nb_variable_free(t->mv[i]);
        nb_variable_free(t->pv[i]);
    }
    nb_optimizer_free(t->mopt);
    nb_optimizer_free(t->popt);
}

/* One plain step on one device over the whole batch; returns its loss. */
static double twin_ref_step(twin *t, const model *m, nb_tensor *const *in)
{
    nb_scope *sc = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tensor *loss = model_loss(m, t->nv, t->pv, in);
    nb_tensor *g[MAXV] = {0};
    CHECK_OK(nb_tape_gradient_vars(tape, loss, t->nv, t->pv, g));
    CHECK_OK(nb_optimizer_apply(t->popt, t->nv, t->pv, g));
    double v = loss ? nb_tensor_item(loss) : NAN;
    nb_scope_end(sc);
    return v;
}

/* Every copy of every mirrored variable against the plain one (relative error
 * at most tol), on its replica's device, bit-equal to replica 0's, which is what
 * nb_read gives outside a replica. With changed, also that each moved. */
static void twin_check(const twin *t, int n, const char *const *devs, double tol, bool changed,
                       const char *what)
{
    nb_scope *sc = nb_scope_begin();
    for (int i = 0; i < t->nv; i++) {
        nb_tensor *ref = nb_read(t->pv[i]);
        nb_tensor *c0 = nb_mirrored_variable_read(t->mv[i], 0);
        CHECKF(nb_variable_replicas(t->mv[i]) == n, "%s: v%d has %d copies", what, i,
               nb_variable_replicas(t->mv[i]));
        if (changed)
            CHECKF(rel_diff(c0, t->init[i]) > 1e-9, "%s: v%d was not updated", what, i);
        for (int r = 0; r < n; r++) {
            nb_tensor *c = nb_mirrored_variable_read(t->mv[i], r);
            double e = rel_diff(c, ref);
            CHECKF(e <= tol, "%s: v%d on replica %d differs from one device by %.3g (tol %.1g)", what,
                   i, r, e, tol);
            CHECKF(on_device(c, devs[r]), "%s: v%d replica %d copy on %s, expected %s", what, i, r,
                   c ? nb_tensor_device(c) : "(null)", devs[r]);
            CHECKF(same_bits(c, c0), "%s: v%d replica %d is not bit-equal to replica 0", what, i, r);
        }
        CHECKF(same_bits(nb_read(t->mv[i]), c0), "%s: nb_read of v%d is not replica 0's copy", what, i);
    }
    nb_scope_end(sc);
}

static void strategy_devices(const nb_mirrored *s, const char **devs)
{
    for (int r = 0; r < nb_mirrored_replicas(s); r++)
        devs[r] = nb_mirrored_device(s, r);
}

/* Snapshots of every copy of every variable (in the current scope). */
static void snapshot(const twin *t, int n, nb_tensor **snap)
{
    for (int i = 0; i < t->nv; i++)
        for (int r = 0; r < n; r++)
            snap[i * n + r] = nb_mirrored_variable_read(t->mv[i], r);
}

static bool unchanged(const twin *t, int n, nb_tensor *const *snap)
{
    bool same = true;
    for (int i = 0; i < t->nv; i++)
        for (int r = 0; r < n; r++)
            same = same && same_bits(snap[i * n + r], nb_mirrored_variable_read(t->mv[i], r));
    return same;
}

/* The set-up most cases share: the MLP_MSE model's initial values in dtype dt
 * (from seed) and `rows` rows of its data (from seed + 1), a strategy over n
 * logical CPU devices and their names, and the model's twin, updated on both
 * sides by optimizer kind opt at rate lr. */
typedef struct mlp_case {
    model m;
    nb_tensor *init[4], *in[2];
    nb_mirrored *s;
    const char *devs[MAXR];
    twin t;
} mlp_case;

static void mlp_case_new(mlp_case *mc, nb_dtype dt, uint64_t seed, int64_t rows, int n, int opt, double lr)
{
    mc->m = (model){MLP_MSE, false};
    model_init(&mc->m, dt, seed, mc->init);
    model_data(&mc->m, dt, rows, seed + 1, mc->in);
    mc->s = cpu_mirrored(n);
    strategy_devices(mc->s, mc->devs);
    twin_new(&mc->t, mc->s, 4, mc->init, make_opt(opt, lr), make_opt(opt, lr));
}

static void mlp_case_free(mlp_case *mc)
{
    twin_free(&mc->t);
    nb_mirrored_free(mc->s);
}

/* One mirrored step of the case (MEAN), the replicas running ctx_step with c. */
static nb_status mlp_case_step(mlp_case *mc, step_ctx *c, nb_tensor **loss)
{
    return nb_mirrored_step(mc->s, mc->t.mopt, 4, mc->t.mv, ctx_step, c, 2, mc->in, NB_REDUCE_MEAN, loss);
}

/* A plain step on the n replicas still equals one on one device: the strategy
 * is usable after what came before it (what: for the message). */
static void mlp_case_still_steps(mlp_case *mc, int n, const char *what)
{
    step_ctx c;
    ctx_init(&c, mc->m, STEP_PLAIN, -1);
    CHECK_OK(mlp_case_step(mc, &c, NULL));
    twin_ref_step(&mc->t, &mc->m, mc->in);
    twin_check(&mc->t, n, mc->devs, 1e-12, true, what);
}

/* ---- 1. one mirrored step equals one step on one device ------------------------ */

static void equivalence_case(int n, int64_t rows, nb_dtype dt, int kind, int opt)
{
    nb_scope *sc = nb_scope_begin();
    char what[128];
    snprintf(what, sizeof what, "%s %s n=%d rows=%lld %s", kind == MLP_MSE ? "mlp" : "linear-ce",
             nb_dtype_name(dt), n, (long long)rows, opt == OPT_ADAM ? "adam" : "sgd");
    double tol = dt == NB_F64 ? 1e-12 : 1e-5, lr = opt == OPT_ADAM ? 0.01 : 0.1;
    model m = {kind, false};
    nb_tensor *init[4], *in[2];
    int nv = model_init(&m, dt, 10 + (uint64_t)n, init);
    model_data(&m, dt, rows, 100 + (uint64_t)rows, in);
    nb_mirrored *s = cpu_mirrored(n);
    CHECKF(s && nb_mirrored_replicas(s) == n, "%s: nb_mirrored_new", what);
    if (!s) {
        nb_scope_end(sc);
        nb_error_clear();
        return;
    }
    const char *devs[MAXR];
    strategy_devices(s, devs);
    for (int r = 0; r < n; r++) {
        char want[16];
        snprintf(want, sizeof want, "/cpu:%d", r);
        CHECKF(devs[r] && strcmp(devs[r], want) == 0, "%s: replica %d on %s", what, r, devs[r]);
    }
    twin t;
    twin_new(&t, s, nv, init, make_opt(opt, lr), make_opt(opt, lr));
    step_ctx c;
    ctx_init(&c, m, STEP_PLAIN, -1);
    nb_tensor *loss = NULL;
    CHECK_OK(nb_mirrored_step(s, t.mopt, nv, t.mv, ctx_step, &c, 2, in, NB_REDUCE_MEAN, &loss));
    double ref = twin_ref_step(&t, &m, in);
    CHECKF(loss && nb_tensor_dtype(loss) == NB_F64 && nb_tensor_ndim(loss) == 0 &&
               on_device(loss, nb_device_current()),
           "%s: the loss is not an f64 scalar on the current device", what);
    double got = loss ? nb_tensor_item(loss) : NAN;
    CHECKF(rel_close(got, ref, tol), "%s: loss %.17g, one device %.17g", what, got, ref);
    check_shares(&c, n, rows, what);
    twin_check(&t, n, devs, tol, true, what);
    nb_mirrored_stats st = stats_of(s);
    CHECKF(st.steps == 1 && st.last_buckets == 1 && st.collective_calls >= 1,
           "%s: stats steps %lld, last_buckets %d, collective_calls %lld", what, (long long)st.steps,
           st.last_buckets, (long long)st.collective_calls);
    twin_free(&t);
    nb_mirrored_free(s);
    nb_scope_end(sc);
}

/* The cases of equivalence_case: replicas, rows, dtype, model, optimizer. */
static const struct {
    int n;
    int64_t rows;
    nb_dtype dt;
    int kind, opt;
} equivalences[] = {
    {1, 7, NB_F64, MLP_MSE, OPT_SGD},    {2, 8, NB_F64, MLP_MSE, OPT_SGD},
    {2, 7, NB_F64, MLP_MSE, OPT_SGD},    {3, 7, NB_F64, MLP_MSE, OPT_SGD},
    {4, 7, NB_F64, MLP_MSE, OPT_SGD},    {4, 3, NB_F64, MLP_MSE, OPT_SGD}, /* replica 3 gets no rows */
    {4, 1, NB_F64, MLP_MSE, OPT_SGD}, /* only one replica has rows */
    {3, 10, NB_F64, LINEAR_CE, OPT_SGD}, {4, 6, NB_F64, LINEAR_CE, OPT_SGD},
    {2, 7, NB_F32, MLP_MSE, OPT_SGD},    {4, 7, NB_F32, MLP_MSE, OPT_SGD},
    {4, 3, NB_F32, LINEAR_CE, OPT_SGD},  {4, 7, NB_F64, MLP_MSE, OPT_ADAM},
    {3, 5, NB_F64, LINEAR_CE, OPT_ADAM}, {3, 10, NB_F32, MLP_MSE, OPT_ADAM},
};

/* The cases in f64 with SGD (f64_sgd), or the others, in table order. */
static void equivalence_cases(bool f64_sgd)
{
    for (size_t k = 0; k < sizeof equivalences / sizeof *equivalences; k++)
        if ((equivalences[k].dt == NB_F64 && equivalences[k].opt == OPT_SGD) == f64_sgd)
            equivalence_case(equivalences[k].n, equivalences[k].rows, equivalences[k].dt, equivalences[k].kind,
                             equivalences[k].opt);
}

/* One step with MEAN on N replicas is one step on one device over the whole
 * batch, for even, uneven and empty shares, in f64 to 1e-12. */
static void test_equivalence_f64_sgd(void) { equivalence_cases(true); }

/* The same in f32 (to 1e-5) and with Adam. */
static void test_equivalence_f32_and_adam(void) { equivalence_cases(false); }

/* ---- 2. SUM and MEAN ------------------------------------------------------------ */

/* Runs one mirrored step (reduction red, per-replica loss m, mirrored rate lr)
 * beside one plain step of loss mref at rate lr_ref, and compares them; returns
 * the mirrored loss and keeps replica 0's copies in out (current scope). */
static double sum_mean_case(const char *what, int n, int64_t rows, nb_reduction red, model m, double lr,
                            model mref, double lr_ref, double *ref_loss, nb_tensor **out)
{
    nb_tensor *init[4], *in[2];
    int nv = model_init(&m, NB_F64, 7, init);
    model_data(&m, NB_F64, rows, 77, in);
    nb_mirrored *s = cpu_mirrored(n);
    const char *devs[MAXR];
    strategy_devices(s, devs);
    twin t;
    twin_new(&t, s, nv, init, nb_sgd_new(lr), nb_sgd_new(lr_ref));
    step_ctx c;
    ctx_init(&c, m, STEP_PLAIN, -1);
    nb_tensor *loss = NULL;
    CHECK_OK(nb_mirrored_step(s, t.mopt, nv, t.mv, ctx_step, &c, 2, in, red, &loss));
    *ref_loss = twin_ref_step(&t, &mref, in);
    twin_check(&t, n, devs, 1e-12, true, what);
    for (int i = 0; i < nv; i++)
        out[i] = nb_mirrored_variable_read(t.mv[i], 0);
    double got = loss ? nb_tensor_item(loss) : NAN;
    twin_free(&t);
    nb_mirrored_free(s);
    return got;
}

/* SUM of per-replica summed losses is the step on the summed loss; SUM of
 * per-replica means is N times the mean step; MEAN of per-replica sums (equal
 * shares) is the sum step divided by N; and the SUM step moves the variables N
 * times as far as the MEAN step. */
static void test_sum_and_mean(void)
{
    model mean_loss = {MLP_MSE, false}, sum_loss = {MLP_MSE, true};
    nb_tensor *a[4], *b[4], *cc[4], *d[4];
    double ref, got;

    got = sum_mean_case("SUM of sums, 7 rows on 3", 3, 7, NB_REDUCE_SUM, sum_loss, 0.02, sum_loss, 0.02, &ref, a);
    CHECKF(rel_close(got, ref, 1e-12), "SUM of sums: loss %.17g, one device %.17g", got, ref);

    got = sum_mean_case("SUM of means, 8 rows on 4", 4, 8, NB_REDUCE_SUM, mean_loss, 0.05, mean_loss, 0.2, &ref, b);
    CHECKF(rel_close(got, 4 * ref, 1e-12), "SUM of means: loss %.17g, 4 x one device %.17g", got, 4 * ref);

    got = sum_mean_case("MEAN of sums, 8 rows on 4", 4, 8, NB_REDUCE_MEAN, sum_loss, 0.08, sum_loss, 0.02, &ref, cc);
    CHECKF(rel_close(got, ref / 4, 1e-12), "MEAN of sums: loss %.17g, one device / 4 %.17g", got, ref / 4);

    /* MEAN of means at the same rate as the SUM of means above. */
    got = sum_mean_case("MEAN of means, 8 rows on 4", 4, 8, NB_REDUCE_MEAN, mean_loss, 0.05, mean_loss, 0.05, &ref, d);
    CHECKF(rel_close(got, ref, 1e-12), "MEAN of means: loss %.17g, one device %.17g", got, ref);

    nb_tensor *init[4];
    model_init(&mean_loss, NB_F64, 7, init);
    for (int i = 0; i < 4; i++) {
        nb_tensor *step_sum = nb_sub(b[i], init[i]), *step_mean = nb_sub(d[i], init[i]);
        double e = rel_diff(step_sum, nb_mul_scalar(step_mean, 4));
        CHECKF(e <= 1e-10, "v%d: the SUM step is not 4 x the MEAN step (rel diff %.3g)", i, e);
        CHECKF(rel_diff(step_sum, step_mean) > 0.5, "v%d: SUM and MEAN steps do not differ", i);
    }
}

/* A variable no replica gives a gradient stays as it is, bit for bit, on every
 * replica; a gradient only one replica gives (NULL elsewhere) counts as zeros
 * from the others. */
static void test_missing_gradients(void)
{
    model m = {MLP_MSE, false};
    nb_tensor *init[5], *in[2];
    model_init(&m, NB_F64, 21, init);
    init[4] = nb_random_normal(NB_F64, NB_SHAPE(3, 2), 0, 1, 25);
    model_data(&m, NB_F64, 7, 26, in);
    nb_mirrored *s = cpu_mirrored(4);
    const char *devs[MAXR];
    strategy_devices(s, devs);

    /* Five variables, the loss uses four; the reference steps only those four. */
    twin t;
    twin_new(&t, s, 5, init, nb_adam_new(0.01, 0.9, 0.999, 1e-8), nb_adam_new(0.01, 0.9, 0.999, 1e-8));
    step_ctx c;
    ctx_init(&c, m, STEP_PLAIN, -1);
    for (int k = 0; k < 2; k++) {
        nb_scope *sc = nb_scope_begin();
        CHECK_OK(nb_mirrored_step(s, t.mopt, 5, t.mv, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL));
        t.nv = 4;
        twin_ref_step(&t, &m, in);
        t.nv = 5;
        nb_scope_end(sc);
    }
    t.nv = 4;
    twin_check(&t, 4, devs, 1e-12, true, "four of five variables");
    t.nv = 5;
    for (int r = 0; r < 4; r++)
        CHECKF(same_bits(nb_mirrored_variable_read(t.mv[4], r), init[4]),
               "the unused variable changed on replica %d", r);
    twin_free(&t);

    /* SUM of summed losses; b1's gradient comes from replica 0 alone. */
    model ms = {MLP_MSE, true};
    twin_new(&t, s, 4, init, nb_sgd_new(0.03), nb_sgd_new(0.03));
    ctx_init(&c, ms, STEP_GRAD_ONLY_0, -1);
    CHECK_OK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, in, NB_REDUCE_SUM, NULL));
    CHECK(atomic_load(&c.calls[0]) == 1);
    int64_t rows0 = c.rows[0];
    /* Replica 0's share is the first rows0 rows. */
    nb_tensor *head[2] = {nb_slice(in[0], NB_SHAPE(0, 0), NB_SHAPE(rows0, -1)),
                          nb_slice(in[1], NB_SHAPE(0, 0), NB_SHAPE(rows0, -1))};
    nb_tape *tape_all = nb_tape_begin();
    nb_tensor *g_all[4], *g_head[4];
    CHECK_OK(nb_tape_gradient_vars(tape_all, model_loss(&ms, 4, t.pv, in), 4, t.pv, g_all));
    nb_tape *tape_head = nb_tape_begin();
    CHECK_OK(nb_tape_gradient_vars(tape_head, model_loss(&ms, 4, t.pv, head), 4, t.pv, g_head));
    g_all[1] = g_head[1];
    CHECK_OK(nb_optimizer_apply(t.popt, 4, t.pv, g_all));
    twin_check(&t, 4, devs, 1e-12, true, "a gradient from replica 0 only");
    twin_free(&t);
    nb_mirrored_free(s);
}

/* ---- 3. copies stay equal; runs repeat -------------------------------------------- */

/* Trains the MLP for steps Adam steps on 3 replicas with 10 rows (4 + 3 + 3);
 * checks every copy bit-equal to replica 0's and keeps replica 0's copies in out.
 * With ref, also steps a plain model beside it and compares at tol. */
static void train_mirrored(nb_dtype dt, int steps, nb_tensor **out, bool ref, double tol)
{
    mlp_case mc;
    mlp_case_new(&mc, dt, 31, 10, 3, OPT_ADAM, 0.01);
    step_ctx c;
    ctx_init(&c, mc.m, STEP_PLAIN, -1);
    double first = NAN, last = NAN;
    for (int k = 0; k < steps; k++) {
        nb_scope *sc = nb_scope_begin();
        nb_tensor *loss = NULL;
        CHECK_OK(mlp_case_step(&mc, &c, &loss));
        last = loss ? nb_tensor_item(loss) : NAN;
        if (k == 0)
            first = last;
        if (ref)
            twin_ref_step(&mc.t, &mc.m, mc.in);
        nb_scope_end(sc);
    }
    CHECKF(last < first, "%s: training did not lower the loss (%g -> %g)", nb_dtype_name(dt), first, last);
    for (int i = 0; i < 4; i++) {
        out[i] = nb_mirrored_variable_read(mc.t.mv[i], 0);
        for (int r = 1; r < 3; r++)
            CHECKF(same_bits(nb_mirrored_variable_read(mc.t.mv[i], r), out[i]),
                   "%s: after %d steps v%d on replica %d differs from replica 0", nb_dtype_name(dt),
                   steps, i, r);
    }
    if (ref)
        twin_check(&mc.t, 3, mc.devs, tol, true, "50 Adam steps");
    nb_mirrored_stats st = stats_of(mc.s);
    CHECKF(st.steps == steps, "stats.steps %lld after %d steps", (long long)st.steps, steps);
    CHECKF(nb_optimizer_iterations(mc.t.mopt) == steps, "optimizer iterations %lld after %d steps",
           (long long)nb_optimizer_iterations(mc.t.mopt), steps);
    mlp_case_free(&mc);
}

/* After 50 Adam steps with an uneven batch every copy is bit-equal to the
 * others, and two fresh runs from the same seeds give the same bits. */
static void test_copies_equal_and_deterministic(void)
{
    nb_tensor *a[4], *b[4];
    train_mirrored(NB_F32, 50, a, false, 0);
    train_mirrored(NB_F32, 50, b, false, 0);
    for (int i = 0; i < 4; i++)
        CHECKF(same_bits(a[i], b[i]), "f32: two runs differ in v%d", i);
    train_mirrored(NB_F64, 50, a, true, 1e-8);
    train_mirrored(NB_F64, 50, b, false, 0);
    for (int i = 0; i < 4; i++)
        CHECKF(same_bits(a[i], b[i]), "f64: two runs differ in v%d", i);
}

/* ---- 4. buckets ------------------------------------------------------------------- */

/* One step of the BAG model with variables of the given shapes (ndim 0 or 1)
 * and dtypes on 4 replicas, 7 rows, at the given bucket size; checks it against
 * one device and returns the stats. */
static nb_mirrored_stats bag_case(const char *what, nb_mirrored *s, twin *t, nb_tensor *const *in,
                                  size_t bucket_bytes, nb_dtype dt)
{
    nb_scope *sc = nb_scope_begin();
    model m = {BAG, false};
    const char *devs[MAXR];
    strategy_devices(s, devs);
    CHECK_OK(nb_mirrored_set_bucket_bytes(s, bucket_bytes));
    nb_mirrored_stats before = stats_of(s);
    step_ctx c;
    ctx_init(&c, m, STEP_PLAIN, -1);
    nb_tensor *loss = NULL;
    CHECK_OK(nb_mirrored_step(s, t->mopt, t->nv, t->mv, ctx_step, &c, 3, in, NB_REDUCE_MEAN, &loss));
    double ref = twin_ref_step(t, &m, in);
    CHECKF(loss && rel_close(nb_tensor_item(loss), ref, dt == NB_F64 ? 1e-12 : 1e-5),
           "%s: loss %.17g, one device %.17g", what, loss ? nb_tensor_item(loss) : NAN, ref);
    nb_mirrored_stats st = stats_of(s);
    CHECKF(st.bucket_bytes == bucket_bytes, "%s: bucket_bytes %zu", what, st.bucket_bytes);
    CHECKF(st.steps == before.steps + 1, "%s: steps %lld", what, (long long)st.steps);
    int64_t calls = st.collective_calls - before.collective_calls;
    CHECKF(calls == st.last_buckets || calls == (int64_t)st.last_buckets * nb_mirrored_replicas(s),
           "%s: %lld collective calls for %d buckets", what, (long long)calls, st.last_buckets);
    nb_scope_end(sc);
    return st;
}

/* Many tiny variables with small buckets (several buckets, each variable in
 * one), one variable larger than a bucket (a bucket of its own) and an f32
 * variable beside f64 ones (a bucket per dtype) all reduce as on one device;
 * the default bucket size is 25 MiB. */
static void test_buckets(void)
{
    nb_mirrored *s = cpu_mirrored(4);
    const char *devs[MAXR];
    strategy_devices(s, devs);
    nb_mirrored_stats st = stats_of(s);
    CHECK(st.bucket_bytes == 26214400);
    CHECK(st.steps == 0 && st.collective_calls == 0);
    CHECKF(st.algorithm && strcmp(st.algorithm, "copies") == 0, "algorithm %s on CPU devices",
           st.algorithm ? st.algorithm : "(null)");

    /* 20 f64 variables, 10 vectors of 4 (32 bytes) and 10 scalars (8 bytes). */
    nb_tensor *init[MAXV], *in[3];
    for (int i = 0; i < 20; i++)
        init[i] = i % 2 ? nb_random_normal(NB_F64, NB_SCALAR, 0, 0.5, 40 + (uint64_t)i)
                        : nb_random_normal(NB_F64, NB_SHAPE(4), 0, 0.5, 40 + (uint64_t)i);
    bag_data(7, 4, 70, in);
    twin t;
    twin_new(&t, s, 20, init, nb_sgd_new(0.1), nb_sgd_new(0.1));
    st = bag_case("20 variables, 64-byte buckets", s, &t, in, 64, NB_F64);
    /* 400 bytes: at least 7 buckets of 64, at most one per variable. */
    CHECKF(st.last_buckets >= 7 && st.last_buckets <= 20, "64-byte buckets: %d buckets", st.last_buckets);
    twin_check(&t, 4, devs, 1e-12, true, "20 variables, 64-byte buckets");
    st = bag_case("20 variables, 8-byte buckets", s, &t, in, 8, NB_F64);
    CHECKF(st.last_buckets == 20, "8-byte buckets: %d buckets, expected 20", st.last_buckets);
    twin_check(&t, 4, devs, 1e-12, true, "20 variables, 8-byte buckets");
    st = bag_case("20 variables, 25 MiB buckets", s, &t, in, 26214400, NB_F64);
    CHECKF(st.last_buckets == 1, "25 MiB buckets: %d buckets, expected 1", st.last_buckets);
    twin_check(&t, 4, devs, 1e-12, true, "20 variables, 25 MiB buckets");
    twin_free(&t);

    /* Two scalars and one vector of 40 (320 bytes) with 64-byte buckets. */
    init[0] = nb_random_normal(NB_F64, NB_SCALAR, 0, 0.5, 81);
    init[1] = nb_random_normal(NB_F64, NB_SCALAR, 0, 0.5, 82);
    init[2] = nb_random_normal(NB_F64, NB_SHAPE(40), 0, 0.5, 83);
    bag_data(7, 40, 84, in);
    twin_new(&t, s, 3, init, nb_sgd_new(0.1), nb_sgd_new(0.1));
    st = bag_case("a variable larger than a bucket", s, &t, in, 64, NB_F64);
    CHECKF(st.last_buckets == 2, "a 320-byte variable and two scalars in 64-byte buckets: %d buckets",
           st.last_buckets);
    twin_check(&t, 4, devs, 1e-12, true, "a variable larger than a bucket");
    twin_free(&t);

    /* f64 and f32 variables in one step. */
    init[0] = nb_random_normal(NB_F64, NB_SHAPE(4), 0, 0.5, 91);
    init[1] = nb_random_normal(NB_F32, NB_SHAPE(4), 0, 0.5, 92);
    init[2] = nb_random_normal(NB_F32, NB_SCALAR, 0, 0.5, 93);
    init[3] = nb_random_normal(NB_F64, NB_SCALAR, 0, 0.5, 94);
    bag_data(7, 4, 95, in);
    twin_new(&t, s, 4, init, nb_sgd_new(0.1), nb_sgd_new(0.1));
    st = bag_case("f32 and f64, one bucket each", s, &t, in, 26214400, NB_F32);
    CHECKF(st.last_buckets == 2, "f32 and f64 variables: %d buckets, expected 2", st.last_buckets);
    twin_check(&t, 4, devs, 1e-5, true, "f32 and f64 variables");
    /* The f64 ones to f64 precision (the f32 terms enter their loss, so only
     * to f32 precision there). */
    st = bag_case("f32 and f64, 8-byte buckets", s, &t, in, 8, NB_F32);
    CHECKF(st.last_buckets == 4, "f32 and f64 variables, 8-byte buckets: %d buckets, expected 4",
           st.last_buckets);
    twin_check(&t, 4, devs, 1e-5, true, "f32 and f64 variables, 8-byte buckets");
    twin_free(&t);
    nb_mirrored_free(s);
}

/* ---- 5. replicas that fail ------------------------------------------------------- */

static atomic_int handler_calls;
static pthread_t handler_threads[16];
static nb_status handler_codes[16];

static void record_handler(nb_status code, const char *message, void *user)
{
    (void)message, (void)user;
    int k = atomic_fetch_add(&handler_calls, 1);
    if (k < 16) {
        handler_threads[k] = pthread_self();
        handler_codes[k] = code;
    }
}

/* A step a replica fails (an op error on replica 1, a gradient of the wrong
 * shape or dtype, a loss that is no floating scalar) returns the error, names
 * the replica and its device, runs the error handler on that replica's thread
 * and changes nothing anywhere, optimizer state included: the next step equals
 * one Adam step on one device. */
static void test_failing_replica(void)
{
    mlp_case mc;
    mlp_case_new(&mc, NB_F64, 51, 7, 4, OPT_ADAM, 0.01);
    nb_tensor *snap[4 * NDEV];
    snapshot(&mc.t, 4, snap);
    step_ctx c;

    atomic_store(&handler_calls, 0);
    nb_set_error_handler(record_handler, NULL);
    ctx_init(&c, mc.m, STEP_FAIL_OP, 1);
    nb_status st = mlp_case_step(&mc, &c, NULL);
    nb_set_error_handler(NULL, NULL);
    CHECK(st == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "replica 1", "/cpu:1", "[2]", "[3]");
    bool on_replica_thread = false;
    int calls = atomic_load(&handler_calls);
    for (int k = 0; k < calls && k < 16; k++)
        if (handler_codes[k] == NB_ERR_SHAPE && atomic_load(&c.calls[1]) &&
            pthread_equal(handler_threads[k], c.thread[1]))
            on_replica_thread = true;
    CHECKF(on_replica_thread, "the error handler did not run on replica 1's thread (%d calls)", calls);
    CHECK(unchanged(&mc.t, 4, snap));

    /* Bad gradients and losses: the error names the replica and what is wrong. */
    static const struct {
        int mode, replica;
        nb_status code;
        const char *where, *what;
    } bad[] = {
        {STEP_GRAD_SHAPE, 0, NB_ERR_SHAPE, "replica 0", "/cpu:0"},
        {STEP_GRAD_DTYPE, 2, NB_ERR_DTYPE, "replica 2", "/cpu:2"},
        {STEP_VECTOR_LOSS, 3, NB_ERR_SHAPE, "replica 3", "floating scalar"},
        {STEP_INT_LOSS, 0, NB_ERR_DTYPE, "replica 0", "i32"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        ctx_init(&c, mc.m, bad[k].mode, bad[k].replica);
        CHECKF(mlp_case_step(&mc, &c, NULL) == bad[k].code, "case %zu", k);
        CHECK_ERROR(bad[k].code, bad[k].where, bad[k].what);
        CHECK(unchanged(&mc.t, 4, snap));
    }
    CHECK(stats_of(mc.s).steps == 0);

    /* The strategy is still usable, and the failures left no trace. */
    mlp_case_still_steps(&mc, 4, "a step after failed ones");
    CHECK(stats_of(mc.s).steps == 1);
    mlp_case_free(&mc);
}

/* ---- 6. bad arguments --------------------------------------------------------------- */

static nb_status noop_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                          void *user)
{
    (void)r, (void)n_in, (void)in, (void)user;
    for (int k = 0; k < n_out; k++)
        out[k] = nb_scalar(NB_F64, 1);
    return NB_OK;
}

/* Every argument error of the strategy's functions: code and message, and
 * nothing changed by a refused step. */
static void test_bad_arguments(void)
{
    /* nb_mirrored_new */
    CHECK(nb_mirrored_new(2, (const char *[]){"/cpu:1", "/cpu:1"}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_new", "/cpu:1");
    CHECK(nb_mirrored_new(2, (const char *[]){"/cpu:1", "cpu:1"}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_new", "cpu:1");
    CHECK(nb_mirrored_new(2, (const char *[]){"/cpu:0", "/cpu:9"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_mirrored_new", "/cpu:9");
    /* A GPU that is not there: no soft placement onto the CPU. */
    CHECK(nb_mirrored_new(1, (const char *[]){"/gpu:99"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_mirrored_new", "/gpu:99");
    CHECK(nb_mirrored_new(2, (const char *[]){"/cpu:0", "banana"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_mirrored_new", "banana");
    CHECK(nb_mirrored_new(1, (const char *[]){"/cpu:x"}) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_mirrored_new", "/cpu:x");
    CHECK(nb_mirrored_new(1, (const char *[]){NULL}) == NULL);
    CHECK(nb_error() != NB_OK);
    nb_error_clear();
    CHECK(nb_mirrored_new(-1, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_new");
    CHECK(nb_mirrored_new(65, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_new");
    CHECK(nb_mirrored_new(0, (const char *[]){"/cpu:0"}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_new");
    /* Defaults: all four logical CPU devices, or the first n (where there is
     * no GPU: with one, the default is every GPU, which test_distribute_gpu checks). */
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        CHECK(nb_mirrored_new(5, NULL) == NULL); /* 4 default devices */
        CHECK_ERROR(NB_ERR_DEVICE, "nb_mirrored_new");
        nb_mirrored *all = nb_mirrored_new(0, NULL);
        CHECK(nb_mirrored_replicas(all) == NDEV);
        for (int r = 0; r < NDEV; r++)
            CHECK(nb_mirrored_device(all, r) &&
                  strcmp(nb_mirrored_device(all, r), nb_device_name(NB_DEVICE_CPU, r)) == 0);
        nb_mirrored_free(all);
    }
    nb_mirrored *s = cpu_mirrored(2);
    nb_mirrored *other = nb_mirrored_new(2, (const char *[]){"/cpu:3", "/cpu:2"});
    CHECK(s && other);
    CHECK(nb_mirrored_replicas(s) == 2 && nb_mirrored_replicas(NULL) == 0);
    CHECK(strcmp(nb_mirrored_device(other, 0), "/cpu:3") == 0 && strcmp(nb_mirrored_device(other, 1), "/cpu:2") == 0);
    CHECK(nb_mirrored_device(s, 2) == NULL && nb_mirrored_device(s, -1) == NULL && nb_mirrored_device(NULL, 0) == NULL);
    nb_error_clear();

    /* nb_mirrored_step */
    model m = {MLP_MSE, false};
    nb_tensor *init[4], *in[2], *snap[4 * 2];
    model_init(&m, NB_F64, 61, init);
    model_data(&m, NB_F64, 6, 62, in);
    twin t;
    twin_new(&t, s, 4, init, nb_sgd_new(0.1), nb_sgd_new(0.1));
    nb_variable *foreign = nb_mirrored_variable_new(other, "foreign", init[0]);
    snapshot(&t, 2, snap);
    step_ctx c;
    ctx_init(&c, m, STEP_PLAIN, -1);
    nb_variable *with_plain[4] = {t.mv[0], t.mv[1], t.pv[2], t.mv[3]};
    CHECK(nb_mirrored_step(s, t.mopt, 4, with_plain, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL) ==
          NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step", "v2");
    nb_variable *with_foreign[4] = {t.mv[0], t.mv[1], t.mv[2], foreign};
    CHECK(nb_mirrored_step(s, t.mopt, 4, with_foreign, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL) ==
          NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step", "foreign");
    nb_tensor *ragged[2] = {in[0], nb_slice(in[1], NB_SHAPE(0, 0), NB_SHAPE(5, -1))};
    CHECK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, ragged, NB_REDUCE_MEAN, NULL) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_mirrored_step", "[6, 5]", "[5, 3]", "first dims");
    nb_tensor *scalar_in[2] = {in[0], nb_scalar(NB_F64, 1)};
    CHECK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, scalar_in, NB_REDUCE_MEAN, NULL) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_mirrored_step", "scalar");
    CHECK(nb_mirrored_step(s, t.mopt, 4, t.mv, NULL, &c, 2, in, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    CHECK(nb_mirrored_step(NULL, t.mopt, 4, t.mv, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    CHECK(nb_mirrored_step(s, NULL, 4, t.mv, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    CHECK(nb_mirrored_step(s, t.mopt, 4, NULL, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    CHECK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, NULL, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    CHECK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 0, NULL, NB_REDUCE_MEAN, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_step");
    /* A batch of no rows has nothing to step on. */
    nb_tensor *empty[2] = {nb_slice(in[0], NB_SHAPE(0, 0), NB_SHAPE(0, -1)), nb_slice(in[1], NB_SHAPE(0, 0), NB_SHAPE(0, -1))};
    nb_status es = nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, empty, NB_REDUCE_MEAN, NULL);
    CHECKF(es != NB_OK && nb_error() == es, "a step on an empty batch: %s", nb_status_name(es));
    nb_error_clear();
    CHECK(atomic_load(&c.started) == 0); /* no replica ran */
    CHECK(unchanged(&t, 2, snap));
    CHECK(stats_of(s).steps == 0);

    /* nb_mirrored_variable_new / _read, nb_variable_replicas */
    CHECK(nb_mirrored_variable_new(NULL, "x", init[0]) == NULL);
    CHECK(nb_error() == NB_ERR_INVALID_ARGUMENT);
    nb_error_clear();
    CHECK(nb_mirrored_variable_new(s, "x", NULL) == NULL);
    CHECK(nb_error() == NB_ERR_INVALID_ARGUMENT);
    nb_error_clear();
    CHECK(nb_mirrored_variable_read(t.pv[0], 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_variable_read");
    CHECK(nb_mirrored_variable_read(t.mv[0], 2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_variable_read");
    CHECK(nb_mirrored_variable_read(t.mv[0], -1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_variable_read");
    CHECK(nb_mirrored_variable_read(NULL, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_variable_read");
    CHECK(nb_variable_replicas(t.mv[0]) == 2 && nb_variable_replicas(t.pv[0]) == 0 &&
          nb_variable_replicas(NULL) == 0 && nb_variable_replicas(foreign) == 2);

    /* buckets and stats */
    CHECK(nb_mirrored_set_bucket_bytes(s, 0) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_set_bucket_bytes");
    CHECK(nb_mirrored_set_bucket_bytes(NULL, 64) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_set_bucket_bytes");
    CHECK(stats_of(s).bucket_bytes == 26214400);
    nb_mirrored_stats st;
    CHECK(nb_mirrored_get_stats(NULL, &st) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_get_stats");
    CHECK(nb_mirrored_get_stats(s, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_get_stats");

    /* nb_mirrored_run */
    nb_tensor *outs[4] = {0};
    CHECK(nb_mirrored_run(s, NULL, NULL, 2, in, 2, outs) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_run");
    CHECK(nb_mirrored_run(NULL, noop_run, NULL, 2, in, 2, outs) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_run");
    nb_status rs = nb_mirrored_run(s, noop_run, NULL, 2, ragged, 2, outs);
    CHECKF(rs != NB_OK && nb_error() == rs, "nb_mirrored_run with ragged inputs: %s", nb_status_name(rs));
    nb_error_clear();
    rs = nb_mirrored_run(s, noop_run, NULL, 2, scalar_in, 2, outs);
    CHECKF(rs != NB_OK && nb_error() == rs, "nb_mirrored_run with a 0-d input: %s", nb_status_name(rs));
    nb_error_clear();
    for (int k = 0; k < 4; k++)
        CHECK(outs[k] == NULL);

    nb_variable_free(foreign);
    twin_free(&t);
    nb_mirrored_free(s);
    nb_mirrored_free(other);
}

/* ---- 7. nb_mirrored_run, reduce, all_reduce --------------------------------------- */

typedef struct run_log {
    atomic_int calls[MAXR];
    int index_seen[MAXR], count[MAXR];
    int64_t rows[MAXR], global_rows[MAXR];
    bool placed[MAXR];
} run_log;

/* Outputs: its row count (i64 scalar), the sum of its share of the second
 * input, and twice its share of the first. */
static nb_status share_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                           void *user)
{
    run_log *log = user;
    int i = nb_replica_index(r);
    if (i < 0 || i >= MAXR || n_in != 2 || n_out != 3)
        return NB_ERR_INTERNAL;
    atomic_fetch_add(&log->calls[i], 1);
    log->index_seen[i] = i;
    log->count[i] = nb_replica_count(r);
    log->rows[i] = nb_replica_rows(r);
    log->global_rows[i] = nb_replica_global_rows(r);
    const char *dev = nb_replica_device(r);
    log->placed[i] = dev && strcmp(nb_device_current(), dev) == 0 && on_device(in[0], dev) &&
                     on_device(in[1], dev) && nb_tensor_dim(in[0], 0) == log->rows[i] &&
                     nb_tensor_dim(in[1], 0) == log->rows[i];
    out[0] = nb_scalar(NB_I64, (double)nb_replica_rows(r));
    out[1] = nb_sum_all(in[1]);
    out[2] = nb_mul_scalar(in[0], 2.0);
    return out[0] && out[1] && out[2] ? NB_OK : nb_error();
}

static void run_case(nb_mirrored *s, int64_t rows)
{
    int n = nb_mirrored_replicas(s);
    double hx[64 * 3];
    nb_tensor *x = host_tensor(NB_F64, NB_SHAPE(rows, 3), 1, hx);
    nb_tensor *idx = nb_arange(NB_F64, 0, (double)rows, 1);
    run_log log;
    memset(&log, 0, sizeof log);
    for (int r = 0; r < MAXR; r++)
        atomic_init(&log.calls[r], 0);
    nb_tensor *out[MAXR * 3];
    CHECK_OK(nb_mirrored_run(s, share_run, &log, 2, (nb_tensor *const[]){x, idx}, 3, out));
    int64_t start = 0;
    for (int r = 0; r < n; r++) {
        const char *dev = nb_mirrored_device(s, r);
        CHECKF(atomic_load(&log.calls[r]) == 1, "rows %lld: replica %d called %d times", (long long)rows,
               r, atomic_load(&log.calls[r]));
        CHECKF(log.count[r] == n && log.global_rows[r] == rows && log.placed[r],
               "rows %lld: replica %d saw count %d, global rows %lld, placed %d", (long long)rows, r,
               log.count[r], (long long)log.global_rows[r], log.placed[r]);
        int64_t k = log.rows[r];
        CHECKF(k == rows / n || k == rows / n + 1, "rows %lld: replica %d got %lld rows", (long long)rows,
               r, (long long)k);
        for (int j = 0; j < 3; j++)
            CHECKF(on_device(out[r * 3 + j], dev), "rows %lld: output %d of replica %d on %s", (long long)rows,
                   j, r, out[r * 3 + j] ? nb_tensor_device(out[r * 3 + j]) : "(null)");
        CHECKF(out[r * 3] && nb_tensor_item(out[r * 3]) == (double)k, "rows %lld: replica %d row count",
               (long long)rows, r);
        /* Its share is rows [start, start + k): their indices sum to this. */
        double want = (double)(k * start + k * (k - 1) / 2);
        CHECKF(out[r * 3 + 1] && nb_tensor_item(out[r * 3 + 1]) == want,
               "rows %lld: replica %d index sum %g, expected %g (rows %lld..%lld)", (long long)rows, r,
               out[r * 3 + 1] ? nb_tensor_item(out[r * 3 + 1]) : NAN, want, (long long)start,
               (long long)(start + k));
        nb_tensor *twice = out[r * 3 + 2];
        bool ok = has_shape(twice, NB_SHAPE(k, 3));
        for (int64_t e = 0; ok && e < k * 3; e++)
            ok = nb_tensor_get(twice, e) == 2 * hx[start * 3 + e];
        CHECKF(ok, "rows %lld: replica %d's share is not rows %lld..%lld", (long long)rows, r,
               (long long)start, (long long)(start + k));
        start += k;
    }
    CHECKF(start == rows, "rows %lld: shares add up to %lld", (long long)rows, (long long)start);

    /* reduce the per-replica index sums: SUM in replica order, MEAN = SUM / N */
    nb_tensor *per[MAXR];
    double sum = 0;
    for (int r = 0; r < n; r++) {
        per[r] = out[r * 3 + 1];
        sum += nb_tensor_item(per[r]);
    }
    nb_tensor *total = nb_mirrored_reduce(s, NB_REDUCE_SUM, per);
    CHECK(total && nb_tensor_ndim(total) == 0 && on_device(total, nb_device_current()));
    CHECK(total && nb_tensor_item(total) == sum);
    nb_tensor *mean = nb_mirrored_reduce(s, NB_REDUCE_MEAN, per);
    CHECK(mean && rel_close(nb_tensor_item(mean), sum / n, 1e-15));
}

/* nb_mirrored_run hands every replica its contiguous share in replica order
 * (shares differing by at most one row, zero rows included), on its device, and
 * gives back the outputs replica-major on the replicas' devices; a failure
 * names the lowest failing replica and leaves every output NULL. */
static void test_run(void)
{
    nb_mirrored *s = cpu_mirrored(4);
    run_case(s, 7);
    run_case(s, 8);
    run_case(s, 3); /* one replica with no rows, still called */
    run_case(s, 1);
    nb_mirrored_free(s);
    nb_mirrored *s3 = nb_mirrored_new(3, (const char *[]){"/cpu:1", "/cpu:3", "/cpu:0"});
    run_case(s3, 11);
    nb_mirrored_free(s3);
}

/* Writes a tensor to output 0 and NULL to output 1. */
static nb_status null_output_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                                 void *user)
{
    (void)r, (void)n_in, (void)in, (void)n_out, (void)user;
    out[0] = nb_scalar(NB_F32, 3);
    out[1] = NULL;
    return NB_OK;
}

/* A replica function may give NULL for an output, and nb_mirrored_run takes
 * no outputs array when it asks for none. */
static void test_run_null_outputs(void)
{
    nb_mirrored *s = cpu_mirrored(2);
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(3, 2));
    nb_tensor *out[4];
    CHECK_OK(nb_mirrored_run(s, null_output_run, NULL, 1, &x, 2, out));
    for (int r = 0; r < 2; r++) {
        CHECK(out[r * 2] && nb_tensor_item(out[r * 2]) == 3 && on_device(out[r * 2], nb_mirrored_device(s, r)));
        CHECK(out[r * 2 + 1] == NULL);
    }
    CHECK_OK(nb_mirrored_run(s, noop_run, NULL, 1, &x, 0, NULL));
    nb_mirrored_free(s);
}

/* Fails on replicas 2 (a shape error) and 3 (a dtype error). */
static nb_status failing_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                             void *user)
{
    (void)n_in, (void)user;
    int i = nb_replica_index(r);
    for (int k = 0; k < n_out; k++)
        out[k] = nb_mul_scalar(in[0], 1.0);
    if (i == 2 && !nb_add(nb_ones(NB_F64, NB_SHAPE(2)), nb_ones(NB_F64, NB_SHAPE(5))))
        return nb_error();
    if (i == 3 && !nb_add(nb_ones(NB_F64, NB_SHAPE(2)), nb_ones(NB_F32, NB_SHAPE(2))))
        return nb_error();
    return NB_OK;
}

/* Replicas 2 and 3 fail: nb_mirrored_run returns replica 2's error, naming it
 * and its device, sets every output to NULL and stays usable. */
static void test_run_failure(void)
{
    nb_mirrored *s = cpu_mirrored(4);
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(8, 2), 0, 1, 5);
    nb_tensor *out[8];
    for (int k = 0; k < 8; k++)
        out[k] = x; /* to see that each is overwritten */
    CHECK(nb_mirrored_run(s, failing_run, NULL, 1, &x, 2, out) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "replica 2", "/cpu:2", "[5]");
    for (int k = 0; k < 8; k++)
        CHECKF(out[k] == NULL, "output %d not NULL after a failure", k);
    /* Still usable. */
    nb_tensor *ok[4];
    CHECK_OK(nb_mirrored_run(s, noop_run, NULL, 1, &x, 1, ok));
    for (int r = 0; r < 4; r++)
        CHECK(ok[r] && nb_tensor_item(ok[r]) == 1);
    nb_mirrored_free(s);
}

/* nb_mirrored_reduce of values on several devices: SUM in replica order
 * exactly, MEAN = SUM / N, on the caller's current device; values that
 * disagree in shape or dtype are NB_ERR_SHAPE / NB_ERR_DTYPE. */
static void test_reduce(void)
{
    nb_mirrored *s = nb_mirrored_new(3, (const char *[]){"/cpu:2", "/cpu:0", "/cpu:1"});
    double h[3][5];
    nb_tensor *per[3];
    for (int r = 0; r < 3; r++) {
        CHECK_OK(nb_device_push(nb_device_name(NB_DEVICE_CPU, 3 - r)));
        per[r] = host_tensor(NB_F64, NB_SHAPE(5), 1, h[r]);
        CHECK_OK(nb_device_pop());
    }
    for (int red = 0; red < 2; red++) {
        CHECK_OK(nb_device_push("/cpu:3"));
        nb_tensor *t = nb_mirrored_reduce(s, (nb_reduction)red, per);
        CHECK_OK(nb_device_pop());
        CHECK(has_shape(t, NB_SHAPE(5)) && nb_tensor_dtype(t) == NB_F64 && on_device(t, "/cpu:3"));
        for (int i = 0; t && i < 5; i++) {
            double want = (h[0][i] + h[1][i]) + h[2][i];
            if (red == NB_REDUCE_SUM)
                CHECKF(nb_tensor_get(t, i) == want, "SUM element %d: %.17g vs %.17g", i, nb_tensor_get(t, i), want);
            else
                CHECKF(rel_close(nb_tensor_get(t, i), want / 3, 3e-16), "MEAN element %d: %.17g vs %.17g", i,
                       nb_tensor_get(t, i), want / 3);
        }
    }
    nb_tensor *bad_shape[3] = {per[0], nb_zeros(NB_F64, NB_SHAPE(4)), per[2]};
    CHECK(nb_mirrored_reduce(s, NB_REDUCE_SUM, bad_shape) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_mirrored_reduce");
    nb_tensor *bad_dtype[3] = {per[0], per[1], nb_zeros(NB_F32, NB_SHAPE(5))};
    CHECK(nb_mirrored_reduce(s, NB_REDUCE_MEAN, bad_dtype) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_mirrored_reduce");
    CHECK(nb_mirrored_reduce(s, NB_REDUCE_SUM, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_reduce");
    nb_mirrored_free(s);
}

static void all_reduce_case(nb_mirrored *s, nb_dtype dt, nb_shape shape, bool on_replicas)
{
    int n = nb_mirrored_replicas(s);
    int64_t len = numel_of(shape);
    char shape_s[64];
    nb_shape_format(shape, shape_s, sizeof shape_s);
    double *h = malloc(sizeof(double) * (size_t)(n * len));
    nb_tensor *per[MAXR], *out[MAXR];
    for (int r = 0; r < n; r++) {
        if (on_replicas)
            CHECK_OK(nb_device_push(nb_mirrored_device(s, r)));
        per[r] = host_tensor(dt, shape, 2, h + r * len);
        if (on_replicas)
            CHECK_OK(nb_device_pop());
    }
    for (int red = 0; red < 2; red++) {
        for (int r = 0; r < n; r++)
            out[r] = NULL;
        nb_status st = nb_mirrored_all_reduce(s, (nb_reduction)red, per, out);
        CHECKF(st == NB_OK, "all_reduce %s %s %s on %d: %s", red ? "MEAN" : "SUM", nb_dtype_name(dt), shape_s,
               n, nb_error_message());
        nb_error_clear();
        for (int r = 0; r < n; r++) {
            CHECKF(out[r] && nb_tensor_dtype(out[r]) == dt && has_shape(out[r], shape) &&
                       on_device(out[r], nb_mirrored_device(s, r)),
                   "all_reduce %s %s: out[%d] wrong dtype, shape or device", nb_dtype_name(dt), shape_s, r);
            CHECKF(same_bits(out[r], out[0]), "all_reduce %s %s: out[%d] differs from out[0]",
                   nb_dtype_name(dt), shape_s, r);
        }
        if (!out[0])
            continue;
        double worst = 0;
        bool exact = true;
        for (int64_t i = 0; i < len; i++) {
            double want;
            if (dt == NB_F32) {
                float acc = (float)h[i];
                for (int r = 1; r < n; r++)
                    acc += (float)h[r * len + i];
                want = red ? (double)(acc / (float)n) : (double)acc;
            } else {
                double acc = h[i];
                for (int r = 1; r < n; r++)
                    acc += h[r * len + i];
                want = red ? acc / n : acc;
            }
            double got = nb_tensor_get(out[0], i);
            if (red == NB_REDUCE_SUM)
                exact = exact && got == want;
            double e = fabs(got - want) / fmax(fabs(want), 1e-30);
            worst = e > worst ? e : worst;
        }
        if (red == NB_REDUCE_SUM)
            CHECKF(exact, "all_reduce SUM %s %s on %d: not the sum in replica order (rel err %.3g)",
                   nb_dtype_name(dt), shape_s, n, worst);
        else
            CHECKF(worst <= (dt == NB_F32 ? 1.5e-7 : 3e-16), "all_reduce MEAN %s %s on %d: rel err %.3g",
                   nb_dtype_name(dt), shape_s, n, worst);
    }
    free(h);
}

/* nb_mirrored_all_reduce gives every replica the same bits: the sum in replica
 * order (or that over N), on its own device, for sizes that N does not divide
 * and sizes below N, from inputs on one device or on the replicas'; tensors
 * that disagree are an error with every output NULL. */
static void test_all_reduce(void)
{
    nb_mirrored *s = cpu_mirrored(4);
    static const int64_t sizes[] = {1, 3, 4, 5, 7, 1000, 1027};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        all_reduce_case(s, NB_F64, NB_SHAPE(sizes[k]), k % 2 == 0);
        all_reduce_case(s, NB_F32, NB_SHAPE(sizes[k]), k % 2 == 1);
    }
    all_reduce_case(s, NB_F64, NB_SHAPE(3, 5), true);
    all_reduce_case(s, NB_F32, NB_SCALAR, false);
    /* with small buckets */
    CHECK_OK(nb_mirrored_set_bucket_bytes(s, 64));
    all_reduce_case(s, NB_F64, NB_SHAPE(1027), true);
    all_reduce_case(s, NB_F32, NB_SHAPE(3), false);

    nb_tensor *per[4], *out[4];
    for (int r = 0; r < 4; r++)
        per[r] = nb_ones(NB_F64, NB_SHAPE(6));
    per[2] = nb_ones(NB_F64, NB_SHAPE(7));
    for (int r = 0; r < 4; r++)
        out[r] = per[0];
    nb_status st = nb_mirrored_all_reduce(s, NB_REDUCE_SUM, per, out);
    CHECKF(st == NB_ERR_SHAPE && nb_error() == st, "all_reduce of [6] and [7]: %s", nb_status_name(st));
    nb_error_clear();
    for (int r = 0; r < 4; r++)
        CHECK(out[r] == NULL);
    per[2] = nb_ones(NB_F32, NB_SHAPE(6));
    st = nb_mirrored_all_reduce(s, NB_REDUCE_SUM, per, out);
    CHECKF(st == NB_ERR_DTYPE && nb_error() == st, "all_reduce of f64 and f32: %s", nb_status_name(st));
    nb_error_clear();
    nb_mirrored_free(s);

    nb_mirrored *s3 = nb_mirrored_new(3, (const char *[]){"/cpu:3", "/cpu:1", "/cpu:2"});
    all_reduce_case(s3, NB_F64, NB_SHAPE(2), true);
    all_reduce_case(s3, NB_F64, NB_SHAPE(10), false);
    all_reduce_case(s3, NB_F32, NB_SHAPE(301), true);
    nb_mirrored_free(s3);
}

/* ---- 8. concurrency ---------------------------------------------------------------- */

typedef struct meet {
    atomic_int entered;
    int expect;
    bool met[MAXR];
} meet;

static nb_status meet_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                          void *user)
{
    (void)n_in, (void)in, (void)n_out, (void)out;
    meet *m = user;
    int i = nb_replica_index(r);
    if (i < 0 || i >= MAXR)
        return NB_ERR_INTERNAL;
    m->met[i] = rendezvous(&m->entered, m->expect, 2.0);
    return NB_OK;
}

/* Replicas run at the same time: each waits (2 s at most) until all have
 * entered, which one after another they never would, in nb_mirrored_run and in
 * nb_mirrored_step. */
static void test_replicas_overlap(void)
{
    nb_mirrored *s = cpu_mirrored(4);
    meet mt;
    memset(&mt, 0, sizeof mt);
    atomic_init(&mt.entered, 0);
    mt.expect = 4;
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(4, 1));
    CHECK_OK(nb_mirrored_run(s, meet_run, &mt, 1, &x, 0, NULL));
    for (int r = 0; r < 4; r++)
        CHECKF(mt.met[r], "nb_mirrored_run: replica %d waited 2 s for the others", r);

    model m = {MLP_MSE, false};
    nb_tensor *init[4], *in[2];
    model_init(&m, NB_F64, 71, init);
    model_data(&m, NB_F64, 8, 72, in);
    twin t;
    twin_new(&t, s, 4, init, nb_sgd_new(0.1), nb_sgd_new(0.1));
    step_ctx c;
    ctx_init(&c, m, STEP_WAIT_ALL, -1);
    c.expect = 4;
    CHECK_OK(nb_mirrored_step(s, t.mopt, 4, t.mv, ctx_step, &c, 2, in, NB_REDUCE_MEAN, NULL));
    for (int r = 0; r < 4; r++)
        CHECKF(c.waited[r], "nb_mirrored_step: replica %d waited 2 s for the others", r);
    twin_free(&t);
    nb_mirrored_free(s);
}

/* ---- 9. freeing, and calls from inside a replica ------------------------------------ */

typedef struct flight {
    nb_mirrored *s;
    twin *t;
    step_ctx *c;
    nb_tensor *const *in;
    nb_status st;
    char message[256];
} flight;

static void *flight_main(void *arg)
{
    flight *f = arg;
    f->st = nb_mirrored_step(f->s, f->t->mopt, f->t->nv, f->t->mv, ctx_step, f->c, 2, f->in,
                             NB_REDUCE_MEAN, NULL);
    snprintf(f->message, sizeof f->message, "%s", nb_error_message());
    nb_error_clear();
    return NULL;
}

typedef struct run_flight {
    nb_mirrored *s;
    nb_tensor *x;
    atomic_int started, finished;
    nb_status st;
    bool outputs_ok;
} run_flight;

static nb_status slow_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                          void *user)
{
    (void)r, (void)n_in, (void)in;
    run_flight *f = user;
    atomic_fetch_add(&f->started, 1);
    sleep_ms(50);
    for (int k = 0; k < n_out; k++)
        out[k] = nb_scalar(NB_F64, 2);
    atomic_fetch_add(&f->finished, 1);
    return NB_OK;
}

static void *run_flight_main(void *arg)
{
    run_flight *f = arg;
    nb_scope *sc = nb_scope_begin();
    nb_tensor *out[NDEV] = {0};
    f->st = nb_mirrored_run(f->s, slow_run, f, 1, &f->x, 1, out);
    f->outputs_ok = true;
    for (int r = 0; r < NDEV; r++)
        f->outputs_ok = f->outputs_ok && out[r] && nb_tensor_item(out[r]) == 2;
    nb_error_clear();
    nb_scope_end(sc);
    return NULL;
}

/* nb_mirrored_free while a step runs on another thread waits for the step,
 * which completes its update; the variables outlive the strategy with their
 * copies. The same with nb_mirrored_run in flight (a few times, since what
 * would go wrong is a race). nb_mirrored_free(NULL) does nothing. */
static void test_free_during_step(void)
{
    nb_mirrored_free(NULL);
    CHECK(nb_error() == NB_OK);

    mlp_case mc;
    mlp_case_new(&mc, NB_F64, 81, 7, 4, OPT_SGD, 0.1);
    step_ctx c;
    ctx_init(&c, mc.m, STEP_SLEEP, -1);
    flight f = {.s = mc.s, .t = &mc.t, .c = &c, .in = mc.in};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flight_main, &f) == 0);
    double end = now_s() + 2.0;
    while (atomic_load(&c.started) == 0 && now_s() < end)
        sleep_ms(1);
    CHECKF(atomic_load(&c.started) > 0, "the step did not start within 2 s");
    nb_mirrored_free(mc.s);
    /* Freeing waited: every replica function had returned. */
    CHECKF(atomic_load(&c.finished) == 4, "nb_mirrored_free returned while %d of 4 replicas were running",
           4 - atomic_load(&c.finished));
    pthread_join(th, NULL);
    CHECKF(f.st == NB_OK, "the step freed under: %s: %s", nb_status_name(f.st), f.message);
    twin_ref_step(&mc.t, &mc.m, mc.in);
    twin_check(&mc.t, 4, mc.devs, 1e-12, true, "after nb_mirrored_free");
    twin_free(&mc.t);

    for (int k = 0; k < 5; k++) {
        run_flight rf = {.s = cpu_mirrored(NDEV), .x = nb_ones(NB_F64, NB_SHAPE(NDEV, 1))};
        atomic_init(&rf.started, 0);
        atomic_init(&rf.finished, 0);
        CHECK(pthread_create(&th, NULL, run_flight_main, &rf) == 0);
        end = now_s() + 2.0;
        while (atomic_load(&rf.started) == 0 && now_s() < end)
            sleep_ms(1);
        CHECKF(atomic_load(&rf.started) > 0, "the run did not start within 2 s");
        nb_mirrored_free(rf.s);
        CHECKF(atomic_load(&rf.finished) == NDEV, "nb_mirrored_free returned while %d replicas were running",
               NDEV - atomic_load(&rf.finished));
        pthread_join(th, NULL);
        CHECKF(rf.st == NB_OK && rf.outputs_ok, "the run freed under: %s", nb_status_name(rf.st));
    }
}

/* Inside a replica function nb_mirrored_step and nb_mirrored_free on the same
 * strategy and assigning a mirrored variable are refused with
 * NB_ERR_INVALID_ARGUMENT (no hang, no effect); the strategy stays usable. */
static void test_calls_from_replicas(void)
{
    mlp_case mc;
    mlp_case_new(&mc, NB_F64, 91, 7, 3, OPT_SGD, 0.1);
    step_ctx c, inner;
    ctx_init(&c, mc.m, STEP_NESTED, 0);
    ctx_init(&inner, mc.m, STEP_PLAIN, -1);
    c.s = mc.s;
    c.opt = mc.t.mopt;
    c.inner = &inner;
    CHECK_OK(mlp_case_step(&mc, &c, NULL));
    CHECK(atomic_load(&c.calls[0]) == 1);
    CHECKF(c.nested[0][0] == NB_ERR_INVALID_ARGUMENT, "nested nb_mirrored_step: %s", nb_status_name(c.nested[0][0]));
    CHECK(c.nested_named[0]);
    CHECKF(c.nested[0][1] == NB_ERR_INVALID_ARGUMENT, "nb_mirrored_free in a replica: %s",
           nb_status_name(c.nested[0][1]));
    CHECKF(c.nested[0][2] == NB_ERR_INVALID_ARGUMENT, "nb_variable_assign in a replica: %s",
           nb_status_name(c.nested[0][2]));
    CHECK(atomic_load(&inner.started) == 0);
    twin_ref_step(&mc.t, &mc.m, mc.in);
    /* The strategy was not freed and the assignment did nothing. */
    mlp_case_still_steps(&mc, 3, "after refused calls from a replica");
    CHECK(stats_of(mc.s).steps == 2);
    mlp_case_free(&mc);
}

/* ---- 10. reading and assigning mirrored variables ----------------------------------- */

typedef struct read_ctx {
    nb_variable *v;
    bool on_replica[MAXR];
} read_ctx;

static nb_status read_run(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                          void *user)
{
    (void)n_in, (void)in, (void)n_out;
    read_ctx *c = user;
    int i = nb_replica_index(r);
    if (i < 0 || i >= MAXR)
        return NB_ERR_INTERNAL;
    out[0] = nb_read(c->v);
    c->on_replica[i] = on_device(out[0], nb_replica_device(r));
    return out[0] ? NB_OK : nb_error();
}

/* nb_read of a mirrored variable gives replica 0's copy outside a replica and
 * the replica's own copy inside one; nb_variable_replicas counts copies; an
 * assignment from outside writes every copy, and a refused one none. */
static void test_reads_and_assign(void)
{
    nb_mirrored *s = nb_mirrored_new(3, (const char *[]){"/cpu:2", "/cpu:0", "/cpu:3"});
    nb_tensor *init = nb_random_normal(NB_F64, NB_SHAPE(2, 3), 0, 1, 101);
    nb_variable *v = nb_mirrored_variable_new(s, "layer/w", init);
    nb_variable *plain = nb_variable_new("plain", init);
    CHECK(v && nb_variable_replicas(v) == 3 && nb_variable_replicas(plain) == 0);
    CHECK(strcmp(nb_variable_name(v), "layer/w") == 0);
    CHECK(nb_variable_dtype(v) == NB_F64 && nb_variable_shape(v).ndim == 2 && nb_variable_trainable(v));
    nb_tensor *r0 = nb_read(v);
    CHECKF(on_device(r0, "/cpu:2"), "nb_read outside a replica on %s", r0 ? nb_tensor_device(r0) : "(null)");
    CHECK(same_bits(r0, init));
    for (int r = 0; r < 3; r++) {
        nb_tensor *c = nb_mirrored_variable_read(v, r);
        CHECK(on_device(c, nb_mirrored_device(s, r)) && same_bits(c, init));
    }

    read_ctx rc = {.v = v};
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(3, 1));
    nb_tensor *out[3];
    CHECK_OK(nb_mirrored_run(s, read_run, &rc, 1, &x, 1, out));
    for (int r = 0; r < 3; r++) {
        CHECKF(rc.on_replica[r], "nb_read inside replica %d is not on its device", r);
        CHECK(on_device(out[r], nb_mirrored_device(s, r)) && same_bits(out[r], init));
    }

    nb_tensor *a = nb_random_normal(NB_F64, NB_SHAPE(2, 3), 0, 1, 102);
    nb_tensor *b = nb_random_normal(NB_F64, NB_SHAPE(2, 3), 0, 1, 103);
    CHECK_OK(nb_variable_assign(v, a));
    for (int r = 0; r < 3; r++)
        CHECKF(same_bits(nb_mirrored_variable_read(v, r), a), "assign did not write replica %d", r);
    CHECK(same_bits(nb_read(v), a));
    CHECK_OK(nb_variable_assign_add(v, b));
    nb_tensor *ab = nb_add(a, b);
    for (int r = 0; r < 3; r++)
        CHECKF(same_bits(nb_mirrored_variable_read(v, r), ab), "assign_add did not write replica %d", r);
    CHECK_OK(nb_variable_assign_sub(v, a));
    nb_tensor *aba = nb_sub(ab, a);
    for (int r = 0; r < 3; r++)
        CHECKF(same_bits(nb_mirrored_variable_read(v, r), aba), "assign_sub did not write replica %d", r);
    CHECK(nb_variable_assign(v, nb_zeros(NB_F64, NB_SHAPE(3, 2))) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "layer/w");
    for (int r = 0; r < 3; r++)
        CHECK(same_bits(nb_mirrored_variable_read(v, r), aba));
    /* An earlier read is a snapshot. */
    CHECK(same_bits(r0, init));

    nb_mirrored_free(s);
    /* The variable outlives its strategy with its copies. */
    CHECK(nb_variable_replicas(v) == 3);
    for (int r = 0; r < 3; r++)
        CHECK(same_bits(nb_mirrored_variable_read(v, r), aba));
    nb_variable_free(v);
    nb_variable_free(plain);
}

/* For test_optimizer_apply_mirrored: tries an optimizer update from inside a replica. */
static nb_status apply_inside(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                              void *user)
{
    (void)r, (void)n_in, (void)in, (void)n_out, (void)out;
    nb_variable *v = ((nb_variable **)user)[0];
    nb_optimizer *opt = ((nb_optimizer **)user)[1];
    nb_tensor *g = nb_ones_like(nb_read(v));
    nb_status st = nb_optimizer_apply(opt, 1, &v, &g);
    return st == NB_ERR_INVALID_ARGUMENT ? (nb_error_clear(), NB_OK) : NB_ERR_INTERNAL;
}

/* nb_optimizer_apply outside a step updates every copy of a mirrored variable
 * alike (one iteration, slots per copy), exactly as a plain variable moves;
 * inside a replica function it is refused. */
static void test_optimizer_apply_mirrored(void)
{
    nb_mirrored *s = cpu_mirrored(3);
    nb_tensor *init = nb_random_normal(NB_F64, NB_SHAPE(4, 2), 0, 1, 111);
    nb_variable *v = nb_mirrored_variable_new(s, "m", init);
    nb_variable *plain = nb_variable_new("p", init);
    nb_optimizer *om = nb_adam_new(0.1, 0.9, 0.999, 1e-7), *op = nb_adam_new(0.1, 0.9, 0.999, 1e-7);
    for (int k = 0; k < 3; k++) {
        nb_tensor *g = nb_random_normal(NB_F64, NB_SHAPE(4, 2), 0, 1, 112 + (uint64_t)k);
        CHECK_OK(nb_optimizer_apply(om, 1, &v, &g));
        CHECK_OK(nb_optimizer_apply(op, 1, &plain, &g));
    }
    CHECK(nb_optimizer_iterations(om) == 3);
    nb_tensor *want = nb_read(plain);
    CHECK(!same_bits(want, init));
    for (int r = 0; r < 3; r++)
        CHECKF(same_bits(nb_mirrored_variable_read(v, r), want), "copy %d differs from the plain update", r);

    void *ctx[2] = {v, om};
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(3, 1));
    CHECK_OK(nb_mirrored_run(s, apply_inside, ctx, 1, &x, 0, NULL));
    for (int r = 0; r < 3; r++)
        CHECK(same_bits(nb_mirrored_variable_read(v, r), want));
    CHECK(nb_optimizer_iterations(om) == 3);

    nb_optimizer_free(om);
    nb_optimizer_free(op);
    nb_variable_free(v);
    nb_variable_free(plain);
    nb_mirrored_free(s);
}

/* For test_caller_state_kept: a replica function that doubles its share, and
 * fails on replica 0 when asked. */
static nb_status double_share(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out,
                              void *user)
{
    (void)n_in, (void)n_out;
    if (user && nb_replica_index(r) == 0)
        return nb_add(in[0], nb_ones(NB_F64, NB_SHAPE(7))) ? NB_ERR_INTERNAL : nb_error();
    out[0] = nb_mul_scalar(in[0], 2.0);
    return out[0] ? NB_OK : nb_error();
}

/* Replica 0 runs on the caller's thread, but the caller's state is its own
 * afterwards: a tape it has open records none of the replica's ops, its device
 * stack is as it was, and an error it had pending is still the pending one. */
static void test_caller_state_kept(void)
{
    nb_mirrored *s = cpu_mirrored(2);
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(6, 2), 0, 1, 121);
    nb_tape *tape = nb_tape_begin_persistent();
    CHECK_OK(nb_tape_watch(tape, x));
    CHECK_OK(nb_device_push("/cpu:3"));
    nb_tensor *out[2];
    CHECK_OK(nb_mirrored_run(s, double_share, NULL, 1, &x, 1, out));
    CHECK(strcmp(nb_device_current(), "/cpu:3") == 0);
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(out[0]), 1, &x, &g));
    CHECKF(g == NULL, "the caller's tape recorded replica 0's ops");
    CHECK_OK(nb_device_pop());

    /* A pending error survives a call that succeeds, and stays first after one
     * that fails (which still returns its own code). */
    CHECK(nb_add(x, nb_ones(NB_F64, NB_SHAPE(5))) == NULL);
    CHECK(nb_error() == NB_ERR_SHAPE);
    CHECK(nb_mirrored_run(s, double_share, NULL, 1, &x, 1, out) == NB_OK);
    CHECK_ERROR(NB_ERR_SHAPE, "add");
    CHECK(nb_add(x, nb_ones(NB_F64, NB_SHAPE(5))) == NULL);
    CHECK(nb_mirrored_run(s, double_share, (void *)1, 1, &x, 1, out) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "add");
    CHECK(nb_mirrored_run(s, double_share, (void *)1, 1, &x, 1, out) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "replica 0", "/cpu:0");
    nb_tape_free(tape);
    nb_mirrored_free(s);
}

/* ---- main -------------------------------------------------------------------------- */

#define RUN_T(fn) RUN_WITHIN(fn, 60)

int main(void)
{
    if (nb_set_logical_cpu_devices(NDEV) != NB_OK)
        return 1;
    RUN_T(test_equivalence_f64_sgd);
    RUN_T(test_equivalence_f32_and_adam);
    RUN_T(test_sum_and_mean);
    RUN_T(test_missing_gradients);
    RUN_T(test_copies_equal_and_deterministic);
    RUN_T(test_buckets);
    RUN_T(test_failing_replica);
    RUN_T(test_bad_arguments);
    RUN_T(test_run);
    RUN_T(test_run_null_outputs);
    RUN_T(test_run_failure);
    RUN_T(test_reduce);
    RUN_T(test_all_reduce);
    RUN_T(test_replicas_overlap);
    RUN_T(test_free_during_step);
    RUN_T(test_calls_from_replicas);
    RUN_T(test_reads_and_assign);
    RUN_T(test_optimizer_apply_mirrored);
    RUN_T(test_caller_state_kept);
    return check_finish();
}
