/* Fashion-MNIST on a model split over two devices: an MLP (784 -> 256 -> 256
 * -> 256 -> 10, relu between, Adam, batch 128) whose first layer sits on one
 * device and the other three on a second, trained twice from the same start:
 *
 *   (a) model-parallel, plain: each layer runs under nb_device_push of its
 *       device and the ops copy the activations (and, backwards, their
 *       gradients) between the devices; one thread, one device busy at a time;
 *   (b) pipelined: the same two halves as the stages of an nb_pipeline, each
 *       batch split into M micro-batches, so that the first device works on
 *       micro-batch m + 1 while the second works on m.
 *
 * It prints each run's loss, test accuracy and steps per second side by side,
 * and the pipeline's bubble (the share of time a stage waits), measured and
 * the schedule's ideal, (S-1)/(M+S-1).
 *
 *   model_parallel [--data DIR] [--epochs N] [--steps N] [--micro-batches M]
 *                  [--schedule gpipe|1f1b] [--quick]
 *
 * The devices are two logical GPUs of the first GPU (nb_set_logical_gpu_devices)
 * where there is one, else two logical CPU devices. --steps caps the steps per
 * epoch (default 150: a run of seconds); --quick trains on 4000 images. The
 * data are the four IDX files of Fashion-MNIST (apt-get install
 * dataset-fashion-mnist). It fails (exit 1) when the two runs' first losses
 * differ (they compute one function of the same weights) or the test accuracy
 * is too low. */
#include <nabla/nabla.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command_line.h"
#include "fashion_data.h"
#include "progress.h"
#include "training.h"

#define BATCH 128
#define LAYERS 4
#define VARS (2 * LAYERS)
#define SPLIT 1 /* layers [0, SPLIT) on the first device, the rest on the second */

static const int64_t sizes[LAYERS + 1] = {784, 256, 256, 256, 10};
static const char *devs[2];

typedef struct model {
    nb_variable *vars[VARS]; /* w0, b0, w1, b1, ... */
} model;

static const char *device_of(int layer) { return devs[layer < SPLIT ? 0 : 1]; }

/* He-initialised weights and zero biases, each on its layer's device; every
 * model made this way starts from the same values. */
static void model_init(model *m, const char *prefix)
{
    for (int l = 0; l < LAYERS; l++) {
        nb_device_push(device_of(l));
        char name[48];
        snprintf(name, sizeof name, "%s/dense%d/w", prefix, l + 1);
        m->vars[2 * l] = nb_variable_new(name, nb_truncated_normal(NB_F32, NB_SHAPE(sizes[l], sizes[l + 1]), 0,
                                                                    sqrt(2.0 / (double)sizes[l]), 100 + l));
        snprintf(name, sizeof name, "%s/dense%d/b", prefix, l + 1);
        m->vars[2 * l + 1] = nb_variable_new(name, nb_zeros(NB_F32, NB_SHAPE(sizes[l + 1])));
        nb_device_pop();
    }
}

static void model_free(model *m)
{
    for (int i = 0; i < VARS; i++)
        nb_variable_free(m->vars[i]);
}

/* Layers [first, last) on x; relu after all but the last layer. */
static nb_tensor *layers(const model *m, int first, int last, nb_tensor *x)
{
    for (int l = first; l < last; l++) {
        x = nb_add(nb_matmul(x, nb_read(m->vars[2 * l])), nb_read(m->vars[2 * l + 1]));
        if (l < LAYERS - 1)
            x = nb_relu(x);
    }
    return x;
}

/* The whole model, each half under its device: model parallelism is no more
 * than this (the ops copy x to the second device, and back in the backward). */
static nb_tensor *split_forward(void *model_, nb_tensor *x, bool training)
{
    (void)training;
    const model *m = model_;
    nb_device_push(devs[0]);
    x = layers(m, 0, SPLIT, x);
    nb_device_pop();
    nb_device_push(devs[1]);
    x = layers(m, SPLIT, LAYERS, x);
    nb_device_pop();
    return x;
}

/* (a): one step, model-parallel. The loss is taken on the second device. */
static nb_tensor *plain_step(model *m, nb_optimizer *opt, nb_tensor *x, nb_tensor *y)
{
    nb_tape *tape = nb_tape_begin();
    nb_tensor *logits = split_forward(m, x, true);
    nb_device_push(devs[1]);
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, y));
    nb_device_pop();
    nb_tensor *grads[VARS];
    nb_tape_gradient_vars(tape, loss, VARS, m->vars, grads);
    nb_optimizer_apply(opt, VARS, m->vars, grads);
    return loss;
}

/* (b): the pipeline's stages. Stage 0 gets the micro-batch's images; stage 1
 * its activations and, through nb_stage_input, its labels. */
static nb_status first_half(nb_stage *st, nb_tensor *x, nb_tensor **y, void *m)
{
    (void)st;
    *y = layers(m, 0, SPLIT, x);
    return *y ? NB_OK : nb_error();
}

static nb_status second_half(nb_stage *st, nb_tensor *x, nb_tensor **y, void *m)
{
    nb_tensor *logits = layers(m, SPLIT, LAYERS, x);
    *y = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, nb_stage_input(st, 1)));
    return *y ? NB_OK : nb_error();
}

/* A small deterministic generator for the shuffles (xorshift64*). */
static uint64_t rng_state = 0x9E3779B97F4A7C15u;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717u;
}

typedef struct run_result {
    double first_loss, last_loss, accuracy, steps_per_s;
} run_result;

/* Trains m for `epochs` epochs of `steps` steps on shuffled batches (the
 * same order in both runs), plainly or through p. */
static run_result train(const char *title, model *m, nb_pipeline *p, int micro_batches, const fashion_set *data,
                        int epochs, int64_t steps)
{
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    int64_t n = nb_tensor_dim(data->x_train, 0);
    int64_t *order = malloc(sizeof *order * (size_t)n);
    rng_state = 0x9E3779B97F4A7C15u;
    run_result r = {-1, 0, 0, 0};
    double train_seconds = 0;
    int64_t total_steps = 0;
    classifier c = {.forward = split_forward, .model = m, .n_vars = VARS, .vars = m->vars, .opt = opt};
    printf("%s\n", title);
    for (int epoch = 1; epoch <= epochs; epoch++) {
        nb_scope *es = nb_scope_begin();
        for (int64_t i = 0; i < n; i++)
            order[i] = i;
        for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        nb_tensor *perm = nb_from_buffer(NB_I64, NB_SHAPE(n), order);
        double loss_sum = 0;
        int64_t seen = 0;
        progress bar;
        progress_begin(&bar, epoch, steps);
        double t0 = progress_now();
        for (int64_t step = 0; step < steps; step++) {
            nb_scope *sc = nb_scope_begin();
            int64_t start = step * BATCH, len = BATCH;
            nb_tensor *idx = nb_slice(perm, NB_SHAPE(start), NB_SHAPE(len));
            nb_tensor *x = nb_gather(data->x_train, idx), *y = nb_gather(data->y_train, idx);
            nb_tensor *loss = NULL;
            if (p)
                nb_pipeline_step(p, opt, micro_batches, NB_TENSORS(x, y), NB_REDUCE_MEAN, &loss);
            else
                loss = plain_step(m, opt, x, y);
            /* reading the loss waits for the device: both runs pay it alike */
            double l = nb_tensor_item(loss);
            if (r.first_loss < 0)
                r.first_loss = l;
            loss_sum += l * (double)len;
            seen += len;
            if (progress_due(&bar, step + 1))
                progress_show(&bar, step + 1, loss_sum / (double)seen, seen);
            nb_scope_end(sc);
        }
        train_seconds += progress_now() - t0;
        total_steps += steps;
        progress_end(&bar);
        r.last_loss = loss_sum / (double)seen;
        r.accuracy = accuracy_in_chunks(&c, data->x_test, data->y_test, 1000);
        printf("  epoch %d: loss %.4f, test accuracy %.2f%%, %.1f steps/s\n", epoch, r.last_loss,
               100.0 * r.accuracy, (double)total_steps / train_seconds);
        nb_scope_end(es);
    }
    r.steps_per_s = (double)total_steps / train_seconds;
    free(order);
    nb_optimizer_free(opt);
    return r;
}

int main(int argc, char **argv)
{
    const char *dir = FASHION_DIR, *schedule = "gpipe";
    int epochs = 1, max_steps = 150, micro_batches = 4;
    bool quick = false;
    OPTIONS_READ(argc, argv,
                 "usage: %s [--data DIR] [--epochs N] [--steps N] [--micro-batches M]\n"
                 "          [--schedule gpipe|1f1b] [--quick]\n",
                 OPTION_TEXT("--data", &dir), OPTION_NUMBER("--epochs", &epochs), OPTION_NUMBER("--steps", &max_steps),
                 OPTION_NUMBER("--micro-batches", &micro_batches), OPTION_TEXT("--schedule", &schedule),
                 OPTION_QUICK(&quick, &epochs));
    bool one_f_one_b = strcmp(schedule, "1f1b") == 0;
    if ((!one_f_one_b && strcmp(schedule, "gpipe") != 0) || micro_batches < 1 || micro_batches > BATCH ||
        epochs < 1) {
        fprintf(stderr, "model_parallel: --schedule is gpipe or 1f1b, --micro-batches 1 to %d, --epochs 1 or more\n",
                BATCH);
        return 2;
    }
    /* Two devices, split before any other nabla call. */
    bool gpu = nb_physical_gpu_count() > 0;
    if ((gpu ? nb_set_logical_gpu_devices(2) : nb_set_logical_cpu_devices(2)) != NB_OK) {
        fprintf(stderr, "model_parallel: %s\n", nb_error_message());
        return 1;
    }
    devs[0] = gpu ? "/gpu:0" : "/cpu:0";
    devs[1] = gpu ? "/gpu:1" : "/cpu:1";
    nb_set_error_handler(nb_error_handler_exit, NULL);

    nb_scope *outer = nb_scope_begin();
    nb_device_push(devs[0]); /* the data and the batches live on the first device */
    fashion_set data = fashion_load_set("model_parallel", dir, NB_SHAPE(784), quick ? 4000 : 0, quick ? 2000 : 0, quick);
    int64_t n = nb_tensor_dim(data.x_train, 0);
    /* whole batches only, so every step can take M micro-batches */
    const int64_t full = n / BATCH, steps = !quick && max_steps > 0 && max_steps < full ? max_steps : full;
    printf("Fashion-MNIST: %lld training and %lld test images; %d epoch(s) of %lld steps of %d\n", (long long)n,
           (long long)nb_tensor_dim(data.x_test, 0), epochs, (long long)steps, BATCH);
    printf("MLP 784-256-256-256-10: layer 1 on %s, layers 2-4 and the loss on %s\n", devs[0], devs[1]);

    model plain, piped;
    model_init(&plain, "plain");
    model_init(&piped, "piped");
    run_result a = train("(a) model-parallel, one thread:", &plain, NULL, 0, &data, epochs, steps);

    nb_pipeline *p = nb_pipeline_new(2, devs);
    nb_pipeline_set_stage(p, 0, first_half, &piped, 2 * SPLIT, piped.vars);
    nb_pipeline_set_stage(p, 1, second_half, &piped, VARS - 2 * SPLIT, piped.vars + 2 * SPLIT);
    nb_pipeline_set_schedule(p, one_f_one_b ? NB_PIPELINE_1F1B : NB_PIPELINE_GPIPE);
    char title[96];
    snprintf(title, sizeof title, "(b) pipelined, %s, %d micro-batches:", one_f_one_b ? "1F1B" : "GPipe",
             micro_batches);
    run_result b = train(title, &piped, p, micro_batches, &data, epochs, steps);
    nb_pipeline_stats stats;
    nb_pipeline_get_stats(p, &stats);

    printf("\n%-28s %10s %10s %12s\n", "", "loss", "accuracy", "steps/s");
    printf("%-28s %10.4f %9.2f%% %12.1f\n", "(a) model-parallel", a.last_loss, 100 * a.accuracy, a.steps_per_s);
    printf("%-28s %10.4f %9.2f%% %12.1f  (%.2fx)\n", "(b) pipelined", b.last_loss, 100 * b.accuracy, b.steps_per_s,
           b.steps_per_s / a.steps_per_s);
    printf("pipeline bubble (last step): measured %.2f, ideal %.2f; stage busy %.1f and %.1f ms of %.1f ms\n",
           stats.bubble, stats.ideal_bubble, 1e3 * stats.stage_busy_seconds[0], 1e3 * stats.stage_busy_seconds[1],
           1e3 * stats.wall_seconds);

    nb_pipeline_free(p);
    model_free(&plain);
    model_free(&piped);
    nb_device_pop();
    nb_scope_end(outer);

    /* One function of the same weights: the first losses agree to f32's
     * rounding; and both runs must have learnt. */
    int rc = 0;
    if (!(fabs(a.first_loss - b.first_loss) <= 1e-5 * fabs(a.first_loss))) {
        fprintf(stderr, "model_parallel: the first losses differ: %.8f plain, %.8f pipelined\n", a.first_loss,
                b.first_loss);
        rc = 1;
    }
    double floor = quick ? 0.65 : 0.75;
    rc |= accuracy_floor("model_parallel (a)", epochs, a.accuracy, floor);
    rc |= accuracy_floor("model_parallel (b)", epochs, b.accuracy, floor);
    return rc;
}
