/* nabla — variables: named, mutable tensors that live until freed (not scoped).
 *
 * nb_read() returns the variable's value; open tapes watch it when the variable is
 * trainable. A read is a snapshot: a later assign does not change a tensor already
 * read. Assignments are not recorded by tapes. */
#ifndef NABLA_VARIABLE_H
#define NABLA_VARIABLE_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a trainable variable holding a copy of initial, on initial's device.
 * name is copied. The caller owns the variable (nb_variable_free); initial keeps
 * its own owner. NULL when initial is NULL or memory runs out. */
nb_variable *nb_variable_new(const char *name, const nb_tensor *initial);

/* Frees v (tensors already read from it stay valid). NULL is ignored. */
void nb_variable_free(nb_variable *v);

/* Returns the current value, owned by the current scope, and watches it on every
 * open tape when v is trainable. NULL when v is NULL. */
nb_tensor *nb_read(nb_variable *v);

const char *nb_variable_name(const nb_variable *v);
bool nb_variable_trainable(const nb_variable *v);
void nb_variable_set_trainable(nb_variable *v, bool trainable);
nb_shape nb_variable_shape(const nb_variable *v);
nb_dtype nb_variable_dtype(const nb_variable *v);
const char *nb_variable_device(const nb_variable *v);

/* v = value, v += value, v -= value. value must have v's shape, dtype (NB_ERR_SHAPE,
 * NB_ERR_DTYPE) and device (it is copied there otherwise). Not recorded. */
nb_status nb_variable_assign(nb_variable *v, const nb_tensor *value);
nb_status nb_variable_assign_add(nb_variable *v, const nb_tensor *value);
nb_status nb_variable_assign_sub(nb_variable *v, const nb_tensor *value);

/* ---- the registry ---------------------------------------------------------------
 * Every variable made by nb_variable_new or nb_get_variable (and every mirrored
 * variable, once, not its per-replica copies) is registered from creation until
 * nb_variable_free. The registry is shared by all threads and guarded by a mutex;
 * it holds no reference: a pointer it hands out is valid until someone frees
 * that variable. */

/* Writes up to cap registered variables, in creation order, to out (out may be
 * NULL when cap is 0) and returns how many are registered (which may exceed cap). */
int nb_variables_list(nb_variable **out, int cap);

/* As nb_variables_list, for the trainable variables only (tf.trainable_variables):
 * what a training loop hands to its optimizer. */
int nb_trainable_variables(nb_variable **out, int cap);

/* The oldest registered variable named name, or NULL (no error) when none is. */
nb_variable *nb_variable_find(const char *name);

/* Frees every registered variable but the mirrored ones (their strategy owns
 * them); returns how many it freed (0 and NB_ERR_OUT_OF_MEMORY when no memory).
 * Do not run it beside a thread that uses or frees those variables. */
int nb_variables_free_all(void);

/* ---- variable scopes (as TensorFlow 1's tf.variable_scope) ------------------------
 * Each thread has its own stack of scopes. Pushing "dense" inside "model" makes
 * the current scope "model/dense"; nb_get_variable("kernel", ...) then names its
 * variable "model/dense/kernel". A scope pushed with reuse, and every scope
 * inside it, reuses existing variables instead of making new ones. */

/* Enters scope name (not NULL, not empty, no longer than 255 bytes; the joined
 * path at most 1023; at most 64 levels). reuse is or-ed with the enclosing
 * scope's. NB_OK, or NB_ERR_INVALID_ARGUMENT with nothing pushed. */
nb_status nb_variable_scope_push(const char *name, bool reuse);
/* Leaves the innermost scope. NB_OK, or NB_ERR_INVALID_ARGUMENT when none is open. */
nb_status nb_variable_scope_pop(void);
/* The calling thread's current scope path ("" at the top); valid until the
 * next push or pop on this thread. */
const char *nb_variable_scope_name(void);

/* How nb_get_variable fills a new variable. Fans are counted as Keras counts
 * them: [in, out] for 2-d, the last two dims times the rest (a receptive
 * field: HWIO convolution filters) for more, [n]: n and n. The truncated
 * normals are cut at two standard deviations and, as Keras's, use a standard
 * deviation divided by 0.87962566 so the variance is the one named. */
typedef enum nb_init_kind {
    NB_INIT_ZEROS,            /* 0 */
    NB_INIT_CONSTANT,         /* value */
    NB_INIT_NORMAL,           /* normal with mean value and standard deviation stddev */
    NB_INIT_GLOROT_UNIFORM,   /* uniform in +-sqrt(6 / (fan_in + fan_out)) */
    NB_INIT_GLOROT_NORMAL,    /* truncated normal, variance 2 / (fan_in + fan_out) */
    NB_INIT_HE_NORMAL,        /* truncated normal, variance 2 / fan_in (for relu) */
    NB_INIT_HE_UNIFORM,       /* uniform in +-sqrt(6 / fan_in) */
    NB_INIT_TRUNCATED_NORMAL, /* normal with mean value and standard deviation stddev,
                                 redrawn beyond two standard deviations */
    NB_INIT_UNIFORM           /* uniform in +-value */
} nb_init_kind;

typedef struct nb_initializer {
    nb_init_kind kind;
    double value;   /* CONSTANT: the value; NORMAL, TRUNCATED_NORMAL: the mean; UNIFORM: the limit */
    double stddev;  /* NORMAL, TRUNCATED_NORMAL */
    uint64_t seed;  /* every random kind: same seed, same values */
} nb_initializer;

/* Returns the variable "<current scope>/<name>" (just name at the top scope).
 * Outside reuse it makes it on the current device with shape, dtype and init,
 * and fails (NB_ERR_INVALID_ARGUMENT) when a variable of that name exists.
 * Under reuse it returns the existing variable, and fails (NB_ERR_INVALID_ARGUMENT)
 * when there is none, or (NB_ERR_SHAPE, NB_ERR_DTYPE, the message naming both
 * shapes and dtypes) when shape or dtype differ. A new variable belongs to the
 * registry: free it once with nb_variable_free, or with nb_variables_free_all;
 * reused, it is the same pointer (do not free it twice). NULL on failure. */
nb_variable *nb_get_variable(const char *name, nb_shape shape, nb_dtype dtype, nb_initializer init);

#ifdef __cplusplus
}
#endif
#endif
