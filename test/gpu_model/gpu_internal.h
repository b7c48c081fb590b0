/* What gpu/gpu_allocator.c needs of gpu_internal.h, CUDA and nabla, for its
 * host model (test_gpu_allocator_model.c): CUDA's streams, events and device
 * memory are that file's fakes, and host allocations may be made to fail.
 * It defines the real header's guard, so that the allocator's own include of
 * gpu_internal.h adds nothing. A field the allocator starts to use must be
 * added here too (the model then stops compiling until it is). */
#ifndef NB_GPU_INTERNAL_H
#define NB_GPU_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <pthread.h>

typedef int nb_status;
enum { NB_OK = 0, NB_ERR_INVALID_ARGUMENT = 1, NB_ERR_OUT_OF_MEMORY = 2, NB_ERR_BACKEND = 3,
       NB_ERR_DEVICE = 4, NB_ERR_UNSUPPORTED = 5 };
typedef enum { NB_LOG_DEBUG, NB_LOG_INFO, NB_LOG_WARNING } nb_log_level;
typedef enum { NB_DEVICE_CPU, NB_DEVICE_GPU } nb_device_kind;

/* ---- fake CUDA ---- */
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotReady = 600, cudaErrorCapture = 900 };
typedef struct fstream *cudaStream_t;
typedef struct fevent *cudaEvent_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
#define cudaEventDisableTiming 2
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMemGetInfo(size_t *f, size_t *t);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m);

typedef struct nb_device { char name[32]; nb_device_kind kind; void *ctx; } nb_device;
typedef struct nb_gpu_allocator nb_gpu_allocator;
typedef struct nb_gpu_pool nb_gpu_pool;
typedef struct nb_gpu_phys {
    int ordinal, n_logical;
    nb_gpu_allocator *alloc;
    struct nb_gpu_ctx *first;
    int64_t card_waits;
} nb_gpu_phys;
typedef struct nb_gpu_ctx {
    nb_device *dev;
    nb_gpu_phys *phys;
    int ordinal;
    cudaStream_t stream;
    nb_gpu_pool *rec_pool;
    int64_t host_waits;
} nb_gpu_ctx;
static inline void nb__gpu_count_wait(nb_gpu_ctx *c) { c->host_waits++; }
static inline void nb__gpu_count_card_wait(nb_gpu_phys *p) { p->card_waits++; }
#define NB_GPU_FENCE_BYTES ((size_t)1 << 20)

typedef struct nb_gpu_memory_stats {
    size_t in_use, requested, peak_in_use, cached, graph_held, reserved, peak_reserved, arena;
    bool growth_allowed;
    uint64_t allocations, cache_hits, device_mallocs, cache_flushes, failures;
    size_t device_free, device_total;
} nb_gpu_memory_stats;

nb_status nb__fail(nb_status code, const char *fmt, ...);
void *nb__fail_null(nb_status code, const char *fmt, ...);
void nb__log(nb_log_level l, const char *fmt, ...);
nb_status nb__gpu_set_device(int ordinal, const char *name);
nb_status nb__gpu_cuda_fail(cudaError_t e, const char *call, const char *name);
nb_device *nb__gpu_device_named(const char *name, const char *who);
int nb_device_count(nb_device_kind k);
int nb__gpu_phys_count(void);
nb_gpu_phys *nb__gpu_phys_at(int i);

/* host-memory failure injection */
void *fake_calloc(size_t n, size_t s);
void *fake_malloc(size_t n);
void *fake_realloc(void *p, size_t n);
#define calloc fake_calloc
#define malloc fake_malloc
#define realloc fake_realloc
#endif
