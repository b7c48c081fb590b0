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

/* nb_optimizer_apply inside a captured step under a loss scaler (on the
 * capture's device): each update does nothing where *skip (a device double
 * there) is not 0, and takes its step from the optimizer's count of applied
 * updates kept on that device, made or refreshed from the host's here. *count
 * gets that count's address, for the scaler's kernel to advance on a good
 * step; the host's count is read back from it when next asked. NB_OK or the
 * error (NB_ERR_UNSUPPORTED where the count is not on the device when a step
 * is recorded: the warm-up step puts it there). */
nb_status nb__optimizer_apply_unless(nb_optimizer *opt, int n, nb_variable *const *vars, nb_tensor *const *grads,
                                     const double *skip, double **count, const char *who);

/* The step number the next update takes; nb__optimizer_advance counts one. */
int64_t nb__optimizer_next_step(const nb_optimizer *opt);
void nb__optimizer_advance(nb_optimizer *opt);

#endif
