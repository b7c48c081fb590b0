/* cuDNN's graph API (cudnn_graph, the cudnnBackend* descriptors) as the GPU
 * backend's files use it: the device's handle, tensor descriptors, an
 * execution plan chosen once per problem and cached, and running a plan.
 *
 * A caller describes its problem by a key of int64s (its kind first, then
 * every number that changes the plan: shapes, strides, dtypes, alignment,
 * math and determinism switches) and asks nb__cudnn_plan_for for the plan;
 * on a miss its build function makes the operation descriptors and
 * nb__cudnn_plan_for runs the heuristics, keeps the first engine
 * configuration the filter allows that finalizes (preferring one whose
 * workspace fits the limit) and caches it with every descriptor it refers to.
 * Internal to gpu/. */
#ifndef NB_GPU_CUDNN_H
#define NB_GPU_CUDNN_H

#include "gpu_internal.h"

/* The graph library's header alone: the legacy convolution, pooling and
 * normalisation calls (cudnn_ops.h, cudnn_cnn.h), which cuDNN 9 deprecates,
 * are not even declared here. */
#include <cudnn_graph.h>

/* The device's cuDNN handle, bound to its stream, made on first use.
 * NB_ERR_BACKEND when cuDNN cannot be started on the device. */
nb_status nb__cudnn_handle(nb_gpu_ctx *c, cudnnHandle_t *out);

/* cuDNN's data type for a floating nb_dtype (f32 for any other). */
cudnnDataType_t nb__cudnn_dtype(nb_dtype dt);

/* The largest of 16, 8, 4, 2 bytes dividing every pointer given, at least
 * the element size: the alignment a tensor descriptor may promise. */
int64_t nb__cudnn_alignment(size_t elem_size, int n, void *const *ptrs);

/* The dims [n, c, h, w] of an image or filter and the strides (in elements)
 * of its layout: NCHW (KCRS) when nchw, else NHWC (KRSC). */
void nb__cudnn_dims(bool nchw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t dims[4], int64_t strides[4]);

/* The longest reason a plan could not be made (nb__cudnn_plan_for's why). */
#define NB_CUDNN_WHY_MAX 256

/* The descriptors one plan is built from, kept alive as long as the plan. */
#define NB_CUDNN_MAX_DESCS 16
typedef struct nb_cudnn_descs {
    cudnnBackendDescriptor_t d[NB_CUDNN_MAX_DESCS];
    int n;
} nb_cudnn_descs;

/* The helpers for build functions below return NB_OK, or NB_ERR_UNSUPPORTED
 * without recording an error when cuDNN refuses (or keep is full): the
 * refusal is noted as the reason nb__cudnn_plan_for gives. */

/* Makes a finalized tensor descriptor (dims and strides in elements, nd of
 * them) and keeps it in keep. */
nb_status nb__cudnn_tensor(const nb_gpu_ctx *c, nb_cudnn_descs *keep, int64_t uid, cudnnDataType_t dt, int nd,
                           const int64_t *dims, const int64_t *strides, int64_t alignment,
                           cudnnBackendDescriptor_t *out);

/* Makes a descriptor of the given type and keeps it in keep (not finalized). */
nb_status nb__cudnn_make(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptorType_t type,
                         cudnnBackendDescriptor_t *out);

/* cudnnBackendSetAttribute as an nb_status. */
nb_status nb__cudnn_set(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t count, const void *values);

/* cudnnBackendFinalize as an nb_status; what names the descriptor in the reason. */
nb_status nb__cudnn_finalize(const nb_gpu_ctx *c, cudnnBackendDescriptor_t d, const char *what);

/* Which engine configurations a plan may use. */
enum {
    NB_CUDNN_ALLOW_TENSOR_CORE = 1, /* tensor-core engines (TF32 for f32) */
    NB_CUDNN_DETERMINISTIC = 2,     /* refuse engines cuDNN notes as nondeterministic */
    NB_CUDNN_EXACT_INPUTS = 4,      /* refuse engines that down-convert inputs or reduce in lower precision */
    NB_CUDNN_FLOAT_REDUCTION = 8,   /* prefer engines that reduce in float: the others only when none is left */
};

/* Builds the operation descriptors of a problem into keep and returns them in
 * ops (at most 8, *nops of them); NB_ERR_UNSUPPORTED, not recorded, for a
 * problem cuDNN cannot take (through the helpers above). */
typedef nb_status (*nb_cudnn_build_fn)(const nb_gpu_ctx *c, nb_cudnn_descs *keep, cudnnBackendDescriptor_t *ops,
                                       int *nops, const void *arg);

/* A cached plan: run it with nb__cudnn_run. Owned by the cache (the process's
 * lifetime). */
typedef struct nb_cudnn_plan {
    cudnnBackendDescriptor_t plan;
    int64_t workspace; /* bytes */
} nb_cudnn_plan;

/* The plan for key (nkey int64s; key[0] the caller's kind) on device c,
 * built with build(arg) and chosen under the flags on a miss. op names the
 * op in messages. NB_ERR_UNSUPPORTED, not recorded, when cuDNN has no plan
 * for it, *why (when why is not NULL) then saying why, in the cache's memory:
 * the caller falls back to its own kernels or records the error. The miss is
 * cached too, so asking again is cheap. NB_ERR_BACKEND (cuDNN cannot start
 * on the device) or NB_ERR_OUT_OF_MEMORY (host), recorded, otherwise. */
nb_status nb__cudnn_plan_for(nb_gpu_ctx *c, const char *op, const int64_t *key, int nkey, unsigned flags,
                             nb_cudnn_build_fn build, const void *arg, const nb_cudnn_plan **out, const char **why);

/* Runs plan on c's stream with the n (uid, pointer) pairs and a workspace
 * from the caching allocator (freed in stream order). */
nb_status nb__cudnn_run(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n, const int64_t *uids,
                        void *const *ptrs);
/* nb__cudnn_run for a caller with its own kernels to fall back on: where cuDNN
 * refuses the execution itself (a BAD_PARAM or NOT_SUPPORTED status, which some
 * engines give only then, for a data pointer's offset, say), it returns
 * NB_ERR_UNSUPPORTED with nothing recorded, as a refusal at planning does;
 * other failures as nb__cudnn_run. */
nb_status nb__cudnn_run_or_refuse(nb_gpu_ctx *c, const char *op, const nb_cudnn_plan *plan, int n,
                                  const int64_t *uids, void *const *ptrs);

#endif
