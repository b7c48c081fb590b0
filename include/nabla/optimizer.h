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

/* Frees the optimizer and its slots. NULL is ignored. */
void nb_optimizer_free(nb_optimizer *opt);

#ifdef __cplusplus
}
#endif
#endif
