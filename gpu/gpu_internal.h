/* nabla internal — shared by the files of gpu/, in C (the .c files) and CUDA C++
 * (the .cu files). Never installed; only gpu/ includes CUDA headers.
 *
 * Layout of the backend:
 *   gpu_device.c      discovery, per-device contexts (stream, events), error helpers
 *   gpu_allocator.c   the caching allocator and the public memory functions
 *   gpu_transfer.c    host <-> device and device <-> device copies, synchronize
 *   gpu_backend.c     the nb_backend table: thin wrappers that enter the device
 *   gpu_matmul.c      matmul: operand layouts, cuBLAS (the fallback), TF32 switch
 *   gpu_matmul_lt.c   matmul through cuBLASLt: handle, algorithms cached per problem
 *   gpu_cudnn.c       cuDNN's graph API: handle, descriptors, the plan cache
 *   gpu_conv.c        conv2d and its gradients through cuDNN
 *   gpu_depthwise.cu  depthwise conv2d and its gradients (own kernels)
 *   gpu_pool_cudnn.c  average pooling through cuDNN (own kernels as fallback)
 *   gpu_nccl.c        collectives through NCCL (when NCCL is found)
 *   gpu_graph.cu      recording a step into a CUDA graph, and its replays
 *   gpu_*.cu          the kernels (elementwise, reduce, softmax, index, random, optim)
 *   gpu_stub.c        the whole of it when CUDA is off */
#ifndef NB_GPU_INTERNAL_H
#define NB_GPU_INTERNAL_H

#ifdef __cplusplus
/* core.h declares C11 atomics in two structs that the .cu files never touch;
 * give C++ the same-sized types so it can read the rest of the header. */
#include <atomic>
typedef std::atomic<int> atomic_int;
typedef std::atomic<bool> atomic_bool;
extern "C" {
#endif

#include "lib/core/core.h"
#include "lib/core/backend.h"
#include "gpu_backend.h"
#include <nabla/gpu.h>

#include <cuda_runtime_api.h>
#include <pthread.h>

/* Most physical GPUs a process uses (the device registry holds 64 devices). */
#define NB_GPU_MAX_PHYS 64

typedef struct nb_gpu_allocator nb_gpu_allocator;
typedef struct nb_gpu_pool nb_gpu_pool;

/* One physical card: its properties and its caching allocator, shared by the
 * logical devices that split it. */
typedef struct nb_gpu_phys {
    int ordinal;              /* CUDA ordinal */
    int n_logical;            /* logical devices on this card */
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t total_memory;
    int clock_khz, bus_width;
    nb_gpu_allocator *alloc;  /* gpu_allocator.c */
    struct nb_gpu_ctx *first; /* logical device 0 of this card, for messages */
    int64_t card_waits;       /* host waits for the whole card (__atomic) */
} nb_gpu_phys;

/* Where an index-checking kernel (gather, scatter_add, the label check)
 * records the first out-of-range index it met, in device memory: the op's name
 * (a static host string, kept as an integer), the position and value of the
 * index and the valid range [0, rows). The host reads it at the next
 * synchronising call (nb__gpu_index_error_fetch, _report). */
typedef struct nb_gpu_index_error {
    int set;
    int pad_;
    long long position;
    long long value;
    long long rows;
    unsigned long long op;
} nb_gpu_index_error;

/* Pinned staging slots: two for uploads on the stream, two for the copy stream. */
#define NB_GPU_STAGE_SLOTS 4
#define NB_GPU_STAGE_BYTES ((size_t)4 << 20)

/* The state of one logical GPU (nb_device.ctx). Created at discovery with no
 * CUDA calls; the stream and events are made on first use (nb__gpu_enter). */
typedef struct nb_gpu_ctx {
    nb_device *dev;
    nb_gpu_phys *phys;
    int ordinal;              /* CUDA ordinal of the card */
    int slot;                 /* logical index on the card */
    int ready;                /* 1 once the stream exists (read with __atomic) */
    pthread_mutex_t lock;     /* lazy creation of everything below */
    cudaStream_t stream;      /* non-blocking; every op of this device runs on it
                                 (uploads of 1 MiB or more on copy_stream, ordered before it) */
    cudaEvent_t join_event;   /* recorded on stream to order another stream after it */
    void *cublas;             /* cublasHandle_t, made by gpu_matmul.c on first matmul */
    void *cublaslt;           /* cublasLtHandle_t, made by gpu_matmul_lt.c on first matmul */
    void *lt_plans;           /* gpu_matmul_lt.c's plan cache, published with cublaslt */
    void *cudnn;              /* cudnnHandle_t, made by gpu_cudnn.c on first use */
    void *cudnn_prop;         /* its device-property descriptor (NULL before cuDNN 9.8) */
    nb_gpu_index_error *index_err;      /* device memory, lazily */
    nb_gpu_index_error *index_err_host; /* pinned mirror, mapped */
    nb_gpu_index_error *index_err_mapped; /* the mirror's address on the device */
    int index_armed;          /* an index check was queued since the last report (__atomic) */
    pthread_mutex_t index_lock; /* held from a fetch to its report: one reader of the mirror */
    /* pinned staging for host -> device copies (gpu_transfer.c) */
    pthread_mutex_t stage_lock;
    /* cuDNN's handle: threads may not use it at once (a pipeline's stages, or
     * an async trainer's workers, on one device); held to build and to run a plan */
    pthread_mutex_t cudnn_lock;
    int stage_state;          /* 0 not tried, 1 ready, -1 unavailable (pageable copies) */
    int stage_next[2];        /* the next slot of each pair (0 stream, 1 copy stream) */
    void *stage[NB_GPU_STAGE_SLOTS];
    cudaEvent_t stage_event[NB_GPU_STAGE_SLOTS];
    bool stage_used[NB_GPU_STAGE_SLOTS];
    size_t stage_fill[NB_GPU_STAGE_SLOTS]; /* bytes handed to DMAs since the slot was last waited for */
    cudaStream_t copy_stream; /* large uploads (NULL: none, they go on stream) */
    cudaEvent_t copy_done;    /* recorded on copy_stream after an upload; stream waits on it */
    cudaEvent_t copy_fence;   /* recorded on stream when copy_stream must wait for it */
    int64_t host_waits;       /* host waits for this stream (__atomic) */
    nb_gpu_pool *rec_pool;    /* while the stream is recorded: the graph's pool (allocator lock) */
} nb_gpu_ctx;

/* ---- host waits (nb_gpu_host_waits) -------------------------------------------
 * Every place the backend makes the host wait for the GPU counts one, just
 * before the waiting call: cudaStreamSynchronize, a cudaEventSynchronize that
 * may block, a blocking copy to the host. A wait for the whole card
 * (cudaDeviceSynchronize, cudaFree, cudaFreeHost) counts on the card, and so on
 * every logical device of it. cudaMalloc and the one-time setup calls
 * (cudaHostAlloc, cublasCreate, stream creation) are not counted. */
static inline void nb__gpu_count_wait(nb_gpu_ctx *c) { __atomic_add_fetch(&c->host_waits, 1, __ATOMIC_RELAXED); }
static inline void nb__gpu_count_card_wait(nb_gpu_phys *p) { __atomic_add_fetch(&p->card_waits, 1, __ATOMIC_RELAXED); }

/* ---- gpu_device.c ------------------------------------------------------------ */

/* ---- discovery (gpu_device.c), the backend's device entries ---- */
/* Fills up to max devices, each physical GPU split into logical_per_gpu; never
 * fails (no driver, no GPU: 0, and nb__gpu_unavailable says why). Called once,
 * by the device registry. */
int nb__gpu_discover(nb_device *devices, int max, int logical_per_gpu);
/* GPUs the driver reports, creating no device state. */
int nb__gpu_physical_count(void);
/* Why discovery found no GPU (static), or NULL. */
const char *nb__gpu_unavailable(void);
/* The capability query of the GPU's table (gpu_backend.c). */
bool nb__gpu_supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype);
/* Running sums along an axis (gpu_scan.cu); the cumsum entry's contract. */
nb_status nb__gpu_cumsum(nb_gpu_ctx *c, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                         bool reverse);

/* Makes dev's card current on the calling thread and creates the context on
 * first use. Writes the context to *out. NB_OK or NB_ERR_BACKEND (recorded). */
nb_status nb__gpu_enter(nb_device *dev, const char *who, nb_gpu_ctx **out);
/* Makes a card current on the calling thread (no context creation; no CUDA
 * call at all where the process sees one card, whose ordinal is 0). */
nb_status nb__gpu_set_device(int ordinal, const char *dev_name);
/* Records NB_ERR_BACKEND "<call> failed on <dev>: <CUDA error string>" (and
 * clears CUDA's non-sticky last error); returns NB_ERR_BACKEND. */
nb_status nb__gpu_cuda_fail(cudaError_t err, const char *call, const char *dev_name);
/* After a kernel launch: NB_OK, or the launch error recorded as above. */
nb_status nb__gpu_launched(const nb_gpu_ctx *c, const char *kernel);
/* A launch that returned e (not cudaSuccess), as cudaLaunchKernel does: records
 * NB_ERR_BACKEND "launch of kernel <kernel> failed on <dev>: <CUDA error>",
 * clears CUDA's non-sticky last error, returns NB_ERR_BACKEND. */
nb_status nb__gpu_launch_failed(const nb_gpu_ctx *c, const char *kernel, cudaError_t e);
/* The device named by a public function's argument, which must be a GPU:
 * NULL and NB_ERR_DEVICE otherwise. */
nb_device *nb__gpu_device_named(const char *name, const char *who);
int nb__gpu_phys_count(void);
nb_gpu_phys *nb__gpu_phys_at(int i);
/* Orders everything queued later on waiter's stream after what is queued now
 * on on's stream (an event, no host wait). */
nb_status nb__gpu_stream_wait(nb_gpu_ctx *waiter, nb_gpu_ctx *on);
/* The device-side index-error record of c (zeroed), creating it on first use. */
nb_status nb__gpu_index_error_record(nb_gpu_ctx *c, nb_gpu_index_error **out);
/* Notes that a kernel that may write the record was queued on c's stream (no
 * wait: the record is read at the next synchronising call). */
void nb__gpu_index_error_arm(nb_gpu_ctx *c);
/* Before a stream synchronisation: when a check was armed since the last one,
 * queues one kernel that moves the record into its pinned mirror and clears
 * it (so a kernel queued later records afresh, and no later fetch sees the
 * same index again), and returns true holding c->index_lock until the
 * report: two threads that wait for one device read the mirror in turn. */
bool nb__gpu_index_error_fetch(nb_gpu_ctx *c);
/* After that synchronisation (fetched: what fetch returned; waited: whether
 * the wait succeeded, so that the mirror holds the record): an index a
 * kernel found outside its range is NB_ERR_INVALID_ARGUMENT naming the op,
 * the index, its position and the range. Releases what fetch took. */
nb_status nb__gpu_index_error_report(nb_gpu_ctx *c, bool fetched, bool waited);
/* NB_OK unless another thread is recording a step on c's stream
 * (nb_graph_capture; the calling thread's own recording refuses these calls
 * before): a wait, or a copy or replay queued there, would break the
 * recording or become part of it. NB_ERR_UNSUPPORTED then, naming who and
 * the device. (A recording that begins between this check and the call is
 * not caught: the threads that share a device must not do both at once.) */
nb_status nb__gpu_not_recording(nb_gpu_ctx *c, const char *who);
/* Queues the kernel that moves *d into *h (device addresses) and zeroes *d
 * (gpu_index.cu). */
cudaError_t nb__gpu_index_error_take(cudaStream_t s, nb_gpu_index_error *d, nb_gpu_index_error *h);

/* Calls a CUDA runtime function; on failure records and returns NB_ERR_BACKEND
 * naming the function and c's device. */
#define NB_GPU_CALL(c, fn, ...)                                                      \
    do {                                                                             \
        cudaError_t e_ = fn(__VA_ARGS__);                                            \
        if (e_ != cudaSuccess)                                                       \
            return nb__gpu_cuda_fail(e_, #fn, (c)->dev->name);                       \
    } while (0)

/* ---- gpu_allocator.c --------------------------------------------------------- */

/* Sets up a card's allocator (host memory only, no CUDA call). false when host
 * memory runs out; records no error (discovery never fails). */
bool nb__gpu_allocator_init(nb_gpu_phys *p);
/* nbytes (rounded up to the size class) of device memory usable in stream order
 * on c's stream; NULL with NB_ERR_OUT_OF_MEMORY or NB_ERR_BACKEND recorded. */
void *nb__gpu_malloc(nb_gpu_ctx *c, size_t nbytes);
/* Gives back what nb__gpu_malloc returned; work already queued on c's stream
 * may still use it (the next user is ordered after it). NULL is ignored. */
void nb__gpu_free(nb_gpu_ctx *c, void *ptr);
/* Blocks of at least this size record an event when freed, so that another
 * stream can be ordered after their earlier users. */
#define NB_GPU_FENCE_BYTES ((size_t)1 << 20)
/* Orders work queued later on waiter (another stream of c's card) after every
 * earlier user of the live block starting at ptr: true when done (a fresh
 * block needs nothing, a recycled one waits for the event of its last free),
 * false when the block is unknown or has no such event (the caller must then
 * order waiter after c's stream itself). */
bool nb__gpu_block_fence(nb_gpu_ctx *c, const void *ptr, cudaStream_t waiter);

/* The pools of recorded graphs (gpu_graph.cu). start: until stop, c's
 * allocations come from a new pool, which also keeps every block c frees
 * (NB_OK, or NB_ERR_OUT_OF_MEMORY recorded); it starts with the blocks of
 * the card's last abandoned recording. release: after the caller waited for
 * c's stream, every block of the pool goes back to the cache, or, for an
 * abandoned recording, is kept for the next recording's pool (a flush of the
 * cache frees them too), and its live blocks become ordinary ones; p is freed
 * (NULL is ignored). */
nb_status nb__gpu_pool_start(nb_gpu_ctx *c, nb_gpu_pool **out);
void nb__gpu_pool_stop(nb_gpu_ctx *c);
void nb__gpu_pool_release(nb_gpu_pool *p, bool abandoned);

/* ---- gpu_graph.cu: recording steps into CUDA graphs ----------------------------- */

extern const nb_graph_kernels nb__gpu_graph_kernels;

/* ---- gpu_nccl.c (built when NB_HAVE_NCCL) ------------------------------------ */

/* The backend's collectives: all-reduce over GPUs on distinct cards. */
extern const nb_collective nb__gpu_nccl;

/* ---- gpu_transfer.c ---------------------------------------------------------- */

nb_status nb__gpu_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes);
nb_status nb__gpu_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes);
nb_status nb__gpu_copy_between(nb_device *dev, void *dst, nb_device *src_dev, const void *src,
                               size_t nbytes);
nb_status nb__gpu_synchronize(nb_device *dev);

/* ---- kernels: each queues its work on c's stream and returns NB_OK, or records
 * the error (NB_ERR_DTYPE naming the op for a dtype it lacks). ----------------- */

/* gpu_elementwise.cu */
nb_status nb__gpu_fill(nb_gpu_ctx *c, const nb_view *out, double value);
nb_status nb__gpu_arange(nb_gpu_ctx *c, const nb_view *out, double start, double step);
nb_status nb__gpu_copy(nb_gpu_ctx *c, const nb_view *out, const nb_view *in);
nb_status nb__gpu_unary(nb_gpu_ctx *c, nb_unary_op op, const nb_view *out, const nb_view *x,
                        double alpha);
nb_status nb__gpu_binary(nb_gpu_ctx *c, nb_binary_op op, const nb_view *out, const nb_view *a,
                         const nb_view *b);
nb_status nb__gpu_where(nb_gpu_ctx *c, const nb_view *out, const nb_view *cond,
                        const nb_view *a, const nb_view *b);
/* gpu_reduce.cu */
nb_status nb__gpu_reduce(nb_gpu_ctx *c, nb_reduce_op op, const nb_view *out, const nb_view *x);
nb_status nb__gpu_arg_reduce(nb_gpu_ctx *c, bool is_max, const nb_view *out, const nb_view *x,
                             int axis);
/* gpu_matmul.c */
nb_status nb__gpu_matmul(nb_gpu_ctx *c, const nb_view *out, const nb_view *a, const nb_view *b);
/* gpu_conv.c: the conv2d entries' contracts (lib/core/backend.h); f32, f64,
 * f16, bf16 */
nb_status nb__gpu_conv2d(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x, const nb_view *w);
nb_status nb__gpu_conv2d_backward_data(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dx, const nb_view *dy,
                                       const nb_view *w);
nb_status nb__gpu_conv2d_backward_filter(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dw,
                                         const nb_view *x, const nb_view *dy);
/* gpu_depthwise.cu: the conv2d entries' contracts for depthwise convolutions
 * (groups == C, K = C * M); f32, f64, f16, bf16, NHWC and NCHW. applies:
 * whether gpu_conv.c routes d here (groups == C > 1; C == 1 is an ordinary
 * convolution, left to cuDNN). The backward filter is deterministic (partial
 * sums per slice of positions in scratch, added in a fixed order); it fails
 * with NB_ERR_OUT_OF_MEMORY when the scratch cannot be had. Every kernel
 * queues its work on c's stream without a host wait. */
bool nb__gpu_depthwise_applies(const nb_conv2d_desc *d);
nb_status nb__gpu_depthwise_forward(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                                    const nb_view *w);
nb_status nb__gpu_depthwise_backward_data(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dx,
                                          const nb_view *dy, const nb_view *w);
nb_status nb__gpu_depthwise_backward_filter(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dw,
                                            const nb_view *x, const nb_view *dy);
/* gpu_pool_cudnn.c: avg_pool2d and its gradient (the entries' contracts)
 * through cuDNN; NB_ERR_UNSUPPORTED, not recorded, when cuDNN has no engine
 * for the problem (or NB_POOL_PLAIN=1): the caller then uses gpu_pool.cu's. */
nb_status nb__cudnn_avg_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x);
nb_status nb__cudnn_avg_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                    const nb_view *dy);
/* gpu_softmax.cu */
nb_status nb__gpu_softmax(nb_gpu_ctx *c, bool log, const nb_view *out, const nb_view *x);
nb_status nb__gpu_softmax_xent(nb_gpu_ctx *c, const nb_view *loss, const nb_view *stats, const nb_view *x,
                               const nb_view *labels);
nb_status nb__gpu_softmax_xent_grad(nb_gpu_ctx *c, const nb_view *dx, const nb_view *g, const nb_view *x,
                                    const nb_view *stats, const nb_view *labels);
/* The table's layer_norm_rows and layer_norm_rows_grad (gpu_norm.cu). */
nb_status nb__gpu_layer_norm_rows(nb_gpu_ctx *c, int64_t rows, int64_t D, const nb_view *out, const nb_view *mean,
                                  const nb_view *rstd, const nb_view *x, const nb_view *gamma, const nb_view *beta,
                                  double epsilon);
nb_status nb__gpu_layer_norm_rows_grad(nb_gpu_ctx *c, int64_t rows, int64_t D, const nb_view *dx,
                                       const nb_view *dgamma, const nb_view *dbeta, const nb_view *g, const nb_view *x,
                                       const nb_view *rstd, const nb_view *gamma);
/* gpu_index.cu */
nb_status nb__gpu_gather(nb_gpu_ctx *c, const char *op, const nb_view *out,
                         const nb_view *params, const nb_view *indices);
nb_status nb__gpu_scatter_add(nb_gpu_ctx *c, const char *op, const nb_view *out,
                              const nb_view *indices, const nb_view *updates);
nb_status nb__gpu_one_hot(nb_gpu_ctx *c, const nb_view *out, const nb_view *indices, double on,
                          double off);
/* Checks that every index (contiguous NB_I32/NB_I64) lies in [0, rows); one
 * outside is recorded for op and reported at the next synchronising call, like
 * gather's. For labels (sparse_softmax_cross_entropy) without a host wait. */
nb_status nb__gpu_check_indices(nb_gpu_ctx *c, const char *op, const nb_view *indices, int64_t rows);
/* gpu_pool.cu: the pooling entries' contracts (lib/core/backend.h) */
nb_status nb__gpu_max_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                             const nb_view *sel);
nb_status nb__gpu_max_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                  const nb_view *dy);
nb_status nb__gpu_avg_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x);
nb_status nb__gpu_avg_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy);
nb_status nb__gpu_channel_moments(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *sum, const nb_view *moment,
                                  const nb_view *a, const nb_view *b, const nb_view *center);
nb_status nb__gpu_channel_affine(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *out, const nb_view *a,
                                 const nb_view *s, const nb_view *b, const nb_view *t, const nb_view *u);
/* gpu_random.cu */
nb_status nb__gpu_random(nb_gpu_ctx *c, const nb_view *out, nb_random_dist dist, double a,
                         double b, uint64_t seed, const double *seed_add);
/* gpu_optim.cu */
nb_status nb__gpu_sgd_update(nb_gpu_ctx *c, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_update_params *p);
nb_status nb__gpu_adam_update(nb_gpu_ctx *c, const nb_view *param, const nb_view *grad,
                              const nb_view *slot1, const nb_view *slot2,
                              const nb_update_params *p);
nb_status nb__gpu_scaler_update(nb_gpu_ctx *c, double *state, const double *check, double *count,
                                const nb_scaler_params *p);
nb_status nb__gpu_sgd_update_many(nb_gpu_ctx *c, int n, const nb_view *param, const nb_view *grad,
                                  const nb_view *slot1, const void *const *sources, const nb_update_params *p);
nb_status nb__gpu_adam_update_many(nb_gpu_ctx *c, int n, const nb_view *param, const nb_view *grad,
                                   const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                   const nb_update_params *p);

#ifdef __cplusplus
}
#endif
#endif
