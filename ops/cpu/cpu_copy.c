/* Creation and conversion kernels: fill, arange, copy (with dtype conversion).
 * Dtypes: f32, f64, i32, i64, bool, u8; f16 and bf16 for fill and copy alone
 * (the CPU stores them and converts them, computes in none of them). */
#include "cpu_internal.h"
#include "lib/core/formulas.h"
#include "lib/core/half.h"

#include <math.h>

static inline bool cpu_dtype_ok(nb_dtype d)
{
    return d == NB_F32 || d == NB_F64 || d == NB_I32 || d == NB_I64 || d == NB_BOOL || d == NB_U8;
}

static inline bool is_half(nb_dtype d) { return d == NB_F16 || d == NB_BF16; }

/* ---- fill ------------------------------------------------------------------------ */

#define FILL_ROW(NAME, T)                                                                    \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        (void)flat;                                                                          \
        const T v = *(const T *)ctx;                                                         \
        if (s[0] == (int64_t)sizeof(T)) {                                                    \
            T *restrict o = (T *)p[0];                                                       \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = v;                                                                    \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(T *)(p[0] + i * s[0]) = v;                                                 \
        }                                                                                    \
    }
FILL_ROW(fill_u8, uint8_t)
FILL_ROW(fill_u16, uint16_t)
FILL_ROW(fill_u32, uint32_t)
FILL_ROW(fill_u64, uint64_t)

nb_cpu_loop_fn nb__cpu_fill_loop(nb_dtype dtype, double value, nb_cpu_fill_ctx *v)
{
    v->u64 = 0;
    switch (dtype) {
    case NB_F32: v->f = (float)value; return fill_u32;
    case NB_F64: v->d = value; return fill_u64;
    case NB_I32: v->i = nb_cast_to_i32(value); return fill_u32;
    case NB_I64: v->l = nb_cast_to_i64(value); return fill_u64;
    case NB_BOOL: v->u8 = value != 0; return fill_u8;
    case NB_U8: v->u8 = nb_cast_to_u8(value); return fill_u8;
    case NB_F16: v->u16 = nb__f16_from_double(value); return fill_u16;
    case NB_BF16: v->u16 = nb__bf16_from_double(value); return fill_u16;
    default: return NULL;
    }
}

nb_status nb__cpu_fill(nb_device *dev, const nb_view *out, double value)
{
    nb_cpu_fill_ctx v;
    nb_cpu_loop_fn fn = nb__cpu_fill_loop(out->dtype, value, &v);
    if (!fn)
        return nb__cpu_unsupported(dev, "fill", out->dtype);
    const nb_view *views[1] = {out};
    nb__cpu_iter_views(1, views, fn, &v, NB_CPU_GRAIN * 4);
    return NB_OK;
}

/* ---- arange ------------------------------------------------------------------------ */

typedef struct arange_ctx {
    double start, step;
    int64_t istart, istep;
    bool integral;
} arange_ctx;

#define ARANGE_FLOAT_ROW(NAME, T)                                                           \
    static void NAME(void *vctx, int64_t n, char *const *p, const int64_t *s, int64_t flat) \
    {                                                                                       \
        const arange_ctx *c = vctx;                                                         \
        for (int64_t i = 0; i < n; i++)                                                     \
            *(T *)(p[0] + i * s[0]) = (T)(c->start + (double)(flat + i) * c->step);         \
    }
ARANGE_FLOAT_ROW(arange_f32, float)
ARANGE_FLOAT_ROW(arange_f64, double)

#define ARANGE_INT_ROW(NAME, T, SAT)                                                        \
    static void NAME(void *vctx, int64_t n, char *const *p, const int64_t *s, int64_t flat) \
    {                                                                                       \
        const arange_ctx *c = vctx;                                                         \
        if (c->integral) {                                                                  \
            for (int64_t i = 0; i < n; i++)                                                 \
                *(T *)(p[0] + i * s[0]) =                                                   \
                    (T)((uint64_t)c->istart + (uint64_t)(flat + i) * (uint64_t)c->istep);   \
        } else {                                                                            \
            for (int64_t i = 0; i < n; i++)                                                 \
                *(T *)(p[0] + i * s[0]) = (T)SAT(c->start + (double)(flat + i) * c->step);  \
        }                                                                                   \
    }
ARANGE_INT_ROW(arange_i32, int32_t, nb_cast_to_i64)
ARANGE_INT_ROW(arange_i64, int64_t, nb_cast_to_i64)
ARANGE_INT_ROW(arange_u8, uint8_t, nb_cast_to_i64)

nb_status nb__cpu_arange(nb_device *dev, const nb_view *out, double start, double step)
{
    nb_cpu_loop_fn fn;
    switch (out->dtype) {
    case NB_F32: fn = arange_f32; break;
    case NB_F64: fn = arange_f64; break;
    case NB_I32: fn = arange_i32; break;
    case NB_I64: fn = arange_i64; break;
    case NB_U8: fn = arange_u8; break;
    default: return nb__cpu_unsupported(dev, "arange", out->dtype);
    }
    arange_ctx c = {start, step, nb_cast_to_i64(start), nb_cast_to_i64(step), false};
    c.integral = (double)c.istart == start && (double)c.istep == step;
    const nb_view *views[1] = {out};
    nb__cpu_iter_views(1, views, fn, &c, NB_CPU_GRAIN);
    return NB_OK;
}

/* ---- copy with conversion ------------------------------------------------------------- */

/* The conversion of x (source kind f: floating, i: integer, b: bool) to
 * each output type. A bool is read as x != 0, as the GPU's conversion reads
 * it, so a byte other than 0 and 1 (memory taken in from elsewhere) converts
 * as true on both. */
#define CVT_N_f(x) (x)
#define CVT_N_i(x) (x)
#define CVT_N_b(x) ((x) != 0)
#define CVT_f32(K, x) ((float)CVT_N_##K(x))
#define CVT_f64(K, x) ((double)CVT_N_##K(x))
/* Floating to integer: the rule of nb_cast_to_i32 and friends in
 * lib/core/formulas.h, which the GPU's conversions share. */
#define CVT_i32(K, x) CVT_i32_##K(x)
#define CVT_i32_f(x) nb_cast_to_i32((double)(x))
#define CVT_i32_i(x) ((int32_t)(x))
#define CVT_i32_b(x) ((int32_t)((x) != 0))
#define CVT_i64(K, x) CVT_i64_##K(x)
#define CVT_i64_f(x) nb_cast_to_i64((double)(x))
#define CVT_i64_i(x) ((int64_t)(x))
#define CVT_i64_b(x) ((int64_t)((x) != 0))
#define CVT_b8(K, x) ((uint8_t)((x) != 0))
#define CVT_u8(K, x) CVT_u8_##K(x)
#define CVT_u8_f(x) nb_cast_to_u8((double)(x))
#define CVT_u8_i(x) ((uint8_t)(x))
#define CVT_u8_b(x) ((uint8_t)((x) != 0))

#define CONV_ROW(TIN, TI, K, TOUT, TO)                                                        \
    static void conv_##TIN##_##TOUT(void *ctx, int64_t n, char *const *p, const int64_t *s,  \
                                    int64_t flat)                                            \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == (int64_t)sizeof(TI)) {                    \
            TO *o = (TO *)p[0];                                                              \
            const TI *in = (const TI *)p[1];                                                 \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = CVT_##TOUT(K, in[i]);                                                 \
        } else if (s[1] == 0) {                                                              \
            const TO v = CVT_##TOUT(K, *(const TI *)p[1]);                                   \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(TO *)(p[0] + i * s[0]) = v;                                                \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(TO *)(p[0] + i * s[0]) = CVT_##TOUT(K, *(const TI *)(p[1] + i * s[1]));    \
        }                                                                                    \
    }

#define CONV_FROM(TIN, TI, K)                                                                \
    CONV_ROW(TIN, TI, K, f32, float)                                                         \
    CONV_ROW(TIN, TI, K, f64, double)                                                        \
    CONV_ROW(TIN, TI, K, i32, int32_t)                                                       \
    CONV_ROW(TIN, TI, K, i64, int64_t)                                                       \
    CONV_ROW(TIN, TI, K, b8, uint8_t)                                                      \
    CONV_ROW(TIN, TI, K, u8, uint8_t)
CONV_FROM(f32, float, f)
CONV_FROM(f64, double, f)
CONV_FROM(i32, int32_t, i)
CONV_FROM(i64, int64_t, i)
CONV_FROM(b8, uint8_t, b)
CONV_FROM(u8, uint8_t, i)

#define CONV_TABLE_ROW(TIN)                                                                  \
    {[NB_F32] = conv_##TIN##_f32, [NB_F64] = conv_##TIN##_f64, [NB_I32] = conv_##TIN##_i32,   \
     [NB_I64] = conv_##TIN##_i64, [NB_BOOL] = conv_##TIN##_b8, [NB_U8] = conv_##TIN##_u8}
static const nb_cpu_loop_fn conv_table[NB_DTYPE_COUNT][NB_DTYPE_COUNT] = {
    [NB_F32] = CONV_TABLE_ROW(f32), [NB_F64] = CONV_TABLE_ROW(f64),
    [NB_I32] = CONV_TABLE_ROW(i32), [NB_I64] = CONV_TABLE_ROW(i64),
    [NB_BOOL] = CONV_TABLE_ROW(b8), [NB_U8] = CONV_TABLE_ROW(u8),
};

/* f16 and bf16: every conversion goes through double, which holds every
 * value of every dtype here but i64 exactly (an i64 rounds once, to double,
 * before it rounds to 16 bits; the GPU's conversion does the same). */
static inline double half_in(nb_dtype d, const char *p)
{
    switch (d) {
    case NB_F16: return nb__f16_to_double(*(const uint16_t *)p);
    case NB_BF16: return nb__bf16_to_double(*(const uint16_t *)p);
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    case NB_BOOL: return *(const uint8_t *)p != 0;
    default: return *(const uint8_t *)p; /* u8 */
    }
}

static inline void half_out(nb_dtype d, char *p, double v)
{
    switch (d) {
    case NB_F16: *(uint16_t *)p = nb__f16_from_double(v); break;
    case NB_BF16: *(uint16_t *)p = nb__bf16_from_double(v); break;
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_I32: *(int32_t *)p = nb_cast_to_i32(v); break;
    case NB_I64: *(int64_t *)p = nb_cast_to_i64(v); break;
    case NB_BOOL: *(uint8_t *)p = v != 0; break;
    default: *(uint8_t *)p = nb_cast_to_u8(v); break;
    }
}

/* f32 to and from f16 and bf16, the conversions mixed precision makes. */
#define HALF_ROW(NAME, TO, TI, CVT)                                                          \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == (int64_t)sizeof(TI)) {                    \
            TO *o = (TO *)p[0];                                                              \
            const TI *in = (const TI *)p[1];                                                 \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = CVT(in[i]);                                                           \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(TO *)(p[0] + i * s[0]) = CVT(*(const TI *)(p[1] + i * s[1]));              \
        }                                                                                    \
    }
HALF_ROW(f32_to_bf16, uint16_t, float, nb__bf16_from_float)
HALF_ROW(bf16_to_f32, float, uint16_t, nb__bf16_to_float)
HALF_ROW(f32_to_f16, uint16_t, float, nb__f16_from_float)
HALF_ROW(f16_to_f32, float, uint16_t, nb__f16_to_float)

static nb_cpu_loop_fn half_f32_row(nb_dtype out, nb_dtype in)
{
    if (in == NB_F32)
        return out == NB_BF16 ? f32_to_bf16 : out == NB_F16 ? f32_to_f16 : NULL;
    if (out == NB_F32)
        return in == NB_BF16 ? bf16_to_f32 : in == NB_F16 ? f16_to_f32 : NULL;
    return NULL;
}

static void conv_half(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)
{
    (void)flat;
    const nb_cpu_copy_ctx *d = ctx;
    for (int64_t i = 0; i < n; i++)
        half_out(d->out, p[0] + i * s[0], half_in(d->in, p[1] + i * s[1]));
}

/* Same dtype: plain element moves. */
#define MOVE_ROW(NAME, T)                                                                    \
    static void NAME(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)  \
    {                                                                                        \
        (void)ctx;                                                                           \
        (void)flat;                                                                          \
        if (s[0] == (int64_t)sizeof(T) && s[1] == (int64_t)sizeof(T)) {                      \
            memcpy(p[0], p[1], (size_t)n * sizeof(T));                                       \
        } else if (s[1] == 0) {                                                              \
            const T v = *(const T *)p[1];                                                    \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(T *)(p[0] + i * s[0]) = v;                                                 \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++)                                                  \
                *(T *)(p[0] + i * s[0]) = *(const T *)(p[1] + i * s[1]);                     \
        }                                                                                    \
    }
MOVE_ROW(move_1, uint8_t)
MOVE_ROW(move_2, uint16_t)
MOVE_ROW(move_4, uint32_t)
MOVE_ROW(move_8, uint64_t)

/* Whether converting in to out moves the bytes unchanged. */
static bool is_move(nb_dtype out, nb_dtype in) { return in == out; }

nb_cpu_loop_fn nb__cpu_copy_loop(nb_dtype out, nb_dtype in, nb_cpu_copy_ctx *ctx)
{
    ctx->out = out, ctx->in = in;
    if ((!cpu_dtype_ok(in) && !is_half(in)) || (!cpu_dtype_ok(out) && !is_half(out)))
        return NULL;
    if (is_move(out, in)) {
        int64_t es = nb__cpu_esize(in);
        return es == 1 ? move_1 : es == 2 ? move_2 : es == 4 ? move_4 : move_8;
    }
    nb_cpu_loop_fn fn = half_f32_row(out, in); /* f32 and a half: bit operations */
    if (fn)
        return fn;
    if (is_half(in) || is_half(out))
        return conv_half;
    return conv_table[in][out];
}

nb_status nb__cpu_copy(nb_device *dev, const nb_view *out, const nb_view *in)
{
    nb_cpu_copy_ctx ctx;
    nb_cpu_loop_fn fn = nb__cpu_copy_loop(out->dtype, in->dtype, &ctx);
    if (!fn)
        return nb__cpu_unsupported(dev, "copy", cpu_dtype_ok(in->dtype) || is_half(in->dtype) ? out->dtype : in->dtype);
    /* a dense move is one memcpy: the same bytes the move loop writes */
    if (is_move(out->dtype, in->dtype) && in->contiguous && out->contiguous) {
        nb__cpu_copy_from_host(dev, out->data, in->data, (size_t)(out->numel * nb__cpu_esize(out->dtype)));
        return NB_OK;
    }
    const nb_view *views[2] = {out, in};
    nb__cpu_iter_views(2, views, fn, &ctx, NB_CPU_GRAIN);
    return NB_OK;
}
