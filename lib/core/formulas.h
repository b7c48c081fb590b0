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
 * the loops, strides and dtypes. */
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

#define NB_T float
#define NB_F(fn) fn##f
#define NB_SUF(name) name##_f32
#include "formulas_float.inc"

#define NB_T double
#define NB_F(fn) fn
#define NB_SUF(name) name##_f64
#include "formulas_float.inc"

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
