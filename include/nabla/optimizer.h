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
/* Number of updates applied so far (apply calls, and steps a loss scaler did
 * not skip). After captured steps under a loss scaler, read back from their
 * device (waiting for it); a failed read records its error and gives the
 * last count the host had. */
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

/* ---- loss scaling (for training in f16) ------------------------------------
 *
 * Gradients of an f16 computation underflow to zero unless the loss is scaled
 * up first. A loss scaler multiplies the loss by its scale before the
 * gradients are taken, divides the gradients by it before the update, and
 * adapts the scale as torch.amp.GradScaler does: a step whose gradients hold
 * an infinity or NaN is skipped (no variable, slot or step count changes) and
 * the scale multiplied by backoff; after growth_interval steps in a row that
 * were applied, it is multiplied by growth. The scale stays within
 * [2^-64, 2^64]. A step:
 *
 *     nb_tape *tape = nb_tape_begin();
 *     nb_tensor *loss = model_loss(...);
 *     nb_tape_gradient_vars(tape, nb_loss_scaler_scale(ls, loss), n, vars, g);
 *     bool stepped;
 *     nb_loss_scaler_step(ls, opt, n, vars, g, &stepped);
 *
 * Such a step can be captured (nabla/graph.h): inside a captured step the
 * scaler keeps its scale, good and skipped steps in device memory on the
 * step's device, the check and the skip stay there too (a skipped replay
 * changes no variable, slot or step count: the optimizer's count of applied
 * steps, which Adam's bias corrections follow, then lives on that device as
 * well), and nothing is read back. The accessors below and
 * nb_optimizer_iterations read the state back when next asked (waiting for
 * the device); eager steps and replays may alternate. The scaler must outlive
 * the graphs that use it. */
typedef struct nb_loss_scaler nb_loss_scaler;

/* A scaler starting at initial_scale (torch's defaults: 65536, 2, 0.5, 2000).
 * The caller frees it with nb_loss_scaler_free. NULL and
 * NB_ERR_INVALID_ARGUMENT for an initial scale outside [2^-64, 2^64], growth
 * <= 1 or not finite, backoff outside (0, 1), or growth_interval outside
 * [1, 2^53] (a captured step counts in device doubles). */
nb_loss_scaler *nb_loss_scaler_new(double initial_scale, double growth, double backoff, int64_t growth_interval);

/* loss times the scale (an op, recorded on the tapes that watch loss), owned
 * by the current scope. NULL and NB_ERR_INVALID_ARGUMENT for a NULL argument,
 * or the op's error. */
nb_tensor *nb_loss_scaler_scale(nb_loss_scaler *ls, const nb_tensor *loss);

/* Divides the gradients of the scaled loss by the scale and, when every one
 * is finite, applies them with opt (nb_optimizer_apply: NULL gradients are
 * skipped); otherwise applies nothing. Then adapts the scale. *stepped, when
 * not NULL, says whether the update was applied (always false inside a
 * captured step, where the outcome stays on the device). An eager step reads
 * one number back from the gradients' device (the check). Returns NB_OK (a
 * skipped step is not an error), NB_ERR_INVALID_ARGUMENT for a NULL scaler,
 * optimizer or array, NB_ERR_UNSUPPORTED in a step recorded on a device where
 * the step run before the recording did not use the scaler, or the error of
 * the unscaling or the update (the scale then unchanged). */
nb_status nb_loss_scaler_step(nb_loss_scaler *ls, nb_optimizer *opt, int n, nb_variable *const *vars,
                              nb_tensor *const *grads, bool *stepped);

/* The current scale (0 for NULL). After captured steps, read back from
 * their device (a failed read records its error and gives the last value the
 * host had); inside a captured step, the value before it. */
double nb_loss_scaler_get_scale(const nb_loss_scaler *ls);
/* Steps skipped so far (0 for NULL); read as nb_loss_scaler_get_scale. */
int64_t nb_loss_scaler_skipped(const nb_loss_scaler *ls);
/* Sets the scale and the count of applied steps since the last change (a
 * checkpoint's restore); the next replay starts from them. NB_OK, or
 * NB_ERR_INVALID_ARGUMENT for NULL, a scale outside [2^-64, 2^64] or a
 * negative count, NB_ERR_UNSUPPORTED inside a captured step, or the error of
 * reading back the skipped count. */
nb_status nb_loss_scaler_set_state(nb_loss_scaler *ls, double scale, int64_t good_steps);
/* The count of applied steps since the scale last changed (0 for NULL); read
 * as nb_loss_scaler_get_scale. */
int64_t nb_loss_scaler_good_steps(const nb_loss_scaler *ls);
/* Frees the scaler. NULL is ignored. */
void nb_loss_scaler_free(nb_loss_scaler *ls);

#ifdef __cplusplus
}
#endif
#endif
