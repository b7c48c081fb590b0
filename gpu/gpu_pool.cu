// 2-d max and average pooling and their gradients, f32/f64/f16/bf16 (f16 and
// bf16 computed in float, f64 in double).
//
// Simple kernels, one thread per element of the result:
//   forward: one thread per output element scans its window;
//   gradients: one thread per input element gathers from the output windows
//   that cover it (for max pooling, those whose first maximum it is, found by
//   scanning the window again), so no atomics are needed and the result is
//   deterministic.
// Every view is contiguous; the descriptor (lib/core/backend.h) gives the
// shapes and the layout (NHWC or NCHW).
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

struct PoolGeo {
    int64_t N, H, W, C, P, Q, R, S, sh, sw, pt, pl;
    bool nchw;
};

__device__ __forceinline__ int64_t at(const PoolGeo &g, int64_t n, int64_t h, int64_t w, int64_t ch, int64_t Hd,
                                      int64_t Wd)
{
    return g.nchw ? ((n * g.C + ch) * Hd + h) * Wd + w : ((n * Hd + h) * Wd + w) * g.C + ch;
}

// Splits a flat index of an [N, Hd, Wd, C] (or NCHW) tensor.
__device__ __forceinline__ void split(const PoolGeo &g, int64_t i, int64_t Hd, int64_t Wd, int64_t &n, int64_t &h,
                                      int64_t &w, int64_t &ch)
{
    if (g.nchw) {
        w = i % Wd;
        i /= Wd;
        h = i % Hd;
        i /= Hd;
        ch = i % g.C;
        n = i / g.C;
    } else {
        ch = i % g.C;
        i /= g.C;
        w = i % Wd;
        i /= Wd;
        h = i % Hd;
        n = i / Hd;
    }
}

// The window of output (p, q) inside the image: rows [h0 + r0, h0 + r1).
__device__ __forceinline__ void window(const PoolGeo &g, int64_t p, int64_t q, int64_t &h0, int64_t &r0, int64_t &r1,
                                       int64_t &w0, int64_t &s0, int64_t &s1)
{
    h0 = p * g.sh - g.pt;
    r0 = h0 < 0 ? -h0 : 0;
    r1 = g.H - h0 < g.R ? g.H - h0 : g.R;
    w0 = q * g.sw - g.pl;
    s0 = w0 < 0 ? -w0 : 0;
    s1 = g.W - w0 < g.S ? g.W - w0 : g.S;
}

// The flat input index of the first maximum (NaN winning) of window (n, p, q, ch).
template <nb_dtype D>
__device__ int64_t argmax(const PoolGeo &g, const T_of<D> *x, int64_t n, int64_t p, int64_t q, int64_t ch)
{
    using C = C_of<D>;
    int64_t h0, r0, r1, w0, s0, s1;
    window(g, p, q, h0, r0, r1, w0, s0, s1);
    int64_t best = at(g, n, h0 + r0, w0 + s0, ch, g.H, g.W);
    C m = ld<D>(x[best]);
    if (m_isnan(m))
        return best;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t s = s0; s < s1; s++) {
            int64_t o = at(g, n, h0 + r, w0 + s, ch, g.H, g.W);
            C v = ld<D>(x[o]);
            if (v > m || m_isnan(v)) {
                m = v;
                best = o;
                if (m_isnan(v))
                    return best;
            }
        }
    return best;
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_max_pool(PoolGeo g, const T_of<D> *x, const T_of<D> *sel, T_of<D> *out, int64_t total)
{
    for (int64_t i = gtid(); i < total; i += gstride()) {
        int64_t n, p, q, ch;
        split(g, i, g.P, g.Q, n, p, q, ch);
        int64_t a = argmax<D>(g, x, n, p, q, ch);
        out[i] = sel ? sel[a] : x[a];
    }
}

// The output rows p whose windows cover input row h: [lo, hi].
__device__ __forceinline__ void covering(int64_t h, int64_t pad, int64_t R, int64_t stride, int64_t P, int64_t &lo,
                                         int64_t &hi)
{
    int64_t t = h + pad; // p * stride <= t and p * stride + R > t
    lo = t - R + 1 <= 0 ? 0 : (t - R + 1 + stride - 1) / stride;
    hi = t / stride;
    if (hi > P - 1)
        hi = P - 1;
}

// Input element i of a gradient kernel: its image n and channel ch, and the
// output windows that cover it, rows [plo, phi] by columns [qlo, qhi].
struct Covered {
    int64_t n, ch, plo, phi, qlo, qhi;
};

__device__ __forceinline__ Covered covered(const PoolGeo &g, int64_t i)
{
    Covered c;
    int64_t h, w;
    split(g, i, g.H, g.W, c.n, h, w, c.ch);
    covering(h, g.pt, g.R, g.sh, g.P, c.plo, c.phi);
    covering(w, g.pl, g.S, g.sw, g.Q, c.qlo, c.qhi);
    return c;
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_max_pool_grad(PoolGeo g, const T_of<D> *x, const T_of<D> *dy, T_of<D> *out, int64_t total)
{
    using A = typename DT<D>::Acc;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        const Covered c = covered(g, i);
        A sum = A(0);
        for (int64_t p = c.plo; p <= c.phi; p++)
            for (int64_t q = c.qlo; q <= c.qhi; q++)
                if (argmax<D>(g, x, c.n, p, q, c.ch) == i)
                    sum += static_cast<A>(ld<D>(dy[at(g, c.n, p, q, c.ch, g.P, g.Q)]));
        out[i] = st<D>(sum);
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads) k_avg_pool(PoolGeo g, const T_of<D> *x, T_of<D> *out, int64_t total)
{
    using A = typename DT<D>::Acc;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        int64_t n, p, q, ch;
        split(g, i, g.P, g.Q, n, p, q, ch);
        int64_t h0, r0, r1, w0, s0, s1;
        window(g, p, q, h0, r0, r1, w0, s0, s1);
        A sum = A(0);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t s = s0; s < s1; s++)
                sum += static_cast<A>(ld<D>(x[at(g, n, h0 + r, w0 + s, ch, g.H, g.W)]));
        // the CPU's rounding: the sum times the window's 1 / count
        out[i] = st<D>(mul_rn(sum, A(1) / static_cast<A>((r1 - r0) * (s1 - s0))));
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads) k_avg_pool_grad(PoolGeo g, const T_of<D> *dy, T_of<D> *out, int64_t total)
{
    using A = typename DT<D>::Acc;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        const Covered c = covered(g, i);
        A sum = A(0);
        for (int64_t p = c.plo; p <= c.phi; p++)
            for (int64_t q = c.qlo; q <= c.qhi; q++) {
                int64_t h0, r0, r1, w0, s0, s1;
                window(g, p, q, h0, r0, r1, w0, s0, s1);
                const A inv = A(1) / static_cast<A>((r1 - r0) * (s1 - s0)); // as the CPU rounds it
                sum = add_rn(sum, mul_rn(static_cast<A>(ld<D>(dy[at(g, c.n, p, q, c.ch, g.P, g.Q)])), inv));
            }
        out[i] = st<D>(sum);
    }
}

PoolGeo geo_of(const nb_pool2d_desc *d)
{
    return PoolGeo{d->N, d->H, d->W, d->C, d->P, d->Q, d->R, d->S, d->sh, d->sw, d->pt, d->pl, d->nchw};
}

} // namespace

extern "C" nb_status nb__gpu_max_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                        const nb_view *x, const nb_view *sel)
{
    const int64_t total = out->numel;
    return launch_float(c, sel ? "max_pool2d_select" : "max_pool2d", x->dtype, total, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_max_pool<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(geo_of(d), in_ptr<D>(x), in_ptr<D>(sel),
                                                                       out_ptr<D>(out), total);
    });
}

extern "C" nb_status nb__gpu_max_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                             const nb_view *x, const nb_view *dy)
{
    const int64_t total = out->numel;
    return launch_float(c, "max_pool2d_grad", x->dtype, total, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_max_pool_grad<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(geo_of(d), in_ptr<D>(x), in_ptr<D>(dy),
                                                                            out_ptr<D>(out), total);
    });
}

extern "C" nb_status nb__gpu_avg_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                        const nb_view *x)
{
    const int64_t total = out->numel;
    return launch_float(c, "avg_pool2d", x->dtype, total, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_avg_pool<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(geo_of(d), in_ptr<D>(x), out_ptr<D>(out),
                                                                       total);
    });
}

extern "C" nb_status nb__gpu_avg_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                             const nb_view *dy)
{
    const int64_t total = out->numel;
    return launch_float(c, "avg_pool2d_grad", dy->dtype, total, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_avg_pool_grad<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(geo_of(d), in_ptr<D>(dy),
                                                                            out_ptr<D>(out), total);
    });
}

// ---- per-channel kernels (batch normalisation) --------------------------------------
//
// channel_moments: two passes. The first writes per-block partial sums (p0 =
// sum a, p1 = the moment's sum) in the accumulator type into scratch laid out
// [C][L], a channel's L partials side by side; the second gives each channel a
// warp that adds them in a fixed order (no float atomics, so the result is the
// same from run to run) and applies the final formula. How the first pass cuts
// the work depends on inner:
//   inner < 32 (NHWC: inner 1): the tensor is rows of K = C * inner columns. A
//     block covers up to 32 neighbouring columns of a chunk of rows, so a warp
//     reads contiguous memory; one block per channel would read with stride
//     C and leave most of the card idle for small C. L = inner * row chunks.
//   otherwise (NCHW): each channel's outer planes of inner contiguous elements
//     are cut into L ranges, a block each, so that few channels still fill
//     the card.
// Sums are double for f64 and f32, float for f16/bf16 (MomentAcc).
// channel_affine: one thread per element.

namespace {

template <nb_dtype D, class A>
__device__ __forceinline__ void moment_add(const T_of<D> *a, const T_of<D> *b, int64_t at, A m, A &p0, A &p1)
{
    const A x = static_cast<A>(ld<D>(a[at]));
    p0 += x;
    if (b) {
        p1 += x * (static_cast<A>(ld<D>(b[at])) - m);
    } else {
        const A d = x - m;
        p1 += d * d;
    }
}

// Rows [s * chunk, (s + 1) * chunk) of an [outer, K] tensor (K = C * inner),
// s = blockIdx.y, for tiles of tx columns; thread t takes column t % tx and
// every ty-th row from t / tx. tx * ty <= blockDim.x; tx = K when K < 32, so
// that a warp still reads contiguous rows. Column k's partial goes to
// part[k * S + s] (and part[K * S + k * S + s]).
template <nb_dtype D, class A>
__global__ void __launch_bounds__(kThreads)
    k_moments_rows(int64_t outer, int64_t K, int64_t inner, int64_t chunk, int64_t S, int tx, int ty,
                   const T_of<D> *a, const T_of<D> *b, const T_of<D> *center, A *part)
{
    __shared__ A s0[kThreads], s1[kThreads];
    const int t = threadIdx.x, x = t % tx, y = t / tx;
    const int64_t s = blockIdx.y, r0 = s * chunk, r1 = outer - r0 < chunk ? outer : r0 + chunk;
    const int64_t ntiles = (K + tx - 1) / tx, step = (int64_t)ty * K;
    int top = 1; // the largest power of two below ty (1 when ty is 1)
    while (2 * top < ty)
        top *= 2;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t k = tile * tx + x;
        A p0 = A(0), p1 = A(0);
        if (y < ty && k < K) {
            const int64_t ch = inner == 1 ? k : k / inner;
            const A m = center ? static_cast<A>(ld<D>(center[ch])) : A(0);
            for (int64_t r = r0 + y, at = r * K + k; r < r1; r += ty, at += step)
                moment_add<D, A>(a, b, at, m, p0, p1);
        }
        s0[t] = p0;
        s1[t] = p1;
        __syncthreads();
        // Rows folded onto the first: the same tree whatever the data.
        for (int w = top; w > 0; w >>= 1) {
            if (y < w && y + w < ty) {
                s0[t] += s0[t + w * tx];
                s1[t] += s1[t + w * tx];
            }
            __syncthreads();
        }
        if (y == 0 && k < K) {
            part[k * S + s] = s0[t];
            part[K * S + k * S + s] = s1[t];
        }
        __syncthreads(); // before the next tile overwrites s0, s1
    }
}

// Range g of G (each chunk elements) of channel ch's n = outer * inner
// elements, for tasks ch * G + g; its partial goes to part[ch * G + g] (and
// part[C * G + ch * G + g]). The (plane, offset) pair is stepped without a
// division per element.
template <nb_dtype D, class A>
__global__ void __launch_bounds__(kThreads)
    k_moments_planes(int64_t C, int64_t inner, int64_t n, int64_t chunk, int64_t G, const T_of<D> *a,
                     const T_of<D> *b, const T_of<D> *center, A *part)
{
    __shared__ A s0[kThreads], s1[kThreads];
    const int64_t dplane = (int64_t)blockDim.x / inner, doff = (int64_t)blockDim.x % inner;
    for (int64_t task = blockIdx.x; task < C * G; task += gridDim.x) {
        const int64_t ch = task / G, g = task - ch * G;
        const int64_t j0 = g * chunk, j1 = n - j0 < chunk ? n : j0 + chunk;
        const A m = center ? static_cast<A>(ld<D>(center[ch])) : A(0);
        A p0 = A(0), p1 = A(0);
        int64_t j = j0 + threadIdx.x, o = j / inner, i = j - o * inner;
        for (; j < j1; j += blockDim.x) {
            moment_add<D, A>(a, b, (o * C + ch) * inner + i, m, p0, p1);
            o += dplane;
            i += doff;
            if (i >= inner) {
                i -= inner;
                o++;
            }
        }
        s0[threadIdx.x] = p0;
        s1[threadIdx.x] = p1;
        __syncthreads();
        for (int w = kThreads / 2; w > 0; w >>= 1) {
            if (threadIdx.x < w) {
                s0[threadIdx.x] += s0[threadIdx.x + w];
                s1[threadIdx.x] += s1[threadIdx.x + w];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            part[task] = s0[0];
            part[C * G + task] = s1[0];
        }
        __syncthreads();
    }
}

// A warp per channel adds its L partials (lane-strided, then a shuffle tree:
// a fixed order) and stores sum and moment; L = 0 (no elements) gives zeros.
template <nb_dtype D, class A>
__global__ void __launch_bounds__(kThreads)
    k_moments_final(int64_t C, int64_t L, int64_t n, bool own_mean, const A *part, T_of<D> *sum, T_of<D> *moment)
{
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = gstride() >> 5;
    for (int64_t ch = gtid() >> 5; ch < C; ch += nwarps) {
        A q0 = A(0), q1 = A(0);
        for (int64_t l = lane; l < L; l += 32) {
            q0 += part[ch * L + l];
            q1 += part[C * L + ch * L + l];
        }
        for (int o = 16; o > 0; o >>= 1) {
            q0 += __shfl_down_sync(0xffffffffu, q0, o);
            q1 += __shfl_down_sync(0xffffffffu, q1, o);
        }
        if (lane == 0) {
            if (own_mean && n > 0) { // about the channel's own mean
                q1 -= q0 * q0 / static_cast<A>(n);
                q1 = q1 < A(0) ? A(0) : q1; // rounding below 0 clamped; NaN (an infinity) kept
            }
            sum[ch] = st<D>(q0);
            moment[ch] = st<D>(q1);
        }
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_channel_affine(int64_t total, int64_t C, int64_t inner, const T_of<D> *a, const T_of<D> *s,
                     const T_of<D> *b, const T_of<D> *t, const T_of<D> *u, T_of<D> *out)
{
    using Cc = C_of<D>;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        const int64_t ch = inner == 1 ? i % C : (i / inner) % C; // NHWC: one division
        // (a s + b t) + u, each step rounded, as the CPU computes it
        Cc v = mul_rn<Cc>(ld<D>(a[i]), ld<D>(s[ch]));
        if (b)
            v = add_rn(v, mul_rn<Cc>(ld<D>(b[i]), ld<D>(t[ch])));
        out[i] = st<D>(add_rn<Cc>(v, ld<D>(u[ch])));
    }
}

template <nb_dtype D> struct MomentAcc {
    using T = double;
};
template <> struct MomentAcc<NB_F16> {
    using T = float;
};
template <> struct MomentAcc<NB_BF16> {
    using T = float;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

} // namespace

extern "C" nb_status nb__gpu_channel_moments(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *sum,
                                             const nb_view *moment, const nb_view *a, const nb_view *b,
                                             const nb_view *center)
{
    const int64_t outer = shape[0], C = shape[1], inner = shape[2];
    if (C <= 0)
        return NB_OK;
    // outer * C * inner is the element count, so with n > 0 neither C * inner
    // nor C * L (L <= outer * inner) overflows.
    const int64_t n = outer > 0 && inner > 0 ? outer * inner : 0;
    const int64_t target = (int64_t)c->phys->sm_count * (2048 / kThreads); // blocks for one full wave
    const bool rows = inner < 32;
    int64_t L = 0, S = 0, chunk = 0, ntiles = 0;
    int tx = 0, ty = 0;
    if (n > 0 && rows) {
        const int64_t K = C * inner;
        tx = K < 32 ? (int)K : 32;
        ty = kThreads / tx;
        ntiles = ceil_div(K, tx);
        // Row chunks to fill the card, each at least 4 rows per thread.
        S = std::min(std::min(ceil_div(target, ntiles), ceil_div(outer, 4 * (int64_t)ty)), (int64_t)65535);
        chunk = ceil_div(outer, S);
        S = ceil_div(outer, chunk);
        L = inner * S;
    } else if (n > 0) {
        // Ranges of at least 8 elements per thread.
        S = std::min(ceil_div(target, C), ceil_div(n, 8 * (int64_t)kThreads));
        chunk = ceil_div(n, S);
        S = ceil_div(n, chunk);
        L = S;
    }
    return dispatch_float(a->dtype, c, "channel_moments", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        using A = typename MomentAcc<D>::T;
        const T_of<D> *ap = in_ptr<D>(a), *bp = in_ptr<D>(b), *cp = in_ptr<D>(center);
        Scratch part(c, (size_t)(2 * C * L) * sizeof(A));
        if (L > 0 && !part.p)
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        A *pp = static_cast<A *>(part.p);
        if (L > 0 && rows) {
            const dim3 grid((unsigned)std::min(ntiles, (int64_t)INT32_MAX), (unsigned)S);
            k_moments_rows<D, A><<<grid, kThreads, 0, c->stream>>>(outer, C * inner, inner, chunk, S, tx, ty, ap,
                                                                    bp, cp, pp);
        } else if (L > 0) {
            const unsigned blocks = (unsigned)std::min(C * S, (int64_t)INT32_MAX);
            k_moments_planes<D, A><<<blocks, kThreads, 0, c->stream>>>(C, inner, n, chunk, S, ap, bp, cp, pp);
        }
        if (L > 0) {
            nb_status st = nb__gpu_launched(c, "channel_moments");
            if (st)
                return st;
        }
        k_moments_final<D, A><<<grid_for(c, C * 32), kThreads, 0, c->stream>>>(
            C, L, n, !b && !center, pp, out_ptr<D>(sum), out_ptr<D>(moment));
        return nb__gpu_launched(c, "channel_moments");
    });
}

extern "C" nb_status nb__gpu_channel_affine(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *out,
                                            const nb_view *a, const nb_view *s, const nb_view *b, const nb_view *t,
                                            const nb_view *u)
{
    const int64_t total = out->numel;
    return launch_float(c, "channel_affine", a->dtype, total, [&](auto tag) {
        constexpr nb_dtype D = decltype(tag)::value;
        k_channel_affine<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            total, shape[1], shape[2], in_ptr<D>(a), in_ptr<D>(s), in_ptr<D>(b), in_ptr<D>(t), in_ptr<D>(u),
            out_ptr<D>(out));
    });
}
