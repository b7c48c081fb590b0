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

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_max_pool_grad(PoolGeo g, const T_of<D> *x, const T_of<D> *dy, T_of<D> *out, int64_t total)
{
    using A = typename DT<D>::Acc;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        int64_t n, h, w, ch;
        split(g, i, g.H, g.W, n, h, w, ch);
        int64_t plo, phi, qlo, qhi;
        covering(h, g.pt, g.R, g.sh, g.P, plo, phi);
        covering(w, g.pl, g.S, g.sw, g.Q, qlo, qhi);
        A sum = A(0);
        for (int64_t p = plo; p <= phi; p++)
            for (int64_t q = qlo; q <= qhi; q++)
                if (argmax<D>(g, x, n, p, q, ch) == i)
                    sum += static_cast<A>(ld<D>(dy[at(g, n, p, q, ch, g.P, g.Q)]));
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
        out[i] = st<D>(sum / static_cast<A>((r1 - r0) * (s1 - s0)));
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads) k_avg_pool_grad(PoolGeo g, const T_of<D> *dy, T_of<D> *out, int64_t total)
{
    using A = typename DT<D>::Acc;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        int64_t n, h, w, ch;
        split(g, i, g.H, g.W, n, h, w, ch);
        int64_t plo, phi, qlo, qhi;
        covering(h, g.pt, g.R, g.sh, g.P, plo, phi);
        covering(w, g.pl, g.S, g.sw, g.Q, qlo, qhi);
        A sum = A(0);
        for (int64_t p = plo; p <= phi; p++)
            for (int64_t q = qlo; q <= qhi; q++) {
                int64_t h0, r0, r1, w0, s0, s1;
                window(g, p, q, h0, r0, r1, w0, s0, s1);
                sum += static_cast<A>(ld<D>(dy[at(g, n, p, q, ch, g.P, g.Q)])) /
                       static_cast<A>((r1 - r0) * (s1 - s0));
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
    const char *name = sel ? "max_pool2d_select" : "max_pool2d";
    const int64_t total = out->numel;
    if (total <= 0)
        return NB_OK;
    const PoolGeo g = geo_of(d);
    return dispatch_float(x->dtype, c, name, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_max_pool<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            g, static_cast<const T_of<D> *>(x->data), sel ? static_cast<const T_of<D> *>(sel->data) : nullptr,
            static_cast<T_of<D> *>(out->data), total);
        return nb__gpu_launched(c, name);
    });
}

extern "C" nb_status nb__gpu_max_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                             const nb_view *x, const nb_view *dy)
{
    const int64_t total = out->numel;
    if (total <= 0)
        return NB_OK;
    const PoolGeo g = geo_of(d);
    return dispatch_float(x->dtype, c, "max_pool2d_grad", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_max_pool_grad<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            g, static_cast<const T_of<D> *>(x->data), static_cast<const T_of<D> *>(dy->data),
            static_cast<T_of<D> *>(out->data), total);
        return nb__gpu_launched(c, "max_pool2d_grad");
    });
}

extern "C" nb_status nb__gpu_avg_pool2d(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                        const nb_view *x)
{
    const int64_t total = out->numel;
    if (total <= 0)
        return NB_OK;
    const PoolGeo g = geo_of(d);
    return dispatch_float(x->dtype, c, "avg_pool2d", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_avg_pool<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            g, static_cast<const T_of<D> *>(x->data), static_cast<T_of<D> *>(out->data), total);
        return nb__gpu_launched(c, "avg_pool2d");
    });
}

extern "C" nb_status nb__gpu_avg_pool2d_grad(nb_gpu_ctx *c, const nb_pool2d_desc *d, const nb_view *out,
                                             const nb_view *dy)
{
    const int64_t total = out->numel;
    if (total <= 0)
        return NB_OK;
    const PoolGeo g = geo_of(d);
    return dispatch_float(dy->dtype, c, "avg_pool2d_grad", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_avg_pool_grad<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            g, static_cast<const T_of<D> *>(dy->data), static_cast<T_of<D> *>(out->data), total);
        return nb__gpu_launched(c, "avg_pool2d_grad");
    });
}

// ---- per-channel kernels (batch normalisation) --------------------------------------
//
// channel_moments: one block per channel, its threads striding over the
// channel's outer * inner elements, then a shared-memory tree; double sums for
// f64 and f32, float for f16/bf16 (their Acc). channel_affine: one thread per
// element.

namespace {

template <nb_dtype D, class A>
__global__ void __launch_bounds__(kThreads)
    k_channel_moments(int64_t outer, int64_t C, int64_t inner, const T_of<D> *a, const T_of<D> *b,
                      const T_of<D> *center, T_of<D> *sum, T_of<D> *moment)
{
    __shared__ A s0[kThreads], s1[kThreads];
    for (int64_t ch = blockIdx.x; ch < C; ch += gridDim.x) {
        const A m = center ? static_cast<A>(ld<D>(center[ch])) : A(0);
        A p0 = A(0), p1 = A(0);
        const int64_t n = outer * inner;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const int64_t o = j / inner, i = j - o * inner, at = (o * C + ch) * inner + i;
            const A x = static_cast<A>(ld<D>(a[at]));
            p0 += x;
            if (b) {
                p1 += x * (static_cast<A>(ld<D>(b[at])) - m);
            } else {
                const A d = x - m;
                p1 += d * d;
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
            A m1 = s1[0];
            if (!b && !center) { // about the channel's own mean
                m1 -= s0[0] * s0[0] / static_cast<A>(n);
                m1 = m1 > A(0) ? m1 : A(0);
            }
            sum[ch] = st<D>(s0[0]);
            moment[ch] = st<D>(m1);
        }
        __syncthreads();
    }
}

template <nb_dtype D>
__global__ void __launch_bounds__(kThreads)
    k_channel_affine(int64_t total, int64_t C, int64_t inner, const T_of<D> *a, const T_of<D> *s,
                     const T_of<D> *b, const T_of<D> *t, const T_of<D> *u, T_of<D> *out)
{
    using Cc = C_of<D>;
    for (int64_t i = gtid(); i < total; i += gstride()) {
        const int64_t ch = (i / inner) % C;
        Cc v = ld<D>(a[i]) * ld<D>(s[ch]) + ld<D>(u[ch]);
        if (b)
            v += ld<D>(b[i]) * ld<D>(t[ch]);
        out[i] = st<D>(v);
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

} // namespace

extern "C" nb_status nb__gpu_channel_moments(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *sum,
                                             const nb_view *moment, const nb_view *a, const nb_view *b,
                                             const nb_view *center)
{
    const int64_t outer = shape[0], C = shape[1], inner = shape[2];
    if (C <= 0)
        return NB_OK;
    const unsigned blocks = (unsigned)(C < 65535 ? C : 65535);
    return dispatch_float(a->dtype, c, "channel_moments", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_channel_moments<D, typename MomentAcc<D>::T><<<blocks, kThreads, 0, c->stream>>>(
            outer, C, inner, static_cast<const T_of<D> *>(a->data),
            b ? static_cast<const T_of<D> *>(b->data) : nullptr,
            center ? static_cast<const T_of<D> *>(center->data) : nullptr, static_cast<T_of<D> *>(sum->data),
            static_cast<T_of<D> *>(moment->data));
        return nb__gpu_launched(c, "channel_moments");
    });
}

extern "C" nb_status nb__gpu_channel_affine(nb_gpu_ctx *c, const int64_t shape[3], const nb_view *out,
                                            const nb_view *a, const nb_view *s, const nb_view *b, const nb_view *t,
                                            const nb_view *u)
{
    const int64_t total = out->numel;
    if (total <= 0)
        return NB_OK;
    return dispatch_float(a->dtype, c, "channel_affine", [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        k_channel_affine<D><<<grid_for(c, total), kThreads, 0, c->stream>>>(
            total, shape[1], shape[2], static_cast<const T_of<D> *>(a->data), static_cast<const T_of<D> *>(s->data),
            b ? static_cast<const T_of<D> *>(b->data) : nullptr, t ? static_cast<const T_of<D> *>(t->data) : nullptr,
            static_cast<const T_of<D> *>(u->data), static_cast<T_of<D> *>(out->data));
        return nb__gpu_launched(c, "channel_affine");
    });
}
