/* The built-in matmul: C = A @ B for f32 and f64 with any element strides.
 *
 * BLIS-style: for each NC-wide panel of B and KC-deep slice of K, B is packed
 * into NR-wide slivers (zero padded); each MC-tall block of A is packed into
 * MR-tall slivers; a register-tiled MR x NR micro-kernel runs over the pairs
 * and updates C in place (full tiles of a row-major C), or goes through a tile
 * on the stack (edge tiles, other strides).
 * Micro-kernels: AVX-512 and AVX2+FMA through intrinsics in functions compiled
 * for those targets and chosen at run time, and a portable one written with
 * GCC vector extensions (or plain loops elsewhere). Blocks of A (and, when M is
 * short, parts of the B panel) are shared out over the thread pool. Very
 * small products use a direct loop. Packing buffers come from the caching
 * allocator, so repeated calls do not reach malloc. */
#include "cpu_internal.h"

#include <pthread.h>
#include <stdlib.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NB_GEMM_X86 1
#include <immintrin.h>
#else
#define NB_GEMM_X86 0
#endif

#if defined(__GNUC__)
#define GEMM_PREFETCH(p) __builtin_prefetch((p), 1)
#else
#define GEMM_PREFETCH(p) ((void)(p))
#endif

#define GEMM_KC 256
#ifndef GEMM_SMALL
#define GEMM_SMALL 512 /* M*N*K at or below which the direct loop runs */
#endif

/* c[MR][NR] (row stride rsc, unit column stride) = (first ? 0 : c) + the product
 * of the packed slivers a (kc x MR) and b (kc x NR). */
typedef void (*ukr_f32)(int64_t kc, const float *restrict a, const float *restrict b,
                        float *restrict c, int64_t rsc, int first);
typedef void (*ukr_f64)(int64_t kc, const double *restrict a, const double *restrict b,
                        double *restrict c, int64_t rsc, int first);

typedef struct gemm_arch {
    const char *name;
    int mr32, nr32, mc32, nc32;
    ukr_f32 k32;
    int mr64, nr64, mc64, nc64;
    ukr_f64 k64;
} gemm_arch;

/* ---- micro-kernels ------------------------------------------------------------------------ */

#define UKR_BODY(T, VT, VLEN, MR, NV, ZERO, LOAD, BCAST, FMA, LOADU, STOREU)                  \
    {                                                                                         \
        VT acc[MR][NV];                                                                       \
        for (int i = 0; i < MR; i++) {                                                        \
            GEMM_PREFETCH(c + i * rsc);                                                       \
            GEMM_PREFETCH(c + i * rsc + NV * VLEN - 1);                                       \
            for (int j = 0; j < NV; j++)                                                      \
                acc[i][j] = ZERO;                                                             \
        }                                                                                     \
        for (int64_t k = 0; k < kc; k++) {                                                    \
            VT bv[NV];                                                                        \
            for (int j = 0; j < NV; j++)                                                      \
                bv[j] = LOAD(b + j * VLEN);                                                   \
            for (int i = 0; i < MR; i++) {                                                    \
                const VT av = BCAST(a[i]);                                                    \
                for (int j = 0; j < NV; j++)                                                  \
                    acc[i][j] = FMA(av, bv[j], acc[i][j]);                                    \
            }                                                                                 \
            a += MR;                                                                          \
            b += NV * VLEN;                                                                   \
        }                                                                                     \
        if (first) {                                                                          \
            for (int i = 0; i < MR; i++)                                                      \
                for (int j = 0; j < NV; j++)                                                  \
                    STOREU(c + i * rsc + j * VLEN, acc[i][j]);                                \
        } else {                                                                              \
            for (int i = 0; i < MR; i++)                                                      \
                for (int j = 0; j < NV; j++) {                                                \
                    VT v = LOADU(c + i * rsc + j * VLEN) + acc[i][j];                         \
                    STOREU(c + i * rsc + j * VLEN, v);                                        \
                }                                                                             \
        }                                                                                     \
    }

/* Defines the micro-kernel NAME for elements of type T (ATTR: the target it is
 * compiled for, or nothing) from UKR_BODY's other arguments: one body, one
 * instruction set and element type each, as the speed needs. */
#define UKR_DEFINE(NAME, ATTR, T, ...)                                                        \
    ATTR static void NAME(int64_t kc, const T *restrict a, const T *restrict b, T *restrict c,  \
                          int64_t rsc, int first) UKR_BODY(T, __VA_ARGS__)

#if NB_GEMM_X86
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
UKR_DEFINE(ukr_f32_avx512, AVX512, float, __m512, 16, 12, 2, _mm512_setzero_ps(), _mm512_load_ps,
           _mm512_set1_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_storeu_ps)
UKR_DEFINE(ukr_f64_avx512, AVX512, double, __m512d, 8, 12, 2, _mm512_setzero_pd(), _mm512_load_pd,
           _mm512_set1_pd, _mm512_fmadd_pd, _mm512_loadu_pd, _mm512_storeu_pd)
UKR_DEFINE(ukr_f32_avx2, AVX2, float, __m256, 8, 6, 2, _mm256_setzero_ps(), _mm256_load_ps, _mm256_set1_ps,
           _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps)
UKR_DEFINE(ukr_f64_avx2, AVX2, double, __m256d, 4, 6, 2, _mm256_setzero_pd(), _mm256_load_pd,
           _mm256_set1_pd, _mm256_fmadd_pd, _mm256_loadu_pd, _mm256_storeu_pd)
#endif

#if defined(__GNUC__)
typedef float v4sf __attribute__((vector_size(16)));
typedef double v2df __attribute__((vector_size(16)));
static inline v4sf gv_load4(const float *p)
{
    v4sf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline v2df gv_load2(const double *p)
{
    v2df v;
    memcpy(&v, p, sizeof v);
    return v;
}
#define GV_LOAD4 gv_load4
#define GV_LOAD2 gv_load2
#define GV_BCAST4(x) ((v4sf){(x), (x), (x), (x)})
#define GV_BCAST2(x) ((v2df){(x), (x)})
#define GV_FMA(a, b, c) ((c) + (a) * (b))
#define GV_STORE(p, v) memcpy((p), &(v), sizeof(v))
UKR_DEFINE(ukr_f32_generic, , float, v4sf, 4, 4, 2, ((v4sf){0, 0, 0, 0}), GV_LOAD4, GV_BCAST4, GV_FMA,
           GV_LOAD4, GV_STORE)
UKR_DEFINE(ukr_f64_generic, , double, v2df, 2, 4, 2, ((v2df){0, 0}), GV_LOAD2, GV_BCAST2, GV_FMA, GV_LOAD2,
           GV_STORE)
#else
#define SC_LOAD(p) (*(p))
#define SC_BCAST(x) (x)
#define SC_FMA(a, b, c) ((c) + (a) * (b))
#define SC_STORE(p, v) (*(p) = (v))
UKR_DEFINE(ukr_f32_generic, , float, float, 1, 4, 8, 0.0f, SC_LOAD, SC_BCAST, SC_FMA, SC_LOAD, SC_STORE)
UKR_DEFINE(ukr_f64_generic, , double, double, 1, 4, 4, 0.0, SC_LOAD, SC_BCAST, SC_FMA, SC_LOAD, SC_STORE)
#endif

static const gemm_arch arch_generic = {"generic", 4, 8, 128, 2048, ukr_f32_generic,
                                       4, 4, 128, 1024, ukr_f64_generic};
#if NB_GEMM_X86
static const gemm_arch arch_avx2 = {"avx2", 6, 16, 144, 4096, ukr_f32_avx2,
                                    6, 8, 96, 2048, ukr_f64_avx2};
static const gemm_arch arch_avx512 = {"avx512", 12, 32, 192, 4096, ukr_f32_avx512,
                                      12, 16, 96, 2048, ukr_f64_avx512};
#endif

static const gemm_arch *g_arch;
static pthread_once_t g_arch_once = PTHREAD_ONCE_INIT;

static void arch_init(void)
{
    g_arch = &arch_generic;
#if NB_GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        g_arch = &arch_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        g_arch = &arch_avx2;
#endif
}

static const gemm_arch *arch(void)
{
    pthread_once(&g_arch_once, arch_init);
    return g_arch;
}

const char *nb__cpu_gemm_kernel_name(void) { return arch()->name; }

bool nb__cpu_gemm_use_kernel(const char *name)
{
    (void)arch();
    if (strcmp(name, "generic") == 0) {
        g_arch = &arch_generic;
        return true;
    }
#if NB_GEMM_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        g_arch = &arch_avx2;
        return true;
    }
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f")) {
        g_arch = &arch_avx512;
        return true;
    }
#endif
    return false;
}

/* ---- packing ----------------------------------------------------------------------------- */

/* One sliver: the R x kc block src (element strides rs between its R rows, cs
 * along k) into dst[k][R], rows past r zero. A's slivers are A's rows; B's are
 * B's columns (B^T's rows). */
#define SLIVER(SUF, T, R)                                                                      \
    static void sliver_##SUF##_##R(const T *restrict src, int64_t rs, int64_t cs, int64_t r,   \
                                   int64_t kc, T *restrict dst)                                \
    {                                                                                          \
        if (r == R && rs == 1) {                                                               \
            for (int64_t k = 0; k < kc; k++)                                                   \
                for (int i = 0; i < R; i++)                                                    \
                    dst[k * R + i] = src[k * cs + i];                                          \
        } else if (r == R && cs == 1) {                                                        \
            for (int64_t k = 0; k < kc; k++)                                                   \
                for (int i = 0; i < R; i++)                                                    \
                    dst[k * R + i] = src[i * rs + k];                                          \
        } else {                                                                               \
            for (int64_t k = 0; k < kc; k++) {                                                 \
                for (int64_t i = 0; i < r; i++)                                                \
                    dst[k * R + i] = src[i * rs + k * cs];                                     \
                for (int64_t i = r; i < R; i++)                                                \
                    dst[k * R + i] = 0;                                                        \
            }                                                                                  \
        }                                                                                      \
    }
#define SLIVERS(SUF, T)                                                                        \
    SLIVER(SUF, T, 4) SLIVER(SUF, T, 6) SLIVER(SUF, T, 8) SLIVER(SUF, T, 12)                   \
    SLIVER(SUF, T, 16) SLIVER(SUF, T, 32)
SLIVERS(f32, float)
SLIVERS(f64, double)

/* ---- the blocked driver, stamped out for float and double ------------------------------- */

#define GEMM_IMPL(SUF, T, UKR_T, MRF, NRF, MCF, NCF, KF, TILE)                                    \
    typedef struct gemm_##SUF {                                                               \
        int64_t M, N, K;                                                                      \
        const T *A, *B;                                                                       \
        T *C;                                                                                 \
        int64_t rsa, csa, rsb, csb, rsc, csc;                                                 \
        int mr, nr;                                                                           \
        int64_t mc;                                                                           \
        UKR_T ukr;                                                                            \
        /* the current panel */                                                               \
        int64_t jc, nc, pc, kc;                                                               \
        const T *bp;                                                                          \
        int64_t n_ic, n_jg, jr_per_group;                                                     \
        atomic_int failed;                                                                    \
    } gemm_##SUF;                                                                             \
                                                                                              \
    /* rows [0, len) of src (rows rs apart, k running cs apart) as slivers of     \
     * width rows each (the last zero padded) into dst: A's rows, or B's columns   \
     * (B^T's rows) */                                                              \
    static void pack_##SUF(const T *src, int64_t rs, int64_t cs, int64_t len, int width, int64_t kc,  \
                           T *restrict dst)                                                  \
    {                                                                                         \
        for (int64_t i = 0; i < len; i += width) {                                            \
            const int64_t r = len - i < width ? len - i : width;                              \
            const T *from = src + i * rs;                                                     \
            T *to = dst + i * kc;                                                             \
            switch (width) {                                                                  \
            case 4: sliver_##SUF##_4(from, rs, cs, r, kc, to); break;                         \
            case 6: sliver_##SUF##_6(from, rs, cs, r, kc, to); break;                         \
            case 8: sliver_##SUF##_8(from, rs, cs, r, kc, to); break;                         \
            case 12: sliver_##SUF##_12(from, rs, cs, r, kc, to); break;                       \
            case 16: sliver_##SUF##_16(from, rs, cs, r, kc, to); break;                       \
            default: sliver_##SUF##_32(from, rs, cs, r, kc, to); break;                       \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* rows [ic, ic + mc) of the current slice of A */                                       \
    static void pack_a_##SUF(const gemm_##SUF *g, int64_t ic, int64_t mc, T *restrict ap)     \
    {                                                                                         \
        pack_##SUF(g->A + ic * g->rsa + g->pc * g->csa, g->rsa, g->csa, mc, g->mr, g->kc, ap);  \
    }                                                                                         \
                                                                                              \
    /* slivers [s0, s1) of the current B panel */                                            \
    static void pack_b_##SUF(void *ctx, int64_t s0, int64_t s1)                               \
    {                                                                                         \
        const gemm_##SUF *g = ctx;                                                            \
        const int64_t j0 = s0 * g->nr, j1 = s1 * g->nr < g->nc ? s1 * g->nr : g->nc;          \
        if (j0 < j1)                                                                          \
            pack_##SUF(g->B + g->pc * g->rsb + (g->jc + j0) * g->csb, g->csb, g->rsb, j1 - j0,  \
                       g->nr, g->kc, (T *)g->bp + j0 * g->kc);                                \
    }                                                                                         \
                                                                                              \
    /* one work item: an MC block of rows times a group of NR slivers of the panel */        \
    static void gemm_items_##SUF(void *ctx, int64_t b, int64_t e)                             \
    {                                                                                         \
        gemm_##SUF *g = ctx;                                                                  \
        const int mr = g->mr, nr = g->nr;                                                     \
        const int64_t kc = g->kc;                                                             \
        const size_t abytes = (size_t)(g->mc * kc) * sizeof(T);                               \
        T *ap = nb__cpu_alloc_quiet(abytes);                                                     \
        if (!ap) {                                                                            \
            atomic_store(&g->failed, 1);                                                      \
            return;                                                                           \
        }                                                                                     \
        T tile[TILE] __attribute__((aligned(64)));                                          \
        const bool first = g->pc == 0;                                                        \
        for (int64_t item = b; item < e; item++) {                                            \
            const int64_t ib = item / g->n_jg, jg = item % g->n_jg;                           \
            const int64_t ic = ib * g->mc;                                                    \
            const int64_t mc = g->M - ic < g->mc ? g->M - ic : g->mc;                         \
            const int64_t jr0 = jg * g->jr_per_group * nr;                                    \
            int64_t jr1 = jr0 + g->jr_per_group * nr;                                         \
            if (jr1 > g->nc)                                                                  \
                jr1 = g->nc;                                                                  \
            if (jr0 >= jr1)                                                                   \
                continue;                                                                     \
            pack_a_##SUF(g, ic, mc, ap);                                                      \
            for (int64_t jr = jr0; jr < jr1; jr += nr) {                                      \
                const int64_t n = g->nc - jr < nr ? g->nc - jr : nr;                          \
                for (int64_t ir = 0; ir < mc; ir += mr) {                                     \
                    const int64_t m = mc - ir < mr ? mc - ir : mr;                            \
                    T *c = g->C + (ic + ir) * g->rsc + (g->jc + jr) * g->csc;                 \
                    const int64_t rsc = g->rsc, csc = g->csc;                                 \
                    if (m == mr && n == nr && csc == 1) {                                     \
                        g->ukr(kc, ap + ir * kc, g->bp + jr * kc, c, rsc, first);             \
                        continue;                                                             \
                    }                                                                         \
                    g->ukr(kc, ap + ir * kc, g->bp + jr * kc, tile, nr, 1);                   \
                    if (first) {                                                              \
                        for (int64_t i = 0; i < m; i++)                                       \
                            for (int64_t j = 0; j < n; j++)                                   \
                                c[i * rsc + j * csc] = tile[i * nr + j];                      \
                    } else {                                                                  \
                        for (int64_t i = 0; i < m; i++)                                       \
                            for (int64_t j = 0; j < n; j++)                                   \
                                c[i * rsc + j * csc] += tile[i * nr + j];                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        nb__cpu_free(NULL, ap, abytes);                                                       \
    }                                                                                         \
                                                                                              \
    /* the direct loop, for small and matrix-vector products: items are (row, chunk of    \
     * up to 512 columns) pairs, so that a single long row still splits */                  \
    typedef struct small_##SUF {                                                              \
        int64_t M, N, K, nchunks;                                                             \
        const T *A, *B;                                                                       \
        T *C;                                                                                 \
        int64_t rsa, csa, rsb, csb, rsc, csc;                                                 \
    } small_##SUF;                                                                            \
    static void gemm_small_##SUF(void *ctx, int64_t b, int64_t e)                             \
    {                                                                                         \
        const small_##SUF *g = ctx;                                                           \
        const int64_t K = g->K, rsa = g->rsa, csa = g->csa, rsb = g->rsb, csb = g->csb;       \
        for (int64_t item = b; item < e; item++) {                                            \
            const int64_t i = item / g->nchunks, j0 = item % g->nchunks * 512;                \
            const int64_t j1 = g->N - j0 < 512 ? g->N : j0 + 512;                             \
            const T *arow = g->A + i * rsa;                                                   \
            if (csb == 1 && g->csc == 1) {                                                    \
                T *restrict c = g->C + i * g->rsc;                                            \
                for (int64_t j = j0; j < j1; j++)                                             \
                    c[j] = 0;                                                                 \
                for (int64_t k = 0; k < K; k++) {                                             \
                    const T a = arow[k * csa];                                                \
                    const T *restrict brow = g->B + k * rsb;                                  \
                    for (int64_t j = j0; j < j1; j++)                                         \
                        c[j] += a * brow[j];                                                  \
                }                                                                             \
            } else if (csa == 1 && rsb == 1) { /* contiguous dot products */                  \
                for (int64_t j = j0; j < j1; j++) {                                           \
                    const T *restrict bcol = g->B + j * csb;                                  \
                    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                      \
                    int64_t k = 0;                                                            \
                    for (; k + 8 <= K; k += 8)                                                \
                        for (int u = 0; u < 8; u++)                                           \
                            acc[u] += arow[k + u] * bcol[k + u];                              \
                    T s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                           \
                          ((acc[4] + acc[5]) + (acc[6] + acc[7]));                            \
                    for (; k < K; k++)                                                        \
                        s += arow[k] * bcol[k];                                               \
                    g->C[i * g->rsc + j * g->csc] = s;                                        \
                }                                                                             \
            } else {                                                                          \
                for (int64_t j = j0; j < j1; j++) {                                           \
                    T s = 0;                                                                  \
                    for (int64_t k = 0; k < K; k++)                                           \
                        s += arow[k * csa] * g->B[k * rsb + j * csb];                         \
                    g->C[i * g->rsc + j * g->csc] = s;                                        \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    nb_status nb__cpu_gemm_##SUF(int64_t M, int64_t N, int64_t K, const T *A, int64_t rsa,    \
                                 int64_t csa, const T *B, int64_t rsb, int64_t csb, T *C,     \
                                 int64_t rsc, int64_t csc)                                    \
    {                                                                                         \
        if (M <= 0 || N <= 0)                                                                 \
            return NB_OK;                                                                     \
        if (K <= 0) {                                                                         \
            for (int64_t i = 0; i < M; i++)                                                   \
                for (int64_t j = 0; j < N; j++)                                               \
                    C[i * rsc + j * csc] = 0;                                                 \
            return NB_OK;                                                                     \
        }                                                                                     \
        if (M * N * K <= GEMM_SMALL || M == 1 || N == 1) {                                    \
            small_##SUF sg = {M, N, K, (N + 511) / 512, A, B, C, rsa, csa, rsb, csb, rsc, csc};  \
            const int64_t items = M * sg.nchunks;                                             \
            if (M * N * K < ((int64_t)1 << 20))                                               \
                gemm_small_##SUF(&sg, 0, items);                                              \
            else                                                                              \
                nb__parallel_for(items, ((int64_t)1 << 18) / (K * (N < 512 ? N : 512)) + 1,   \
                                 gemm_small_##SUF, &sg);                                      \
            return NB_OK;                                                                     \
        }                                                                                     \
        /* C column-major: compute C^T = B^T A^T, so that tiles are written along rows */    \
        if (csc != 1 && rsc == 1)                                                             \
            return nb__cpu_gemm_##SUF(N, M, K, B, csb, rsb, A, csa, rsa, C, csc, rsc);        \
        const gemm_arch *ar = arch();                                                         \
        gemm_##SUF g;                                                                         \
        g.M = M, g.N = N, g.K = K, g.A = A, g.B = B, g.C = C;                                 \
        g.rsa = rsa, g.csa = csa, g.rsb = rsb, g.csb = csb, g.rsc = rsc, g.csc = csc;         \
        g.mr = ar->MRF, g.nr = ar->NRF, g.ukr = ar->KF;                                       \
        atomic_init(&g.failed, 0);                                                            \
        const int threads = nb__thread_count();                                               \
        const int64_t flops = M * N * K;                                                      \
        const int64_t nc_max = ar->NCF;                                                       \
        /* MC: the architecture's, or less so that every thread gets a block */              \
        int64_t mc = ar->MCF;                                                                 \
        if (threads > 1 && flops >= (int64_t)1 << 21) {                                       \
            int64_t share = (M + threads - 1) / threads;                                      \
            share = (share + g.mr - 1) / g.mr * g.mr;                                         \
            if (share < mc)                                                                   \
                mc = share < g.mr ? g.mr : share;                                             \
        }                                                                                     \
        g.mc = mc;                                                                            \
        const int64_t n_panel = N < nc_max ? N : nc_max;                                      \
        const size_t bbytes =                                                                 \
            (size_t)(GEMM_KC * ((n_panel + g.nr - 1) / g.nr * g.nr)) * sizeof(T);             \
        T *bp = nb__cpu_alloc_quiet(bbytes);                                                     \
        if (!bp)                                                                              \
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "matmul: out of memory packing a panel");  \
        g.bp = bp;                                                                            \
        for (int64_t jc = 0; jc < N; jc += nc_max) {                                          \
            g.jc = jc;                                                                        \
            g.nc = N - jc < nc_max ? N - jc : nc_max;                                         \
            const int64_t slivers = (g.nc + g.nr - 1) / g.nr;                                 \
            g.n_ic = (M + g.mc - 1) / g.mc;                                                   \
            g.n_jg = 1;                                                                       \
            if (threads > 1 && flops >= (int64_t)1 << 21 && g.n_ic < 2 * threads) {           \
                g.n_jg = (2 * threads + g.n_ic - 1) / g.n_ic;                                 \
                if (g.n_jg > slivers)                                                         \
                    g.n_jg = slivers;                                                         \
            }                                                                                 \
            g.jr_per_group = (slivers + g.n_jg - 1) / g.n_jg;                                 \
            for (int64_t pc = 0; pc < K; pc += GEMM_KC) {                                     \
                g.pc = pc;                                                                    \
                g.kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;                                   \
                if (threads > 1 && g.kc * g.nc >= ((int64_t)1 << 16))                         \
                    nb__parallel_for(slivers, 4, pack_b_##SUF, &g);                           \
                else                                                                          \
                    pack_b_##SUF(&g, 0, slivers);                                             \
                const int64_t items = g.n_ic * g.n_jg;                                        \
                if (threads > 1 && flops >= (int64_t)1 << 21)                                 \
                    nb__parallel_for(items, 1, gemm_items_##SUF, &g);                         \
                else                                                                          \
                    gemm_items_##SUF(&g, 0, items);                                           \
            }                                                                                 \
        }                                                                                     \
        nb__cpu_free(NULL, bp, bbytes);                                                       \
        if (atomic_load(&g.failed))                                                           \
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "matmul: out of memory packing a block");  \
        return NB_OK;                                                                         \
    }

/* The largest MR x NR over the kernels, for the tile on the stack. */
#define GEMM_MAX_MR32 12
#define GEMM_MAX_NR32 32
#define GEMM_MAX_MR64 12
#define GEMM_MAX_NR64 16

GEMM_IMPL(f32, float, ukr_f32, mr32, nr32, mc32, nc32, k32, GEMM_MAX_MR32 * GEMM_MAX_NR32)
GEMM_IMPL(f64, double, ukr_f64, mr64, nr64, mc64, nc64, k64, GEMM_MAX_MR64 * GEMM_MAX_NR64)
