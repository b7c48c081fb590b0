/* The CPU kernel table (ops/cpu) on its own: nb_view's over malloc'd buffers,
 * no tensors. Every kernel is compared with a plain reference (an elementwise
 * op's is the one beside its formula, lib/core/formulas.h) on random,
 * never-zero inputs, with contiguous, strided (transposed, stepped) and
 * broadcast (stride 0) operands; outputs are poisoned first (NaN for floats,
 * 0x5A bytes for integers) so an unwritten element fails. Exits 0 on success,
 * 1 on failure. */
#include <nabla/nabla.h>

#include "lib/core/backend.h"
#include "lib/core/formulas.h"
#include "lib/core/half.h"
#include "ops/cpu/cpu_internal.h"
#include "splitmix.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB_TEST_ASAN NB_ASAN

/* Under AddressSanitizer the impossible allocation below must return NULL, not abort. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static int failures;
static const char *current = "";

#define EXPECT(cond, ...)                                                                     \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            if (failures < 60) {                                                              \
                fprintf(stderr, "%s:%d: [%s] ", __FILE__, __LINE__, current);                 \
                fprintf(stderr, __VA_ARGS__);                                                 \
                fprintf(stderr, "\n");                                                        \
            }                                                                                 \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

#define EXPECT_OK(expr)                                                                       \
    do {                                                                                      \
        nb_status st_ = (expr);                                                               \
        EXPECT(st_ == NB_OK, "%s returned %s: %s", #expr, nb_status_name(st_),                \
               nb_error_message());                                                           \
        nb_error_clear();                                                                     \
    } while (0)

/* Expects the pending error to be code with a message containing sub. */
static void expect_error(int line, nb_status got, nb_status code, const char *sub)
{
    if (got != code || nb_error() != code || !strstr(nb_error_message(), sub)) {
        fprintf(stderr, "%s:%d: [%s] expected %s containing '%s', got %s / %s: '%s'\n", __FILE__,
                line, current, nb_status_name(code), sub, nb_status_name(got),
                nb_status_name(nb_error()), nb_error_message());
        failures++;
    }
    nb_error_clear();
}
#define EXPECT_ERROR(expr, code, sub) expect_error(__LINE__, (expr), (code), (sub))

static nb_device *const DEV = NULL; /* kernels take the device only for messages */
#define B (&nb__cpu_backend)

/* ---- random numbers ------------------------------------------------------------------------ */

/* Never zero: +-[lo, hi). */
static double rng_nonzero(double lo, double hi)
{
    double v = lo + (hi - lo) * rng_unit();
    return (rng_u64() & 1) ? v : -v;
}

/* ---- arrays: a view over its own buffer ------------------------------------------------------ */

typedef struct arr {
    nb_view v;
    char *mem;
    int64_t mem_elems;
} arr;

static int64_t esize(nb_dtype d) { return (int64_t)nb_dtype_size(d); }

static bool is_float(nb_dtype d) { return d == NB_F32 || d == NB_F64; }

static double rd(nb_dtype d, const char *p)
{
    switch (d) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    default: return *(const uint8_t *)p;
    }
}

static void wr(nb_dtype d, char *p, double v)
{
    switch (d) {
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_I32: *(int32_t *)p = (int32_t)v; break;
    case NB_I64: *(int64_t *)p = (int64_t)v; break;
    case NB_BOOL: *(uint8_t *)p = v != 0; break;
    default: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
    }
}

/* estrides: element strides (NULL: row-major contiguous); any may be 0. */
static arr arr_new(nb_dtype dt, int nd, const int64_t *shape, const int64_t *estrides)
{
    arr a;
    memset(&a, 0, sizeof a);
    a.v.dtype = dt;
    a.v.ndim = nd;
    int64_t numel = 1, span = 1, s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        a.v.shape[i] = shape[i];
        int64_t st = estrides ? estrides[i] : s;
        a.v.strides[i] = st * esize(dt);
        s *= shape[i] > 0 ? shape[i] : 1;
        numel *= shape[i];
        if (shape[i] > 0)
            span += (shape[i] - 1) * st;
    }
    a.v.numel = numel;
    bool contiguous = true;
    int64_t expect = esize(dt);
    for (int i = nd - 1; i >= 0; i--) {
        if (shape[i] != 1 && a.v.strides[i] != expect) {
            contiguous = false;
            break;
        }
        expect *= shape[i];
    }
    a.v.contiguous = contiguous || numel == 0;
    a.mem_elems = span;
    a.mem = malloc((size_t)(span * esize(dt)) + 64);
    a.v.data = a.mem;
    return a;
}

static arr arr_c(nb_dtype dt, int nd, const int64_t *shape) { return arr_new(dt, nd, shape, NULL); }

static void arr_free(arr *a)
{
    free(a->mem);
    a->mem = NULL;
}

static char *arr_ptr(const arr *a, int64_t flat)
{
    int64_t off = 0;
    for (int d = a->v.ndim - 1; d >= 0; d--) {
        int64_t i = flat % a->v.shape[d];
        flat /= a->v.shape[d];
        off += i * a->v.strides[d];
    }
    return (char *)a->v.data + off;
}

static double get(const arr *a, int64_t flat) { return rd(a->v.dtype, arr_ptr(a, flat)); }
static void set(arr *a, int64_t flat, double v) { wr(a->v.dtype, arr_ptr(a, flat), v); }

/* Fills the whole buffer (gaps too) with random never-zero values. */
static void arr_rand(arr *a, double lo, double hi)
{
    for (int64_t i = 0; i < a->mem_elems; i++) {
        char *p = a->mem + i * esize(a->v.dtype);
        switch (a->v.dtype) {
        case NB_F32: case NB_F64: wr(a->v.dtype, p, rng_nonzero(lo, hi)); break;
        case NB_I32: case NB_I64: {
            int64_t m = (int64_t)hi;
            int64_t v = 1 + (int64_t)(rng_u64() % (uint64_t)(m > 1 ? m : 1));
            wr(a->v.dtype, p, (rng_u64() & 1) ? (double)v : -(double)v);
            break;
        }
        case NB_BOOL: wr(a->v.dtype, p, (double)(rng_u64() & 1)); break;
        default: wr(a->v.dtype, p, (double)(1 + rng_u64() % 200)); break;
        }
    }
}

static void arr_poison(arr *a)
{
    memset(a->mem, is_float(a->v.dtype) ? 0xFF : 0x5A, (size_t)(a->mem_elems * esize(a->v.dtype)));
}

/* |got - want| <= tol * (1 + |want|), NaN only where want is NaN. */
static bool close_to(double got, double want, double tol)
{
    if (want != want)
        return got != got;
    if (isinf(want))
        return got == want;
    return fabs(got - want) <= tol * (1 + fabs(want));
}

static double tol_for(nb_dtype d) { return d == NB_F32 ? 2e-6 : d == NB_F64 ? 1e-13 : 0; }

static const nb_dtype ALL6[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_BOOL, NB_U8};

/* ---- layouts for elementwise operands ----------------------------------------------------- */

enum { L_CONTIG, L_TRANS, L_STEP, L_BCAST0, L_BCAST_LAST, L_SCALAR, L_COUNT };
static const char *const layout_names[L_COUNT] = {"contiguous", "transposed", "stepped",
                                                  "broadcast-dim0", "broadcast-last", "scalar"};

static arr arr_layout(nb_dtype dt, int nd, const int64_t *shape, int layout)
{
    int64_t st[NB_MAX_DIMS];
    int64_t s = 1;
    switch (layout) {
    case L_TRANS:
        for (int i = 0; i < nd; i++) {
            st[i] = s;
            s *= shape[i];
        }
        break;
    case L_STEP:
        s = 2;
        for (int i = nd - 1; i >= 0; i--) {
            st[i] = s;
            s *= shape[i] * (i == nd - 1 ? 2 : 1);
        }
        break;
    case L_BCAST0:
    case L_BCAST_LAST:
        for (int i = nd - 1; i >= 0; i--) {
            bool b = layout == L_BCAST0 ? i == 0 : i == nd - 1;
            st[i] = b ? 0 : s;
            s *= b ? 1 : shape[i];
        }
        break;
    case L_SCALAR:
        for (int i = 0; i < nd; i++)
            st[i] = 0;
        break;
    default:
        return arr_c(dt, nd, shape);
    }
    return arr_new(dt, nd, shape, st);
}

/* Output layouts: contiguous, transposed or stepped (never broadcast). */
static int out_layout(int i) { return i % 3 == 0 ? L_CONTIG : i % 3 == 1 ? L_TRANS : L_STEP; }

static const int64_t SHAPE_SMALL[3] = {4, 5, 6};
static const int64_t SHAPE_BIG[2] = {200, 350}; /* > 2 * grain: the parallel path */

/* ---- memory ---------------------------------------------------------------------------------- */

typedef struct xthread {
    void *ptrs[64];
    size_t sizes[64];
} xthread;

static void *free_elsewhere(void *arg)
{
    xthread *x = arg;
    for (int i = 0; i < 64; i++)
        B->free(DEV, x->ptrs[i], x->sizes[i]);
    return NULL;
}

static void test_memory(void)
{
    current = "memory";
    static const size_t sizes[] = {0, 1, 7, 64, 65, 100, 255, 256, 257, 1000, 4096, 5000,
                                   65536, 100000, 1 << 20, 3 << 20, (size_t)70 << 20};
    const int n = (int)(sizeof sizes / sizeof *sizes);
    void *p[32];
    for (int i = 0; i < n; i++) {
        p[i] = B->alloc(DEV, sizes[i]);
        EXPECT(p[i] != NULL, "alloc(%zu) failed", sizes[i]);
        EXPECT(((uintptr_t)p[i] & 63) == 0, "alloc(%zu) is not 64-byte aligned", sizes[i]);
        if (p[i] && sizes[i])
            memset(p[i], 0xAB, sizes[i]);
    }
    for (int i = 0; i < n; i++)
        B->free(DEV, p[i], sizes[i]);
    /* The same sizes again come from the cache: no system allocation. */
    nb_cpu_alloc_stats before = nb__cpu_alloc_stats();
    for (int round = 0; round < 100; round++) {
        for (int i = 0; i < n - 1; i++)
            p[i] = B->alloc(DEV, sizes[i]);
        for (int i = 0; i < n - 1; i++)
            B->free(DEV, p[i], sizes[i]);
    }
    nb_cpu_alloc_stats after = nb__cpu_alloc_stats();
    /* (Under AddressSanitizer the cache is off so that use-after-free shows.) */
    EXPECT(after.system_allocs == before.system_allocs || NB_TEST_ASAN,
           "repeated allocations reached the system %lld times",
           (long long)(after.system_allocs - before.system_allocs));
    /* Freed on another thread, then reused here. */
    xthread x;
    for (int i = 0; i < 64; i++) {
        x.sizes[i] = (size_t)(i + 1) * 1000;
        x.ptrs[i] = B->alloc(DEV, x.sizes[i]);
        memset(x.ptrs[i], i, x.sizes[i]);
    }
    pthread_t t;
    pthread_create(&t, NULL, free_elsewhere, &x);
    pthread_join(t, NULL); /* the thread's cache moves to the global cache as it exits */
    before = nb__cpu_alloc_stats();
    for (int i = 0; i < 64; i++)
        x.ptrs[i] = B->alloc(DEV, x.sizes[i]);
    after = nb__cpu_alloc_stats();
    EXPECT(after.system_allocs == before.system_allocs || NB_TEST_ASAN,
           "blocks freed on an exited thread were not reused (%lld new)",
           (long long)(after.system_allocs - before.system_allocs));
    for (int i = 0; i < 64; i++)
        B->free(DEV, x.ptrs[i], x.sizes[i]);
    /* Copies and synchronize. */
    char src[100], mid[100], dst[100];
    for (int i = 0; i < 100; i++)
        src[i] = (char)i;
    EXPECT_OK(B->copy_from_host(DEV, mid, src, 100));
    EXPECT_OK(B->copy_between(DEV, dst, DEV, mid, 100));
    memset(mid, 0, 100);
    EXPECT_OK(B->copy_to_host(DEV, mid, dst, 100));
    EXPECT(memcmp(mid, src, 100) == 0, "copies lost data");
    EXPECT_OK(B->synchronize(DEV));
    /* A large copy takes the parallel path. */
    size_t big = (size_t)20 << 20;
    char *b1 = B->alloc(DEV, big), *b2 = B->alloc(DEV, big);
    for (size_t i = 0; i < big; i++)
        b1[i] = (char)(i * 7);
    EXPECT_OK(B->copy_between(DEV, b2, DEV, b1, big));
    EXPECT(memcmp(b1, b2, big) == 0, "large copy differs");
    B->free(DEV, b1, big);
    B->free(DEV, b2, big);
    /* An impossible size: NULL and NB_ERR_OUT_OF_MEMORY naming the size. */
    void *huge = B->alloc(DEV, (size_t)1 << 62);
    EXPECT(huge == NULL, "alloc(2^62) succeeded");
    EXPECT(nb_error() == NB_ERR_OUT_OF_MEMORY && strstr(nb_error_message(), "4611686018427387904"),
           "alloc(2^62): %s '%s'", nb_status_name(nb_error()), nb_error_message());
    nb_error_clear();
    nb__cpu_alloc_trim();
}

/* ---- fill, arange, random ---------------------------------------------------------------- */

static void test_fill_arange(void)
{
    current = "fill";
    for (size_t di = 0; di < 6; di++) {
        nb_dtype dt = ALL6[di];
        for (int l = 0; l < 3; l++) {
            arr o = arr_layout(dt, 3, SHAPE_SMALL, out_layout(l));
            arr_poison(&o);
            double value = dt == NB_BOOL ? 1 : dt == NB_U8 ? 200 : is_float(dt) ? -2.5 : -7;
            EXPECT_OK(B->fill(DEV, &o.v, value));
            for (int64_t i = 0; i < o.v.numel; i++)
                EXPECT(get(&o, i) == value, "%s %s: [%lld] = %g", nb_dtype_name(dt),
                       layout_names[out_layout(l)], (long long)i, get(&o, i));
            if (out_layout(l) == L_STEP) { /* the gaps stay untouched */
                const char *gap = o.mem + esize(dt);
                EXPECT(((const unsigned char *)gap)[0] == (is_float(dt) ? 0xFF : 0x5A),
                       "fill wrote into a gap");
            }
            arr_free(&o);
        }
    }
    arr big = arr_c(NB_F32, 2, SHAPE_BIG);
    arr_poison(&big);
    EXPECT_OK(B->fill(DEV, &big.v, 0.25));
    for (int64_t i = 0; i < big.v.numel; i++)
        if (get(&big, i) != 0.25) {
            EXPECT(0, "big fill [%lld] = %g", (long long)i, get(&big, i));
            break;
        }
    arr_free(&big);

    current = "arange";
    const nb_dtype ad[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_U8};
    for (size_t di = 0; di < 5; di++) {
        nb_dtype dt = ad[di];
        int64_t shape[1] = {50};
        arr o = arr_c(dt, 1, shape);
        arr_poison(&o);
        double start = is_float(dt) ? -1.5 : 3, step = is_float(dt) ? 0.25 : 2;
        EXPECT_OK(B->arange(DEV, &o.v, start, step));
        for (int64_t i = 0; i < 50; i++) {
            double want = start + (double)i * step;
            EXPECT(close_to(get(&o, i), want, tol_for(dt)), "%s [%lld] = %g, want %g",
                   nb_dtype_name(dt), (long long)i, get(&o, i), want);
        }
        arr_free(&o);
    }
    {
        int64_t shape[1] = {100000};
        arr o = arr_c(NB_I64, 1, shape);
        arr_poison(&o);
        EXPECT_OK(B->arange(DEV, &o.v, 0, 1));
        for (int64_t i = 0; i < 100000; i++)
            if (get(&o, i) != (double)i) {
                EXPECT(0, "big arange [%lld] = %g", (long long)i, get(&o, i));
                break;
            }
        arr_free(&o);
    }
}

static void test_random(void)
{
    current = "random";
    const int64_t n = 200000;
    int64_t shape1[1] = {n}, shape2[2] = {n / 100, 100};
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di ? NB_F64 : NB_F32;
        for (int dist = 0; dist < 3; dist++) {
            double a = dist == NB_RAND_UNIFORM ? -2 : 1.5, b = dist == NB_RAND_UNIFORM ? 3 : 2;
            arr o = arr_c(dt, 1, shape1), o2 = arr_c(dt, 2, shape2), o3 = arr_c(dt, 1, shape1);
            arr_poison(&o);
            arr_poison(&o2);
            arr_poison(&o3);
            EXPECT_OK(B->random(DEV, &o.v, (nb_random_dist)dist, a, b, 1234, NULL));
            EXPECT_OK(B->random(DEV, &o2.v, (nb_random_dist)dist, a, b, 1234, NULL));
            EXPECT_OK(B->random(DEV, &o3.v, (nb_random_dist)dist, a, b, 1235, NULL));
            /* seed_add, read from memory, the bits of a uint64 in a double's
             * place: 1233 + 2 is seed 1235, and so is 1237 + (2^64 - 2) */
            const uint64_t adds[2] = {2, (uint64_t)0 - 2}, bases[2] = {1233, 1237};
            for (int k = 0; k < 2; k++) {
                double add;
                memcpy(&add, &adds[k], sizeof add);
                arr o4 = arr_c(dt, 1, shape1);
                arr_poison(&o4);
                EXPECT_OK(B->random(DEV, &o4.v, (nb_random_dist)dist, a, b, bases[k], &add));
                EXPECT(memcmp(o3.v.data, o4.v.data, (size_t)n * nb_dtype_size(dt)) == 0,
                       "seed %llu + seed_add %llu is not seed 1235", (unsigned long long)bases[k],
                       (unsigned long long)adds[k]);
                arr_free(&o4);
            }
            double sum = 0, sum2 = 0, lo = INFINITY, hi = -INFINITY;
            int64_t same_other_seed = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = get(&o, i);
                EXPECT(v == v, "NaN at %lld", (long long)i);
                if (v != get(&o2, i) && failures < 50)
                    EXPECT(0, "element %lld depends on the shape", (long long)i);
                same_other_seed += v == get(&o3, i);
                sum += v;
                sum2 += v * v;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            double mean = sum / (double)n, sd = sqrt(sum2 / (double)n - mean * mean);
            EXPECT(same_other_seed < 10, "seeds 1234 and 1235 agree on %lld elements",
                   (long long)same_other_seed);
            if (dist == NB_RAND_UNIFORM) {
                EXPECT(lo >= a && hi < b, "uniform outside [%g, %g): %g .. %g", a, b, lo, hi);
                EXPECT(fabs(mean - 0.5) < 0.02, "uniform mean %g", mean);
                EXPECT(fabs(sd - 5 / sqrt(12.0)) < 0.02, "uniform sd %g", sd);
            } else if (dist == NB_RAND_NORMAL) {
                EXPECT(fabs(mean - a) < 0.02, "normal mean %g", mean);
                EXPECT(fabs(sd - b) < 0.02, "normal sd %g", sd);
                double z = nb__cpu_philox_normal(1234, 77, 0);
                EXPECT(close_to(get(&o, 77), a + b * z, tol_for(dt)), "element 77 is not (seed, 77)'s draw");
            } else {
                EXPECT(lo >= a - 2 * b && hi <= a + 2 * b, "truncated outside 2 sd: %g .. %g", lo, hi);
                EXPECT(fabs(mean - a) < 0.02, "truncated mean %g", mean);
                /* sd of a normal truncated at 2 sd: 0.8796 */
                EXPECT(fabs(sd - 0.8796 * b) < 0.02, "truncated sd %g", sd);
            }
            arr_free(&o);
            arr_free(&o2);
            arr_free(&o3);
        }
    }
    /* Strided output: element i is still (seed, i)'s. */
    int64_t sh[2] = {6, 7}, st[2] = {1, 6};
    arr t = arr_new(NB_F64, 2, sh, st), c = arr_c(NB_F64, 2, sh);
    EXPECT_OK(B->random(DEV, &t.v, NB_RAND_NORMAL, 0, 1, 99, NULL));
    EXPECT_OK(B->random(DEV, &c.v, NB_RAND_NORMAL, 0, 1, 99, NULL));
    for (int64_t i = 0; i < 42; i++)
        EXPECT(get(&t, i) == get(&c, i), "strided random differs at %lld", (long long)i);
    arr_free(&t);
    arr_free(&c);
}

/* ---- copy ------------------------------------------------------------------------------------ */

/* The conversion the kernel promises, in double. */
static double convert_ref(double v, nb_dtype from, nb_dtype to)
{
    switch (to) {
    case NB_F32: return (float)v;
    case NB_F64: return v;
    case NB_I32: case NB_I64: return trunc(v);
    case NB_BOOL: return v != 0;
    default: return (double)(((int64_t)trunc(v)) & 0xFF);
    }
    (void)from;
}

static void test_copy(void)
{
    current = "copy";
    for (size_t i = 0; i < 6; i++)
        for (size_t o = 0; o < 6; o++)
            for (int l = 0; l < L_COUNT; l++) {
                nb_dtype di = ALL6[i], dout = ALL6[o];
                arr in = arr_layout(di, 3, SHAPE_SMALL, l);
                arr out = arr_layout(dout, 3, SHAPE_SMALL, out_layout(l));
                arr_rand(&in, 0.1, 100);
                arr_poison(&out);
                EXPECT_OK(B->copy(DEV, &out.v, &in.v));
                for (int64_t k = 0; k < out.v.numel; k++) {
                    double want = convert_ref(get(&in, k), di, dout);
                    if (!close_to(get(&out, k), want, tol_for(dout))) {
                        EXPECT(0, "%s -> %s (%s): [%lld] = %g, want %g", nb_dtype_name(di),
                               nb_dtype_name(dout), layout_names[l], (long long)k, get(&out, k), want);
                        break;
                    }
                }
                arr_free(&in);
                arr_free(&out);
            }
    /* Large, transposed input (parallel, strided). */
    arr in = arr_layout(NB_F32, 2, SHAPE_BIG, L_TRANS), out = arr_c(NB_F64, 2, SHAPE_BIG);
    arr_rand(&in, 0.1, 10);
    arr_poison(&out);
    EXPECT_OK(B->copy(DEV, &out.v, &in.v));
    for (int64_t k = 0; k < out.v.numel; k++)
        if (get(&out, k) != get(&in, k)) {
            EXPECT(0, "big copy [%lld]", (long long)k);
            break;
        }
    arr_free(&in);
    arr_free(&out);
}

/* ---- unary ----------------------------------------------------------------------------------- */

/* Each op's reference, written beside its formula (lib/core/formulas.h). */
static double (*const unary_refs[])(double x, double alpha, int int_bits) = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = nb_ref_un_##name,
#include "lib/core/ops.def"
};
static double (*const binary_refs[])(double x, double y, int int_bits) = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) [NB_BIN_##ID] = nb_ref_bin_##name,
#include "lib/core/ops.def"
};
_Static_assert(sizeof unary_refs / sizeof *unary_refs == NB_UN_COUNT, "unary references and ops.def disagree");
_Static_assert(sizeof binary_refs / sizeof *binary_refs == NB_BIN_COUNT, "binary references and ops.def disagree");

/* The references' integer width: 0 for the floating dtypes. */
static int int_bits(nb_dtype dt) { return dt == NB_I32 ? 32 : dt == NB_I64 ? 64 : 0; }

static bool positive_domain(nb_unary_op op, double alpha)
{
    return op == NB_UN_LOG || op == NB_UN_SQRT || op == NB_UN_RSQRT ||
           (op == NB_UN_POW_SCALAR && alpha != floor(alpha));
}

static void check_unary(nb_unary_op op, nb_dtype dt, double alpha, int nd, const int64_t *shape,
                        int lin, int lout)
{
    arr x = arr_layout(dt, nd, shape, lin), o = arr_layout(dt, nd, shape, lout);
    arr_rand(&x, 0.1, is_float(dt) ? 3 : 50);
    if (positive_domain(op, alpha))
        for (int64_t i = 0; i < x.mem_elems; i++) {
            char *p = x.mem + i * esize(dt);
            wr(dt, p, fabs(rd(dt, p)));
        }
    arr_poison(&o);
    EXPECT_OK(B->unary(DEV, op, &o.v, &x.v, alpha));
    double tol = dt == NB_F32 ? 1e-5 : dt == NB_F64 ? 1e-12 : 0;
    for (int64_t i = 0; i < o.v.numel; i++) {
        double xv = get(&x, i), want = unary_refs[op](xv, alpha, int_bits(dt));
        if (!is_float(dt))
            want = trunc(want);
        if (!close_to(get(&o, i), want, tol)) {
            EXPECT(0, "op %d %s alpha %g (%s -> %s): f(%g) = %.9g, want %.9g", (int)op,
                   nb_dtype_name(dt), alpha, layout_names[lin], layout_names[lout], xv,
                   get(&o, i), want);
            break;
        }
    }
    arr_free(&x);
    arr_free(&o);
}

static void test_unary(void)
{
    current = "unary";
    for (int op = 0; op < NB_UN_COUNT; op++)
        for (int di = 0; di < 2; di++) {
            nb_dtype dt = di ? NB_F64 : NB_F32;
            double alphas[3] = {0.37, -0.5, 2};
            int na = op == NB_UN_POW_SCALAR ? 3 : op == NB_UN_STEP ? 2 : 1;
            if (op == NB_UN_POW_SCALAR) {
                alphas[0] = 2.5;
                alphas[1] = -1;
            }
            for (int a = 0; a < na; a++)
                for (int l = 0; l < L_COUNT; l++)
                    check_unary((nb_unary_op)op, dt, alphas[a], 3, SHAPE_SMALL, l, out_layout(l));
            check_unary((nb_unary_op)op, dt, alphas[0], 2, SHAPE_BIG, L_CONTIG, L_CONTIG);
        }
    /* the ops the list defines on integers (NUMERIC) */
    for (int op = 0; op < NB_UN_COUNT; op++)
        for (int di = 0; di < 2; di++) {
            nb_dtype dt = di ? NB_I64 : NB_I32;
            if (!(nb__unary_dtypes((nb_unary_op)op) & NB_MASK(dt)))
                continue;
            for (int l = 0; l < L_COUNT; l++) {
                check_unary((nb_unary_op)op, dt, 3, 3, SHAPE_SMALL, l, out_layout(l));
                check_unary((nb_unary_op)op, dt, 2.5, 3, SHAPE_SMALL, l, out_layout(l));
            }
            check_unary((nb_unary_op)op, dt, -4, 2, SHAPE_BIG, L_TRANS, L_CONTIG);
        }
    /* step at exactly 0, both conventions; relu/sign at 0 */
    double xs[4] = {-1, 0, 0.5, -0.0};
    int64_t shape[1] = {4};
    arr x = arr_c(NB_F32, 1, shape), o = arr_c(NB_F32, 1, shape);
    for (int i = 0; i < 4; i++)
        set(&x, i, xs[i]);
    EXPECT_OK(B->unary(DEV, NB_UN_STEP, &o.v, &x.v, 0));
    EXPECT(get(&o, 0) == 0 && get(&o, 1) == 0 && get(&o, 2) == 1, "step(alpha 0) at 0");
    EXPECT_OK(B->unary(DEV, NB_UN_STEP, &o.v, &x.v, -1));
    EXPECT(get(&o, 0) == 0 && get(&o, 1) == 1 && get(&o, 2) == 1 && get(&o, 3) == 1,
           "step(alpha < 0) at 0");
    EXPECT_OK(B->unary(DEV, NB_UN_SIGN, &o.v, &x.v, 0));
    EXPECT(get(&o, 1) == 0 && get(&o, 0) == -1, "sign at 0");
    /* stability at the extremes */
    xs[0] = -200, xs[1] = 200, xs[2] = -100, xs[3] = 100;
    for (int i = 0; i < 4; i++)
        set(&x, i, xs[i]);
    EXPECT_OK(B->unary(DEV, NB_UN_SIGMOID, &o.v, &x.v, 0));
    EXPECT(get(&o, 0) == 0 && get(&o, 1) == 1, "sigmoid(+-200) = %g, %g", get(&o, 0), get(&o, 1));
    EXPECT_OK(B->unary(DEV, NB_UN_SOFTPLUS, &o.v, &x.v, 0));
    EXPECT(get(&o, 0) == 0 && close_to(get(&o, 1), 200, 1e-6), "softplus(+-200) = %g, %g",
           get(&o, 0), get(&o, 1));
    arr_free(&x);
    arr_free(&o);
}

/* ---- binary, where -------------------------------------------------------------------------- */

static void check_binary(nb_binary_op op, nb_dtype dt, int nd, const int64_t *shape, int la,
                         int lb, int lo)
{
    nb_dtype odt = nb__binary_is_comparison(op) ? NB_BOOL : dt;
    arr a = arr_layout(dt, nd, shape, la), b = arr_layout(dt, nd, shape, lb);
    arr o = arr_layout(odt, nd, shape, lo);
    arr_rand(&a, 0.1, is_float(dt) ? 3 : 20);
    arr_rand(&b, 0.1, is_float(dt) ? 3 : 20);
    if (op == NB_BIN_POW) {
        for (int64_t i = 0; i < a.mem_elems; i++) {
            char *p = a.mem + i * esize(dt);
            wr(dt, p, is_float(dt) ? fabs(rd(dt, p)) : (double)((int64_t)rd(dt, p) % 5));
        }
        for (int64_t i = 0; i < b.mem_elems && !is_float(dt); i++) {
            char *q = b.mem + i * esize(dt);
            wr(dt, q, (double)((int64_t)rd(dt, q) % 6));
        }
    }
    if (nb__binary_is_comparison(op)) /* make some equal pairs */
        for (int64_t i = 0; i < a.v.numel && i < b.v.numel; i += 3)
            set(&a, i, get(&b, i));
    arr_poison(&o);
    EXPECT_OK(B->binary(DEV, op, &o.v, &a.v, &b.v));
    double tol = dt == NB_F32 ? 1e-5 : dt == NB_F64 ? 1e-13 : 0;
    for (int64_t i = 0; i < o.v.numel; i++) {
        double x = get(&a, i), y = get(&b, i), want = binary_refs[op](x, y, int_bits(dt));
        if (!close_to(get(&o, i), want, tol)) {
            EXPECT(0, "op %d %s (%s, %s -> %s): f(%g, %g) = %.9g, want %.9g", (int)op,
                   nb_dtype_name(dt), layout_names[la], layout_names[lb], layout_names[lo], x, y,
                   get(&o, i), want);
            break;
        }
    }
    arr_free(&a);
    arr_free(&b);
    arr_free(&o);
}

static void test_binary(void)
{
    current = "binary";
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_BOOL, NB_U8};
    for (int op = 0; op < NB_BIN_COUNT; op++)
        for (size_t di = 0; di < 6; di++) {
            nb_dtype dt = dts[di];
            if (!(nb__binary_dtypes((nb_binary_op)op) & NB_MASK(dt)))
                continue; /* not defined for dt (ops.def): the CPU has no loop for it */
            for (int la = 0; la < L_COUNT; la++)
                for (int lb = 0; lb < L_COUNT; lb += (la == L_CONTIG ? 1 : 2))
                    check_binary((nb_binary_op)op, dt, 3, SHAPE_SMALL, la, lb, out_layout(la + lb));
            check_binary((nb_binary_op)op, dt, 2, SHAPE_BIG, L_CONTIG, L_CONTIG, L_CONTIG);
            check_binary((nb_binary_op)op, dt, 2, SHAPE_BIG, L_CONTIG, L_SCALAR, L_CONTIG);
            check_binary((nb_binary_op)op, dt, 2, SHAPE_BIG, L_TRANS, L_BCAST0, L_CONTIG);
        }
    /* NaN propagation of maximum/minimum, integer division by zero and INT_MIN / -1 */
    int64_t shape[1] = {3};
    arr a = arr_c(NB_F32, 1, shape), b = arr_c(NB_F32, 1, shape), o = arr_c(NB_F32, 1, shape);
    set(&a, 0, NAN), set(&a, 1, 1), set(&a, 2, 2);
    set(&b, 0, 1), set(&b, 1, NAN), set(&b, 2, 1);
    EXPECT_OK(B->binary(DEV, NB_BIN_MAX, &o.v, &a.v, &b.v));
    EXPECT(isnan(get(&o, 0)) && isnan(get(&o, 1)) && get(&o, 2) == 2, "maximum and NaN");
    EXPECT_OK(B->binary(DEV, NB_BIN_MIN, &o.v, &a.v, &b.v));
    EXPECT(isnan(get(&o, 0)) && isnan(get(&o, 1)) && get(&o, 2) == 1, "minimum and NaN");
    arr_free(&a), arr_free(&b), arr_free(&o);
    a = arr_c(NB_I32, 1, shape), b = arr_c(NB_I32, 1, shape), o = arr_c(NB_I32, 1, shape);
    ((int32_t *)a.mem)[0] = 7, ((int32_t *)a.mem)[1] = INT32_MIN, ((int32_t *)a.mem)[2] = -7;
    ((int32_t *)b.mem)[0] = 0, ((int32_t *)b.mem)[1] = -1, ((int32_t *)b.mem)[2] = 2;
    EXPECT_OK(B->binary(DEV, NB_BIN_DIV, &o.v, &a.v, &b.v));
    EXPECT(get(&o, 0) == 0 && get(&o, 1) == INT32_MIN && get(&o, 2) == -3,
           "integer division edge cases: %g %g %g", get(&o, 0), get(&o, 1), get(&o, 2));
    arr_free(&a), arr_free(&b), arr_free(&o);
}

static void test_where(void)
{
    current = "where";
    for (size_t di = 0; di < 6; di++)
        for (int l = 0; l < L_COUNT; l++) {
            nb_dtype dt = ALL6[di];
            arr c = arr_layout(NB_BOOL, 3, SHAPE_SMALL, (l + 2) % L_COUNT);
            arr a = arr_layout(dt, 3, SHAPE_SMALL, l), b = arr_layout(dt, 3, SHAPE_SMALL, (l + 1) % L_COUNT);
            arr o = arr_layout(dt, 3, SHAPE_SMALL, out_layout(l));
            arr_rand(&c, 0, 1), arr_rand(&a, 0.1, 50), arr_rand(&b, 0.1, 50);
            arr_poison(&o);
            EXPECT_OK(B->where(DEV, &o.v, &c.v, &a.v, &b.v));
            for (int64_t i = 0; i < o.v.numel; i++) {
                double want = get(&c, i) ? get(&a, i) : get(&b, i);
                if (get(&o, i) != want) {
                    EXPECT(0, "%s %s: [%lld] = %g, want %g", nb_dtype_name(dt), layout_names[l],
                           (long long)i, get(&o, i), want);
                    break;
                }
            }
            arr_free(&c), arr_free(&a), arr_free(&b), arr_free(&o);
        }
    arr c = arr_c(NB_BOOL, 2, SHAPE_BIG), a = arr_c(NB_F64, 2, SHAPE_BIG);
    arr b = arr_layout(NB_F64, 2, SHAPE_BIG, L_SCALAR), o = arr_c(NB_F64, 2, SHAPE_BIG);
    arr_rand(&c, 0, 1), arr_rand(&a, 0.1, 5), arr_rand(&b, 0.1, 5);
    arr_poison(&o);
    EXPECT_OK(B->where(DEV, &o.v, &c.v, &a.v, &b.v));
    for (int64_t i = 0; i < o.v.numel; i++)
        if (get(&o, i) != (get(&c, i) ? get(&a, i) : get(&b, i))) {
            EXPECT(0, "big where [%lld]", (long long)i);
            break;
        }
    arr_free(&c), arr_free(&a), arr_free(&b), arr_free(&o);
}

/* ---- reductions -------------------------------------------------------------------------------- */

/* out has x's shape with size 1 where mask has a bit. */
static void check_reduce(nb_reduce_op op, nb_dtype dt, int nd, const int64_t *shape, unsigned mask,
                         int lin)
{
    int64_t oshape[NB_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        oshape[d] = (mask >> d) & 1 ? 1 : shape[d];
    arr x = arr_layout(dt, nd, shape, lin), o = arr_c(dt, nd, oshape);
    /* prod of many values must stay finite: values near 1 */
    if (op == NB_RED_PROD && is_float(dt))
        arr_rand(&x, 0.9, 1.1);
    else
        arr_rand(&x, 0.1, is_float(dt) ? 10 : (op == NB_RED_PROD ? 1 : 1000));
    arr_poison(&o);
    EXPECT_OK(B->reduce(DEV, op, &o.v, &x.v));
    int64_t count = x.v.numel / (o.v.numel ? o.v.numel : 1);
    for (int64_t k = 0; k < o.v.numel; k++) {
        /* the output's multi-index; walk the reduced sub-space */
        int64_t oidx[NB_MAX_DIMS], rest = k;
        for (int d = nd - 1; d >= 0; d--) {
            oidx[d] = rest % oshape[d];
            rest /= oshape[d];
        }
        long double acc = op == NB_RED_PROD ? 1 : op == NB_RED_MAX ? -INFINITY
                          : op == NB_RED_MIN ? INFINITY : 0, mag = 0;
        for (int64_t r = 0; r < count; r++) {
            int64_t idx[NB_MAX_DIMS], rr = r, flat = 0;
            for (int d = nd - 1; d >= 0; d--) {
                if ((mask >> d) & 1) {
                    idx[d] = rr % shape[d];
                    rr /= shape[d];
                } else {
                    idx[d] = oidx[d];
                }
            }
            for (int d = 0; d < nd; d++)
                flat = flat * shape[d] + idx[d];
            long double v = get(&x, flat);
            mag += fabsl(v);
            switch (op) {
            case NB_RED_SUM: case NB_RED_MEAN: acc += v; break;
            case NB_RED_PROD: acc *= v; break;
            case NB_RED_MAX: acc = v > acc ? v : acc; break;
            default: acc = v < acc ? v : acc; break;
            }
        }
        if (op == NB_RED_MEAN)
            acc = is_float(dt) ? acc / count : truncl(acc / count);
        double got = get(&o, k), want = (double)acc;
        double tol = dt == NB_F32 ? 2e-6 : dt == NB_F64 ? 1e-13 : 0;
        bool ok = op == NB_RED_SUM || op == NB_RED_MEAN
                      ? fabs(got - want) <= tol * (1 + (double)mag / (op == NB_RED_MEAN ? count : 1))
                      : close_to(got, want, tol * (op == NB_RED_PROD ? count : 1));
        if (!ok) {
            EXPECT(0, "op %d %s mask %u (%s) nd %d [%lld]: %.12g, want %.12g", (int)op,
                   nb_dtype_name(dt), mask, layout_names[lin], nd, (long long)k, got, want);
            break;
        }
    }
    arr_free(&x);
    arr_free(&o);
}

static void test_reduce(void)
{
    current = "reduce";
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64};
    const int64_t shape4[4] = {3, 4, 5, 6};
    for (int op = 0; op <= NB_RED_PROD; op++)
        for (int di = 0; di < 4; di++) {
            for (unsigned mask = 0; mask < 16; mask++)
                for (int l = 0; l < 3; l++)
                    check_reduce((nb_reduce_op)op, dts[di], 4, shape4, mask, l);
            /* large: full (partials), rows, columns (tiles), middle */
            const int64_t s_full[1] = {70001}, s_rows[2] = {30, 2500}, s_cols[2] = {701, 100};
            const int64_t s_mid[3] = {20, 200, 20};
            if (op != NB_RED_PROD) {
                check_reduce((nb_reduce_op)op, dts[di], 1, s_full, 1, L_CONTIG);
                check_reduce((nb_reduce_op)op, dts[di], 2, s_rows, 2, L_CONTIG);
                check_reduce((nb_reduce_op)op, dts[di], 2, s_cols, 1, L_CONTIG);
                check_reduce((nb_reduce_op)op, dts[di], 2, s_cols, 1, L_TRANS);
                check_reduce((nb_reduce_op)op, dts[di], 3, s_mid, 2, L_CONTIG);
                check_reduce((nb_reduce_op)op, dts[di], 3, s_mid, 5, L_CONTIG);
            }
        }
    /* NaN propagates through max/min; an f32 sum of many values stays accurate */
    int64_t shape[1] = {1000}, one[1] = {1};
    arr x = arr_c(NB_F32, 1, shape), o = arr_c(NB_F32, 1, one);
    for (int i = 0; i < 1000; i++)
        set(&x, i, i == 500 ? NAN : i);
    EXPECT_OK(B->reduce(DEV, NB_RED_MAX, &o.v, &x.v));
    EXPECT(isnan(get(&o, 0)), "max with a NaN = %g", get(&o, 0));
    EXPECT_OK(B->reduce(DEV, NB_RED_MIN, &o.v, &x.v));
    EXPECT(isnan(get(&o, 0)), "min with a NaN = %g", get(&o, 0));
    arr_free(&x);
    arr_free(&o);
    int64_t nbig[1] = {1 << 22};
    x = arr_c(NB_F32, 1, nbig), o = arr_c(NB_F32, 1, one);
    for (int64_t i = 0; i < nbig[0]; i++)
        ((float *)x.mem)[i] = 0.1f;
    EXPECT_OK(B->reduce(DEV, NB_RED_SUM, &o.v, &x.v));
    EXPECT(close_to(get(&o, 0), 0.1f * (double)nbig[0], 1e-6), "sum of 2^22 x 0.1f = %.9g",
           get(&o, 0));
    arr_free(&x);
    arr_free(&o);
}

static void test_arg_reduce(void)
{
    current = "arg_reduce";
    const int64_t shape[3] = {5, 6, 7};
    for (size_t di = 0; di < 6; di++)
        for (int is_max = 0; is_max < 2; is_max++)
            for (int axis = 0; axis < 3; axis++)
                for (int l = 0; l < 3; l++) {
                    nb_dtype dt = ALL6[di];
                    int64_t oshape[3] = {5, 6, 7};
                    oshape[axis] = 1;
                    arr x = arr_layout(dt, 3, shape, l), o = arr_c(NB_I64, 3, oshape);
                    arr_rand(&x, 0.1, is_float(dt) ? 5 : 4); /* integers: many ties */
                    arr_poison(&o);
                    EXPECT_OK(B->arg_reduce(DEV, is_max, &o.v, &x.v, axis - (l == 2 ? 3 : 0)));
                    for (int64_t k = 0; k < o.v.numel; k++) {
                        int64_t idx[3] = {k / 42 % 5, k / 7 % 6, k % 7};
                        if (axis == 0) idx[0] = 0, idx[1] = k / 7 % 6, idx[2] = k % 7;
                        if (axis == 1) idx[0] = k / 7 % 5, idx[1] = 0, idx[2] = k % 7;
                        if (axis == 2) idx[0] = k / 6 % 5, idx[1] = k % 6, idx[2] = 0;
                        double best = 0;
                        int64_t bi = -1;
                        for (int64_t i = 0; i < shape[axis]; i++) {
                            idx[axis] = i;
                            double v = get(&x, (idx[0] * 6 + idx[1]) * 7 + idx[2]);
                            if (bi < 0 || (is_max ? v > best : v < best))
                                best = v, bi = i;
                        }
                        if (get(&o, k) != (double)bi) {
                            EXPECT(0, "%s %s axis %d [%lld] = %g, want %lld", is_max ? "argmax" : "argmin",
                                   nb_dtype_name(dt), axis, (long long)k, get(&o, k), (long long)bi);
                            break;
                        }
                    }
                    arr_free(&x);
                    arr_free(&o);
                }
    /* large (parallel) over the last axis, with a NaN that wins */
    int64_t big[2] = {2000, 300}, ob[2] = {2000, 1};
    arr x = arr_c(NB_F32, 2, big), o = arr_c(NB_I64, 2, ob);
    arr_rand(&x, 0.1, 1);
    for (int64_t r = 0; r < 2000; r++)
        set(&x, r * 300 + (r * 7) % 300, 5.0);
    set(&x, 0 * 300 + 299, NAN);
    arr_poison(&o);
    EXPECT_OK(B->arg_reduce(DEV, true, &o.v, &x.v, 1));
    EXPECT(get(&o, 0) == 299, "argmax with a NaN = %g", get(&o, 0));
    for (int64_t r = 1; r < 2000; r++)
        if (get(&o, r) != (double)((r * 7) % 300)) {
            EXPECT(0, "big argmax row %lld = %g", (long long)r, get(&o, r));
            break;
        }
    arr_free(&x);
    arr_free(&o);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

typedef nb_status (*matmul_fn)(nb_device *, const nb_view *, const nb_view *, const nb_view *);

/* A [batch..., rows, cols] operand: col-major last two dims when trans; batch dims
 * listed in bshape, each broadcast (stride 0) where bcast has its bit. */
static arr mm_operand(nb_dtype dt, int nb, const int64_t *bshape, unsigned bcast, int64_t rows,
                      int64_t cols, bool trans, int64_t pad)
{
    int64_t shape[NB_MAX_DIMS], st[NB_MAX_DIMS];
    int nd = nb + 2;
    for (int d = 0; d < nb; d++)
        shape[d] = bshape[d];
    shape[nb] = rows;
    shape[nb + 1] = cols;
    /* leading dimension padded by pad elements to catch ld mistakes */
    int64_t ld = (trans ? rows : cols) + pad;
    int64_t mat = ld * (trans ? cols : rows);
    st[nb] = trans ? 1 : ld;
    st[nb + 1] = trans ? ld : 1;
    int64_t s = mat;
    for (int d = nb - 1; d >= 0; d--) {
        bool b = (bcast >> d) & 1;
        st[d] = b ? 0 : s;
        s *= b ? 1 : bshape[d];
    }
    return arr_new(dt, nd, shape, st);
}

static void check_matmul(matmul_fn fn, const char *path, nb_dtype dt, int nb, const int64_t *bshape,
                         unsigned bca, unsigned bcb, int64_t M, int64_t N, int64_t K, bool ta,
                         bool tb, bool tc)
{
    arr a = mm_operand(dt, nb, bshape, bca, M, K, ta, ta ? 1 : 3);
    arr b = mm_operand(dt, nb, bshape, bcb, K, N, tb, tb ? 2 : 0);
    arr c = mm_operand(dt, nb, bshape, 0, M, N, tc, 0);
    arr_rand(&a, 0.1, is_float(dt) ? 1 : 9);
    arr_rand(&b, 0.1, is_float(dt) ? 1 : 9);
    arr_poison(&c);
    EXPECT_OK(fn(DEV, &c.v, &a.v, &b.v));
    int64_t nbatch = c.v.numel / (M * N > 0 ? M * N : 1);
    const int nd = nb + 2;
    for (int64_t bi = 0; bi < nbatch; bi++) {
        /* batch offsets from the batch index */
        int64_t oa = 0, ob = 0, oc = 0, rest = bi;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t i = rest % bshape[d];
            rest /= bshape[d];
            oa += i * a.v.strides[d], ob += i * b.v.strides[d], oc += i * c.v.strides[d];
        }
        const char *pa = (const char *)a.v.data + oa, *pb = (const char *)b.v.data + ob;
        const char *pc = (const char *)c.v.data + oc;
        const int64_t sa0 = a.v.strides[nd - 2], sa1 = a.v.strides[nd - 1];
        const int64_t sb0 = b.v.strides[nd - 2], sb1 = b.v.strides[nd - 1];
        const int64_t sc0 = c.v.strides[nd - 2], sc1 = c.v.strides[nd - 1];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = rd(dt, pa + i * sa0 + k * sa1), y = rd(dt, pb + k * sb0 + j * sb1);
                    s += x * y;
                    mag += fabs(x * y);
                }
                double got = rd(dt, pc + i * sc0 + j * sc1);
                double tol = dt == NB_F32 ? 1e-6 * (double)(K + 4) : dt == NB_F64 ? 1e-14 * (double)(K + 4) : 0;
                if (!(fabs(got - s) <= tol * (1 + mag))) {
                    EXPECT(0, "%s %s batch %d [%lld x %lld x %lld] ta %d tb %d tc %d bcast %u/%u: "
                           "C[%lld][%lld][%lld] = %.9g, want %.9g", path, nb_dtype_name(dt), nb,
                           (long long)M, (long long)N, (long long)K, ta, tb, tc, bca, bcb,
                           (long long)bi, (long long)i, (long long)j, got, s);
                    goto done;
                }
            }
    }
done:
    arr_free(&a);
    arr_free(&b);
    arr_free(&c);
}

static void matmul_suite(matmul_fn fn, const char *path, bool full)
{
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {1, 7, 5}, {6, 1, 9}, {3, 4, 1}, {2, 3, 4}, {13, 17, 19}, {33, 40, 31},
        {64, 64, 64}, {67, 45, 129}, {100, 3, 300}, {5, 200, 70}, {130, 150, 270}, {0, 4, 3}, {4, 3, 0},
    };
    const int ns = (int)(sizeof sizes / sizeof *sizes);
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di ? NB_F64 : NB_F32;
        for (int s = 0; s < ns; s++)
            for (int t = 0; t < 8; t++)
                check_matmul(fn, path, dt, 0, NULL, 0, 0, sizes[s][0], sizes[s][1], sizes[s][2],
                             t & 1, (t >> 1) & 1, (t >> 2) & 1);
        /* batches, broadcast on either side */
        const int64_t b1[1] = {5}, b2[2] = {2, 3};
        for (int t = 0; t < 4; t++) {
            check_matmul(fn, path, dt, 1, b1, 0, 0, 9, 10, 11, t & 1, t >> 1, false);
            check_matmul(fn, path, dt, 1, b1, 1, 0, 9, 10, 11, t & 1, t >> 1, false);
            check_matmul(fn, path, dt, 2, b2, 2, 1, 70, 80, 90, t & 1, t >> 1, t == 3);
            check_matmul(fn, path, dt, 2, b2, 0, 3, 16, 20, 24, t & 1, t >> 1, false);
        }
        /* many small products (per-batch threading) */
        const int64_t b3[1] = {300};
        if (full)
            check_matmul(fn, path, dt, 1, b3, 0, 1, 20, 24, 28, false, true, false);
    }
    if (!full)
        return;
    /* larger: several K blocks and N panels, the parallel split */
    check_matmul(fn, path, NB_F32, 0, NULL, 0, 0, 64, 4200, 300, false, false, false);
    check_matmul(fn, path, NB_F32, 0, NULL, 0, 0, 257, 263, 520, true, true, false);
    check_matmul(fn, path, NB_F64, 0, NULL, 0, 0, 301, 97, 530, false, true, true);
    for (int t = 0; t < 4; t++) { /* matrix-vector shapes, large enough to split */
        check_matmul(fn, path, NB_F32, 0, NULL, 0, 0, 1, 3000, 500, t & 1, t >> 1, false);
        check_matmul(fn, path, NB_F64, 0, NULL, 0, 0, 2000, 1, 700, t & 1, t >> 1, t == 3);
    }
    for (int di = 0; di < 2; di++) { /* integers: a plain loop */
        nb_dtype dt = di ? NB_I64 : NB_I32;
        const int64_t b1[1] = {3};
        for (int t = 0; t < 4; t++)
            check_matmul(fn, path, dt, 1, b1, 1, 0, 7, 8, 9, t & 1, t >> 1, false);
    }
}

static void test_matmul(void)
{
    current = "matmul";
    matmul_suite(B->matmul, "table", true);
    const char *kernels[3] = {"generic", "avx2", "avx512"};
    const char *native = nb__cpu_gemm_kernel_name();
    for (int k = 0; k < 3; k++) {
        if (!nb__cpu_gemm_use_kernel(kernels[k]))
            continue;
        char name[64];
        snprintf(name, sizeof name, "builtin-%s", kernels[k]);
        matmul_suite(nb__cpu_matmul_builtin, name, strcmp(kernels[k], native) == 0);
    }
    nb__cpu_gemm_use_kernel(native);
    /* shapes that do not fit */
    int64_t s23[2] = {2, 3}, s44[2] = {4, 4};
    arr a = arr_c(NB_F32, 2, s23), b = arr_c(NB_F32, 2, s44), c = arr_c(NB_F32, 2, s23);
    EXPECT_ERROR(B->matmul(DEV, &c.v, &a.v, &b.v), NB_ERR_SHAPE, "matmul");
    arr_free(&a), arr_free(&b), arr_free(&c);
}

/* ---- softmax --------------------------------------------------------------------------------- */

static void test_softmax(void)
{
    current = "softmax";
    const int64_t shape[3] = {3, 4, 37};
    const int64_t big[2] = {500, 301};
    for (int di = 0; di < 2; di++)
        for (int lg = 0; lg < 2; lg++)
            for (int l = 0; l < 4; l++) {
                nb_dtype dt = di ? NB_F64 : NB_F32;
                int nd = l == 3 ? 2 : 3;
                const int64_t *sh = l == 3 ? big : shape;
                arr x = arr_layout(dt, nd, sh, l == 3 ? L_CONTIG : l);
                arr o = arr_layout(dt, nd, sh, l == 2 ? L_TRANS : L_CONTIG);
                arr_rand(&x, 0.1, 5);
                int64_t len = sh[nd - 1], rows = x.v.numel / len;
                for (int64_t i = 0; i < x.v.numel; i += 5) /* huge values: needs the max shift */
                    set(&x, i, get(&x, i) + 500);
                arr_poison(&o);
                EXPECT_OK(B->softmax(DEV, lg, &o.v, &x.v));
                for (int64_t r = 0; r < rows; r++) {
                    double m = -INFINITY, s = 0;
                    for (int64_t i = 0; i < len; i++)
                        m = fmax(m, get(&x, r * len + i));
                    for (int64_t i = 0; i < len; i++)
                        s += exp(get(&x, r * len + i) - m);
                    for (int64_t i = 0; i < len; i++) {
                        double xv = get(&x, r * len + i);
                        double want = lg ? xv - m - log(s) : exp(xv - m) / s;
                        double got = get(&o, r * len + i);
                        if (!close_to(got, want, dt == NB_F32 ? 1e-5 : 1e-12)) {
                            EXPECT(0, "%s %s layout %d row %lld [%lld] = %.9g, want %.9g",
                                   lg ? "log_softmax" : "softmax", nb_dtype_name(dt), l,
                                   (long long)r, (long long)i, got, want);
                            r = rows;
                            break;
                        }
                    }
                }
                arr_free(&x);
                arr_free(&o);
            }
}

/* A row's max is taken one way whatever the row's stride: a contiguous row
 * (vectorised, the lanes of several vectors) gives the bits of a strided one
 * (scalar, SM_MAX), on rows long and short, of ties, zeros of both signs, NaN,
 * +-inf and a max in every place. */
static void test_softmax_stride_bits(void)
{
    current = "softmax strides";
    enum { N = 40, C = 131 };
    static double v[N * C];
    uint64_t seed = 12345;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            const unsigned k = (unsigned)(seed >> 33) % 16;
            double *e = &v[r * C + c];
            if (r < 16) /* zeros of both signs among -200s: the max is a zero */
                *e = k < 2 ? 0.0 : k < 4 ? -0.0 : -200.0 - k;
            else if (r < 20) /* ties at 3 among smaller values */
                *e = k < 3 ? 3.0 : -(double)k;
            else if (r < 24)
                *e = (double)k - 8;
            else /* distinct values, the max at a place of its own */
                *e = c == (r * 37) % C ? 20.0 : (double)(seed >> 11) * 0x1p-53 * 20 - 10;
        }
    v[20 * C] = NAN;            /* NaN first: the max is NaN */
    v[21 * C + 77] = NAN;       /* NaN later: the max skips it, its exp does not */
    v[22 * C + 50] = INFINITY;  /* +inf: its exps are NaN */
    for (int c = 0; c < C; c++) /* all -inf: the max is 0, the exps 0 */
        v[23 * C + c] = -INFINITY;
    const int64_t lens[5] = {C, 40, 32, 31, 7};
    for (int di = 0; di < 2; di++)
        for (int li = 0; li < 5; li++)
            for (int lg = 0; lg < 2; lg++) {
                nb_dtype dt = di ? NB_F64 : NB_F32;
                const int64_t sh[2] = {N, lens[li]};
                arr xc = arr_c(dt, 2, sh), xs = arr_layout(dt, 2, sh, L_TRANS);
                arr oc = arr_c(dt, 2, sh), os = arr_c(dt, 2, sh);
                for (int64_t r = 0; r < N; r++)
                    for (int64_t c = 0; c < sh[1]; c++) {
                        set(&xc, r * sh[1] + c, v[r * C + c]);
                        set(&xs, r * sh[1] + c, v[r * C + c]);
                    }
                arr_poison(&oc), arr_poison(&os);
                EXPECT_OK(B->softmax(DEV, lg, &oc.v, &xc.v));
                EXPECT_OK(B->softmax(DEV, lg, &os.v, &xs.v));
                EXPECT(memcmp(oc.v.data, os.v.data, (size_t)(N * sh[1]) * esize(dt)) == 0,
                       "%s %s, rows of %lld: a contiguous row's bits differ from a strided one's",
                       lg ? "log_softmax" : "softmax", nb_dtype_name(dt), (long long)sh[1]);
                if (lg && li == 0) {
                    for (int64_t r = 0; r < 16; r++) { /* each zero: -log(the row's count of zeros) */
                        int zeros = 0;
                        for (int64_t c = 0; c < C; c++)
                            zeros += v[r * C + c] == 0;
                        for (int64_t c = 0; c < C; c++)
                            if (v[r * C + c] == 0)
                                EXPECT(close_to(get(&oc, r * C + c), -log(zeros), 1e-6), "row %lld [%lld] = %g",
                                       (long long)r, (long long)c, get(&oc, r * C + c));
                    }
                    for (int64_t r = 20; r < 24; r++)
                        EXPECT(isnan(get(&oc, r * C + 1)), "row %lld is not NaN", (long long)r);
                    for (int64_t r = 24; r < N; r++)
                        EXPECT(get(&oc, r * C + (r * 37) % C) > -1e-3, "row %lld: its max's place %g", (long long)r,
                               get(&oc, r * C + (r * 37) % C));
                }
                arr_free(&xc), arr_free(&xs), arr_free(&oc), arr_free(&os);
            }
}

/* ---- gather, scatter_add, one_hot --------------------------------------------------------------- */

static void fill_indices(arr *ix, int64_t rows)
{
    for (int64_t i = 0; i < ix->v.numel; i++)
        set(ix, i, (double)(rng_u64() % (uint64_t)rows));
}

static void test_index(void)
{
    current = "gather";
    for (size_t di = 0; di < 6; di++)
        for (int it = 0; it < 2; it++)
            for (int rs = 0; rs < 3; rs++) {
                nb_dtype dt = ALL6[di], idt = it ? NB_I64 : NB_I32;
                const int64_t rows = rs == 2 ? 5000 : 11;
                int64_t pshape[3] = {rows, 3, 4};
                int pnd = rs == 0 ? 1 : 3; /* rows of one element, or of 12 */
                int64_t ishape[2] = {rs == 2 ? 400 : 4, 6};
                int64_t oshape[4] = {ishape[0], 6, 3, 4};
                arr p = arr_c(dt, pnd, pshape), ix = arr_c(idt, 2, ishape);
                arr o = arr_c(dt, pnd + 1, oshape);
                arr_rand(&p, 0.1, 100);
                fill_indices(&ix, rows);
                arr_poison(&o);
                EXPECT_OK(B->gather(DEV, "gather", &o.v, &p.v, &ix.v));
                int64_t row = p.v.numel / rows;
                for (int64_t k = 0; k < o.v.numel; k++) {
                    double want = get(&p, (int64_t)get(&ix, k / row) * row + k % row);
                    if (get(&o, k) != want) {
                        EXPECT(0, "%s idx %s [%lld] = %g, want %g", nb_dtype_name(dt),
                               nb_dtype_name(idt), (long long)k, get(&o, k), want);
                        break;
                    }
                }
                /* an index out of range: the error names op and index, out untouched */
                arr_poison(&o);
                set(&ix, 5, (double)rows);
                EXPECT_ERROR(B->gather(DEV, "embedding_lookup", &o.v, &p.v, &ix.v),
                             NB_ERR_INVALID_ARGUMENT, "embedding_lookup: index");
                set(&ix, 5, -1);
                char msg[128];
                snprintf(msg, sizeof msg, "gather: index -1 at position 5 is outside [0, %lld)", (long long)rows);
                EXPECT_ERROR(B->gather(DEV, "gather", &o.v, &p.v, &ix.v), NB_ERR_INVALID_ARGUMENT, msg);
                EXPECT(isnan(get(&o, 0)) || ((unsigned char *)o.mem)[0] == 0x5A,
                       "gather wrote before failing");
                arr_free(&p), arr_free(&ix), arr_free(&o);
            }

    current = "scatter_add";
    const nb_dtype sdt[4] = {NB_F32, NB_F64, NB_I32, NB_I64};
    for (int di = 0; di < 4; di++)
        for (int it = 0; it < 2; it++)
            for (int big = 0; big < 2; big++) {
                nb_dtype dt = sdt[di], idt = it ? NB_I64 : NB_I32;
                int64_t rows = 9, cols = big ? 3000 : 5, n = big ? 40 : 30;
                int64_t oshape[2] = {rows, cols}, ishape[1] = {n}, ushape[2] = {n, cols};
                arr o = arr_c(dt, 2, oshape), ix = arr_c(idt, 1, ishape), u = arr_c(dt, 2, ushape);
                arr_rand(&o, 0.1, 10);
                arr_rand(&u, 0.1, 10);
                fill_indices(&ix, rows); /* duplicates certain */
                double *want = malloc(sizeof(double) * (size_t)(rows * cols));
                for (int64_t k = 0; k < rows * cols; k++)
                    want[k] = get(&o, k);
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = 0; c < cols; c++)
                        want[(int64_t)get(&ix, i) * cols + c] += get(&u, i * cols + c);
                EXPECT_OK(B->scatter_add(DEV, "scatter_add", &o.v, &ix.v, &u.v));
                for (int64_t k = 0; k < rows * cols; k++)
                    if (!close_to(get(&o, k), want[k], tol_for(dt) * 10)) {
                        EXPECT(0, "%s [%lld] = %g, want %g", nb_dtype_name(dt), (long long)k,
                               get(&o, k), want[k]);
                        break;
                    }
                set(&ix, n - 1, 1e9);
                EXPECT_ERROR(B->scatter_add(DEV, "gather_grad", &o.v, &ix.v, &u.v),
                             NB_ERR_INVALID_ARGUMENT, "gather_grad: index 1000000000 at position");
                free(want);
                arr_free(&o), arr_free(&ix), arr_free(&u);
            }

    current = "one_hot";
    const nb_dtype idts[3] = {NB_I32, NB_I64, NB_U8};
    for (size_t di = 0; di < 6; di++)
        for (int it = 0; it < 3; it++)
            for (int l = 0; l < 2; l++) {
                nb_dtype dt = ALL6[di];
                int64_t ishape[2] = {7, 5}, oshape[3] = {7, 5, 6};
                arr ix = arr_layout(idts[it], 2, ishape, l ? L_TRANS : L_CONTIG);
                arr o = arr_c(dt, 3, oshape);
                for (int64_t i = 0; i < 35; i++) /* some outside [0, 6) */
                    set(&ix, i, idts[it] == NB_U8 ? (double)(i % 9) : (double)(i % 10) - 2);
                arr_poison(&o);
                double on = dt == NB_BOOL ? 1 : 3, off = dt == NB_BOOL ? 0 : (dt == NB_U8 ? 2 : -1);
                EXPECT_OK(B->one_hot(DEV, &o.v, &ix.v, on, off));
                for (int64_t k = 0; k < o.v.numel; k++) {
                    double want = (double)(k % 6) == get(&ix, k / 6) ? on : off;
                    if (get(&o, k) != want) {
                        EXPECT(0, "%s [%lld] = %g, want %g", nb_dtype_name(dt), (long long)k,
                               get(&o, k), want);
                        break;
                    }
                }
                arr_free(&ix), arr_free(&o);
            }
}

/* ---- optimizers -------------------------------------------------------------------------------- */

static void test_optim(void)
{
    current = "optim";
    for (int di = 0; di < 2; di++)
        for (int kind = 0; kind < 6; kind++)
            for (int big = 0; big < 2; big++) {
                nb_dtype dt = di ? NB_F64 : NB_F32;
                int64_t shape[1] = {big ? 100003 : 37};
                int64_t n = shape[0];
                arr p = arr_c(dt, 1, shape), g = arr_c(dt, 1, shape);
                arr m = arr_c(dt, 1, shape), v = arr_c(dt, 1, shape);
                arr_rand(&p, 0.1, 1), arr_rand(&m, 0.1, 1);
                for (int64_t i = 0; i < n; i++)
                    set(&v, i, fabs(rng_nonzero(0.1, 1)));
                double *rp = malloc(sizeof(double) * (size_t)n * 3), *rm = rp + n, *rv = rm + n;
                for (int64_t i = 0; i < n; i++)
                    rp[i] = get(&p, i), rm[i] = get(&m, i), rv[i] = get(&v, i);
                nb_update_params hp = {0};
                hp.lr = 0.01, hp.momentum = 0.9, hp.beta1 = 0.9, hp.beta2 = 0.999, hp.epsilon = 1e-7;
                hp.nesterov = kind == 2;
                hp.weight_decay = kind == 3 || kind == 5 ? 0.05 : 0;
                for (int step = 1; step <= 3; step++) {
                    arr_rand(&g, 0.1, 1);
                    hp.step = step;
                    for (int64_t i = 0; i < n; i++) {
                        double gi = get(&g, i), pi = rp[i];
                        if (kind == 0) {
                            rp[i] -= hp.lr * gi;
                        } else if (kind <= 3) {
                            double gg = gi + hp.weight_decay * pi;
                            rm[i] = hp.momentum * rm[i] + gg;
                            rp[i] -= hp.lr * (kind == 2 ? gg + hp.momentum * rm[i] : rm[i]);
                        } else {
                            rm[i] = hp.beta1 * rm[i] + (1 - hp.beta1) * gi;
                            rv[i] = hp.beta2 * rv[i] + (1 - hp.beta2) * gi * gi;
                            double mh = rm[i] / (1 - pow(hp.beta1, step));
                            double vh = rv[i] / (1 - pow(hp.beta2, step));
                            rp[i] -= hp.lr * (mh / (sqrt(vh) + hp.epsilon) + hp.weight_decay * pi);
                        }
                    }
                    if (kind <= 3)
                        EXPECT_OK(B->optim->sgd_update(DEV, &p.v, &g.v, kind == 0 ? NULL : &m.v, &hp));
                    else
                        EXPECT_OK(B->optim->adam_update(DEV, &p.v, &g.v, &m.v, &v.v, &hp));
                }
                double tol = dt == NB_F32 ? 1e-5 : 1e-12;
                for (int64_t i = 0; i < n; i++) {
                    bool ok = close_to(get(&p, i), rp[i], tol) &&
                              (kind == 0 || close_to(get(&m, i), rm[i], tol)) &&
                              (kind < 4 || close_to(get(&v, i), rv[i], tol));
                    if (!ok) {
                        EXPECT(0, "kind %d %s [%lld]: p %.9g want %.9g, m %.9g want %.9g", kind,
                               nb_dtype_name(dt), (long long)i, get(&p, i), rp[i], get(&m, i), rm[i]);
                        break;
                    }
                }
                free(rp);
                arr_free(&p), arr_free(&g), arr_free(&m), arr_free(&v);
            }
}

/* ---- f16 and bf16 --------------------------------------------------------------------------------- */

/* The bit-operation conversions from f32 (the copy kernel's fast rows) agree
 * with the exact ones from double on every 4,099th float bit pattern (both
 * signs, every exponent, NaNs, infinities, subnormals), and back. */
static void test_half_conversions(void)
{
    current = "half conversions";
    int64_t bad = 0;
    for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 4099) {
        uint32_t bits = (uint32_t)b;
        float f;
        memcpy(&f, &bits, sizeof f);
        uint16_t h = nb__f16_from_float(f), hd = nb__f16_from_double(f);
        uint16_t g = nb__bf16_from_float(f), gd = nb__bf16_from_double(f);
        bool nan = isnan(f);
        /* NaNs: any NaN of the same sign will do */
        bool h_ok = nan ? (h & 0x7C00) == 0x7C00 && (h & 0x3FF) && (h >> 15) == (bits >> 31) : h == hd;
        bool g_ok = nan ? (g & 0x7F80) == 0x7F80 && (g & 0x7F) && (g >> 15) == (bits >> 31) : g == gd;
        bool back = nan || ((double)nb__f16_to_float(h) == nb__f16_to_double(h) &&
                            (double)nb__bf16_to_float(g) == nb__bf16_to_double(g));
        if (!h_ok || !g_ok || !back) {
            if (bad++ < 5)
                fprintf(stderr, "[%s] %a (%#x): f16 %#x (exact %#x), bf16 %#x (exact %#x)\n", current, f, bits, h, hd,
                        g, gd);
        }
    }
    EXPECT(bad == 0, "%lld patterns disagree", (long long)bad);
    /* every f16 and bf16 value widens to the same float both ways */
    int wide = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = nb__f16_to_float((uint16_t)h), b = nb__bf16_to_float((uint16_t)h);
        double ad = nb__f16_to_double((uint16_t)h), bd = nb__bf16_to_double((uint16_t)h);
        wide += isnan(ad) ? !isnan(a) || !signbit(a) != !signbit(ad) : (double)a != ad || !signbit(a) != !signbit(ad);
        wide += isnan(bd) ? !isnan(b) : (double)b != bd || !signbit(b) != !signbit(bd);
    }
    EXPECT(wide == 0, "%d values widen differently", wide);
    /* ties go to even, past the largest finite value to infinity */
    EXPECT(nb__f16_from_float(65519.0f) == 0x7BFF && nb__f16_from_float(65520.0f) == 0x7C00, "f16 overflow");
    EXPECT(nb__f16_from_float(0x1p-25f) == 0 && nb__f16_from_float(0x1.8p-25f) == 1, "f16 subnormal ties");
    EXPECT(nb__bf16_from_float(1.00390625f) == 0x3F80 && nb__bf16_from_float(1.01171875f) == 0x3F82, "bf16 ties");
}

/* ---- dtypes the CPU does not take -------------------------------------------------------------- */

/* A loss scaler's captured step: a device step count gives the host step's
 * bits, a set skip flag changes nothing (an out-of-place update copies its
 * source), and scaler_update runs the scaler's rule. */
static void test_optim_scaled(void)
{
    current = "optim scaled";
    int64_t shape[1] = {41};
    for (int di = 0; di < 2; di++)
        for (int adam = 0; adam < 2; adam++) {
            nb_dtype dt = di ? NB_F64 : NB_F32;
            size_t bytes = (size_t)shape[0] * nb_dtype_size(dt);
            arr p[2], m[2], v[2], g = arr_c(dt, 1, shape), src = arr_c(dt, 1, shape);
            p[0] = arr_c(dt, 1, shape), m[0] = arr_c(dt, 1, shape), v[0] = arr_c(dt, 1, shape);
            arr_rand(&p[0], 0.1, 1), arr_rand(&m[0], 0.1, 1), arr_rand(&v[0], 0.1, 1), arr_rand(&src, 0.1, 1);
            for (int k = 1; k < 2; k++) {
                p[k] = arr_c(dt, 1, shape), m[k] = arr_c(dt, 1, shape), v[k] = arr_c(dt, 1, shape);
                memcpy(p[k].v.data, p[0].v.data, bytes), memcpy(m[k].v.data, m[0].v.data, bytes);
                memcpy(v[k].v.data, v[0].v.data, bytes);
            }
            nb_update_params hp = {0};
            hp.lr = 0.01, hp.momentum = 0.9, hp.beta1 = 0.9, hp.beta2 = 0.999, hp.epsilon = 1e-7;
            double count = 0, go = 0, stop = NAN;
            for (int step = 1; step <= 7; step++) {
                arr_rand(&g, 0.1, 1);
                hp.step = step;
                /* [0]: the host's step; [1]: the device's count of the steps before */
                nb_update_params dp = hp;
                dp.step = 0, dp.skip = &go, dp.device_count = &count;
                count = step - 1;
                for (int k = 0; k < 2; k++) {
                    const nb_update_params *q = k ? &dp : &hp;
                    EXPECT_OK(adam ? B->optim->adam_update(DEV, &p[k].v, &g.v, &m[k].v, &v[k].v, q)
                                   : B->optim->sgd_update(DEV, &p[k].v, &g.v, &m[k].v, q));
                }
                EXPECT(!memcmp(p[0].v.data, p[1].v.data, bytes) && !memcmp(m[0].v.data, m[1].v.data, bytes) &&
                           !memcmp(v[0].v.data, v[1].v.data, bytes),
                       "%s %s step %d: the device count's update differs from the host step's", nb_dtype_name(dt),
                       adam ? "adam" : "momentum", step);
                /* skipped in place (a NaN flag): nothing moves */
                dp.skip = &stop;
                EXPECT_OK(adam ? B->optim->adam_update(DEV, &p[1].v, &g.v, &m[1].v, &v[1].v, &dp)
                               : B->optim->sgd_update(DEV, &p[1].v, &g.v, &m[1].v, &dp));
                EXPECT(!memcmp(p[0].v.data, p[1].v.data, bytes) && !memcmp(m[0].v.data, m[1].v.data, bytes) &&
                           !memcmp(v[0].v.data, v[1].v.data, bytes),
                       "%s %s step %d: a skipped update changed something", nb_dtype_name(dt),
                       adam ? "adam" : "momentum", step);
            }
            /* skipped out of place: param gets the source, the slots stay */
            double one = 1;
            nb_update_params dp = hp;
            dp.skip = &one, dp.device_count = &count, dp.source = src.v.data;
            for (int64_t i = 0; i < shape[0]; i++)
                set(&p[1], i, NAN);
            EXPECT_OK(adam ? B->optim->adam_update(DEV, &p[1].v, &g.v, &m[1].v, &v[1].v, &dp)
                           : B->optim->sgd_update(DEV, &p[1].v, &g.v, &m[1].v, &dp));
            EXPECT(!memcmp(p[1].v.data, src.v.data, bytes) && !memcmp(m[0].v.data, m[1].v.data, bytes),
                   "%s %s: a skipped out-of-place update did not copy its source", nb_dtype_name(dt),
                   adam ? "adam" : "momentum");
            for (int k = 0; k < 2; k++)
                arr_free(&p[k]), arr_free(&m[k]), arr_free(&v[k]);
            arr_free(&g), arr_free(&src);
        }

    /* the scaler's rule: growth after `interval` good steps (capped), backoff (floored) and a skip */
    nb_scaler_params sp = {2, 0.5, 0x1p-64, 0x1p64, 3};
    struct {
        double before[NB_LS_COUNT], check, count_before;
        double after[NB_LS_COUNT], count_after;
    } cases[] = {
        {{1024, 0, 5}, 0, 7, {1024, 1, 5}, 8},
        {{1024, 2, 5}, 0, 7, {2048, 0, 5}, 8},
        {{0x1p64, 2, 0}, 0, 0, {0x1p64, 0, 0}, 1},
        {{1024, 2, 5}, NAN, 7, {512, 0, 6}, 7},
        {{0x1p-64, 1, 0}, INFINITY, 3, {0x1p-64, 0, 1}, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double st[NB_LS_COUNT], count = cases[i].count_before;
        memcpy(st, cases[i].before, sizeof st);
        EXPECT_OK(B->optim->scaler_update(DEV, st, &cases[i].check, &count, &sp));
        EXPECT(!memcmp(st, cases[i].after, sizeof st) && count == cases[i].count_after,
               "scaler_update case %zu: scale %g, good %g, skipped %g, count %g", i, st[0], st[1], st[2], count);
    }
}

static void test_unsupported(void)
{
    current = "unsupported";
    int64_t shape[2] = {2, 2}, one[2] = {1, 1};
    arr h = arr_c(NB_F16, 2, shape), h2 = arr_c(NB_F16, 2, shape), h1 = arr_c(NB_F16, 2, one);
    arr bf = arr_c(NB_BF16, 2, shape), f = arr_c(NB_F32, 2, shape), u = arr_c(NB_U8, 2, shape);
    arr bo = arr_c(NB_BOOL, 2, shape), ix = arr_c(NB_I32, 2, shape);
    memset(ix.mem, 0, 16);
    /* f16 and bf16: filled and converted, nothing else */
    EXPECT_OK(B->fill(DEV, &h.v, 1));
    EXPECT(((uint16_t *)h.mem)[3] == 0x3C00, "f16 fill gave %#x", ((uint16_t *)h.mem)[3]);
    EXPECT_OK(B->copy(DEV, &f.v, &h.v));
    EXPECT(((float *)f.mem)[2] == 1.0f, "f16 to f32 gave %g", ((float *)f.mem)[2]);
    EXPECT_OK(B->copy(DEV, &bf.v, &f.v));
    EXPECT(((uint16_t *)bf.mem)[1] == 0x3F80, "f32 to bf16 gave %#x", ((uint16_t *)bf.mem)[1]);
    EXPECT_ERROR(B->arange(DEV, &bf.v, 0, 1), NB_ERR_DTYPE, "arange: dtype bf16 is not supported on /cpu:0");
    EXPECT_ERROR(B->random(DEV, &h.v, NB_RAND_NORMAL, 0, 1, 1, NULL), NB_ERR_DTYPE, "random: dtype f16");
    EXPECT_ERROR(B->random(DEV, &ix.v, NB_RAND_UNIFORM, 0, 1, 1, NULL), NB_ERR_DTYPE, "random: dtype i32");
    EXPECT_ERROR(B->unary(DEV, NB_UN_EXP, &h2.v, &h.v, 0), NB_ERR_DTYPE,
                 "exp: dtype f16 is not supported on /cpu:0");
    EXPECT_ERROR(B->unary(DEV, NB_UN_EXP, &ix.v, &ix.v, 0), NB_ERR_DTYPE, "exp: dtype i32");
    EXPECT_ERROR(B->unary(DEV, NB_UN_NEG, &u.v, &u.v, 0), NB_ERR_DTYPE, "neg: dtype u8");
    EXPECT_ERROR(B->binary(DEV, NB_BIN_ADD, &h2.v, &h.v, &h.v), NB_ERR_DTYPE,
                 "add: dtype f16 is not supported on /cpu:0");
    EXPECT_ERROR(B->binary(DEV, NB_BIN_ADD, &bo.v, &bo.v, &bo.v), NB_ERR_DTYPE, "add: dtype bool");
    EXPECT_ERROR(B->binary(DEV, NB_BIN_LT, &bo.v, &h.v, &h.v), NB_ERR_DTYPE, "less: dtype f16");
    EXPECT_ERROR(B->where(DEV, &h2.v, &bo.v, &h.v, &h.v), NB_ERR_DTYPE, "where: dtype f16");
    EXPECT_ERROR(B->reduce(DEV, NB_RED_SUM, &h1.v, &h.v), NB_ERR_DTYPE, "sum: dtype f16");
    EXPECT_ERROR(B->reduce(DEV, NB_RED_MAX, &u.v, &u.v), NB_ERR_DTYPE, "max: dtype u8");
    EXPECT_ERROR(B->arg_reduce(DEV, true, &ix.v, &h.v, 0), NB_ERR_DTYPE, "argmax: dtype f16");
    EXPECT_ERROR(B->matmul(DEV, &h2.v, &h.v, &h.v), NB_ERR_DTYPE, "matmul: dtype f16");
    EXPECT_ERROR(B->matmul(DEV, &u.v, &u.v, &u.v), NB_ERR_DTYPE, "matmul: dtype u8");
    EXPECT_ERROR(B->softmax(DEV, false, &h2.v, &h.v), NB_ERR_DTYPE, "softmax: dtype f16");
    EXPECT_ERROR(B->softmax(DEV, true, &ix.v, &ix.v), NB_ERR_DTYPE, "log_softmax: dtype i32");
    EXPECT_ERROR(B->gather(DEV, "gather", &h2.v, &h.v, &ix.v), NB_ERR_DTYPE, "gather: dtype f16");
    EXPECT_ERROR(B->scatter_add(DEV, "scatter_add", &bo.v, &ix.v, &bo.v), NB_ERR_DTYPE,
                 "scatter_add: dtype bool");
    EXPECT_ERROR(B->one_hot(DEV, &h.v, &ix.v, 1, 0), NB_ERR_DTYPE, "one_hot: dtype f16");
    nb_update_params hp = {0};
    EXPECT_ERROR(B->optim->sgd_update(DEV, &h.v, &h.v, NULL, &hp), NB_ERR_DTYPE, "sgd_update: dtype f16");
    EXPECT_ERROR(B->optim->adam_update(DEV, &bf.v, &bf.v, &bf.v, &bf.v, &hp), NB_ERR_DTYPE,
                 "adam_update: dtype bf16");
    arr_free(&h), arr_free(&h2), arr_free(&h1), arr_free(&bf), arr_free(&f), arr_free(&u);
    arr_free(&bo), arr_free(&ix);
}

int main(void)
{
    test_memory();
    test_fill_arange();
    test_random();
    test_copy();
    test_unary();
    test_binary();
    test_where();
    test_reduce();
    test_arg_reduce();
    test_matmul();
    test_softmax();
    test_softmax_stride_bits();
    test_index();
    test_optim();
    test_optim_scaled();
    test_half_conversions();
    test_unsupported();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_cpu_kernels: all passed (built-in gemm kernel: %s)\n", nb__cpu_gemm_kernel_name());
    return 0;
}
