/* The matmul entry: batch dims (broadcast by stride 0 allowed), operand layouts
 * derived from the strides of the last two dims, and the product by CBLAS
 * (when NB_HAVE_CBLAS) or the built-in gemm (cpu_gemm.c).
 * Dtypes: f32, f64 (BLAS or built-in); i32, i64 by a plain loop (wrapping). */
#include "cpu_internal.h"
#include "nb_config.h"

#include <limits.h>

#if NB_HAVE_CBLAS
#include <cblas.h>
#endif

typedef struct mm_plan {
    nb_dtype dtype;
    int64_t es, M, N, K;
    int nb;                       /* batch dims */
    int64_t bshape[NB_MAX_DIMS];
    int64_t bst[3][NB_MAX_DIMS];  /* byte strides over the batch dims: out, a, b */
    int64_t nbatch;
    int64_t rs[3], cs[3];         /* element strides of the last two dims: out, a, b */
    char *data[3];
    bool builtin;
    atomic_int failed;
} mm_plan;

#if NB_HAVE_CBLAS
/* Row-major (false) or column-major (true) with its leading dimension, as BLAS
 * wants them; false when the layout has no unit stride BLAS can use. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *colmajor,
                        int64_t *ld)
{
    int64_t minr = cols > 1 ? cols : 1, minc = rows > 1 ? rows : 1;
    if ((cs == 1 || cols == 1) && (rows == 1 || rs >= minr)) {
        *colmajor = false;
        *ld = rows == 1 ? minr : rs;
        return *ld <= INT_MAX;
    }
    if ((rs == 1 || rows == 1) && (cols == 1 || cs >= minc)) {
        *colmajor = true;
        *ld = cols == 1 ? minc : cs;
        return *ld <= INT_MAX;
    }
    return false;
}

/* One product through CBLAS; false when the layouts or sizes do not suit it. */
static bool blas_one(const mm_plan *pl, char *c, const char *a, const char *b)
{
    bool ccol, acol, bcol;
    int64_t ldc, lda, ldb;
    if (pl->M > INT_MAX || pl->N > INT_MAX || pl->K > INT_MAX ||
        !blas_layout(pl->M, pl->N, pl->rs[0], pl->cs[0], &ccol, &ldc) ||
        !blas_layout(pl->M, pl->K, pl->rs[1], pl->cs[1], &acol, &lda) ||
        !blas_layout(pl->K, pl->N, pl->rs[2], pl->cs[2], &bcol, &ldb))
        return false;
    const enum CBLAS_ORDER order = ccol ? CblasColMajor : CblasRowMajor;
    const enum CBLAS_TRANSPOSE ta = acol == ccol ? CblasNoTrans : CblasTrans;
    const enum CBLAS_TRANSPOSE tb = bcol == ccol ? CblasNoTrans : CblasTrans;
    if (pl->dtype == NB_F32)
        cblas_sgemm(order, ta, tb, (int)pl->M, (int)pl->N, (int)pl->K, 1.0f, (const float *)a,
                    (int)lda, (const float *)b, (int)ldb, 0.0f, (float *)c, (int)ldc);
    else
        cblas_dgemm(order, ta, tb, (int)pl->M, (int)pl->N, (int)pl->K, 1.0, (const double *)a,
                    (int)lda, (const double *)b, (int)ldb, 0.0, (double *)c, (int)ldc);
    return true;
}
#endif

#define INT_MM(NAME, T, U)                                                                     \
    static void NAME(const mm_plan *pl, char *cp, const char *ap, const char *bp)             \
    {                                                                                          \
        T *C = (T *)cp;                                                                        \
        const T *A = (const T *)ap, *B = (const T *)bp;                                        \
        const int64_t rsc = pl->rs[0], csc = pl->cs[0], rsa = pl->rs[1], csa = pl->cs[1];      \
        const int64_t rsb = pl->rs[2], csb = pl->cs[2];                                        \
        for (int64_t i = 0; i < pl->M; i++)                                                    \
            for (int64_t j = 0; j < pl->N; j++) {                                              \
                U s = 0;                                                                       \
                for (int64_t k = 0; k < pl->K; k++)                                            \
                    s += (U)A[i * rsa + k * csa] * (U)B[k * rsb + j * csb];                    \
                C[i * rsc + j * csc] = (T)s;                                                   \
            }                                                                                  \
    }
INT_MM(mm_i32, int32_t, uint32_t)
INT_MM(mm_i64, int64_t, uint64_t)

static nb_status mm_one(const mm_plan *pl, char *c, const char *a, const char *b)
{
#if NB_HAVE_CBLAS
    if ((pl->dtype == NB_F32 || pl->dtype == NB_F64) && !pl->builtin && blas_one(pl, c, a, b))
        return NB_OK; /* else the built-in kernel */
#endif
    switch (pl->dtype) {
    case NB_F32:
        return nb__cpu_gemm_f32(pl->M, pl->N, pl->K, (const float *)a, pl->rs[1], pl->cs[1],
                                (const float *)b, pl->rs[2], pl->cs[2], (float *)c, pl->rs[0],
                                pl->cs[0]);
    case NB_F64:
        return nb__cpu_gemm_f64(pl->M, pl->N, pl->K, (const double *)a, pl->rs[1], pl->cs[1],
                                (const double *)b, pl->rs[2], pl->cs[2], (double *)c, pl->rs[0],
                                pl->cs[0]);
    case NB_I32: mm_i32(pl, c, a, b); return NB_OK;
    default: mm_i64(pl, c, a, b); return NB_OK;
    }
}

/* Batches [b, e), each product on its own. */
static void mm_batches(void *ctx, int64_t b, int64_t e)
{
    mm_plan *pl = ctx;
    int64_t idx[NB_MAX_DIMS], off[3];
    nb__cpu_index_at(pl->nb, pl->bshape, b, idx, 3, off, (const int64_t(*)[NB_MAX_DIMS])pl->bst);
    for (int64_t f = b; f < e; f++) {
        if (mm_one(pl, pl->data[0] + off[0], pl->data[1] + off[1], pl->data[2] + off[2]) != NB_OK)
            atomic_store(&pl->failed, 1);
        if (f + 1 < e)
            nb__cpu_index_next(pl->nb, pl->bshape, idx, 3, off, (const int64_t(*)[NB_MAX_DIMS])pl->bst);
    }
}

static nb_status matmul(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b,
                        bool builtin)
{
    nb_dtype dt = out->dtype;
    if (dt != NB_F32 && dt != NB_F64 && dt != NB_I32 && dt != NB_I64)
        return nb__cpu_unsupported(dev, "matmul", dt);
    if (a->dtype != dt || b->dtype != dt)
        return nb__fail(NB_ERR_DTYPE, "matmul: dtypes %s @ %s -> %s differ",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype), nb_dtype_name(dt));
    const int nd = out->ndim;
    if (nd < 2 || a->ndim != nd || b->ndim != nd)
        return nb__fail(NB_ERR_SHAPE, "matmul: operands have %d, %d and %d dims (need equal, >= 2)",
                        a->ndim, b->ndim, nd);
    mm_plan pl;
    pl.dtype = dt;
    pl.es = nb__cpu_esize(dt);
    pl.M = out->shape[nd - 2];
    pl.N = out->shape[nd - 1];
    pl.K = a->shape[nd - 1];
    if (a->shape[nd - 2] != pl.M || b->shape[nd - 2] != pl.K || b->shape[nd - 1] != pl.N)
        return nb__fail(NB_ERR_SHAPE, "matmul: [%lld, %lld] @ [%lld, %lld] -> [%lld, %lld] do not fit",
                        (long long)a->shape[nd - 2], (long long)a->shape[nd - 1],
                        (long long)b->shape[nd - 2], (long long)b->shape[nd - 1],
                        (long long)pl.M, (long long)pl.N);
    const nb_view *v[3] = {out, a, b};
    for (int o = 0; o < 3; o++) {
        pl.data[o] = (char *)v[o]->data;
        pl.rs[o] = v[o]->strides[nd - 2] / pl.es;
        pl.cs[o] = v[o]->strides[nd - 1] / pl.es;
    }
    pl.nb = 0;
    pl.nbatch = 1;
    for (int d = 0; d < nd - 2; d++) {
        int64_t size = out->shape[d];
        if ((a->shape[d] != size && a->shape[d] != 1) || (b->shape[d] != size && b->shape[d] != 1))
            return nb__fail(NB_ERR_SHAPE, "matmul: batch dim %d is %lld, %lld -> %lld", d,
                            (long long)a->shape[d], (long long)b->shape[d], (long long)size);
        if (size == 1)
            continue;
        pl.bshape[pl.nb] = size;
        for (int o = 0; o < 3; o++)
            pl.bst[o][pl.nb] = v[o]->shape[d] == 1 ? 0 : v[o]->strides[d];
        pl.nb++;
        pl.nbatch *= size;
    }
    if (pl.nb == 0) {
        pl.nb = 1;
        pl.bshape[0] = 1;
        pl.bst[0][0] = pl.bst[1][0] = pl.bst[2][0] = 0;
    }
    /* A serial thread keeps off BLAS: OpenBLAS's own threads serve one caller at
     * a time, and callers on several threads wait for each other there. */
    pl.builtin = builtin || !NB_HAVE_CBLAS || nb__thread_serial();
    atomic_init(&pl.failed, 0);
    if (out->numel == 0)
        return NB_OK;
    /* Many small products: one per thread at a time (each then runs serially);
     * otherwise one after another, each split across the pool by itself. */
    const int64_t flops = pl.M * pl.N * pl.K;
    const bool per_batch = pl.nbatch > 1 && (pl.builtin || dt == NB_I32 || dt == NB_I64) &&
                           flops < ((int64_t)1 << 21) && flops * pl.nbatch >= ((int64_t)1 << 17);
    if (per_batch)
        nb__parallel_for(pl.nbatch, ((int64_t)1 << 16) / (flops + 1) + 1, mm_batches, &pl);
    else
        mm_batches(&pl, 0, pl.nbatch);
    if (atomic_load(&pl.failed))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "matmul: out of memory");
    return NB_OK;
}

nb_status nb__cpu_matmul(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b)
{
    return matmul(dev, out, a, b, false);
}

nb_status nb__cpu_matmul_builtin(nb_device *dev, const nb_view *out, const nb_view *a,
                                 const nb_view *b)
{
    return matmul(dev, out, a, b, true);
}
