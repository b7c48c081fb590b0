/* nabla — asynchronous data-parallel training: workers that do not wait for
 * one another.
 *
 * A trainer holds W workers, one per device, each on a host thread of its own,
 * and the shared parameters: every variable made through it
 * (nb_async_variable_new) has a master copy, which the updates change, and one
 * copy per worker. nb_async_train cuts the inputs into batches and hands them
 * out in turn (worker w takes batches w, w + W, w + 2W, ...). For each of its
 * batches a worker
 *   1. reads the current parameters into its copies (a consistent snapshot:
 *      no update lands halfway through a read),
 *   2. runs the step function on its batch, which returns the gradients
 *      (inside it, nb_read() of a trainer's variable gives the worker's copy),
 *   3. applies them to the master copies with the optimizer, without waiting
 *      for the other workers. Updates are atomic with respect to each other:
 *      one update of all the variables lands at a time, none is lost.
 * Each update's staleness is the number of updates that landed between the
 * worker's read and its own update.
 *
 * The staleness bound (nb_async_set_staleness_bound) makes this
 * stale-synchronous: with bound b >= 1 a worker starts its batch number c (its
 * clock) only once every other worker has finished its batch c - b, so no
 * worker runs more than b batches ahead of the slowest, and no update is more
 * than (W - 1)(2b + 1) updates stale. Bound 0 is synchronous training: the
 * workers of a round (batches cW .. cW + W - 1) all read the same
 * parameters, and their gradients, weighted by their rows, are summed in
 * worker order into one update, so every update has staleness 0 and training
 * matches nb_mirrored_step over W replicas with a global batch of W batches.
 * No bound (the default, -1) is fully asynchronous.
 *
 * Across processes (nb_async_new_world under mpirun), the first S ranks are
 * parameter servers: the variables are shared out over them by size, each
 * server keeps the master copies of its share and applies the updates that
 * reach it; the other ranks are workers, which push gradients to and pull
 * parameters from the servers with MPI messages.
 *
 * Errors: a failing step function (or an error left pending in it) stops the
 * training: nb_async_train returns the error naming the worker, its device
 * and its batch, the other workers stop before their next batch, and the
 * updates already applied stay (asynchronous updates cannot be taken back). */
#ifndef NABLA_ASYNC_H
#define NABLA_ASYNC_H

#include <nabla/distribute.h>
#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_async nb_async;

/* ---- the trainer ----------------------------------------------------------- */

/* Creates a trainer of n workers on the devices named in devices ("/gpu:0",
 * "/cpu:1", ...; two workers may share a device), or with devices NULL on the
 * default devices as nb_mirrored_new takes them (every GPU, else every logical
 * CPU device; n = 0: all of them). The master copies live on master_device
 * (NULL: the first worker's device). Returns a trainer the caller frees with
 * nb_async_free; NULL with NB_ERR_INVALID_ARGUMENT for n < 0, n above 64, or
 * n = 0 with devices given; NB_ERR_DEVICE for an unknown or malformed device
 * name (no soft placement) or fewer default devices than n;
 * NB_ERR_OUT_OF_MEMORY. */
nb_async *nb_async_new(int n, const char *const *devices, const char *master_device);

/* Like nb_async_new, spanning every process that mpirun started: ranks 0 ..
 * servers - 1 serve the parameters, the others are workers with n local
 * workers each (their devices as in nb_async_new; master_device is where a
 * server keeps its share). Every rank makes the same calls in the same order
 * from one thread: nb_async_variable_new is collective (same names, dtypes and
 * shapes everywhere; all start from rank 0's value); in nb_async_train a
 * server serves until every worker has finished (its inputs and step function
 * are not used), and each worker process trains on its own inputs. A worker
 * process that dies does not stop the others: the servers stop waiting for it
 * after the deadline (nb_mirrored_set_timeout's, NB_WORLD_TIMEOUT): a worker
 * process silent that long (no step may take longer) is taken for dead. A
 * server that dies or stops answering is NB_ERR_TIMEOUT on every worker,
 * naming its rank, within the deadline; a server holding a worker back (the
 * bound, or the end of training while others still train) tells it to keep
 * waiting, so that wait may be longer. Without mpirun (or MPI) it is nb_async_new.
 * NB_ERR_INVALID_ARGUMENT for servers < 1 or no worker rank left
 * (servers >= processes); NB_ERR_BACKEND when MPI cannot start. */
nb_async *nb_async_new_world(int n, const char *const *devices, const char *master_device, int servers);

/* Waits for a call running on another thread to finish, then frees the
 * trainer. Its variables stay valid (each keeps its copies, reads
 * outside a worker give the master copy) but can no longer be trained. NULL
 * is ignored; NB_ERR_INVALID_ARGUMENT (nothing freed) from inside a worker. */
void nb_async_free(nb_async *a);

/* Local workers (n); 0 for NULL. Across processes: nb_async_world_workers
 * counts every worker of every process, nb_async_is_server says whether this
 * rank serves parameters. */
int nb_async_workers(const nb_async *a);
int nb_async_world_workers(const nb_async *a);
bool nb_async_is_server(const nb_async *a);

/* Device of worker w (a static string); NULL when out of range. */
const char *nb_async_device(const nb_async *a, int worker);

/* The staleness bound: -1 (default) none, 0 synchronous, b > 0
 * stale-synchronous (see above), from the next nb_async_train on (a call in
 * progress keeps its own). NB_ERR_INVALID_ARGUMENT for NULL or a bound
 * below -1. Across processes every rank must set the same bound. */
nb_status nb_async_set_staleness_bound(nb_async *a, int64_t bound);

/* ---- variables ------------------------------------------------------------- */

/* Creates a trainable variable whose master copy and every worker's copy start
 * as initial. name is copied. The caller frees it with nb_variable_free.
 * Outside the trainer's workers, nb_read gives the master copy (after
 * nb_async_train, the trained value); assignments write every copy and are
 * NB_ERR_INVALID_ARGUMENT inside a worker. NULL and the error for a NULL
 * argument, a non-floating initial (NB_ERR_DTYPE) or no memory. */
nb_variable *nb_async_variable_new(nb_async *a, const char *name, const nb_tensor *initial);

/* ---- training -------------------------------------------------------------- */

/* What each update was, for curves and staleness histograms. */
typedef struct nb_async_update {
    int worker;          /* the worker whose gradient it was (-1 for a round's mean, bound 0) */
    int64_t update;      /* 1, 2, ...: its number among the updates of the trainer's life */
    int64_t batch;       /* the batch it came from (the round's first batch for bound 0; across
                            processes, its number among its worker process's batches) */
    int64_t rows;        /* the rows it learned from */
    int64_t staleness;   /* updates that landed between the read and this update */
    double loss;         /* the step function's loss on that batch (the round's weighted mean) */
} nb_async_update;

/* Called after every update, on the thread that applied it, one at a time.
 * Must not call the trainer. */
typedef void (*nb_async_observer)(const nb_async_update *u, void *user);

/* Sets (or with fn NULL removes) the observer, from the next nb_async_train
 * on (a call in progress keeps its own). Reading each loss to the host costs
 * a wait on the device, so there is none without an observer.
 * NB_ERR_INVALID_ARGUMENT for NULL a. */
nb_status nb_async_set_observer(nb_async *a, nb_async_observer fn, void *user);

/* One pass over the inputs: cuts them (each with at least one dim, all the
 * same first dim B) into ceil(B / batch_rows) batches of batch_rows rows (the
 * last may be smaller) and trains as described at the top. fn is a mirrored
 * step function: it is called with an nb_replica whose index is the worker,
 * count the workers, rows and global rows the batch's rows; it returns the
 * loss of its batch and the gradients (NULL for none) of the variables vars,
 * which must all be this trainer's. opt's slots and step count are the master
 * copies'. Returns NB_OK, or: NB_ERR_INVALID_ARGUMENT for a NULL argument, a
 * variable not of this trainer, batch_rows < 1, or a call from a worker;
 * NB_ERR_SHAPE for inputs without a common first dim or with no rows; the
 * step function's error (or a gradient that does not match its variable,
 * NB_ERR_SHAPE / NB_ERR_DTYPE, or a loss that is not a floating scalar),
 * naming the worker, its device and its batch. Across processes, every
 * worker process calls it with its own inputs and every server with any
 * (NULL allowed); the servers' return comes once all workers are done. */
nb_status nb_async_train(nb_async *a, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                         nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                         int64_t batch_rows);

/* What the trainer has done so far (all calls of nb_async_train). */
typedef struct nb_async_stats {
    int64_t updates;          /* updates applied (bound 0: one per round) */
    int64_t gradients;        /* gradients the workers sent: every one was applied */
    int64_t examples;         /* rows the workers learned from */
    double mean_staleness;    /* over the updates */
    int64_t max_staleness;
    int64_t waits;            /* times a worker waited for the bound */
    double seconds;           /* wall time inside nb_async_train */
} nb_async_stats;

/* Writes the counters to *out (this process's for a worker, the server's for a
 * server). NB_ERR_INVALID_ARGUMENT for NULL. */
nb_status nb_async_get_stats(const nb_async *a, nb_async_stats *out);

#ifdef __cplusplus
}
#endif
#endif
