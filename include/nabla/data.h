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
 * is missing, truncated, or its header, dimensions or size disagree, or its dims
 * multiply past 2^48 bytes (a zero dim counted as 1, so that no order of the
 * dims gets past). */
nb_tensor *nb_idx_read(const char *path);

/* The same from an IDX image already in memory: size bytes at data, gzip-
 * compressed or plain. The bytes are copied; the caller keeps data. Returns a
 * new CPU tensor owned by the current scope, or NULL with NB_ERR_IO naming the
 * buffer's size when the image is truncated or its header, dimensions or size
 * disagree (NB_ERR_UNSUPPORTED for i16), NB_ERR_INVALID_ARGUMENT when data is
 * NULL and size is not 0. */
nb_tensor *nb_idx_read_memory(const void *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif
