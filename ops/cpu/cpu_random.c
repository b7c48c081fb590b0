/* Counter-based random tensors (f32, f64): Philox4x32-10 keyed by the seed, with
 * the element's row-major index and a try number as the counter, so element i
 * depends only on (seed, i) — not on the shape, the threads or the chunking.
 *  uniform:   a + (b - a) * u, u in [0, 1) with 53 random bits (f32 results
 *             that round up to b are moved just below it);
 *  normal:    a + b * z, z by Box-Muller (the cosine branch) from one draw;
 *  truncated: the same, drawn again with the next try number until |z| <= 2.
 * The arithmetic is done in double, with a log (nb__log_fine, formulas.h) and
 * a cosine of nabla's own (within a few units in the last place of a double)
 * that, unlike libm's, vectorise: rows are drawn a block at a time, the
 * block's loops compiled for the CPU's vector width (NB_CPU_SIMD_LOOP; this
 * file is one of the vector sources in ops/cpu/meson.build). Every width gives
 * the same bits, and nb__cpu_philox_uniform and nb__cpu_philox_normal give
 * them one at a time. */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

#include <math.h>
#include <string.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10
#define RAND_BLOCK 128 /* elements drawn at a time: their doubles stay in L1 */

/* Philox's round keys for a seed, worked out once per tensor. */
typedef struct philox_keys {
    uint32_t k0[PHILOX_ROUNDS], k1[PHILOX_ROUNDS];
} philox_keys;

static philox_keys keys_of(uint64_t seed)
{
    philox_keys k;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        k.k0[r] = k0;
        k.k1[r] = k1;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return k;
}

/* The two 64-bit words of element i on try t: Philox4x32-10 of the counter
 * (i, i >> 32, t, "nabl"). */
__attribute__((always_inline)) static inline void draw(const philox_keys *k, uint64_t i, uint32_t t,
                                                       uint64_t *w0, uint64_t *w1)
{
    uint32_t c0 = (uint32_t)i, c1 = (uint32_t)(i >> 32), c2 = t, c3 = 0x6e61626cu /* "nabl" */;
#pragma GCC unroll 10
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        const uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k->k0[r];
        c1 = (uint32_t)p1;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k->k1[r];
        c3 = (uint32_t)p0;
    }
    *w0 = ((uint64_t)c0 << 32) | c1;
    *w1 = ((uint64_t)c2 << 32) | c3;
}

/* The words of m elements on try t into w0 and w1: elements first .. first +
 * m - 1, or at[0 .. m - 1] where `at` is not NULL. One function per vector
 * level; draw_words picks the CPU's. Philox is 32x32 -> 64-bit multiplies,
 * which the AVX2 and AVX-512 versions do with one vpmuludq per lane of 64 bits
 * (the compiler, left alone, repacks 32-bit lanes every round). */
static void draw_words_scalar(const philox_keys *k, const uint64_t *at, uint64_t first, uint32_t t, int m,
                              uint64_t *w0, uint64_t *w1)
{
    for (int j = 0; j < m; j++)
        draw(k, at ? at[j] : first + (uint64_t)j, t, &w0[j], &w1[j]);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

/* draw_words for vectors V of 64-bit lanes, one element per lane, whose low
 * halves hold its counter words: the multiplies read only the low halves, so
 * the high ones may hold anything until the words are packed; the last
 * elements, fewer than a vector, one at a time. */
#define PHILOX_VECTOR_BODY(V, SET1, MUL, SRL, SLL, XOR3, AND, OR, ADD, LANES, LOAD, STORE)        \
    const V m0 = SET1(PHILOX_M0), m1 = SET1(PHILOX_M1), low = SET1(0xffffffffLL);                 \
    V k0[PHILOX_ROUNDS], k1[PHILOX_ROUNDS];                                                         \
    for (int r = 0; r < PHILOX_ROUNDS; r++) {                                                       \
        k0[r] = SET1(k->k0[r]);                                                                     \
        k1[r] = SET1(k->k1[r]);                                                                     \
    }                                                                                               \
    int j = 0;                                                                                      \
    for (; j + (int)(sizeof(V) / 8) <= m; j += (int)(sizeof(V) / 8)) {                              \
        const V i = at ? LOAD((const void *)(at + j)) : ADD(SET1((long long)(first + (uint64_t)j)), LANES); \
        V c0 = i, c1 = SRL(i, 32), c2 = SET1(t), c3 = SET1(0x6e61626c);                             \
        for (int r = 0; r < PHILOX_ROUNDS; r++) {                                                   \
            const V p0 = MUL(c0, m0), p1 = MUL(c2, m1);                                             \
            c0 = XOR3(SRL(p1, 32), c1, k0[r]);                                                      \
            c1 = p1;                                                                                \
            c2 = XOR3(SRL(p0, 32), c3, k1[r]);                                                      \
            c3 = p0;                                                                                \
        }                                                                                           \
        STORE((void *)(w0 + j), OR(SLL(c0, 32), AND(c1, low)));                                     \
        STORE((void *)(w1 + j), OR(SLL(c2, 32), AND(c3, low)));                                     \
    }                                                                                               \
    draw_words_scalar(k, at ? at + j : NULL, first + (uint64_t)j, t, m - j, w0 + j, w1 + j);

#define XOR3_512(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0x96)
NB_CPU_TARGET_AVX512 static void draw_words_avx512(const philox_keys *k, const uint64_t *at, uint64_t first,
                                                   uint32_t t, int m, uint64_t *w0, uint64_t *w1)
{
    PHILOX_VECTOR_BODY(__m512i, _mm512_set1_epi64, _mm512_mul_epu32, _mm512_srli_epi64, _mm512_slli_epi64,
                       XOR3_512, _mm512_and_si512, _mm512_or_si512, _mm512_add_epi64,
                       _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), _mm512_loadu_si512, _mm512_storeu_si512)
}

#define XOR3_256(a, b, c) _mm256_xor_si256(_mm256_xor_si256((a), (b)), (c))
NB_CPU_TARGET_AVX2 static void draw_words_avx2(const philox_keys *k, const uint64_t *at, uint64_t first,
                                               uint32_t t, int m, uint64_t *w0, uint64_t *w1)
{
    PHILOX_VECTOR_BODY(__m256i, _mm256_set1_epi64x, _mm256_mul_epu32, _mm256_srli_epi64, _mm256_slli_epi64,
                       XOR3_256, _mm256_and_si256, _mm256_or_si256, _mm256_add_epi64,
                       _mm256_set_epi64x(3, 2, 1, 0), _mm256_loadu_si256, _mm256_storeu_si256)
}
#endif

static void draw_words(const philox_keys *k, const uint64_t *at, uint64_t first, uint32_t t, int m, uint64_t *w0,
                       uint64_t *w1)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    switch (nb__cpu_simd_level()) {
    case 2: draw_words_avx512(k, at, first, t, m, w0, w1); return;
    case 1: draw_words_avx2(k, at, first, t, m, w0, w1); return;
    default: break;
    }
#endif
    draw_words_scalar(k, at, first, t, m, w0, w1);
}

/* x < 2^53 as a double, exactly, from its bits: a conversion from a 64-bit
 * integer vectorises only with AVX-512DQ. */
static inline double exact53(uint64_t x)
{
    const double half = nb__bits_double(0x4330000000000000ULL | (x >> 1)) - 0x1p52;
    return 2.0 * half + (nb__bits_double(0x4330000000000000ULL | (x & 1)) - 0x1p52);
}

/* cos(2 pi x / 2^53) for x < 2^53: the nearest quarter turn k is taken from
 * x's bits and the rest, at most an eighth of a turn, is exact, so only the
 * final multiply by pi/2 rounds; then the sine or cosine of the rest (Taylor
 * series to the 17th power, whose next term is below 2^-58), signed by k. */
static inline double cos_turns53(uint64_t x)
{
    const uint64_t k = (x + (1ULL << 50)) >> 51;      /* 0 .. 4 quarter turns */
    const uint64_t d = x + (1ULL << 51) - (k << 51); /* the rest, + 2^51, in [2^50, 3 2^50) */
    const double t = (nb__bits_double(0x4330000000000000ULL | d) - (0x1p52 + 0x1p51)) * (1.5707963267948966 * 0x1p-51);
    const double t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    const double c = 1.0 + t2 * (((-1.0 / 2 + 1.0 / 24 * t2) + (-1.0 / 720 + 1.0 / 40320 * t2) * t4) +
                                 ((-1.0 / 3628800 + 1.0 / 479001600 * t2) +
                                  (-1.0 / 87178291200.0 + 1.0 / 20922789888000.0 * t2) * t4) *
                                     t8);
    const double s = t + t * (t2 * (((-1.0 / 6 + 1.0 / 120 * t2) + (-1.0 / 5040 + 1.0 / 362880 * t2) * t4) +
                                    ((-1.0 / 39916800 + 1.0 / 6227020800.0 * t2) +
                                     (-1.0 / 1307674368000.0 + 1.0 / 355687428096000.0 * t2) * t4) *
                                        t8));
    const double v = (k & 1) ? s : c;
    return nb__bits_double(nb__double_bits(v) ^ (((k + 1) & 2) << 62)); /* minus for k = 1, 2 */
}

/* u in [0, 1) from a word: its top 53 bits. */
static inline double uniform_of(uint64_t w0) { return exact53(w0 >> 11) * 0x1.0p-53; }

/* A standard normal from two words: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1]. */
static inline double normal_of(uint64_t w0, uint64_t w1)
{
    const double u1 = (exact53(w0 >> 11) + 1.0) * 0x1.0p-53;
    return __builtin_sqrt(-2.0 * nb__log_fine(u1)) * cos_turns53(w1 >> 11);
}

double nb__cpu_box_muller(uint64_t w0, uint64_t w1) { return normal_of(w0, w1); }

double nb__cpu_philox_uniform(uint64_t seed, uint64_t i)
{
    const philox_keys k = keys_of(seed);
    uint64_t w0, w1;
    draw(&k, i, 0, &w0, &w1);
    return uniform_of(w0);
}

double nb__cpu_philox_normal(uint64_t seed, uint64_t i, uint32_t trial)
{
    const philox_keys k = keys_of(seed);
    uint64_t w0, w1;
    draw(&k, i, trial, &w0, &w1);
    return normal_of(w0, w1);
}

typedef struct rand_ctx {
    nb_random_dist dist;
    double a, b;
    philox_keys keys;
    float below_f32; /* the largest values below b, toward a (uniform) */
    double below_f64;
} rand_ctx;

/* Draws for elements first .. first + m - 1 into z: u for uniform, z on try 0
 * otherwise; for the truncated normal, the elements with |z| > 2 (1 in 22)
 * are gathered and drawn again with the next try number, together, until
 * none is left (or 1000 tries, never in practice: then 0). */
__attribute__((always_inline)) static inline void draw_block(const rand_ctx *c, uint64_t first, int m,
                                                             double *restrict z)
{
    uint64_t w0[RAND_BLOCK], w1[RAND_BLOCK];
    draw_words(&c->keys, NULL, first, 0, m, w0, w1);
    if (c->dist == NB_RAND_UNIFORM) {
        for (int j = 0; j < m; j++)
            z[j] = uniform_of(w0[j]);
        return;
    }
    for (int j = 0; j < m; j++)
        z[j] = normal_of(w0[j], w1[j]);
    if (c->dist != NB_RAND_TRUNCATED_NORMAL)
        return;
    uint64_t at[RAND_BLOCK];
    int where[RAND_BLOCK], left = 0;
    for (int j = 0; j < m; j++) { /* without a branch: 1 in 22 would mispredict */
        at[left] = first + (uint64_t)j;
        where[left] = j;
        left += !(fabs(z[j]) <= 2.0);
    }
    for (uint32_t t = 1; left > 0 && t < 1000; t++) {
        double again[RAND_BLOCK];
        draw_words(&c->keys, at, 0, t, left, w0, w1);
        for (int q = 0; q < left; q++)
            again[q] = normal_of(w0[q], w1[q]);
        int still = 0;
        for (int q = 0; q < left; q++)
            if (fabs(again[q]) <= 2.0) {
                z[where[q]] = again[q];
            } else {
                at[still] = at[q];
                where[still++] = where[q];
            }
        left = still;
    }
    for (int q = 0; q < left; q++)
        z[where[q]] = 0.0;
}

/* One row of n elements, the first of which is element `flat`. */
#define RAND_ROW(NAME, T, BELOW)                                                              \
    __attribute__((always_inline)) static inline void NAME##_body(void *vctx, int64_t n,     \
                                                                  char *const *p,             \
                                                                  const int64_t *s, int64_t flat) \
    {                                                                                         \
        const rand_ctx *c = vctx;                                                             \
        const double a = c->a, b = c->b, width = b - a;                                       \
        const bool fix_high = b > a;                                                          \
        const T below = c->BELOW;                                                             \
        double z[RAND_BLOCK];                                                                 \
        T v[RAND_BLOCK];                                                                      \
        for (int64_t base = 0; base < n; base += RAND_BLOCK) {                                \
            const int m = (int)(n - base < RAND_BLOCK ? n - base : RAND_BLOCK);               \
            draw_block(c, (uint64_t)(flat + base), m, z);                                     \
            if (c->dist == NB_RAND_UNIFORM)                                                   \
                for (int j = 0; j < m; j++) {                                                 \
                    const T x = (T)(a + width * z[j]);                                        \
                    v[j] = fix_high && (double)x >= b ? below : x;                            \
                }                                                                             \
            else                                                                              \
                for (int j = 0; j < m; j++)                                                   \
                    v[j] = (T)(a + b * z[j]);                                                 \
            if (s[0] == (int64_t)sizeof(T))                                                   \
                memcpy(p[0] + base * s[0], v, (size_t)m * sizeof(T));                         \
            else                                                                              \
                for (int j = 0; j < m; j++)                                                   \
                    *(T *)(p[0] + (base + j) * s[0]) = v[j];                                  \
        }                                                                                     \
    }                                                                                         \
    NB_CPU_SIMD_LOOP(NAME)
RAND_ROW(rand_f32, float, below_f32)
RAND_ROW(rand_f64, double, below_f64)

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
    if (seed_add) { /* the CPU's memory: read now, as the kernel runs; 64 bits in a double's place */
        uint64_t add;
        memcpy(&add, seed_add, sizeof add);
        seed += add;
    }
    rand_ctx c = {dist, a, b, keys_of(seed), nextafterf((float)b, (float)a), nextafter(b, a)};
    const nb_view *views[1] = {out};
    nb__cpu_iter_views(1, views, fn, &c, NB_CPU_GRAIN_HEAVY);
    return NB_OK;
}
