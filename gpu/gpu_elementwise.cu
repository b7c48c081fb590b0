// Elementwise kernels: fill, arange, copy (with cast), unary, binary, where.
// Each goes through nbg::ew_launch: dims are collapsed first, then a vectorised
// grid-stride loop runs when every operand is contiguous and aligned, and a
// general strided loop (byte strides, stride 0 for broadcast, up to 8 dims)
// otherwise. f16/bf16 compute in float.
#include "gpu_kernels.cuh"

using namespace nbg;

namespace {

// ---- fill and arange -------------------------------------------------------------

template <nb_dtype D> struct FillF {
    double value;
    NBG_HD T_of<D> operator()() const { return st<D>(value); }
};

template <nb_dtype D, class Idx>
__global__ void __launch_bounds__(kThreads) k_arange(Geo<1> g, char *out, Idx n, double start, double step)
{
    for (Idx i = (Idx)gtid(); i < n; i += (Idx)gstride()) {
        int64_t off[1];
        geo_offsets<Idx, 1>(g, i, off);
        // _rn: no FMA contraction, so the values are the CPU's (a mul, then an add)
        *reinterpret_cast<T_of<D> *>(out + off[0]) = st<D>(__dadd_rn(start, __dmul_rn((double)i, step)));
    }
}

// ---- unary -------------------------------------------------------------------------

template <nb_unary_op OP> constexpr bool unary_takes_int =
    OP == NB_UN_NEG || OP == NB_UN_ABS || OP == NB_UN_SIGN || OP == NB_UN_SQUARE || OP == NB_UN_RELU ||
    OP == NB_UN_ADD_SCALAR || OP == NB_UN_MUL_SCALAR || OP == NB_UN_STEP;

// Integer ops as the CPU does them: wrapping (unsigned) arithmetic; a scalar
// that is not a whole number is applied in double, saturated and truncated.
template <nb_unary_op OP, class T> NBG_HD T unary_int(T x, int64_t ia, double da, bool frac)
{
    using U = std::make_unsigned_t<T>;
    constexpr double lo = (double)cuda::std::numeric_limits<T>::min();
    constexpr double hi = sizeof(T) == 8 ? 9223372036854774784.0 : (double)cuda::std::numeric_limits<T>::max();
    if constexpr (OP == NB_UN_NEG) {
        return (T)((U)0 - (U)x);
    } else if constexpr (OP == NB_UN_ABS) {
        return x < 0 ? (T)((U)0 - (U)x) : x;
    } else if constexpr (OP == NB_UN_SIGN) {
        return (T)((x > 0) - (x < 0));
    } else if constexpr (OP == NB_UN_SQUARE) {
        return (T)((U)x * (U)x);
    } else if constexpr (OP == NB_UN_RELU) {
        return x < 0 ? (T)0 : x;
    } else if constexpr (OP == NB_UN_STEP) {
        return (T)(da < 0 ? x >= 0 : x > 0);
    } else {
        static_assert(OP == NB_UN_ADD_SCALAR || OP == NB_UN_MUL_SCALAR, "not an integer op");
        if (frac) {
            double v = OP == NB_UN_ADD_SCALAR ? (double)x + da : (double)x * da;
            return (T)(!(v == v) ? 0.0 : v < lo ? lo : v > hi ? hi : v);
        }
        return OP == NB_UN_ADD_SCALAR ? (T)((U)x + (U)ia) : (T)((U)x * (U)ia);
    }
}

template <nb_unary_op OP, nb_dtype D> struct UnaryF {
    using C = C_of<D>;
    C alpha;
    bool alpha_negative;
    int64_t alpha_int;  // for integer dtypes: alpha saturated to int64
    double alpha_real;  // alpha itself
    bool alpha_frac;    // alpha is not a whole number

    NBG_HD T_of<D> operator()(T_of<D> xs) const
    {
        if constexpr (is_int_v<D>)
            return unary_int<OP>(xs, alpha_int, alpha_real, alpha_frac);
        else
            return floating(xs);
    }

    NBG_HD T_of<D> floating(T_of<D> xs) const
    {
        const C x = ld<D>(xs);
        const C zero = C(0), one = C(1);
        C r;
        if constexpr (OP == NB_UN_NEG) {
            r = -x;
        } else if constexpr (OP == NB_UN_ABS) {
            if constexpr (is_float_v<D>)
                r = m_fabs(x);
            else
                r = x < zero ? -x : x;
        } else if constexpr (OP == NB_UN_SIGN) {
            r = x > zero ? one : x < zero ? -one : x * zero; // as the CPU: NaN and -0 kept
        } else if constexpr (OP == NB_UN_EXP) {
            r = m_exp(x);
        } else if constexpr (OP == NB_UN_LOG) {
            r = m_log(x);
        } else if constexpr (OP == NB_UN_SQRT) {
            r = m_sqrt(x);
        } else if constexpr (OP == NB_UN_RSQRT) {
            r = one / m_sqrt(x);
        } else if constexpr (OP == NB_UN_SQUARE) {
            r = x * x;
        } else if constexpr (OP == NB_UN_SIN) {
            r = m_sin(x);
        } else if constexpr (OP == NB_UN_COS) {
            r = m_cos(x);
        } else if constexpr (OP == NB_UN_TANH) {
            r = m_tanh(x);
        } else if constexpr (OP == NB_UN_ERF) {
            r = m_erf(x);
        } else if constexpr (OP == NB_UN_SIGMOID) {
            if (x >= zero) {
                r = one / (one + m_exp(-x));
            } else {
                C e = m_exp(x);
                r = e / (one + e);
            }
        } else if constexpr (OP == NB_UN_RELU) {
            r = x < zero ? zero : x; // NaN stays NaN
        } else if constexpr (OP == NB_UN_LEAKY_RELU) {
            r = x < zero ? alpha * x : x;
        } else if constexpr (OP == NB_UN_GELU) {
            r = C(0.5) * x * m_erfc(-x * C(0.70710678118654752440));
        } else if constexpr (OP == NB_UN_SOFTPLUS) {
            r = (x > zero ? x : zero) + m_log1p(m_exp(-m_fabs(x)));
        } else if constexpr (OP == NB_UN_RECIPROCAL) {
            r = one / x;
        } else if constexpr (OP == NB_UN_STEP) {
            r = (alpha_negative ? x >= zero : x > zero) ? one : zero;
        } else if constexpr (OP == NB_UN_NORMAL_PDF) {
            r = m_exp(C(-0.5) * x * x) * C(0.39894228040143267794);
        } else if constexpr (OP == NB_UN_ADD_SCALAR) {
            r = x + alpha;
        } else if constexpr (OP == NB_UN_MUL_SCALAR) {
            r = x * alpha;
        } else {
            static_assert(OP == NB_UN_POW_SCALAR, "unhandled unary op");
            // exact for the exponents the CPU special-cases (CUDA's pow is within 2 ulp)
            r = alpha == C(2) ? x * x : alpha == C(1) ? x : alpha == C(-1) ? one / x : m_pow(x, alpha);
        }
        return st<D>(r);
    }
};

const char *unary_name(nb_unary_op op)
{
    static const char *const names[NB_UN_COUNT] = {
        "neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "square", "sin", "cos", "tanh", "erf",
        "sigmoid", "relu", "leaky_relu", "gelu", "softplus", "reciprocal", "step", "normal_pdf",
        "add_scalar", "mul_scalar", "pow_scalar"};
    return (int)op >= 0 && op < NB_UN_COUNT ? names[op] : "unary";
}

template <nb_unary_op OP>
nb_status unary_op(nb_gpu_ctx *c, const nb_view *out, const nb_view *x, double alpha)
{
    const char *name = unary_name(OP);
    return dispatch(x->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (is_float_v<D> || (unary_takes_int<OP> && (D == NB_I32 || D == NB_I64))) {
            UnaryF<OP, D> f;
            const int64_t ia = !(alpha == alpha) ? 0
                             : alpha >= 9223372036854775807.0 ? INT64_MAX
                             : alpha <= -9223372036854775808.0 ? INT64_MIN
                                                               : (int64_t)alpha;
            f.alpha = is_float_v<D> ? static_cast<C_of<D>>(alpha) : C_of<D>(0);
            f.alpha_negative = alpha < 0;
            f.alpha_int = ia;
            f.alpha_real = alpha;
            f.alpha_frac = (double)ia != alpha;
            return ew_launch<T_of<D>, T_of<D>>(c, name, f, out, {x});
        } else {
            return dtype_error(c, name, D);
        }
    });
}

// ---- binary ------------------------------------------------------------------------

// The type integer arithmetic is done in so that it wraps (unsigned).
template <class C, bool FLOAT> struct Wrap { using type = C; };
template <class C> struct Wrap<C, false> { using type = std::make_unsigned_t<C>; };

template <nb_binary_op OP> constexpr bool is_comparison = OP >= NB_BIN_EQ && OP <= NB_BIN_GE;

template <nb_binary_op OP, nb_dtype D> struct BinaryF {
    using C = C_of<D>;
    using Out = std::conditional_t<is_comparison<OP>, uint8_t, T_of<D>>;

    NBG_HD Out operator()(T_of<D> as, T_of<D> bs) const
    {
        const C a = ld<D>(as), b = ld<D>(bs);
        if constexpr (OP == NB_BIN_EQ) return a == b;
        else if constexpr (OP == NB_BIN_NE) return a != b;
        else if constexpr (OP == NB_BIN_LT) return a < b;
        else if constexpr (OP == NB_BIN_LE) return a <= b;
        else if constexpr (OP == NB_BIN_GT) return a > b;
        else if constexpr (OP == NB_BIN_GE) return a >= b;
        else {
            C r;
            using W = typename Wrap<C, is_float_v<D>>::type; // integers wrap
            if constexpr (OP == NB_BIN_ADD) {
                r = (C)((W)a + (W)b);
            } else if constexpr (OP == NB_BIN_SUB) {
                r = (C)((W)a - (W)b);
            } else if constexpr (OP == NB_BIN_MUL) {
                r = (C)((W)a * (W)b);
            } else if constexpr (OP == NB_BIN_DIV) {
                if constexpr (is_float_v<D>)
                    r = a / b;
                else // integer division truncates; x / 0 gives 0; MIN / -1 wraps (no UB)
                    r = b == C(0) ? C(0) : b == C(-1) ? (C)((W)0 - (W)a) : a / b;
            } else if constexpr (OP == NB_BIN_POW) {
                r = m_pow(a, b);
            } else if constexpr (OP == NB_BIN_MAX) {
                r = (m_isnan(a) || a > b) ? a : b; // NaN propagates from either side; as the CPU on ties
            } else {
                static_assert(OP == NB_BIN_MIN, "unhandled binary op");
                r = (m_isnan(a) || a < b) ? a : b;
            }
            return st<D>(r);
        }
    }
};

const char *binary_name(nb_binary_op op)
{
    static const char *const names[NB_BIN_COUNT] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                    "equal", "not_equal", "less", "less_equal", "greater",
                                                    "greater_equal"};
    return (int)op >= 0 && op < NB_BIN_COUNT ? names[op] : "binary";
}

template <nb_binary_op OP, nb_dtype D> constexpr bool binary_supported()
{
    if constexpr (is_comparison<OP>)
        return true;
    else if constexpr (OP == NB_BIN_POW)
        return is_float_v<D>;
    else if constexpr (D == NB_BOOL)
        return OP == NB_BIN_MAX || OP == NB_BIN_MIN;
    else
        return true;
}

template <nb_binary_op OP>
nb_status binary_op(nb_gpu_ctx *c, const nb_view *out, const nb_view *a, const nb_view *b)
{
    const char *name = binary_name(OP);
    return dispatch(a->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if constexpr (binary_supported<OP, D>()) {
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
    return dispatch(out->dtype, [&](auto tag) -> nb_status {
        constexpr nb_dtype D = decltype(tag)::value;
        if (n <= (int64_t)INT32_MAX) // not UINT32_MAX: i += stride must not wrap
            k_arange<D, uint32_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(g, p, (uint32_t)n, start, step);
        else
            k_arange<D, uint64_t><<<grid_for(c, n), kThreads, 0, c->stream>>>(g, p, (uint64_t)n, start, step);
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

#define UNARY_CASE(OP) case OP: return unary_op<OP>(c, out, x, alpha);
extern "C" nb_status nb__gpu_unary(nb_gpu_ctx *c, nb_unary_op op, const nb_view *out, const nb_view *x,
                                   double alpha)
{
    switch (op) {
        UNARY_CASE(NB_UN_NEG) UNARY_CASE(NB_UN_ABS) UNARY_CASE(NB_UN_SIGN) UNARY_CASE(NB_UN_EXP)
        UNARY_CASE(NB_UN_LOG) UNARY_CASE(NB_UN_SQRT) UNARY_CASE(NB_UN_RSQRT) UNARY_CASE(NB_UN_SQUARE)
        UNARY_CASE(NB_UN_SIN) UNARY_CASE(NB_UN_COS) UNARY_CASE(NB_UN_TANH) UNARY_CASE(NB_UN_ERF)
        UNARY_CASE(NB_UN_SIGMOID) UNARY_CASE(NB_UN_RELU) UNARY_CASE(NB_UN_LEAKY_RELU) UNARY_CASE(NB_UN_GELU)
        UNARY_CASE(NB_UN_SOFTPLUS) UNARY_CASE(NB_UN_RECIPROCAL) UNARY_CASE(NB_UN_STEP)
        UNARY_CASE(NB_UN_NORMAL_PDF) UNARY_CASE(NB_UN_ADD_SCALAR) UNARY_CASE(NB_UN_MUL_SCALAR)
        UNARY_CASE(NB_UN_POW_SCALAR)
    default: break;
    }
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "unary: unknown op %d on %s", (int)op, c->dev->name);
}
#undef UNARY_CASE

#define BINARY_CASE(OP) case OP: return binary_op<OP>(c, out, a, b);
extern "C" nb_status nb__gpu_binary(nb_gpu_ctx *c, nb_binary_op op, const nb_view *out, const nb_view *a,
                                    const nb_view *b)
{
    switch (op) {
        BINARY_CASE(NB_BIN_ADD) BINARY_CASE(NB_BIN_SUB) BINARY_CASE(NB_BIN_MUL) BINARY_CASE(NB_BIN_DIV)
        BINARY_CASE(NB_BIN_POW) BINARY_CASE(NB_BIN_MAX) BINARY_CASE(NB_BIN_MIN) BINARY_CASE(NB_BIN_EQ)
        BINARY_CASE(NB_BIN_NE) BINARY_CASE(NB_BIN_LT) BINARY_CASE(NB_BIN_LE) BINARY_CASE(NB_BIN_GT)
        BINARY_CASE(NB_BIN_GE)
    default: break;
    }
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "binary: unknown op %d on %s", (int)op, c->dev->name);
}
#undef BINARY_CASE
