/* nabla internal — an optimizer update in parts, for the mirrored strategy: make
 * the slots of every copy on one thread, update each replica's copies on that
 * replica's thread (concurrently), then count the iteration once. */
#ifndef NB_OPTIMIZER_IMPL_H
#define NB_OPTIMIZER_IMPL_H

#include "lib/core/core.h"
#include "lib/core/optim_kernels.h"

/* Creates the slots (momentum, Adam's moments) of n plain variables that lack
 * them, zero-filled on each variable's device. NULL entries are skipped. Not
 * safe to run beside an update. NB_OK or the error (naming who). */
nb_status nb__optimizer_prepare(nb_optimizer *opt, int n, nb_variable *const *vars, const char *who);

/* Applies update number step (1 on the first) to n plain variables from their
 * gradients (NULL skipped), whose slots nb__optimizer_prepare made. Gradients
 * must match their variables (unchecked here). Threads may run it at once on
 * disjoint variables. Counts no iteration. NB_OK or the error. */
nb_status nb__optimizer_update(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                               int64_t step, const char *who);

/* nb__optimizer_update whose numbers (nb_update_pack's NB_UPD_COUNT doubles)
 * the kernels read from device_params, in the device's memory, when not NULL:
 * in a recorded step whose caller refreshes them before each replay
 * (nb__optimizer_pack), no hook of the optimizer's own is registered, so
 * replica threads may record their updates at once. */
nb_status nb__optimizer_update_at(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                                  int64_t step, const double *device_params, const char *who);

/* The numbers update number step reads, as nb_update_pack lays them out. */
void nb__optimizer_pack(const nb_optimizer *opt, int64_t step, double out[NB_UPD_COUNT]);

/* The step number the next update takes; nb__optimizer_advance counts one. */
int64_t nb__optimizer_next_step(const nb_optimizer *opt);
void nb__optimizer_advance(nb_optimizer *opt);

#endif
