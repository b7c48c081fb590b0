/* nabla internal — the asynchronous trainer's parts: its workers and the
 * shared parameters in this process (async.c), and the parameter servers of
 * other processes (async_world.c). */
#ifndef NB_ASYNC_IMPL_H
#define NB_ASYNC_IMPL_H

#include "distribute_impl.h"

#define NB_ASYNC_MAX 64

typedef struct nb_async_worker {
    struct nb_async *a;
    int index;
    nb_device *dev;
    pthread_t thread;
    bool serial;          /* its kernels keep to its own thread */
    struct nb_replica ctx;
    int64_t clock;        /* batches finished in this call; INT64_MAX once done */
    int64_t read_version; /* the updates the parameters it read had seen */
    int64_t round;        /* bound 0: the round its kept gradients belong to (-1: none) */
    /* the current batch's results: gradients on the masters' device (kept
     * past the batch's scope until the round's update for bound 0), rows, loss */
    nb_tensor **grads;
    int64_t batch, rows;
    double loss;
    nb_tensor *loss_t;
    /* the first error, moved off the thread */
    nb_status status;
    char message[NB_REPLICA_MESSAGE];
} nb_async_worker;

struct nb_async {
    uint64_t id;
    int n;
    nb_device *devices[NB_ASYNC_MAX];
    nb_device *master;
    nb_async_worker *workers;

    pthread_mutex_t lock; /* the masters, the clocks, the counters */
    pthread_cond_t cv;    /* a clock moved, a round was applied, or a worker failed */
    /* what the setters chose (under lock): a call takes them at its start */
    int64_t set_bound;
    nb_async_observer set_observer;
    void *set_observer_user;
    bool training;        /* a call is in progress (one at a time) */

    /* the call in progress */
    int64_t bound;        /* -1 none, 0 synchronous, else the largest lead */
    nb_async_observer observer;
    void *observer_user;
    nb_optimizer *opt;
    int n_vars;
    nb_variable *const *vars;
    nb_variable **masters; /* per variable: its master copy */
    nb_replica_step_fn fn;
    void *user;
    int n_inputs;
    nb_tensor *const *inputs;
    int64_t batch_rows, total_rows, n_batches;
    bool abort;            /* a worker failed: the others stop */
    int64_t rounds_done, arrived; /* bound 0 */

    /* counters */
    int64_t version; /* updates applied in the trainer's life */
    int64_t gradients, examples, staleness_sum, max_staleness, waits;
    int64_t ns;

    /* across processes (async_world.c) */
    bool world;
    struct nb_async_world *w;
};

/* ---- async.c ---------------------------------------------------------------------- */

/* Applies grads (on the masters' device, per variable of the call; NULL
 * skipped) to the masters as one optimizer update and counts it in
 * a->version (under the trainer's lock, or on a server's one thread). */
nb_status nb__async_apply(nb_async *a, nb_tensor *const *grads, const char *who);

/* Counts an applied gradient of `rows` rows with its staleness and tells the
 * observer (under the trainer's lock; a->version already counts the update). */
void nb__async_count(nb_async *a, int worker, int64_t batch, int64_t rows, int64_t staleness, double loss);

/* ---- async_world.c ---------------------------------------------------------------- */

/* Joins the world for nb_async_new_world: NB_OK with *world true when this
 * process is one of several (a->w set up for `servers` servers), false when
 * it runs alone. */
nb_status nb__async_world_open(nb_async *a, int servers, bool *world, const char *who);
void nb__async_world_free(nb_async *a);
bool nb__async_world_is_server(const nb_async *a);
int nb__async_world_workers(const nb_async *a);

/* A new variable made the same on every rank (checked), from rank 0's value:
 * to *same (owned by the current scope). */
nb_status nb__async_world_variable(nb_async *a, const char *name, const nb_tensor *initial, nb_tensor **same,
                                   const char *who);

/* The calls a worker makes to the servers, from its own thread: the current
 * parameters into its copies (*version: the updates they had seen), its
 * gradients (on the masters' device) with the staleness the servers measured,
 * and (whether it finished its batches or failed) that it is done. */
nb_status nb__async_world_pull(nb_async *a, nb_async_worker *ws, int64_t clock);
nb_status nb__async_world_push(nb_async *a, nb_async_worker *ws, int64_t clock, int64_t *staleness);
nb_status nb__async_world_done(nb_async *a, nb_async_worker *ws);

/* A server's nb_async_train: serves the workers until every one has said it
 * finished (or was silent past the deadline). A worker process's: after its
 * workers finished, says so and takes the final parameters into the masters. */
nb_status nb__async_world_serve(nb_async *a, const char *who);
nb_status nb__async_world_finish(nb_async *a, bool ok, const char *who);

/* Checks that every rank trains the same variables with the same bound. */
nb_status nb__async_world_begin(nb_async *a, const char *who);

#endif
