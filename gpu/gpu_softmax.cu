// softmax and log_softmax over the last dim of a contiguous input, and sparse
// softmax cross-entropy's rows with their gradient (at the end).
//
// One pass finds each row's max and sum of exponentials together (the "online"
// softmax: the running sum is rescaled when the max grows), a second writes the
// result, so a row is read twice. Rows up to 1024 long get one warp each,
// longer rows a block of 256 threads. Own kernel rather than cuDNN: it needs no
// descriptors, covers f16/bf16/f32/f64 and any row count. f16/bf16/f32 compute in
// float, f64 in double; every row's sum of exponentials adds in double, as the
// CPU's f32 does (in float a row of 2^20 drifted 25 ulp).
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

// A row's running max m (compute type C) and sum s of exp(x - m) (double).
template <class C> struct MaxSum {
    C m;
    double s;
};

template <class C> __device__ __forceinline__ void ms_add(MaxSum<C> &a, C v)
{
    if (v > a.m) {
        a.s = a.s * (double)m_exp(a.m - v) + 1.0; // exp(-inf) = 0 on the first element
        a.m = v;
    } else if (v != -cuda::std::numeric_limits<C>::infinity()) {
        a.s += (double)m_exp(v - a.m); // a NaN input lands here and makes the row NaN, as it should
    }
}

template <class C> __device__ __forceinline__ MaxSum<C> ms_merge(MaxSum<C> a, MaxSum<C> b)
{
    C m = a.m > b.m ? a.m : b.m;
    if (m == -cuda::std::numeric_limits<C>::infinity())
        return {m, a.s + b.s};
    return {m, a.s * (double)m_exp(a.m - m) + b.s * (double)m_exp(b.m - m)};
}

// The warp's rows merged: every lane gets lane 0's (m, s). The butterfly
// leaves each lane its own rounding of the sum (a * b + c d contracts into
// an fma taken from one side), so without the broadcast two equal logits of
// one row could be normalised by two different sums.
template <class C> __device__ __forceinline__ MaxSum<C> ms_warp(MaxSum<C> a)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum<C> b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
        a = ms_merge(a, b);
    }
    return {__shfl_sync(0xffffffffu, a.m, 0), __shfl_sync(0xffffffffu, a.s, 0)};
}

template <nb_dtype D, bool LOG>
__device__ __forceinline__ void write_row(const T_of<D> *x, T_of<D> *y, int64_t L, int lane, int lanes,
                                          MaxSum<typename DT<D>::Acc> ms)
{
    using C = typename DT<D>::Acc;
    const C inv = static_cast<C>(1.0 / ms.s), log_s = static_cast<C>(m_log(ms.s));
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

// ---- sparse softmax cross-entropy (backend.h: softmax_xent, softmax_xent_grad) ----
// The forward is softmax's first pass and one read of the label's logit:
// loss = -((x[label] - m) - log(s)), with (m, log s) kept per row for the
// gradient (in the compute type: f32 for f16 and bf16). The gradient is one
// elementwise pass, its row's values read from those stats. A label outside
// [0, C) reads nothing: a NaN loss, no -g; the forward records it as
// check_indices would (reported at the next synchronising call).

namespace {

template <nb_dtype D, class L>
__device__ __forceinline__ void xent_finish(const T_of<D> *xr, int64_t C, L label, MaxSum<typename DT<D>::Acc> ms,
                                            T_of<D> *loss, typename DT<D>::Acc *stats, int64_t row,
                                            const IndexCheck &chk)
{
    using A = typename DT<D>::Acc;
    const A log_s = static_cast<A>(m_log(ms.s));
    const bool in_range = label >= 0 && label < C;
    if (!in_range)
        flag_index(chk, row, (int64_t)label);
    const A y = in_range ? (static_cast<A>(ld<D>(xr[label])) - ms.m) - log_s
                         : cuda::std::numeric_limits<A>::quiet_NaN();
    loss[row] = st<D>(-y);
    stats[2 * row] = ms.m == -cuda::std::numeric_limits<A>::infinity() ? A(0) : ms.m; // the CPU's max of a -inf row
    stats[2 * row + 1] = log_s;
}

template <nb_dtype D, class L>
__global__ void __launch_bounds__(kThreads) k_xent_warp(const T_of<D> *x, const L *labels, T_of<D> *loss,
                                                        typename DT<D>::Acc *stats, int64_t rows, int64_t C,
                                                        IndexCheck chk)
{
    using A = typename DT<D>::Acc;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t row = gtid() >> 5; row < rows; row += nwarps) {
        const T_of<D> *xr = x + row * C;
        MaxSum<A> ms{-cuda::std::numeric_limits<A>::infinity(), A(0)};
        for (int64_t i = lane; i < C; i += 32)
            ms_add(ms, static_cast<A>(ld<D>(xr[i])));
        ms = ms_warp(ms);
        if (lane == 0)
            xent_finish<D, L>(xr, C, labels[row], ms, loss, stats, row, chk);
    }
}

template <nb_dtype D, class L>
__global__ void __launch_bounds__(kThreads) k_xent_block(const T_of<D> *x, const L *labels, T_of<D> *loss,
                                                         typename DT<D>::Acc *stats, int64_t rows, int64_t C,
                                                         IndexCheck chk)
{
    using A = typename DT<D>::Acc;
    __shared__ MaxSum<A> warps[kThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T_of<D> *xr = x + row * C;
        MaxSum<A> ms{-cuda::std::numeric_limits<A>::infinity(), A(0)};
        for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
            ms_add(ms, static_cast<A>(ld<D>(xr[i])));
        ms = ms_warp(ms);
        if (lane == 0)
            warps[warp] = ms;
        __syncthreads();
        if (threadIdx.x == 0) {
            ms = warps[0];
            for (int w = 1; w < kThreads / 32; w++)
                ms = ms_merge(ms, warps[w]);
            xent_finish<D, L>(xr, C, labels[row], ms, loss, stats, row, chk);
        }
        __syncthreads(); // warps[] is reused by the next row
    }
}

// dx = G - exp(y) s: G = -g at the label, 0 elsewhere; s = -g + 0 (the CPU's form).
template <nb_dtype D, class L, class Idx>
__global__ void __launch_bounds__(kThreads) k_xent_grad(const T_of<D> *x, const L *labels, const T_of<D> *g,
                                                        int64_t g_step, const typename DT<D>::Acc *stats,
                                                        T_of<D> *dx, Idx n, Idx C)
{
    using A = typename DT<D>::Acc;
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        const Idx row = i / C, k = i - row * C;
        const A gn = -static_cast<A>(ld<D>(g[(int64_t)row * g_step])), s = gn + A(0);
        const A p = m_exp((static_cast<A>(ld<D>(x[i])) - stats[2 * row]) - stats[2 * row + 1]);
        const A G = (int64_t)labels[row] == (int64_t)k ? gn : A(0);
        dx[i] = st<D>(G - p * s);
    }
}

bool xent_views_ok(const nb_view *x, const nb_view *labels, const nb_view *stats)
{
    const nb_dtype sdt = x->dtype == NB_F64 ? NB_F64 : NB_F32;
    return x->ndim == 2 && x->contiguous && labels->contiguous && stats->contiguous && labels->numel == x->shape[0] &&
           stats->numel == 2 * x->shape[0] && stats->dtype == sdt;
}

} // namespace

extern "C" nb_status nb__gpu_softmax_xent(nb_gpu_ctx *c, const nb_view *loss, const nb_view *stats, const nb_view *x,
                                          const nb_view *labels)
{
    const char *name = "sparse_softmax_cross_entropy";
    if (!xent_views_ok(x, labels, stats) || !loss->contiguous || loss->numel != x->shape[0] ||
        loss->dtype != x->dtype || (x->shape[0] > 0 && x->shape[1] < 1))
        return nb__fail(NB_ERR_INTERNAL, "%s: expects contiguous logits [N, C >= 1], labels and loss [N], stats [N, 2] on %s",
                        name, c->dev->name);
    const int64_t rows = x->shape[0], C = x->shape[1];
    if (rows == 0)
        return NB_OK;
    IndexCheck chk{nullptr, (unsigned long long)(uintptr_t)name, C};
    nb_status s = nb__gpu_index_error_record(c, &chk.err);
    if (s)
        return s;
    s = by_index(c, name, labels, [&](auto ltag) -> nb_status {
        using L = decltype(ltag);
        const L *lp = static_cast<const L *>(labels->data);
        return dispatch_float(x->dtype, c, name, [&](auto tag) -> nb_status {
            constexpr nb_dtype D = decltype(tag)::value;
            using A = typename DT<D>::Acc;
            const T_of<D> *xp = static_cast<const T_of<D> *>(x->data);
            T_of<D> *lo = static_cast<T_of<D> *>(loss->data);
            A *sp = static_cast<A *>(stats->data);
            if (C <= 1024) {
                k_xent_warp<D, L><<<grid_for(c, rows * 32), kThreads, 0, c->stream>>>(xp, lp, lo, sp, rows, C, chk);
            } else {
                const int64_t cap = (int64_t)c->phys->sm_count * (2048 / kThreads);
                const unsigned blocks = (unsigned)(rows < cap ? rows : cap);
                k_xent_block<D, L><<<blocks, kThreads, 0, c->stream>>>(xp, lp, lo, sp, rows, C, chk);
            }
            return nb__gpu_launched(c, name);
        });
    });
    nb__gpu_index_error_arm(c); // after a failure too: a kernel that ran before it may have flagged an index
    return s;
}

extern "C" nb_status nb__gpu_softmax_xent_grad(nb_gpu_ctx *c, const nb_view *dx, const nb_view *g, const nb_view *x,
                                               const nb_view *stats, const nb_view *labels)
{
    const char *name = "sparse_softmax_cross_entropy gradient";
    if (!xent_views_ok(x, labels, stats) || !dx->contiguous || dx->numel != x->numel || dx->dtype != x->dtype ||
        g->ndim != 1 || g->numel != x->shape[0] || g->dtype != x->dtype)
        return nb__fail(NB_ERR_INTERNAL, "%s: expects contiguous logits and dx [N, C], g [N], stats [N, 2] on %s", name,
                        c->dev->name);
    const int64_t n = x->numel, C = x->shape[1];
    if (n == 0)
        return NB_OK;
    return by_index(c, name, labels, [&](auto ltag) -> nb_status {
        using L = decltype(ltag);
        const L *lp = static_cast<const L *>(labels->data);
        return dispatch_float(x->dtype, c, name, [&](auto tag) -> nb_status {
            constexpr nb_dtype D = decltype(tag)::value;
            using A = typename DT<D>::Acc;
            const T_of<D> *xp = static_cast<const T_of<D> *>(x->data), *gp = static_cast<const T_of<D> *>(g->data);
            const int64_t g_step = g->strides[0] / (int64_t)sizeof(T_of<D>);
            const A *sp = static_cast<const A *>(stats->data);
            T_of<D> *dp = static_cast<T_of<D> *>(dx->data);
            if (n <= INT32_MAX)
                k_xent_grad<D, L, uint32_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(xp, lp, gp, g_step, sp, dp,
                                                                                        (uint32_t)n, (uint32_t)C);
            else
                k_xent_grad<D, L, uint64_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(xp, lp, gp, g_step, sp, dp,
                                                                                        (uint64_t)n, (uint64_t)C);
            return nb__gpu_launched(c, name);
        });
    });
}
