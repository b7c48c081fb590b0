// Elementwise kernels: fill, arange, copy (with cast), unary, binary, where.
// Unary and binary ops come from lib/core/ops.def and compute the formulas of
// lib/core/formulas.h, the same the CPU computes.
// Each goes through nbg::ew_launch: dims are collapsed first, then a vectorised
// grid-stride loop runs when every operand is contiguous and aligned, and a
// general strided loop (byte strides, stride 0 for broadcast, up to 8 dims)
// otherwise. f16/bf16 compute in float.
#include "gpu_kernels.cuh"
#include "lib/core/formulas.h"

using namespace nbg;

namespace {

// ---- fill and arange -------------------------------------------------------------

template <nb_dtype D> struct FillF {
    double value;
    NBG_HD T_of<D> operator()() const { return st<D>(value); }
};

// start + i * step, as the CPU's arange computes it (ops/cpu/cpu_copy.c): an
// integer dtype with a whole start and step counts in wrapping uint64 (exact
// past 2^53, wrapping as an i32 does), else through double, an integer's
// value saturated to int64 and then converted.
struct Arange {
    double start, step;
    int64_t istart, istep;
    bool integral;
};

template <nb_dtype D, class Idx>
__global__ void __launch_bounds__(kThreads) k_arange(Geo<1> g, char *out, Idx n, Arange a)
{
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        int64_t off[1];
        geo_offsets<Idx, 1>(g, i, off);
        T_of<D> *o = reinterpret_cast<T_of<D> *>(out + off[0]);
        if constexpr (is_int_v<D>) {
            if (a.integral) {
                *o = static_cast<T_of<D>>((uint64_t)a.istart + (uint64_t)i * (uint64_t)a.istep);
                continue;
            }
            // _rn: no FMA contraction, so the values are the CPU's (a mul, then an add)
            *o = static_cast<T_of<D>>(nb_cast_to_i64(__dadd_rn(a.start, __dmul_rn((double)i, a.step))));
        } else {
            *o = st<D>(__dadd_rn(a.start, __dmul_rn((double)i, a.step)));
        }
    }
}

// ---- the formulas, by compute type -----------------------------------------------------

// Each op's formula lives in lib/core/formulas.h, shared with the CPU. Un<OP>::f
// and Bin<OP>::f overload it on the compute types (float serves f16 and bf16;
// int32_t serves bool and u8, comparisons only), generated from ops.def.
#define FLOAT_DTYPES NB_FLOATS
#define NUMERIC_DTYPES NB_NUMERIC
#define ANY_DTYPES NB_ALL_DTYPES

template <nb_unary_op OP> struct Un;
#define UN_INT_FLOAT(name)
#define UN_INT_NUMERIC(name)                                                                   \
    static NBG_HD int32_t f(int32_t x, int32_t a) { return nb_un_##name##_i32(x, a); }         \
    static NBG_HD int64_t f(int64_t x, int64_t a) { return nb_un_##name##_i64(x, a); }
#define NB_UNARY(ID, name, dtypes, cost, api)                                                  \
    template <> struct Un<NB_UN_##ID> {                                                        \
        static NBG_HD float f(float x, float a) { return nb_un_##name##_f32(x, a); }           \
        static NBG_HD double f(double x, double a) { return nb_un_##name##_f64(x, a); }        \
        UN_INT_##dtypes(name)                                                                  \
    };
#include "lib/core/ops.def"

template <nb_binary_op OP> struct Bin;
#define BIN_INT_FLOAT(name)
#define BIN_INT_NUMERIC(name)                                                                  \
    static NBG_HD auto f(int32_t x, int32_t y) { return nb_bin_##name##_i32(x, y); }           \
    static NBG_HD auto f(int64_t x, int64_t y) { return nb_bin_##name##_i64(x, y); }
#define BIN_INT_ANY(name) BIN_INT_NUMERIC(name)
#define NB_BINARY(ID, name, dtypes, cost, kind, api)                                           \
    template <> struct Bin<NB_BIN_##ID> {                                                      \
        static NBG_HD auto f(float x, float y) { return nb_bin_##name##_f32(x, y); }           \
        static NBG_HD auto f(double x, double y) { return nb_bin_##name##_f64(x, y); }         \
        BIN_INT_##dtypes(name)                                                                 \
    };
#include "lib/core/ops.def"

// The dtypes each op is defined for, at compile time (nb__unary_dtypes at run time).
constexpr unsigned kUnaryDtypes[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) dtypes##_DTYPES,
#include "lib/core/ops.def"
};
constexpr unsigned kBinaryDtypes[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) dtypes##_DTYPES,
#include "lib/core/ops.def"
};
static_assert(sizeof kUnaryDtypes / sizeof kUnaryDtypes[0] == NB_UN_COUNT, "ops.def and nb_unary_op disagree");
static_assert(sizeof kBinaryDtypes / sizeof kBinaryDtypes[0] == NB_BIN_COUNT, "ops.def and nb_binary_op disagree");

template <nb_unary_op OP, nb_dtype D> constexpr bool unary_supported = (kUnaryDtypes[OP] & NB_MASK(D)) != 0;
template <nb_binary_op OP, nb_dtype D> constexpr bool binary_supported = (kBinaryDtypes[OP] & NB_MASK(D)) != 0;

// ---- unary -------------------------------------------------------------------------

NBG_HD int32_t add_frac(int32_t x, double a) { return nb_un_add_frac_i32(x, a); }
NBG_HD int64_t add_frac(int64_t x, double a) { return nb_un_add_frac_i64(x, a); }
NBG_HD int32_t mul_frac(int32_t x, double a) { return nb_un_mul_frac_i32(x, a); }
NBG_HD int64_t mul_frac(int64_t x, double a) { return nb_un_mul_frac_i64(x, a); }

template <nb_unary_op OP, nb_dtype D> struct UnaryF {
    using C = C_of<D>;
    C alpha;           // the scalar in C (integers: saturated to int64 first, as the CPU)
    double alpha_real; // the scalar itself
    bool alpha_frac;   // integers: the scalar is not a whole number

    NBG_HD T_of<D> operator()(T_of<D> xs) const
    {
        if constexpr (is_int_v<D>) {
            if constexpr (OP == NB_UN_ADD_SCALAR)
                if (alpha_frac)
                    return add_frac(xs, alpha_real);
            if constexpr (OP == NB_UN_MUL_SCALAR)
                if (alpha_frac)
                    return mul_frac(xs, alpha_real);
            return Un<OP>::f(xs, alpha);
        } else {
            return st<D>(Un<OP>::f(ld<D>(xs), alpha));
        }
    }
};

template <nb_unary_op OP>
nb_status unary_op(nb_gpu_ctx *c, const nb_view *out, const nb_view *x, double alpha)
{
    const char *name = nb__unary_name(OP);
    return dispatch(x->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (unary_supported<OP, D>) {
            const int64_t ia = !(alpha == alpha) ? 0
                             : alpha >= 9223372036854775807.0 ? INT64_MAX
                             : alpha <= -9223372036854775808.0 ? INT64_MIN
                                                               : (int64_t)alpha;
            UnaryF<OP, D> f;
            f.alpha = is_float_v<D> ? static_cast<C_of<D>>(alpha) : static_cast<C_of<D>>(ia);
            f.alpha_real = alpha;
            f.alpha_frac = (double)ia != alpha;
            return ew_launch<T_of<D>, T_of<D>>(c, name, f, out, {x});
        } else {
            return dtype_error(c, name, D);
        }
    });
}

// ---- binary ------------------------------------------------------------------------

// The list's kind column: CMP writes uint8_t (NB_BOOL).
#define KIND_IS_CMP_ARITH false
#define KIND_IS_CMP_CMP true
constexpr bool kBinaryIsComparison[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) KIND_IS_CMP_##kind,
#include "lib/core/ops.def"
};
static_assert(sizeof kBinaryIsComparison / sizeof kBinaryIsComparison[0] == NB_BIN_COUNT,
              "ops.def and nb_binary_op disagree");
template <nb_binary_op OP> constexpr bool is_comparison = kBinaryIsComparison[OP];

template <nb_binary_op OP, nb_dtype D> struct BinaryF {
    using Out = std::conditional_t<is_comparison<OP>, uint8_t, T_of<D>>;

    NBG_HD Out operator()(T_of<D> as, T_of<D> bs) const
    {
        auto r = Bin<OP>::f(ld<D>(as), ld<D>(bs));
        if constexpr (is_comparison<OP>)
            return r;
        else
            return st<D>(r);
    }
};

template <nb_binary_op OP>
nb_status binary_op(nb_gpu_ctx *c, const nb_view *out, const nb_view *a, const nb_view *b)
{
    const char *name = nb__binary_name(OP);
    return dispatch(a->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (binary_supported<OP, D>) {
            using F = BinaryF<OP, D>;
            return ew_launch<typename F::Out, T_of<D>, T_of<D>>(c, name, F{}, out, {a, b});
        } else {
            return dtype_error(c, name, D);
        }
    });
}

// ---- copy and where (by element size where the dtype does not matter) ------------------

template <class T> struct RawCopyF {
    NBG_HD T operator()(T x) const { return x; }
};

template <nb_dtype To, nb_dtype From> struct CastF {
    NBG_HD T_of<To> operator()(T_of<From> x) const { return cvt<To, From>(x); }
};

template <class T> struct WhereF {
    NBG_HD T operator()(uint8_t cond, T a, T b) const { return cond ? a : b; }
};

// Raw copy of same-dtype elements: one cudaMemcpyAsync when both are dense.
template <class T> nb_status raw_copy(nb_gpu_ctx *c, const nb_view *out, const nb_view *in)
{
    Geo<2> g = geo_of<2>(out);
    geo_operand(g, 1, in);
    geo_collapse(g);
    if (g.nd == 0 || (g.nd == 1 && g.st[0][0] == (int64_t)sizeof(T) && g.st[1][0] == (int64_t)sizeof(T))) {
        NB_GPU_CALL(c, cudaMemcpyAsync, out->data, in->data, (size_t)out->numel * sizeof(T),
                    cudaMemcpyDeviceToDevice, c->stream);
        return NB_OK;
    }
    return ew_launch<T, T>(c, "copy", RawCopyF<T>{}, out, {in});
}

template <class Fn> nb_status by_size(size_t size, Fn &&fn)
{
    switch (size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    default: return fn(uint64_t{});
    }
}

} // namespace

extern "C" nb_status nb__gpu_fill(nb_gpu_ctx *c, const nb_view *out, double value)
{
    if (out->numel <= 0)
        return NB_OK;
    if (out->contiguous && value == 0.0 && !std::signbit(value)) {
        // all-zero bits in every dtype
        NB_GPU_CALL(c, cudaMemsetAsync, out->data, 0, (size_t)out->numel * dtype_size(out->dtype), c->stream);
        return NB_OK;
    }
    return dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        return ew_launch<T_of<D>>(c, "fill", FillF<D>{value}, out, {});
    });
}

extern "C" nb_status nb__gpu_arange(nb_gpu_ctx *c, const nb_view *out, double start, double step)
{
    int64_t n = out->numel;
    if (n <= 0)
        return NB_OK;
    Geo<1> g = geo_of<1>(out);
    geo_collapse(g); // keeps row-major order: element i stays element i
    if (g.nd == 0) {
        g.nd = 1;
        g.shape[0] = 1;
    }
    char *p = static_cast<char *>(out->data);
    Arange a{start, step, nb_cast_to_i64(start), nb_cast_to_i64(step), false};
    a.integral = (double)a.istart == start && (double)a.istep == step;
    return dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if (n <= (int64_t)INT32_MAX) // not UINT32_MAX: i += stride must not wrap
            k_arange<D, uint32_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(g, p, (uint32_t)n, a);
        else
            k_arange<D, uint64_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(g, p, (uint64_t)n, a);
        return nb__gpu_launched(c, "arange");
    });
}

extern "C" nb_status nb__gpu_copy(nb_gpu_ctx *c, const nb_view *out, const nb_view *in)
{
    if (out->numel <= 0)
        return NB_OK;
    if (out->dtype == in->dtype)
        return by_size(dtype_size(out->dtype), [&](auto t) { return raw_copy<decltype(t)>(c, out, in); });
    return dispatch(out->dtype, [&](auto to) -> nb_status {
        constexpr nb_dtype To = decltype(to)::value;
        return dispatch(in->dtype, [&](auto from) -> nb_status {
            constexpr nb_dtype From = decltype(from)::value;
            return ew_launch<T_of<To>, T_of<From>>(c, "cast", CastF<To, From>{}, out, {in});
        });
    });
}

extern "C" nb_status nb__gpu_where(nb_gpu_ctx *c, const nb_view *out, const nb_view *cond, const nb_view *a,
                                   const nb_view *b)
{
    if (cond->dtype != NB_BOOL && cond->dtype != NB_U8)
        return nb__fail(NB_ERR_DTYPE, "where: condition must be bool, not %s", nb_dtype_name(cond->dtype));
    return by_size(dtype_size(out->dtype), [&](auto t) {
        using T = decltype(t);
        return ew_launch<T, uint8_t, T, T>(c, "where", WhereF<T>{}, out, {cond, a, b});
    });
}

extern "C" nb_status nb__gpu_unary(nb_gpu_ctx *c, nb_unary_op op, const nb_view *out, const nb_view *x,
                                   double alpha)
{
    switch (op) {
#define NB_UNARY(ID, name, dtypes, cost, api) \
    case NB_UN_##ID: return unary_op<NB_UN_##ID>(c, out, x, alpha);
#include "lib/core/ops.def"
    default: break;
    }
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "unary: unknown op %d on %s", (int)op, c->dev->name);
}

extern "C" nb_status nb__gpu_binary(nb_gpu_ctx *c, nb_binary_op op, const nb_view *out, const nb_view *a,
                                    const nb_view *b)
{
    switch (op) {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) \
    case NB_BIN_##ID: return binary_op<NB_BIN_##ID>(c, out, a, b);
#include "lib/core/ops.def"
    default: break;
    }
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "binary: unknown op %d on %s", (int)op, c->dev->name);
}
