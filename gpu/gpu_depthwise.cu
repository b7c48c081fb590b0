// Depthwise 2-d convolutions (groups == C: one input channel per group, K =
// C * M output channels, output channel k = c * M + m reading input channel c)
// and their data and filter gradients, f32/f64/f16/bf16: f16 and bf16 computed
// in float, f32 in float (never TF32), f64 in double. cuDNN's engines for
// groups == C are slow; these direct kernels take their place (gpu_conv.c).
//
// Every view is contiguous (lib/core/backend.h): x, dx [N, H, W, C] or
// [N, C, H, W]; y, dy [N, P, Q, K] or [N, K, P, Q]; the filter HWIO
// [R, S, 1, K], tap (r, s) of output channel k at (r * S + s) * K + k.
// Output row p reads input rows p * sh - pt + r * dh, those outside [0, H)
// being zeros (columns alike); any R, S, strides, dilations and pads.
//
//   forward        one thread per output element (NHWC: a run of 4 output
//                  columns of one channel, the filter taps loaded once for
//                  the four); consecutive threads take consecutive channels
//                  (NHWC) or columns (NCHW), so loads and stores coalesce.
//   backward data  the same gather from the other side: each input element
//                  sums the outputs that read it, found by solving
//                  h = p * sh - pt + r * dh for p (only where divisible).
//   backward filter for each tap and channel a sum over the N * P * Q output
//                  positions: the positions are cut into slices, one block
//                  per slice sums its share into a partial in scratch (fixed
//                  order within the block), then a second kernel adds the
//                  partials of every slice in slice order. No atomics: the
//                  bits depend on the shape alone, so deterministic mode and
//                  captured replays repeat them.
// A 3x3 filter on NHWC data, the layer of mobile networks, gets loops the
// compiler unrolls. Indices are 32-bit when every tensor and coordinate fits
// (cheaper divisions), 64-bit otherwise. Scratch comes from the caching
// allocator in stream order; nothing waits for the host.
#include "gpu_kernels.cuh"

#include <algorithm>

using namespace nbg;

namespace {

struct DwGeo {
    int64_t N, H, W, C, K, M, R, S, P, Q;
    int sh, sw, dh, dw, pt, pl;
};

// Output columns (forward) or input columns (backward data) per NHWC thread.
constexpr int kRun = 4;

// ---- forward --------------------------------------------------------------------

// y[n, p, q, k] = sum over (r, s) of x[n, p*sh - pt + r*dh, q*sw - pl + s*dw, k / M] * f[r, s, k].
// A thread takes output columns q0 .. q0 + RUN - 1 of (n, p, k); RUN is 1 for NCHW.
template <nb_dtype D, class I, bool NCHW, int KR, int KS, int RUN>
__global__ void __launch_bounds__(kThreads)
    k_dw_forward(DwGeo g, const T_of<D> *__restrict__ x, const T_of<D> *__restrict__ f, T_of<D> *__restrict__ y,
                 int64_t total)
{
    using A = typename DT<D>::Acc;
    const I H = (I)g.H, W = (I)g.W, C = (I)g.C, K = (I)g.K, M = (I)g.M, P = (I)g.P, Q = (I)g.Q;
    const I R = KR > 0 ? (I)KR : (I)g.R, S = KS > 0 ? (I)KS : (I)g.S;
    const I QR = (Q + RUN - 1) / RUN; // runs per output row
    for (int64_t i = gtid(); i < total; i += gstride()) {
        I j = (I)i, n, p, qr, k;
        if constexpr (NCHW) {
            qr = j % QR, j /= QR, p = j % P, j /= P, k = j % K, n = j / K;
        } else {
            k = j % K, j /= K, qr = j % QR, j /= QR, p = j % P, n = j / P;
        }
        const I c = M == 1 ? k : k / M;
        const I q0 = qr * RUN, h0 = p * g.sh - g.pt;
        A acc[RUN];
#pragma unroll
        for (int t = 0; t < RUN; t++)
            acc[t] = A(0);
#pragma unroll
        for (I r = 0; r < R; r++) {
            const I h = h0 + r * g.dh;
            if (h < 0 || h >= H)
                continue;
            // the start of input row h of (n, c): element (n, h, 0, c) or (n, c, h, 0)
            const I row = NCHW ? ((n * C + c) * H + h) * W : (n * H + h) * W * C + c;
#pragma unroll
            for (I s = 0; s < S; s++) {
                const A fv = static_cast<A>(ld<D>(f[(r * S + s) * K + k]));
#pragma unroll
                for (int t = 0; t < RUN; t++) {
                    const I q = q0 + t, w = q * g.sw - g.pl + s * g.dw;
                    if (q < Q && w >= 0 && w < W)
                        acc[t] += static_cast<A>(ld<D>(x[NCHW ? row + w : row + w * C])) * fv;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RUN; t++) {
            const I q = q0 + t;
            if (q < Q)
                y[NCHW ? ((n * K + k) * P + p) * Q + q : ((n * P + p) * Q + q) * K + k] = st<D>(acc[t]);
        }
    }
}

// ---- backward data ----------------------------------------------------------------

// The output index o with o * stride - pad + tap * dil == i, or -1 when none
// is in [0, lim): i + pad - tap * dil must be a non-negative multiple of stride.
template <class I> __device__ __forceinline__ I dw_source(I i, I tap, int stride, int pad, int dil, I lim)
{
    const I num = i + pad - tap * dil;
    if (num < 0)
        return -1;
    I o = num;
    if (stride != 1) {
        o = num / stride;
        if (o * stride != num)
            return -1;
    }
    return o < lim ? o : -1;
}

// dx[n, h, w, c] = sum over (r, s, m) of dy[n, p, q, c*M + m] * f[r, s, c*M + m]
// over the (p, q) with p*sh - pt + r*dh == h and q*sw - pl + s*dw == w. A
// thread takes input columns w0 .. w0 + RUN - 1 of (n, h, c); RUN is 1 for NCHW.
template <nb_dtype D, class I, bool NCHW, int KR, int KS, int RUN>
__global__ void __launch_bounds__(kThreads)
    k_dw_backward_data(DwGeo g, const T_of<D> *__restrict__ dy, const T_of<D> *__restrict__ f,
                       T_of<D> *__restrict__ dx, int64_t total)
{
    using A = typename DT<D>::Acc;
    const I H = (I)g.H, W = (I)g.W, C = (I)g.C, K = (I)g.K, M = (I)g.M, P = (I)g.P, Q = (I)g.Q;
    const I R = KR > 0 ? (I)KR : (I)g.R, S = KS > 0 ? (I)KS : (I)g.S;
    const I WR = (W + RUN - 1) / RUN; // runs per input row
    const I kstep = NCHW ? P * Q : 1;   // from output channel k to k + 1 in dy
    for (int64_t i = gtid(); i < total; i += gstride()) {
        I j = (I)i, n, h, wr, c;
        if constexpr (NCHW) {
            wr = j % WR, j /= WR, h = j % H, j /= H, c = j % C, n = j / C;
        } else {
            c = j % C, j /= C, wr = j % WR, j /= WR, h = j % H, n = j / H;
        }
        const I w0 = wr * RUN, k0 = c * M;
        A acc[RUN];
#pragma unroll
        for (int t = 0; t < RUN; t++)
            acc[t] = A(0);
#pragma unroll
        for (I r = 0; r < R; r++) {
            const I p = dw_source<I>(h, r, g.sh, g.pt, g.dh, P);
            if (p < 0)
                continue;
            // dy at (n, p, 0, k0) or (n, k0, p, 0)
            const I row = NCHW ? ((n * K + k0) * P + p) * Q : (n * P + p) * Q * K + k0;
#pragma unroll
            for (I s = 0; s < S; s++) {
                const T_of<D> *ft = f + (r * S + s) * K + k0;
#pragma unroll
                for (int t = 0; t < RUN; t++) {
                    const I w = w0 + t;
                    const I q = w < W ? dw_source<I>(w, s, g.sw, g.pl, g.dw, Q) : I(-1);
                    if (q < 0)
                        continue;
                    const T_of<D> *o = dy + (NCHW ? row + q : row + q * K);
                    A v = static_cast<A>(ld<D>(o[0])) * static_cast<A>(ld<D>(ft[0]));
                    for (I m = 1; m < M; m++)
                        v += static_cast<A>(ld<D>(o[m * kstep])) * static_cast<A>(ld<D>(ft[m]));
                    acc[t] += v;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RUN; t++) {
            const I w = w0 + t;
            if (w < W)
                dx[NCHW ? ((n * C + c) * H + h) * W + w : ((n * H + h) * W + w) * C + c] = st<D>(acc[t]);
        }
    }
}

// ---- backward filter ----------------------------------------------------------------

// Output positions (n, p, q) numbered pos = (n * P + p) * Q + q are cut into
// slices of `chunk`; block (column block, slice) writes
// part[(slice * R * S + tap) * K + k], the sum over its slice of
// x[n, p*sh - pt + r*dh, q*sw - pl + s*dw, k / M] * dy[n, p, q, k].
constexpr int kLanes = 32; // NHWC: threads across channels
constexpr int kRows = 8;   // NHWC: threads across positions (kLanes * kRows == kThreads)
static_assert(kLanes * kRows == kThreads, "the filter kernels' blocks are kThreads");

// NHWC: threadIdx.x a channel of the column block, threadIdx.y every
// kRows-th position of the slice. With KR > 0 every tap is summed at once
// (blockIdx.x = the column block); otherwise one tap per block (blockIdx.x =
// tap * kblocks + column block).
template <nb_dtype D, class I, int KR, int KS>
__global__ void __launch_bounds__(kThreads)
    k_dw_filter_nhwc(DwGeo g, const T_of<D> *__restrict__ x, const T_of<D> *__restrict__ dy,
                     typename DT<D>::Acc *__restrict__ part, int64_t kblocks, int64_t chunk)
{
    using A = typename DT<D>::Acc;
    constexpr int NT = KR > 0 ? KR * KS : 1; // taps per block
    const I H = (I)g.H, W = (I)g.W, C = (I)g.C, K = (I)g.K, M = (I)g.M, P = (I)g.P, Q = (I)g.Q;
    const I S = KS > 0 ? (I)KS : (I)g.S, RS = (I)(g.R * g.S);
    const I L = (I)(g.N * g.P * g.Q);
    const I tap0 = KR > 0 ? I(0) : (I)(blockIdx.x / kblocks);
    const I k = (I)(blockIdx.x % kblocks) * kLanes + (I)threadIdx.x;
    const int64_t stop = ((int64_t)blockIdx.y + 1) * chunk, end = stop < (int64_t)L ? stop : (int64_t)L;
    const I lo = (I)((int64_t)blockIdx.y * chunk), hi = (I)end;
    A acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = A(0);
    if (k < K) {
        const I c = M == 1 ? k : k / M;
        for (I pos = lo + (I)threadIdx.y; pos < hi; pos += kRows) {
            const I q = pos % Q, np = pos / Q, p = np % P, n = np / P;
            const A gy = static_cast<A>(ld<D>(dy[pos * K + k]));
            const I h0 = p * g.sh - g.pt, w0 = q * g.sw - g.pl;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const I tap = tap0 + t, r = tap / S, s = tap - r * S;
                const I h = h0 + r * g.dh, w = w0 + s * g.dw;
                if (h >= 0 && h < H && w >= 0 && w < W)
                    acc[t] += static_cast<A>(ld<D>(x[((n * H + h) * W + w) * C + c])) * gy;
            }
        }
    }
    // the kRows partial sums of each channel, added in row order
    __shared__ A sum[kRows][kLanes];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        sum[threadIdx.y][threadIdx.x] = acc[t];
        __syncthreads();
        if (threadIdx.y == 0 && k < K) {
            A v = sum[0][threadIdx.x];
            for (int j = 1; j < kRows; j++)
                v += sum[j][threadIdx.x];
            part[((int64_t)blockIdx.y * RS + tap0 + t) * (int64_t)K + k] = v;
        }
        __syncthreads();
    }
}

// NCHW: one block per (tap, channel) and slice, blockIdx.x = tap * K + k; the
// threads take consecutive positions (consecutive columns in memory) and
// their sums meet in a fixed tree.
template <nb_dtype D, class I>
__global__ void __launch_bounds__(kThreads)
    k_dw_filter_nchw(DwGeo g, const T_of<D> *__restrict__ x, const T_of<D> *__restrict__ dy,
                     typename DT<D>::Acc *__restrict__ part, int64_t chunk)
{
    using A = typename DT<D>::Acc;
    const I H = (I)g.H, W = (I)g.W, C = (I)g.C, K = (I)g.K, M = (I)g.M, P = (I)g.P, Q = (I)g.Q, S = (I)g.S;
    const I RS = (I)(g.R * g.S), L = (I)(g.N * g.P * g.Q);
    const I tap = (I)(blockIdx.x / (unsigned)g.K), k = (I)(blockIdx.x % (unsigned)g.K);
    const I r = tap / S, s = tap - r * S, c = M == 1 ? k : k / M;
    const int64_t stop = ((int64_t)blockIdx.y + 1) * chunk, end = stop < (int64_t)L ? stop : (int64_t)L;
    const I lo = (I)((int64_t)blockIdx.y * chunk), hi = (I)end;
    A acc = A(0);
    for (I pos = lo + (I)threadIdx.x; pos < hi; pos += kThreads) {
        const I q = pos % Q, np = pos / Q, p = np % P, n = np / P;
        const I h = p * g.sh - g.pt + r * g.dh, w = q * g.sw - g.pl + s * g.dw;
        if (h >= 0 && h < H && w >= 0 && w < W)
            acc += static_cast<A>(ld<D>(x[((n * C + c) * H + h) * W + w])) *
                   static_cast<A>(ld<D>(dy[((n * K + k) * P + p) * Q + q]));
    }
    __shared__ A sum[kThreads];
    sum[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
            sum[threadIdx.x] += sum[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[((int64_t)blockIdx.y * RS + tap) * (int64_t)K + k] = sum[0];
}

// dw[col] = the sum over slices of part[slice * cols + col], cols = R * S * K:
// thread row y adds the slices y, y + kRows, ... in order, then row 0 adds the
// rows in order.
template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_dw_filter_sum(const typename DT<D>::Acc *__restrict__ part, T_of<D> *__restrict__ dw, int64_t cols,
                    int64_t slices)
{
    using A = typename DT<D>::Acc;
    const int64_t col = (int64_t)blockIdx.x * kLanes + threadIdx.x;
    A v = A(0);
    if (col < cols)
        for (int64_t sl = threadIdx.y; sl < slices; sl += kRows)
            v += part[sl * cols + col];
    __shared__ A sum[kRows][kLanes];
    sum[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        A t = sum[0][threadIdx.x];
        for (int j = 1; j < kRows; j++)
            t += sum[j][threadIdx.x];
        dw[col] = st<D>(t);
    }
}

// ---- host side ----------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

DwGeo geo_of(const nb_conv2d_desc *d)
{
    return DwGeo{d->N, d->H, d->W, d->C, d->K, d->K / d->C, d->R, d->S, d->P, d->Q,
                 d->stride[0], d->stride[1], d->dilation[0], d->dilation[1], d->pad[0], d->pad[1]};
}

// Whether every index and coordinate the kernels form fits in int32: the
// tensors' element counts, and rows and columns before their range checks
// (an output row's first input row, p * sh - pt + r * dh, and the runs past
// the last column).
bool fits_int32(const nb_conv2d_desc *d)
{
    const int64_t lim = INT32_MAX;
    const int64_t nx = d->N * d->H * d->W * d->C, ny = d->N * d->P * d->Q * d->K, nw = d->R * d->S * d->K;
    const int64_t span_h = (int64_t)d->dilation[0] * (d->R - 1) + 1, span_w = (int64_t)d->dilation[1] * (d->S - 1) + 1;
    int64_t rows, cols;
    if (__builtin_mul_overflow(d->P + kRun, (int64_t)d->stride[0], &rows) ||
        __builtin_mul_overflow(d->Q + kRun, (int64_t)d->stride[1], &cols))
        return false;
    const int64_t need[] = {nx + kThreads, ny + kThreads, nw,
                            rows + d->pad[0] + span_h, cols + d->pad[1] + span_w,
                            d->H + kRun + d->pad[0] + span_h, d->W + kRun + d->pad[1] + span_w};
    for (int64_t v : need)
        if (v > lim)
            return false;
    return true;
}

bool is_3x3(const nb_conv2d_desc *d) { return d->R == 3 && d->S == 3; }

template <nb_dtype D, class I>
void launch_forward(nb_gpu_ctx *c, const nb_conv2d_desc *d, const T_of<D> *x, const T_of<D> *f, T_of<D> *y)
{
    const DwGeo g = geo_of(d);
    if (d->nchw) {
        const int64_t total = d->N * d->K * d->P * d->Q;
        k_dw_forward<D, I, true, 0, 0, 1><<<grid_for(c, total), kThreads, 0, c->stream>>>(g, x, f, y, total);
        return;
    }
    const int64_t total = d->N * d->P * ceil_div(d->Q, kRun) * d->K;
    if (is_3x3(d))
        k_dw_forward<D, I, false, 3, 3, kRun><<<grid_for(c, total), kThreads, 0, c->stream>>>(g, x, f, y, total);
    else
        k_dw_forward<D, I, false, 0, 0, kRun><<<grid_for(c, total), kThreads, 0, c->stream>>>(g, x, f, y, total);
}

template <nb_dtype D, class I>
void launch_backward_data(nb_gpu_ctx *c, const nb_conv2d_desc *d, const T_of<D> *dy, const T_of<D> *f,
                          T_of<D> *dx)
{
    const DwGeo g = geo_of(d);
    if (d->nchw) {
        const int64_t total = d->N * d->C * d->H * d->W;
        k_dw_backward_data<D, I, true, 0, 0, 1><<<grid_for(c, total), kThreads, 0, c->stream>>>(g, dy, f, dx, total);
        return;
    }
    const int64_t total = d->N * d->H * ceil_div(d->W, kRun) * d->C;
    if (is_3x3(d))
        k_dw_backward_data<D, I, false, 3, 3, kRun>
            <<<grid_for(c, total), kThreads, 0, c->stream>>>(g, dy, f, dx, total);
    else
        k_dw_backward_data<D, I, false, 0, 0, kRun>
            <<<grid_for(c, total), kThreads, 0, c->stream>>>(g, dy, f, dx, total);
}

// The backward filter's partition, from the shape alone (so the sums' order,
// and their bits, do not depend on the card): about kTargetBlocks blocks in
// the first pass, each slice at least kMinSlice positions.
constexpr int64_t kTargetBlocks = 1024;
struct FilterPlan {
    bool all_taps;   // NHWC 3x3: every tap in one block
    int64_t kblocks; // NHWC: column blocks of kLanes channels
    int64_t gridx;   // blocks across taps and channels
    int64_t slices, chunk;
};

FilterPlan filter_plan(const nb_conv2d_desc *d)
{
    FilterPlan fp;
    const int64_t L = d->N * d->P * d->Q, RS = d->R * d->S;
    int64_t min_slice;
    fp.all_taps = !d->nchw && is_3x3(d);
    if (d->nchw) {
        fp.kblocks = 0;
        fp.gridx = RS * d->K; // the caller checked that the filter's count fits in int32
        min_slice = 4 * kThreads;
    } else {
        fp.kblocks = ceil_div(d->K, kLanes);
        fp.gridx = fp.kblocks * (fp.all_taps ? 1 : RS);
        min_slice = 8 * kRows;
    }
    fp.slices = std::max<int64_t>(1, std::min(ceil_div(L, min_slice), ceil_div(kTargetBlocks, fp.gridx)));
    fp.chunk = ceil_div(L, fp.slices);
    fp.slices = ceil_div(L, fp.chunk); // no empty slice
    return fp;
}

template <nb_dtype D, class I>
void launch_filter_partials(nb_gpu_ctx *c, const nb_conv2d_desc *d, const FilterPlan &fp, const T_of<D> *x,
                            const T_of<D> *dy, typename DT<D>::Acc *part)
{
    const DwGeo g = geo_of(d);
    const dim3 grid((unsigned)fp.gridx, (unsigned)fp.slices);
    if (d->nchw)
        k_dw_filter_nchw<D, I><<<grid, kThreads, 0, c->stream>>>(g, x, dy, part, fp.chunk);
    else if (fp.all_taps)
        k_dw_filter_nhwc<D, I, 3, 3><<<grid, dim3(kLanes, kRows), 0, c->stream>>>(g, x, dy, part, fp.kblocks, fp.chunk);
    else
        k_dw_filter_nhwc<D, I, 0, 0><<<grid, dim3(kLanes, kRows), 0, c->stream>>>(g, x, dy, part, fp.kblocks, fp.chunk);
}

} // namespace

extern "C" bool nb__gpu_depthwise_applies(const nb_conv2d_desc *d)
{
    return d->groups > 1 && d->groups == d->C;
}

extern "C" nb_status nb__gpu_depthwise_forward(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *y,
                                               const nb_view *x, const nb_view *w)
{
    const bool narrow = fits_int32(d);
    return launch_float(c, "conv2d", y->dtype, y->numel, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        if (narrow)
            launch_forward<D, int32_t>(c, d, in_ptr<D>(x), in_ptr<D>(w), out_ptr<D>(y));
        else
            launch_forward<D, int64_t>(c, d, in_ptr<D>(x), in_ptr<D>(w), out_ptr<D>(y));
    });
}

extern "C" nb_status nb__gpu_depthwise_backward_data(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dx,
                                                     const nb_view *dy, const nb_view *w)
{
    const bool narrow = fits_int32(d);
    return launch_float(c, "conv2d_backward_data", dx->dtype, dx->numel, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        if (narrow)
            launch_backward_data<D, int32_t>(c, d, in_ptr<D>(dy), in_ptr<D>(w), out_ptr<D>(dx));
        else
            launch_backward_data<D, int64_t>(c, d, in_ptr<D>(dy), in_ptr<D>(w), out_ptr<D>(dx));
    });
}

extern "C" nb_status nb__gpu_depthwise_backward_filter(nb_gpu_ctx *c, const nb_conv2d_desc *d, const nb_view *dw,
                                                       const nb_view *x, const nb_view *dy)
{
    const char *op = "conv2d_backward_filter";
    if (dw->numel <= 0)
        return NB_OK;
    const int64_t cols = d->R * d->S * d->K; // dw's elements
    if (cols > INT32_MAX)
        return nb__fail(NB_ERR_UNSUPPORTED, "%s: a depthwise filter of %lld x %lld x 1 x %lld is too large for %s", op,
                        (long long)d->R, (long long)d->S, (long long)d->K, c->dev->name);
    const FilterPlan fp = filter_plan(d);
    const bool narrow = fits_int32(d);
    return dispatch_float(dw->dtype, c, op, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        using A = typename DT<D>::Acc;
        size_t bytes;
        if (__builtin_mul_overflow((size_t)fp.slices, (size_t)cols, &bytes) ||
            __builtin_mul_overflow(bytes, sizeof(A), &bytes))
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %lld partial filter gradients of %lld elements are too large",
                            op, (long long)fp.slices, (long long)cols);
        Scratch part(c, bytes);
        if (!part.p)
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        A *pp = static_cast<A *>(part.p);
        if (narrow)
            launch_filter_partials<D, int32_t>(c, d, fp, in_ptr<D>(x), in_ptr<D>(dy), pp);
        else
            launch_filter_partials<D, int64_t>(c, d, fp, in_ptr<D>(x), in_ptr<D>(dy), pp);
        nb_status st = nb__gpu_launched(c, op);
        if (st)
            return st;
        k_dw_filter_sum<D><<<(unsigned)ceil_div(cols, kLanes), dim3(kLanes, kRows), 0, c->stream>>>(
            pp, out_ptr<D>(dw), cols, fp.slices);
        return nb__gpu_launched(c, op);
    });
}
