/* libFuzzer target for the shape and view ops and the creation functions.
 *
 * An input is a little program: each op byte picks a call (create, reshape,
 * transpose, permute, expand_dims, squeeze, slice, broadcast_to, contiguous,
 * concat, stack, split, gather, one_hot, pad, nb_tensor_read, scopes) and the
 * bytes after it its arguments: slots of a small pool of tensors (views and
 * non-contiguous ones among them), shapes with hostile dims and ndims outside
 * 0..8, axes, sizes. Beside the library this file keeps its own model: what
 * each call must do (pass, fail, or either where the library may choose) and,
 * for small tensors, the values a result must hold. A pass must have the
 * predicted dtype, shape, element count, row-major strides when it says it is
 * contiguous, and values; a failure must leave an error whose message names
 * the call. Calls that would allocate more than BUDGET bytes without
 * overflowing are skipped (libFuzzer counts a large malloc as a crash).
 * Crashes, sanitizer reports, leaked tensors and model mismatches abort.
 * FUZZ_TRACE=1 in the environment prints each call and its outcome, to read
 * what a reproducer does. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nabla/nabla.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 8
#define MIRROR_MAX 4096              /* elements whose values the model keeps */
#define BUDGET ((int64_t)1 << 20)    /* bytes one call may allocate */
#define MAX_OPS 64
#define MAX_DEPTH 3                  /* scopes opened inside the input's own */

enum { MUST_FAIL, MUST_PASS, EITHER, SKIP };

typedef struct slot {
    nb_tensor *t; /* NULL: empty, which calls then get as a NULL input */
    double *v;    /* t's values in row-major order, when known and small */
    int depth;    /* the scope that owns t */
} slot;

/* The program being run. */
static struct {
    const uint8_t *p;
    size_t n;
    slot s[SLOTS];
    nb_scope *scope[MAX_DEPTH + 1];
    int depth;
    int step;
    const char *call;
    char outcome[192]; /* for FUZZ_TRACE */
    bool trace;
} F;

#define REQUIRE(cond, ...)                                                                   \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_shape: step %d (%s): %s:%d: %s: ", F.step, F.call,         \
                    __FILE__, __LINE__, #cond);                                              \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* ---- reading the program ------------------------------------------------------------ */

static unsigned byte(void)
{
    if (!F.n)
        return 0;
    F.n--;
    return *F.p++;
}

/* Dims past every limit: negative, past int32, past int64 once multiplied. */
static const int64_t hostile_dims[16] = {
    -1, -2, 7, 64, 255, INT64_C(1) << 31, (INT64_C(1) << 32) - 1, INT64_C(1) << 32,
    INT64_C(1) << 40, INT64_C(1) << 61, INT64_C(1) << 62, (INT64_C(1) << 62) + 1,
    INT64_MAX, INT64_MIN, INT64_C(3) << 61, INT64_C(1) << 20,
};

/* Mostly 0 to 5; now and then a hostile dim. */
static int64_t dim_arg(void)
{
    unsigned b = byte();
    return b < 208 ? (int64_t)(b % 6) : hostile_dims[b & 15];
}

/* A shape: like_ndim dims (when >= 0) half the time, else 0 to 4; now and then
 * an ndim outside 0..8, which must be refused without reading past dims[7]. */
static nb_shape shape_arg(int like_ndim)
{
    static const int odd[8] = {-1, 9, 1000, INT_MIN, INT_MAX, -1000, 8, 7};
    nb_shape s;
    memset(&s, 0, sizeof s);
    unsigned b = byte();
    if (b >= 248)
        s.ndim = odd[b & 7];
    else
        s.ndim = like_ndim >= 0 && b < 124 ? like_ndim : (int)(b % 5);
    for (int i = 0; i < NB_MAX_DIMS && i < (s.ndim > 0 ? s.ndim : 0); i++)
        s.dims[i] = dim_arg();
    return s;
}

/* -10 to 10, or an int's extremes. */
static int axis_arg(void)
{
    unsigned b = byte();
    return b >= 250 ? (b & 1 ? INT_MIN : INT_MAX) : (int)(b % 21) - 10;
}

/* Mostly dtypes the CPU holds; now and then f16/bf16 (GPU only) or no dtype. */
static nb_dtype dtype_arg(void)
{
    static const nb_dtype common[8] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_U8, NB_BOOL, NB_I64, NB_F32};
    unsigned b = byte();
    if (b < 240)
        return common[b % 8];
    return b < 246 ? NB_F16 : b < 250 ? NB_BF16 : (nb_dtype)(NB_DTYPE_COUNT + (b & 1));
}

static slot *slot_arg(void) { return &F.s[byte() % SLOTS]; }

/* ---- the model's arithmetic --------------------------------------------------------- */

static bool valid_dtype(nb_dtype d) { return (unsigned)d < NB_DTYPE_COUNT; }
static bool cpu_dtype(nb_dtype d) { return valid_dtype(d) && d != NB_F16 && d != NB_BF16; }
static bool int_index_dtype(nb_dtype d) { return d == NB_I32 || d == NB_I64; }
static bool numeric_dtype(nb_dtype d) { return d == NB_F32 || d == NB_F64 || d == NB_I32 || d == NB_I64; }
static size_t elem_of(nb_dtype d) { return valid_dtype(d) ? nb_dtype_size(d) : 1; }

/* Elements: 0 when a dim is 0, -1 when a dim is negative or the count overflows. */
static int64_t numel_of(int nd, const int64_t *d)
{
    for (int i = 0; i < nd; i++)
        if (d[i] < 0)
            return -1;
    for (int i = 0; i < nd; i++)
        if (d[i] == 0)
            return 0;
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        if (__builtin_mul_overflow(n, d[i], &n))
            return -1;
    return n;
}

/* Bytes the dims span with a zero dim counted as 1; -1 when negative or past
 * int64. Every tensor the library makes must have one that fits. */
static int64_t span_of(int nd, const int64_t *d, size_t elem)
{
    int64_t s = (int64_t)elem;
    for (int i = 0; i < nd; i++)
        if (d[i] < 0 || __builtin_mul_overflow(s, d[i] > 1 ? d[i] : 1, &s))
            return -1;
    return s;
}

static int64_t add_sat(int64_t a, int64_t b) { return __builtin_add_overflow(a, b, &a) ? INT64_MAX : a; }

/* An axis in [0, n), or -1. */
static int norm_axis(int axis, int n)
{
    if (axis < -n || axis >= n)
        return -1;
    return axis < 0 ? axis + n : axis;
}

typedef struct info {
    nb_dtype dt;
    int nd;
    int64_t d[NB_MAX_DIMS];
    int64_t numel, bytes; /* bytes: numel times the element size */
    bool contig;
} info;

static info info_of(const nb_tensor *t)
{
    info x;
    memset(&x, 0, sizeof x);
    x.dt = nb_tensor_dtype(t);
    x.nd = nb_tensor_ndim(t);
    REQUIRE(x.nd >= 0 && x.nd <= NB_MAX_DIMS, "a tensor of %d dims", x.nd);
    for (int i = 0; i < x.nd; i++)
        x.d[i] = nb_tensor_dim(t, i);
    x.numel = nb_tensor_numel(t);
    x.bytes = __builtin_mul_overflow(x.numel, (int64_t)elem_of(x.dt), &x.bytes) ? INT64_MAX : x.bytes;
    x.contig = nb_tensor_is_contiguous(t);
    return x;
}

static void unravel(int64_t flat, int nd, const int64_t *shape, int64_t *idx)
{
    for (int i = nd - 1; i >= 0; i--) {
        idx[i] = shape[i] ? flat % shape[i] : 0;
        flat = shape[i] ? flat / shape[i] : 0;
    }
}

static int64_t ravel(int nd, const int64_t *shape, const int64_t *idx)
{
    int64_t f = 0;
    for (int i = 0; i < nd; i++)
        f = f * shape[i] + idx[i];
    return f;
}

/* ---- values --------------------------------------------------------------------------- */

static void put_value(nb_dtype dt, void *buf, int64_t i, double v)
{
    switch (dt) {
    case NB_F32: ((float *)buf)[i] = (float)v; break;
    case NB_F64: ((double *)buf)[i] = v; break;
    case NB_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case NB_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case NB_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

static double get_value(nb_dtype dt, const void *buf, int64_t i)
{
    switch (dt) {
    case NB_F32: return ((const float *)buf)[i];
    case NB_F64: return ((const double *)buf)[i];
    case NB_I32: return ((const int32_t *)buf)[i];
    case NB_I64: return (double)((const int64_t *)buf)[i];
    case NB_F16: { /* the CPU holds f16 and bf16: tensors made empty, then padded */
        uint16_t h = ((const uint16_t *)buf)[i];
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    case NB_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    default: return ((const uint8_t *)buf)[i];
    }
}

/* A value each dtype holds exactly: mostly 0 to 7, for integers now and then
 * an index far out of any range. */
static double value_arg(nb_dtype dt)
{
    unsigned b = byte();
    if (b < 224 || dt == NB_BOOL)
        return dt == NB_BOOL ? b & 1 : b % 8;
    static const double i64[8] = {-1, 99, 2147483647.0, -2147483648.0, 1099511627776.0, -1099511627776.0,
                                  -9223372036854775808.0, 255};
    static const double i32[8] = {-1, 99, 2147483647.0, -2147483648.0, 255, -7, 1000, 5};
    static const double u8[8] = {255, 128, 99, 200, 8, 9, 10, 11};
    static const double fl[8] = {-1, 99, 0.5, -0.25, 1024, -3, 6, 1e6};
    switch (dt) {
    case NB_I64: return i64[b & 7];
    case NB_I32: return i32[b & 7];
    case NB_U8: return u8[b & 7];
    default: return fl[b & 7];
    }
}

static double *new_values(int64_t n)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    REQUIRE(v != NULL, "out of host memory");
    return v;
}

/* t's values, read back; t holds at most MIRROR_MAX elements. */
static double *read_values(const nb_tensor *t, const info *x)
{
    void *buf = malloc((size_t)(x->bytes ? x->bytes : 1));
    REQUIRE(buf != NULL, "out of host memory");
    nb_status st = nb_tensor_read(t, buf, (size_t)x->bytes);
    REQUIRE(st == NB_OK, "reading back %lld bytes: %s", (long long)x->bytes, nb_error_message());
    double *v = new_values(x->numel);
    for (int64_t i = 0; i < x->numel; i++)
        v[i] = get_value(x->dt, buf, i);
    free(buf);
    return v;
}

/* ---- outcomes ------------------------------------------------------------------------- */

/* Whether msg names one of the '|'-separated names. */
static bool names_one(const char *msg, const char *names)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", names);
    for (char *save = NULL, *w = strtok_r(buf, "|", &save); w; w = strtok_r(NULL, "|", &save))
        if (strstr(msg, w))
            return true;
    return false;
}

/* A call failed: the model must allow it, and the error must be one an op
 * gives for its arguments, with a message naming the call. */
static void failed(int expect)
{
    nb_status code = nb_error();
    const char *msg = nb_error_message();
    REQUIRE(expect != MUST_PASS, "failed where it must pass: %s: %s", nb_status_name(code), msg);
    REQUIRE(code == NB_ERR_INVALID_ARGUMENT || code == NB_ERR_SHAPE || code == NB_ERR_DTYPE ||
                code == NB_ERR_OUT_OF_MEMORY || code == NB_ERR_UNSUPPORTED,
            "failed with %s: %s", nb_status_name(code), msg);
    REQUIRE(msg[0] && names_one(msg, F.call), "the message '%s' does not name the call", msg);
    snprintf(F.outcome, sizeof F.outcome, "failed: %s", msg);
    nb_error_clear();
}

/* Checks what any tensor must be: dims >= 0, numel their product, strides
 * row-major when it says it is contiguous, a span that fits. */
static bool sound(const nb_tensor *t, const info *x)
{
    REQUIRE(valid_dtype(x->dt), "dtype %d", (int)x->dt);
    for (int i = 0; i < x->nd; i++)
        REQUIRE(x->d[i] >= 0, "dim %d is %lld", i, (long long)x->d[i]);
    REQUIRE(x->numel == numel_of(x->nd, x->d), "numel %lld for dims whose product is %lld", (long long)x->numel,
            (long long)numel_of(x->nd, x->d));
    REQUIRE(span_of(x->nd, x->d, elem_of(x->dt)) >= 0, "a tensor whose dims (zeros counted as 1) pass int64 bytes");
    if (x->contig && x->numel > 0) {
        int64_t expect = (int64_t)elem_of(x->dt);
        for (int i = x->nd - 1; i >= 0; i--) {
            REQUIRE(x->d[i] == 1 || nb_tensor_stride(t, i) == expect,
                    "contiguous, but dim %d has stride %lld, not %lld",
                    i, (long long)nb_tensor_stride(t, i), (long long)expect);
            expect *= x->d[i];
        }
    }
    return true;
}

/* Puts r (owned by the current scope) in a slot chosen by the program. */
static void keep(nb_tensor *r, double *v)
{
    slot *s = slot_arg();
    free(s->v);
    s->t = r;
    s->v = v;
    s->depth = F.depth;
}

/* A call that returns one tensor r: checks it against the model (expect, dtype
 * dt, shape (nd, d), values want when known; want is taken over) and keeps it. */
static void land(int expect, nb_tensor *r, nb_dtype dt, int nd, const int64_t *d, double *want)
{
    if (!r) {
        failed(expect);
        free(want);
        return;
    }
    REQUIRE(expect != MUST_FAIL, "passed where it must fail");
    REQUIRE(nb_error() == NB_OK, "passed with an error pending: %s", nb_error_message());
    info x = info_of(r);
    REQUIRE(x.dt == dt, "dtype %s, expected %s", nb_dtype_name(x.dt), nb_dtype_name(dt));
    bool same = x.nd == nd;
    for (int i = 0; same && i < nd; i++)
        same = x.d[i] == d[i];
    if (!same) {
        nb_shape e = {nd, {0}};
        memcpy(e.dims, d, sizeof(int64_t) * (size_t)(nd > 0 && nd <= NB_MAX_DIMS ? nd : 0));
        char got[160], exp[160];
        REQUIRE(same, "shape %s, expected %s", nb_shape_format(nb_tensor_shape(r), got, sizeof got),
                nb_shape_format(e, exp, sizeof exp));
    }
    nb_shape_format(nb_tensor_shape(r), F.outcome, sizeof F.outcome);
    if (!sound(r, &x)) {
        free(want);
        return;
    }
    if (want && x.numel <= MIRROR_MAX) {
        double *v = read_values(r, &x);
        for (int64_t i = 0; i < x.numel; i++)
            REQUIRE(v[i] == want[i] || (isnan(v[i]) && isnan(want[i])), "element %lld is %g, expected %g",
                    (long long)i, v[i], want[i]);
        free(v);
    } else {
        free(want);
        want = NULL;
    }
    keep(r, want);
}

/* What a call that allocates `bytes` (and may need `extra` more for
 * temporaries) must do once its arguments are valid: fail when the output's
 * span overflows, else pass, or be skipped past BUDGET. */
static int alloc_expect(int nd, const int64_t *d, nb_dtype dt, int64_t extra)
{
    if (span_of(nd, d, elem_of(dt)) < 0)
        return MUST_FAIL;
    int64_t bytes = numel_of(nd, d) * (int64_t)elem_of(dt); /* <= the span */
    return add_sat(bytes, extra) > BUDGET ? SKIP : MUST_PASS;
}

/* ---- creation ------------------------------------------------------------------------- */

static void op_arange(nb_dtype dt)
{
    static const double ends[16] = {0, 1, -1, 2.5, 3, 10, -10, 0.5, 1e18, -1e18, 4.7e18, 1e300,
                                     -1e300, NAN, INFINITY, -INFINITY};
    double start = ends[byte() & 15], stop = ends[byte() & 15], step = ends[byte() & 15];
    F.call = "nb_arange|arange";
    int expect = MUST_PASS;
    int64_t n = 0;
    if (!valid_dtype(dt) || step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step)) {
        expect = MUST_FAIL;
    } else {
        double count = ceil((stop - start) / step);
        if (!(count < 0x1p62))
            expect = MUST_FAIL;
        else
            n = count > 0 ? (int64_t)count : 0;
    }
    int64_t bytes;
    if (expect == MUST_PASS && (__builtin_mul_overflow(n, (int64_t)elem_of(dt), &bytes) || bytes > BUDGET))
        return;
    if (expect == MUST_PASS && !cpu_dtype(dt))
        expect = MUST_FAIL; /* the CPU holds f16 and bf16 but makes no range of them */
    else if (expect == MUST_PASS && !numeric_dtype(dt))
        expect = EITHER; /* a range of bools or bytes: the backend's choice */
    nb_tensor *r = nb_arange(dt, start, stop, step);
    land(expect, r, dt, 1, &n, NULL);
}

static void op_create(void)
{
    static const char *const names[5] = {"nb_zeros|nb_full", "nb_ones|nb_full", "nb_full", "nb_empty",
                                         "nb_from_buffer"};
    int kind = (int)(byte() % 6);
    nb_dtype dt = dtype_arg();
    if (kind == 5) {
        op_arange(dt);
        return;
    }
    F.call = names[kind];
    nb_shape s = shape_arg(-1);
    double fill = kind == 0 ? 0 : kind == 1 ? 1 : (double)(byte() % 8);
    bool null_data = kind == 4 && byte() % 16 == 0;
    size_t elem = elem_of(dt);
    int nd = s.ndim;
    int64_t n = nd >= 0 && nd <= NB_MAX_DIMS ? numel_of(nd, s.dims) : -1, bytes = 0;
    int expect;
    if (!valid_dtype(dt) || n < 0 || __builtin_mul_overflow(n, (int64_t)elem, &bytes) || null_data)
        expect = MUST_FAIL;
    else if (bytes > BUDGET || (kind == 4 && n > MIRROR_MAX))
        return;
    else if (span_of(nd, s.dims, elem) < 0)
        expect = MUST_FAIL; /* an empty tensor whose other dims pass int64 bytes */
    else
        expect = MUST_PASS; /* f16 and bf16 too: the CPU holds them (their values go unchecked here) */

    double *want = NULL;
    nb_tensor *r;
    if (kind == 4) {
        /* Host data for a shape that passes; a small buffer for one that must
         * fail, which must not be read. */
        int64_t m = expect == MUST_FAIL ? 8 : n;
        void *data = calloc((size_t)(m > 0 ? m : 1), 8);
        REQUIRE(data != NULL, "out of host memory");
        if (expect != MUST_FAIL && cpu_dtype(dt)) {
            want = new_values(n);
            for (int64_t i = 0; i < n; i++) {
                put_value(dt, data, i, value_arg(dt));
                want[i] = get_value(dt, data, i);
            }
        }
        r = nb_from_buffer(dt, s, null_data ? NULL : data);
        free(data);
    } else {
        if (kind != 3 && expect != MUST_FAIL && cpu_dtype(dt) && n <= MIRROR_MAX) {
            want = new_values(n);
            for (int64_t i = 0; i < n; i++)
                want[i] = dt == NB_BOOL ? fill != 0 : fill;
        }
        r = kind == 0   ? nb_zeros(dt, s)
            : kind == 1 ? nb_ones(dt, s)
            : kind == 2 ? nb_full(dt, s, fill)
                        : nb_empty(dt, s);
    }
    land(expect, r, dt, nd, s.dims, want);
}

/* ---- views ---------------------------------------------------------------------------- */

/* Values of x (dims xd) permuted: result dim i is x's dim perm[i]. */
static double *permuted(const double *v, int nd, const int64_t *xd, const int *perm, int64_t numel)
{
    if (!v)
        return NULL;
    int64_t od[NB_MAX_DIMS], oi[NB_MAX_DIMS], xi[NB_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        od[i] = xd[perm[i]];
    double *w = new_values(numel);
    for (int64_t f = 0; f < numel; f++) {
        unravel(f, nd, od, oi);
        for (int i = 0; i < nd; i++)
            xi[perm[i]] = oi[i];
        w[f] = v[ravel(nd, xd, xi)];
    }
    return w;
}

static double *copy_values(const double *v, int64_t n)
{
    if (!v)
        return NULL;
    double *w = new_values(n);
    memcpy(w, v, sizeof(double) * (size_t)n);
    return w;
}

static void op_reshape(void)
{
    F.call = "reshape";
    slot *s = slot_arg();
    nb_shape t = shape_arg(-1);
    if (t.ndim > 0 && t.ndim <= NB_MAX_DIMS && byte() < 96)
        t.dims[byte() % (unsigned)t.ndim] = -1;
    if (byte() < 16 && t.ndim > 1 && t.ndim <= NB_MAX_DIMS)
        t.dims[0] = t.dims[t.ndim - 1] = -1;
    if (!s->t) {
        land(MUST_FAIL, nb_reshape(NULL, t), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    nb_shape out = t;
    int expect = MUST_PASS, infer = -1;
    int64_t known = 1;
    if (t.ndim < 0 || t.ndim > NB_MAX_DIMS) {
        expect = MUST_FAIL;
    } else {
        int64_t rest[NB_MAX_DIMS];
        int nr = 0;
        for (int i = 0; i < t.ndim && expect != MUST_FAIL; i++) {
            if (t.dims[i] == -1 && infer < 0)
                infer = i;
            else if (t.dims[i] < 0)
                expect = MUST_FAIL;
            else
                rest[nr++] = t.dims[i];
        }
        if (expect != MUST_FAIL) {
            known = numel_of(nr, rest);
            if (known < 0)
                expect = MUST_FAIL;
            else if (infer >= 0 && (known == 0 || x.numel % known != 0))
                expect = MUST_FAIL;
            else if (infer >= 0)
                out.dims[infer] = x.numel / known;
            else if (known != x.numel)
                expect = MUST_FAIL;
        }
        if (expect != MUST_FAIL && span_of(out.ndim, out.dims, elem_of(x.dt)) < 0)
            expect = MUST_FAIL;
        if (expect != MUST_FAIL && !x.contig && x.bytes > BUDGET)
            return;
    }
    nb_tensor *r = nb_reshape(s->t, t);
    land(expect, r, x.dt, out.ndim, out.dims, expect == MUST_FAIL ? NULL : copy_values(s->v, x.numel));
}

static void op_permute(bool transpose)
{
    F.call = transpose ? "transpose" : "permute";
    slot *s = slot_arg();
    int a0 = axis_arg(), a1 = axis_arg();
    nb_axes axes;
    memset(&axes, 0, sizeof axes);
    /* A shuffle of 0..n-1, now and then spoiled. */
    unsigned b = byte();
    axes.n = b < 200 && s->t ? nb_tensor_ndim(s->t) : (int)(b % 12);
    int n = axes.n < NB_MAX_DIMS ? axes.n : NB_MAX_DIMS;
    for (int i = 0; i < n; i++)
        axes.axes[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(byte() % (unsigned)(i + 1)), tmp = axes.axes[i];
        axes.axes[i] = axes.axes[j];
        axes.axes[j] = tmp;
    }
    if (n > 0 && byte() < 32)
        axes.axes[byte() % (unsigned)n] = axis_arg();
    if (!s->t) {
        land(MUST_FAIL, transpose ? nb_transpose(NULL, a0, a1) : nb_permute(NULL, axes), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    int perm[NB_MAX_DIMS];
    int expect = MUST_PASS;
    for (int i = 0; i < x.nd; i++)
        perm[i] = i;
    if (transpose) {
        int p = norm_axis(a0, x.nd), q = norm_axis(a1, x.nd);
        if (p < 0 || q < 0) {
            expect = MUST_FAIL;
        } else {
            perm[p] = q;
            perm[q] = p;
        }
    } else if (axes.n != x.nd) {
        expect = MUST_FAIL;
    } else {
        int seen = 0;
        for (int i = 0; i < x.nd && expect != MUST_FAIL; i++) {
            int a = norm_axis(axes.axes[i], x.nd);
            if (a < 0 || (seen & (1 << a)))
                expect = MUST_FAIL;
            else
                seen |= 1 << a, perm[i] = a;
        }
    }
    int64_t od[NB_MAX_DIMS];
    for (int i = 0; i < x.nd; i++)
        od[i] = x.d[perm[i]];
    nb_tensor *r = transpose ? nb_transpose(s->t, a0, a1) : nb_permute(s->t, axes);
    double *want = expect == MUST_PASS && x.numel <= MIRROR_MAX ? permuted(s->v, x.nd, x.d, perm, x.numel) : NULL;
    land(expect, r, x.dt, x.nd, od, want);
}

static void op_expand_squeeze(bool expand)
{
    F.call = expand ? "expand_dims" : "squeeze";
    slot *s = slot_arg();
    int axis = axis_arg();
    if (!s->t) {
        land(MUST_FAIL, expand ? nb_expand_dims(NULL, axis) : nb_squeeze(NULL, axis), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    int64_t od[NB_MAX_DIMS];
    int nd = 0, expect;
    if (expand) {
        int a = x.nd < NB_MAX_DIMS ? norm_axis(axis, x.nd + 1) : -1;
        expect = a < 0 ? MUST_FAIL : MUST_PASS;
        for (int i = 0, j = 0; a >= 0 && i <= x.nd; i++)
            od[nd++] = i == a ? 1 : x.d[j++];
    } else {
        int a = norm_axis(axis, x.nd);
        expect = a < 0 || x.d[a] != 1 ? MUST_FAIL : MUST_PASS;
        for (int i = 0; expect == MUST_PASS && i < x.nd; i++)
            if (i != a)
                od[nd++] = x.d[i];
    }
    nb_tensor *r = expand ? nb_expand_dims(s->t, axis) : nb_squeeze(s->t, axis);
    land(expect, r, x.dt, nd, od, expect == MUST_PASS ? copy_values(s->v, x.numel) : NULL);
}

/* Values of the block of x (dims xd) at begin with dims od. */
static double *block(const double *v, int nd, const int64_t *xd, const int64_t *begin, const int64_t *od)
{
    int64_t n = numel_of(nd, od);
    if (!v || n > MIRROR_MAX)
        return NULL;
    int64_t oi[NB_MAX_DIMS], xi[NB_MAX_DIMS];
    double *w = new_values(n);
    for (int64_t f = 0; f < n; f++) {
        unravel(f, nd, od, oi);
        for (int i = 0; i < nd; i++)
            xi[i] = oi[i] + begin[i];
        w[f] = v[ravel(nd, xd, xi)];
    }
    return w;
}

static void op_slice(void)
{
    F.call = "slice";
    slot *s = slot_arg();
    int nd = s->t ? nb_tensor_ndim(s->t) : 1;
    nb_shape begin = shape_arg(nd), size = shape_arg(nd);
    for (int i = 0; i < size.ndim && i < NB_MAX_DIMS; i++)
        if (byte() < 64)
            size.dims[i] = -1;
    if (!s->t) {
        land(MUST_FAIL, nb_slice(NULL, begin, size), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    int64_t od[NB_MAX_DIMS] = {0};
    int expect = begin.ndim == x.nd && size.ndim == x.nd ? MUST_PASS : MUST_FAIL;
    for (int i = 0; expect == MUST_PASS && i < x.nd; i++) {
        int64_t b = begin.dims[i], z = size.dims[i], d = x.d[i];
        if (z == -1 && b >= 0 && b <= d)
            z = d - b;
        if (b < 0 || b > d || z < 0 || z > d - b)
            expect = MUST_FAIL;
        od[i] = z;
    }
    nb_tensor *r = nb_slice(s->t, begin, size);
    land(expect, r, x.dt, x.nd, od, expect == MUST_PASS ? block(s->v, x.nd, x.d, begin.dims, od) : NULL);
}

static void op_broadcast_to(void)
{
    F.call = "broadcast_to";
    slot *s = slot_arg();
    int xnd = s->t ? nb_tensor_ndim(s->t) : 0;
    /* Mostly x's dims with some stretched and some put in front. */
    nb_shape t;
    memset(&t, 0, sizeof t);
    unsigned b = byte();
    if (b >= 240) {
        t = shape_arg(-1);
    } else {
        t.ndim = xnd + (int)(b % 3);
        int lead = t.ndim - xnd;
        for (int i = 0; i < t.ndim && i < NB_MAX_DIMS; i++) {
            int64_t have = i < lead || !s->t ? 1 : nb_tensor_dim(s->t, i - lead);
            t.dims[i] = have == 1 || byte() < 48 ? dim_arg() : have;
        }
    }
    if (!s->t) {
        land(MUST_FAIL, nb_broadcast_to(NULL, t), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    int expect = t.ndim >= x.nd && t.ndim <= NB_MAX_DIMS ? MUST_PASS : MUST_FAIL;
    int lead = expect == MUST_PASS ? t.ndim - x.nd : 0;
    for (int i = 0; expect == MUST_PASS && i < t.ndim; i++) {
        int64_t want = t.dims[i], have = i < lead ? 1 : x.d[i - lead];
        if (want < 0 || (have != want && have != 1))
            expect = MUST_FAIL;
    }
    if (expect == MUST_PASS && span_of(t.ndim, t.dims, elem_of(x.dt)) < 0)
        expect = MUST_FAIL;
    double *want = NULL;
    int64_t n = expect == MUST_PASS ? numel_of(t.ndim, t.dims) : -1;
    if (s->v && n >= 0 && n <= MIRROR_MAX) {
        int64_t oi[NB_MAX_DIMS], xi[NB_MAX_DIMS];
        want = new_values(n);
        for (int64_t f = 0; f < n; f++) {
            unravel(f, t.ndim, t.dims, oi);
            for (int j = 0; j < x.nd; j++)
                xi[j] = x.d[j] == 1 ? 0 : oi[j + lead];
            want[f] = s->v[ravel(x.nd, x.d, xi)];
        }
    }
    land(expect, nb_broadcast_to(s->t, t), x.dt, t.ndim, t.dims, want);
}

static void op_contiguous(void)
{
    F.call = "contiguous";
    slot *s = slot_arg();
    if (!s->t) {
        land(MUST_FAIL, nb_contiguous(NULL), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    if (!x.contig && x.bytes > BUDGET)
        return;
    nb_tensor *r = nb_contiguous(s->t);
    if (r)
        REQUIRE(nb_tensor_is_contiguous(r), "a contiguous copy that is not contiguous");
    land(MUST_PASS, r, x.dt, x.nd, x.d, copy_values(s->v, x.numel));
}

/* ---- joining and splitting ------------------------------------------------------------ */

static void op_join(bool stacking)
{
    F.call = stacking ? "stack" : "concat";
    unsigned b = byte();
    int k = b >= 248 ? 0 : 1 + (int)(b % 4);
    int axis = axis_arg();
    nb_tensor *xs[4] = {NULL, NULL, NULL, NULL};
    const double *vs[4] = {NULL, NULL, NULL, NULL};
    slot *first = slot_arg();
    for (int i = 0; i < k; i++) {
        slot *s = i == 0 || byte() < 128 ? first : slot_arg();
        xs[i] = s->t;
        vs[i] = s->v;
    }
    int expect = k >= 1 ? MUST_PASS : MUST_FAIL;
    for (int i = 0; i < k; i++)
        if (!xs[i])
            expect = MUST_FAIL;
    info x[4];
    int64_t od[NB_MAX_DIMS] = {0};
    int a = -1, ond = 0;
    if (expect == MUST_PASS) {
        for (int i = 0; i < k; i++)
            x[i] = info_of(xs[i]);
        ond = x[0].nd + (stacking ? 1 : 0);
        a = stacking && x[0].nd >= NB_MAX_DIMS ? -1 : norm_axis(axis, ond);
        if (a < 0)
            expect = MUST_FAIL;
        for (int i = 1; i < k && expect == MUST_PASS; i++) {
            bool fits = x[i].dt == x[0].dt && x[i].nd == x[0].nd;
            for (int d = 0; fits && d < x[0].nd; d++)
                fits = x[i].d[d] == x[0].d[d] || (!stacking && d == a);
            if (!fits)
                expect = MUST_FAIL;
        }
    }
    if (expect == MUST_PASS) {
        for (int d = 0, j = 0; d < ond; d++)
            od[d] = stacking && d == a ? k : x[0].d[j++];
        if (!stacking) {
            od[a] = 0;
            for (int i = 0; i < k && expect == MUST_PASS; i++)
                if (__builtin_add_overflow(od[a], x[i].d[a], &od[a]))
                    expect = MUST_FAIL;
        }
        if (expect == MUST_PASS)
            expect = alloc_expect(ond, od, x[0].dt, 0);
        if (expect == SKIP)
            return;
    }
    double *want = NULL;
    int64_t n = expect == MUST_PASS ? numel_of(ond, od) : -1;
    bool known = n >= 0 && n <= MIRROR_MAX;
    for (int i = 0; i < k; i++)
        known = known && vs[i];
    if (known) {
        /* Each output element from the input whose part holds it. */
        int64_t oi[NB_MAX_DIMS], xi[NB_MAX_DIMS];
        want = new_values(n);
        for (int64_t f = 0; f < n; f++) {
            unravel(f, ond, od, oi);
            int src = 0;
            if (stacking) {
                src = (int)oi[a];
                for (int d = 0, j = 0; d < ond; d++)
                    if (d != a)
                        xi[j++] = oi[d];
            } else {
                memcpy(xi, oi, sizeof(int64_t) * (size_t)ond);
                while (xi[a] >= x[src].d[a])
                    xi[a] -= x[src++].d[a];
            }
            want[f] = vs[src][ravel(x[src].nd, x[src].d, xi)];
        }
    }
    nb_tensor *r = stacking ? nb_stack(k, k ? xs : NULL, axis) : nb_concat(k, k ? xs : NULL, axis);
    land(expect, r, expect == MUST_PASS ? x[0].dt : NB_F32, ond, od, want);
}

static void op_split(void)
{
    F.call = "split";
    slot *s = slot_arg();
    int n = 1 + (int)(byte() % 5);
    int64_t sizes[5];
    bool given = byte() & 1;
    for (int i = 0; i < n; i++)
        sizes[i] = dim_arg();
    int axis = axis_arg();
    nb_tensor *out[5];
    if (!s->t) {
        REQUIRE(nb_split(NULL, n, given ? sizes : NULL, axis, out) != NB_OK, "split of NULL passed");
        failed(MUST_FAIL);
        return;
    }
    info x = info_of(s->t);
    int a = norm_axis(axis, x.nd);
    int expect = a < 0 ? MUST_FAIL : MUST_PASS;
    int64_t piece[5];
    if (expect == MUST_PASS) {
        int64_t dim = x.d[a], total = 0;
        for (int i = 0; i < n; i++) {
            piece[i] = given ? sizes[i] : dim / n;
            if (piece[i] < 0 || __builtin_add_overflow(total, piece[i], &total))
                expect = MUST_FAIL;
        }
        if (given ? total != dim : dim % n != 0)
            expect = MUST_FAIL;
    }
    nb_status st = nb_split(s->t, n, given ? sizes : NULL, axis, out);
    if (st != NB_OK) {
        REQUIRE(nb_error() == st, "split returned %s with %s pending", nb_status_name(st), nb_status_name(nb_error()));
        for (int i = 0; i < n; i++)
            REQUIRE(out[i] == NULL, "a failed split left piece %d", i);
        failed(expect);
        return;
    }
    REQUIRE(expect == MUST_PASS, "passed where it must fail");
    /* Each piece may land in x's own slot: keep x's values aside. */
    double *xv = x.numel <= MIRROR_MAX ? copy_values(s->v, x.numel) : NULL;
    int64_t begin[NB_MAX_DIMS] = {0}, od[NB_MAX_DIMS];
    memcpy(od, x.d, sizeof od);
    for (int i = 0; i < n; i++) {
        od[a] = piece[i];
        land(expect, out[i], x.dt, x.nd, od, block(xv, x.nd, x.d, begin, od));
        begin[a] += piece[i];
    }
    free(xv);
}

/* ---- indexing ------------------------------------------------------------------------- */

static void op_gather(void)
{
    F.call = "gather";
    slot *p = slot_arg(), *ix = slot_arg();
    if (!p->t || !ix->t) {
        land(MUST_FAIL, nb_gather(p->t, ix->t), NB_F32, 0, NULL, NULL);
        return;
    }
    info xp = info_of(p->t), xi = info_of(ix->t);
    int nd = xi.nd + xp.nd - 1;
    int64_t od[NB_MAX_DIMS] = {0};
    int expect = numeric_dtype(xp.dt) && int_index_dtype(xi.dt) && xp.nd >= 1 && nd <= NB_MAX_DIMS ? MUST_PASS
                                                                                                 : MUST_FAIL;
    int64_t rows = xp.nd >= 1 ? xp.d[0] : 0, n = -1;
    if (expect == MUST_PASS) {
        memcpy(od, xi.d, sizeof(int64_t) * (size_t)xi.nd);
        memcpy(od + xi.nd, xp.d + 1, sizeof(int64_t) * (size_t)(xp.nd - 1));
        /* Non-contiguous inputs are copied first. */
        int64_t extra = add_sat(xp.contig ? 0 : xp.bytes, xi.contig ? 0 : xi.bytes);
        expect = alloc_expect(nd, od, xp.dt, extra);
        if (expect == SKIP)
            return;
        n = expect == MUST_PASS ? numel_of(nd, od) : -1;
        /* Indices are checked whenever there are some, rows of no elements
         * included. */
        if (expect == MUST_PASS && xi.numel > 0 && !ix->v)
            expect = EITHER;
        for (int64_t i = 0; expect != MUST_FAIL && n >= 0 && ix->v && i < xi.numel; i++)
            if (!(ix->v[i] >= 0 && ix->v[i] < (double)rows))
                expect = MUST_FAIL;
    }
    double *want = NULL;
    if (expect != MUST_FAIL && n >= 0 && n <= MIRROR_MAX && p->v && ix->v) {
        int64_t row = rows ? xp.numel / rows : 0;
        want = new_values(n);
        for (int64_t f = 0; f < n; f++) {
            int64_t i = row ? f / row : 0, c = row ? f % row : 0;
            want[f] = p->v[(int64_t)ix->v[i] * row + c];
        }
    }
    land(expect, nb_gather(p->t, ix->t), xp.dt, nd, od, want);
}

static void op_one_hot(void)
{
    F.call = "one_hot";
    slot *ix = slot_arg();
    int64_t depth = dim_arg();
    nb_dtype dt = dtype_arg();
    if (!ix->t) {
        land(MUST_FAIL, nb_one_hot(NULL, depth, dt), NB_F32, 0, NULL, NULL);
        return;
    }
    info xi = info_of(ix->t);
    int nd = xi.nd + 1;
    int64_t od[NB_MAX_DIMS] = {0};
    int expect = int_index_dtype(xi.dt) && valid_dtype(dt) && depth >= 1 && xi.nd < NB_MAX_DIMS ? MUST_PASS
                                                                                             : MUST_FAIL;
    if (expect == MUST_PASS) {
        memcpy(od, xi.d, sizeof(int64_t) * (size_t)xi.nd);
        od[xi.nd] = depth;
        expect = alloc_expect(nd, od, dt, xi.contig ? 0 : xi.bytes);
        if (expect == SKIP)
            return;
        if (expect == MUST_PASS && !cpu_dtype(dt))
            expect = MUST_FAIL; /* f16 and bf16 are GPU only */
    }
    double *want = NULL;
    int64_t n = expect == MUST_PASS ? numel_of(nd, od) : -1;
    if (n >= 0 && n <= MIRROR_MAX && ix->v) {
        want = new_values(n);
        for (int64_t f = 0; f < n; f++)
            want[f] = ix->v[f / depth] == (double)(f % depth);
    }
    land(expect, nb_one_hot(ix->t, depth, dt), dt, nd, od, want);
}

/* ---- pad and reading back ------------------------------------------------------------- */

static void op_pad(void)
{
    F.call = "pad";
    slot *s = slot_arg();
    int nd = s->t ? nb_tensor_ndim(s->t) : 1;
    nb_shape before = shape_arg(nd), after = shape_arg(nd);
    double value = (double)(byte() % 8);
    if (!s->t) {
        land(MUST_FAIL, nb_pad(NULL, before, after, value), NB_F32, 0, NULL, NULL);
        return;
    }
    info x = info_of(s->t);
    int64_t od[NB_MAX_DIMS] = {0};
    int expect = before.ndim == x.nd && after.ndim == x.nd ? MUST_PASS : MUST_FAIL;
    for (int i = 0; expect == MUST_PASS && i < x.nd; i++)
        if (before.dims[i] < 0 || after.dims[i] < 0 || __builtin_add_overflow(before.dims[i], x.d[i], &od[i]) ||
            __builtin_add_overflow(od[i], after.dims[i], &od[i]))
            expect = MUST_FAIL;
    int64_t n = expect == MUST_PASS ? numel_of(x.nd, od) : -1, bytes = 0;
    if (expect == MUST_PASS && (n < 0 || __builtin_mul_overflow(n, (int64_t)elem_of(x.dt), &bytes)))
        expect = MUST_FAIL;
    if (expect == MUST_PASS && bytes > BUDGET)
        return;
    if (expect == MUST_PASS && span_of(x.nd, od, elem_of(x.dt)) < 0)
        expect = MUST_FAIL; /* empty, but its other dims pass int64 bytes */
    double *want = NULL;
    if (expect == MUST_PASS && n <= MIRROR_MAX && (s->v || x.numel == 0)) {
        int64_t oi[NB_MAX_DIMS];
        want = new_values(n);
        for (int64_t f = 0; f < n; f++) {
            unravel(f, x.nd, od, oi);
            bool inside = true;
            for (int i = 0; i < x.nd && inside; i++) {
                oi[i] -= before.dims[i];
                inside = oi[i] >= 0 && oi[i] < x.d[i];
            }
            want[f] = inside ? s->v[ravel(x.nd, x.d, oi)] : x.dt == NB_BOOL ? value != 0 : value;
        }
    }
    land(expect, nb_pad(s->t, before, after, value), x.dt, x.nd, od, want);
}

static void op_read(void)
{
    F.call = "nb_tensor_read";
    slot *s = slot_arg();
    unsigned mode = byte() % 4;
    uint8_t small[16];
    if (!s->t) {
        REQUIRE(nb_tensor_read(NULL, small, sizeof small) != NB_OK, "reading NULL passed");
        failed(MUST_FAIL);
        return;
    }
    info x = info_of(s->t);
    /* x.bytes is INT64_MAX when it does not fit, more than any buffer here. */
    void *buf = small;
    size_t size = sizeof small;
    if (mode == 0 && x.bytes <= BUDGET) {
        size = (size_t)x.bytes;
        buf = malloc(size ? size : 1);
        REQUIRE(buf != NULL, "out of host memory");
    } else if (mode == 1 && x.bytes > 0 && x.bytes <= (int64_t)sizeof small) {
        size = (size_t)x.bytes - 1;
    } else if (mode == 2) {
        buf = NULL;
        size = 0;
    }
    int expect = buf && (int64_t)size >= x.bytes ? MUST_PASS : MUST_FAIL;
    if (expect == MUST_PASS && !x.contig && x.bytes > BUDGET)
        expect = SKIP;
    if (expect != SKIP) {
        nb_status st = nb_tensor_read(s->t, buf, size);
        if (st != NB_OK) {
            failed(expect);
        } else {
            REQUIRE(expect != MUST_FAIL, "read %lld bytes into %zu", (long long)x.bytes, size);
            snprintf(F.outcome, sizeof F.outcome, "read %lld bytes", (long long)x.bytes);
            for (int64_t i = 0; s->v && i < x.numel; i++)
                REQUIRE(get_value(x.dt, buf, i) == s->v[i], "element %lld read back as %g, expected %g",
                        (long long)i, get_value(x.dt, buf, i), s->v[i]);
        }
    }
    if (buf != small)
        free(buf);
}

/* ---- scopes --------------------------------------------------------------------------- */

static void op_scope(bool begin)
{
    F.call = begin ? "nb_scope_begin" : "nb_scope_end";
    if (begin) {
        if (F.depth < MAX_DEPTH) {
            F.scope[F.depth + 1] = nb_scope_begin();
            REQUIRE(F.scope[F.depth + 1] != NULL, "no scope: %s", nb_error_message());
            F.depth++;
        }
        return;
    }
    if (F.depth == 0)
        return;
    /* One tensor of the ending scope may move out with nb_keep. */
    slot *k = slot_arg();
    if (k->t && k->depth == F.depth && byte() & 1) {
        REQUIRE(nb_keep(k->t) == k->t, "nb_keep refused a tensor of the current scope");
        k->depth--;
    }
    REQUIRE(nb_scope_end(F.scope[F.depth]) == NB_OK, "nb_scope_end: %s", nb_error_message());
    F.depth--;
    for (int i = 0; i < SLOTS; i++) {
        if (F.s[i].t && F.s[i].depth > F.depth) {
            free(F.s[i].v);
            memset(&F.s[i], 0, sizeof F.s[i]);
        }
    }
}

/* ---- the program ---------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("NB_NUM_THREADS", "1", 0); /* one thread: faster and reproducible runs */
    setenv("NB_DEBUG_POISON", "1", 0); /* an element a kernel forgets to write shows */
    const char *trace = getenv("FUZZ_TRACE");
    F.trace = trace && trace[0] && strcmp(trace, "0") != 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bool trace = F.trace;
    memset(&F, 0, sizeof F);
    F.trace = trace;
    F.p = data;
    F.n = size;
    F.call = "setup";
    int64_t live = nb_live_tensors();
    REQUIRE(nb_error() == NB_OK, "an error pending from before: %s", nb_error_message());
    F.scope[0] = nb_scope_begin();
    REQUIRE(F.scope[0] != NULL, "no scope");

    /* Two small tensors to start from: a [2, 3] f32 and a [4] i64 of indices. */
    const float a[6] = {0, 1, 2, 3, 4, 5};
    const int64_t ix[4] = {1, 0, 1, 1};
    F.s[0].t = nb_from_buffer(NB_F32, NB_SHAPE(2, 3), a);
    F.s[1].t = nb_from_buffer(NB_I64, NB_SHAPE(4), ix);
    REQUIRE(F.s[0].t && F.s[1].t, "setup: %s", nb_error_message());
    F.s[0].v = new_values(6);
    F.s[1].v = new_values(4);
    for (int i = 0; i < 6; i++)
        F.s[0].v[i] = a[i];
    for (int i = 0; i < 4; i++)
        F.s[1].v[i] = (double)ix[i];

    for (F.step = 0; F.step < MAX_OPS && F.n > 0; F.step++) {
        snprintf(F.outcome, sizeof F.outcome, "skipped");
        switch (byte() % 19) {
        case 0: op_create(); break;
        case 1: op_reshape(); break;
        case 2: op_permute(true); break;
        case 3: op_permute(false); break;
        case 4: op_expand_squeeze(true); break;
        case 5: op_expand_squeeze(false); break;
        case 6: op_slice(); break;
        case 7: op_broadcast_to(); break;
        case 8: op_contiguous(); break;
        case 9: op_join(false); break;
        case 10: op_join(true); break;
        case 11: op_split(); break;
        case 12: op_gather(); break;
        case 13: op_one_hot(); break;
        case 14: op_pad(); break;
        case 15: op_read(); break;
        case 16: op_scope(true); break;
        case 17: op_scope(false); break;
        default: op_create(); break;
        }
        REQUIRE(nb_error() == NB_OK, "left an error pending: %s", nb_error_message());
        if (F.trace)
            fprintf(stderr, "step %d: %s: %s\n", F.step, F.call, F.outcome);
    }

    F.call = "teardown";
    for (int i = 0; i < SLOTS; i++)
        free(F.s[i].v);
    REQUIRE(nb_scope_end(F.scope[0]) == NB_OK, "nb_scope_end: %s", nb_error_message());
    REQUIRE(nb_live_tensors() == live, "%lld tensors leaked", (long long)(nb_live_tensors() - live));
    return 0;
}
