/* Counter-based random tensors (f32, f64): Philox4x32-10 keyed by the seed, with
 * the element's row-major index and a try number as the counter, so element i
 * depends only on (seed, i) — not on the shape, the threads or the chunking.
 *  uniform:   a + (b - a) * u, u in [0, 1) with 53 random bits (f32 results
 *             that round up to b are moved just below it);
 *  normal:    a + b * z, z by Box-Muller (the cosine branch) from one draw;
 *  truncated: the same, drawn again with the next try number until |z| <= 2. */
#include "cpu_internal.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define TWO_PI 6.28318530717958647692

static inline void philox(uint32_t c[4], uint64_t seed)
{
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c[0] = hi1 ^ c[1] ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c[3] ^ k1;
        c[3] = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

/* Two 64-bit words for element i on try t. */
static inline void draw(uint64_t seed, uint64_t i, uint32_t t, uint64_t *w0, uint64_t *w1)
{
    uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), t, 0x6e61626cu /* "nabl" */};
    philox(c, seed);
    *w0 = ((uint64_t)c[0] << 32) | c[1];
    *w1 = ((uint64_t)c[2] << 32) | c[3];
}

double nb__cpu_philox_uniform(uint64_t seed, uint64_t i)
{
    uint64_t w0, w1;
    draw(seed, i, 0, &w0, &w1);
    return (double)(w0 >> 11) * 0x1.0p-53;
}

double nb__cpu_philox_normal(uint64_t seed, uint64_t i, uint32_t trial)
{
    uint64_t w0, w1;
    draw(seed, i, trial, &w0, &w1);
    double u1 = ((double)(w0 >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(w1 >> 11) * 0x1.0p-53;         /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2);
}

static inline double truncated(uint64_t seed, uint64_t i)
{
    for (uint32_t t = 0; t < 1000; t++) {
        double z = nb__cpu_philox_normal(seed, i, t);
        if (fabs(z) <= 2.0)
            return z;
    }
    return 0.0; /* unreachable in practice: 1000 tries all beyond 2 sigma */
}

typedef struct rand_ctx {
    nb_random_dist dist;
    double a, b;
    uint64_t seed;
} rand_ctx;

#define RAND_ROW(NAME, T, FIX_HIGH)                                                           \
    static void NAME(void *vctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                         \
        const rand_ctx *c = vctx;                                                             \
        const double a = c->a, b = c->b;                                                      \
        switch (c->dist) {                                                                    \
        case NB_RAND_UNIFORM:                                                                 \
            for (int64_t i = 0; i < n; i++) {                                                 \
                T v = (T)(a + (b - a) * nb__cpu_philox_uniform(c->seed, (uint64_t)(flat + i))); \
                FIX_HIGH;                                                                     \
                *(T *)(p[0] + i * s[0]) = v;                                                  \
            }                                                                                 \
            break;                                                                            \
        case NB_RAND_NORMAL:                                                                  \
            for (int64_t i = 0; i < n; i++)                                                   \
                *(T *)(p[0] + i * s[0]) =                                                     \
                    (T)(a + b * nb__cpu_philox_normal(c->seed, (uint64_t)(flat + i), 0));     \
            break;                                                                            \
        default:                                                                              \
            for (int64_t i = 0; i < n; i++)                                                   \
                *(T *)(p[0] + i * s[0]) = (T)(a + b * truncated(c->seed, (uint64_t)(flat + i))); \
            break;                                                                            \
        }                                                                                     \
    }
RAND_ROW(rand_f32, float, if (b > a && (double)v >= b) v = nextafterf((float)b, (float)a))
RAND_ROW(rand_f64, double, if (b > a && v >= b) v = nextafter(b, a))

nb_status nb__cpu_random(nb_device *dev, const nb_view *out, nb_random_dist dist, double a,
                         double b, uint64_t seed, const double *seed_add)
{
    nb_cpu_loop_fn fn;
    switch (out->dtype) {
    case NB_F32: fn = rand_f32; break;
    case NB_F64: fn = rand_f64; break;
    default: return nb__cpu_unsupported(dev, "random", out->dtype);
    }
    if (dist != NB_RAND_NORMAL && dist != NB_RAND_UNIFORM && dist != NB_RAND_TRUNCATED_NORMAL)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "random: unknown distribution %d", (int)dist);
    if (seed_add) /* the CPU's memory: read now, as the kernel runs */
        seed += (uint64_t)*seed_add;
    rand_ctx c = {dist, a, b, seed};
    nb_cpu_iter it;
    const nb_view *views[1] = {out};
    nb__cpu_iter_init(&it, 1, views);
    nb__cpu_iter_run(&it, fn, &c, NB_CPU_GRAIN_HEAVY);
    return NB_OK;
}
