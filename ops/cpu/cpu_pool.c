/* 2-d max and average pooling on the CPU, and their gradients.
 *
 * Every view is contiguous (the front end makes them so). NHWC runs a row of
 * output pixels at a time with the channels innermost (unit stride, so the
 * max and sum loops vectorise); NCHW runs one channel plane at a time. The
 * work is split across the pool by (image, output row) for the forward
 * kernels, and by image (NHWC) or (image, channel) plane (NCHW) for the
 * gradients, which add into overlapping windows of their own image only. */
#include "cpu_internal.h"

#include <math.h>

typedef struct pool_ctx {
    const nb_pool2d_desc *d;
    const void *x, *sel, *dy;
    void *out;
} pool_ctx;

/* The window of output (p, q) inside the image: rows h0 + [r0, r1) and
 * columns w0 + [s0, s1). */
typedef struct pool_window {
    int64_t h0, r0, r1, w0, s0, s1;
} pool_window;

static inline pool_window window_at(const nb_pool2d_desc *d, int64_t p, int64_t q)
{
    pool_window w;
    w.h0 = p * d->sh - d->pt;
    w.r0 = w.h0 < 0 ? -w.h0 : 0;
    w.r1 = d->H - w.h0 < d->R ? d->H - w.h0 : d->R;
    w.w0 = q * d->sw - d->pl;
    w.s0 = w.w0 < 0 ? -w.w0 : 0;
    w.s1 = d->W - w.w0 < d->S ? d->W - w.w0 : d->S;
    return w;
}

/* The first maximum (NaN winning) of the window at (p, q) of a plane whose
 * element (h, w) sits at x[(h * W + w) * cs]: its offset h * W + w. */
#define DEFINE_ARGMAX(T)                                                                            \
    static inline int64_t argmax_##T(const nb_pool2d_desc *d, const T *x, int64_t cs, int64_t p,     \
                                     int64_t q)                                                     \
    {                                                                                               \
        const pool_window w = window_at(d, p, q);                                                   \
        int64_t best = (w.h0 + w.r0) * d->W + w.w0 + w.s0;                                          \
        T m = x[best * cs];                                                                         \
        if (m != m)                                                                                 \
            return best;                                                                            \
        for (int64_t r = w.r0; r < w.r1; r++)                                                       \
            for (int64_t s = w.s0; s < w.s1; s++) {                                                 \
                int64_t o = (w.h0 + r) * d->W + w.w0 + s;                                           \
                T v = x[o * cs];                                                                    \
                if (v > m || v != v) {                                                              \
                    m = v;                                                                          \
                    best = o;                                                                       \
                    if (v != v)                                                                     \
                        return best;                                                                \
                }                                                                                   \
            }                                                                                       \
        return best;                                                                                \
    }

#define DEFINE_POOL(T)                                                                              \
    DEFINE_ARGMAX(T)                                                                                \
    /* rows [b, e) of N * P (NHWC) or N * C * P (NCHW) */                                          \
    static inline __attribute__((always_inline)) void max_fwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const pool_ctx *c = vctx;                                                                   \
        const nb_pool2d_desc *d = c->d;                                                             \
        const T *x = c->x, *sel = c->sel;                                                           \
        T *out = c->out;                                                                            \
        const int64_t C = d->C, plane = d->H * d->W;                                                \
        for (int64_t row = b; row < e; row++) {                                                     \
            const int64_t p = row % d->P, img = row / d->P; /* img: n (NHWC) or n * C + c */        \
            T *o = out + row * d->Q * (d->nchw ? 1 : C);                                            \
            if (d->nchw) {                                                                          \
                const T *xi = x + img * plane;                                                      \
                for (int64_t q = 0; q < d->Q; q++) {                                                \
                    int64_t a = argmax_##T(d, xi, 1, p, q);                                         \
                    o[q] = sel ? sel[img * plane + a] : xi[a];                                      \
                }                                                                                   \
                continue;                                                                           \
            }                                                                                       \
            const T *xi = x + img * plane * C;                                                      \
            for (int64_t q = 0; q < d->Q; q++, o += C) {                                            \
                const pool_window w = window_at(d, p, q);                                           \
                if (sel) {                                                                          \
                    for (int64_t ch = 0; ch < C; ch++) {                                            \
                        int64_t a = argmax_##T(d, xi + ch, C, p, q);                                \
                        o[ch] = sel[(img * plane + a) * C + ch];                                    \
                    }                                                                               \
                    continue;                                                                       \
                }                                                                                   \
                memcpy(o, xi + ((w.h0 + w.r0) * d->W + w.w0 + w.s0) * C, sizeof(T) * (size_t)C);    \
                for (int64_t r = w.r0; r < w.r1; r++)                                               \
                    for (int64_t s = w.s0; s < w.s1; s++) {                                         \
                        const T *v = xi + ((w.h0 + r) * d->W + w.w0 + s) * C;                       \
                        for (int64_t ch = 0; ch < C; ch++)                                          \
                            o[ch] = ((v[ch] > o[ch]) | (v[ch] != v[ch])) ? v[ch] : o[ch];           \
                    }                                                                               \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    /* planes [b, e): images (NHWC) or (image, channel) pairs (NCHW) */                            \
    static inline __attribute__((always_inline)) void max_bwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const pool_ctx *c = vctx;                                                                   \
        const nb_pool2d_desc *d = c->d;                                                             \
        const T *x = c->x, *dy = c->dy;                                                             \
        T *out = c->out;                                                                            \
        const int64_t C = d->nchw ? 1 : d->C, plane = d->H * d->W * C, oplane = d->P * d->Q * C;    \
        for (int64_t img = b; img < e; img++) {                                                     \
            T *dx = out + img * plane;                                                              \
            memset(dx, 0, sizeof(T) * (size_t)plane);                                               \
            const T *xi = x + img * plane, *g = dy + img * oplane;                                  \
            if (C == 1) {                                                                           \
                for (int64_t p = 0; p < d->P; p++)                                                  \
                    for (int64_t q = 0; q < d->Q; q++)                                              \
                        dx[argmax_##T(d, xi, 1, p, q)] += g[p * d->Q + q];                          \
                continue;                                                                           \
            }                                                                                       \
            /* NHWC: the first maxima of a block of channels side by side */                       \
            T m[64];                                                                                \
            int32_t at[64];                                                                         \
            for (int64_t p = 0; p < d->P; p++) {                                                    \
                for (int64_t q = 0; q < d->Q; q++) {                                                \
                    const pool_window w = window_at(d, p, q);                                       \
                    const T *gq = g + (p * d->Q + q) * C;                                           \
                    for (int64_t c0 = 0; c0 < C; c0 += 64) {                                        \
                        const int64_t nc = C - c0 < 64 ? C - c0 : 64;                               \
                        const T *first = xi + ((w.h0 + w.r0) * d->W + w.w0 + w.s0) * C + c0;        \
                        for (int64_t ch = 0; ch < nc; ch++) {                                       \
                            m[ch] = first[ch];                                                      \
                            at[ch] = (int32_t)((w.h0 + w.r0) * d->W + w.w0 + w.s0);                 \
                        }                                                                           \
                        for (int64_t r = w.r0; r < w.r1; r++)                                       \
                            for (int64_t s = w.s0; s < w.s1; s++) {                                 \
                                const int32_t o = (int32_t)((w.h0 + r) * d->W + w.w0 + s);          \
                                const T *v = xi + (int64_t)o * C + c0;                              \
                                for (int64_t ch = 0; ch < nc; ch++) {                               \
                                    const T vv = v[ch], mm = m[ch];                                 \
                                    const int up = (vv > mm) | ((vv != vv) & (mm == mm));           \
                                    m[ch] = up ? vv : mm;                                           \
                                    at[ch] = up ? o : at[ch];                                       \
                                }                                                                   \
                            }                                                                       \
                        for (int64_t ch = 0; ch < nc; ch++)                                         \
                            dx[(int64_t)at[ch] * C + c0 + ch] += gq[c0 + ch];                       \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    static inline __attribute__((always_inline)) void avg_fwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const pool_ctx *c = vctx;                                                                   \
        const nb_pool2d_desc *d = c->d;                                                             \
        const T *x = c->x;                                                                          \
        T *out = c->out;                                                                            \
        const int64_t C = d->nchw ? 1 : d->C, plane = d->H * d->W * C;                              \
        for (int64_t row = b; row < e; row++) {                                                     \
            const int64_t p = row % d->P, img = row / d->P;                                         \
            const T *xi = x + img * plane;                                                          \
            T *o = out + row * d->Q * C;                                                            \
            for (int64_t q = 0; q < d->Q; q++, o += C) {                                            \
                const pool_window w = window_at(d, p, q);                                           \
                for (int64_t ch = 0; ch < C; ch++)                                                  \
                    o[ch] = 0;                                                                      \
                for (int64_t r = w.r0; r < w.r1; r++)                                               \
                    for (int64_t s = w.s0; s < w.s1; s++) {                                         \
                        const T *v = xi + ((w.h0 + r) * d->W + w.w0 + s) * C;                       \
                        for (int64_t ch = 0; ch < C; ch++)                                          \
                            o[ch] += v[ch];                                                         \
                    }                                                                               \
                const T inv = (T)1 / (T)((w.r1 - w.r0) * (w.s1 - w.s0));                            \
                for (int64_t ch = 0; ch < C; ch++)                                                  \
                    o[ch] *= inv;                                                                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    static inline __attribute__((always_inline)) void avg_bwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const pool_ctx *c = vctx;                                                                   \
        const nb_pool2d_desc *d = c->d;                                                             \
        const T *dy = c->dy;                                                                        \
        T *out = c->out;                                                                            \
        const int64_t C = d->nchw ? 1 : d->C, plane = d->H * d->W * C, oplane = d->P * d->Q * C;    \
        for (int64_t img = b; img < e; img++) {                                                     \
            T *dx = out + img * plane;                                                              \
            memset(dx, 0, sizeof(T) * (size_t)plane);                                               \
            const T *g = dy + img * oplane;                                                         \
            for (int64_t p = 0; p < d->P; p++) {                                                    \
                for (int64_t q = 0; q < d->Q; q++) {                                                \
                    const pool_window w = window_at(d, p, q);                                       \
                    const T inv = (T)1 / (T)((w.r1 - w.r0) * (w.s1 - w.s0));                        \
                    const T *gq = g + (p * d->Q + q) * C;                                           \
                    for (int64_t r = w.r0; r < w.r1; r++)                                           \
                        for (int64_t s = w.s0; s < w.s1; s++) {                                     \
                            T *v = dx + ((w.h0 + r) * d->W + w.w0 + s) * C;                         \
                            for (int64_t ch = 0; ch < C; ch++)                                      \
                                v[ch] += gq[ch] * inv;                                              \
                        }                                                                           \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

/* The kernels for AVX2 and for the baseline (NB_CPU_AVX2_ENTRY, cpu_internal.h). */

DEFINE_POOL(float)
DEFINE_POOL(double)
NB_CPU_AVX2_ENTRY(max_fwd, float)
NB_CPU_AVX2_ENTRY(max_fwd, double)
NB_CPU_AVX2_ENTRY(max_bwd, float)
NB_CPU_AVX2_ENTRY(max_bwd, double)
NB_CPU_AVX2_ENTRY(avg_fwd, float)
NB_CPU_AVX2_ENTRY(avg_fwd, double)
NB_CPU_AVX2_ENTRY(avg_bwd, float)
NB_CPU_AVX2_ENTRY(avg_bwd, double)

/* Rows of output for the forward kernels (N * P, or N * C * P for NCHW), and
 * planes for the gradients (N, or N * C for NCHW). */
static int64_t fwd_rows(const nb_pool2d_desc *d) { return d->N * (d->nchw ? d->C : 1) * d->P; }
static int64_t planes(const nb_pool2d_desc *d) { return d->N * (d->nchw ? d->C : 1); }
/* A grain of rows or planes holding about NB_CPU_GRAIN elements of work. */
static int64_t grain_of(int64_t units, int64_t work)
{
    int64_t per = units ? work / units : 1;
    int64_t g = per ? NB_CPU_GRAIN / (per > 0 ? per : 1) : NB_CPU_GRAIN;
    return g < 1 ? 1 : g;
}

#define RUN(name, dt, units, work, ctx)                                                             \
    do {                                                                                            \
        if ((dt) == NB_F32)                                                                         \
            nb__parallel_for((units), grain_of((units), (work)), name##_float, (ctx));              \
        else if ((dt) == NB_F64)                                                                    \
            nb__parallel_for((units), grain_of((units), (work)), name##_double, (ctx));             \
        else                                                                                        \
            return nb__cpu_unsupported(dev, #name, (dt));                                           \
    } while (0)

nb_status nb__cpu_max_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                             const nb_view *sel)
{
    if (x->dtype != NB_F32 && x->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "max_pool2d", x->dtype);
    pool_ctx c = {d, x->data, sel ? sel->data : NULL, NULL, out->data};
    int64_t work = out->numel * d->R * d->S;
    RUN(max_fwd, x->dtype, fwd_rows(d), work, &c);
    return NB_OK;
}

nb_status nb__cpu_max_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                  const nb_view *dy)
{
    if (x->dtype != NB_F32 && x->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "max_pool2d_grad", x->dtype);
    pool_ctx c = {d, x->data, NULL, dy->data, out->data};
    int64_t work = dy->numel * d->R * d->S + out->numel;
    RUN(max_bwd, x->dtype, planes(d), work, &c);
    return NB_OK;
}

nb_status nb__cpu_avg_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x)
{
    if (x->dtype != NB_F32 && x->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "avg_pool2d", x->dtype);
    pool_ctx c = {d, x->data, NULL, NULL, out->data};
    int64_t work = out->numel * d->R * d->S;
    RUN(avg_fwd, x->dtype, fwd_rows(d), work, &c);
    return NB_OK;
}

nb_status nb__cpu_avg_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy)
{
    if (dy->dtype != NB_F32 && dy->dtype != NB_F64)
        return nb__cpu_unsupported(dev, "avg_pool2d_grad", dy->dtype);
    pool_ctx c = {d, NULL, NULL, dy->data, out->data};
    int64_t work = dy->numel * d->R * d->S + out->numel;
    RUN(avg_bwd, dy->dtype, planes(d), work, &c);
    return NB_OK;
}

/* ---- per-channel kernels (batch normalisation) ------------------------------------ */

/* Four doubles (GCC's vector extension), and four elements loaded as them
 * (macros: a function returning a vector would warn about AVX's ABI). */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f_u __attribute__((vector_size(16), aligned(4), __may_alias__));
typedef double v4d_u __attribute__((vector_size(32), aligned(8), __may_alias__));
#define load4_float(p) __builtin_convertvector(*(const v4f_u *)(const void *)(p), v4d)
#define load4_double(p) ((v4d)(*(const v4d_u *)(const void *)(p)))

typedef struct chan_ctx {
    int64_t outer, C, inner, chunk;
    const void *a, *b, *center, *s, *t, *u;
    void *out;
    double *part; /* NHWC moments: 2 * C partial sums per chunk of rows */
    double *dcenter; /* NHWC moments: the center as doubles (zeros for none) */
    bool square;  /* moments with b NULL: (a - center)^2 */
} chan_ctx;

#define DEFINE_CHANNEL(T)                                                                           \
    /* NHWC: chunks [b, e) of rows, each into its own partial sums (the    \
     * center read as a row of doubles, so the inner loops vectorise) */  \
    static inline __attribute__((always_inline)) void moments_rows_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const chan_ctx *c = vctx;                                                                   \
        const int64_t C = c->C;                                                                     \
        const T *a = c->a, *bb = c->b;                                                              \
        const double *restrict m = c->dcenter;                                                      \
        for (int64_t k = b; k < e; k++) {                                                           \
            double *restrict s0 = c->part + 2 * C * k, *restrict s1 = s0 + C;                       \
            for (int64_t ch = 0; ch < C; ch++)                                                      \
                s0[ch] = s1[ch] = 0;                                                                \
            int64_t r0 = k * c->chunk, r1 = r0 + c->chunk < c->outer ? r0 + c->chunk : c->outer;    \
            for (int64_t r = r0; r < r1; r++) {                                                     \
                const T *restrict ar = a + r * C;                                                   \
                if (bb) {                                                                           \
                    const T *restrict br = bb + r * C;                                              \
                    for (int64_t ch = 0; ch < C; ch++) {                                            \
                        double x = ar[ch];                                                          \
                        s0[ch] += x;                                                                \
                        s1[ch] += x * ((double)br[ch] - m[ch]);                                     \
                    }                                                                               \
                } else {                                                                            \
                    for (int64_t ch = 0; ch < C; ch++) {                                            \
                        double x = ar[ch], d = x - m[ch];                                           \
                        s0[ch] += x;                                                                \
                        s1[ch] += d * d;                                                            \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    /* NCHW: channels [b, e), each summed over its planes */                                       \
    static inline __attribute__((always_inline)) void moments_planes_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const chan_ctx *c = vctx;                                                                   \
        const T *a = c->a, *bb = c->b, *ctr = c->center;                                           \
        T *out = c->out;                                                                            \
        for (int64_t ch = b; ch < e; ch++) {                                                        \
            double s0 = 0, s1 = 0, m = ctr ? (double)ctr[ch] : 0.0;                                 \
            for (int64_t o = 0; o < c->outer; o++) {                                                \
                const T *ap = a + (o * c->C + ch) * c->inner, *bp = bb ? bb + (o * c->C + ch) * c->inner : NULL; \
                /* vectors of four double sums, two of each side by side */                         \
                v4d a0 = {0}, a1 = {0}, q0 = {0}, q1 = {0};                                         \
                const v4d mv = {m, m, m, m};                                                        \
                const int64_t n = c->inner, n8 = n - n % 8;                                         \
                if (bp) {                                                                           \
                    for (int64_t i = 0; i < n8; i += 8) {                                           \
                        v4d x0 = load4_##T(ap + i), x1 = load4_##T(ap + i + 4);                     \
                        a0 += x0, a1 += x1;                                                         \
                        q0 += x0 * (load4_##T(bp + i) - mv);                                        \
                        q1 += x1 * (load4_##T(bp + i + 4) - mv);                                    \
                    }                                                                               \
                } else {                                                                            \
                    for (int64_t i = 0; i < n8; i += 8) {                                           \
                        v4d x0 = load4_##T(ap + i), x1 = load4_##T(ap + i + 4);                     \
                        v4d d0 = x0 - mv, d1 = x1 - mv;                                             \
                        a0 += x0, a1 += x1;                                                         \
                        q0 += d0 * d0, q1 += d1 * d1;                                               \
                    }                                                                               \
                }                                                                                   \
                double l0[8], l1[8];                                                                \
                memcpy(l0, &a0, 32), memcpy(l0 + 4, &a1, 32);                                       \
                memcpy(l1, &q0, 32), memcpy(l1 + 4, &q1, 32);                                       \
                for (int64_t i = n8; i < n; i++) {                                                  \
                    double x = ap[i], d = bp ? (double)bp[i] - m : x - m;                           \
                    l0[0] += x;                                                                     \
                    l1[0] += bp ? x * d : d * d;                                                    \
                }                                                                                   \
                for (int j = 0; j < 8; j++) {                                                       \
                    s0 += l0[j];                                                                    \
                    s1 += l1[j];                                                                    \
                }                                                                                   \
            }                                                                                       \
            if (!bb && !ctr) { /* about the channel's own mean */                                    \
                s1 -= s0 * s0 / (double)(c->outer * c->inner);                                      \
                s1 = s1 < 0 ? 0 : s1; /* rounding clamped; NaN (an infinity) kept */                \
            }                                                                                       \
            out[ch] = (T)s0;                                                                        \
            out[c->C + ch] = (T)s1;                                                                 \
        }                                                                                           \
    }                                                                                               \
    /* rows [b, e) of outer * C planes of inner elements (NHWC: planes of C) */                    \
    static inline __attribute__((always_inline)) void affine_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const chan_ctx *c = vctx;                                                                   \
        const T *a = c->a, *bb = c->b, *s = c->s, *t = c->t, *u = c->u;                             \
        T *out = c->out;                                                                            \
        if (c->inner == 1) {                                                                        \
            const int64_t C = c->C;                                                                 \
            for (int64_t r = b; r < e; r++) {                                                       \
                const T *ar = a + r * C;                                                            \
                T *o = out + r * C;                                                                 \
                if (bb) {                                                                           \
                    const T *br = bb + r * C;                                                       \
                    for (int64_t ch = 0; ch < C; ch++)                                              \
                        o[ch] = ar[ch] * s[ch] + br[ch] * t[ch] + u[ch];                            \
                } else {                                                                            \
                    for (int64_t ch = 0; ch < C; ch++)                                              \
                        o[ch] = ar[ch] * s[ch] + u[ch];                                             \
                }                                                                                   \
            }                                                                                       \
            return;                                                                                 \
        }                                                                                           \
        for (int64_t pl = b; pl < e; pl++) {                                                        \
            const int64_t ch = pl % c->C, n = c->inner;                                             \
            const T *ap = a + pl * n;                                                               \
            T *o = out + pl * n;                                                                    \
            const T sv = s[ch], uv = u[ch];                                                         \
            if (bb) {                                                                               \
                const T *bp = bb + pl * n, tv = t[ch];                                              \
                for (int64_t i = 0; i < n; i++)                                                     \
                    o[i] = ap[i] * sv + bp[i] * tv + uv;                                            \
            } else {                                                                                \
                for (int64_t i = 0; i < n; i++)                                                     \
                    o[i] = ap[i] * sv + uv;                                                         \
            }                                                                                       \
        }                                                                                           \
    }

DEFINE_CHANNEL(float)
DEFINE_CHANNEL(double)
NB_CPU_AVX2_ENTRY(moments_rows, float)
NB_CPU_AVX2_ENTRY(moments_rows, double)
NB_CPU_AVX2_ENTRY(moments_planes, float)
NB_CPU_AVX2_ENTRY(moments_planes, double)
NB_CPU_AVX2_ENTRY(affine, float)
NB_CPU_AVX2_ENTRY(affine, double)

/* Row chunks NHWC channel moments split into at most. */
#define NB_MOMENT_CHUNKS 16

nb_status nb__cpu_channel_moments(nb_device *dev, const int64_t shape[3], const nb_view *sum, const nb_view *moment,
                                  const nb_view *a, const nb_view *b, const nb_view *center)
{
    nb_dtype dt = a->dtype;
    if (dt != NB_F32 && dt != NB_F64)
        return nb__cpu_unsupported(dev, "channel_moments", dt);
    const int64_t outer = shape[0], C = shape[1], inner = shape[2];
    const size_t es = (size_t)nb__cpu_esize(dt);
    chan_ctx c = {outer, C, inner, 0, a->data, b ? b->data : NULL, center ? center->data : NULL,
                  NULL, NULL, NULL, NULL, NULL, NULL, b == NULL};
    int64_t total = outer * C * inner;
    if (inner > 1 || C == 0) {
        /* the two sums side by side, then copied into their outputs */
        void *tmp = nb__cpu_alloc_quiet(2 * (size_t)C * es + 1);
        if (!tmp)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "channel_moments: out of memory");
        c.out = tmp;
        int64_t grain = total / (C ? C : 1) ? NB_CPU_GRAIN / (total / (C ? C : 1)) : 1;
        if (dt == NB_F32)
            nb__parallel_for(C, grain < 1 ? 1 : grain, moments_planes_float, &c);
        else
            nb__parallel_for(C, grain < 1 ? 1 : grain, moments_planes_double, &c);
        memcpy(sum->data, tmp, (size_t)C * es);
        memcpy(moment->data, (char *)tmp + (size_t)C * es, (size_t)C * es);
        nb__cpu_free(dev, tmp, 2 * (size_t)C * es + 1);
        return NB_OK;
    }
    /* NHWC: chunks of rows with partial sums, combined in chunk order; how
     * many depends on the shape alone (each of about NB_CPU_GRAIN elements or
     * more, at most NB_MOMENT_CHUNKS), never on the threads, since the bits
     * depend on it */
    int64_t chunks = total < 2 * NB_CPU_GRAIN ? 1 : total / NB_CPU_GRAIN;
    if (chunks > NB_MOMENT_CHUNKS)
        chunks = NB_MOMENT_CHUNKS;
    if (chunks > outer)
        chunks = outer ? outer : 1;
    c.chunk = (outer + chunks - 1) / chunks;
    chunks = c.chunk ? (outer + c.chunk - 1) / c.chunk : 1;
    size_t pbytes = sizeof(double) * (2 * (size_t)C * (size_t)(chunks ? chunks : 1) + (size_t)C);
    c.part = nb__cpu_alloc_quiet(pbytes);
    if (!c.part)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "channel_moments: out of memory");
    c.dcenter = c.part + 2 * C * (chunks ? chunks : 1);
    for (int64_t ch = 0; ch < C; ch++)
        c.dcenter[ch] = !center ? 0.0 : dt == NB_F32 ? (double)((const float *)center->data)[ch]
                                                     : ((const double *)center->data)[ch];
    if (outer == 0)
        memset(c.part, 0, pbytes);
    else if (dt == NB_F32)
        nb__parallel_for(chunks, 1, moments_rows_float, &c);
    else
        nb__parallel_for(chunks, 1, moments_rows_double, &c);
    for (int64_t ch = 0; ch < C; ch++) {
        double s0 = 0, s1 = 0;
        for (int64_t k = 0; k < chunks; k++) {
            s0 += c.part[2 * C * k + ch];
            s1 += c.part[2 * C * k + C + ch];
        }
        if (!b && !center) { /* about the channel's own mean; rounding below 0 clamped, NaN kept */
            s1 -= s0 * s0 / (double)outer;
            s1 = s1 < 0 ? 0 : s1;
        }
        if (dt == NB_F32) {
            ((float *)sum->data)[ch] = (float)s0;
            ((float *)moment->data)[ch] = (float)s1;
        } else {
            ((double *)sum->data)[ch] = s0;
            ((double *)moment->data)[ch] = s1;
        }
    }
    nb__cpu_free(dev, c.part, pbytes);
    return NB_OK;
}

nb_status nb__cpu_channel_affine(nb_device *dev, const int64_t shape[3], const nb_view *out, const nb_view *a,
                                 const nb_view *s, const nb_view *b, const nb_view *t, const nb_view *u)
{
    nb_dtype dt = a->dtype;
    if (dt != NB_F32 && dt != NB_F64)
        return nb__cpu_unsupported(dev, "channel_affine", dt);
    chan_ctx c = {shape[0], shape[1], shape[2], 0, a->data, b ? b->data : NULL, NULL,
                  s->data, t ? t->data : NULL, u->data, out->data, NULL, NULL, false};
    int64_t rows = shape[2] == 1 ? shape[0] : shape[0] * shape[1];
    int64_t per = shape[2] == 1 ? shape[1] : shape[2];
    int64_t grain = per ? NB_CPU_GRAIN / per : 1;
    if (dt == NB_F32)
        nb__parallel_for(rows, grain < 1 ? 1 : grain, affine_float, &c);
    else
        nb__parallel_for(rows, grain < 1 ? 1 : grain, affine_double, &c);
    return NB_OK;
}
