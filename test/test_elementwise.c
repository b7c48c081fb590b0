/* Elementwise ops: values against plain C references on random inputs (broadcast,
 * strided, 0-d, f32 and f64, integers), gradients by the gradient checker in f64,
 * comparisons and where, the promised errors, a large (threaded) case and a second
 * derivative through nested tapes. */
#include "check.h"

/* ---- shape helpers -------------------------------------------------------------- */

static nb_shape bshape(nb_shape a, nb_shape b)
{
    nb_shape o = {a.ndim > b.ndim ? a.ndim : b.ndim, {0}};
    for (int i = 0; i < o.ndim; i++) {
        int ia = i - (o.ndim - a.ndim), ib = i - (o.ndim - b.ndim);
        int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
        o.dims[i] = da == 1 ? db : da;
    }
    return o;
}


/* Flat index into an input of shape in for the output element flat of shape out. */
static int64_t bidx(nb_shape out, int64_t flat, nb_shape in)
{
    int64_t idx = 0, mul = 1;
    for (int d = out.ndim - 1; d >= 0; d--) {
        int64_t i = flat % out.dims[d];
        flat /= out.dims[d];
        int di = d - (out.ndim - in.ndim);
        if (di >= 0) {
            if (in.dims[di] != 1)
                idx += i * mul;
            mul *= in.dims[di];
        }
    }
    return idx;
}


/* A random tensor of shape s; domain 1 = positive [0.5, 2], 2 = [-2, 2], else normal. */
static nb_tensor *rnd(nb_dtype dt, nb_shape s, int domain, uint64_t seed)
{
    if (domain == 1)
        return nb_random_uniform(dt, s, 0.5, 2.0, seed);
    if (domain == 2)
        return nb_random_uniform(dt, s, -2.0, 2.0, seed);
    return nb_random_normal(dt, s, 0.0, 1.0, seed);
}

/* A tensor of logical shape s built as a transposed view (dims 0 and ndim-1
 * swapped) of a random contiguous tensor: strided input. */
static nb_tensor *rnd_strided(nb_dtype dt, nb_shape s, int domain, uint64_t seed)
{
    nb_shape t = s;
    t.dims[0] = s.dims[s.ndim - 1];
    t.dims[s.ndim - 1] = s.dims[0];
    nb_tensor *x = nb_transpose(rnd(dt, t, domain, seed), 0, s.ndim - 1);
    CHECK(x && !nb_tensor_is_contiguous(x));
    return x;
}

/* ---- binary ops ---------------------------------------------------------------- */

typedef struct binop {
    const char *name;
    nb_tensor *(*op)(const nb_tensor *, const nb_tensor *);
    double (*ref)(double, double);
    int dom_a, dom_b;
} binop;

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_pow(double a, double b) { return pow(a, b); }
static double r_max(double a, double b) { return a > b ? a : b; }
static double r_min(double a, double b) { return a < b ? a : b; }

static const binop binops[] = {
    {"add", nb_add, r_add, 0, 0},
    {"sub", nb_sub, r_sub, 0, 0},
    {"mul", nb_mul, r_mul, 0, 0},
    {"div", nb_div, r_div, 0, 1},
    {"pow", nb_pow, r_pow, 1, 2},
    {"maximum", nb_maximum, r_max, 0, 0},
    {"minimum", nb_minimum, r_min, 0, 0},
};
#define N_BINOPS (int)(sizeof binops / sizeof *binops)

static double binary_error(const binop *op, const nb_tensor *a, const nb_tensor *b)
{
    nb_shape sa = nb_tensor_shape(a), sb = nb_tensor_shape(b), so = bshape(sa, sb);
    nb_tensor *y = op->op(a, b);
    if (!has_shape(y, so)) {
        fprintf(stderr, "[%s] %s: wrong result shape\n", check_current, op->name);
        return INFINITY;
    }
    if (nb_tensor_dtype(y) != nb_tensor_dtype(a))
        return INFINITY;
    double *va = check_values(a), *vb = check_values(b);
    int64_t n = numel_of(so);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        ref[i] = op->ref(va[bidx(so, i, sa)], vb[bidx(so, i, sb)]);
    double e = check_max_error(y, ref, n);
    free(va);
    free(vb);
    free(ref);
    return e;
}

static void test_binary_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    const nb_shape pairs[][2] = {
        {NB_SHAPE(4, 5), NB_SHAPE(4, 5)},
        {NB_SHAPE(3, 1, 4), NB_SHAPE(2, 1)},
        {NB_SHAPE(2, 1), NB_SHAPE(3, 1, 4)},
        {NB_SCALAR, NB_SHAPE(5, 3)},
        {NB_SHAPE(5, 3), NB_SCALAR},
        {NB_SCALAR, NB_SCALAR},
        {NB_SHAPE(6), NB_SHAPE(2, 3, 6)},
        {NB_SHAPE(2, 1, 3, 1), NB_SHAPE(1, 4, 1, 5)},
    };
    uint64_t seed = 100;
    for (int o = 0; o < N_BINOPS; o++) {
        const binop *op = &binops[o];
        for (int d = 0; d < 2; d++) {
            for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
                nb_tensor *a = rnd(dts[d], pairs[p][0], op->dom_a, seed++);
                nb_tensor *b = rnd(dts[d], pairs[p][1], op->dom_b, seed++);
                double e = binary_error(op, a, b);
                if (!(e <= value_tol(dts[d])))
                    fprintf(stderr, "[%s] %s %s pair %zu: error %g\n", check_current, op->name,
                            nb_dtype_name(dts[d]), p, e);
                CHECK(e <= value_tol(dts[d]));
            }
            /* strided: transposed views, alone and against contiguous / broadcast */
            nb_tensor *at = rnd_strided(dts[d], NB_SHAPE(4, 6), op->dom_a, seed++);
            nb_tensor *bt = rnd_strided(dts[d], NB_SHAPE(4, 6), op->dom_b, seed++);
            nb_tensor *bc = rnd(dts[d], NB_SHAPE(4, 6), op->dom_b, seed++);
            nb_tensor *b1 = rnd(dts[d], NB_SHAPE(6), op->dom_b, seed++);
            nb_tensor *a3 = rnd_strided(dts[d], NB_SHAPE(5, 2, 3), op->dom_a, seed++);
            nb_tensor *b3 = rnd(dts[d], NB_SHAPE(2, 1), op->dom_b, seed++);
            double e1 = binary_error(op, at, bt), e2 = binary_error(op, at, bc), e3 = binary_error(op, at, b1),
                   e4 = binary_error(op, a3, b3);
            CHECK(e1 <= value_tol(dts[d]));
            CHECK(e2 <= value_tol(dts[d]));
            CHECK(e3 <= value_tol(dts[d]));
            CHECK(e4 <= value_tol(dts[d]));
        }
    }
}

/* The transposed view reads back in logical order (checks the test's own helper). */
static void test_strided_readback(void)
{
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 4), 0, 1, 7);
    nb_tensor *t = nb_transpose(x, 0, 1);
    double *vx = check_values(x), *vt = check_values(t);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            CHECK(vt[i * 3 + j] == vx[j * 4 + i]);
    free(vx);
    free(vt);
}

static nb_tensor *gc_binary(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const binop *op = user;
    return op->op(in[0], in[1]);
}

static nb_tensor *gc_binary_strided(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const binop *op = user;
    return op->op(nb_transpose(in[0], 0, 1), in[1]);
}

static void test_binary_gradients(void)
{
    const nb_shape pairs[][2] = {
        {NB_SHAPE(3, 4), NB_SHAPE(3, 4)},
        {NB_SHAPE(3, 1, 4), NB_SHAPE(2, 1)},
        {NB_SCALAR, NB_SHAPE(5, 3)},
        {NB_SHAPE(5, 3), NB_SCALAR},
        {NB_SHAPE(4), NB_SHAPE(2, 3, 4)},
    };
    uint64_t seed = 500;
    for (int o = 0; o < N_BINOPS; o++) {
        const binop *op = &binops[o];
        for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
            nb_tensor *a = rnd(NB_F64, pairs[p][0], op->dom_a, seed++);
            nb_tensor *b = rnd(NB_F64, pairs[p][1], op->dom_b, seed++);
            double err = -1;
            nb_status st = nb_gradient_check(gc_binary, (void *)op, NB_TENSORS(a, b), GC_EPS, GC_TOL, &err);
            if (st)
                fprintf(stderr, "[%s] %s pair %zu: %s (max error %g)\n", check_current, op->name, p,
                        nb_error_message(), err);
            CHECK_OK(st);
        }
        /* a strided first operand (transposed inside fn) against a broadcast second */
        nb_tensor *a = rnd(NB_F64, NB_SHAPE(4, 3), op->dom_a, seed++);
        nb_tensor *b = rnd(NB_F64, NB_SHAPE(4), op->dom_b, seed++);
        CHECK_GRADIENT(gc_binary_strided, (void *)op, NB_TENSORS(a, b));
    }
}

/* maximum / minimum split a tied gradient in half between a and b (as
 * PyTorch does); where either is NaN the gradient goes to b. */
static void test_maximum_ties(void)
{
    const double av[5] = {1, 2, 3, 4, NAN}, bv[5] = {1, 5, 3, 0, 2};
    nb_tensor *a = nb_from_buffer(NB_F64, NB_SHAPE(5), av);
    nb_tensor *b = nb_from_buffer(NB_F64, NB_SHAPE(5), bv);
    for (int m = 0; m < 2; m++) {
        nb_tape *tape = nb_tape_begin();
        CHECK_OK(nb_tape_watch(tape, a));
        CHECK_OK(nb_tape_watch(tape, b));
        nb_tensor *y = m ? nb_minimum(a, b) : nb_maximum(a, b);
        nb_tensor *g[2] = {NULL, NULL};
        CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(a, b), g));
        CHECK(g[0] && g[1]);
        if (!g[0] || !g[1])
            continue;
        const double ga_max[5] = {0.5, 0, 0.5, 1, 0}, gb_max[5] = {0.5, 1, 0.5, 0, 1};
        const double ga_min[5] = {0.5, 1, 0.5, 0, 0}, gb_min[5] = {0.5, 0, 0.5, 1, 1};
        CHECK(check_max_error(g[0], m ? ga_min : ga_max, 5) == 0);
        CHECK(check_max_error(g[1], m ? gb_min : gb_max, 5) == 0);
        CHECK(isnan(nb_tensor_get(y, 4))); /* the value propagates NaN either way */
    }
}

/* ---- integers -------------------------------------------------------------------- */

static void test_integer_binary(void)
{
    const int32_t a32[6] = {1, -2, 3, 40000, -5, 6}, b32[3] = {7, -8, 9};
    const int64_t a64[6] = {3000000000LL, -2, 3, 4, -5000000000LL, 6}, b64[3] = {7, -8, 3};
    nb_tensor *a[2] = {nb_from_buffer(NB_I32, NB_SHAPE(2, 3), a32), nb_from_buffer(NB_I64, NB_SHAPE(2, 3), a64)};
    nb_tensor *b[2] = {nb_from_buffer(NB_I32, NB_SHAPE(3), b32), nb_from_buffer(NB_I64, NB_SHAPE(3), b64)};
    for (int d = 0; d < 2; d++) {
        nb_tensor *ys[3] = {nb_add(a[d], b[d]), nb_sub(a[d], b[d]), nb_mul(a[d], b[d])};
        for (int k = 0; k < 3; k++) {
            CHECK(ys[k] && nb_tensor_dtype(ys[k]) == (d ? NB_I64 : NB_I32));
            CHECK(has_shape(ys[k], NB_SHAPE(2, 3)));
            double ref[6];
            for (int i = 0; i < 6; i++) {
                double x = d ? (double)a64[i] : a32[i], z = d ? (double)b64[i % 3] : b32[i % 3];
                ref[i] = k == 0 ? x + z : k == 1 ? x - z : x * z;
            }
            CHECK(check_max_error(ys[k], ref, 6) == 0);
        }
        /* scalar-operand forms and the integer unary ops */
        nb_tensor *s = nb_add_scalar(a[d], 3), *m = nb_mul_scalar(a[d], -2), *ng = nb_neg(a[d]);
        nb_tensor *ab = nb_abs(a[d]), *sq = nb_square(b[d]), *rl = nb_relu(a[d]), *sg = nb_sign(a[d]);
        double rs[6], rm[6], rn[6], ra[6], rr[6], rg[6], rq[3];
        for (int i = 0; i < 6; i++) {
            double x = d ? (double)a64[i] : a32[i];
            rs[i] = x + 3, rm[i] = -2 * x, rn[i] = -x, ra[i] = fabs(x), rr[i] = x > 0 ? x : 0;
            rg[i] = x > 0 ? 1 : x < 0 ? -1 : 0;
        }
        for (int i = 0; i < 3; i++) {
            double z = d ? (double)b64[i] : b32[i];
            rq[i] = z * z;
        }
        CHECK(s && nb_tensor_dtype(s) == nb_tensor_dtype(a[d]));
        CHECK(check_max_error(s, rs, 6) == 0);
        CHECK(check_max_error(m, rm, 6) == 0);
        CHECK(check_max_error(ng, rn, 6) == 0);
        CHECK(check_max_error(ab, ra, 6) == 0);
        CHECK(check_max_error(sq, rq, 3) == 0);
        CHECK(check_max_error(rl, rr, 6) == 0);
        CHECK(check_max_error(sg, rg, 6) == 0);
    }
    /* integer division truncates toward zero like C */
    const int32_t n32[4] = {7, -7, 9, 100}, d32[4] = {2, 2, -4, 7};
    nb_tensor *q = nb_div(nb_from_buffer(NB_I32, NB_SHAPE(4), n32), nb_from_buffer(NB_I32, NB_SHAPE(4), d32));
    const double rq[4] = {3, -3, -2, 14};
    CHECK(q && nb_tensor_dtype(q) == NB_I32);
    CHECK(check_max_error(q, rq, 4) == 0);
    /* an integer quotient by zero is refused (broadcast divisors too); a float one is inf */
    const int64_t n64[3] = {5, 0, -5}, d64[3] = {1, 0, 0};
    nb_tensor *nn = nb_from_buffer(NB_I64, NB_SHAPE(3), n64);
    CHECK(nb_div(nn, nb_from_buffer(NB_I64, NB_SHAPE(3), d64)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "div", "division by zero", "2 of", "i64 [3]");
    CHECK(nb_div(nn, nb_scalar(NB_I64, 0)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "div", "division by zero", "i64 []");
    CHECK(nb_div(nn, nb_zeros(NB_I64, NB_SHAPE(0))) == NULL); /* shapes, not zeros, are wrong here */
    CHECK_ERROR(NB_ERR_SHAPE, "div");
    CHECK(nb_tensor_get(nb_div(nb_scalar(NB_F32, 1), nb_scalar(NB_F32, 0)), 0) == INFINITY);
    /* floating-only ops refuse integers */
    CHECK(nb_pow(a[0], a[0]) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "pow", "i32");
    CHECK(nb_exp(a[1]) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "exp", "i64");
}

/* ---- unary ops ------------------------------------------------------------------- */

typedef struct unop {
    const char *name;
    nb_tensor *(*op)(const nb_tensor *);
    double (*ref)(double);
    int domain;
} unop;

static nb_tensor *w_leaky(const nb_tensor *x) { return nb_leaky_relu(x, 0.1); }
static nb_tensor *w_add_scalar(const nb_tensor *x) { return nb_add_scalar(x, 2.5); }
static nb_tensor *w_mul_scalar(const nb_tensor *x) { return nb_mul_scalar(x, -1.75); }
static nb_tensor *w_pow_scalar(const nb_tensor *x) { return nb_pow_scalar(x, 2.7); }
static nb_tensor *w_pow_scalar_neg(const nb_tensor *x) { return nb_pow_scalar(x, -1.5); }

static double r_neg(double x) { return -x; }
static double r_abs(double x) { return fabs(x); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_square(double x) { return x * x; }
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0; }
static double r_leaky(double x) { return x > 0 ? x : 0.1 * x; }
static double r_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double r_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double r_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }
static double r_add_scalar(double x) { return x + 2.5; }
static double r_mul_scalar(double x) { return x * -1.75; }
static double r_pow_scalar(double x) { return pow(x, 2.7); }
static double r_pow_scalar_neg(double x) { return pow(x, -1.5); }

static const unop unops[] = {
    {"neg", nb_neg, r_neg, 0},
    {"abs", nb_abs, r_abs, 0},
    {"exp", nb_exp, exp, 2},
    {"log", nb_log, log, 1},
    {"sqrt", nb_sqrt, sqrt, 1},
    {"rsqrt", nb_rsqrt, r_rsqrt, 1},
    {"square", nb_square, r_square, 0},
    {"sin", nb_sin, sin, 2},
    {"cos", nb_cos, cos, 2},
    {"tanh", nb_tanh, tanh, 0},
    {"erf", nb_erf, erf, 0},
    {"sigmoid", nb_sigmoid, r_sigmoid, 0},
    {"relu", nb_relu, r_relu, 0},
    {"leaky_relu", w_leaky, r_leaky, 0},
    {"gelu", nb_gelu, r_gelu, 0},
    {"softplus", nb_softplus, r_softplus, 0},
    {"sign", nb_sign, r_sign, 0},
    {"add_scalar", w_add_scalar, r_add_scalar, 0},
    {"mul_scalar", w_mul_scalar, r_mul_scalar, 0},
    {"pow_scalar", w_pow_scalar, r_pow_scalar, 1},
    {"pow_scalar(-1.5)", w_pow_scalar_neg, r_pow_scalar_neg, 1},
};
#define N_UNOPS (int)(sizeof unops / sizeof *unops)

static double unary_error(const unop *op, const nb_tensor *x)
{
    nb_tensor *y = op->op(x);
    if (!has_shape(y, nb_tensor_shape(x)) || nb_tensor_dtype(y) != nb_tensor_dtype(x))
        return INFINITY;
    int64_t n = nb_tensor_numel(x);
    double *v = check_values(x);
    for (int64_t i = 0; i < n; i++)
        v[i] = op->ref(v[i]);
    double e = check_max_error(y, v, n);
    free(v);
    return e;
}

static void test_unary_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    uint64_t seed = 1000;
    for (int o = 0; o < N_UNOPS; o++) {
        const unop *op = &unops[o];
        for (int d = 0; d < 2; d++) {
            nb_tensor *xs[4] = {
                rnd(dts[d], NB_SHAPE(7, 5), op->domain, seed + 0),
                rnd_strided(dts[d], NB_SHAPE(7, 5), op->domain, seed + 1),
                rnd(dts[d], NB_SCALAR, op->domain, seed + 2),
                rnd_strided(dts[d], NB_SHAPE(3, 2, 4), op->domain, seed + 3),
            };
            seed += 4;
            for (int k = 0; k < 4; k++) {
                double e = unary_error(op, xs[k]);
                if (!(e <= value_tol(dts[d])))
                    fprintf(stderr, "[%s] %s %s case %d: error %g\n", check_current, op->name,
                            nb_dtype_name(dts[d]), k, e);
                CHECK(e <= value_tol(dts[d]));
            }
        }
    }
    /* extremes stay finite and right: sigmoid, softplus, tanh at +-50 */
    const double big[4] = {-50, 50, -700, 700};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(4), big);
    double rsig[4], rsp[4], rth[4];
    for (int i = 0; i < 4; i++)
        rsig[i] = r_sigmoid(big[i]), rsp[i] = r_softplus(big[i]), rth[i] = tanh(big[i]);
    CHECK(check_max_error(nb_sigmoid(x), rsig, 4) <= TOL64);
    CHECK(check_max_error(nb_softplus(x), rsp, 4) <= TOL64);
    CHECK(check_max_error(nb_tanh(x), rth, 4) <= TOL64);
}

static nb_tensor *gc_unary(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    return ((const unop *)user)->op(in[0]);
}

static nb_tensor *gc_unary_strided(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    return ((const unop *)user)->op(nb_transpose(in[0], 0, 1));
}

static void test_unary_gradients(void)
{
    uint64_t seed = 2000;
    for (int o = 0; o < N_UNOPS; o++) {
        const unop *op = &unops[o];
        nb_tensor *x = rnd(NB_F64, NB_SHAPE(3, 4), op->domain, seed++);
        nb_tensor *x0 = rnd(NB_F64, NB_SCALAR, op->domain, seed++);
        nb_tensor *xt = rnd(NB_F64, NB_SHAPE(4, 2), op->domain, seed++);
        double err = -1;
        nb_status st = nb_gradient_check(gc_unary, (void *)op, NB_TENSORS(x), GC_EPS, GC_TOL, &err);
        if (st)
            fprintf(stderr, "[%s] %s: %s\n", check_current, op->name, nb_error_message());
        CHECK_OK(st);
        CHECK(err >= 0 && err <= GC_TOL);
        CHECK_OK(nb_gradient_check(gc_unary, (void *)op, NB_TENSORS(x0), GC_EPS, GC_TOL, NULL));
        CHECK_OK(nb_gradient_check(gc_unary_strided, (void *)op, NB_TENSORS(xt), GC_EPS, GC_TOL, NULL));
    }
}

/* ---- comparisons and where -------------------------------------------------------- */

typedef struct cmpop {
    const char *name;
    nb_tensor *(*op)(const nb_tensor *, const nb_tensor *);
    int (*ref)(double, double);
} cmpop;

static int c_eq(double a, double b) { return a == b; }
static int c_ne(double a, double b) { return a != b; }
static int c_lt(double a, double b) { return a < b; }
static int c_le(double a, double b) { return a <= b; }
static int c_gt(double a, double b) { return a > b; }
static int c_ge(double a, double b) { return a >= b; }

static const cmpop cmpops[] = {
    {"equal", nb_equal, c_eq},      {"not_equal", nb_not_equal, c_ne}, {"less", nb_less, c_lt},
    {"less_equal", nb_less_equal, c_le}, {"greater", nb_greater, c_gt}, {"greater_equal", nb_greater_equal, c_ge},
};

/* Small-integer valued data so that ties occur, in any dtype. */
static nb_tensor *small_ints(nb_dtype dt, nb_shape s, unsigned seed)
{
    int64_t n = numel_of(s);
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (double)((seed >> 16) % 3) - 1.0;
    }
    nb_tensor *d = nb_from_buffer(NB_F64, s, v);
    free(v);
    return nb_cast(d, dt);
}

static void test_comparisons(void)
{
    const nb_dtype dts[4] = {NB_F32, NB_F64, NB_I32, NB_I64};
    const nb_shape pairs[][2] = {
        {NB_SHAPE(4, 5), NB_SHAPE(4, 5)},
        {NB_SHAPE(3, 1, 4), NB_SHAPE(2, 1)},
        {NB_SCALAR, NB_SHAPE(5, 3)},
    };
    unsigned seed = 11;
    for (size_t o = 0; o < sizeof cmpops / sizeof *cmpops; o++) {
        for (int d = 0; d < 4; d++) {
            for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
                nb_tensor *a = small_ints(dts[d], pairs[p][0], seed++);
                nb_tensor *b = small_ints(dts[d], pairs[p][1], seed++);
                nb_shape so = bshape(pairs[p][0], pairs[p][1]);
                nb_tensor *y = cmpops[o].op(a, b);
                CHECK(y && nb_tensor_dtype(y) == NB_BOOL && has_shape(y, so));
                double *va = check_values(a), *vb = check_values(b);
                int64_t n = numel_of(so);
                double *ref = malloc(sizeof(double) * (size_t)n);
                for (int64_t i = 0; i < n; i++)
                    ref[i] = cmpops[o].ref(va[bidx(so, i, pairs[p][0])], vb[bidx(so, i, pairs[p][1])]);
                CHECK(check_max_error(y, ref, n) == 0);
                free(va);
                free(vb);
                free(ref);
            }
        }
        /* random floats, one a strided view */
        nb_tensor *a = rnd_strided(NB_F32, NB_SHAPE(6, 5), 0, seed++), *b = rnd(NB_F32, NB_SHAPE(5), 0, seed++);
        nb_tensor *y = cmpops[o].op(a, b);
        double *va = check_values(a), *vb = check_values(b), ref[30];
        for (int i = 0; i < 30; i++)
            ref[i] = cmpops[o].ref(va[i], vb[i % 5]);
        CHECK(check_max_error(y, ref, 30) == 0);
        free(va);
        free(vb);
    }
}

static void test_where_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *src = rnd(dts[d], NB_SHAPE(3, 1, 4), 0, 300 + d);
        nb_tensor *cond = nb_greater(src, nb_scalar(dts[d], 0.0));
        nb_tensor *a = rnd(dts[d], NB_SHAPE(2, 1), 0, 310 + d);
        nb_tensor *b = rnd(dts[d], NB_SHAPE(4), 0, 320 + d);
        nb_tensor *y = nb_where(cond, a, b);
        nb_shape so = NB_SHAPE(3, 2, 4);
        CHECK(has_shape(y, so) && nb_tensor_dtype(y) == dts[d]);
        double *vs = check_values(src), *va = check_values(a), *vb = check_values(b), ref[24];
        for (int i = 0; i < 24; i++)
            ref[i] = vs[bidx(so, i, NB_SHAPE(3, 1, 4))] > 0 ? va[bidx(so, i, NB_SHAPE(2, 1))]
                                                             : vb[bidx(so, i, NB_SHAPE(4))];
        CHECK(check_max_error(y, ref, 24) == 0);
        free(vs);
        free(va);
        free(vb);
        /* 0-d branches, strided condition */
        nb_tensor *c2 = nb_less(rnd_strided(dts[d], NB_SHAPE(5, 3), 0, 330 + d), nb_scalar(dts[d], 0.0));
        nb_tensor *y2 = nb_where(c2, nb_scalar(dts[d], 2.0), nb_scalar(dts[d], -3.0));
        CHECK(has_shape(y2, NB_SHAPE(5, 3)));
        double *vc = check_values(c2), r2[15];
        for (int i = 0; i < 15; i++)
            r2[i] = vc[i] ? 2.0 : -3.0;
        CHECK(check_max_error(y2, r2, 15) == 0);
        free(vc);
    }
    /* the condition must be bool */
    nb_tensor *f = nb_ones(NB_F32, NB_SHAPE(2));
    CHECK(nb_where(f, f, f) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "where", "f32");
}

static nb_tensor *gc_where(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    return nb_where((const nb_tensor *)user, in[0], in[1]);
}

static void test_where_gradient(void)
{
    nb_tensor *cond = nb_greater(rnd(NB_F64, NB_SHAPE(3, 1, 4), 0, 400), nb_scalar(NB_F64, 0.0));
    nb_tensor *a = rnd(NB_F64, NB_SHAPE(2, 1), 0, 401);
    nb_tensor *b = rnd(NB_F64, NB_SHAPE(4), 0, 402);
    CHECK_GRADIENT(gc_where, cond, NB_TENSORS(a, b));

    /* Exact: with a, b full-shape, grad_a = cond, grad_b = !cond; cond cannot be
     * watched and gets no gradient. */
    nb_tensor *a2 = rnd(NB_F64, NB_SHAPE(3, 4), 0, 403), *b2 = rnd(NB_F64, NB_SHAPE(3, 4), 0, 404);
    nb_tensor *c2 = nb_greater(a2, b2);
    nb_tape *tape = nb_tape_begin_persistent();
    CHECK(nb_tape_watch(tape, c2) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "bool");
    CHECK_OK(nb_tape_watch(tape, a2));
    CHECK_OK(nb_tape_watch(tape, b2));
    nb_tensor *y = nb_where(c2, a2, b2);
    nb_tensor *g[3] = {NULL, NULL, NULL};
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(a2, b2, c2), g));
    CHECK(g[0] && g[1] && g[2] == NULL);
    if (g[0] && g[1]) {
        double *vc = check_values(c2), ra[12], rb[12];
        for (int i = 0; i < 12; i++)
            ra[i] = vc[i], rb[i] = 1 - vc[i];
        CHECK(check_max_error(g[0], ra, 12) == 0);
        CHECK(check_max_error(g[1], rb, 12) == 0);
        free(vc);
    }
    nb_tape_free(tape);
}

/* ---- errors -------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *a = nb_random_normal(NB_F32, NB_SHAPE(2, 3), 0, 1, 1);
    nb_tensor *b = nb_random_normal(NB_F32, NB_SHAPE(4), 0, 1, 2);
    nb_tensor *d = nb_random_normal(NB_F64, NB_SHAPE(2, 3), 0, 1, 3);
    for (int o = 0; o < N_BINOPS; o++) {
        CHECK(binops[o].op(a, b) == NULL);
        CHECK_ERROR(NB_ERR_SHAPE, binops[o].name, "[2, 3]", "[4]");
        CHECK(binops[o].op(a, d) == NULL);
        CHECK_ERROR(NB_ERR_DTYPE, binops[o].name, "f32", "f64");
        CHECK(binops[o].op(a, NULL) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, binops[o].name, "input 1 is NULL");
        CHECK(binops[o].op(NULL, a) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");
    }
    for (size_t o = 0; o < sizeof cmpops / sizeof *cmpops; o++) {
        CHECK(cmpops[o].op(a, b) == NULL);
        CHECK_ERROR(NB_ERR_SHAPE, "[2, 3]", "[4]");
        CHECK(cmpops[o].op(a, d) == NULL);
        CHECK_ERROR(NB_ERR_DTYPE, "f32", "f64");
    }
    for (int o = 0; o < N_UNOPS; o++) {
        CHECK(unops[o].op(NULL) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");
    }
    nb_tensor *c = nb_greater(a, nb_scalar(NB_F32, 0));
    CHECK(nb_where(c, a, b) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "where", "[2, 3]", "[4]");
    CHECK(nb_where(c, a, d) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "where", "f32", "f64");
    CHECK(nb_where(c, NULL, a) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "where", "input 1 is NULL");
    nb_tensor *c3 = nb_greater(b, nb_scalar(NB_F32, 0));
    CHECK(nb_where(c3, a, a) == NULL); /* cond [4] against [2, 3] */
    CHECK_ERROR(NB_ERR_SHAPE, "[4]", "[2, 3]");

    /* A chain of three ops after a failure keeps the FIRST error. */
    nb_tensor *y = nb_exp(nb_add(nb_mul(a, b), a));
    CHECK(y == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "mul", "[2, 3]", "[4]");
    y = nb_sqrt(nb_sub(nb_div(a, d), nb_neg(a)));
    CHECK(y == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "div", "f32", "f64");
    /* the message of a NULL input does not replace an earlier, unrelated error */
    CHECK(nb_add(a, b) == NULL);
    CHECK(nb_mul(NULL, a) == NULL);
    CHECK(nb_tanh(NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "add", "[2, 3]", "[4]");
}

/* ---- large tensors (the thread pool) --------------------------------------------- */

static void test_large(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        int64_t n = 300000;
        nb_tensor *a = nb_random_uniform(dts[d], NB_SHAPE(n), -3, 3, 900 + d);
        nb_tensor *b = nb_random_normal(dts[d], NB_SHAPE(n), 0, 1, 910 + d);
        double *va = check_values(a), *vb = check_values(b);
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            ref[i] = va[i] + vb[i];
        CHECK(check_max_error(nb_add(a, b), ref, n) <= value_tol(dts[d]));
        for (int64_t i = 0; i < n; i++)
            ref[i] = exp(va[i]);
        CHECK(check_max_error(nb_exp(a), ref, n) <= value_tol(dts[d]));
        for (int64_t i = 0; i < n; i++)
            ref[i] = tanh(va[i]) * vb[i];
        CHECK(check_max_error(nb_mul(nb_tanh(a), b), ref, n) <= value_tol(dts[d]));
        /* strided and broadcast: [600, 500] transposed view + a row [500] */
        nb_tensor *m = nb_random_normal(dts[d], NB_SHAPE(500, 600), 0, 1, 920 + d);
        nb_tensor *mt = nb_transpose(m, 0, 1);
        nb_tensor *row = nb_random_normal(dts[d], NB_SHAPE(500), 0, 1, 930 + d);
        double *vm = check_values(m), *vr = check_values(row);
        for (int64_t i = 0; i < 600; i++)
            for (int64_t j = 0; j < 500; j++)
                ref[i * 500 + j] = vm[j * 600 + i] + vr[j];
        CHECK(check_max_error(nb_add(mt, row), ref, n) <= value_tol(dts[d]));
        for (int64_t i = 0; i < n; i++)
            ref[i] = exp(vm[(i % 500) * 600 + i / 500]);
        CHECK(check_max_error(nb_exp(mt), ref, n) <= value_tol(dts[d]));
        free(va);
        free(vb);
        free(vm);
        free(vr);
        free(ref);
    }
}

/* ---- higher order ------------------------------------------------------------------ */

static void test_second_derivative(void)
{
    nb_tensor *x = nb_random_uniform(NB_F64, NB_SHAPE(5), -2, 2, 77);
    nb_tape *outer = nb_tape_begin();
    CHECK_OK(nb_tape_watch(outer, x));
    nb_tape *inner = nb_tape_begin();
    CHECK_OK(nb_tape_watch(inner, x));
    nb_tensor *y = nb_mul(nb_mul(x, x), x);
    nb_tensor *dy = NULL, *d2y = NULL;
    CHECK_OK(nb_tape_gradient(inner, y, NB_TENSORS(x), &dy));
    CHECK(dy != NULL);
    CHECK_OK(nb_tape_gradient(outer, dy, NB_TENSORS(x), &d2y));
    CHECK(d2y != NULL);
    double *vx = check_values(x), r1[5], r2[5];
    for (int i = 0; i < 5; i++)
        r1[i] = 3 * vx[i] * vx[i], r2[i] = 6 * vx[i];
    CHECK(check_max_error(dy, r1, 5) <= TOL64);
    CHECK(check_max_error(d2y, r2, 5) <= TOL64);
    free(vx);

    /* the same through pow_scalar and a unary chain: d2/dx2 sin(x)^2 = 2 cos(2x) */
    nb_tensor *z = nb_random_uniform(NB_F64, NB_SHAPE(4), -2, 2, 78);
    nb_tape *o2 = nb_tape_begin();
    CHECK_OK(nb_tape_watch(o2, z));
    nb_tape *i2 = nb_tape_begin();
    CHECK_OK(nb_tape_watch(i2, z));
    nb_tensor *s = nb_pow_scalar(nb_sin(z), 2.0);
    nb_tensor *ds = NULL, *d2s = NULL;
    CHECK_OK(nb_tape_gradient(i2, s, NB_TENSORS(z), &ds));
    CHECK_OK(nb_tape_gradient(o2, ds, NB_TENSORS(z), &d2s));
    double *vz = check_values(z), r3[4];
    for (int i = 0; i < 4; i++)
        r3[i] = 2 * cos(2 * vz[i]);
    CHECK(check_max_error(d2s, r3, 4) <= 1e-10);
    free(vz);
}

/* Second order for every op: fn returns the inner tape's gradient of sum(y * y),
 * and the checker differentiates that (an outer tape over the gradient ops). */
typedef struct second_case {
    const unop *u;
    const binop *b;
} second_case;

static nb_tensor *second_op(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const second_case *c = user;
    return c->u ? c->u->op(in[0]) : c->b->op(in[0], in[1]);
}

static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    nb_tensor *g[2] = {NULL, NULL};
    if (!grads_of_square_sum(second_op, user, n, in, g))
        return NULL;
    /* NULL for a source the target does not reach: zeros */
    nb_tensor *r = g[0] ? g[0] : nb_zeros_like(in[0]);
    return n == 2 ? nb_add(r, nb_sum_all(g[1] ? g[1] : nb_zeros_like(in[1]))) : r;
}

static void test_second_order_all(void)
{
    uint64_t seed = 3000;
    for (int o = 0; o < N_UNOPS; o++) {
        second_case c = {&unops[o], NULL};
        nb_tensor *x = rnd(NB_F64, NB_SHAPE(3, 4), unops[o].domain, seed++);
        double err = -1;
        nb_status st = nb_gradient_check(gc_second, &c, NB_TENSORS(x), GC_EPS, 1e-5, &err);
        if (st)
            fprintf(stderr, "[%s] %s: %s\n", check_current, unops[o].name, nb_error_message());
        CHECK_OK(st);
    }
    for (int o = 0; o < N_BINOPS; o++) {
        second_case c = {NULL, &binops[o]};
        nb_tensor *a = rnd(NB_F64, NB_SHAPE(3, 1, 4), binops[o].dom_a, seed++);
        nb_tensor *b = rnd(NB_F64, NB_SHAPE(2, 1), binops[o].dom_b, seed++);
        double err = -1;
        nb_status st = nb_gradient_check(gc_second, &c, NB_TENSORS(a, b), GC_EPS, 1e-5, &err);
        if (st)
            fprintf(stderr, "[%s] %s: %s\n", check_current, binops[o].name, nb_error_message());
        CHECK_OK(st);
    }
}

/* Gradients of powers where the base is 0: x^0 has slope 0 everywhere (not
 * 0 * 0^-1 = NaN), through pow_scalar and pow alike, and x^1 has second
 * derivative 0 at 0; as PyTorch gives. */
static void test_pow_edge_gradients(void)
{
    const double xv[4] = {0, 2, -3, 0};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(4), xv), *g = NULL;
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, x));
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_pow_scalar(x, 0.0)), 1, &x, &g));
    const double zeros[4] = {0, 0, 0, 0};
    CHECK(check_max_error(g, zeros, 4) == 0);

    nb_tape *outer = nb_tape_begin(), *inner = nb_tape_begin();
    CHECK_OK(nb_tape_watch(outer, x));
    CHECK_OK(nb_tape_watch(inner, x));
    nb_tensor *d1 = NULL, *d2 = NULL;
    CHECK_OK(nb_tape_gradient(inner, nb_sum_all(nb_pow_scalar(x, 1.0)), 1, &x, &d1));
    CHECK_OK(nb_tape_gradient(outer, nb_sum_all(d1), 1, &x, &d2));
    const double ones[4] = {1, 1, 1, 1};
    CHECK(check_max_error(d1, ones, 4) == 0);
    CHECK(check_max_error(d2, zeros, 4) == 0);

    /* pow(a, b): d/da at (0, 0) and (2, 0) is 0, at (0, 2) it is 2 * 0 = 0, at
     * (3, 2) 6; d/db is a^b log a, 0 where a <= 0. */
    const double av[4] = {0, 2, 0, 3}, bv[4] = {0, 0, 2, 2};
    nb_tensor *a = nb_from_buffer(NB_F64, NB_SHAPE(4), av), *b = nb_from_buffer(NB_F64, NB_SHAPE(4), bv);
    nb_tensor *gab[2] = {NULL, NULL};
    nb_tape *t2 = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t2, a));
    CHECK_OK(nb_tape_watch(t2, b));
    CHECK_OK(nb_tape_gradient(t2, nb_sum_all(nb_pow(a, b)), NB_TENSORS(a, b), gab));
    const double want_a[4] = {0, 0, 0, 6}, want_b[4] = {0, log(2.0), 0, 9 * log(3.0)};
    CHECK(check_max_error(gab[0], want_a, 4) <= 1e-15);
    CHECK(check_max_error(gab[1], want_b, 4) <= 1e-15);
}

/* A constant slope stays constant whatever flows into it: x^0 and pow(a, 0)
 * pass 0 even where the incoming gradient is NaN (0 * NaN was NaN), and relu's
 * step mask passes no gradient back at all, so a second order through an
 * infinite slope (u * inf) is 0, not 0 * inf = NaN; as PyTorch gives. */
static void test_constant_slopes(void)
{
    const double xv[2] = {2, 3}, bv[2] = {0, 1}, cv[2] = {NAN, 1};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(2), xv), *b = nb_from_buffer(NB_F64, NB_SHAPE(2), bv);
    nb_tensor *c = nb_from_buffer(NB_F64, NB_SHAPE(2), cv), *g = NULL, *gp = NULL;
    nb_tape *t = nb_tape_begin_persistent();
    CHECK_OK(nb_tape_watch(t, x));
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_mul(nb_pow_scalar(x, 0.0), c)), 1, &x, &g));
    CHECK(nb_tensor_get(g, 0) == 0 && nb_tensor_get(g, 1) == 0);
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_mul(nb_pow(x, b), c)), 1, &x, &gp));
    CHECK(nb_tensor_get(gp, 0) == 0 && nb_tensor_get(gp, 1) == 1);
    nb_tape_free(t);

    const double uv[1] = {1}, wv[1] = {INFINITY};
    nb_tensor *u = nb_from_buffer(NB_F64, NB_SHAPE(1), uv), *w = nb_from_buffer(NB_F64, NB_SHAPE(1), wv);
    nb_tensor *d1 = NULL, *d2 = NULL;
    nb_tape *outer = nb_tape_begin(), *inner = nb_tape_begin();
    CHECK_OK(nb_tape_watch(outer, u));
    CHECK_OK(nb_tape_watch(inner, u));
    CHECK_OK(nb_tape_gradient(inner, nb_sum_all(nb_relu(nb_mul(u, w))), 1, &u, &d1));
    CHECK(nb_tensor_get(d1, 0) == INFINITY);
    CHECK_OK(nb_tape_gradient_ex(outer, nb_sum_all(d1), NULL, 1, &u, &d2, NB_UNCONNECTED_ZERO));
    CHECK(nb_tensor_get(d2, 0) == 0);
}

int main(void)
{
    RUN(test_strided_readback);
    RUN(test_binary_values);
    RUN(test_binary_gradients);
    RUN(test_maximum_ties);
    RUN(test_integer_binary);
    RUN(test_unary_values);
    RUN(test_unary_gradients);
    RUN(test_comparisons);
    RUN(test_where_values);
    RUN(test_where_gradient);
    RUN(test_errors);
    RUN(test_large);
    RUN(test_second_derivative);
    RUN(test_second_order_all);
    RUN(test_pow_edge_gradients);
    RUN(test_constant_slopes);
    return check_finish();
}
