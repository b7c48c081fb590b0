/* Unary elementwise kernels: one loop per (op, dtype) around the op's formula
 * in lib/core/formulas.h, generated from the list in lib/core/ops.def. f32 is
 * computed in float, with nabla's own exp, log, tanh, erf, sin, cos and their
 * kin (nb_expf and the rest) and libm's float functions otherwise; the ops the
 * list allows on integers also run on i32 and i64 (wrapping arithmetic; a
 * scalar that is not a whole number is applied in double, truncated and
 * saturated). */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

#include <string.h>

typedef nb_cpu_un_ctx un_ctx;

/* One loop function per (op, dtype): x is the element, alpha the scalar (in T).
 * The contiguous loop vectorises (this file's flags: ops/cpu/meson.build), to
 * the CPU's width (NB_CPU_SIMD_LOOP), but where a formula calls libm. Its
 * pointers are not restrict: an op in place (nb_variable_assign_sub) passes
 * one buffer as output and input, and the compiler's overlap check sends
 * that, as well as separate buffers, to the vector loop. */
#define UN_ROW(NAME, T, ALPHA, EXPR)                                                         \
    __attribute__((always_inline)) static inline void NAME##_body(void *vctx, int64_t n,    \
                                                                  char *const *p,            \
                                                                  const int64_t *s, int64_t flat) \
    {                                                                                        \
        const un_ctx *c = vctx;                                                              \
        const T alpha = (T)(ALPHA);                                                          \
        (void)c;                                                                             \
        (void)alpha;                                                                         \
        (void)flat;                                                                          \
        if (s[0] == (int64_t)sizeof(T) && s[1] == (int64_t)sizeof(T)) {                      \
            T *o = (T *)p[0];                                                                \
            const T *in = (const T *)p[1];                                                   \
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
    }                                                                                        \
    NB_CPU_SIMD_LOOP(NAME)

/* Every op on f32 and f64. */
#define NB_UNARY(ID, name, dtypes, cost, api)                                                \
    UN_ROW(un_##name##_f32, float, c->alpha, nb_un_##name##_f32(x, alpha))                   \
    UN_ROW(un_##name##_f64, double, c->alpha, nb_un_##name##_f64(x, alpha))
#include "lib/core/ops.def"
UN_ROW(un_identity_f32, float, c->alpha, x)
UN_ROW(un_identity_f64, double, c->alpha, x)
/* x^a for the a that nb__cpu_unary_loop gives no loop of its own: the formula
 * without its tests of a, which would keep the loop from vectorising. */
UN_ROW(un_pow_general_f32, float, c->alpha, NB_MATH_F32(pow)(x, alpha))
UN_ROW(un_pow_general_f64, double, c->alpha, NB_MATH_F64(pow)(x, alpha))

/* The ops the list allows on integers, on i32 and i64. */
#define INT_ROWS_FLOAT(name)
#define INT_ROWS_NUMERIC(name)                                                               \
    UN_ROW(un_##name##_i32, int32_t, c->ialpha, nb_un_##name##_i32(x, alpha))                \
    UN_ROW(un_##name##_i64, int64_t, c->ialpha, nb_un_##name##_i64(x, alpha))
#define NB_UNARY(ID, name, dtypes, cost, api) INT_ROWS_##dtypes(name)
#include "lib/core/ops.def"
UN_ROW(un_add_frac_i32, int32_t, c->ialpha, nb_un_add_frac_i32(x, c->alpha))
UN_ROW(un_add_frac_i64, int64_t, c->ialpha, nb_un_add_frac_i64(x, c->alpha))
UN_ROW(un_mul_frac_i32, int32_t, c->ialpha, nb_un_mul_frac_i32(x, c->alpha))
UN_ROW(un_mul_frac_i64, int64_t, c->ialpha, nb_un_mul_frac_i64(x, c->alpha))

/* sin and cos of f32 and f64: the loop runs their branch-free near form
 * (|x| <= 2^20: nb__sinf_near, nb__sin_d_near) on a block, then redoes the
 * block's rare far, infinite or NaN x one at a time with the whole function
 * (the same bits where both apply). A block is written only once it is done,
 * so an op in place still reads its x. */
#define TRIG_BLOCK 256
#define UN_TRIG_ROW(NAME, T, FABS, NEAR, WHOLE)                                              \
    __attribute__((always_inline)) static inline void NAME##_body(void *vctx, int64_t n,    \
                                                                  char *const *p,            \
                                                                  const int64_t *s, int64_t flat) \
    {                                                                                        \
        (void)vctx;                                                                          \
        (void)flat;                                                                          \
        if (s[0] != (int64_t)sizeof(T) || s[1] != (int64_t)sizeof(T)) {                      \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(T *)(p[0] + i * s[0]) = WHOLE(*(const T *)(p[1] + i * s[1]));              \
            return;                                                                          \
        }                                                                                    \
        T y[TRIG_BLOCK];                                                                     \
        for (int64_t base = 0; base < n; base += TRIG_BLOCK) {                               \
            const int m = (int)(n - base < TRIG_BLOCK ? n - base : TRIG_BLOCK);              \
            const T *in = (const T *)p[1] + base;                                            \
            for (int j = 0; j < m; j++)                                                      \
                y[j] = NEAR(in[j]);                                                          \
            for (int j = 0; j < m; j++)                                                      \
                if (!(FABS(in[j]) <= (T)0x1p20)) /* no branch on the sign */                 \
                    y[j] = WHOLE(in[j]);                                                     \
            memcpy((T *)p[0] + base, y, (size_t)m * sizeof(T));                              \
        }                                                                                    \
    }                                                                                        \
    NB_CPU_SIMD_LOOP(NAME)
static inline double sin_d_near(double x) { return nb__sin_d_near(x, 0); }
static inline double cos_d_near(double x) { return nb__sin_d_near(x, 1); }
UN_TRIG_ROW(un_sin_blocks_f32, float, __builtin_fabsf, nb__sinf_near, nb_sinf)
UN_TRIG_ROW(un_cos_blocks_f32, float, __builtin_fabsf, nb__cosf_near, nb_cosf)
UN_TRIG_ROW(un_sin_blocks_f64, double, __builtin_fabs, sin_d_near, nb__sin_d)
UN_TRIG_ROW(un_cos_blocks_f64, double, __builtin_fabs, cos_d_near, nb__cos_d)

/* [op][0: f32, 1: f64] and [op][0: i32, 1: i64] */
static const nb_cpu_loop_fn un_float_table[][2] = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = {un_##name##_f32, un_##name##_f64},
#include "lib/core/ops.def"
};
#define INT_ENTRY_FLOAT(name) {NULL, NULL}
#define INT_ENTRY_NUMERIC(name) {un_##name##_i32, un_##name##_i64}
static const nb_cpu_loop_fn un_int_table[][2] = {
#define NB_UNARY(ID, name, dtypes, cost, api) [NB_UN_##ID] = INT_ENTRY_##dtypes(name),
#include "lib/core/ops.def"
};
_Static_assert(sizeof un_float_table / sizeof un_float_table[0] == NB_UN_COUNT &&
               sizeof un_int_table / sizeof un_int_table[0] == NB_UN_COUNT, "unary tables and ops.def disagree");

nb_cpu_loop_fn nb__cpu_unary_loop(nb_unary_op op, nb_dtype out, nb_dtype x, double alpha, nb_cpu_un_ctx *ctx,
                                  bool *heavy_out)
{
    if ((unsigned)op >= NB_UN_COUNT || x != out)
        return NULL;
    nb_cpu_loop_fn fn = NULL;
    un_ctx c = {alpha, 0};
    bool heavy = nb__unary_heavy(op);
    if (x == NB_F32 || x == NB_F64) {
        int k = x == NB_F64;
        fn = un_float_table[op][k];
        if (op == NB_UN_SIN)
            fn = k ? un_sin_blocks_f64 : un_sin_blocks_f32;
        else if (op == NB_UN_COS)
            fn = k ? un_cos_blocks_f64 : un_cos_blocks_f32;
        if (op == NB_UN_POW_SCALAR) {
            /* the exponents that are a multiplication or a division: cheap loops */
            if (alpha == 2) {
                fn = k ? un_square_f64 : un_square_f32;
                heavy = false;
            } else if (alpha == 1) {
                fn = k ? un_identity_f64 : un_identity_f32;
                heavy = false;
            } else if (alpha == -1) {
                fn = k ? un_reciprocal_f64 : un_reciprocal_f32;
                heavy = false;
            } else {
                fn = k ? un_pow_general_f64 : un_pow_general_f32;
            }
        }
    } else if (x == NB_I32 || x == NB_I64) {
        int k = x == NB_I64;
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
    *ctx = c;
    *heavy_out = heavy;
    return fn;
}

nb_status nb__cpu_unary(nb_device *dev, nb_unary_op op, const nb_view *out, const nb_view *x,
                        double alpha)
{
    if ((unsigned)op >= NB_UN_COUNT)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "unary: unknown op %d", (int)op);
    const char *name = nb__unary_name(op);
    if (x->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s differs from input dtype %s",
                        name, nb_dtype_name(out->dtype), nb_dtype_name(x->dtype));
    un_ctx c;
    bool heavy;
    nb_cpu_loop_fn fn = nb__cpu_unary_loop(op, out->dtype, x->dtype, alpha, &c, &heavy);
    if (!fn)
        return nb__cpu_unsupported(dev, name, x->dtype);
    const nb_view *views[2] = {out, x};
    nb__cpu_iter_views(2, views, fn, &c, heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
    return NB_OK;
}
