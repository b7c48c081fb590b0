/* nabla — pipeline parallelism: one model cut into stages, one stage per
 * device, a batch pushed through them in micro-batches.
 *
 * Model parallelism needs nothing of this file: ops copy their inputs between
 * devices differentiably, so a model whose layers sit on two devices (each
 * layer under nb_device_push) trains as any other, one device busy at a time.
 * A pipeline keeps them all busy: it splits the batch along its first dim into
 * M micro-batches and runs stage s of micro-batch m while stage s+1 runs
 * micro-batch m-1. Each stage has a host thread of its own for the pipeline's
 * life, with its device pushed, its own scope and tape stack; stages pass
 * activations forward and their gradients back through per-micro-batch
 * mailboxes.
 *
 * A stage function gets x (the previous stage's output, copied to its device;
 * stage 0: the micro-batch's rows of input 0) and writes y. The last stage's
 * y is the micro-batch's loss, a floating scalar (for example the mean over
 * the micro-batch's rows). The pipeline records each (stage, micro-batch) on a
 * tape of its own and takes its gradient seeded with what the next stage sent
 * back, so the gradients it returns are those of the whole batch:
 *
 *     sum over m of w_m * d loss_m / d vars,   w_m = rows_m / B (MEAN) or 1 (SUM).
 *
 * Schedules: GPipe runs every micro-batch forward, then every one backward;
 * 1F1B (PipeDream-flush) starts the backward of a micro-batch as soon as the
 * last stage has its loss, so a stage holds at most S - s micro-batches'
 * activations instead of M. Both add the micro-batches' gradients in the same
 * order (0, 1, ..., M-1), so they give the same bits; both have the same
 * ideal bubble, (S-1)/(M+S-1) of the time.
 *
 * Errors: a stage that fails (its function returns an error, or returns with
 * an error pending) stops every stage; the call returns that error naming the
 * stage, its device and the micro-batch, nothing is updated, and the pipeline
 * is ready for the next call. Error handlers run on the failing stage's
 * thread. */
#ifndef NABLA_PIPELINE_H
#define NABLA_PIPELINE_H

#include <nabla/distribute.h>
#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most stages a pipeline may have. */
#define NB_PIPELINE_MAX_STAGES 64

typedef struct nb_pipeline nb_pipeline;
/* What a stage function is told about the stage and micro-batch it runs. */
typedef struct nb_stage nb_stage;

typedef enum nb_pipeline_schedule {
    NB_PIPELINE_GPIPE = 0, /* all forwards, then all backwards (the default) */
    NB_PIPELINE_1F1B = 1   /* one forward, one backward: fewer activations held */
} nb_pipeline_schedule;

/* A stage's forward pass for one micro-batch, run on the stage's thread with
 * its device pushed. x: the previous stage's output on this stage's device
 * (stage 0: the micro-batch's rows of input 0), owned by the pipeline. Writes
 * its output to *y (owned by the current scope: simply return what the ops
 * gave); the last stage's is the micro-batch's loss. Returns NB_OK or an
 * error; NB_OK with an error pending counts as failing. */
typedef nb_status (*nb_stage_fn)(nb_stage *st, nb_tensor *x, nb_tensor **y, void *user);

/* Creates a pipeline of n_stages stages, stage s on devices[s] ("/cpu:0",
 * "/gpu:1", ...). One device may host several stages (each keeps a thread of
 * its own; on one GPU they share its stream, so they overlap little). Returns
 * a pipeline the caller frees with nb_pipeline_free; NULL and
 * NB_ERR_INVALID_ARGUMENT for n_stages outside [1, 64] or a NULL list or name,
 * NB_ERR_DEVICE naming an unknown or malformed device (no soft placement: a
 * stage never silently lands elsewhere), NB_ERR_OUT_OF_MEMORY when a thread or
 * memory cannot be had. */
nb_pipeline *nb_pipeline_new(int n_stages, const char *const *devices);

/* Waits for a call running on another thread, then stops the stage threads
 * and frees the pipeline (the variables stay the caller's). NULL is ignored.
 * From inside a stage function it does nothing and records
 * NB_ERR_INVALID_ARGUMENT. */
void nb_pipeline_free(nb_pipeline *p);

/* Number of stages (0 for NULL) and stage s's device (a static string; NULL
 * out of range). */
int nb_pipeline_stages(const nb_pipeline *p);
const char *nb_pipeline_device(const nb_pipeline *p, int stage);

/* Sets stage's function, its user pointer and the variables it trains
 * (vars[0 .. n_vars-1], copied; the variables stay the caller's and must
 * outlive their use). Each must be a plain, floating variable on the stage's
 * device. NB_OK; NB_ERR_INVALID_ARGUMENT for a NULL pipeline, function or
 * variable, a stage out of range, n_vars < 0, a mirrored variable or one
 * given to two stages (or twice); NB_ERR_DEVICE naming a variable on another
 * device; NB_ERR_DTYPE for a variable that is not floating. On failure the
 * stage keeps its previous setting. */
nb_status nb_pipeline_set_stage(nb_pipeline *p, int stage, nb_stage_fn fn, void *user, int n_vars,
                                nb_variable *const *vars);

/* Chooses the schedule of the next calls. NB_OK, or NB_ERR_INVALID_ARGUMENT
 * for NULL or an unknown schedule. */
nb_status nb_pipeline_set_schedule(nb_pipeline *p, nb_pipeline_schedule schedule);

/* The variables of every stage in stage order (then each stage's order):
 * writes up to cap of them to out and returns how many there are (0 for
 * NULL). grads of nb_pipeline_gradients follow this order. */
int nb_pipeline_variables(const nb_pipeline *p, nb_variable **out, int cap);

/* ---- the stage context ----------------------------------------------------- */

int nb_stage_index(const nb_stage *st);         /* 0 .. S-1; -1 for NULL */
int nb_stage_count(const nb_stage *st);         /* S */
int nb_stage_micro_batch(const nb_stage *st);   /* 0 .. M-1 */
int nb_stage_micro_batches(const nb_stage *st); /* M */
int64_t nb_stage_rows(const nb_stage *st);      /* rows of this micro-batch */
const char *nb_stage_device(const nb_stage *st);/* a static string */

/* From a stage function: the micro-batch's rows of step input k, on this
 * stage's device (copied once per stage and micro-batch; later calls return
 * the same tensor), owned by the pipeline and valid until the function
 * returns (ops and tapes keep what they need of it): for the last stage's
 * labels. NULL and NB_ERR_INVALID_ARGUMENT for NULL or k out of range. */
nb_tensor *nb_stage_input(nb_stage *st, int k);

/* ---- training ------------------------------------------------------------------ */

/* Runs the batch through the pipeline: every input (at least one; all with
 * at least one dim and one first dim B) is split into micro_batches shares of
 * consecutive rows (the first B mod M get one row more), and the stages run
 * the schedule concurrently. Writes to grads[i] (an array of
 * nb_pipeline_variables(p) entries) the gradient of variable i, on its device
 * (NULL when no micro-batch's loss depends on it), and to *loss (when not
 * NULL) the combined loss as an f64 scalar on the caller's current device,
 * all owned by the caller's current scope. MEAN weighs micro-batch m by
 * rows_m / B (so a per-row mean loss gives the full batch's mean gradient);
 * SUM adds them. Returns NB_OK or the error, with every output NULL:
 * NB_ERR_INVALID_ARGUMENT for a NULL pipeline, input or array, no inputs, an
 * unknown reduction, micro_batches < 1 or more than the rows, a stage without
 * a function, a call from a stage function; NB_ERR_SHAPE for inputs that are
 * scalars or disagree on their first dim; a stage's error naming the stage,
 * its device and the micro-batch: its function's, NB_ERR_INVALID_ARGUMENT
 * for a NULL output, NB_ERR_DTYPE / NB_ERR_SHAPE for a last output that is
 * not a floating scalar or an inner one that is not floating. */
nb_status nb_pipeline_gradients(nb_pipeline *p, int micro_batches, int n_inputs, nb_tensor *const *inputs,
                                nb_reduction reduction, nb_tensor **loss, nb_tensor **grads);

/* nb_pipeline_gradients, then one update of every stage's variables with opt
 * (one nb_optimizer_apply on the caller's thread: each variable is updated on
 * its own device; a variable without gradient is left as it is). On any
 * failure nothing is updated. *loss as above (NULL is fine). NB_OK or the
 * error (NB_ERR_INVALID_ARGUMENT for a NULL optimizer). */
nb_status nb_pipeline_step(nb_pipeline *p, nb_optimizer *opt, int micro_batches, int n_inputs,
                           nb_tensor *const *inputs, nb_reduction reduction, nb_tensor **loss);

/* ---- statistics ------------------------------------------------------------------ */

typedef struct nb_pipeline_stats {
    int64_t steps;            /* calls that succeeded */
    int stages, micro_batches;/* of the last successful call */
    nb_pipeline_schedule schedule;
    double wall_seconds;      /* the last call's schedule, start to end */
    double stage_busy_seconds[NB_PIPELINE_MAX_STAGES]; /* its time in forwards and backwards */
    int stage_peak_in_flight[NB_PIPELINE_MAX_STAGES];  /* most micro-batches it held at once */
    double bubble;            /* measured: 1 - mean busy / wall */
    double ideal_bubble;      /* the schedule's: (S-1) / (M+S-1) */
} nb_pipeline_stats;

/* Writes the statistics of the last successful call to *out. NB_OK, or
 * NB_ERR_INVALID_ARGUMENT for NULL. */
nb_status nb_pipeline_get_stats(const nb_pipeline *p, nb_pipeline_stats *out);

#ifdef __cplusplus
}
#endif
#endif
