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
 * For doubles, exp, expm1, tanh, sin, cos, log, log1p, pow, erf and erfc
 * are nabla's own too (nb__exp_d and the others, below: within 0.52, 1.01,
 * 1.5, 0.81, 0.81, 0.501, 0.501, 0.52, 0.6 and 0.72 ulp, vectorising the
 * same way, exp, log and erfc with tables that a vector loop gathers from,
 * pow from exp's and log's parts, erf from erfc's, sin and cos redoing x
 * past 2^20 with libm's). NB_MATH_F32(fn) and NB_MATH_F64(fn) name the ones
 * the f32 and f64 formulas call: nabla's on the CPU, CUDA's on the GPU (its
 * formulas compile with __CUDACC__). */
#ifdef __CUDACC__
#define NB_MATH_F32(fn) fn##f
#define NB_MATH_F64(fn) fn
#else
#define NB_MATH_F32(fn) nb_##fn##f
#define NB_MATH_F64(fn) nb__##fn##_d

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

/* cond ? a : b through the bits: GCC threads a ?: that makes a constant, or
 * whose condition is used again, into branches, and a loop whose table
 * reads it has put in one branch (or folded in the other) does not
 * vectorise. */
NB_FN double nb__pick(int cond, double a, double b)
{
    const uint64_t mask = (uint64_t)0 - (uint64_t)(cond != 0);
    return nb__bits_double((nb__double_bits(a) & mask) | (nb__double_bits(b) & ~mask));
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
    /* 64-bit flags, as in nb__pow_d: a bool made of the 64-bit parity
     * keeps a loop of two varying x and y from vectorising */
    const uint64_t small_y = ay < 0x1p24f;
    const uint64_t y_whole = (small_y ^ 1) | (uint64_t)(t - 0x1.8p52 == yd);
    const uint64_t y_odd = small_y & y_whole & nb__double_bits(t) & 1;
    /* (0, inf and NaN give nonsense here, replaced below) */
    double z = yd * (nb__log_fine((double)ax) * 1.4426950408889634);
    z = z > 200.0 ? 200.0 : z;
    z = z < -200.0 ? -200.0 : z;
    double p;
    const double scale = nb__exp2_parts(z, &p);
    float r = (float)((1.0 + p) * scale);
    const uint64_t neg = (uint64_t)(x < 0) & y_odd;
    r = neg ? -r : r;
    r = ((uint64_t)(x < 0) & (y_whole ^ 1)) ? (float)NAN : r;
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
    r = y != y ? y : r;
    r = x != x ? x : r; /* as nb__pow_d */
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

/* ---- double: exp, expm1, tanh, sin, cos, log, log1p, pow, erf and erfc of nabla's own (the CPU's f64 formulas) ---- */

/* 2^(j / 64) for j = 0..63 in two parts: the double nearest, and the rest. */
static const double nb__exp2_64ths[64][2] = {
    {0x1.0000000000000p+0, 0x0.0p+0}, {0x1.02c9a3e778061p+0, -0x1.19083535b085dp-56},
    {0x1.059b0d3158574p+0, 0x1.d73e2a475b465p-55}, {0x1.0874518759bc8p+0, 0x1.186be4bb284ffp-57},
    {0x1.0b5586cf9890fp+0, 0x1.8a62e4adc610bp-54}, {0x1.0e3ec32d3d1a2p+0, 0x1.03a1727c57b53p-59},
    {0x1.11301d0125b51p+0, -0x1.6c51039449b3ap-54}, {0x1.1429aaea92de0p+0, -0x1.32fbf9af1369ep-54},
    {0x1.172b83c7d517bp+0, -0x1.19041b9d78a76p-55}, {0x1.1a35beb6fcb75p+0, 0x1.e5b4c7b4968e4p-55},
    {0x1.1d4873168b9aap+0, 0x1.e016e00a2643cp-54}, {0x1.2063b88628cd6p+0, 0x1.dc775814a8495p-55},
    {0x1.2387a6e756238p+0, 0x1.9b07eb6c70573p-54}, {0x1.26b4565e27cddp+0, 0x1.2bd339940e9d9p-55},
    {0x1.29e9df51fdee1p+0, 0x1.612e8afad1255p-55}, {0x1.2d285a6e4030bp+0, 0x1.0024754db41d5p-54},
    {0x1.306fe0a31b715p+0, 0x1.6f46ad23182e4p-55}, {0x1.33c08b26416ffp+0, 0x1.32721843659a6p-54},
    {0x1.371a7373aa9cbp+0, -0x1.63aeabf42eae2p-54}, {0x1.3a7db34e59ff7p+0, -0x1.5e436d661f5e3p-56},
    {0x1.3dea64c123422p+0, 0x1.ada0911f09ebcp-55}, {0x1.4160a21f72e2ap+0, -0x1.ef3691c309278p-58},
    {0x1.44e086061892dp+0, 0x1.89b7a04ef80d0p-59}, {0x1.486a2b5c13cd0p+0, 0x1.3c1a3b69062f0p-56},
    {0x1.4bfdad5362a27p+0, 0x1.d4397afec42e2p-56}, {0x1.4f9b2769d2ca7p+0, -0x1.4b309d25957e3p-54},
    {0x1.5342b569d4f82p+0, -0x1.07abe1db13cadp-55}, {0x1.56f4736b527dap+0, 0x1.9bb2c011d93adp-54},
    {0x1.5ab07dd485429p+0, 0x1.6324c054647adp-54}, {0x1.5e76f15ad2148p+0, 0x1.ba6f93080e65ep-54},
    {0x1.6247eb03a5585p+0, -0x1.383c17e40b497p-54}, {0x1.6623882552225p+0, -0x1.bb60987591c34p-54},
    {0x1.6a09e667f3bcdp+0, -0x1.bdd3413b26456p-54}, {0x1.6dfb23c651a2fp+0, -0x1.bbe3a683c88abp-57},
    {0x1.71f75e8ec5f74p+0, -0x1.16e4786887a99p-55}, {0x1.75feb564267c9p+0, -0x1.0245957316dd3p-54},
    {0x1.7a11473eb0187p+0, -0x1.41577ee04992fp-55}, {0x1.7e2f336cf4e62p+0, 0x1.05d02ba15797ep-56},
    {0x1.82589994cce13p+0, -0x1.d4c1dd41532d8p-54}, {0x1.868d99b4492edp+0, -0x1.fc6f89bd4f6bap-54},
    {0x1.8ace5422aa0dbp+0, 0x1.6e9f156864b27p-54}, {0x1.8f1ae99157736p+0, 0x1.5cc13a2e3976cp-55},
    {0x1.93737b0cdc5e5p+0, -0x1.75fc781b57ebcp-57}, {0x1.97d829fde4e50p+0, -0x1.d185b7c1b85d1p-54},
    {0x1.9c49182a3f090p+0, 0x1.c7c46b071f2bep-56}, {0x1.a0c667b5de565p+0, -0x1.359495d1cd533p-54},
    {0x1.a5503b23e255dp+0, -0x1.d2f6edb8d41e1p-54}, {0x1.a9e6b5579fdbfp+0, 0x1.0fac90ef7fd31p-54},
    {0x1.ae89f995ad3adp+0, 0x1.7a1cd345dcc81p-54}, {0x1.b33a2b84f15fbp+0, -0x1.2805e3084d708p-57},
    {0x1.b7f76f2fb5e47p+0, -0x1.5584f7e54ac3bp-56}, {0x1.bcc1e904bc1d2p+0, 0x1.23dd07a2d9e84p-55},
    {0x1.c199bdd85529cp+0, 0x1.11065895048ddp-55}, {0x1.c67f12e57d14bp+0, 0x1.2884dff483cadp-54},
    {0x1.cb720dcef9069p+0, 0x1.503cbd1e949dbp-56}, {0x1.d072d4a07897cp+0, -0x1.cbc3743797a9cp-54},
    {0x1.d5818dcfba487p+0, 0x1.2ed02d75b3707p-55}, {0x1.da9e603db3285p+0, 0x1.c2300696db532p-54},
    {0x1.dfc97337b9b5fp+0, -0x1.1a5cd4f184b5cp-54}, {0x1.e502ee78b3ff6p+0, 0x1.39e8980a9cc8fp-55},
    {0x1.ea4afa2a490dap+0, -0x1.e9c23179c2893p-54}, {0x1.efa1bee615a27p+0, 0x1.dc7f486a4b6b0p-54},
    {0x1.f50765b6e4540p+0, 0x1.9d3e12dd8a18bp-54}, {0x1.fa7c1819e90d8p+0, 0x1.74853f3a5931ep-55}};

/* e^x = 2^n 2^(j / 64) e^r for x = (64 n + j) (ln 2 / 64) + r, |r| <= ln 2 / 128:
 * returns 2^(j / 64)'s first part, *lo its second, *p = e^r - 1 by its series
 * to r^7 (the next term is below 2^-64 of 1), and *s1, *s2 two powers of two
 * whose product is 2^n (each a normal double, so that scaling by one then the
 * other rounds once, also into the subnormals). Right for x in [-746, 710],
 * past which e^x is 0 or inf in double: there the parts are meaningless (but
 * made without undefined behaviour) and the callers select. No clamp: GCC
 * threads a clamped x's constant table index into a branch, and the loop no
 * longer vectorises. ln 2 / 64 comes in two parts, the first of 36 bits, so
 * that k times it is exact for every |k| < 2^17 here. k is made as in
 * nb__exp2_parts, then moved up by 2^17 so that the integer work is unsigned
 * (it vectorises without AVX-512's 64-bit shifts). */
NB_FN double nb__exp_d_parts(double x, double *lo, double *p, double *s1, double *s2)
{
    const double shift = 0x1.8p52;
    const double t = x * 0x1.71547652b82fep+6 + shift;
    const double kf = t - shift;
    const double r = (x - kf * 0x1.62e42fefa0000p-7) - kf * 0x1.cf79abc9e3b3ap-46;
    *p = r + r * r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 + r * (1.0 / 5040))))));
    const uint64_t kb = nb__double_bits(t) - nb__double_bits(shift) + (1ULL << 17); /* k + 2^17 >= 0 */
    const uint64_t j = kb & 63, nb = kb >> 6, h = nb >> 1; /* nb = n + 2^11, h = floor(n / 2) + 2^10 */
    *s1 = nb__bits_double((h - 1) << 52);       /* 2^floor(n / 2) */
    *s2 = nb__bits_double((nb - h - 1) << 52);  /* 2^(n - floor(n / 2)) */
    *lo = nb__exp2_64ths[j][1];
    return nb__exp2_64ths[j][0];
}

/* e^x from nb__exp_d_parts' parts. */
NB_FN double nb__exp_d_join(double hi, double lo, double p, double s1, double s2)
{
    return ((hi + (lo + hi * p)) * s1) * s2;
}

/* e^x: within 0.52 ulp, 0.76 where the result is subnormal (test_cpu_math
 * measures it against long double); 0 below -746 and inf above 710 (and for
 * the infinities); a NaN stays NaN. */
NB_FN double nb__exp_d(double x)
{
    double lo, p, s1, s2;
    const double hi = nb__exp_d_parts(x, &lo, &p, &s1, &s2);
    double y = nb__exp_d_join(hi, lo, p, s1, s2);
    y = x > 710.0 ? (double)INFINITY : y;
    return nb__pick(x < -746.0, 0.0, y); /* a constant from ?: would be threaded into what uses it */
}

/* e^x - 1: below |x| = 0.35 its series to x^15 (the next term is below 2^-60
 * of the result), which keeps the digits that (S - 1) + (2^n lo + S p) loses
 * to cancellation there; above, that form, for S = 2^n hi, where S - 1 is
 * exact for every n from -1 to 52 (below, the result is near -1; above, 1 is
 * below S's last place); past 40, e^x itself (S alone would overflow first),
 * below -40, -1. Below 2^-54 it is x (and keeps -0). Within 1.01 ulp. */
NB_FN double nb__expm1_d(double x)
{
    double lo, p, s1, s2;
    const double hi = nb__exp_d_parts(x, &lo, &p, &s1, &s2);
    const double S = (hi * s1) * s2;
    const double far = (S - 1.0) + ((lo * s1) * s2 + S * p);
    const double big = nb__exp_d_join(hi, lo, p, s1, s2);
    double q = 1.0 / 1307674368000; /* 1 / 15!, then down to 1 / 2! */
    q = q * x + 1.0 / 87178291200;
    q = q * x + 1.0 / 6227020800;
    q = q * x + 1.0 / 479001600;
    q = q * x + 1.0 / 39916800;
    q = q * x + 1.0 / 3628800;
    q = q * x + 1.0 / 362880;
    q = q * x + 1.0 / 40320;
    q = q * x + 1.0 / 5040;
    q = q * x + 1.0 / 720;
    q = q * x + 1.0 / 120;
    q = q * x + 1.0 / 24;
    q = q * x + 1.0 / 6;
    q = q * x + 0.5;
    const double near = x + (x * x) * q;
    const double a = __builtin_fabs(x);
    double y = a < 0.35 ? near : far;
    y = x > 40.0 ? big : y;
    y = x > 710.0 ? (double)INFINITY : y;
    y = x < -40.0 ? -1.0 : y; /* e^x is below 2^-54 */
    return a < 0x1p-54 ? x : y;
}

/* tanh |x|: below 0.55 its series to x^41 (the next term is below 2^-56 of
 * the result; the sum after x is less than a tenth of it, so its rounding
 * hardly shows), from there 1 - 2 / (e^(2|x|) + 1), whose second part is at
 * most a half (and which is 1 from 19 up, where e^(2|x|) swamps the 1, to
 * inf, where it is inf; unclamped, as nb__exp_d_parts says why). The sign is
 * x's (-0 and NaN included). Within 1.5 ulp (glibc's within 2.2). */
NB_FN double nb__tanh_d(double x)
{
    const double a = __builtin_fabs(x);
    const double u = a * a;
    double q = 0x1.8e25ff9327e2cp-27; /* x^41's, then down to x^3's */
    q = q * u + -0x1.eb3229047434cp-26;
    q = q * u + 0x1.2efe8db3aff1fp-24;
    q = q * u + -0x1.75cde6563fed9p-23;
    q = q * u + 0x1.cd299de4ae6bbp-22;
    q = q * u + -0x1.1c77df95c1c0dp-20;
    q = q * u + 0x1.5ef2da474e5b7p-19;
    q = q * u + -0x1.b0f72d3ee24e9p-18;
    q = q * u + 0x1.0b132d39a6050p-16;
    q = q * u + -0x1.497d8eea25259p-15;
    q = q * u + 0x1.967e18afcafadp-14;
    q = q * u + -0x1.f57d7734d1664p-13;
    q = q * u + 0x1.3558248036744p-11;
    q = q * u + -0x1.7da36452b75e3p-10;
    q = q * u + 0x1.d6d3d0e157de0p-9;
    q = q * u + -0x1.226e355e6c23dp-7;
    q = q * u + 0x1.664f4882c10fap-6;
    q = q * u + -0x1.ba1ba1ba1ba1cp-5;
    q = q * u + 0x1.1111111111111p-3;
    q = q * u + -0x1.5555555555555p-2;
    const double near = a + a * (u * q);
    const double far = 1.0 - 2.0 / (nb__exp_d(2.0 * a) + 1.0);
    return __builtin_copysign(a < 0.55 ? near : far, x);
}

/* sin (quarter 0) or cos (quarter 1) of a double x with |x| <= 2^20: x =
 * k pi/2 + r, |r| <= pi/4, with pi/2 in three parts (the first two of 33
 * bits, so that k times them is exact) and r kept as rh + rl (the roundings
 * of the two subtractions caught by TwoSum), so that r's digits survive an x
 * near a multiple of pi/2; then sin r or cos r by their series to r^17 and
 * r^18 (the next terms are below 2^-62 of the result), cos in 1 - r^2/2's two
 * parts, and the quarter k + quarter picks which and its sign. Beyond 2^20,
 * and for inf and NaN, nb__sin_d and nb__cos_d call libm; a loop runs this
 * form on every x and redoes those (ops/cpu/cpu_unary.c). */
NB_FN double nb__sin_d_near(double x, uint64_t quarter)
{
    const double shift = 0x1.8p52;
    const double t = x * 0x1.45f306dc9c883p-1 + shift;
    const double kf = t - shift;
    const double a = x - kf * 0x1.921fb54400000p+0, b = kf * 0x1.0b4611a600000p-34; /* both exact */
    const double y = a - b, bb = y - a, ey = (a - (y - bb)) - (b + bb); /* TwoSum: y + ey = a - b */
    const double c = kf * 0x1.3198a2e037073p-69;
    const double rh = y - c, rl = ((y - rh) - c) + ey;
    const double z = rh * rh;
    double S = 0x1.952c77030ad4ap-49; /* 1 / 17!, then down to -1 / 3! */
    S = S * z + -0x1.ae7f3e733b81fp-41;
    S = S * z + 0x1.6124613a86d09p-33;
    S = S * z + -0x1.ae64567f544e4p-26;
    S = S * z + 0x1.71de3a556c734p-19;
    S = S * z + -0x1.a01a01a01a01ap-13;
    S = S * z + 0x1.1111111111111p-7;
    S = S * z + -0x1.5555555555555p-3;
    double C = -0x1.6827863b97d97p-53; /* -1 / 18!, then down to 1 / 4! */
    C = C * z + 0x1.ae7f3e733b81fp-45;
    C = C * z + -0x1.93974a8c07c9dp-37;
    C = C * z + 0x1.1eed8eff8d898p-29;
    C = C * z + -0x1.27e4fb7789f5cp-22;
    C = C * z + 0x1.a01a01a01a01ap-16;
    C = C * z + -0x1.6c16c16c16c17p-10;
    C = C * z + 0x1.5555555555555p-5;
    const double sn = rh + (rh * (z * S) + rl * (1.0 - 0.5 * z));
    const double hz = 0.5 * z, w = 1.0 - hz;
    const double cs = w + (((1.0 - w) - hz) + (z * z * C - rh * rl));
    const uint64_t q = nb__double_bits(t) + quarter; /* k's low bits, plus the quarter */
    double v = (q & 1) ? cs : sn;
    v = (q & 2) ? -v : v;
    return __builtin_fabs(x) < 0x1p-27 ? (quarter ? 1.0 : x) : v; /* sin x is x there, and keeps -0 */
}
NB_FN_RARE double nb__sin_d(double x) { return __builtin_fabs(x) <= 0x1p20 ? nb__sin_d_near(x, 0) : sin(x); }
NB_FN_RARE double nb__cos_d(double x) { return __builtin_fabs(x) <= 0x1p20 ? nb__sin_d_near(x, 1) : cos(x); }

/* For log: the 128 intervals of m in [0x1.5fp-1, 0x1.5fp+0) that 2^45 of
 * its bit patterns make, each with c, the inverse of its middle to 11
 * significant bits (1 for the interval around 1, [1 - 2^-9, 1 + 2^-8)), and
 * -log c in two parts: the first a multiple of 2^-42, the rest. */
static const double nb__log_c[128][3] = {
    {0x1.7440000000000p+0, -0x1.7f5fa09d58000p-2, 0x1.6d73cd356a371p-44}, {0x1.7240000000000p+0, -0x1.79db6681b0000p-2, 0x1.4d319161a11f8p-44},
    {0x1.7040000000000p+0, -0x1.744f8633f2000p-2, 0x1.91e9d1816c06cp-46}, {0x1.6e00000000000p+0, -0x1.6e08eaa2ba000p-2, -0x1.e38c139318d71p-46},
    {0x1.6c00000000000p+0, -0x1.686c81e9b1000p-2, -0x1.2bb110af84054p-44}, {0x1.6a00000000000p+0, -0x1.62c82f2b9c000p-2, -0x1.e54bdbd7c8a98p-44},
    {0x1.6800000000000p+0, -0x1.5d1bdbf581000p-2, 0x1.8d6bdc9c7c238p-44}, {0x1.6600000000000p+0, -0x1.5767717456000p-2, 0x1.64ead9524d7cap-44},
    {0x1.6440000000000p+0, -0x1.5262deeb99000p-2, 0x1.e1b9f70894a01p-44}, {0x1.6240000000000p+0, -0x1.4c9f09e153000p-2, 0x1.e1dde70e02de0p-45},
    {0x1.6040000000000p+0, -0x1.46d2d9c280000p-2, -0x1.59b275f67f75ap-44}, {0x1.5e80000000000p+0, -0x1.41b941cce1000p-2, 0x1.0469013e43fc9p-44},
    {0x1.5c80000000000p+0, -0x1.3bdd24eb15000p-2, 0x1.257b4970e6ed9p-44}, {0x1.5ac0000000000p+0, -0x1.36b5776bc1000p-2, -0x1.169785a9c223fp-46},
    {0x1.5900000000000p+0, -0x1.31871c9544000p-2, -0x1.84fab94cecfd9p-46}, {0x1.5700000000000p+0, -0x1.2b9303ab8a000p-2, 0x1.6db12d6bfb0a5p-45},
    {0x1.5540000000000p+0, -0x1.26561f1338000p-2, -0x1.8b48866faa45fp-44}, {0x1.5380000000000p+0, -0x1.2112559861000p-2, -0x1.82e78ba2950c4p-44},
    {0x1.51c0000000000p+0, -0x1.1bc794fd1d000p-2, 0x1.ccf0c747ba7bep-44}, {0x1.5000000000000p+0, -0x1.1675cababa000p-2, -0x1.8380e731f55c4p-44},
    {0x1.4e40000000000p+0, -0x1.111ce4003f000p-2, 0x1.b3237096b4b6bp-46}, {0x1.4cc0000000000p+0, -0x1.0c81d4860b000p-2, 0x1.e5bcf401d1731p-44},
    {0x1.4b00000000000p+0, -0x1.071b85fcd6000p-2, 0x1.bcb8ba3e01a11p-44}, {0x1.4940000000000p+0, -0x1.01ade3913a000p-2, 0x1.08930ccdc1521p-46},
    {0x1.47c0000000000p+0, -0x1.fa01c3bb58000p-3, 0x1.a1f71fae1d786p-46}, {0x1.4600000000000p+0, -0x1.ef0adcbdc6000p-3, 0x1.b26b79c86af24p-45},
    {0x1.4480000000000p+0, -0x1.e598ed5a88000p-3, 0x1.d134bcf1e98a1p-47}, {0x1.42c0000000000p+0, -0x1.da85d620ce000p-3, -0x1.40194c16cc7ecp-45},
    {0x1.4140000000000p+0, -0x1.d0fb7f2256000p-3, 0x1.af52b20633b29p-47}, {0x1.3fc0000000000p+0, -0x1.c765b9e4d6000p-3, -0x1.1ab6b36976f6cp-44},
    {0x1.3e40000000000p+0, -0x1.bdc46ae344000p-3, -0x1.625b4023d6505p-44}, {0x1.3c80000000000p+0, -0x1.b2797ee464000p-3, 0x1.be88a906d00a9p-44},
    {0x1.3b00000000000p+0, -0x1.a8becfc882000p-3, -0x1.e3185cf21b9cfp-44}, {0x1.3980000000000p+0, -0x1.9ef83d276a000p-3, 0x1.730b7b3f9ce00p-45},
    {0x1.3800000000000p+0, -0x1.9525a9cf46000p-3, 0x1.297137d9f158fp-44}, {0x1.3680000000000p+0, -0x1.8b46f82236000p-3, -0x1.2d9f2102dd7c9p-46},
    {0x1.3540000000000p+0, -0x1.83040c91bc000p-3, -0x1.e5b71c6e66f32p-44}, {0x1.33c0000000000p+0, -0x1.790ed4ee26000p-3, -0x1.99bbd4e7746f6p-46},
    {0x1.3240000000000p+0, -0x1.6f0d28ae56000p-3, -0x1.69737c93373dap-44}, {0x1.30c0000000000p+0, -0x1.64fee88260000p-3, 0x1.da40d759dded6p-46},
    {0x1.2f80000000000p+0, -0x1.5c94007598000p-3, 0x1.a8d948cd23322p-44}, {0x1.2e00000000000p+0, -0x1.526e5e3a1c000p-3, 0x1.790ba37fc5238p-44},
    {0x1.2c80000000000p+0, -0x1.483bccce6e000p-3, -0x1.eea52723f6369p-46}, {0x1.2b40000000000p+0, -0x1.3fb25a5952000p-3, -0x1.195be6b358ff7p-44},
    {0x1.2a00000000000p+0, -0x1.371fc201e8000p-3, -0x1.ee8779b2d8abcp-44}, {0x1.2880000000000p+0, -0x1.2cca0f5f60000p-3, 0x1.b5ef191aff120p-44},
    {0x1.2740000000000p+0, -0x1.2423113ba6000p-3, 0x1.e3a0078ee9d9cp-44}, {0x1.2600000000000p+0, -0x1.1b72ad52f6000p-3, -0x1.e80a41811a396p-45},
    {0x1.2480000000000p+0, -0x1.10f8e42254000p-3, 0x1.93b3843396307p-45}, {0x1.2340000000000p+0, -0x1.08338affa2000p-3, -0x1.0533cac823e27p-44},
    {0x1.2200000000000p+0, -0x1.fec9131dc0000p-4, 0x1.54555d1ae6607p-44}, {0x1.20c0000000000p+0, -0x1.ed1794e838000p-4, 0x1.fd143749d0484p-46},
    {0x1.1f80000000000p+0, -0x1.db5270187c000p-4, -0x1.9277856ae181fp-44}, {0x1.1e40000000000p+0, -0x1.c97978d790000p-4, 0x1.6e010977d1884p-44},
    {0x1.1d00000000000p+0, -0x1.b78c82bb10000p-4, 0x1.25ef7bc3987e7p-44}, {0x1.1bc0000000000p+0, -0x1.a58b60c2b4000p-4, 0x1.cdc735c5c9f2ap-44},
    {0x1.1a80000000000p+0, -0x1.9375e55594000p-4, -0x1.eddc37380c364p-44}, {0x1.1940000000000p+0, -0x1.814be23f8c000p-4, -0x1.b2381da82fdfdp-51},
    {0x1.1800000000000p+0, -0x1.6f0d28ae58000p-4, 0x1.4b4641b664613p-44}, {0x1.1700000000000p+0, -0x1.60658a9374000p-4, -0x1.0c3b1dee9c4f8p-44},
    {0x1.15c0000000000p+0, -0x1.4e01108a34000p-4, -0x1.ae5cfdf2c5ae5p-44}, {0x1.1480000000000p+0, -0x1.3b87598b1c000p-4, 0x1.2241594aca313p-45},
    {0x1.1340000000000p+0, -0x1.28f83450ec000p-4, -0x1.a8d75aa119769p-44}, {0x1.1240000000000p+0, -0x1.1a0fba1bf8000p-4, -0x1.4a3fcc319d6dcp-45},
    {0x1.1100000000000p+0, -0x1.0759835990000p-4, 0x1.b8ecfe4b59987p-44}, {0x1.1000000000000p+0, -0x1.f0a30c0118000p-5, 0x1.d599e83368e91p-45},
    {0x1.0ec0000000000p+0, -0x1.cae72fb960000p-5, 0x1.efabf2025b1bep-44}, {0x1.0dc0000000000p+0, -0x1.ac97221710000p-5, -0x1.f8d3ef013222cp-45},
    {0x1.0c80000000000p+0, -0x1.868a830840000p-5, 0x1.2623a134ac693p-46}, {0x1.0b80000000000p+0, -0x1.67f94f0948000p-5, -0x1.ecc1f3e7e4ed7p-44},
    {0x1.0a80000000000p+0, -0x1.494acc34d8000p-5, -0x1.11c78a56fd247p-45}, {0x1.0940000000000p+0, -0x1.22c71bcea8000p-5, -0x1.d2818f87f888fp-48},
    {0x1.0840000000000p+0, -0x1.03d5d85e70000p-5, -0x1.f778960ed29cfp-44}, {0x1.0740000000000p+0, -0x1.c98d18d010000p-6, 0x1.bf6150589df0fp-45},
    {0x1.0640000000000p+0, -0x1.8b31facaa0000p-6, 0x1.3fc78a96e4964p-44}, {0x1.0500000000000p+0, -0x1.3cea443470000p-6, 0x1.6a2c432d6a40bp-44},
    {0x1.0400000000000p+0, -0x1.fc0a8b0fc0000p-7, -0x1.f1e7cf6d3a69cp-50}, {0x1.0300000000000p+0, -0x1.7dc475f820000p-7, 0x1.eb1245b5da1f5p-44},
    {0x1.0200000000000p+0, -0x1.fe02a6b100000p-8, -0x1.9e23f0dda40e4p-46}, {0x1.0100000000000p+0, -0x1.ff00aa2b00000p-9, -0x1.0bc04a086b56ap-45},
    {0x1.0000000000000p+0, 0x0.0p+0, 0x0.0p+0}, {0x1.fc00000000000p-1, 0x1.0101575880000p-7, 0x1.bce251998b506p-44},
    {0x1.f800000000000p-1, 0x1.0205658930000p-6, 0x1.611d27c8e8417p-44}, {0x1.f440000000000p-1, 0x1.7c61b1cf60000p-6, -0x1.08fc8f849a447p-45},
    {0x1.f080000000000p-1, 0x1.f7a9b16780000p-6, 0x1.42ad9271be7d7p-45}, {0x1.ecc0000000000p-1, 0x1.39f07ba0e8000p-5, 0x1.eb129d642e577p-44},
    {0x1.e900000000000p-1, 0x1.788595a358000p-5, -0x1.08b0d083b3a4cp-46}, {0x1.e580000000000p-1, 0x1.b35dd9b588000p-5, 0x1.d5674d6cf558ep-44},
    {0x1.e200000000000p-1, 0x1.eea31c0068000p-5, 0x1.c3dd83606d891p-44}, {0x1.de40000000000p-1, 0x1.174f76ab08000p-4, 0x1.1710317ee2e48p-44},
    {0x1.db00000000000p-1, 0x1.333d7f8184000p-4, -0x1.692b6a81b8848p-49}, {0x1.d780000000000p-1, 0x1.5188742260000p-4, 0x1.30a1d96258b3ep-44},
    {0x1.d400000000000p-1, 0x1.700d30aeac000p-4, 0x1.c1e8da99ded32p-49}, {0x1.d0c0000000000p-1, 0x1.8c985e9ba0000p-4, -0x1.37c377e430036p-44},
    {0x1.cd80000000000p-1, 0x1.a956d3ecac000p-4, 0x1.e63794c02c4afp-44}, {0x1.ca40000000000p-1, 0x1.c6494a2e40000p-4, 0x1.8a5e8ab20c4e6p-44},
    {0x1.c700000000000p-1, 0x1.e3707ee304000p-4, 0x1.0f684e6766abdp-45}, {0x1.c400000000000p-1, 0x1.fe89139dbc000p-4, 0x1.56594d82f7a82p-44},
    {0x1.c100000000000p-1, 0x1.0ce7ecdccc000p-3, 0x1.4652dabff5447p-46}, {0x1.bdc0000000000p-1, 0x1.1bc8af2144000p-3, -0x1.2994d823555d4p-44},
    {0x1.bac0000000000p-1, 0x1.299d30c606000p-3, 0x1.d4d0079dc08d9p-44}, {0x1.b7c0000000000p-1, 0x1.3789c4c042000p-3, -0x1.992c2eecb3868p-44},
    {0x1.b500000000000p-1, 0x1.4462b9dc9c000p-3, -0x1.84858a711b062p-44}, {0x1.b200000000000p-1, 0x1.527e5e4a1c000p-3, -0x1.4e60b8d4b411dp-44},
    {0x1.af40000000000p-1, 0x1.5f830a1a5c000p-3, 0x1.5226898ffc1bcp-44}, {0x1.ac40000000000p-1, 0x1.6dcf0165f8000p-3, 0x1.b95669a33e4c6p-46},
    {0x1.a980000000000p-1, 0x1.7b00916516000p-3, -0x1.ae75fcb067e57p-44}, {0x1.a6c0000000000p-1, 0x1.884807ce56000p-3, 0x1.c77cef4a8712cp-46},
    {0x1.a400000000000p-1, 0x1.95a5adcf70000p-3, 0x1.7f22858a0ff6fp-47}, {0x1.a180000000000p-1, 0x1.a1dfc40f1c000p-3, -0x1.01e0f004f3781p-44},
    {0x1.9ec0000000000p-1, 0x1.af6895610e000p-3, -0x1.148288bf7a937p-45}, {0x1.9c40000000000p-1, 0x1.bbca696b08000p-3, -0x1.7fdd0ae06cee0p-47},
    {0x1.9980000000000p-1, 0x1.c97f8079d4000p-3, 0x1.3b161a8c6e6c5p-45}, {0x1.9700000000000p-1, 0x1.d60a17f904000p-3, -0x1.5d6e06fc20d39p-44},
    {0x1.9480000000000p-1, 0x1.e2a877a6b2000p-3, 0x1.823817787081ap-44}, {0x1.9200000000000p-1, 0x1.ef5ade4dd0000p-3, -0x1.a211565bb8e11p-51},
    {0x1.8f80000000000p-1, 0x1.fc218be620000p-3, 0x1.4bba46f1cf6a0p-44}, {0x1.8d40000000000p-1, 0x1.03d95a1d67000p-2, 0x1.a17880f236109p-44},
    {0x1.8ac0000000000p-1, 0x1.0a504e97bb000p-2, 0x1.03094e6690c44p-44}, {0x1.8880000000000p-1, 0x1.102ac0a35d000p-2, -0x1.f1fbddfdfd686p-45},
    {0x1.8600000000000p-1, 0x1.16b5ccbad0000p-2, -0x1.23299042d74bfp-44}, {0x1.83c0000000000p-1, 0x1.1ca28c64bb000p-2, -0x1.ac4f842f5566bp-46},
    {0x1.8180000000000p-1, 0x1.22981fbef8000p-2, -0x1.a1421609580dap-44}, {0x1.7f40000000000p-1, 0x1.2896a13e08000p-2, 0x1.a8ed027e16952p-44},
    {0x1.7d00000000000p-1, 0x1.2e9e2bce12000p-2, 0x1.4300c128d1dc2p-45}, {0x1.7ac0000000000p-1, 0x1.34aedad5b1000p-2, 0x1.a2aacf2be1fddp-44},
    {0x1.78c0000000000p-1, 0x1.3a1ac802f3000p-2, 0x1.98ecf399abd8dp-44}, {0x1.7680000000000p-1, 0x1.403d086cea000p-2, 0x1.e6ef574487308p-44}
};

/* log w - shift ln 2 + low for a positive normal finite w, a whole shift
 * and a small low, as the returned part plus *lo's (to about 2^-68 of the
 * result; log and log1p round their sum, pow keeps both and multiplies
 * them by up to 746): w = 2^e m, m in [0x1.5fp-1, 0x1.5fp+0) from w's bits,
 * and log w = e ln 2 - log c + log(1 + r) for r = m c - 1 (|r| < 0.0041)
 * with c nb__log_c's for m's interval. r comes exactly, as r_hi + r_lo,
 * from m's first 42 significant bits and the rest (each product with c's 11
 * bits is exact), then as r + r_err (TwoSum: the two may cancel);
 * log(1 + r) is r - r^2/2 + its series from r^3 to r^10 (the next term is
 * below 2^-90; r^9's, 2^-75, would be 2^-67 of a result near 2^-8, where c
 * is 1), r^2/2 made exactly from r's halves. e ln 2 comes as ln 2's first part of
 * 33 bits times e, exact, plus the rest; that part plus -log c's first is
 * exact too, and it, r and -r^2/2 are summed exactly (TwoSums), so where
 * they cancel (m in the intervals beside 1's, where the result is near
 * 2^-9 and r^2/2 near 2^-17) only the small terms' roundings show. Where take_x is set, r is
 * x (exact), for log1p of an x within 2^-10 of 0 (w = 1 + x is then in 1's
 * interval, where c is 1 and e 0): a select of r (nb__pick), not of the
 * result, so that the table is read for every element and a loop
 * vectorises. Other w give nonsense (without undefined behaviour) for the
 * callers to replace. */
NB_FN double nb__log_d_parts(double w, double shift, double low, int take_x, double x, double *lo)
{
    const uint64_t u = nb__double_bits(w) + (0x3ff0000000000000ULL - 0x3fe5f00000000000ULL);
    const double e = nb__bits_double(0x4330000000000000ULL | (u >> 52)) - (0x1p52 + 1023.0) - shift;
    const uint64_t mb = (u & 0x000fffffffffffffULL) + 0x3fe5f00000000000ULL;
    const double m = nb__bits_double(mb), m_hi = nb__bits_double(mb & ~(uint64_t)0x7ff), m_lo = m - m_hi;
    const uint64_t j = (u >> 45) & 127;
    const double c = nb__log_c[j][0];
    const double r_hi = nb__pick(take_x, x, m_hi * c - 1.0), r_lo = nb__pick(take_x, 0.0, m_lo * c), r = r_hi + r_lo;
    const double rb = r - r_hi, r_err = (r_hi - (r - rb)) + (r_lo - rb); /* TwoSum: r_hi and r_lo may cancel */
    /* -r^2/2 exactly, from r's first 26 significant bits and the rest */
    const double rh = nb__bits_double(nb__double_bits(r) & ~(uint64_t)0x7ffffff), rl = r - rh, h = -0.5 * (rh * rh);
    const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33;
    const double a = e * ln2_hi + nb__log_c[j][1], s1 = a + r, b1 = s1 - a, err1 = (a - (s1 - b1)) + (r - b1);
    const double hi = s1 + h, b2 = hi - s1, err2 = (s1 - (hi - b2)) + (h - b2); /* TwoSums */
    const double r2 = r * r;
    const double r4 = r2 * r2;
    const double tail = r2 * ((1.0 / 3 * r + (-0.25 + 0.2 * r) * r2) +
                              ((-1.0 / 6 + 1.0 / 7 * r) + (-0.125 + 1.0 / 9 * r) * r2) * r4 - 0.1 * (r4 * r4));
    const double rest = tail - (rh * rl + 0.5 * (rl * rl)); /* log(1 + r) - r + rh^2/2 */
    /* r_err enters as log(1 + r + r_err) - log(1 + r), r_err / (1 + r) to first order */
    *lo = (err1 + err2) + ((((nb__log_c[j][2] + e * ln2_lo) + low) + rest) + (r_err - r * r_err));
    return hi;
}

/* nb__log_d_parts' sum, rounded once. */
NB_FN double nb__log_d_normal(double w, double shift, double low, int take_x, double x)
{
    double lo;
    const double hi = nb__log_d_parts(w, shift, low, take_x, x, &lo);
    return hi + lo;
}

/* log x: within 0.5001 ulp (against quad precision; test_cpu_math checks
 * 0.501 against long double);
 * a subnormal x is scaled by 2^54 first; -inf at +-0, NaN below 0, inf at
 * inf, and a NaN stays NaN. */
NB_FN double nb__log_d(double x)
{
    const int sub = x < 0x1p-1022;
    const double w = sub ? x * 0x1p54 : x;
    double y = nb__log_d_normal(w, sub ? 54.0 : 0.0, 0.0, 0, 0.0);
    y = x == (double)INFINITY ? x : y;
    y = x == 0 ? -(double)INFINITY : y;
    y = x < 0 ? (double)NAN : y;
    return x != x ? x : y;
}

/* log(1 + x) as log u + c / u for u = 1 + x rounded and c what the rounding
 * lost (TwoSum), so that no digit of a small x is lost; below |x| = 2^-10,
 * with r = x itself (there c / u's own square would matter); x itself below
 * 2^-54 (and -0 kept). Within 0.5001 ulp, as log. -inf at -1, NaN below,
 * inf at inf, a NaN stays NaN. */
NB_FN double nb__log1p_d(double x)
{
    const double u = 1.0 + x;
    const double w = nb__pick(u > 0x1p-1022, u, 1.0);
    const double bb = u - 1.0, c = (1.0 - (u - bb)) + (x - bb); /* TwoSum */
    const int small = __builtin_fabs(x) < 0x1p-10;
    double y = nb__log_d_normal(w, 0.0, nb__pick(small, 0.0, c / w), small, x);
    y = nb__pick(__builtin_fabs(x) < 0x1p-54, x, y);
    y = x == (double)INFINITY ? x : y;
    y = x == -1.0 ? -(double)INFINITY : y;
    y = x < -1.0 ? (double)NAN : y;
    return x != x ? x : y;
}

/* x^y = e^(y log|x|), signed, for the finite, nonzero x and y the specials
 * below leave: log|x| as two parts (nb__log_d_parts, a subnormal |x| scaled
 * by 2^54 first), normalised (Fast2Sum), times y exactly (Dekker's product:
 * no fma, which the baseline has not), and e^(z_hi + z_lo) as nb__exp_d's
 * e^z_hi with z_lo folded into its e^r - 1 (e^(r + z_lo) - 1 = p + z_lo
 * (1 + p) to 2^-88). Within 0.52 ulp (test_cpu_math measures it against
 * long double), as exp. y is whole and odd by the bits of |y| + 2^52 below
 * 2^52, of |y| itself up to 2^53. The split takes y clamped to 2^900, where
 * it cannot overflow: past that y log|x| is past exp's range, which the
 * selects on z_hi decide, unless |x| is 1, whose log is 0 (z_lo then is 0
 * too). The specials are C's (Annex F): 1 for y = 0 or x = 1 (even against
 * a NaN), NaN for x < 0 and y not whole, the zeros and infinities of x and y
 * by their signs, y's parity and |x| against 1. */
NB_FN double nb__pow_d(double x, double y)
{
    const double ax = __builtin_fabs(x), ay = __builtin_fabs(y);
    /* the flags are 64-bit, as the doubles' lanes: an int made of a 64-bit
     * compare keeps a loop of two varying x and y from vectorising */
    const uint64_t lt52 = ay < 0x1p52;
    const double t = ay + 0x1p52; /* below 2^52, ay rounded to a whole number in t's low bits */
    const uint64_t y_whole = (lt52 ^ 1) | (uint64_t)(t - 0x1p52 == ay);
    const uint64_t parity = nb__double_bits(nb__pick(lt52, t, ay)) & 1;
    const uint64_t y_odd = y_whole & (uint64_t)(ay < 0x1p53) & parity;
    const int sub = ax < 0x1p-1022;
    double lo;
    const double hi = nb__log_d_parts(nb__pick(sub, ax * 0x1p54, ax), nb__pick(sub, 54.0, 0.0), 0.0, 0, 0.0, &lo);
    const double lh = hi + lo, ll = lo - (lh - hi); /* Fast2Sum */
    /* y lh exactly as z_hi + its error (Veltkamp's splits), then y ll */
    const double zh = y * lh;
    const double yc = nb__pick(ay > 0x1p900, __builtin_copysign(0x1p900, y), y); /* the split's own y */
    const double cy = yc * 134217729.0, yh = cy - (cy - yc), yl = yc - yh;
    const double cl = lh * 134217729.0, lhh = cl - (cl - lh), lhl = lh - lhh;
    const double zl = (((yh * lhh - zh) + yh * lhl) + yl * lhh) + yl * lhl + y * ll;
    double elo, p, s1, s2;
    const double ehi = nb__exp_d_parts(zh, &elo, &p, &s1, &s2);
    double r = nb__exp_d_join(ehi, elo, p + (zl + zl * p), s1, s2);
    r = nb__pick(zh > 710.0, (double)INFINITY, r);
    r = nb__pick(zh < -746.0, 0.0, r);
    const uint64_t neg = (uint64_t)(x < 0) & y_odd;
    r = nb__pick(neg, -r, r);
    r = nb__pick((uint64_t)(x < 0) & (y_whole ^ 1), (double)NAN, r);
    /* x = +-0: inf for y < 0, 0 for y > 0, x's sign where y is odd */
    double edge = nb__pick(y < 0, (double)INFINITY, 0.0);
    r = nb__pick(ax == 0, nb__pick(y_odd, __builtin_copysign(edge, x), edge), r);
    /* x = +-inf: the other way round */
    edge = nb__pick(y < 0, 0.0, (double)INFINITY);
    r = nb__pick(ax == (double)INFINITY, nb__pick(neg, -edge, edge), r);
    /* y = +-inf: inf where |x| < 1 and y < 0 or |x| > 1 and y > 0, 0 where
     * the other, 1 where |x| = 1 */
    edge = nb__pick((ax < 1.0) == (y < 0), (double)INFINITY, 0.0);
    edge = nb__pick(ax == 1.0, 1.0, edge);
    r = nb__pick(ay == (double)INFINITY, edge, r);
    r = nb__pick(y != y, y, r);
    r = nb__pick(x != x, x, r); /* a NaN x, else y, as it is: not x + y, whose NaN follows the operand order */
    r = nb__pick(x == 1.0, 1.0, r); /* even for a NaN y */
    return nb__pick(y == 0, 1.0, r); /* even for a NaN x */
}

/* erfc(x) e^(x^2) on the intervals of x in [0.25, 27.3) that x's exponent
 * and first three bits of significand pick: around the interval's middle c,
 * in powers of u = x - c, the first coefficient in two parts (the
 * polynomial of degree 11 through the interval's 12 Chebyshev nodes, made
 * in 200-bit arithmetic; relative error below 2^-60). */
static const double nb__erfcx_poly[54][13] = {
    {0x1.848b490b8a87fp-1, -0x1.eeb3f153c7488p-55, -0x1.7350eb3a31d57p-1, 0x1.21e9ca90154b3p-1, -0x1.8869173a903cap-2, 0x1.db97aaf49c465p-3, -0x1.07658ed1a92f7p-3, 0x1.0e6b20adf264dp-4, -0x1.03faa9b0a391fp-5, 0x1.d7c7ac1ee2dc7p-7, -0x1.967d293637c06p-8, 0x1.4e4564736af88p-9, -0x1.075ef80335fe1p-10},
    {0x1.7937bb093cf2ep-1, -0x1.d5d2400415164p-55, -0x1.61c1d2fad73d7p-1, 0x1.10323066c50cap-1, -0x1.6bee90d070fcfp-2, 0x1.b4598dcfa88e2p-3, -0x1.dea86f9f63262p-4, 0x1.e710bc52aabe9p-5, -0x1.d069167a6b77ep-6, 0x1.a22122d8320a8p-7, -0x1.65a3b498416b5p-8, 0x1.2410bc4a2a773p-9, -0x1.c932244a00f68p-11},
    {0x1.6e6c53c2e2c44p-1, -0x1.ceb0d8eaa6c25p-56, -0x1.5143d3106e9cep-1, 0x1.ff842502fcf19p-2, -0x1.51cadbfd417c5p-2, 0x1.90ad94d3e374cp-3, -0x1.b34a35b730451p-4, 0x1.b7048aafc7a2ep-5, -0x1.9f2887f4f8d25p-6, 0x1.72e7e44240ce7p-7, -0x1.3af06e9159b1ep-8, 0x1.fed50a555a95dp-10, -0x1.8d3003343af65p-11},
    {0x1.6420da0c11896p-1, -0x1.d3b098094233bp-55, -0x1.41c34d4fa6d2fp-1, 0x1.e0fd5486e32b2p-2, -0x1.39c7b57f38019p-2, 0x1.70398f4d2b0a9p-3, -0x1.8c2efc655d3c4p-4, 0x1.8c0c27ee9b452p-5, -0x1.737333ae464cdp-6, 0x1.494d748a376a0p-7, -0x1.1594b257c15b7p-8, 0x1.bf20695702a29p-10, -0x1.595cccd99971ap-11},
    {0x1.5a4dab2cf4920p-1, 0x1.fc4917d993c60p-55, -0x1.332e3c4d345b9p-1, 0x1.c49f373d983c9p-2, -0x1.23b42f5990d4fp-2, 0x1.52acd4be9ba96p-3, -0x1.68e3e2e08a497p-4, 0x1.6595c33e56649p-5, -0x1.4ca0b9fe21cafp-6, 0x1.249e5ed349b77p-7, -0x1.e9bc143b93740p-9, 0x1.87b59c9910a57p-10, -0x1.2c909cc94b296p-11},
    {0x1.50ebaeb1c07acp-1, 0x1.12837903edcd8p-56, -0x1.25740ea259061p-1, 0x1.aa3d710a85d87p-2, -0x1.0f64210d810dep-2, 0x1.37bf3318d3669p-3, -0x1.4902e0706d8a0p-4, 0x1.4320ca56d08eap-5, -0x1.2a1dab26fd5a2p-6, 0x1.043e882852e81p-7, -0x1.b06467bc89872p-9, 0x1.5775b7057e1d8p-10, -0x1.05ceba682f206p-11},
    {0x1.47f44b516a364p-1, 0x1.075e2e86aa6a1p-58, -0x1.188585c68b2c7p-1, 0x1.91af9566e64c3p-2, -0x1.f95f4fcdf2a89p-3, 0x1.1f2ffd523d520p-3, -0x1.2c3140d08be5ep-4, 0x1.243bc62ea7a45p-5, -0x1.0b68cfe6d49d0p-6, 0x1.cf4c0e0599b3ep-8, -0x1.7e1775c419a9dp-9, 0x1.2d69feaf5dff3p-10, -0x1.c87e36356ca67p-12},
    {0x1.3f615cd07fbb0p-1, 0x1.1b3be83fc5dcap-55, -0x1.0c54981e57b07p-1, 0x1.7ad0c6439a831p-2, -0x1.d6e56aefeb61ep-3, 0x1.08c5365d7f816p-3, -0x1.121e507bb47f6p-4, 0x1.08827e7f6282fp-5, -0x1.e0219fa686461p-7, 0x1.9cbcd835fe382p-8, -0x1.51ee1f41dccbfp-9, 0x1.08be1afa99146p-10, -0x1.8e51cae66188dp-12},
    {0x1.3334ea3613de0p-1, -0x1.9d7751d9895e3p-55, -0x1.f6a5625dbca39p-2, 0x1.5b61f82a5b851p-2, -0x1.a821c8b450068p-3, 0x1.d571fdb4ec867p-4, -0x1.df18cee6ceb78p-5, 0x1.c83f33aa34423p-6, -0x1.99092a7d4db0cp-7, 0x1.5b98c2d6dbce7p-8, -0x1.198412c72277bp-9, 0x1.b4ae78b569509p-11, -0x1.45453bf6ec5e9p-12},
    {0x1.242708751d9a7p-1, -0x1.9d19a17ce6c6dp-56, -0x1.cd991ffa808c8p-2, 0x1.363b25ed7ee17p-2, -0x1.71dd5747519e3p-3, 0x1.90dae008a54ccp-4, -0x1.9160946e00defp-5, 0x1.7798454ab05f4p-6, -0x1.4b486d8d8f0afp-7, 0x1.153ec39ae0fdcp-8, -0x1.ba9fa06d78f49p-10, 0x1.529932d90d210p-11, -0x1.f1d608c8c7865p-13},
    {0x1.164fc6284ab1ep-1, 0x1.e84dd1f5f61dap-56, -0x1.a8e46be6e2c85p-2, 0x1.15c9a58110905p-2, -0x1.43757462ea8cdp-3, 0x1.574e36a137343p-4, -0x1.514c77233a4c2p-5, 0x1.362c2a0ce76acp-6, -0x1.0d2b661a4ef8ap-7, 0x1.bbb3d754f650fp-9, -0x1.5d1c3fab2df86p-10, 0x1.076b25472cc88p-11, -0x1.7e40fd85d5b52p-13},
    {0x1.098ea367ecbccp-1, 0x1.4da7414c32134p-55, -0x1.87fbbe45de3c9p-2, 0x1.f2c0ac1b437c1p-3, -0x1.1ba8ab3ac2a55p-3, 0x1.26df710907952p-4, -0x1.1c4d642c0645dp-5, 0x1.00ef8161a2012p-6, -0x1.b6c7961d9e6d1p-8, 0x1.642f477913ba9p-9, -0x1.143ebf0e4eb66p-10, 0x1.9b3423b0aeed8p-12, -0x1.2679e145fd092p-13},
    {0x1.fb8e558b14d90p-2, 0x1.012959f294870p-56, -0x1.6a676e6756483p-2, 0x1.c0db0e94b2e14p-3, -0x1.f2da4c8e0115ep-4, 0x1.fbfb915a74e95p-5, -0x1.e0acd93ddf110p-6, 0x1.aaf565fdc032fp-7, -0x1.66bc8f50e4d36p-8, 0x1.1ed3bcfbf04cep-9, -0x1.b69180973fa44p-11, 0x1.41fc0bf04e0a8p-12, -0x1.c72fdcf1852a0p-14},
    {0x1.e5c0be6e7d145p-2, -0x1.04cf50fedf8ddp-56, -0x1.4fc092b633c90p-2, 0x1.94ec854982c56p-3, -0x1.b7ccc69dd6fa0p-4, 0x1.b6c442fdd827cp-5, -0x1.97832a2acc751p-6, 0x1.63cbe6efbe5f9p-7, -0x1.262f056b10b18p-8, 0x1.cf601fbb952b4p-10, -0x1.5d3a35024519ap-11, 0x1.f9d8ba3fffd90p-13, -0x1.60ee73c1f2e55p-14},
    {0x1.d188819e7fef8p-2, -0x1.844979f220029p-57, -0x1.37ae69215ef93p-2, 0x1.6e24e4b083bb5p-3, -0x1.84b9d95908c0ep-4, 0x1.7c015c685787cp-5, -0x1.5a752bf601bedp-6, 0x1.295b05fbd8a6bp-7, -0x1.e3ed8bffcaa83p-9, 0x1.776e67535016bp-10, -0x1.16f158acbd6fap-11, 0x1.8e97250f7ad95p-13, -0x1.1283040d5c074p-14},
    {0x1.bebec8c623082p-2, -0x1.2b1d76be607dbp-59, -0x1.21e42f10c2fb8p-2, 0x1.4bd3765bcc48fp-3, -0x1.586f59f62015fp-4, 0x1.49fb0d91297c9p-5, -0x1.275c656c7ffc1p-6, 0x1.f270cbd6fbaffp-8, -0x1.8f302dd7e262bp-9, 0x1.311574b4b4fe9p-10, -0x1.bef4f22142938p-12, 0x1.3b0a9ffe15384p-13, -0x1.ac5cb9716d7b2p-15},
    {0x1.a4f550c5f1a99p-2, -0x1.baa3ef66d780fp-58, -0x1.04ec886c0552fp-2, 0x1.1f73ffa65802dp-3, -0x1.20926c49bc2e9p-4, 0x1.0c4c6c3e580a5p-5, -0x1.d352a281f799ap-7, 0x1.807142e0d5ce9p-8, -0x1.2cabf5b237410p-9, 0x1.c16bbc7808a4ep-11, -0x1.424cf7583b4b3p-12, 0x1.bdae0e8226833p-14, -0x1.292cf49a2f897p-15},
    {0x1.8674923c605e1p-2, 0x1.c1d5c0d56fa22p-56, -0x1.c841f18283f7ap-3, 0x1.de35ab5b880c5p-4, -0x1.cb858a0b1dd63p-5, 0x1.9abcc2c9dc9e6p-6, -0x1.5908bd6b9e140p-7, 0x1.127f6dc36963ep-8, -0x1.a01de525af51ep-10, 0x1.2ded0f3bb014ep-11, -0x1.a510244c6ed10p-13, 0x1.1b6aa69ee6553p-14, -0x1.706552985b51cp-16},
    {0x1.6bb376a9390cdp-2, 0x1.9155cf5ca6711p-56, -0x1.917d7928e2332p-3, 0x1.90e47c99926d2p-4, -0x1.711413b59af42p-5, 0x1.3d5e9f54c9729p-6, -0x1.014991d6578f2p-7, 0x1.8c10e9abf8738p-9, -0x1.230930611c91cp-10, 0x1.9a25b4de97648p-12, -0x1.1624f0273d55bp-13, 0x1.6c99a504a367fp-15, -0x1.ce037c686a36dp-17},
    {0x1.5416a05961e1cp-2, -0x1.192f324e568c6p-58, -0x1.63698e1f5ae48p-3, 0x1.528b08cb62361p-4, -0x1.2ae454cdcb79cp-5, 0x1.eedbaf5ddfd14p-7, -0x1.835e05b363454p-8, 0x1.209579b1da6b1p-9, -0x1.9b4f0e40ac30bp-11, 0x1.198a17e0511e9p-12, -0x1.737872646c954p-14, 0x1.da4003eb26ec6p-16, -0x1.24fca5c1567b2p-17},
    {0x1.3f20d017f3530p-2, 0x1.69b189c5d929bp-57, -0x1.3c5e938b9cefbp-3, 0x1.1fdbb34b82defp-4, -0x1.e7e4fd2df9084p-6, 0x1.8519019636593p-7, -0x1.2642531a9746bp-8, 0x1.a88dd719eb9a1p-10, -0x1.2586ab9d97ddep-11, 0x1.8679367390305p-13, -0x1.f552ce8e54a7bp-15, 0x1.37c0b04b5a0dap-16, -0x1.77aabdc804163p-18},
    {0x1.2c6c3d2ac6111p-2, 0x1.ce9d38a38d404p-57, -0x1.1b110b4094c34p-3, 0x1.ecaedd6244629p-5, -0x1.9126c9e5ff890p-6, 0x1.346c4610698a6p-7, -0x1.c2f162807b19ap-9, 0x1.3b26815bb3643p-10, -0x1.a6efc31ad676bp-12, 0x1.1172aec1f60bcp-13, -0x1.55b708a4d1e74p-15, 0x1.9e2044b161768p-17, -0x1.e6c9f66a86416p-19},
    {0x1.1ba58e2518db3p-2, -0x1.38b19ac842a27p-61, -0x1.fcf6c328b302ep-4, 0x1.a82dedb53def2p-5, -0x1.4c2309f687b06p-6, 0x1.ecb8b2b74bd89p-8, -0x1.5c644ff184316p-9, 0x1.d7fa1b61bbcc3p-11, -0x1.337daca8587b6p-12, 0x1.82a0647074a66p-14, -0x1.d6670013df6bep-16, 0x1.15d245d02699cp-17, -0x1.3ea13a91d03c4p-19},
    {0x1.0c8803dfa92b2p-2, 0x1.6bfe18dac8bcdp-56, -0x1.cb9b1437dd505p-4, 0x1.6f4730a4cfc21p-5, -0x1.14d04d95e020cp-6, 0x1.8c7595ee7a866p-8, -0x1.0f4ab6478f45bp-9, 0x1.646338ee23cc7p-11, -0x1.c30c1ea6d2625p-13, 0x1.13d2ae1bc71e3p-14, -0x1.46d54f174243cp-16, 0x1.7860e8de7c8dfp-18, -0x1.a544b93c397d9p-20},
    {0x1.f0fd28fdc20abp-3, 0x1.46cc36a880986p-57, -0x1.8d6f73d5aa121p-4, 0x1.2adaf7aaf55e3p-5, -0x1.aa2443aac74b3p-7, 0x1.21decee0ec699p-8, -0x1.7a181925b96e2p-10, 0x1.dab55d89ff704p-12, -0x1.1fc891381acc4p-13, 0x1.51e01fc89e33fp-15, -0x1.81042aec9a644p-17, 0x1.ac19b422ea71ep-19, -0x1.ce1bee6733904p-21},
    {0x1.c3987d04d0b98p-3, -0x1.f0a86e1ce7eccp-57, -0x1.4baeac94dc8b2p-4, 0x1.cdc880a056a25p-6, -0x1.32a8abc8db398p-7, 0x1.8680d28747d7ap-9, -0x1.deb45e9cfd0d3p-11, 0x1.1b649ba6990e4p-12, -0x1.44f8e8ce145dfp-14, 0x1.69c2eb0ecb2c8p-16, -0x1.87bbfa23b69d0p-18, 0x1.9e99a6f5e9176p-20, -0x1.aae033461f244p-22},
    {0x1.9d7738e1f4db7p-3, 0x1.e585dcf3a4c5ap-59, -0x1.18737afe106cep-4, 0x1.6afd3ba3fa643p-6, -0x1.c28dd3c4d6775p-8, 0x1.0d40a2ab35f66p-9, -0x1.36e9940d2ed08p-11, 0x1.5bd1dd6db8d86p-13, -0x1.79dac38b23acep-15, 0x1.8f68e1927fb86p-17, -0x1.9b85d280c421fp-19, 0x1.9f105a17b83ccp-21, -0x1.980af40bd06d2p-23},
    {0x1.7d0a5e9dd5710p-3, 0x1.1e88c0fb2c58ap-57, -0x1.dfc0205709b2cp-5, 0x1.21c23afa33c47p-6, -0x1.512f92fca6d78p-8, 0x1.7b404aa4de344p-10, -0x1.9d6f22275d93cp-12, 0x1.b5d78b37df20fp-14, -0x1.c35c6526dcd65p-16, 0x1.c5b43bce77ccbp-18, -0x1.bd5e6adca6009p-20, 0x1.ac9770e0272d4p-22, -0x1.92b9e3c95601cp-24},
    {0x1.612a8125451bdp-3, 0x1.67d98d3808479p-57, -0x1.9e8803e177224p-5, 0x1.d503e1d20090fp-7, -0x1.009a927223b07p-8, 0x1.104973fea2eaep-10, -0x1.18d46547b41fep-12, 0x1.1a12c4a83cc35p-14, -0x1.146359e04ba57p-16, 0x1.089473a47ef07p-18, -0x1.ef88adf7809e8p-21, 0x1.c7891a281e108p-23, -0x1.9991a04c0138fp-25},
    {0x1.48f8f10299b71p-3, 0x1.635d10bc11fbep-59, -0x1.696d353f008b5p-5, 0x1.804cc15714188p-7, -0x1.8c84c13afb9c4p-9, 0x1.8de5f26a7e1acp-11, -0x1.8511846d9f886p-13, 0x1.7350e3a4f23bfp-15, -0x1.5a61389026ce7p-17, 0x1.3c3b49700ede6p-19, -0x1.1ae021693bbefp-21, 0x1.f16aaa3580d7bp-24, -0x1.ac612d65a3693p-26},
    {0x1.33cb19179d7f6p-3, -0x1.43e5ea7353fcfp-63, -0x1.3dacc8d85f6c4p-5, 0x1.3e68313870541p-7, -0x1.36992d37bc011p-9, 0x1.276b01ef6f723p-11, -0x1.1267afc4c573cp-13, 0x1.f28b1c3ba1571p-16, -0x1.bb73ad96f9469p-18, 0x1.82a8f440d9b29p-20, -0x1.4acf9b3d1c1fep-22, 0x1.1681f1b629af1p-24, -0x1.cbfc21100376fp-27},
    {0x1.211c625924e34p-3, -0x1.ce6e37e03e568p-57, -0x1.193eb7b9bf564p-5, 0x1.0a7a05d3387a8p-7, -0x1.ecb581c2b7f7ep-10, 0x1.bd21af8e75bdep-12, -0x1.8985979e24b21p-14, 0x1.54d6c39ebf474p-16, -0x1.218709b43e0ecp-18, 0x1.e2df68127d9a0p-21, -0x1.8ba1a0b906dd5p-23, 0x1.3f50767360138p-25, -0x1.fa3c799895fffp-28},
    {0x1.08e62ce8c89adp-3, -0x1.dd3201e457771p-57, -0x1.da39533524970p-6, 0x1.9ef71691a5536p-8, -0x1.6373226edf551p-10, 0x1.2a660fdeafe8ep-12, -0x1.eb88e0e8dbf24p-15, 0x1.8d8e5a00db593p-17, -0x1.3c07769dce914p-19, 0x1.ee3144bf6d32fp-22, -0x1.7c55065757d15p-24, 0x1.222894b26abe3p-26, -0x1.b16a3b88b9c8ap-29},
    {0x1.dc603a3e77e9bp-4, -0x1.d5b605c10ea85p-59, -0x1.81149bc4a104bp-6, 0x1.317c144f8b420p-8, -0x1.dc1af883a33d2p-11, 0x1.6cc10c161ae19p-13, -0x1.12f1743bbe8f1p-15, 0x1.9818c0fb1c06bp-18, -0x1.2a625a5e57ff7p-20, 0x1.ae1e5466b2d64p-23, -0x1.31c2f789f2a4ep-25, 0x1.af5da9b00aa9bp-28, -0x1.2ab113d2d3611p-30},
    {0x1.b096face146fep-4, 0x1.978872f0b1e6bp-59, -0x1.3e981b3b13590p-6, 0x1.cdeae21161629p-9, -0x1.49d492a39eb62p-11, 0x1.d03e19aa09f8dp-14, -0x1.4230e3ccf3e74p-16, 0x1.b93f47739b4f6p-19, -0x1.2a435311a6b0ap-21, 0x1.8e3664bf10bcbp-24, -0x1.06a3174dccc39p-26, 0x1.5810d8d698528p-29, -0x1.bb77817cbc730p-32},
    {0x1.8c14049cd551ep-4, -0x1.0624a2ea6f13cp-59, -0x1.0bc46cdc18fe6p-6, 0x1.6535040e2c85cp-9, -0x1.d662fda6d50f7p-12, 0x1.31dddbe4337a4p-14, -0x1.8900e0bd25c6bp-17, 0x1.f31a328890bb6p-20, -0x1.395be0885153cp-22, 0x1.85304d3155a44p-25, -0x1.de41836e525bap-28, 0x1.240f2c9a54d5fp-30, -0x1.5fa023d269c07p-33},
    {0x1.6d2f811bf7397p-4, 0x1.818290d48bf3dp-58, -0x1.c82c132848f67p-7, 0x1.19a2448fc71d9p-9, -0x1.57e0ab4d7cb1cp-12, 0x1.9f57d767b4381p-15, -0x1.f0678072370d8p-18, 0x1.259fcb57246a2p-20, -0x1.57ec1a04a4cc5p-23, 0x1.8ef4e4a41fd38p-26, -0x1.ca7631f52ae14p-29, 0x1.05fbb2af2ca99p-31, -0x1.27a18228cbb1ap-34},
    {0x1.52b80d463c470p-4, -0x1.f2fbf9949d2f3p-58, -0x1.8914e8736d77dp-7, 0x1.c39a4935fa76ap-10, -0x1.00e4e3d2d8508p-12, 0x1.21808c22d60abp-15, -0x1.433e288b7e56bp-18, 0x1.65acd3d2097a9p-21, -0x1.884f46d8d91bep-24, 0x1.aa9e8c532e930p-27, -0x1.cc0f6e4f9bbd8p-30, 0x1.edb156b6ec8ffp-33, -0x1.05e82d5289c91p-35},
    {0x1.3bcc59a28358cp-4, 0x1.48dc665cc1893p-59, -0x1.5621e47157306p-7, 0x1.6f68a6f3153a2p-10, -0x1.872cdb81fdf3fp-13, 0x1.9d0000a8e1dc1p-16, -0x1.b07c4a7e74207p-19, 0x1.c147c33def5bdp-22, -0x1.cf16f8c95de54p-25, 0x1.d9aeb68036137p-28, -0x1.e0e71bbc07bd7p-31, 0x1.e6146e1178983p-34, -0x1.e65a6210a5d77p-37},
    {0x1.27c2b4d2f8988p-4, -0x1.994163fde9831p-59, -0x1.2c6aebe4718c2p-7, 0x1.2ec8136aa630fp-10, -0x1.2ed983856cc8bp-13, 0x1.2cab802c99751p-16, -0x1.285655d26066bp-19, 0x1.21fd16170fdc0p-22, -0x1.19cc08286a035p-25, 0x1.0ff6b44599745p-28, -0x1.04b6bbc5e5c32p-31, 0x1.f1ddb4009ce6fp-35, -0x1.d70d22e6ad573p-38},
    {0x1.0e078051f491dp-4, 0x1.2db106f46de50p-62, -0x1.f57cad15dbe3cp-8, 0x1.cea22f2be06e3p-11, -0x1.a80f2934e8ba2p-14, 0x1.82426c74e7e24p-17, -0x1.5da898d7eefd9p-20, 0x1.3a9b824f378b7p-23, -0x1.1962405f87b55p-26, 0x1.f45fce1189447p-30, -0x1.ba5989f7630adp-33, 0x1.8854c62564c02p-36, -0x1.56e9e99071b1ep-39},
    {0x1.e3db9bbbefc9ep-5, 0x1.7930fbe44bfdap-61, -0x1.93108c9356f34p-8, 0x1.4dfd333e22452p-11, -0x1.134ff4426077cp-14, 0x1.c3904bd3cdb6fp-18, -0x1.7074a5b55dd41p-21, 0x1.2b25ec3c7fefcp-24, -0x1.e35fb0ca55115p-28, 0x1.84a15966bd321p-31, -0x1.36f956fe0869ep-34, 0x1.f2fcb15adb803p-38, -0x1.8b8806109f8d2p-41},
    {0x1.b634a500659c3p-5, -0x1.0e776eee6e8e1p-59, -0x1.4ae8bbe708546p-8, 0x1.f197309556b7cp-12, -0x1.7481570279713p-15, 0x1.15adcc42e0f89p-18, -0x1.9c3efbbab4a86p-22, 0x1.30be830a3d6fap-25, -0x1.c0b4984a18b36p-29, 0x1.48feaca334b09p-32, -0x1.e0853095db8c0p-36, 0x1.5faf0eb82729cp-39, -0x1.fd9a244218429p-43},
    {0x1.90658c4eb57cbp-5, 0x1.34ba7cf65cddbp-59, -0x1.14782b97452f2p-8, 0x1.7c66d2a104799p-12, -0x1.04c1668352a7ap-15, 0x1.6433d10f64036p-19, -0x1.e4dce67f4fa79p-23, 0x1.48d73b84e1538p-26, -0x1.bc802d5bb7ed4p-30, 0x1.2b629326f21b2p-33, -0x1.91ec367d19cc1p-37, 0x1.0e48bbfa3321dp-40, -0x1.686a062bcdd89p-44},
    {0x1.7093453935bbap-5, -0x1.7659d66f64fd2p-61, -0x1.d4cddeef787a8p-9, 0x1.2937870fcdf60p-12, -0x1.77b3f7978e1aap-16, 0x1.d976d0b3743d6p-20, -0x1.296db577f7a73p-23, 0x1.7490dc2564d59p-27, -0x1.d14be26734d91p-31, 0x1.21b1d92b801d1p-34, -0x1.67ad6f47816b4p-38, 0x1.bf433ff89eae7p-42, -0x1.140c1c8222ad1p-45},
    {0x1.556d4dd1f605cp-5, -0x1.69975bd99a08ap-59, -0x1.9276b60443f7cp-9, 0x1.d9243e5cacb1cp-13, -0x1.1560775b6b45ep-16, 0x1.445d3c99e94f2p-20, -0x1.7a51b09ecc73ap-24, 0x1.b81a86c0a8d47p-28, -0x1.fea8dcc0812bfp-32, 0x1.27812241d8663p-35, -0x1.55226c880f551p-39, 0x1.8a56c755d6992p-43, -0x1.c4f0a561e9235p-47},
    {0x1.3dfeb746148ecp-5, 0x1.bc1c8bc55e5bbp-61, -0x1.5d3dd94e2ae31p-9, 0x1.7eaa573db0fa9p-13, -0x1.a2517ed700043p-17, 0x1.c83e256c7a080p-21, -0x1.f0785eacdfa73p-25, 0x1.0d829aae1e40ep-28, -0x1.23f333395d9b1p-32, 0x1.3b8cb757f1b6fp-36, -0x1.544d05b770657p-40, 0x1.6f6bf893a98a4p-44, -0x1.8a7e970fc55c0p-48},
    {0x1.29910a1ff7b0ep-5, -0x1.4102232c18fbcp-59, -0x1.31e66a6386f9fp-9, 0x1.39d30f8ceebcep-13, -0x1.414ce1ffcca96p-17, 0x1.484a4e903bc95p-21, -0x1.4ec25b3a78184p-25, 0x1.54acba91c6c2dp-29, -0x1.5a01dd70121e5p-33, 0x1.5ebab67332a40p-37, -0x1.62d1faf56f01cp-41, 0x1.675388dbf05fap-45, -0x1.6a1a1994637a1p-49},
    {0x1.0f67b1bff7645p-5, -0x1.771967a44ee21p-59, -0x1.fd20a0cb71091p-10, 0x1.dcb8a7c6aef31p-14, -0x1.bd9f058f74e69p-18, 0x1.9fd8ef2101ae9p-22, -0x1.836964cc7319ep-26, 0x1.6851597bb34bep-30, -0x1.4e8fd3bc2c8a9p-34, 0x1.361f2012f5974p-38, -0x1.1f0130daf0f44p-42, 0x1.0bd79bcf63208p-46, -0x1.ee1e8dcad6a91p-51},
    {0x1.e5d6a9f4cc3eap-6, -0x1.44724bdd59e9ap-61, -0x1.98006b41c68e6p-10, 0x1.562a96b0758d1p-14, -0x1.1e90357ca61f3p-18, 0x1.df572c701ac2ep-23, -0x1.905c14c8f6abdp-27, 0x1.4df1413daf32cp-31, -0x1.162b7d6bee437p-35, 0x1.cecb3de723217p-40, -0x1.807989737f9a3p-44, 0x1.4191f006af595p-48, -0x1.0a704d15a9ff9p-52},
    {0x1.b7ad8ef8307ccp-6, 0x1.ae4991f581937p-61, -0x1.4e3cc52793c39p-10, 0x1.fb98687d18249p-15, -0x1.8100c74fe5b73p-19, 0x1.23b1721d457fdp-23, -0x1.b9813abb2167cp-28, 0x1.4dc262105a214p-32, -0x1.f80f2fb777816p-37, 0x1.7c33c20859b64p-41, -0x1.1e782aeabf37fp-45, 0x1.b217146f86a03p-50, -0x1.465a9b61200eep-54},
    {0x1.91853accde052p-6, -0x1.22a96fd8a3d51p-61, -0x1.16cb03a88c8efp-10, 0x1.82cb1527ef468p-15, -0x1.0c109a761b5adp-19, 0x1.73371e27ec2aep-24, -0x1.00ca3ab65e3e3p-28, 0x1.62f12c1b41f07p-33, -0x1.ea283a5e2723ep-38, 0x1.5220121dfa3d3p-42, -0x1.d213248919e43p-47, 0x1.42b6e25b1bae1p-51, -0x1.bc03808a2528fp-56},
    {0x1.7173c308c43e9p-6, -0x1.e9dab507a1470p-60, -0x1.d8252a832fb4bp-11, 0x1.2d73a48df2c3cp-15, -0x1.80a1dc85d952cp-20, 0x1.ea608ac1f0da3p-25, -0x1.3859b1da5d601p-29, 0x1.8d989357b35bdp-34, -0x1.f9b5944b291b7p-39, 0x1.415b0e1379d93p-43, -0x1.9819450a439dep-48, 0x1.042682ec16dabp-52, -0x1.49db12872c498p-57},
    {0x1.561fcfda08321p-6, 0x1.2d918d6ea62dcp-60, -0x1.94ed2196647d1p-11, 0x1.deee0c8da2571p-16, -0x1.1b0953da04d5fp-20, 0x1.4e4f0dba2c133p-25, -0x1.8a9a07e3246e4p-30, 0x1.d17418d3bb6f0p-35, -0x1.1254079425c9fp-39, 0x1.432581e740de5p-44, -0x1.7c6617d67c869p-49, 0x1.c14fead8646a0p-54, -0x1.081a5c6b0fee1p-58},
};

/* For a >= 0.25, erfc a as 2^n (returned + *tail), unsummed, *s1 *s2 = 2^n
 * (as nb__exp_d_parts'): a clamped to [0.25, 27.3] (erfc 27.3 is below half
 * the least subnormal; a NaN becomes 27.3, for the callers to replace);
 * e^(-a^2) from a^2 made exactly (Dekker's square, s_hi + s_lo), as
 * nb__exp_d_parts of -s_hi with s_lo folded into its e^r - 1, times
 * G = erfc(a) e^(a^2) from nb__erfcx_poly's interval (picked by a's bits,
 * u = a - c exact); the product of the leading parts exactly (Dekker's), the
 * rest, a few hundredths of it, summed in plain doubles. */
NB_FN double nb__erfc_d_parts(double a, double *tail, double *s1, double *s2)
{
    a = nb__pick(a < 27.3, a, 27.3);
    a = nb__pick(a > 0.25, a, 0.25);
    const uint64_t bits = nb__double_bits(a);
    const uint64_t j = (bits >> 49) - (1021u << 3); /* the row */
    /* read as [j][k]: through a pointer to the row, the loop does not vectorise */
#define NB__G(k) nb__erfcx_poly[j][k]
    const double c = nb__bits_double((bits & ~((1ULL << 49) - 1)) | (1ULL << 48)); /* the middle */
    const double u = a - c, u2 = u * u, u4 = u2 * u2;
    /* G - its first part: the linear term apart (up to 6 % of G), the rest
     * (below 0.4 %) by Estrin's scheme, whose few units of rounding would
     * show at 6 % */
    const double g2 = ((NB__G(3) + NB__G(4) * u) + (NB__G(5) + NB__G(6) * u) * u2) +
                      ((NB__G(7) + NB__G(8) * u) + (NB__G(9) + NB__G(10) * u) * u2) * u4 +
                      (NB__G(11) + NB__G(12) * u) * (u4 * u4);
    const double g_rest = NB__G(1) + (NB__G(2) * u + g2 * u2);
    const double ca = a * 134217729.0, ah = ca - (ca - a), al = a - ah;
    const double sh = a * a, sl = ((ah * ah - sh) + 2.0 * ah * al) + al * al;
    double lo, p;
    const double hi = nb__exp_d_parts(-sh, &lo, &p, s1, s2);
    p = p - sl * (1.0 + p); /* e^(r - s_lo) - 1, to 2^-86 */
    const double a0 = NB__G(0), ph = hi * a0;
    const double ch = hi * 134217729.0, hh = ch - (ch - hi), hl = hi - hh;
    const double c0 = a0 * 134217729.0, a0h = c0 - (c0 - a0), a0l = a0 - a0h;
    const double pl = (((hh * a0h - ph) + hh * a0l) + hl * a0h) + hl * a0l;
    *tail = pl + (hi * g_rest + (lo + hi * p) * (a0 + g_rest));
    return ph;
#undef NB__G
}

/* 2^64 erf x for |x| < 0.25 as the returned part plus *lo: x P(x^2), P of
 * degree 7 (through erf(x) / x at 8 Chebyshev nodes of x^2 in [0, 1/16],
 * as nb__erfcx_poly's; relative error 2^-66), 2^64 x times P's first coefficient (in two parts) made
 * exactly (scaled so that no part of it falls into the subnormals). Other x
 * give nonsense (without undefined behaviour). */
NB_FN double nb__erf_d_small(double x, double *lo)
{
    const double b0 = 0x1.20dd750429b6dp+0, b0_lo = 0x1.1aadc70312f94p-56;
    const double s = x * x, s2 = s * s, s4 = s2 * s2;
    const double q = ((-0x1.812746b0379e6p-2 + 0x1.ce2f21a0429acp-4 * s) +
                      (-0x1.b82ce31241ee4p-6 + 0x1.565bccc8d8b41p-8 * s) * s2) +
                     ((-0x1.c02d69b1f611ap-11 + 0x1.f97724147f5c4p-14 * s) - 0x1.e736c732456a2p-17 * s2) * s4;
    const double xs = x * 0x1p64, ph = xs * b0;
    const double cx = xs * 134217729.0, xh = cx - (cx - xs), xl = xs - xh;
    const double cb = b0 * 134217729.0, bh = cb - (cb - b0), bl = b0 - bh;
    *lo = ((((xh * bh - ph) + xh * bl) + xl * bh) + xl * bl) + xs * (b0_lo + s * q);
    return ph;
}

/* erf x: below |x| = 0.25 nb__erf_d_small's sum, scaled back once (into the
 * subnormals too); above, 1 - erfc |x| (signed) from nb__erfc_d_parts', its
 * leading part subtracted exactly (the scaling is exact where erfc |x| is
 * normal, and where it is not, erf x is +-1). Within 0.6 ulp, 0.77 where
 * the result is subnormal (test_cpu_math measures it against long double);
 * +-1 at +-inf, a NaN stays NaN. */
NB_FN double nb__erf_d(double x)
{
    const double ax = __builtin_fabs(x);
    double tail, s1, s2, lo;
    const double ph = nb__erfc_d_parts(ax, &tail, &s1, &s2);
    const double eh = (ph * s1) * s2, et = (tail * s1) * s2;
    const double o = 1.0 - eh, o_err = (1.0 - o) - eh; /* eh < 0.73: exact */
    const double big = __builtin_copysign(o + (o_err - et), x);
    const double sh = nb__erf_d_small(x, &lo);
    const double y = nb__pick(ax < 0.25, __builtin_copysign((sh + lo) * 0x1p-64, x), big); /* -0 stays -0 */
    return x != x ? x : y;
}

/* erfc x: above |x| = 0.25, erfc |x| from nb__erfc_d_parts' sum, scaled once
 * (into the subnormals too), and 2 - erfc |x| for x < 0; below, 1 - erf x
 * from nb__erf_d_small's parts (scaled back exactly, or to what 1 - erf x
 * does not see), the leading one subtracted exactly. Within 0.72 ulp,
 * 0.77 where the result is subnormal (test_cpu_math measures it against
 * long double); 0 at inf, 2 at -inf, a
 * NaN stays NaN. */
NB_FN double nb__erfc_d(double x)
{
    const double ax = __builtin_fabs(x);
    double tail, s1, s2, lo;
    const double ph = nb__erfc_d_parts(ax, &tail, &s1, &s2);
    const double pos = ((ph + tail) * s1) * s2;
    const double eh = (ph * s1) * s2, et = (tail * s1) * s2;
    const double d = 2.0 - eh, d_err = (2.0 - d) - eh;
    double y = nb__pick(x < 0, d + (d_err - et), pos);
    const double sh = nb__erf_d_small(x, &lo) * 0x1p-64;
    const double o = 1.0 - sh, o_err = (1.0 - o) - sh; /* |sh| < 0.28: exact */
    y = nb__pick(ax < 0.25, o + (o_err - lo * 0x1p-64), y);
    return x != x ? x : y;
}
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
#define NB_MATH NB_MATH_F64
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
