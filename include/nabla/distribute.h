/* nabla — the mirrored strategy: one model trained on several devices at once.
 *
 * A strategy holds N replicas, one per device. A variable made through it
 * (nb_mirrored_variable_new) has one copy per replica, all made from one initial
 * value. nb_mirrored_step splits a global batch along its first dimension
 * (shares differ by at most one row), runs the user's step function on every
 * replica concurrently, all-reduces the gradients and applies one optimizer
 * update on every replica, so the copies stay equal bit for bit. Replicas 1 ..
 * N-1 run on host threads of their own; replica 0 runs on the calling thread,
 * with the caller's tapes, device stack and pending error set aside for the
 * call. Each replica has its own scope, tape stack and device pushed.
 *
 * Inside a replica function, nb_read() of a mirrored variable gives that
 * replica's copy; outside any replica it gives replica 0's. Everything created
 * inside a replica function belongs to that replica's scope, which ends when
 * the step ends (outputs of nb_mirrored_run are handed to the caller's scope).
 *
 * All-reduce: gradients are packed into buckets of one dtype (25 MiB by
 * default; a larger gradient gets a bucket of its own), so a step makes few
 * collective calls. When every replica is a distinct physical GPU and NCCL is
 * built in, NCCL reduces them; otherwise (logical GPUs, CPU devices) each
 * replica reduces its own 1/N of every bucket from all replicas in the fixed
 * order 0, 1, ..., N-1 and then gathers the other parts (reduce-scatter then
 * all-gather through device copies): no replica is a funnel, and two runs give
 * the same bits.
 *
 * Errors: a failure on any replica makes the call return that error with a
 * message naming the replica and its device; no variable is updated anywhere
 * and the strategy stays usable. Error handlers run on the failing replica's
 * thread. */
#ifndef NABLA_DISTRIBUTE_H
#define NABLA_DISTRIBUTE_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_mirrored nb_mirrored;
/* What a replica function is told about the replica it runs for. */
typedef struct nb_replica nb_replica;

/* How per-replica values combine. */
typedef enum nb_reduction {
    NB_REDUCE_SUM = 0, /* the plain sum over replicas */
    NB_REDUCE_MEAN = 1 /* nb_mirrored_step: weighted by each replica's rows (the exact
                          global mean of per-row means); elsewhere: sum times 1/N */
} nb_reduction;

/* ---- the strategy ---------------------------------------------------------- */

/* Creates a strategy over n devices named in devices ("/gpu:0", "/cpu:1", ...).
 * With devices NULL it takes the default devices: every GPU, or where there is
 * none every logical CPU device (nb_set_logical_cpu_devices); n = 0 takes all of
 * them, n > 0 the first n. Returns a strategy the caller frees with
 * nb_mirrored_free; NULL and NB_ERR_INVALID_ARGUMENT for n < 0, n above 64,
 * n = 0 with devices given, or a device given twice; NB_ERR_DEVICE for an
 * unknown or malformed name or fewer default devices than n (no soft placement
 * here: a replica never silently lands on another device); NB_ERR_OUT_OF_MEMORY
 * when a thread or memory cannot be had. */
nb_mirrored *nb_mirrored_new(int n, const char *const *devices);

/* ---- across processes ------------------------------------------------------ */

/* Like nb_mirrored_new, for this process's n devices, and spanning every
 * process that mpirun started (the world): the replicas of all processes form
 * one strategy. Initialises MPI (MPI_THREAD_SERIALIZED) when the program has
 * not and a launcher (mpirun, mpiexec, srun) started the process, and then
 * finalises it at exit; a program that initialises MPI itself does so before
 * this call and finalises it after freeing the strategy. Started without a
 * launcher (and without MPI initialised), or built without MPI, it is
 * nb_mirrored_new: one process, MPI untouched.
 * Each process calls the strategy's functions in the same order from one
 * thread (the one that initialised MPI, when that was MPI_THREAD_FUNNELED):
 *   - nb_mirrored_variable_new is collective: every process must make the same
 *     variables (name, dtype, shape) in the same order, or every process fails
 *     naming the first difference; each starts from rank 0's initial value.
 *   - nb_mirrored_step takes this process's share of the global batch (shares
 *     may differ in size, and be empty); its replicas reduce their gradients,
 *     then the processes sum theirs: with NCCL where every process's first
 *     replica is a GPU of its own (waiting for each sum, so that a dead
 *     process is found), else with MPI through host memory; MEAN is the mean
 *     over every row of every process, and *loss the global batch's.
 *   - nb_mirrored_all_reduce sums over every replica of every process (MEAN
 *     divides by their count); nb_mirrored_run and nb_mirrored_reduce stay
 *     within the process.
 * Every wait across processes has a deadline (nb_mirrored_set_timeout): a
 * process that dies or stops answering makes the others' call fail with
 * NB_ERR_TIMEOUT naming its rank where it is known, and from then on every
 * call across processes fails at once (MPI is then not finalised at exit, since
 * that would wait for the dead process; mpirun needs --enable-recovery for the
 * others to outlive one that was killed). A process that was only slow and
 * sends after the deadline cannot reach memory the others freed (their
 * pending receives are cancelled; what a pending send still reads is kept to
 * the end of the process), so freeing the strategy after such a failure is
 * safe. Returns the strategy, or NULL with
 * the error (NB_ERR_BACKEND when MPI cannot start, NB_ERR_TIMEOUT or
 * NB_ERR_INVALID_ARGUMENT when the processes do not agree to start). */
nb_mirrored *nb_mirrored_new_world(int n, const char *const *devices);

/* This process's rank among the processes (0 with one), their count (1 without
 * mpirun), and the replicas of all of them; 0 for NULL. */
int nb_mirrored_world_rank(const nb_mirrored *s);
int nb_mirrored_world_size(const nb_mirrored *s);
int nb_mirrored_world_replicas(const nb_mirrored *s);

/* The deadline of every wait across processes, in seconds (default
 * NB_WORLD_TIMEOUT from the environment, else 300): process-wide.
 * NB_ERR_INVALID_ARGUMENT for NULL or a value that is not positive. */
nb_status nb_mirrored_set_timeout(nb_mirrored *s, double seconds);

/* Waits for a call (step, run, all-reduce) running on another thread to finish, then frees the
 * strategy, its threads and its buffers. Mirrored variables stay valid (each
 * keeps its copies) but can no longer be used by a step. NULL is ignored.
 * Called from inside one of the strategy's own replica functions it does
 * nothing and records NB_ERR_INVALID_ARGUMENT. */
void nb_mirrored_free(nb_mirrored *s);

/* Number of replicas; 0 for NULL. */
int nb_mirrored_replicas(const nb_mirrored *s);

/* Device name of replica r (a static string); NULL when out of range. */
const char *nb_mirrored_device(const nb_mirrored *s, int replica);

/* Bucket size for packing gradients, in bytes (default 25 MiB). Returns
 * NB_ERR_INVALID_ARGUMENT for 0 or NULL. */
nb_status nb_mirrored_set_bucket_bytes(nb_mirrored *s, size_t bytes);

/* Counters of what the strategy has done. */
typedef struct nb_mirrored_stats {
    int64_t steps;           /* nb_mirrored_step calls that applied an update */
    int64_t collective_calls;/* buckets all-reduced so far (one collective call each) */
    int last_buckets;        /* buckets in the last all-reduce */
    size_t bucket_bytes;     /* the current setting */
    const char *algorithm;   /* "nccl" or "copies" (reduce-scatter + all-gather) */
    const char *world_algorithm; /* across processes: "nccl" (a GPU per process) or "mpi"
                                    (a ring through host memory); NULL in one process */
    int64_t world_sums;      /* all-reduces across processes so far (each of every bucket) */
    double world_seconds;    /* the time they took in all, handshakes and staging included */
} nb_mirrored_stats;

/* Writes the counters to *out. NB_ERR_INVALID_ARGUMENT for NULL. */
nb_status nb_mirrored_get_stats(const nb_mirrored *s, nb_mirrored_stats *out);

/* ---- mirrored variables ---------------------------------------------------- */

/* Creates a trainable variable with one copy of initial on every replica's
 * device (so all start equal). name is copied. The caller frees it with
 * nb_variable_free, which frees every copy; the other variable functions work
 * on it as on any variable (an assignment writes every copy; from inside a
 * replica function it is NB_ERR_INVALID_ARGUMENT, since the replicas would race).
 * NULL and the error when initial is NULL, s is NULL or memory runs out. */
nb_variable *nb_mirrored_variable_new(nb_mirrored *s, const char *name, const nb_tensor *initial);

/* Number of copies of v: the replica count for a mirrored variable, 0 for a
 * plain one (or NULL). */
int nb_variable_replicas(const nb_variable *v);

/* Replica r's copy of a mirrored variable (a snapshot, not watched by tapes),
 * owned by the current scope. NULL and NB_ERR_INVALID_ARGUMENT when v is not
 * mirrored or r is out of range. For checking that the copies agree. */
nb_tensor *nb_mirrored_variable_read(nb_variable *v, int replica);

/* ---- the replica context --------------------------------------------------- */

int nb_replica_index(const nb_replica *r);         /* 0 .. N-1 */
int nb_replica_count(const nb_replica *r);         /* N */
const char *nb_replica_device(const nb_replica *r);/* its device, a static string */
int64_t nb_replica_rows(const nb_replica *r);      /* rows of the global batch it got */
int64_t nb_replica_global_rows(const nb_replica *r);/* rows of the whole batch */

/* ---- running on every replica ---------------------------------------------- */

/* A function run on one replica, on that replica's thread with its device
 * pushed. inputs are its share of the global inputs (rows [start, start + rows)
 * of each, on its device: shares follow replica order, and the first B mod N
 * replicas get one row more). It writes n_outputs tensors to outputs (a NULL
 * output is allowed) and returns NB_OK or an error; returning NB_OK with an
 * error pending counts as failing. */
typedef nb_status (*nb_replica_fn)(nb_replica *r, int n_inputs, nb_tensor *const *inputs,
                                   int n_outputs, nb_tensor **outputs, void *user);

/* Runs fn on every replica concurrently, each with its share of inputs (every
 * input needs at least one dim, and all the same first dim: NB_ERR_SHAPE
 * otherwise; a replica may get zero rows and is still called). Writes
 * N * n_outputs tensors to outputs, replica-major (outputs[r * n_outputs + k]),
 * each on its replica's device and owned by the caller's current scope. On
 * failure every output is NULL and the error names the first replica (lowest
 * index) that failed. */
nb_status nb_mirrored_run(nb_mirrored *s, nb_replica_fn fn, void *user, int n_inputs,
                          nb_tensor *const *inputs, int n_outputs, nb_tensor **outputs);

/* Combines N per-replica values (one per replica, same shape and dtype, any
 * devices) into one tensor on the caller's current device, summing in replica
 * order (MEAN divides by N). Returns it, owned by the current scope; NULL and
 * NB_ERR_SHAPE / NB_ERR_DTYPE when they disagree. */
nb_tensor *nb_mirrored_reduce(nb_mirrored *s, nb_reduction reduction, nb_tensor *const *per_replica);

/* All-reduces N per-replica tensors (per_replica[r] of one shape and dtype,
 * else NB_ERR_SHAPE / NB_ERR_DTYPE; copied to replica r's device when
 * elsewhere) with the strategy's collective: writes N new tensors to out, out[r]
 * on replica r's device, all equal bit for bit (SUM, or MEAN = SUM times 1/N;
 * NB_BOOL is NB_ERR_DTYPE, and MEAN needs a floating dtype). Owned by the
 * current scope. On failure every out[r] is NULL. */
nb_status nb_mirrored_all_reduce(nb_mirrored *s, nb_reduction reduction, nb_tensor *const *per_replica,
                                 nb_tensor **out);

/* ---- training --------------------------------------------------------------- */

/* One replica's training step. inputs are its share of the batch (rows > 0),
 * on its device. It records its own tape, writes its loss (a floating scalar)
 * to *loss and the gradient of the loss with respect to vars[i] to grads[i]
 * (NULL for none, which counts as zeros), all owned by its scope (the
 * replica's scope: simply return what the ops gave). Usually:
 *     nb_tape *tape = nb_tape_begin();
 *     *loss = my_loss(inputs);
 *     return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads); */
typedef nb_status (*nb_replica_step_fn)(nb_replica *r, int n_inputs, nb_tensor *const *inputs,
                                        int n_vars, nb_variable *const *vars, nb_tensor **loss,
                                        nb_tensor **grads, void *user);

/* One training step: splits inputs over the replicas (as nb_mirrored_run does), runs fn on every replica
 * that got rows (a replica with zero rows is not called: it contributes zero
 * gradient and zero weight), all-reduces the gradients, SUM or MEAN (MEAN
 * weights replica r by rows_r / global rows, so with a per-row mean loss the
 * update is that of one device on the whole batch), and applies opt to every
 * copy of every variable. vars must all be mirrored variables of s (NB_VARS(w, b)
 * gives the count and array). A variable no replica gave a gradient is left as
 * it is. When loss is not NULL, *loss receives the combined loss (reduced like
 * the gradients) as an f64 scalar on the caller's current device, owned by the
 * current scope.
 * Fails with NB_ERR_INVALID_ARGUMENT for a NULL argument, no inputs, a plain
 * variable or one of another strategy, or a call from inside a replica
 * function; NB_ERR_SHAPE for inputs without a common first dim or a batch of no
 * rows; with the replica's error (naming it) when a replica fails, its gradient
 * does not match its variable (NB_ERR_SHAPE / NB_ERR_DTYPE) or its loss is not
 * a floating scalar (NULL: NB_ERR_INVALID_ARGUMENT, not floating: NB_ERR_DTYPE,
 * more than one element: NB_ERR_SHAPE). On failure nothing is updated. */
nb_status nb_mirrored_step(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                           nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                           nb_reduction reduction, nb_tensor **loss);

/* ---- a captured training step ------------------------------------------------- */

typedef struct nb_mirrored_graph nb_mirrored_graph;

/* nb_mirrored_step captured (nabla/graph.h, whose rules the step function
 * follows on every replica): runs it as step 1 and records each replica's part
 * of it on its device, in two graphs: its step function with the gradients
 * packed into the all-reduce's buckets, and its update from the reduced
 * buckets. Each replay (nb_mirrored_graph_replay) then replays every
 * replica's first graph at once, all-reduces the buckets as a step does (NCCL
 * or device copies: not recorded), and replays the second graphs: the
 * variables of eager steps, bit for bit, at the host cost of two replays per
 * replica. The step function runs twice per replica at capture.
 * Writes the graph (freed by nb_mirrored_graph_free, before the strategy) to
 * *out and step 1's combined loss, as nb_mirrored_step does, to *loss (when
 * not NULL). The strategy, the optimizer and the variables must outlive the
 * graph; eager steps and other graphs of the strategy may run between its
 * replays. On failure *out is NULL and the error is returned: those of
 * nb_mirrored_step, NB_ERR_SHAPE when a replica would get no rows (every
 * replica records its part), NB_ERR_UNSUPPORTED for a step function that
 * breaks a capture rule (naming the replica and the call). Across processes
 * (nb_mirrored_new_world) every process captures, replays and steps eagerly
 * in the same order, as with nb_mirrored_step; the sum over the processes is
 * not recorded either. A failure in the step's capture updates nothing; one
 * in the update's recording leaves step 1 applied (perhaps not everywhere). */
nb_status nb_mirrored_capture(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                              nb_replica_step_fn fn, void *user, int n_inputs, nb_tensor *const *inputs,
                              nb_reduction reduction, nb_tensor **loss, nb_mirrored_graph **out);

/* One more step: inputs (as many as at capture, each of the shape and dtype it
 * had then; any device) split over the replicas, their graphs replayed, the
 * buckets all-reduced, the updates replayed, the optimizer's step counted. The
 * combined loss to *loss as nb_mirrored_step gives it (when not NULL).
 * NB_ERR_INVALID_ARGUMENT for NULL g or input, NB_ERR_SHAPE or NB_ERR_DTYPE
 * naming an input that changed (capture a new graph for it), or a replica's
 * error naming it (on a GPU, errors in the replayed kernels surface at the
 * next synchronising call). */
nb_status nb_mirrored_graph_replay(nb_mirrored_graph *g, nb_tensor *const *inputs, nb_tensor **loss);

/* How many kernels and copies one replay launches over all the replicas; 0
 * for NULL. */
int64_t nb_mirrored_graph_nodes(const nb_mirrored_graph *g);

/* Waits for g's replays and frees it. NULL is ignored. */
void nb_mirrored_graph_free(nb_mirrored_graph *g);

#ifdef __cplusplus
}
#endif
#endif
