/* nb_matmul: 2-d, batched, batch-broadcast, vector operands, transposed views,
 * awkward sizes, f32 and f64, against a plain triple loop; gradients by the
 * checker for every form; the errors. */
#include "check.h"

#undef TOL32
#define TOL32 2e-5 /* long f32 sums */


/* Flat index into a batch shape in (right-aligned) for batch element flat of out. */
static int64_t bidx(int ond, const int64_t *od, int64_t flat, int ind, const int64_t *id)
{
    int64_t idx = 0, mul = 1;
    for (int d = ond - 1; d >= 0; d--) {
        int64_t i = flat % od[d];
        flat /= od[d];
        int di = d - (ond - ind);
        if (di >= 0) {
            if (id[di] != 1)
                idx += i * mul;
            mul *= id[di];
        }
    }
    return idx;
}

/* The reference product. A 1-d a is [1, K], a 1-d b is [K, 1]; the result is in
 * row-major order of the true result shape (which the promoted one matches). */
static double *ref_matmul(const nb_tensor *a, const nb_tensor *b, int64_t *count)
{
    nb_shape sa = nb_tensor_shape(a), sb = nb_tensor_shape(b);
    if (sa.ndim == 1)
        sa = (nb_shape){2, {1, sa.dims[0]}};
    if (sb.ndim == 1)
        sb = (nb_shape){2, {sb.dims[0], 1}};
    int64_t M = sa.dims[sa.ndim - 2], K = sa.dims[sa.ndim - 1], N = sb.dims[sb.ndim - 1];
    int nba = sa.ndim - 2, nbb = sb.ndim - 2, nbo = nba > nbb ? nba : nbb;
    int64_t bo[NB_MAX_DIMS], nbatch = 1;
    for (int i = 0; i < nbo; i++) {
        int ia = i - (nbo - nba), ib = i - (nbo - nbb);
        int64_t da = ia >= 0 ? sa.dims[ia] : 1, db = ib >= 0 ? sb.dims[ib] : 1;
        bo[i] = da == 1 ? db : da;
        nbatch *= bo[i];
    }
    double *va = check_values(a), *vb = check_values(b);
    double *out = malloc(sizeof(double) * (size_t)(nbatch * M * N));
    for (int64_t t = 0; t < nbatch; t++) {
        const double *pa = va + bidx(nbo, bo, t, nba, sa.dims) * M * K;
        const double *pb = vb + bidx(nbo, bo, t, nbb, sb.dims) * K * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                long double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (long double)pa[i * K + k] * pb[k * N + j];
                out[(t * M + i) * N + j] = (double)s;
            }
    }
    free(va);
    free(vb);
    *count = nbatch * M * N;
    return out;
}

static double matmul_error(const nb_tensor *a, const nb_tensor *b, nb_shape expect)
{
    nb_tensor *y = nb_matmul(a, b);
    if (!has_shape(y, expect) || nb_tensor_dtype(y) != nb_tensor_dtype(a)) {
        fprintf(stderr, "[%s] wrong result shape or dtype (%s)\n", check_current, nb_error_message());
        return INFINITY;
    }
    int64_t n;
    double *ref = ref_matmul(a, b, &n);
    double e = check_max_error(y, ref, n);
    free(ref);
    return e;
}

/* A random tensor of logical shape s; transposed: a view swapping the last two
 * dims of a contiguous tensor. */
static nb_tensor *rnd(nb_dtype dt, nb_shape s, bool transposed, uint64_t seed)
{
    if (!transposed)
        return nb_random_normal(dt, s, 0, 1, seed);
    nb_shape t = s;
    t.dims[s.ndim - 1] = s.dims[s.ndim - 2];
    t.dims[s.ndim - 2] = s.dims[s.ndim - 1];
    nb_tensor *x = nb_transpose(nb_random_normal(dt, t, 0, 1, seed), -1, -2);
    CHECK(x && (s.dims[s.ndim - 1] == 1 || s.dims[s.ndim - 2] == 1 || !nb_tensor_is_contiguous(x)));
    return x;
}

typedef struct mm_case {
    nb_shape a, b, out;
} mm_case;

static const mm_case cases[] = {
    {NB_SHAPE(5, 7), NB_SHAPE(7, 3), NB_SHAPE(5, 3)},
    {NB_SHAPE(1, 4), NB_SHAPE(4, 1), NB_SHAPE(1, 1)},
    {NB_SHAPE(3, 4, 5), NB_SHAPE(3, 5, 6), NB_SHAPE(3, 4, 6)},
    {NB_SHAPE(2, 1, 3, 4), NB_SHAPE(5, 4, 2), NB_SHAPE(2, 5, 3, 2)},
    {NB_SHAPE(4, 3), NB_SHAPE(2, 3, 5), NB_SHAPE(2, 4, 5)},
    {NB_SHAPE(2, 6, 3), NB_SHAPE(3, 4), NB_SHAPE(2, 6, 4)},
    {NB_SHAPE(4), NB_SHAPE(4, 3), NB_SHAPE(3)},
    {NB_SHAPE(3, 4), NB_SHAPE(4), NB_SHAPE(3)},
    {NB_SHAPE(4), NB_SHAPE(4), NB_SCALAR},
    {NB_SHAPE(5), NB_SHAPE(2, 5, 3), NB_SHAPE(2, 3)},
    {NB_SHAPE(2, 3, 5), NB_SHAPE(5), NB_SHAPE(2, 3)},
    {NB_SHAPE(37, 53), NB_SHAPE(53, 29), NB_SHAPE(37, 29)},
    {NB_SHAPE(130, 70), NB_SHAPE(70, 65), NB_SHAPE(130, 65)},
    {NB_SHAPE(3, 17, 33), NB_SHAPE(3, 33, 9), NB_SHAPE(3, 17, 9)},
    {NB_SHAPE(2, 257, 300), NB_SHAPE(300, 190), NB_SHAPE(2, 257, 190)},
};
#define N_CASES (int)(sizeof cases / sizeof *cases)

static void test_values(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    uint64_t seed = 10;
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < N_CASES; c++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    /* transposing needs 2 dims */
                    if ((ta && cases[c].a.ndim < 2) || (tb && cases[c].b.ndim < 2))
                        continue;
                    nb_tensor *a = rnd(dts[d], cases[c].a, ta, seed++);
                    nb_tensor *b = rnd(dts[d], cases[c].b, tb, seed++);
                    double e = matmul_error(a, b, cases[c].out);
                    if (!(e <= value_tol(dts[d])))
                        fprintf(stderr, "[%s] %s case %d ta %d tb %d: error %g\n", check_current,
                                nb_dtype_name(dts[d]), c, ta, tb, e);
                    CHECK(e <= value_tol(dts[d]));
                }
}

/* Views that are not plain transposes: a slice with a row stride, a permuted
 * batch, a broadcast operand. */
static void test_other_views(void)
{
    const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int d = 0; d < 2; d++) {
        nb_tensor *big = nb_random_normal(dts[d], NB_SHAPE(9, 12), 0, 1, 100 + d);
        nb_tensor *a = nb_slice(big, NB_SHAPE(1, 2), NB_SHAPE(6, 7)); /* [6, 7], row stride 12 */
        nb_tensor *b = nb_random_normal(dts[d], NB_SHAPE(7, 4), 0, 1, 110 + d);
        CHECK(matmul_error(a, b, NB_SHAPE(6, 4)) <= value_tol(dts[d]));
        nb_tensor *bs = nb_slice(nb_random_normal(dts[d], NB_SHAPE(7, 10), 0, 1, 115 + d), NB_SHAPE(0, 3),
                                 NB_SHAPE(7, 5));
        CHECK(matmul_error(a, bs, NB_SHAPE(6, 5)) <= value_tol(dts[d]));
        /* a [4, 3, 5] batch built by permuting [3, 4, 5]: batch dim strided */
        nb_tensor *p = nb_permute(nb_random_normal(dts[d], NB_SHAPE(3, 4, 5), 0, 1, 120 + d), NB_AXES(1, 0, 2));
        nb_tensor *q = nb_random_normal(dts[d], NB_SHAPE(4, 5, 2), 0, 1, 130 + d);
        CHECK(matmul_error(p, q, NB_SHAPE(4, 3, 2)) <= value_tol(dts[d]));
        /* fully transposed batch: [4, 5, 3] viewed as [3, 5, 4] by swapping dims 0 and 2 */
        nb_tensor *r = nb_transpose(nb_random_normal(dts[d], NB_SHAPE(4, 5, 3), 0, 1, 140 + d), 0, 2);
        nb_tensor *s = nb_random_normal(dts[d], NB_SHAPE(3, 4, 2), 0, 1, 150 + d);
        CHECK(matmul_error(r, s, NB_SHAPE(3, 5, 2)) <= value_tol(dts[d]));
        /* broadcast_to view as an operand (stride-0 batch) */
        nb_tensor *w = nb_broadcast_to(nb_random_normal(dts[d], NB_SHAPE(1, 5, 3), 0, 1, 160 + d), NB_SHAPE(4, 5, 3));
        nb_tensor *x = nb_random_normal(dts[d], NB_SHAPE(4, 2, 5), 0, 1, 170 + d);
        CHECK(matmul_error(x, w, NB_SHAPE(4, 2, 3)) <= value_tol(dts[d]));
        /* A^T A from one base through a transposed view leaves the base as it was */
        nb_tensor *base = nb_random_normal(dts[d], NB_SHAPE(6, 8), 0, 1, 180 + d);
        double *before = check_values(base);
        nb_tensor *m = nb_matmul(nb_transpose(base, 0, 1), base); /* [8, 8] */
        CHECK(has_shape(m, NB_SHAPE(8, 8)));
        CHECK(check_max_error(base, before, 48) == 0);
        free(before);
    }
}

/* ---- gradients ------------------------------------------------------------------------ */

typedef struct gc_case {
    bool ta, tb;
} gc_case;

static nb_tensor *gc_matmul(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const gc_case *c = user;
    const nb_tensor *a = c->ta ? nb_transpose(in[0], -1, -2) : in[0];
    const nb_tensor *b = c->tb ? nb_transpose(in[1], -1, -2) : in[1];
    return nb_matmul(a, b);
}

static void test_gradients(void)
{
    uint64_t seed = 300;
    for (int c = 0; c < N_CASES; c++) {
        int64_t na = 1, nb = 1;
        for (int i = 0; i < cases[c].a.ndim; i++)
            na *= cases[c].a.dims[i];
        for (int i = 0; i < cases[c].b.ndim; i++)
            nb *= cases[c].b.dims[i];
        if (na + nb > 4000)
            continue; /* the big ones: values only; 37x53x29 stands for the odd sizes */
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                if ((ta && cases[c].a.ndim < 2) || (tb && cases[c].b.ndim < 2))
                    continue;
                if ((ta || tb) && cases[c].a.ndim == 2 && cases[c].a.dims[0] == 37 && (ta != tb))
                    continue; /* keep the big case's checks few */
                gc_case g = {ta, tb};
                /* inputs are stored with the last two dims swapped when fn transposes them */
                nb_shape sa = cases[c].a, sb = cases[c].b;
                if (ta) {
                    int64_t t = sa.dims[sa.ndim - 1];
                    sa.dims[sa.ndim - 1] = sa.dims[sa.ndim - 2];
                    sa.dims[sa.ndim - 2] = t;
                }
                if (tb) {
                    int64_t t = sb.dims[sb.ndim - 1];
                    sb.dims[sb.ndim - 1] = sb.dims[sb.ndim - 2];
                    sb.dims[sb.ndim - 2] = t;
                }
                nb_tensor *a = nb_random_normal(NB_F64, sa, 0, 1, seed++);
                nb_tensor *b = nb_random_normal(NB_F64, sb, 0, 1, seed++);
                double err = -1;
                nb_status st = nb_gradient_check(gc_matmul, &g, NB_TENSORS(a, b), GC_EPS, GC_TOL, &err);
                if (st)
                    fprintf(stderr, "[%s] case %d ta %d tb %d: %s\n", check_current, c, ta, tb, nb_error_message());
                CHECK_OK(st);
                CHECK(err >= 0 && err <= GC_TOL);
            }
    }
}

/* Exact gradients of a 2-d product: dA = G B^T, dB = A^T G with G ones. */
static void test_gradient_exact(void)
{
    nb_tensor *a = nb_random_normal(NB_F64, NB_SHAPE(3, 4), 0, 1, 400);
    nb_tensor *b = nb_random_normal(NB_F64, NB_SHAPE(4, 2), 0, 1, 401);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, a));
    CHECK_OK(nb_tape_watch(tape, b));
    nb_tensor *y = nb_matmul(a, b), *g[2] = {NULL, NULL};
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(a, b), g));
    double *va = check_values(a), *vb = check_values(b), ra[12], rb[8];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            ra[i * 4 + k] = vb[k * 2] + vb[k * 2 + 1];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 2; j++)
            rb[k * 2 + j] = va[k] + va[4 + k] + va[8 + k];
    CHECK(has_shape(g[0], NB_SHAPE(3, 4)) && has_shape(g[1], NB_SHAPE(4, 2)));
    CHECK(check_max_error(g[0], ra, 12) <= TOL64);
    CHECK(check_max_error(g[1], rb, 8) <= TOL64);
    free(va);
    free(vb);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *a = nb_random_normal(NB_F32, NB_SHAPE(2, 3), 0, 1, 1);
    nb_tensor *b = nb_random_normal(NB_F32, NB_SHAPE(4, 5), 0, 1, 2);
    CHECK(nb_matmul(a, b) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "matmul", "[2, 3]", "[4, 5]");
    nb_tensor *v = nb_random_normal(NB_F32, NB_SHAPE(4), 0, 1, 3);
    CHECK(nb_matmul(a, v) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "matmul");
    CHECK(nb_matmul(v, a) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "matmul");
    nb_tensor *b3 = nb_random_normal(NB_F32, NB_SHAPE(3, 3, 2), 0, 1, 4);
    nb_tensor *a3 = nb_random_normal(NB_F32, NB_SHAPE(2, 2, 3), 0, 1, 5);
    CHECK(nb_matmul(a3, b3) == NULL); /* batch 2 vs 3 */
    CHECK_ERROR(NB_ERR_SHAPE, "matmul", "[2, 2, 3]", "[3, 3, 2]");
    const int32_t iv[6] = {1, 2, 3, 4, 5, 6};
    nb_tensor *i = nb_from_buffer(NB_I32, NB_SHAPE(2, 3), iv), *i2 = nb_from_buffer(NB_I32, NB_SHAPE(3, 2), iv);
    CHECK(nb_matmul(i, i2) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "matmul", "i32");
    nb_tensor *d = nb_random_normal(NB_F64, NB_SHAPE(3, 2), 0, 1, 6);
    CHECK(nb_matmul(a, d) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "matmul", "f32", "f64");
    CHECK(nb_matmul(a, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "matmul", "input 1 is NULL");
    CHECK(nb_matmul(nb_scalar(NB_F32, 2), a) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "matmul");
    /* the first error survives the chain */
    CHECK(nb_relu(nb_matmul(nb_matmul(a, b), a)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "[2, 3]", "[4, 5]");
}

/* Second order: the checker differentiates the inner tape's gradient of
 * sum(y * y) w.r.t. a, plus the sum of the gradient w.r.t. b. */
static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    nb_tensor *g[2] = {NULL, NULL};
    if (!grads_of_square_sum(gc_matmul, user, n, in, g))
        return NULL;
    return nb_add(g[0], nb_sum_all(g[1]));
}

static void test_second_order(void)
{
    const mm_case sc[] = {
        {NB_SHAPE(3, 4), NB_SHAPE(4, 2), NB_SHAPE(3, 2)},
        {NB_SHAPE(2, 1, 3, 4), NB_SHAPE(5, 4, 2), NB_SHAPE(2, 5, 3, 2)},
        {NB_SHAPE(4), NB_SHAPE(4, 3), NB_SHAPE(3)},
        {NB_SHAPE(3, 4), NB_SHAPE(4), NB_SHAPE(3)},
        {NB_SHAPE(4), NB_SHAPE(4), NB_SCALAR},
    };
    uint64_t seed = 500;
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
        gc_case g = {false, false};
        nb_tensor *a = nb_random_normal(NB_F64, sc[i].a, 0, 1, seed++);
        nb_tensor *b = nb_random_normal(NB_F64, sc[i].b, 0, 1, seed++);
        nb_status st = nb_gradient_check(gc_second, &g, NB_TENSORS(a, b), GC_EPS, 1e-5, NULL);
        if (st)
            fprintf(stderr, "[%s] case %zu: %s\n", check_current, i, nb_error_message());
        CHECK_OK(st);
    }
}

int main(void)
{
    RUN(test_values);
    RUN(test_other_views);
    RUN(test_gradients);
    RUN(test_gradient_exact);
    RUN(test_second_order);
    RUN(test_errors);
    return check_finish();
}
