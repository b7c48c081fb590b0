/* nabla internal — the mirrored strategy's parts: the strategy and its replica
 * threads (mirrored.c), and the bucketed all-reduce they run (allreduce.c). */
#ifndef NB_DISTRIBUTE_IMPL_H
#define NB_DISTRIBUTE_IMPL_H

#include "lib/core/backend.h"
#include "lib/core/core.h"

#include <pthread.h>

#define NB_MIRRORED_MAX 64
#define NB_REPLICA_MESSAGE 1024

/* A barrier for the replica threads that also agrees on success: every thread
 * passes in whether it is fine and all get back whether all were. When all are,
 * the last to arrive runs `last` (when set) before anyone goes on, and its
 * result becomes everyone's. */
typedef struct nb_barrier {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int n, arrived;
    atomic_uint_fast64_t generation; /* read without the lock while spinning */
    bool all_ok, result;
} nb_barrier;

/* One bucket: gradients of one dtype packed end to end. */
typedef struct nb_bucket {
    nb_dtype dtype;
    int64_t numel;
} nb_bucket;

/* Where each variable's gradient lies in the buckets (bucket -1: no replica gave
 * one, so it is left out). Made once per step by the last replica to arrive. */
typedef struct nb_bucket_plan {
    int n_buckets, cap_buckets;
    nb_bucket *buckets;
    int n_vars, cap_vars;
    int *bucket_of;     /* per variable */
    int64_t *offset_of; /* per variable: first element in its bucket */
} nb_bucket_plan;

/* Bucket tensors a replica keeps from one step to the next while the plan's
 * buckets stay the same (so a training loop allocates none). */
typedef struct nb_bucket_cache {
    int n;
    nb_bucket *layout;
    nb_tensor **tensors; /* 1-d, contiguous, on the replica's device */
} nb_bucket_cache;

struct nb_replica {
    int index, count;
    const char *device;
    int64_t start, rows, global_rows;
};

typedef struct nb_mirrored nb_mirrored;
typedef struct nb_replica_state nb_replica_state;

/* The work of one call, run by every replica thread on its own state. */
typedef void (*nb_job_fn)(nb_replica_state *rs, void *job);

struct nb_replica_state {
    nb_mirrored *s;
    int index;
    nb_device *dev;
    pthread_t thread;   /* replicas 1 .. N-1; replica 0 runs on the caller's thread */
    bool started;
    bool serial;        /* its kernels keep to its own thread (nb__thread_set_serial) */
    struct nb_replica ctx;
    /* the outcome of the current job: the first error, moved off the thread */
    nb_status status;
    char message[NB_REPLICA_MESSAGE];
    /* a step's results, held until every replica is done */
    nb_tensor *loss;
    nb_tensor **grads;     /* per variable: what the step function gave */
    /* per-variable scratch of the update: the replica's copies, and views of
     * the reduced gradients in the buckets (grown by reserve_vars) */
    nb_variable **copies;
    nb_tensor **places;
    nb_bucket_cache cache;
    /* the buffers of the all-reduce in progress, read by the other replicas */
    nb_tensor *const *ar_src;
    nb_tensor *const *ar_dst;
};

struct nb_mirrored {
    uint64_t id;
    int n;
    nb_device *devices[NB_MIRRORED_MAX];
    nb_replica_state *reps;

    /* handing jobs to the replica threads */
    pthread_mutex_t lock;
    pthread_cond_t work_cv, done_cv;
    atomic_uint_fast64_t generation; /* bumped for each job */
    atomic_int remaining;            /* replica threads still on the current job */
    bool quit;
    /* Threads spin a little before they sleep while the replicas do not
     * outnumber the cores: waking a sleeping thread costs tens of microseconds
     * (more on virtual machines), several times per step. */
    bool spin;
    nb_job_fn job_fn;
    void *job;
    nb_barrier barrier;
    pthread_mutex_t call_lock; /* one call at a time; free waits on it */

    /* the all-reduce */
    size_t bucket_bytes;
    const nb_collective *collective; /* NCCL when every replica is its own card */
    void *comm;
    nb_bucket_plan plan;
    /* per variable, for the plan: some replica gave a gradient; dtype; size */
    int cap_vars;
    bool *present;
    nb_dtype *dtypes;
    int64_t *numels;

    /* counters */
    int64_t steps, collective_calls;
    int last_buckets;

    /* across processes (nb_mirrored_new_world with more than one): this
     * process's replicas reduce first, then replica 0 sums the buckets with
     * the other processes (world.h) through host memory, then the others copy
     * its result */
    bool world;
    int world_replicas;  /* the replicas of every process */
    /* the processes' own collective (NCCL, one GPU per process), when every
     * process's replica 0 is a GPU of its own; else MPI through host memory */
    const nb_collective *world_collective;
    void *world_comm;
    void *host;          /* staging for buckets that are not in host memory */
    size_t host_bytes;
    int64_t world_ns, world_sums; /* time in the sums across processes, and their count */
};

/* ---- mirrored.c ------------------------------------------------------------ */

/* Waits at the strategy's barrier; returns whether every replica passed ok (and
 * last, when given, succeeded: it runs once, on the last thread to arrive, and
 * records its error there on failure). */
bool nb__mirrored_barrier(nb_mirrored *s, bool ok, bool (*last)(nb_mirrored *s, void *arg), void *arg);

/* Records on the calling replica thread that it failed (the pending error, or
 * code with a message when none is pending). Keeps the first. Returns false. */
bool nb__replica_failed(nb_replica_state *rs, nb_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A replica's share of a call's inputs: rows [ctx.start, + ctx.rows) of each,
 * on its device, owned by the current scope (a small array, or a malloc'd one
 * for many inputs). nb__shares_init returns false after nb__replica_failed;
 * nb__shares_free frees the array (not the tensors). */
typedef struct nb_shares {
    nb_tensor *small[16];
    nb_tensor **t;
} nb_shares;
bool nb__shares_init(nb_shares *sh, nb_replica_state *rs, int n, nb_tensor *const *inputs);
void nb__shares_free(nb_shares *sh);

/* ---- the training step in parts (mirrored.c), for mirrored_graph.c -------- */

/* One nb_mirrored_step as every replica thread sees it. */
typedef struct nb_step_job {
    nb_optimizer *opt;
    int n_vars;
    nb_variable *const *vars;
    nb_replica_step_fn fn;
    void *user;
    int n_inputs;
    nb_tensor *const *inputs;
    nb_reduction reduction;
    int64_t step;                /* the optimizer's step number for this update */
    const double *device_params; /* NULL, or where a recorded update reads its numbers */
    const char *who;             /* the public call, for messages */
} nb_step_job;

/* nb_mirrored_step's argument checks (fn: the step function, any type):
 * NB_OK or the error naming who. Outside the call lock. */
nb_status nb__mirrored_step_check(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                                  const void *fn, int n_inputs, nb_reduction reduction, const char *who);
/* Under the call lock: per-variable scratch, every replica's rows of the
 * batch, the optimizer's slots. NB_OK or the error naming who. */
nb_status nb__mirrored_step_prepare(nb_mirrored *s, nb_optimizer *opt, int n_vars, nb_variable *const *vars,
                                    int n_inputs, nb_tensor *const *inputs, nb_reduction reduction, const char *who);
/* Runs fn(rs, job) on every replica thread (replica 0 on the caller's) and
 * waits for all; then the first replica's error, raised naming who, or NB_OK. */
void nb__mirrored_dispatch(nb_mirrored *s, nb_job_fn fn, void *job);
nb_status nb__mirrored_raise(nb_mirrored *s, const char *who);
/* The parts of a replica's step: the step function on its shares and the
 * checks of what it gave (rs->loss, rs->grads); the bucket plan (a barrier's
 * last function, arg the job); the gradients packed into the buckets,
 * weighted; the update of its copies from the reduced buckets. Each returns
 * false after nb__replica_failed. */
bool nb__step_compute_on(nb_replica_state *rs, nb_step_job *j, nb_tensor *const *shares);
bool nb__step_plan(nb_mirrored *s, void *arg);
bool nb__step_pack(nb_replica_state *rs, nb_step_job *j);
bool nb__step_apply(nb_replica_state *rs, nb_step_job *j);
/* The batch's loss: the replicas' losses weighted as the gradients, as f64 on
 * the current device (owned by the current scope), or NULL with the error. */
nb_tensor *nb__mirrored_combine_losses(nb_mirrored *s, nb_reduction reduction);
/* Across processes: the loss of the whole global batch, summed over the
 * processes whether the caller wants it or not (every rank makes the same
 * calls), to *loss (when not NULL) as an f64 scalar on the current device. */
nb_status nb__mirrored_world_loss(nb_mirrored *s, const char *who, nb_reduction reduction, nb_tensor **loss);

/* ---- batch.c ---------------------------------------------------------------- */

/* Checks inputs to be split by rows (none NULL, each with a dim, one first dim
 * for all): NB_OK with their rows in *rows (0 for none), else the error
 * naming who and the input. */
nb_status nb__batch_check(const char *who, int n_inputs, nb_tensor *const *inputs, int64_t *rows);

/* Rows [start, start + rows) of x on dev (x itself cut where it lies, then the
 * rows copied), owned by the current scope; NULL with the error recorded. */
nb_tensor *nb__batch_rows(const nb_tensor *x, int64_t start, int64_t rows, nb_device *dev);

/* ---- allreduce.c ------------------------------------------------------------ */

/* Lays the gradients of n variables (dtypes and element counts) into buckets of
 * at most bucket_bytes (a larger gradient gets a bucket of its own), skipping
 * those with present[i] false. Grouped by dtype in order of first appearance.
 * false and NB_ERR_OUT_OF_MEMORY when host memory runs out. */
bool nb__bucket_plan_make(nb_bucket_plan *plan, int n, const nb_dtype *dtypes, const int64_t *numels,
                          const bool *present, size_t bucket_bytes);
void nb__bucket_plan_free(nb_bucket_plan *plan);

/* Makes sure the replica's cached bucket tensors match the plan (reallocating
 * when they do not). NB_OK or the error. */
nb_status nb__bucket_cache_fit(nb_replica_state *rs, const nb_bucket_plan *plan);
void nb__bucket_cache_free(nb_bucket_cache *cache);

/* Sums bucket tensors across replicas, called by every replica thread at once
 * (who: the public call, which a failure across processes names; ok: whether
 * this replica is fine so far; if any is not, nothing is summed):
 * afterwards dst of every replica holds sum over replicas of src, times scale
 * (src == dst is in place). src[k] and dst[k] are contiguous 1-d tensors, bucket k
 * of this replica, on its device; every replica passes the same layout. Uses the
 * strategy's collective when it has one, else reduce-scatter then all-gather
 * through device copies. Returns whether every replica succeeded (all agree). */
bool nb__all_reduce_buckets(nb_replica_state *rs, const char *who, bool ok, int n_buckets, nb_tensor *const *src,
                            nb_tensor *const *dst, double scale);

#endif
