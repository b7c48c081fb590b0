/* The backend-op matrix: every op of lib/core/ops.def, for every dtype the list
 * allows, on every device present (/cpu:0 and each /gpu:N).
 *
 * The per-op loops are generated from the list with X-macros: each NB_UNARY and
 * NB_BINARY op is compared with its reference nb_ref_un_<name> or
 * nb_ref_bin_<name>, written beside its formula (lib/core/formulas.h); each
 * NB_REDUCE op needs ref_red_<name> and red_dtypes_<name>, and each NB_KERNEL
 * entry a function kernel_<name> that runs its cases; a new op without them
 * does not build.
 * A unary op whose domain is not the whole line gets an entry in un_domain.
 *
 * Inputs are random with odd sizes (1, 7, 33, 1000+ elements, 0 to 4 dims,
 * empty ones), broadcasting pairs, non-contiguous views (dims reversed, every
 * other element, an offset slice, a broadcast view), per-op value ranges, and
 * the edge points (0, -0, +-inf, NaN) where include/nabla/ops.h defines them.
 * The unit suite poisons every output (NB_DEBUG_POISON=1), so an element a
 * kernel forgets to write shows up as NaN or a large odd value.
 *
 * On /cpu:0 every result is compared with a scalar reference evaluated in
 * double on the inputs' stored values, then rounded to the output's dtype; on
 * any other device with the /cpu:0 result of the same op on the same inputs
 * (f16 and bf16 against the f32 result rounded to them). NaN must match NaN,
 * +-inf exactly. Differentiable ops go through nb_gradient_check in f64 (on
 * every device) at points away from kinks, and on a device other than /cpu:0
 * their tape gradients are compared with the CPU's.
 *
 * A dtype a device does not run (its backend's supports entry) must be refused
 * with NB_ERR_DTYPE or NB_ERR_UNSUPPORTED under strict placement; a dtype the
 * list does not allow must be refused with NB_ERR_DTYPE. One summary line per
 * device: cases ran, passed, skipped as unsupported.
 *
 * Usage: test_backend_ops        /cpu:0 and every GPU present (suite unit)
 *        test_backend_ops --gpu  every GPU; exits 77 without one, 1 when
 *                                NB_REQUIRE_GPU=1 asks for one (suite gpu)
 * NB_BACKEND_OPS_DEVICES=/cpu:0,/cpu:1 names the devices instead (a second
 * logical CPU runs the device-against-CPU comparisons without a GPU). */
#include "check.h"
#include "splitmix.h"

#include "lib/core/formulas.h"
#include "ops/op.h"

#include <stdarg.h>

#define CPU "/cpu:0"
#define MAX_DEVICES 16

/* ---- devices and tallies ------------------------------------------------------------------ */

typedef struct device_run {
    const char *name;
    nb_device *dev;
    int ran, passed, skipped;
} device_run;

static device_run devices[MAX_DEVICES];
static int n_devices;
static device_run *cur;      /* the device the cases run on now */
static bool reference_mode;  /* cur is /cpu:0: compare with the double references */
static bool cpu_side;        /* running the /cpu:0 twin of a case on another device */

static bool is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }
static bool is_float(nb_dtype dt) { return dt == NB_F32 || dt == NB_F64 || is_half(dt); }
static bool is_int(nb_dtype dt) { return dt == NB_I32 || dt == NB_I64; }
/* The dtype the /cpu:0 twin of a case uses for dt. */
static nb_dtype twin(nb_dtype dt) { return is_half(dt) ? NB_F32 : dt; }
/* dt here: the twin's dtype while running the twin. */
static nb_dtype here(nb_dtype dt) { return cpu_side ? twin(dt) : dt; }
static bool holds(const device_run *d, nb_dtype dt) { return (d->dev->backend->dtypes >> dt) & 1u; }
/* Whether the device runs kernel k in dt: the CPU holds f16 and bf16 (it
 * stores and converts them) but computes in neither; test_core checks that
 * it refuses them cleanly. */
static bool computes(const device_run *d, nb_kernel k, nb_dtype dt)
{
    return holds(d, dt) && (!d->dev->backend->supports || d->dev->backend->supports(d->dev, k, 0, dt));
}

#define FLOATS_MASK (NB_MASK(NB_F32) | NB_MASK(NB_F64) | NB_MASK(NB_F16) | NB_MASK(NB_BF16))
#define NUMERIC_MASK (FLOATS_MASK | NB_MASK(NB_I32) | NB_MASK(NB_I64))
#define ALL_MASK ((1u << NB_DTYPE_COUNT) - 1)

/* ---- cases -------------------------------------------------------------------------------- */

static char label[512];
static bool verbose; /* NB_BACKEND_OPS_VERBOSE=1: a line per case */
static int case_failures;
static nb_scope *case_scope;
static int64_t case_live;

static void case_begin(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(label, sizeof label, "%s ", cur->name);
    vsnprintf(label + k, sizeof label - (size_t)k, fmt, ap);
    va_end(ap);
    check_current = label;
    case_failures = check_failures;
    case_live = nb_live_tensors();
    case_scope = nb_scope_begin();
}

static void case_end(void)
{
    nb_scope_end(case_scope);
    if (nb_error()) {
        fprintf(stderr, "[%s] left a pending error: %s\n", label, nb_error_message());
        check_failures++;
        nb_error_clear();
    }
    if (nb_live_tensors() != case_live) {
        fprintf(stderr, "[%s] leaked %lld tensors\n", label, (long long)(nb_live_tensors() - case_live));
        check_failures++;
    }
    cur->ran++;
    if (check_failures == case_failures)
        cur->passed++;
    if (verbose)
        printf("%s: %s\n", label, check_failures == case_failures ? "ok" : "FAILED");
}

/* ---- numbers ------------------------------------------------------------------------------ */

/* f16 and bf16 from and to double (round to nearest even). */
static double f16_decode(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}
static double bf16_decode(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double round_f16(double v)
{
    if (isnan(v) || isinf(v) || v == 0)
        return v;
    double a = fabs(v);
    if (a >= 65520.0)
        return v > 0 ? INFINITY : -INFINITY;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int q = e - 11 < -24 ? -24 : e - 11; /* the spacing of f16 values near a: 2^q */
    double r = nearbyint(ldexp(a, -q)); /* nearest, ties to even (the default rounding mode) */
    return copysign(ldexp(r, q), v);
}
static double round_bf16(double v)
{
    float f = (float)v;
    if (isnan(f))
        return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    u &= 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* v as dtype dt stores it, for values the reference already keeps in range. */
static double stored(nb_dtype dt, double v)
{
    switch (dt) {
    case NB_F32: return (double)(float)v;
    case NB_F16: return round_f16(v);
    case NB_BF16: return round_bf16(v);
    default: return v;
    }
}

/* A reference result converted to an integer dtype: truncated, wrapped. */
static double wrap_int(nb_dtype dt, double v)
{
    if (!is_int(dt) && dt != NB_U8)
        return v;
    double t = trunc(v);
    if (!(fabs(t) < 9.2e18))
        return 0;
    int64_t i = (int64_t)t;
    return dt == NB_I32 ? (double)(int32_t)(uint32_t)(uint64_t)i : dt == NB_U8 ? (double)(uint8_t)(uint64_t)i
                                                                               : (double)i;
}

static void to_native(nb_dtype dt, double v, void *p)
{
    switch (dt) {
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)(int64_t)v; break;
    case NB_I64: *(int64_t *)p = (int64_t)v; break;
    case NB_BOOL: *(bool *)p = v != 0; break;
    case NB_U8: *(uint8_t *)p = (uint8_t)(uint64_t)(int64_t)v; break;
    default: break;
    }
}

static double from_native(nb_dtype dt, const void *p)
{
    switch (dt) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_F16: return f16_decode(*(const uint16_t *)p);
    case NB_BF16: return bf16_decode(*(const uint16_t *)p);
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    case NB_BOOL: return *(const unsigned char *)p;
    case NB_U8: return *(const uint8_t *)p;
    default: return NAN;
    }
}

/* t's values in row-major order as doubles (malloc'd), read in its own dtype
 * from its device (no cast kernel involved; f16 and bf16 cannot live on the
 * CPU). NULL on failure. */
static double *values_of(const nb_tensor *t)
{
    if (!t)
        return NULL;
    const nb_tensor *c = t;
    nb_dtype dt = nb_tensor_dtype(c);
    int64_t n = nb_tensor_numel(c);
    size_t es = nb_dtype_size(dt);
    unsigned char *raw = malloc(es * (size_t)(n > 0 ? n : 1));
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!raw || !v || nb_tensor_read(c, raw, es * (size_t)n) != NB_OK) {
        free(raw);
        free(v);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = from_native(dt, raw + (size_t)i * es);
    free(raw);
    return v;
}

/* Whether got matches want (n values): NaN with NaN, infinities exactly, others
 * within tol * (1 + |want|). Reports the first few mismatches. */
static bool values_match(const double *got, const double *want, int64_t n, double tol, const char *what)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        bool ok = isnan(w) ? isnan(g) : isinf(w) || isinf(g) ? g == w : fabs(g - w) <= tol * (1.0 + fabs(w));
        if (!ok && bad++ < 4)
            fprintf(stderr, "[%s] %s: element %lld is %.17g, expected %.17g\n", label, what, (long long)i, g, w);
    }
    if (bad > 4)
        fprintf(stderr, "[%s] %s: %d elements of %lld differ\n", label, what, bad, (long long)n);
    return bad == 0;
}

static bool same_shape(nb_shape a, nb_shape b)
{
    if (a.ndim != b.ndim)
        return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.dims[i] != b.dims[i])
            return false;
    return true;
}

static const char *shape_str(nb_shape s)
{
    static char buf[4][96];
    static int k;
    k = (k + 1) % 4;
    return nb_shape_format(s, buf[k], sizeof buf[k]);
}

/* ---- inputs -------------------------------------------------------------------------------- */

typedef enum layout {
    L_CONTIG,   /* a fresh row-major tensor */
    L_REVERSED, /* dims reversed (a transpose for 2 dims): ndim >= 2 */
    L_STEPPED,  /* every other element of a larger tensor */
    L_OFFSET,   /* a slice starting two rows in: ndim >= 1 */
    L_BROADCAST /* stride 0 on dim 0 (rows made equal first): ndim >= 1 */
} layout;
static const char *const layout_names[] = {"", " reversed", " stepped", " offset", " broadcast"};

static int64_t numel(nb_shape s)
{
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        n *= s.dims[i];
    return n;
}

/* A tensor of dtype dt on device dev whose logical values are v (shape s), laid
 * out as lay. For L_BROADCAST v's rows are first made equal to its row 0. The
 * base is built on the host in dt (f32 then cast on the device for f16/bf16);
 * the places a view skips hold 12345 (or 1 for bool), never read. */
static nb_tensor *make_input(const char *dev, nb_dtype dt, nb_shape s, double *v, layout lay)
{
    int64_t n = numel(s);
    nb_shape bs = s;
    int nd = s.ndim;
    if ((lay == L_REVERSED && nd < 2) || ((lay == L_OFFSET || lay == L_BROADCAST) && nd < 1))
        lay = L_CONTIG;
    switch (lay) {
    case L_CONTIG: break;
    case L_REVERSED:
        for (int i = 0; i < nd; i++)
            bs.dims[i] = s.dims[nd - 1 - i];
        break;
    case L_STEPPED: bs.dims[bs.ndim++] = 2; break;
    case L_OFFSET: bs.dims[0] += 2; break;
    case L_BROADCAST: bs.dims[0] = 1; break;
    }
    if (lay == L_BROADCAST && s.dims[0] > 0) {
        int64_t row = n / s.dims[0];
        for (int64_t i = row; i < n; i++)
            v[i] = v[i % row];
    }
    int64_t bn = numel(bs);
    double *base = malloc(sizeof(double) * (size_t)(bn > 0 ? bn : 1));
    for (int64_t i = 0; i < bn; i++)
        base[i] = 12345;
    int64_t idx[NB_MAX_DIMS] = {0};
    for (int64_t f = 0; f < n; f++) {
        /* idx: f's multi-index in s; its place in the base */
        int64_t p = 0;
        switch (lay) {
        case L_CONTIG: p = f; break;
        case L_BROADCAST: p = f % (s.dims[0] ? n / s.dims[0] : 1); break;
        case L_STEPPED: p = 2 * f; break;
        case L_OFFSET: p = f + 2 * (s.dims[0] ? n / s.dims[0] : 0); break;
        case L_REVERSED:
            for (int i = 0; i < nd; i++)
                p = p * bs.dims[i] + idx[nd - 1 - i];
            break;
        }
        base[p] = v[f];
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < s.dims[i])
                break;
            idx[i] = 0;
        }
    }
    nb_dtype hd = is_half(dt) ? NB_F32 : dt;
    size_t es = nb_dtype_size(hd);
    unsigned char *raw = malloc(es * (size_t)(bn > 0 ? bn : 1));
    for (int64_t i = 0; i < bn; i++)
        to_native(hd, base[i], raw + (size_t)i * es);
    free(base);
    nb_tensor *t = nb_from_buffer(hd, bs, raw);
    free(raw);
    if (t && strcmp(dev, CPU))
        t = nb_to_device(t, dev);
    if (t && hd != dt)
        t = nb_cast(t, dt);
    if (!t)
        return NULL;
    switch (lay) {
    case L_CONTIG: return t;
    case L_REVERSED: {
        nb_axes perm = {nd, {0}};
        for (int i = 0; i < nd; i++)
            perm.axes[i] = nd - 1 - i;
        return nb_permute(t, perm);
    }
    case L_STEPPED: {
        nb_shape b = {bs.ndim, {0}}, z = bs;
        z.dims[bs.ndim - 1] = 1;
        return nb_squeeze(nb_slice(t, b, z), -1);
    }
    case L_OFFSET: {
        nb_shape b = {nd, {0}};
        b.dims[0] = 2;
        return nb_slice(t, b, s);
    }
    case L_BROADCAST: return nb_broadcast_to(t, s);
    }
    return t;
}

/* Value ranges. kind: R_REAL uniform in [lo, hi]; R_MAG +-[lo, hi] (never near
 * 0); R_GRID multiples of 0.5 in [lo, hi] (ties). Integers: whole numbers in
 * [ilo, ihi] (0 skipped when inonzero). */
typedef enum range_kind { R_REAL, R_MAG, R_GRID } range_kind;
typedef struct range {
    range_kind kind;
    double lo, hi;
    int ilo, ihi;
    bool inonzero;
} range;
#define RANGE_DEFAULT ((range){R_REAL, -4, 4, -20, 20, false})

static double *gen(int64_t n, nb_dtype dt, range r)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (r.lo == 0 && r.hi == 0)
        r = RANGE_DEFAULT;
    if (r.ilo == 0 && r.ihi == 0)
        r.ilo = -20, r.ihi = 20;
    for (int64_t i = 0; i < n; i++) {
        double u = rng_unit();
        if (dt == NB_BOOL) {
            v[i] = u < 0.5;
        } else if (dt == NB_U8) {
            v[i] = floor(u * 12);
        } else if (is_int(dt)) {
            int k = r.ilo + (int)floor(u * (r.ihi - r.ilo + 1));
            if (k > r.ihi)
                k = r.ihi;
            if (k == 0 && r.inonzero)
                k = r.ihi;
            v[i] = k;
        } else if (r.kind == R_MAG) {
            double m = r.lo + (r.hi - r.lo) * u;
            v[i] = (rng_u64() & 1) ? m : -m;
        } else if (r.kind == R_GRID) {
            v[i] = floor((r.lo + (r.hi - r.lo) * u) * 2) / 2;
        } else {
            v[i] = r.lo + (r.hi - r.lo) * u;
        }
    }
    return v;
}

/* ---- running one case --------------------------------------------------------------------- */

typedef struct input {
    nb_dtype dt;
    nb_shape shape;
    double *v; /* logical values (owned by the caller) */
    layout lay;
} input;

typedef nb_tensor *(*apply_fn)(int n, nb_tensor *const *in, const void *ctx);
/* Fills *shape and returns the malloc'd reference values of the result from the
 * inputs' stored values. */
typedef double *(*ref_fn)(int n, const input *in, const void *ctx, nb_shape *shape);

/* How closely a result must agree: T_ELEM (one rounding), T_ACC (sums over
 * many elements), T_EXACT (integers, selections, copies). */
typedef enum tol_kind { T_ELEM, T_ACC, T_EXACT } tol_kind;

static double tol_for(nb_dtype dt, tol_kind k)
{
    /* on /cpu:0 a conversion to f16 or bf16 is held to the reference's
     * rounding exactly; elsewhere the twin it is compared with is f32 */
    if (k == T_EXACT && (!is_half(dt) || reference_mode))
        return 0;
    switch (dt) {
    case NB_F32: return reference_mode ? (k == T_ELEM ? 1e-5 : 1e-4) : (k == T_ELEM ? 2e-5 : 1e-4);
    case NB_F64: return reference_mode ? (k == T_ELEM ? 1e-12 : 1e-10) : 1e-11;
    case NB_F16: return 2e-3;
    case NB_BF16: return 1.6e-2;
    default: return 0;
    }
}

/* Runs apply on inputs made on the current device and checks its result: with
 * ref on /cpu:0, with the /cpu:0 twin elsewhere. out_dt: the result's dtype. */
static void run_values(int n, input *in, apply_fn apply, ref_fn ref, const void *ctx, nb_dtype out_dt, tol_kind tk)
{
    nb_tensor *t[4] = {0};
    for (int i = 0; i < n; i++) {
        t[i] = make_input(cur->name, in[i].dt, in[i].shape, in[i].v, in[i].lay);
        CHECKF(t[i] != NULL, "input %d", i);
        if (!t[i])
            return;
    }
    /* the inputs as stored (f16/bf16 rounded), for the reference or the twin */
    input st[4];
    double *sv[4] = {0};
    for (int i = 0; i < n; i++) {
        st[i] = in[i];
        st[i].v = sv[i] = values_of(t[i]);
        CHECKF(sv[i] != NULL, "reading input %d", i);
    }
    for (int i = 0; i < n; i++)
        if (!sv[i]) {
            for (int j = 0; j < n; j++)
                free(sv[j]);
            return;
        }
    nb_tensor *out = apply(n, t, ctx);
    CHECKF(out != NULL, "the op failed");
    if (out) {
        CHECKF(strcmp(nb_tensor_device(out), cur->name) == 0, "result on %s", nb_tensor_device(out));
        CHECKF(nb_tensor_dtype(out) == out_dt, "result dtype %s, expected %s", nb_dtype_name(nb_tensor_dtype(out)),
               nb_dtype_name(out_dt));
        double *got = values_of(out), *want = NULL;
        nb_shape ws = {0, {0}};
        if (reference_mode) {
            want = ref(n, st, ctx, &ws);
            for (int64_t i = 0; want && i < numel(ws); i++)
                want[i] = stored(out_dt, want[i]);
        } else {
            nb_tensor *c[4] = {0};
            bool made = true;
            for (int i = 0; i < n && made; i++) {
                c[i] = make_input(CPU, twin(in[i].dt), in[i].shape, sv[i], in[i].lay);
                made = c[i] != NULL;
            }
            cpu_side = true;
            nb_tensor *oc = made ? apply(n, c, ctx) : NULL;
            cpu_side = false;
            CHECKF(oc != NULL, "the op failed on " CPU);
            if (oc) {
                ws = nb_tensor_shape(oc);
                want = values_of(oc);
                for (int64_t i = 0; want && i < numel(ws); i++)
                    want[i] = stored(out_dt, want[i]);
            }
        }
        if (got && want) {
            CHECKF(same_shape(nb_tensor_shape(out), ws), "shape %s, expected %s", shape_str(nb_tensor_shape(out)),
                   shape_str(ws));
            /* sums over a million elements: their rounding grows */
            double tol = tol_for(out_dt, tk) * (tk == T_ACC && n > 0 && numel(in[0].shape) > 100000 ? 10 : 1);
            if (same_shape(nb_tensor_shape(out), ws))
                CHECK(values_match(got, want, numel(ws), tol, "value"));
        } else {
            CHECKF(false, "no values to compare");
        }
        free(got);
        free(want);
    }
    for (int i = 0; i < n; i++)
        free(sv[i]);
}

/* Index checks a device may queue (gather, scatter_add, labels): a bad index
 * is then reported by the next synchronising call instead of the op. */
static bool deferred_ok;

/* Expects apply to be refused with one of the codes (strict placement, so that
 * nothing falls back to the CPU); with deferred_ok, off /cpu:0, by the next
 * nb_synchronize instead. */
static void run_refused(int n, input *in, apply_fn apply, const void *ctx, nb_status code1, nb_status code2)
{
    nb_tensor *t[4] = {0};
    for (int i = 0; i < n; i++) {
        t[i] = make_input(cur->name, in[i].dt, in[i].shape, in[i].v, in[i].lay);
        if (!t[i]) {
            CHECKF(false, "input %d", i);
            return;
        }
    }
    bool soft = nb_set_soft_placement(false);
    nb_tensor *out = apply(n, t, ctx);
    nb_set_soft_placement(soft);
    if (out && deferred_ok && !reference_mode && !nb_error() && nb_synchronize() != NB_OK)
        out = NULL;
    nb_status e = nb_error();
    CHECKF(out == NULL && (e == code1 || e == code2), "expected %s or %s, got %s", nb_status_name(code1),
           nb_status_name(code2), out ? "a result" : nb_status_name(e));
    nb_error_clear();
}

/* The dtypes of a case: run when the list allows dt and the device supports it,
 * refused when the list does not (NB_ERR_DTYPE) or the device does not
 * (NB_ERR_DTYPE or NB_ERR_UNSUPPORTED: a skip). Returns whether to run values. */
typedef enum plan { P_SKIP, P_RUN, P_REFUSE_LIST, P_REFUSE_DEVICE } plan;
static plan plan_for(unsigned listed, nb_kernel k, int variant, nb_dtype dt)
{
    if (!holds(cur, dt))
        return P_SKIP; /* no tensor of dt can live here */
    if (!((listed >> dt) & 1u))
        return P_REFUSE_LIST;
    if (!cur->dev->backend->supports(cur->dev, k, variant, dt))
        return P_REFUSE_DEVICE;
    return P_RUN;
}

/* One refusal case for a plan that refuses; true when the plan was to run. */
static bool refusal(plan p, const char *what, nb_dtype dt, int n, input *in, apply_fn apply, const void *ctx)
{
    if (p == P_RUN)
        return true;
    if (p == P_SKIP)
        return false;
    case_begin("%s %s refused", what, nb_dtype_name(dt));
    run_refused(n, in, apply, ctx, NB_ERR_DTYPE, p == P_REFUSE_LIST ? NB_ERR_DTYPE : NB_ERR_UNSUPPORTED);
    case_end();
    if (p == P_REFUSE_DEVICE)
        cur->skipped++;
    return false;
}

/* ---- gradients ---------------------------------------------------------------------------- */

typedef struct grad_case {
    nb_checked_fn fn;
    const void *ctx;
} grad_case;

/* The tape's gradients of sum(fn(in) * w), w fixed weights; returns fn's value. */
static nb_tensor *tape_gradients(grad_case *g, int n, nb_tensor *const *in, nb_tensor **grads)
{
    nb_tape *tape = nb_tape_begin();
    for (int i = 0; i < n; i++)
        CHECK_OK(nb_tape_watch(tape, in[i]));
    nb_tensor *y = g->fn(n, in, (void *)g->ctx);
    if (!y)
        return NULL;
    nb_tensor *w = nb_to_device(nb_random_uniform(NB_F64, nb_tensor_shape(y), 0.5, 1.5, 4242), nb_tensor_device(y));
    CHECK_OK(nb_tape_gradient_ex(tape, nb_sum_all(nb_mul(y, w)), NULL, n, in, grads, NB_UNCONNECTED_ZERO));
    return y;
}

static bool tensors_match(const nb_tensor *g, const nb_tensor *c, double tol, const char *what)
{
    if (!g || !c) {
        fprintf(stderr, "[%s] %s: missing (%s)\n", label, what, nb_error_message());
        return false;
    }
    if (!same_shape(nb_tensor_shape(g), nb_tensor_shape(c))) {
        fprintf(stderr, "[%s] %s: shape %s against %s\n", label, what, shape_str(nb_tensor_shape(g)),
                shape_str(nb_tensor_shape(c)));
        return false;
    }
    double *a = values_of(g), *b = values_of(c);
    bool ok = a && b && values_match(a, b, nb_tensor_numel(c), tol, what);
    free(a);
    free(b);
    return ok;
}

/* in: f64 values of n inputs (shapes given). The gradient checker on the current
 * device; elsewhere than /cpu:0 also value and tape gradients against /cpu:0. */
static void run_gradient(int n, const nb_shape *shapes, double *const *v, nb_checked_fn fn, const void *ctx)
{
    nb_tensor *t[4] = {0}, *c[4] = {0};
    for (int i = 0; i < n; i++) {
        c[i] = make_input(CPU, NB_F64, shapes[i], v[i], L_CONTIG);
        t[i] = reference_mode ? c[i] : nb_to_device(c[i], cur->name);
        if (!t[i]) {
            CHECKF(false, "input %d", i);
            return;
        }
    }
    double err = INFINITY;
    nb_status st = nb_gradient_check(fn, (void *)ctx, n, t, GC_EPS, GC_TOL, &err);
    CHECKF(st == NB_OK && err <= GC_TOL, "gradient check: error %g: %s", err, st ? nb_error_message() : "");
    nb_error_clear();
    if (!reference_mode) {
        grad_case g = {fn, ctx};
        nb_tensor *gg[4] = {0}, *gc[4] = {0};
        nb_tensor *yg = tape_gradients(&g, n, t, gg);
        cpu_side = true;
        nb_tensor *yc = tape_gradients(&g, n, c, gc);
        cpu_side = false;
        CHECK(tensors_match(yg, yc, 1e-10, "value"));
        for (int i = 0; i < n; i++)
            CHECK(tensors_match(gg[i], gc[i], 1e-10, "gradient"));
    }
}

/* ---- broadcasting helpers for the references ---------------------------------------------- */

static nb_shape broadcast_shape(int n, const input *in)
{
    nb_shape o = {0, {0}};
    for (int k = 0; k < n; k++)
        if (in[k].shape.ndim > o.ndim)
            o.ndim = in[k].shape.ndim;
    for (int i = 0; i < o.ndim; i++) {
        o.dims[i] = 1;
        for (int k = 0; k < n; k++) {
            int j = i - (o.ndim - in[k].shape.ndim);
            if (j >= 0 && in[k].shape.dims[j] != 1)
                o.dims[i] = in[k].shape.dims[j];
        }
    }
    return o;
}

/* The flat index in shape s of output multi-index idx (of o), broadcast. */
static int64_t bcast_index(nb_shape o, const int64_t *idx, nb_shape s)
{
    int64_t p = 0;
    for (int j = 0; j < s.ndim; j++) {
        int i = j + (o.ndim - s.ndim);
        p = p * s.dims[j] + (s.dims[j] == 1 ? 0 : idx[i]);
    }
    return p;
}

static void next_index(nb_shape s, int64_t *idx)
{
    for (int i = s.ndim - 1; i >= 0; i--) {
        if (++idx[i] < s.dims[i])
            return;
        idx[i] = 0;
    }
}

static double *alloc_values(int64_t n) { return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

/* ================================ unary ops ================================================= */

/* The references' integer width: 0 for the floating dtypes. */
static int int_bits(nb_dtype dt) { return dt == NB_I32 ? 32 : dt == NB_I64 ? 64 : 0; }

/* The public function of each op (nb__unary for the internal ones). */
#define PUB_UN_X(ID, name) \
    static nb_tensor *pub_##name(const nb_tensor *x, double a) { (void)a; return nb_##name(x); }
#define PUB_UN_XA(ID, name) \
    static nb_tensor *pub_##name(const nb_tensor *x, double a) { return nb_##name(x, a); }
#define PUB_UN_INTERNAL(ID, name) \
    static nb_tensor *pub_##name(const nb_tensor *x, double a) { return nb__unary(NB_UN_##ID, x, a); }
#define NB_UNARY(ID, name, dtypes, cost, api) PUB_UN_##api(ID, name)
#include "lib/core/ops.def"

typedef struct unary_entry {
    nb_unary_op op;
    const char *name;
    double (*ref)(double x, double alpha, int int_bits);
    nb_tensor *(*pub)(const nb_tensor *x, double alpha);
} unary_entry;

static const unary_entry unary_ops[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) {NB_UN_##ID, #name, nb_ref_un_##name, pub_##name},
#include "lib/core/ops.def"
};

/* Value ranges where the domain is not the whole line (random values; the edge
 * points go everywhere). */
static const range un_domain[NB_UN_COUNT] = {
    [NB_UN_LOG] = {R_REAL, 0.05, 5, 1, 20, false},
    [NB_UN_SQRT] = {R_REAL, 0.0, 5, 0, 20, false},
    [NB_UN_RSQRT] = {R_REAL, 0.05, 5, 1, 20, false},
    [NB_UN_RECIPROCAL] = {R_MAG, 0.1, 4, 1, 20, true},
    [NB_UN_POW_SCALAR] = {R_REAL, 0.05, 3, 1, 20, false},
};
/* The scalars an op is tried with (alpha). */
typedef struct alphas {
    int n;
    double v[4];
} alphas;
static const alphas un_alphas[NB_UN_COUNT] = {
    [NB_UN_LEAKY_RELU] = {2, {0.2, 1.5}},
    [NB_UN_STEP] = {2, {0.0, -1.0}},
    [NB_UN_ADD_SCALAR] = {2, {-1.5, 3.0}},
    [NB_UN_MUL_SCALAR] = {2, {0.7, -2.0}},
    [NB_UN_POW_SCALAR] = {4, {1.7, 2.0, 0.0, -0.5}},
};
/* Gradients away from kinks: |x| >= 0.1; domains above stay positive. */
static const double edges[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 30.0, -30.0,
                               100.0, -100.0, 1e-3};
#define N_EDGES ((int64_t)(sizeof edges / sizeof *edges))
/* i32 values where arithmetic wraps (two's complement). */
static const double int_edges[] = {0, 1, -1, 2, 2147483647, -2147483647 - 1.0, 46341, 65536, -7};
#define N_INT_EDGES ((int64_t)(sizeof int_edges / sizeof *int_edges))

typedef struct shape_case {
    nb_shape s;
    layout lay;
} shape_case;

static const shape_case unary_shapes[] = {
    {NB_SCALAR, L_CONTIG},          {{1, {1}}, L_CONTIG},          {{1, {7}}, L_CONTIG},
    {{1, {7}}, L_STEPPED},          {{2, {3, 11}}, L_CONTIG},      {{2, {3, 11}}, L_REVERSED},
    {{4, {2, 3, 1, 5}}, L_CONTIG},  {{4, {2, 3, 1, 5}}, L_OFFSET}, {{1, {1031}}, L_CONTIG},
    {{2, {5, 7}}, L_BROADCAST},     {{3, {4, 0, 3}}, L_CONTIG},    {{2, {37, 129}}, L_CONTIG},
    {{2, {37, 129}}, L_REVERSED},
};

typedef struct unary_ctx {
    const unary_entry *e;
    double alpha;
    nb_dtype dt;
    bool reversed; /* gradients: dims reversed inside fn */
} unary_ctx;

static nb_tensor *apply_unary(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const unary_ctx *c = ctx;
    return c->e->pub(in[0], c->alpha);
}

static double *ref_unary(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const unary_ctx *c = ctx;
    int64_t k = numel(in[0].shape);
    double *w = alloc_values(k);
    for (int64_t i = 0; i < k; i++)
        w[i] = wrap_int(c->dt, c->e->ref(in[0].v[i], c->alpha, int_bits(c->dt)));
    *shape = in[0].shape;
    return w;
}

static nb_tensor *grad_unary(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const unary_ctx *c = ctx;
    return c->e->pub(c->reversed ? nb_transpose(in[0], 0, -1) : in[0], c->alpha);
}

static void kernel_unary(void)
{
    for (size_t u = 0; u < sizeof unary_ops / sizeof *unary_ops; u++) {
        const unary_entry *e = &unary_ops[u];
        CHECKF(strcmp(nb__unary_name(e->op), e->name) == 0, "%s is named %s", e->name, nb__unary_name(e->op));
        range dom = un_domain[e->op];
        alphas al = un_alphas[e->op].n ? un_alphas[e->op] : (alphas){1, {0.0}};
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            plan p = plan_for(nb__unary_dtypes(e->op), NB_K_UNARY, e->op, dt);
            unary_ctx c0 = {e, al.v[0], dt, false};
            double one = 1;
            input probe = {dt, {1, {1}}, &one, L_CONTIG};
            if (!refusal(p, e->name, dt, 1, &probe, apply_unary, &c0))
                continue;
            for (int a = 0; a < al.n; a++) {
                unary_ctx c = {e, al.v[a], dt, false};
                for (size_t s = 0; s < sizeof unary_shapes / sizeof *unary_shapes; s++) {
                    const shape_case *sc = &unary_shapes[s];
                    case_begin("%s(alpha %g) %s %s%s", e->name, c.alpha, nb_dtype_name(dt), shape_str(sc->s),
                               layout_names[sc->lay]);
                    double *v = gen(numel(sc->s), dt, dom);
                    input in = {dt, sc->s, v, sc->lay};
                    run_values(1, &in, apply_unary, ref_unary, &c, dt, T_ELEM);
                    free(v);
                    case_end();
                }
                if (is_float(dt)) {
                    case_begin("%s(alpha %g) %s edge points", e->name, c.alpha, nb_dtype_name(dt));
                    double v[N_EDGES];
                    memcpy(v, edges, sizeof v);
                    input in = {dt, {1, {N_EDGES}}, v, L_CONTIG};
                    run_values(1, &in, apply_unary, ref_unary, &c, dt, T_ELEM);
                    case_end();
                } else if (dt == NB_I32 && c.alpha == trunc(c.alpha)) {
                    case_begin("%s(alpha %g) i32 wrapping", e->name, c.alpha);
                    double v[N_INT_EDGES];
                    memcpy(v, int_edges, sizeof v);
                    input in = {dt, {1, {N_INT_EDGES}}, v, L_CONTIG};
                    run_values(1, &in, apply_unary, ref_unary, &c, dt, T_EXACT);
                    case_end();
                }
            }
        }
        /* gradients in f64, contiguous and strided, away from kinks */
        if (!holds(cur, NB_F64) || !cur->dev->backend->supports(cur->dev, NB_K_UNARY, e->op, NB_F64))
            continue;
        for (int a = 0; a < al.n; a++) {
            for (int rev = 0; rev < 2; rev++) {
                unary_ctx c = {e, al.v[a], NB_F64, rev};
                case_begin("%s(alpha %g) gradient%s", e->name, c.alpha, rev ? " strided" : "");
                range gr = dom.lo == 0 && dom.hi == 0 ? (range){R_MAG, 0.1, 2, 0, 0, false} : dom;
                if (gr.lo < 0.1 && gr.kind == R_REAL)
                    gr.lo = 0.1;
                nb_shape s = rev ? NB_SHAPE(4, 3) : NB_SHAPE(3, 4);
                double *v = gen(12, NB_F64, gr);
                run_gradient(1, &s, &v, grad_unary, &c);
                free(v);
                case_end();
            }
        }
    }
}

/* ================================ binary ops ================================================ */

#define PUB_BIN_AB(name) nb_##name
#define PUB_BIN_OWN(name) nb_##name
#define PUB_BIN_INTERNAL(name) pub_bin_##name
/* nb__binary for the internal ones */
#define PUB_BIN_FN_AB(ID, name)
#define PUB_BIN_FN_OWN(ID, name)
#define PUB_BIN_FN_INTERNAL(ID, name) \
    static nb_tensor *pub_bin_##name(const nb_tensor *a, const nb_tensor *b) { return nb__binary(NB_BIN_##ID, a, b); }
#define NB_BINARY(ID, name, dtypes, cost, kind, api) PUB_BIN_FN_##api(ID, name)
#include "lib/core/ops.def"
#define CMP_ARITH false
#define CMP_CMP true

typedef struct binary_entry {
    nb_binary_op op;
    const char *name;
    double (*ref)(double a, double b, int int_bits);
    nb_tensor *(*pub)(const nb_tensor *a, const nb_tensor *b);
    bool comparison;
} binary_entry;

static const binary_entry binary_ops[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) {NB_BIN_##ID, #name, nb_ref_bin_##name, PUB_BIN_##api(name), CMP_##kind},
#include "lib/core/ops.def"
};

/* Value ranges of (a, b) where an op's domain is not the whole line. */
static const range bin_domain[NB_BIN_COUNT][2] = {
    [NB_BIN_DIV] = {{R_REAL, -4, 4, -20, 20, false}, {R_MAG, 0.25, 4, -20, 20, true}},
    [NB_BIN_POW] = {{R_REAL, 0.05, 3, 1, 5, false}, {R_REAL, -3, 3, 0, 3, false}},
};

typedef struct pair_case {
    nb_shape a, b;
    layout la, lb;
    bool grid; /* values on a grid: ties */
} pair_case;

static const pair_case binary_pairs[] = {
    {NB_SCALAR, NB_SCALAR, L_CONTIG, L_CONTIG, false},
    {{1, {7}}, {1, {7}}, L_CONTIG, L_CONTIG, true},
    {{1, {1031}}, {1, {1031}}, L_CONTIG, L_CONTIG, false},
    {{3, {4, 1, 33}}, {2, {5, 1}}, L_CONTIG, L_CONTIG, false},
    {{3, {4, 1, 33}}, {2, {5, 1}}, L_CONTIG, L_CONTIG, true},
    {NB_SCALAR, {2, {3, 7}}, L_CONTIG, L_CONTIG, false},
    {{4, {2, 3, 1, 5}}, {3, {3, 4, 1}}, L_CONTIG, L_OFFSET, true},
    {{2, {0, 3}}, {2, {1, 3}}, L_CONTIG, L_CONTIG, false},
    {{2, {3, 11}}, {2, {3, 11}}, L_REVERSED, L_STEPPED, false},
    {{2, {5, 7}}, {1, {7}}, L_BROADCAST, L_OFFSET, true},
    {{2, {1001, 64}}, {2, {1001, 64}}, L_CONTIG, L_CONTIG, false},
    {{2, {1001, 64}}, {2, {1001, 64}}, L_REVERSED, L_REVERSED, false},
};

typedef struct binary_ctx {
    const binary_entry *e;
    nb_dtype dt;
    bool reversed; /* gradients: a's dims reversed inside fn */
} binary_ctx;

static nb_tensor *apply_binary(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const binary_ctx *c = ctx;
    return c->e->pub(in[0], in[1]);
}

static double *ref_elementwise(int n, const input *in, nb_shape *shape, double (*f)(const double *x, const void *ctx),
                               const void *ctx)
{
    nb_shape o = broadcast_shape(n, in);
    int64_t k = numel(o), idx[NB_MAX_DIMS] = {0};
    double *w = alloc_values(k), x[4];
    for (int64_t i = 0; i < k; i++) {
        for (int j = 0; j < n; j++)
            x[j] = in[j].v[bcast_index(o, idx, in[j].shape)];
        w[i] = f(x, ctx);
        next_index(o, idx);
    }
    *shape = o;
    return w;
}

static double binary_at(const double *x, const void *ctx)
{
    const binary_ctx *c = ctx;
    double r = c->e->ref(x[0], x[1], int_bits(c->dt));
    return c->e->comparison ? r : wrap_int(c->dt, r);
}

static double *ref_binary(int n, const input *in, const void *ctx, nb_shape *shape)
{
    return ref_elementwise(n, in, shape, binary_at, ctx);
}

static nb_tensor *grad_binary(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const binary_ctx *c = ctx;
    return c->e->pub(c->reversed ? nb_transpose(in[0], 0, -1) : in[0], in[1]);
}

static void kernel_binary(void)
{
    for (size_t u = 0; u < sizeof binary_ops / sizeof *binary_ops; u++) {
        const binary_entry *e = &binary_ops[u];
        CHECKF(strcmp(nb__binary_name(e->op), e->name) == 0, "%s is named %s", e->name, nb__binary_name(e->op));
        CHECK(e->comparison == nb__binary_is_comparison(e->op));
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            nb_dtype out_dt = e->comparison ? NB_BOOL : dt;
            plan p = plan_for(nb__binary_dtypes(e->op), NB_K_BINARY, e->op, dt);
            binary_ctx c = {e, dt, false};
            double one[2] = {1, 1};
            input probe[2] = {{dt, {1, {1}}, &one[0], L_CONTIG}, {dt, {1, {1}}, &one[1], L_CONTIG}};
            if (!refusal(p, e->name, dt, 2, probe, apply_binary, &c))
                continue;
            for (size_t s = 0; s < sizeof binary_pairs / sizeof *binary_pairs; s++) {
                const pair_case *pc = &binary_pairs[s];
                case_begin("%s %s %s%s with %s%s%s", e->name, nb_dtype_name(dt), shape_str(pc->a),
                           layout_names[pc->la], shape_str(pc->b), layout_names[pc->lb], pc->grid ? " (ties)" : "");
                range ra = bin_domain[e->op][0], rb = bin_domain[e->op][1];
                if (pc->grid) {
                    ra.kind = ra.kind == R_REAL && ra.lo < 0 ? R_GRID : ra.kind;
                    rb.kind = rb.kind == R_REAL && rb.lo < 0 ? R_GRID : rb.kind;
                    if (ra.lo == 0 && ra.hi == 0)
                        ra = (range){R_GRID, -3, 3, -3, 3, false};
                    if (rb.lo == 0 && rb.hi == 0)
                        rb = (range){R_GRID, -3, 3, -3, 3, false};
                }
                double *va = gen(numel(pc->a), dt, ra), *vb = gen(numel(pc->b), dt, rb);
                input in[2] = {{dt, pc->a, va, pc->la}, {dt, pc->b, vb, pc->lb}};
                run_values(2, in, apply_binary, ref_binary, &c, out_dt, T_ELEM);
                free(va);
                free(vb);
                case_end();
            }
            if (is_float(dt)) {
                /* every pair of edge points: [k, 1] with [1, k] */
                case_begin("%s %s edge points", e->name, nb_dtype_name(dt));
                double va[N_EDGES], vb[N_EDGES];
                memcpy(va, edges, sizeof va);
                memcpy(vb, edges, sizeof vb);
                vb[N_EDGES - 1] = -2.5; /* a negative base with a non-integer exponent */
                input in[2] = {{dt, {2, {N_EDGES, 1}}, va, L_CONTIG}, {dt, {2, {1, N_EDGES}}, vb, L_CONTIG}};
                run_values(2, in, apply_binary, ref_binary, &c, out_dt, T_ELEM);
                case_end();
            }
            if (dt == NB_I32) {
                /* every pair of wrapping points (no zero divisor) */
                case_begin("%s i32 wrapping", e->name);
                double va[N_INT_EDGES], vb[N_INT_EDGES];
                memcpy(va, int_edges, sizeof va);
                memcpy(vb, int_edges, sizeof vb);
                if (e->op == NB_BIN_DIV)
                    vb[0] = 3;
                input in[2] = {{dt, {2, {N_INT_EDGES, 1}}, va, L_CONTIG}, {dt, {2, {1, N_INT_EDGES}}, vb, L_CONTIG}};
                run_values(2, in, apply_binary, ref_binary, &c, out_dt, T_EXACT);
                case_end();
            }
            if (e->op == NB_BIN_DIV && is_int(dt)) {
                /* integer division by zero is refused */
                case_begin("div %s by zero", nb_dtype_name(dt));
                double va[3] = {1, 2, 3}, vb[3] = {1, 0, 2};
                input in[2] = {{dt, {1, {3}}, va, L_CONTIG}, {dt, {1, {3}}, vb, L_CONTIG}};
                run_refused(2, in, apply_binary, &c, NB_ERR_INVALID_ARGUMENT, NB_ERR_INVALID_ARGUMENT);
                case_end();
            }
        }
        if (e->comparison || !holds(cur, NB_F64) || !cur->dev->backend->supports(cur->dev, NB_K_BINARY, e->op, NB_F64))
            continue;
        /* gradients: broadcasting both ways, same shapes, a 0-d operand, a strided one */
        static const nb_shape gpairs[][2] = {
            {{3, {2, 1, 3}}, {2, {4, 1}}},
            {{2, {3, 4}}, {2, {3, 4}}},
            {{0, {0}}, {2, {2, 3}}},
            {{2, {4, 3}}, {1, {4}}}, /* a reversed inside fn: [3, 4] with [4] */
        };
        for (size_t p = 0; p < sizeof gpairs / sizeof *gpairs; p++) {
            binary_ctx c = {e, NB_F64, p == 3};
            case_begin("%s gradient %s with %s%s", e->name, shape_str(gpairs[p][0]), shape_str(gpairs[p][1]),
                       p == 3 ? " (a strided)" : "");
            range ra = bin_domain[e->op][0], rb = bin_domain[e->op][1];
            if (ra.lo == 0 && ra.hi == 0)
                ra = (range){R_REAL, -2, 2, 0, 0, false};
            if (rb.lo == 0 && rb.hi == 0)
                rb = (range){R_REAL, -2, 2, 0, 0, false};
            if (e->op == NB_BIN_POW)
                ra.lo = 0.5;
            double *v[2] = {gen(numel(gpairs[p][0]), NB_F64, ra), gen(numel(gpairs[p][1]), NB_F64, rb)};
            run_gradient(2, gpairs[p], v, grad_binary, &c);
            free(v[0]);
            free(v[1]);
            case_end();
        }
    }
}

/* ================================ where ===================================================== */

static nb_tensor *apply_where(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n, (void)ctx;
    return nb_where(in[0], in[1], in[2]);
}
static double where_at(const double *x, const void *ctx)
{
    (void)ctx;
    return x[0] != 0 ? x[1] : x[2];
}
static double *ref_where(int n, const input *in, const void *ctx, nb_shape *shape)
{
    return ref_elementwise(n, in, shape, where_at, ctx);
}
static nb_tensor *grad_where(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const nb_tensor *cond = ctx;
    return nb_where(nb_to_device((nb_tensor *)cond, nb_tensor_device(in[0])), nb_square(in[0]), nb_sin(in[1]));
}

static void kernel_where(void)
{
    static const struct {
        nb_shape c, a, b;
        layout lc, la, lb;
    } cases[] = {
        {{2, {4, 1}}, {3, {2, 1, 3}}, {1, {3}}, L_CONTIG, L_CONTIG, L_CONTIG},
        {{2, {3, 11}}, {2, {3, 11}}, {2, {3, 11}}, L_REVERSED, L_STEPPED, L_REVERSED},
        {NB_SCALAR, NB_SCALAR, NB_SCALAR, L_CONTIG, L_CONTIG, L_CONTIG},
        {{1, {1031}}, {1, {1031}}, NB_SCALAR, L_CONTIG, L_CONTIG, L_CONTIG},
        {{2, {0, 3}}, {1, {3}}, {2, {1, 3}}, L_CONTIG, L_CONTIG, L_CONTIG},
        {{2, {5, 7}}, {2, {5, 7}}, {1, {7}}, L_CONTIG, L_BROADCAST, L_OFFSET},
    };
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(ALL_MASK, NB_K_WHERE, 0, dt);
        double v1[3] = {1, 1, 1};
        input probe[3] = {{NB_BOOL, {1, {1}}, &v1[0], L_CONTIG}, {dt, {1, {1}}, &v1[1], L_CONTIG},
                          {dt, {1, {1}}, &v1[2], L_CONTIG}};
        if (!refusal(p, "where", dt, 3, probe, apply_where, NULL))
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            case_begin("where %s %s%s ? %s%s : %s%s", nb_dtype_name(dt), shape_str(cases[s].c),
                       layout_names[cases[s].lc], shape_str(cases[s].a), layout_names[cases[s].la],
                       shape_str(cases[s].b), layout_names[cases[s].lb]);
            double *vc = gen(numel(cases[s].c), NB_BOOL, RANGE_DEFAULT);
            double *va = gen(numel(cases[s].a), dt, RANGE_DEFAULT), *vb = gen(numel(cases[s].b), dt, RANGE_DEFAULT);
            /* NaN in the branch not taken must not leak */
            if (is_float(dt) && numel(cases[s].b) > 0)
                vb[0] = NAN;
            input in[3] = {{NB_BOOL, cases[s].c, vc, cases[s].lc}, {dt, cases[s].a, va, cases[s].la},
                           {dt, cases[s].b, vb, cases[s].lb}};
            run_values(3, in, apply_where, ref_where, NULL, dt, T_EXACT);
            free(vc);
            free(va);
            free(vb);
            case_end();
        }
    }
    if (holds(cur, NB_F64)) {
        case_begin("where gradient");
        const bool mask[4] = {true, false, false, true};
        nb_tensor *cond = nb_from_buffer(NB_BOOL, NB_SHAPE(4, 1), mask);
        nb_shape s[2] = {NB_SHAPE(2, 1, 3), NB_SHAPE(3)};
        double *v[2] = {gen(6, NB_F64, RANGE_DEFAULT), gen(3, NB_F64, RANGE_DEFAULT)};
        run_gradient(2, s, v, grad_where, cond);
        free(v[0]);
        free(v[1]);
        case_end();
    }
}

/* ================================ reductions ================================================ */

static double ref_red_sum(const double *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    return s;
}
static double ref_red_mean(const double *x, int64_t n) { return n ? ref_red_sum(x, n) / (double)n : NAN; }
static double ref_red_max(const double *x, int64_t n)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = isnan(x[i]) || isnan(m) ? NAN : x[i] > m ? x[i] : m;
    return m;
}
static double ref_red_min(const double *x, int64_t n)
{
    double m = INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = isnan(x[i]) || isnan(m) ? NAN : x[i] < m ? x[i] : m;
    return m;
}
static double ref_red_prod(const double *x, int64_t n)
{
    double p = 1;
    for (int64_t i = 0; i < n; i++)
        p *= x[i];
    return p;
}
/* The dtypes each reduction takes (the list does not say). */
static const unsigned red_dtypes_sum = NUMERIC_MASK, red_dtypes_mean = FLOATS_MASK, red_dtypes_max = NUMERIC_MASK,
                      red_dtypes_min = NUMERIC_MASK, red_dtypes_prod = NUMERIC_MASK;
/* Whether an empty reduction has a value (max and min have nothing to pick). */
static const bool red_empty_ok_sum = true, red_empty_ok_mean = true, red_empty_ok_max = false,
                  red_empty_ok_min = false, red_empty_ok_prod = true;

typedef struct reduce_entry {
    nb_reduce_op op;
    const char *name;
    double (*ref)(const double *x, int64_t n);
    nb_tensor *(*pub)(const nb_tensor *x, nb_axes axes, bool keepdims);
    unsigned dtypes;
    bool empty_ok;
} reduce_entry;

static const reduce_entry reduce_ops[] = {
#define NB_REDUCE(ID, name) \
    {NB_RED_##ID, #name, ref_red_##name, nb_##name, red_dtypes_##name, red_empty_ok_##name},
#include "lib/core/ops.def"
};

typedef struct reduce_ctx {
    const reduce_entry *e;
    nb_axes axes;
    bool keepdims;
    bool reversed;
} reduce_ctx;

static nb_tensor *apply_reduce(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const reduce_ctx *c = ctx;
    return c->e->pub(in[0], c->axes, c->keepdims);
}

/* For each output element of a reduction over mask, the reduced values in order. */
static double *ref_reduce_with(const input *in, int mask, bool keepdims, nb_shape *shape,
                               double (*f)(const double *x, int64_t n, const void *ctx), const void *ctx)
{
    nb_shape s = in[0].shape, kept = s, o = {0, {0}}, red = {0, {0}};
    for (int i = 0; i < s.ndim; i++) {
        bool r = mask & (1 << i);
        kept.dims[i] = r ? 1 : s.dims[i];
        if (r)
            red.dims[red.ndim++] = s.dims[i];
        if (!r || keepdims)
            o.dims[o.ndim++] = kept.dims[i];
    }
    int64_t no = numel(kept), nr = numel(red), oi[NB_MAX_DIMS] = {0};
    double *w = alloc_values(no), *buf = alloc_values(nr);
    for (int64_t i = 0; i < no; i++) {
        int64_t ri[NB_MAX_DIMS] = {0}, full[NB_MAX_DIMS];
        for (int64_t j = 0; j < nr; j++) {
            for (int d = 0, k = 0; d < s.ndim; d++)
                full[d] = (mask & (1 << d)) ? ri[k++] : oi[d];
            int64_t p = 0;
            for (int d = 0; d < s.ndim; d++)
                p = p * s.dims[d] + full[d];
            buf[j] = in[0].v[p];
            next_index(red, ri);
        }
        w[i] = f(buf, nr, ctx);
        next_index(kept, oi);
    }
    free(buf);
    *shape = o;
    return w;
}

static double reduce_at(const double *x, int64_t n, const void *ctx) { return ((const reduce_ctx *)ctx)->e->ref(x, n); }

static double *ref_reduce(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const reduce_ctx *c = ctx;
    double *w = ref_reduce_with(in, axes_mask(c->axes, in[0].shape.ndim), c->keepdims, shape, reduce_at, ctx);
    for (int64_t i = 0; i < numel(*shape); i++)
        w[i] = wrap_int(in[0].dt, w[i]);
    return w;
}

static nb_tensor *grad_reduce(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const reduce_ctx *c = ctx;
    return c->e->pub(c->reversed ? nb_transpose(in[0], 0, -1) : in[0], c->axes, c->keepdims);
}

typedef struct reduce_shape {
    nb_shape s;
    layout lay;
    int n_sets;
    nb_axes sets[8];
    bool keep_both;
} reduce_shape;

static const reduce_shape reduce_shapes[] = {
    {NB_SCALAR, L_CONTIG, 1, {NB_ALL_AXES}, true},
    {{1, {7}}, L_CONTIG, 2, {NB_ALL_AXES, {1, {0}}}, true},
    {{1, {7}}, L_STEPPED, 1, {NB_ALL_AXES}, false},
    {{2, {3, 11}}, L_CONTIG, 3, {NB_ALL_AXES, {1, {0}}, {1, {1}}}, true},
    {{2, {3, 11}}, L_REVERSED, 3, {NB_ALL_AXES, {1, {0}}, {1, {1}}}, true},
    {{4, {2, 3, 1, 5}}, L_CONTIG, 4, {NB_ALL_AXES, {2, {0, 2}}, {2, {1, 3}}, {1, {-1}}}, true},
    {{2, {5, 7}}, L_BROADCAST, 2, {{1, {0}}, {1, {1}}}, false},
    {{1, {1031}}, L_CONTIG, 1, {NB_ALL_AXES}, true},
    {{3, {7, 33, 129}}, L_CONTIG, 8,
     {NB_ALL_AXES, {1, {0}}, {1, {1}}, {1, {2}}, {2, {0, 2}}, {2, {1, 2}}, {2, {0, 1}}, {1, {-1}}}, true},
    {{3, {7, 33, 129}}, L_REVERSED, 8,
     {NB_ALL_AXES, {1, {0}}, {1, {1}}, {1, {2}}, {2, {0, 2}}, {2, {1, 2}}, {2, {0, 1}}, {1, {-1}}}, true},
    {{2, {8192, 3}}, L_CONTIG, 2, {{1, {0}}, {1, {1}}}, true},
    {{1, {1 << 20}}, L_CONTIG, 1, {NB_ALL_AXES}, false},
    {{3, {4, 0, 3}}, L_CONTIG, 3, {{1, {1}}, {1, {0}}, NB_ALL_AXES}, false},
};

static void kernel_reduce(void)
{
    for (size_t u = 0; u < sizeof reduce_ops / sizeof *reduce_ops; u++) {
        const reduce_entry *e = &reduce_ops[u];
        CHECKF(strcmp(nb__reduce_name(e->op), e->name) == 0, "%s is named %s", e->name, nb__reduce_name(e->op));
        range dom = e->op == NB_RED_PROD ? (range){R_REAL, 0.99, 1.01, -1, 1, true} : RANGE_DEFAULT;
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            plan p = plan_for(e->dtypes, NB_K_REDUCE, e->op, dt);
            reduce_ctx c0 = {e, NB_ALL_AXES, false, false};
            double one = 1;
            input probe = {dt, {1, {1}}, &one, L_CONTIG};
            if (!refusal(p, e->name, dt, 1, &probe, apply_reduce, &c0))
                continue;
            for (size_t s = 0; s < sizeof reduce_shapes / sizeof *reduce_shapes; s++) {
                const reduce_shape *rs = &reduce_shapes[s];
                /* the large ones once per dtype class, not for every alpha of work */
                double *v = gen(numel(rs->s), dt, e->op == NB_RED_PROD && numel(rs->s) > 100000
                                                      ? (range){R_REAL, 0.9999, 1.0001, -1, 1, true}
                                                      : dom);
                for (int a = 0; a < rs->n_sets; a++) {
                    for (int keep = 0; keep < (rs->keep_both ? 2 : 1); keep++) {
                        reduce_ctx c = {e, rs->sets[a], keep, false};
                        int mask = axes_mask(c.axes, rs->s.ndim);
                        bool empty = false;
                        for (int d = 0; d < rs->s.ndim; d++)
                            empty |= (mask & (1 << d)) && rs->s.dims[d] == 0;
                        case_begin("%s %s %s%s axes mask %#x%s", e->name, nb_dtype_name(dt), shape_str(rs->s),
                                   layout_names[rs->lay], mask, keep ? " keepdims" : "");
                        input in = {dt, rs->s, v, rs->lay};
                        if (empty && !e->empty_ok)
                            run_refused(1, &in, apply_reduce, &c, NB_ERR_INVALID_ARGUMENT, NB_ERR_SHAPE);
                        else
                            run_values(1, &in, apply_reduce, ref_reduce, &c, dt, is_float(dt) ? T_ACC : T_EXACT);
                        case_end();
                    }
                }
                free(v);
            }
            if (is_float(dt)) {
                /* rows of edge points: NaN propagates, infinities add up or cancel */
                static const double rows[5][3] = {{1, NAN, 2}, {INFINITY, 1, -INFINITY}, {0, -0.0, 3},
                                                  {INFINITY, 2, INFINITY}, {-INFINITY, 0, 5}};
                const nb_axes sets[3] = {{1, {1}}, {1, {0}}, NB_ALL_AXES};
                for (int a = 0; a < 3; a++) {
                    reduce_ctx c = {e, sets[a], false, false};
                    case_begin("%s %s edge rows axes mask %#x", e->name, nb_dtype_name(dt), axes_mask(sets[a], 2));
                    double v[15];
                    memcpy(v, rows, sizeof v);
                    input in = {dt, {2, {5, 3}}, v, L_CONTIG};
                    run_values(1, &in, apply_reduce, ref_reduce, &c, dt, T_ACC);
                    case_end();
                }
            }
        }
        if (!holds(cur, NB_F64) || !(e->dtypes & NB_MASK(NB_F64)))
            continue;
        /* gradients over several axis sets, keepdims, and a strided input */
        const nb_axes sets[] = {NB_ALL_AXES, {1, {1}}, {2, {0, 2}}, {1, {-1}}};
        for (size_t a = 0; a < sizeof sets / sizeof *sets; a++) {
            for (int rev = 0; rev < 2; rev++) {
                if (rev && a != 2)
                    continue;
                reduce_ctx c = {e, sets[a], a % 2 == 1, rev};
                nb_shape s = rev ? NB_SHAPE(4, 3, 2) : NB_SHAPE(2, 3, 4);
                case_begin("%s gradient axes mask %#x%s%s", e->name, axes_mask(sets[a], 3),
                           c.keepdims ? " keepdims" : "", rev ? " strided" : "");
                double *v = gen(24, NB_F64, e->op == NB_RED_PROD ? (range){R_REAL, 0.5, 1.5, 0, 0, false}
                                                                 : (range){R_REAL, -2, 2, 0, 0, false});
                run_gradient(1, &s, &v, grad_reduce, &c);
                free(v);
                case_end();
            }
        }
    }
}

/* ================================ arg_reduce ================================================ */

typedef struct arg_ctx {
    bool is_max;
    int axis;
    bool keepdims;
} arg_ctx;

static nb_tensor *apply_arg(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const arg_ctx *c = ctx;
    return c->is_max ? nb_argmax(in[0], c->axis, c->keepdims) : nb_argmin(in[0], c->axis, c->keepdims);
}

/* The first index of the largest (smallest) value; NaN is the extreme. */
static double arg_at(const double *x, int64_t n, const void *ctx)
{
    const arg_ctx *c = ctx;
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            return (double)i;
        if (c->is_max ? x[i] > x[best] : x[i] < x[best])
            best = i;
    }
    return (double)best;
}

static double *ref_arg(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const arg_ctx *c = ctx;
    int axis = c->axis < 0 ? c->axis + in[0].shape.ndim : c->axis;
    return ref_reduce_with(in, 1 << axis, c->keepdims, shape, arg_at, ctx);
}

static void kernel_arg_reduce(void)
{
    static const struct {
        nb_shape s;
        layout lay;
    } shapes[] = {
        {{1, {7}}, L_CONTIG},         {{1, {1}}, L_CONTIG},          {{2, {3, 11}}, L_CONTIG},
        {{2, {3, 11}}, L_REVERSED},   {{4, {2, 3, 1, 5}}, L_OFFSET}, {{1, {1031}}, L_STEPPED},
        {{3, {7, 33, 129}}, L_CONTIG}, {{3, {7, 33, 129}}, L_REVERSED}, {{2, {17, 23}}, L_CONTIG},
    };
    const unsigned listed = NUMERIC_MASK | NB_MASK(NB_U8);
    for (int is_max = 0; is_max < 2; is_max++) {
        const char *name = is_max ? "argmax" : "argmin";
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            plan p = plan_for(listed, NB_K_ARG_REDUCE, 0, dt);
            arg_ctx c0 = {is_max, 0, false};
            double one = 1;
            input probe = {dt, {1, {1}}, &one, L_CONTIG};
            if (!refusal(p, name, dt, 1, &probe, apply_arg, &c0))
                continue;
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
                double *v = gen(numel(shapes[s].s), dt, (range){R_GRID, -3, 3, -3, 3, false}); /* ties */
                for (int axis = -1; axis < shapes[s].s.ndim; axis++) {
                    for (int keep = 0; keep < 2; keep++) {
                        arg_ctx c = {is_max, axis, keep};
                        case_begin("%s %s %s%s axis %d%s", name, nb_dtype_name(dt), shape_str(shapes[s].s),
                                   layout_names[shapes[s].lay], axis, keep ? " keepdims" : "");
                        input in = {dt, shapes[s].s, v, shapes[s].lay};
                        run_values(1, &in, apply_arg, ref_arg, &c, NB_I64, T_EXACT);
                        case_end();
                    }
                }
                free(v);
            }
            if (is_float(dt)) {
                static const double rows[4][3] = {{1, NAN, NAN}, {INFINITY, 1, INFINITY}, {-INFINITY, -INFINITY, 0},
                                                  {2, 2, -0.0}};
                for (int axis = 0; axis < 2; axis++) {
                    arg_ctx c = {is_max, axis, false};
                    case_begin("%s %s edge rows axis %d", name, nb_dtype_name(dt), axis);
                    double v[12];
                    memcpy(v, rows, sizeof v);
                    input in = {dt, {2, {4, 3}}, v, L_CONTIG};
                    run_values(1, &in, apply_arg, ref_arg, &c, NB_I64, T_EXACT);
                    case_end();
                }
            }
            /* nothing to pick on an empty axis */
            case_begin("%s %s empty axis", name, nb_dtype_name(dt));
            arg_ctx c = {is_max, 1, false};
            input in = {dt, {2, {3, 0}}, NULL, L_CONTIG};
            run_refused(1, &in, apply_arg, &c, NB_ERR_INVALID_ARGUMENT, NB_ERR_SHAPE);
            case_end();
        }
    }
}

/* ================================ copy and cast ============================================= */

/* nb_cast's policy: floating to integer truncates toward zero, saturates and
 * takes NaN to 0 (to u8 through i32, wrapping); anything to bool is x != 0. */
static double cast_ref(double v, nb_dtype from, nb_dtype to)
{
    if (to == NB_BOOL)
        return v != 0;
    if (is_float(to))
        return stored(to, v);
    if (is_float(from)) {
        nb_dtype via = to == NB_U8 ? NB_I32 : to;
        double lo = via == NB_I32 ? -2147483648.0 : -9223372036854775808.0;
        double hi = via == NB_I32 ? 2147483647.0 : 9223372036854775807.0;
        double t = isnan(v) ? 0 : v <= lo ? lo : v >= hi ? hi : trunc(v);
        if (to == NB_U8)
            return (double)(uint8_t)(uint32_t)(int32_t)t;
        return t;
    }
    return wrap_int(to, v);
}

typedef struct cast_ctx {
    nb_dtype from, to;
} cast_ctx;

static nb_tensor *apply_cast(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const cast_ctx *c = ctx;
    return nb_cast(in[0], here(c->to));
}

static double *ref_cast(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const cast_ctx *c = ctx;
    int64_t k = numel(in[0].shape);
    double *w = alloc_values(k);
    for (int64_t i = 0; i < k; i++)
        w[i] = cast_ref(in[0].v[i], c->from, c->to);
    *shape = in[0].shape;
    return w;
}

static nb_tensor *apply_contiguous(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n, (void)ctx;
    nb_tensor *t = nb_contiguous(in[0]);
    CHECK(t && nb_tensor_is_contiguous(t));
    return t;
}

static double *ref_identity(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n, (void)ctx;
    int64_t k = numel(in[0].shape);
    double *w = alloc_values(k);
    memcpy(w, in[0].v, sizeof(double) * (size_t)k);
    *shape = in[0].shape;
    return w;
}

static nb_tensor *grad_cast(int n, nb_tensor *const *in, void *ctx)
{
    (void)n, (void)ctx;
    return nb_mul(nb_cast(in[0], NB_F64), in[0]);
}

static void kernel_copy(void)
{
    /* values a cast must handle, for floating sources */
    static const double float_edges[] = {0.0, -0.0, 0.5, -0.5, 1.9, -1.9, 2.5, 255.0, 256.0, 300.7, -1.0, -129.0,
                                         1e10, -1e10, 3e9, 1e30, INFINITY, -INFINITY, NAN, 65504.0, 70000.0,
                                         1e300, -1e300, 1e-300, 2147483647.0, 2147483648.0, -2147483649.0};
    static const shape_case shapes[] = {
        {NB_SCALAR, L_CONTIG},         {{1, {7}}, L_STEPPED},      {{2, {17, 23}}, L_CONTIG},
        {{2, {17, 23}}, L_REVERSED},   {{2, {5, 7}}, L_BROADCAST}, {{4, {2, 3, 1, 5}}, L_OFFSET},
        {{1, {1031}}, L_CONTIG},       {{2, {0, 4}}, L_CONTIG},
    };
    for (nb_dtype from = 0; from < NB_DTYPE_COUNT; from++) {
        for (nb_dtype to = 0; to < NB_DTYPE_COUNT; to++) {
            if (!holds(cur, from) || !holds(cur, to))
                continue;
            cast_ctx c = {from, to};
            if (!cur->dev->backend->supports(cur->dev, NB_K_COPY, 0, from)) {
                double one = 1;
                input probe = {from, {1, {1}}, &one, L_CONTIG};
                refusal(P_REFUSE_DEVICE, "cast", from, 1, &probe, apply_cast, &c);
                continue;
            }
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
                case_begin("cast %s to %s %s%s", nb_dtype_name(from), nb_dtype_name(to), shape_str(shapes[s].s),
                           layout_names[shapes[s].lay]);
                double *v = gen(numel(shapes[s].s), from, (range){R_REAL, -300, 300, -300, 300, false});
                input in = {from, shapes[s].s, v, shapes[s].lay};
                run_values(1, &in, apply_cast, ref_cast, &c, to, T_EXACT);
                free(v);
                case_end();
            }
            if (is_float(from)) {
                case_begin("cast %s to %s edge points", nb_dtype_name(from), nb_dtype_name(to));
                double v[sizeof float_edges / sizeof *float_edges];
                memcpy(v, float_edges, sizeof v);
                input in = {from, {1, {(int64_t)(sizeof v / sizeof *v)}}, v, L_CONTIG};
                run_values(1, &in, apply_cast, ref_cast, &c, to, T_EXACT);
                case_end();
            } else if (from != NB_BOOL) {
                /* integers past the destination's range wrap */
                case_begin("cast %s to %s wide integers", nb_dtype_name(from), nb_dtype_name(to));
                double v[6] = {0, -1, 255, 256, -129, 2147483647};
                if (from == NB_U8)
                    v[1] = 1, v[3] = 128, v[4] = 127, v[5] = 200;
                else if (from == NB_I64)
                    v[5] = 1099511627781.0; /* 2^40 + 5 */
                input in = {from, {1, {6}}, v, L_CONTIG};
                run_values(1, &in, apply_cast, ref_cast, &c, to, T_EXACT);
                case_end();
            }
        }
        /* a strided copy in one dtype */
        if (!holds(cur, from) || !cur->dev->backend->supports(cur->dev, NB_K_COPY, 0, from))
            continue;
        case_begin("contiguous %s", nb_dtype_name(from));
        double *v = gen(17 * 23, from, RANGE_DEFAULT);
        input in = {from, {2, {17, 23}}, v, L_REVERSED};
        run_values(1, &in, apply_contiguous, ref_identity, NULL, from, T_EXACT);
        free(v);
        case_end();
    }
    if (holds(cur, NB_F64)) {
        case_begin("cast gradient");
        nb_shape s = NB_SHAPE(3, 4);
        double *v = gen(12, NB_F64, RANGE_DEFAULT);
        run_gradient(1, &s, &v, grad_cast, NULL);
        free(v);
        case_end();
    }
}

/* ================================ matmul ==================================================== */

typedef struct matmul_ctx {
    bool ta, tb; /* gradients: transpose a, b inside fn */
} matmul_ctx;

static nb_tensor *apply_matmul(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const matmul_ctx *c = ctx;
    return nb_matmul(c && c->ta ? nb_transpose(in[0], -1, -2) : in[0],
                     c && c->tb ? nb_transpose(in[1], -1, -2) : in[1]);
}

static double *ref_matmul(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n, (void)ctx;
    nb_shape a = in[0].shape, b = in[1].shape;
    bool va = a.ndim == 1, vb = b.ndim == 1;
    if (va) /* a row */
        a = (nb_shape){2, {1, a.dims[0]}};
    if (vb) /* a column */
        b = (nb_shape){2, {b.dims[0], 1}};
    int64_t M = a.dims[a.ndim - 2], K = a.dims[a.ndim - 1], N = b.dims[b.ndim - 1];
    input ba[2] = {{in[0].dt, {a.ndim - 2, {0}}, NULL, L_CONTIG}, {in[1].dt, {b.ndim - 2, {0}}, NULL, L_CONTIG}};
    memcpy(ba[0].shape.dims, a.dims, sizeof(int64_t) * (size_t)(a.ndim - 2));
    memcpy(ba[1].shape.dims, b.dims, sizeof(int64_t) * (size_t)(b.ndim - 2));
    nb_shape batch = broadcast_shape(2, ba);
    int64_t nbatch = numel(batch), idx[NB_MAX_DIMS] = {0};
    double *w = alloc_values(nbatch * M * N);
    for (int64_t t = 0; t < nbatch; t++) {
        const double *pa = in[0].v + bcast_index(batch, idx, ba[0].shape) * M * K;
        const double *pb = in[1].v + bcast_index(batch, idx, ba[1].shape) * K * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += pa[i * K + k] * pb[k * N + j];
                w[(t * M + i) * N + j] = s;
            }
        next_index(batch, idx);
    }
    nb_shape o = batch;
    if (!va)
        o.dims[o.ndim++] = M;
    if (!vb)
        o.dims[o.ndim++] = N;
    *shape = o;
    return w;
}

static nb_tensor *grad_matmul(int n, nb_tensor *const *in, void *ctx) { return apply_matmul(n, in, ctx); }

static void kernel_matmul(void)
{
    static const struct {
        nb_shape a, b;
        layout la, lb;
    } cases[] = {
        {{2, {33, 65}}, {2, {65, 17}}, L_CONTIG, L_CONTIG},
        {{2, {33, 65}}, {2, {65, 17}}, L_REVERSED, L_CONTIG}, /* transposed operands are used in place */
        {{2, {33, 65}}, {2, {65, 17}}, L_CONTIG, L_REVERSED},
        {{2, {33, 65}}, {2, {65, 17}}, L_REVERSED, L_REVERSED},
        {{1, {65}}, {2, {65, 17}}, L_CONTIG, L_CONTIG},
        {{2, {33, 65}}, {1, {65}}, L_CONTIG, L_STEPPED},
        {{4, {3, 1, 8, 16}}, {3, {5, 16, 4}}, L_CONTIG, L_CONTIG},
        {{3, {5, 8, 16}}, {3, {5, 16, 4}}, L_OFFSET, L_CONTIG},
        {{2, {1, 1}}, {2, {1, 1}}, L_CONTIG, L_CONTIG},
        {{2, {7, 1}}, {2, {1, 7}}, L_CONTIG, L_CONTIG},
        {{2, {3, 0}}, {2, {0, 4}}, L_CONTIG, L_CONTIG}, /* K = 0: zeros */
        {{2, {0, 5}}, {2, {5, 4}}, L_CONTIG, L_CONTIG},
        {{3, {2, 3, 4}}, {1, {4}}, L_CONTIG, L_CONTIG},
        {{1, {4}}, {3, {2, 4, 3}}, L_CONTIG, L_CONTIG},
        {{2, {128, 256}}, {2, {256, 64}}, L_CONTIG, L_CONTIG},
    };
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(FLOATS_MASK, NB_K_MATMUL, 0, dt);
        double v1[2] = {1, 1};
        input probe[2] = {{dt, {2, {1, 1}}, &v1[0], L_CONTIG}, {dt, {2, {1, 1}}, &v1[1], L_CONTIG}};
        if (!refusal(p, "matmul", dt, 2, probe, apply_matmul, NULL))
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            /* layouts are of the logical operand: reversed means a transposed view */
            case_begin("matmul %s %s%s x %s%s", nb_dtype_name(dt), shape_str(cases[s].a), layout_names[cases[s].la],
                       shape_str(cases[s].b), layout_names[cases[s].lb]);
            double *va = gen(numel(cases[s].a), dt, (range){R_REAL, -1, 1, -3, 3, false});
            double *vb = gen(numel(cases[s].b), dt, (range){R_REAL, -1, 1, -3, 3, false});
            input in[2] = {{dt, cases[s].a, va, cases[s].la}, {dt, cases[s].b, vb, cases[s].lb}};
            run_values(2, in, apply_matmul, ref_matmul, NULL, dt, T_ACC);
            free(va);
            free(vb);
            case_end();
        }
        /* NaN propagates where it enters; inf * 0 is NaN */
        case_begin("matmul %s edge points", nb_dtype_name(dt));
        double va[12] = {NAN, 1, 2, 3, 1, INFINITY, 0, 1, -1, 2, 0.5, -INFINITY};
        double vb[8] = {1, 0, 2, 1, 0, 1, -1, 0};
        input in[2] = {{dt, {2, {3, 4}}, va, L_CONTIG}, {dt, {2, {4, 2}}, vb, L_CONTIG}};
        run_values(2, in, apply_matmul, ref_matmul, NULL, dt, T_ACC);
        case_end();
    }
    if (!holds(cur, NB_F64))
        return;
    /* gradients: plain, batched with broadcasting, transposed operands, vectors */
    static const struct {
        nb_shape a, b;
        bool ta, tb;
    } mm[] = {
        {{2, {3, 4}}, {2, {4, 2}}, false, false},
        {{4, {2, 1, 3, 4}}, {3, {3, 4, 2}}, false, false},
        {{4, {2, 1, 4, 3}}, {3, {3, 4, 2}}, true, false},
        {{3, {2, 3, 4}}, {3, {2, 2, 4}}, false, true},
        {{1, {4}}, {3, {2, 4, 3}}, false, false},
        {{3, {2, 3, 4}}, {1, {4}}, false, false},
    };
    for (size_t i = 0; i < sizeof mm / sizeof *mm; i++) {
        matmul_ctx c = {mm[i].ta, mm[i].tb};
        case_begin("matmul gradient %s%s x %s%s", shape_str(mm[i].a), c.ta ? "^T" : "", shape_str(mm[i].b),
                   c.tb ? "^T" : "");
        nb_shape s[2] = {mm[i].a, mm[i].b};
        double *v[2] = {gen(numel(s[0]), NB_F64, (range){R_REAL, -1, 1, 0, 0, false}),
                        gen(numel(s[1]), NB_F64, (range){R_REAL, -1, 1, 0, 0, false})};
        run_gradient(2, s, v, grad_matmul, &c);
        free(v[0]);
        free(v[1]);
        case_end();
    }
}

/* ================================ softmax =================================================== */

typedef struct softmax_ctx {
    bool log;
    int axis;
    bool reversed;
} softmax_ctx;

static nb_tensor *apply_softmax(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const softmax_ctx *c = ctx;
    const nb_tensor *x = c->reversed ? nb_transpose(in[0], 0, -1) : in[0];
    return c->log ? nb_log_softmax(x, c->axis) : nb_softmax(x, c->axis);
}
static nb_tensor *grad_softmax(int n, nb_tensor *const *in, void *ctx) { return apply_softmax(n, in, ctx); }

/* Softmax of a row holding +inf (or NaN), or only -inf, is NaN. */
static void softmax_row(double *x, int64_t n, int64_t stride, bool lg)
{
    double m = -INFINITY;
    bool bad = n > 0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i * stride];
        if (isnan(v) || v == INFINITY)
            m = NAN;
        else if (!isnan(m) && v > m)
            m = v;
        if (v != -INFINITY)
            bad = false;
    }
    if (isnan(m))
        bad = true;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += exp(x[i * stride] - m);
    for (int64_t i = 0; i < n; i++) {
        double d = x[i * stride] - m;
        x[i * stride] = bad ? NAN : lg ? d - log(s) : exp(d) / s;
    }
}

static double *ref_softmax(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const softmax_ctx *c = ctx;
    nb_shape s = in[0].shape;
    int axis = c->axis < 0 ? c->axis + s.ndim : c->axis;
    int64_t k = numel(s), len = s.dims[axis], inner = 1;
    for (int i = axis + 1; i < s.ndim; i++)
        inner *= s.dims[i];
    double *w = alloc_values(k);
    memcpy(w, in[0].v, sizeof(double) * (size_t)k);
    for (int64_t o = 0; len > 0 && o < k / len / inner; o++)
        for (int64_t i = 0; i < inner; i++)
            softmax_row(w + o * len * inner + i, len, inner, c->log);
    *shape = s;
    return w;
}

static void kernel_softmax(void)
{
    static const struct {
        nb_shape s;
        layout lay;
        int axis;
    } cases[] = {
        {{2, {37, 50}}, L_CONTIG, -1}, {{2, {37, 50}}, L_CONTIG, 0},     {{2, {3, 3000}}, L_CONTIG, 1},
        {{3, {2, 3, 4}}, L_CONTIG, -1}, {{3, {2, 3, 4}}, L_CONTIG, 0},  {{3, {2, 3, 4}}, L_CONTIG, 1},
        {{1, {7}}, L_STEPPED, 0},       {{2, {5, 3}}, L_REVERSED, -1},  {{2, {33, 1}}, L_CONTIG, -1},
        {{2, {5, 7}}, L_BROADCAST, 0},  {{2, {0, 5}}, L_CONTIG, -1},    {{1, {1031}}, L_OFFSET, 0},
    };
    for (int lg = 0; lg < 2; lg++) {
        const char *name = lg ? "log_softmax" : "softmax";
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            plan p = plan_for(FLOATS_MASK, NB_K_SOFTMAX, 0, dt);
            softmax_ctx c0 = {lg, -1, false};
            double one = 1;
            input probe = {dt, {1, {1}}, &one, L_CONTIG};
            if (!refusal(p, name, dt, 1, &probe, apply_softmax, &c0))
                continue;
            for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
                softmax_ctx c = {lg, cases[s].axis, false};
                case_begin("%s %s %s%s axis %d", name, nb_dtype_name(dt), shape_str(cases[s].s),
                           layout_names[cases[s].lay], c.axis);
                double *v = gen(numel(cases[s].s), dt, (range){R_REAL, -6, 6, 0, 0, false});
                input in = {dt, cases[s].s, v, cases[s].lay};
                run_values(1, &in, apply_softmax, ref_softmax, &c, dt, T_ELEM);
                free(v);
                case_end();
            }
            /* rows of edge points */
            static const double rows[6][3] = {{INFINITY, 1, 2},          {-INFINITY, -INFINITY, -INFINITY},
                                              {-INFINITY, 0, 1},         {NAN, 1, 2},
                                              {1000, 1000, -1000},       {0, -0.0, 0}};
            softmax_ctx c = {lg, -1, false};
            case_begin("%s %s edge rows", name, nb_dtype_name(dt));
            double v[18];
            memcpy(v, rows, sizeof v);
            input in = {dt, {2, {6, 3}}, v, L_CONTIG};
            run_values(1, &in, apply_softmax, ref_softmax, &c, dt, T_ELEM);
            case_end();
        }
        if (!holds(cur, NB_F64))
            continue;
        const int axes[] = {-1, 0, 1};
        for (int a = 0; a < 4; a++) {
            softmax_ctx c = {lg, a < 3 ? axes[a] : -1, a == 3};
            nb_shape s = a < 3 ? NB_SHAPE(2, 3, 4) : NB_SHAPE(5, 3);
            case_begin("%s gradient %s axis %d%s", name, shape_str(s), c.axis, c.reversed ? " strided" : "");
            double *v = gen(numel(s), NB_F64, (range){R_REAL, -3, 3, 0, 0, false});
            run_gradient(1, &s, &v, grad_softmax, &c);
            free(v);
            case_end();
        }
    }
}

/* ================================ gather and scatter_add ==================================== */

static nb_tensor *apply_gather(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n, (void)ctx;
    return nb_gather(in[0], in[1]);
}

static double *ref_gather(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n, (void)ctx;
    nb_shape p = in[0].shape, o = in[1].shape;
    int64_t row = p.dims[0] ? numel(p) / p.dims[0] : 0, k = numel(o);
    for (int i = 1; i < p.ndim; i++)
        o.dims[o.ndim++] = p.dims[i];
    double *w = alloc_values(k * row);
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < row; j++)
            w[i * row + j] = in[0].v[(int64_t)in[1].v[i] * row + j];
    *shape = o;
    return w;
}

typedef struct scatter_ctx {
    nb_shape out; /* [R, ...] */
} scatter_ctx;

static nb_tensor *apply_scatter(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const scatter_ctx *c = ctx;
    return nb__scatter_add(in[0], in[1], c->out.ndim, c->out.dims);
}

static double *ref_scatter(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const scatter_ctx *c = ctx;
    int64_t total = numel(c->out), row = c->out.dims[0] ? total / c->out.dims[0] : 0, k = numel(in[0].shape);
    double *w = alloc_values(total);
    for (int64_t i = 0; i < total; i++)
        w[i] = 0;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < row; j++)
            w[(int64_t)in[0].v[i] * row + j] += in[1].v[i * row + j];
    for (int64_t i = 0; i < total; i++)
        w[i] = wrap_int(in[1].dt, w[i]);
    *shape = c->out;
    return w;
}

typedef struct gather_grad_ctx {
    const nb_tensor *idx; /* on the CPU */
    bool reversed;        /* params transposed inside fn */
} gather_grad_ctx;

static nb_tensor *grad_gather(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const gather_grad_ctx *c = ctx;
    return nb_square(nb_gather(c->reversed ? nb_transpose(in[0], 0, 1) : in[0],
                               nb_to_device((nb_tensor *)c->idx, nb_tensor_device(in[0]))));
}

static nb_tensor *grad_scatter(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const nb_tensor *idx = ctx;
    return nb_sin(nb__scatter_add(nb_to_device((nb_tensor *)idx, nb_tensor_device(in[0])), in[0], 2,
                                  (int64_t[]){5, 3}));
}

static const struct index_case {
    nb_shape params, idx;
    layout lp;
    int n;
    int64_t v[8];
} index_cases[] = {
    {{2, {50, 7}}, {2, {2, 3}}, L_CONTIG, 6, {0, 49, 3, 3, 17, 20}},
    {{2, {50, 7}}, {1, {6}}, L_REVERSED, 6, {5, 5, 0, 49, 1, 2}},
    {{3, {50, 3, 5}}, {2, {2, 3}}, L_CONTIG, 6, {0, 49, 3, 3, 17, 20}},
    {{1, {5}}, NB_SCALAR, L_CONTIG, 1, {4}},
    {{2, {5, 3}}, {1, {0}}, L_CONTIG, 0, {0}},
    {{2, {4, 33}}, {1, {7}}, L_OFFSET, 7, {3, 0, 3, 3, 1, 2, 0}},
    {{2, {1031, 1}}, {1, {3}}, L_STEPPED, 3, {1030, 0, 515}},
};

static void kernel_gather(void)
{
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        for (nb_dtype it = NB_I32; it <= NB_I64; it++) {
            plan p = plan_for(NUMERIC_MASK, NB_K_GATHER, 0, dt);
            double one = 1, zero = 0;
            input probe[2] = {{dt, {1, {1}}, &one, L_CONTIG}, {it, {1, {1}}, &zero, L_CONTIG}};
            if (!refusal(p, "gather", dt, 2, probe, apply_gather, NULL))
                continue;
            for (size_t s = 0; s < sizeof index_cases / sizeof *index_cases; s++) {
                const struct index_case *ic = &index_cases[s];
                case_begin("gather %s params %s%s, %s indices %s", nb_dtype_name(dt), shape_str(ic->params),
                           layout_names[ic->lp], nb_dtype_name(it), shape_str(ic->idx));
                double *vp = gen(numel(ic->params), dt, RANGE_DEFAULT), vi[8];
                for (int i = 0; i < ic->n; i++)
                    vi[i] = (double)ic->v[i];
                input in[2] = {{dt, ic->params, vp, ic->lp}, {it, ic->idx, vi, L_CONTIG}};
                run_values(2, in, apply_gather, ref_gather, NULL, dt, T_EXACT);
                free(vp);
                case_end();
            }
            /* an index out of range is refused (by the op, or by the next
             * synchronising call where the device queues the check); the
             * device carries on */
            case_begin("gather %s %s index out of range", nb_dtype_name(dt), nb_dtype_name(it));
            double *vp = gen(50 * 7, dt, RANGE_DEFAULT), bad[2] = {0, 50}, neg[2] = {-1, 2}, good[2] = {49, 1};
            input in[2] = {{dt, {2, {50, 7}}, vp, L_CONTIG}, {it, {1, {2}}, bad, L_CONTIG}};
            deferred_ok = true;
            run_refused(2, in, apply_gather, NULL, NB_ERR_INVALID_ARGUMENT, NB_ERR_INVALID_ARGUMENT);
            in[1].v = neg;
            run_refused(2, in, apply_gather, NULL, NB_ERR_INVALID_ARGUMENT, NB_ERR_INVALID_ARGUMENT);
            deferred_ok = false;
            in[1].v = good;
            run_values(2, in, apply_gather, ref_gather, NULL, dt, T_EXACT);
            free(vp);
            case_end();
        }
    }
    if (!holds(cur, NB_F64))
        return;
    /* repeated indices: the gradient (scatter_add) accumulates */
    const int64_t i64[6] = {0, 4, 2, 2, 1, 4};
    const int32_t i32[5] = {3, 3, 3, 0, 2};
    for (int k = 0; k < 3; k++) {
        case_begin("gather gradient %s%s", k ? "i32" : "i64", k == 2 ? " strided" : "");
        nb_shape s = k == 2 ? NB_SHAPE(3, 5) : NB_SHAPE(5, 3);
        double *v = gen(15, NB_F64, RANGE_DEFAULT);
        gather_grad_ctx c = {k ? nb_from_buffer(NB_I32, NB_SHAPE(5), i32) : nb_from_buffer(NB_I64, NB_SHAPE(2, 3), i64),
                             k == 2};
        run_gradient(1, &s, &v, grad_gather, &c);
        free(v);
        case_end();
    }
}

static void kernel_scatter_add(void)
{
    static const struct {
        nb_shape out, idx;
        int n;
        int64_t v[8];
    } cases[] = {
        {{2, {5, 3}}, {1, {6}}, 6, {0, 4, 2, 2, 1, 4}},
        {{3, {4, 2, 3}}, {2, {2, 3}}, 6, {3, 3, 3, 0, 1, 3}},
        {{1, {7}}, {1, {7}}, 7, {6, 5, 4, 3, 2, 1, 0}},
        {{2, {3, 33}}, {1, {0}}, 0, {0}},
        {{2, {1, 1031}}, {1, {4}}, 4, {0, 0, 0, 0}},
    };
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        for (nb_dtype it = NB_I32; it <= NB_I64; it++) {
            plan p = plan_for(NUMERIC_MASK, NB_K_SCATTER_ADD, 0, dt);
            scatter_ctx c0 = {{1, {1}}};
            double zero = 0, one = 1;
            input probe[2] = {{it, {1, {1}}, &zero, L_CONTIG}, {dt, {1, {1}}, &one, L_CONTIG}};
            if (!refusal(p, "scatter_add", dt, 2, probe, apply_scatter, &c0))
                continue;
            for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
                scatter_ctx c = {cases[s].out};
                nb_shape us = cases[s].idx;
                for (int i = 1; i < c.out.ndim; i++)
                    us.dims[us.ndim++] = c.out.dims[i];
                case_begin("scatter_add %s into %s, %s indices %s", nb_dtype_name(dt), shape_str(c.out),
                           nb_dtype_name(it), shape_str(cases[s].idx));
                double vi[8], *vu = gen(numel(us), dt, (range){R_GRID, -3, 3, -5, 5, false});
                for (int i = 0; i < cases[s].n; i++)
                    vi[i] = (double)cases[s].v[i];
                input in[2] = {{it, cases[s].idx, vi, L_CONTIG}, {dt, us, vu, s == 1 ? L_REVERSED : L_CONTIG}};
                run_values(2, in, apply_scatter, ref_scatter, &c, dt, T_ACC);
                free(vu);
                case_end();
            }
        }
    }
    if (!holds(cur, NB_F64))
        return;
    const int64_t i64[4] = {0, 4, 2, 4};
    case_begin("scatter_add gradient");
    nb_shape s = NB_SHAPE(4, 3);
    double *v = gen(12, NB_F64, RANGE_DEFAULT);
    run_gradient(1, &s, &v, grad_scatter, nb_from_buffer(NB_I64, NB_SHAPE(4), i64));
    free(v);
    case_end();
}

/* ================================ one_hot =================================================== */

typedef struct one_hot_ctx {
    int64_t depth;
    nb_dtype dt;
} one_hot_ctx;

static nb_tensor *apply_one_hot(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const one_hot_ctx *c = ctx;
    return nb_one_hot(in[0], c->depth, here(c->dt));
}

static double *ref_one_hot(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const one_hot_ctx *c = ctx;
    int64_t k = numel(in[0].shape);
    double *w = alloc_values(k * c->depth);
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < c->depth; j++)
            w[i * c->depth + j] = in[0].v[i] == (double)j;
    *shape = in[0].shape;
    shape->dims[shape->ndim++] = c->depth;
    return w;
}

static void kernel_one_hot(void)
{
    static const struct {
        nb_shape s;
        layout lay;
        int64_t depth;
        int n;
        int64_t v[8];
    } cases[] = {
        {{1, {6}}, L_CONTIG, 10, 6, {0, 3, 9, 2, 11, -1}}, /* out of range: a row of zeros */
        {{2, {2, 3}}, L_REVERSED, 50, 6, {5, 5, 0, 49, 1, 2}},
        {NB_SCALAR, L_CONTIG, 4, 1, {3}},
        {{1, {0}}, L_CONTIG, 3, 0, {0}},
        {{1, {7}}, L_STEPPED, 1, 7, {0, 0, 1, 0, -5, 0, 0}},
    };
    for (nb_dtype it = 0; it < NB_DTYPE_COUNT; it++) {
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            if (!computes(cur, NB_K_ONE_HOT, dt))
                continue;
            plan p = plan_for(NB_MASK(NB_I32) | NB_MASK(NB_I64), NB_K_ONE_HOT, 0, it);
            one_hot_ctx c0 = {3, dt};
            double one = 1;
            input probe = {it, {1, {1}}, &one, L_CONTIG};
            if (!refusal(p, "one_hot indices", it, 1, &probe, apply_one_hot, &c0))
                continue;
            for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
                one_hot_ctx c = {cases[s].depth, dt};
                case_begin("one_hot %s indices %s%s depth %lld to %s", nb_dtype_name(it), shape_str(cases[s].s),
                           layout_names[cases[s].lay], (long long)c.depth, nb_dtype_name(dt));
                double v[8];
                for (int i = 0; i < cases[s].n; i++)
                    v[i] = (double)cases[s].v[i];
                input in = {it, cases[s].s, v, cases[s].lay};
                run_values(1, &in, apply_one_hot, ref_one_hot, &c, dt, T_EXACT);
                case_end();
            }
        }
    }
}

/* ================================ labels: check_indices ===================================== */

static nb_tensor *apply_sparse_ce(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n, (void)ctx;
    return nb_sparse_softmax_cross_entropy(in[0], in[1]);
}

/* loss_i = logsumexp(logits_i) - logits_i[label_i] */
static double *ref_sparse_ce(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n, (void)ctx;
    int64_t N = in[0].shape.dims[0], C = in[0].shape.dims[1];
    double *w = alloc_values(N);
    for (int64_t i = 0; i < N; i++) {
        const double *row = in[0].v + i * C;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < C; j++)
            s += exp(row[j] - m);
        w[i] = m + log(s) - row[(int64_t)in[1].v[i]];
    }
    *shape = (nb_shape){1, {N}};
    return w;
}

static void kernel_check_indices(void)
{
    static const struct {
        nb_shape s;
        int64_t limit;
        int n;
        int64_t v[8];
        int bad; /* the position of the first bad index, -1 for none */
    } cases[] = {
        {{1, {6}}, 10, 6, {0, 9, 3, 3, 1, 2}, -1},
        {{2, {2, 3}}, 5, 6, {4, 4, 0, 1, 2, 3}, -1},
        {NB_SCALAR, 1, 1, {0}, -1},
        {{1, {0}}, 3, 0, {0}, -1},
        {{1, {6}}, 10, 6, {0, 9, 3, 10, 1, 2}, 3},
        {{1, {5}}, 4, 5, {0, 1, 2, 3, -1}, 4},
        {{2, {2, 2}}, 7, 4, {-7, 0, 0, 0}, 0},
    };
    for (nb_dtype it = NB_I32; it <= NB_I64; it++) {
        if (plan_for(NB_MASK(NB_I32) | NB_MASK(NB_I64), NB_K_CHECK_INDICES, 0, it) != P_RUN)
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            case_begin("check_indices %s %s below %lld%s", nb_dtype_name(it), shape_str(cases[s].s),
                       (long long)cases[s].limit, cases[s].bad >= 0 ? " (one out of range)" : "");
            double v[8];
            for (int i = 0; i < cases[s].n; i++)
                v[i] = (double)cases[s].v[i];
            nb_tensor *t = make_input(cur->name, it, cases[s].s, v, L_CONTIG);
            CHECK(t != NULL);
            if (t) {
                nb_view vi = nb__view(t);
                nb_status st = cur->dev->backend->check_indices(cur->dev, "check_indices", &vi, cases[s].limit);
                if (st == NB_OK)
                    st = nb_synchronize(); /* where the device queued the check */
                if (cases[s].bad < 0) {
                    CHECK_OK(st);
                } else {
                    char value[32];
                    snprintf(value, sizeof value, "%lld", (long long)cases[s].v[cases[s].bad]);
                    CHECK(st == NB_ERR_INVALID_ARGUMENT);
                    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "check_indices", value);
                }
            }
            case_end();
        }
        /* sparse_softmax_cross_entropy checks its labels with it */
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            if (plan_for(FLOATS_MASK, NB_K_SOFTMAX, 0, dt) != P_RUN)
                continue;
            for (int bad = 0; bad < 2; bad++) {
                case_begin("sparse_softmax_cross_entropy %s logits, %s labels%s", nb_dtype_name(dt), nb_dtype_name(it),
                           bad ? " out of range" : "");
                double *vl = gen(7 * 5, dt, RANGE_DEFAULT), labels[7] = {0, 4, 2, 2, 1, 3, 0};
                if (bad)
                    labels[5] = 5;
                input in[2] = {{dt, {2, {7, 5}}, vl, L_CONTIG}, {it, {1, {7}}, labels, L_CONTIG}};
                if (bad) {
                    deferred_ok = true;
                    run_refused(2, in, apply_sparse_ce, NULL, NB_ERR_INVALID_ARGUMENT, NB_ERR_INVALID_ARGUMENT);
                    deferred_ok = false;
                } else {
                    run_values(2, in, apply_sparse_ce, ref_sparse_ce, NULL, dt, T_ACC);
                }
                free(vl);
                case_end();
            }
        }
    }
}

/* ================================ sparse softmax cross-entropy rows ========================= */

/* The op runs on the row kernels wherever the device has them; these cases
 * run it on rows short and long (one warp and one block per row on a GPU),
 * edge rows and labels of both integer dtypes, its values against the
 * reference (the CPU's against the double one, a GPU's against the CPU's), its
 * gradient for a weighted loss likewise, and the gradient checker in f64. */
static const struct {
    nb_shape s;
} xent_cases[] = {{{2, {7, 5}}}, {{2, {33, 1}}}, {{2, {64, 10}}}, {{2, {3, 3000}}}, {{2, {1000, 17}}}, {{2, {5, 1031}}}};

static void xent_labels(double *lab, int64_t N, int64_t C)
{
    for (int64_t i = 0; i < N; i++)
        lab[i] = (double)(rng_u64() % (uint64_t)C);
}

/* in: logits, labels, weights w [N]: the gradient of sum(loss * w) for the logits. */
static nb_tensor *apply_xent_grad(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n, (void)ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *g = NULL;
    if (nb_tape_watch(tape, in[0]) != NB_OK)
        return NULL;
    nb_tensor *loss = nb_sparse_softmax_cross_entropy(in[0], in[1]);
    nb_status st = nb_tape_gradient(tape, nb_sum_all(nb_mul(loss, in[2])), 1, &in[0], &g);
    nb_tape_free(tape);
    return st ? NULL : g;
}

/* (softmax(x) - onehot(label)) w per row */
static double *ref_xent_grad(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    double *w = ref_softmax(1, in, &(softmax_ctx){false, -1, false}, shape);
    int64_t N = in[0].shape.dims[0], C = in[0].shape.dims[1];
    for (int64_t i = 0; w && i < N; i++)
        for (int64_t j = 0; j < C; j++)
            w[i * C + j] = (w[i * C + j] - (j == (int64_t)in[1].v[i])) * in[2].v[i];
    (void)ctx;
    return w;
}

typedef struct xent_gc {
    nb_tensor *labels; /* on /cpu:0 */
} xent_gc;

static nb_tensor *grad_xent(int n, nb_tensor *const *in, void *ctx)
{
    (void)n;
    const xent_gc *c = ctx;
    return nb_sparse_softmax_cross_entropy(in[0], nb_to_device(c->labels, nb_tensor_device(in[0])));
}

static void run_xent_kernel(bool grad)
{
    const char *name = grad ? "sparse_softmax_cross_entropy gradient" : "sparse_softmax_cross_entropy";
    for (nb_dtype it = NB_I32; it <= NB_I64; it++)
        for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            if (plan_for(FLOATS_MASK, grad ? NB_K_SOFTMAX_XENT_GRAD : NB_K_SOFTMAX_XENT, 0, dt) != P_RUN)
                continue;
            for (size_t s = 0; s < sizeof xent_cases / sizeof *xent_cases; s++) {
                nb_shape sh = xent_cases[s].s;
                int64_t N = sh.dims[0], C = sh.dims[1];
                case_begin("%s %s logits %s, %s labels", name, nb_dtype_name(dt), shape_str(sh), nb_dtype_name(it));
                double *vx = gen(N * C, dt, (range){R_REAL, -6, 6, 0, 0, false}), *vl = alloc_values(N),
                       *vw = gen(N, dt, (range){R_REAL, 0.5, 1.5, 0, 0, false});
                xent_labels(vl, N, C);
                input in[3] = {{dt, sh, vx, L_CONTIG}, {it, {1, {N}}, vl, L_CONTIG}, {dt, {1, {N}}, vw, L_CONTIG}};
                if (grad)
                    run_values(3, in, apply_xent_grad, ref_xent_grad, NULL, dt, T_ACC);
                else
                    run_values(2, in, apply_sparse_ce, ref_sparse_ce, NULL, dt, T_ACC);
                free(vx), free(vl), free(vw);
                case_end();
            }
            /* edge rows: +inf (NaN), all -inf (NaN), -inf at the label (+inf)
             * and elsewhere (finite), NaN, large equal values, signed zeros */
            static const double rows[7][3] = {{INFINITY, 1, 2},    {-INFINITY, -INFINITY, -INFINITY},
                                              {-INFINITY, 0, 1},   {0, -INFINITY, 1},
                                              {NAN, 1, 2},         {1000, 1000, -1000},
                                              {0, -0.0, 0}};
            double v[21], lab[7] = {1, 0, 0, 2, 1, 0, 1}, w[7] = {1, 0.5, 2, 1, 1, 0.75, 1.25};
            memcpy(v, rows, sizeof v);
            case_begin("%s %s edge rows, %s labels", name, nb_dtype_name(dt), nb_dtype_name(it));
            input in[3] = {{dt, {2, {7, 3}}, v, L_CONTIG}, {it, {1, {7}}, lab, L_CONTIG}, {dt, {1, {7}}, w, L_CONTIG}};
            if (grad)
                run_values(3, in, apply_xent_grad, ref_xent_grad, NULL, dt, T_ACC);
            else
                run_values(2, in, apply_sparse_ce, ref_sparse_ce, NULL, dt, T_ACC);
            case_end();
        }
    if (!grad || !holds(cur, NB_F64))
        return;
    const nb_shape shapes[3] = {NB_SHAPE(4, 3), NB_SHAPE(9, 1), NB_SHAPE(6, 40)};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s].dims[0], C = shapes[s].dims[1];
        case_begin("%s gradient check %s", name, shape_str(shapes[s]));
        double *vl = alloc_values(N), *vx = gen(N * C, NB_F64, (range){R_REAL, -3, 3, 0, 0, false});
        xent_labels(vl, N, C);
        xent_gc c = {make_input(CPU, NB_I64, (nb_shape){1, {N}}, vl, L_CONTIG)};
        CHECK(c.labels != NULL);
        if (c.labels)
            run_gradient(1, &shapes[s], &vx, grad_xent, &c);
        free(vl), free(vx);
        case_end();
    }
}

static void kernel_softmax_xent(void) { run_xent_kernel(false); }
static void kernel_softmax_xent_grad(void) { run_xent_kernel(true); }

/* ================================ cumsum ==================================================== */

/* No public op yet: the kernel entry itself, on a fresh output. */
typedef struct cumsum_ctx {
    int axis;
    bool exclusive, reverse;
} cumsum_ctx;

static nb_tensor *apply_cumsum(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const cumsum_ctx *c = ctx;
    const nb_tensor *x = in[0];
    nb_tensor *out = nb__tensor_new("cumsum", x->device, x->dtype, x->ndim, x->shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(x);
    return nb__own(nb__kernel_done(x->device->backend->cumsum(x->device, &vo, &vx, c->axis, c->exclusive, c->reverse),
                                   out));
}

static double *ref_cumsum(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const cumsum_ctx *c = ctx;
    nb_shape s = in[0].shape;
    int64_t k = numel(s), len = s.dims[c->axis], inner = 1;
    for (int i = c->axis + 1; i < s.ndim; i++)
        inner *= s.dims[i];
    double *w = alloc_values(k);
    for (int64_t o = 0; len > 0 && o < k / len / inner; o++)
        for (int64_t i = 0; i < inner; i++) {
            double acc = 0;
            for (int64_t j = 0; j < len; j++) {
                int64_t jj = c->reverse ? len - 1 - j : j, p = (o * len + jj) * inner + i;
                if (c->exclusive) {
                    w[p] = acc;
                    acc += in[0].v[p];
                } else {
                    acc += in[0].v[p];
                    w[p] = acc;
                }
            }
        }
    for (int64_t i = 0; i < k; i++)
        w[i] = wrap_int(in[0].dt, w[i]);
    *shape = s;
    return w;
}

static void kernel_cumsum(void)
{
    static const struct {
        nb_shape s;
        layout lay;
        int axis;
    } cases[] = {
        {{1, {7}}, L_CONTIG, 0},       {{2, {3, 11}}, L_CONTIG, 1},   {{2, {3, 11}}, L_REVERSED, 0},
        {{3, {2, 3, 5}}, L_OFFSET, 1}, {{1, {1031}}, L_STEPPED, 0},   {{2, {0, 4}}, L_CONTIG, 0},
        {{2, {5, 7}}, L_BROADCAST, 0}, {{2, {2, 4099}}, L_CONTIG, 1},
    };
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(NUMERIC_MASK, NB_K_CUMSUM, 0, dt);
        cumsum_ctx c0 = {0, false, false};
        double one = 1;
        input probe = {dt, {1, {1}}, &one, L_CONTIG};
        if (!refusal(p, "cumsum", dt, 1, &probe, apply_cumsum, &c0))
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            double *v = gen(numel(cases[s].s), dt, (range){R_GRID, -3, 3, -5, 5, false});
            for (int mode = 0; mode < 4; mode++) {
                cumsum_ctx c = {cases[s].axis, mode & 1, mode & 2};
                case_begin("cumsum kernel %s %s%s axis %d%s%s", nb_dtype_name(dt), shape_str(cases[s].s),
                           layout_names[cases[s].lay], c.axis, c.exclusive ? " exclusive" : "",
                           c.reverse ? " reverse" : "");
                input in = {dt, cases[s].s, v, cases[s].lay};
                run_values(1, &in, apply_cumsum, ref_cumsum, &c, dt, T_ACC);
                case_end();
            }
            free(v);
        }
    }
}

/* ================================ creation ================================================== */

/* fill (nb_full, nb_zeros, nb_ones) and arange: every element against its
 * formula; on a device, against /cpu:0. */
static void check_created(nb_tensor *t, nb_tensor *c, nb_dtype dt, nb_shape s, double (*f)(int64_t i, const void *ctx),
                          const void *ctx)
{
    CHECKF(t && strcmp(nb_tensor_device(t), cur->name) == 0, "made on %s", t ? nb_tensor_device(t) : "nothing");
    CHECKF(t && nb_tensor_dtype(t) == dt && same_shape(nb_tensor_shape(t), s), "dtype or shape");
    if (!t || !same_shape(nb_tensor_shape(t), s))
        return;
    double *got = values_of(t), *want = alloc_values(numel(s));
    for (int64_t i = 0; i < numel(s); i++)
        want[i] = f(i, ctx);
    if (c) {
        double *cv = values_of(c);
        for (int64_t i = 0; cv && i < numel(s); i++)
            want[i] = stored(dt, cv[i]);
        free(cv);
    }
    CHECK(got && values_match(got, want, numel(s), tol_for(dt, T_EXACT), "value"));
    free(got);
    free(want);
}

typedef struct fill_ctx {
    nb_dtype dt;
    double value;
} fill_ctx;
static double fill_at(int64_t i, const void *ctx)
{
    (void)i;
    const fill_ctx *c = ctx;
    return cast_ref(c->value, NB_F64, c->dt);
}

typedef struct arange_ctx {
    nb_dtype dt;
    double start, step;
} arange_ctx;
static double arange_at(int64_t i, const void *ctx)
{
    const arange_ctx *c = ctx;
    return stored(c->dt, c->start + (double)i * c->step);
}

static void kernel_fill(void)
{
    static const nb_shape shapes[] = {{2, {3, 1000}}, {1, {77}}, NB_SCALAR, {2, {0, 3}}, {4, {2, 3, 1, 5}}};
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        if (!holds(cur, dt))
            continue;
        const double values[] = {is_float(dt) ? 2.5 : 3.0, 0.0, 1.0, is_float(dt) ? -INFINITY : 7.0};
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            for (int k = 0; k < 4; k++) {
                fill_ctx c = {dt, values[k]};
                case_begin("fill %s %s with %g", nb_dtype_name(dt), shape_str(shapes[s]), c.value);
                CHECK_OK(nb_device_push(cur->name));
                nb_tensor *t = k == 1 ? nb_zeros(dt, shapes[s]) : k == 2 ? nb_ones(dt, shapes[s])
                                                                         : nb_full(dt, shapes[s], c.value);
                CHECK_OK(nb_device_pop());
                nb_tensor *cpu = reference_mode ? NULL : nb_full(twin(dt), shapes[s], c.value);
                check_created(t, cpu, dt, shapes[s], fill_at, &c);
                case_end();
            }
        }
        /* a strided fill: the poisoned output of a view op is the fill kernel on a
         * fresh tensor, so fill through nb_pad's border instead */
        if (!(NUMERIC_MASK & NB_MASK(dt)))
            continue;
        case_begin("fill %s pad border", nb_dtype_name(dt));
        CHECK_OK(nb_device_push(cur->name));
        nb_tensor *t = nb_pad(nb_ones(dt, NB_SHAPE(2, 3)), NB_SHAPE(1, 0), NB_SHAPE(0, 2), 4.0);
        CHECK_OK(nb_device_pop());
        static const double want[] = {4, 4, 4, 4, 4, 1, 1, 1, 4, 4, 1, 1, 1, 4, 4};
        double *got = values_of(t);
        CHECK(t && nb_tensor_numel(t) == 15 && got && values_match(got, want, 15, 0, "value"));
        free(got);
        case_end();
    }
}

static void kernel_arange(void)
{
    static const struct {
        double start, stop, step;
    } cases[] = {{-3.0, 7.0, 0.25}, {0, 100000, 3}, {10, -10, -1.5}, {0, 1, 1}, {5, 5, 1}, {0, 1031, 1}};
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        if (!computes(cur, NB_K_ARANGE, dt) || !(NUMERIC_MASK & NB_MASK(dt)))
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            if (!is_float(dt) && cases[s].step != floor(cases[s].step))
                continue;
            if (dt == NB_F16 && fabs(cases[s].stop) > 2048)
                continue; /* not representable */
            arange_ctx c = {dt, cases[s].start, cases[s].step};
            int64_t n = (int64_t)ceil((cases[s].stop - cases[s].start) / cases[s].step);
            nb_shape sh = {1, {n > 0 ? n : 0}};
            case_begin("arange %s %g to %g step %g", nb_dtype_name(dt), cases[s].start, cases[s].stop, cases[s].step);
            CHECK_OK(nb_device_push(cur->name));
            nb_tensor *t = nb_arange(dt, cases[s].start, cases[s].stop, cases[s].step);
            CHECK_OK(nb_device_pop());
            nb_tensor *cpu = reference_mode ? NULL : nb_arange(twin(dt), cases[s].start, cases[s].stop, cases[s].step);
            check_created(t, cpu, dt, sh, arange_at, &c);
            case_end();
        }
    }
}

/* Random tensors: shape, determinism (same seed same values, element i depends
 * only on (seed, i)), ranges; refused for non-floating dtypes. */
static void kernel_random(void)
{
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        if (!computes(cur, NB_K_RANDOM, dt))
            continue;
        for (int dist = 0; dist < 3; dist++) {
            const char *name = dist == 0 ? "random_normal" : dist == 1 ? "random_uniform" : "truncated_normal";
            case_begin("%s %s", name, nb_dtype_name(dt));
            CHECK_OK(nb_device_push(cur->name));
            nb_tensor *t[4];
            const nb_shape shapes[4] = {{2, {33, 31}}, {2, {33, 31}}, {2, {33, 31}}, {1, {1000}}};
            const uint64_t seeds[4] = {42, 42, 43, 42};
            for (int k = 0; k < 4; k++)
                t[k] = dist == 0   ? nb_random_normal(dt, shapes[k], 2.0, 3.0, seeds[k])
                       : dist == 1 ? nb_random_uniform(dt, shapes[k], -1.0, 4.0, seeds[k])
                                   : nb_truncated_normal(dt, shapes[k], 0.5, 2.0, seeds[k]);
            CHECK_OK(nb_device_pop());
            if (!is_float(dt)) {
                CHECK(t[0] == NULL);
                CHECK_ERROR(NB_ERR_DTYPE, nb_dtype_name(dt));
                case_end();
                continue;
            }
            CHECK(t[0] && has_shape(t[0], shapes[0]) && nb_tensor_dtype(t[0]) == dt &&
                  strcmp(nb_tensor_device(t[0]), cur->name) == 0);
            double *a = values_of(t[0]), *b = values_of(t[1]), *d = values_of(t[2]), *p = values_of(t[3]);
            CHECK(a && b && d && p);
            if (a && b && d && p) {
                int same = 0, differ = 0, out = 0;
                for (int64_t i = 0; i < 33 * 31; i++) {
                    same += a[i] == b[i] || (isnan(a[i]) && isnan(b[i]));
                    differ += a[i] != d[i];
                    out += isnan(a[i]) || (dist == 1 && (a[i] < -1.0 || a[i] > 4.0)) ||
                           (dist == 2 && (a[i] < 0.5 - 4.0 || a[i] > 0.5 + 4.0));
                }
                CHECKF(same == 33 * 31, "the same seed gave %d equal values of %d", same, 33 * 31);
                CHECKF(differ > 33 * 31 * 9 / 10, "another seed changed only %d values", differ);
                CHECKF(out == 0, "%d values out of range", out);
                CHECKF(memcmp(a, p, sizeof(double) * 1000) == 0, "a shorter tensor is not a prefix");
            }
            if (!reference_mode && a) {
                /* the device runs the CPU's generator: the same values */
                nb_tensor *c = dist == 0   ? nb_random_normal(twin(dt), shapes[0], 2.0, 3.0, 42)
                               : dist == 1 ? nb_random_uniform(twin(dt), shapes[0], -1.0, 4.0, 42)
                                           : nb_truncated_normal(twin(dt), shapes[0], 0.5, 2.0, 42);
                double *cv = values_of(c);
                for (int64_t i = 0; cv && i < 33 * 31; i++)
                    cv[i] = stored(dt, cv[i]);
                CHECK(cv && values_match(a, cv, 33 * 31, is_half(dt) ? tol_for(dt, T_ELEM) : dt == NB_F64 ? 1e-13 : 1e-6,
                                         "against " CPU));
                free(cv);
            }
            free(a);
            free(b);
            free(d);
            free(p);
            case_end();
        }
    }
}

/* ================================ optimizer updates ========================================= */

/* The fused updates, through the optimizers, against their formulas in double
 * on /cpu:0 and against /cpu:0 elsewhere: three steps on [64, 3]. */
typedef struct opt_kind {
    const char *name;
    int kind; /* 0 sgd, 1 momentum, 2 nesterov, 3 adam, 4 adamw */
} opt_kind;

static nb_optimizer *make_opt(int kind)
{
    switch (kind) {
    case 0: return nb_sgd_new(0.1);
    case 1: return nb_sgd_momentum_new(0.1, 0.9, false);
    case 2: return nb_sgd_momentum_new(0.1, 0.9, true);
    case 3: return nb_adam_new(0.01, 0.9, 0.999, 1e-7);
    default: return nb_adamw_new(0.01, 0.9, 0.999, 1e-7, 0.05);
    }
}

static void opt_ref(int kind, double *p, double *m, double *v, double g, int t)
{
    const double lr = kind < 3 ? 0.1 : 0.01, wd = kind == 4 ? 0.05 : 0;
    switch (kind) {
    case 0: *p -= lr * g; break;
    case 1: *m = 0.9 * *m + g; *p -= lr * *m; break;
    case 2: *m = 0.9 * *m + g; *p -= lr * (g + 0.9 * *m); break;
    default: {
        *m = 0.9 * *m + 0.1 * g;
        *v = 0.999 * *v + 0.001 * g * g;
        double mh = *m / (1 - pow(0.9, t)), vh = *v / (1 - pow(0.999, t));
        *p -= lr * (mh / (sqrt(vh) + 1e-7) + wd * *p);
    }
    }
}

static void run_optimizer(int kind, const char *name)
{
    for (nb_dtype dt = NB_F32; dt <= NB_BF16; dt++) {
        if (!computes(cur, NB_K_SGD_UPDATE, dt))
            continue;
        case_begin("%s update %s", name, nb_dtype_name(dt));
        const int n = 64 * 3;
        double *p0 = gen(n, NB_F64, RANGE_DEFAULT), *g[3];
        for (int s = 0; s < 3; s++)
            g[s] = gen(n, NB_F64, RANGE_DEFAULT);
        nb_optimizer *o = make_opt(kind);
        nb_variable *var = nb_variable_new("w", make_input(cur->name, dt, NB_SHAPE(64, 3), p0, L_CONTIG));
        CHECK(o && var);
        double *start = var ? values_of(nb_read(var)) : NULL;
        for (int s = 0; s < 3 && o && var; s++) {
            nb_tensor *gt = make_input(cur->name, dt, NB_SHAPE(64, 3), g[s], L_CONTIG);
            double *gs = values_of(gt); /* the gradient as stored */
            memcpy(g[s], gs, sizeof(double) * (size_t)n);
            free(gs);
            CHECK_OK(nb_optimizer_apply(o, 1, &var, &gt));
        }
        if (o && var && start) {
            double *got = values_of(nb_read(var)), *want = alloc_values(n);
            if (reference_mode) {
                for (int i = 0; i < n; i++) {
                    double p = start[i], m = 0, v = 0;
                    for (int s = 0; s < 3; s++)
                        opt_ref(kind, &p, &m, &v, g[s][i], s + 1);
                    want[i] = p;
                }
            } else {
                nb_optimizer *oc = make_opt(kind);
                nb_variable *vc = nb_variable_new("w", make_input(CPU, twin(dt), NB_SHAPE(64, 3), start, L_CONTIG));
                for (int s = 0; s < 3; s++) {
                    nb_tensor *gt = make_input(CPU, twin(dt), NB_SHAPE(64, 3), g[s], L_CONTIG);
                    CHECK_OK(nb_optimizer_apply(oc, 1, &vc, &gt));
                }
                double *cv = values_of(nb_read(vc));
                for (int i = 0; cv && i < n; i++)
                    want[i] = stored(dt, cv[i]);
                free(cv);
                nb_variable_free(vc);
                nb_optimizer_free(oc);
            }
            CHECK(got && values_match(got, want, n, is_half(dt) ? 3 * tol_for(dt, T_ELEM) : dt == NB_F32 ? 1e-5 : 1e-12,
                                      "parameter"));
            free(got);
            free(want);
        }
        free(start);
        nb_variable_free(var);
        nb_optimizer_free(o);
        free(p0);
        for (int s = 0; s < 3; s++)
            free(g[s]);
        case_end();
    }
}

static void kernel_sgd_update(void)
{
    run_optimizer(0, "sgd");
    run_optimizer(1, "momentum");
    run_optimizer(2, "nesterov");
}

static void kernel_adam_update(void)
{
    run_optimizer(3, "adam");
    run_optimizer(4, "adamw");
}

/* ================================ convolutions ============================================== */

#include <nabla/nn.h>

/* x [N, H, W, C] (NHWC), w [R, S, C / G, K], y [N, P, Q, K], with the pads of
 * the case's options resolved here. which: 0 conv2d (x, w), 1 conv2d_transpose
 * (dy, w), 2 conv2d_filter_grad (x, dy). */
typedef struct conv_ctx {
    int which;
    int64_t N, H, W, C, K, R, S;
    nb_conv2d_opts o;
    int64_t P, Q, pt, pl;
} conv_ctx;

static void conv_resolve(conv_ctx *c)
{
    int64_t in[2] = {c->H, c->W}, k[2] = {c->R, c->S}, out[2], lo[2];
    for (int i = 0; i < 2; i++) {
        int64_t st = c->o.stride[i], span = c->o.dilation[i] * (k[i] - 1) + 1, a = 0, b = 0;
        if (c->o.padding == NB_PAD_EXPLICIT) {
            a = c->o.pad[2 * i], b = c->o.pad[2 * i + 1];
        } else if (c->o.padding == NB_PAD_SAME) {
            int64_t n = (in[i] + st - 1) / st, t = (n - 1) * st + span - in[i];
            t = t < 0 ? 0 : t;
            a = t / 2, b = t - a;
        }
        lo[i] = a;
        out[i] = (in[i] + a + b - span) / st + 1;
    }
    c->P = out[0], c->Q = out[1], c->pt = lo[0], c->pl = lo[1];
}

static nb_tensor *apply_conv(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const conv_ctx *c = ctx;
    int64_t hw[2] = {c->H, c->W}, rs[2] = {c->R, c->S};
    switch (c->which) {
    case 0: return nb_conv2d(in[0], in[1], &c->o);
    case 1: return nb_conv2d_transpose(in[0], in[1], hw, &c->o);
    default: return nb_conv2d_filter_grad(in[0], in[1], rs, &c->o);
    }
}
static nb_tensor *grad_conv(int n, nb_tensor *const *in, void *ctx) { return apply_conv(n, in, ctx); }

/* Calls f(x index, w index, y index) for every product term of the convolution. */
#define CONV_TERMS(c, BODY)                                                                               \
    do {                                                                                                  \
        int64_t G_ = (c)->o.groups, Cg_ = (c)->C / G_, Kg_ = (c)->K / G_;                                 \
        for (int64_t n_ = 0; n_ < (c)->N; n_++)                                                           \
            for (int64_t p_ = 0; p_ < (c)->P; p_++)                                                       \
                for (int64_t q_ = 0; q_ < (c)->Q; q_++)                                                   \
                    for (int64_t k_ = 0; k_ < (c)->K; k_++)                                               \
                        for (int64_t r_ = 0; r_ < (c)->R; r_++)                                           \
                            for (int64_t s_ = 0; s_ < (c)->S; s_++) {                                     \
                                int64_t h_ = p_ * (c)->o.stride[0] - (c)->pt + r_ * (c)->o.dilation[0];   \
                                int64_t w_ = q_ * (c)->o.stride[1] - (c)->pl + s_ * (c)->o.dilation[1];   \
                                if (h_ < 0 || h_ >= (c)->H || w_ < 0 || w_ >= (c)->W)                     \
                                    continue;                                                             \
                                for (int64_t ci_ = 0; ci_ < Cg_; ci_++) {                                 \
                                    int64_t xi = ((n_ * (c)->H + h_) * (c)->W + w_) * (c)->C +            \
                                                 (k_ / Kg_) * Cg_ + ci_;                                  \
                                    int64_t wi = ((r_ * (c)->S + s_) * Cg_ + ci_) * (c)->K + k_;          \
                                    int64_t yi = ((n_ * (c)->P + p_) * (c)->Q + q_) * (c)->K + k_;        \
                                    BODY;                                                                 \
                                }                                                                         \
                            }                                                                             \
    } while (0)

static double *ref_conv(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const conv_ctx *c = ctx;
    int64_t G = c->o.groups;
    const double *a = in[0].v, *b = in[1].v;
    int64_t cnt;
    if (c->which == 0) {
        *shape = (nb_shape){4, {c->N, c->P, c->Q, c->K}};
    } else if (c->which == 1) {
        *shape = (nb_shape){4, {c->N, c->H, c->W, c->C}};
    } else {
        *shape = (nb_shape){4, {c->R, c->S, c->C / G, c->K}};
    }
    cnt = numel(*shape);
    double *o = alloc_values(cnt);
    for (int64_t i = 0; i < cnt; i++)
        o[i] = 0;
    if (c->which == 0)
        CONV_TERMS(c, o[yi] += a[xi] * b[wi]);
    else if (c->which == 1)
        CONV_TERMS(c, o[xi] += a[yi] * b[wi]);
    else
        CONV_TERMS(c, o[wi] += a[xi] * b[yi]);
    return o;
}

static void run_conv_kernel(int which, nb_kernel k, const char *name)
{
    static const struct {
        int64_t N, H, W, C, K, R, S;
        nb_conv2d_opts o;
    } cases[] = {
        {2, 7, 6, 3, 5, 3, 3, {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 1, NB_NHWC}},
        {1, 9, 8, 4, 6, 3, 2, {{2, 3}, {1, 2}, NB_PAD_EXPLICIT, {1, 0, 2, 1}, 2, NB_NHWC}},
        {3, 6, 7, 4, 8, 3, 3, {{2, 1}, {1, 1}, NB_PAD_SAME, {0}, 4, NB_NHWC}}, /* depthwise, multiplier 2 */
        {2, 5, 5, 6, 4, 1, 1, {{1, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, NB_NHWC}},
        {1, 33, 17, 16, 16, 3, 3, {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 1, NB_NHWC}},
    };
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(FLOATS_MASK, k, 0, dt);
        conv_ctx pc = {which, 1, 3, 3, 1, 1, 1, 1, {{1, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, NB_NHWC}, 0, 0, 0, 0};
        conv_resolve(&pc);
        double v1[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        nb_shape xs = {4, {1, 3, 3, 1}}, ws = {4, {1, 1, 1, 1}}, ys = {4, {1, 3, 3, 1}};
        input probe[2] = {{dt, which == 1 ? ys : xs, v1, L_CONTIG}, {dt, which == 2 ? ys : ws, v1, L_CONTIG}};
        if (!refusal(p, name, dt, 2, probe, apply_conv, &pc))
            continue;
        for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
            conv_ctx c = {which, cases[s].N, cases[s].H, cases[s].W, cases[s].C, cases[s].K, cases[s].R,
                          cases[s].S, cases[s].o, 0, 0, 0, 0};
            conv_resolve(&c);
            nb_shape x = {4, {c.N, c.H, c.W, c.C}}, w = {4, {c.R, c.S, c.C / c.o.groups, c.K}},
                     y = {4, {c.N, c.P, c.Q, c.K}};
            nb_shape s0 = which == 1 ? y : x, s1 = which == 2 ? y : w;
            case_begin("%s %s x %s w %s groups %d", name, nb_dtype_name(dt), shape_str(x), shape_str(w),
                       c.o.groups);
            double *va = gen(numel(s0), dt, (range){R_REAL, -1, 1, -3, 3, false});
            double *vb = gen(numel(s1), dt, (range){R_REAL, -1, 1, -3, 3, false});
            input in[2] = {{dt, s0, va, L_CONTIG}, {dt, s1, vb, s % 2 ? L_STEPPED : L_CONTIG}};
            run_values(2, in, apply_conv, ref_conv, &c, dt, T_ACC);
            free(va);
            free(vb);
            case_end();
        }
    }
    if (!holds(cur, NB_F64))
        return;
    for (size_t s = 0; s < 3; s++) {
        conv_ctx c = {which, 1, cases[s].H, cases[s].W, cases[s].C, cases[s].K, cases[s].R, cases[s].S,
                      cases[s].o, 0, 0, 0, 0};
        conv_resolve(&c);
        nb_shape x = {4, {c.N, c.H, c.W, c.C}}, w = {4, {c.R, c.S, c.C / c.o.groups, c.K}},
                 y = {4, {c.N, c.P, c.Q, c.K}};
        nb_shape sh[2] = {which == 1 ? y : x, which == 2 ? y : w};
        case_begin("%s gradient x %s w %s", name, shape_str(x), shape_str(w));
        double *v[2] = {gen(numel(sh[0]), NB_F64, (range){R_REAL, -1, 1, 0, 0, false}),
                        gen(numel(sh[1]), NB_F64, (range){R_REAL, -1, 1, 0, 0, false})};
        run_gradient(2, sh, v, grad_conv, &c);
        free(v[0]);
        free(v[1]);
        case_end();
    }
}

static void kernel_conv2d(void) { run_conv_kernel(0, NB_K_CONV2D, "conv2d"); }
static void kernel_conv2d_backward_data(void) { run_conv_kernel(1, NB_K_CONV2D_BACKWARD_DATA, "conv2d_transpose"); }
static void kernel_conv2d_backward_filter(void)
{
    run_conv_kernel(2, NB_K_CONV2D_BACKWARD_FILTER, "conv2d_filter_grad");
}

/* ================================ pooling =================================================== */

typedef struct pool_bo_case {
    nb_shape x;
    nb_pool2d_opts o;
    layout lay;
} pool_bo_case;

static const pool_bo_case pool_bo_cases[] = {
    {{4, {2, 5, 7, 3}}, {{2, 2}, {0, 0}, NB_PAD_VALID, {0}, NB_NHWC}, L_CONTIG},
    {{4, {1, 7, 5, 2}}, {{3, 3}, {2, 2}, NB_PAD_SAME, {0}, NB_NHWC}, L_REVERSED},
    {{4, {2, 3, 7, 6}}, {{3, 2}, {1, 3}, NB_PAD_EXPLICIT, {2, 1, 0, 1}, NB_NCHW}, L_CONTIG},
    {{4, {1, 2, 6, 5}}, {{2, 3}, {2, 1}, NB_PAD_SAME, {0}, NB_NCHW}, L_OFFSET},
    {{4, {1, 4, 4, 37}}, {{3, 3}, {1, 1}, NB_PAD_SAME, {0}, NB_NHWC}, L_CONTIG},
};

typedef struct pool_bo_ctx {
    const pool_bo_case *c;
    int kind; /* 0 max, 1 max's gradient, 2 avg, 3 avg's gradient */
} pool_bo_ctx;

/* Geometry: pads top/left, output P, Q, and the layout's index. */
static void pool_bo_geo(const pool_bo_case *c, int64_t *g)
{
    bool nchw = c->o.format == NB_NCHW;
    int64_t H = c->x.dims[nchw ? 2 : 1], W = c->x.dims[nchw ? 3 : 2];
    int64_t R = c->o.window[0], S = c->o.window[1];
    int64_t sh = c->o.stride[0] ? c->o.stride[0] : R, sw = c->o.stride[1] ? c->o.stride[1] : S;
    int64_t pt = 0, pb = 0, pl = 0, pr = 0;
    if (c->o.padding == NB_PAD_SAME) {
        int64_t th = ((H + sh - 1) / sh - 1) * sh + R - H, tw = ((W + sw - 1) / sw - 1) * sw + S - W;
        th = th < 0 ? 0 : th, tw = tw < 0 ? 0 : tw;
        pt = th / 2, pb = th - pt, pl = tw / 2, pr = tw - pl;
    } else if (c->o.padding == NB_PAD_EXPLICIT) {
        pt = c->o.pad[0], pb = c->o.pad[1], pl = c->o.pad[2], pr = c->o.pad[3];
    }
    int64_t v[12] = {H, W, R, S, sh, sw, pt, pl, (H + pt + pb - R) / sh + 1, (W + pl + pr - S) / sw + 1,
                     c->x.dims[0], c->x.dims[nchw ? 1 : 3]};
    memcpy(g, v, sizeof v);
}

static nb_shape pool_bo_out_shape(const pool_bo_case *c)
{
    int64_t g[12];
    pool_bo_geo(c, g);
    return c->o.format == NB_NCHW ? (nb_shape){4, {g[10], g[11], g[8], g[9]}} : (nb_shape){4, {g[10], g[8], g[9], g[11]}};
}

static int64_t pool_bo_at(const pool_bo_case *c, int64_t n, int64_t h, int64_t w, int64_t ch, int64_t H, int64_t W,
                          int64_t C)
{
    return c->o.format == NB_NCHW ? ((n * C + ch) * H + h) * W + w : ((n * H + h) * W + w) * C + ch;
}

static nb_tensor *apply_pool(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const pool_bo_ctx *c = ctx;
    if (c->kind == 0 || c->kind == 2)
        return c->kind ? nb_avg_pool2d(in[0], &c->c->o) : nb_max_pool2d(in[0], &c->c->o);
    /* the gradient kernels, through the tape: d sum(pool(x) * dy) / dx */
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, in[0]);
    nb_tensor *y = c->kind == 1 ? nb_max_pool2d(in[0], &c->c->o) : nb_avg_pool2d(in[0], &c->c->o);
    nb_tensor *g = NULL;
    if (!y || nb_tape_gradient(tape, nb_sum_all(nb_mul(y, in[1])), 1, in, &g))
        return NULL;
    return g;
}

static double *ref_pool(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const pool_bo_ctx *pc = ctx;
    const pool_bo_case *c = pc->c;
    int64_t g[12];
    pool_bo_geo(c, g);
    const int64_t H = g[0], W = g[1], R = g[2], S = g[3], sh = g[4], sw = g[5], pt = g[6], pl = g[7], P = g[8],
                  Q = g[9], N = g[10], C = g[11];
    bool grad = pc->kind == 1 || pc->kind == 3, is_max = pc->kind < 2;
    *shape = grad ? in[0].shape : pool_bo_out_shape(c);
    int64_t total = numel(*shape);
    double *w = alloc_values(total);
    for (int64_t i = 0; i < total; i++)
        w[i] = 0;
    const double *x = in[0].v;
    for (int64_t nn = 0; nn < N; nn++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t q = 0; q < Q; q++)
                for (int64_t ch = 0; ch < C; ch++) {
                    double m = 0, sum = 0;
                    int64_t best = -1, cnt = 0;
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t s2 = 0; s2 < S; s2++) {
                            int64_t h = p * sh - pt + r, ww = q * sw - pl + s2;
                            if (h < 0 || h >= H || ww < 0 || ww >= W)
                                continue;
                            int64_t i = pool_bo_at(c, nn, h, ww, ch, H, W, C);
                            cnt++;
                            sum += x[i];
                            if (best < 0 || (!isnan(m) && (x[i] > m || isnan(x[i]))))
                                m = x[i], best = i;
                        }
                    int64_t o = pool_bo_at(c, nn, p, q, ch, P, Q, C);
                    if (!grad) {
                        w[o] = is_max ? m : sum / (double)cnt;
                    } else if (is_max) {
                        w[best] += in[1].v[o];
                    } else {
                        for (int64_t r = 0; r < R; r++)
                            for (int64_t s2 = 0; s2 < S; s2++) {
                                int64_t h = p * sh - pt + r, ww = q * sw - pl + s2;
                                if (h >= 0 && h < H && ww >= 0 && ww < W)
                                    w[pool_bo_at(c, nn, h, ww, ch, H, W, C)] += in[1].v[o] / (double)cnt;
                            }
                    }
                }
    return w;
}

static nb_tensor *grad_pool(int n, nb_tensor *const *in, void *ctx)
{
    return apply_pool(n, in, ctx);
}

static void run_pool_kernel(int kind)
{
    static const char *const names[] = {"max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad"};
    static const nb_kernel ks[] = {NB_K_MAX_POOL2D, NB_K_MAX_POOL2D_GRAD, NB_K_AVG_POOL2D, NB_K_AVG_POOL2D_GRAD};
    bool grad = kind == 1 || kind == 3;
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(FLOATS_MASK, ks[kind], 0, dt);
        static const pool_bo_case probe_case = {{4, {1, 1, 1, 1}}, {{1, 1}, {1, 1}, NB_PAD_VALID, {0}, NB_NHWC}, L_CONTIG};
        pool_bo_ctx pc0 = {&probe_case, kind & 2};
        double one = 1;
        input probe[1] = {{dt, {4, {1, 1, 1, 1}}, &one, L_CONTIG}};
        /* the gradient kernels cannot be reached with a dtype the forward refuses */
        if (!refusal(p, names[kind], dt, 1, probe, apply_pool, &pc0))
            continue;
        for (size_t k = 0; k < sizeof pool_bo_cases / sizeof *pool_bo_cases; k++) {
            const pool_bo_case *c = &pool_bo_cases[k];
            pool_bo_ctx pc = {c, kind};
            nb_shape os = pool_bo_out_shape(c);
            case_begin("%s %s %s%s", names[kind], nb_dtype_name(dt), shape_str(c->x), layout_names[c->lay]);
            double *v = gen(numel(c->x), dt, (range){R_GRID, -3, 3, 0, 0, false});
            if (k == 1 && kind < 2)
                v[5] = NAN; /* a NaN wins its windows */
            double *dy = gen(numel(os), dt, (range){R_GRID, -2, 2, 0, 0, false});
            input in[2] = {{dt, c->x, v, c->lay}, {dt, os, dy, L_CONTIG}};
            run_values(grad ? 2 : 1, in, apply_pool, ref_pool, &pc, dt, kind == 0 ? T_EXACT : T_ACC);
            free(v);
            free(dy);
            case_end();
        }
    }
    if (!holds(cur, NB_F64))
        return;
    for (size_t k = 0; k < sizeof pool_bo_cases / sizeof *pool_bo_cases; k += 2) {
        const pool_bo_case *c = &pool_bo_cases[k];
        pool_bo_ctx pc = {c, kind};
        case_begin("%s gradient %s", names[kind], shape_str(c->x));
        int64_t n = numel(c->x);
        double *v = alloc_values(n); /* distinct values: no kink within the checker's step */
        for (int64_t i = 0; i < n; i++)
            v[i] = 0.01 * (double)((i * 7919) % n) - 1;
        nb_shape s[2] = {c->x, pool_bo_out_shape(c)};
        double *dy = gen(numel(s[1]), NB_F64, RANGE_DEFAULT);
        double *vs[2] = {v, dy};
        run_gradient(grad ? 2 : 1, s, vs, grad_pool, &pc);
        free(v);
        free(dy);
        case_end();
    }
}

static void kernel_max_pool2d(void) { run_pool_kernel(0); }
static void kernel_max_pool2d_grad(void) { run_pool_kernel(1); }
static void kernel_avg_pool2d(void) { run_pool_kernel(2); }
static void kernel_avg_pool2d_grad(void) { run_pool_kernel(3); }

/* ================================ per-channel kernels (batch_norm_train) ==================== */

/* Reached through batch_norm_train: its values (channel_moments twice, then
 * channel_affine) and its gradient for x (channel_moments, channel_affine),
 * against double references of the formulas. */
typedef struct bn_bo_case {
    nb_shape x;
    nb_data_format f;
    layout lay;
} bn_bo_case;

static const bn_bo_case bn_bo_cases[] = {
    {{4, {2, 5, 3, 7}}, NB_NHWC, L_CONTIG},
    {{4, {3, 4, 5, 2}}, NB_NCHW, L_CONTIG},
    {{2, {33, 5}}, NB_NHWC, L_REVERSED},
    {{4, {4, 6, 6, 40}}, NB_NHWC, L_CONTIG},
};

typedef struct bn_bo_ctx {
    const bn_bo_case *c;
    bool grad;
} bn_bo_ctx;

static nb_tensor *apply_bn(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const bn_bo_ctx *c = ctx;
    if (!c->grad)
        return nb_batch_norm_train(in[0], in[1], in[2], 1e-3, c->c->f, NULL, NULL);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, in[0]);
    nb_tensor *y = nb_batch_norm_train(in[0], in[1], in[2], 1e-3, c->c->f, NULL, NULL), *g = NULL;
    if (!y || nb_tape_gradient(tape, nb_sum_all(nb_mul(y, in[3])), 1, in, &g))
        return NULL;
    return g;
}

static double *ref_bn(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const bn_bo_ctx *c = ctx;
    nb_shape s = in[0].shape;
    int ca = c->c->f == NB_NCHW && s.ndim > 2 ? 1 : s.ndim - 1;
    int64_t C = s.dims[ca], inner = 1, total = numel(s);
    for (int i = ca + 1; i < s.ndim; i++)
        inner *= s.dims[i];
    double m = (double)(total / C);
    double *out = alloc_values(total);
    for (int64_t ch = 0; ch < C; ch++) {
        double mu = 0, var = 0, sg = 0, sgx = 0;
        for (int64_t i = 0; i < total; i++)
            if ((i / inner) % C == ch)
                mu += in[0].v[i];
        mu /= m;
        for (int64_t i = 0; i < total; i++)
            if ((i / inner) % C == ch)
                var += (in[0].v[i] - mu) * (in[0].v[i] - mu);
        double rstd = 1 / sqrt(var / m + 1e-3), gm = in[1].v[ch], bt = in[2].v[ch];
        if (c->grad)
            for (int64_t i = 0; i < total; i++)
                if ((i / inner) % C == ch) {
                    sg += in[3].v[i];
                    sgx += in[3].v[i] * (in[0].v[i] - mu) * rstd;
                }
        for (int64_t i = 0; i < total; i++)
            if ((i / inner) % C == ch) {
                double xh = (in[0].v[i] - mu) * rstd;
                out[i] = c->grad ? gm * rstd * (in[3].v[i] - sg / m - xh * sgx / m) : gm * xh + bt;
            }
    }
    *shape = s;
    return out;
}

static void run_bn_kernel(bool grad)
{
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(FLOATS_MASK, grad ? NB_K_CHANNEL_AFFINE : NB_K_CHANNEL_MOMENTS, 0, dt);
        static const bn_bo_case probe_case = {{2, {2, 1}}, NB_NHWC, L_CONTIG};
        bn_bo_ctx pc0 = {&probe_case, false};
        double two[2] = {1, 2}, one = 1, zero = 0;
        input probe[3] = {{dt, {2, {2, 1}}, two, L_CONTIG}, {dt, {1, {1}}, &one, L_CONTIG}, {dt, {1, {1}}, &zero, L_CONTIG}};
        if (!refusal(p, grad ? "batch_norm_train gradient" : "batch_norm_train", dt, 3, probe, apply_bn, &pc0))
            continue;
        for (size_t k = 0; k < sizeof bn_bo_cases / sizeof *bn_bo_cases; k++) {
            const bn_bo_case *c = &bn_bo_cases[k];
            bn_bo_ctx pc = {c, grad};
            int ca = c->f == NB_NCHW && c->x.ndim > 2 ? 1 : c->x.ndim - 1;
            nb_shape cs = {1, {c->x.dims[ca]}};
            case_begin("batch_norm_train%s %s %s%s", grad ? " gradient" : "", nb_dtype_name(dt), shape_str(c->x),
                       layout_names[c->lay]);
            double *v = gen(numel(c->x), dt, (range){R_REAL, -2, 3, 0, 0, false});
            double *gm = gen(cs.dims[0], dt, (range){R_REAL, 0.5, 2, 0, 0, false});
            double *bt = gen(cs.dims[0], dt, RANGE_DEFAULT);
            double *w = gen(numel(c->x), dt, RANGE_DEFAULT);
            input in[4] = {{dt, c->x, v, c->lay}, {dt, cs, gm, L_CONTIG}, {dt, cs, bt, L_CONTIG}, {dt, c->x, w, L_CONTIG}};
            run_values(grad ? 4 : 3, in, apply_bn, ref_bn, &pc, dt, T_ACC);
            free(v), free(gm), free(bt), free(w);
            case_end();
        }
    }
}

/* NHWC moments split their rows into chunks whose partial sums combine in
 * order: on the CPU the same bits on the pool and on one thread (where a CPU
 * replica's kernels run). */
static void moments_thread_independent(void)
{
    if (strcmp(cur->name, CPU) != 0)
        return;
    static const nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int k = 0; k < 2; k++) {
        const nb_dtype dt = dts[k];
        case_begin("batch_norm_train %s [64, 8, 8, 32] NHWC, on one thread and on the pool", nb_dtype_name(dt));
        nb_tensor *x = nb_random_normal(dt, NB_SHAPE(64, 8, 8, 32), 0.5, 2, 11);
        nb_tensor *g = nb_ones(dt, NB_SHAPE(32)), *b = nb_zeros(dt, NB_SHAPE(32));
        nb_tensor *pool = nb_batch_norm_train(x, g, b, 1e-3, NB_NHWC, NULL, NULL);
        nb__thread_set_serial(true);
        nb_tensor *one = nb_batch_norm_train(x, g, b, 1e-3, NB_NHWC, NULL, NULL);
        nb__thread_set_serial(false);
        double *a = values_of(pool), *e = values_of(one);
        CHECKF(a && e && memcmp(a, e, sizeof(double) * 64 * 8 * 8 * 32) == 0, "the pool and one thread differ");
        free(a), free(e);
        case_end();
    }
}

static void kernel_channel_moments(void)
{
    run_bn_kernel(false);
    moments_thread_independent();
}
static void kernel_channel_affine(void) { run_bn_kernel(true); }

/* ================================ row kernels (layer_norm) ================================== */

/* Reached through layer_norm (its values, and its tape gradients for x, gamma
 * and beta of sum(y w)) on every device, and on a device whose backend has
 * the entries through the entries themselves on poisoned outputs (out, mean
 * and rstd; dx, dgamma and dbeta, some not asked for), against double
 * references. Edge rows: constant (exactly beta; NaN with epsilon 0), a NaN,
 * +-inf. Inputs x, gamma, beta, w. */
typedef enum ln_what {
    LN_Y, LN_DX, LN_DGAMMA, LN_DBETA,             /* through the op */
    LN_K_OUT, LN_K_MEAN, LN_K_RSTD,               /* layer_norm_rows */
    LN_K_DX, LN_K_DGAMMA, LN_K_DBETA, LN_K_COUNT /* layer_norm_rows_grad */
} ln_what;

typedef struct ln_bo_case {
    nb_shape x;
    int n_axes;
    bool gamma, beta, edges;
    double eps;
    layout lay;
} ln_bo_case;

static const ln_bo_case ln_bo_cases[] = {
    {{2, {7, 33}}, 1, true, true, false, 1e-5, L_CONTIG},
    {{4, {2, 3, 4, 5}}, 2, true, false, false, 1e-3, L_CONTIG},
    {{2, {5, 16}}, 1, false, true, false, 1e-5, L_REVERSED},
    {{2, {1, 1}}, 1, false, false, false, 1e-5, L_CONTIG},
    {{2, {300, 257}}, 1, true, true, false, 1e-5, L_CONTIG},
    {{3, {3, 2, 64}}, 1, true, true, false, 1e-5, L_STEPPED},
    {{2, {6, 9}}, 1, true, true, true, 1e-3, L_CONTIG},
    {{2, {6, 9}}, 1, false, true, true, 0, L_CONTIG},
};

typedef struct ln_bo_ctx {
    const ln_bo_case *c;
    ln_what what;
} ln_bo_ctx;

/* The entries' results on fresh (poisoned) outputs: out, mean, rstd, then,
 * for the gradient's, dx, dgamma, dbeta, asking only for the one wanted and
 * (for dgamma) dx too. */
static nb_tensor *apply_ln_kernel(nb_tensor *const *in, const ln_bo_ctx *c)
{
    const ln_bo_case *k = c->c;
    nb_tensor *x = nb_contiguous(in[0]), *g = k->gamma ? nb_contiguous(in[1]) : NULL;
    nb_tensor *b = k->beta ? nb_contiguous(in[2]) : NULL, *w = nb_contiguous(in[3]);
    if (!x || (k->gamma && !g) || (k->beta && !b) || !w)
        return NULL;
    nb_device *dev = x->device;
    int64_t D = 1;
    for (int i = x->ndim - k->n_axes; i < x->ndim; i++)
        D *= x->shape[i];
    int64_t rows = x->numel / D;
    /* mean and rstd are f32 for the half types (backend.h) */
    nb_dtype sdt = is_half(x->dtype) ? NB_F32 : x->dtype;
    nb_tensor *t[6] = {nb__tensor_new("layer_norm", dev, x->dtype, x->ndim, x->shape),
                       nb__tensor_new("layer_norm", dev, sdt, 1, &rows),
                       nb__tensor_new("layer_norm", dev, sdt, 1, &rows),
                       nb__tensor_new("layer_norm", dev, x->dtype, x->ndim, x->shape),
                       nb__tensor_new("layer_norm", dev, x->dtype, 1, &D),
                       nb__tensor_new("layer_norm", dev, x->dtype, 1, &D)};
    for (int i = 0; i < 6; i++)
        t[i] = nb__own(t[i]);
    for (int i = 0; i < 6; i++)
        if (!t[i])
            return NULL;
    nb_view v[6], vx = nb__view(x), vg = g ? nb__view(g) : (nb_view){0}, vb = b ? nb__view(b) : (nb_view){0},
                  vw = nb__view(w);
    for (int i = 0; i < 6; i++)
        v[i] = nb__view(t[i]);
    if (dev->backend->layer_norm_rows(dev, rows, D, &v[0], &v[1], &v[2], &vx, g ? &vg : NULL, b ? &vb : NULL, k->eps))
        return NULL;
    if (c->what < LN_K_DX)
        return t[c->what - LN_K_OUT];
    bool dx = c->what == LN_K_DX || c->what == LN_K_DGAMMA;
    if (dev->backend->layer_norm_rows_grad(dev, rows, D, dx ? &v[3] : NULL, c->what == LN_K_DGAMMA ? &v[4] : NULL,
                                           c->what == LN_K_DBETA ? &v[5] : NULL, &vw, &vx, &v[2], g ? &vg : NULL))
        return NULL;
    if (c->what == LN_K_DGAMMA && strcmp(dev->name, CPU) == 0) {
        /* the column sums do not depend on the thread count */
        nb_tensor *serial = nb__own(nb__tensor_new("layer_norm", dev, x->dtype, 1, &D));
        nb_view vs = serial ? nb__view(serial) : (nb_view){0};
        nb__thread_set_serial(true);
        nb_status st = serial ? dev->backend->layer_norm_rows_grad(dev, rows, D, NULL, &vs, NULL, &vw, &vx, &v[2],
                                                                   g ? &vg : NULL)
                              : NB_ERR_INTERNAL;
        nb__thread_set_serial(false);
        double *a = st ? NULL : values_of(serial), *e = values_of(t[4]);
        CHECKF(a && e && memcmp(a, e, sizeof(double) * (size_t)D) == 0, "dgamma on one thread differs");
        free(a), free(e);
    }
    return t[c->what - LN_K_DX + 3];
}

static nb_tensor *apply_ln(int n, nb_tensor *const *in, const void *ctx)
{
    (void)n;
    const ln_bo_ctx *c = ctx;
    const ln_bo_case *k = c->c;
    if (c->what >= LN_K_OUT)
        return apply_ln_kernel(in, c);
    nb_tensor *g = k->gamma ? in[1] : NULL, *b = k->beta ? in[2] : NULL;
    if (c->what == LN_Y)
        return nb_layer_norm(in[0], g, b, k->n_axes, k->eps);
    nb_tape *tape = nb_tape_begin();
    for (int i = 0; i < 3; i++)
        nb_tape_watch(tape, in[i]);
    nb_tensor *y = nb_layer_norm(in[0], g, b, k->n_axes, k->eps), *gr[3] = {0};
    if (!y || nb_tape_gradient_ex(tape, nb_sum_all(nb_mul(y, in[3])), NULL, 3, in, gr, NB_UNCONNECTED_ZERO))
        return NULL;
    return gr[c->what - LN_DX];
}

static double *ref_ln(int n, const input *in, const void *ctx, nb_shape *shape)
{
    (void)n;
    const ln_bo_ctx *c = ctx;
    const ln_bo_case *k = c->c;
    nb_shape s = in[0].shape;
    int64_t D = 1, total = numel(s);
    for (int i = s.ndim - k->n_axes; i < s.ndim; i++)
        D *= s.dims[i];
    int64_t rows = total / D;
    double *y = alloc_values(total), *dx = alloc_values(total), *mean = alloc_values(rows),
           *rstd = alloc_values(rows), *dg = alloc_values(D), *db = alloc_values(D);
    for (int64_t j = 0; j < D; j++)
        dg[j] = db[j] = 0;
    const double *x = in[0].v, *w = in[3].v;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * D, *wr = w + r * D;
        double mu = 0, var = 0, sh = 0, shx = 0;
        for (int64_t j = 0; j < D; j++)
            mu += xr[j];
        mu /= (double)D;
        for (int64_t j = 0; j < D; j++)
            var += (xr[j] - mu) * (xr[j] - mu);
        double rs = 1 / sqrt(var / (double)D + k->eps);
        mean[r] = mu, rstd[r] = rs;
        for (int64_t j = 0; j < D; j++) {
            double xh = (xr[j] - mu) * rs, gm = k->gamma ? in[1].v[j] : 1, h = wr[j] * gm;
            y[r * D + j] = xh * gm + (k->beta ? in[2].v[j] : 0);
            sh += h, shx += h * xh;
            dg[j] += wr[j] * xh, db[j] += wr[j];
        }
        for (int64_t j = 0; j < D; j++) {
            double xh = (xr[j] - mu) * rs, h = wr[j] * (k->gamma ? in[1].v[j] : 1);
            dx[r * D + j] = rs * (h - sh / (double)D - xh * shx / (double)D);
        }
    }
    double *keep;
    switch (c->what) {
    case LN_Y: case LN_K_OUT: keep = y, *shape = s; break;
    case LN_DX: case LN_K_DX: keep = dx, *shape = s; break;
    case LN_K_MEAN: keep = mean, *shape = (nb_shape){1, {rows}}; break;
    case LN_K_RSTD: keep = rstd, *shape = (nb_shape){1, {rows}}; break;
    case LN_DGAMMA: keep = dg, *shape = in[1].shape; break;
    case LN_DBETA: keep = db, *shape = in[2].shape; break;
    case LN_K_DGAMMA: keep = dg, *shape = (nb_shape){1, {D}}; break;
    default: keep = db, *shape = (nb_shape){1, {D}}; break;
    }
    double *all[6] = {y, dx, mean, rstd, dg, db};
    for (int i = 0; i < 6; i++)
        if (all[i] != keep)
            free(all[i]);
    return keep;
}

static void run_ln_kernel(bool grad)
{
    static const char *const names[LN_K_COUNT] = {"y", "dx", "dgamma", "dbeta", "out", "mean",
                                                  "rstd", "dx", "dgamma", "dbeta"};
    for (nb_dtype dt = 0; dt < NB_DTYPE_COUNT; dt++) {
        plan p = plan_for(FLOATS_MASK, grad ? NB_K_LAYER_NORM_ROWS_GRAD : NB_K_LAYER_NORM_ROWS, 0, dt);
        static const ln_bo_case probe_case = {{2, {2, 2}}, 1, true, true, false, 1e-5, L_CONTIG};
        ln_bo_ctx pc0 = {&probe_case, grad ? LN_DX : LN_Y};
        double four[4] = {1, 2, 3, 5}, two[2] = {1, 2};
        input probe[4] = {{dt, {2, {2, 2}}, four, L_CONTIG}, {dt, {1, {2}}, two, L_CONTIG},
                          {dt, {1, {2}}, two, L_CONTIG}, {dt, {2, {2, 2}}, four, L_CONTIG}};
        if (!refusal(p, grad ? "layer_norm gradient" : "layer_norm", dt, 4, probe, apply_ln, &pc0))
            continue;
        /* the entries themselves where the backend has them (they are optional) */
        bool entries = cur->dev->backend->layer_norm_rows && cur->dev->backend->layer_norm_rows_grad;
        for (size_t ci = 0; ci < sizeof ln_bo_cases / sizeof *ln_bo_cases; ci++) {
            const ln_bo_case *c = &ln_bo_cases[ci];
            nb_shape ps = {c->n_axes, {0}};
            for (int i = 0; i < c->n_axes; i++)
                ps.dims[i] = c->x.dims[c->x.ndim - c->n_axes + i];
            int64_t n = numel(c->x), D = numel(ps);
            double *v = gen(n, dt, (range){R_REAL, -2, 3, 0, 0, false});
            double *gm = gen(D, dt, (range){R_REAL, 0.5, 2, 0, 0, false});
            double *bt = gen(D, dt, RANGE_DEFAULT);
            double *w = gen(n, dt, RANGE_DEFAULT);
            if (c->edges) { /* rows 0..3: constant, a NaN, +inf, -inf */
                for (int64_t j = 0; j < D; j++)
                    v[j] = 2.5;
                v[D + 3] = NAN, v[2 * D + 1] = INFINITY, v[3 * D + D - 1] = -INFINITY;
            }
            input in[4] = {{dt, c->x, v, c->lay}, {dt, ps, gm, L_CONTIG}, {dt, ps, bt, L_CONTIG}, {dt, c->x, w, L_CONTIG}};
            ln_what first = grad ? LN_DX : LN_Y, last = grad ? LN_DBETA : LN_Y;
            ln_what kfirst = grad ? LN_K_DX : LN_K_OUT, klast = grad ? LN_K_DBETA : LN_K_RSTD;
            for (int wi = first; wi <= (int)klast; wi++) {
                if (wi > (int)last && wi < (int)kfirst)
                    continue;
                /* (the half types' statistics are f32: checked through the outputs) */
                if (wi >= LN_K_OUT && (!entries || (is_half(dt) && (wi == LN_K_MEAN || wi == LN_K_RSTD))))
                    continue;
                /* the op's gradients of an absent gamma or beta are zeros; the
                 * entry's dgamma and dbeta do not depend on them */
                if ((wi == LN_DGAMMA && !c->gamma) || (wi == LN_DBETA && !c->beta))
                    continue;
                ln_bo_ctx pc = {c, (ln_what)wi};
                case_begin("layer_norm%s %s %s %s n_axes %d%s%s%s eps %g%s", wi >= LN_K_OUT ? " entry" : "",
                           names[wi], nb_dtype_name(dt), shape_str(c->x), c->n_axes, c->gamma ? " gamma" : "",
                           c->beta ? " beta" : "", c->edges ? " edge rows" : "", c->eps, layout_names[c->lay]);
                run_values(4, in, apply_ln, ref_ln, &pc, dt, T_ACC);
                case_end();
            }
            free(v), free(gm), free(bt), free(w);
        }
    }
}

static void kernel_layer_norm_rows(void) { run_ln_kernel(false); }
static void kernel_layer_norm_rows_grad(void) { run_ln_kernel(true); }

/* ================================ the matrix ================================================ */

/* Every kernel entry of the list has its cases here. */
#define NB_KERNEL(ID, name) [NB_K_##ID] = {#name, kernel_##name},
static const struct {
    const char *name;
    void (*run)(void);
} kernels[NB_K_COUNT] = {
#include "lib/core/ops.def"
};

static void add_device(const char *name)
{
    nb_device *d = nb__device_find(name, "test_backend_ops");
    if (!d || n_devices == MAX_DEVICES) {
        fprintf(stderr, "test_backend_ops: no device %s: %s\n", name, nb_error_message());
        check_failures++;
        nb_error_clear();
        return;
    }
    devices[n_devices++] = (device_run){d->name, d, 0, 0, 0};
}

int main(int argc, char **argv)
{
    bool gpu_only = argc > 1 && strcmp(argv[1], "--gpu") == 0;
    /* outputs poisoned before the kernels write them, also when run by hand */
    setenv("NB_DEBUG_POISON", "1", 0);
    const char *vb = getenv("NB_BACKEND_OPS_VERBOSE");
    verbose = vb && vb[0] && strcmp(vb, "0") != 0;
    const char *list = getenv("NB_BACKEND_OPS_DEVICES");
    if (list && list[0]) {
        if (strstr(list, "/cpu:1") && nb_set_logical_cpu_devices(2) != NB_OK)
            return 1;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", list);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
            add_device(tok);
    } else {
        int n_gpu = nb_device_count(NB_DEVICE_GPU);
        if (gpu_only && n_gpu == 0)
            return check_no_gpu("test_backend_ops");
        if (!gpu_only)
            add_device(CPU);
        for (int i = 0; i < n_gpu; i++)
            add_device(nb_device_name(NB_DEVICE_GPU, i));
    }
    for (int d = 0; d < n_devices; d++) {
        cur = &devices[d];
        reference_mode = strcmp(cur->name, CPU) == 0;
        rng_state = RNG_SEED; /* the same inputs on every device */
        for (int k = 0; k < NB_K_COUNT; k++) {
            CHECKF(kernels[k].run != NULL && strcmp(kernels[k].name, nb__kernel_name((nb_kernel)k)) == 0,
                   "kernel %d (%s) has no cases", k, nb__kernel_name((nb_kernel)k));
            if (kernels[k].run)
                kernels[k].run();
        }
        CHECK_OK(nb_synchronize());
    }
    for (int d = 0; d < n_devices; d++)
        printf("test_backend_ops %s: %d cases ran, %d passed, %d skipped as unsupported\n", devices[d].name,
               devices[d].ran, devices[d].passed, devices[d].skipped);
    return check_finish();
}
