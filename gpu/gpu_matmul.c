/* matmul: the operands' layouts, cuBLAS, and the TF32 switch.
 *
 * cuBLAS is column-major. Each operand's last two dims have unit stride on one
 * of them: a row-major [R, C] matrix with leading dimension ld is, to cuBLAS, the
 * column-major [C, R] transpose with the same ld. For a row-major output we ask
 * cuBLAS for out^T = b^T a^T (m = N, n = M), for a column-major one for
 * out = a b directly; each operand is passed transposed or not according to
 * whether its layout matches the output's. Batch dims are collapsed where the
 * three operands allow it; the innermost one goes to one strided-batched
 * gemm (stride 0 for a broadcast operand) and any others are looped over.
 * That gemm runs through cuBLASLt with the algorithm its heuristics chose for
 * the problem (gpu_matmul_lt.c), or, where cuBLASLt has none, refuses the
 * call or NB_MATMUL_CUBLAS=1 says so, through cublasGemmStridedBatchedEx_64.
 * An operand no layout fits (stride-0 rows, negative strides) is first copied
 * to a contiguous scratch block.
 * f32 (TF32 tensor cores only when nb_gpu_set_tf32(true)), f64, and f16/bf16
 * with float accumulation. */
#include "gpu_matmul_lt.h"

#include <cublas_v2.h>
#include <string.h>

static atomic_bool g_tf32;

bool nb_gpu_set_tf32(bool on) { return atomic_exchange(&g_tf32, on); }
bool nb_gpu_tf32(void) { return atomic_load(&g_tf32); }

static nb_status cublas_fail(const nb_gpu_ctx *c, const char *call, cublasStatus_t s)
{
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %s (%s)", call, c->dev->name, cublasGetStatusString(s),
                    cublasGetStatusName(s));
}

/* cuBLAS's workspace per handle. Without one of its own a handle finds no
 * workspace while a stream is recorded (gpu_graph.cu) and falls back to other
 * kernels, whose results differ in the last bits from the eager step's; with
 * this one both choose alike. 32 MiB: what cuBLAS asks for on Hopper. */
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

static nb_status set_workspace(nb_gpu_ctx *c, cublasHandle_t h)
{
    void *ws = NULL;
    /* Not from the caching allocator: a recording's pool would take it back. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    bool swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    cudaError_t e = cudaMalloc(&ws, CUBLAS_WORKSPACE_BYTES);
    if (swapped)
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cudaMalloc (cuBLAS workspace)", c->dev->name);
    cublasStatus_t s = cublasSetWorkspace(h, ws, CUBLAS_WORKSPACE_BYTES);
    if (s != CUBLAS_STATUS_SUCCESS) {
        (void)cudaFree(ws);
        return cublas_fail(c, "cublasSetWorkspace", s);
    }
    return NB_OK;
}

/* The device's cuBLAS handle, bound to its stream and its own workspace (for
 * the handle's life, as the handle), made on first use. */
static nb_status handle_of(nb_gpu_ctx *c, cublasHandle_t *out)
{
    cublasHandle_t h = __atomic_load_n((cublasHandle_t *)&c->cublas, __ATOMIC_ACQUIRE);
    if (h) {
        *out = h;
        return NB_OK;
    }
    nb_status st = NB_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->cublas) {
        /* relaxed: a handle made while a stream is recorded must not end the recording */
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        bool swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
        cublasStatus_t s = cublasCreate(&h);
        if (swapped)
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
        if (s != CUBLAS_STATUS_SUCCESS) {
            st = cublas_fail(c, "cublasCreate", s);
        } else if ((s = cublasSetStream(h, c->stream)) != CUBLAS_STATUS_SUCCESS) {
            st = cublas_fail(c, "cublasSetStream", s);
            cublasDestroy(h);
        } else if ((st = set_workspace(c, h)) != NB_OK) {
            cublasDestroy(h);
        } else {
            __atomic_store_n((cublasHandle_t *)&c->cublas, h, __ATOMIC_RELEASE);
        }
    }
    h = c->cublas;
    pthread_mutex_unlock(&c->lock);
    *out = h;
    return st;
}

/* A matrix [R, C] with element strides sr, sc: row-major (unit column stride)
 * or column-major (unit row stride) with a leading dimension cuBLAS accepts. */
typedef struct mat {
    bool rowmajor;
    int64_t ld;
} mat;

static bool mat_layout(int64_t R, int64_t C, int64_t sr, int64_t sc, mat *m)
{
    int64_t r1 = R > 1 ? R : 1, c1 = C > 1 ? C : 1;
    if ((sc == 1 || C == 1) && (R == 1 || sr >= c1)) {
        m->rowmajor = true;
        m->ld = R == 1 ? c1 : sr;
        return true;
    }
    if ((sr == 1 || R == 1) && (C == 1 || sc >= r1)) {
        m->rowmajor = false;
        m->ld = C == 1 ? r1 : sc;
        return true;
    }
    return false;
}

/* Element strides of v's last two dims, when its byte strides are whole elements. */
static bool elem_strides(const nb_view *v, size_t es, int64_t *sr, int64_t *sc)
{
    int64_t r = v->strides[v->ndim - 2], c = v->strides[v->ndim - 1];
    if (r % (int64_t)es || c % (int64_t)es)
        return false;
    *sr = r / (int64_t)es;
    *sc = c / (int64_t)es;
    return true;
}

/* An operand's view, copied to contiguous scratch (*scratch, freed by the caller)
 * when no layout fits it. */
static nb_status prepare(nb_gpu_ctx *c, const nb_view *v, size_t es, nb_view *use, mat *m, void **scratch)
{
    int nd = v->ndim;
    int64_t R = v->shape[nd - 2], C = v->shape[nd - 1], sr, sc;
    *use = *v;
    *scratch = NULL;
    if (elem_strides(v, es, &sr, &sc) && mat_layout(R, C, sr, sc, m)) {
        bool batch_ok = true; /* batch strides must be whole elements too */
        for (int d = 0; d < nd - 2; d++)
            batch_ok = batch_ok && v->strides[d] % (int64_t)es == 0;
        if (batch_ok)
            return NB_OK;
    }
    *scratch = nb__gpu_malloc(c, (size_t)(v->numel > 0 ? v->numel : 1) * es);
    if (!*scratch)
        return NB_ERR_OUT_OF_MEMORY;
    use->data = *scratch;
    use->contiguous = true;
    nb__contiguous_strides(nd, v->shape, es, use->strides);
    nb_status st = nb__gpu_copy(c, use, v);
    if (st)
        return st;
    m->rowmajor = true;
    m->ld = C > 1 ? C : 1;
    return NB_OK;
}

typedef struct gemm {
    cublasHandle_t h; /* made before any plan: the warm-up of a recording makes both */
    cudaDataType dt;
    cublasComputeType_t ct;
    bool dbl;
    size_t es;
    int64_t M, N, K;
    mat mo, ma, mb;
} gemm;

/* The largest power of two up to 256 dividing every byte offset or address
 * given (at least the element size): the alignment cuBLASLt may assume. */
static int64_t alignment_of(size_t es, int n, const int64_t *bytes)
{
    uint64_t bits = 256;
    for (int i = 0; i < n; i++)
        bits |= (uint64_t)bytes[i];
    int64_t a = (int64_t)(bits & (~bits + 1));
    return a < (int64_t)es ? (int64_t)es : a;
}

/* Queues the gemms of out = va @ vb (views already in a layout cuBLAS takes):
 * through cuBLASLt where it has a plan for the problem, else (or once it
 * refuses a call) through cublasGemmStridedBatchedEx_64. */
static nb_status run_gemms(nb_gpu_ctx *c, const gemm *g, const nb_view *out, const nb_view *va, const nb_view *vb)
{
    const int nd = out->ndim;
    const int64_t es = (int64_t)g->es;
    /* Batch dims: drop size 1, merge neighbours contiguous in all three. */
    int nb = 0;
    int64_t bshape[NB_MAX_DIMS], bst[3][NB_MAX_DIMS]; /* element strides of out, a, b */
    for (int d = 0; d < nd - 2; d++) {
        if (out->shape[d] == 1)
            continue;
        int64_t so = out->strides[d] / es;
        int64_t s1 = va->shape[d] == 1 ? 0 : va->strides[d] / es;
        int64_t s2 = vb->shape[d] == 1 ? 0 : vb->strides[d] / es;
        if (nb > 0 && bst[0][nb - 1] == so * out->shape[d] && bst[1][nb - 1] == s1 * out->shape[d] &&
            bst[2][nb - 1] == s2 * out->shape[d]) {
            bshape[nb - 1] *= out->shape[d];
        } else {
            bshape[nb] = out->shape[d];
            nb++;
        }
        bst[0][nb - 1] = so;
        bst[1][nb - 1] = s1;
        bst[2][nb - 1] = s2;
    }
    const int64_t count = nb ? bshape[nb - 1] : 1;
    const int64_t stride_o = nb ? bst[0][nb - 1] : 0, stride_a = nb ? bst[1][nb - 1] : 0,
                  stride_b = nb ? bst[2][nb - 1] : 0;
    int64_t outer = 1;
    for (int d = 0; d < nb - 1; d++)
        outer *= bshape[d];

    /* Row-major output: out^T = b^T a^T. Column-major output: out = a b. */
    const bool swap = g->mo.rowmajor;
    const mat *m1 = swap ? &g->mb : &g->ma, *m2 = swap ? &g->ma : &g->mb;
    const int64_t gm = swap ? g->N : g->M, gn = swap ? g->M : g->N;
    const cublasOperation_t op1 = m1->rowmajor == g->mo.rowmajor ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op2 = m2->rowmajor == g->mo.rowmajor ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int64_t s1 = swap ? stride_b : stride_a, s2 = swap ? stride_a : stride_b;
    const nb_view *v1 = swap ? vb : va, *v2 = swap ? va : vb;
    const int k1 = swap ? 2 : 1, k2 = swap ? 1 : 2; /* their columns in bst */
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void *alpha = g->dbl ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = g->dbl ? (const void *)&zero_d : (const void *)&zero_f;

    /* cuBLASLt's problem: the alignment of every address the loop below
     * passes (the base, the batch stride, the outer batch strides). */
    int64_t off1[NB_MAX_DIMS + 2], off2[NB_MAX_DIMS + 2], offo[NB_MAX_DIMS + 2];
    int n_off = 0;
    off1[n_off] = (int64_t)(uintptr_t)v1->data, off2[n_off] = (int64_t)(uintptr_t)v2->data;
    offo[n_off++] = (int64_t)(uintptr_t)out->data;
    for (int d = 0; d < nb; d++, n_off++) {
        off1[n_off] = bst[k1][d] * es, off2[n_off] = bst[k2][d] * es, offo[n_off] = bst[0][d] * es;
    }
    const nb_lt_problem prob = {
        .dt = g->dt, .ct = g->ct, .trans_a = op1 == CUBLAS_OP_T, .trans_b = op2 == CUBLAS_OP_T,
        .m = gm, .n = gn, .k = g->K, .lda = m1->ld, .ldb = m2->ld, .ldd = g->mo.ld,
        .stride_a = count > 1 ? s1 : 0, .stride_b = count > 1 ? s2 : 0, .stride_d = count > 1 ? stride_o : 0,
        .count = count,
        .align_a = alignment_of(g->es, n_off, off1), .align_b = alignment_of(g->es, n_off, off2),
        .align_d = alignment_of(g->es, n_off, offo), .deterministic = nb_deterministic(),
    };
    const nb_lt_plan *plan = NULL;
    void *ws = NULL;
    nb_status st = nb__lt_plan_for(c, &prob, &plan);
    if (st == NB_ERR_UNSUPPORTED) { /* cuBLAS runs it */
        plan = NULL;
        st = NB_OK;
    } else if (st) {
        return st;
    }
    /* the workspace from the caching allocator, in stream order (while
     * gpu_graph.cu records, from the graph's pool, kept as long as the graph) */
    if (plan && nb__lt_workspace(plan) > 0 && !(ws = nb__gpu_malloc(c, nb__lt_workspace(plan))))
        return NB_ERR_OUT_OF_MEMORY;
    for (int64_t o = 0; o < outer && !st; o++) {
        /* byte offsets of this outer batch index in out, a, b */
        int64_t rem = o, off[3] = {0, 0, 0};
        for (int d = nb - 2; d >= 0; d--) {
            int64_t i = rem % bshape[d];
            rem /= bshape[d];
            for (int k = 0; k < 3; k++)
                off[k] += i * bst[k][d] * es;
        }
        char *po = (char *)out->data + off[0];
        const char *pa = (const char *)va->data + off[1], *pb = (const char *)vb->data + off[2];
        const void *p1 = swap ? (const void *)pb : (const void *)pa;
        const void *p2 = swap ? (const void *)pa : (const void *)pb;
        if (plan) {
            st = nb__lt_run(c, plan, p1, p2, po, ws);
            if (st != NB_ERR_UNSUPPORTED)
                continue;
            plan = NULL, st = NB_OK; /* refused, nothing queued: cuBLAS from here on */
        }
        cublasStatus_t s = cublasGemmStridedBatchedEx_64(g->h, op1, op2, gm, gn, g->K, alpha, p1, g->dt, m1->ld, s1,
                                                         p2, g->dt, m2->ld, s2, beta, po, g->dt, g->mo.ld, stride_o,
                                                         count, g->ct, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            st = cublas_fail(c, "cublasGemmStridedBatchedEx_64", s);
    }
    nb__gpu_free(c, ws); /* stream-ordered: the queued gemms still own it */
    return st;
}

nb_status nb__gpu_matmul(nb_gpu_ctx *c, const nb_view *out, const nb_view *a, const nb_view *b)
{
    const int nd = out->ndim;
    if (nd < 2 || a->ndim != nd || b->ndim != nd)
        return nb__fail(NB_ERR_INTERNAL, "matmul: operands must share the output's rank (>= 2) on %s", c->dev->name);
    if (a->dtype != out->dtype || b->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "matmul: dtypes %s x %s -> %s differ on %s", nb_dtype_name(a->dtype),
                        nb_dtype_name(b->dtype), nb_dtype_name(out->dtype), c->dev->name);
    cudaDataType dt;
    cublasComputeType_t ct;
    bool dbl = false;
    switch (out->dtype) {
    case NB_F32: dt = CUDA_R_32F; ct = atomic_load(&g_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
    case NB_F64: dt = CUDA_R_64F; ct = CUBLAS_COMPUTE_64F; dbl = true; break;
    case NB_F16: dt = CUDA_R_16F; ct = CUBLAS_COMPUTE_32F; break;
    case NB_BF16: dt = CUDA_R_16BF; ct = CUBLAS_COMPUTE_32F; break;
    default:
        return nb__fail(NB_ERR_DTYPE, "matmul: dtype %s is not supported on %s (floating dtypes only)",
                        nb_dtype_name(out->dtype), c->dev->name);
    }
    const size_t es = nb_dtype_size(out->dtype);
    const int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[nd - 1];
    if (out->numel == 0)
        return NB_OK;
    if (K == 0)
        return nb__gpu_fill(c, out, 0.0);

    mat mo;
    int64_t osr, osc;
    if (!elem_strides(out, es, &osr, &osc) || !mat_layout(M, N, osr, osc, &mo))
        return nb__fail(NB_ERR_INTERNAL, "matmul: the output on %s is neither row- nor column-major", c->dev->name);
    cublasHandle_t h;
    nb_status st = handle_of(c, &h);
    if (st)
        return st;
    nb_view va, vb;
    void *sa = NULL, *sb = NULL;
    mat ma, mb;
    if ((st = prepare(c, a, es, &va, &ma, &sa)) == NB_OK && (st = prepare(c, b, es, &vb, &mb, &sb)) == NB_OK) {
        gemm g = {h, dt, ct, dbl, es, M, N, K, mo, ma, mb};
        st = run_gemms(c, &g, out, &va, &vb);
    }
    /* stream-ordered: the gemms queued above still see the scratch blocks */
    nb__gpu_free(c, sa);
    nb__gpu_free(c, sb);
    return st;
}
