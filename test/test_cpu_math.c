/* The CPU's own float exp, expm1, log, log1p, tanh, erf and erfc
 * (lib/core/formulas.h)
 * and the vectorised loops made of them (ops/cpu/cpu_unary.c, cpu_softmax.c):
 *   - each function against libm's double, rounded, over every 101st float
 *     (1009th under AddressSanitizer; NB_MATH_SWEEP_STEP=1: all of them): within 0.5002 ulp, every special
 *     input exact, and correctly rounded but for few floats (the count is
 *     printed and bounded);
 *   - pow over every 10007th float against 17 exponents, random pairs and
 *     every pair of special values, the same way;
 *   - the double exp, expm1, tanh, sin, cos, log and log1p against long
 *     double's on random values over their branches, random bit patterns and
 *     edges: within 0.52, 1.01, 1.5, 0.81, 0.81, 0.501 and 0.501 ulp (exp within
 *     0.76 among the subnormals), the edges exact;
 *   - every f32 and f64 unary op at each vector level this CPU runs
 *     (baseline, AVX2, AVX-512), contiguous and strided, gives the bits of
 *     its formula called one element at a time, on random values and edges;
 *   - softmax and log_softmax the same at each level and stride, and near a
 *     double reference;
 *   - the random generator (ops/cpu/cpu_random.c): Philox4x32-10 against its
 *     published answers and a copy written here from its definition, the
 *     Box-Muller normal within 2.5 units of 2^-52 of a long double reference
 *     (edges and random words), and every distribution and dtype at each
 *     vector level, contiguous and strided, the bits of the one-element draw;
 *   - the reductions over rows, columns and all, the same bits at each level.
 * Exits 0 on success, 1 on failure. */
#include <nabla/nabla.h>

#include "lib/core/backend.h"
#include "lib/core/formulas.h"
#include "ops/cpu/cpu_internal.h"
#include "splitmix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                                                     \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            if (failures < 40) {                                                              \
                fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                               \
                fprintf(stderr, __VA_ARGS__);                                                 \
                fprintf(stderr, "\n");                                                        \
            }                                                                                 \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The same bits, or both NaN (a NaN's payload is not specified). */
static bool same_f(float a, float b) { return fbits(a) == fbits(b) || (a != a && b != b); }
static bool same_d(double a, double b) { return nb__double_bits(a) == nb__double_bits(b) || (a != a && b != b); }

/* ---- the double exp, expm1, tanh, sin and cos against long double ---- */

typedef struct math_fn_d {
    const char *name;
    double (*ours)(double);
    long double (*ref)(long double);
    double bound, bound_sub; /* ulps, and where the result is subnormal */
    const double (*ranges)[2]; /* its own, or NULL: the shared ones */
    int n_ranges;
} math_fn_d;

static double our_exp_d(double x) { return nb__exp_d(x); }
static double our_expm1_d(double x) { return nb__expm1_d(x); }
static double our_tanh_d(double x) { return nb__tanh_d(x); }
static double our_sin_d(double x) { return nb__sin_d(x); }
static double our_cos_d(double x) { return nb__cos_d(x); }
static double our_log_d(double x) { return nb__log_d(x); }
static double our_log1p_d(double x) { return nb__log1p_d(x); }
static double our_erf_d(double x) { return nb__erf_d(x); }
static double our_erfc_d(double x) { return nb__erfc_d(x); }

/* log's: the subnormals, around 1 (where the result cancels), the intervals
 * beside 1's (where -log c and r cancel, and r^2/2's rounding would show)
 * and the scales; log1p's: down to -1, small, around the change of binade,
 * where 1 + x rounds, the intervals beside 1's, and near 2^53. */
static const double log_ranges[][2] = {{0x1p-1074, 0x1p-1060}, {0x1p-1074, 0x1p-1022}, {0x1p-1022, 0x1p-1000},
                                       {0.5, 2.0},            {0.7, 1.45},            {1 - 1e-6, 1 + 1e-6},
                                       {0, 10},               {1e5, 1e9},             {1e300, 1.7e308},
                                       {1 + 0x1p-8, 1 + 0x1p-7}, {1 - 0x1p-8, 1 - 0x1p-9}};
static const double log1p_ranges[][2] = {{-1, -0.5},   {-0.5, 0.5},         {-0.3, 0.42},    {-1e-3, 1e-3},
                                         {-1e-10, 1e-10}, {0.9, 1.1},       {0, 10},         {1e5, 1e20},
                                         {9.0e15, 9.1e15}, {-0x1p-50, 0x1p-50}, {1e300, 1.7e308},
                                         {0x1p-8, 0x1p-7}, {-0x1p-8, -0x1p-10}};
/* erf's and erfc's: the small form and each side of its end (0.25), the
 * table's binades, the first intervals of 8's and 16's (where G's linear
 * term weighs most), where erfc turns subnormal and where it ends, tiny x. */
static const double erf_ranges[][2] = {{-0.25, 0.25}, {0.25, 0.5},  {-0.5, -0.25},     {0.5, 1},
                                       {-1, -0.5},    {1, 3},       {-3, -1},          {3, 6},
                                       {-6, -3},      {6, 27.5},    {26, 27.3},        {-30, 30},
                                       {-1e-5, 1e-5}, {-1e-300, 1e-300}, {0.2499, 0.2501}, {-0x1p-1060, 0x1p-1060},
                                       {8, 8.03},     {16, 16.06}};
#define RANGES(r) r, (int)(sizeof r / sizeof r[0])

static const math_fn_d fns_d[] = {
    {"exp", our_exp_d, expl, 0.52, 0.76, NULL, 0},
    {"expm1", our_expm1_d, expm1l, 1.01, 1.01, NULL, 0},
    {"tanh", our_tanh_d, tanhl, 1.5, 1.5, NULL, 0},
    {"sin", our_sin_d, sinl, 0.81, 0.81, NULL, 0},
    {"cos", our_cos_d, cosl, 0.81, 0.81, NULL, 0},
    {"log", our_log_d, logl, 0.501, 0.501, RANGES(log_ranges)},
    {"log1p", our_log1p_d, log1pl, 0.501, 0.501, RANGES(log1p_ranges)},
    {"erf", our_erf_d, erfl, 0.6, 0.77, RANGES(erf_ranges)},
    {"erfc", our_erfc_d, erfcl, 0.72, 0.77, RANGES(erf_ranges)},
};

/* The error of y in units of the last place of the double nearest ref
 * (2^-1074 among the subnormals); -1 where one is special (0, inf, NaN) and
 * the other is not its rounding. */
static double ulps_d(double y, long double ref)
{
    const double r = (double)ref;
    if (r != r || y != y || isinf(r) || isinf(y) || r == 0 || y == 0)
        return same_d(y, r) ? 0 : -1;
    int e;
    frexp(r, &e);
    const double ulp = e - 53 < -1074 ? 0x1p-1074 : ldexp(1.0, e - 53);
    return (double)(fabsl((long double)y - ref) / ulp);
}

/* Each function on random doubles over ranges that cover its branches and
 * the results near overflow and in the subnormals, on random bit patterns,
 * and on its edges (exact there), within its bound; the worst is printed. */
static void test_double_functions(void)
{
    const double shared[][2] = {{-746, 710},    {-40, 40},     {-3, 3},           {-0.6, 0.6},
                                {-0.36, 0.36},  {-1e-3, 1e-3}, {-745.2, -708},    {700, 709.79},
                                {-1e-300, 1e-300}, {-1e5, 1e5}, {-0x1p20, 0x1p20}, {-1e9, 1e9}};
    const int per = NB_ASAN ? 20000 : 200000;
    const double edges[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.35, -0.35, 0.55, -0.55,
                            0x1p-54, -0x1p-54, 0x1p-1074, 709.782712893384, 709.7827128933841, 710.0, 710.5,
                            -745.1332191019411, -745.1332191019412, -746.0, -746.5, 40.0, -40.0, 19.0, 20.0,
                            1e300, -1e300, 0x1p20, -0x1p20, 0x1.0000000000001p20, 0x1p-27, 1.5707963267948966,
                            3.141592653589793, 0x1.921fb54442d18p+20, 0x1p-1022, 0x1.fffffffffffffp-1023,
                            0x1.fffffffffffffp+1023, 0x1p53, 0x1p53 - 1, 0.5, -0.5, 2.0, 0x1p-53,
                            0x1.6a09e667f3bcdp-1, 0x1.6a09e667f3bccp-1, 0x1.6a09e667f3bcdp+0,
                            -0x1.fffffffffffffp-1, 0x1.0000000000001p+0, 0x1.fffffffffffffp-1};
    for (size_t f = 0; f < sizeof fns_d / sizeof fns_d[0]; f++) {
        const math_fn_d *fn = &fns_d[f];
        const double(*ranges)[2] = fn->ranges ? fn->ranges : shared;
        const int n_ranges = fn->ranges ? fn->n_ranges : (int)(sizeof shared / sizeof shared[0]);
        double worst = 0, worst_x = 0;
        for (int i = 0; i < n_ranges * per + per + (int)(sizeof edges / sizeof edges[0]); i++) {
            double x;
            if (i < n_ranges * per) {
                const double u = (double)(rng_u64() >> 11) * 0x1p-53;
                x = ranges[i / per][0] + u * (ranges[i / per][1] - ranges[i / per][0]);
            } else if (i < n_ranges * per + per) {
                const uint64_t b = rng_u64();
                memcpy(&x, &b, sizeof x);
            } else {
                x = edges[i - n_ranges * per - per];
            }
            const double y = fn->ours(x);
            const long double ref = fn->ref((long double)x);
            const double e = ulps_d(y, ref);
            const bool sub = fabs((double)ref) < 0x1p-1022;
            EXPECT(e >= 0 && e <= (sub ? fn->bound_sub : fn->bound), "%s(%a) = %a, %.4f ulp from %La", fn->name, x, y,
                   e, ref);
            if (e > worst)
                worst = e, worst_x = x;
        }
        printf("  double %s: within %.4f ulp of long double (worst at %a)\n", fn->name, worst, worst_x);
    }
}

/* The double pow on pairs of nine kinds (x anywhere with y small, y up to
 * 64, x beside 1 with y up to 1e8, results near both ends of the range and
 * into the subnormals, x < 0 with y whole, subnormal x, x within 2^-6 of 1
 * with |y log x| from 500 to 745, where log's parts' own error is
 * multiplied most, random bits) within
 * 0.52 ulp of long double (0.76 where the result is subnormal), and on every
 * pair of special values the bits of libm's pow (C's Annex F; a NaN for a
 * NaN, whatever its sign and payload; other finite results there within the
 * bound). */
static void test_double_pow(void)
{
    const int per = NB_ASAN ? 20000 : 200000;
    double worst = 0, worst_x = 0, worst_y = 0;
    for (int kind = 0; kind < 9; kind++) {
        for (int i = 0; i < per; i++) {
            const double u = rng_unit() * 2 - 1, v = rng_unit() * 2 - 1;
            double x, y;
            switch (kind) {
            case 0: x = exp2(u * 1000), y = v; break;
            case 1: x = exp2(u * 20), y = v * 64; break;
            case 2: x = 1 + u * 1e-6, y = v * 1e8; break;
            case 3: x = exp2(u * 1074), y = v * 1.02; break;
            case 4: x = u * 100, y = nearbyint(v * 300); break;
            case 5: x = exp2(u * 10), y = (u < 0 ? 709.7 : -744.0) / log(x) * (1 + v * 3e-3); break;
            case 6: x = fabs(u) * 0x1p-1022, y = v; break;
            case 7: x = 1 + u * 0x1p-6, y = (v < 0 ? -500 + v * 245 : 500 + v * 245) / log(x); break;
            default: {
                const uint64_t a = rng_u64(), b = rng_u64();
                memcpy(&x, &a, sizeof x), memcpy(&y, &b, sizeof y);
            }
            }
            const double got = nb__pow_d(x, y);
            const long double ref = powl((long double)x, (long double)y);
            const double e = ulps_d(got, ref);
            const bool sub = fabsl(ref) < 0x1p-1022L;
            EXPECT(e >= 0 && e <= (sub ? 0.76 : 0.52), "pow(%a, %a) = %a, %.4f ulp from %La", x, y, got, e, ref);
            if (e > worst && !sub)
                worst = e, worst_x = x, worst_y = y;
        }
    }
    const double sp[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, -7.0, 1075.0,
                         INFINITY, -INFINITY, NAN, 0x1p52, -0x1p52, 0x1p52 + 1, -(0x1p52 + 1), 0x1p53,
                         -0x1p53, 0x1p53 + 2, 0x1p51 + 0.5, -(0x1p51 + 0.5), 0x1p-1074, -0x1p-1074,
                         0x1.fffffffffffffp1023, -0x1.fffffffffffffp1023, 1 + 0x1p-52, 1 - 0x1p-53,
                         -(1 + 0x1p-52), 1023.0, -1074.0, 1e-3, 0x1p997, -0x1p997, 1e300, -1e300,
                         0x1.fffffffffffffp-1023};
    const int ns = (int)(sizeof sp / sizeof *sp);
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < ns; j++) {
            const double got = nb__pow_d(sp[i], sp[j]), want = pow(sp[i], sp[j]);
            const bool special = want != want || isinf(want) || want == 0;
            const double e = special ? (same_d(got, want) ? 0 : -1) : ulps_d(got, powl(sp[i], sp[j]));
            EXPECT(e >= 0 && e <= 0.76, "pow(%a, %a) = %a, want %a", sp[i], sp[j], got, want);
        }
    printf("  double pow: within %.4f ulp of long double (worst at %a, %a)\n", worst, worst_x, worst_y);
}

/* ---- the functions against libm's double ---- */

typedef struct math_fn {
    const char *name;
    float (*ours)(float);
    double (*ref)(double);
} math_fn;

static const math_fn fns[] = {
    {"exp", nb_expf, exp},     {"expm1", nb_expm1f, expm1}, {"log", nb_logf, log}, {"log1p", nb_log1pf, log1p},
    {"tanh", nb_tanhf, tanh}, {"erf", nb_erff, erf},         {"erfc", nb_erfcf, erfc}, {"sin", nb_sinf, sin},
    {"cos", nb_cosf, cos},
};
#define N_FNS (int)(sizeof fns / sizeof fns[0])

/* The spacing of floats at |r| (the largest float's beyond it). */
static double ulp_at(float r)
{
    float a = fabsf(r);
    if (a == 0)
        return 0x1p-149;
    float up = nextafterf(a, INFINITY);
    return isinf(up) ? (double)a - nextafterf(a, 0) : (double)up - a;
}

/* Checks f at x: the result's error in ulps (into *worst), and whether it is
 * not the rounded reference (into *differ). A reference that rounds to inf,
 * 0, or NaN must be met exactly. */
static void check_point(const math_fn *f, float x, double *worst, uint64_t *differ)
{
    const float y = f->ours(x);
    const double rd = f->ref((double)x);
    const float r = (float)rd;
    if (same_f(y, r))
        return;
    bool special = r != r || isinf(r) || r == 0 || y != y || isinf(y) || y == 0;
    EXPECT(!special && signbit(y) == signbit(r), "%s(%a) = %a, want %a", f->name, (double)x, (double)y, (double)r);
    if (special)
        return;
    (*differ)++;
    double e = fabs((double)y - rd) / ulp_at(r);
    EXPECT(e <= 0.5002, "%s(%a) = %a is %.6f ulp from %a", f->name, (double)x, (double)y, e, rd);
    if (e > *worst)
        *worst = e;
}

static void test_sweep(void)
{
    const char *env = getenv("NB_MATH_SWEEP_STEP");
    /* fewer under AddressSanitizer, whose checks make the sweep 15 times slower */
    uint64_t step = env && atoll(env) > 0 ? (uint64_t)atoll(env) : NB_ASAN ? 1009 : 101;
    /* the edges, then every step-th bit pattern (both signs, NaNs, infs) */
    const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f, 0x1p-149f, -0x1p-149f,
                           0x1p-126f, 0x1p-30f, -0x1p-30f, 0x1p-29f, -0x1p-29f, 0x1.fffffep-30f, 0x1.62e42ep+6f,
                           0x1.62e430p+6f, 89.0f, -87.33654f, -103.2789f, -0x1.9fe368p+6f, -0x1.9fe36ap+6f,
                           -104.0f, -110.0f, -111.0f, 100.0f, 101.0f, 9.01f, 10.0f, -10.0f, 0x1.fffffep127f,
                           -0x1.fffffep127f, -0.99999994f, -1.00000012f, 0.346573591f, -0.346573591f, 0.5f, -0.5f, 0.49999997f, 10.0f, 10.05f, 10.06f, 11.0f, 12.0f,
                           /* sin and cos: pi/2 and pi, the near reduction's end, far multiples of pi/2 */
                           0x1.921fb6p0f, -0x1.921fb6p0f, 0x1.921fb6p1f, 0x1p20f, -0x1p20f, 0x1.000002p20f,
                           0x1.fffffep19f, 0x1.921fb6p20f, 0x1.921fb6p50f, 0x1.921fb6p100f, 0x1p127f, 0x1p-126f,
                           1e6f, 1e7f, 1e30f, 16367173.0f, 0x1.7d9e3p126f};
    for (int k = 0; k < N_FNS; k++) {
        double worst = 0;
        uint64_t differ = 0, n = 0;
        for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++, n++)
            check_point(&fns[k], edges[i], &worst, &differ);
        for (uint64_t u = k; u < (1ull << 32); u += step, n++)
            check_point(&fns[k], bits_f((uint32_t)u), &worst, &differ);
        printf("  %-5s %llu floats: %llu not correctly rounded, at most %.6f ulp\n", fns[k].name,
               (unsigned long long)n, (unsigned long long)differ, worst);
        EXPECT(differ * 100000 <= n, "%s: %llu of %llu not correctly rounded", fns[k].name,
               (unsigned long long)differ, (unsigned long long)n);
    }
    /* the values written out */
    EXPECT(nb_expf(0.0f) == 1.0f && nb_expf(-0.0f) == 1.0f, "exp(+-0)");
    EXPECT(fbits(nb_expf(-INFINITY)) == 0 && fbits(nb_expf(-200.0f)) == 0, "exp(-inf), exp(-200): +0");
    EXPECT(nb_expf(0x1.62e42ep+6f) == 0x1.ffff08p+127f && nb_expf(0x1.62e430p+6f) == INFINITY,
           "exp's last finite float and its overflow");
    EXPECT(nb_expf(-0x1.9fe368p+6f) == 0x1p-149f && fbits(nb_expf(-0x1.9fe36ap+6f)) == 0,
           "exp's least subnormal, and +0 past it");
    EXPECT(fbits(nb_expm1f(-0.0f)) == fbits(-0.0f) && nb_expm1f(-INFINITY) == -1.0f, "expm1(-0), expm1(-inf)");
    EXPECT(fbits(nb_logf(1.0f)) == 0 && nb_logf(0.0f) == -INFINITY && nb_logf(-0.0f) == -INFINITY, "log(1), log(+-0)");
    EXPECT(isnan(nb_logf(-1.0f)) && isnan(nb_logf(-INFINITY)) && nb_logf(INFINITY) == INFINITY, "log(-1), log(+-inf)");
    EXPECT(fbits(nb_log1pf(-0.0f)) == fbits(-0.0f) && nb_log1pf(-1.0f) == -INFINITY && isnan(nb_log1pf(-2.0f)),
           "log1p(-0), log1p(-1), log1p(-2)");
    EXPECT(fbits(nb_tanhf(-0.0f)) == fbits(-0.0f) && nb_tanhf(-INFINITY) == -1.0f && nb_tanhf(20.0f) == 1.0f,
           "tanh(-0), tanh(-inf), tanh(20)");
    EXPECT(nb_tanhf(0x1p-149f) == 0x1p-149f, "tanh of the least subnormal");
    EXPECT(fbits(nb_erff(-0.0f)) == fbits(-0.0f) && nb_erff(-INFINITY) == -1.0f && nb_erff(0.5f) == (float)erf(0.5),
           "erf(-0), erf(-inf), erf at the series' end");
    EXPECT(nb_erfcf(0.0f) == 1.0f && nb_erfcf(-INFINITY) == 2.0f && fbits(nb_erfcf(INFINITY)) == 0 &&
               nb_erfcf(10.0f) == (float)erfc(10.0),
           "erfc(0), erfc(-inf), erfc(inf), erfc(10) (a subnormal)");
    for (int k = 0; k < N_FNS; k++)
        EXPECT(isnan(fns[k].ours(NAN)) && isnan(fns[k].ours(-NAN)), "%s(NaN)", fns[k].name);
}

/* pow: x over every step-th float against exponents that training uses and
 * some far ones, random pairs, and every pair of special values; each within
 * 0.5002 ulp of libm's double pow rounded, specials exact. nb__log_fine, under
 * it, within 2^-51 of log. */
static void check_pow(float x, float y, double *worst, uint64_t *differ)
{
    const float got = nb_powf(x, y);
    const double rd = pow((double)x, (double)y);
    const float r = (float)rd;
    if (same_f(got, r))
        return;
    bool special = r != r || isinf(r) || r == 0 || got != got || isinf(got) || got == 0;
    EXPECT(!special && signbit(got) == signbit(r), "pow(%a, %a) = %a, want %a", (double)x, (double)y, (double)got,
           (double)r);
    if (special)
        return;
    (*differ)++;
    const double e = fabs((double)got - rd) / ulp_at(r);
    EXPECT(e <= 0.5002, "pow(%a, %a) = %a is %.6f ulp from %a", (double)x, (double)y, (double)got, e, rd);
    *worst = e > *worst ? e : *worst;
}

static void test_pow(void)
{
    double worst = 0;
    uint64_t differ = 0, n = 0;
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 3.0f, -3.0f, 2.5f, -2.5f,
                              INFINITY, -INFINITY, NAN, 0x1p24f, -0x1p24f, 0x1.000002p24f, -0x1.000002p24f,
                              0x1.fffffep23f, -0x1.fffffep23f, 0x1p-149f, -0x1p-149f, 0x1.fffffep127f,
                              -0x1.fffffep127f, 1.00000012f, 0.99999994f, -1.00000012f, 127.0f, -149.0f, 1e-3f};
    const int ns = (int)(sizeof specials / sizeof *specials);
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < ns; j++, n++)
            check_pow(specials[i], specials[j], &worst, &differ);
    const float exps[] = {0.5f, -0.5f, 1.5f, -1.5f, 3.0f, -3.0f, 2.2f, 0.33333334f, 7.0f, -7.5f, 0.1f, 100.0f, -100.0f,
                          1e-3f, 4.0f, -2.0f, 0.75f};
    const uint64_t step = NB_ASAN ? 100003 : 10007;
    for (size_t k = 0; k < sizeof exps / sizeof *exps; k++)
        for (uint64_t u = k; u < (1ull << 32); u += step, n++)
            check_pow(bits_f((uint32_t)u), exps[k], &worst, &differ);
    for (int i = 0; i < (NB_ASAN ? 100000 : 1000000); i++, n++) {
        /* x log-uniform over floats' range, y anywhere from -64 to 64 */
        const float x = (float)exp2((rng_unit() * 2 - 1) * 126), y = (float)((rng_unit() * 2 - 1) * 64);
        check_pow(i & 1 ? x : -x, i & 2 ? y : nearbyintf(y), &worst, &differ);
    }
    printf("  pow   %llu pairs: %llu not correctly rounded, at most %.6f ulp\n", (unsigned long long)n,
           (unsigned long long)differ, worst);
    EXPECT(differ * 10000 <= n, "pow: %llu of %llu not correctly rounded", (unsigned long long)differ,
           (unsigned long long)n);
    EXPECT(nb_powf(NAN, 0.0f) == 1.0f && nb_powf(1.0f, NAN) == 1.0f && nb_powf(-1.0f, INFINITY) == 1.0f,
           "pow(NaN, 0), pow(1, NaN), pow(-1, inf)");
    EXPECT(fbits(nb_powf(-0.0f, 3.0f)) == fbits(-0.0f) && nb_powf(-0.0f, -3.0f) == -INFINITY &&
               nb_powf(-INFINITY, 3.0f) == -INFINITY && isnan(nb_powf(-2.0f, 0.5f)),
           "pow(-0, 3), pow(-0, -3), pow(-inf, 3), pow(-2, 0.5)");
    double worst_log = 0;
    for (int i = 0; i < 200000; i++) {
        const double w = i & 1 ? exp2((rng_unit() * 2 - 1) * 1000) : 1 + (rng_unit() * 2 - 1) * 0x1p-20;
        const long double ref = logl((long double)w);
        const double e = ref == 0 ? fabs(nb__log_fine(w)) : (double)(fabsl(nb__log_fine(w) - ref) / fabsl(ref));
        worst_log = e > worst_log ? e : worst_log;
    }
    EXPECT(worst_log <= 0x1p-51, "nb__log_fine is %g from log, relative", worst_log);
}

/* ---- the loops at each vector level ---- */

static const char *const levels[] = {"baseline", "avx2", "avx512"};

/* Values for op: random over a range where it is interesting, then edges. */
static void fill_inputs(double *v, int n)
{
    const double edges[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.5, -0.5, 1e-40, -1e-40,
                            1e-8, -1e-8, 88.72283935546875, 88.8, -103.97, -110.5, 700.0, -750.0, 3e38, -3e38,
                            9.1, -9.1, 1e-30, 2.0, -2.0, 16.0, -16.0};
    const int ne = (int)(sizeof edges / sizeof edges[0]);
    for (int i = 0; i < n; i++) {
        double u = rng_unit();
        v[i] = i < ne ? edges[i] : i % 3 == 0 ? (u * 2 - 1) * 120 : i % 3 == 1 ? (u * 2 - 1) * 4 : (u * 2 - 1) * 1e-3;
    }
}

/* The formula of op on one element, as the GPU-free scalar code computes it. */
static float scalar_f32(nb_unary_op op, float x, float a)
{
    switch (op) {
#define NB_UNARY(ID, name, dtypes, cost, api)                                                  \
    case NB_UN_##ID: return nb_un_##name##_f32(x, a);
#include "lib/core/ops.def"
    default: return NAN;
    }
}
static double scalar_f64(nb_unary_op op, double x, double a)
{
    switch (op) {
#define NB_UNARY(ID, name, dtypes, cost, api)                                                  \
    case NB_UN_##ID: return nb_un_##name##_f64(x, a);
#include "lib/core/ops.def"
    default: return NAN;
    }
}

static nb_view view_1d(nb_dtype dt, void *data, int64_t n, int64_t estride)
{
    nb_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dt;
    v.ndim = 1;
    v.numel = n;
    v.shape[0] = n;
    v.strides[0] = estride * (int64_t)nb_dtype_size(dt);
    v.contiguous = estride == 1;
    return v;
}

static void test_unary_levels(void)
{
    enum { N = 1031, STRIDE = 3 };
    double *in = malloc(N * sizeof *in);
    float *xf = malloc(N * STRIDE * sizeof *xf), *of = malloc(N * STRIDE * sizeof *of);
    double *xd = malloc(N * STRIDE * sizeof *xd), *od = malloc(N * STRIDE * sizeof *od);
    fill_inputs(in, N);
    int ran = 0;
    for (int l = 0; l < 3; l++) {
        if (!nb__cpu_simd_use(levels[l]))
            continue;
        ran++;
        for (int op = 0; op < NB_UN_COUNT; op++) {
            /* pow's exponents: a general one, besides the ones made cheap */
            const double alpha = op == NB_UN_POW_SCALAR ? 1.5 : op == NB_UN_STEP ? -1 : 0.25;
            for (int layout = 0; layout < 3; layout++) { /* contiguous, strided, in place */
                const bool strided = layout == 1, in_place = layout == 2;
                const int64_t st = strided ? STRIDE : 1;
                for (int i = 0; i < N; i++) {
                    xf[i * st] = (float)in[i];
                    xd[i * st] = in[i];
                    of[i * st] = NAN;
                    od[i * st] = NAN;
                }
                float *rf = in_place ? xf : of;
                double *rd = in_place ? xd : od;
                nb_view vx = view_1d(NB_F32, xf, N, st), vo = view_1d(NB_F32, rf, N, st);
                nb_status s1 = nb__cpu_backend.unary(NULL, (nb_unary_op)op, &vo, &vx, alpha);
                vx = view_1d(NB_F64, xd, N, st);
                vo = view_1d(NB_F64, rd, N, st);
                nb_status s2 = nb__cpu_backend.unary(NULL, (nb_unary_op)op, &vo, &vx, alpha);
                EXPECT(s1 == NB_OK && s2 == NB_OK, "%s at %s: %s", nb__unary_name((nb_unary_op)op), levels[l],
                       nb_error_message());
                nb_error_clear();
                int bad = 0;
                for (int i = 0; i < N && bad < 3; i++) {
                    float wf = scalar_f32((nb_unary_op)op, (float)in[i], (float)alpha);
                    double wd = scalar_f64((nb_unary_op)op, in[i], alpha);
                    bool ok = same_f(rf[i * st], wf) && same_d(rd[i * st], wd);
                    EXPECT(ok, "%s at %s, %s, x = %a: f32 %a want %a, f64 %a want %a",
                           nb__unary_name((nb_unary_op)op), levels[l],
                           strided ? "strided" : in_place ? "in place" : "contiguous", in[i], (double)rf[i * st],
                           (double)wf, rd[i * st], wd);
                    bad += !ok;
                }
            }
        }
    }
    EXPECT(ran >= 1, "no vector level ran");
    printf("  unary ops at %d vector level(s): the bits of their formulas\n", ran);
    free(in), free(xf), free(of), free(xd), free(od);
}

/* Every float binary op, f32 and f64, at each vector level: contiguous,
 * with b a broadcast scalar, with a one, and strided, against the op's
 * formula on one element (the comparisons write bool bytes). x and y come
 * from fill_inputs, y reversed, and a second pass takes y whole (pow's odd
 * and even exponents, x < 0 among them); last, the arithmetic ops run in
 * place, the result over a. */
static float scalar_bin_f32(nb_binary_op op, float x, float y)
{
    switch (op) {
#define NB_BINARY(ID, name, dtypes, cost, kind, api)                                           \
    case NB_BIN_##ID: return (float)nb_bin_##name##_f32(x, y);
#include "lib/core/ops.def"
    default: return NAN;
    }
}
static double scalar_bin_f64(nb_binary_op op, double x, double y)
{
    switch (op) {
#define NB_BINARY(ID, name, dtypes, cost, kind, api)                                           \
    case NB_BIN_##ID: return (double)nb_bin_##name##_f64(x, y);
#include "lib/core/ops.def"
    default: return NAN;
    }
}

static void test_binary_levels(void)
{
    enum { N = 1031, STRIDE = 2 };
    double *in = malloc(N * sizeof *in), *in2 = malloc(N * sizeof *in2);
    float *af = malloc(N * STRIDE * sizeof *af), *bf = malloc(N * STRIDE * sizeof *bf);
    double *ad = malloc(N * STRIDE * sizeof *ad), *bd = malloc(N * STRIDE * sizeof *bd);
    double *of = malloc(N * STRIDE * sizeof *of), *od = malloc(N * STRIDE * sizeof *od);
    fill_inputs(in, N);
    int ran = 0;
    for (int l = 0; l < 3; l++) {
        if (!nb__cpu_simd_use(levels[l]))
            continue;
        ran++;
        for (int op = 0; op < NB_BIN_COUNT; op++) {
            const bool cmp = nb__binary_is_comparison((nb_binary_op)op);
            const nb_dtype of_dt = cmp ? NB_BOOL : NB_F32, od_dt = cmp ? NB_BOOL : NB_F64;
            /* 0 same shape, 1 b scalar, 2 a scalar, 3 strided; +4: y whole; 8, 9: same shape
             * in place, over a (y whole in 9), for the ops whose result is a's dtype */
            for (int mode = 0; mode < 10; mode++) {
                const int shape = mode < 8 ? mode & 3 : 0;
                const bool in_place = mode >= 8, whole = (mode >= 4 && mode < 8) || mode == 9;
                if (in_place && cmp)
                    continue;
                const int64_t st = shape == 3 ? STRIDE : 1;
                for (int i = 0; i < N; i++) {
                    const double y = in[N - 1 - i];
                    in2[i] = whole ? nearbyint(y) : y;
                }
                for (int i = 0; i < N; i++) {
                    af[i * st] = (float)in[i], ad[i * st] = in[i];
                    bf[i * st] = (float)in2[i], bd[i * st] = in2[i];
                }
                memset(of, 0x7f, N * STRIDE * sizeof *of), memset(od, 0x7f, N * STRIDE * sizeof *od);
                void *rf = in_place ? (void *)af : of, *rd = in_place ? (void *)ad : od;
                nb_view va = view_1d(NB_F32, af, N, st), vb = view_1d(NB_F32, bf, N, st);
                nb_view vo = view_1d(of_dt, rf, N, st);
                if (shape == 1)
                    vb.strides[0] = 0, vb.contiguous = false;
                if (shape == 2)
                    va.strides[0] = 0, va.contiguous = false;
                nb_status s1 = nb__cpu_backend.binary(NULL, (nb_binary_op)op, &vo, &va, &vb);
                va = view_1d(NB_F64, ad, N, st), vb = view_1d(NB_F64, bd, N, st);
                vo = view_1d(od_dt, rd, N, st);
                if (shape == 1)
                    vb.strides[0] = 0, vb.contiguous = false;
                if (shape == 2)
                    va.strides[0] = 0, va.contiguous = false;
                nb_status s2 = nb__cpu_backend.binary(NULL, (nb_binary_op)op, &vo, &va, &vb);
                EXPECT(s1 == NB_OK && s2 == NB_OK, "%s at %s: %s", nb__binary_name((nb_binary_op)op), levels[l],
                       nb_error_message());
                nb_error_clear();
                int bad = 0;
                for (int i = 0; i < N && bad < 3; i++) {
                    const int ia = shape == 2 ? 0 : i, ib = shape == 1 ? 0 : i;
                    const float wf = scalar_bin_f32((nb_binary_op)op, (float)in[ia], (float)in2[ib]);
                    const double wd = scalar_bin_f64((nb_binary_op)op, in[ia], in2[ib]);
                    float gf;
                    double gd;
                    if (cmp) {
                        gf = ((const uint8_t *)rf)[i * st];
                        gd = ((const uint8_t *)rd)[i * st];
                    } else {
                        gf = ((const float *)rf)[i * st];
                        gd = ((const double *)rd)[i * st];
                    }
                    const bool ok = same_f(gf, wf) && same_d(gd, wd);
                    EXPECT(ok, "%s at %s, mode %d, x = %a, y = %a: f32 %a want %a, f64 %a want %a",
                           nb__binary_name((nb_binary_op)op), levels[l], mode, in[ia], in2[ib], (double)gf,
                           (double)wf, gd, wd);
                    bad += !ok;
                }
            }
        }
    }
    EXPECT(ran >= 1, "no vector level ran");
    printf("  binary ops at %d vector level(s): the bits of their formulas\n", ran);
    free(in), free(in2), free(af), free(bf), free(ad), free(bd), free(of), free(od);
}

/* ---- softmax ---- */

static void test_softmax_levels(void)
{
    const int64_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 1000, 1031};
    const int64_t rows = 3;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li], total = rows * n;
        float *x = malloc((size_t)total * sizeof *x);
        float *first = malloc((size_t)total * sizeof *first);
        for (int64_t i = 0; i < total; i++)
            x[i] = (float)((rng_unit() * 2 - 1) * 30);
        if (n > 2) { /* a row with -inf, a row with a NaN */
            x[0] = -INFINITY;
            x[n + 1] = NAN;
        }
        for (int is_log = 0; is_log < 2; is_log++) {
            int runs = 0;
            for (int l = 0; l < 3; l++) {
                if (!nb__cpu_simd_use(levels[l]))
                    continue;
                for (int strided = 0; strided < 2; strided++) {
                    /* strided: element j of row r at 2 (r n + j), the columns' stride 2 */
                    nb_view vx, vo;
                    memset(&vx, 0, sizeof vx);
                    vx.dtype = NB_F32;
                    vx.ndim = 2;
                    vx.shape[0] = rows;
                    vx.shape[1] = n;
                    vx.numel = total;
                    const int64_t es = strided ? 2 : 1;
                    vx.strides[0] = n * es * 4;
                    vx.strides[1] = es * 4;
                    vx.contiguous = !strided;
                    vo = vx;
                    float *xbuf = malloc((size_t)total * es * sizeof *xbuf);
                    float *obuf = malloc((size_t)total * es * sizeof *obuf);
                    for (int64_t i = 0; i < total; i++) {
                        xbuf[i * es] = x[i];
                        obuf[i * es] = NAN;
                    }
                    vx.data = xbuf;
                    vo.data = obuf;
                    EXPECT(nb__cpu_backend.softmax(NULL, is_log, &vo, &vx) == NB_OK, "softmax: %s", nb_error_message());
                    nb_error_clear();
                    for (int64_t i = 0; i < total; i++) {
                        float got = obuf[i * es];
                        if (runs == 0) {
                            first[i] = got;
                        } else if (!same_f(got, first[i])) {
                            EXPECT(false, "%ssoftmax len %lld at %s %s, element %lld: %a, first run %a", is_log ? "log_" : "",
                                   (long long)n, levels[l], strided ? "strided" : "contiguous", (long long)i,
                                   (double)got, (double)first[i]);
                            break;
                        }
                    }
                    runs++;
                    free(xbuf);
                    free(obuf);
                }
            }
            /* against double, from the differences x - max as the kernel rounds them to float */
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + r * n;
                float m = xr[0];
                bool has_nan = false;
                for (int64_t j = 0; j < n; j++) {
                    has_nan |= xr[j] != xr[j];
                    m = xr[j] > m ? xr[j] : m;
                }
                m = isinf(m) ? 0 : m;
                double sum = 0;
                for (int64_t j = 0; j < n; j++)
                    sum += exp((double)(xr[j] - m));
                for (int64_t j = 0; j < n; j++) {
                    const double d = (double)(xr[j] - m);
                    const double want = is_log ? d - log(sum) : exp(d) / sum;
                    const float got = first[r * n + j];
                    if (has_nan)
                        EXPECT(got != got, "softmax of a row with a NaN: %a", (double)got);
                    else if (want == -INFINITY)
                        EXPECT(got == -INFINITY, "log_softmax of -inf: %a", (double)got);
                    else
                        EXPECT(fabs(got - want) <= 3e-7 * (fabs(want) + (is_log ? 1 : 0)) + 1e-44,
                               "%ssoftmax len %lld [%lld, %lld]: %a want %a", is_log ? "log_" : "", (long long)n,
                               (long long)r, (long long)j, (double)got, want);
                }
            }
        }
        free(x), free(first);
    }
    printf("  softmax and log_softmax: the same bits at every level and stride, near double\n");
}

/* ---- the random generator ---- */

/* Philox4x32-10 from its definition (Salmon et al., SC'11) on counter c, key k. */
static void ref_philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)p1;
        c[3] = (uint32_t)p0;
        c[0] = n0;
        c[2] = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* The words nabla's element i draws on try t: counter (i, i >> 32, t, "nabl"). */
static void ref_words(uint64_t seed, uint64_t i, uint32_t t, uint64_t *w0, uint64_t *w1)
{
    uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), t, 0x6e61626cu};
    ref_philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    *w0 = (uint64_t)c[0] << 32 | c[1];
    *w1 = (uint64_t)c[2] << 32 | c[3];
}

/* sqrt(-2 log u1) cos(2 pi u2) in long double, and the radius. */
static long double ref_box_muller(uint64_t w0, uint64_t w1, long double *radius)
{
    const long double u1 = ((long double)(w0 >> 11) + 1) * 0x1p-53L, u2 = (long double)(w1 >> 11) * 0x1p-53L;
    *radius = sqrtl(-2 * logl(u1));
    return *radius * cosl(6.28318530717958647692528676655900577L * u2);
}

static void test_random_words(void)
{
    /* Random123's known answers for Philox4x32-10 */
    uint32_t zero[4] = {0, 0, 0, 0}, ones[4] = {~0u, ~0u, ~0u, ~0u};
    ref_philox(zero, 0, 0);
    ref_philox(ones, ~0u, ~0u);
    EXPECT(zero[0] == 0x6627e8d5u && zero[1] == 0xe169c58du && zero[2] == 0xbc57ac4cu && zero[3] == 0x9b00dbd8u,
           "Philox4x32-10 of zeros: %08x %08x %08x %08x", zero[0], zero[1], zero[2], zero[3]);
    EXPECT(ones[0] == 0x408f276du && ones[1] == 0x41c83b0eu && ones[2] == 0xa20bc7c6u && ones[3] == 0x6d5451fdu,
           "Philox4x32-10 of ones: %08x %08x %08x %08x", ones[0], ones[1], ones[2], ones[3]);
    /* the library's draws are those words' */
    const uint64_t seeds[] = {0, 42, 0xfedcba9876543210ULL};
    for (int si = 0; si < 3; si++)
        for (uint64_t i = 0; i < 20000; i++) {
            const uint64_t at = i < 10000 ? i : (1ULL << 32) - 5000 + i; /* across i's high word */
            uint64_t w0, w1;
            ref_words(seeds[si], at, 0, &w0, &w1);
            const double u = nb__cpu_philox_uniform(seeds[si], at);
            EXPECT(u == (double)(w0 >> 11) * 0x1p-53, "uniform of seed %llx element %llu: %a",
                   (unsigned long long)seeds[si], (unsigned long long)at, u);
            for (uint32_t t = 0; t < 3; t += 2) {
                ref_words(seeds[si], at, t, &w0, &w1);
                const double z = nb__cpu_philox_normal(seeds[si], at, t), want = nb__cpu_box_muller(w0, w1);
                EXPECT(z == want, "normal of seed %llx element %llu try %u: %a, its words give %a",
                       (unsigned long long)seeds[si], (unsigned long long)at, t, z, want);
            }
        }
}

/* |z - exact| <= 2.5 2^-52 r: the log's and the cosine's few units. */
static double box_muller_error(uint64_t w0, uint64_t w1)
{
    long double r;
    const long double ref = ref_box_muller(w0, w1, &r);
    const double z = nb__cpu_box_muller(w0, w1);
    if (r == 0) /* u1 = 1 */
        return z == 0 ? 0 : INFINITY;
    return (double)(fabsl((long double)z - ref) / r) / 0x1p-52;
}

static void test_box_muller(void)
{
    const uint64_t top = 1ULL << 53;
    /* u1 at 2^-53, 1/2 + 2^-53, 1 - 2^-53, 1; u2 at the quarter turns, the
     * eighths (where the reduction's nearest quarter changes) and beside them */
    const uint64_t x1[] = {0, 1, top / 2, top / 2 - 1, top - 2, top - 1, 12345};
    const uint64_t x2[] = {0, 1, top / 8 - 1, top / 8, top / 8 + 1, top / 4 - 1, top / 4, top / 4 + 1,
                           3 * top / 8, top / 2, 5 * top / 8, 3 * top / 4, 7 * top / 8, 7 * top / 8 + 1,
                           top - 1};
    double worst = 0;
    for (size_t a = 0; a < sizeof x1 / sizeof *x1; a++)
        for (size_t b = 0; b < sizeof x2 / sizeof *x2; b++) {
            const uint64_t w0 = x1[a] << 11 | 0x7ff, w1 = x2[b] << 11; /* the low bits are dropped */
            const double e = box_muller_error(w0, w1);
            worst = e > worst ? e : worst;
            EXPECT(e <= 2.5, "Box-Muller of u1 = (%llu + 1) 2^-53, u2 = %llu 2^-53: %g units off", (unsigned long long)x1[a],
                   (unsigned long long)x2[b], e);
        }
    EXPECT(nb__cpu_box_muller((top - 1) << 11, 12345) == 0, "u1 = 1 gives radius 0");
    EXPECT(nb__cpu_box_muller(0, (top / 4) << 11) == 0 && nb__cpu_box_muller(0, (3 * top / 4) << 11) == 0,
           "a quarter turn gives 0");
    EXPECT(nb__cpu_box_muller(0, 0) == -nb__cpu_box_muller(0, (top / 2) << 11), "cos 0 = -cos pi");
    const int n = NB_ASAN ? 200000 : 2000000;
    for (int i = 0; i < n; i++) {
        const uint64_t w0 = rng_u64(), w1 = rng_u64();
        const double e = box_muller_error(w0, w1);
        worst = e > worst ? e : worst;
        if (!(e <= 2.5))
            EXPECT(false, "Box-Muller of words %016llx %016llx: %g units off", (unsigned long long)w0,
                   (unsigned long long)w1, e);
    }
    printf("  Box-Muller: within %.2f units of 2^-52 times the radius (%d random words and the edges)\n", worst, n);
}

/* Element `flat` of a random tensor as the one-element draws give it. */
static double expected_draw(nb_random_dist dist, nb_dtype dt, double a, double b, uint64_t seed, uint64_t flat)
{
    if (dist == NB_RAND_UNIFORM) {
        const double u = nb__cpu_philox_uniform(seed, flat);
        if (dt == NB_F32) {
            const float v = (float)(a + (b - a) * u);
            return b > a && (double)v >= b ? nextafterf((float)b, (float)a) : v;
        }
        const double v = a + (b - a) * u;
        return b > a && v >= b ? nextafter(b, a) : v;
    }
    double z = nb__cpu_philox_normal(seed, flat, 0);
    for (uint32_t t = 1; dist == NB_RAND_TRUNCATED_NORMAL && !(fabs(z) <= 2.0); t++)
        z = nb__cpu_philox_normal(seed, flat, t);
    return dt == NB_F32 ? (double)(float)(a + b * z) : a + b * z;
}

static void test_random_levels(void)
{
    /* rows whose first element is anywhere in a block of 128; a range whose
     * f32 values round up to b (a + 8u at 1e8: the floats there are 8 apart) */
    const int64_t shapes[][2] = {{1, 1}, {1, 5}, {1, 127}, {1, 128}, {1, 129}, {7, 131}, {3, 1000}, {2, 4099}};
    const double ranges[][2] = {{-1.0, 4.0}, {2.0, 3.0}, {1e8, 1e8 + 8}};
    int ran = 0;
    for (int l = 0; l < 3; l++) {
        if (!nb__cpu_simd_use(levels[l]))
            continue;
        ran++;
        for (int di = 0; di < 2; di++) {
            const nb_dtype dt = di ? NB_F64 : NB_F32;
            const size_t es = nb_dtype_size(dt);
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
                for (int dist = NB_RAND_UNIFORM; dist <= NB_RAND_TRUNCATED_NORMAL; dist++)
                    for (size_t ri = 0; ri < 3; ri++)
                        for (int transposed = 0; transposed < 2; transposed++) {
                            const int64_t rows = shapes[si][0], cols = shapes[si][1], total = rows * cols;
                            nb_view v;
                            memset(&v, 0, sizeof v);
                            v.dtype = dt;
                            v.ndim = 2;
                            v.shape[0] = rows;
                            v.shape[1] = cols;
                            v.numel = total;
                            /* transposed: (r, c) stored at c rows + r */
                            v.strides[0] = (int64_t)es * (transposed ? 1 : cols);
                            v.strides[1] = (int64_t)es * (transposed ? rows : 1);
                            v.contiguous = !transposed || rows == 1;
                            char *buf = malloc((size_t)total * es);
                            memset(buf, 0xff, (size_t)total * es); /* NaNs: an unwritten element fails */
                            v.data = buf;
                            const double a = ranges[ri][0], b = ranges[ri][1];
                            const uint64_t seed = 1000 + si;
                            EXPECT(nb__cpu_backend.random(NULL, &v, (nb_random_dist)dist, a, b, seed, NULL) == NB_OK,
                                   "random: %s", nb_error_message());
                            nb_error_clear();
                            int bad = 0;
                            for (int64_t r = 0; r < rows; r++)
                                for (int64_t c = 0; c < cols; c++) {
                                    const char *at = buf + r * v.strides[0] + c * v.strides[1];
                                    const double got = dt == NB_F32 ? (double)*(const float *)at : *(const double *)at;
                                    const double want = expected_draw((nb_random_dist)dist, dt, a, b, seed,
                                                                      (uint64_t)(r * cols + c));
                                    if (!(got == want) && bad++ < 3)
                                        EXPECT(false, "random dist %d %s [%lld, %lld]%s at %s, [a, b) = [%g, %g), element (%lld, %lld): %a, want %a",
                                               dist, nb_dtype_name(dt), (long long)rows, (long long)cols,
                                               transposed ? " transposed" : "", levels[l], a, b, (long long)r,
                                               (long long)c, got, want);
                                    if (dist == NB_RAND_UNIFORM && b > a)
                                        EXPECT(got >= a && got < b, "uniform %a outside [%g, %g)", got, a, b);
                                }
                            free(buf);
                        }
        }
    }
    EXPECT(ran >= 1, "no vector level ran");
    printf("  random tensors at %d vector level(s): the bits of the one-element draws\n", ran);
}

/* The reductions (ops/cpu/cpu_reduce.c) over rows, columns and all of x, f32,
 * f64, i32 and i64, give the same bits at every vector level (any NaN for a
 * NaN): their accumulating loops are compiled for each (the integers' where
 * that is safe). A float x holds a NaN, infs and signed zeros in its dirty
 * variant. */
static void test_reduce_levels(void)
{
    /* the last two: columns split by rows (more than 8 grains of work, few tiles) */
    const int64_t shapes[][2] = {{3, 7},     {5, 200},    {3, 1000},  {2000, 3}, {300, 300},
                                 {40, 1030}, {70000, 2}, {1100, 300}, {5000, 64}};
    int ran = 0;
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64};
    for (int di = 0; di < 4; di++) {
        const nb_dtype dt = dts[di];
        const int64_t es = (int64_t)nb_dtype_size(dt);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int dirty = 0; dirty < 2; dirty++) {
                const int64_t rows = shapes[si][0], cols = shapes[si][1], total = rows * cols;
                char *x = malloc((size_t)(total * es));
                for (int64_t i = 0; i < total; i++) {
                    double v = 0.5 + rng_unit(); /* near 1, so that products stay finite */
                    v = i % 3 ? v : -v;
                    if (dirty && i % 97 == 5)
                        v = i % 5 == 0 ? NAN : i % 5 == 1 ? INFINITY : i % 5 == 2 ? -INFINITY : i % 5 == 3 ? 0.0 : -0.0;
                    if (dt == NB_F32)
                        ((float *)x)[i] = (float)v;
                    else if (dt == NB_F64)
                        ((double *)x)[i] = v;
                    else if (dt == NB_I32) /* wrapping sums and products in 64 bits, cut to 32 */
                        ((int32_t *)x)[i] = (int32_t)(rng_u64() % 2001) - 1000;
                    else
                        ((int64_t *)x)[i] = (int64_t)(rng_u64() >> 1) * (i % 2 ? 1 : -1);
                }
                nb_view vx;
                memset(&vx, 0, sizeof vx);
                vx.data = x;
                vx.dtype = dt;
                vx.ndim = 2;
                vx.shape[0] = rows;
                vx.shape[1] = cols;
                vx.numel = total;
                vx.strides[0] = cols * es;
                vx.strides[1] = es;
                vx.contiguous = true;
                for (int op = 0; op < NB_RED_COUNT; op++)
                    for (int axes = 1; axes <= 3; axes++) { /* 1: rows, 2: columns, 3: all */
                        nb_view vo = vx;
                        vo.shape[0] = axes & 2 ? 1 : rows;
                        vo.shape[1] = axes & 1 ? 1 : cols;
                        vo.numel = vo.shape[0] * vo.shape[1];
                        vo.strides[0] = vo.shape[1] * es;
                        char *first = malloc((size_t)(vo.numel * es)), *o = malloc((size_t)(vo.numel * es));
                        int runs = 0;
                        for (int l = 0; l < 3; l++) {
                            if (!nb__cpu_simd_use(levels[l]))
                                continue;
                            vo.data = runs ? o : first;
                            EXPECT(nb__cpu_backend.reduce(NULL, (nb_reduce_op)op, &vo, &vx) == NB_OK, "reduce: %s",
                                   nb_error_message());
                            nb_error_clear();
                            for (int64_t i = 0; runs && i < vo.numel; i++) {
                                const bool same = dt == NB_F32   ? same_f(((float *)o)[i], ((float *)first)[i])
                                                  : dt == NB_F64 ? same_d(((double *)o)[i], ((double *)first)[i])
                                                                 : memcmp(o + i * es, first + i * es, (size_t)es) == 0;
                                if (!same) {
                                    EXPECT(false, "%s %s [%lld, %lld]%s over %s at %s, output %lld differs from %s's",
                                           nb__reduce_name((nb_reduce_op)op), nb_dtype_name(dt), (long long)rows,
                                           (long long)cols, dirty ? " with NaN, inf, -0" : "",
                                           axes == 1 ? "rows" : axes == 2 ? "columns" : "all", levels[l],
                                           (long long)i, levels[0]);
                                    break;
                                }
                            }
                            runs++;
                        }
                        ran = runs > ran ? runs : ran;
                        free(first);
                        free(o);
                    }
                free(x);
            }
    }
    printf("  reductions over rows, columns and all: the same bits at %d vector level(s)\n", ran);
}

/* NB_CPU_SIMD caps the level the kernels start at; nb__cpu_simd_use takes
 * only the names, and only a level this CPU runs. */
static void test_level_choice(int level)
{
    const char *cap = getenv("NB_CPU_SIMD");
    for (int l = 0; l < 3; l++)
        if (cap && strcmp(cap, levels[l]) == 0)
            EXPECT(level <= l, "NB_CPU_SIMD=%s, but the kernels started at %s", cap, levels[level]);
    EXPECT(!nb__cpu_simd_use("avx1024") && !nb__cpu_simd_use("") && nb__cpu_simd_level() == level,
           "an unknown level was taken");
    EXPECT(nb__cpu_simd_use("baseline") && nb__cpu_simd_level() == 0, "the baseline was refused");
    EXPECT(nb__cpu_simd_use(levels[level]) && nb__cpu_simd_level() == level, "the starting level was refused");
}

int main(void)
{
    const int level = nb__cpu_simd_level();
    printf("test_cpu_math: this CPU's vectors: %s%s%s\n", levels[level], getenv("NB_CPU_SIMD") ? ", NB_CPU_SIMD=" : "",
           getenv("NB_CPU_SIMD") ? getenv("NB_CPU_SIMD") : "");
    test_level_choice(level);
    test_sweep();
    test_pow();
    test_double_functions();
    test_double_pow();
    test_unary_levels();
    test_binary_levels();
    test_softmax_levels();
    test_random_words();
    test_box_muller();
    test_random_levels();
    test_reduce_levels();
    nb__cpu_simd_use(levels[level]);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_cpu_math: all passed\n");
    return 0;
}
