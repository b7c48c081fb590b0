/* nabla — optimizers. Each keeps its slots (momentum, moments) per variable and
 * updates variables in place with a fused kernel on the variable's device. */
#ifndef NABLA_OPTIMIZER_H
#define NABLA_OPTIMIZER_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Plain gradient descent: v -= lr * g. */
nb_optimizer *nb_sgd_new(double learning_rate);
/* With momentum m = momentum * m + g; v -= lr * m, or with Nesterov
 * v -= lr * (g + momentum * m). */
nb_optimizer *nb_sgd_momentum_new(double learning_rate, double momentum, bool nesterov);
/* Adam (Kingma & Ba) with bias correction. */
nb_optimizer *nb_adam_new(double learning_rate, double beta1, double beta2, double epsilon);
/* AdamW: Adam plus decoupled weight decay v -= lr * weight_decay * v. */
nb_optimizer *nb_adamw_new(double learning_rate, double beta1, double beta2, double epsilon,
                           double weight_decay);
/* Each returns an optimizer the caller frees with nb_optimizer_free, or NULL and
 * NB_ERR_INVALID_ARGUMENT for a negative rate or a beta outside [0, 1). */

/* Applies one update to n variables from their gradients (NULL gradients are
 * skipped). A gradient must match its variable's shape and dtype (NB_ERR_SHAPE,
 * NB_ERR_DTYPE). Returns NB_OK or the error. */
nb_status nb_optimizer_apply(nb_optimizer *opt, int n, nb_variable *const *vars,
                             nb_tensor *const *grads);

nb_status nb_optimizer_set_learning_rate(nb_optimizer *opt, double learning_rate);
double nb_optimizer_learning_rate(const nb_optimizer *opt);
/* Number of apply calls so far. */
int64_t nb_optimizer_iterations(const nb_optimizer *opt);

/* ---- state, for checkpoints ------------------------------------------------------ */

/* "sgd", "momentum", "adam" or "adamw" (a static string); NULL for NULL. */
const char *nb_optimizer_kind(const nb_optimizer *opt);
/* A hyper-parameter by name: "learning_rate", "momentum", "nesterov" (0 or 1),
 * "beta1", "beta2", "epsilon", "weight_decay"; NaN for a name this kind lacks. */
double nb_optimizer_hyperparameter(const nb_optimizer *opt, const char *name);
/* Sets *names to a static array of the slot names this optimizer keeps per
 * variable and returns how many: none for SGD, "momentum", or "adam_m" and
 * "adam_v". 0 for NULL. */
int nb_optimizer_slot_names(const nb_optimizer *opt, const char *const **names);
/* A copy of v's slot (of v's shape, dtype and device), owned by the current
 * scope. NULL with no error when v has no slots yet (it was never updated);
 * NULL and NB_ERR_INVALID_ARGUMENT for a NULL argument or a slot name this
 * optimizer lacks. For a mirrored variable, the slot of replica 0's copy. */
nb_tensor *nb_optimizer_get_slot(nb_optimizer *opt, nb_variable *v, const char *slot);
/* Sets v's slot to a copy of value (made first when v has none; every copy's
 * slot for a mirrored variable). value must have v's shape and dtype
 * (NB_ERR_SHAPE, NB_ERR_DTYPE); it is copied to v's device. NB_OK or the error
 * (NB_ERR_INVALID_ARGUMENT for NULL or an unknown slot name). */
nb_status nb_optimizer_set_slot(nb_optimizer *opt, nb_variable *v, const char *slot, const nb_tensor *value);
/* Sets the number of apply calls made so far (>= 0; Adam's bias correction
 * follows it). NB_OK or NB_ERR_INVALID_ARGUMENT. */
nb_status nb_optimizer_set_iterations(nb_optimizer *opt, int64_t iterations);

/* Frees the optimizer and its slots. NULL is ignored. */
void nb_optimizer_free(nb_optimizer *opt);

#ifdef __cplusplus
}
#endif
#endif
