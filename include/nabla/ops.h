/* nabla — ops. Each runs now, on the device chosen by the placement rules (see
 * device.h), and returns a new tensor owned by the current scope (see tensor.h).
 * While a tape watches one of its inputs, the op is recorded and is
 * differentiable (except where noted).
 *
 * Every op fails the same way: it returns NULL and records an error that names the
 * op and the offending shapes, dtypes or devices: NB_ERR_SHAPE for shapes that do
 * not fit, NB_ERR_DTYPE for a dtype the op does not take or two inputs that differ
 * (nothing is promoted; use nb_cast), NB_ERR_DEVICE for inputs on two devices,
 * NB_ERR_INVALID_ARGUMENT for a bad axis or value. Given a NULL input an op
 * returns NULL and keeps the earlier error, so a chain is checked once at its end.
 * Binary elementwise ops broadcast by NumPy's rules.
 *
 * Edge points. What every op gives at its edges is policy, the same on every
 * device and kept by tests (test_differential compares with PyTorch in float64):
 * PyTorch's answer where it has one, TensorFlow's where PyTorch refuses.
 * - Floating values follow IEEE 754 and C's math library: x/0 is +-inf, 0/0 NaN,
 *   log(0) -inf, log and sqrt of a negative NaN, rsqrt(+-0) +-inf, pow(0, 0) 1,
 *   pow of a negative base NaN unless the exponent is an integer.
 * - NaN propagates: an op with a NaN input gives NaN where it enters, also
 *   through maximum/minimum and the max/min reductions; argmax/argmin take NaN as
 *   the extreme (its first index); comparisons with NaN are false (not_equal
 *   true). sign(NaN) is NaN (PyTorch gives 0; nabla does not turn NaN into a
 *   number), and abs's slope there is NaN too. Which NaN (sign, payload) a
 *   reduction gives is not kept: on the CPU a sum, mean, prod, max or min that
 *   meets a NaN gives the default one (positive, quiet), whatever order its
 *   vector lanes met them in.
 * - Integers wrap on overflow (two's complement); division truncates toward
 *   zero; division by zero is NB_ERR_INVALID_ARGUMENT. Casts: see nb_cast.
 * - Empty axes: sum 0, prod 1, mean NaN, logsumexp -inf; max, min, argmax and
 *   argmin over an empty axis are NB_ERR_SHAPE (nothing to pick);
 *   cumsum along an empty axis (or of an empty tensor) is an empty result of
 *   the same shape.
 * - cumsum propagates NaN and infinities as a sum does: from the element where
 *   one enters to the end of its run (inf + -inf is NaN), integers wrap.
 * - Slopes at kinks: relu, abs and sign have slope 0 at 0 (relu passes none at
 *   NaN); leaky_relu alpha at 0 and below; maximum/minimum split a tie in half;
 *   max/min reductions share a tie equally; x^0 has slope 0 everywhere, 0
 *   included, and pow's slope in its exponent is 0 where the base is <= 0;
 *   sqrt's slope at 0 is +inf. prod's gradient is exact where inputs are 0
 *   (no division by x), but NaN where an input is infinite; logsumexp is -inf when every input is -inf and +inf when
 *   one is +inf, with slope 0 on the finite inputs beside a +inf and NaN on the
 *   infinite ones (as PyTorch); sigmoid_cross_entropy's slope at a logit of 0 is
 *   0.5 - label.
 * - Softmax of a row holding +inf, or only -inf, is NaN, as in PyTorch.
 * - Indices out of range (gather, its gradient, sparse_softmax_cross_entropy
 *   labels) are NB_ERR_INVALID_ARGUMENT naming the op, the index, its position
 *   and the range, even where the result is empty. On the CPU the op fails; a
 *   GPU checks on the device without making the host wait, and the error comes
 *   from the next synchronising call (a read of any tensor of that device,
 *   nb_synchronize), which then fails and clears it; the op's result must not be used. one_hot gives a row of zeros for
 *   them, as TensorFlow does. */
#ifndef NABLA_OPS_H
#define NABLA_OPS_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A set of axes; negative axes count from the end. NB_ALL_AXES means every axis. */
typedef struct nb_axes {
    int n;
    int axes[NB_MAX_DIMS];
} nb_axes;
#define NB_AXES(...) ((nb_axes){NB_NARGS(__VA_ARGS__), {__VA_ARGS__}})
#define NB_ALL_AXES ((nb_axes){0, {0}})

/* ---- elementwise, two inputs (floating and integer dtypes) ------------------ */
nb_tensor *nb_add(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_sub(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_mul(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_div(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_pow(const nb_tensor *a, const nb_tensor *b);     /* floating only */
nb_tensor *nb_maximum(const nb_tensor *a, const nb_tensor *b); /* ties split the gradient */
nb_tensor *nb_minimum(const nb_tensor *a, const nb_tensor *b);
/* The same with a scalar of a's dtype as the second operand. */
nb_tensor *nb_add_scalar(const nb_tensor *a, double b);
nb_tensor *nb_mul_scalar(const nb_tensor *a, double b);
nb_tensor *nb_pow_scalar(const nb_tensor *a, double b);

/* ---- elementwise, one input (floating dtypes; neg, abs, square, relu, sign
 * also take integers) --------------------------------------------------------- */
nb_tensor *nb_neg(const nb_tensor *x);
nb_tensor *nb_abs(const nb_tensor *x);
nb_tensor *nb_sign(const nb_tensor *x); /* gradient zero */
nb_tensor *nb_exp(const nb_tensor *x);
nb_tensor *nb_log(const nb_tensor *x);
nb_tensor *nb_sqrt(const nb_tensor *x);
nb_tensor *nb_rsqrt(const nb_tensor *x);
nb_tensor *nb_square(const nb_tensor *x);
nb_tensor *nb_sin(const nb_tensor *x);
nb_tensor *nb_cos(const nb_tensor *x);
nb_tensor *nb_tanh(const nb_tensor *x);
nb_tensor *nb_erf(const nb_tensor *x);
nb_tensor *nb_sigmoid(const nb_tensor *x);
nb_tensor *nb_relu(const nb_tensor *x);
nb_tensor *nb_leaky_relu(const nb_tensor *x, double alpha);
nb_tensor *nb_gelu(const nb_tensor *x); /* exact: x * Phi(x) */
nb_tensor *nb_softplus(const nb_tensor *x);
nb_tensor *nb_silu(const nb_tensor *x); /* x * sigmoid(x) ("swish") */
nb_tensor *nb_elu(const nb_tensor *x);  /* x > 0 ? x : exp(x) - 1 */

/* ---- comparisons (result NB_BOOL, not differentiable) and selection --------- */
nb_tensor *nb_equal(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_not_equal(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_less(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_less_equal(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_greater(const nb_tensor *a, const nb_tensor *b);
nb_tensor *nb_greater_equal(const nb_tensor *a, const nb_tensor *b);
/* cond ? a : b elementwise, all three broadcast; cond is NB_BOOL. No gradient
 * flows to cond. */
nb_tensor *nb_where(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b);

/* ---- reductions -------------------------------------------------------------- */
nb_tensor *nb_sum(const nb_tensor *x, nb_axes axes, bool keepdims);
nb_tensor *nb_mean(const nb_tensor *x, nb_axes axes, bool keepdims);
nb_tensor *nb_max(const nb_tensor *x, nb_axes axes, bool keepdims); /* ties share the gradient */
nb_tensor *nb_min(const nb_tensor *x, nb_axes axes, bool keepdims);
nb_tensor *nb_prod(const nb_tensor *x, nb_axes axes, bool keepdims);
nb_tensor *nb_logsumexp(const nb_tensor *x, nb_axes axes, bool keepdims);
/* Over every element, to a 0-d tensor. */
nb_tensor *nb_sum_all(const nb_tensor *x);
nb_tensor *nb_mean_all(const nb_tensor *x);
/* Index of the first largest (smallest) element along axis, as NB_I64. */
nb_tensor *nb_argmax(const nb_tensor *x, int axis, bool keepdims);
nb_tensor *nb_argmin(const nb_tensor *x, int axis, bool keepdims);

/* ---- scans ------------------------------------------------------------------- */
/* The running sum of x along axis (negative counts from the end), as
 * TensorFlow's tf.math.cumsum: a new tensor of x's shape and dtype, owned by the
 * current scope, whose element i along axis sums x's elements j <= i (j < i when
 * exclusive, so the first is 0), or, when reverse, j >= i (j > i). The inclusive
 * forward case is PyTorch's torch.cumsum; unlike it, an integer result keeps
 * x's dtype and wraps. A 0-d x is one element along axis 0 or -1. Sums run in
 * order along the axis (f32 accumulated in double on the CPU, as PyTorch's), so
 * each element is the same for any number of threads. Differentiable: the
 * gradient is the running sum of the incoming one in the other direction.
 * Fails with NB_ERR_INVALID_ARGUMENT for a NULL x (keeping the earlier error)
 * or an axis outside x's dims, and NB_ERR_DTYPE naming cumsum for a dtype other
 * than f32, f64, f16, bf16, i32, i64. */
nb_tensor *nb_cumsum(const nb_tensor *x, int axis, bool exclusive, bool reverse);

/* ---- linear algebra ---------------------------------------------------------- */
/* a[..., M, K] x b[..., K, N] -> [..., M, N]; batch dims broadcast; a 1-d operand
 * is a row (a) or a column (b) vector that is dropped from the result. Transposed
 * views (nb_transpose) are used in place, without a copy. */
nb_tensor *nb_matmul(const nb_tensor *a, const nb_tensor *b);

/* ---- softmax and losses ------------------------------------------------------ */
nb_tensor *nb_softmax(const nb_tensor *x, int axis);
nb_tensor *nb_log_softmax(const nb_tensor *x, int axis);
/* Per-example loss [N] from logits [N, C] and dense probabilities labels [N, C].
 * Labels get a gradient too. */
nb_tensor *nb_softmax_cross_entropy(const nb_tensor *logits, const nb_tensor *labels);
/* Per-example loss [N] from logits [N, C] and class indices labels [N] (NB_I32
 * or NB_I64): -log_softmax(logits)[i, labels[i]]. A label outside [0, C) is
 * NB_ERR_INVALID_ARGUMENT (on a GPU, from the next synchronising call: see the
 * edge points above). On the CPU and the GPU it runs as one kernel forward and
 * one backward (on the CPU with the bits of its composition of ops), and its
 * gradient is differentiable again. */
nb_tensor *nb_sparse_softmax_cross_entropy(const nb_tensor *logits, const nb_tensor *labels);
/* Elementwise max(x,0) - x*z + log(1 + exp(-|x|)), stable for any logit. */
nb_tensor *nb_sigmoid_cross_entropy(const nb_tensor *logits, const nb_tensor *labels);
/* mean((pred - target)^2) over every element: a 0-d tensor. */
nb_tensor *nb_mean_squared_error(const nb_tensor *pred, const nb_tensor *target);

/* ---- shapes, views and copies ------------------------------------------------ */
/* A view when x is contiguous, else a copy. One dim may be -1 (inferred). */
nb_tensor *nb_reshape(const nb_tensor *x, nb_shape shape);
/* Swaps two dims (a view). */
nb_tensor *nb_transpose(const nb_tensor *x, int dim0, int dim1);
/* Reorders dims: result dim i is x's dim perm[i] (a view). */
nb_tensor *nb_permute(const nb_tensor *x, nb_axes perm);
/* Inserts a size-1 dim at axis / removes size-1 dim axis (views). */
nb_tensor *nb_expand_dims(const nb_tensor *x, int axis);
nb_tensor *nb_squeeze(const nb_tensor *x, int axis);
/* begin[i] .. begin[i]+size[i] on each dim; size -1 runs to the end (a view). */
nb_tensor *nb_slice(const nb_tensor *x, nb_shape begin, nb_shape size);
/* A view with stride 0 on broadcast dims (read-only use). */
nb_tensor *nb_broadcast_to(const nb_tensor *x, nb_shape shape);
/* A row-major copy (x itself, with a new reference, when already contiguous). */
nb_tensor *nb_contiguous(const nb_tensor *x);
nb_tensor *nb_concat(int n, nb_tensor *const *xs, int axis);
nb_tensor *nb_stack(int n, nb_tensor *const *xs, int axis);
/* Splits x along axis into n pieces of sizes[i] (sizes NULL: equal pieces, NB_ERR_SHAPE
 * when the dim does not divide). Writes n new tensors to out (views). */
nb_status nb_split(const nb_tensor *x, int n, const int64_t *sizes, int axis, nb_tensor **out);
/* Rows of params (axis 0) picked by integer indices: result shape is
 * indices.shape + params.shape[1:]. An out-of-range index is
 * NB_ERR_INVALID_ARGUMENT, at once on the CPU, at the next synchronising call
 * on a GPU (see the edge points above). */
nb_tensor *nb_gather(const nb_tensor *params, const nb_tensor *indices);
/* indices (integer) -> indices.shape + [depth] with 1 at the index, 0 elsewhere. */
nb_tensor *nb_one_hot(const nb_tensor *indices, int64_t depth, nb_dtype dtype);
/* Converts to dtype (a copy; differentiable between floating dtypes). Floating
 * to integer truncates toward zero, saturates at the integer type's range and
 * takes NaN to 0 (to u8 through i32, wrapping); anything to bool is x != 0. The
 * same on every device. */
nb_tensor *nb_cast(const nb_tensor *x, nb_dtype dtype);
/* Pads dim i with before[i] and after[i] elements of value. */
nb_tensor *nb_pad(const nb_tensor *x, nb_shape before, nb_shape after, double value);
/* The same values with no gradient flowing back. */
nb_tensor *nb_stop_gradient(const nb_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
