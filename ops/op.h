/* nabla internal — what every op's front end uses: input checks, placement,
 * output allocation, recording, and gradient helpers. The checks, broadcasting
 * and finishing (op.c) call no op; placement (placement.c) and the gradient
 * helpers (reduce.c) are ops themselves, built on op.c like every other. */
#ifndef NB_OPS_OP_H
#define NB_OPS_OP_H

#include "lib/core/backend.h"
#include "lib/core/core.h"
#include "lib/core/recording.h"

/* A tensor's (ndim, shape) as two arguments, for nb__sum_to and friends. */
#define SHAPE_OF(t) (t)->ndim, (t)->shape

/* ---- checks (op.c) ---- */

/* NB_ERR_DTYPE "<op>: <what> has dtype X; expected one of ..." unless t's dtype is
 * in mask. Returns NB_OK or the error. */
nb_status nb__check_dtype(const char *op, const char *what, const nb_tensor *t, unsigned mask);
/* NB_ERR_DTYPE "<op>: dtypes differ: f32 and f64 (use nb_cast)" unless equal. */
nb_status nb__check_same_dtype(const char *op, const nb_tensor *a, const nb_tensor *b);
/* Normalises a possibly negative axis into [0, ndim); -1 and NB_ERR_INVALID_ARGUMENT
 * "<op>: axis 5 is out of range for a 2-d tensor" otherwise. */
int nb__axis(const char *op, int axis, int ndim);
/* Turns a set of axes into a bit mask of dims (NB_ALL_AXES: every dim); -1 on a
 * bad or repeated axis (with the error recorded). */
int nb__axes_mask(const char *op, nb_axes axes, int ndim);

/* ---- placement (placement.c) ---- */

/* Chooses the device for an op with n inputs by the placement rules: the pushed
 * device, else the inputs' own. With a device pushed, an input elsewhere is
 * replaced in inputs[] by a recorded copy (owned by the current scope). NULL and
 * NB_ERR_DEVICE for inputs on two devices with nothing pushed. */
nb_device *nb__op_place(const char *op, int n, const nb_tensor **inputs);

/* Whether dev's backend runs kernel k (variant: the unary, binary or reduce op)
 * for dtype: its supports entry, or its dtype mask when it has none. */
bool nb__supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype);

/* nb__op_place, then the capability query: when the chosen device does not run
 * kernel k for dtype, soft placement moves the op to /cpu:0 (inputs copied
 * there and recorded, one warning per kind of fallback) and returns it; strict
 * placement, or a CPU that lacks it too, is NB_ERR_UNSUPPORTED naming op, the
 * device and the dtype (NULL returned). Ops call it before allocating. */
nb_device *nb__op_place_kernel(const char *op, int n, const nb_tensor **inputs, nb_kernel k, int variant,
                               nb_dtype dtype);

/* ---- contiguous copies, broadcasting, allocation, finishing (op.c) ---- */

/* t itself when contiguous, else a private contiguous copy on t's device (not
 * scoped, not recorded: for handing a kernel contiguous data); *tmp receives
 * the copy to nb__release afterwards, or NULL. NULL with the error recorded
 * when the copy fails. */
const nb_tensor *nb__dense(const char *op, const nb_tensor *t, nb_tensor **tmp);

/* NumPy broadcasting of two shapes into out (ndim in *ndim); false and
 * NB_ERR_SHAPE naming both shapes when they do not broadcast. */
bool nb__broadcast(const char *op, const nb_tensor *a, const nb_tensor *b, int *ndim, int64_t *out);

/* Allocates op's output on dev; NULL and an error naming op on failure (a
 * dtype dev cannot hold, a size past any device, no memory). Not scoped:
 * nb__finish hands it out. */
static inline nb_tensor *nb__out(const char *op, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape)
{
    return nb__tensor_new(op, dev, dtype, ndim, shape);
}

/* Finishes an op with one output: records it when a tape is recording, logs its
 * placement, and hands out to the current scope. attrs may be NULL. */
nb_tensor *nb__finish(const nb_op_def *def, int n_in, const nb_tensor *const *inputs, nb_tensor *out,
                      const nb_op_attrs *attrs);

/* For gradient functions: NB_OK when every given result is non-NULL, else the
 * pending error (a failed op inside recorded one). */
static inline nb_status nb__ok(const void *p)
{
    return p ? NB_OK : nb_error() ? nb_error() : NB_ERR_INTERNAL;
}
static inline nb_status nb__ok2(const void *a, const void *b)
{
    nb_status st = nb__ok(a);
    return st ? st : nb__ok(b);
}

/* Calls a kernel's status; on failure releases out and returns NULL. */
static inline nb_tensor *nb__kernel_done(nb_status st, nb_tensor *out)
{
    if (st) {
        nb__release(out);
        return NULL;
    }
    return out;
}

/* ---- gradient helpers, made of ops (reduce.c) ---- */

/* Sums g over the dims that broadcasting added or stretched, giving shape (ndim,
 * shape): the gradient of a broadcast input. Returns g itself when shapes match,
 * else a new tensor owned by the current scope; NULL (the error kept) when g is
 * NULL or an op fails. */
nb_tensor *nb__sum_to(nb_tensor *g, int ndim, const int64_t *shape);
/* Reshapes a reduced gradient back to keepdims form (mask: the reduced dims)
 * and broadcasts it to x's shape: a new tensor owned by the current scope, or
 * NULL (the error kept) when g is NULL or an op fails. */
nb_tensor *nb__expand_reduced(nb_tensor *g, const nb_tensor *x, int mask);

/* Internal ops shared between files. */
nb_tensor *nb__unary(nb_unary_op kop, const nb_tensor *x, double alpha);
nb_tensor *nb__binary(nb_binary_op kop, const nb_tensor *a, const nb_tensor *b);
/* A recorded copy of t on dev (placement.c), owned by the current scope; NULL
 * with the error recorded (no device, no memory, a captured step). */
nb_tensor *nb__copy_to_device(const nb_tensor *t, nb_device *dev);
/* A zero-gradient step mask x > 0 (as x's dtype). */
nb_tensor *nb__step(const nb_tensor *x);
/* Scatter-add of updates rows into zeros of shape (rows, ...): gather's gradient. */
nb_tensor *nb__scatter_add(const nb_tensor *indices, const nb_tensor *updates, int ndim, const int64_t *shape);
/* nb_dropout whose mask seed is seed + *seed_add, the double read from the
 * device's memory when the mask is drawn (seed_add NULL: seed alone): how a
 * dropout layer in a recorded step draws a new mask at each replay. */
nb_tensor *nb__dropout_at(const nb_tensor *x, double rate, uint64_t seed, const double *seed_add);

#endif
