/* Reductions: sum, mean, max, min, prod, logsumexp over axes (single, several,
 * negative, all; keepdims or not), sum_all/mean_all, argmax/argmin; values against
 * plain C references, gradients by the checker, tie sharing, and the errors. */
#include "check.h"

static nb_shape reduced_shape(nb_shape s, int mask, bool keepdims)
{
    nb_shape o = {0, {0}};
    for (int i = 0; i < s.ndim; i++) {
        if (!(mask & (1 << i)))
            o.dims[o.ndim++] = s.dims[i];
        else if (keepdims)
            o.dims[o.ndim++] = 1;
    }
    return o;
}

/* Output flat index (keepdims layout, which has the same order either way). */
static int64_t out_index(nb_shape s, int mask, int64_t flat)
{
    int64_t idx[NB_MAX_DIMS];
    for (int d = s.ndim - 1; d >= 0; d--) {
        idx[d] = flat % s.dims[d];
        flat /= s.dims[d];
    }
    int64_t o = 0;
    for (int d = 0; d < s.ndim; d++)
        if (!(mask & (1 << d)))
            o = o * s.dims[d] + idx[d];
    return o;
}

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_LSE, R_COUNT };
static const char *rnames[R_COUNT] = {"sum", "mean", "max", "min", "prod", "logsumexp"};
static nb_tensor *(*const rops[R_COUNT])(const nb_tensor *, nb_axes, bool) = {
    nb_sum, nb_mean, nb_max, nb_min, nb_prod, nb_logsumexp};

/* Reference reduction of values v of shape s over mask; out has numel of result. */
static void ref_reduce(int kind, const double *v, nb_shape s, int mask, double *out, int64_t nout)
{
    int64_t n = numel_of(s);
    double *cnt = calloc((size_t)nout, sizeof(double));
    double *mx = malloc(sizeof(double) * (size_t)nout);
    for (int64_t o = 0; o < nout; o++)
        mx[o] = -INFINITY;
    if (kind == R_LSE)
        for (int64_t i = 0; i < n; i++) {
            int64_t o = out_index(s, mask, i);
            if (v[i] > mx[o])
                mx[o] = v[i];
        }
    for (int64_t o = 0; o < nout; o++)
        out[o] = kind == R_PROD ? 1 : kind == R_MAX ? -INFINITY : kind == R_MIN ? INFINITY : 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t o = out_index(s, mask, i);
        cnt[o] += 1;
        switch (kind) {
        case R_SUM: case R_MEAN: out[o] += v[i]; break;
        case R_MAX: out[o] = v[i] > out[o] ? v[i] : out[o]; break;
        case R_MIN: out[o] = v[i] < out[o] ? v[i] : out[o]; break;
        case R_PROD: out[o] *= v[i]; break;
        case R_LSE: out[o] += exp(v[i] - mx[o]); break;
        }
    }
    for (int64_t o = 0; o < nout; o++) {
        if (kind == R_MEAN)
            out[o] /= cnt[o];
        if (kind == R_LSE)
            out[o] = mx[o] + log(out[o]);
    }
    free(cnt);
    free(mx);
}

static double reduce_error(int kind, const nb_tensor *x, nb_axes axes, bool keepdims)
{
    nb_shape s = nb_tensor_shape(x);
    int mask = axes_mask(axes, s.ndim);
    nb_shape so = reduced_shape(s, mask, keepdims);
    nb_tensor *y = rops[kind](x, axes, keepdims);
    if (!has_shape(y, so) || nb_tensor_dtype(y) != nb_tensor_dtype(x)) {
        fprintf(stderr, "[%s] %s: wrong result shape or dtype\n", check_current, rnames[kind]);
        return INFINITY;
    }
    int64_t nout = numel_of(so);
    double *v = check_values(x), *ref = malloc(sizeof(double) * (size_t)nout);
    ref_reduce(kind, v, s, mask, ref, nout);
    double e = check_max_error(y, ref, nout);
    free(v);
    free(ref);
    return e;
}

static const nb_axes axes_cases[] = {
    {1, {0}}, {1, {1}}, {1, {2}}, {1, {-1}}, {1, {-3}}, {2, {0, 2}}, {2, {-1, -3}},
    {2, {2, 1}}, {3, {0, 1, 2}}, {0, {0}} /* NB_ALL_AXES */,
};
#define N_AXES (int)(sizeof axes_cases / sizeof *axes_cases)

static nb_tensor *input_for(int kind, nb_dtype dt, nb_shape s, uint64_t seed, bool strided)
{
    nb_shape t = s;
    if (strided) {
        t.dims[0] = s.dims[s.ndim - 1];
        t.dims[s.ndim - 1] = s.dims[0];
    }
    nb_tensor *x = kind == R_PROD ? nb_random_uniform(dt, t, 0.6, 1.5, seed) : nb_random_normal(dt, t, 0, 1, seed);
    return strided ? nb_transpose(x, 0, s.ndim - 1) : x;
}

static void test_reduce_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    uint64_t seed = 10;
    for (int k = 0; k < R_COUNT; k++)
        for (int d = 0; d < 2; d++)
            for (int strided = 0; strided < 2; strided++)
                for (int a = 0; a < N_AXES; a++)
                    for (int keep = 0; keep < 2; keep++) {
                        nb_tensor *x = input_for(k, dts[d], NB_SHAPE(3, 4, 5), seed++, strided);
                        CHECK(!strided || !nb_tensor_is_contiguous(x));
                        double e = reduce_error(k, x, axes_cases[a], keep);
                        if (!(e <= value_tol(dts[d])))
                            fprintf(stderr, "[%s] %s %s strided %d axes case %d keep %d: error %g\n",
                                    check_current, rnames[k], nb_dtype_name(dts[d]), strided, a, keep, e);
                        CHECK(e <= value_tol(dts[d]));
                    }
    /* 1-d, 0-d and larger inputs */
    for (int k = 0; k < R_COUNT; k++)
        for (int d = 0; d < 2; d++) {
            CHECK(reduce_error(k, input_for(k, dts[d], NB_SHAPE(17), seed++, false), NB_AXES(0), false) <= value_tol(dts[d]));
            CHECK(reduce_error(k, input_for(k, dts[d], NB_SCALAR, seed++, false), NB_ALL_AXES, false) <= value_tol(dts[d]));
            CHECK(reduce_error(k, input_for(k, dts[d], NB_SCALAR, seed++, false), NB_ALL_AXES, true) <= value_tol(dts[d]));
            CHECK(reduce_error(k, input_for(k, dts[d], NB_SHAPE(2, 3, 4, 5), seed++, true), NB_AXES(1, 3), true) <= value_tol(dts[d]));
            if (k != R_PROD) {
                double e = reduce_error(k, input_for(k, dts[d], NB_SHAPE(300, 1000), seed++, false), NB_AXES(0), false);
                CHECK(e <= (dts[d] == NB_F32 ? 1e-4 : 1e-11));
                e = reduce_error(k, input_for(k, dts[d], NB_SHAPE(300, 1000), seed++, true), NB_AXES(-1), true);
                CHECK(e <= (dts[d] == NB_F32 ? 1e-4 : 1e-11));
            }
        }
}

static void test_integer_reduce(void)
{
    const int32_t v32[6] = {4, -7, 2, 9, 9, -1};
    const int64_t v64[6] = {4000000000LL, -7, 2, 9, 9, -1};
    for (int d = 0; d < 2; d++) {
        nb_tensor *x = d ? nb_from_buffer(NB_I64, NB_SHAPE(2, 3), v64) : nb_from_buffer(NB_I32, NB_SHAPE(2, 3), v32);
        double a0 = d ? 4e9 : 4;
        nb_tensor *s = nb_sum(x, NB_AXES(1), false), *m = nb_max(x, NB_AXES(0), false);
        nb_tensor *n = nb_min(x, NB_ALL_AXES, false), *p = nb_prod(x, NB_AXES(-1), true);
        const double rs[2] = {a0 - 7 + 2, 9 + 9 - 1}, rm[3] = {a0 > 9 ? a0 : 9, 9, 2}, rn[1] = {-7}, rp[2] = {a0 * -14, -81};
        CHECK(s && nb_tensor_dtype(s) == nb_tensor_dtype(x));
        CHECK(check_max_error(s, rs, 2) == 0);
        CHECK(check_max_error(m, rm, 3) == 0);
        CHECK(check_max_error(n, rn, 1) == 0);
        CHECK(has_shape(p, NB_SHAPE(2, 1)) && check_max_error(p, rp, 2) == 0);
        CHECK(nb_mean(x, NB_AXES(0), false) == NULL); /* mean is floating only */
        CHECK_ERROR(NB_ERR_DTYPE, "mean");
    }
}

static void test_sum_mean_all(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(6, 7, 3), 0.5, 2, 40 + d);
        nb_tensor *xt = nb_transpose(x, 0, 2);
        double *v = check_values(x), s = 0;
        for (int i = 0; i < 126; i++)
            s += v[i];
        double rs[1] = {s}, rm[1] = {s / 126};
        nb_tensor *ys[4] = {nb_sum_all(x), nb_mean_all(x), nb_sum_all(xt), nb_mean_all(xt)};
        for (int k = 0; k < 4; k++) {
            CHECK(has_shape(ys[k], NB_SCALAR) && nb_tensor_dtype(ys[k]) == dts[d]);
            CHECK(check_max_error(ys[k], k % 2 ? rm : rs, 1) <= value_tol(dts[d]));
        }
        free(v);
    }
    /* big: the threaded path */
    nb_tensor *big = nb_random_uniform(NB_F64, NB_SHAPE(400000), -1, 3, 49);
    double *v = check_values(big), s = 0;
    for (int i = 0; i < 400000; i++)
        s += v[i];
    double rs[1] = {s}, rm[1] = {s / 400000};
    CHECK(check_max_error(nb_sum_all(big), rs, 1) <= 1e-11);
    CHECK(check_max_error(nb_mean_all(big), rm, 1) <= 1e-11);
    free(v);
}

/* The largest of row[0..n); *sum gets the sum of exp(row[i] - that largest),
 * the stable parts of the row's logsumexp and softmax. */
static double max_and_exp_sum(const double *row, int n, double *sum)
{
    double m = -INFINITY, s = 0;
    for (int c = 0; c < n; c++)
        m = fmax(m, row[c]);
    for (int c = 0; c < n; c++)
        s += exp(row[c] - m);
    *sum = s;
    return m;
}

static void test_logsumexp_stable(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        /* rows around +1000, -1000 and mixed, where a naive exp overflows */
        const double v[12] = {1000, 1001, 999.5, 1000.25, -1000, -1001, -999, -1000.5, 1000, -1000, 0, 3};
        nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(3, 4), v);
        if (dts[d] == NB_F32)
            x = nb_cast(x, NB_F32);
        double ref[3];
        for (int r = 0; r < 3; r++) {
            double s, m = max_and_exp_sum(v + r * 4, 4, &s);
            ref[r] = m + log(s);
        }
        nb_tensor *y = nb_logsumexp(x, NB_AXES(-1), false);
        CHECK(has_shape(y, NB_SHAPE(3)));
        CHECK(check_max_error(y, ref, 3) <= value_tol(dts[d]));
        /* random data shifted by 1000 */
        nb_tensor *z = nb_add_scalar(nb_random_normal(dts[d], NB_SHAPE(4, 6), 0, 3, 50 + d), 1000);
        CHECK(reduce_error(R_LSE, z, NB_AXES(1), true) <= value_tol(dts[d]));
        CHECK(reduce_error(R_LSE, z, NB_ALL_AXES, false) <= value_tol(dts[d]));
        nb_tensor *zn = nb_add_scalar(nb_random_normal(dts[d], NB_SHAPE(4, 6), 0, 3, 52 + d), -1000);
        CHECK(reduce_error(R_LSE, zn, NB_AXES(0), false) <= value_tol(dts[d]));
    }
    /* its gradient at large values is the softmax of each row, finite */
    const double v[8] = {1000, 1001, 999, 1000.5, -1000, -999.5, -1001, -1000};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(2, 4), v);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x));
    nb_tensor *y = nb_logsumexp(x, NB_AXES(1), false), *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
    double ref[8];
    for (int r = 0; r < 2; r++) {
        double s, m = max_and_exp_sum(v + r * 4, 4, &s);
        for (int c = 0; c < 4; c++)
            ref[r * 4 + c] = exp(v[r * 4 + c] - m) / s;
    }
    CHECK(check_max_error(g, ref, 8) <= TOL64);
}

/* ---- gradients ---------------------------------------------------------------------- */

typedef struct red_case {
    int kind;
    nb_axes axes;
    bool keepdims;
    bool strided;
} red_case;

static nb_tensor *gc_reduce(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const red_case *c = user;
    const nb_tensor *x = c->strided ? nb_transpose(in[0], 0, nb_tensor_ndim(in[0]) - 1) : in[0];
    return rops[c->kind](x, c->axes, c->keepdims);
}

static void test_reduce_gradients(void)
{
    uint64_t seed = 600;
    for (int k = 0; k < R_COUNT; k++)
        for (int a = 0; a < N_AXES; a++)
            for (int keep = 0; keep < 2; keep++)
                for (int strided = 0; strided < 2; strided++) {
                    red_case c = {k, axes_cases[a], keep, strided};
                    nb_tensor *x = input_for(k, NB_F64, NB_SHAPE(3, 4, 5), seed++, false);
                    if (k == R_LSE)
                        x = nb_add_scalar(x, 50); /* shifted values through the stable path */
                    double err = -1;
                    nb_status st = nb_gradient_check(gc_reduce, &c, NB_TENSORS(x), GC_EPS, GC_TOL, &err);
                    if (st)
                        fprintf(stderr, "[%s] %s axes case %d keep %d strided %d: %s\n", check_current,
                                rnames[k], a, keep, strided, nb_error_message());
                    CHECK_OK(st);
                }
    /* sum_all, mean_all */
    red_case c = {R_SUM, NB_ALL_AXES, false, false};
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(4, 3), 0, 1, 700);
    CHECK_OK(nb_gradient_check(gc_reduce, &c, NB_TENSORS(x), GC_EPS, GC_TOL, NULL));
    c.kind = R_MEAN;
    CHECK_OK(nb_gradient_check(gc_reduce, &c, NB_TENSORS(x), GC_EPS, GC_TOL, NULL));
}

static nb_tensor *grad_of(nb_tensor *(*op)(const nb_tensor *, nb_axes, bool), nb_tensor *x, nb_axes axes)
{
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x));
    nb_tensor *y = op(x, axes, false);
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
    return g;
}

static void test_ties_share(void)
{
    const double v1[3] = {1, 3, 3}, g1[3] = {0, .5, .5};
    nb_tensor *x1 = nb_from_buffer(NB_F64, NB_SHAPE(3), v1);
    CHECK(check_max_error(grad_of(nb_max, x1, NB_ALL_AXES), g1, 3) <= 1e-15);
    const double v2[4] = {2, 1, 1, 5}, g2[4] = {0, .5, .5, 0};
    nb_tensor *x2 = nb_from_buffer(NB_F64, NB_SHAPE(4), v2);
    CHECK(check_max_error(grad_of(nb_min, x2, NB_AXES(0)), g2, 4) <= 1e-15);
    const double v3[6] = {1, 3, 3, 4, 4, 0}, g3[6] = {0, .5, .5, .5, .5, 0};
    nb_tensor *x3 = nb_from_buffer(NB_F64, NB_SHAPE(2, 3), v3);
    CHECK(check_max_error(grad_of(nb_max, x3, NB_AXES(1)), g3, 6) <= 1e-15);
    const double v4[6] = {7, 7, 7, 7, 7, 7}, g4[6] = {1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6};
    nb_tensor *x4 = nb_from_buffer(NB_F64, NB_SHAPE(2, 3), v4);
    CHECK(check_max_error(grad_of(nb_min, x4, NB_ALL_AXES), g4, 6) <= 1e-15);
    /* column-wise over axis 0 with a 3-way tie */
    const double v5[6] = {2, 5, 2, 2, 1, 2}, g5[6] = {.5, 1, .5, .5, 0, .5};
    nb_tensor *x5 = nb_from_buffer(NB_F64, NB_SHAPE(2, 3), v5);
    CHECK(check_max_error(grad_of(nb_max, x5, NB_AXES(0)), g5, 6) <= 1e-15);
    /* f32 too */
    nb_tensor *x6 = nb_cast(x1, NB_F32);
    CHECK(check_max_error(grad_of(nb_max, x6, NB_ALL_AXES), g1, 3) <= 1e-7);
}

/* ---- arg reductions --------------------------------------------------------------- */

static void ref_arg(bool is_max, const double *v, nb_shape s, int axis, double *out)
{
    int64_t outer, n, inner;
    axis_split(s, axis, &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            int64_t best = 0;
            for (int64_t k = 1; k < n; k++) {
                double c = v[(o * n + k) * inner + in], b = v[(o * n + best) * inner + in];
                if (is_max ? c > b : c < b)
                    best = k;
            }
            out[o * inner + in] = (double)best;
        }
}

static void test_arg_reduce(void)
{
    const nb_dtype dts[4] = {NB_F32, NB_F64, NB_I32, NB_I64};
    uint64_t seed = 800;
    for (int d = 0; d < 4; d++)
        for (int is_max = 0; is_max < 2; is_max++)
            for (int axis = -3; axis < 3; axis++)
                for (int keep = 0; keep < 2; keep++)
                    for (int ties = 0; ties < 2; ties++) {
                        nb_shape s = NB_SHAPE(3, 4, 5);
                        nb_tensor *x = nb_random_normal(NB_F64, s, 0, 1, seed++);
                        if (ties) /* few distinct values: ties everywhere */
                            x = nb_cast(nb_cast(nb_mul_scalar(x, 1.2), NB_I32), NB_F64);
                        if (dts[d] != NB_F64)
                            x = nb_cast(x, dts[d]);
                        int a = axis < 0 ? axis + 3 : axis;
                        nb_tensor *y = is_max ? nb_argmax(x, axis, keep) : nb_argmin(x, axis, keep);
                        nb_shape so = reduced_shape(s, 1 << a, keep);
                        CHECK(has_shape(y, so) && nb_tensor_dtype(y) == NB_I64);
                        double *v = check_values(x), ref[20];
                        ref_arg(is_max, v, s, a, ref);
                        double e = check_max_error(y, ref, numel_of(so));
                        if (e != 0)
                            fprintf(stderr, "[%s] %s %s axis %d keep %d ties %d wrong\n", check_current,
                                    is_max ? "argmax" : "argmin", nb_dtype_name(dts[d]), axis, keep, ties);
                        CHECK(e == 0);
                        free(v);
                    }
    /* explicit first-index ties, and a strided input */
    const double v[8] = {1, 5, 5, 0, 0, 2, -1, -1};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(8), v);
    CHECK(nb_tensor_item(nb_argmax(x, 0, false)) == 1);
    CHECK(nb_tensor_item(nb_argmin(x, 0, false)) == 6);
    nb_tensor *m = nb_from_buffer(NB_F64, NB_SHAPE(2, 4), v); /* transposed: [4, 2] */
    nb_tensor *mt = nb_transpose(m, 0, 1);
    const double rmax[2] = {1, 1}, rmin[2] = {3, 2}, rmax0[4] = {0, 0, 0, 0}, rmin0[4] = {1, 1, 1, 1};
    CHECK(check_max_error(nb_argmax(mt, 0, false), rmax, 2) == 0);
    CHECK(check_max_error(nb_argmin(mt, 0, false), rmin, 2) == 0);
    CHECK(check_max_error(nb_argmax(mt, 1, false), rmax0, 4) == 0);
    CHECK(check_max_error(nb_argmin(mt, -1, true), rmin0, 4) == 0);
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(2, 3, 4), 0, 1, 900);
    for (int k = 0; k < R_COUNT; k++) {
        CHECK(rops[k](x, NB_AXES(3), false) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, rnames[k], "axis", "3");
        CHECK(rops[k](x, NB_AXES(0, -4), true) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, rnames[k], "axis", "-4");
        CHECK(rops[k](x, NB_AXES(1, -2), false) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, rnames[k], "axis", "repeated");
        CHECK(rops[k](x, NB_AXES(2, 0, 2), false) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "repeated");
        CHECK(rops[k](NULL, NB_AXES(0), false) == NULL);
        CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, rnames[k], "input 0 is NULL");
    }
    CHECK(nb_argmax(x, 3, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "argmax", "axis");
    CHECK(nb_argmin(x, -4, true) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "argmin", "axis");
    CHECK(nb_argmax(NULL, 0, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");
    CHECK(nb_sum_all(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT);
    /* a chain keeps the first error */
    CHECK(nb_mean_all(nb_exp(nb_sum(x, NB_AXES(7), false))) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "sum", "axis 7");
    /* logsumexp of integers */
    nb_tensor *i = nb_from_buffer(NB_I32, NB_SHAPE(2), (const int32_t[]){1, 2});
    CHECK(nb_logsumexp(i, NB_ALL_AXES, false) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "logsumexp", "i32");
}

/* Second order: the checker differentiates the inner tape's gradient of
 * sum(y * y) (y the reduction). */
static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const red_case *c = user;
    nb_tape *inner = nb_tape_begin();
    if (nb_tape_watch(inner, in[0]))
        return NULL;
    nb_tensor *y = rops[c->kind](in[0], c->axes, c->keepdims);
    nb_tensor *g = NULL;
    if (nb_tape_gradient(inner, nb_sum_all(nb_mul(y, y)), NB_TENSORS(in[0]), &g))
        return NULL;
    return g;
}

static void test_second_order(void)
{
    uint64_t seed = 1000;
    for (int k = 0; k < R_COUNT; k++)
        for (int a = 0; a < N_AXES; a += 3) {
            red_case c = {k, axes_cases[a], a % 2 == 0, false};
            nb_tensor *x = input_for(k, NB_F64, NB_SHAPE(2, 3, 4), seed++, false);
            nb_status st = nb_gradient_check(gc_second, &c, NB_TENSORS(x), GC_EPS, 1e-5, NULL);
            if (st)
                fprintf(stderr, "[%s] %s axes case %d: %s\n", check_current, rnames[k], a, nb_error_message());
            CHECK_OK(st);
        }
}

/* Size-1 dims, reducing a size-1 axis, and a 1-element tensor. */
static void test_degenerate_shapes(void)
{
    const nb_shape shapes[3] = {NB_SHAPE(1, 5, 1), NB_SHAPE(4, 1), NB_SHAPE(1)};
    const nb_axes axs[3] = {NB_AXES(0), NB_AXES(-1), NB_AXES(0, 2)};
    uint64_t seed = 1100;
    for (int k = 0; k < R_COUNT; k++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                if (axs[j].n > shapes[i].ndim || (axs[j].n == 2 && shapes[i].ndim < 3))
                    continue;
                for (int keep = 0; keep < 2; keep++) {
                    nb_tensor *x = input_for(k, NB_F64, shapes[i], seed++, false);
                    CHECK(reduce_error(k, x, axs[j], keep) <= TOL64);
                    red_case c = {k, axs[j], keep, false};
                    CHECK_OK(nb_gradient_check(gc_reduce, &c, NB_TENSORS(x), GC_EPS, GC_TOL, NULL));
                }
            }
}

/* prod's gradient where inputs are 0 is the product of the others (never
 * prod / 0); logsumexp of infinite inputs is -inf or +inf, of NaN is NaN, and
 * over an empty axis -inf; as PyTorch gives. */
static void test_reduce_edge_points(void)
{
    const double rows[3][3] = {{0, 2, 3}, {0, 0, 3}, {4, 2, 3}};
    const double want[3][3] = {{6, 0, 0}, {0, 0, 0}, {6, 12, 8}};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(3, 3), rows), *g = NULL;
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, x));
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_prod(x, NB_AXES(1), false)), 1, &x, &g));
    CHECK(check_max_error(g, &want[0][0], 9) == 0);

    const double lv[4][2] = {{-INFINITY, -INFINITY}, {INFINITY, 1}, {-INFINITY, 0}, {NAN, 1}};
    nb_tensor *l = nb_logsumexp(nb_from_buffer(NB_F64, NB_SHAPE(4, 2), lv), NB_AXES(1), false);
    CHECK(has_shape(l, NB_SHAPE(4)));
    CHECK(nb_tensor_get(l, 0) == -INFINITY);
    CHECK(nb_tensor_get(l, 1) == INFINITY);
    CHECK(nb_tensor_get(l, 2) == 0);
    CHECK(isnan(nb_tensor_get(l, 3)));

    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(3, 0));
    nb_tensor *le = nb_logsumexp(e, NB_AXES(1), false), *lk = nb_logsumexp(e, NB_AXES(1), true);
    CHECK(has_shape(le, NB_SHAPE(3)) && has_shape(lk, NB_SHAPE(3, 1)));
    for (int i = 0; i < 3; i++)
        CHECK(nb_tensor_get(le, i) == -INFINITY && nb_tensor_get(lk, i) == -INFINITY);
    nb_tensor *la = nb_logsumexp(e, NB_ALL_AXES, false);
    CHECK(has_shape(la, NB_SCALAR) && nb_tensor_item(la) == -INFINITY);
    /* over the non-empty axis of an empty tensor: an empty result */
    CHECK(has_shape(nb_logsumexp(e, NB_AXES(0), false), NB_SHAPE(0)));
}

/* On the CPU a float reduction that meets a NaN gives the one default NaN
 * (positive, quiet, no payload), whatever NaNs it met and in whatever order
 * its lanes met them; rows without a NaN are not NaN. Rows long enough for
 * the vector lanes, columns enough to split by rows, and all. */
static void test_reduce_nan_default(void)
{
    CHECK_OK(nb_device_push("/cpu:0"));
    const int64_t rows = 1500, cols = 300, total = rows * cols;
    const uint32_t want_f = 0x7fc00000u;
    const uint64_t want_d = 0x7ff8000000000000ull;
    /* NaNs of both signs and odd payloads in row 3 (columns 5 and 200) and in column 7 of row 1000 */
    const int64_t at[3] = {3 * cols + 5, 3 * cols + 200, 1000 * cols + 7};
    for (int dti = 0; dti < 2; dti++) {
        const nb_dtype dt = dti ? NB_F64 : NB_F32;
        const size_t es = nb_dtype_size(dt);
        char *buf = malloc(es * (size_t)total), *out = malloc(es * (size_t)total);
        CHECK_OK(nb_tensor_read(nb_random_normal(dt, NB_SHAPE(rows, cols), 0, 1, 77), buf, es * (size_t)total));
        for (int k = 0; k < 3; k++) {
            const uint64_t bits = dt == NB_F32 ? (k == 1 ? 0x7fc00123u : 0xffc00123u)
                                               : (k == 1 ? 0x7ff8000000000456ull : 0xfff8000000000456ull);
            memcpy(buf + (size_t)at[k] * es, &bits, es); /* little-endian: the low bytes */
        }
        nb_tensor *x = nb_from_buffer(dt, NB_SHAPE(rows, cols), buf);
        for (int k = 0; k < R_LSE; k++)
            for (int axes = 0; axes < 3; axes++) {
                nb_tensor *r = axes == 0   ? rops[k](x, NB_AXES(1), false)
                               : axes == 1 ? rops[k](x, NB_AXES(0), false)
                                           : rops[k](x, NB_ALL_AXES, false);
                const int64_t n = nb_tensor_numel(r);
                CHECK_OK(nb_tensor_read(r, out, es * (size_t)n));
                for (int64_t i = 0; i < n; i++) {
                    const bool nan_in = axes == 2 || (axes == 0 ? i == 3 || i == 1000 : i == 5 || i == 200 || i == 7);
                    uint64_t b = 0;
                    memcpy(&b, out + (size_t)i * es, es);
                    const bool is_nan = dt == NB_F32 ? isnan(((float *)out)[i]) : isnan(((double *)out)[i]);
                    const bool ok = nan_in ? b == (dt == NB_F32 ? want_f : want_d) : !is_nan;
                    if (!ok) {
                        CHECKF(false, "%s %s over %s: output %lld (bits %llx) is not %s", rnames[k],
                               nb_dtype_name(dt), axes == 0 ? "rows" : axes == 1 ? "columns" : "all",
                               (long long)i, (unsigned long long)b, nan_in ? "the default NaN" : "a number");
                        break;
                    }
                }
            }
        free(buf);
        free(out);
    }
    nb_device_pop();
}

/* prod's second derivative where inputs are 0 is exact, as PyTorch's (the zeros
 * were held constant, so the others' slopes had no slope in them): in a row,
 * d2 prod / dx_i dx_j is the product of the rest. logsumexp's slope at finite
 * inputs beside a +inf is 0 even where exp(x) overflows (was inf / inf). */
static void test_edge_points_higher_order(void)
{
    const double rows[4][3] = {{0, 2, 3}, {0, 0, 3}, {4, 2, 3}, {0, 0, 0}};
    /* d/dx_i of the sum of the gradient: column sums of each row's Hessian */
    const double want[4][3] = {{5, 3, 2}, {3, 3, 0}, {5, 7, 6}, {0, 0, 0}};
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(4, 3), rows), *g = NULL, *h = NULL;
    nb_tape *outer = nb_tape_begin(), *inner = nb_tape_begin();
    CHECK_OK(nb_tape_watch(outer, x));
    CHECK_OK(nb_tape_watch(inner, x));
    CHECK_OK(nb_tape_gradient(inner, nb_sum_all(nb_prod(x, NB_AXES(1), false)), 1, &x, &g));
    CHECK_OK(nb_tape_gradient(outer, nb_sum_all(g), 1, &x, &h));
    CHECK(check_max_error(h, &want[0][0], 12) <= 1e-15);

    /* Beside one zero the gradient is 0 even where the product of the others
     * overflows f32 (was inf * 0 = NaN); at the zero it is that product, inf. */
    const float fv[3] = {0, 1e30f, 1e30f};
    nb_tensor *f = nb_from_buffer(NB_F32, NB_SHAPE(3), fv), *gf = NULL;
    nb_tape *tf = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tf, f));
    CHECK_OK(nb_tape_gradient(tf, nb_prod(f, NB_ALL_AXES, false), 1, &f, &gf));
    CHECK(nb_tensor_get(gf, 0) == INFINITY && nb_tensor_get(gf, 1) == 0 && nb_tensor_get(gf, 2) == 0);

    const double lv[3] = {INFINITY, 1000, 0};
    nb_tensor *l = nb_from_buffer(NB_F64, NB_SHAPE(3), lv), *gl = NULL;
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, l));
    CHECK_OK(nb_tape_gradient(t, nb_logsumexp(l, NB_ALL_AXES, false), 1, &l, &gl));
    CHECK(isnan(nb_tensor_get(gl, 0))); /* exp(inf - inf), as PyTorch's */
    CHECK(nb_tensor_get(gl, 1) == 0 && nb_tensor_get(gl, 2) == 0);
}

int main(void)
{
    RUN(test_reduce_values);
    RUN(test_integer_reduce);
    RUN(test_sum_mean_all);
    RUN(test_logsumexp_stable);
    RUN(test_reduce_edge_points);
    RUN(test_edge_points_higher_order);
    RUN(test_reduce_nan_default);
    RUN(test_reduce_gradients);
    RUN(test_ties_share);
    RUN(test_second_order);
    RUN(test_degenerate_shapes);
    RUN(test_arg_reduce);
    RUN(test_errors);
    return check_finish();
}
