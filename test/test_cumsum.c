/* cumsum: values against a plain running sum on random inputs (odd sizes, every
 * axis, the four exclusive/reverse combinations, transposed and broadcast
 * views, the tiled, row and threaded paths), integer wrap, empty and 0-d
 * tensors, infinities and NaN, gradients of first and second order, and the
 * errors. */
#include "check.h"

#include <stdint.h>

/* The running sum of v (shape s, row-major) along axis into out, in double,
 * in order along the axis; rounded to f32 when f32 (what nabla's f32 kernel
 * gives, bit for bit). */
static void ref_cumsum(const double *v, nb_shape s, int axis, bool excl, bool rev, bool f32, double *out)
{
    int64_t outer, n, inner;
    axis_split(s, axis, &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            double acc = 0;
            for (int64_t k = 0; k < n; k++) {
                int64_t j = rev ? n - 1 - k : k, at = (o * n + j) * inner + in;
                if (excl) {
                    out[at] = acc;
                    acc += v[at];
                } else {
                    acc += v[at];
                    out[at] = acc;
                }
                if (f32)
                    out[at] = (float)out[at];
            }
        }
}

/* Whether nb_cumsum of x matches the reference exactly (shape, dtype, values). */
static bool cumsum_exact(const nb_tensor *x, int axis, bool excl, bool rev)
{
    nb_shape s = nb_tensor_shape(x);
    int a = axis < 0 ? axis + (s.ndim ? s.ndim : 1) : axis;
    nb_tensor *y = nb_cumsum(x, axis, excl, rev);
    if (!has_shape(y, s) || nb_tensor_dtype(y) != nb_tensor_dtype(x)) {
        fprintf(stderr, "[%s] wrong shape or dtype\n", check_current);
        return false;
    }
    int64_t n = numel_of(s);
    double *v = check_values(x), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    ref_cumsum(v, s, a, excl, rev, nb_tensor_dtype(x) == NB_F32, ref);
    double e = check_max_error(y, ref, n);
    free(v);
    free(ref);
    return e == 0;
}

static const nb_dtype all_dtypes[4] = {NB_F32, NB_F64, NB_I32, NB_I64};

/* Random values of dtype: normal floats, or integers in about [-300, 300]. */
static nb_tensor *random_input(nb_dtype dt, nb_shape s, uint64_t seed)
{
    if (dt == NB_F32 || dt == NB_F64)
        return nb_random_normal(dt, s, 0, 1, seed);
    return nb_cast(nb_random_normal(NB_F64, s, 0, 100, seed), dt);
}

static void test_values(void)
{
    const nb_shape shapes[] = {NB_SHAPE(13), NB_SHAPE(3, 5), NB_SHAPE(3, 5, 7), NB_SHAPE(1, 9, 1),
                               NB_SHAPE(2, 3, 1, 5), NB_SHAPE(7, 1)};
    uint64_t seed = 1;
    for (int d = 0; d < 4; d++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            nb_shape s = shapes[si];
            for (int axis = -s.ndim; axis < s.ndim; axis++)
                for (int c = 0; c < 4; c++) {
                    nb_tensor *x = random_input(all_dtypes[d], s, seed++);
                    bool ok = cumsum_exact(x, axis, c & 1, c & 2);
                    if (!ok)
                        fprintf(stderr, "[%s] %s shape %zu axis %d exclusive %d reverse %d\n", check_current,
                                nb_dtype_name(all_dtypes[d]), si, axis, c & 1, (c & 2) != 0);
                    CHECK(ok);
                }
        }
}

/* Transposed, permuted, sliced and broadcast inputs. */
static void test_strided(void)
{
    uint64_t seed = 100;
    for (int d = 0; d < 4; d++)
        for (int axis = 0; axis < 3; axis++)
            for (int c = 0; c < 4; c++) {
                nb_dtype dt = all_dtypes[d];
                nb_tensor *t = nb_transpose(random_input(dt, NB_SHAPE(7, 5, 3), seed++), 0, 2);
                nb_tensor *p = nb_permute(random_input(dt, NB_SHAPE(5, 3, 7), seed++), NB_AXES(1, 2, 0));
                nb_tensor *sl = nb_slice(random_input(dt, NB_SHAPE(5, 9, 6), seed++), NB_SHAPE(1, 2, 1),
                                         NB_SHAPE(3, 5, 4));
                nb_tensor *b = nb_broadcast_to(random_input(dt, NB_SHAPE(3, 1, 5), seed++), NB_SHAPE(3, 4, 5));
                CHECK(!nb_tensor_is_contiguous(t) && !nb_tensor_is_contiguous(p));
                CHECK(!nb_tensor_is_contiguous(sl) && !nb_tensor_is_contiguous(b));
                bool ok = cumsum_exact(t, axis, c & 1, c & 2) && cumsum_exact(p, axis, c & 1, c & 2) &&
                          cumsum_exact(sl, axis, c & 1, c & 2) && cumsum_exact(b, axis, c & 1, c & 2);
                if (!ok)
                    fprintf(stderr, "[%s] %s axis %d exclusive %d reverse %d\n", check_current,
                            nb_dtype_name(dt), axis, c & 1, (c & 2) != 0);
                CHECK(ok);
            }
}

/* Large inputs: many tiles, several threads, long rows; f32 accumulates in
 * double and matches the double reference rounded per element. */
static void test_large(void)
{
    uint64_t seed = 200;
    const nb_shape shapes[] = {NB_SHAPE(300, 1000), NB_SHAPE(70000), NB_SHAPE(3, 200, 333)};
    for (int d = 0; d < 2; d++)
        for (int si = 0; si < 3; si++)
            for (int axis = 0; axis < shapes[si].ndim; axis++)
                for (int c = 0; c < 4; c += 3) {
                    nb_tensor *x = random_input(all_dtypes[d], shapes[si], seed++);
                    CHECK(cumsum_exact(x, axis, c & 1, c & 2));
                    CHECK(cumsum_exact(nb_transpose(x, 0, -1), axis, c & 1, c & 2));
                }
    /* a long f32 row of positive values: a float accumulator would drift */
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(200000), 0, 1, 250);
    nb_tensor *y = nb_cumsum(x, 0, false, false);
    double *v = check_values(x), acc = 0;
    for (int i = 0; i < 200000; i++)
        acc += v[i];
    CHECK(nb_tensor_get(y, 199999) == (double)(float)acc);
    free(v);
    /* the same values on a second run */
    CHECK(same_bits(y, nb_cumsum(x, 0, false, false)));
}

static void test_integer_wrap(void)
{
    const int32_t v32[4] = {INT32_MAX, 1, -3, INT32_MIN};
    nb_tensor *x = nb_from_buffer(NB_I32, NB_SHAPE(4), v32);
    int32_t got[4];
    CHECK_OK(nb_tensor_read(nb_cumsum(x, 0, false, false), got, sizeof got));
    CHECK(got[0] == INT32_MAX && got[1] == INT32_MIN);
    CHECK(got[2] == (int32_t)((uint32_t)INT32_MIN - 3u));
    CHECK(got[3] == (int32_t)((uint32_t)INT32_MIN - 3u + (uint32_t)INT32_MIN));
    CHECK_OK(nb_tensor_read(nb_cumsum(x, 0, true, true), got, sizeof got));
    CHECK(got[3] == 0 && got[2] == INT32_MIN && got[1] == (int32_t)((uint32_t)INT32_MIN - 3u));
    const int64_t v64[3] = {INT64_MAX, 2, INT64_MIN};
    nb_tensor *x64 = nb_from_buffer(NB_I64, NB_SHAPE(3), v64);
    int64_t g64[3];
    CHECK_OK(nb_tensor_read(nb_cumsum(x64, -1, false, false), g64, sizeof g64));
    CHECK(g64[0] == INT64_MAX && g64[1] == INT64_MIN + 1 && g64[2] == 1);
}

static void test_empty_and_scalar(void)
{
    const nb_shape shapes[] = {NB_SHAPE(3, 0), NB_SHAPE(0, 4), NB_SHAPE(0), NB_SHAPE(2, 0, 3)};
    for (int d = 0; d < 4; d++)
        for (int si = 0; si < 4; si++)
            for (int axis = 0; axis < shapes[si].ndim; axis++) {
                nb_tensor *y = nb_cumsum(nb_zeros(all_dtypes[d], shapes[si]), axis, axis & 1, true);
                CHECK(has_shape(y, shapes[si]) && nb_tensor_dtype(y) == all_dtypes[d]);
            }
    /* the gradient through an empty axis is empty too */
    nb_tensor *e = nb_zeros(NB_F64, NB_SHAPE(2, 0)), *g = NULL;
    nb_tape *t = nb_tape_begin();
    CHECK_OK(nb_tape_watch(t, e));
    CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_cumsum(e, 1, false, false)), NB_TENSORS(e), &g));
    CHECK(has_shape(g, NB_SHAPE(2, 0)));
    /* 0-d: one element along axis 0 or -1, as PyTorch */
    for (int d = 0; d < 4; d++) {
        nb_tensor *s = nb_cast(nb_scalar(NB_F64, 7), all_dtypes[d]);
        nb_tensor *y0 = nb_cumsum(s, 0, false, false), *y1 = nb_cumsum(s, -1, false, true);
        nb_tensor *ye = nb_cumsum(s, 0, true, false);
        CHECK(has_shape(y0, NB_SCALAR) && has_shape(y1, NB_SCALAR) && has_shape(ye, NB_SCALAR));
        CHECK(nb_tensor_item(y0) == 7 && nb_tensor_item(y1) == 7 && nb_tensor_item(ye) == 0);
        CHECK(nb_tensor_dtype(y0) == all_dtypes[d]);
    }
}

static void test_nonfinite(void)
{
    const double v[5] = {1, INFINITY, 2, -INFINITY, 3};
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *x = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(5), v), dts[d]);
        nb_tensor *f = nb_cumsum(x, 0, false, false), *r = nb_cumsum(x, 0, true, true);
        CHECK(nb_tensor_get(f, 0) == 1 && nb_tensor_get(f, 1) == INFINITY && nb_tensor_get(f, 2) == INFINITY);
        CHECK(isnan(nb_tensor_get(f, 3)) && isnan(nb_tensor_get(f, 4)));
        /* reverse exclusive: x[4], x[3] + x[4], ... */
        CHECK(nb_tensor_get(r, 4) == 0 && nb_tensor_get(r, 3) == 3 && nb_tensor_get(r, 2) == -INFINITY);
        CHECK(nb_tensor_get(r, 1) == -INFINITY && isnan(nb_tensor_get(r, 0))); /* -inf + inf */
        const double w[6] = {1, 2, NAN, 4, 5, 6}; /* [2, 3]: NaN in row 0 only */
        nb_tensor *m = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(2, 3), w), dts[d]);
        nb_tensor *c0 = nb_cumsum(m, 0, false, false), *c1 = nb_cumsum(m, 1, false, false);
        CHECK(nb_tensor_get(c0, 3) == 5 && nb_tensor_get(c0, 4) == 7 && isnan(nb_tensor_get(c0, 5)));
        CHECK(nb_tensor_get(c1, 1) == 3 && isnan(nb_tensor_get(c1, 2)) && nb_tensor_get(c1, 5) == 15);
        nb_tensor *c1r = nb_cumsum(m, 1, false, true);
        CHECK(isnan(nb_tensor_get(c1r, 0)) && isnan(nb_tensor_get(c1r, 2)) && nb_tensor_get(c1r, 3) == 15);
    }
}

/* ---- gradients ---------------------------------------------------------------- */

typedef struct cs_case {
    int axis;
    bool exclusive, reverse, strided;
} cs_case;

static nb_tensor *gc_cumsum(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const cs_case *c = user;
    const nb_tensor *x = c->strided ? nb_transpose(in[0], 0, nb_tensor_ndim(in[0]) - 1) : in[0];
    return nb_cumsum(x, c->axis, c->exclusive, c->reverse);
}

/* The checker differentiates the inner tape's gradient of sum(y * y * y). */
static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    nb_tape *inner = nb_tape_begin();
    if (nb_tape_watch(inner, in[0]))
        return NULL;
    nb_tensor *y = gc_cumsum(1, in, user);
    nb_tensor *g = NULL;
    if (nb_tape_gradient(inner, nb_sum_all(nb_mul(nb_mul(y, y), y)), NB_TENSORS(in[0]), &g))
        return NULL;
    return g;
}

static void test_gradients(void)
{
    uint64_t seed = 300;
    for (int axis = -3; axis < 3; axis++)
        for (int c = 0; c < 4; c++)
            for (int strided = 0; strided < 2; strided++) {
                cs_case k = {axis, c & 1, (c & 2) != 0, strided};
                nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 4, 5), 0, 1, seed++);
                nb_status st = nb_gradient_check(gc_cumsum, &k, NB_TENSORS(x), GC_EPS, GC_TOL, NULL);
                if (st)
                    fprintf(stderr, "[%s] axis %d exclusive %d reverse %d strided %d: %s\n", check_current, axis,
                            k.exclusive, k.reverse, strided, nb_error_message());
                CHECK_OK(st);
                if (axis % 2 == 0) {
                    nb_tensor *x2 = nb_random_normal(NB_F64, NB_SHAPE(2, 3, 4), 0, 1, seed++);
                    st = nb_gradient_check(gc_second, &k, NB_TENSORS(x2), GC_EPS, 1e-5, NULL);
                    if (st)
                        fprintf(stderr, "[%s] second order: axis %d exclusive %d reverse %d: %s\n", check_current,
                                axis, k.exclusive, k.reverse, nb_error_message());
                    CHECK_OK(st);
                }
            }
    /* 1-d and 0-d inputs */
    cs_case k1 = {0, false, false, false}, k2 = {-1, true, true, false};
    nb_tensor *v = nb_random_normal(NB_F64, NB_SHAPE(9), 0, 1, 390);
    CHECK_OK(nb_gradient_check(gc_cumsum, &k1, NB_TENSORS(v), GC_EPS, GC_TOL, NULL));
    CHECK_OK(nb_gradient_check(gc_second, &k2, NB_TENSORS(v), GC_EPS, 1e-5, NULL));
    nb_tensor *s = nb_scalar(NB_F64, 1.5);
    CHECK_OK(nb_gradient_check(gc_cumsum, &k1, NB_TENSORS(s), GC_EPS, GC_TOL, NULL));
    /* the gradient's values: the running sum of the weights the other way */
    const double w[4] = {1, 2, 3, 4};
    const double want[4][4] = {{10, 9, 7, 4}, {9, 7, 4, 0}, {1, 3, 6, 10}, {0, 1, 3, 6}};
    for (int c = 0; c < 4; c++) {
        nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(4), 0, 1, 391 + c), *g = NULL;
        nb_tape *t = nb_tape_begin();
        CHECK_OK(nb_tape_watch(t, x));
        nb_tensor *y = nb_cumsum(x, 0, c & 1, c & 2);
        CHECK_OK(nb_tape_gradient(t, nb_sum_all(nb_mul(y, nb_from_buffer(NB_F64, NB_SHAPE(4), w))),
                                  NB_TENSORS(x), &g));
        CHECK(check_max_error(g, want[c], 4) == 0);
    }
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(2, 3, 4), 0, 1, 500);
    CHECK(nb_cumsum(x, 3, false, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "cumsum", "axis 3");
    CHECK(nb_cumsum(x, -4, true, true) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "cumsum", "axis -4");
    CHECK(nb_cumsum(nb_scalar(NB_F32, 1), 1, false, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "cumsum", "axis 1", "0-d");
    CHECK(nb_cumsum(nb_scalar(NB_F32, 1), -2, false, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "cumsum", "axis -2");
    CHECK(nb_cumsum(nb_cast(x, NB_BOOL), 0, false, false) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "cumsum", "bool");
    CHECK(nb_cumsum(nb_cast(x, NB_U8), 0, false, false) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "cumsum", "u8");
    CHECK(nb_cumsum(NULL, 0, false, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "cumsum", "input 0 is NULL");
    /* a chain keeps the first error */
    CHECK(nb_cumsum(nb_sum(x, NB_AXES(9), false), 0, false, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "sum", "axis 9");
}

int main(void)
{
    RUN(test_values);
    RUN(test_strided);
    RUN(test_large);
    RUN(test_integer_wrap);
    RUN(test_empty_and_scalar);
    RUN(test_nonfinite);
    RUN(test_gradients);
    RUN(test_errors);
    return check_finish();
}
