/* nabla internal — the kernel table a device kind provides.
 *
 * ops/ validates inputs, computes the output shape, allocates the output and
 * calls these through dev->backend; it never includes gpu/. Conventions:
 * - out is freshly allocated and contiguous unless the entry says otherwise;
 * - inputs are views already broadcast to the ndim (and, for elementwise kernels,
 *   the shape) of out: stride 0 on broadcast dims, any other strides allowed;
 * - dtypes were checked by the op; a kernel returns NB_ERR_DTYPE (through
 *   nb__fail, naming the op) for one it does not implement on its device;
 * - a kernel may run asynchronously; it returns NB_OK once the work is queued.
 * Every entry returns NB_OK or the error it recorded with nb__fail. */
#ifndef NB_BACKEND_H
#define NB_BACKEND_H

#include "core.h"

typedef enum nb_unary_op {
    NB_UN_NEG, NB_UN_ABS, NB_UN_SIGN, NB_UN_EXP, NB_UN_LOG, NB_UN_SQRT, NB_UN_RSQRT,
    NB_UN_SQUARE, NB_UN_SIN, NB_UN_COS, NB_UN_TANH, NB_UN_ERF, NB_UN_SIGMOID,
    NB_UN_RELU, NB_UN_LEAKY_RELU, /* alpha: slope for x < 0 */
    NB_UN_GELU,                   /* exact, x * Phi(x) */
    NB_UN_SOFTPLUS,               /* log(1 + exp(x)), stable */
    NB_UN_RECIPROCAL,             /* 1 / x */
    NB_UN_STEP,                   /* x > 0 ? 1 : 0 (alpha below 0: x >= 0) */
    NB_UN_NORMAL_PDF,             /* exp(-x^2/2) / sqrt(2 pi), for gelu's gradient */
    NB_UN_ADD_SCALAR,             /* x + alpha */
    NB_UN_MUL_SCALAR,             /* x * alpha */
    NB_UN_POW_SCALAR,             /* x ^ alpha */
    NB_UN_COUNT
} nb_unary_op;

typedef enum nb_binary_op {
    NB_BIN_ADD, NB_BIN_SUB, NB_BIN_MUL, NB_BIN_DIV, NB_BIN_POW, NB_BIN_MAX, NB_BIN_MIN,
    /* comparisons write NB_BOOL (one byte, 0 or 1) */
    NB_BIN_EQ, NB_BIN_NE, NB_BIN_LT, NB_BIN_LE, NB_BIN_GT, NB_BIN_GE,
    NB_BIN_COUNT
} nb_binary_op;

typedef enum nb_reduce_op { NB_RED_SUM, NB_RED_MEAN, NB_RED_MAX, NB_RED_MIN, NB_RED_PROD } nb_reduce_op;

typedef enum nb_random_dist { NB_RAND_NORMAL, NB_RAND_UNIFORM, NB_RAND_TRUNCATED_NORMAL } nb_random_dist;

/* Hyper-parameters of a fused optimizer update. */
typedef struct nb_update_params {
    double lr, momentum, beta1, beta2, epsilon, weight_decay;
    bool nesterov;
    int64_t step; /* 1 on the first Adam step, for bias correction */
    /* NULL: param is updated in place. Otherwise the parameter's current values
     * are read from here (param's layout) and the result is written to param, so
     * a value still shared with a read costs no extra copy. */
    const void *source;
} nb_update_params;

/* A collective library over several devices of one kind (NCCL on GPUs): what the
 * mirrored strategy uses when every replica is a distinct physical device. The
 * same shape serves a later multi-process (MPI) path. Every rank's calls come
 * from that rank's own thread, all ranks making the same calls in the same order. */
typedef struct nb_collective {
    const char *name; /* "nccl" */
    /* A communicator over n devices, rank r being devs[r]: writes it to *comm.
     * NB_ERR_UNSUPPORTED (recorded) when these devices cannot share one (two
     * logical devices on one card, a device of another kind, too few devices);
     * NB_ERR_BACKEND when the library fails. */
    nb_status (*comm_new)(int n, nb_device *const *devs, void **comm);
    /* Sums count elements of dtype across ranks: recv[i] = sum over ranks of
     * send[i] (send == recv is in place). Queued on rank's device in stream order
     * after the work already queued there; returns once queued. n_bufs calls are
     * made as one group. NB_ERR_DTYPE for a dtype it cannot sum. */
    nb_status (*all_reduce_sum)(void *comm, int rank, int n_bufs, const void *const *send,
                                void *const *recv, const int64_t *counts, nb_dtype dtype);
    /* Frees the communicator after waiting for its queued work; NULL is ignored. */
    void (*comm_free)(void *comm);
} nb_collective;

struct nb_backend {
    const char *name;
    /* The dtypes its tensors may hold: bit (1 << dtype). Creating a tensor of any
     * other dtype on its devices is NB_ERR_DTYPE, before anything is allocated. */
    uint32_t dtypes;

    /* Collectives across devices of this kind; NULL when there are none. */
    const nb_collective *collective;

    /* ---- memory ---- */
    /* nbytes of device memory (16-byte aligned at least), or NULL and
     * NB_ERR_OUT_OF_MEMORY; free takes back what alloc gave. */
    void *(*alloc)(nb_device *dev, size_t nbytes);
    void (*free)(nb_device *dev, void *ptr, size_t nbytes);
    nb_status (*copy_from_host)(nb_device *dev, void *dst, const void *src, size_t nbytes);
    /* Waits for queued work on dev that writes src before copying. */
    nb_status (*copy_to_host)(nb_device *dev, void *dst, const void *src, size_t nbytes);
    /* Contiguous bytes from src on src_dev to dst on dev (same kind or CPU<->dev). */
    nb_status (*copy_between)(nb_device *dev, void *dst, nb_device *src_dev, const void *src,
                              size_t nbytes);
    nb_status (*synchronize)(nb_device *dev);

    /* ---- creation ---- */
    nb_status (*fill)(nb_device *dev, const nb_view *out, double value); /* out any strides */
    nb_status (*arange)(nb_device *dev, const nb_view *out, double start, double step);
    /* Counter-based: element i depends only on (seed, i). Floating out. */
    nb_status (*random)(nb_device *dev, const nb_view *out, nb_random_dist dist, double a,
                        double b, uint64_t seed);

    /* ---- elementwise ---- */
    /* out (any strides, same shape as in) = in converted to out's dtype. */
    nb_status (*copy)(nb_device *dev, const nb_view *out, const nb_view *in);
    nb_status (*unary)(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x,
                       double alpha);
    nb_status (*binary)(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *a,
                        const nb_view *b);
    /* out = cond ? a : b; cond is NB_BOOL. */
    nb_status (*where)(nb_device *dev, const nb_view *out, const nb_view *cond, const nb_view *a,
                       const nb_view *b);

    /* ---- reductions ---- */
    /* out has x's ndim with size 1 on the reduced dims (x's size elsewhere). */
    nb_status (*reduce)(nb_device *dev, nb_reduce_op op, const nb_view *out, const nb_view *x);
    /* out (NB_I64) has x's ndim with size 1 on axis: index of the first max/min. */
    nb_status (*arg_reduce)(nb_device *dev, bool is_max, const nb_view *out, const nb_view *x,
                            int axis);

    /* ---- linear algebra ---- */
    /* out[..., M, N] = a[..., M, K] @ b[..., K, N]; all three have out's ndim (>= 2),
     * a and b broadcast over the batch dims (stride 0 allowed there). Each operand's
     * last two dims have unit stride on one of them (row- or column-major). */
    nb_status (*matmul)(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b);

    /* ---- softmax ---- */
    /* Over the last dim of a contiguous x; out has x's shape. */
    nb_status (*softmax)(nb_device *dev, bool log, const nb_view *out, const nb_view *x);

    /* ---- indexing ---- */
    /* out[i, ...] = params[indices[i], ...]; params contiguous [R, ...], indices
     * contiguous NB_I32/NB_I64 of any shape flattened. An index outside [0, R) is
     * NB_ERR_INVALID_ARGUMENT naming op. */
    nb_status (*gather)(nb_device *dev, const char *op, const nb_view *out, const nb_view *params,
                        const nb_view *indices);
    /* out[indices[i], ...] += updates[i, ...]; out contiguous [R, ...]. */
    nb_status (*scatter_add)(nb_device *dev, const char *op, const nb_view *out,
                             const nb_view *indices, const nb_view *updates);
    /* out[..., k] = (indices[...] == k) ? on : off; indices outside [0, depth) give a
     * row of off (as TensorFlow). */
    nb_status (*one_hot)(nb_device *dev, const nb_view *out, const nb_view *indices, double on,
                         double off);

    /* ---- optimizers (param, grad and slots contiguous, one dtype) ---- */
    /* slot1 = momentum buffer (NULL for plain SGD). */
    nb_status (*sgd_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                            const nb_view *slot1, const nb_update_params *p);
    /* slot1 = m, slot2 = v; weight_decay > 0 gives AdamW. */
    nb_status (*adam_update)(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_view *slot2,
                             const nb_update_params *p);
};

/* The CPU kernel table (ops/cpu). */
extern const nb_backend nb__cpu_backend;

/* GPU discovery (gpu/, or a stub when CUDA is off): fills up to max devices of
 * kind NB_DEVICE_GPU (name, physical ordinal, backend, ctx), each physical GPU
 * split into logical_per_gpu devices; returns how many. Never fails: no GPU, no
 * driver or CUDA off all give 0. */
int nb__gpu_discover(nb_device *devices, int max, int logical_per_gpu);
bool nb__gpu_built(void);
/* Why discovery found no GPU (a static string), or NULL when it found one or has
 * not run. */
const char *nb__gpu_unavailable(void);
/* Number of physical GPUs the driver reports (0 with no GPU, no driver or CUDA
 * off), without creating any device state: callable before the registry exists. */
int nb__gpu_physical_count(void);

#endif
