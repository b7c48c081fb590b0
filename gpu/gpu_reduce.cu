// Reductions (sum, mean, max, min, prod over any set of dims) and argmax/argmin.
//
// The input's dims are split into kept dims (the output's) and reduced dims;
// each set is collapsed where it is contiguous. Two kernels cover the layouts:
// - inner: the reduced elements are adjacent in memory (row sums): one warp per
//   output (or per chunk of it), lanes read consecutive elements;
// - outer: the kept elements are adjacent (column sums, a reduced batch dim):
//   32 outputs per block side by side, 8 lanes per output down the reduced dims;
//   also for short reductions (under 32 elements), one thread group per output.
// When there are too few outputs to fill the card, the reduced range is split
// into chunks whose partial results (in the accumulator type) go to scratch
// memory and a second kernel combines them. A whole contiguous tensor of 64K
// elements or more goes to cub::DeviceReduce, and 4 x SMs or more contiguous
// rows of 4096 or more to cub::DeviceSegmentedReduce (a block per row).
// Accumulators as the CPU's (Acc_of): f32 sums and floating products in double,
// integers in int64. max/min propagate NaN. No atomics: the split depends only
// on the shape and the card, so results are the same from run to run
// (deterministic mode needs nothing more here).
//
// argmax/argmin: one warp per output over a contiguous axis, one thread per
// output over a short one, and when there are few outputs for the card (argmax
// over axis 0 of [60000, 10]) blocks over chunks of the axis whose best
// (value, index) pairs a second kernel combines.
#include "gpu_kernels.cuh"

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>


using namespace nbg;

namespace {

struct RGeo {
    int nk, nr;
    int64_t kshape[NB_MAX_DIMS], kst[NB_MAX_DIMS]; // kept dims: sizes, input byte strides
    int64_t rshape[NB_MAX_DIMS], rst[NB_MAX_DIMS]; // reduced dims
};

__device__ __forceinline__ int64_t dims_offset(int n, const int64_t *shape, const int64_t *st, int64_t i)
{
    if (n == 1)
        return i * st[0];
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t q = i / shape[d];
        off += (i - q * shape[d]) * st[d];
        i = q;
    }
    return off;
}

// Merges neighbours of a dim list that are contiguous with each other.
inline void collapse_list(int &n, int64_t *shape, int64_t *st)
{
    if (n <= 1)
        return;
    int w = 0;
    for (int d = 1; d < n; d++) {
        if (st[w] == st[d] * shape[d]) {
            shape[w] *= shape[d];
            st[w] = st[d];
        } else {
            w++;
            shape[w] = shape[d];
            st[w] = st[d];
        }
    }
    n = w + 1;
}

template <class Acc, nb_reduce_op OP> __host__ __device__ __forceinline__ Acc red_identity()
{
    if constexpr (OP == NB_RED_PROD)
        return Acc(1);
    else if constexpr (OP == NB_RED_MAX)
        return cuda::std::numeric_limits<Acc>::has_infinity ? -cuda::std::numeric_limits<Acc>::infinity()
                                                      : cuda::std::numeric_limits<Acc>::lowest();
    else if constexpr (OP == NB_RED_MIN)
        return cuda::std::numeric_limits<Acc>::has_infinity ? cuda::std::numeric_limits<Acc>::infinity()
                                                      : cuda::std::numeric_limits<Acc>::max();
    else
        return Acc(0);
}

template <class Acc, nb_reduce_op OP> __host__ __device__ __forceinline__ Acc red_combine(Acc a, Acc b)
{
    if constexpr (OP == NB_RED_PROD)
        return a * b;
    else if constexpr (OP == NB_RED_MAX) // the CPU's FMAX: a NaN wins, a tie keeps a (which of -0 and +0
                                         // a long row ends with depends on each device's order of combining)
        return (m_isnan(b) || b > a) ? b : a;
    else if constexpr (OP == NB_RED_MIN)
        return (m_isnan(b) || b < a) ? b : a;
    else
        return a + b;
}

template <class Acc, nb_reduce_op OP> __device__ __forceinline__ Acc warp_reduce(Acc v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = red_combine<Acc, OP>(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

// The accumulator of reduction OP over dtype D, as the CPU's: f32 sums and
// means, and every floating product, in double (a float product of a million
// factors near 1 drifted 0.75 % from the CPU's); the other floating
// reductions in float (f16, bf16, f32) or double (f64), integers in int64.
template <nb_dtype D, nb_reduce_op OP>
using Acc_of = std::conditional_t<(is_float_v<D> && OP == NB_RED_PROD) ||
                                      (D == NB_F32 && (OP == NB_RED_SUM || OP == NB_RED_MEAN)),
                                  double, typename DT<D>::Acc>;

template <nb_dtype D, class Acc> __device__ __forceinline__ Acc load_acc(const char *p)
{
    return static_cast<Acc>(ld<D>(*reinterpret_cast<const T_of<D> *>(p)));
}

// mean_div: R for a mean (0 otherwise). A NaN result is the default quiet
// NaN, as the CPU stores it (not an input's payload or the hardware's).
template <nb_dtype D, class Acc> __host__ __device__ __forceinline__ T_of<D> finish(Acc acc, int64_t mean_div)
{
    if (mean_div > 0)
        acc = acc / static_cast<Acc>(mean_div);
    if constexpr (cuda::std::is_floating_point_v<Acc>)
        if (m_isnan(acc))
            acc = cuda::std::numeric_limits<Acc>::quiet_NaN();
    return st<D>(acc);
}

// Writes acc for output k: the final value, or partial (k, s) when split.
template <nb_dtype D, bool FINAL, class Acc>
__device__ __forceinline__ void put(void *dst, int64_t k, int64_t s, int64_t S, Acc acc, int64_t mean_div)
{
    if constexpr (FINAL)
        static_cast<T_of<D> *>(dst)[k] = finish<D>(acc, mean_div);
    else
        static_cast<Acc *>(dst)[k * S + s] = acc;
}

template <nb_dtype D, nb_reduce_op OP, bool FINAL>
__global__ void __launch_bounds__(kThreads)
    k_reduce_inner(RGeo g, const char *x, int64_t K, int64_t R, int64_t S, int64_t chunk, void *dst,
                   int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t w = gtid() >> 5; w < K * S; w += nwarps) {
        const int64_t k = w / S, s = w - k * S;
        const char *base = x + dims_offset(g.nk, g.kshape, g.kst, k);
        const int64_t r1 = min(R, (s + 1) * chunk);
        Acc acc = red_identity<Acc, OP>();
        for (int64_t r = s * chunk + lane; r < r1; r += 32)
            acc = red_combine<Acc, OP>(acc, load_acc<D, Acc>(base + dims_offset(g.nr, g.rshape, g.rst, r)));
        acc = warp_reduce<Acc, OP>(acc);
        if (lane == 0)
            put<D, FINAL>(dst, k, s, S, acc, mean_div);
    }
}

constexpr int kOuterX = 32, kOuterY = 8;

template <nb_dtype D, nb_reduce_op OP, bool FINAL>
__global__ void __launch_bounds__(kOuterX *kOuterY)
    k_reduce_outer(RGeo g, const char *x, int64_t K, int64_t R, int64_t S, int64_t chunk, void *dst,
                   int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    __shared__ Acc part[kOuterY][kOuterX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t k = (int64_t)blockIdx.x * kOuterX + tx, s = blockIdx.y;
    Acc acc = red_identity<Acc, OP>();
    if (k < K) {
        const char *base = x + dims_offset(g.nk, g.kshape, g.kst, k);
        const int64_t r1 = min(R, (s + 1) * chunk);
        for (int64_t r = s * chunk + ty; r < r1; r += kOuterY)
            acc = red_combine<Acc, OP>(acc, load_acc<D, Acc>(base + dims_offset(g.nr, g.rshape, g.rst, r)));
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && k < K) {
#pragma unroll
        for (int y = 1; y < kOuterY; y++)
            acc = red_combine<Acc, OP>(acc, part[y][tx]);
        put<D, FINAL>(dst, k, s, S, acc, mean_div);
    }
}

// Combines S partials per output: one warp per output.
template <nb_dtype D, nb_reduce_op OP>
__global__ void __launch_bounds__(kThreads)
    k_reduce_final(const Acc_of<D, OP> *partial, int64_t K, int64_t S, T_of<D> *out, int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t k = gtid() >> 5; k < K; k += nwarps) {
        Acc acc = red_identity<Acc, OP>();
        for (int64_t s = lane; s < S; s += 32)
            acc = red_combine<Acc, OP>(acc, partial[k * S + s]);
        acc = warp_reduce<Acc, OP>(acc);
        if (lane == 0)
            out[k] = finish<D>(acc, mean_div);
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- a whole contiguous tensor to one value: cub::DeviceReduce ----------------------------

template <nb_dtype D, class Acc> struct LoadAcc {
    __host__ __device__ __forceinline__ Acc operator()(T_of<D> v) const { return static_cast<Acc>(ld<D>(v)); }
};
template <class Acc, nb_reduce_op OP> struct Combine {
    __host__ __device__ __forceinline__ Acc operator()(Acc a, Acc b) const { return red_combine<Acc, OP>(a, b); }
};

template <nb_dtype D, class Acc>
__global__ void k_reduce_finish(const Acc *acc, T_of<D> *out, int64_t mean_div)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        out[0] = finish<D>(acc[0], mean_div);
}

// CUB's reduction: vectorised loads, tuned tiles, two passes (per-block results,
// then one block), so the order of the additions is fixed for a given size and
// card: run to run deterministic.
template <nb_dtype D, nb_reduce_op OP>
nb_status reduce_all_cub(nb_gpu_ctx *c, const T_of<D> *x, int64_t R, T_of<D> *out, int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    auto in = thrust::make_transform_iterator(x, LoadAcc<D, Acc>{});
    Scratch result(c, sizeof(Acc));
    if (!result.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    Acc *rp = static_cast<Acc *>(result.p);
    const Acc init = red_identity<Acc, OP>();
    size_t bytes = 0;
    cudaError_t e = cub::DeviceReduce::Reduce(nullptr, bytes, in, rp, R, Combine<Acc, OP>{}, init, c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceReduce::Reduce", c->dev->name);
    Scratch temp(c, bytes);
    if (bytes && !temp.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    e = cub::DeviceReduce::Reduce(temp.p, bytes, in, rp, R, Combine<Acc, OP>{}, init, c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceReduce::Reduce", c->dev->name);
    k_reduce_finish<D, Acc><<<1, 32, 0, c->stream>>>(rp, out, mean_div);
    return nb__gpu_launched(c, "reduce_finish");
}

// ---- many long contiguous rows: cub::DeviceSegmentedReduce -----------------------------------

struct RowStart {
    int64_t R;
    __host__ __device__ __forceinline__ int64_t operator()(int64_t k) const { return k * R; }
};
template <nb_dtype D, class Acc> struct Finish {
    int64_t mean_div;
    __host__ __device__ __forceinline__ T_of<D> operator()(Acc acc) const { return finish<D>(acc, mean_div); }
};

// One block per row, each adding its row in a fixed order.
template <nb_dtype D, nb_reduce_op OP>
nb_status reduce_rows_cub(nb_gpu_ctx *c, const T_of<D> *x, int64_t K, int64_t R, T_of<D> *out, int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    auto in = thrust::make_transform_iterator(x, LoadAcc<D, Acc>{});
    auto dst = thrust::make_transform_output_iterator(out, Finish<D, Acc>{mean_div});
    auto begin = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), RowStart{R});
    const Acc init = red_identity<Acc, OP>();
    size_t bytes = 0;
    cudaError_t e = cub::DeviceSegmentedReduce::Reduce(nullptr, bytes, in, dst, K, begin, begin + 1,
                                                       Combine<Acc, OP>{}, init, c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceSegmentedReduce::Reduce", c->dev->name);
    Scratch temp(c, bytes);
    if (bytes && !temp.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    e = cub::DeviceSegmentedReduce::Reduce(temp.p, bytes, in, dst, K, begin, begin + 1, Combine<Acc, OP>{}, init,
                                           c->stream);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cub::DeviceSegmentedReduce::Reduce", c->dev->name);
    return nb__gpu_launched(c, "reduce");
}

template <nb_dtype D, nb_reduce_op OP>
nb_status reduce_typed(nb_gpu_ctx *c, const RGeo &g, const nb_view *out, const nb_view *x, int64_t K, int64_t R,
                       int64_t mean_div)
{
    using Acc = Acc_of<D, OP>;
    const int64_t sm = c->phys->sm_count;
    const char *xp = static_cast<const char *>(x->data);
    if (K == 1 && g.nr == 1 && g.rst[0] == (int64_t)sizeof(T_of<D>) && R >= 65536)
        return reduce_all_cub<D, OP>(c, reinterpret_cast<const T_of<D> *>(xp), R, static_cast<T_of<D> *>(out->data),
                                     mean_div);
    // Rows back to back, enough of them for a block per row to fill the card.
    if (g.nr == 1 && g.rst[0] == (int64_t)sizeof(T_of<D>) && g.nk == 1 && g.kst[0] == R * (int64_t)sizeof(T_of<D>) &&
        R >= 4096 && K >= 4 * sm)
        return reduce_rows_cub<D, OP>(c, reinterpret_cast<const T_of<D> *>(xp), K, R,
                                      static_cast<T_of<D> *>(out->data), mean_div);
    // The outer kernel only pays when neighbouring outputs are neighbours in
    // memory and there are enough of them to fill its 32 columns.
    const int64_t es = (int64_t)sizeof(T_of<D>);
    const bool r_unit = g.rst[g.nr - 1] == es, k_unit = g.kst[g.nk - 1] == es;
    const bool inner = R >= 32 && (r_unit || !k_unit || K < 32);
    int64_t S = 1;
    if (inner) {
        const int64_t target = sm * (2048 / 32); // warps to fill the card
        if (K < target && R > 2048)
            S = std::min(ceil_div(R, 1024), ceil_div(target, K));
    } else {
        const int64_t kblocks = ceil_div(K, kOuterX), target = sm * (2048 / (kOuterX * kOuterY));
        if (kblocks < target && R > 256)
            S = std::min(std::min(ceil_div(R, 256), ceil_div(target, kblocks)), (int64_t)65535);
    }
    const int64_t chunk = ceil_div(R, S);
    S = ceil_div(R, chunk);

    Scratch partial(c, S > 1 ? (size_t)(K * S) * sizeof(Acc) : 0);
    if (S > 1 && !partial.p)
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    void *dst = S > 1 ? partial.p : out->data;
    if (inner) {
        unsigned blocks = grid_for(c, K * S * 32);
        if (S > 1)
            k_reduce_inner<D, OP, false><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, R, S, chunk, dst, mean_div);
        else
            k_reduce_inner<D, OP, true><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, R, S, chunk, dst, mean_div);
    } else {
        dim3 grid((unsigned)ceil_div(K, kOuterX), (unsigned)S), block(kOuterX, kOuterY);
        if (S > 1)
            k_reduce_outer<D, OP, false><<<grid, block, 0, c->stream>>>(g, xp, K, R, S, chunk, dst, mean_div);
        else
            k_reduce_outer<D, OP, true><<<grid, block, 0, c->stream>>>(g, xp, K, R, S, chunk, dst, mean_div);
    }
    nb_status st = nb__gpu_launched(c, "reduce");
    if (st || S == 1)
        return st;
    k_reduce_final<D, OP><<<grid_for(c, K * 32), kThreads, 0, c->stream>>>(
        static_cast<const Acc *>(partial.p), K, S, static_cast<T_of<D> *>(out->data), mean_div);
    return nb__gpu_launched(c, "reduce_final");
}

const char *reduce_name(nb_reduce_op op)
{
    switch (op) {
    case NB_RED_SUM: return "sum";
    case NB_RED_MEAN: return "mean";
    case NB_RED_MAX: return "max";
    case NB_RED_MIN: return "min";
    case NB_RED_PROD: return "prod";
    case NB_RED_COUNT: break;
    }
    return "reduce";
}

// ---- argmax / argmin --------------------------------------------------------------------

template <nb_dtype D, bool IS_MAX>
__device__ __forceinline__ bool arg_better(C_of<D> v, int64_t i, C_of<D> bv, int64_t bi)
{
    if constexpr (is_float_v<D>) {
        if (m_isnan(bv))
            return m_isnan(v) && i < bi; // the first NaN wins, as in NumPy
        if (m_isnan(v))
            return true;
    }
    if (IS_MAX ? v > bv : v < bv)
        return true;
    return v == bv && i < bi;
}

template <nb_dtype D, bool IS_MAX, bool WARP>
__global__ void __launch_bounds__(kThreads)
    k_arg_reduce(RGeo g, const char *x, int64_t K, int64_t L, int64_t step, int64_t *out)
{
    using C = C_of<D>;
    const int lanes = WARP ? 32 : 1;
    const int lane = WARP ? (threadIdx.x & 31) : 0;
    const int64_t groups = gstride() / lanes;
    for (int64_t k = gtid() / lanes; k < K; k += groups) {
        const char *base = x + dims_offset(g.nk, g.kshape, g.kst, k);
        C bv = IS_MAX ? red_identity<C, NB_RED_MAX>() : red_identity<C, NB_RED_MIN>();
        int64_t bi = INT64_MAX;
        for (int64_t i = lane; i < L; i += lanes) {
            C v = ld<D>(*reinterpret_cast<const T_of<D> *>(base + i * step));
            if (arg_better<D, IS_MAX>(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        if constexpr (WARP) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                C ov = __shfl_down_sync(0xffffffffu, bv, o);
                int64_t oi = __shfl_down_sync(0xffffffffu, bi, o);
                if (arg_better<D, IS_MAX>(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
        }
        if (lane == 0)
            out[k] = bi == INT64_MAX ? 0 : bi;
    }
}

// Few outputs over a long (or strided) axis: blocks of 256 threads, grid
// (K outputs) x (S chunks of the axis). Each thread keeps the best (value,
// index) of its elements, the block combines them; with S > 1 the chunk's
// best goes to scratch and k_arg_final combines the S of each output. The
// combination picks the same element whatever the order (the first max, or
// the first NaN), so the result does not depend on the split.
constexpr int kArgThreads = 256;

template <nb_dtype D, bool IS_MAX>
__device__ __forceinline__ void arg_warp(C_of<D> &bv, int64_t &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        C_of<D> ov = __shfl_down_sync(0xffffffffu, bv, o);
        int64_t oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (arg_better<D, IS_MAX>(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

template <nb_dtype D, bool IS_MAX>
__global__ void __launch_bounds__(kArgThreads)
    k_arg_block(RGeo g, const char *x, int64_t K, int64_t L, int64_t step, int64_t S, int64_t chunk,
                C_of<D> *part_v, int64_t *part_i, int64_t *out)
{
    using C = C_of<D>;
    __shared__ C sv[kArgThreads / 32];
    __shared__ int64_t si[kArgThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t b = blockIdx.x; b < K * S; b += gridDim.x) {
        const int64_t k = b / S, sidx = b - k * S;
        const char *base = x + dims_offset(g.nk, g.kshape, g.kst, k);
        const int64_t i1 = min(L, (sidx + 1) * chunk);
        C bv = IS_MAX ? red_identity<C, NB_RED_MAX>() : red_identity<C, NB_RED_MIN>();
        int64_t bi = INT64_MAX;
        for (int64_t i = sidx * chunk + threadIdx.x; i < i1; i += kArgThreads) {
            C v = ld<D>(*reinterpret_cast<const T_of<D> *>(base + i * step));
            if (arg_better<D, IS_MAX>(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        arg_warp<D, IS_MAX>(bv, bi);
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < kArgThreads / 32 ? sv[lane] : (IS_MAX ? red_identity<C, NB_RED_MAX>()
                                                              : red_identity<C, NB_RED_MIN>());
            bi = lane < kArgThreads / 32 ? si[lane] : INT64_MAX;
            arg_warp<D, IS_MAX>(bv, bi);
            if (lane == 0) {
                if (S == 1) {
                    out[k] = bi == INT64_MAX ? 0 : bi;
                } else {
                    part_v[b] = bv;
                    part_i[b] = bi;
                }
            }
        }
        __syncthreads(); // sv/si are reused by the block's next output
    }
}

// Combines the S chunk results of each output: one warp per output.
template <nb_dtype D, bool IS_MAX>
__global__ void __launch_bounds__(kThreads)
    k_arg_final(const C_of<D> *part_v, const int64_t *part_i, int64_t K, int64_t S, int64_t *out)
{
    using C = C_of<D>;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t k = gtid() >> 5; k < K; k += nwarps) {
        C bv = IS_MAX ? red_identity<C, NB_RED_MAX>() : red_identity<C, NB_RED_MIN>();
        int64_t bi = INT64_MAX;
        for (int64_t s = lane; s < S; s += 32) {
            const C v = part_v[k * S + s];
            const int64_t i = part_i[k * S + s];
            if (i != INT64_MAX && arg_better<D, IS_MAX>(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        arg_warp<D, IS_MAX>(bv, bi);
        if (lane == 0)
            out[k] = bi == INT64_MAX ? 0 : bi;
    }
}

template <nb_dtype D, bool IS_MAX>
nb_status arg_blocks(nb_gpu_ctx *c, const RGeo &g, const char *x, int64_t K, int64_t L, int64_t step,
                     int64_t *out, const char *name)
{
    using C = C_of<D>;
    // Enough blocks for two waves over the card, chunks of at least 2048 elements.
    const int64_t target = (int64_t)c->phys->sm_count * (2048 / kArgThreads) * 2;
    int64_t S = 1;
    if (K < target)
        S = std::min(ceil_div(target, K), ceil_div(L, 2048));
    if (S < 1)
        S = 1;
    const int64_t chunk = ceil_div(L, S);
    S = ceil_div(L, chunk);
    Scratch pv(c, S > 1 ? (size_t)(K * S) * sizeof(C) : 0), pi(c, S > 1 ? (size_t)(K * S) * sizeof(int64_t) : 0);
    if (S > 1 && (!pv.p || !pi.p))
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    const int64_t blocks = std::min(K * S, (int64_t)c->phys->sm_count * (2048 / kArgThreads) * 8);
    k_arg_block<D, IS_MAX><<<(unsigned)blocks, kArgThreads, 0, c->stream>>>(
        g, x, K, L, step, S, chunk, static_cast<C *>(pv.p), static_cast<int64_t *>(pi.p), out);
    nb_status st = nb__gpu_launched(c, name);
    if (st || S == 1)
        return st;
    k_arg_final<D, IS_MAX><<<grid_for(c, K * 32), kThreads, 0, c->stream>>>(
        static_cast<const C *>(pv.p), static_cast<const int64_t *>(pi.p), K, S, out);
    return nb__gpu_launched(c, name);
}

} // namespace

extern "C" nb_status nb__gpu_reduce(nb_gpu_ctx *c, nb_reduce_op op, const nb_view *out, const nb_view *x)
{
    const char *name = reduce_name(op);
    if (out->numel <= 0)
        return NB_OK;
    if (out->ndim != x->ndim || out->dtype != x->dtype)
        return nb__fail(NB_ERR_INTERNAL, "%s: output and input disagree on rank or dtype on %s", name,
                        c->dev->name);
    // the kernels write out densely, one element per kept position
    if (!out->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: the output must be contiguous on %s", name, c->dev->name);
    for (int d = 0; d < x->ndim; d++)
        if (out->shape[d] != 1 && out->shape[d] != x->shape[d])
            return nb__fail(NB_ERR_SHAPE, "%s: output dim %d is %lld, input's %lld", name, d,
                            (long long)out->shape[d], (long long)x->shape[d]);
    RGeo g;
    std::memset(&g, 0, sizeof g);
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] == 1)
            continue;
        if (out->shape[d] == 1) {
            g.rshape[g.nr] = x->shape[d];
            g.rst[g.nr++] = x->strides[d];
        } else {
            g.kshape[g.nk] = x->shape[d];
            g.kst[g.nk++] = x->strides[d];
        }
    }
    collapse_list(g.nk, g.kshape, g.kst);
    collapse_list(g.nr, g.rshape, g.rst);
    const int64_t K = out->numel;
    int64_t R = 1;
    for (int d = 0; d < g.nr; d++)
        R *= g.rshape[d];
    if (g.nk == 0) { // a single output
        g.nk = 1;
        g.kshape[0] = 1;
        g.kst[0] = 0;
    }
    if (g.nr == 0) { // nothing reduced: one element per output
        g.nr = 1;
        g.rshape[0] = 1;
        g.rst[0] = 0;
    }
    if (R == 0) {
        double v = op == NB_RED_PROD ? 1.0
                 : op == NB_RED_MAX  ? -INFINITY
                 : op == NB_RED_MIN  ? INFINITY
                 : op == NB_RED_MEAN && nb__is_floating(x->dtype) ? NAN
                                                                 : 0.0;
        return nb__gpu_fill(c, out, v);
    }
    const int64_t mean_div = op == NB_RED_MEAN ? R : 0;
    return dispatch(x->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (D == NB_BOOL || D == NB_U8) {
            return dtype_error(c, name, D);
        } else {
            switch (op) {
            case NB_RED_SUM:
            case NB_RED_MEAN: return reduce_typed<D, NB_RED_SUM>(c, g, out, x, K, R, mean_div);
            case NB_RED_MAX: return reduce_typed<D, NB_RED_MAX>(c, g, out, x, K, R, 0);
            case NB_RED_MIN: return reduce_typed<D, NB_RED_MIN>(c, g, out, x, K, R, 0);
            case NB_RED_PROD: return reduce_typed<D, NB_RED_PROD>(c, g, out, x, K, R, 0);
            case NB_RED_COUNT: break;
            }
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "reduce: unknown op %d on %s", (int)op, c->dev->name);
        }
    });
}

extern "C" nb_status nb__gpu_arg_reduce(nb_gpu_ctx *c, bool is_max, const nb_view *out, const nb_view *x,
                                        int axis)
{
    const char *name = is_max ? "argmax" : "argmin";
    if (axis < 0)
        axis += x->ndim;
    if (axis < 0 || axis >= x->ndim)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is out of range for rank %d", name, axis, x->ndim);
    if (out->dtype != NB_I64)
        return nb__fail(NB_ERR_DTYPE, "%s: output must be i64, not %s", name, nb_dtype_name(out->dtype));
    if (out->ndim != x->ndim || !out->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: the output must be contiguous, of the input's rank, on %s", name,
                        c->dev->name);
    for (int d = 0; d < x->ndim; d++)
        if (out->shape[d] != (d == axis ? 1 : x->shape[d]))
            return nb__fail(NB_ERR_SHAPE, "%s: output dim %d is %lld, not %lld", name, d, (long long)out->shape[d],
                            (long long)(d == axis ? 1 : x->shape[d]));
    const int64_t K = out->numel, L = x->shape[axis], step = x->strides[axis];
    if (K <= 0)
        return NB_OK;
    if (L == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is empty", name, axis);
    RGeo g;
    std::memset(&g, 0, sizeof g);
    for (int d = 0; d < x->ndim; d++) {
        if (d == axis || x->shape[d] == 1)
            continue;
        g.kshape[g.nk] = x->shape[d];
        g.kst[g.nk++] = x->strides[d];
    }
    collapse_list(g.nk, g.kshape, g.kst);
    if (g.nk == 0) {
        g.nk = 1;
        g.kshape[0] = 1;
    }
    const char *xp = static_cast<const char *>(x->data);
    int64_t *op = static_cast<int64_t *>(out->data);
    return dispatch(x->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        // Few outputs for the card, each over a long axis (argmax over axis 0
        // of [60000, 10]): many threads per output.
        const bool few = K * 32 < (int64_t)c->phys->sm_count * 2048 && L >= 1024;
        if (few)
            return is_max ? arg_blocks<D, true>(c, g, xp, K, L, step, op, name)
                          : arg_blocks<D, false>(c, g, xp, K, L, step, op, name);
        const bool warp = L >= 32 && step == (int64_t)sizeof(T_of<D>);
        const unsigned blocks = grid_for(c, warp ? K * 32 : K);
        if (is_max) {
            if (warp)
                k_arg_reduce<D, true, true><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, L, step, op);
            else
                k_arg_reduce<D, true, false><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, L, step, op);
        } else {
            if (warp)
                k_arg_reduce<D, false, true><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, L, step, op);
            else
                k_arg_reduce<D, false, false><<<blocks, kThreads, 0, c->stream>>>(g, xp, K, L, step, op);
        }
        return nb__gpu_launched(c, name);
    });
}
