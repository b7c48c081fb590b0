/* Variables and optimizers: creation, snapshot reads (copy-on-write), assignment
 * and its errors, gradients through nb_read, and every optimizer against a plain
 * C reference of its formulas in f64 and f32. */
#include "check.h"

#include "lib/variable/variable_impl.h"

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

/* Uniform in [-1, 1), never exactly zero. */
static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return u == 0 ? 0.5 : u;
}

/* Fills h with n random values, rounded to dtype, and returns a tensor holding them. */
static nb_tensor *random_tensor(nb_dtype dt, nb_shape shape, double *h, double scale)
{
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++)
        n *= shape.dims[i];
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        h[i] = scale * rnd();
        if (dt == NB_F32)
            h[i] = f[i] = (float)h[i];
    }
    nb_tensor *t = nb_from_buffer(dt, shape, dt == NB_F32 ? (const void *)f : (const void *)h);
    free(f);
    return t;
}

static bool values_equal(const nb_tensor *t, const double *ref, int64_t n)
{
    if (!t || nb_tensor_numel(t) != n)
        return false;
    for (int64_t i = 0; i < n; i++)
        if (nb_tensor_get(t, i) != ref[i])
            return false;
    return true;
}

/* ---- variables ---------------------------------------------------------------- */

static void test_variable_new(void)
{
    double h[6];
    nb_tensor *init = random_tensor(NB_F64, NB_SHAPE(2, 3), h, 1);
    nb_variable *v = nb_variable_new("dense/w", init);
    CHECK(v != NULL);
    CHECK(strcmp(nb_variable_name(v), "dense/w") == 0);
    CHECK(nb_variable_trainable(v));
    nb_shape s = nb_variable_shape(v);
    CHECK(s.ndim == 2 && s.dims[0] == 2 && s.dims[1] == 3);
    CHECK(nb_variable_dtype(v) == NB_F64);
    CHECK(strcmp(nb_variable_device(v), "/cpu:0") == 0);
    nb_tensor *r = nb_read(v);
    CHECK(values_equal(r, h, 6));
    CHECK(r != init); /* a copy, not the caller's tensor */
    CHECK(nb_tensor_is_contiguous(r));
    nb_variable_set_trainable(v, false);
    CHECK(!nb_variable_trainable(v));
    nb_variable_free(v);
    /* The read outlives the variable. */
    CHECK(values_equal(r, h, 6));

    /* From a strided view: the variable holds a contiguous copy of its elements. */
    nb_tensor *tr = nb_transpose(init, 0, 1);
    nb_variable *vt = nb_variable_new("t", tr);
    CHECK(vt != NULL);
    nb_tensor *rt = nb_read(vt);
    CHECK(nb_tensor_is_contiguous(rt));
    CHECK(nb_tensor_dim(rt, 0) == 3 && nb_tensor_dim(rt, 1) == 2);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            CHECK(nb_tensor_get(rt, i * 2 + j) == h[j * 3 + i]);
    nb_variable_free(vt);

    /* Scalars and integer variables. */
    nb_variable *vs = nb_variable_new("step", nb_scalar(NB_I64, 7));
    CHECK(nb_variable_shape(vs).ndim == 0);
    CHECK(nb_tensor_item(nb_read(vs)) == 7);
    CHECK_OK(nb_variable_assign_add(vs, nb_scalar(NB_I64, 5)));
    CHECK(nb_tensor_item(nb_read(vs)) == 12);
    nb_variable_free(vs);

    /* NULL initial: NULL and an error; an earlier error is kept. */
    CHECK(nb_variable_new("x", NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_variable_new", "'x'");
    nb_tensor *bad = nb_reshape(init, NB_SHAPE(4, 4));
    CHECK(bad == NULL);
    CHECK(nb_variable_new("x", bad) == NULL);
    CHECK(nb_error() == NB_ERR_SHAPE); /* the reshape's error, kept */
    nb_error_clear();
    CHECK(nb_read(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_read");
    nb_variable_free(NULL);
}

static void test_read_snapshot(void)
{
    double h0[4], h1[4], h2[4], ref[4];
    nb_variable *v = nb_variable_new("v", random_tensor(NB_F64, NB_SHAPE(4), h0, 1));
    nb_tensor *a = random_tensor(NB_F64, NB_SHAPE(4), h1, 1);
    nb_tensor *b = random_tensor(NB_F64, NB_SHAPE(4), h2, 1);

    nb_tensor *r0 = nb_read(v);
    CHECK(nb_read(v) == r0); /* reading twice with no write gives the same tensor */
    CHECK_OK(nb_variable_assign(v, a));
    nb_tensor *r1 = nb_read(v);
    CHECK(values_equal(r0, h0, 4)); /* the old read is unchanged */
    CHECK(values_equal(r1, h1, 4));
    CHECK(r1 != r0);

    CHECK_OK(nb_variable_assign_add(v, b));
    for (int i = 0; i < 4; i++)
        ref[i] = h1[i] + h2[i];
    nb_tensor *r2 = nb_read(v);
    CHECK(values_equal(r1, h1, 4));
    CHECK(values_equal(r2, ref, 4));

    CHECK_OK(nb_variable_assign_sub(v, a));
    for (int i = 0; i < 4; i++)
        ref[i] = (h1[i] + h2[i]) - h1[i];
    CHECK(values_equal(r2, (double[]){h1[0] + h2[0], h1[1] + h2[1], h1[2] + h2[2], h1[3] + h2[3]}, 4));
    CHECK(values_equal(nb_read(v), ref, 4));

    /* Assigning a variable's own read to it. */
    nb_tensor *self = nb_read(v);
    CHECK_OK(nb_variable_assign_add(v, self));
    for (int i = 0; i < 4; i++)
        ref[i] *= 2;
    CHECK(values_equal(nb_read(v), ref, 4));
    nb_variable_free(v);
}

/* With no read alive the variable is updated in place; a view of a read still
 * alive (its storage shared) forces a copy. */
static void test_copy_on_write(void)
{
    double h0[6], h1[6];
    nb_variable *v = nb_variable_new("v", random_tensor(NB_F32, NB_SHAPE(2, 3), h0, 1));
    nb_tensor *a = random_tensor(NB_F32, NB_SHAPE(2, 3), h1, 1);

    nb_tensor *before = nb__variable_value(v);
    nb_scope *s = nb_scope_begin();
    CHECK(values_equal(nb_read(v), h0, 6));
    nb_scope_end(s);
    CHECK_OK(nb_variable_assign(v, a));
    CHECK(nb__variable_value(v) == before); /* in place */
    CHECK(values_equal(nb_read(v), h1, 6));

    /* Keep only a reshaped view of a read. */
    s = nb_scope_begin();
    nb_tensor *view = nb_keep(nb_reshape(nb_read(v), NB_SHAPE(3, 2)));
    nb_scope_end(s);
    CHECK(view != NULL);
    CHECK_OK(nb_variable_assign(v, nb_zeros(NB_F32, NB_SHAPE(2, 3))));
    CHECK(values_equal(view, h1, 6));
    CHECK(nb_tensor_item(nb_sum_all(nb_abs(nb_read(v)))) == 0);
    nb_variable_free(v);
}

static void test_assign_errors(void)
{
    double h[50];
    nb_variable *v = nb_variable_new("dense/w", random_tensor(NB_F32, NB_SHAPE(5, 10), h, 1));

    CHECK(nb_variable_assign(v, nb_zeros(NB_F32, NB_SHAPE(10, 5))) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_variable_assign: variable 'dense/w' is f32 [5, 10], value is f32 [10, 5]");
    CHECK(nb_variable_assign(v, nb_zeros(NB_F64, NB_SHAPE(5, 10))) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_variable_assign: variable 'dense/w' is f32 [5, 10], value is f64 [5, 10]");
    CHECK(nb_variable_assign_add(v, nb_zeros(NB_F32, NB_SHAPE(50))) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_variable_assign_add", "'dense/w'", "[50]");
    CHECK(nb_variable_assign_sub(v, nb_zeros(NB_I32, NB_SHAPE(5, 10))) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_variable_assign_sub", "'dense/w'", "i32");
    /* Broadcastable is not enough: the shape must match. */
    CHECK(nb_variable_assign_add(v, nb_ones(NB_F32, NB_SHAPE(10))) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "'dense/w'");
    CHECK(nb_variable_assign(v, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_variable_assign", "'dense/w'");
    CHECK(nb_variable_assign(NULL, nb_zeros(NB_F32, NB_SHAPE(5, 10))) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_variable_assign");
    /* Nothing changed. */
    CHECK(values_equal(nb_read(v), h, 50));
    nb_variable_free(v);
}

/* ---- gradients through reads -------------------------------------------------- */

static void test_gradient_through_read(void)
{
    double hw[6], hx[6], hb[3];
    nb_variable *w = nb_variable_new("w", random_tensor(NB_F64, NB_SHAPE(2, 3), hw, 1));
    nb_variable *b = nb_variable_new("b", random_tensor(NB_F64, NB_SHAPE(3), hb, 1));
    nb_variable *frozen = nb_variable_new("frozen", nb_ones(NB_F64, NB_SHAPE(2, 3)));
    nb_variable_set_trainable(frozen, false);
    nb_tensor *x = random_tensor(NB_F64, NB_SHAPE(2, 3), hx, 1);

    nb_tape *tape = nb_tape_begin_persistent();
    /* y = sum(w * x + w * w * frozen + b) */
    nb_tensor *y = nb_sum_all(nb_add(nb_add(nb_mul(nb_read(w), x), nb_mul(nb_mul(nb_read(w), nb_read(w)), nb_read(frozen))),
                                     nb_read(b)));
    CHECK(y != NULL);
    nb_tensor *g[3] = {NULL, NULL, NULL};
    CHECK_OK(nb_tape_gradient_vars(tape, y, NB_VARS(w, b, frozen), g));
    double ref[6];
    for (int i = 0; i < 6; i++)
        ref[i] = hx[i] + 2 * hw[i];
    CHECK(check_max_error(g[0], ref, 6) < 1e-12);
    CHECK(check_max_error(g[1], (double[]){2, 2, 2}, 3) < 1e-12);
    CHECK(g[2] == NULL); /* not trainable: not watched */
    nb_tape_free(tape);

    /* A read taken before the tape opened is not watched by it. */
    nb_tensor *early = nb_read(b);
    tape = nb_tape_begin();
    nb_tensor *z = nb_sum_all(nb_mul(early, early));
    nb_tensor *gb = NULL;
    CHECK_OK(nb_tape_gradient_vars(tape, z, NB_VARS(b), &gb));
    CHECK(gb == NULL);

    nb_variable_free(w);
    nb_variable_free(b);
    nb_variable_free(frozen);
}

/* ---- optimizers against a reference ----------------------------------------------- */

typedef enum { REF_SGD, REF_MOMENTUM, REF_NESTEROV, REF_ADAM, REF_ADAMW } ref_kind;

typedef struct ref_opt {
    ref_kind kind;
    double lr, momentum, beta1, beta2, eps, wd;
} ref_opt;

/* One step of the header's formulas, in double. */
static void ref_step(const ref_opt *o, int64_t t, int64_t n, double *x, const double *g, double *m, double *v)
{
    for (int64_t i = 0; i < n; i++) {
        switch (o->kind) {
        case REF_SGD:
            x[i] -= o->lr * g[i];
            break;
        case REF_MOMENTUM:
        case REF_NESTEROV:
            m[i] = o->momentum * m[i] + g[i];
            x[i] -= o->lr * (o->kind == REF_NESTEROV ? g[i] + o->momentum * m[i] : m[i]);
            break;
        case REF_ADAM:
        case REF_ADAMW: {
            m[i] = o->beta1 * m[i] + (1 - o->beta1) * g[i];
            v[i] = o->beta2 * v[i] + (1 - o->beta2) * g[i] * g[i];
            double mh = m[i] / (1 - pow(o->beta1, (double)t));
            double vh = v[i] / (1 - pow(o->beta2, (double)t));
            double decay = o->kind == REF_ADAMW ? o->lr * o->wd * x[i] : 0;
            x[i] -= o->lr * mh / (sqrt(vh) + o->eps) + decay;
            break;
        }
        }
    }
}

static nb_optimizer *make_opt(const ref_opt *o)
{
    switch (o->kind) {
    case REF_SGD: return nb_sgd_new(o->lr);
    case REF_MOMENTUM: return nb_sgd_momentum_new(o->lr, o->momentum, false);
    case REF_NESTEROV: return nb_sgd_momentum_new(o->lr, o->momentum, true);
    case REF_ADAM: return nb_adam_new(o->lr, o->beta1, o->beta2, o->eps);
    case REF_ADAMW: return nb_adamw_new(o->lr, o->beta1, o->beta2, o->eps, o->wd);
    }
    return NULL;
}

static const char *kind_name(ref_kind k)
{
    static const char *names[] = {"sgd", "momentum", "nesterov", "adam", "adamw"};
    return names[k];
}

/* Two variables (a matrix and a vector), several steps of random gradients; the
 * vector gets no gradient on step 3 (its slots and values must stay put then). */
static void check_optimizer(const ref_opt *o, nb_dtype dt, double tol)
{
    enum { NA = 12, NB = 5, STEPS = 6 };
    double xa[NA], xb[NB], ga[NA], gb[NB], ma[NA] = {0}, va[NA] = {0}, mb[NB] = {0}, vb[NB] = {0};
    nb_variable *a = nb_variable_new("a", random_tensor(dt, NB_SHAPE(3, 4), xa, 1));
    nb_variable *b = nb_variable_new("b", random_tensor(dt, NB_SHAPE(5), xb, 1));
    nb_optimizer *opt = make_opt(o);
    CHECK(opt != NULL);
    for (int step = 1; step <= STEPS; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *grad_a = random_tensor(dt, NB_SHAPE(3, 4), ga, 2);
        nb_tensor *grad_b = step == 3 ? NULL : random_tensor(dt, NB_SHAPE(5), gb, 0.5);
        nb_tensor *old = nb_read(a); /* held across the update: snapshot */
        double *olda = check_values(old);
        CHECK_OK(nb_optimizer_apply(opt, NB_VARS(a, b), (nb_tensor *const[]){grad_a, grad_b}));
        ref_step(o, step, NA, xa, ga, ma, va);
        if (grad_b) /* the step number counts apply calls, not this variable's updates */
            ref_step(o, step, NB, xb, gb, mb, vb);
        CHECK(values_equal(old, olda, NA));
        free(olda);
        nb_scope_end(s);
        double ea = check_max_error(nb_read(a), xa, NA), eb = check_max_error(nb_read(b), xb, NB);
        if (!(ea <= tol && eb <= tol)) {
            fprintf(stderr, "[%s] %s %s step %d: error %.3g / %.3g > %.3g\n", check_current, kind_name(o->kind),
                    nb_dtype_name(dt), step, ea, eb, tol);
            check_failures++;
        }
    }
    CHECK(nb_optimizer_iterations(opt) == STEPS);
    nb_optimizer_free(opt);
    nb_variable_free(a);
    nb_variable_free(b);
}

static const ref_opt ref_opts[] = {
    {.kind = REF_SGD, .lr = 0.1},
    {.kind = REF_MOMENTUM, .lr = 0.05, .momentum = 0.9},
    {.kind = REF_NESTEROV, .lr = 0.05, .momentum = 0.8},
    /* A large epsilon tells eps added to sqrt(v_hat) apart from other placements. */
    {.kind = REF_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-3},
    {.kind = REF_ADAM, .lr = 0.02, .beta1 = 0.5, .beta2 = 0.75, .eps = 1e-8},
    {.kind = REF_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-3, .wd = 0.1},
};

static void test_optimizers_f64(void)
{
    for (size_t i = 0; i < sizeof ref_opts / sizeof *ref_opts; i++)
        check_optimizer(&ref_opts[i], NB_F64, 1e-12);
}

static void test_optimizers_f32(void)
{
    for (size_t i = 0; i < sizeof ref_opts / sizeof *ref_opts; i++)
        check_optimizer(&ref_opts[i], NB_F32, 2e-5);
}

/* One apply over several variables (one call of the device's many entry: one
 * kernel on a GPU) gives the bits of one optimizer per variable: sizes from
 * 1 to 70000 (several blocks), a variable whose value a read holds (its update
 * writes a fresh buffer), one without a gradient in a step, four steps. On
 * the current device. */
static void check_many(const ref_opt *o, nb_dtype dt)
{
    enum { NV = 4, STEPS = 4 };
    const nb_shape shapes[NV] = {NB_SHAPE(1), NB_SHAPE(33), NB_SHAPE(70000), NB_SHAPE(7, 3)};
    nb_variable *all[NV], *one[NV];
    nb_optimizer *opt_all = make_opt(o), *opt_one[NV];
    for (int k = 0; k < NV; k++) {
        double *h = malloc(sizeof(double) * 70000);
        all[k] = nb_variable_new("all", random_tensor(dt, shapes[k], h, 1));
        one[k] = nb_variable_new("one", nb_read(all[k]));
        opt_one[k] = make_opt(o);
        free(h);
    }
    for (int step = 1; step <= STEPS; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *g[NV];
        for (int k = 0; k < NV; k++) {
            double *h = malloc(sizeof(double) * 70000);
            g[k] = step == 2 && k == 1 ? NULL : random_tensor(dt, shapes[k], h, 1);
            free(h);
        }
        nb_tensor *held = nb_read(all[2]), *held_one = nb_read(one[2]);
        CHECK_OK(nb_optimizer_apply(opt_all, NV, all, g));
        for (int k = 0; k < NV; k++) /* a NULL gradient still counts the step */
            CHECK_OK(nb_optimizer_apply(opt_one[k], 1, &one[k], &g[k]));
        for (int k = 0; k < NV; k++)
            CHECKF(same_bits(nb_read(all[k]), nb_read(one[k])), "%s %s step %d variable %d", kind_name(o->kind),
                   nb_dtype_name(dt), step, k);
        CHECK(same_bits(held, held_one));
        nb_scope_end(s);
    }
    for (int k = 0; k < NV; k++) {
        nb_variable_free(all[k]);
        nb_variable_free(one[k]);
        nb_optimizer_free(opt_one[k]);
    }
    nb_optimizer_free(opt_all);
}

static void test_many_updates(void)
{
    for (size_t i = 0; i < sizeof ref_opts / sizeof *ref_opts; i++) {
        check_many(&ref_opts[i], NB_F32);
        check_many(&ref_opts[i], NB_F64);
    }
}

/* Gradient descent on sum((w - c)^2) reaches c. */
static void test_convergence(void)
{
    double hc[8], hw[8];
    nb_tensor *c = random_tensor(NB_F32, NB_SHAPE(8), hc, 3);
    for (int k = 0; k < 3; k++) {
        nb_variable *w = nb_variable_new("w", random_tensor(NB_F32, NB_SHAPE(8), hw, 1));
        nb_optimizer *opt = k == 0 ? nb_sgd_new(0.1) : k == 1 ? nb_sgd_momentum_new(0.05, 0.9, true)
                                                               : nb_adam_new(0.1, 0.9, 0.999, 1e-8);
        double loss = INFINITY;
        for (int step = 0; step < 400; step++) {
            nb_scope *s = nb_scope_begin();
            nb_tape *tape = nb_tape_begin();
            nb_tensor *l = nb_sum_all(nb_square(nb_sub(nb_read(w), c)));
            nb_tensor *g = NULL;
            CHECK_OK(nb_tape_gradient_vars(tape, l, NB_VARS(w), &g));
            CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w), &g));
            loss = nb_tensor_item(l);
            nb_scope_end(s);
            if (nb_error())
                break;
        }
        CHECK(loss < 1e-6);
        CHECK(check_max_error(nb_read(w), hc, 8) < 1e-3);
        nb_optimizer_free(opt);
        nb_variable_free(w);
    }
}

static void test_null_grads(void)
{
    double ha[4], hb[4], ref[4];
    nb_variable *a = nb_variable_new("a", random_tensor(NB_F64, NB_SHAPE(4), ha, 1));
    nb_variable *b = nb_variable_new("b", random_tensor(NB_F64, NB_SHAPE(4), hb, 1));
    nb_optimizer *opt = nb_adam_new(0.1, 0.9, 0.999, 1e-7);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(a, b), (nb_tensor *const[]){NULL, NULL}));
    CHECK_OK(nb_optimizer_apply(opt, 0, NULL, NULL));
    CHECK(nb_optimizer_iterations(opt) == 2);
    CHECK(values_equal(nb_read(a), ha, 4));
    CHECK(values_equal(nb_read(b), hb, 4));
    /* The first real step is step 3 for bias correction. */
    nb_tensor *g = nb_ones(NB_F64, NB_SHAPE(4));
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(b), &g));
    double m = 0.1, v = 0.001, mh = m / (1 - pow(0.9, 3)), vh = v / (1 - pow(0.999, 3));
    for (int i = 0; i < 4; i++)
        ref[i] = hb[i] - 0.1 * mh / (sqrt(vh) + 1e-7);
    CHECK(check_max_error(nb_read(b), ref, 4) < 1e-12);
    CHECK(values_equal(nb_read(a), ha, 4));
    nb_optimizer_free(opt);
    nb_variable_free(a);
    nb_variable_free(b);
}

static void test_apply_errors(void)
{
    double hw[50], hb[10];
    nb_variable *w = nb_variable_new("dense/w", random_tensor(NB_F32, NB_SHAPE(5, 10), hw, 1));
    nb_variable *b = nb_variable_new("dense/b", random_tensor(NB_F32, NB_SHAPE(10), hb, 1));
    nb_optimizer *opt = nb_sgd_momentum_new(0.1, 0.9, false);
    nb_tensor *gw = nb_ones(NB_F32, NB_SHAPE(5, 10));

    /* The second pair is wrong: nothing is updated, not even the first. */
    CHECK(nb_optimizer_apply(opt, NB_VARS(w, b), (nb_tensor *const[]){gw, nb_ones(NB_F32, NB_SHAPE(5))}) ==
          NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_optimizer_apply: variable 'dense/b' is f32 [10], gradient 1 is f32 [5]");
    CHECK(nb_optimizer_apply(opt, NB_VARS(w, b), (nb_tensor *const[]){gw, nb_ones(NB_F64, NB_SHAPE(10))}) ==
          NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_optimizer_apply", "'dense/b'", "f64 [10]");
    CHECK(nb_optimizer_apply(opt, NB_VARS(w), (nb_tensor *const[]){nb_ones(NB_F32, NB_SHAPE(10, 5))}) ==
          NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "'dense/w'", "[5, 10]", "[10, 5]");
    CHECK(nb_optimizer_apply(opt, 2, (nb_variable *const[]){w, NULL}, (nb_tensor *const[]){gw, gw}) ==
          NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_apply", "variable 1");
    CHECK(nb_optimizer_apply(NULL, NB_VARS(w), &gw) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_apply");
    CHECK(nb_optimizer_apply(opt, -1, NULL, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_apply");
    CHECK(nb_optimizer_iterations(opt) == 0);
    CHECK(values_equal(nb_read(w), hw, 50));
    CHECK(values_equal(nb_read(b), hb, 10));

    /* Integer variables cannot be trained. */
    nb_variable *count = nb_variable_new("count", nb_zeros(NB_I32, NB_SHAPE(3)));
    CHECK(nb_optimizer_apply(opt, NB_VARS(count), (nb_tensor *const[]){nb_ones(NB_I32, NB_SHAPE(3))}) ==
          NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_optimizer_apply", "'count'", "i32");
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(count), (nb_tensor *const[]){NULL})); /* skipped */
    nb_variable_free(count);

    /* Constructor arguments. */
    CHECK(nb_sgd_new(-0.1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_sgd_new", "learning rate");
    CHECK(nb_sgd_new(NAN) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_sgd_new");
    CHECK(nb_sgd_momentum_new(0.1, -0.5, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_sgd_momentum_new", "momentum");
    CHECK(nb_adam_new(0.001, 1.0, 0.999, 1e-7) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_adam_new", "beta1", "[0, 1)");
    CHECK(nb_adam_new(0.001, 0.9, -0.1, 1e-7) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_adam_new", "beta2");
    CHECK(nb_adam_new(-1, 0.9, 0.999, 1e-7) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_adam_new", "learning rate");
    CHECK(nb_adamw_new(0.001, 0.9, 0.999, 1e-7, -0.01) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_adamw_new", "weight decay");
    CHECK(nb_adamw_new(0.001, 0.9, 0.999, -1e-7, 0.01) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_adamw_new", "epsilon");
    nb_optimizer *zero = nb_adam_new(0, 0, 0, 0);
    CHECK(zero != NULL);
    nb_optimizer_free(zero);

    /* Learning rate. */
    CHECK(nb_optimizer_learning_rate(opt) == 0.1);
    CHECK_OK(nb_optimizer_set_learning_rate(opt, 0.25));
    CHECK(nb_optimizer_learning_rate(opt) == 0.25);
    CHECK(nb_optimizer_set_learning_rate(opt, -1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_set_learning_rate");
    CHECK(nb_optimizer_learning_rate(opt) == 0.25);
    CHECK(nb_optimizer_set_learning_rate(NULL, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_optimizer_set_learning_rate");
    /* The new rate is used by the next step. */
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(b), (nb_tensor *const[]){nb_ones(NB_F32, NB_SHAPE(10))}));
    double ref[10];
    for (int i = 0; i < 10; i++)
        ref[i] = hb[i] - 0.25;
    CHECK(check_max_error(nb_read(b), ref, 10) < 1e-6);
    nb_optimizer_free(opt);
    nb_optimizer_free(NULL);
    nb_variable_free(w);
    nb_variable_free(b);
}

/* A variable freed and another created (possibly at the same address) does not
 * inherit the first one's momentum. */
static void test_slots_not_aliased(void)
{
    nb_optimizer *opt = nb_sgd_momentum_new(1.0, 0.5, false);
    nb_tensor *g = nb_ones(NB_F64, NB_SHAPE(3));
    for (int k = 0; k < 4; k++) {
        nb_variable *v = nb_variable_new("v", nb_zeros(NB_F64, NB_SHAPE(3)));
        CHECK_OK(nb_optimizer_apply(opt, NB_VARS(v), &g));
        CHECK(check_max_error(nb_read(v), (double[]){-1, -1, -1}, 3) < 1e-15);
        CHECK_OK(nb_optimizer_apply(opt, NB_VARS(v), &g));
        CHECK(check_max_error(nb_read(v), (double[]){-2.5, -2.5, -2.5}, 3) < 1e-15);
        nb_variable_free(v);
    }
    /* Many variables: the slot table grows and keeps each one's state. */
    enum { NV = 40 };
    nb_variable *vs[NV];
    for (int i = 0; i < NV; i++)
        vs[i] = nb_variable_new("many", nb_full(NB_F64, NB_SHAPE(3), i));
    for (int step = 0; step < 2; step++)
        for (int i = 0; i < NV; i++)
            CHECK_OK(nb_optimizer_apply(opt, 1, &vs[i], &g));
    for (int i = 0; i < NV; i++) {
        CHECK(check_max_error(nb_read(vs[i]), (double[]){i - 2.5, i - 2.5, i - 2.5}, 3) < 1e-15);
        nb_variable_free(vs[i]);
    }
    nb_optimizer_free(opt);
}

/* Gradients given as strided views, and a gradient that is a variable's own read. */
static void test_odd_gradients(void)
{
    double hw[6], hg[6], ref[6];
    nb_variable *w = nb_variable_new("w", random_tensor(NB_F64, NB_SHAPE(3, 2), hw, 1));
    nb_tensor *gt = random_tensor(NB_F64, NB_SHAPE(2, 3), hg, 1);
    nb_tensor *g = nb_transpose(gt, 0, 1);
    CHECK(!nb_tensor_is_contiguous(g));
    nb_optimizer *opt = nb_sgd_new(0.5);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w), &g));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            ref[i * 2 + j] = hw[i * 2 + j] - 0.5 * hg[j * 3 + i];
    CHECK(check_max_error(nb_read(w), ref, 6) < 1e-15);

    /* w -= 0.5 * w, with the gradient being w's own value. */
    nb_tensor *self = nb_read(w);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w), &self));
    for (int i = 0; i < 6; i++)
        ref[i] *= 0.5;
    CHECK(check_max_error(nb_read(w), ref, 6) < 1e-15);
    CHECK(check_max_error(self, (double[]){ref[0] * 2, ref[1] * 2, ref[2] * 2, ref[3] * 2, ref[4] * 2, ref[5] * 2},
                          6) < 1e-15);
    nb_optimizer_free(opt);
    nb_variable_free(w);
}

/* Updates are not recorded: a tape open around apply records nothing from it. */
static void test_not_recorded(void)
{
    double hw[4];
    nb_variable *w = nb_variable_new("w", random_tensor(NB_F64, NB_SHAPE(4), hw, 1));
    nb_optimizer *opt = nb_adam_new(0.1, 0.9, 0.999, 1e-7);
    nb_tape *tape = nb_tape_begin();
    nb_tensor *r = nb_read(w);
    nb_tensor *g = nb_mul_scalar(r, 2);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w), &g));
    CHECK_OK(nb_variable_assign_add(w, g));
    nb_tensor *after = nb_read(w);
    nb_tensor *grad = NULL;
    CHECK_OK(nb_tape_gradient(tape, after, NB_TENSORS(r), &grad));
    CHECK(grad == NULL); /* after does not depend on r through any recorded op */
    nb_optimizer_free(opt);
    nb_variable_free(w);
}

/* Values and gradients on another device are copied to the variable's. */
static void test_devices(void)
{
    if (nb_device_count(NB_DEVICE_CPU) < 2) {
        fprintf(stderr, "[test_devices] one CPU device only; skipped\n");
        return;
    }
    double h[4], hg[4], ref[4];
    CHECK_OK(nb_device_push("/cpu:1"));
    nb_variable *v = nb_variable_new("remote", random_tensor(NB_F32, NB_SHAPE(4), h, 1));
    CHECK_OK(nb_device_pop());
    CHECK(strcmp(nb_variable_device(v), "/cpu:1") == 0);
    nb_tensor *g = random_tensor(NB_F32, NB_SHAPE(4), hg, 1); /* on /cpu:0 */
    CHECK_OK(nb_variable_assign_add(v, g));
    nb_optimizer *opt = nb_sgd_momentum_new(0.5, 0.9, false);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(v), &g));
    nb_tensor *r = nb_read(v);
    CHECK(strcmp(nb_tensor_device(r), "/cpu:1") == 0);
    for (int i = 0; i < 4; i++)
        ref[i] = h[i] + hg[i] - 0.5 * hg[i];
    CHECK(check_max_error(r, ref, 4) < 1e-6);
    CHECK(strcmp(nb_variable_device(v), "/cpu:1") == 0);
    nb_optimizer_free(opt);
    nb_variable_free(v);
}

/* The same on a GPU, when there is one: variables, slots and updates on the GPU,
 * and gradients that come from the CPU. */
static void test_gpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        fprintf(stderr, "[test_gpu] no GPU; skipped\n");
        return;
    }
    CHECK_OK(nb_device_push("/gpu:0"));
    test_read_snapshot();
    test_copy_on_write();
    test_odd_gradients();
    test_many_updates();
    for (size_t i = 0; i < sizeof ref_opts / sizeof *ref_opts; i++) {
        check_optimizer(&ref_opts[i], NB_F64, 1e-12);
        check_optimizer(&ref_opts[i], NB_F32, 2e-5);
    }
    double h[4], hg[4], ref[4];
    nb_variable *v = nb_variable_new("gpu", random_tensor(NB_F32, NB_SHAPE(4), h, 1));
    CHECK_OK(nb_device_pop());
    CHECK(strncmp(nb_variable_device(v), "/gpu:", 5) == 0);
    nb_tensor *g = random_tensor(NB_F32, NB_SHAPE(4), hg, 1); /* on /cpu:0 */
    nb_optimizer *opt = nb_adam_new(0.1, 0.9, 0.999, 1e-3);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(v), &g));
    CHECK_OK(nb_variable_assign_sub(v, g));
    for (int i = 0; i < 4; i++) {
        double m = 0.1 * hg[i], vv = 0.001 * hg[i] * hg[i];
        ref[i] = h[i] - 0.1 * (m / 0.1) / (sqrt(vv / 0.001) + 1e-3) - hg[i];
    }
    CHECK(check_max_error(nb_read(v), ref, 4) < 1e-5);
    nb_optimizer_free(opt);
    nb_variable_free(v);
}

/* The loss scaler: gradients of the scaled loss come back unscaled to the
 * update (an exact power of two: the same bits as an unscaled step); an
 * infinity or NaN skips the step, leaving variables, slots and the step count
 * alone, and halves the scale; growth_interval applied steps double it; the
 * bounds hold; bad arguments. */
static void test_loss_scaler(void)
{
    nb_variable *w = nb_variable_new("ls/w", nb_from_buffer(NB_F32, NB_SHAPE(3), (float[]){1, 2, 3}));
    nb_variable *ref = nb_variable_new("ls/ref", nb_from_buffer(NB_F32, NB_SHAPE(3), (float[]){1, 2, 3}));
    nb_optimizer *opt = nb_adam_new(0.1, 0.9, 0.999, 1e-7), *opt_ref = nb_adam_new(0.1, 0.9, 0.999, 1e-7);
    nb_loss_scaler *ls = nb_loss_scaler_new(1024, 2, 0.5, 3);
    CHECK(ls && nb_loss_scaler_get_scale(ls) == 1024);
    const float xs[6][3] = {{0.5f, -1, 2}, {1, 1, 1}, {INFINITY, 0, 1}, {0.25f, 3, -2}, {NAN, 1, 1}, {1, -1, 0.5f}};
    const double scales_after[6] = {1024, 1024, 512, 512, 256, 256};
    const bool applied[6] = {true, true, false, true, false, true};
    for (int k = 0; k < 6; k++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *x = nb_from_buffer(NB_F32, NB_SHAPE(3), xs[k]);
        nb_tape *tape = nb_tape_begin();
        nb_tensor *loss = nb_sum_all(nb_mul(nb_read(w), x)), *g;
        CHECK_OK(nb_tape_gradient_vars(tape, nb_loss_scaler_scale(ls, loss), 1, &w, &g));
        CHECK(nb_tensor_get(g, 1) == xs[k][1] * nb_loss_scaler_get_scale(ls));
        bool stepped = !applied[k];
        CHECK_OK(nb_loss_scaler_step(ls, opt, 1, &w, &g, &stepped));
        CHECKF(stepped == applied[k] && nb_loss_scaler_get_scale(ls) == scales_after[k],
               "step %d: applied %d, scale %g", k, stepped, nb_loss_scaler_get_scale(ls));
        if (applied[k]) { /* the same update as without scaling */
            nb_tensor *tape_x = nb_from_buffer(NB_F32, NB_SHAPE(3), xs[k]);
            CHECK_OK(nb_optimizer_apply(opt_ref, 1, &ref, &tape_x));
        }
        CHECK(same_bits(nb_read(w), nb_read(ref)));
        nb_scope_end(s);
    }
    CHECK(nb_loss_scaler_skipped(ls) == 2 && nb_optimizer_iterations(opt) == 4);
    /* three applied steps in a row double the scale: one so far, two more */
    nb_scope *s = nb_scope_begin();
    for (int k = 0; k < 3; k++) {
        nb_tensor *g = nb_mul_scalar(nb_ones(NB_F32, NB_SHAPE(3)), nb_loss_scaler_get_scale(ls));
        CHECK_OK(nb_loss_scaler_step(ls, opt, 1, &w, &g, NULL));
    }
    CHECK(nb_loss_scaler_get_scale(ls) == 512 && nb_loss_scaler_good_steps(ls) == 1);
    /* NULL gradients are skipped; none at all is a step */
    nb_tensor *none = NULL;
    bool stepped = false;
    CHECK_OK(nb_loss_scaler_step(ls, opt, 1, &w, &none, &stepped));
    CHECK(stepped && nb_loss_scaler_good_steps(ls) == 2);
    nb_scope_end(s);
    /* the bounds */
    CHECK_OK(nb_loss_scaler_set_state(ls, 0x1p64, 2));
    s = nb_scope_begin();
    nb_tensor *one = nb_ones(NB_F32, NB_SHAPE(3));
    CHECK_OK(nb_loss_scaler_step(ls, opt, 1, &w, &one, NULL));
    CHECK(nb_loss_scaler_get_scale(ls) == 0x1p64);
    CHECK_OK(nb_loss_scaler_set_state(ls, 0x1p-64, 0));
    nb_tensor *inf = nb_full(NB_F32, NB_SHAPE(3), INFINITY);
    CHECK_OK(nb_loss_scaler_step(ls, opt, 1, &w, &inf, NULL));
    CHECK(nb_loss_scaler_get_scale(ls) == 0x1p-64);
    /* a gradient of the wrong shape: the update's error, the scale unchanged */
    nb_tensor *bad = nb_ones(NB_F32, NB_SHAPE(4));
    CHECK(nb_loss_scaler_step(ls, opt, 1, &w, &bad, NULL) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE);
    CHECK(nb_loss_scaler_get_scale(ls) == 0x1p-64);
    nb_scope_end(s);
    /* bad arguments */
    CHECK(nb_loss_scaler_new(0, 2, 0.5, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new", "initial scale 0");
    CHECK(nb_loss_scaler_new(NAN, 2, 0.5, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new");
    CHECK(nb_loss_scaler_new(8, 1, 0.5, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new", "growth 1");
    CHECK(nb_loss_scaler_new(8, 2, 1, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new", "backoff 1");
    CHECK(nb_loss_scaler_new(8, 2, 0.5, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new", "interval 0");
    CHECK(nb_loss_scaler_new(8, 2, 0.5, ((int64_t)1 << 53) + 1) == NULL); /* counted in doubles on a device */
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_new", "interval 9007199254740993", "2^53");
    CHECK(nb_loss_scaler_step(NULL, opt, 1, &w, &one, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_step", "scaler is NULL");
    CHECK(nb_loss_scaler_step(ls, NULL, 1, &w, &one, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_step", "optimizer is NULL");
    CHECK(nb_loss_scaler_scale(ls, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_scale", "loss is NULL");
    CHECK(nb_loss_scaler_set_state(ls, 0, 0) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_loss_scaler_set_state");
    CHECK(nb_loss_scaler_get_scale(NULL) == 0 && nb_loss_scaler_skipped(NULL) == 0);
    nb_loss_scaler_free(NULL);
    nb_loss_scaler_free(ls);
    nb_optimizer_free(opt);
    nb_optimizer_free(opt_ref);
    nb_variable_free(w);
    nb_variable_free(ref);
}

int main(void)
{
    CHECK_OK(nb_set_logical_cpu_devices(2));
    RUN(test_variable_new);
    RUN(test_read_snapshot);
    RUN(test_copy_on_write);
    RUN(test_assign_errors);
    RUN(test_gradient_through_read);
    RUN(test_optimizers_f64);
    RUN(test_optimizers_f32);
    RUN(test_many_updates);
    RUN(test_convergence);
    RUN(test_null_grads);
    RUN(test_apply_errors);
    RUN(test_loss_scaler);
    RUN(test_slots_not_aliased);
    RUN(test_odd_gradients);
    RUN(test_not_recorded);
    RUN(test_devices);
    RUN(test_gpu);
    return check_finish();
}
