/* nabla internal — shared pieces of the CPU kernels (ops/cpu).
 *
 * Every kernel file includes this header FIRST: with GCC it raises the files'
 * optimisation to -O3 so that the contiguous loops are vectorised even in a
 * -O2 (debugoptimized) build, where GCC's "very cheap" cost model would leave
 * them scalar. Tests include it to reach the built-in matmul and the
 * allocator's statistics directly. */
#ifndef NB_CPU_INTERNAL_H
#define NB_CPU_INTERNAL_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__)
#pragma GCC optimize("O3")
#endif

#include "cpu_backend.h"
#include "lib/core/backend.h"

#include <string.h>

/* Elements below which elementwise work stays on the calling thread; the
 * cheaper the per-element work, the larger. */
#define NB_CPU_GRAIN 32768
#define NB_CPU_GRAIN_HEAVY 4096

/* ---- small helpers ----------------------------------------------------------- */

static inline int64_t nb__cpu_esize(nb_dtype d)
{
    switch (d) {
    case NB_F32: case NB_I32: return 4;
    case NB_F64: case NB_I64: return 8;
    case NB_F16: case NB_BF16: return 2;
    case NB_BOOL: case NB_U8: return 1;
    default: return 0;
    }
}

static inline const char *nb__cpu_dev_name(const nb_device *dev)
{
    return dev ? dev->name : "/cpu:0";
}

/* nb__fail(NB_ERR_DTYPE, "<op>: dtype <d> is not supported on /cpu:0"). */
nb_status nb__cpu_unsupported(const nb_device *dev, const char *op, nb_dtype d);

/* ---- memory (cpu_memory.c) ---------------------------------------------------- */

/* The caching allocator behind the table's alloc/free: 64-byte aligned blocks in
 * size classes (4 per power of two), a bounded per-thread cache and a bounded
 * global one; blocks over 64 MiB go straight to aligned_alloc/free. */
void *nb__cpu_alloc(nb_device *dev, size_t nbytes);
void nb__cpu_free(nb_device *dev, void *ptr, size_t nbytes);
/* The same allocation without recording an error (for worker threads): NULL on failure. */
void *nb__cpu_alloc_quiet(size_t nbytes);
typedef struct nb_cpu_alloc_stats {
    int64_t system_allocs;  /* aligned_alloc calls made so far */
    int64_t system_frees;
    int64_t cached_bytes;   /* held by the global cache now (thread caches not counted) */
} nb_cpu_alloc_stats;
nb_cpu_alloc_stats nb__cpu_alloc_stats(void);

/* ---- recording a step (cpu_graph.c) --------------------------------------------- */

/* The CPU's graph kernels: a recorded step is a list of kernel calls. */
extern const nb_graph_kernels nb__cpu_graph;
/* Whether p, freed by its owner, belongs to a recorded graph that still lives
 * (which then frees it when it is destroyed): nb__cpu_free asks first. */
bool nb__cpu_graph_keeps(void *p);
/* Returns the calling thread's and the global cache's blocks to the system. */
void nb__cpu_alloc_trim(void);

/* ---- strided N-d iteration (cpu_iter.c) --------------------------------------- */

/* An elementwise kernel has up to 4 operands; a fused chain (cpu_fuse.c) up to 12. */
#define NB_CPU_MAX_OPS 12

/* Up to NB_CPU_MAX_OPS operands sharing one shape, their dims coalesced (size-1
 * dims dropped, neighbours merged where every operand allows). ndim >= 1. */
typedef struct nb_cpu_iter {
    int ndim, nops;
    int64_t numel;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_CPU_MAX_OPS][NB_MAX_DIMS];
    char *data[NB_CPU_MAX_OPS];
} nb_cpu_iter;

/* The inner loop: n elements along the innermost dim from p[i] with byte
 * strides s[i]; flat is the row-major index of the first of them. */
typedef void (*nb_cpu_loop_fn)(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat);

/* views[0] gives the shape; every other view has the same shape. */
void nb__cpu_iter_init(nb_cpu_iter *it, int nops, const nb_view *const *views);
/* Runs fn over every element; splits across the thread pool when numel >= 2*grain. */
void nb__cpu_iter_run(const nb_cpu_iter *it, nb_cpu_loop_fn fn, void *ctx, int64_t grain);
/* nb__cpu_iter_init, then nb__cpu_iter_run: but where every view is
 * contiguous and the work too small to split, one call of fn over it all,
 * with no iterator made (a small op's kernel). */
void nb__cpu_iter_views(int nops, const nb_view *const *views, nb_cpu_loop_fn fn, void *ctx, int64_t grain);
/* Runs fn over the flat elements [begin, end) only. */
void nb__cpu_iter_range(const nb_cpu_iter *it, nb_cpu_loop_fn fn, void *ctx, int64_t begin,
                        int64_t end);

/* Byte offset of element idx (row-major multi-index) of dims [0, ndim) with strides. */
static inline int64_t nb__cpu_offset(int ndim, const int64_t *idx, const int64_t *strides)
{
    int64_t off = 0;
    for (int d = 0; d < ndim; d++)
        off += idx[d] * strides[d];
    return off;
}

/* Starts a walk at flat position pos of the row-major dims [0, ndim) of shape:
 * its multi-index in idx, and the byte offsets of nops operands in off. */
static inline void nb__cpu_index_at(int ndim, const int64_t *shape, int64_t pos, int64_t *idx, int nops,
                                    int64_t *off, const int64_t (*strides)[NB_MAX_DIMS])
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = pos % shape[d];
        pos /= shape[d];
    }
    for (int o = 0; o < nops; o++)
        off[o] = nb__cpu_offset(ndim, idx, strides[o]);
}

/* Appends a dim of size, stepped by s0 in one operand and s1 in another, to the
 * *n dims of shape and st; merged into the last one where that one steps over
 * exactly it in both, so that loops walk fewer, longer dims. */
static inline void nb__cpu_append_dim(int *n, int64_t *shape, int64_t (*st)[NB_MAX_DIMS], int64_t size, int64_t s0,
                                      int64_t s1)
{
    if (*n > 0 && st[0][*n - 1] == s0 * size && st[1][*n - 1] == s1 * size) {
        shape[*n - 1] *= size;
        st[0][*n - 1] = s0;
        st[1][*n - 1] = s1;
    } else {
        shape[*n] = size;
        st[0][*n] = s0;
        st[1][(*n)++] = s1;
    }
}

/* A walk over no dims (a 0-d result) walks one dim of size 1 instead. */
static inline void nb__cpu_one_dim_at_least(int *n, int64_t *shape, int64_t (*st)[NB_MAX_DIMS])
{
    if (*n == 0) {
        *n = 1;
        shape[0] = 1;
        st[0][0] = st[1][0] = 0;
    }
}

/* Advances a row-major multi-index over dims [0, ndim) of shape, keeping the byte
 * offsets of nops operands in step. */
static inline void nb__cpu_index_next(int ndim, const int64_t *shape, int64_t *idx, int nops,
                                      int64_t *off, const int64_t (*strides)[NB_MAX_DIMS])
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d]++;
        for (int o = 0; o < nops; o++)
            off[o] += strides[o][d];
        if (idx[d] < shape[d])
            return;
        for (int o = 0; o < nops; o++)
            off[o] -= shape[d] * strides[o][d];
        idx[d] = 0;
    }
}

/* ---- matmul (cpu_gemm.c) ----------------------------------------------------- */

/* C[M,N] = A[M,K] @ B[K,N] with element strides (rs*, cs*) for each operand, by
 * the built-in cache-blocked, register-tiled kernel (AVX2/FMA when the CPU has
 * it, portable vector code otherwise); splits across the pool when large.
 * Returns NB_OK or NB_ERR_OUT_OF_MEMORY (packing buffers). */
nb_status nb__cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t rsa,
                           int64_t csa, const float *B, int64_t rsb, int64_t csb, float *C,
                           int64_t rsc, int64_t csc);
nb_status nb__cpu_gemm_f64(int64_t M, int64_t N, int64_t K, const double *A, int64_t rsa,
                           int64_t csa, const double *B, int64_t rsb, int64_t csb, double *C,
                           int64_t rsc, int64_t csc);
/* Which micro-kernel the built-in gemm uses: "avx512", "avx2" or "generic". */
const char *nb__cpu_gemm_kernel_name(void);
/* Makes the built-in gemm use the named micro-kernel if this CPU runs it (for
 * tests; not thread-safe); returns whether it does now. */
bool nb__cpu_gemm_use_kernel(const char *name);

/* The table's matmul (cpu_matmul.c), and the same forced onto the built-in path
 * (for tests and machines without CBLAS). */
nb_status nb__cpu_matmul(nb_device *dev, const nb_view *out, const nb_view *a, const nb_view *b);
nb_status nb__cpu_matmul_builtin(nb_device *dev, const nb_view *out, const nb_view *a,
                                 const nb_view *b);

/* ---- the other table entries -------------------------------------------------- */

nb_status nb__cpu_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes);
nb_status nb__cpu_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes);
nb_status nb__cpu_copy_between(nb_device *dev, void *dst, nb_device *src_dev, const void *src,
                               size_t nbytes);
nb_status nb__cpu_synchronize(nb_device *dev);

nb_status nb__cpu_fill(nb_device *dev, const nb_view *out, double value);
nb_status nb__cpu_arange(nb_device *dev, const nb_view *out, double start, double step);
nb_status nb__cpu_random(nb_device *dev, const nb_view *out, nb_random_dist dist, double a,
                         double b, uint64_t seed, const double *seed_add);
nb_status nb__cpu_copy(nb_device *dev, const nb_view *out, const nb_view *in);
nb_status nb__cpu_unary(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x,
                        double alpha);
nb_status nb__cpu_binary(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *a,
                         const nb_view *b);
nb_status nb__cpu_where(nb_device *dev, const nb_view *out, const nb_view *cond,
                        const nb_view *a, const nb_view *b);

/* The loop an elementwise kernel runs for (op, dtypes), resolved once: what
 * nb__cpu_unary and nb__cpu_binary hand to the iteration, so that a fused
 * chain (cpu_fuse.c) computes the same bits. NULL, with no error recorded,
 * where the kernel would fail (an unknown op, dtypes that do not fit or are
 * not supported); *ctx (unary) and *heavy are set otherwise. */
typedef struct nb_cpu_un_ctx {
    double alpha;
    int64_t ialpha; /* alpha saturated to int64, for the integer kernels */
} nb_cpu_un_ctx;
nb_cpu_loop_fn nb__cpu_unary_loop(nb_unary_op op, nb_dtype out, nb_dtype x, double alpha, nb_cpu_un_ctx *ctx,
                                  bool *heavy);
nb_cpu_loop_fn nb__cpu_binary_loop(nb_binary_op op, nb_dtype out, nb_dtype a, nb_dtype b, bool *heavy);
/* nb__cpu_fill's loop for dtype, with value converted into *ctx; NULL where
 * the dtype has no fill. */
typedef union nb_cpu_fill_ctx {
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    float f;
    double d;
    int32_t i;
    int64_t l;
} nb_cpu_fill_ctx;
nb_cpu_loop_fn nb__cpu_fill_loop(nb_dtype dtype, double value, nb_cpu_fill_ctx *ctx);
/* nb__cpu_copy's loop converting elements of dtype in to out (operands out,
 * in; any strides), its context (the dtypes) in *ctx; NULL where either dtype
 * is one the CPU does not store. Every pair of stored dtypes has one. */
typedef struct nb_cpu_copy_ctx {
    nb_dtype out, in;
} nb_cpu_copy_ctx;
nb_cpu_loop_fn nb__cpu_copy_loop(nb_dtype out, nb_dtype in, nb_cpu_copy_ctx *ctx);
/* nb__cpu_where's loop (operands out, cond, a, b; no context): NULL unless
 * cond is NB_BOOL or NB_U8 and a, b and out share a dtype the CPU's where
 * runs (not f16 or bf16). */
nb_cpu_loop_fn nb__cpu_where_loop(nb_dtype out, nb_dtype cond, nb_dtype a, nb_dtype b);
nb_status nb__cpu_reduce(nb_device *dev, nb_reduce_op op, const nb_view *out, const nb_view *x);
/* A reduction fed by its producer (a fused chain, cpu_fuse.c): x's elements
 * are made on demand rather than read from memory. produce writes x's
 * elements [flat, flat + n) (row-major) densely into dst, 64-byte aligned,
 * n <= 256; it is called from the pool's threads at once, each with its own
 * dst. */
typedef void (*nb_cpu_produce_fn)(void *ctx, int64_t flat, int64_t n, char *dst);
/* Whether nb__cpu_reduce_fed runs this call: a dtype and op the CPU reduces,
 * x dense (row-major, no gaps) with at least one element, and the reduced
 * dims trailing (a full reduction, or rows) or leading (columns, the kept
 * dims contiguous in out too). Strided x is not fed. Records no error. */
bool nb__cpu_reduce_can_feed(nb_reduce_op op, const nb_view *out, const nb_view *x);
/* Runs nb__cpu_reduce(op, out, x) with x's elements from produce, through
 * the same splits, lanes and combining order, so out gets the same bits;
 * x's memory is never touched. heavy: x is costly to make (the rows split
 * finer). Returns false, having run nothing, where
 * nb__cpu_reduce_can_feed says no. Records no error. */
bool nb__cpu_reduce_fed(nb_reduce_op op, const nb_view *out, const nb_view *x, nb_cpu_produce_fn produce,
                        void *ctx, bool heavy);
nb_status nb__cpu_arg_reduce(nb_device *dev, bool is_max, const nb_view *out, const nb_view *x,
                             int axis);
nb_status nb__cpu_cumsum(nb_device *dev, const nb_view *out, const nb_view *x, int axis,
                         bool exclusive, bool reverse);
nb_status nb__cpu_softmax(nb_device *dev, bool log, const nb_view *out, const nb_view *x);
nb_status nb__cpu_softmax_xent(nb_device *dev, const nb_view *loss, const nb_view *stats, const nb_view *x,
                               const nb_view *labels);
nb_status nb__cpu_softmax_xent_grad(nb_device *dev, const nb_view *dx, const nb_view *g, const nb_view *x,
                                    const nb_view *stats, const nb_view *labels);
nb_status nb__cpu_gather(nb_device *dev, const char *op, const nb_view *out,
                         const nb_view *params, const nb_view *indices);
nb_status nb__cpu_scatter_add(nb_device *dev, const char *op, const nb_view *out,
                              const nb_view *indices, const nb_view *updates);
nb_status nb__cpu_check_indices(nb_device *dev, const char *op, const nb_view *indices, int64_t limit);
nb_status nb__cpu_one_hot(nb_device *dev, const nb_view *out, const nb_view *indices, double on,
                          double off);
/* 2-d pooling (cpu_pool.c): the table's pooling entries, f32 and f64. */
nb_status nb__cpu_max_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                             const nb_view *sel);
nb_status nb__cpu_max_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x,
                                  const nb_view *dy);
nb_status nb__cpu_avg_pool2d(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *x);
nb_status nb__cpu_avg_pool2d_grad(nb_device *dev, const nb_pool2d_desc *d, const nb_view *out, const nb_view *dy);
/* Per-channel sums and affine maps for batch normalisation (cpu_pool.c). */
nb_status nb__cpu_channel_moments(nb_device *dev, const int64_t shape[3], const nb_view *sum, const nb_view *moment,
                                  const nb_view *a, const nb_view *b, const nb_view *center);
nb_status nb__cpu_channel_affine(nb_device *dev, const int64_t shape[3], const nb_view *out, const nb_view *a,
                                 const nb_view *s, const nb_view *b, const nb_view *t, const nb_view *u);
/* Layer normalisation over contiguous rows (cpu_norm.c), f32 and f64. */
nb_status nb__cpu_layer_norm_rows(nb_device *dev, int64_t rows, int64_t D, const nb_view *out, const nb_view *mean,
                                  const nb_view *rstd, const nb_view *x, const nb_view *gamma, const nb_view *beta,
                                  double epsilon);
nb_status nb__cpu_layer_norm_rows_grad(nb_device *dev, int64_t rows, int64_t D, const nb_view *dx,
                                       const nb_view *dgamma, const nb_view *dbeta, const nb_view *g,
                                       const nb_view *x, const nb_view *rstd, const nb_view *gamma);
/* ---- convolutions (cpu_conv.c, cpu_conv_dnnl.c) -------------------------------- */

nb_status nb__cpu_conv2d(nb_device *dev, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                         const nb_view *w);
nb_status nb__cpu_conv2d_backward_data(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dx,
                                       const nb_view *dy, const nb_view *w);
nb_status nb__cpu_conv2d_backward_filter(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dw,
                                         const nb_view *x, const nb_view *dy);
/* Whether f32 convolutions skip oneDNN for the plain im2col path (first read
 * from NB_CONV_PLAIN=1); set_plain changes it (for tests) and returns the old
 * setting. Without oneDNN every convolution is plain whatever this says. */
bool nb__cpu_conv_plain(void);
bool nb__cpu_conv_set_plain(bool on);
/* oneDNN's f32 convolution (when NB_HAVE_DNNL): which is 0 forward (out y, a
 * x, b w), 1 backward data (dx, dy, w), 2 backward filter (dw, x, dy), on
 * contiguous data laid out as d says. NB_ERR_UNSUPPORTED, recording nothing,
 * when oneDNN will not take the shape (the caller then runs the plain path);
 * any other error recorded. Primitives are cached per descriptor. */
nb_status nb__cpu_conv2d_dnnl(int which, const nb_conv2d_desc *d, void *out, const void *a, const void *b);

nb_status nb__cpu_sgd_update(nb_device *dev, const nb_view *param, const nb_view *grad,
                             const nb_view *slot1, const nb_update_params *p);
nb_status nb__cpu_adam_update(nb_device *dev, const nb_view *param, const nb_view *grad,
                              const nb_view *slot1, const nb_view *slot2,
                              const nb_update_params *p);
nb_status nb__cpu_scaler_update(nb_device *dev, double *state, const double *check, double *count,
                                const nb_scaler_params *p);
/* The single updates in turn, through dev's table (a recording records each). */
nb_status nb__cpu_sgd_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                  const nb_view *slot1, const void *const *sources, const nb_update_params *p);
nb_status nb__cpu_adam_update_many(nb_device *dev, int n, const nb_view *param, const nb_view *grad,
                                   const nb_view *slot1, const nb_view *slot2, const void *const *sources,
                                   const nb_update_params *p);

/* Philox4x32-10 (cpu_random.c): the uniform double in [0, 1) that element i
 * of a random tensor with seed draws, and the standard normal it draws on try
 * `trial`; nb__cpu_box_muller is that normal for the generator's two 64-bit
 * words w0 and w1 (for tests). */
double nb__cpu_philox_uniform(uint64_t seed, uint64_t i);
double nb__cpu_philox_normal(uint64_t seed, uint64_t i, uint32_t trial);
double nb__cpu_box_muller(uint64_t w0, uint64_t w1);

/* ---- kernels compiled for more than one instruction set ----
 * nb__cpu_simd_level() is what the CPU runs, asked once: 0 the build's
 * baseline, 1 AVX2 + FMA, 2 AVX-512 (F, DQ, VL and BW) too. Every copy of a
 * kernel computes the same bits (no contraction into FMA: -ffp-contract=off),
 * so the level only changes the speed. nb__cpu_simd_use(name) makes the
 * kernels use "avx512", "avx2" or "baseline" if this CPU runs it, for tests
 * (not thread-safe), and returns whether they do now (cpu_simd.c). */
int nb__cpu_simd_level(void);
bool nb__cpu_simd_use(const char *name);

/* NB_CPU_AVX2_ENTRY(name, T) makes name_T(ctx, b, e), a nb__parallel_for
 * body that runs name_body_T (an always_inline function) as compiled for
 * AVX2 + FMA when the CPU has them and as compiled for the build's baseline
 * otherwise.
 * NB_CPU_SIMD_LOOP(name) makes name(ctx, n, p, s, flat), a nb_cpu_loop_fn
 * that runs name##_body (always_inline) as compiled for the CPU's level: the
 * elementwise loops, which the compiler vectorises to the width it is given.
 * NB_CPU_SIMD_RANGE(name) does the same for a nb__parallel_for body
 * name(ctx, b, e). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define NB_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define NB_CPU_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl,avx512bw")))
static inline bool nb__cpu_has_avx2(void) { return nb__cpu_simd_level() >= 1; }
#define NB_CPU_AVX2_ENTRY(name, T)                                                                  \
    NB_CPU_TARGET_AVX2 static void name##_avx2_##T(void *ctx, int64_t b, int64_t e)                 \
    {                                                                                               \
        name##_body_##T(ctx, b, e);                                                                 \
    }                                                                                               \
    static void name##_base_##T(void *ctx, int64_t b, int64_t e) { name##_body_##T(ctx, b, e); }    \
    static void name##_##T(void *ctx, int64_t b, int64_t e)                                         \
    {                                                                                               \
        if (nb__cpu_has_avx2())                                                                     \
            name##_avx2_##T(ctx, b, e);                                                             \
        else                                                                                        \
            name##_base_##T(ctx, b, e);                                                             \
    }
/* The three copies of name##_body, each declared with attr (which may be
 * empty), and the one that picks among them, for a void function of the
 * parameter list params, called with the argument list args. */
#define NB_CPU_SIMD_COPIES(name, attr, params, args)                                                \
    NB_CPU_TARGET_AVX512 attr static void name##_avx512 params { name##_body args; }                \
    NB_CPU_TARGET_AVX2 attr static void name##_avx2 params { name##_body args; }                    \
    attr static void name##_base params { name##_body args; }                                       \
    static inline void name params                                                                  \
    {                                                                                               \
        switch (nb__cpu_simd_level()) {                                                             \
        case 2: name##_avx512 args; break;                                                          \
        case 1: name##_avx2 args; break;                                                            \
        default: name##_base args; break;                                                           \
        }                                                                                           \
    }
#else
#define NB_CPU_AVX2_ENTRY(name, T)                                                                  \
    static void name##_##T(void *ctx, int64_t b, int64_t e) { name##_body_##T(ctx, b, e); }
#define NB_CPU_SIMD_COPIES(name, attr, params, args) attr static void name params { name##_body args; }
#endif
#define NB_CPU_SIMD_FN(name, params, args) NB_CPU_SIMD_COPIES(name, , params, args)
#define NB_CPU_SIMD_LOOP(name)                                                                      \
    NB_CPU_SIMD_FN(name, (void *c, int64_t n, char *const *p, const int64_t *s, int64_t flat), (c, n, p, s, flat))
#define NB_CPU_SIMD_RANGE(name) NB_CPU_SIMD_FN(name, (void *ctx, int64_t b, int64_t e), (ctx, b, e))

#endif
