/* The neural-network ops of include/nabla/nn.h other than convolutions:
 * max and average pooling (values against nested loops, ties, NaN, padding
 * never winning, both layouts, gradients of the first and second order),
 * global average pooling, batch_norm (training and inference, statistics,
 * gradients), layer_norm, dropout and embedding_lookup, and their errors.
 * Where a GPU is present, pooling, batch_norm_train and dropout are compared
 * with the CPU's. */
#include "check.h"
#include "conv_ref.h"

static uint64_t rng = 0x1234567ull;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static double *random_values(int64_t n, double lo, double hi)
{
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * urand();
    return v;
}

static nb_tensor *tensor_of(nb_dtype dt, nb_shape s, const double *v)
{
    nb_tensor *t = nb_from_buffer(NB_F64, s, v);
    return dt == NB_F64 ? t : nb_cast(t, dt);
}

/* ---- pooling references ---------------------------------------------------------- */

static nb_tensor *pool(bool is_max, const nb_tensor *x, const nb_pool2d_opts *o)
{
    return is_max ? nb_max_pool2d(x, o) : nb_avg_pool2d(x, o);
}

static nb_shape in_shape(const pool_case *c)
{
    return c->o.format == NB_NCHW ? NB_SHAPE(c->N, c->C, c->H, c->W) : NB_SHAPE(c->N, c->H, c->W, c->C);
}

/* The pooled output's shape, in the case's layout. */
static nb_shape out_shape(const pool_case *c)
{
    pool_geo g = pool_geo_of(c);
    return c->o.format == NB_NCHW ? NB_SHAPE(c->N, c->C, g.P, g.Q) : NB_SHAPE(c->N, g.P, g.Q, c->C);
}

static const pool_case pool_cases[] = {
    {1, 5, 7, 3, {{2, 2}, {0, 0}, NB_PAD_VALID, {0}, NB_NHWC}},
    {2, 7, 5, 3, {{3, 3}, {2, 2}, NB_PAD_SAME, {0}, NB_NHWC}},
    {2, 7, 5, 3, {{3, 3}, {2, 2}, NB_PAD_SAME, {0}, NB_NCHW}},
    {1, 9, 8, 2, {{3, 2}, {3, 1}, NB_PAD_VALID, {0}, NB_NCHW}},
    {2, 6, 7, 4, {{3, 3}, {1, 1}, NB_PAD_SAME, {0}, NB_NHWC}},
    {3, 7, 7, 1, {{3, 3}, {2, 3}, NB_PAD_EXPLICIT, {1, 2, 2, 0}, NB_NHWC}},
    {2, 5, 6, 3, {{2, 3}, {2, 1}, NB_PAD_EXPLICIT, {1, 0, 0, 2}, NB_NCHW}},
    {1, 1, 1, 5, {{1, 1}, {1, 1}, NB_PAD_VALID, {0}, NB_NHWC}},
    {1, 2, 3, 2, {{3, 3}, {1, 1}, NB_PAD_SAME, {0}, NB_NHWC}},
    {2, 8, 8, 33, {{2, 2}, {2, 2}, NB_PAD_VALID, {0}, NB_NHWC}},
    {1, 5, 6, 70, {{3, 3}, {2, 2}, NB_PAD_SAME, {0}, NB_NHWC}},
};
#define N_POOL_CASES ((int)(sizeof pool_cases / sizeof *pool_cases))

static void pool_values(void)
{
    for (int k = 0; k < N_POOL_CASES; k++) {
        const pool_case *c = &pool_cases[k];
        pool_geo g = pool_geo_of(c);
        nb_shape s = in_shape(c);
        int64_t n = numel_of(s), m = c->N * g.P * g.Q * c->C;
        for (int dti = 0; dti < 2; dti++) {
            nb_dtype dt = dti ? NB_F64 : NB_F32;
            /* a grid of halves: many ties */
            double *v = random_values(n, -4, 4);
            if (k % 2)
                for (int64_t i = 0; i < n; i++)
                    v[i] = floor(v[i] * 2) / 2;
            if (dt == NB_F32)
                for (int64_t i = 0; i < n; i++)
                    v[i] = (float)v[i];
            double *want = malloc(sizeof(double) * (size_t)m);
            for (int is_max = 0; is_max < 2; is_max++) {
                nb_tensor *y = pool(is_max, tensor_of(dt, s, v), &c->o);
                pool_ref(c, is_max, v, want, NULL);
                CHECKF(y && nb_tensor_dtype(y) == dt, "case %d", k);
                CHECKF(has_shape(y, out_shape(c)), "case %d %s shape", k, is_max ? "max" : "avg");
                CHECKF(check_max_error(y, want, m) <= (dt == NB_F32 ? 1e-6 : 1e-14), "case %d %s %s", k,
                       is_max ? "max" : "avg", nb_dtype_name(dt));
            }
            free(want);
            free(v);
        }
    }
}

/* Non-contiguous input: a transposed view pools like its copy. */
static void pool_strided_input(void)
{
    double *v = random_values(2 * 5 * 6 * 3, -1, 1);
    nb_tensor *t = nb_from_buffer(NB_F64, NB_SHAPE(2, 6, 5, 3), v);
    nb_tensor *x = nb_transpose(t, 1, 2); /* [2, 5, 6, 3], not contiguous */
    nb_pool2d_opts o = {{2, 3}, {1, 2}, NB_PAD_SAME, {0}, NB_NHWC};
    for (int is_max = 0; is_max < 2; is_max++)
        CHECK(same_bits(pool(is_max, x, &o), pool(is_max, nb_contiguous(x), &o)));
    free(v);
}

/* Padding never wins (all inputs negative), NaN propagates, the gradient goes
 * to the first maximum of each window. */
static void max_pool_edges(void)
{
    double v[9] = {-5, -3, -3, -1, NAN, -2, -3, -1, -1}; /* [1, 3, 3, 1] */
    nb_pool2d_opts o = {{2, 2}, {1, 1}, NB_PAD_EXPLICIT, {1, 1, 1, 1}, NB_NHWC};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(1, 3, 3, 1), v);
    nb_tensor *y = nb_max_pool2d(x, &o);
    /* windows at (-1..0, -1..0): -5; (-1..0, 0..1): -3 (the first of the ties) */
    CHECK(has_shape(y, NB_SHAPE(1, 4, 4, 1)));
    if (y) {
        CHECK(nb_tensor_get(y, 0) == -5);
        CHECK(nb_tensor_get(y, 1) == -3);
        CHECK(nb_tensor_get(y, 3) == -3);
        CHECK(isnan(nb_tensor_get(y, 5))); /* holds the NaN */
        CHECK(nb_tensor_get(y, 15) == -1);
    }
    /* ties: [1, 2, 3, 1] of equal values, window 2x3: the gradient all to (0, 0) */
    double t[6] = {2, 2, 2, 2, 2, 2};
    nb_tensor *xt = nb_from_buffer(NB_F64, NB_SHAPE(1, 2, 3, 1), t);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, xt));
    nb_pool2d_opts o2 = {{2, 3}, {0, 0}, NB_PAD_VALID, {0}, NB_NHWC};
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(nb_max_pool2d(xt, &o2)), 1, &xt, &g));
    if (g) {
        CHECK(nb_tensor_get(g, 0) == 1);
        for (int i = 1; i < 6; i++)
            CHECK(nb_tensor_get(g, i) == 0);
    }
}

/* The tape's gradient of sum(pool(x) * w) against the reference: each window's
 * weight to its first maximum (max) or spread over its inside elements (avg). */
static void pool_gradient_values(void)
{
    for (int k = 0; k < N_POOL_CASES; k++) {
        const pool_case *c = &pool_cases[k];
        nb_shape s = in_shape(c), os = out_shape(c);
        int64_t n = numel_of(s), m = numel_of(os);
        double *v = random_values(n, -2, 2), *w = random_values(m, 0.5, 1.5);
        for (int64_t i = 0; i < n; i++)
            v[i] = floor(v[i] * 4) / 4; /* ties */
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int is_max = 0; is_max < 2; is_max++) {
            pool_ref_grad(c, is_max, v, w, want);
            nb_tensor *x = nb_from_buffer(NB_F64, s, v), *wt = nb_from_buffer(NB_F64, os, w), *gx = NULL;
            nb_tape *tape = nb_tape_begin();
            CHECK_OK(nb_tape_watch(tape, x));
            CHECK_OK(nb_tape_gradient(tape, nb_sum_all(nb_mul(pool(is_max, x, &c->o), wt)), 1, &x, &gx));
            CHECKF(check_max_error(gx, want, n) <= 1e-14, "case %d %s gradient", k, is_max ? "max" : "avg");
        }
        free(v), free(w), free(want);
    }
}

typedef struct pool_fn_ctx {
    const nb_pool2d_opts *o;
    bool is_max;
} pool_fn_ctx;

static nb_tensor *pool_fn(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const pool_fn_ctx *c = user;
    return pool(c->is_max, in[0], c->o);
}

/* The gradient of sum(pool(x) * w) with respect to x, as a function of (x, w):
 * checking it checks the second order. */
static nb_tensor *pool_grad_fn(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const pool_fn_ctx *c = user;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, in[0]);
    nb_tensor *y = nb_sum_all(nb_mul(pool(c->is_max, in[0], c->o), in[1]));
    nb_tensor *g = NULL;
    if (nb_tape_gradient_ex(tape, y, NULL, 1, in, &g, NB_UNCONNECTED_ZERO))
        return NULL;
    return g;
}

/* And the second order again, through the gradient of the gradient. */
static nb_tensor *pool_grad2_fn(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, in[1]);
    nb_tensor *g = pool_grad_fn(2, in, user);
    nb_tensor *gw = NULL;
    if (!g || nb_tape_gradient_ex(tape, nb_sum_all(nb_mul(g, in[2])), NULL, 1, &in[1], &gw, NB_UNCONNECTED_ZERO))
        return NULL;
    return gw;
}

static void pool_gradient_check(void)
{
    for (int k = 0; k < N_POOL_CASES; k++) {
        const pool_case *c = &pool_cases[k];
        nb_shape s = in_shape(c), os = out_shape(c);
        int64_t n = numel_of(s);
        if (n > 600)
            continue;
        /* distinct values, at least 0.01 apart: no kinks within the step */
        double *v = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            v[i] = 0.01 * (double)((i * 7919) % n) - 1;
        double *w = random_values(numel_of(os), -1, 1), *u = random_values(n, -1, 1);
        nb_tensor *in[3] = {nb_from_buffer(NB_F64, s, v), nb_from_buffer(NB_F64, os, w), nb_from_buffer(NB_F64, s, u)};
        for (int is_max = 0; is_max < 2; is_max++) {
            pool_fn_ctx ctx = {&c->o, is_max};
            double err = 0;
            CHECK_OK(nb_gradient_check(pool_fn, &ctx, 1, in, GC_EPS, GC_TOL, &err));
            CHECK_OK(nb_gradient_check(pool_grad_fn, &ctx, 2, in, GC_EPS, GC_TOL, &err));
            CHECK_OK(nb_gradient_check(pool_grad2_fn, &ctx, 3, in, GC_EPS, GC_TOL, &err));
        }
        free(v), free(w), free(u);
    }
}

static void global_avg_pool(void)
{
    double *v = random_values(2 * 3 * 4 * 5, -1, 1);
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(2, 3, 4, 5), v);
    nb_tensor *y = nb_global_avg_pool2d(x, NB_NHWC), *z = nb_global_avg_pool2d(x, NB_NCHW);
    CHECK(has_shape(y, NB_SHAPE(2, 5)) && has_shape(z, NB_SHAPE(2, 3)));
    double want_y[10] = {0}, want_z[6] = {0};
    for (int n = 0; n < 2; n++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 5; c++) {
                    double e = v[((n * 3 + a) * 4 + b) * 5 + c];
                    want_y[n * 5 + c] += e / 12;
                    want_z[n * 3 + a] += e / 20;
                }
    CHECK(check_max_error(y, want_y, 10) <= 1e-14);
    CHECK(check_max_error(z, want_z, 6) <= 1e-14);
    free(v);
}

static void pool_errors(void)
{
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(1, 4, 4, 2));
    nb_pool2d_opts o = {{0, 2}, {0, 0}, NB_PAD_VALID, {0}, NB_NHWC};
    CHECK(!nb_max_pool2d(x, &o));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "max_pool2d", "window");
    o = (nb_pool2d_opts){{2, 2}, {-1, 1}, NB_PAD_VALID, {0}, NB_NHWC};
    CHECK(!nb_avg_pool2d(x, &o));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "avg_pool2d", "stride");
    o = (nb_pool2d_opts){{2, 2}, {1, 1}, NB_PAD_EXPLICIT, {0, 2, 0, 0}, NB_NHWC};
    CHECK(!nb_max_pool2d(x, &o));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "max_pool2d", "padding");
    o = (nb_pool2d_opts){{5, 2}, {1, 1}, NB_PAD_VALID, {0}, NB_NHWC};
    CHECK(!nb_max_pool2d(x, &o));
    CHECK_ERROR(NB_ERR_SHAPE, "max_pool2d", "does not fit");
    CHECK(!nb_max_pool2d(x, NULL));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "max_pool2d");
    o = (nb_pool2d_opts){{2, 2}, {1, 1}, NB_PAD_VALID, {0}, NB_NHWC};
    CHECK(!nb_max_pool2d(nb_zeros(NB_F32, NB_SHAPE(4, 4, 2)), &o));
    CHECK_ERROR(NB_ERR_SHAPE, "max_pool2d", "4-d");
    CHECK(!nb_avg_pool2d(nb_zeros(NB_I32, NB_SHAPE(1, 4, 4, 2)), &o));
    CHECK_ERROR(NB_ERR_DTYPE, "avg_pool2d");
    CHECK(!nb_global_avg_pool2d(nb_zeros(NB_I64, NB_SHAPE(1, 4, 4, 2)), NB_NHWC));
    CHECK_ERROR(NB_ERR_DTYPE, "global_avg_pool2d");
    /* an empty batch pools to an empty batch */
    CHECK(has_shape(nb_max_pool2d(nb_zeros(NB_F32, NB_SHAPE(0, 4, 4, 2)), &o), NB_SHAPE(0, 3, 3, 2)));
}

/* ---- batch and layer normalisation ------------------------------------------------- */

/* Per-channel statistics of x ([rows, C] after moving the channel last). */
static void bn_reference(const double *x, int64_t N, int64_t C, int64_t HW, bool nchw, const double *gamma,
                         const double *beta, double eps, double *y, double *mean, double *var_unbiased)
{
    int64_t m = N * HW;
    for (int64_t c = 0; c < C; c++) {
        double s = 0, ss = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < HW; k++)
                s += x[nchw ? (n * C + c) * HW + k : (n * HW + k) * C + c];
        double mu = s / (double)m;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < HW; k++) {
                double d = x[nchw ? (n * C + c) * HW + k : (n * HW + k) * C + c] - mu;
                ss += d * d;
            }
        double var = ss / (double)m;
        mean[c] = mu;
        var_unbiased[c] = ss / (double)(m - 1);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < HW; k++) {
                int64_t i = nchw ? (n * C + c) * HW + k : (n * HW + k) * C + c;
                y[i] = (gamma ? gamma[c] : 1) * (x[i] - mu) / sqrt(var + eps) + (beta ? beta[c] : 0);
            }
    }
}

/* An infinity in a channel leaves its variance without a value: the whole
 * channel comes out NaN (as PyTorch's), not -inf or a variance of 0, and the
 * other channels are untouched. NHWC, NCHW and the CPU's chunked rows. */
static void batch_norm_infinity(void)
{
    const struct {
        int64_t N, H, W, C;
        nb_data_format f;
    } cases[] = {{2, 3, 2, 3, NB_NHWC}, {2, 3, 2, 3, NB_NCHW}, {16, 64, 16, 3, NB_NHWC}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int64_t N = cases[k].N, H = cases[k].H, W = cases[k].W, C = cases[k].C, n = N * H * W * C;
        bool nchw = cases[k].f == NB_NCHW;
        nb_shape s = nchw ? NB_SHAPE(N, C, H, W) : NB_SHAPE(N, H, W, C);
        for (int sign = -1; sign <= 1; sign += 2) {
            double *x = random_values(n, -1, 1);
            x[nchw ? 1 * H * W + 2 : 1] = sign * INFINITY; /* channel 1 */
            for (int dti = 0; dti < 2; dti++) {
                nb_tensor *y = nb_batch_norm_train(tensor_of(dti ? NB_F64 : NB_F32, s, x), NULL, NULL, 1e-3,
                                                   cases[k].f, NULL, NULL);
                double *v = y ? check_values(y) : NULL;
                int bad = v ? 0 : 1;
                for (int64_t i = 0; v && i < n; i++) {
                    int64_t ch = nchw ? (i / (H * W)) % C : i % C;
                    bad += ch == 1 ? !isnan(v[i]) : !isfinite(v[i]);
                }
                CHECKF(bad == 0, "case %zu sign %d %s: %d wrong elements", k, sign, dti ? "f64" : "f32", bad);
                free(v);
            }
            free(x);
        }
    }
}

static void batch_norm_values(void)
{
    const struct {
        int ndim;
        int64_t N, HW, C;
        nb_data_format f;
        bool params;
    } cases[] = {
        {4, 3, 5 * 4, 3, NB_NHWC, true}, {4, 2, 3 * 7, 5, NB_NCHW, true}, {2, 9, 1, 4, NB_NHWC, true},
        {2, 6, 1, 3, NB_NCHW, false},   {4, 4, 2 * 3, 7, NB_NHWC, false},
        {4, 16, 256 * 4, 5, NB_NHWC, true}, /* 82k elements: the CPU's rows split into chunks */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int64_t N = cases[k].N, HW = cases[k].HW, C = cases[k].C, n = N * HW * C;
        bool nchw = cases[k].f == NB_NCHW && cases[k].ndim == 4;
        nb_shape s = cases[k].ndim == 2 ? NB_SHAPE(N, C)
                     : nchw              ? NB_SHAPE(N, C, HW / (HW % 4 == 0 ? 4 : 3), HW % 4 == 0 ? 4 : 3)
                                         : NB_SHAPE(N, HW / (HW % 4 == 0 ? 4 : 3), HW % 4 == 0 ? 4 : 3, C);
        CHECK(numel_of(s) == n);
        double *x = random_values(n, -3, 5), *gm = random_values(C, 0.5, 2), *bt = random_values(C, -1, 1);
        double *y = malloc(sizeof(double) * (size_t)n), mean[8], var[8];
        const double eps = 1e-3;
        bool p = cases[k].params;
        bn_reference(x, N, C, HW, nchw, p ? gm : NULL, p ? bt : NULL, eps, y, mean, var);
        for (int dti = 0; dti < 2; dti++) {
            nb_dtype dt = dti ? NB_F64 : NB_F32;
            double tol = dt == NB_F32 ? 2e-5 : 1e-12;
            nb_tensor *xt = tensor_of(dt, s, x);
            nb_tensor *gt = p ? tensor_of(dt, NB_SHAPE(C), gm) : NULL, *bt_ = p ? tensor_of(dt, NB_SHAPE(C), bt) : NULL;
            nb_tensor *bm = NULL, *bv = NULL;
            nb_tensor *yt = nb_batch_norm_train(xt, gt, bt_, eps, cases[k].f, &bm, &bv);
            CHECKF(yt && has_shape(yt, s), "case %zu", k);
            CHECKF(check_max_error(yt, y, n) <= tol, "case %zu %s values", k, nb_dtype_name(dt));
            CHECKF(has_shape(bm, NB_SHAPE(C)) && check_max_error(bm, mean, C) <= tol, "case %zu mean", k);
            CHECKF(has_shape(bv, NB_SHAPE(C)) && check_max_error(bv, var, C) <= tol, "case %zu var", k);
            /* inference with the biased variance gives the training result */
            nb_tensor *biased = nb_mul_scalar(bv, (double)(N * HW - 1) / (double)(N * HW));
            nb_tensor *yi = nb_batch_norm_infer(xt, gt, bt_, bm, biased, eps, cases[k].f);
            CHECKF(check_max_error(yi, y, n) <= 10 * tol, "case %zu infer", k);
            /* NULL statistics are fine */
            CHECK(nb_batch_norm_train(xt, gt, bt_, eps, cases[k].f, NULL, NULL));
        }
        free(x), free(gm), free(bt), free(y);
    }
}

/* f32 statistics far from 0: the one-pass variance cancels in double. */
static void batch_norm_offset(void)
{
    const int64_t N = 40, C = 3, n = N * 5 * C;
    double *x = random_values(n, -1, 1);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(1000 + x[i]);
    double *y = malloc(sizeof(double) * (size_t)n), mean[3], var[3];
    bn_reference(x, N, C, 5, false, NULL, NULL, 1e-5, y, mean, var);
    for (int f = 0; f < 2; f++) {
        nb_tensor *bm = NULL, *bv = NULL;
        nb_tensor *xt = tensor_of(NB_F32, f ? NB_SHAPE(N, 5, C) : NB_SHAPE(N * 5, C), x);
        nb_tensor *yt = nb_batch_norm_train(xt, NULL, NULL, 1e-5, NB_NHWC, &bm, &bv);
        /* y = x scale + shift: f32 rounding of x scale ~ 1700 */
        CHECK(check_max_error(yt, y, n) <= 1e-3);
        CHECK(check_max_error(bv, var, C) <= 1e-5);
        CHECK(check_max_error(bm, mean, C) <= 1e-7);
    }
    free(x), free(y);
}

typedef struct bn_ctx {
    nb_data_format f;
    int which; /* 0 train, 1 infer, 2 layer_norm */
} bn_ctx;

static nb_tensor *bn_fn(int n, nb_tensor *const *in, void *user)
{
    const bn_ctx *c = user;
    nb_tensor *g = n > 1 ? in[1] : NULL, *b = n > 2 ? in[2] : NULL;
    switch (c->which) {
    case 0: return nb_batch_norm_train(in[0], g, b, 1e-3, c->f, NULL, NULL);
    case 1: return nb_batch_norm_infer(in[0], g, b, in[3], in[4], 1e-3, c->f);
    default: return nb_layer_norm(in[0], g, b, 2, 1e-3);
    }
}

/* The gradient of sum(bn(x) * w) with respect to (x, gamma, beta), summed
 * into one tensor: checking it checks the second order. */
static nb_tensor *bn_grad_fn(int n, nb_tensor *const *in, void *user)
{
    nb_tape *tape = nb_tape_begin();
    for (int i = 0; i < 3; i++)
        nb_tape_watch(tape, in[i]);
    nb_tensor *y = nb_sum_all(nb_mul(bn_fn(3, in, user), in[n - 1]));
    nb_tensor *g[3] = {0};
    if (nb_tape_gradient_ex(tape, y, NULL, 3, in, g, NB_UNCONNECTED_ZERO))
        return NULL;
    return nb_add(nb_sum_all(nb_mul(g[0], g[0])), nb_add(nb_sum_all(nb_mul(g[1], g[1])), nb_sum_all(g[2])));
}

static void norm_gradient_check(void)
{
    const struct {
        nb_shape s;
        int64_t C;
        nb_data_format f;
    } cases[] = {
        {{4, {2, 3, 2, 3}}, 3, NB_NHWC}, {{4, {2, 3, 2, 3}}, 3, NB_NCHW}, {{2, {5, 4}}, 4, NB_NHWC},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        nb_shape s = cases[k].s;
        int64_t C = cases[k].C, n = numel_of(s);
        double *x = random_values(n, -2, 2), *g = random_values(C, 0.5, 1.5), *b = random_values(C, -1, 1);
        double *mv = random_values(C, -1, 1), *vv = random_values(C, 0.5, 2), *w = random_values(n, -1, 1);
        nb_tensor *in[6] = {nb_from_buffer(NB_F64, s, x), nb_from_buffer(NB_F64, NB_SHAPE(C), g),
                            nb_from_buffer(NB_F64, NB_SHAPE(C), b), nb_from_buffer(NB_F64, NB_SHAPE(C), mv),
                            nb_from_buffer(NB_F64, NB_SHAPE(C), vv), nb_from_buffer(NB_F64, s, w)};
        double err = 0;
        bn_ctx train = {cases[k].f, 0}, infer = {cases[k].f, 1};
        CHECK_OK(nb_gradient_check(bn_fn, &train, 3, in, GC_EPS, GC_TOL, &err));
        CHECK_OK(nb_gradient_check(bn_fn, &train, 1, in, GC_EPS, GC_TOL, &err));
        CHECK_OK(nb_gradient_check(bn_fn, &infer, 5, in, GC_EPS, GC_TOL, &err));
        /* second order: x, gamma, beta and the weights w */
        nb_tensor *in2[4] = {in[0], in[1], in[2], in[5]};
        CHECK_OK(nb_gradient_check(bn_grad_fn, &train, 4, in2, GC_EPS, 1e-5, &err));
        /* inference: x, gamma, beta, mean, var and w (in[5]) */
        CHECK_OK(nb_gradient_check(bn_grad_fn, &infer, 6, in, GC_EPS, 1e-5, &err));
        CHECK_OK(nb_gradient_check(bn_fn, &infer, 1, in, GC_EPS, GC_TOL, &err));
        free(x), free(g), free(b), free(mv), free(vv), free(w);
    }
}

static void layer_norm_values(void)
{
    /* [3, 4, 5] over the last 2 dims */
    const int64_t R = 3, D = 20;
    double *x = random_values(R * D, -2, 3), *g = random_values(D, 0.5, 1.5), *b = random_values(D, -1, 1);
    double want[60];
    for (int64_t r = 0; r < R; r++) {
        double s = 0, ss = 0;
        for (int64_t j = 0; j < D; j++)
            s += x[r * D + j];
        double mu = s / D;
        for (int64_t j = 0; j < D; j++)
            ss += (x[r * D + j] - mu) * (x[r * D + j] - mu);
        for (int64_t j = 0; j < D; j++)
            want[r * D + j] = g[j] * (x[r * D + j] - mu) / sqrt(ss / D + 1e-3) + b[j];
    }
    nb_tensor *xt = nb_from_buffer(NB_F64, NB_SHAPE(3, 4, 5), x);
    nb_tensor *gt = nb_from_buffer(NB_F64, NB_SHAPE(4, 5), g), *bt = nb_from_buffer(NB_F64, NB_SHAPE(4, 5), b);
    CHECK(check_max_error(nb_layer_norm(xt, gt, bt, 2, 1e-3), want, R * D) <= 1e-13);
    nb_tensor *in[3] = {xt, gt, bt};
    bn_ctx c = {NB_NHWC, 2};
    double err;
    CHECK_OK(nb_gradient_check(bn_fn, &c, 3, in, GC_EPS, GC_TOL, &err));
    CHECK_OK(nb_gradient_check(bn_fn, &c, 2, in, GC_EPS, GC_TOL, &err));
    CHECK_OK(nb_gradient_check(bn_fn, &c, 1, in, GC_EPS, GC_TOL, &err));
    /* second order: x, gamma, beta and the weights w */
    double *w = random_values(R * D, -1, 1);
    nb_tensor *in2[4] = {xt, gt, bt, nb_from_buffer(NB_F64, NB_SHAPE(3, 4, 5), w)};
    CHECK_OK(nb_gradient_check(bn_grad_fn, &c, 4, in2, GC_EPS, 1e-5, &err));
    free(w);
    CHECK(!nb_layer_norm(xt, gt, bt, 1, 1e-3));
    CHECK_ERROR(NB_ERR_SHAPE, "layer_norm", "gamma");
    CHECK(!nb_layer_norm(xt, NULL, NULL, 4, 1e-3));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "layer_norm", "n_axes");
    free(x), free(g), free(b);
}

/* y[r, j] = g[j] (x[r, j] - mean_r) / sqrt(var_r + eps) + b[j] over rows of D
 * (g, b NULL: 1, 0). */
static void ln_reference(const double *x, int64_t R, int64_t D, const double *g, const double *b, double eps,
                         double *y)
{
    for (int64_t r = 0; r < R; r++) {
        double s = 0, ss = 0;
        for (int64_t j = 0; j < D; j++)
            s += x[r * D + j];
        double mu = s / (double)D;
        for (int64_t j = 0; j < D; j++)
            ss += (x[r * D + j] - mu) * (x[r * D + j] - mu);
        for (int64_t j = 0; j < D; j++)
            y[r * D + j] = (g ? g[j] : 1) * (x[r * D + j] - mu) / sqrt(ss / (double)D + eps) + (b ? b[j] : 0);
    }
}

/* f32 and f64, with and without gamma and beta, over 1 and 2 axes, and a
 * transposed (non-contiguous) input. */
static void layer_norm_cases(void)
{
    const struct {
        nb_shape s;
        int n_axes;
        bool gamma, beta, transposed;
    } cases[] = {
        {{2, {7, 33}}, 1, true, true, false},  {{4, {2, 3, 4, 5}}, 2, true, false, false},
        {{2, {5, 16}}, 1, false, true, false}, {{2, {4, 9}}, 1, false, false, false},
        {{2, {6, 9}}, 1, true, true, true},    {{3, {64, 2, 300}}, 1, true, true, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        nb_shape s = cases[k].s;
        int64_t n = numel_of(s), D = 1;
        for (int i = s.ndim - cases[k].n_axes; i < s.ndim; i++)
            D *= s.dims[i];
        nb_shape ps = {cases[k].n_axes, {0}};
        for (int i = 0; i < ps.ndim; i++)
            ps.dims[i] = s.dims[s.ndim - ps.ndim + i];
        double *x = random_values(n, -2, 3), *g = random_values(D, 0.5, 1.5), *b = random_values(D, -1, 1);
        double *y = malloc(sizeof(double) * (size_t)n), *xl = malloc(sizeof(double) * (size_t)n);
        /* transposed: x's buffer is [D, rows], read as its transpose */
        for (int64_t r = 0; r < n / D; r++)
            for (int64_t j = 0; j < D; j++)
                xl[r * D + j] = cases[k].transposed ? x[j * (n / D) + r] : x[r * D + j];
        ln_reference(xl, n / D, D, cases[k].gamma ? g : NULL, cases[k].beta ? b : NULL, 1e-5, y);
        for (int dti = 0; dti < 2; dti++) {
            nb_dtype dt = dti ? NB_F64 : NB_F32;
            nb_tensor *xt = cases[k].transposed ? nb_transpose(tensor_of(dt, NB_SHAPE(s.dims[1], s.dims[0]), x), 0, 1)
                                                : tensor_of(dt, s, x);
            nb_tensor *gt = cases[k].gamma ? tensor_of(dt, ps, g) : NULL;
            nb_tensor *bt = cases[k].beta ? tensor_of(dt, ps, b) : NULL;
            nb_tensor *yt = nb_layer_norm(xt, gt, bt, cases[k].n_axes, 1e-5);
            CHECKF(yt && has_shape(yt, s) && nb_tensor_dtype(yt) == dt, "case %zu", k);
            CHECKF(check_max_error(yt, y, n) <= (dti ? 1e-12 : 2e-5), "case %zu %s", k, nb_dtype_name(dt));
        }
        free(x), free(g), free(b), free(y), free(xl);
    }
}

/* Constant rows (variance 0), NaN and infinity, and empty inputs. */
static void layer_norm_edges(void)
{
    const double g[4] = {0.5, 1.5, -1, 2}, b[4] = {0.25, -1, 0.5, 3};
    /* row 0 constant, row 1 ordinary, row 2 with a NaN, row 3 with an infinity */
    const double x[16] = {2.5, 2.5, 2.5, 2.5, 1, -2, 0.5, 3, 1, NAN, 2, 3, 1, INFINITY, 2, 3};
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_F64 : NB_F32;
        nb_tensor *xt = tensor_of(dt, NB_SHAPE(4, 4), x);
        nb_tensor *gt = tensor_of(dt, NB_SHAPE(4), g), *bt = tensor_of(dt, NB_SHAPE(4), b);
        nb_tensor *y = nb_layer_norm(xt, gt, bt, 1, 1e-3);
        CHECK(y);
        for (int j = 0; j < 4; j++) {
            CHECKF(nb_tensor_get(y, j) == b[j], "%s constant row: beta", nb_dtype_name(dt));
            CHECK(isfinite(nb_tensor_get(y, 4 + j)));
            CHECKF(isnan(nb_tensor_get(y, 8 + j)) && isnan(nb_tensor_get(y, 12 + j)), "%s NaN and inf rows",
                   nb_dtype_name(dt));
        }
        /* epsilon 0 on a constant row: 0 / 0 */
        nb_tensor *y0 = nb_layer_norm(xt, gt, bt, 1, 0);
        for (int j = 0; j < 4; j++)
            CHECK(isnan(nb_tensor_get(y0, j)) && isfinite(nb_tensor_get(y0, 4 + j)));
        /* the gradient on the constant row is finite with epsilon > 0 */
        nb_tensor *x2 = nb_slice(xt, NB_SHAPE(0, 0), NB_SHAPE(2, 4));
        nb_tape *tape = nb_tape_begin();
        nb_tape_watch(tape, x2);
        nb_tape_watch(tape, gt);
        nb_tape_watch(tape, bt);
        nb_tensor *loss = nb_sum_all(nb_mul(nb_layer_norm(x2, gt, bt, 1, 1e-3), x2));
        nb_tensor *gr[3] = {0};
        CHECK_OK(nb_tape_gradient_ex(tape, loss, NULL, 3, (nb_tensor *const[]){x2, gt, bt}, gr, NB_UNCONNECTED_NULL));
        for (int i = 0; i < 8; i++)
            CHECK(gr[0] && isfinite(nb_tensor_get(gr[0], i)));
        CHECK(gr[1] && gr[2] && has_shape(gr[1], NB_SHAPE(4)) && has_shape(gr[2], NB_SHAPE(4)));
        nb_tape_stop(tape);
        /* empty: no rows, and rows of nothing */
        nb_tensor *e = nb_layer_norm(nb_zeros(dt, NB_SHAPE(0, 4)), gt, bt, 1, 1e-3);
        CHECK(e && has_shape(e, NB_SHAPE(0, 4)));
        e = nb_layer_norm(nb_zeros(dt, NB_SHAPE(3, 0)), nb_zeros(dt, NB_SHAPE(0)), NULL, 1, 1e-3);
        CHECK(e && has_shape(e, NB_SHAPE(3, 0)));
        nb_tensor *xe = nb_zeros(dt, NB_SHAPE(0, 4));
        tape = nb_tape_begin();
        nb_tape_watch(tape, xe);
        nb_tape_watch(tape, gt);
        loss = nb_sum_all(nb_layer_norm(xe, gt, bt, 1, 1e-3));
        CHECK_OK(nb_tape_gradient_ex(tape, loss, NULL, 2, (nb_tensor *const[]){xe, gt}, gr, NB_UNCONNECTED_ZERO));
        CHECK(has_shape(gr[0], NB_SHAPE(0, 4)) && has_shape(gr[1], NB_SHAPE(4)));
        nb_tape_stop(tape);
    }
}

/* Rows far from 0 with small deviations (1000 + 0.01 u) in f32: the values
 * and the gradient for x keep their digits, against the same stored values
 * in f64. */
static void layer_norm_offset_rows(void)
{
    const int64_t R = 5, D = 67;
    double *x = random_values(R * D, -1, 1), *g = random_values(D, 0.5, 1.5), *b = random_values(D, -1, 1);
    double *w = random_values(R * D, -1, 1);
    for (int64_t i = 0; i < R * D; i++)
        x[i] = (double)(float)(1000 + 0.01 * x[i]);
    double *y = malloc(sizeof(double) * (size_t)(R * D));
    ln_reference(x, R, D, g, b, 1e-5, y);
    nb_tensor *dx[2] = {0};
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_F64 : NB_F32;
        nb_tensor *xt = tensor_of(dt, NB_SHAPE(R, D), x), *gt = tensor_of(dt, NB_SHAPE(D), g);
        nb_tensor *bt = tensor_of(dt, NB_SHAPE(D), b), *wt = tensor_of(dt, NB_SHAPE(R, D), w);
        nb_tape *tape = nb_tape_begin();
        nb_tape_watch(tape, xt);
        nb_tensor *yt = nb_layer_norm(xt, gt, bt, 1, 1e-5);
        CHECKF(check_max_error(yt, y, R * D) <= (dti ? 1e-12 : 1e-5), "%s offset rows", nb_dtype_name(dt));
        CHECK_OK(nb_tape_gradient(tape, nb_sum_all(nb_mul(yt, wt)), 1, &xt, &dx[dti]));
    }
    /* dx is about rstd (~170) times g: compared relative to its largest */
    double *d32 = check_values(dx[0]), *d64 = check_values(dx[1]), worst = 0, big = 0;
    for (int64_t i = 0; i < R * D; i++) {
        big = fmax(big, fabs(d64[i]));
        worst = fmax(worst, fabs(d32[i] - d64[i]));
    }
    CHECKF(big > 10 && worst <= 1e-4 * big, "offset rows dx: %g of %g", worst, big);
    free(d32), free(d64), free(x), free(g), free(b), free(w), free(y);
}

/* batch_norm_infer: NaN stays where it is, a transposed input, empty inputs. */
static void batch_norm_infer_edges(void)
{
    const int64_t C = 3;
    double *x = random_values(4 * 5 * C, -2, 2), *g = random_values(C, 0.5, 1.5), *b = random_values(C, -1, 1);
    double *m = random_values(C, -1, 1), *v = random_values(C, 0.5, 2);
    x[7] = NAN;
    for (int dti = 0; dti < 2; dti++) {
        nb_dtype dt = dti ? NB_F64 : NB_F32;
        nb_tensor *gt = tensor_of(dt, NB_SHAPE(C), g), *bt = tensor_of(dt, NB_SHAPE(C), b);
        nb_tensor *mt = tensor_of(dt, NB_SHAPE(C), m), *vt = tensor_of(dt, NB_SHAPE(C), v);
        nb_tensor *xt = tensor_of(dt, NB_SHAPE(4, 5, C), x);
        nb_tensor *y = nb_batch_norm_infer(xt, gt, bt, mt, vt, 1e-3, NB_NHWC);
        CHECK(y);
        for (int64_t i = 0; i < 4 * 5 * C; i++) {
            double want = (x[i] - m[i % C]) / sqrt(v[i % C] + 1e-3) * g[i % C] + b[i % C];
            double got = nb_tensor_get(y, i);
            CHECKF(i == 7 ? isnan(got) : fabs(got - want) <= (dti ? 1e-12 : 1e-5), "%s element %lld",
                   nb_dtype_name(dt), (long long)i);
        }
        /* NCHW through a transposed view: the same values */
        nb_tensor *xn = nb_transpose(tensor_of(dt, NB_SHAPE(4, C, 5), x), 1, 2);
        nb_tensor *yn = nb_batch_norm_infer(xn, gt, bt, mt, vt, 1e-3, NB_NHWC);
        nb_tensor *yc = nb_batch_norm_infer(nb_contiguous(xn), gt, bt, mt, vt, 1e-3, NB_NHWC);
        CHECK(same_bits(yn, yc));
        nb_tensor *e = nb_batch_norm_infer(nb_zeros(dt, NB_SHAPE(0, C)), gt, bt, mt, vt, 1e-3, NB_NHWC);
        CHECK(e && has_shape(e, NB_SHAPE(0, C)));
        e = nb_batch_norm_infer(nb_zeros(dt, NB_SHAPE(2, C, 0, 4)), gt, bt, mt, vt, 1e-3, NB_NCHW);
        CHECK(e && has_shape(e, NB_SHAPE(2, C, 0, 4)));
    }
    free(x), free(g), free(b), free(m), free(v);
}

static void norm_errors(void)
{
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2, 3, 3, 4));
    CHECK(!nb_batch_norm_train(x, nb_ones(NB_F32, NB_SHAPE(3)), NULL, 1e-3, NB_NHWC, NULL, NULL));
    CHECK_ERROR(NB_ERR_SHAPE, "batch_norm_train", "gamma", "[4]");
    CHECK(!nb_batch_norm_train(x, NULL, nb_ones(NB_F32, NB_SHAPE(4)), 1e-3, NB_NCHW, NULL, NULL));
    CHECK_ERROR(NB_ERR_SHAPE, "batch_norm_train", "beta", "[3]");
    CHECK(!nb_batch_norm_train(x, nb_ones(NB_F64, NB_SHAPE(4)), NULL, 1e-3, NB_NHWC, NULL, NULL));
    CHECK_ERROR(NB_ERR_DTYPE, "batch_norm_train");
    CHECK(!nb_batch_norm_train(nb_zeros(NB_I32, NB_SHAPE(2, 3)), NULL, NULL, 1e-3, NB_NHWC, NULL, NULL));
    CHECK_ERROR(NB_ERR_DTYPE, "batch_norm_train");
    CHECK(!nb_batch_norm_train(nb_zeros(NB_F32, NB_SHAPE(1, 3)), NULL, NULL, 1e-3, NB_NHWC, NULL, NULL));
    CHECK_ERROR(NB_ERR_SHAPE, "batch_norm_train", "per channel");
    CHECK(!nb_batch_norm_infer(x, NULL, NULL, nb_zeros(NB_F32, NB_SHAPE(4)), nb_ones(NB_F32, NB_SHAPE(5)), 1e-3,
                               NB_NHWC));
    CHECK_ERROR(NB_ERR_SHAPE, "batch_norm_infer", "var");
    CHECK(!nb_batch_norm_infer(x, NULL, NULL, NULL, nb_ones(NB_F32, NB_SHAPE(4)), 1e-3, NB_NHWC));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "batch_norm_infer", "mean");
}

/* ---- dropout ------------------------------------------------------------------------- */

static void dropout(void)
{
    const int64_t n = 100000;
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(n));
    nb_tensor *a = nb_dropout(x, 0.3, 42), *b = nb_dropout(x, 0.3, 42), *c = nb_dropout(x, 0.3, 43);
    CHECK(a && b && c && same_bits(a, b));
    CHECK(!same_bits(a, c));
    double *v = a ? check_values(a) : NULL;
    int64_t kept = 0;
    bool values_ok = true;
    for (int64_t i = 0; v && i < n; i++) {
        kept += v[i] != 0;
        values_ok &= v[i] == 0 || fabs(v[i] - 1 / 0.7) < 1e-6;
    }
    CHECK(values_ok);
    /* 1 - rate within 5 standard deviations */
    CHECKF(fabs((double)kept / n - 0.7) < 5 * sqrt(0.21 / n), "kept %lld", (long long)kept);
    CHECK_NEAR(nb_tensor_get(nb_mean_all(a), 0), 1.0, 0.01); /* the expected value kept */
    free(v);
    /* f64 draws the same mask */
    nb_tensor *a64 = nb_dropout(nb_ones(NB_F64, NB_SHAPE(n)), 0.3, 42);
    CHECK(same_bits(nb_cast(a64, NB_F32), a));
    /* the gradient is mask / (1 - rate) */
    nb_tensor *g = NULL;
    double *xv = random_values(200, -1, 1);
    nb_tensor *x2 = nb_from_buffer(NB_F64, NB_SHAPE(4, 50), xv);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x2));
    nb_tensor *y = nb_dropout(x2, 0.5, 7);
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(y), 1, &x2, &g));
    if (g && y) {
        bool ok = true;
        for (int64_t i = 0; i < 200; i++) {
            double gi = nb_tensor_get(g, i), yi = nb_tensor_get(y, i);
            ok &= gi == 0 ? yi == 0 : (gi == 2 && fabs(yi - 2 * xv[i]) < 1e-15);
        }
        CHECK(ok);
    }
    free(xv);
    /* rate 0: x's values */
    nb_tensor *z = nb_dropout(x2, 0.0, 1);
    CHECK(same_bits(z, x2));
    CHECK(!nb_dropout(x, 1.0, 1));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "dropout", "rate");
    CHECK(!nb_dropout(x, -0.1, 1));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "dropout", "rate");
    CHECK(!nb_dropout(x, NAN, 1));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "dropout", "rate");
    CHECK(!nb_dropout(nb_zeros(NB_I32, NB_SHAPE(3)), 0.5, 1));
    CHECK_ERROR(NB_ERR_DTYPE, "dropout");
}

/* ---- embeddings ------------------------------------------------------------------------ */

static void embedding(void)
{
    double *tv = random_values(5 * 3, -1, 1);
    nb_tensor *table = nb_from_buffer(NB_F64, NB_SHAPE(5, 3), tv);
    const int32_t ids[6] = {4, 1, 4, 0, 4, 2};
    nb_tensor *it = nb_from_buffer(NB_I32, NB_SHAPE(2, 3), ids), *g = NULL;
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, table));
    nb_tensor *e = nb_embedding_lookup(table, it);
    CHECK(has_shape(e, NB_SHAPE(2, 3, 3)));
    double want[18];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            want[i * 3 + j] = tv[ids[i] * 3 + j];
    CHECK(check_max_error(e, want, 18) == 0);
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(e), 1, &table, &g));
    double wg[15] = {0};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            wg[ids[i] * 3 + j] += 1;
    CHECK(check_max_error(g, wg, 15) == 0);
    const int64_t bad[2] = {0, 5};
    CHECK(!nb_embedding_lookup(table, nb_from_buffer(NB_I64, NB_SHAPE(2), bad)));
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "embedding_lookup");
    CHECK(!nb_embedding_lookup(table, table));
    CHECK_ERROR(NB_ERR_DTYPE, "embedding_lookup", "ids");
    CHECK(!nb_embedding_lookup(nb_zeros(NB_I32, NB_SHAPE(5, 3)), it));
    CHECK_ERROR(NB_ERR_DTYPE, "embedding_lookup", "table");
    CHECK(!nb_embedding_lookup(nb_zeros(NB_F32, NB_SHAPE(5)), it));
    CHECK_ERROR(NB_ERR_SHAPE, "embedding_lookup", "table");
    free(tv);
}

/* Rows of 8 bytes taken from views at odd offsets, so that no row is aligned
 * to its size: two f32 from a reshaped slice at element 1 (the
 * embedding lookup that UBSan caught reading one uint64_t) and two i32 from
 * a gather, each from a slice at element 1. Under the sanitizer build a
 * misaligned read through a wide pointer stops the test. */
static void gather_misaligned_rows(void)
{
    const float fv[5] = {1.5f, -2.25f, 3.125f, 7.0f, -0.5f};
    nb_tensor *table = nb_reshape(nb_slice(nb_from_buffer(NB_F32, NB_SHAPE(5), fv), NB_SHAPE(1), NB_SHAPE(4)),
                                  NB_SHAPE(2, 2));
    const int32_t ids[5] = {0, 0, 1, 0, 1};
    nb_tensor *e = nb_embedding_lookup(table, nb_from_buffer(NB_I32, NB_SHAPE(5), ids));
    CHECK(has_shape(e, NB_SHAPE(5, 2)));
    double want[10];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 2; j++)
            want[i * 2 + j] = fv[1 + ids[i] * 2 + j];
    CHECK(check_max_error(e, want, 10) == 0);
    int32_t iv[9];
    for (int i = 0; i < 9; i++)
        iv[i] = i * 7 - 20;
    nb_tensor *p = nb_reshape(nb_slice(nb_from_buffer(NB_I32, NB_SHAPE(9), iv), NB_SHAPE(1), NB_SHAPE(8)),
                              NB_SHAPE(4, 2));
    const int64_t rows[5] = {3, 0, 2, 3, 1};
    nb_tensor *g = nb_gather(p, nb_from_buffer(NB_I64, NB_SHAPE(5), rows));
    CHECK(has_shape(g, NB_SHAPE(5, 2)) && nb_tensor_dtype(g) == NB_I32);
    int32_t got[10] = {0};
    CHECK_OK(nb_tensor_read(g, got, sizeof got));
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 2; j++)
            CHECKF(got[i * 2 + j] == iv[1 + rows[i] * 2 + j], "i32 rows of 2, [%d, %d]", i, j);
}

/* ---- the GPU against the CPU ------------------------------------------------------------ */

static void gpu_matches_cpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        printf("test_nn: no GPU, GPU comparisons skipped\n");
        return;
    }
    const char *gpu = nb_device_name(NB_DEVICE_GPU, 0);
    for (int k = 0; k < N_POOL_CASES; k++) {
        const pool_case *c = &pool_cases[k];
        nb_shape s = in_shape(c);
        int64_t n = numel_of(s);
        double *v = random_values(n, -2, 2);
        for (int64_t i = 0; i < n; i++)
            v[i] = floor(v[i] * 4) / 4;
        nb_tensor *x = nb_from_buffer(NB_F64, s, v), *xg = nb_to_device(x, gpu);
        for (int is_max = 0; is_max < 2; is_max++) {
            nb_tensor *gc = NULL, *gg = NULL;
            nb_tape *t1 = nb_tape_begin();
            nb_tape_watch(t1, x);
            nb_tensor *yc = pool(is_max, x, &c->o);
            CHECK_OK(nb_tape_gradient(t1, nb_sum_all(nb_mul(yc, yc)), 1, &x, &gc));
            nb_tape *t2 = nb_tape_begin();
            nb_tape_watch(t2, xg);
            nb_tensor *yg = pool(is_max, xg, &c->o);
            CHECK_OK(nb_tape_gradient(t2, nb_sum_all(nb_mul(yg, yg)), 1, &xg, &gg));
            /* max pooling picks an element: the very bits; average pooling
             * through cuDNN may divide in another order: within an ulp or two */
            double *ref = check_values(yc);
            CHECKF(on_device(yg, gpu) && (is_max ? same_bits(nb_to_device(yg, "/cpu:0"), yc)
                                                 : check_max_error(yg, ref, nb_tensor_numel(yc)) <= 1e-15),
                   "case %d values", k);
            free(ref);
            double *want = gc ? check_values(gc) : NULL;
            CHECKF(want && check_max_error(gg, want, n) <= 1e-14, "case %d gradient", k);
            free(want);
            for (int h = 0; h < 3; h++) { /* f32 inputs through the half types */
                nb_dtype dt = h == 0 ? NB_F32 : h == 1 ? NB_F16 : NB_BF16;
                nb_tensor *yh = nb_cast(pool(is_max, nb_cast(xg, dt), &c->o), NB_F64);
                double *w = check_values(yc);
                CHECKF(check_max_error(yh, w, nb_tensor_numel(yc)) <= (h ? 1e-2 : 1e-6), "case %d %s", k,
                       nb_dtype_name(dt));
                free(w);
            }
        }
        free(v);
    }
}

/* batch_norm_train's values and gradients, and dropout's mask, on the GPU
 * against the CPU. */
static void gpu_norm_matches_cpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return;
    const char *gpu = nb_device_name(NB_DEVICE_GPU, 0);
    for (int f = 0; f < 2; f++) {
        nb_shape s = f ? NB_SHAPE(3, 5, 4, 6) : NB_SHAPE(3, 4, 6, 5);
        int64_t n = numel_of(s);
        double *v = random_values(n, -2, 3), *gm = random_values(5, 0.5, 2), *bt = random_values(5, -1, 1);
        nb_tensor *in_c[3] = {nb_from_buffer(NB_F64, s, v), nb_from_buffer(NB_F64, NB_SHAPE(5), gm),
                              nb_from_buffer(NB_F64, NB_SHAPE(5), bt)};
        nb_tensor *in_g[3] = {nb_to_device(in_c[0], gpu), nb_to_device(in_c[1], gpu), nb_to_device(in_c[2], gpu)};
        nb_tensor *yv[2] = {0}, *gr[2][3] = {{0}};
        for (int d = 0; d < 2; d++) {
            nb_tensor **in = d ? in_g : in_c;
            nb_tape *t = nb_tape_begin();
            for (int i = 0; i < 3; i++)
                CHECK_OK(nb_tape_watch(t, in[i]));
            yv[d] = nb_batch_norm_train(in[0], in[1], in[2], 1e-3, f ? NB_NCHW : NB_NHWC, NULL, NULL);
            CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_mul(yv[d], nb_sin(in[0]))), 3, in, gr[d]));
        }
        CHECK(on_device(yv[1], gpu));
        nb_tensor *pairs[4][2] = {{yv[0], yv[1]}, {gr[0][0], gr[1][0]}, {gr[0][1], gr[1][1]}, {gr[0][2], gr[1][2]}};
        for (int i = 0; i < 4; i++) {
            double *want = pairs[i][0] ? check_values(pairs[i][0]) : NULL;
            CHECKF(want && check_max_error(nb_to_device(pairs[i][1], "/cpu:0"), want, nb_tensor_numel(pairs[i][0])) <= 1e-12,
                   "batch_norm %s %d", f ? "NCHW" : "NHWC", i);
            free(want);
        }
        free(v), free(gm), free(bt);
    }
    nb_tensor *ones = nb_ones(NB_F32, NB_SHAPE(1000));
    CHECK(same_bits(nb_dropout(ones, 0.4, 9), nb_to_device(nb_dropout(nb_to_device(ones, gpu), 0.4, 9), "/cpu:0")));
}

/* With --gpu, only the comparisons with a GPU (77 without one): the build
 * runs them again with NB_POOL_PLAIN=1, so that both of the GPU's pooling
 * paths (cuDNN's and nabla's own kernels) meet the CPU. */
int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--gpu") == 0) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_nn --gpu");
        RUN(gpu_matches_cpu);
        RUN(gpu_norm_matches_cpu);
        return check_finish();
    }
    RUN(pool_values);
    RUN(pool_strided_input);
    RUN(max_pool_edges);
    RUN(pool_gradient_values);
    RUN(pool_gradient_check);
    RUN(global_avg_pool);
    RUN(pool_errors);
    RUN(batch_norm_values);
    RUN(batch_norm_infinity);
    RUN(batch_norm_offset);
    RUN(norm_gradient_check);
    RUN(layer_norm_values);
    RUN(layer_norm_cases);
    RUN(layer_norm_edges);
    RUN(layer_norm_offset_rows);
    RUN(batch_norm_infer_edges);
    RUN(norm_errors);
    RUN(dropout);
    RUN(embedding);
    RUN(gather_misaligned_rows);
    RUN(gpu_matches_cpu);
    RUN(gpu_norm_matches_cpu);
    return check_finish();
}
