/* nabla — tensors: creation, views, reading back, and ownership by scopes.
 *
 * Ownership: a tensor a function returns belongs to the innermost open scope of
 * the calling thread and is released when that scope ends. With no scope open the
 * caller owns it and calls nb_release(). nb_keep() moves a tensor to the next
 * scope out (or to the caller when there is none) so it outlives its scope.
 * Tensors are reference counted inside, so a tape or a variable can hold one past
 * its scope. Creation functions place the tensor on the current device (the top
 * of the thread's device stack, /cpu:0 when nothing is pushed). */
#ifndef NABLA_TENSOR_H
#define NABLA_TENSOR_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- scopes ---------------------------------------------------------------- */

/* Opens a scope on the calling thread. Returns its handle, which is ended by
 * nb_scope_end and is never valid again afterwards (handles are not reused, so a
 * stale one cannot end a later scope). Returns NULL (NB_ERR_OUT_OF_MEMORY) only
 * when memory runs out. */
nb_scope *nb_scope_begin(void);

/* Ends scope s and every scope opened inside it, releasing the tensors (and
 * tapes) they own. A handle that is NULL, already ended, or opened on another
 * thread is NB_ERR_INVALID_ARGUMENT, and nothing is ended. */
nb_status nb_scope_end(nb_scope *s);

/* Moves t from the scope that owns it to the next one out; with no scope out,
 * the caller now owns t and must nb_release() it. Returns t, or NULL if t is NULL
 * or not owned by an open scope of this thread. */
nb_tensor *nb_keep(nb_tensor *t);

/* Drops the caller's reference to a tensor it owns (one returned with no scope
 * open, or moved out by nb_keep). NULL is ignored. */
void nb_release(nb_tensor *t);

/* Adds a reference owned by the current scope (or by the caller): the same
 * tensor, returned again. For handing one tensor to two owners. */
nb_tensor *nb_retain(nb_tensor *t);

/* Number of tensors alive in the process; tests check it returns to its start. */
int64_t nb_live_tensors(void);

/* ---- creation -------------------------------------------------------------- */

/* Each returns a new tensor on the current device, owned as described above, or
 * NULL on a bad shape (NB_ERR_SHAPE), a dtype the device lacks (NB_ERR_DTYPE) or
 * no memory (NB_ERR_OUT_OF_MEMORY). */
nb_tensor *nb_empty(nb_dtype dtype, nb_shape shape);
nb_tensor *nb_zeros(nb_dtype dtype, nb_shape shape);
nb_tensor *nb_ones(nb_dtype dtype, nb_shape shape);
nb_tensor *nb_full(nb_dtype dtype, nb_shape shape, double value);
nb_tensor *nb_scalar(nb_dtype dtype, double value);
/* 1-d tensor start, start+step, ... below stop (above it for a negative step). */
nb_tensor *nb_arange(nb_dtype dtype, double start, double stop, double step);
/* Copies count = prod(shape) elements of dtype from host memory at data. */
nb_tensor *nb_from_buffer(nb_dtype dtype, nb_shape shape, const void *data);
nb_tensor *nb_zeros_like(const nb_tensor *t);
nb_tensor *nb_ones_like(const nb_tensor *t);

/* Random tensors from a counter-based generator: the same seed gives the same
 * values on every run and every thread. Floating dtypes only (NB_ERR_DTYPE). */
nb_tensor *nb_random_normal(nb_dtype dtype, nb_shape shape, double mean, double stddev, uint64_t seed);
nb_tensor *nb_random_uniform(nb_dtype dtype, nb_shape shape, double low, double high, uint64_t seed);
/* Normal values redrawn until they lie within two standard deviations. */
nb_tensor *nb_truncated_normal(nb_dtype dtype, nb_shape shape, double mean, double stddev, uint64_t seed);

/* ---- properties ------------------------------------------------------------ */

nb_dtype nb_tensor_dtype(const nb_tensor *t);
int nb_tensor_ndim(const nb_tensor *t);
/* Returns dim i; negative i counts from the end. -1 when t is NULL or i is out of range. */
int64_t nb_tensor_dim(const nb_tensor *t, int i);
nb_shape nb_tensor_shape(const nb_tensor *t);
int64_t nb_tensor_numel(const nb_tensor *t);
/* Byte stride of dim i (0 for broadcast dims). */
int64_t nb_tensor_stride(const nb_tensor *t, int i);
bool nb_tensor_is_contiguous(const nb_tensor *t);
/* The device name, e.g. "/cpu:0"; a static string. */
const char *nb_tensor_device(const nb_tensor *t);
/* Size of one element of dtype in bytes; name such as "f32". */
size_t nb_dtype_size(nb_dtype dtype);
const char *nb_dtype_name(nb_dtype dtype);
/* Writes "[2, 3]" into buf (always NUL-terminated); returns buf. */
char *nb_shape_format(nb_shape shape, char *buf, size_t size);

/* ---- reading back ---------------------------------------------------------- */

/* Copies t's elements, in row-major order, into host memory at dst, which holds
 * size bytes. Waits for the device. Returns NB_ERR_INVALID_ARGUMENT when size is
 * less than numel * dtype size. */
nb_status nb_tensor_read(const nb_tensor *t, void *dst, size_t size);

/* Returns the value of a one-element tensor as a double; NaN and an error
 * (NB_ERR_SHAPE) when t has more than one element. */
double nb_tensor_item(const nb_tensor *t);

/* Returns element at the given row-major flat index as a double (slow: for
 * tests and printing). NaN and NB_ERR_INVALID_ARGUMENT when out of range. */
double nb_tensor_get(const nb_tensor *t, int64_t flat_index);

#ifdef __cplusplus
}
#endif
#endif
