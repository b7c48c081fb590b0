/* nabla internal — elementwise chains of a step recorded on a GPU, compiled
 * into one kernel at run time (gpu_fuse.c, gpu_fuse_source.c).
 *
 * While a thread records a step into a CUDA graph with fusion on
 * (nb_graph_set_fusion), the table's fill, unary, binary, copy (cast) and
 * where entries do not launch: they append their call to the thread's pending chain (as far as
 * the plan of lib/core/fusion.h lets it grow). Any other work on the device
 * (every other entry enters it through nb__gpu_enter) and the end of the
 * recording flush the chain first: one call launches its own kernel; two or
 * more launch one kernel made for the chain, its source generated from the
 * plan with the formulas of lib/core/formulas.h and compiled by NVRTC (loaded
 * with dlopen; where it is missing or fails, the calls launch one by one). A
 * result whose tensor was let go before the flush is never written. The
 * kernels are compiled and loaded while the step runs eagerly just before
 * its recording (the capture's step 1): a recording may not load code, so it
 * fuses the chains whose kernels are ready and runs any other one unfused.
 *
 * Each call keeps its formula, compute type and rounding (f16 and bf16 are
 * computed in float and rounded to their dtype after every call, as the
 * kernels do; a cast converts as the cast kernel does, a where selects the
 * elements' bits), and a barrier between calls keeps the compiler from
 * contracting one call's multiply into the next call's add, so a fused chain
 * computes the bits its calls do. */
#ifndef NB_GPU_FUSE_H
#define NB_GPU_FUSE_H

#include "lib/core/fusion.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_gpu_ctx nb_gpu_ctx;

/* ---- the recording's chain (gpu_fuse.c) ---- */

/* Starts deferring fill, unary, binary, copy and where calls on c for the calling thread
 * (gpu_graph.cu, once the stream records), when fusion is on. */
void nb__gpu_fuse_start(nb_gpu_ctx *c);
/* Stops it: the pending chain is launched (keep) or dropped. Returns NB_OK or
 * the launch's error. */
nb_status nb__gpu_fuse_stop(nb_gpu_ctx *c, bool keep);
/* Around the eager run that precedes a recording (on true, then false): the
 * calls run as usual, and the chains they form are compiled and loaded, so
 * that the recording, which may not load code, finds their kernels ready. A
 * chain whose kernel is not ready when it is recorded runs unfused. */
void nb__gpu_fuse_prepare(nb_gpu_ctx *c, bool on);
/* Whether this thread defers (or, preparing, watches) calls on c. */
bool nb__gpu_fuse_deferring(const nb_gpu_ctx *c);
/* Appends call to the pending chain (*deferred true; preparing, false: the
 * caller runs it), launching (or compiling) the chain first where call
 * cannot join it; a call the chain cannot hold at all (a dtype or op it does
 * not compile) is left to the caller (*deferred false). Returns NB_OK or a
 * launch's error. */
nb_status nb__gpu_fuse_defer(nb_gpu_ctx *c, const nb_fuse_call *call, bool *deferred);
/* Launches the pending chain, if any (nb__gpu_enter, before any other work on
 * c). */
nb_status nb__gpu_fuse_flush(nb_gpu_ctx *c);
/* Memory handed out and given back while this thread defers: a result whose
 * block is given back before the flush is dead. */
void nb__gpu_fuse_note_alloc(nb_gpu_ctx *c, void *p, size_t nbytes);
void nb__gpu_fuse_note_free(nb_gpu_ctx *c, void *p, size_t nbytes);

/* ---- the kernel of a chain (gpu_fuse_source.c; no GPU needed) ---- */

/* The operands' iteration, shared by the source and the launch: every slot
 * is an operand, their dims coalesced (at least one). */
#define NB_GPU_FUSE_MAX_DIMS 8
typedef struct nb_gpu_fuse_geo {
    int nd;
    int64_t shape[NB_GPU_FUSE_MAX_DIMS];
    int64_t strides[NB_FUSE_MAX_SLOTS][NB_GPU_FUSE_MAX_DIMS]; /* bytes, by slot */
} nb_gpu_fuse_geo;

/* The kernel's argument, the same layout in the generated source. store has
 * bit k set where slot k is written to memory (the chain writes it and it is
 * not internal): the source does not depend on which results are dead, so
 * the kernel compiled while preparing serves the recording. k holds each
 * step's scalar (a fill's value, a unary's alpha) as bits: the source does
 * not depend on the values either, so chains that differ only in them share
 * one compiled kernel. */
typedef struct nb_gpu_fuse_args {
    char *p[NB_FUSE_MAX_SLOTS];
    long long st[NB_FUSE_MAX_SLOTS][NB_GPU_FUSE_MAX_DIMS];
    long long shape[NB_GPU_FUSE_MAX_DIMS];
    unsigned long long k[NB_FUSE_MAX_CALLS];
    long long n;
    unsigned store;
} nb_gpu_fuse_args;

/* p's iteration in *g and its argument in *a. */
void nb__gpu_fuse_geometry(const nb_fuse_plan *p, nb_gpu_fuse_geo *g, nb_gpu_fuse_args *a);

/* Whether the fused kernel computes c as its own kernel would (the dtypes
 * and ops it generates code for). */
bool nb__gpu_fuse_supported(const nb_fuse_call *c);

/* The CUDA source of p's kernel, extern "C" nb_fused(nb_gpu_fuse_args),
 * which includes "nb_fuse_prelude.h" and "formulas.h"; malloc'd, the caller
 * frees it. NULL when out of host memory (no error recorded). */
char *nb__gpu_fuse_source(const nb_fuse_plan *p, const nb_gpu_fuse_geo *g);

/* Compiles src with NVRTC for sm_<arch> (90 for sm_90) into a CUBIN: NB_OK
 * with *cubin (malloc'd, the caller frees it) and *size, else
 * NB_ERR_UNSUPPORTED (NVRTC could not be loaded) or NB_ERR_BACKEND (it
 * failed; the message carries its log's start). */
nb_status nb__gpu_fuse_compile(const char *src, int arch, void **cubin, size_t *size);

#ifdef __cplusplus
}
#endif

#endif
