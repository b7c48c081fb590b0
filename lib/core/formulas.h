/* nabla internal — every elementwise formula of ops.def, written once.
 *
 * It compiles as C (the CPU kernels, ops/cpu) and as CUDA (the GPU kernels,
 * gpu/), so both devices compute the same expression: nb_un_<name>_<type>(x,
 * alpha) for each NB_UNARY op and nb_bin_<name>_<type>(x, y) for each NB_BINARY
 * op, for f32 and f64 (the GPU computes f16 and bf16 in f32), and for i32, i64
 * (and u8, comparisons only) where the list allows integers. Integer
 * arithmetic wraps (it is done unsigned: no undefined behaviour).
 *
 * A formula is a function of one element and the op's scalar; the kernels own
 * the loops, strides and dtypes.
 *
 * Beside each op's formula stands its reference for the tests,
 * NB_REF_UN(name, expression of x and a) or NB_REF_BIN(name, expression of x
 * and y): the same function written again in double from its definition and
 * libm, not from the kernel's stable or fast form, so that a test compares the
 * kernel with something other than itself. test_backend_ops and
 * test_cpu_kernels call nb_ref_un_<name>(x, a, int_bits) and
 * nb_ref_bin_<name>(x, y, int_bits) through tables made from ops.def, so a
 * listed op without a reference does not build. int_bits is 0 for the
 * floating dtypes and 32 or 64 for the integers (whose results the tests
 * truncate and wrap): one reference serves every dtype of its op. They are
 * defined once, on the double pass, and only for C. */
#ifndef NB_FORMULAS_H
#define NB_FORMULAS_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define NB_FN static inline __host__ __device__
#else
#define NB_FN static inline
#endif

#define NB_INV_SQRT2 0.70710678118654752440
#define NB_INV_SQRT_2PI 0.39894228040143267794

/* The references: defined (C only) or skipped, pass by pass. */
#define NB_REF_SKIP(...)
#ifdef __CUDACC__
#define NB_REF_DEFINE_UN NB_REF_SKIP
#define NB_REF_DEFINE_BIN NB_REF_SKIP
#else
#define NB_REF_DEFINE_UN(name, ...)                                                   \
    static inline double nb_ref_un_##name(double x, double a, int int_bits)          \
    {                                                                                 \
        (void)x, (void)a, (void)int_bits;                                             \
        return __VA_ARGS__;                                                           \
    }
#define NB_REF_DEFINE_BIN(name, ...)                                                  \
    static inline double nb_ref_bin_##name(double x, double y, int int_bits)         \
    {                                                                                 \
        (void)x, (void)y, (void)int_bits;                                             \
        return __VA_ARGS__;                                                           \
    }
/* x * y wrapped to a signed integer of int_bits bits, exactly (a double product
 * is not, past 2^53). */
static inline double nb_ref_wrapped_product(double x, double y, int int_bits)
{
    uint64_t p = (uint64_t)(int64_t)x * (uint64_t)(int64_t)y;
    return int_bits == 32 ? (double)(int32_t)(uint32_t)p : (double)(int64_t)p;
}
#endif
#define NB_REF_UN NB_REF_SKIP
#define NB_REF_BIN NB_REF_SKIP

#define NB_T float
#define NB_F(fn) fn##f
#define NB_SUF(name) name##_f32
#include "formulas_float.inc"

/* The double pass defines the references (the comparisons' too). */
#undef NB_REF_UN
#undef NB_REF_BIN
#define NB_REF_UN NB_REF_DEFINE_UN
#define NB_REF_BIN NB_REF_DEFINE_BIN
#define NB_T double
#define NB_F(fn) fn
#define NB_SUF(name) name##_f64
#include "formulas_float.inc"
#undef NB_REF_UN
#undef NB_REF_BIN
#define NB_REF_UN NB_REF_SKIP
#define NB_REF_BIN NB_REF_SKIP

#define NB_T int32_t
#define NB_U uint32_t
#define NB_T_LO -2147483648.0
#define NB_T_HI 2147483647.0
#define NB_SUF(name) name##_i32
#include "formulas_int.inc"

/* The top is the largest double below 2^63, so the conversion back is defined. */
#define NB_T int64_t
#define NB_U uint64_t
#define NB_T_LO -9223372036854775808.0
#define NB_T_HI 9223372036854774784.0
#define NB_SUF(name) name##_i64
#include "formulas_int.inc"

/* bool and u8: comparisons only. */
#define NB_T uint8_t
#define NB_SUF(name) name##_u8
#include "formulas_cmp.inc"

#undef NB_REF_UN
#undef NB_REF_BIN
#undef NB_REF_SKIP
#undef NB_REF_DEFINE_UN
#undef NB_REF_DEFINE_BIN

/* ---- nb_cast from floating to integer types, on every device ----
 * Truncates toward zero, saturates at the type's range and takes NaN to 0; to
 * u8 it goes through i32 and wraps. Written out because neither C nor the GPU
 * gives this by itself: a C conversion of NaN or of an out-of-range value is
 * undefined, and PTX's cvt.rzi gives INT_MIN (INT64_MIN) for NaN. f16 and bf16
 * come here widened to float or double. */
NB_FN int32_t nb_cast_to_i32(double v)
{
    return !(v == v) ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
}
/* 2^63 is a double and INT64_MAX is not: v at or past either end saturates. */
NB_FN int64_t nb_cast_to_i64(double v)
{
    return !(v == v) ? 0 : v >= 9223372036854775808.0 ? INT64_MAX : v < -9223372036854775808.0 ? INT64_MIN : (int64_t)v;
}
NB_FN uint8_t nb_cast_to_u8(double v) { return (uint8_t)(uint32_t)nb_cast_to_i32(v); }

#endif
