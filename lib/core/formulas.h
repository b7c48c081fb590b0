/* nabla internal — every elementwise formula of ops.def, written once.
 *
 * It compiles as C (the CPU kernels, ops/cpu) and as CUDA (the GPU kernels,
 * gpu/), so both devices compute the same expression: nb_un_<name>_<type>(x,
 * alpha) for each NB_UNARY op and nb_bin_<name>_<type>(x, y) for each NB_BINARY
 * op, for f32 and f64 (the GPU computes f16 and bf16 in f32), and for i32, i64
 * (and u8, comparisons only) where the list allows integers. Integer
 * arithmetic wraps (it is done unsigned: no undefined behaviour).
 *
 * A formula is a function of one element and the op's scalar; the kernels own
 * the loops, strides and dtypes.
 *
 * Beside each op's formula stands its reference for the tests,
 * NB_REF_UN(name, expression of x and a) or NB_REF_BIN(name, expression of x
 * and y): the same function written again in double from its definition and
 * libm, not from the kernel's stable or fast form, so that a test compares the
 * kernel with something other than itself. test_backend_ops and
 * test_cpu_kernels call nb_ref_un_<name>(x, a, int_bits) and
 * nb_ref_bin_<name>(x, y, int_bits) through tables made from ops.def, so a
 * listed op without a reference does not build. int_bits is 0 for the
 * floating dtypes and 32 or 64 for the integers (whose results the tests
 * truncate and wrap): one reference serves every dtype of its op. They are
 * defined once, on the double pass, and only for C. */
#ifndef NB_FORMULAS_H
#define NB_FORMULAS_H

#include <math.h>
#include <stdint.h>

/* Every formula is inlined whole on the CPU: a call in a loop keeps it from
 * vectorising, and GCC's -O2 estimate would leave the larger ones calls.
 * NB_FN_RARE marks the rare paths (sin and cos of a far x) that may be. */
#ifdef __CUDACC__
#define NB_FN static inline __host__ __device__
#else
#define NB_FN static inline __attribute__((always_inline))
#endif
#define NB_FN_RARE static inline

#define NB_INV_SQRT2 0.70710678118654752440
#define NB_INV_SQRT_2PI 0.39894228040143267794

/* The references: defined (C only) or skipped, pass by pass. */
#define NB_REF_SKIP(...)
#ifdef __CUDACC__
#define NB_REF_DEFINE_UN NB_REF_SKIP
#define NB_REF_DEFINE_BIN NB_REF_SKIP
#else
#define NB_REF_DEFINE_UN(name, ...)                                                   \
    static inline double nb_ref_un_##name(double x, double a, int int_bits)          \
    {                                                                                 \
        (void)x, (void)a, (void)int_bits;                                             \
        return __VA_ARGS__;                                                           \
    }
#define NB_REF_DEFINE_BIN(name, ...)                                                  \
    static inline double nb_ref_bin_##name(double x, double y, int int_bits)         \
    {                                                                                 \
        (void)x, (void)y, (void)int_bits;                                             \
        return __VA_ARGS__;                                                           \
    }
/* x * y wrapped to a signed integer of int_bits bits, exactly (a double product
 * is not, past 2^53). */
static inline double nb_ref_wrapped_product(double x, double y, int int_bits)
{
    uint64_t p = (uint64_t)(int64_t)x * (uint64_t)(int64_t)y;
    return int_bits == 32 ? (double)(int32_t)(uint32_t)p : (double)(int64_t)p;
}
#endif
#define NB_REF_UN NB_REF_SKIP
#define NB_REF_BIN NB_REF_SKIP

/* ---- exp, expm1, log, log1p, tanh, erf, erfc, sin, cos and pow of a float on the CPU ----
 * nb_expf, nb_expm1f, nb_logf, nb_log1pf, nb_tanhf, nb_erff, nb_erfcf,
 * nb_sinf, nb_cosf and nb_powf are those functions rounded to float. They work in
 * double to a relative error near 2^-38, so each is within 0.5001 ulp, and
 * the correctly rounded float but for a few in a million (test_cpu_math
 * counts them; glibc's float functions are within 0.502 to 3.2 ulp). Unlike
 * libm's they are formulas without branches, calls or tables, so a loop of
 * them vectorises, and every copy of that loop (scalar, SSE2, AVX2, AVX-512)
 * gives the same bits. Out-of-range and special inputs go through the formula
 * as clamped or harmless values, and their results are selected at the end
 * (with single compares, no && or ||: GCC leaves a loop with branches
 * unvectorised). sin and cos are the exception: past 2^20 their argument is
 * reduced with a table of 2/pi's bits, so a loop runs their branch-free near
 * form and redoes the far few (nb__sinf_near).
 * NB_MATH_F32(fn) names the one the f32 formulas call: nabla's on the CPU,
 * CUDA's fn##f on the GPU (its formulas compile with __CUDACC__). */
#ifdef __CUDACC__
#define NB_MATH_F32(fn) fn##f
#else
#define NB_MATH_F32(fn) nb_##fn##f

NB_FN double nb__bits_double(uint64_t u)
{
    double d;
    __builtin_memcpy(&d, &u, sizeof d);
    return d;
}
NB_FN uint64_t nb__double_bits(double d)
{
    uint64_t u;
    __builtin_memcpy(&u, &d, sizeof u);
    return u;
}

/* 2^z = scale (1 + *p) for z in [-1000, 1000]: scale = 2^k with k = round(z)
 * exactly, and *p = 2^r - 1 for r = z - k, |r| <= 1/2, as r q(r) with q of
 * degree 7 (relative error 2^-38.8: a Chebyshev fit of (2^r - 1) / r). */
NB_FN double nb__exp2_parts(double z, double *p)
{
    const double shift = 0x1.8p52; /* z + shift holds round(z) in its low bits */
    const double t = z + shift;
    const double r = z - (t - shift);
    const double r2 = r * r; /* Estrin's scheme, as in nb__erfc_abs */
    const double q01 = 0.6931471805568324 + 0.24022650695888503 * r;
    const double q23 = 0.055504109063258665 + 0.00961812913523614 * r;
    const double q45 = 0.0013333478473685416 + 0.00015403475186530786 * r;
    const double q67 = 1.5303700711365693e-05 + 1.325080551750225e-06 * r;
    *p = r * ((q01 + q23 * r2) + (q45 + q67 * r2) * (r2 * r2));
    return nb__bits_double((nb__double_bits(t) + 1023) << 52); /* k's two's complement is t's low bits */
}

/* log(w) for a positive, finite, normal w: w = 2^e m with m in [sqrt(1/2),
 * sqrt(2)), log m = 2 atanh(s) for s = (m - 1) / (m + 1), |s| <= 0.1716, by
 * its series to s^15 (relative error 2^-41). e and m come from w's bits moved
 * by sqrt(1/2)'s, so that m's range starts there: no compare, no select. */
NB_FN double nb__log_normal(double w)
{
    const uint64_t u = nb__double_bits(w) + (0x3ff0000000000000ULL - 0x3fe6a09e667f3bcdULL);
    /* e + 2^52 + 1023 as a double made from the exponent's bits, then e */
    const double e = nb__bits_double(0x4330000000000000ULL | (u >> 52)) - (0x1p52 + 1023.0);
    const double m = nb__bits_double((u & 0x000fffffffffffffULL) + 0x3fe6a09e667f3bcdULL);
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    const double s4 = s2 * s2; /* Estrin's scheme, as in nb__erfc_abs */
    const double q = ((1.0 / 3 + 1.0 / 5 * s2) + (1.0 / 7 + 1.0 / 9 * s2) * s4) +
                     ((1.0 / 11 + 1.0 / 13 * s2) + 1.0 / 15 * s4) * (s4 * s4);
    return e * 0.6931471805599453 + (2.0 * s + 2.0 * s * (s2 * q));
}

/* log w for a positive, finite, normal w to within 2^-51 of it (pow's, and
 * the random normals'): as nb__log_normal, its series summed to s^21 (the
 * next term is below 2^-60 of the result), and ln 2 in two parts, so that
 * e ln 2's first part is exact. */
NB_FN double nb__log_fine(double w)
{
    const uint64_t u = nb__double_bits(w) + (0x3ff0000000000000ULL - 0x3fe6a09e667f3bcdULL);
    const double e = nb__bits_double(0x4330000000000000ULL | (u >> 52)) - (0x1p52 + 1023.0);
    const double m = nb__bits_double((u & 0x000fffffffffffffULL) + 0x3fe6a09e667f3bcdULL);
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s, s4 = s2 * s2, s8 = s4 * s4;
    const double q = (((1.0 / 3 + 1.0 / 5 * s2) + (1.0 / 7 + 1.0 / 9 * s2) * s4) +
                      ((1.0 / 11 + 1.0 / 13 * s2) + (1.0 / 15 + 1.0 / 17 * s2) * s4) * s8) +
                     (1.0 / 19 + 1.0 / 21 * s2) * (s8 * s8);
    const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33;
    return e * ln2_hi + ((e * ln2_lo + 2.0 * s * (s2 * q)) + 2.0 * s);
}

/* e^x = scale (1 + *p), nb__exp2_parts of x log2 e, x clamped to [-110, 100]
 * first, past which a float result is 0 or inf anyway; a NaN fails both
 * compares and stays NaN. */
NB_FN double nb__exp_parts(float x, double *p)
{
    float xc = x > 100.0f ? 100.0f : x;
    xc = xc < -110.0f ? -110.0f : xc;
    return nb__exp2_parts((double)xc * 1.4426950408889634, p);
}

NB_FN float nb_expf(float x)
{
    double p;
    const double scale = nb__exp_parts(x, &p);
    return (float)((1.0 + p) * scale);
}

/* e^x - 1 = (2^k - 1) + 2^k p: no cancellation (for k = 0 it is p); below
 * 2^-30 it is x to float's precision (and keeps -0). */
NB_FN float nb_expm1f(float x)
{
    double p;
    const double scale = nb__exp_parts(x, &p);
    const float y = (float)((scale - 1.0) + scale * p);
    return __builtin_fabsf(x) < 0x1p-30f ? x : y;
}

/* erfc |x| = t e^(-x^2 + g(t)) for t = 1 / (1 + |x| / 2), g of degree 16 in
 * t (relative error 2^-39: a Chebyshev fit of log(erfc(|x|) / t) + x^2 over
 * |x| in [0, 11]; |x| is clamped to 11, past which erfc is 0 in float), and
 * erfc x = 2 - erfc |x| below 0. A NaN goes through as NaN. */
NB_FN double nb__erfc_abs(float x, double *a_out)
{
    double a = (double)x;
    a = a < 0 ? -a : a;
    a = a > 11.0 ? 11.0 : a;
    *a_out = a;
    const double t = 1.0 / (1.0 + 0.5 * a);
    /* Estrin's scheme: a short chain of dependent operations, so that the
     * iterations of a vectorised loop overlap */
    const double t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    const double p01 = -1.265512897792885 + 1.0000326024765 * t, p23 = 0.3743776796757403 + 0.0904698112871604 * t;
    const double p45 = -0.14083712529929845 + 0.15558977620363482 * t, p67 = -1.2815582898009237 + 3.51154383465738 * t;
    const double p89 = -7.317108378770192 + 11.408906499657713 * t, pab = -11.11865107118424 + 4.878244882249847 * t;
    const double pcd = 1.9402552593731803 - 4.113908224807878 * t, pef = 2.560364034601602 - 0.7810106020444999 * t;
    const double p03 = p01 + p23 * t2, p47 = p45 + p67 * t2, p8b = p89 + pab * t2, pcf = pcd + pef * t2;
    const double p07 = p03 + p47 * t4, p8f = p8b + pcf * t4;
    const double g = p07 + (p8f + 0.09880220951833689 * t8) * t8;
    double p;
    const double scale = nb__exp2_parts((g - a * a) * 1.4426950408889634, &p);
    return t * ((1.0 + p) * scale);
}
NB_FN float nb_erfcf(float x)
{
    double a;
    const double r = nb__erfc_abs(x, &a);
    return (float)(x < 0 ? 2.0 - r : r);
}

/* erf x = 1 - erfc |x| with x's sign from |x| = 1/2 up, and below, where that
 * would cancel, its series 2x / sqrt(pi) sum (-x^2)^n / (n! (2n + 1)) to n =
 * 10 (relative error 2^-46). */
NB_FN float nb_erff(float x)
{
    double a;
    const double r = 1.0 - nb__erfc_abs(x, &a);
    const double x2 = (double)x * (double)x;
    double s = -1.0 / 76204800.0; /* (-1)^n / (n! (2n + 1)), n = 10 down to 1 */
    s = s * x2 + 1.0 / 6894720.0;
    s = s * x2 - 1.0 / 685440.0;
    s = s * x2 + 1.0 / 75600.0;
    s = s * x2 - 1.0 / 9360.0;
    s = s * x2 + 1.0 / 1320.0;
    s = s * x2 - 1.0 / 216.0;
    s = s * x2 + 1.0 / 42.0;
    s = s * x2 - 1.0 / 10.0;
    s = s * x2 + 1.0 / 3.0;
    const double series = 1.1283791670955126 * ((double)x * (1.0 - x2 * s)); /* keeps -0 */
    const double big = x < 0 ? -r : r;
    return (float)(a < 0.5 ? series : big);
}

/* A float's double is normal: every positive finite x goes through the
 * formula; 0, negatives, inf and NaN are selected after. */
NB_FN float nb_logf(float x)
{
    float y = (float)nb__log_normal((double)x);
    y = x == (float)INFINITY ? x : y;
    y = x == 0 ? -(float)INFINITY : y;
    y = x < 0 ? (float)NAN : y;
    return x != x ? x : y;
}

/* 1 + x is exact in double for |x| >= 2^-29; below that log1p(x) is x to
 * float's precision (and keeps -0). */
NB_FN float nb_log1pf(float x)
{
    const double w = 1.0 + (double)x;
    float y = (float)nb__log_normal(w > 0 ? w : 1.0);
    y = __builtin_fabsf(x) < 0x1p-29f ? x : y;
    y = x == (float)INFINITY ? x : y;
    y = x == -1.0f ? -(float)INFINITY : y;
    y = x < -1.0f ? (float)NAN : y;
    return x != x ? x : y;
}

/* tanh |x| = -m / (m + 2) for m = e^(-2|x|) - 1, made as (2^k - 1) + 2^k p
 * (no cancellation: for k = 0 it is p); |x| is clamped to 10, past which the
 * float result is 1; the sign is x's (-0 and NaN included). */
NB_FN float nb_tanhf(float x)
{
    float a = x < 0 ? -x : x;
    a = a > 10.0f ? 10.0f : a;
    double p;
    const double scale = nb__exp2_parts((double)a * -2.8853900817779268, &p);
    const double m = (scale - 1.0) + scale * p;
    return __builtin_copysignf((float)(-m / (m + 2.0)), x);
}

/* x^y for floats, the C standard's special cases included: |x|^y =
 * 2^(y log2 |x|) in double (the exponent within 2^-43 of the truth, clamped
 * to [-200, 200], past which a float is 0 or inf), signed for a negative x
 * and an odd y, NaN for a negative x and a y that is no whole number; then
 * the cases of 0, inf, 1 and NaN selected. Every float past 2^24 is an even
 * whole number; below it, y + 1.5 2^52 holds y's parity in its last bit. */
NB_FN float nb_powf(float x, float y)
{
    const float ax = __builtin_fabsf(x), ay = __builtin_fabsf(y);
    const double yd = (double)y, t = yd + 0x1.8p52;
    const bool small_y = ay < 0x1p24f;
    const bool y_whole = !small_y | (t - 0x1.8p52 == yd);
    const bool y_odd = small_y & y_whole & ((nb__double_bits(t) & 1) != 0);
    /* (0, inf and NaN give nonsense here, replaced below) */
    double z = yd * (nb__log_fine((double)ax) * 1.4426950408889634);
    z = z > 200.0 ? 200.0 : z;
    z = z < -200.0 ? -200.0 : z;
    double p;
    const double scale = nb__exp2_parts(z, &p);
    float r = (float)((1.0 + p) * scale);
    const bool neg = (x < 0) & y_odd;
    r = neg ? -r : r;
    r = ((x < 0) & !y_whole) ? (float)NAN : r;
    /* x = +-0: inf for y < 0, 0 for y > 0, x's sign where y is odd */
    float edge = y < 0 ? (float)INFINITY : 0.0f;
    r = ax == 0 ? (y_odd ? __builtin_copysignf(edge, x) : edge) : r;
    /* x = +-inf: the other way round */
    edge = y < 0 ? 0.0f : (float)INFINITY;
    r = ax == (float)INFINITY ? (neg ? -edge : edge) : r;
    /* y = +-inf: inf where |x| < 1 and y < 0 or |x| > 1 and y > 0, 0 where the
     * other, 1 where |x| = 1 */
    edge = (ax < 1.0f) == (y < 0) ? (float)INFINITY : 0.0f;
    edge = ax == 1.0f ? 1.0f : edge;
    r = ay == (float)INFINITY ? edge : r;
    r = ((x != x) | (y != y)) ? x + y : r;
    r = x == 1.0f ? 1.0f : r; /* even for a NaN y */
    return y == 0 ? 1.0f : r; /* even for a NaN x */
}

/* sin(q pi/2 + r) for |r| <= pi/4 (a little more where q was rounded the
 * other way), rounded to float: sin r to r^13 or cos r to r^12 (their next
 * terms are below 2^-45 and 2^-41 of the result), picked and signed by q's
 * two low bits. */
NB_FN float nb__sin_quadrant(double r, uint64_t q)
{
    const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    /* r (1 + ...), not r + r (...), which makes sin -0 +0 */
    const double s = r * (1.0 + r2 * (((-1.0 / 6 + 1.0 / 120 * r2) + (-1.0 / 5040 + 1.0 / 362880 * r2) * r4) +
                                      (-1.0 / 39916800 + 1.0 / 6227020800.0 * r2) * r8));
    const double c = 1.0 + r2 * (((-1.0 / 2 + 1.0 / 24 * r2) + (-1.0 / 720 + 1.0 / 40320 * r2) * r4) +
                                 (-1.0 / 3628800 + 1.0 / 479001600 * r2) * r8);
    const double v = (q & 1) ? c : s;
    return (float)((q & 2) ? -v : v);
}

/* x = k pi/2 + r for |x| <= 2^20: k = round(x 2/pi) (its low bits in *q),
 * r = (x - k p1) - k p2 with pi/2 = p1 + p2 + 3.5e-27, p1 of 31 bits so that
 * k p1 and x - k p1 are exact (|k| < 2^20): r is within 2^-66 of the truth,
 * and no float this small is nearer than 2^-29 to a multiple of pi/2. */
NB_FN double nb__trig_reduce_near(float x, uint64_t *q)
{
    const double t = (double)x * 0.63661977236758138 + 0x1.8p52;
    *q = nb__double_bits(t);
    const double k = t - 0x1.8p52;
    return ((double)x - k * 0x1.921fb544p0) - k * 0x1.0b4611a626331p-34;
}

/* x = k pi/2 + r for a finite float |x| > 2^20 (Payne and Hanek): with x = m
 * 2^e, the bits of 2/pi above 4 / (m 2^e) only add whole turns, so m times
 * the next 96 bits, modulo 2^96, is x 2/pi modulo 4 with 94 bits after the
 * point (the rest of 2/pi adds under 2^-70); k is its nearest whole number. */
NB_FN_RARE double nb__trig_reduce_far(float x, uint64_t *q)
{
    static const uint32_t two_over_pi[10] = {0, /* then 2/pi's bits from the first after the point */
                                             0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u,
                                             0x3c439041u, 0xfe5163abu, 0xdebbc561u, 0xb7246e3au};
    uint32_t b;
    __builtin_memcpy(&b, &x, sizeof b);
    const int e = (int)((b >> 23) & 0xff) - 150; /* -3 .. 104 here */
    const uint64_t m = (b & 0x7fffffu) | 0x800000u;
    const int g = e + 30; /* 2/pi's bit e - 1 in the table (its bit i at i + 31) */
    const int w = g >> 5, sh = g & 31;
    uint64_t c[3];
    for (int i = 0; i < 3; i++)
        c[i] = sh ? (uint32_t)(two_over_pi[w + i] << sh | two_over_pi[w + i + 1] >> (32 - sh)) : two_over_pi[w + i];
    const uint64_t p2 = m * c[2], p1 = m * c[1], p0 = m * c[0];
    const uint64_t mid = (p2 >> 32) + (uint32_t)p1;
    const uint32_t lo = (uint32_t)p2, hi = (uint32_t)((mid >> 32) + (p1 >> 32) + p0);
    /* y 2^94 = hi 2^64 + mid 2^32 + lo: the quadrant is hi's top 2 bits; f
     * the 64 bits after the point, rounded to the nearest quadrant as a
     * signed fraction */
    const uint64_t f = (uint64_t)(hi & 0x3fffffffu) << 34 | (uint64_t)(uint32_t)mid << 2 | lo >> 30;
    uint64_t k = (uint64_t)(hi >> 30) + (f >> 63);
    double r = ((double)(int64_t)f * 0x1p-64 + (double)(lo & 0x3fffffffu) * 0x1p-94) * 1.5707963267948966;
    if (b >> 31) {
        r = -r;
        k = 0 - k;
    }
    *q = k;
    return r;
}

/* The near reduction's sine and cosine, without a branch (vectorised loops
 * call them for every x, then redo the rare |x| > 2^20 with nb_sinf and
 * nb_cosf: ops/cpu/cpu_unary.c). */
NB_FN float nb__sinf_near(float x)
{
    uint64_t q;
    const double r = nb__trig_reduce_near(x, &q);
    return nb__sin_quadrant(r, q);
}
NB_FN float nb__cosf_near(float x)
{
    uint64_t q;
    const double r = nb__trig_reduce_near(x, &q);
    return nb__sin_quadrant(r, q + 1);
}

/* sin(x + quarter pi/2) of any float (quarter 0: sin, 1: cos); inf and NaN
 * give NaN (x - x). */
NB_FN_RARE float nb__sinf_turned(float x, uint64_t quarter)
{
    uint64_t q;
    if (__builtin_fabsf(x) <= 0x1p20f) {
        const double r = nb__trig_reduce_near(x, &q);
        return nb__sin_quadrant(r, q + quarter);
    }
    if (x - x != 0)
        return x - x;
    const double r = nb__trig_reduce_far(x, &q);
    return nb__sin_quadrant(r, q + quarter);
}
NB_FN_RARE float nb_sinf(float x) { return nb__sinf_turned(x, 0); }
NB_FN_RARE float nb_cosf(float x) { return nb__sinf_turned(x, 1); }
#endif

#define NB_T float
#define NB_F(fn) fn##f
#define NB_MATH NB_MATH_F32
#define NB_SUF(name) name##_f32
#include "formulas_float.inc"

/* The double pass defines the references (the comparisons' too). */
#undef NB_REF_UN
#undef NB_REF_BIN
#define NB_REF_UN NB_REF_DEFINE_UN
#define NB_REF_BIN NB_REF_DEFINE_BIN
#define NB_T double
#define NB_F(fn) fn
#define NB_MATH(fn) fn
#define NB_SUF(name) name##_f64
#include "formulas_float.inc"
#undef NB_REF_UN
#undef NB_REF_BIN
#define NB_REF_UN NB_REF_SKIP
#define NB_REF_BIN NB_REF_SKIP

#define NB_T int32_t
#define NB_U uint32_t
#define NB_T_LO -2147483648.0
#define NB_T_HI 2147483647.0
#define NB_SUF(name) name##_i32
#include "formulas_int.inc"

/* The top is the largest double below 2^63, so the conversion back is defined. */
#define NB_T int64_t
#define NB_U uint64_t
#define NB_T_LO -9223372036854775808.0
#define NB_T_HI 9223372036854774784.0
#define NB_SUF(name) name##_i64
#include "formulas_int.inc"

/* bool and u8: comparisons only. */
#define NB_T uint8_t
#define NB_SUF(name) name##_u8
#include "formulas_cmp.inc"

#undef NB_REF_UN
#undef NB_REF_BIN
#undef NB_REF_SKIP
#undef NB_REF_DEFINE_UN
#undef NB_REF_DEFINE_BIN

/* ---- nb_cast from floating to integer types, on every device ----
 * Truncates toward zero, saturates at the type's range and takes NaN to 0; to
 * u8 it goes through i32 and wraps. Written out because neither C nor the GPU
 * gives this by itself: a C conversion of NaN or of an out-of-range value is
 * undefined, and PTX's cvt.rzi gives INT_MIN (INT64_MIN) for NaN. f16 and bf16
 * come here widened to float or double. */
NB_FN int32_t nb_cast_to_i32(double v)
{
    return !(v == v) ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
}
/* 2^63 is a double and INT64_MAX is not: v at or past either end saturates. */
NB_FN int64_t nb_cast_to_i64(double v)
{
    return !(v == v) ? 0 : v >= 9223372036854775808.0 ? INT64_MAX : v < -9223372036854775808.0 ? INT64_MIN : (int64_t)v;
}
NB_FN uint8_t nb_cast_to_u8(double v) { return (uint8_t)(uint32_t)nb_cast_to_i32(v); }

#endif
