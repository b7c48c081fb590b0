// nabla internal — what the .cu files share: dtype traits and conversions, math
// overloads, the strided geometry and its collapsing, the generic elementwise
// launcher (vectorised contiguous path, general strided path up to 8 dims) and
// dtype dispatch. CUDA C++17; included only by gpu/*.cu.
#pragma once

// CUB's device-wide algorithms include <iostream> (for debug printing that is
// compiled out), whose static initialiser needs libstdc++ at link time; the
// objects must need nothing from it (see gpu/meson.build). Marking the header
// as already included keeps it out; nothing here prints.
#ifndef _GLIBCXX_IOSTREAM
#define _GLIBCXX_IOSTREAM 1
#endif

#include "gpu_internal.h"
#include "lib/core/formulas.h"
#include "lib/core/op_phases.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cuda/std/limits>
#include <cuda/std/tuple>

#include <array>
#include <cstdint>
#include <tuple>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

namespace nbg {

// Helpers and functors are host-callable too, so their arithmetic can be
// checked on a machine without a GPU.
#define NBG_HD __host__ __device__ __forceinline__

// ---- dtypes ---------------------------------------------------------------------

// T: how an element is stored; C: what arithmetic on it uses; Acc: what a
// reduction accumulates in.
template <nb_dtype D> struct DT;
template <> struct DT<NB_F32> { using T = float; using C = float; using Acc = float; };
template <> struct DT<NB_F64> { using T = double; using C = double; using Acc = double; };
template <> struct DT<NB_F16> { using T = __half; using C = float; using Acc = float; };
template <> struct DT<NB_BF16> { using T = __nv_bfloat16; using C = float; using Acc = float; };
template <> struct DT<NB_I32> { using T = int32_t; using C = int32_t; using Acc = int64_t; };
template <> struct DT<NB_I64> { using T = int64_t; using C = int64_t; using Acc = int64_t; };
template <> struct DT<NB_BOOL> { using T = uint8_t; using C = int32_t; using Acc = int64_t; };
template <> struct DT<NB_U8> { using T = uint8_t; using C = int32_t; using Acc = int64_t; };

template <nb_dtype D> using T_of = typename DT<D>::T;
template <nb_dtype D> using C_of = typename DT<D>::C;

template <nb_dtype D> constexpr bool is_float_v = D == NB_F32 || D == NB_F64 || D == NB_F16 || D == NB_BF16;
template <nb_dtype D> constexpr bool is_int_v = D == NB_I32 || D == NB_I64 || D == NB_U8;

template <nb_dtype D> struct Tag { static constexpr nb_dtype value = D; };

inline size_t dtype_size(nb_dtype d)
{
    switch (d) {
    case NB_F64: case NB_I64: return 8;
    case NB_F32: case NB_I32: return 4;
    case NB_F16: case NB_BF16: return 2;
    default: return 1;
    }
}

// Storage -> compute type.
template <nb_dtype D> NBG_HD C_of<D> ld(T_of<D> x)
{
    if constexpr (D == NB_F16)
        return __half2float(x);
    else if constexpr (D == NB_BF16)
        return __bfloat162float(x);
    else if constexpr (D == NB_BOOL)
        return x != 0;
    else
        return static_cast<C_of<D>>(x);
}

// One multiply, add or subtract, rounded on its own: never fused with its
// neighbour into an fma, as the CPU's kernels (built with -ffp-contract=off)
// compute them. For float and double.
template <class C> __device__ __forceinline__ C mul_rn(C a, C b)
{
    if constexpr (std::is_same_v<C, double>)
        return __dmul_rn(a, b);
    else
        return __fmul_rn(a, b);
}
template <class C> __device__ __forceinline__ C add_rn(C a, C b)
{
    if constexpr (std::is_same_v<C, double>)
        return __dadd_rn(a, b);
    else
        return __fadd_rn(a, b);
}
template <class C> __device__ __forceinline__ C sub_rn(C a, C b)
{
    if constexpr (std::is_same_v<C, double>)
        return __dsub_rn(a, b);
    else
        return __fsub_rn(a, b);
}

// Compute type (or any arithmetic value) -> storage. An integer goes to f16
// and bf16 through double, as on the CPU (ops/cpu/cpu_copy.c): through float,
// an i32 past 2^24 would round twice (16842753 to bf16: 16777216, not 16908288).
template <nb_dtype D, class V> NBG_HD T_of<D> st(V v)
{
    if constexpr (D == NB_F16) {
        if constexpr (std::is_same_v<V, double> || std::is_integral_v<V>)
            return __double2half(static_cast<double>(v));
        else
            return __float2half(static_cast<float>(v));
    } else if constexpr (D == NB_BF16) {
        if constexpr (std::is_same_v<V, double> || std::is_integral_v<V>)
            return __double2bfloat16(static_cast<double>(v));
        else
            return __float2bfloat16(static_cast<float>(v));
    } else if constexpr (D == NB_BOOL) {
        return v != V(0) ? 1 : 0;
    } else if constexpr (D == NB_U8 && std::is_floating_point_v<V>) {
        // nb_cast's rule (lib/core/formulas.h): NaN -> 0, through int32, wrapping
        return nb_cast_to_u8(static_cast<double>(v));
    } else if constexpr (D == NB_I32 && std::is_floating_point_v<V>) {
        return nb_cast_to_i32(static_cast<double>(v)); // NaN -> 0, not cvt.rzi's INT_MIN
    } else if constexpr (D == NB_I64 && std::is_floating_point_v<V>) {
        return nb_cast_to_i64(static_cast<double>(v));
    } else {
        return static_cast<T_of<D>>(v);
    }
}

// Conversion between any two dtypes (nb_cast): floating -> integer truncates,
// anything -> bool is (x != 0).
template <nb_dtype To, nb_dtype From> NBG_HD T_of<To> cvt(T_of<From> x)
{
    if constexpr (To == From)
        return x;
    else if constexpr (From == NB_F16 || From == NB_BF16)
        return st<To>(ld<From>(x));
    else if constexpr (From == NB_BOOL)
        return st<To>(static_cast<int32_t>(x != 0));
    else
        return st<To>(x);
}

// ---- math overloads (float and double) ----------------------------------------------

#define NBG_MATH1(name, f32, f64)                                                     \
    NBG_HD float name(float x) { return f32(x); }                                     \
    NBG_HD double name(double x) { return f64(x); }
NBG_MATH1(m_exp, expf, exp)
NBG_MATH1(m_log, logf, log)
NBG_MATH1(m_log1p, log1pf, log1p)
NBG_MATH1(m_sqrt, sqrtf, sqrt)
NBG_MATH1(m_sin, sinf, sin)
NBG_MATH1(m_cos, cosf, cos)
NBG_MATH1(m_tanh, tanhf, tanh)
NBG_MATH1(m_erf, erff, erf)
NBG_MATH1(m_erfc, erfcf, erfc)
NBG_MATH1(m_fabs, fabsf, fabs)
#undef NBG_MATH1
NBG_HD float m_pow(float x, float y) { return powf(x, y); }
NBG_HD double m_pow(double x, double y) { return pow(x, y); }
template <class C> NBG_HD bool m_isnan(C x) { return x != x; }

// ---- launch geometry ----------------------------------------------------------------

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough for one full wave, no more.
inline unsigned grid_for(const nb_gpu_ctx *c, int64_t n, int threads = kThreads)
{
    int64_t blocks = (n + threads - 1) / threads;
    int64_t cap = (int64_t)c->phys->sm_count * (2048 / threads);
    if (blocks > cap)
        blocks = cap;
    return blocks < 1 ? 1u : (unsigned)blocks;
}

__device__ __forceinline__ int64_t gtid() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t gstride() { return (int64_t)gridDim.x * blockDim.x; }

// A strided iteration space: shape and, per operand, byte strides (operand 0 is
// the output).
template <int NA> struct Geo {
    int nd;
    int64_t shape[NB_MAX_DIMS];
    int64_t st[NA][NB_MAX_DIMS];
};

// Drops size-1 dims and merges neighbours that are contiguous in every operand.
template <int NA> inline void geo_collapse(Geo<NA> &g)
{
    int k = 0;
    for (int d = 0; d < g.nd; d++) {
        if (g.shape[d] == 1)
            continue;
        g.shape[k] = g.shape[d];
        for (int a = 0; a < NA; a++)
            g.st[a][k] = g.st[a][d];
        k++;
    }
    g.nd = k;
    if (k <= 1)
        return;
    int w = 0;
    for (int d = 1; d < g.nd; d++) {
        bool merge = true;
        for (int a = 0; a < NA; a++)
            merge = merge && g.st[a][w] == g.st[a][d] * g.shape[d];
        if (merge) {
            g.shape[w] *= g.shape[d];
            for (int a = 0; a < NA; a++)
                g.st[a][w] = g.st[a][d];
        } else {
            w++;
            g.shape[w] = g.shape[d];
            for (int a = 0; a < NA; a++)
                g.st[a][w] = g.st[a][d];
        }
    }
    g.nd = w + 1;
}

// Puts operand a's strides into g, aligned to the right of out's dims; dims the
// operand lacks or has as 1 get stride 0 (broadcast).
template <int NA> inline void geo_operand(Geo<NA> &g, int a, const nb_view *v)
{
    int off = g.nd - v->ndim;
    for (int d = 0; d < g.nd; d++) {
        int vd = d - off;
        g.st[a][d] = (vd < 0 || v->shape[vd] == 1) ? 0 : v->strides[vd];
    }
}

template <int NA> inline Geo<NA> geo_of(const nb_view *out)
{
    Geo<NA> g;
    std::memset(&g, 0, sizeof g);
    g.nd = out->ndim;
    for (int d = 0; d < out->ndim; d++) {
        g.shape[d] = out->shape[d];
        g.st[0][d] = out->strides[d];
    }
    return g;
}

// Byte offset of linear (row-major) element i in operand a.
template <class Idx, int NA>
NBG_HD void geo_offsets(const Geo<NA> &g, Idx i, int64_t (&off)[NA])
{
    for (int a = 0; a < NA; a++)
        off[a] = 0;
    for (int d = g.nd - 1; d >= 0; d--) {
        Idx n = (Idx)g.shape[d];
        Idx q = i / n;
        Idx r = i - q * n;
        i = q;
        for (int a = 0; a < NA; a++)
            off[a] += (int64_t)r * g.st[a][d];
    }
}

// ---- launching ------------------------------------------------------------------------------

template <class Tuple, size_t... I>
nb_status launch_args(nb_gpu_ctx *c, const char *what, const void *kernel, unsigned grid, unsigned block,
                      Tuple &vals, std::index_sequence<I...>)
{
    void *argv[sizeof...(I) + 1] = {static_cast<void *>(&std::get<I>(vals))...};
    int phase = nb__phase_enter(NB_PHASE_LAUNCH);
    cudaError_t e = cudaLaunchKernel(kernel, dim3(grid), dim3(block), argv, 0, c->stream);
    nb__phase_leave(phase);
    phase = nb__phase_enter(NB_PHASE_LAUNCH_CHECK);
    nb_status st = e == cudaSuccess ? NB_OK : nb__gpu_launch_failed(c, what, e);
    nb__phase_leave(phase);
    return st;
}

// kernel<<<grid, block, 0, c->stream>>>(args...), through cudaLaunchKernel: its
// return value reports a launch that failed, so no cudaGetLastError follows it
// (and an error some earlier call left behind is not blamed on this launch).
// The arguments are converted to the kernel's parameter types first, as <<<>>>
// does. NB_OK, or NB_ERR_BACKEND naming what and c's device (recorded).
template <class... P, class... A>
nb_status launch(nb_gpu_ctx *c, const char *what, void (*kernel)(P...), unsigned grid, unsigned block,
                 A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "launch: the kernel takes another number of arguments");
    std::tuple<P...> vals(std::forward<A>(args)...);
    return launch_args(c, what, reinterpret_cast<const void *>(kernel), grid, block, vals,
                       std::index_sequence_for<P...>{});
}

// ---- the elementwise engine -------------------------------------------------------------

template <class T, int V> struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

template <int NA> struct Ptrs {
    char *p[NA];
    unsigned one; // bit a: operand a is a single element every i reads (a broadcast scalar)
};

// Vector j of V elements of a dense operand at p, or its one element V times.
template <class T, int V> __device__ __forceinline__ Vec<T, V> load_vec(const char *p, int64_t j, bool one)
{
    if (one) {
        const T x = *reinterpret_cast<const T *>(p);
        Vec<T, V> r;
#pragma unroll
        for (int k = 0; k < V; k++)
            r.v[k] = x;
        return r;
    }
    return reinterpret_cast<const Vec<T, V> *>(p)[j];
}

template <class Out, class... Ins, class F, size_t... I>
__device__ __forceinline__ void ew_apply(const F &f, char *const *p, const int64_t *off, std::index_sequence<I...>)
{
    *reinterpret_cast<Out *>(p[0] + off[0]) = f(*reinterpret_cast<const Ins *>(p[I + 1] + off[I + 1])...);
}

template <int V, class Out, class... Ins, class F, size_t... I>
__device__ __forceinline__ void ew_apply_vec(const F &f, char *const *p, unsigned one, int64_t j,
                                             std::index_sequence<I...>)
{
    // One aligned vector load per input (a broadcast scalar: one element), V
    // results, one aligned vector store.
    cuda::std::tuple<Vec<Ins, V>...> vs{load_vec<Ins, V>(p[I + 1], j, (one >> (I + 1)) & 1u)...};
    (void)vs; // unused when there are no inputs (fill)
    Vec<Out, V> r;
#pragma unroll
    for (int k = 0; k < V; k++)
        r.v[k] = f(cuda::std::get<I>(vs).v[k]...);
    reinterpret_cast<Vec<Out, V> *>(p[0])[j] = r;
}

// Every operand contiguous and aligned to V elements, or an input of one
// element that every i reads (p.one).
template <int V, class F, class Out, class... Ins>
__global__ void __launch_bounds__(kThreads) k_ew_vec(F f, int64_t n, Ptrs<1 + sizeof...(Ins)> p)
{
    constexpr int NA = 1 + sizeof...(Ins);
    using Seq = std::index_sequence_for<Ins...>;
    int64_t nv = n / V;
    for (int64_t j = gtid(); j < nv; j += gstride())
        ew_apply_vec<V, Out, Ins...>(f, p.p, p.one, j, Seq{});
    size_t sizes[NA] = {sizeof(Out), sizeof(Ins)...};
    for (int64_t i = nv * V + gtid(); i < n; i += gstride()) {
        int64_t off[NA];
#pragma unroll
        for (int a = 0; a < NA; a++)
            off[a] = (p.one >> a) & 1u ? 0 : i * (int64_t)sizes[a];
        ew_apply<Out, Ins...>(f, p.p, off, Seq{});
    }
}

// Any strides, up to 8 dims (1-d strided or broadcast operands included).
template <class Idx, class F, class Out, class... Ins>
__global__ void __launch_bounds__(kThreads) k_ew_strided(F f, Idx n, Geo<1 + sizeof...(Ins)> g,
                                                          Ptrs<1 + sizeof...(Ins)> p)
{
    constexpr int NA = 1 + sizeof...(Ins);
    using Seq = std::index_sequence_for<Ins...>;
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        int64_t off[NA];
        geo_offsets<Idx, NA>(g, i, off);
        ew_apply<Out, Ins...>(f, p.p, off, Seq{});
    }
}

// out = f(ins...) elementwise over out's shape; inputs broadcast to it. Out and
// Ins are the storage types; f maps input values to an output value.
template <class Out, class... Ins, class F>
nb_status ew_launch(nb_gpu_ctx *c, const char *what, const F &f, const nb_view *out,
                    std::array<const nb_view *, sizeof...(Ins)> ins)
{
    constexpr int NA = 1 + sizeof...(Ins);
    int64_t n = out->numel;
    if (n <= 0)
        return NB_OK;
    Geo<NA> g = geo_of<NA>(out);
    Ptrs<NA> p;
    p.one = 0;
    p.p[0] = static_cast<char *>(out->data);
    for (int a = 1; a < NA; a++) {
        geo_operand(g, a, ins[a - 1]);
        p.p[a] = static_cast<char *>(ins[a - 1]->data);
    }
    geo_collapse(g);
    constexpr int V = 4;
    const size_t sizes[NA] = {sizeof(Out), sizeof(Ins)...};
    // The vector kernel when every operand is dense: aligned to V elements for
    // its vector loads, which only n >= V makes. A single element (every dim 1,
    // collapsed away: nd 0) is at offset 0 of each operand whatever the strides,
    // so it takes the vector kernel's scalar tail too, whose arguments are a
    // tenth of the strided kernel's (less for the launch to copy). An input
    // broadcast from one element (x + a scalar tensor: stride 0 over the one
    // dim) is read once per vector, not through the strided kernel's division.
    bool vec = g.nd == 0;
    if (g.nd == 1) {
        vec = true;
        for (int a = 0; a < NA && vec; a++) {
            if (a > 0 && g.st[a][0] == 0) {
                p.one |= 1u << a;
                continue;
            }
            vec = g.st[a][0] == (int64_t)sizes[a] && (n < V || (uintptr_t)p.p[a] % (V * sizes[a]) == 0);
        }
    }
    if (vec)
        return launch(c, what, k_ew_vec<V, F, Out, Ins...>, grid_for(c, (n + V - 1) / V), kThreads, f, n, p);
    if (n <= (int64_t)INT32_MAX) // not UINT32_MAX: i += stride must not wrap
        return launch(c, what, k_ew_strided<uint32_t, F, Out, Ins...>, grid_for(c, n), kThreads, f, (uint32_t)n, g,
                      p);
    return launch(c, what, k_ew_strided<uint64_t, F, Out, Ins...>, grid_for(c, n), kThreads, f, (uint64_t)n, g, p);
}

// ---- dispatch -------------------------------------------------------------------------------

// Calls fn(Tag<D>{}) for the runtime dtype d.
template <class Fn> nb_status dispatch(nb_dtype d, Fn &&fn)
{
    switch (d) {
    case NB_F32: return fn(Tag<NB_F32>{});
    case NB_F64: return fn(Tag<NB_F64>{});
    case NB_F16: return fn(Tag<NB_F16>{});
    case NB_BF16: return fn(Tag<NB_BF16>{});
    case NB_I32: return fn(Tag<NB_I32>{});
    case NB_I64: return fn(Tag<NB_I64>{});
    case NB_BOOL: return fn(Tag<NB_BOOL>{});
    case NB_U8: return fn(Tag<NB_U8>{});
    default: break;
    }
    return nb__fail(NB_ERR_DTYPE, "gpu: unknown dtype %d", (int)d);
}

// Calls fn(Tag<D>{}) for the floating dtypes only; others are NB_ERR_DTYPE.
template <class Fn> nb_status dispatch_float(nb_dtype d, const nb_gpu_ctx *c, const char *op, Fn &&fn)
{
    switch (d) {
    case NB_F32: return fn(Tag<NB_F32>{});
    case NB_F64: return fn(Tag<NB_F64>{});
    case NB_F16: return fn(Tag<NB_F16>{});
    case NB_BF16: return fn(Tag<NB_BF16>{});
    default: break;
    }
    return nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s (floating dtypes only)", op,
                    nb_dtype_name(d), c->dev->name);
}

// Calls launch(tag) for the float dtype dt, tag naming it as Tag<D>, where a
// kernel has `total` outputs to write (none: nothing to do), and reports a
// failed launch under name.
template <class Launch>
nb_status launch_float(nb_gpu_ctx *c, const char *name, nb_dtype dt, int64_t total, Launch &&launch)
{
    if (total <= 0)
        return NB_OK;
    return dispatch_float(dt, c, name, [&](auto tag) -> nb_status {
        launch(tag);
        return nb__gpu_launched(c, name);
    });
}

// A view's data as dtype D's elements; an absent view gives nullptr.
template <nb_dtype D> const T_of<D> *in_ptr(const nb_view *v)
{
    return v ? static_cast<const T_of<D> *>(v->data) : nullptr;
}
template <nb_dtype D> T_of<D> *out_ptr(const nb_view *v) { return v ? static_cast<T_of<D> *>(v->data) : nullptr; }

inline nb_status dtype_error(const nb_gpu_ctx *c, const char *op, nb_dtype d)
{
    return nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", op, nb_dtype_name(d), c->dev->name);
}

// Scratch memory from the caching allocator, given back when the scope ends.
// Freed in stream order: kernels queued before the free still see it.
struct Scratch {
    nb_gpu_ctx *c;
    void *p;
    Scratch(nb_gpu_ctx *ctx, size_t n) : c(ctx), p(n ? nb__gpu_malloc(ctx, n) : nullptr) {}
    ~Scratch() { nb__gpu_free(c, p); }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
};

// ---- bad indices ----------------------------------------------------------------------------
// A kernel that finds an index outside its range records the first one in the
// device's index-error record (nb__gpu_index_error_record before the launch,
// _arm after it); the next synchronising call reports it (gpu_device.c).
// What a kernel needs to record a bad index: the record, the op's name (a
// static host string, carried as an integer) and the valid range.
struct IndexCheck {
    nb_gpu_index_error *err;
    unsigned long long op;
    int64_t rows;
};

__device__ __forceinline__ void flag_index(const IndexCheck &chk, int64_t position, int64_t value)
{
    if (atomicCAS(&chk.err->set, 0, 1) == 0) {
        chk.err->position = position;
        chk.err->value = value;
        chk.err->rows = chk.rows;
        chk.err->op = chk.op;
    }
}

// Calls fn(I{}) for the index dtype.
template <class Fn>
nb_status by_index(const nb_gpu_ctx *c, const char *op, const nb_view *indices, Fn &&fn)
{
    if (indices->dtype == NB_I32)
        return fn(int32_t{});
    if (indices->dtype == NB_I64)
        return fn(int64_t{});
    return nb__fail(NB_ERR_DTYPE, "%s: indices must be i32 or i64, not %s (on %s)", op,
                    nb_dtype_name(indices->dtype), c->dev->name);
}

} // namespace nbg
