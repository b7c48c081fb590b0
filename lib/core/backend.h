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
#include "optim_kernels.h"

/* The kernel entries, unary, binary and reduction ops, from the one list. */
typedef enum nb_kernel {
#define NB_KERNEL(ID, name) NB_K_##ID,
#include "ops.def"
    NB_K_COUNT
} nb_kernel;

typedef enum nb_unary_op {
#define NB_UNARY(ID, name, dtypes, cost, api) NB_UN_##ID,
#include "ops.def"
    NB_UN_COUNT
} nb_unary_op;

typedef enum nb_binary_op {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) NB_BIN_##ID,
#include "ops.def"
    NB_BIN_COUNT
} nb_binary_op;

typedef enum nb_reduce_op {
#define NB_REDUCE(ID, name) NB_RED_##ID,
#include "ops.def"
    NB_RED_COUNT
} nb_reduce_op;

/* Names from the list ("sigmoid", "maximum", "sum", "scatter_add"); "?" for a
 * value outside it. Static strings. */
const char *nb__kernel_name(nb_kernel k);
const char *nb__unary_name(nb_unary_op op);
const char *nb__binary_name(nb_binary_op op);
const char *nb__reduce_name(nb_reduce_op op);
/* The dtypes an op is defined for (bit 1 << dtype), from the list; 0 outside it.
 * A backend may support fewer (its supports entry says). */
unsigned nb__unary_dtypes(nb_unary_op op);
unsigned nb__binary_dtypes(nb_binary_op op);
/* Whether the list defines kernel k's variant for dtype: the unary and binary
 * ops' dtype masks; true for the other kernels, whose dtypes their backends
 * decide. The start of every backend's supports answer. */
bool nb__list_defines(nb_kernel k, int variant, nb_dtype dtype);
/* Ops whose per-element cost is a libm call (the list's cost column). */
bool nb__unary_heavy(nb_unary_op op);
bool nb__binary_heavy(nb_binary_op op);
/* Comparisons, the list's kind CMP: out is NB_BOOL. Inline: every binary op
 * asks it on the hot path. */
static inline bool nb__binary_is_comparison(nb_binary_op op)
{
    switch (op) {
#define NB_KIND_IS_CMP_ARITH false
#define NB_KIND_IS_CMP_CMP true
#define NB_BINARY(ID, name, dtypes, cost, kind, api) \
    case NB_BIN_##ID: return NB_KIND_IS_CMP_##kind;
#include "ops.def"
#undef NB_KIND_IS_CMP_ARITH
#undef NB_KIND_IS_CMP_CMP
    default: return false;
    }
}

typedef enum nb_random_dist { NB_RAND_NORMAL, NB_RAND_UNIFORM, NB_RAND_TRUNCATED_NORMAL } nb_random_dist;

/* A 2-d pooling: images [N, H, W, C] (NHWC) or [N, C, H, W] (nchw), windows
 * R x S moved by strides (sh, sw) over the image padded by pt rows at the top
 * and pl columns at the left, giving [N, P, Q, C] (or [N, C, P, Q]). The
 * front end checks that every window holds at least one element of the image
 * (pads smaller than the window). */
typedef struct nb_pool2d_desc {
    int64_t N, H, W, C, P, Q;
    int64_t R, S, sh, sw, pt, pl;
    bool nchw;
} nb_pool2d_desc;

/* One 2-D convolution, worked out once by the front end (ops/conv.c) and
 * handed to the three conv2d entries. Images x [N, H, W, C] and y [N, P, Q, K]
 * (nchw: [N, C, H, W] and [N, K, P, Q]); the filter always HWIO [R, S, C /
 * groups, K], output channel k belonging to group k / (K / groups). Output
 * row p reads input rows p * stride[0] - pad[0] + r * dilation[0] (r < R),
 * those outside [0, H) being zeros; the same for columns. All sizes >= 1,
 * strides and dilations >= 1, pads >= 0 (the bottom/right pads are implied by
 * P and Q). */
typedef struct nb_conv2d_desc {
    int64_t N, H, W, C, K, R, S, P, Q;
    int stride[2];   /* height, width */
    int dilation[2]; /* height, width */
    int pad[2];      /* top, left */
    int groups;
    bool nchw;
} nb_conv2d_desc;

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

    /* ---- across processes (NULL where the library has none) ----
     * One communicator over `size` processes, one device each: rank 0 makes a
     * unique id of world_id_bytes (world_make_id), the caller hands it to every
     * process (MPI), and each makes its rank's communicator with it
     * (world_comm_new: waits for the others at most timeout_s, then gives up,
     * NB_ERR_TIMEOUT). world_sum sums n_bufs buffers (device memory of dev)
     * in place across the processes and waits for the result at most
     * timeout_s; a sum that does not finish in time aborts the communicator
     * (NB_ERR_TIMEOUT), which is then only good for world_comm_free. */
    size_t world_id_bytes;
    nb_status (*world_make_id)(void *id);
    nb_status (*world_comm_new)(nb_device *dev, int rank, int size, const void *id, double timeout_s, void **comm);
    nb_status (*world_sum)(void *comm, int n_bufs, void *const *bufs, const int64_t *counts, nb_dtype dtype,
                           double timeout_s);
    void (*world_comm_free)(void *comm);
} nb_collective;

/* Recording the kernels a step queues on one device into a graph that is then
 * replayed whole (CUDA graphs), for lib/graph. A backend without it leaves
 * nb_backend.graph NULL, and a graph on its devices replays by running the
 * step again. The calling thread is the only one using dev meanwhile. */
typedef struct nb_graph_kernels {
    /* Starts recording what the calling thread queues on dev: nothing runs
     * until a replay. Until end, dev's allocations come from a pool private
     * to the recording, which also keeps every block freed meanwhile: a
     * replay uses the same addresses, and nothing else gets them. */
    nb_status (*begin)(nb_device *dev, void **rec);
    /* Stops the recording rec. With keep, *exec is the replayable graph;
     * without (or on failure: the error recorded), everything is released
     * and *exec is NULL. */
    nb_status (*end)(nb_device *dev, void *rec, bool keep, void **exec);
    /* Queues n doubles (n may be 0) into dev_params, device memory, then one
     * replay of exec, in dev's order; returns once queued. */
    nb_status (*launch)(nb_device *dev, void *exec, double *dev_params, int n, const double *params);
    /* How many kernels and copies exec replays. */
    int64_t (*nodes)(const void *exec);
    /* Waits for exec's replays, then frees it and gives its pool back. */
    void (*destroy)(nb_device *dev, void *exec);
    /* Optional (NULL: none). Called with on true before, and false after, the
     * eager run of the step that precedes its recording, on the capturing
     * thread: the backend may prepare what the recording will need (a GPU
     * compiles the kernels of the chains it will fuse, since a recording may
     * not load code) without changing what the step computes. */
    void (*prepare)(nb_device *dev, bool on);
} nb_graph_kernels;

struct nb_backend {
    const char *name;
    /* The kind of device it serves: one backend per kind in a process. */
    nb_device_kind kind;
    /* The dtypes its tensors may hold: bit (1 << dtype). Creating a tensor of any
     * other dtype on its devices is NB_ERR_DTYPE, before anything is allocated. */
    uint32_t dtypes;

    /* Collectives across devices of this kind; NULL when there are none. */
    const nb_collective *collective;
    /* Fused optimizer updates (optim_kernels.h); NULL when there are none. */
    const nb_optim_kernels *optim;
    /* Graph recording (above); NULL when there is none. */
    const nb_graph_kernels *graph;

    /* ---- devices ---- */
    /* Fills up to max devices of this kind (kind, index, name "/<kind>:<index>",
     * physical ordinal, backend, ctx), each physical device split into
     * logical_per_physical logical ones; returns how many. Never fails: missing
     * hardware or drivers give 0 (unavailable then says why). */
    int (*discover)(nb_device *devices, int max, int logical_per_physical);
    /* Physical devices present, without creating any device state (callable
     * before discover). */
    int (*physical_count)(void);
    /* Why discover found no device (a static string), or NULL when it found one
     * or has not run. */
    const char *(*unavailable)(void);
    /* Whether it runs kernel k for inputs of dtype: variant is the nb_unary_op,
     * nb_binary_op or nb_reduce_op for those kernels, 0 for the others; dtype is
     * the first input's (the index dtype for one_hot). Asked by ops before they
     * allocate an output (nb__op_place_kernel), so that soft placement can move
     * an op a device lacks to the CPU. */
    bool (*supports)(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype);

    /* ---- memory ---- */
    /* nbytes of device memory (16-byte aligned at least), or NULL and
     * NB_ERR_OUT_OF_MEMORY; free takes back what alloc gave. */
    void *(*alloc)(nb_device *dev, size_t nbytes);
    void (*free)(nb_device *dev, void *ptr, size_t nbytes);
    /* dst is a fresh allocation, or one no queued work still reads: a device
     * may write it on a copy stream ordered only after the block's earlier
     * owners (the GPU does for 1 MiB or more). */
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
    /* Counter-based: element i depends only on (seed, i). Floating out.
     * seed_add: NULL, or one double's 8 bytes in dev's memory read when the
     * kernel runs, holding the bits of a uint64 added to seed (a recorded
     * step's dropout reads its mask seed there, which each replay refreshes). */
    nb_status (*random)(nb_device *dev, const nb_view *out, nb_random_dist dist, double a,
                        double b, uint64_t seed, const double *seed_add);

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
    /* out (contiguous, x's shape and dtype) = running sum of x along axis:
     * out[.., i, ..] = sum of x[.., j, ..] for j <= i (j < i when exclusive),
     * counted from the end (j >= i, j > i) when reverse. */
    nb_status (*cumsum)(nb_device *dev, const nb_view *out, const nb_view *x, int axis, bool exclusive,
                        bool reverse);

    /* ---- linear algebra ---- */
    /* out[..., M, N] = a[..., M, K] @ b[..., K, N]; all three have out's ndim (>= 2),
     * a and b broadcast over the batch dims (stride 0 allowed there). Each operand's
     * last two dims have unit stride on one of them (row- or column-major). */
    nb_status (*matmul)(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b);

    /* ---- softmax ---- */
    /* Over the last dim of a contiguous x; out has x's shape. */
    nb_status (*softmax)(nb_device *dev, bool log, const nb_view *out, const nb_view *x);
    /* Sparse softmax cross-entropy, one pass over each row of contiguous
     * logits x [N, C] (C >= 1) with labels (contiguous NB_I32 or NB_I64 [N]):
     * with m the row's max and lsum the log of the sum of exp(x - m), both
     * as softmax takes them (log_softmax = (x - m) - lsum), loss[i] = -((x[i,
     * label] - m) - lsum), and stats [N, 2] = (m, lsum) for the gradient (x's
     * dtype; f32 for f16 and bf16). A label outside [0, C) is reported as
     * check_indices reports it, naming the op sparse_softmax_cross_entropy
     * (a device may queue the check: the GPU does, its row's loss NaN).
     * Optional: NULL, or both entries present. */
    nb_status (*softmax_xent)(nb_device *dev, const nb_view *loss, const nb_view *stats, const nb_view *x,
                              const nb_view *labels);
    /* Its gradient for the loss gradient g [N] (any stride: a mean's gradient
     * is one value broadcast): dx [N, C] = G - exp(y) s, y =
     * (x - m) - lsum, G = -g[i] at the label and +0 elsewhere, s = -g[i] + 0:
     * log_softmax's gradient applied to the loss written as neg(sum(where(
     * one_hot, log_softmax(x), 0))), which on the CPU gives its bits (its exp
     * is the exp op's). */
    nb_status (*softmax_xent_grad)(nb_device *dev, const nb_view *dx, const nb_view *g, const nb_view *x,
                                   const nb_view *stats, const nb_view *labels);

    /* ---- indexing ---- */
    /* out[i, ...] = params[indices[i], ...]; params contiguous [R, ...], indices
     * contiguous NB_I32/NB_I64 of any shape flattened. An index outside [0, R) is
     * NB_ERR_INVALID_ARGUMENT naming op, the index, its position and the range;
     * its row of out is zeros and nothing outside out is written. A device may
     * queue the check and report it at its next synchronising call
     * (copy_to_host, synchronize) instead: the GPU does. */
    nb_status (*gather)(nb_device *dev, const char *op, const nb_view *out, const nb_view *params,
                        const nb_view *indices);
    /* out[indices[i], ...] += updates[i, ...]; out contiguous [R, ...]. An index
     * outside [0, R) is skipped and reported as gather's. Without atomics in
     * deterministic mode (nb_deterministic). */
    nb_status (*scatter_add)(nb_device *dev, const char *op, const nb_view *out,
                             const nb_view *indices, const nb_view *updates);
    /* out[..., k] = (indices[...] == k) ? on : off; indices outside [0, depth) give a
     * row of off (as TensorFlow). */
    nb_status (*one_hot)(nb_device *dev, const nb_view *out, const nb_view *indices, double on,
                         double off);
    /* Checks that every element of indices (contiguous NB_I32/NB_I64) lies in
     * [0, limit): NB_ERR_INVALID_ARGUMENT naming op, the index, its position and
     * the range otherwise. A device may queue the check and report a bad index
     * at the next synchronising call (a read, nb_synchronize) instead of
     * waiting for it now: the GPU does. */
    nb_status (*check_indices)(nb_device *dev, const char *op, const nb_view *indices, int64_t limit);

    /* ---- pooling (d describes the shapes; every view contiguous) ---- */
    /* out [N, P, Q, C] = the max of each window of x, padding excluded, a NaN
     * in the window winning; with sel (x's shape) not NULL, sel's element at
     * the position of each window's first maximum (row-major window order)
     * instead: max pooling's second-order selection. */
    nb_status (*max_pool2d)(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                            const nb_view *sel);
    /* out (x's shape) = dy [N, P, Q, C] summed into the positions of each
     * window's first maximum of x; 0 elsewhere. */
    nb_status (*max_pool2d_grad)(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                 const nb_view *dy);
    /* out [N, P, Q, C] = the mean of each window over the elements inside the
     * image. */
    nb_status (*avg_pool2d)(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x);
    /* out [N, H, W, C] = each dy element divided by its window's count and
     * summed into the window's elements inside the image: avg_pool2d's
     * transpose. */
    nb_status (*avg_pool2d_grad)(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy);

    /* ---- per-channel kernels (batch normalisation) ----
     * The contiguous inputs a and b are [outer, C, inner] (NHWC: inner 1;
     * NCHW: outer N, inner H * W); per-channel operands and outputs are [C],
     * all of one floating dtype. */
    /* sum[c] = the sum of a over channel c's elements; moment[c] = the sum of
     * a (b - center[c]) (center NULL: 0), or with b NULL of (a - center[c])^2,
     * center NULL meaning the channel's own mean (one pass: the sum of a^2
     * less sum^2 / count, cancelling in the accumulator; clamped at 0 where
     * rounding takes it below, NaN kept, as for a channel holding an
     * infinity). Accumulated in double (float on the GPU for f16/bf16). */
    nb_status (*channel_moments)(nb_device *dev, const int64_t shape[3], const nb_view *sum, const nb_view *moment,
                                 const nb_view *a, const nb_view *b, const nb_view *center);
    /* out = a s[c] + b t[c] + u[c], out like a (b and t NULL: no b term). */
    nb_status (*channel_affine)(nb_device *dev, const int64_t shape[3], const nb_view *out, const nb_view *a,
                                const nb_view *s, const nb_view *b, const nb_view *t, const nb_view *u);

    /* ---- rows (layer normalisation) ----
     * Optional: a backend may leave both NULL, and the op then runs as a
     * composition of ops; ops test the pointer before asking supports. x,
     * out, dx and g are contiguous [rows, D]; gamma, beta, dgamma and dbeta
     * [D]; mean and rstd [rows]; one dtype (the CPU: f32 and f64; the GPU
     * f16 and bf16 too), but mean and rstd are f32 for f16 and bf16. */
    /* Per row r: mean[r] and var = the mean of (x - mean[r])^2 (two passes
     * over the row, accumulated in double), rstd[r] = 1 / sqrt(var +
     * epsilon), and out = (x - mean[r]) rstd[r] gamma + beta (gamma NULL: 1,
     * beta NULL: 0). A constant row gives exactly beta for epsilon > 0 and
     * NaN for 0; a row holding an infinity or a NaN is NaN throughout.
     * D 0: mean and rstd NaN, out empty. mean may be NULL (not wanted). */
    nb_status (*layer_norm_rows)(nb_device *dev, int64_t rows, int64_t D, const nb_view *out, const nb_view *mean,
                                 const nb_view *rstd, const nb_view *x, const nb_view *gamma, const nb_view *beta,
                                 double epsilon);
    /* layer_norm_rows' gradient from the output gradient g and the saved
     * rstd: with xhat = (x - mean_r) rstd[r], mean_r the row's mean summed
     * again in double (the saved mean, rounded to f32, would lose a row's
     * small deviations far from 0), and h = g gamma
     * (gamma NULL: g), dx = rstd[r] (h - mean_row(h) - xhat mean_row(h
     * xhat)), dgamma = the sum over rows of g xhat, dbeta = the sum over rows
     * of g. Any of dx, dgamma, dbeta may be NULL (not wanted). The row sums
     * are accumulated in double; the column sums in double over fixed blocks
     * of rows combined in block order, so the result does not depend on the
     * thread count. rows 0: dgamma and dbeta 0. */
    nb_status (*layer_norm_rows_grad)(nb_device *dev, int64_t rows, int64_t D, const nb_view *dx,
                                      const nb_view *dgamma, const nb_view *dbeta, const nb_view *g, const nb_view *x,
                                      const nb_view *rstd, const nb_view *gamma);

    /* ---- convolutions (d: nb_conv2d_desc above) ----
     * Every view is contiguous: x, dx [N, H, W, C] (or NCHW), w, dw [R, S, C /
     * groups, K], y, dy [N, P, Q, K] (or NKPQ); one floating dtype. */
    /* y = x (*) w, the cross-correlation of TensorFlow's conv2d. */
    nb_status (*conv2d)(nb_device *dev, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                        const nb_view *w);
    /* dx = the transpose of conv2d applied to dy (conv2d's gradient for x). */
    nb_status (*conv2d_backward_data)(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dx,
                                      const nb_view *dy, const nb_view *w);
    /* dw = conv2d's gradient for w from x and dy, summed over the batch. */
    nb_status (*conv2d_backward_filter)(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dw,
                                        const nb_view *x, const nb_view *dy);
};

/* ---- the backend registry (lib/core/device.c) ----
 *
 * The core names no backend. The build's list of backends (lib/backends.c, the
 * one file that names them all, compiled with the library) hands them over;
 * the registry asks each to discover its devices on first use. */
typedef struct nb_backend_list {
    int n;
    const nb_backend *const *backends;
} nb_backend_list;
/* The backends linked into this build: the CPU's always, first. */
nb_backend_list nb__builtin_backends(void);
/* The registered backend of a kind, or NULL when none is built in. */
const nb_backend *nb__backend_of_kind(nb_device_kind kind);

#endif
