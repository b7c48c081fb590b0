/* nabla internal — the 16-bit floats on the host: f16 (IEEE binary16) and bf16
 * (bfloat16) to and from double, for the CPU's conversions and reads.
 *
 * Encoding rounds to nearest, ties to even, straight from the double (never
 * through float, which would round twice), gives subnormals where the format
 * has them and turns what rounds past the largest finite value into an
 * infinity, as a GPU's conversion does. A NaN stays a quiet NaN with its
 * sign; a GPU's conversion makes every NaN the positive 0x7fff instead, so
 * only a NaN's bits differ between the two. */
#ifndef NB_CORE_HALF_H
#define NB_CORE_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The value of x rounded to a format of `digits` significant bits, smallest
 * normal exponent emin (2^emin) and largest finite value max: ties to even
 * (nearbyint in the default rounding mode), beyond max an infinity. */
static inline double nb__round_to_format(double x, int digits, int emin, double max)
{
    if (!isfinite(x) || x == 0)
        return x;
    int e;
    (void)frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int lead = e - 1 < emin ? emin : e - 1;
    double quantum = ldexp(1.0, lead - (digits - 1));
    double r = nearbyint(x / quantum) * quantum;
    return fabs(r) > max ? copysign(INFINITY, x) : r;
}

static inline uint16_t nb__bf16_from_double(double x)
{
    if (isnan(x))
        return signbit(x) ? 0xFFC0 : 0x7FC0;
    float f = (float)nb__round_to_format(x, 8, -126, 0x1.FEp127); /* exact in float */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static inline double nb__bf16_to_double(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t nb__f16_from_double(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x))
        return sign | 0x7E00;
    double r = fabs(nb__round_to_format(x, 11, -14, 65504.0));
    if (isinf(r))
        return sign | 0x7C00;
    if (r < 0x1p-14) /* subnormal (or zero): a multiple of 2^-24 */
        return sign | (uint16_t)(r * 0x1p24);
    int e;
    double m = frexp(r, &e); /* r = m 2^e, m in [0.5, 1) */
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(m * 2048.0 - 1024.0);
}

static inline double nb__f16_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* The same for f32, the common case, with bit operations (equal to the
 * above on every float). */
static inline uint16_t nb__bf16_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) /* NaN */
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static inline float nb__bf16_to_float(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline uint16_t nb__f16_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return sign | 0x7E00;
    if (a >= 0x477FF000u) /* 65520 and up round to infinity */
        return sign | 0x7C00;
    if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, exact after the scaling */
        float v;
        memcpy(&v, &a, sizeof v);
        return sign | (uint16_t)nearbyintf(v * 0x1p24f);
    }
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - ((uint32_t)(127 - 15) << 23);
    return sign | (uint16_t)(r >> 13);
}

static inline float nb__f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) { /* zero or subnormal: m 2^-24, exact */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    uint32_t bits = sign | (e == 31 ? 0x7F800000u : (e + 112u) << 23) | (m << 13); /* 112 = 127 - 15 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
