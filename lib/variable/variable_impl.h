/* nabla internal — what other modules (optimizers, the mirrored strategy) need
 * from variables beyond the public API. */
#ifndef NB_VARIABLE_IMPL_H
#define NB_VARIABLE_IMPL_H

#include "lib/core/core.h"

/* A number unique to v for the process's lifetime (never reused, unlike the
 * address of a freed variable): optimizers key their slots on it. 0 for NULL. */
uint64_t nb__variable_uid(const nb_variable *v);

/* The variable's current value: contiguous, owned by the variable, no new
 * reference. It may be shared with tensors already read (see nb__variable_update_target). */
nb_tensor *nb__variable_value(nb_variable *v);

/* The tensor an update of v should write: v's value itself when nothing else
 * holds it, else a new uninitialised tensor of its shape (refs = 1) for an
 * out-of-place update that reads the old value; but in a recording
 * (lib/core/capture.h) that allows it, a new tensor over the value's own
 * memory, written in place (nb__variable_target_in_place tells). Hand the
 * result to nb__variable_commit once written (or nb__release it on failure).
 * NULL and the error recorded when memory runs out. */
nb_tensor *nb__variable_update_target(nb_variable *v, const char *who);
/* Whether t, from nb__variable_update_target, is v's memory written in place
 * while a read holds the old storage. */
bool nb__variable_target_in_place(nb_variable *v, const nb_tensor *t);

/* Makes t (from nb__variable_update_target) v's value; the old value stays alive
 * for the reads that hold it (when t is written in place, the recording marks
 * the old storage stale: a later use of it records the step again). */
void nb__variable_commit(nb_variable *v, nb_tensor *t);

/* The registry (lib/variable/variable_scope.c): nb_variable_new and the mirrored
 * constructor add their variable, nb_variable_free removes it (a no-op for one
 * never added). NB_OK, or NB_ERR_OUT_OF_MEMORY recorded naming who. */
nb_status nb__variable_register(nb_variable *v, const char *who);
void nb__variable_unregister(nb_variable *v);

/* ---- mirrored variables (lib/distribute) ---------------------------------------
 * The functions above act on the copy of the replica the calling thread runs
 * (copy 0 outside any replica). */

/* A trainable variable with one plain copy of initial on each of n devices,
 * owned by the strategy with id owner. NULL and the error (naming who) on failure. */
nb_variable *nb__variable_mirrored_new(uint64_t owner, const char *name, int n, nb_device *const *devices,
                                       const nb_tensor *initial, const char *who);
/* The owning strategy's id; 0 for a plain variable. */
uint64_t nb__variable_mirror_owner(const nb_variable *v);
/* Replica r's copy (a plain variable); v itself when v is plain; NULL out of range. */
nb_variable *nb__variable_copy(nb_variable *v, int r);

#endif
