// softmax and log_softmax over the last dim of a contiguous input.
//
// One pass finds each row's max and sum of exponentials together (the "online"
// softmax: the running sum is rescaled when the max grows), a second writes the
// result, so a row is read twice. Rows up to 1024 long get one warp each,
// longer rows a block of 256 threads. Own kernel rather than cuDNN: it needs no
// descriptors, covers f16/bf16/f32/f64 and any row count. f16/bf16/f32 compute in
// float, f64 in double.
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

template <class C> struct MaxSum {
    C m, s;
};

template <class C> __device__ __forceinline__ void ms_add(MaxSum<C> &a, C v)
{
    if (v > a.m) {
        a.s = a.s * m_exp(a.m - v) + C(1); // exp(-inf) = 0 on the first element
        a.m = v;
    } else if (v != -cuda::std::numeric_limits<C>::infinity()) {
        a.s += m_exp(v - a.m); // a NaN input lands here and makes the row NaN, as it should
    }
}

template <class C> __device__ __forceinline__ MaxSum<C> ms_merge(MaxSum<C> a, MaxSum<C> b)
{
    C m = a.m > b.m ? a.m : b.m;
    if (m == -cuda::std::numeric_limits<C>::infinity())
        return {m, a.s + b.s};
    return {m, a.s * m_exp(a.m - m) + b.s * m_exp(b.m - m)};
}

template <class C> __device__ __forceinline__ MaxSum<C> ms_warp(MaxSum<C> a)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum<C> b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_merge(a, b);
    }
    return a; // every lane holds the row's result
}

template <nb_dtype D, bool LOG>
__device__ __forceinline__ void write_row(const T_of<D> *x, T_of<D> *y, int64_t L, int lane, int lanes,
                                          MaxSum<typename DT<D>::Acc> ms)
{
    using C = typename DT<D>::Acc;
    const C inv = C(1) / ms.s, log_s = m_log(ms.s);
    for (int64_t i = lane; i < L; i += lanes) {
        C v = static_cast<C>(ld<D>(x[i]));
        y[i] = st<D>(LOG ? v - ms.m - log_s : m_exp(v - ms.m) * inv);
    }
}

template <nb_dtype D, bool LOG>
__global__ void __launch_bounds__(kThreads) k_softmax_warp(const T_of<D> *x, T_of<D> *y, int64_t rows, int64_t L)
{
    using C = typename DT<D>::Acc;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t row = gtid() >> 5; row < rows; row += nwarps) {
        const T_of<D> *xr = x + row * L;
        MaxSum<C> ms{-cuda::std::numeric_limits<C>::infinity(), C(0)};
        for (int64_t i = lane; i < L; i += 32)
            ms_add(ms, static_cast<C>(ld<D>(xr[i])));
        ms = ms_warp(ms);
        write_row<D, LOG>(xr, y + row * L, L, lane, 32, ms);
    }
}

template <nb_dtype D, bool LOG>
__global__ void __launch_bounds__(kThreads) k_softmax_block(const T_of<D> *x, T_of<D> *y, int64_t rows, int64_t L)
{
    using C = typename DT<D>::Acc;
    __shared__ MaxSum<C> warps[kThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T_of<D> *xr = x + row * L;
        MaxSum<C> ms{-cuda::std::numeric_limits<C>::infinity(), C(0)};
        for (int64_t i = threadIdx.x; i < L; i += blockDim.x)
            ms_add(ms, static_cast<C>(ld<D>(xr[i])));
        ms = ms_warp(ms);
        if (lane == 0)
            warps[warp] = ms;
        __syncthreads();
        ms = warps[0];
        for (int w = 1; w < kThreads / 32; w++)
            ms = ms_merge(ms, warps[w]);
        __syncthreads(); // warps[] is reused by the next row
        write_row<D, LOG>(xr, y + row * L, L, threadIdx.x, blockDim.x, ms);
    }
}

} // namespace

extern "C" nb_status nb__gpu_softmax(nb_gpu_ctx *c, bool log, const nb_view *out, const nb_view *x)
{
    const char *name = log ? "log_softmax" : "softmax";
    if (x->numel <= 0)
        return NB_OK;
    if (x->ndim < 1 || !x->contiguous || !out->contiguous || out->numel != x->numel)
        return nb__fail(NB_ERR_INTERNAL, "%s: expects contiguous input and output of one shape on %s", name,
                        c->dev->name);
    const int64_t L = x->shape[x->ndim - 1], rows = x->numel / L;
    return dispatch_float(x->dtype, c, name, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        const T_of<D> *xp = static_cast<const T_of<D> *>(x->data);
        T_of<D> *yp = static_cast<T_of<D> *>(out->data);
        if (L <= 1024) {
            const unsigned blocks = grid_for(c, rows * 32);
            if (log)
                k_softmax_warp<D, true><<<blocks, kThreads, 0, c->stream>>>(xp, yp, rows, L);
            else
                k_softmax_warp<D, false><<<blocks, kThreads, 0, c->stream>>>(xp, yp, rows, L);
        } else {
            const int64_t cap = (int64_t)c->phys->sm_count * (2048 / kThreads);
            const unsigned blocks = (unsigned)(rows < cap ? rows : cap);
            if (log)
                k_softmax_block<D, true><<<blocks, kThreads, 0, c->stream>>>(xp, yp, rows, L);
            else
                k_softmax_block<D, false><<<blocks, kThreads, 0, c->stream>>>(xp, yp, rows, L);
        }
        return nb__gpu_launched(c, name);
    });
}
