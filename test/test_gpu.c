/* The CUDA backend beyond single ops: the ops of lib/core/ops.def themselves,
 * in every dtype against /cpu:0 with their gradients, are test_backend_ops's
 * matrix. Here: TF32 matmul, logsumexp, the backward kernels of a small model
 * against the CPU, random tensors (moments, f16/bf16), copies between host and
 * devices, the f64 gradient checker on /gpu:0 for the composite ops (logsumexp,
 * losses, shape ops), inputs on two devices and soft/strict placement, a
 * stress run of small ops that must not make the host wait
 * (nb_gpu_host_waits), and the caching allocator (statistics, cache reuse,
 * reserve mode, recovery from running out of device memory). Exits 77
 * (skipped) where there is no GPU, or fails naming why when NB_REQUIRE_GPU=1.
 * Every setting a case changes (placement, log callback, TF32) is put back,
 * and nothing but main's first call touches the logical device split.
 *
 * Each physical GPU is split into two logical GPUs, so /gpu:0 and /gpu:1 share
 * card 0 with a stream each: that exercises cross-stream copies and the
 * allocator's cross-stream reuse on a one-GPU machine. */
#include "check.h"

#include <nabla/gpu.h>

#define GPU "/gpu:0"
#define CPU "/cpu:0"

static bool on_gpu_device(const nb_tensor *t) { return t && strncmp(nb_tensor_device(t), "/gpu:", 5) == 0; }

/* t's values as doubles on the host (malloc'd, caller frees); *n = -1 on failure. */
static double *host_values(const nb_tensor *t, int64_t *n)
{
    *n = -1;
    if (!t)
        return NULL;
    /* f16/bf16 are GPU dtypes: widen them where they are first */
    nb_dtype dt = nb_tensor_dtype(t);
    const nb_tensor *w = dt == NB_F16 || dt == NB_BF16 ? nb_cast(t, NB_F32) : t;
    nb_tensor *c = w ? nb_to_device((nb_tensor *)w, CPU) : NULL;
    nb_tensor *d = c ? nb_cast(c, NB_F64) : NULL;
    if (!d)
        return NULL;
    int64_t k = nb_tensor_numel(d);
    double *v = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1));
    if (!v || nb_tensor_read(d, v, sizeof(double) * (size_t)k) != NB_OK) {
        free(v);
        return NULL;
    }
    *n = k;
    return v;
}

/* Largest |g - c| / (1 + |c|) between two tensors on any devices; c must have
 * g's shape and dtype. INFINITY when either is missing or they differ in shape,
 * dtype or NaN-ness. */
static double tensor_error(const nb_tensor *g, const nb_tensor *c)
{
    if (!g || !c || nb_tensor_dtype(g) != nb_tensor_dtype(c))
        return INFINITY;
    nb_shape sg = nb_tensor_shape(g), sc = nb_tensor_shape(c);
    if (sg.ndim != sc.ndim)
        return INFINITY;
    for (int i = 0; i < sg.ndim; i++)
        if (sg.dims[i] != sc.dims[i])
            return INFINITY;
    int64_t n1, n2;
    double *a = host_values(g, &n1), *b = host_values(c, &n2), worst = 0;
    if (!a || !b || n1 != n2)
        worst = INFINITY;
    for (int64_t i = 0; worst < INFINITY && i < n1; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i])))
                worst = INFINITY;
            continue;
        }
        if (isinf(a[i]) || isinf(b[i])) {
            if (a[i] != b[i])
                worst = INFINITY;
            continue;
        }
        double e = fabs(a[i] - b[i]) / (1.0 + fabs(b[i]));
        if (e > worst)
            worst = e;
    }
    free(a);
    free(b);
    return worst;
}

/* tensor_error, and g must lie on a GPU. */
static double gpu_cpu_error(const nb_tensor *g, const nb_tensor *c)
{
    return on_gpu_device(g) ? tensor_error(g, c) : INFINITY;
}

#define CHECK_MATCH(what, g, c, tol)                                                                \
    do {                                                                                            \
        double e_ = gpu_cpu_error((g), (c));                                                        \
        if (!(e_ <= (tol))) {                                                                       \
            fprintf(stderr, "%s:%d: [%s] %s: GPU vs CPU normalised error %.3g > %.3g (%s)\n",       \
                    __FILE__, __LINE__, check_current, (what), e_, (double)(tol), nb_error_message()); \
            check_failures++;                                                                       \
            nb_error_clear();                                                                       \
        }                                                                                           \
    } while (0)

static nb_tensor *rnd(nb_dtype dt, nb_shape s, uint64_t seed) { return nb_random_normal(dt, s, 0.0, 1.0, seed); }
static nb_tensor *gpu(const nb_tensor *t) { return nb_to_device((nb_tensor *)t, GPU); }

/* ---- TF32 matmul (a GPU setting; matmul's values in every dtype are in test_backend_ops) ---- */

static void test_tf32(void)
{
    /* TF32: faster, about 1e-3 relative */
    nb_tensor *a = rnd(NB_F32, NB_SHAPE(128, 256), 19), *b = rnd(NB_F32, NB_SHAPE(256, 64), 20);
    CHECK(!nb_gpu_set_tf32(true));
    CHECK(nb_gpu_tf32());
    CHECK_MATCH("matmul tf32", nb_matmul(gpu(a), gpu(b)), nb_matmul(a, b), 2e-2);
    CHECK(nb_gpu_set_tf32(false));
    CHECK_MATCH("matmul f32", nb_matmul(gpu(a), gpu(b)), nb_matmul(a, b), 1e-4);
}

/* ---- integer casts to f16 and bf16: one rounding, as on the CPU ------------------------------ */

static void test_int_to_half(void)
{
    /* past 2^24 an i32 through float would round twice: 2^24 + 2^16 + 1 is
     * 16908288 in bf16, 16777216 the other way */
    const double v[6] = {16842753, -16842753, 2147483647, 65519, 65520, 33554435};
    const nb_dtype from[2] = {NB_I32, NB_I64}, to[2] = {NB_BF16, NB_F16};
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++) {
            nb_tensor *x = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(6), v), from[f]);
            nb_tensor *on_gpu = nb_to_device(nb_cast(gpu(x), to[t]), "/cpu:0"), *on_cpu = nb_cast(x, to[t]);
            CHECKF(same_bits(on_gpu, on_cpu), "%s to %s differs from the CPU's", nb_dtype_name(from[f]),
                   nb_dtype_name(to[t]));
        }
    nb_tensor *b = nb_to_device(nb_cast(gpu(nb_cast(nb_scalar(NB_F64, 16842753), NB_I32)), NB_BF16), "/cpu:0");
    CHECK(b && nb_tensor_get(b, 0) == 16908288);
}

/* ---- the CPU's values where the kernels once differed ---------------------------------------- */

/* nb_arange(dt, start, stop, 1) made on /gpu:0, or NULL. */
static nb_tensor *arange_on_gpu(nb_dtype dt, double start, double stop)
{
    if (nb_device_push(GPU) != NB_OK)
        return NULL;
    nb_tensor *t = nb_arange(dt, start, stop, 1);
    (void)nb_device_pop();
    return t;
}

static void test_same_as_cpu(void)
{
    /* cumsum of f32 adds in double, as the CPU: in float 1e8 + 1 - 1e8 is 0 */
    const float c1[3] = {1e8f, 1, -1e8f}, c2[3] = {16777216.0f, 1, 1};
    for (int k = 0; k < 2; k++) {
        nb_tensor *x = nb_from_buffer(NB_F32, NB_SHAPE(3), k ? c2 : c1);
        for (int mode = 0; mode < 3; mode++) {
            bool excl = mode == 1, rev = mode == 2;
            CHECKF(same_bits(nb_cumsum(gpu(x), 0, excl, rev), nb_cumsum(x, 0, excl, rev)),
                   "cumsum %d, mode %d differs from the CPU's", k, mode);
        }
    }
    /* a long row (the block and chunked scans): the CPU's values. Both add in
     * double, in another order, so a sum that lands within a double's rounding
     * of a float's halfway point may round the other way: a few elements may
     * differ by one unit (in float, 145,375 of these 200,000 differed) */
    nb_tensor *u = nb_random_uniform(NB_F32, NB_SHAPE(200000), 0, 1, 5);
    nb_tensor *u2 = nb_reshape(u, NB_SHAPE(8, 25000));
    for (int k = 0; k < 2; k++) {
        nb_tensor *x = k ? u2 : u;
        int axis = k, n_off = 0;
        nb_tensor *on_gpu = nb_cumsum(gpu(x), axis, k, k), *on_cpu = nb_cumsum(x, axis, k, k);
        float *a = malloc(200000 * sizeof *a), *b = malloc(200000 * sizeof *b);
        bool read = a && b && nb_tensor_read(on_gpu, a, 200000 * sizeof *a) == NB_OK &&
                    nb_tensor_read(on_cpu, b, 200000 * sizeof *b) == NB_OK;
        CHECK(read);
        for (int i = 0; read && i < 200000; i++)
            if (a[i] != b[i])
                n_off += fabsf(a[i] - b[i]) <= fabsf(nextafterf(b[i], INFINITY) - b[i]) ? 1 : 1000000;
        CHECKF(n_off <= 3, "long cumsum %d: %d elements differ from the CPU's (a million for each by more than "
               "one unit)", k, n_off);
        free(a);
        free(b);
    }

    /* integer arange counts exactly past 2^53, and an i32 wraps as on the CPU */
    const double big = 9007199254740992.0; /* 2^53 */
    CHECK(same_bits(arange_on_gpu(NB_I64, big, big + 8), nb_arange(NB_I64, big, big + 8, 1)));
    CHECK(same_bits(arange_on_gpu(NB_I32, 2147483646.0, 2147483650.0), nb_arange(NB_I32, 2147483646.0, 2147483650.0, 1)));

    /* max and min keep the first of equal zeros, and a NaN result is the default NaN */
    const float z[4] = {-0.0f, 0.0f, 0.0f, -0.0f};
    nb_tensor *zx = nb_from_buffer(NB_F32, NB_SHAPE(2, 2), z);
    CHECK(same_bits(nb_max(gpu(zx), NB_AXES(1), false), nb_max(zx, NB_AXES(1), false)));
    CHECK(same_bits(nb_min(gpu(zx), NB_AXES(1), false), nb_min(zx, NB_AXES(1), false)));
    CHECK(same_bits(nb_max(gpu(zx), NB_AXES(0), false), nb_max(zx, NB_AXES(0), false)));
    uint32_t nan_bits = 0xff812345u;
    float nan_payload, with_nan[3] = {1, 0, 2};
    memcpy(&nan_payload, &nan_bits, 4);
    with_nan[1] = nan_payload;
    nb_tensor *nx = nb_from_buffer(NB_F32, NB_SHAPE(3), with_nan);
    CHECK(same_bits(nb_max(gpu(nx), NB_AXES(0), false), nb_max(nx, NB_AXES(0), false)));
    CHECK(same_bits(nb_sum(gpu(nx), NB_AXES(0), false), nb_sum(nx, NB_AXES(0), false)));

    /* equal logits of a row get equal probabilities (one sum per row) */
    nb_tensor *lg = rnd(NB_F32, NB_SHAPE(256, 1000), 77);
    nb_tensor *first = nb_slice(lg, NB_SHAPE(0, 0), NB_SHAPE(-1, 1));
    nb_tensor *rest = nb_slice(lg, NB_SHAPE(0, 2), NB_SHAPE(-1, -1));
    nb_tensor *lt = nb_concat(3, (nb_tensor *[]){first, first, rest}, 1); /* columns 0 and 1 equal */
    CHECK(lt && has_shape(lt, NB_SHAPE(256, 1000)));
    for (int log = 0; log < 2 && lt; log++) {
        nb_tensor *p = log ? nb_log_softmax(gpu(lt), -1) : nb_softmax(gpu(lt), -1);
        nb_tensor *p0 = nb_slice(p, NB_SHAPE(0, 0), NB_SHAPE(-1, 1)), *p1 = nb_slice(p, NB_SHAPE(0, 1), NB_SHAPE(-1, 1));
        CHECKF(same_bits(nb_contiguous(p0), nb_contiguous(p1)), "%s: equal logits, other values",
               log ? "log_softmax" : "softmax");
        CHECK_MATCH("softmax rows", p, log ? nb_log_softmax(lt, -1) : nb_softmax(lt, -1), 1e-6);
    }

    /* f64 normals: the CPU's to 8 units of 2^-52 (relative above 1: the CPU's
     * own cosine is that close in absolute terms), also where the cosine is
     * near 0, its argument taken in turns. Emulated on the host, 0 of 4
     * million draws were further off; with the argument rounded first (the
     * old kernel), 363, about 95 for 2^20 draws */
    CHECK_OK(nb_device_push(GPU));
    nb_tensor *ng = nb_random_normal(NB_F64, NB_SHAPE(1 << 20), 0, 1, 99);
    CHECK_OK(nb_device_pop());
    nb_tensor *nc = nb_random_normal(NB_F64, NB_SHAPE(1 << 20), 0, 1, 99);
    int64_t n1, n2, far = 0;
    double *a = host_values(ng, &n1), *b = host_values(nc, &n2);
    CHECK(a && b && n1 == n2 && n1 == 1 << 20);
    for (int64_t i = 0; a && b && i < n1 && i < n2; i++)
        far += !(fabs(a[i] - b[i]) <= 8 * 0x1p-52 * fmax(1.0, fabs(b[i])));
    CHECKF(far <= 10, "%lld of 2^20 f64 normals differ from the CPU's by more than 8 units", (long long)far);
    free(a);
    free(b);
}

/* ---- logsumexp (built from the reductions, not a kernel of its own) ---------------------------- */

static void test_logsumexp(void)
{
    const nb_dtype dts[] = {NB_F32, NB_F64};
    for (size_t d = 0; d < 2; d++) {
        nb_tensor *x = rnd(dts[d], NB_SHAPE(7, 33, 129), 8), *xg = gpu(x);
        const double tol = dts[d] == NB_F64 ? 1e-11 : 1e-4;
        CHECK_MATCH("logsumexp", nb_logsumexp(xg, NB_AXES(2), false), nb_logsumexp(x, NB_AXES(2), false), tol);
        CHECK_MATCH("logsumexp", nb_logsumexp(xg, NB_AXES(0, 2), true), nb_logsumexp(x, NB_AXES(0, 2), true), tol);
    }
}

/* ---- gradients through the tape: the backward kernels (scatter_add, reductions'
 * broadcasts, transposed matmuls) on the GPU against the CPU, in f64. ------------------ */

static nb_tensor *model_loss(nb_tensor *const *p, const nb_tensor *x, const nb_tensor *idx, const nb_tensor *labels)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, p[0]), p[1]));
    nb_tensor *e = nb_gather(p[3], idx);
    nb_tensor *logits = nb_matmul(nb_tanh(nb_add(h, e)), p[2]);
    return nb_mean_all(nb_softmax_cross_entropy(logits, labels));
}

static void gradients_on(const char *dev, nb_tensor *const *init, const nb_tensor *x, const nb_tensor *idx,
                         const nb_tensor *labels, nb_tensor **grads, nb_tensor **loss)
{
    nb_tensor *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = nb_to_device(init[i], dev);
    nb_tensor *xd = nb_to_device((nb_tensor *)x, dev), *id = nb_to_device((nb_tensor *)idx, dev);
    nb_tensor *ld = nb_to_device((nb_tensor *)labels, dev);
    nb_tape *tape = nb_tape_begin();
    for (int i = 0; i < 4; i++)
        CHECK_OK(nb_tape_watch(tape, p[i]));
    *loss = model_loss(p, xd, id, ld);
    CHECK_OK(nb_tape_gradient(tape, *loss, 4, p, grads));
}

static void test_gradients(void)
{
    nb_tensor *init[4] = {rnd(NB_F64, NB_SHAPE(16, 32), 30), rnd(NB_F64, NB_SHAPE(32), 31),
                          rnd(NB_F64, NB_SHAPE(32, 5), 32), rnd(NB_F64, NB_SHAPE(10, 32), 33)};
    const int64_t idx[8] = {1, 4, 4, 9, 0, 2, 4, 7}; /* repeats: scatter_add accumulates */
    nb_tensor *x = rnd(NB_F64, NB_SHAPE(8, 16), 34), *ix = nb_from_buffer(NB_I64, NB_SHAPE(8), idx);
    nb_tensor *labels = nb_softmax(rnd(NB_F64, NB_SHAPE(8, 5), 35), -1);
    nb_tensor *gg[4] = {0}, *gc[4] = {0}, *lg = NULL, *lc = NULL;
    gradients_on(GPU, init, x, ix, labels, gg, &lg);
    gradients_on(CPU, init, x, ix, labels, gc, &lc);
    CHECK_MATCH("loss", lg, lc, 1e-11);
    static const char *names[4] = {"d w1", "d b1", "d w2", "d embedding"};
    for (int i = 0; i < 4; i++)
        CHECK_MATCH(names[i], gg[i], gc[i], 1e-10);
}

/* ---- random ---------------------------------------------------------------------------------- */

static void moments(const nb_tensor *t, double *mean, double *sd, double *lo, double *hi)
{
    int64_t n;
    double *v = host_values(t, &n), s = 0, ss = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        ss += v[i] * v[i];
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
    *mean = n > 0 ? s / (double)n : NAN;
    *sd = n > 0 ? sqrt(ss / (double)n - *mean * *mean) : NAN;
    free(v);
}

/* Largest |a - b| between two tensors' values (any devices and dtypes). */
static double value_difference(const nb_tensor *a, const nb_tensor *b)
{
    int64_t n1, n2;
    double *x = host_values(a, &n1), *y = host_values(b, &n2), worst = 0;
    if (!x || !y || n1 != n2)
        worst = INFINITY;
    for (int64_t i = 0; worst < INFINITY && i < n1; i++)
        worst = fabs(x[i] - y[i]) > worst ? fabs(x[i] - y[i]) : worst;
    free(x);
    free(y);
    return worst;
}

static void test_random(void)
{
    /* f32/f64: the GPU runs the CPU's generator, so the values agree (up to the
     * last bit of the GPU's double log/cos) */
    const nb_dtype dts[] = {NB_F32, NB_F64};
    for (size_t d = 0; d < 2; d++) {
        const double tol = dts[d] == NB_F64 ? 1e-13 : 1e-6;
        const nb_shape s = NB_SHAPE(1000, 1001);
        nb_tensor *c[3] = {nb_random_normal(dts[d], s, 2.0, 3.0, 42), nb_random_uniform(dts[d], s, -1.0, 4.0, 43),
                           nb_truncated_normal(dts[d], s, 0.5, 2.0, 44)};
        CHECK_OK(nb_device_push(GPU));
        nb_tensor *g[3] = {nb_random_normal(dts[d], s, 2.0, 3.0, 42), nb_random_uniform(dts[d], s, -1.0, 4.0, 43),
                           nb_truncated_normal(dts[d], s, 0.5, 2.0, 44)};
        CHECK_OK(nb_device_pop());
        CHECK_MATCH("random_normal", g[0], c[0], tol);
        CHECK_MATCH("random_uniform", g[1], c[1], tol);
        CHECK_MATCH("truncated_normal", g[2], c[2], tol);
        double m, sd, lo, hi;
        moments(g[1], &m, &sd, &lo, &hi);
        CHECK(lo >= -1.0 && hi < 4.0);
        moments(g[2], &m, &sd, &lo, &hi);
        CHECK(lo >= 0.5 - 4.0 && hi <= 0.5 + 4.0);
    }
    /* f16/bf16 (GPU only): the same draws, rounded */
    CHECK_OK(nb_device_push(GPU));
    const nb_dtype halves[] = {NB_F16, NB_BF16};
    for (size_t d = 0; d < 2; d++) {
        nb_tensor *a = nb_random_normal(halves[d], NB_SHAPE(1 << 20), 2.0, 3.0, 42);
        nb_tensor *b = nb_random_normal(halves[d], NB_SHAPE(1 << 20), 2.0, 3.0, 42);
        double m, s, lo, hi;
        CHECK(on_gpu_device(a));
        CHECK(value_difference(a, b) == 0);
        moments(a, &m, &s, &lo, &hi);
        CHECK_NEAR(m, 2.0, 0.05);
        CHECK_NEAR(s, 3.0, 0.05);
        CHECK(value_difference(a, nb_random_normal(halves[d], NB_SHAPE(1 << 20), 2.0, 3.0, 43)) > 0.1);
        nb_tensor *u = nb_random_uniform(halves[d], NB_SHAPE(1 << 20), -1.0, 4.0, 44);
        moments(u, &m, &s, &lo, &hi);
        CHECK_NEAR(m, 1.5, 0.05);
        CHECK(lo >= -1.0 && hi < 4.0);
        nb_tensor *t = nb_truncated_normal(halves[d], NB_SHAPE(1 << 20), 0.0, 1.0, 45);
        moments(t, &m, &s, &lo, &hi);
        CHECK(lo >= -2.0 && hi <= 2.0);
        CHECK_NEAR(s, 0.8796, 0.05); /* the sd of a normal truncated at +-2 */
    }
    /* element i depends only on (seed, i): a shorter tensor is a prefix */
    nb_tensor *p = nb_random_normal(NB_F32, NB_SHAPE(1001), 0, 1, 7), *q = nb_random_normal(NB_F32, NB_SHAPE(1000), 0, 1, 7);
    CHECK(value_difference(nb_slice(p, NB_SHAPE(0), NB_SHAPE(1000)), q) == 0);
    CHECK(nb_random_normal(NB_I32, NB_SHAPE(4), 0, 1, 1) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "i32");
    CHECK_OK(nb_device_pop());
}

/* ---- copies ------------------------------------------------------------------------------------ */

static void test_transfers(void)
{
    /* 3M floats go through the pinned staging buffers, 10M directly */
    const int64_t sizes[] = {1, 1000, 3 << 20, 10 << 20};
    for (int k = 0; k < 4; k++) {
        int64_t n = sizes[k];
        float *buf = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            buf[i] = (float)(i % 1000003) * 0.5f;
        CHECK_OK(nb_device_push(GPU));
        nb_tensor *t = nb_from_buffer(NB_F32, NB_SHAPE(n), buf);
        CHECK_OK(nb_device_pop());
        memset(buf, 0, sizeof(float) * (size_t)n); /* the upload must not read buf late */
        CHECK(on_gpu_device(t));
        CHECK_OK(nb_tensor_read(t, back, sizeof(float) * (size_t)n));
        bool same = true;
        for (int64_t i = 0; i < n && same; i++)
            same = back[i] == (float)(i % 1000003) * 0.5f;
        CHECK(same);
        free(buf);
        free(back);
    }
    /* between GPUs: /gpu:1 is the second logical device of card 0, or its own card */
    int n_gpu = nb_device_count(NB_DEVICE_GPU);
    nb_tensor *x = rnd(NB_F32, NB_SHAPE(513, 77), 50), *y = rnd(NB_F32, NB_SHAPE(513, 77), 51);
    for (int i = 1; i < n_gpu && i < 4; i++) {
        const char *other = nb_device_name(NB_DEVICE_GPU, i);
        nb_tensor *x0 = gpu(x);
        nb_tensor *x1 = nb_to_device(x0, other);
        CHECK(x1 && strcmp(nb_tensor_device(x1), other) == 0);
        CHECK_MATCH("gpu -> gpu", x1, x, 0);
        CHECK_MATCH("op on the other gpu", nb_add(x1, nb_to_device(y, other)), nb_add(x, y), 1e-6);
        CHECK_MATCH("and back", nb_to_device(nb_mul(x1, x1), GPU), nb_mul(x, x), 1e-6);
    }
    CHECK_OK(nb_synchronize());
}

/* ---- the allocator ----------------------------------------------------------------------------- */

static void stats(nb_gpu_memory_stats *s) { CHECK_OK(nb_gpu_get_memory_stats(GPU, s)); }

static void test_allocator_stats(void)
{
    const size_t mib = (size_t)1 << 20;
    nb_gpu_memory_stats s0, s1, s2, s3, s4;
    CHECK_OK(nb_synchronize());
    stats(&s0);
    CHECK(s0.device_total > 0 && s0.device_free <= s0.device_total);
    CHECK(s0.reserved >= s0.in_use + s0.cached + s0.graph_held);

    CHECK_OK(nb_device_push(GPU));
    nb_scope *sc = nb_scope_begin();
    nb_tensor *t = nb_empty(NB_F32, NB_SHAPE((int64_t)(10 * mib / 4) + 3)); /* 10 MiB + 12 bytes */
    CHECK(t != NULL);
    stats(&s1);
    CHECK(s1.in_use >= s0.in_use + 10 * mib);
    CHECK(s1.requested >= s0.requested + 10 * mib + 12);
    CHECK(s1.peak_in_use >= s1.in_use);
    CHECK(s1.allocations > s0.allocations);
    CHECK(s1.reserved >= s1.in_use);
    nb_scope_end(sc);
    stats(&s2);
    CHECK(s2.in_use + 10 * mib <= s1.in_use);
    CHECK(s2.cached >= 10 * mib); /* kept for reuse, not given back */

    sc = nb_scope_begin();
    t = nb_empty(NB_F32, NB_SHAPE((int64_t)(10 * mib / 4) + 3));
    stats(&s3);
    CHECK(s3.cache_hits > s2.cache_hits);
    CHECK(s3.device_mallocs == s2.device_mallocs);
    nb_scope_end(sc);
    CHECK_OK(nb_device_pop());

    CHECK_OK(nb_gpu_empty_cache(GPU));
    stats(&s4);
    CHECK(s4.cached == 0);
    CHECK_OK(nb_gpu_reset_peak_memory(GPU));
    stats(&s4);
    CHECK(s4.peak_in_use == s4.in_use);
    CHECK_OK(nb_gpu_empty_cache(NULL));

    nb_gpu_properties p;
    CHECK_OK(nb_gpu_device_properties(GPU, &p));
    CHECK(p.name[0] != '\0' && p.total_memory > 0 && p.compute_major >= 1 && p.multiprocessors > 0);
    CHECK(p.logical_per_gpu == 2);

    /* failure paths */
    CHECK(nb_gpu_get_memory_stats(CPU, &s4) == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "not a GPU");
    CHECK(nb_gpu_get_memory_stats("/gpu:63", &s4) == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "/gpu:63");
    CHECK(nb_gpu_get_memory_stats(GPU, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "NULL");
}

static void test_out_of_memory(void)
{
    nb_gpu_properties p;
    CHECK_OK(nb_gpu_device_properties(GPU, &p));
    nb_gpu_memory_stats before, after;
    stats(&before);
    CHECK_OK(nb_device_push(GPU));

    /* one tensor twice the card's size */
    nb_tensor *huge = nb_empty(NB_F32, NB_SHAPE((int64_t)(p.total_memory / 2)));
    CHECK(huge == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "out of memory", GPU);

    /* fill the card, a sixteenth at a time, until it fails */
    const int64_t chunk = (int64_t)(p.total_memory / 16 / 4);
    nb_scope *sc = nb_scope_begin();
    int got = 0;
    for (int i = 0; i < 40; i++) {
        if (!nb_empty(NB_F32, NB_SHAPE(chunk)))
            break;
        got++;
    }
    CHECK(got >= 1 && got < 40);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_scope_end(sc); /* all of it goes to the cache */

    /* carry on: a block larger than any cached one makes the allocator empty
     * its cache and retry */
    sc = nb_scope_begin();
    nb_tensor *big = nb_empty(NB_F32, NB_SHAPE(chunk * 4));
    CHECK(big != NULL);
    nb_tensor *x = nb_full(NB_F32, NB_SHAPE(1000), 2.0);
    CHECK_NEAR(nb_tensor_item(nb_sum_all(nb_mul(x, x))), 4000.0, 1e-6);
    nb_scope_end(sc);
    CHECK_OK(nb_device_pop());

    stats(&after);
    CHECK(after.failures >= before.failures + 2);
    CHECK(after.cache_flushes > before.cache_flushes);
    CHECK_OK(nb_gpu_empty_cache(GPU));
}

static void test_reserve(void)
{
    const size_t mib = (size_t)1 << 20;
    nb_gpu_memory_stats s;
    CHECK_OK(nb_gpu_set_reserve(GPU, 64 * mib, false));
    stats(&s);
    CHECK(s.arena == 64 * mib && !s.growth_allowed);
    CHECK(s.reserved >= 64 * mib);

    CHECK_OK(nb_device_push(GPU));
    nb_scope *sc = nb_scope_begin();
    nb_tensor *a = nb_empty(NB_F32, NB_SHAPE((int64_t)(40 * mib / 4)));
    CHECK(a != NULL);
    nb_tensor *x = nb_add(nb_full(NB_F32, NB_SHAPE(100), 1.0), nb_full(NB_F32, NB_SHAPE(100), 2.0));
    CHECK_NEAR(nb_tensor_item(nb_sum_all(x)), 300.0, 1e-6);
    CHECK(nb_empty(NB_F32, NB_SHAPE((int64_t)(40 * mib / 4))) == NULL); /* the arena is a cap */
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "arena", GPU);
    /* the arena cannot change while it holds live blocks */
    CHECK(nb_gpu_set_reserve(GPU, 0, true) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "live");
    nb_scope_end(sc);
    /* freed arena blocks are reused */
    sc = nb_scope_begin();
    CHECK(nb_empty(NB_F32, NB_SHAPE((int64_t)(40 * mib / 4))) != NULL);
    nb_scope_end(sc);
    CHECK_OK(nb_device_pop());

    CHECK_OK(nb_synchronize());
    CHECK_OK(nb_gpu_set_reserve(GPU, 0, true));
    stats(&s);
    CHECK(s.arena == 0 && s.growth_allowed);
    CHECK(nb_gpu_set_reserve(CPU, 0, true) == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "not a GPU");
}

/* ---- the f64 gradient checker on the GPU: composite ops --------------------------------------
 * The ops of lib/core/ops.def (unary, binary, where, the reductions, matmul,
 * softmax, gather and scatter_add) go through nb_gradient_check on every GPU in
 * test_backend_ops. Here the ops built from them: logsumexp, sum_all and
 * mean_all, the four losses and the shape ops, through nb_gradient_check on
 * /gpu:0, then the same function's value and tape gradients on /gpu:0 against
 * /cpu:0. */

#define GPU_GC_EPS 1e-6
#define GPU_GC_TOL 1e-6

enum {
    GG_LOGSUMEXP, GG_SUM_ALL, GG_MEAN_ALL,
    GG_SOFTMAX_CE, GG_SPARSE_CE, GG_SIGMOID_CE, GG_MSE,
    GG_RESHAPE, GG_TRANSPOSE, GG_PERMUTE, GG_SLICE, GG_CONCAT, GG_STACK, GG_PAD, GG_BROADCAST,
};

typedef struct gpu_gc {
    int op;
    nb_axes axes;        /* logsumexp */
    bool keepdims;
    bool strided;        /* fn first transposes in[0] (dims 0 and -1): a strided input */
    const nb_tensor *aux; /* on the CPU: sparse labels */
} gpu_gc;

static nb_tensor *gpu_gc_fn(int n, nb_tensor *const *in, void *user)
{
    const gpu_gc *c = user;
    const nb_tensor *x = c->strided ? nb_transpose(in[0], 0, -1) : in[0];
    const nb_tensor *y = n > 1 ? in[1] : NULL;
    /* aux lives on the CPU; the op takes it beside the inputs */
    const nb_tensor *aux = c->aux ? nb_to_device((nb_tensor *)c->aux, nb_tensor_device(in[0])) : NULL;
    switch (c->op) {
    case GG_LOGSUMEXP: return nb_logsumexp(x, c->axes, c->keepdims);
    case GG_SUM_ALL: return nb_sum_all(nb_square(x));
    case GG_MEAN_ALL: return nb_mean_all(nb_sin(x));
    case GG_SOFTMAX_CE: return nb_softmax_cross_entropy(x, y);
    case GG_SPARSE_CE: return nb_sparse_softmax_cross_entropy(x, aux);
    case GG_SIGMOID_CE: return nb_sigmoid_cross_entropy(x, y);
    case GG_MSE: return nb_mean_squared_error(x, y);
    case GG_RESHAPE: return nb_mul(nb_reshape(x, NB_SHAPE(4, -1)), nb_reshape(nb_transpose(x, 0, 2), NB_SHAPE(4, 6)));
    case GG_TRANSPOSE: return nb_mul(nb_transpose(x, 0, 2), nb_contiguous(nb_transpose(nb_sin(x), 0, 2)));
    case GG_PERMUTE: return nb_square(nb_permute(x, NB_AXES(2, 0, 1)));
    case GG_SLICE:
        return nb_add(nb_square(nb_slice(x, NB_SHAPE(0, 1, 1), NB_SHAPE(2, -1, 2))),
                      nb_slice(nb_transpose(x, 0, 2), NB_SHAPE(1, 0, 0), NB_SHAPE(2, 2, 2)));
    case GG_CONCAT: return nb_concat(NB_TENSORS(nb_square(in[0]), in[1], nb_transpose(in[2], 0, 1)), 1);
    case GG_STACK: return nb_stack(NB_TENSORS(nb_sin(x), nb_transpose(y, 0, 1)), 1);
    case GG_PAD: return nb_square(nb_pad(x, NB_SHAPE(1, 0, 2), NB_SHAPE(0, 2, 1), 0.5));
    case GG_BROADCAST: return nb_mul(nb_broadcast_to(x, NB_SHAPE(2, 3, 4)), y);
    }
    return NULL;
}

/* The tape's value and gradients of sum(fn(in) * w), w fixed uniform weights. */
static nb_tensor *tape_gradients(gpu_gc *c, int n, nb_tensor *const *in, nb_tensor **grads)
{
    nb_tape *tape = nb_tape_begin();
    for (int i = 0; i < n; i++)
        CHECK_OK(nb_tape_watch(tape, in[i]));
    nb_tensor *y = gpu_gc_fn(n, in, c);
    if (!y)
        return NULL;
    CHECK_OK(nb_device_push(nb_tensor_device(y)));
    nb_tensor *w = nb_random_uniform(NB_F64, nb_tensor_shape(y), 0.5, 1.5, 4242);
    CHECK_OK(nb_device_pop());
    CHECK_OK(nb_tape_gradient_ex(tape, nb_sum_all(nb_mul(y, w)), NULL, n, in, grads, NB_UNCONNECTED_ZERO));
    return y;
}

/* in: CPU f64 tensors. The checker on their GPU copies, then value and gradients
 * GPU against CPU. */
static void gpu_gradient_check(const char *name, gpu_gc c, int n, nb_tensor *const *in)
{
    nb_scope *sc = nb_scope_begin();
    nb_tensor *g_in[4] = {0}, *gg[4] = {0}, *gc[4] = {0};
    for (int i = 0; i < n; i++)
        g_in[i] = gpu(in[i]);
    double err = INFINITY;
    nb_status st = nb_gradient_check(gpu_gc_fn, &c, n, g_in, GPU_GC_EPS, GPU_GC_TOL, &err);
    if (st)
        fprintf(stderr, "[%s] %s: %s\n", check_current, name, nb_error_message());
    CHECK_OK(st);
    CHECK(err >= 0 && err <= GPU_GC_TOL);
    nb_tensor *yg = tape_gradients(&c, n, g_in, gg), *yc = tape_gradients(&c, n, in, gc);
    CHECK_MATCH(name, yg, yc, 1e-10);
    for (int i = 0; i < n; i++)
        CHECK_MATCH(name, gg[i], gc[i], 1e-10);
    nb_scope_end(sc);
}

static nb_tensor *uniform64(nb_shape s, double lo, double hi, uint64_t seed)
{
    return nb_random_uniform(NB_F64, s, lo, hi, seed);
}

static void test_gradient_checker(void)
{
    uint64_t seed = 7000;
    /* logsumexp over several axis sets, with and without keepdims, and a strided input */
    const nb_axes sets[] = {NB_ALL_AXES, NB_AXES(1), NB_AXES(0, 2), NB_AXES(-1)};
    for (size_t a = 0; a < sizeof sets / sizeof *sets; a++) {
        for (int strided = 0; strided < 2; strided++) {
            if (strided && a != 2)
                continue;
            nb_shape s = strided ? NB_SHAPE(4, 3, 2) : NB_SHAPE(2, 3, 4);
            nb_tensor *r = uniform64(s, -2, 2, seed++);
            gpu_gc c = {.op = GG_LOGSUMEXP, .axes = sets[a], .keepdims = a % 2 == 1, .strided = strided};
            gpu_gradient_check("logsumexp", c, 1, &r);
        }
    }
    nb_tensor *x = uniform64(NB_SHAPE(3, 4), -2.0, 2.0, seed++);
    gpu_gradient_check("sum_all", (gpu_gc){.op = GG_SUM_ALL}, 1, &x);
    gpu_gradient_check("mean_all", (gpu_gc){.op = GG_MEAN_ALL}, 1, &x);

    /* the four losses (dense labels get a gradient too) */
    nb_tensor *sce[2] = {uniform64(NB_SHAPE(4, 5), -2, 2, seed + 0), nb_softmax(uniform64(NB_SHAPE(4, 5), -1, 1, seed + 1), -1)};
    seed += 2;
    gpu_gradient_check("softmax_cross_entropy", (gpu_gc){.op = GG_SOFTMAX_CE}, 2, sce);
    const int64_t l64[4] = {1, 0, 4, 4};
    const int32_t l32[4] = {3, 2, 0, 1};
    nb_tensor *logits = uniform64(NB_SHAPE(4, 5), -2, 2, seed++);
    gpu_gradient_check("sparse_softmax_cross_entropy i64",
                       (gpu_gc){.op = GG_SPARSE_CE, .aux = nb_from_buffer(NB_I64, NB_SHAPE(4), l64)}, 1, &logits);
    gpu_gradient_check("sparse_softmax_cross_entropy i32",
                       (gpu_gc){.op = GG_SPARSE_CE, .aux = nb_from_buffer(NB_I32, NB_SHAPE(4), l32)}, 1, &logits);
    nb_tensor *sig[2] = {uniform64(NB_SHAPE(3, 4), -3, 3, seed + 0), uniform64(NB_SHAPE(3, 4), 0, 1, seed + 1)};
    seed += 2;
    gpu_gradient_check("sigmoid_cross_entropy", (gpu_gc){.op = GG_SIGMOID_CE}, 2, sig);
    nb_tensor *mse[2] = {uniform64(NB_SHAPE(3, 4), -2, 2, seed + 0), uniform64(NB_SHAPE(3, 4), -2, 2, seed + 1)};
    seed += 2;
    gpu_gradient_check("mean_squared_error", (gpu_gc){.op = GG_MSE}, 2, mse);

    /* shape ops */
    nb_tensor *x3 = uniform64(NB_SHAPE(2, 3, 4), -2, 2, seed++);
    gpu_gradient_check("reshape", (gpu_gc){.op = GG_RESHAPE}, 1, &x3);
    gpu_gradient_check("transpose", (gpu_gc){.op = GG_TRANSPOSE}, 1, &x3);
    gpu_gradient_check("permute", (gpu_gc){.op = GG_PERMUTE}, 1, &x3);
    gpu_gradient_check("slice", (gpu_gc){.op = GG_SLICE}, 1, &x3);
    gpu_gradient_check("pad", (gpu_gc){.op = GG_PAD}, 1, &x3);
    nb_tensor *cat[3] = {uniform64(NB_SHAPE(2, 1), -2, 2, seed + 0), uniform64(NB_SHAPE(2, 3), -2, 2, seed + 1),
                         uniform64(NB_SHAPE(2, 2), -2, 2, seed + 2)}; /* the last transposed: [2, 2] */
    seed += 3;
    gpu_gradient_check("concat", (gpu_gc){.op = GG_CONCAT}, 3, cat);
    nb_tensor *st[2] = {uniform64(NB_SHAPE(2, 3), -2, 2, seed + 0), uniform64(NB_SHAPE(3, 2), -2, 2, seed + 1)};
    seed += 2;
    gpu_gradient_check("stack", (gpu_gc){.op = GG_STACK}, 2, st);
    nb_tensor *bc[2] = {uniform64(NB_SHAPE(3, 1), -2, 2, seed + 0), uniform64(NB_SHAPE(2, 3, 4), -2, 2, seed + 1)};
    seed += 2;
    gpu_gradient_check("broadcast_to", (gpu_gc){.op = GG_BROADCAST}, 2, bc);
}

/* ---- placement: inputs on two devices, soft and strict placement ----------------------------- */

static void test_mixed_devices(void)
{
    nb_tensor *a = rnd(NB_F64, NB_SHAPE(3, 4), 60), *bc = rnd(NB_F64, NB_SHAPE(3, 4), 61), *b = gpu(bc);
    CHECK(strcmp(nb_tensor_device(a), CPU) == 0 && b && strcmp(nb_tensor_device(b), GPU) == 0);

    /* nothing pushed: an error naming the op and both devices */
    CHECK(nb_add(a, b) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "add", CPU, GPU);
    CHECK(nb_matmul(b, nb_transpose(a, 0, 1)) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "matmul", CPU, GPU);
    CHECK(nb_where(nb_greater(a, a), b, b) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "where", CPU, GPU);

    /* /gpu:0 pushed: the CPU input is copied there, by a recorded op, so its
     * gradient comes back to the CPU */
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, a));
    CHECK_OK(nb_tape_watch(tape, b));
    CHECK_OK(nb_device_push(GPU));
    nb_tensor *p = nb_mul(nb_sin(a), b);
    nb_tensor *y = nb_sum_all(nb_mul(p, p));
    nb_tensor *e = nb_exp(a); /* only CPU inputs: runs on the pushed device */
    CHECK_OK(nb_device_pop());
    CHECK(y && strcmp(nb_tensor_device(y), GPU) == 0);
    CHECK(e && strcmp(nb_tensor_device(e), GPU) == 0);
    CHECK(strcmp(nb_tensor_device(a), CPU) == 0); /* the input stays where it was */
    CHECK_MATCH("exp of a pushed CPU input", e, nb_exp(a), 1e-11);
    nb_tensor *g[2] = {NULL, NULL};
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(a, b), g));
    CHECK(g[0] && strcmp(nb_tensor_device(g[0]), CPU) == 0);
    CHECK(g[1] && strcmp(nb_tensor_device(g[1]), GPU) == 0);
    /* y = sum((sin a * b)^2): dy/da = 2 sin a cos a b^2, dy/db = 2 sin(a)^2 b, on the CPU */
    nb_tensor *sa = nb_sin(a);
    nb_tensor *ref_a = nb_mul_scalar(nb_mul(nb_mul(sa, nb_cos(a)), nb_square(bc)), 2.0);
    nb_tensor *ref_b = nb_mul_scalar(nb_mul(nb_square(sa), bc), 2.0);
    double ea = tensor_error(g[0], ref_a);
    if (!(ea <= 1e-11))
        fprintf(stderr, "[%s] d a on the CPU: error %g\n", check_current, ea);
    CHECK(ea <= 1e-11);
    CHECK_MATCH("d b", g[1], ref_b, 1e-11);
    CHECK_MATCH("y", y, nb_sum_all(nb_square(nb_mul(sa, bc))), 1e-11);

    /* a GPU that does not exist: soft placement means /cpu:0 and one warning */
    warning_count placement_warnings = {"/gpu:99", 0};
    nb_log_callback old = nb_set_log_callback(count_warnings, &placement_warnings);
    nb_status st = nb_device_push("/gpu:99");
    CHECK_OK(st);
    if (st == NB_OK) {
        CHECK(strcmp(nb_device_current(), CPU) == 0);
        nb_tensor *o = nb_ones(NB_F32, NB_SHAPE(2));
        CHECK(o && strcmp(nb_tensor_device(o), CPU) == 0);
        CHECK_OK(nb_device_pop());
    }
    nb_set_log_callback(old, NULL);
    CHECK(placement_warnings.n == 1);
    /* strict placement: an error naming the device; an existing GPU still works */
    bool soft = nb_set_soft_placement(false);
    CHECK(soft);
    CHECK(nb_device_push("/gpu:99") == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "/gpu:99", "strict");
    CHECK(strcmp(nb_device_current(), CPU) == 0);
    CHECK_OK(nb_device_push(GPU));
    CHECK(strcmp(nb_device_current(), GPU) == 0);
    CHECK_OK(nb_device_pop());
    nb_set_soft_placement(soft);
}

/* ---- no host waits on the hot path ------------------------------------------------------------
 * About 10,000 small recorded ops on /gpu:0 (forward, backward, optimizer) must
 * leave nb_gpu_host_waits where it was; reading a value moves it. gather, its
 * gradient and sparse_softmax_cross_entropy check their indices on the device
 * and wait for nothing. What waits on purpose is checked to wait:
 *  - an upload that finds its staging buffer's previous copy still running;
 *  - nb_synchronize, nb_tensor_read/item/get, copies to the CPU;
 *  - nb_gpu_empty_cache, nb_gpu_set_reserve and the out-of-memory retry (a
 *    wait for the whole card). */

typedef struct busy {
    nb_tensor *x, *labels, *target; /* [16, 32]; [16, 8] probabilities; [16, 8] in (0, 1) */
    nb_variable *w, *b;             /* [32, 8], [8] */
    nb_optimizer *opt;
} busy;

/* One step, every op recorded on a tape that watches x: elementwise with
 * broadcasting, comparisons and where, reductions, a batched matmul, softmax,
 * a dense layer and three losses; then the backward pass and a momentum step
 * on w and b. Returns a 0-d summary of it all. */
static nb_tensor *busy_step(busy *k)
{
    nb_tape *tape = nb_tape_begin();
    if (nb_tape_watch(tape, k->x))
        return NULL;
    nb_tensor *x = k->x, *w = nb_read(k->w), *b = nb_read(k->b), *zero = nb_zeros_like(x);
    nb_tensor *e = nb_add(nb_mul(nb_tanh(x), nb_sigmoid(x)), nb_mul_scalar(nb_exp(nb_neg(nb_square(x))), 0.5));
    e = nb_sub(nb_div(e, nb_add_scalar(nb_abs(x), 1.0)), nb_minimum(x, zero));
    e = nb_where(nb_greater(x, zero), e, nb_gelu(x));
    e = nb_add(e, nb_mul(nb_softplus(x), nb_mean(x, NB_AXES(1), true))); /* [16, 32] * [16, 1] */
    nb_tensor *r = nb_sub(nb_add(nb_mean(e, NB_AXES(0), false), nb_max(e, NB_AXES(0), false)),
                          nb_min(e, NB_AXES(0), false)); /* [32] */
    nb_tensor *lse = nb_logsumexp(e, NB_AXES(1), false); /* [16] */
    nb_tensor *am = nb_cast(nb_argmax(e, 1, false), NB_F64);
    nb_tensor *e3 = nb_reshape(e, NB_SHAPE(4, 4, 32));
    nb_tensor *mm = nb_mul_scalar(nb_matmul(e3, nb_transpose(e3, 1, 2)), 0.1); /* [4, 4, 4] */
    nb_tensor *sm = nb_sum_all(nb_mul(nb_softmax(mm, -1), nb_log_softmax(mm, 1)));
    nb_tensor *h = nb_add(nb_matmul(x, w), b); /* [16, 8] */
    nb_tensor *loss = nb_mean_all(nb_softmax_cross_entropy(h, k->labels));
    loss = nb_add(loss, nb_mean_all(nb_sigmoid_cross_entropy(h, k->target)));
    loss = nb_add(loss, nb_mean_squared_error(nb_sigmoid(nb_relu(h)), k->target));
    nb_tensor *extra = nb_add(nb_add(nb_mean_all(r), nb_mean_all(lse)), nb_add(sm, nb_mean_all(am)));
    nb_tensor *total = nb_add(loss, nb_mul_scalar(extra, 1e-3));
    nb_tensor *g[3] = {NULL, NULL, NULL};
    if (nb_tape_gradient(tape, total, NB_TENSORS(x, w, b), g) || nb_tape_stop(tape))
        return NULL;
    if (nb_optimizer_apply(k->opt, NB_VARS(k->w, k->b), (nb_tensor *const[]){g[1], g[2]}))
        return NULL;
    return nb_add(total, nb_mul_scalar(nb_mean_all(nb_square(g[0])), 1e-3));
}

static int busy_ops;
static void count_ops(nb_log_level level, const char *message, void *user)
{
    (void)level, (void)user;
    if (strstr(message, "on " GPU))
        busy_ops++;
}

/* Runs steps of busy_step on k's device and sums their summaries into *acc
 * (kept in the caller's scope). *waits: /gpu:0's host waits after the first
 * step (a warm-up) when non-NULL. */
static void busy_run(busy *k, int steps, nb_tensor **acc, int64_t *waits)
{
    for (int i = 0; i < steps; i++) {
        if (i == 1 && waits)
            *waits = nb_gpu_host_waits(GPU);
        nb_scope *s = nb_scope_begin();
        nb_tensor *t = busy_step(k);
        nb_tensor *sum = t && *acc ? nb_add(*acc, t) : t;
        *acc = sum ? nb_keep(sum) : NULL;
        nb_scope_end(s);
        if (!*acc)
            break;
    }
    CHECK(*acc != NULL);
}

static void busy_setup(busy *k, const char *dev)
{
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(16, 32), 0, 1, 80);
    nb_tensor *labels = nb_softmax(nb_random_normal(NB_F64, NB_SHAPE(16, 8), 0, 2, 81), -1);
    nb_tensor *target = nb_random_uniform(NB_F64, NB_SHAPE(16, 8), 0.05, 0.95, 82);
    nb_tensor *w = nb_random_normal(NB_F64, NB_SHAPE(32, 8), 0, 0.3, 83), *b = nb_zeros(NB_F64, NB_SHAPE(8));
    k->x = nb_to_device(x, dev);
    k->labels = nb_to_device(labels, dev);
    k->target = nb_to_device(target, dev);
    k->w = nb_variable_new("busy/w", nb_to_device(w, dev));
    k->b = nb_variable_new("busy/b", nb_to_device(b, dev));
    k->opt = nb_sgd_momentum_new(0.05, 0.9, false);
    CHECK(k->x && k->labels && k->target && k->w && k->b && k->opt);
}

static void busy_free(busy *k)
{
    nb_variable_free(k->w);
    nb_variable_free(k->b);
    nb_optimizer_free(k->opt);
}

static void test_no_host_waits(void)
{
    enum { STEPS = 50 }; /* about 245 ops each */
    CHECK(nb_gpu_host_waits(CPU) == -1);
    CHECK_ERROR(NB_ERR_DEVICE, "not a GPU");
    CHECK(nb_gpu_host_waits("/gpu:63") == -1);
    CHECK_ERROR(NB_ERR_DEVICE, "/gpu:63");

    busy kg, kc;
    busy_setup(&kg, GPU);
    busy_setup(&kc, CPU);
    nb_tensor *acc_g = NULL, *acc_c = NULL;
    int64_t before = -1;
    /* count the ops through the placement log */
    nb_log_callback old = nb_set_log_callback(count_ops, NULL);
    bool logged = nb_set_log_device_placement(true);
    busy_ops = 0;
    busy_run(&kg, STEPS, &acc_g, &before);
    int64_t after = nb_gpu_host_waits(GPU);
    nb_set_log_device_placement(logged);
    nb_set_log_callback(old, NULL);
    CHECK(before >= 0);
    if (after != before)
        fprintf(stderr, "[%s] %lld host waits in %d ops that read nothing\n", check_current,
                (long long)(after - before), busy_ops);
    CHECK(after == before);
    CHECK(busy_ops >= 10000);

    /* reading a value waits */
    double v = nb_tensor_item(acc_g);
    CHECK(isfinite(v));
    CHECK(nb_gpu_host_waits(GPU) > after);

    /* the same steps on the CPU give the same numbers */
    busy_run(&kc, STEPS, &acc_c, NULL);
    CHECK_MATCH("stress summary", acc_g, acc_c, 1e-9);
    CHECK_MATCH("stress w", nb_read(kg.w), nb_read(kc.w), 1e-9);
    CHECK_MATCH("stress b", nb_read(kg.b), nb_read(kc.b), 1e-9);

    /* the index checks queue on the device; a synchronisation waits */
    const int64_t idx[3] = {2, 0, 2};
    nb_tensor *ig = gpu(nb_from_buffer(NB_I64, NB_SHAPE(3), idx));
    int64_t n1 = nb_gpu_host_waits(GPU);
    CHECK(nb_gather(kg.x, ig) != NULL);
    CHECK(nb_sparse_softmax_cross_entropy(nb_slice(kg.labels, NB_SHAPE(0, 0), NB_SHAPE(3, -1)), ig) != NULL);
    int64_t n2 = nb_gpu_host_waits(GPU);
    CHECK(n2 == n1);
    CHECK_OK(nb_synchronize());
    int64_t n3 = nb_gpu_host_waits(GPU);
    CHECK(n3 > n2);
    /* a large upload runs on the copy stream; the data arrive intact */
    const int64_t big = (int64_t)10 << 20; /* 40 MiB of f32 */
    float *host = calloc((size_t)big, sizeof *host);
    CHECK(host != NULL);
    if (host) {
        host[big - 1] = 3.5f;
        CHECK_OK(nb_device_push(GPU));
        nb_tensor *up = nb_from_buffer(NB_F32, NB_SHAPE(big), host);
        CHECK_OK(nb_device_pop());
        CHECK(up != NULL && nb_tensor_get(up, big - 1) == 3.5);
        free(host);
    }
    busy_free(&kg);
    busy_free(&kc);
}

int main(void)
{
    /* before any device is used: two logical GPUs per card */
    if (nb_set_logical_gpu_devices(2) != NB_OK)
        return 1;
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return check_no_gpu("test_gpu");
    RUN(test_tf32);
    RUN(test_int_to_half);
    RUN(test_same_as_cpu);
    RUN(test_logsumexp);
    RUN(test_gradients);
    RUN(test_random);
    RUN(test_transfers);
    RUN(test_gradient_checker);
    RUN(test_mixed_devices);
    RUN(test_no_host_waits);
    RUN(test_allocator_stats);
    RUN(test_reserve);
    RUN(test_out_of_memory);
    return check_finish();
}
