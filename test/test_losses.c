/* Softmax, log-softmax and the losses: values against plain C references
 * (including large logits), gradients by the checker in f64, and the errors. */
#include "check.h"


/* Reference (log-)softmax of v (shape s) along axis, into out. */
static void ref_softmax(const double *v, nb_shape s, int axis, bool log_, double *out)
{
    int64_t outer, n, inner;
    axis_split(s, axis, &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            double m = -INFINITY, sum = 0;
            for (int64_t k = 0; k < n; k++)
                m = fmax(m, v[(o * n + k) * inner + in]);
            for (int64_t k = 0; k < n; k++)
                sum += exp(v[(o * n + k) * inner + in] - m);
            for (int64_t k = 0; k < n; k++) {
                double z = v[(o * n + k) * inner + in] - m;
                out[(o * n + k) * inner + in] = log_ ? z - log(sum) : exp(z) / sum;
            }
        }
}

static double softmax_error(const nb_tensor *x, int axis, bool log_)
{
    nb_shape s = nb_tensor_shape(x);
    nb_tensor *y = log_ ? nb_log_softmax(x, axis) : nb_softmax(x, axis);
    if (!has_shape(y, s) || nb_tensor_dtype(y) != nb_tensor_dtype(x))
        return INFINITY;
    int64_t n = nb_tensor_numel(x);
    double *v = check_values(x), *ref = malloc(sizeof(double) * (size_t)n);
    ref_softmax(v, s, axis < 0 ? axis + s.ndim : axis, log_, ref);
    double e = check_max_error(y, ref, n);
    free(v);
    free(ref);
    return e;
}

static void test_softmax_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    uint64_t seed = 10;
    for (int d = 0; d < 2; d++)
        for (int lg = 0; lg < 2; lg++) {
            nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(4, 6), 0, 2, seed++);
            CHECK(softmax_error(x, -1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(x, 1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(x, 0, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(x, -2, lg) <= value_tol(dts[d]));
            nb_tensor *x3 = nb_random_normal(dts[d], NB_SHAPE(2, 3, 5), 0, 2, seed++);
            CHECK(softmax_error(x3, 1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(x3, 0, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(x3, -1, lg) <= value_tol(dts[d]));
            /* strided input */
            nb_tensor *xt = nb_transpose(nb_random_normal(dts[d], NB_SHAPE(6, 4), 0, 2, seed++), 0, 1);
            CHECK(softmax_error(xt, -1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(xt, 0, lg) <= value_tol(dts[d]));
            /* 1-d and wide rows (a multi-threaded size) */
            CHECK(softmax_error(nb_random_normal(dts[d], NB_SHAPE(9), 0, 2, seed++), 0, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(nb_random_normal(dts[d], NB_SHAPE(64, 5000), 0, 2, seed++), -1, lg) <=
                  value_tol(dts[d]));
            /* large logits: near +-1000, and rows whose spread is 2000 */
            nb_tensor *big = nb_add_scalar(nb_random_normal(dts[d], NB_SHAPE(3, 7), 0, 5, seed++), 1000);
            CHECK(softmax_error(big, -1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(big, 0, lg) <= value_tol(dts[d]));
            nb_tensor *neg = nb_add_scalar(nb_random_normal(dts[d], NB_SHAPE(3, 7), 0, 5, seed++), -1000);
            CHECK(softmax_error(neg, -1, lg) <= value_tol(dts[d]));
            const double sp[8] = {1000, -1000, 0, 999, -5, 5, 800, -800};
            nb_tensor *spread = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(2, 4), sp), dts[d]);
            CHECK(softmax_error(spread, -1, lg) <= value_tol(dts[d]));
            CHECK(softmax_error(spread, 0, lg) <= value_tol(dts[d]));
            nb_tensor *ys = lg ? nb_log_softmax(spread, -1) : nb_softmax(spread, -1);
            double *v = check_values(ys);
            for (int i = 0; i < 8; i++)
                CHECK(isfinite(v[i]) || (lg && v[i] == -INFINITY && dts[d] == NB_F32));
            free(v);
        }
    /* rows (and columns, for axis 0) sum to 1 */
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(5, 8), 0, 3, 90);
    const double ones5[5] = {1, 1, 1, 1, 1}, ones8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(check_max_error(nb_sum(nb_softmax(x, -1), NB_AXES(-1), false), ones5, 5) <= 1e-14);
    CHECK(check_max_error(nb_sum(nb_softmax(x, 0), NB_AXES(0), false), ones8, 8) <= 1e-14);
    CHECK(check_max_error(nb_sum(nb_exp(nb_log_softmax(x, -1)), NB_AXES(1), false), ones5, 5) <= 1e-14);
    nb_tensor *xf = nb_add_scalar(nb_random_normal(NB_F32, NB_SHAPE(5, 8), 0, 3, 91), 1000);
    CHECK(check_max_error(nb_sum(nb_softmax(xf, -1), NB_AXES(-1), false), ones5, 5) <= 1e-6);
}

typedef struct sm_case {
    int axis;
    bool log_;
    bool strided;
} sm_case;

static nb_tensor *gc_softmax(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const sm_case *c = user;
    const nb_tensor *x = c->strided ? nb_transpose(in[0], 0, 1) : in[0];
    return c->log_ ? nb_log_softmax(x, c->axis) : nb_softmax(x, c->axis);
}

static void test_softmax_gradients(void)
{
    uint64_t seed = 100;
    const int axes[4] = {-1, 0, 1, 2};
    for (int lg = 0; lg < 2; lg++)
        for (int a = 0; a < 4; a++)
            for (int strided = 0; strided < 2; strided++) {
                sm_case c = {axes[a], lg, strided};
                nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 4, 5), 0, 2, seed++);
                double err = -1;
                nb_status st = nb_gradient_check(gc_softmax, &c, NB_TENSORS(x), GC_EPS, GC_TOL, &err);
                if (st)
                    fprintf(stderr, "[%s] %s axis %d strided %d: %s\n", check_current, lg ? "log_softmax" : "softmax",
                            axes[a], strided, nb_error_message());
                CHECK_OK(st);
                CHECK(err >= 0 && err <= GC_TOL);
            }
    /* a 2-d case around 30 (kept moderate so the differences stay accurate) */
    sm_case c = {-1, false, false};
    nb_tensor *x = nb_add_scalar(nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 1, 150), 30);
    CHECK_OK(nb_gradient_check(gc_softmax, &c, NB_TENSORS(x), GC_EPS, GC_TOL, NULL));
    c.log_ = true;
    CHECK_OK(nb_gradient_check(gc_softmax, &c, NB_TENSORS(x), GC_EPS, GC_TOL, NULL));
}

/* ---- cross entropies ------------------------------------------------------------------ */

static nb_tensor *random_probs(nb_dtype dt, nb_shape s, uint64_t seed)
{
    return nb_softmax(nb_random_normal(dt, s, 0, 1, seed), -1);
}

static void test_softmax_cross_entropy_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++)
        for (int big = 0; big < 2; big++) {
            nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(6, 5), 0, 2, 200 + d);
            if (big)
                x = nb_add_scalar(nb_mul_scalar(x, 100), 1000);
            nb_tensor *z = random_probs(dts[d], NB_SHAPE(6, 5), 210 + d);
            nb_tensor *y = nb_softmax_cross_entropy(x, z);
            CHECK(has_shape(y, NB_SHAPE(6)) && nb_tensor_dtype(y) == dts[d]);
            double *vx = check_values(x), *vz = check_values(z), ls[30], ref[6];
            ref_softmax(vx, NB_SHAPE(6, 5), 1, true, ls);
            for (int i = 0; i < 6; i++) {
                ref[i] = 0;
                for (int k = 0; k < 5; k++)
                    ref[i] -= vz[i * 5 + k] * ls[i * 5 + k];
            }
            double e = check_max_error(y, ref, 6);
            if (!(e <= value_tol(dts[d]) * (big ? 100 : 1)))
                fprintf(stderr, "[%s] %s big %d: error %g\n", check_current, nb_dtype_name(dts[d]), big, e);
            CHECK(e <= value_tol(dts[d]) * (big ? 100 : 1));
            free(vx);
            free(vz);
        }
}

/* A loss of two inputs (logits or predictions, and labels or targets), for
 * the gradient checker: gc_pair's user. */
typedef struct pair_loss {
    nb_tensor *(*fn)(const nb_tensor *a, const nb_tensor *b);
} pair_loss;

static const pair_loss sce_loss = {nb_softmax_cross_entropy}, sigmoid_ce_loss = {nb_sigmoid_cross_entropy},
                       mse_loss = {nb_mean_squared_error};

static nb_tensor *gc_pair(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const pair_loss *loss = user;
    return loss->fn(in[0], in[1]);
}

static void test_softmax_cross_entropy_gradients(void)
{
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(4, 5), 0, 2, 220);
    nb_tensor *z = random_probs(NB_F64, NB_SHAPE(4, 5), 221);
    CHECK_GRADIENT(gc_pair, (void *)&sce_loss, NB_TENSORS(x, z));
    /* exact: d/dx = softmax(x) - z (with sum(z) = 1), d/dz = -log_softmax(x) */
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x));
    CHECK_OK(nb_tape_watch(tape, z));
    nb_tensor *y = nb_sum_all(nb_softmax_cross_entropy(x, z)), *g[2] = {NULL, NULL};
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x, z), g));
    double *vx = check_values(x), *vz = check_values(z), sm[20], ls[20], rz[20];
    ref_softmax(vx, NB_SHAPE(4, 5), 1, false, sm);
    ref_softmax(vx, NB_SHAPE(4, 5), 1, true, ls);
    for (int i = 0; i < 20; i++)
        sm[i] -= vz[i], rz[i] = -ls[i];
    CHECK(check_max_error(g[0], sm, 20) <= 1e-12);
    CHECK(check_max_error(g[1], rz, 20) <= 1e-12);
    free(vx);
    free(vz);
}

static void test_sparse_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    const int32_t l32[6] = {0, 3, 4, 1, 4, 2};
    const int64_t l64[6] = {2, 2, 0, 4, 1, 3};
    for (int d = 0; d < 2; d++)
        for (int li = 0; li < 2; li++) {
            nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(6, 5), 0, 3, 300 + d * 2 + li);
            if (d == 1 && li == 1)
                x = nb_add_scalar(x, 1000);
            nb_tensor *labels = li ? nb_from_buffer(NB_I64, NB_SHAPE(6), l64) : nb_from_buffer(NB_I32, NB_SHAPE(6), l32);
            nb_tensor *y = nb_sparse_softmax_cross_entropy(x, labels);
            CHECK(has_shape(y, NB_SHAPE(6)) && nb_tensor_dtype(y) == dts[d]);
            double *vx = check_values(x), ls[30], ref[6];
            ref_softmax(vx, NB_SHAPE(6, 5), 1, true, ls);
            for (int i = 0; i < 6; i++)
                ref[i] = -ls[i * 5 + (li ? l64[i] : l32[i])];
            CHECK(check_max_error(y, ref, 6) <= value_tol(dts[d]));
            /* equal to the dense form with one-hot labels */
            nb_tensor *dense = nb_softmax_cross_entropy(x, nb_one_hot(labels, 5, dts[d]));
            CHECK(check_max_error(dense, ref, 6) <= value_tol(dts[d]));
            free(vx);
        }
}

static nb_tensor *gc_sparse(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    return nb_sparse_softmax_cross_entropy(in[0], (const nb_tensor *)user);
}

static void test_sparse_gradients(void)
{
    const int32_t l32[4] = {1, 0, 2, 2};
    const int64_t l64[4] = {0, 2, 1, 1};
    nb_tensor *labels[2] = {nb_from_buffer(NB_I32, NB_SHAPE(4), l32), nb_from_buffer(NB_I64, NB_SHAPE(4), l64)};
    for (int li = 0; li < 2; li++) {
        nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 2, 320 + li);
        CHECK_GRADIENT(gc_sparse, labels[li], NB_TENSORS(x));
        /* exact: softmax(x) - onehot */
        nb_tape *tape = nb_tape_begin();
        CHECK_OK(nb_tape_watch(tape, x));
        nb_tensor *y = nb_sum_all(nb_sparse_softmax_cross_entropy(x, labels[li])), *g = NULL;
        CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
        double *vx = check_values(x), sm[12];
        ref_softmax(vx, NB_SHAPE(4, 3), 1, false, sm);
        for (int i = 0; i < 4; i++)
            sm[i * 3 + (li ? l64[i] : l32[i])] -= 1;
        CHECK(check_max_error(g, sm, 12) <= 1e-12);
        free(vx);
    }
}

/* The op runs as one kernel each way on the CPU: the same bits as its
 * composition of ops (values and the gradient of a weighted sum), on short
 * and long rows, many rows (threads), one class, a strided input and rows
 * with infinities. */
static nb_tensor *xent_composed(const nb_tensor *x, const nb_tensor *labels)
{
    nb_tensor *zero = nb_zeros(nb_tensor_dtype(x), NB_SCALAR);
    nb_tensor *target = nb_one_hot(labels, nb_tensor_shape(x).dims[1], NB_BOOL);
    return nb_neg(nb_sum(nb_where(target, nb_log_softmax(x, -1), zero), NB_AXES(-1), false));
}

static void test_sparse_fused_bits(void)
{
    const nb_shape shapes[5] = {NB_SHAPE(64, 10), NB_SHAPE(1000, 17), NB_SHAPE(3, 1031), NB_SHAPE(5, 1),
                                NB_SHAPE(40, 7)};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 5; s++) {
            nb_dtype dt = d ? NB_F64 : NB_F32;
            int64_t N = shapes[s].dims[0], C = shapes[s].dims[1];
            nb_tensor *x = s == 4 ? nb_transpose(nb_random_normal(dt, NB_SHAPE(C, N), 0, 4, 700 + s), 0, 1)
                                  : nb_random_normal(dt, shapes[s], 0, 4, 700 + s);
            if (s == 4) { /* infinities: -inf at a label, +inf elsewhere, -inf off the label */
                double *v = check_values(x);
                v[0] = -INFINITY, v[2 * C + 1] = INFINITY, v[3 * C + 2] = -INFINITY;
                x = nb_from_buffer(NB_F64, shapes[s], v);
                x = nb_cast(x, dt);
                free(v);
            }
            int64_t *lv = malloc(sizeof(int64_t) * (size_t)N);
            for (int64_t i = 0; i < N; i++)
                lv[i] = (i * 7 + s) % C;
            if (s == 4)
                lv[0] = 0, lv[3] = 1;
            nb_tensor *labels = nb_from_buffer(NB_I64, NB_SHAPE(N), lv);
            nb_tensor *w = nb_random_uniform(dt, NB_SHAPE(N), 0.5, 1.5, 710 + s);
            nb_tensor *gf = NULL, *gc = NULL;
            nb_tape *t1 = nb_tape_begin();
            CHECK_OK(nb_tape_watch(t1, x));
            nb_tensor *fused = nb_sparse_softmax_cross_entropy(x, labels);
            CHECK_OK(nb_tape_gradient(t1, nb_sum_all(nb_mul(fused, w)), 1, &x, &gf));
            nb_tape *t2 = nb_tape_begin();
            CHECK_OK(nb_tape_watch(t2, x));
            nb_tensor *composed = xent_composed(x, labels);
            CHECK_OK(nb_tape_gradient(t2, nb_sum_all(nb_mul(composed, w)), 1, &x, &gc));
            CHECKF(same_bits(fused, composed), "%s [%lld, %lld]: loss", nb_dtype_name(dt), (long long)N, (long long)C);
            CHECKF(same_bits(gf, gc), "%s [%lld, %lld]: gradient", nb_dtype_name(dt), (long long)N, (long long)C);
            if (s == 4)
                CHECK(nb_tensor_get(fused, 0) == INFINITY && isnan(nb_tensor_get(fused, 2)) &&
                      isfinite(nb_tensor_get(fused, 3)));
            free(lv);
        }
}

static double ref_sigmoid_ce(double x, double z)
{
    return (x > 0 ? x : 0) - x * z + log1p(exp(-fabs(x)));
}

static void test_sigmoid_cross_entropy(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(4, 5), 0, 3, 400 + d);
        nb_tensor *z = nb_random_uniform(dts[d], NB_SHAPE(4, 5), 0, 1, 410 + d);
        nb_tensor *y = nb_sigmoid_cross_entropy(x, z);
        CHECK(has_shape(y, NB_SHAPE(4, 5)) && nb_tensor_dtype(y) == dts[d]);
        double *vx = check_values(x), *vz = check_values(z), ref[20];
        for (int i = 0; i < 20; i++) {
            ref[i] = ref_sigmoid_ce(vx[i], vz[i]);
            /* the textbook form agrees for moderate logits */
            double p = 1 / (1 + exp(-vx[i]));
            CHECK_NEAR(ref[i], -(vz[i] * log(p) + (1 - vz[i]) * log(1 - p)), 1e-9);
        }
        CHECK(check_max_error(y, ref, 20) <= value_tol(dts[d]));
        free(vx);
        free(vz);
        /* extreme logits stay finite and right */
        const double xe[6] = {50, -50, 800, -800, 50, -50}, ze[6] = {1, 0, 0, 1, 0.3, 0.7};
        nb_tensor *x2 = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(6), xe), dts[d]);
        nb_tensor *z2 = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(6), ze), dts[d]);
        nb_tensor *y2 = nb_sigmoid_cross_entropy(x2, z2);
        double r2[6];
        for (int i = 0; i < 6; i++)
            r2[i] = ref_sigmoid_ce(xe[i], ze[i]);
        double *v2 = check_values(y2);
        for (int i = 0; i < 6; i++)
            CHECK(isfinite(v2[i]));
        free(v2);
        CHECK(check_max_error(y2, r2, 6) <= value_tol(dts[d]));
    }
}

static void test_sigmoid_cross_entropy_gradients(void)
{
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 4), 0, 3, 420);
    nb_tensor *z = nb_random_uniform(NB_F64, NB_SHAPE(3, 4), 0, 1, 421);
    CHECK_GRADIENT(gc_pair, (void *)&sigmoid_ce_loss, NB_TENSORS(x, z));
    /* exact at extreme logits: d/dx = sigmoid(x) - z, d/dz = -x */
    const double xe[4] = {50, -50, 30, -2}, ze[4] = {0.2, 0.9, 1, 0};
    nb_tensor *x2 = nb_from_buffer(NB_F64, NB_SHAPE(4), xe), *z2 = nb_from_buffer(NB_F64, NB_SHAPE(4), ze);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x2));
    CHECK_OK(nb_tape_watch(tape, z2));
    nb_tensor *y = nb_sum_all(nb_sigmoid_cross_entropy(x2, z2)), *g[2] = {NULL, NULL};
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x2, z2), g));
    double gx[4], gz[4];
    for (int i = 0; i < 4; i++)
        gx[i] = 1 / (1 + exp(-xe[i])) - ze[i], gz[i] = -xe[i];
    CHECK(check_max_error(g[0], gx, 4) <= 1e-12);
    CHECK(check_max_error(g[1], gz, 4) <= 1e-12);

    /* At a logit of exactly 0 (a zero-initialised output layer): the first
     * derivative is sigmoid(0) - z = 0.5 - z, the second sigmoid'(0) = 0.25. */
    const double z0[3] = {0, 0.3, 1};
    nb_tensor *x0 = nb_zeros(NB_F64, NB_SHAPE(3)), *zz = nb_from_buffer(NB_F64, NB_SHAPE(3), z0);
    nb_tape *outer = nb_tape_begin(), *inner = nb_tape_begin();
    CHECK_OK(nb_tape_watch(outer, x0));
    CHECK_OK(nb_tape_watch(inner, x0));
    nb_tensor *l = nb_sum_all(nb_sigmoid_cross_entropy(x0, zz)), *d1 = NULL, *d2 = NULL;
    CHECK_NEAR(nb_tensor_item(l), 3 * log(2.0), 1e-15);
    CHECK_OK(nb_tape_gradient(inner, l, 1, &x0, &d1));
    CHECK_OK(nb_tape_gradient(outer, nb_sum_all(d1), 1, &x0, &d2));
    const double want1[3] = {0.5, 0.2, -0.5}, want2[3] = {0.25, 0.25, 0.25};
    CHECK(check_max_error(d1, want1, 3) <= 1e-15);
    CHECK(check_max_error(d2, want2, 3) <= 1e-15);
}

static void test_mean_squared_error(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *p = nb_random_normal(dts[d], NB_SHAPE(5, 3), 0, 1, 500 + d);
        nb_tensor *t = nb_random_normal(dts[d], NB_SHAPE(5, 3), 1, 2, 510 + d);
        nb_tensor *y = nb_mean_squared_error(p, t);
        CHECK(has_shape(y, NB_SCALAR) && nb_tensor_dtype(y) == dts[d]);
        double *vp = check_values(p), *vt = check_values(t), s = 0;
        for (int i = 0; i < 15; i++)
            s += (vp[i] - vt[i]) * (vp[i] - vt[i]);
        double ref[1] = {s / 15};
        CHECK(check_max_error(y, ref, 1) <= value_tol(dts[d]));
        /* a strided prediction */
        nb_tensor *pt = nb_transpose(nb_random_normal(dts[d], NB_SHAPE(3, 5), 0, 1, 520 + d), 0, 1);
        double *vpt = check_values(pt);
        s = 0;
        for (int i = 0; i < 15; i++)
            s += (vpt[i] - vt[i]) * (vpt[i] - vt[i]);
        ref[0] = s / 15;
        CHECK(check_max_error(nb_mean_squared_error(pt, t), ref, 1) <= value_tol(dts[d]));
        free(vp);
        free(vt);
        free(vpt);
    }
    nb_tensor *p = nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 1, 530);
    nb_tensor *t = nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 1, 531);
    CHECK_GRADIENT(gc_pair, (void *)&mse_loss, NB_TENSORS(p, t));
    /* exact: d/dp = 2 (p - t) / n */
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, p));
    nb_tensor *y = nb_mean_squared_error(p, t), *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(p), &g));
    double *vp = check_values(p), *vt = check_values(t), r[12];
    for (int i = 0; i < 12; i++)
        r[i] = 2 * (vp[i] - vt[i]) / 12;
    CHECK(check_max_error(g, r, 12) <= 1e-14);
    free(vp);
    free(vt);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(4, 3), 0, 1, 1);
    nb_tensor *z = nb_random_uniform(NB_F32, NB_SHAPE(4, 2), 0, 1, 2);
    nb_tensor *zd = nb_random_uniform(NB_F64, NB_SHAPE(4, 3), 0, 1, 3);
    nb_tensor *x1 = nb_random_normal(NB_F32, NB_SHAPE(12), 0, 1, 4);

    /* softmax / log_softmax */
    CHECK(nb_softmax(x, 2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "softmax", "axis");
    CHECK(nb_log_softmax(x, -3) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "log_softmax", "axis");
    CHECK(nb_softmax(nb_scalar(NB_F32, 1), 0) == NULL);
    CHECK(nb_error() != NB_OK);
    nb_error_clear();
    const int32_t iv[4] = {1, 2, 3, 4};
    nb_tensor *ints = nb_from_buffer(NB_I32, NB_SHAPE(4), iv);
    CHECK(nb_softmax(ints, 0) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "softmax", "i32");
    CHECK(nb_softmax(NULL, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");

    /* dense cross entropy */
    CHECK(nb_softmax_cross_entropy(x, z) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "softmax_cross_entropy", "[4, 3]", "[4, 2]");
    CHECK(nb_softmax_cross_entropy(x, zd) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "softmax_cross_entropy", "f32", "f64");
    CHECK(nb_softmax_cross_entropy(x1, x1) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "softmax_cross_entropy", "[12]");
    CHECK(nb_softmax_cross_entropy(x, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 1 is NULL");

    /* sparse cross entropy */
    const int32_t bad_hi[4] = {0, 1, 3, 2}, bad_lo[4] = {0, -1, 2, 2};
    const int64_t bad64[4] = {0, 1, 2, 7};
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I32, NB_SHAPE(4), bad_hi)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "sparse_softmax_cross_entropy", "outside", "3");
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I32, NB_SHAPE(4), bad_lo)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "outside", "-1");
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I64, NB_SHAPE(4), bad64)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "outside", "7");
    const int64_t huge[4] = {0, INT64_MIN, 1, INT64_MAX}; /* the message must not cast them back */
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I64, NB_SHAPE(4), huge)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "outside", "-9223372036854775808", "position 1");
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I32, NB_SHAPE(3), iv)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "sparse_softmax_cross_entropy", "[3]", "[4, 3]");
    CHECK(nb_sparse_softmax_cross_entropy(x, nb_from_buffer(NB_I32, NB_SHAPE(4, 1), iv)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "[4, 1]");
    CHECK(nb_sparse_softmax_cross_entropy(x, x1) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "labels", "f32");
    CHECK(nb_sparse_softmax_cross_entropy(x1, ints) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "[12]");

    /* sigmoid cross entropy and mse */
    CHECK(nb_sigmoid_cross_entropy(x, z) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "sigmoid_cross_entropy", "[4, 3]", "[4, 2]");
    CHECK(nb_sigmoid_cross_entropy(x, zd) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "f32", "f64");
    CHECK(nb_mean_squared_error(x, z) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "mean_squared_error", "[4, 3]", "[4, 2]");
    CHECK(nb_mean_squared_error(x, x1) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "[4, 3]", "[12]");
    CHECK(nb_mean_squared_error(x, zd) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "f32", "f64");
    CHECK(nb_mean_squared_error(NULL, x) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");

    /* the first error survives a chain */
    CHECK(nb_mean_all(nb_softmax_cross_entropy(nb_log_softmax(x, 5), z)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "log_softmax", "axis");
}

/* Second order through every loss: the checker differentiates the inner tape's
 * gradient of sum(loss * loss) w.r.t. the first input. */
typedef nb_tensor *(*loss_fn)(int n, nb_tensor *const *in, void *user);
typedef struct second_case {
    loss_fn fn;
    void *user;
} second_case;

static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    const second_case *c = user;
    nb_tensor *g[2] = {NULL, NULL};
    if (!grads_of_square_sum(c->fn, c->user, n, in, g))
        return NULL;
    return n == 2 ? nb_add(g[0], nb_sum_all(g[1])) : g[0];
}

static void test_second_order(void)
{
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 4), 0, 2, 600);
    nb_tensor *z = random_probs(NB_F64, NB_SHAPE(3, 4), 601);
    nb_tensor *u = nb_random_uniform(NB_F64, NB_SHAPE(3, 4), 0, 1, 602);
    const int64_t lv[3] = {3, 0, 2};
    nb_tensor *labels = nb_from_buffer(NB_I64, NB_SHAPE(3), lv);
    sm_case sm[4] = {{-1, false, false}, {0, false, false}, {-1, true, false}, {0, true, true}};
    for (int i = 0; i < 4; i++) {
        second_case c = {gc_softmax, &sm[i]};
        nb_tensor *xi = i == 3 ? nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 2, 603) : x;
        nb_status st = nb_gradient_check(gc_second, &c, NB_TENSORS(xi), GC_EPS, 1e-5, NULL);
        if (st)
            fprintf(stderr, "[%s] softmax case %d: %s\n", check_current, i, nb_error_message());
        CHECK_OK(st);
    }
    second_case sce = {gc_pair, (void *)&sce_loss}, sp = {gc_sparse, labels};
    second_case sig = {gc_pair, (void *)&sigmoid_ce_loss}, mse = {gc_pair, (void *)&mse_loss};
    CHECK_OK(nb_gradient_check(gc_second, &sce, NB_TENSORS(x, z), GC_EPS, 1e-5, NULL));
    CHECK_OK(nb_gradient_check(gc_second, &sp, NB_TENSORS(x), GC_EPS, 1e-5, NULL));
    CHECK_OK(nb_gradient_check(gc_second, &sig, NB_TENSORS(x, u), GC_EPS, 1e-5, NULL));
    CHECK_OK(nb_gradient_check(gc_second, &mse, NB_TENSORS(x, u), GC_EPS, 1e-5, NULL));
}

/* Losses at infinite logits: sparse_softmax_cross_entropy picks the label's
 * log-probability, so a -inf logit of another class leaves it finite (the
 * one-hot product made 0 * -inf = NaN); sigmoid_cross_entropy of +-inf is +inf
 * unless the label makes it 0 * inf (was inf - inf = NaN), its slope finite. */
static void test_losses_at_infinite_logits(void)
{
    const double lv[3] = {-INFINITY, 0, 1};
    const int64_t yv[1] = {2};
    nb_tensor *logits = nb_from_buffer(NB_F64, NB_SHAPE(1, 3), lv), *g = NULL;
    nb_tensor *labels = nb_from_buffer(NB_I64, NB_SHAPE(1), yv);
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, logits));
    nb_tensor *loss = nb_sparse_softmax_cross_entropy(logits, labels);
    const double e = exp(1.0);
    CHECK_NEAR(nb_tensor_item(loss), log(1 + e) - 1, 1e-15);
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(loss), 1, &logits, &g));
    const double want[3] = {0, 1 / (1 + e), e / (1 + e) - 1};
    CHECK(check_max_error(g, want, 3) <= 1e-15);

    const double xv[4] = {INFINITY, -INFINITY, INFINITY, -INFINITY}, zv[4] = {0.25, 0.25, 0, 1};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(4), xv), *z = nb_from_buffer(NB_F64, NB_SHAPE(4), zv);
    nb_tensor *gx = NULL;
    nb_tape *t2 = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t2, x));
    nb_tensor *l = nb_sigmoid_cross_entropy(x, z);
    for (int i = 0; i < 4; i++)
        CHECKF(nb_tensor_get(l, i) == INFINITY, "element %d is %g", i, nb_tensor_get(l, i));
    CHECK_OK(nb_tape_gradient(t2, nb_sum_all(l), 1, &x, &gx));
    const double wantx[4] = {0.75, -0.25, 1, -1};
    CHECK(check_max_error(gx, wantx, 4) == 0);
}

/* No examples and no classes: logits [0, 0] give an empty loss [0] (one_hot
 * refused the depth 0 with an error naming it). */
static void test_sparse_no_classes(void)
{
    nb_tensor *logits = nb_zeros(NB_F64, NB_SHAPE(0, 0)), *labels = nb_zeros(NB_I64, NB_SHAPE(0)), *g = NULL;
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, logits));
    nb_tensor *loss = nb_sparse_softmax_cross_entropy(logits, labels);
    CHECK(has_shape(loss, NB_SHAPE(0)));
    CHECK_OK(nb_tape_gradient_ex(t, loss, NULL, 1, &logits, &g, NB_UNCONNECTED_ZERO));
    CHECK(has_shape(g, NB_SHAPE(0, 0)));
}

int main(void)
{
    RUN(test_softmax_values);
    RUN(test_softmax_gradients);
    RUN(test_softmax_cross_entropy_values);
    RUN(test_softmax_cross_entropy_gradients);
    RUN(test_sparse_values);
    RUN(test_sparse_gradients);
    RUN(test_sparse_fused_bits);
    RUN(test_sigmoid_cross_entropy);
    RUN(test_sigmoid_cross_entropy_gradients);
    RUN(test_mean_squared_error);
    RUN(test_losses_at_infinite_logits);
    RUN(test_sparse_no_classes);
    RUN(test_second_order);
    RUN(test_errors);
    return check_finish();
}
