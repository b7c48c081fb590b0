/* How the Fashion-MNIST samples train and score a classifier (header-only):
 * an epoch of mini-batch steps with its progress lines, an epoch's running loss
 * and accuracy kept on the device, and the accuracy on a test set.
 *
 *   classifier c = {forward, &model, n_vars, vars, opt};
 *   epoch_sums sums = epoch_sums_new();
 *   for each epoch:
 *       train_epoch(&c, batches, steps, epoch, &sums);
 *       epoch_sums_read(&sums, &loss, &train_accuracy);
 *       test_accuracy = accuracy_in_chunks(&c, x_test, y_test, 1000);
 *
 * With c.graph set (a classifier_graph of the caller's), the first step of a
 * batch shape is captured (nb_graph_capture) and every later batch of that
 * shape replays it; a batch of another shape (the last, shorter one) runs as
 * an eager step between the replays. */
#ifndef NB_SAMPLES_TRAINING_H
#define NB_SAMPLES_TRAINING_H

#include <nabla/nabla.h>
#include <stdio.h>

#include "progress.h"

#define CLASSIFIER_MAX_VARS 32

typedef struct classifier_graph classifier_graph;

/* A model that maps rows to logits, and what trains it. */
typedef struct classifier {
    nb_tensor *(*forward)(void *model, nb_tensor *x, bool training); /* x -> logits [rows, classes] */
    void *model;
    int n_vars; /* at most CLASSIFIER_MAX_VARS */
    nb_variable **vars; /* the trainable ones */
    nb_optimizer *opt;
    nb_loss_scaler *scaler; /* NULL, or the loss scaling of f16 training */
    classifier_graph *graph; /* NULL, or where the captured step is kept */
} classifier;

/* Number of rows whose largest logit is at the label, as an f32 0-d tensor. */
static inline nb_tensor *count_correct(nb_tensor *logits, nb_tensor *labels)
{
    return nb_sum_all(nb_cast(nb_equal(nb_argmax(logits, 1, false), labels), NB_F32));
}

/* The share of the rows of x (any rank) that c classifies as y says, run
 * `chunk` rows at a time. */
static inline double accuracy_in_chunks(const classifier *c, nb_tensor *x, nb_tensor *y, int64_t chunk)
{
    nb_shape begin = nb_tensor_shape(x), size = begin;
    for (int d = 1; d < begin.ndim; d++)
        begin.dims[d] = 0, size.dims[d] = -1;
    int64_t n = nb_tensor_dim(x, 0);
    double right = 0;
    for (int64_t start = 0; start < n; start += chunk) {
        nb_scope *s = nb_scope_begin();
        int64_t len = n - start < chunk ? n - start : chunk;
        begin.dims[0] = start, size.dims[0] = len;
        nb_tensor *xb = nb_slice(x, begin, size);
        nb_tensor *yb = nb_slice(y, NB_SHAPE(start), NB_SHAPE(len));
        right += nb_tensor_item(count_correct(c->forward(c->model, xb, false), yb));
        nb_scope_end(s);
    }
    return right / (double)n;
}

/* An epoch's sums of loss * rows and of correct rows, in a variable on the
 * device so that the training loop never waits for them; `seen` counts rows. */
typedef struct epoch_sums {
    nb_variable *sums;
    int64_t seen;
} epoch_sums;

static inline epoch_sums epoch_sums_new(void)
{
    epoch_sums e = {nb_variable_new("stats", nb_zeros(NB_F32, NB_SHAPE(2))), 0};
    nb_variable_set_trainable(e.sums, false);
    return e;
}

static inline void epoch_sums_restart(epoch_sums *e)
{
    nb_variable_assign(e->sums, nb_zeros(NB_F32, NB_SHAPE(2)));
    e->seen = 0;
}

/* Adds a batch's mean loss and its count of right rows to the sums on the
 * device (the caller counts the rows: a replayed step runs no host code). */
static inline void epoch_sums_add(epoch_sums *e, nb_tensor *loss, nb_tensor *logits, nb_tensor *labels)
{
    int64_t len = nb_tensor_dim(logits, 0);
    nb_tensor *both[2] = {nb_mul_scalar(loss, (double)len), count_correct(logits, labels)};
    nb_variable_assign_add(e->sums, nb_stack(2, both, 0));
}

/* The mean loss and the accuracy so far (reading them waits for the device). */
static inline void epoch_sums_read(const epoch_sums *e, double *loss, double *accuracy)
{
    float sums[2];
    nb_tensor_read(nb_read(e->sums), sums, sizeof sums);
    *loss = sums[0] / (double)e->seen;
    *accuracy = sums[1] / (double)e->seen;
}

/* A progress line after step (1-based) when one is due. */
static inline void epoch_sums_progress(const epoch_sums *e, progress *bar, int64_t step)
{
    if (progress_due(bar, step)) {
        double loss, accuracy;
        epoch_sums_read(e, &loss, &accuracy);
        progress_show(bar, step, loss, e->seen);
    }
}

static inline void epoch_sums_free(epoch_sums *e)
{
    nb_variable_free(e->sums);
}

/* One step on a batch: the mean sparse softmax cross-entropy of c's logits, its
 * gradients by a tape, the optimizer's update; the loss and logits go to sums
 * (the caller counts the rows). */
static inline void classifier_step(const classifier *c, nb_tensor *x, nb_tensor *y, epoch_sums *sums)
{
    nb_tape *tape = nb_tape_begin();
    nb_tensor *logits = c->forward(c->model, x, true);
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, y));
    nb_tensor *grads[CLASSIFIER_MAX_VARS];
    if (c->scaler) { /* gradients of the scaled loss; a step that overflows is skipped */
        nb_tape_gradient_vars(tape, nb_loss_scaler_scale(c->scaler, loss), c->n_vars, c->vars, grads);
        nb_loss_scaler_step(c->scaler, c->opt, c->n_vars, c->vars, grads, NULL);
    } else {
        nb_tape_gradient_vars(tape, loss, c->n_vars, c->vars, grads);
        nb_optimizer_apply(c->opt, c->n_vars, c->vars, grads);
    }
    epoch_sums_add(sums, loss, logits, y);
}

/* The captured step and what it reads: the caller's, kept across epochs. */
struct classifier_graph {
    const classifier *c;
    epoch_sums *sums;
    nb_graph *step; /* NULL until the first full batch */
    int64_t rows;   /* the batch rows it was captured with */
    int64_t replays, eager_steps;
};

/* classifier_step as a graph's step function (no outputs). */
static inline nb_status classifier_graph_step(void *user, int n_in, nb_tensor *const *in, int n_out,
                                              nb_tensor **out)
{
    classifier_graph *cg = user;
    (void)n_in, (void)n_out, (void)out;
    classifier_step(cg->c, in[0], in[1], cg->sums);
    return NB_OK; /* the samples' error handler exits at the first error */
}

/* A step on (x, y) through c->graph: the capture at the first batch, replays
 * at every later one of its shape, an eager step at any other shape. */
static inline void classifier_graph_run(const classifier *c, nb_tensor *x, nb_tensor *y, epoch_sums *sums)
{
    classifier_graph *cg = c->graph;
    cg->c = c;
    cg->sums = sums;
    nb_tensor *in[2] = {x, y};
    int64_t rows = nb_tensor_dim(x, 0);
    if (!cg->step) {
        nb_graph_capture(nb_device_current(), classifier_graph_step, cg, 2, in, 0, NULL, &cg->step);
        cg->rows = rows;
    } else if (rows == cg->rows) {
        nb_graph_replay(cg->step, in, NULL);
        cg->replays++;
    } else {
        classifier_step(c, x, y, sums);
        cg->eager_steps++;
    }
}

static inline void classifier_graph_free(classifier_graph *cg)
{
    nb_graph_free(cg->step);
    cg->step = NULL;
}

/* An epoch: a step on each of the first `steps` (x, y) batches of `batches`,
 * each in a scope of its own, with progress lines as they fall due. sums
 * starts again from zero. */
static inline void train_epoch(const classifier *c, nb_dataset *batches, int64_t steps, int epoch,
                               epoch_sums *sums)
{
    nb_dataset_iterator *it = nb_dataset_iterate(batches);
    epoch_sums_restart(sums);
    progress bar;
    progress_begin(&bar, epoch, steps);
    for (int64_t step = 0; step < steps; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *batch[2];
        bool more = nb_dataset_next(it, batch) == NB_OK; /* false at the end of the data (errors exit) */
        if (more) {
            if (c->graph)
                classifier_graph_run(c, batch[0], batch[1], sums);
            else
                classifier_step(c, batch[0], batch[1], sums);
            sums->seen += nb_tensor_dim(batch[0], 0);
            epoch_sums_progress(sums, &bar, step + 1);
        }
        nb_scope_end(s);
        if (!more)
            break;
    }
    progress_end(&bar);
    nb_dataset_iterator_free(it);
}

/* An epoch's scalars for TensorBoard (w may be NULL: none): train/loss,
 * train/accuracy (unless it is negative: not measured) and test/accuracy. */
static inline void epoch_summaries(nb_summary_writer *w, int epoch, double loss, double train_accuracy,
                                   double test_accuracy)
{
    if (!w)
        return;
    nb_summary_scalar(w, "train/loss", epoch, loss);
    if (train_accuracy >= 0)
        nb_summary_scalar(w, "train/accuracy", epoch, train_accuracy);
    nb_summary_scalar(w, "test/accuracy", epoch, test_accuracy);
}

/* The samples' sanity floor: the exit status, 1 after saying so on stderr when
 * a run that trained at all (epochs > 0) ends below `floor`, else 0. */
static inline int accuracy_floor(const char *prog, int epochs, double test_accuracy, double floor)
{
    if (epochs > 0 && test_accuracy < floor) {
        fprintf(stderr, "%s: test accuracy %.3f is too low\n", prog, test_accuracy);
        return 1;
    }
    return 0;
}

/* Steps in an epoch of n rows in batches of `batch`, capped at max_steps when
 * that is positive. */
static inline int64_t steps_per_epoch(int64_t n, int batch, int max_steps)
{
    int64_t steps = (n + batch - 1) / batch;
    return max_steps > 0 && max_steps < steps ? max_steps : steps;
}

#endif
