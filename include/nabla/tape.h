/* nabla — the gradient tape.
 *
 * Tapes form a per-thread stack. Every op whose inputs an open tape watches is
 * recorded on that tape; its outputs become watched too. Variables read with
 * nb_read() while a tape is open are watched automatically (when trainable).
 * nb_tape_gradient() walks the record backwards. Gradient functions are written
 * with nabla ops, so an outer tape records the inner tape's gradient computation:
 * nested tapes give higher-order gradients.
 *
 * A tape belongs to the scope open when it began and is freed when that scope
 * ends; with no scope the caller frees it with nb_tape_free(). A one-shot tape
 * (nb_tape_begin) releases what it saved once its gradient is taken, and asking
 * it again is NB_ERR_TAPE; a persistent tape keeps everything until freed. */
#ifndef NABLA_TAPE_H
#define NABLA_TAPE_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* NB_TENSORS(a, b) and NB_VARS(w, b) expand to "count, array" argument pairs
 * (1 to 16 elements). */
#define NB__COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define NB_COUNT(...) NB__COUNT_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define NB_TENSORS(...) NB_COUNT(__VA_ARGS__), ((nb_tensor *const[]){__VA_ARGS__})
#define NB_VARS(...) NB_COUNT(__VA_ARGS__), ((nb_variable *const[]){__VA_ARGS__})

/* Opens a one-shot (persistent = false) or persistent tape on top of the calling
 * thread's tape stack. Returns it, owned by the current scope; NULL on no memory. */
nb_tape *nb_tape_begin(void);
nb_tape *nb_tape_begin_persistent(void);

/* Stops recording: takes the tape off the stack but keeps its record, so its
 * gradient can still be taken (and an outer tape can record that). */
nb_status nb_tape_stop(nb_tape *tape);

/* Frees the tape and what it saved (ending it first if it is still open). NULL is
 * ignored. */
void nb_tape_free(nb_tape *tape);

/* Watches a tensor (floating dtypes; others are NB_ERR_DTYPE). */
nb_status nb_tape_watch(nb_tape *tape, const nb_tensor *t);
/* Watches a variable's current value. */
nb_status nb_tape_watch_variable(nb_tape *tape, nb_variable *v);

/* Pause and resume recording on this tape (ops in between are not recorded). */
nb_status nb_tape_pause(nb_tape *tape);
nb_status nb_tape_resume(nb_tape *tape);

/* What a source that the target does not depend on gets. */
typedef enum nb_unconnected { NB_UNCONNECTED_NULL = 0, NB_UNCONNECTED_ZERO = 1 } nb_unconnected;

/* Writes d target / d sources[i] to grads[i] (n entries; new tensors owned by the
 * current scope, shaped like the sources). The target's seed is ones. Sources the
 * target does not depend on get NULL. Fails with NB_ERR_TAPE for a one-shot tape
 * asked twice, NB_ERR_INVALID_ARGUMENT for a NULL target or source; on failure every
 * grads[i] is NULL. */
nb_status nb_tape_gradient(nb_tape *tape, const nb_tensor *target, int n,
                           nb_tensor *const *sources, nb_tensor **grads);

/* The same with respect to variables. */
nb_status nb_tape_gradient_vars(nb_tape *tape, const nb_tensor *target, int n,
                                nb_variable *const *vars, nb_tensor **grads);

/* nb_tape_gradient_vars in the general form of nb_tape_gradient_ex: seeded
 * with output_gradient (NULL means ones; else the target's shape and dtype,
 * NB_ERR_SHAPE otherwise), unconnected variables NULL or zeros. For a piece of
 * a model whose output's gradient comes from elsewhere (a pipeline stage).
 * Gradients owned by the current scope; on failure every grads[i] is NULL. */
nb_status nb_tape_gradient_vars_ex(nb_tape *tape, const nb_tensor *target, const nb_tensor *output_gradient,
                                   int n, nb_variable *const *vars, nb_tensor **grads,
                                   nb_unconnected unconnected);

/* The general form: output_gradient (NULL means ones) seeds the target and must
 * match its shape and dtype; unconnected chooses NULL or zeros. */
nb_status nb_tape_gradient_ex(nb_tape *tape, const nb_tensor *target,
                              const nb_tensor *output_gradient, int n,
                              nb_tensor *const *sources, nb_tensor **grads,
                              nb_unconnected unconnected);

/* ---- custom gradients -------------------------------------------------------- */

/* Computes outputs from inputs with nabla ops; it runs with recording off. Writes
 * n_out new tensors to outputs; returns NB_OK or an error. */
typedef nb_status (*nb_custom_forward_fn)(int n_in, nb_tensor *const *inputs, int n_out,
                                          nb_tensor **outputs, void *user);
/* Given the gradients of the outputs (NULL where an output got none), writes the
 * gradients of the inputs (NULL for none). Written with nabla ops it is itself
 * differentiable by an outer tape. */
typedef nb_status (*nb_custom_backward_fn)(int n_in, nb_tensor *const *inputs, int n_out,
                                           nb_tensor *const *outputs,
                                           nb_tensor *const *output_grads,
                                           nb_tensor **input_grads, void *user);

/* Runs forward and records it on the open tapes as one op whose gradient is
 * backward. outputs receive n_out new tensors owned by the current scope. user
 * must stay valid as long as a tape holds the record. */
nb_status nb_custom_gradient(int n_in, nb_tensor *const *inputs, int n_out, nb_tensor **outputs,
                             nb_custom_forward_fn forward, nb_custom_backward_fn backward,
                             void *user);

/* ---- gradient checking ------------------------------------------------------- */

/* A function of n tensors returning one tensor (owned by the current scope). */
typedef nb_tensor *(*nb_checked_fn)(int n, nb_tensor *const *inputs, void *user);

/* Compares the tape's gradients of fn (reduced to a scalar by a fixed random
 * weighting of its outputs) with central differences of step eps, for every
 * element of every NB_F64 input. Writes the largest error |a - n| / max(1, |a|, |n|)
 * to max_error (when non-NULL). Returns NB_OK when it is at most tolerance,
 * NB_ERR_TAPE with a message naming the input and element otherwise, or the error
 * fn raised. Inputs must be NB_F64 (NB_ERR_DTYPE). */
nb_status nb_gradient_check(nb_checked_fn fn, void *user, int n, nb_tensor *const *inputs,
                            double eps, double tolerance, double *max_error);

#ifdef __cplusplus
}
#endif
#endif
