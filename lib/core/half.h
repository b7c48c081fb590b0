/* nabla internal — the 16-bit floats on the host: f16 (IEEE binary16) and bf16
 * (bfloat16) to and from double, for the CPU's conversions and reads.
 *
 * Encoding rounds to nearest, ties to even, straight from the double (never
 * through float, which would round twice), gives subnormals where the format
 * has them, turns what rounds past the largest finite value into an infinity
 * and keeps NaNs NaN (quiet, with their sign): what a GPU's conversion does. */
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

#endif
