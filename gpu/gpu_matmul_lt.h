/* matmul through cuBLASLt, as gpu_matmul.c uses it: one strided-batched gemm
 * D = op(A) op(B), column-major as cuBLAS takes it (gpu_matmul.c maps
 * row-major tensors onto it by swapping operands), with an algorithm chosen by
 * cuBLASLt's heuristics once per problem and cached per logical device.
 * gpu_matmul.c keeps cublasGemmStridedBatchedEx_64 as the fallback for every
 * problem this refuses. Internal to gpu/. */
#ifndef NB_GPU_MATMUL_LT_H
#define NB_GPU_MATMUL_LT_H

#include "gpu_internal.h"

#include <cublasLt.h>

/* Everything that changes the algorithm cuBLASLt may run: the plan cache's key. */
typedef struct nb_lt_problem {
    cudaDataType dt;            /* of A, B and D alike */
    cublasComputeType_t ct;     /* 32F, 32F_FAST_TF32 (f32 and halves, f32 scale) or 64F */
    bool trans_a, trans_b;      /* op(A), op(B): transposed or not */
    int64_t m, n, k;            /* D is m x n, the sum runs over k (k >= 1) */
    int64_t lda, ldb, ldd;      /* leading dimensions, in elements, of the stored matrices */
    int64_t stride_a, stride_b, stride_d; /* elements between batch matrices; 0: one for all */
    int64_t count;              /* matrices in the batch (>= 1) */
    int64_t align_a, align_b, align_d; /* bytes (a power of two, at most 256) dividing every address passed */
    bool deterministic;         /* only algorithms without split-K (see gpu_matmul_lt.c) */
} nb_lt_problem;

typedef struct nb_lt_plan nb_lt_plan;

/* The cached plan of p on c, made on first use: NB_OK and *out, or
 * NB_ERR_UNSUPPORTED, not recorded, when cuBLASLt is not to be used for it
 * (its heuristics offered no algorithm, a size exceeds its 32-bit range, the
 * device's cache is full, an earlier call with the plan was refused, or
 * NB_MATMUL_CUBLAS=1): the caller then runs cuBLAS. Other failures
 * (NB_ERR_BACKEND when cuBLASLt cannot start on the device,
 * NB_ERR_OUT_OF_MEMORY) are recorded. The plan lives as long as the device. */
nb_status nb__lt_plan_for(nb_gpu_ctx *c, const nb_lt_problem *p, const nb_lt_plan **out);

/* Bytes of workspace the plan's algorithm needs (0: none). */
size_t nb__lt_workspace(const nb_lt_plan *plan);

/* Queues D = op(A) op(B) (every matrix of the batch) on c's stream, with ws
 * holding nb__lt_workspace(plan) bytes in stream order. NB_OK;
 * NB_ERR_UNSUPPORTED, not recorded, when cuBLASLt refuses the call (nothing
 * was queued, and the plan is refused from then on); NB_ERR_BACKEND recorded
 * for any other failure. */
nb_status nb__lt_run(nb_gpu_ctx *c, const nb_lt_plan *plan, const void *A, const void *B, void *D, void *ws);

#endif
