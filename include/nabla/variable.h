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

#ifdef __cplusplus
}
#endif
#endif
