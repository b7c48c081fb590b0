/* The GPU backend's asynchronous behaviour and its newer kernels, on /gpu:0:
 * - a training step with an embedding (gather on a variable), sparse labels and
 *   an optimizer apply never makes the host wait (nb_gpu_host_waits) until a
 *   value is read;
 * - a bad index in gather, its gradient (scatter_add) and sparse labels is not
 *   reported by the op but at the next synchronising call (nb_synchronize, a
 *   read), which fails naming the op, the index and the range, and then clears;
 *   one_hot gives a row of zeros for one (as TensorFlow);
 * - cumsum (inclusive, exclusive, reverse, strided input, empty axis, the
 *   dtypes), reductions and argmax/argmin against the CPU on odd shapes;
 * - deterministic mode: gather's gradient with heavily repeated indices is the
 *   same to the bit over two runs;
 * - a 64 MiB upload (the copy stream) round-trips exactly, also while other
 *   work is queued and into a recycled block;
 * - the allocator's classes: 1.3 MiB takes less than 2 MiB.
 * Exits 77 (skipped) where there is no GPU, or fails naming why when
 * NB_REQUIRE_GPU=1. Integer-valued inputs keep the sums exact, so most
 * comparisons with the CPU are exact. */
#include "check.h"

#include <pthread.h>

#include <nabla/gpu.h>

#define GPU "/gpu:0"
#define CPU "/cpu:0"

/* Small integers in [-4, 4] from a fixed generator, as f64 on the CPU. */
static nb_tensor *ints_cpu(nb_shape s, uint32_t seed)
{
    int64_t n = numel_of(s);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v)
        return NULL;
    uint32_t x = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (double)((int)(x >> 24) % 9 - 4);
    }
    nb_device_push(CPU);
    nb_tensor *t = nb_from_buffer(NB_F64, s, v);
    nb_device_pop();
    free(v);
    return t;
}

/* The same values as dtype on the GPU, and (f16/bf16 as f32) on the CPU. */
static void ints_pair(nb_dtype dt, nb_shape s, uint32_t seed, nb_tensor **g, nb_tensor **c)
{
    nb_tensor *h = ints_cpu(s, seed);
    *g = nb_cast(nb_to_device(h, GPU), dt);
    *c = nb_cast(h, dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt);
}

/* Largest |g - c| over the elements (as f64 on the CPU); INFINITY when either is
 * missing, the shapes differ, or one is NaN where the other is not. */
static double max_diff(const nb_tensor *g, const nb_tensor *c)
{
    if (!g || !c || !has_shape(c, nb_tensor_shape(g)))
        return INFINITY;
    /* widened where they are, since the CPU holds no f16 or bf16 */
    nb_tensor *gd = nb_to_device(nb_cast(g, NB_F64), CPU), *cd = nb_to_device(nb_cast(c, NB_F64), CPU);
    if (!gd || !cd)
        return INFINITY;
    int64_t n = nb_tensor_numel(gd);
    double *a = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)), *b = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double worst = INFINITY;
    if (a && b && nb_tensor_read(gd, a, sizeof(double) * (size_t)n) == NB_OK &&
        nb_tensor_read(cd, b, sizeof(double) * (size_t)n) == NB_OK) {
        worst = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) != isnan(b[i])) {
                worst = INFINITY;
                break;
            }
            double d = isnan(a[i]) ? 0 : fabs(a[i] - b[i]);
            if (d > worst)
                worst = d;
        }
    }
    free(a);
    free(b);
    return worst;
}

/* ---- no host waits in a training step ---------------------------------------------- */

typedef struct embed_model {
    nb_variable *table, *w; /* [50, 16], [16, 5] */
    nb_tensor *ids, *labels; /* [32] i64 in [0, 50), [32] i64 in [0, 5); on the GPU */
    nb_optimizer *opt;
} embed_model;

static nb_tensor *embed_step(embed_model *m)
{
    nb_tape *tape = nb_tape_begin();
    nb_tensor *e = nb_gather(nb_read(m->table), m->ids);
    nb_tensor *logits = nb_matmul(nb_tanh(e), nb_read(m->w));
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, m->labels));
    nb_tensor *g[2] = {NULL, NULL};
    if (!loss || nb_tape_gradient_vars(tape, loss, NB_VARS(m->table, m->w), g) ||
        nb_optimizer_apply(m->opt, NB_VARS(m->table, m->w), g))
        loss = NULL;
    nb_tape_free(tape);
    return loss;
}

static void test_step_without_waits(void)
{
    CHECK_OK(nb_device_push(GPU));
    int64_t ids[32], labels[32];
    for (int i = 0; i < 32; i++) {
        ids[i] = (i * 7) % 50;
        labels[i] = (i * 3) % 5;
    }
    embed_model m = {
        .table = nb_variable_new("table", nb_random_uniform(NB_F32, NB_SHAPE(50, 16), -1, 1, 1)),
        .w = nb_variable_new("w", nb_random_uniform(NB_F32, NB_SHAPE(16, 5), -1, 1, 2)),
        .ids = nb_from_buffer(NB_I64, NB_SHAPE(32), ids),
        .labels = nb_from_buffer(NB_I64, NB_SHAPE(32), labels),
        .opt = nb_sgd_momentum_new(0.1, 0.9, false),
    };
    CHECK(m.table && m.w && m.ids && m.labels && m.opt);
    CHECK(on_device(m.ids, GPU) && on_device(m.labels, GPU));
    nb_scope *warm = nb_scope_begin();
    CHECK(embed_step(&m) != NULL); /* first use: streams, cuBLAS, scratch */
    nb_scope_end(warm);
    CHECK_OK(nb_synchronize());

    int64_t before = nb_gpu_host_waits(GPU);
    nb_tensor *loss = NULL;
    for (int step = 0; step < 5; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *l = embed_step(&m);
        CHECK(l != NULL);
        if (step == 4)
            loss = nb_keep(l);
        nb_scope_end(s);
    }
    int64_t after = nb_gpu_host_waits(GPU);
    CHECKF(after == before, "%lld host waits in 5 steps that read nothing", (long long)(after - before));
    double v = nb_tensor_item(loss);
    CHECK(isfinite(v));
    CHECK(nb_gpu_host_waits(GPU) > after); /* reading waits */
    nb_variable_free(m.table);
    nb_variable_free(m.w);
    nb_optimizer_free(m.opt);
    CHECK_OK(nb_device_pop());
}

/* ---- bad indices, reported at the next synchronising call ------------------------------ */

static void test_deferred_index_errors(void)
{
    CHECK_OK(nb_device_push(GPU));
    nb_tensor *params = nb_random_uniform(NB_F32, NB_SHAPE(10, 4), -1, 1, 3);
    const int64_t bad[] = {2, 12, 0};
    nb_tensor *ib = nb_from_buffer(NB_I64, NB_SHAPE(3), bad);
    CHECK_OK(nb_synchronize());

    /* gather returns at once; nb_synchronize reports it, once */
    nb_tensor *out = nb_gather(params, ib);
    CHECK(out != NULL);
    CHECK(nb_error() == NB_OK);
    CHECK(nb_synchronize() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "12", "[0, 10)");
    CHECK_OK(nb_synchronize());
    /* nothing was written out of bounds: the bad row is zeros, the others right */
    if (out) {
        CHECK(nb_tensor_get(out, 4) == 0.0 && nb_tensor_get(out, 7) == 0.0);
        CHECK(nb_tensor_get(out, 0) == nb_tensor_get(params, 8));
        CHECK(nb_tensor_get(out, 11) == nb_tensor_get(params, 3));
    }

    /* a read reports it too */
    nb_tensor *ok_t = nb_full(NB_F32, NB_SHAPE(3), 2.0);
    CHECK(nb_gather(params, ib) != NULL);
    float buf[3];
    CHECK(nb_tensor_read(ok_t, buf, sizeof buf) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "12");
    CHECK_OK(nb_tensor_read(ok_t, buf, sizeof buf));
    CHECK(buf[0] == 2.0f && buf[2] == 2.0f);

    /* gather's gradient (scatter_add) checks too */
    const int32_t bad32[] = {-3, 1};
    nb_tensor *i32 = nb_from_buffer(NB_I32, NB_SHAPE(2), bad32);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, params));
    nb_tensor *y = nb_gather(params, i32);
    CHECK(y != NULL);
    CHECK(nb_synchronize() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "-3");
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(y), NB_TENSORS(params), &g));
    nb_tape_free(tape);
    CHECK(g != NULL);
    CHECK(nb_synchronize() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "scatter_add", "-3", "[0, 10)");
    if (g) /* the good index got its ones, the bad one was skipped */
        CHECK(nb_tensor_item(nb_sum_all(g)) == 4.0);

    /* sparse labels */
    nb_tensor *logits = nb_random_uniform(NB_F32, NB_SHAPE(2, 5), -1, 1, 4);
    const int64_t bad_labels[] = {1, 7};
    nb_tensor *lb = nb_from_buffer(NB_I64, NB_SHAPE(2), bad_labels);
    CHECK(nb_sparse_softmax_cross_entropy(logits, lb) != NULL);
    CHECK(nb_error() == NB_OK);
    CHECK(nb_synchronize() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "sparse_softmax_cross_entropy", "7", "[0, 5)");
    CHECK_OK(nb_synchronize());

    /* one_hot: a row of zeros, no error (as TensorFlow) */
    const int64_t hot[] = {1, 9, -1};
    nb_tensor *oh = nb_one_hot(nb_from_buffer(NB_I64, NB_SHAPE(3), hot), 4, NB_F32);
    CHECK(oh != NULL);
    CHECK_OK(nb_synchronize());
    if (oh) {
        CHECK(nb_tensor_item(nb_sum_all(oh)) == 1.0);
        CHECK(nb_tensor_get(oh, 1) == 1.0);
    }
    CHECK_OK(nb_device_pop());
}

/* ---- cumsum against the CPU ------------------------------------------------------------------ */

static void cumsum_case(const char *what, nb_dtype dt, nb_shape s, int axis, bool transpose)
{
    nb_tensor *g, *c;
    ints_pair(dt, s, (uint32_t)(s.dims[0] * 31 + axis), &g, &c);
    if (transpose) {
        g = nb_transpose(g, 0, 1);
        c = nb_transpose(c, 0, 1);
    }
    for (int mode = 0; mode < 4; mode++) {
        bool excl = mode & 1, rev = mode & 2;
        nb_tensor *rg = nb_cumsum(g, axis, excl, rev), *rc = nb_cumsum(c, axis, excl, rev);
        if (dt == NB_F16 || dt == NB_BF16) /* the exact f32 sums, rounded as the GPU rounds them */
            rc = nb_cast(nb_to_device(rc, GPU), dt);
        CHECK(rg == NULL || on_device(rg, GPU));
        double d = max_diff(rg, rc);
        CHECKF(d == 0, "cumsum %s %s axis %d%s%s: off by %g", what, nb_dtype_name(dt), axis,
               excl ? " exclusive" : "", rev ? " reverse" : "", d);
    }
}

static void test_cumsum(void)
{
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_F16, NB_BF16};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        nb_dtype dt = dts[i];
        cumsum_case("[7, 300]", dt, NB_SHAPE(7, 300), 1, false);    /* a block per row */
        cumsum_case("[300, 7] axis 0", dt, NB_SHAPE(300, 7), 0, false);
        cumsum_case("[5, 4, 33]", dt, NB_SHAPE(5, 4, 33), 1, false); /* short rows */
        cumsum_case("[3, 17]^T", dt, NB_SHAPE(3, 17), 1, true);      /* strided */
        cumsum_case("[1001]", dt, NB_SHAPE(1001), 0, false);
        if (dt != NB_F16 && dt != NB_BF16) { /* sums beyond their integers */
            cumsum_case("[3, 5000]", dt, NB_SHAPE(3, 5000), 1, false);  /* chunked rows */
            cumsum_case("[200000]", dt, NB_SHAPE(200000), 0, false);    /* one long row */
            cumsum_case("[9000, 40]^T", dt, NB_SHAPE(9000, 40), 1, true);
        }
    }
    /* the fixed-order paths of deterministic mode */
    bool was = nb_set_deterministic(true);
    cumsum_case("[200000] deterministic", NB_F32, NB_SHAPE(200000), 0, false);
    nb_set_deterministic(was);
    /* an empty axis: an empty result */
    nb_device_push(GPU);
    nb_tensor *e = nb_cumsum(nb_zeros(NB_F32, NB_SHAPE(3, 0)), 1, false, false);
    nb_device_pop();
    CHECK(has_shape(e, NB_SHAPE(3, 0)) && on_device(e, GPU));
    /* NaN runs to the end of its row */
    nb_device_push(GPU);
    const float nanrow[] = {1, NAN, 2, 3};
    nb_tensor *rn = nb_cumsum(nb_from_buffer(NB_F32, NB_SHAPE(4), nanrow), 0, false, false);
    nb_device_pop();
    CHECK(rn && nb_tensor_get(rn, 0) == 1.0 && isnan(nb_tensor_get(rn, 1)) && isnan(nb_tensor_get(rn, 3)));
}

/* ---- reductions and argmax against the CPU ---------------------------------------------------- */

static void test_reductions(void)
{
    nb_tensor *g, *c;
    ints_pair(NB_F32, NB_SHAPE(1000, 77), 5, &g, &c); /* 77,000 elements: cub::DeviceReduce */
    CHECK(max_diff(nb_sum_all(g), nb_sum_all(c)) == 0);
    CHECK(max_diff(nb_max(g, NB_ALL_AXES, false), nb_max(c, NB_ALL_AXES, false)) == 0);
    CHECK(max_diff(nb_min(g, NB_ALL_AXES, false), nb_min(c, NB_ALL_AXES, false)) == 0);
    CHECK(max_diff(nb_mean_all(g), nb_mean_all(c)) <= 1e-6);
    CHECK(max_diff(nb_sum(g, NB_AXES(0), false), nb_sum(c, NB_AXES(0), false)) == 0);
    CHECK(max_diff(nb_sum(g, NB_AXES(1), false), nb_sum(c, NB_AXES(1), false)) == 0);
    nb_tensor *gt = nb_transpose(g, 0, 1), *ct = nb_transpose(c, 0, 1);
    CHECK(max_diff(nb_sum_all(gt), nb_sum_all(ct)) == 0);
    CHECK(max_diff(nb_sum(gt, NB_AXES(1), true), nb_sum(ct, NB_AXES(1), true)) == 0);
    ints_pair(NB_F32, NB_SHAPE(600, 5000), 12, &g, &c); /* long rows: cub::DeviceSegmentedReduce */
    CHECK(max_diff(nb_sum(g, NB_AXES(1), false), nb_sum(c, NB_AXES(1), false)) == 0);
    CHECK(max_diff(nb_max(g, NB_AXES(1), true), nb_max(c, NB_AXES(1), true)) == 0);
    CHECK(max_diff(nb_mean(g, NB_AXES(1), false), nb_mean(c, NB_AXES(1), false)) <= 1e-6);
    ints_pair(NB_F64, NB_SHAPE(70000), 6, &g, &c);
    CHECK(max_diff(nb_sum_all(g), nb_sum_all(c)) == 0);
    ints_pair(NB_I64, NB_SHAPE(70000), 7, &g, &c);
    CHECK(max_diff(nb_sum_all(g), nb_sum_all(c)) == 0);
    CHECK(max_diff(nb_max(g, NB_ALL_AXES, false), nb_max(c, NB_ALL_AXES, false)) == 0);
    /* NaN wins max over a whole tensor */
    nb_device_push(GPU);
    nb_tensor *big = nb_full(NB_F32, NB_SHAPE(100000), 1.0);
    nb_device_pop();
    float nan = NAN;
    nb_tensor *onenan = nb_concat(NB_TENSORS(big, nb_to_device(nb_from_buffer(NB_F32, NB_SHAPE(1), &nan), GPU)), 0);
    CHECK(onenan && isnan(nb_tensor_item(nb_max(onenan, NB_ALL_AXES, false))));
    /* empty axis: sum 0 */
    nb_device_push(GPU);
    nb_tensor *z = nb_sum(nb_zeros(NB_F32, NB_SHAPE(0, 5)), NB_AXES(0), false);
    nb_device_pop();
    CHECK(has_shape(z, NB_SHAPE(5)) && nb_tensor_item(nb_sum_all(z)) == 0.0);

    /* argmax/argmin: ties (small integers) go to the first index */
    const nb_dtype dts[] = {NB_F32, NB_I32, NB_F16};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
        ints_pair(dts[i], NB_SHAPE(60000, 10), 8 + (uint32_t)i, &g, &c);
        for (int axis = 0; axis < 2; axis++) {
            CHECKF(max_diff(nb_argmax(g, axis, false), nb_argmax(c, axis, false)) == 0, "argmax %s axis %d",
                   nb_dtype_name(dts[i]), axis);
            CHECKF(max_diff(nb_argmin(g, axis, false), nb_argmin(c, axis, false)) == 0, "argmin %s axis %d",
                   nb_dtype_name(dts[i]), axis);
        }
        gt = nb_transpose(g, 0, 1);
        ct = nb_transpose(c, 0, 1);
        CHECK(max_diff(nb_argmax(gt, 1, true), nb_argmax(ct, 1, true)) == 0);
    }
    /* NaN is the extreme: its first index */
    nb_tensor *col = nb_concat(NB_TENSORS(big, nb_to_device(nb_from_buffer(NB_F32, NB_SHAPE(1), &nan), GPU), big), 0);
    CHECK(col && nb_tensor_item(nb_argmax(col, 0, false)) == 100000.0);
    CHECK(col && nb_tensor_item(nb_argmin(col, 0, false)) == 100000.0);
    /* an empty axis has nothing to pick */
    nb_device_push(GPU);
    CHECK(nb_argmax(nb_zeros(NB_F32, NB_SHAPE(0, 3)), 0, false) == NULL);
    nb_device_pop();
    CHECK_ERROR(NB_ERR_SHAPE, "argmax", "axis 0 is empty");
}

/* ---- deterministic scatter_add ------------------------------------------------------------------- */

static nb_tensor *embedding_grad(const nb_tensor *table, const nb_tensor *ids, const nb_tensor *up)
{
    nb_tape *tape = nb_tape_begin();
    nb_tensor *g = NULL;
    if (nb_tape_watch(tape, table) == NB_OK) {
        nb_tensor *loss = nb_sum_all(nb_mul(nb_gather(table, ids), up));
        if (nb_tape_gradient(tape, loss, NB_TENSORS((nb_tensor *)table), &g))
            g = NULL;
    }
    nb_tape_free(tape);
    return g;
}

static void test_deterministic_gather_grad(void)
{
    bool was = nb_set_deterministic(true);
    CHECK_OK(nb_device_push(GPU));
    enum { N = 20000, ROWS = 20, D = 48 };
    int64_t *ids = malloc(sizeof(int64_t) * N);
    for (int i = 0; i < N; i++)
        ids[i] = (i % 7 == 0) ? (i / 7) % ROWS : i % 3; /* rows 0-2 thousands of times */
    nb_tensor *table = nb_random_uniform(NB_F32, NB_SHAPE(ROWS, D), -1, 1, 9);
    nb_tensor *up = nb_random_uniform(NB_F32, NB_SHAPE(N, D), -1, 1, 10);
    nb_tensor *ig = nb_from_buffer(NB_I64, NB_SHAPE(N), ids);
    free(ids);
    nb_tensor *g1 = embedding_grad(table, ig, up), *g2 = embedding_grad(table, ig, up);
    CHECK(g1 && g2 && on_device(g1, GPU));
    CHECK(same_bits(g1, g2));
    nb_tensor *gh = embedding_grad(nb_cast(table, NB_F16), ig, nb_cast(up, NB_F16));
    nb_tensor *gh2 = embedding_grad(nb_cast(table, NB_F16), ig, nb_cast(up, NB_F16));
    CHECK(same_bits(gh, gh2));
    CHECK_OK(nb_device_pop());
    /* and it is the CPU's sum, to rounding */
    nb_tensor *gc = embedding_grad(nb_to_device(table, CPU), nb_to_device(ig, CPU), nb_to_device(up, CPU));
    CHECK(max_diff(g1, gc) < 1e-3);
    nb_set_deterministic(was);
}

/* ---- large uploads ---------------------------------------------------------------------------------- */

static void test_large_upload(void)
{
    const int64_t n = (int64_t)16 << 20; /* 64 MiB of f32 */
    float *host = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    CHECK(host && back);
    if (!host || !back) {
        free(host);
        free(back);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        host[i] = (float)(i % 1000003) * 0.5f - 7.0f;
    CHECK_OK(nb_device_push(GPU));
    for (int round = 0; round < 3; round++) {
        nb_scope *s = nb_scope_begin();
        /* work queued before the upload, which the upload may overlap */
        nb_tensor *busy = nb_random_uniform(NB_F32, NB_SHAPE(2048, 2048), -1, 1, 11);
        nb_tensor *prod = nb_matmul(busy, busy);
        nb_tensor *t = nb_from_buffer(NB_F32, NB_SHAPE(n), host);
        CHECK(t != NULL);
        /* a kernel after the upload sees all of it */
        nb_tensor *twice = nb_add(t, t);
        memset(back, 0, sizeof(float) * (size_t)n);
        CHECK_OK(nb_tensor_read(t, back, sizeof(float) * (size_t)n));
        CHECK(memcmp(host, back, sizeof(float) * (size_t)n) == 0);
        CHECK(twice && nb_tensor_get(twice, n - 1) == 2.0 * host[n - 1]);
        CHECK(prod != NULL);
        nb_scope_end(s); /* the next round's upload lands in this round's block */
    }
    CHECK_OK(nb_device_pop());
    free(host);
    free(back);
}

/* Uploads behind a busy device stream, many rounds, with poison on (as meson
 * runs the tests): the new tensor's poison fill is queued behind the busy
 * kernels, so an upload on the copy stream that did not wait for it would land
 * first and be overwritten (the race the first GPU run met only when other
 * processes slowed the card). Where there are two GPUs, a thread on each does
 * it at once. */
typedef struct upload_job {
    const char *dev;
    int rounds, bad;
    nb_status err;
} upload_job;

static void *upload_rounds(void *arg)
{
    upload_job *j = arg;
    const int64_t n = (int64_t)3 << 20; /* 12 MiB of f32: the copy stream's size */
    float *host = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    if (!host || !back) {
        free(host), free(back);
        j->bad = -1;
        return NULL;
    }
    nb_device_push(j->dev);
    nb_tensor *busy = nb_random_uniform(NB_F32, NB_SHAPE(2048, 2048), -1, 1, 5);
    for (int round = 0; round < j->rounds && !j->err; round++) {
        nb_scope *s = nb_scope_begin();
        for (int64_t i = 0; i < n; i++)
            host[i] = (float)((i * 7 + round * 131) % 100003) - 50000.0f;
        /* a few milliseconds of kernels ahead of the upload */
        nb_tensor *acc = busy;
        for (int k = 0; k < 12; k++)
            acc = nb_tanh(nb_matmul(acc, busy));
        nb_tensor *t = nb_from_buffer(NB_F32, NB_SHAPE(n), host);
        nb_tensor *sum = nb_add(t, nb_zeros(NB_F32, NB_SHAPE(n))); /* a kernel reading it */
        if (!acc || !t || !sum || nb_tensor_read(sum, back, sizeof(float) * (size_t)n) != NB_OK) {
            j->err = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        } else if (memcmp(host, back, sizeof(float) * (size_t)n) != 0) {
            j->bad++;
        }
        nb_scope_end(s); /* the next round's upload may land in this round's block */
    }
    nb_release(busy);
    nb_device_pop();
    free(host), free(back);
    return NULL;
}

static void test_upload_behind_busy_stream(void)
{
    int ndev = nb_device_count(NB_DEVICE_GPU) >= 2 ? 2 : 1;
    upload_job jobs[2] = {{nb_device_name(NB_DEVICE_GPU, 0), 8, 0, NB_OK},
                          {ndev > 1 ? nb_device_name(NB_DEVICE_GPU, 1) : NULL, 8, 0, NB_OK}};
    pthread_t th[2];
    for (int i = 0; i < ndev; i++)
        CHECK(pthread_create(&th[i], NULL, upload_rounds, &jobs[i]) == 0);
    for (int i = 0; i < ndev; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < ndev; i++) {
        CHECKF(jobs[i].err == NB_OK, "%s: %s", jobs[i].dev, nb_status_name(jobs[i].err));
        CHECKF(jobs[i].bad == 0, "%s: %d of %d uploads read back other bytes", jobs[i].dev, jobs[i].bad,
               jobs[i].rounds);
    }
}

/* ---- the allocator's size classes ------------------------------------------------------------------- */

static void test_allocator_classes(void)
{
    const size_t mib = (size_t)1 << 20, want = 13 * mib / 10;
    CHECK_OK(nb_gpu_empty_cache(GPU));
    nb_gpu_memory_stats s0, s1;
    CHECK_OK(nb_gpu_get_memory_stats(GPU, &s0));
    CHECK_OK(nb_device_push(GPU));
    nb_tensor *t = nb_empty(NB_U8, NB_SHAPE((int64_t)want));
    CHECK_OK(nb_device_pop());
    CHECK(t != NULL);
    CHECK_OK(nb_gpu_get_memory_stats(GPU, &s1));
    CHECKF(s1.in_use - s0.in_use >= want && s1.in_use - s0.in_use < 2 * mib, "in use grew by %zu",
           s1.in_use - s0.in_use);
    CHECKF(s1.reserved - s0.reserved < 2 * mib, "reserved grew by %zu", s1.reserved - s0.reserved);
    CHECK(s1.reserved >= s1.in_use + s1.cached + s1.graph_held);
}

int main(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return check_no_gpu("test_gpu_async");
    RUN(test_step_without_waits);
    RUN(test_deferred_index_errors);
    RUN(test_cumsum);
    RUN(test_reductions);
    RUN(test_deterministic_gather_grad);
    RUN(test_large_upload);
    RUN(test_upload_behind_busy_stream);
    RUN(test_allocator_classes);
    return check_finish();
}
