/* Binary elementwise kernels, one loop per (op, dtype) around the op's formula
 * in lib/core/formulas.h, generated from lib/core/ops.def: arithmetic on f32
 * and f64, and on i32 and i64 where the list allows integers (wrapping;
 * integer DIV truncates toward zero); comparisons on every CPU dtype, writing
 * NB_BOOL. Float MAX/MIN propagate NaN. And where, on any CPU dtype. */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

/* One loop function per (op, dtype) with fast paths for same-shape contiguous
 * operands and for a scalar-broadcast one: BIN_BODY makes its body, BIN_ROW
 * the function, compiled for the build's baseline, BIN_ROW_SIMD the function
 * that runs the body as compiled for the CPU's vector level (NB_CPU_SIMD_LOOP:
 * pow's exp and log vectorise to its width, with the same bits at every
 * level). No pointer is restrict, since an op may run in place (as
 * cpu_unary.c's loops). */
#define BIN_BODY(NAME, T, TO, EXPR)                                                          \
    __attribute__((always_inline)) static inline void NAME##_body(void *ctx, int64_t n,     \
                                                                  char *const *p,            \
                                                                  const int64_t *s, int64_t flat) \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        const int64_t es = (int64_t)sizeof(T);                                               \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == es && s[2] == es) {                       \
            TO *o = (TO *)p[0];                                                              \
            const T *a = (const T *)p[1], *b = (const T *)p[2];                              \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = a[i], y = b[i];                                                  \
                o[i] = (TO)(EXPR);                                                           \
            }                                                                                \
        } else if (s[0] == (int64_t)sizeof(TO) && s[1] == es && s[2] == 0) {                 \
            TO *o = (TO *)p[0];                                                              \
            const T *a = (const T *)p[1];                                                    \
            const T y = *(const T *)p[2];                                                    \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = a[i];                                                            \
                o[i] = (TO)(EXPR);                                                           \
            }                                                                                \
        } else if (s[0] == (int64_t)sizeof(TO) && s[1] == 0 && s[2] == es) {                 \
            TO *o = (TO *)p[0];                                                              \
            const T *b = (const T *)p[2];                                                    \
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
#define BIN_ROW(NAME, T, TO, EXPR)                                                           \
    BIN_BODY(NAME, T, TO, EXPR)                                                              \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        NAME##_body(ctx, n, p, s, flat);                                                     \
    }
#define BIN_ROW_SIMD(NAME, T, TO, EXPR) BIN_BODY(NAME, T, TO, EXPR) NB_CPU_SIMD_LOOP(NAME)
/* The float rows by the op's cost in ops.def: a heavy formula (pow) gains
 * from wide vectors; a light one (add, max, a comparison) is bound by memory,
 * and its loops stay as they were, so that which of two NaNs an add keeps
 * (the operand order a copy's code picks) is the same in an eager op and in
 * a fused or recorded one, whatever the level. */
#define BIN_ROW_LIGHT BIN_ROW
#define BIN_ROW_HEAVY BIN_ROW_SIMD

/* f32 and f64: every op. i32 and i64: every op the list allows on integers
 * (NUMERIC or ANY). bool and u8: the comparisons (ANY, CMP). */
#define OUT_ARITH(T) T
#define OUT_CMP(T) uint8_t
#define NB_BINARY(ID, name, dtypes, cost, kind, api)                                         \
    BIN_ROW_##cost(bin_##name##_f32, float, OUT_##kind(float), nb_bin_##name##_f32(x, y))    \
    BIN_ROW_##cost(bin_##name##_f64, double, OUT_##kind(double), nb_bin_##name##_f64(x, y))
#include "lib/core/ops.def"

#define INT_ROWS(name, kind)                                                                 \
    BIN_ROW(bin_##name##_i32, int32_t, OUT_##kind(int32_t), nb_bin_##name##_i32(x, y))       \
    BIN_ROW(bin_##name##_i64, int64_t, OUT_##kind(int64_t), nb_bin_##name##_i64(x, y))
#define INT_ROWS_FLOAT(name, kind)
#define INT_ROWS_NUMERIC(name, kind) INT_ROWS(name, kind)
#define INT_ROWS_ANY(name, kind) INT_ROWS(name, kind) BIN_ROW(bin_##name##_u8, uint8_t, uint8_t, nb_bin_##name##_u8(x, y))
#define NB_BINARY(ID, name, dtypes, cost, kind, api) INT_ROWS_##dtypes(name, kind)
#include "lib/core/ops.def"

#define ENTRY_FLOAT(name) [NB_F32] = bin_##name##_f32, [NB_F64] = bin_##name##_f64
#define ENTRY_NUMERIC(name) ENTRY_FLOAT(name), [NB_I32] = bin_##name##_i32, [NB_I64] = bin_##name##_i64
#define ENTRY_ANY(name) ENTRY_NUMERIC(name), [NB_BOOL] = bin_##name##_u8, [NB_U8] = bin_##name##_u8
static const nb_cpu_loop_fn bin_table[][NB_DTYPE_COUNT] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) [NB_BIN_##ID] = {ENTRY_##dtypes(name)},
#include "lib/core/ops.def"
};
_Static_assert(sizeof bin_table / sizeof bin_table[0] == NB_BIN_COUNT, "binary table and ops.def disagree");

nb_cpu_loop_fn nb__cpu_binary_loop(nb_binary_op op, nb_dtype out, nb_dtype a, nb_dtype b, bool *heavy)
{
    if ((unsigned)op >= NB_BIN_COUNT || (unsigned)a >= NB_DTYPE_COUNT || b != a ||
        out != (nb__binary_is_comparison(op) ? NB_BOOL : a))
        return NULL;
    *heavy = nb__binary_heavy(op) && (a == NB_F32 || a == NB_F64);
    return bin_table[op][a];
}

nb_status nb__cpu_binary(nb_device *dev, nb_binary_op op, const nb_view *out, const nb_view *a,
                         const nb_view *b)
{
    if ((unsigned)op >= NB_BIN_COUNT)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "binary: unknown op %d", (int)op);
    const char *name = nb__binary_name(op);
    if ((unsigned)a->dtype >= NB_DTYPE_COUNT || !bin_table[op][a->dtype])
        return nb__cpu_unsupported(dev, name, a->dtype);
    bool heavy;
    nb_cpu_loop_fn fn = nb__cpu_binary_loop(op, out->dtype, a->dtype, b->dtype, &heavy);
    if (!fn)
        return nb__fail(NB_ERR_DTYPE, "%s: dtypes %s, %s -> %s do not fit", name,
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype),
                        nb_dtype_name(out->dtype));
    const nb_view *views[3] = {out, a, b};
    nb__cpu_iter_views(3, views, fn, NULL, heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
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
            T *o = (T *)p[0];                                                                \
            const uint8_t *c = (const uint8_t *)p[1];                                        \
            const T *a = (const T *)p[2], *b = (const T *)p[3];                              \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T x = a[i], y = b[i]; /* both read: a select, not a branch */          \
                o[i] = c[i] ? x : y;                                                         \
            }                                                                                \
        } else if (s[0] == es && s[1] == 1 && s[2] == 0 && s[3] == 0) {                      \
            T *o = (T *)p[0];                                                                \
            const uint8_t *c = (const uint8_t *)p[1];                                        \
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

nb_cpu_loop_fn nb__cpu_where_loop(nb_dtype out, nb_dtype cond, nb_dtype a, nb_dtype b)
{
    if ((cond != NB_BOOL && cond != NB_U8) || a != out || b != out)
        return NULL;
    switch (out) {
    case NB_F32: case NB_I32: return where_4;
    case NB_F64: case NB_I64: return where_8;
    case NB_BOOL: case NB_U8: return where_1;
    default: return NULL;
    }
}

nb_status nb__cpu_where(nb_device *dev, const nb_view *out, const nb_view *cond,
                        const nb_view *a, const nb_view *b)
{
    if (!nb__cpu_where_loop(out->dtype, NB_BOOL, out->dtype, out->dtype))
        return nb__cpu_unsupported(dev, "where", out->dtype);
    if (cond->dtype != NB_BOOL && cond->dtype != NB_U8)
        return nb__fail(NB_ERR_DTYPE, "where: condition dtype %s is not bool",
                        nb_dtype_name(cond->dtype));
    if (a->dtype != out->dtype || b->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "where: dtypes %s and %s differ from the output's %s",
                        nb_dtype_name(a->dtype), nb_dtype_name(b->dtype),
                        nb_dtype_name(out->dtype));
    nb_cpu_loop_fn fn = nb__cpu_where_loop(out->dtype, cond->dtype, a->dtype, b->dtype);
    const nb_view *views[4] = {out, cond, a, b};
    nb__cpu_iter_views(4, views, fn, NULL, NB_CPU_GRAIN);
    return NB_OK;
}
