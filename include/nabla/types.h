/* nabla — basic types shared by every public header. */
#ifndef NABLA_TYPES_H
#define NABLA_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions a tensor may have. */
#define NB_MAX_DIMS 8

/* Element types. Ops never promote silently: mixing dtypes is an error. */
typedef enum nb_dtype {
    NB_F32 = 0, /* the default */
    NB_F64,     /* gradient checks */
    NB_F16,     /* computed on a GPU; a CPU stores and converts it */
    NB_BF16,    /* computed on a GPU; a CPU stores and converts it */
    NB_I32,
    NB_I64,     /* labels, indices */
    NB_BOOL,    /* masks, one byte per element, 0 or 1 */
    NB_U8,
    NB_DTYPE_COUNT
} nb_dtype;

/* A shape: up to NB_MAX_DIMS int64 dims. Passed by value. */
typedef struct nb_shape {
    int ndim;
    int64_t dims[NB_MAX_DIMS];
} nb_shape;

/* NB_NARGS(a, b, c) counts its 1 to 8 arguments (3 here). */
#define NB__NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, N, ...) N
#define NB_NARGS(...) NB__NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)

/* NB_SHAPE(2, 3) builds an nb_shape literal; NB_SCALAR is the 0-d shape. */
#define NB_SHAPE(...) ((nb_shape){NB_NARGS(__VA_ARGS__), {__VA_ARGS__}})
#define NB_SCALAR ((nb_shape){0, {0}})

/* Opaque handles. */
typedef struct nb_tensor nb_tensor;
typedef struct nb_scope nb_scope;
typedef struct nb_tape nb_tape;
typedef struct nb_variable nb_variable;
typedef struct nb_optimizer nb_optimizer;

/* Status codes. 0 is success; every failure is one of these. */
typedef enum nb_status {
    NB_OK = 0,
    NB_ERR_INVALID_ARGUMENT, /* NULL, a bad value, an out-of-range axis */
    NB_ERR_SHAPE,            /* shapes that do not fit together */
    NB_ERR_DTYPE,            /* a dtype the op does not take, or two that differ */
    NB_ERR_DEVICE,           /* unknown device, strict placement, inputs on two devices */
    NB_ERR_OUT_OF_MEMORY,
    NB_ERR_TAPE,             /* a one-shot tape asked twice, a gradient that cannot be taken */
    NB_ERR_IO,               /* a file missing or malformed */
    NB_ERR_BACKEND,          /* a CUDA, cuBLAS, cuDNN, ... call failed */
    NB_ERR_UNSUPPORTED,      /* valid, but not available in this build or on this device */
    NB_ERR_INTERNAL,
    NB_ERR_OUT_OF_RANGE,     /* past the end: a dataset iterator with no more elements */
    NB_ERR_TIMEOUT           /* another process did not answer in time (it died or stopped) */
} nb_status;

#ifdef __cplusplus
}
#endif
#endif
