/* matmul through cuBLASLt: the device's cuBLASLt handle, the plan cache and
 * the call (gpu_matmul_lt.h).
 *
 * A plan holds the matmul and layout descriptors of one problem and the
 * algorithm cuBLASLt's heuristics ranked first for it (under a workspace limit
 * of LT_WORKSPACE_MAX), chosen once and kept per logical device: an eager step
 * and its recording into a CUDA graph (gpu_graph.cu; the warm-up run makes the
 * plan) run the same kernels and give the same bits. The key holds every
 * number the choice depends on, the operands' alignment included, since
 * cuBLASLt picks kernels that assume it.
 *
 * Deterministic mode: cuBLAS documents cublasLtMatmul with a workspace of the
 * caller's as bitwise reproducible on one GPU, and none of its split-K
 * reduction schemes uses atomics (INPLACE orders the partial sums with
 * counters). Still, deterministic mode takes only algorithms whose
 * configuration has no split-K (SPLITK_NUM 1, reduction scheme NONE): each
 * output is then one sequential sum, whatever cuBLASLt's internals. When the
 * heuristics offer none such, cuBLAS runs the problem (gpu_matmul.c).
 *
 * Plans are never freed: like cuDNN's plans (gpu_cudnn.c) they live as long as
 * their device context, which lives as long as the process. The cache is
 * bounded (LT_MAX_PLANS per device); a problem beyond it runs on cuBLAS. */
#include "gpu_matmul_lt.h"

#include <stdlib.h>
#include <string.h>

/* The most workspace an algorithm may ask for: what cuBLAS takes on Hopper,
 * and what PyTorch gives cuBLASLt there. */
#define LT_WORKSPACE_MAX ((size_t)32 << 20)
/* Algorithms asked of the heuristics: the first is taken, but deterministic
 * mode may have to skip split-K ones. */
#define LT_CANDIDATES 8
#define LT_BUCKETS 256
#define LT_MAX_PLANS 4096
#define LT_KEY_LEN 20

struct nb_lt_plan {
    struct nb_lt_plan *next;     /* immutable once published */
    int64_t key[LT_KEY_LEN];
    bool usable;                 /* the heuristics gave an algorithm */
    int refused;                 /* a call was refused: cuBLAS from then on (__atomic) */
    double one, zero;            /* alpha and beta in the scale type (f32 in the first 4 bytes) */
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
};

typedef struct lt_cache {
    nb_lt_plan *bucket[LT_BUCKETS]; /* heads read with __atomic acquire, written under the ctx's lock */
    int count;                      /* written under the ctx's lock (__atomic: read without it) */
} lt_cache;

/* NB_MATMUL_CUBLAS=1: cuBLAS alone, as before cuBLASLt (to compare the two). */
static bool cublas_only(void)
{
    static int state; /* 0 unread, 1 cuBLASLt allowed, 2 cuBLAS only */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (!s) {
        const char *env = getenv("NB_MATMUL_CUBLAS");
        s = env && env[0] == '1' ? 2 : 1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s == 2;
}

static nb_status lt_fail(const nb_gpu_ctx *c, const char *call, cublasStatus_t s)
{
    return nb__fail(NB_ERR_BACKEND, "matmul: %s failed on %s: %s (%s)", call, c->dev->name, cublasLtGetStatusString(s),
                    cublasLtGetStatusName(s));
}

/* Lets the calling thread make calls a stream recording would refuse (the
 * library's own setup) while gpu_graph.cu records; returns whether to undo. */
static bool capture_relax(enum cudaStreamCaptureMode *mode)
{
    *mode = cudaStreamCaptureModeRelaxed;
    return cudaThreadExchangeStreamCaptureMode(mode) == cudaSuccess;
}

static void capture_restore(bool swapped, enum cudaStreamCaptureMode *mode)
{
    if (swapped)
        (void)cudaThreadExchangeStreamCaptureMode(mode);
}

/* The device's cuBLASLt handle and plan cache, made on first use (as the
 * cuBLAS handle in gpu_matmul.c). */
static nb_status lt_state(nb_gpu_ctx *c, cublasLtHandle_t *h, lt_cache **cache)
{
    *h = __atomic_load_n((cublasLtHandle_t *)&c->cublaslt, __ATOMIC_ACQUIRE);
    if (*h) {
        *cache = c->lt_plans; /* published before the handle */
        return NB_OK;
    }
    nb_status st = NB_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->cublaslt) {
        lt_cache *lc = calloc(1, sizeof *lc);
        cublasLtHandle_t nh = NULL;
        enum cudaStreamCaptureMode mode;
        bool swapped = capture_relax(&mode);
        cublasStatus_t s = lc ? cublasLtCreate(&nh) : CUBLAS_STATUS_SUCCESS;
        capture_restore(swapped, &mode);
        if (!lc) {
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "matmul: out of host memory on %s", c->dev->name);
        } else if (s != CUBLAS_STATUS_SUCCESS) {
            free(lc);
            st = lt_fail(c, "cublasLtCreate", s);
        } else {
            c->lt_plans = lc;
            __atomic_store_n((cublasLtHandle_t *)&c->cublaslt, nh, __ATOMIC_RELEASE);
        }
    }
    *h = c->cublaslt;
    *cache = c->lt_plans;
    pthread_mutex_unlock(&c->lock);
    return st;
}

static int key_of(const nb_lt_problem *p, int64_t key[LT_KEY_LEN])
{
    int n = 0;
    key[n++] = p->dt;
    key[n++] = p->ct;
    key[n++] = p->trans_a | p->trans_b << 1 | p->deterministic << 2;
    key[n++] = p->m, key[n++] = p->n, key[n++] = p->k;
    key[n++] = p->lda, key[n++] = p->ldb, key[n++] = p->ldd;
    key[n++] = p->stride_a, key[n++] = p->stride_b, key[n++] = p->stride_d;
    key[n++] = p->count;
    key[n++] = p->align_a, key[n++] = p->align_b, key[n++] = p->align_d;
    while (n < LT_KEY_LEN)
        key[n++] = 0;
    return n;
}

static unsigned key_hash(const int64_t key[LT_KEY_LEN])
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < LT_KEY_LEN; i++)
        h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    return (unsigned)(h % LT_BUCKETS);
}

static nb_lt_plan *plan_find(lt_cache *lc, unsigned b, const int64_t key[LT_KEY_LEN])
{
    for (nb_lt_plan *e = __atomic_load_n(&lc->bucket[b], __ATOMIC_ACQUIRE); e; e = e->next)
        if (memcmp(e->key, key, sizeof e->key) == 0)
            return e;
    return NULL;
}

/* Sets the layout of a stored rows x cols matrix (column-major, ld) of a batch. */
static cublasStatus_t layout(cublasLtMatrixLayoutOpaque_t *l, cudaDataType dt, int64_t rows, int64_t cols,
                             int64_t ld, int64_t count, int64_t stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutInit(l, dt, (uint64_t)rows, (uint64_t)cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS && count > 1) {
        int32_t n = (int32_t)count;
        s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof stride);
    }
    return s;
}

/* Whether deterministic mode may run algo: no split-K (read from its
 * configuration; one that cannot be read is refused). */
static bool sequential_sum(const cublasLtMatmulAlgo_t *algo)
{
    uint32_t splits = 0, scheme = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                             &written) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme,
                                             &written) != CUBLAS_STATUS_SUCCESS)
        return false;
    return splits <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE;
}

/* Describes p into e and asks the heuristics for its algorithm; e->usable
 * stays false when there is none (a refusal is not an error: cuBLAS takes it). */
static void plan_build(const nb_gpu_ctx *c, cublasLtHandle_t h, const nb_lt_problem *p, nb_lt_plan *e)
{
    const bool dbl = p->ct == CUBLAS_COMPUTE_64F;
    if (dbl) {
        e->one = 1.0, e->zero = 0.0;
    } else {
        const float one = 1.0f, zero = 0.0f;
        memcpy(&e->one, &one, sizeof one);
        memcpy(&e->zero, &zero, sizeof zero);
    }
    const int32_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* stored matrices: A is m x k (k x m transposed), B is k x n (n x k) */
    cublasStatus_t s = cublasLtMatmulDescInit(&e->desc, p->ct, dbl ? CUDA_R_64F : CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(&e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(&e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = layout(&e->la, p->dt, p->trans_a ? p->k : p->m, p->trans_a ? p->m : p->k, p->lda, p->count, p->stride_a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = layout(&e->lb, p->dt, p->trans_b ? p->n : p->k, p->trans_b ? p->k : p->n, p->ldb, p->count, p->stride_b);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = layout(&e->ld, p->dt, p->m, p->n, p->ldd, p->count, p->stride_d);

    cublasLtMatmulPreferenceOpaque_t pref;
    const uint64_t ws_max = LT_WORKSPACE_MAX;
    const uint32_t al_a = (uint32_t)p->align_a, al_b = (uint32_t)p->align_b, al_d = (uint32_t)p->align_d;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceInit(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max,
                                                 sizeof ws_max);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                 sizeof al_a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                 sizeof al_b);
    /* C is D (beta is 0): the same pointer, layout and alignment */
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                 sizeof al_d);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                 sizeof al_d);
    cublasLtMatmulHeuristicResult_t found[LT_CANDIDATES];
    int got = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        /* host-side work only, but kept out of a recording's rules all the same */
        enum cudaStreamCaptureMode mode;
        bool swapped = capture_relax(&mode);
        s = cublasLtMatmulAlgoGetHeuristic(h, &e->desc, &e->la, &e->lb, &e->ld, &e->ld, &pref,
                                           p->deterministic ? LT_CANDIDATES : 1, found, &got);
        capture_restore(swapped, &mode);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        nb__log(NB_LOG_DEBUG, "matmul on %s: cuBLASLt described no algorithm (%s); cuBLAS runs it", c->dev->name,
                cublasLtGetStatusName(s));
        return;
    }
    for (int i = 0; i < got && i < LT_CANDIDATES; i++) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS || found[i].workspaceSize > LT_WORKSPACE_MAX)
            continue;
        if (p->deterministic && !sequential_sum(&found[i].algo))
            continue;
        e->algo = found[i].algo;
        e->workspace = found[i].workspaceSize;
        e->usable = true;
        return;
    }
    nb__log(NB_LOG_DEBUG, "matmul on %s: cuBLASLt's heuristics offered no%s algorithm of %d; cuBLAS runs it",
            c->dev->name, p->deterministic ? " split-K-free" : "", got);
}

nb_status nb__lt_plan_for(nb_gpu_ctx *c, const nb_lt_problem *p, const nb_lt_plan **out)
{
    *out = NULL;
    if (cublas_only())
        return NB_ERR_UNSUPPORTED;
    /* cuBLASLt's sizes and batch count are 32-bit */
    const int64_t big = INT32_MAX;
    if (p->m > big || p->n > big || p->k > big || p->lda > big || p->ldb > big || p->ldd > big || p->count > big ||
        p->m < 1 || p->n < 1 || p->k < 1 || p->count < 1)
        return NB_ERR_UNSUPPORTED;
    cublasLtHandle_t h;
    lt_cache *lc;
    nb_status st = lt_state(c, &h, &lc);
    if (st)
        return st;
    int64_t key[LT_KEY_LEN];
    key_of(p, key);
    const unsigned b = key_hash(key);
    nb_lt_plan *e = plan_find(lc, b, key);
    if (!e && __atomic_load_n(&lc->count, __ATOMIC_RELAXED) >= LT_MAX_PLANS)
        return NB_ERR_UNSUPPORTED; /* the cache is full: no heuristics query per call */
    if (!e) {
        nb_lt_plan *ne = calloc(1, sizeof *ne);
        if (!ne)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "matmul: out of host memory on %s", c->dev->name);
        memcpy(ne->key, key, sizeof ne->key);
        plan_build(c, h, p, ne);
        pthread_mutex_lock(&c->lock);
        e = plan_find(lc, b, key); /* another thread may have made it meanwhile */
        if (!e && lc->count < LT_MAX_PLANS) {
            ne->next = lc->bucket[b];
            __atomic_store_n(&lc->bucket[b], ne, __ATOMIC_RELEASE);
            __atomic_store_n(&lc->count, lc->count + 1, __ATOMIC_RELAXED);
            e = ne;
            ne = NULL;
        }
        pthread_mutex_unlock(&c->lock);
        free(ne);
        if (!e) /* the cache is full */
            return NB_ERR_UNSUPPORTED;
    }
    if (!e->usable || __atomic_load_n(&e->refused, __ATOMIC_RELAXED))
        return NB_ERR_UNSUPPORTED;
    *out = e;
    return NB_OK;
}

size_t nb__lt_workspace(const nb_lt_plan *plan) { return plan->workspace; }

nb_status nb__lt_run(nb_gpu_ctx *c, const nb_lt_plan *plan, const void *A, const void *B, void *D, void *ws)
{
    cublasLtHandle_t h = __atomic_load_n((cublasLtHandle_t *)&c->cublaslt, __ATOMIC_ACQUIRE);
    nb_lt_plan *e = (nb_lt_plan *)plan;
    /* the descriptors are only read: concurrent calls may share them */
    cublasStatus_t s = cublasLtMatmul(h, &e->desc, &e->one, A, &e->la, B, &e->lb, &e->zero, D, &e->ld, D, &e->ld,
                                      &e->algo, ws, e->workspace, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS)
        return NB_OK;
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        __atomic_store_n(&e->refused, 1, __ATOMIC_RELAXED);
        nb__log(NB_LOG_DEBUG, "matmul on %s: cublasLtMatmul refused its plan (%s); cuBLAS runs it from now on",
                c->dev->name, cublasLtGetStatusName(s));
        return NB_ERR_UNSUPPORTED;
    }
    return lt_fail(c, "cublasLtMatmul", s);
}
