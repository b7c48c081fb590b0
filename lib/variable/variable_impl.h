/* nabla internal — what other modules (optimizers, the mirrored strategy) need
 * from variables beyond the public API. */
#ifndef NB_VARIABLE_IMPL_H
#define NB_VARIABLE_IMPL_H

#include "lib/core/core.h"

/* A number unique to v for the process's lifetime (never reused, unlike the
 * address of a freed variable): optimizers key their slots on it. 0 for NULL. */
uint64_t nb__variable_uid(const nb_variable *v);

/* The variable's current value: contiguous, owned by the variable, no new
 * reference. It may be shared with tensors already read (see nb__variable_writable). */
nb_tensor *nb__variable_value(nb_variable *v);

/* Makes v's value safe to update in place: when a tensor read from v (or a view
 * of its storage) is still alive, copies the value into a fresh tensor the
 * variable alone holds, so earlier reads keep their snapshot. Returns the value
 * to write into (no new reference), or NULL with the error recorded. who names
 * the calling function in messages. */
nb_tensor *nb__variable_writable(nb_variable *v, const char *who);

#endif
