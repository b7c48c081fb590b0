/* nabla — reading data files. */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads an IDX file (the MNIST format), gzip-compressed or plain, into a new CPU
 * tensor of the file's shape and element type (u8 -> NB_U8, i8 -> NB_U8 bits,
 * i32 -> NB_I32, f32 -> NB_F32, f64 -> NB_F64; i16 is NB_ERR_UNSUPPORTED). Returns
 * it owned by the current scope, or NULL with NB_ERR_IO naming the file when it
 * is missing, truncated, or its header, dimensions or size disagree. */
nb_tensor *nb_idx_read(const char *path);

#ifdef __cplusplus
}
#endif
#endif
