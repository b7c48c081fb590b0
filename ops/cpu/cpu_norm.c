/* Layer normalisation over contiguous rows on the CPU: the table's
 * layer_norm_rows and layer_norm_rows_grad, f32 and f64.
 *
 * Each row is read while it sits in cache: the forward sums it, sums its
 * squared deviations about the mean (both in double) and writes the output;
 * the gradient sums the row again for its mean, sums h and h xhat over it,
 * adds g and g xhat into its block's column sums, then writes dx. Rows are
 * split across the pool; the gradient's column sums go through fixed blocks
 * of rows, combined in block order, so that dgamma and dbeta do not depend
 * on the thread count. */
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

/* Four doubles (GCC's vector extension), and four elements loaded as them
 * (macros: a function returning a vector would warn about AVX's ABI). */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f_u __attribute__((vector_size(16), aligned(4), __may_alias__));
typedef double v4d_u __attribute__((vector_size(32), aligned(8), __may_alias__));
#define load4_float(p) __builtin_convertvector(*(const v4f_u *)(const void *)(p), v4d)
#define load4_double(p) ((v4d)(*(const v4d_u *)(const void *)(p)))

typedef struct ln_ctx {
    int64_t D, rows, block;
    double eps;
    const void *x, *gamma, *beta, *g, *rstd_in;
    void *out, *mean, *rstd;
    double *part; /* gradient: 2 * D column sums (g, g xhat) per block of rows */
} ln_ctx;

/* a + b's eight lanes summed (pointers: a vector argument would warn about
 * AVX's ABI) */
static inline __attribute__((always_inline)) double hsum8(const v4d *a, const v4d *b)
{
    double l[8];
    memcpy(l, a, 32), memcpy(l + 4, b, 32);
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

#define DEFINE_LN(T)                                                                                \
    /* the sum of a row, and of its squared deviations about mu, in double */                      \
    static inline __attribute__((always_inline)) double row_sum_##T(const T *restrict x, int64_t D) \
    {                                                                                               \
        v4d a0 = {0}, a1 = {0};                                                                     \
        const int64_t n8 = D - D % 8;                                                               \
        for (int64_t i = 0; i < n8; i += 8) {                                                       \
            a0 += load4_##T(x + i);                                                                 \
            a1 += load4_##T(x + i + 4);                                                             \
        }                                                                                           \
        double s = hsum8(&a0, &a1);                                                                   \
        for (int64_t i = n8; i < D; i++)                                                            \
            s += (double)x[i];                                                                      \
        return s;                                                                                   \
    }                                                                                               \
    static inline __attribute__((always_inline)) double row_sq_##T(const T *restrict x, int64_t D, double mu) \
    {                                                                                               \
        v4d a0 = {0}, a1 = {0};                                                                     \
        const v4d m = {mu, mu, mu, mu};                                                             \
        const int64_t n8 = D - D % 8;                                                               \
        for (int64_t i = 0; i < n8; i += 8) {                                                       \
            v4d d0 = load4_##T(x + i) - m, d1 = load4_##T(x + i + 4) - m;                           \
            a0 += d0 * d0;                                                                          \
            a1 += d1 * d1;                                                                          \
        }                                                                                           \
        double s = hsum8(&a0, &a1);                                                                   \
        for (int64_t i = n8; i < D; i++) {                                                          \
            double d = (double)x[i] - mu;                                                           \
            s += d * d;                                                                             \
        }                                                                                           \
        return s;                                                                                   \
    }                                                                                               \
    /* rows [b, e). The centring is (x - m) - dm with m the mean rounded to  \
     * T and dm what that rounding lost: x - m is exact for x near m, so a  \
     * row far from 0 keeps its small deviations, and a constant row gives   \
     * exactly 0 (then exactly beta). */                                     \
    static inline __attribute__((always_inline)) void ln_fwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const ln_ctx *c = vctx;                                                                     \
        const int64_t D = c->D;                                                                     \
        const T *restrict gm = c->gamma, *restrict bt = c->beta;                                    \
        for (int64_t r = b; r < e; r++) {                                                           \
            const T *restrict x = (const T *)c->x + r * D;                                          \
            T *restrict o = (T *)c->out + r * D;                                                    \
            double mu = row_sum_##T(x, D) / (double)D;                                              \
            double rs = 1.0 / sqrt(row_sq_##T(x, D, mu) / (double)D + c->eps);                      \
            if (c->mean)                                                                            \
                ((T *)c->mean)[r] = (T)mu;                                                          \
            ((T *)c->rstd)[r] = (T)rs;                                                              \
            const T m = (T)mu, dm = (T)(mu - (double)m), s = (T)rs;                                 \
            if (gm && bt) {                                                                         \
                for (int64_t j = 0; j < D; j++)                                                     \
                    o[j] = ((x[j] - m) - dm) * s * gm[j] + bt[j];                                   \
            } else if (gm) {                                                                        \
                for (int64_t j = 0; j < D; j++)                                                     \
                    o[j] = ((x[j] - m) - dm) * s * gm[j];                                           \
            } else if (bt) {                                                                        \
                for (int64_t j = 0; j < D; j++)                                                     \
                    o[j] = ((x[j] - m) - dm) * s + bt[j];                                           \
            } else {                                                                                \
                for (int64_t j = 0; j < D; j++)                                                     \
                    o[j] = ((x[j] - m) - dm) * s;                                                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    /* blocks [b, e) of c->block rows: per row its mean again, the sums of h \
     * and h xhat (and the block's column sums of g and g xhat), then dx */  \
    static inline __attribute__((always_inline)) void ln_bwd_body_##T(void *vctx, int64_t b, int64_t e) \
    {                                                                                               \
        const ln_ctx *c = vctx;                                                                     \
        const int64_t D = c->D, n4 = D - D % 4;                                                     \
        const T *restrict gm = c->gamma, *rstd = c->rstd_in;                                        \
        for (int64_t k = b; k < e; k++) {                                                           \
            double *restrict pg = c->part ? c->part + 2 * D * k : NULL, *restrict pgx = pg ? pg + D : NULL; \
            if (pg)                                                                                 \
                memset(pg, 0, sizeof(double) * 2 * (size_t)D);                                      \
            int64_t r0 = k * c->block, r1 = r0 + c->block < c->rows ? r0 + c->block : c->rows;      \
            for (int64_t r = r0; r < r1; r++) {                                                     \
                const T *restrict x = (const T *)c->x + r * D, *restrict g = (const T *)c->g + r * D; \
                const double mu = row_sum_##T(x, D) / (double)D, rs = (double)rstd[r];              \
                const v4d vm = {mu, mu, mu, mu}, vr = {rs, rs, rs, rs};                             \
                v4d sh = {0}, shx = {0};                                                            \
                for (int64_t j = 0; j < n4; j += 4) {                                               \
                    v4d gv = load4_##T(g + j), xh = (load4_##T(x + j) - vm) * vr;                   \
                    v4d h = gm ? gv * load4_##T(gm + j) : gv;                                       \
                    sh += h;                                                                        \
                    shx += h * xh;                                                                  \
                    if (pg) {                                                                       \
                        *(v4d_u *)(pg + j) = load4_double(pg + j) + gv;                             \
                        *(v4d_u *)(pgx + j) = load4_double(pgx + j) + gv * xh;                      \
                    }                                                                               \
                }                                                                                   \
                const v4d zero = {0};                                                                   \
                double s0 = hsum8(&sh, &zero), s1 = hsum8(&shx, &zero);                         \
                for (int64_t j = n4; j < D; j++) {                                                  \
                    double gj = (double)g[j], xh = ((double)x[j] - mu) * rs;                        \
                    double h = gm ? gj * (double)gm[j] : gj;                                        \
                    s0 += h;                                                                        \
                    s1 += h * xh;                                                                   \
                    if (pg) {                                                                       \
                        pg[j] += gj;                                                                \
                        pgx[j] += gj * xh;                                                          \
                    }                                                                               \
                }                                                                                   \
                if (!c->out)                                                                        \
                    continue;                                                                       \
                T *restrict dx = (T *)c->out + r * D;                                               \
                const T m = (T)mu, dm = (T)(mu - (double)m), s = rstd[r];                           \
                const T a = (T)(s0 / (double)D), q = (T)(s1 / (double)D);                           \
                if (gm) {                                                                           \
                    for (int64_t j = 0; j < D; j++)                                                 \
                        dx[j] = s * ((g[j] * gm[j] - a) - ((x[j] - m) - dm) * s * q);               \
                } else {                                                                            \
                    for (int64_t j = 0; j < D; j++)                                                 \
                        dx[j] = s * ((g[j] - a) - ((x[j] - m) - dm) * s * q);                       \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

/* The kernels for AVX2 and for the baseline (NB_CPU_AVX2_ENTRY, cpu_internal.h). */

DEFINE_LN(float)
DEFINE_LN(double)
NB_CPU_AVX2_ENTRY(ln_fwd, float)
NB_CPU_AVX2_ENTRY(ln_fwd, double)
NB_CPU_AVX2_ENTRY(ln_bwd, float)
NB_CPU_AVX2_ENTRY(ln_bwd, double)

static const void *data_or_null(const nb_view *v) { return v ? v->data : NULL; }

nb_status nb__cpu_layer_norm_rows(nb_device *dev, int64_t rows, int64_t D, const nb_view *out, const nb_view *mean,
                                  const nb_view *rstd, const nb_view *x, const nb_view *gamma, const nb_view *beta,
                                  double epsilon)
{
    nb_dtype dt = x->dtype;
    if (dt != NB_F32 && dt != NB_F64)
        return nb__cpu_unsupported(dev, "layer_norm", dt);
    ln_ctx c = {.D = D, .rows = rows, .eps = epsilon, .x = x->data, .gamma = data_or_null(gamma),
                .beta = data_or_null(beta), .out = out->data, .mean = mean ? mean->data : NULL, .rstd = rstd->data};
    int64_t grain = D ? NB_CPU_GRAIN / D : NB_CPU_GRAIN;
    nb__parallel_for(rows, grain < 1 ? 1 : grain, dt == NB_F32 ? ln_fwd_float : ln_fwd_double, &c);
    return NB_OK;
}

/* At most this many blocks of rows for the gradient's column sums: their
 * buffer is 2 D doubles a block. */
#define LN_MAX_BLOCKS 64

nb_status nb__cpu_layer_norm_rows_grad(nb_device *dev, int64_t rows, int64_t D, const nb_view *dx,
                                       const nb_view *dgamma, const nb_view *dbeta, const nb_view *g,
                                       const nb_view *x, const nb_view *rstd, const nb_view *gamma)
{
    nb_dtype dt = x->dtype;
    if (dt != NB_F32 && dt != NB_F64)
        return nb__cpu_unsupported(dev, "layer_norm", dt);
    /* blocks of at least NB_CPU_GRAIN elements, and at most LN_MAX_BLOCKS of
     * them: sizes that depend on the shape alone */
    int64_t block = D ? NB_CPU_GRAIN / D : rows, least = (rows + LN_MAX_BLOCKS - 1) / LN_MAX_BLOCKS;
    block = block < least ? least : block;
    block = block < 1 ? 1 : block;
    int64_t blocks = (rows + block - 1) / block;
    bool cols = dgamma || dbeta;
    size_t pbytes = sizeof(double) * 2 * (size_t)D * (size_t)blocks + 1;
    ln_ctx c = {.D = D, .rows = rows, .block = block, .x = x->data, .gamma = data_or_null(gamma), .g = g->data,
                .rstd_in = rstd->data, .out = dx ? dx->data : NULL};
    if (cols && !(c.part = nb__cpu_alloc_quiet(pbytes)))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "layer_norm: out of memory");
    if (blocks && (cols || dx))
        nb__parallel_for(blocks, 1, dt == NB_F32 ? ln_bwd_float : ln_bwd_double, &c);
    if (cols) {
        for (int64_t j = 0; j < D; j++) {
            double sg = 0, sgx = 0;
            for (int64_t k = 0; k < blocks; k++) {
                sg += c.part[2 * D * k + j];
                sgx += c.part[2 * D * k + D + j];
            }
            if (dt == NB_F32) {
                if (dbeta)
                    ((float *)dbeta->data)[j] = (float)sg;
                if (dgamma)
                    ((float *)dgamma->data)[j] = (float)sgx;
            } else {
                if (dbeta)
                    ((double *)dbeta->data)[j] = sg;
                if (dgamma)
                    ((double *)dgamma->data)[j] = sgx;
            }
        }
        nb__cpu_free(dev, c.part, pbytes);
    }
    return NB_OK;
}
