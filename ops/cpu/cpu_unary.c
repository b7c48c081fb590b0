/* Unary elementwise kernels. Every NB_UN_* op for f32 and f64 (f32 computed in
 * float with the float libm functions); NEG, ABS, SIGN, SQUARE, RELU,
 * ADD_SCALAR and MUL_SCALAR also for i32 and i64 (wrapping arithmetic; a
 * non-integral alpha is applied in double and truncated). */
#include "cpu_internal.h"

#include <math.h>

#define INV_SQRT2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794

static const char *const un_names[NB_UN_COUNT] = {
    [NB_UN_NEG] = "neg", [NB_UN_ABS] = "abs", [NB_UN_SIGN] = "sign", [NB_UN_EXP] = "exp",
    [NB_UN_LOG] = "log", [NB_UN_SQRT] = "sqrt", [NB_UN_RSQRT] = "rsqrt",
    [NB_UN_SQUARE] = "square", [NB_UN_SIN] = "sin", [NB_UN_COS] = "cos", [NB_UN_TANH] = "tanh",
    [NB_UN_ERF] = "erf", [NB_UN_SIGMOID] = "sigmoid", [NB_UN_RELU] = "relu",
    [NB_UN_LEAKY_RELU] = "leaky_relu", [NB_UN_GELU] = "gelu", [NB_UN_SOFTPLUS] = "softplus",
    [NB_UN_RECIPROCAL] = "reciprocal", [NB_UN_STEP] = "step", [NB_UN_NORMAL_PDF] = "normal_pdf",
    [NB_UN_ADD_SCALAR] = "add_scalar", [NB_UN_MUL_SCALAR] = "mul_scalar",
    [NB_UN_POW_SCALAR] = "pow_scalar",
};

typedef struct un_ctx {
    double alpha;
    int64_t ialpha; /* alpha saturated to int64, for the integer kernels */
} un_ctx;

/* One loop function per (op, dtype): x is the element, alpha the scalar (in T). */
#define UN_ROW(NAME, T, ALPHA, EXPR)                                                         \
    static void NAME(void *vctx, int64_t n, char *const *p, const int64_t *s, int64_t flat) \
    {                                                                                        \
        const un_ctx *c = vctx;                                                              \
        const T alpha = (T)(ALPHA);                                                          \
        (void)c;                                                                             \
        (void)alpha;                                                                         \
        (void)flat;                                                                          \
        if (s[0] == (int64_t)sizeof(T) && s[1] == (int64_t)sizeof(T)) {                      \
            T *restrict o = (T *)p[0];                                                       \
            const T *restrict in = (const T *)p[1];                                          \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = in[i];                                                           \
                o[i] = (T)(EXPR);                                                            \
            }                                                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = *(const T *)(p[1] + i * s[1]);                                   \
                *(T *)(p[0] + i * s[0]) = (T)(EXPR);                                         \
            }                                                                                \
        }                                                                                    \
    }

/* Floating ops; F(fn) names the libm function for T. */
#define UN_FLOAT_OPS(SUF, T, F)                                                              \
    UN_ROW(un_neg_##SUF, T, c->alpha, -x)                                                    \
    UN_ROW(un_abs_##SUF, T, c->alpha, F(fabs)(x))                                            \
    UN_ROW(un_sign_##SUF, T, c->alpha, x > 0 ? (T)1 : x < 0 ? (T)-1 : x * (T)0)              \
    UN_ROW(un_exp_##SUF, T, c->alpha, F(exp)(x))                                             \
    UN_ROW(un_log_##SUF, T, c->alpha, F(log)(x))                                             \
    UN_ROW(un_sqrt_##SUF, T, c->alpha, F(sqrt)(x))                                           \
    UN_ROW(un_rsqrt_##SUF, T, c->alpha, (T)1 / F(sqrt)(x))                                   \
    UN_ROW(un_square_##SUF, T, c->alpha, x * x)                                              \
    UN_ROW(un_sin_##SUF, T, c->alpha, F(sin)(x))                                             \
    UN_ROW(un_cos_##SUF, T, c->alpha, F(cos)(x))                                             \
    UN_ROW(un_tanh_##SUF, T, c->alpha, F(tanh)(x))                                           \
    UN_ROW(un_erf_##SUF, T, c->alpha, F(erf)(x))                                             \
    UN_ROW(un_sigmoid_##SUF, T, c->alpha,                                                    \
           x >= 0 ? (T)1 / ((T)1 + F(exp)(-x)) : F(exp)(x) / ((T)1 + F(exp)(x)))             \
    UN_ROW(un_relu_##SUF, T, c->alpha, x < 0 ? (T)0 : x)                                     \
    UN_ROW(un_leaky_relu_##SUF, T, c->alpha, x < 0 ? alpha * x : x)                          \
    UN_ROW(un_gelu_##SUF, T, c->alpha, x * (T)0.5 * ((T)1 + F(erf)(x * (T)INV_SQRT2)))       \
    UN_ROW(un_softplus_##SUF, T, c->alpha, (x > 0 ? x : (T)0) + F(log1p)(F(exp)(-F(fabs)(x)))) \
    UN_ROW(un_reciprocal_##SUF, T, c->alpha, (T)1 / x)                                       \
    UN_ROW(un_step_gt_##SUF, T, c->alpha, x > 0 ? (T)1 : (T)0)                               \
    UN_ROW(un_step_ge_##SUF, T, c->alpha, x >= 0 ? (T)1 : (T)0)                              \
    UN_ROW(un_normal_pdf_##SUF, T, c->alpha, F(exp)((T)-0.5 * x * x) * (T)INV_SQRT_2PI)     \
    UN_ROW(un_add_scalar_##SUF, T, c->alpha, x + alpha)                                      \
    UN_ROW(un_mul_scalar_##SUF, T, c->alpha, x * alpha)                                      \
    UN_ROW(un_pow_scalar_##SUF, T, c->alpha, F(pow)(x, alpha))                               \
    UN_ROW(un_identity_##SUF, T, c->alpha, x)

#define F_f32(fn) fn##f
#define F_f64(fn) fn
UN_FLOAT_OPS(f32, float, F_f32)
UN_FLOAT_OPS(f64, double, F_f64)

/* Integer ops in unsigned arithmetic (wrapping, no UB). */
static inline double sat_int(double v, double lo, double hi)
{
    return !(v == v) ? 0 : v < lo ? lo : v > hi ? hi : v;
}
#define UN_INT_OPS(SUF, T, U, LO, HI)                                                        \
    UN_ROW(un_neg_##SUF, T, c->ialpha, (U)0 - (U)x)                                          \
    UN_ROW(un_abs_##SUF, T, c->ialpha, x < 0 ? (U)0 - (U)x : (U)x)                           \
    UN_ROW(un_sign_##SUF, T, c->ialpha, (x > 0) - (x < 0))                                   \
    UN_ROW(un_square_##SUF, T, c->ialpha, (U)x * (U)x)                                       \
    UN_ROW(un_relu_##SUF, T, c->ialpha, x < 0 ? 0 : x)                                       \
    UN_ROW(un_add_scalar_##SUF, T, c->ialpha, (U)x + (U)alpha)                               \
    UN_ROW(un_mul_scalar_##SUF, T, c->ialpha, (U)x * (U)alpha)                               \
    UN_ROW(un_add_frac_##SUF, T, c->ialpha, sat_int((double)x + c->alpha, LO, HI))           \
    UN_ROW(un_mul_frac_##SUF, T, c->ialpha, sat_int((double)x * c->alpha, LO, HI))
UN_INT_OPS(i32, int32_t, uint32_t, -2147483648.0, 2147483647.0)
UN_INT_OPS(i64, int64_t, uint64_t, -9223372036854775808.0, 9223372036854774784.0)

#define UN_FLOAT_ENTRY(OP, name) [OP] = {un_##name##_f32, un_##name##_f64}
/* [op][0: f32, 1: f64] */
static const nb_cpu_loop_fn un_float_table[NB_UN_COUNT][2] = {
    UN_FLOAT_ENTRY(NB_UN_NEG, neg), UN_FLOAT_ENTRY(NB_UN_ABS, abs),
    UN_FLOAT_ENTRY(NB_UN_SIGN, sign), UN_FLOAT_ENTRY(NB_UN_EXP, exp),
    UN_FLOAT_ENTRY(NB_UN_LOG, log), UN_FLOAT_ENTRY(NB_UN_SQRT, sqrt),
    UN_FLOAT_ENTRY(NB_UN_RSQRT, rsqrt), UN_FLOAT_ENTRY(NB_UN_SQUARE, square),
    UN_FLOAT_ENTRY(NB_UN_SIN, sin), UN_FLOAT_ENTRY(NB_UN_COS, cos),
    UN_FLOAT_ENTRY(NB_UN_TANH, tanh), UN_FLOAT_ENTRY(NB_UN_ERF, erf),
    UN_FLOAT_ENTRY(NB_UN_SIGMOID, sigmoid), UN_FLOAT_ENTRY(NB_UN_RELU, relu),
    UN_FLOAT_ENTRY(NB_UN_LEAKY_RELU, leaky_relu), UN_FLOAT_ENTRY(NB_UN_GELU, gelu),
    UN_FLOAT_ENTRY(NB_UN_SOFTPLUS, softplus), UN_FLOAT_ENTRY(NB_UN_RECIPROCAL, reciprocal),
    UN_FLOAT_ENTRY(NB_UN_STEP, step_gt), UN_FLOAT_ENTRY(NB_UN_NORMAL_PDF, normal_pdf),
    UN_FLOAT_ENTRY(NB_UN_ADD_SCALAR, add_scalar), UN_FLOAT_ENTRY(NB_UN_MUL_SCALAR, mul_scalar),
    UN_FLOAT_ENTRY(NB_UN_POW_SCALAR, pow_scalar),
};

#define UN_INT_ENTRY(OP, name) [OP] = {un_##name##_i32, un_##name##_i64}
static const nb_cpu_loop_fn un_int_table[NB_UN_COUNT][2] = {
    UN_INT_ENTRY(NB_UN_NEG, neg), UN_INT_ENTRY(NB_UN_ABS, abs),
    UN_INT_ENTRY(NB_UN_SIGN, sign), UN_INT_ENTRY(NB_UN_SQUARE, square),
    UN_INT_ENTRY(NB_UN_RELU, relu), UN_INT_ENTRY(NB_UN_ADD_SCALAR, add_scalar),
    UN_INT_ENTRY(NB_UN_MUL_SCALAR, mul_scalar),
};

/* Ops whose per-element cost is a libm call: split across threads sooner. */
static inline bool un_heavy(nb_unary_op op)
{
    switch (op) {
    case NB_UN_NEG: case NB_UN_ABS: case NB_UN_SIGN: case NB_UN_SQUARE: case NB_UN_RELU:
    case NB_UN_LEAKY_RELU: case NB_UN_RECIPROCAL: case NB_UN_STEP: case NB_UN_ADD_SCALAR:
    case NB_UN_MUL_SCALAR: case NB_UN_SQRT: case NB_UN_RSQRT:
        return false;
    default:
        return true;
    }
}

nb_status nb__cpu_unary(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x,
                        double alpha)
{
    if ((unsigned)op >= NB_UN_COUNT)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "unary: unknown op %d", (int)op);
    nb_cpu_loop_fn fn = NULL;
    un_ctx c = {alpha, 0};
    bool heavy = un_heavy(op);
    if (x->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s differs from input dtype %s",
                        un_names[op], nb_dtype_name(out->dtype), nb_dtype_name(x->dtype));
    if (x->dtype == NB_F32 || x->dtype == NB_F64) {
        int k = x->dtype == NB_F64;
        fn = un_float_table[op][k];
        if (op == NB_UN_STEP && alpha < 0) {
            fn = k ? un_step_ge_f64 : un_step_ge_f32;
        } else if (op == NB_UN_POW_SCALAR) {
            heavy = true;
            if (alpha == 2) {
                fn = k ? un_square_f64 : un_square_f32;
                heavy = false;
            } else if (alpha == 1) {
                fn = k ? un_identity_f64 : un_identity_f32;
                heavy = false;
            } else if (alpha == -1) {
                fn = k ? un_reciprocal_f64 : un_reciprocal_f32;
                heavy = false;
            }
        }
    } else if (x->dtype == NB_I32 || x->dtype == NB_I64) {
        int k = x->dtype == NB_I64;
        fn = un_int_table[op][k];
        c.ialpha = !(alpha == alpha) ? 0
                   : alpha >= 9223372036854775807.0 ? INT64_MAX
                   : alpha <= -9223372036854775808.0 ? INT64_MIN
                   : (int64_t)alpha;
        if ((op == NB_UN_ADD_SCALAR || op == NB_UN_MUL_SCALAR) && (double)c.ialpha != alpha) {
            if (op == NB_UN_ADD_SCALAR)
                fn = k ? un_add_frac_i64 : un_add_frac_i32;
            else
                fn = k ? un_mul_frac_i64 : un_mul_frac_i32;
        }
        heavy = false;
    }
    if (!fn)
        return nb__cpu_unsupported(dev, un_names[op], x->dtype);
    nb_cpu_iter it;
    const nb_view *views[2] = {out, x};
    nb__cpu_iter_init(&it, 2, views);
    nb__cpu_iter_run(&it, fn, &c, heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
    return NB_OK;
}
