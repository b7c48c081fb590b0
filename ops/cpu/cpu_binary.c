/* Binary elementwise kernels and where.
 * Arithmetic (ADD SUB MUL DIV POW MAX MIN): f32, f64, i32, i64. Integer
 * arithmetic wraps; integer DIV truncates toward zero and gives 0 for a zero
 * divisor; integer POW is repeated multiplication (a negative exponent gives
 * 1/x truncated: 0 except for x = +-1). Float MAX/MIN propagate NaN.
 * Comparisons (EQ NE LT LE GT GE): f32, f64, i32, i64, bool, u8, writing NB_BOOL.
 * where: any CPU dtype (f32, f64, i32, i64, bool, u8); cond is NB_BOOL. */
#include "cpu_internal.h"

#include <math.h>

static const char *const bin_names[NB_BIN_COUNT] = {
    [NB_BIN_ADD] = "add", [NB_BIN_SUB] = "sub", [NB_BIN_MUL] = "mul", [NB_BIN_DIV] = "div",
    [NB_BIN_POW] = "pow", [NB_BIN_MAX] = "maximum", [NB_BIN_MIN] = "minimum",
    [NB_BIN_EQ] = "equal", [NB_BIN_NE] = "not_equal", [NB_BIN_LT] = "less",
    [NB_BIN_LE] = "less_equal", [NB_BIN_GT] = "greater", [NB_BIN_GE] = "greater_equal",
};

#define INT_HELPERS(SUF, T, U)                                                               \
    static inline T div_##SUF(T x, T y)                                                      \
    {                                                                                        \
        if (y == 0)                                                                          \
            return 0;                                                                        \
        if (y == -1)                                                                         \
            return (T)((U)0 - (U)x);                                                         \
        return x / y;                                                                        \
    }                                                                                        \
    static inline T pow_##SUF(T x, T y)                                                      \
    {                                                                                        \
        if (y < 0)                                                                           \
            return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;                            \
        U r = 1, b = (U)x;                                                                   \
        for (U e = (U)y; e; e >>= 1) {                                                       \
            if (e & 1)                                                                       \
                r *= b;                                                                      \
            b *= b;                                                                          \
        }                                                                                    \
        return (T)r;                                                                         \
    }
INT_HELPERS(i32, int32_t, uint32_t)
INT_HELPERS(i64, int64_t, uint64_t)

/* One loop function per (op, dtype) with fast paths for same-shape contiguous
 * operands and for a scalar-broadcast one. */
#define BIN_ROW(NAME, T, TO, EXPR)                                                           \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        const int64_t es = (int64_t)sizeof(T);                                               \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == es && s[2] == es) {                       \
            TO *restrict o = (TO *)p[0];                                                     \
            const T *restrict a = (const T *)p[1], *restrict b = (const T *)p[2];            \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = a[i], y = b[i];                                                  \
                o[i] = (TO)(EXPR);                                                           \
            }                                                                                \
        } else if (s[0] == (int64_t)sizeof(TO) && s[1] == es && s[2] == 0) {                 \
            TO *restrict o = (TO *)p[0];                                                     \
            const T *restrict a = (const T *)p[1];                                           \
            const T y = *(const T *)p[2];                                                    \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = a[i];                                                            \
                o[i] = (TO)(EXPR);                                                           \
            }                                                                                \
        } else if (s[0] == (int64_t)sizeof(TO) && s[1] == 0 && s[2] == es) {                 \
            TO *restrict o = (TO *)p[0];                                                     \
            const T *restrict b = (const T *)p[2];                                           \
            const T x = *(const T *)p[1];                                                    \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T y = b[i];                                                            \
                o[i] = (TO)(EXPR);                                                           \
            }                                                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = *(const T *)(p[1] + i * s[1]), y = *(const T *)(p[2] + i * s[2]); \
                *(TO *)(p[0] + i * s[0]) = (TO)(EXPR);                                       \
            }                                                                                \
        }                                                                                    \
    }

#define BIN_CMP_OPS(SUF, T)                                                                  \
    BIN_ROW(bin_eq_##SUF, T, uint8_t, x == y)                                                \
    BIN_ROW(bin_ne_##SUF, T, uint8_t, x != y)                                                \
    BIN_ROW(bin_lt_##SUF, T, uint8_t, x < y)                                                 \
    BIN_ROW(bin_le_##SUF, T, uint8_t, x <= y)                                                \
    BIN_ROW(bin_gt_##SUF, T, uint8_t, x > y)                                                 \
    BIN_ROW(bin_ge_##SUF, T, uint8_t, x >= y)

#define BIN_FLOAT_OPS(SUF, T, POW)                                                           \
    BIN_ROW(bin_add_##SUF, T, T, x + y)                                                      \
    BIN_ROW(bin_sub_##SUF, T, T, x - y)                                                      \
    BIN_ROW(bin_mul_##SUF, T, T, x * y)                                                      \
    BIN_ROW(bin_div_##SUF, T, T, x / y)                                                      \
    BIN_ROW(bin_pow_##SUF, T, T, POW(x, y))                                                  \
    BIN_ROW(bin_max_##SUF, T, T, (x > y || x != x) ? x : y)                                  \
    BIN_ROW(bin_min_##SUF, T, T, (x < y || x != x) ? x : y)                                  \
    BIN_CMP_OPS(SUF, T)

#define BIN_INT_OPS(SUF, T, U)                                                               \
    BIN_ROW(bin_add_##SUF, T, T, (U)x + (U)y)                                                \
    BIN_ROW(bin_sub_##SUF, T, T, (U)x - (U)y)                                                \
    BIN_ROW(bin_mul_##SUF, T, T, (U)x * (U)y)                                                \
    BIN_ROW(bin_div_##SUF, T, T, div_##SUF(x, y))                                            \
    BIN_ROW(bin_pow_##SUF, T, T, pow_##SUF(x, y))                                            \
    BIN_ROW(bin_max_##SUF, T, T, x > y ? x : y)                                              \
    BIN_ROW(bin_min_##SUF, T, T, x < y ? x : y)                                              \
    BIN_CMP_OPS(SUF, T)

BIN_FLOAT_OPS(f32, float, powf)
BIN_FLOAT_OPS(f64, double, pow)
BIN_INT_OPS(i32, int32_t, uint32_t)
BIN_INT_OPS(i64, int64_t, uint64_t)
BIN_CMP_OPS(u8, uint8_t)

#define BIN_ENTRY(OP, name)                                                                  \
    [OP] = {[NB_F32] = bin_##name##_f32, [NB_F64] = bin_##name##_f64,                        \
            [NB_I32] = bin_##name##_i32, [NB_I64] = bin_##name##_i64}
#define CMP_ENTRY(OP, name)                                                                  \
    [OP] = {[NB_F32] = bin_##name##_f32, [NB_F64] = bin_##name##_f64,                        \
            [NB_I32] = bin_##name##_i32, [NB_I64] = bin_##name##_i64,                        \
            [NB_BOOL] = bin_##name##_u8, [NB_U8] = bin_##name##_u8}
static const nb_cpu_loop_fn bin_table[NB_BIN_COUNT][NB_DTYPE_COUNT] = {
    BIN_ENTRY(NB_BIN_ADD, add), BIN_ENTRY(NB_BIN_SUB, sub), BIN_ENTRY(NB_BIN_MUL, mul),
    BIN_ENTRY(NB_BIN_DIV, div), BIN_ENTRY(NB_BIN_POW, pow), BIN_ENTRY(NB_BIN_MAX, max),
    BIN_ENTRY(NB_BIN_MIN, min), CMP_ENTRY(NB_BIN_EQ, eq), CMP_ENTRY(NB_BIN_NE, ne),
    CMP_ENTRY(NB_BIN_LT, lt), CMP_ENTRY(NB_BIN_LE, le), CMP_ENTRY(NB_BIN_GT, gt),
    CMP_ENTRY(NB_BIN_GE, ge),
};

nb_status nb__cpu_binary(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *a,
                         const nb_view *b)
{
    if ((unsigned)op >= NB_BIN_COUNT)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "binary: unknown op %d", (int)op);
    if ((unsigned)a->dtype >= NB_DTYPE_COUNT)
        return nb__cpu_unsupported(dev, bin_names[op], a->dtype);
    nb_cpu_loop_fn fn = bin_table[op][a->dtype];
    if (!fn)
        return nb__cpu_unsupported(dev, bin_names[op], a->dtype);
    nb_dtype want = op >= NB_BIN_EQ ? NB_BOOL : a->dtype;
    if (b->dtype != a->dtype || out->dtype != want)
        return nb__fail(NB_ERR_DTYPE, "%s: dtypes %s, %s -> %s do not fit", bin_names[op],
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype),
                        nb_dtype_name(out->dtype));
    nb_cpu_iter it;
    const nb_view *views[3] = {out, a, b};
    nb__cpu_iter_init(&it, 3, views);
    bool heavy = op == NB_BIN_POW && (a->dtype == NB_F32 || a->dtype == NB_F64);
    nb__cpu_iter_run(&it, fn, NULL, heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
    return NB_OK;
}

/* ---- where ------------------------------------------------------------------------------ */

#define WHERE_ROW(NAME, T)                                                                   \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        const int64_t es = (int64_t)sizeof(T);                                               \
        if (s[0] == es && s[1] == 1 && s[2] == es && s[3] == es) {                           \
            T *restrict o = (T *)p[0];                                                       \
            const uint8_t *restrict c = (const uint8_t *)p[1];                               \
            const T *restrict a = (const T *)p[2], *restrict b = (const T *)p[3];            \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = c[i] ? a[i] : b[i];                                                   \
        } else if (s[0] == es && s[1] == 1 && s[2] == 0 && s[3] == 0) {                      \
            T *restrict o = (T *)p[0];                                                       \
            const uint8_t *restrict c = (const uint8_t *)p[1];                               \
            const T a = *(const T *)p[2], b = *(const T *)p[3];                              \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = c[i] ? a : b;                                                         \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(T *)(p[0] + i * s[0]) = *(const uint8_t *)(p[1] + i * s[1])                \
                                              ? *(const T *)(p[2] + i * s[2])                \
                                              : *(const T *)(p[3] + i * s[3]);               \
        }                                                                                    \
    }
WHERE_ROW(where_1, uint8_t)
WHERE_ROW(where_4, uint32_t)
WHERE_ROW(where_8, uint64_t)

nb_status nb__cpu_where(nb_device *dev, const nb_view *out, const nb_view *cond,
                        const nb_view *a, const nb_view *b)
{
    nb_cpu_loop_fn fn;
    switch (out->dtype) {
    case NB_F32: case NB_I32: fn = where_4; break;
    case NB_F64: case NB_I64: fn = where_8; break;
    case NB_BOOL: case NB_U8: fn = where_1; break;
    default: return nb__cpu_unsupported(dev, "where", out->dtype);
    }
    if (cond->dtype != NB_BOOL && cond->dtype != NB_U8)
        return nb__fail(NB_ERR_DTYPE, "where: condition dtype %s is not bool",
                        nb_dtype_name(cond->dtype));
    if (a->dtype != out->dtype || b->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "where: dtypes %s and %s differ from the output's %s",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype),
                        nb_dtype_name(out->dtype));
    nb_cpu_iter it;
    const nb_view *views[4] = {out, cond, a, b};
    nb__cpu_iter_init(&it, 4, views);
    nb__cpu_iter_run(&it, fn, NULL, NB_CPU_GRAIN);
    return NB_OK;
}
