/* Fashion-MNIST on several devices at once: the MLP of fashion_mnist
 * (784 -> 256 -> 128 -> 10, Adam, batch 128) trained through the mirrored
 * strategy. Each step splits the batch over the replicas, every replica computes
 * the gradients of its share, and the averaged gradients update every copy.
 *
 *   mirrored_mnist [--replicas N] [--devices LIST] [--data DIR] [--epochs N]
 *                  [--steps N] [--quick] [--logdir DIR]
 *
 * --replicas N (default 2) takes the first N GPUs; with fewer GPUs than N each
 * GPU is split into logical GPUs, and with none the CPU is split into N logical
 * CPU devices. --devices /gpu:0,/gpu:1 names the devices instead. --steps caps
 * the steps per epoch; --quick trains on 4000 images for one epoch. The data are
 * the four IDX files of Fashion-MNIST (apt-get install dataset-fashion-mnist).
 * --logdir writes TensorBoard summaries there: each epoch's loss and test
 * accuracy and histograms of the weights.
 *
 * Under mpirun (mpirun -np 2 mirrored_mnist --replicas 2: four replicas in two
 * processes) the strategy spans the processes: each takes its share of every
 * global batch, the gradients are summed across all replicas of all
 * processes, and only rank 0 prints and writes summaries. */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command_line.h"
#include "fashion_data.h"
#include "fashion_mlp.h"
#include "progress.h"
#include "training.h"

#define BATCH 128 /* the global batch, as in fashion_mnist */
#define MAX_REPLICAS 64

/* One replica's share of a step: inputs are its rows of the images and labels. */
static nb_status train_step(nb_replica *r, int n_inputs, nb_tensor *const *in, int n_vars,
                            nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads,
                            void *user)
{
    (void)r, (void)n_inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(mlp_forward(in[0], vars), in[1]));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

/* Counts the replica's test rows whose largest logit is at the label (f32 0-d). */
static nb_status replica_correct(nb_replica *r, int n_inputs, nb_tensor *const *in, int n_outputs,
                               nb_tensor **out, void *params)
{
    (void)r, (void)n_inputs, (void)n_outputs;
    out[0] = count_correct(mlp_forward(in[0], params), in[1]);
    return out[0] ? NB_OK : nb_error();
}

static double evaluate(nb_mirrored *s, nb_tensor *x, nb_tensor *y, nb_variable **params)
{
    nb_scope *sc = nb_scope_begin();
    nb_tensor *per_replica[MAX_REPLICAS];
    nb_mirrored_run(s, replica_correct, params, NB_TENSORS(x, y), 1, per_replica);
    double right = nb_tensor_item(nb_mirrored_reduce(s, NB_REDUCE_SUM, per_replica));
    nb_scope_end(sc);
    return right / (double)nb_tensor_dim(x, 0);
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

int main(int argc, char **argv)
{
    const char *dir = FASHION_DIR;
    int replicas = 2, epochs = 5, max_steps = 0, n_names = 0;
    char *names[MAX_REPLICAS], *list = NULL;
    const char *logdir = NULL, *devices = NULL;
    bool quick = false; /* a short run; missing data then skips (exit 77) */
    OPTIONS_READ(argc, argv,
                 "usage: %s [--replicas N] [--devices /gpu:0,/gpu:1] [--data DIR] [--epochs N]\n"
                 "          [--steps N] [--quick] [--logdir DIR]\n",
                 OPTION_TEXT("--data", &dir), OPTION_NUMBER("--replicas", &replicas),
                 OPTION_TEXT("--devices", &devices), OPTION_NUMBER("--epochs", &epochs),
                 OPTION_NUMBER("--steps", &max_steps), OPTION_QUICK(&quick, &epochs),
                 OPTION_TEXT("--logdir", &logdir));
    list = (char *)devices; /* a string of argv, which strtok may cut */
    if (replicas < 1 || replicas > MAX_REPLICAS) {
        fprintf(stderr, "mirrored_mnist: --replicas wants 1 to %d\n", MAX_REPLICAS);
        return 2;
    }

    /* The devices are split before any other nabla call. */
    nb_status st = NB_OK;
    if (list) { /* named devices: /cpu:K asks for K + 1 logical CPU devices */
        int cpus = 0;
        for (char *name = strtok(list, ","); name && n_names < MAX_REPLICAS;
             name = strtok(NULL, ",")) {
            names[n_names++] = name;
            const char *c = strstr(name, "cpu:");
            if (c && atoi(c + 4) + 1 > cpus)
                cpus = atoi(c + 4) + 1;
        }
        replicas = n_names;
        if (cpus > 1)
            st = nb_set_logical_cpu_devices(cpus);
    } else {
        int gpus = nb_physical_gpu_count();
        if (gpus == 0)
            st = nb_set_logical_cpu_devices(replicas);
        else if (gpus < replicas)
            st = nb_set_logical_gpu_devices((replicas + gpus - 1) / gpus);
    }
    if (st != NB_OK) {
        fprintf(stderr, "mirrored_mnist: %s\n", nb_error_message());
        return 1;
    }
    nb_set_error_handler(nb_error_handler_exit, NULL);
    /* Without names: the first N GPUs (logical ones when split), else CPU
     * devices; across every process mpirun started, when it started several. */
    nb_mirrored *s = nb_mirrored_new_world(replicas, list ? (const char *const *)names : NULL);
    const int rank = nb_mirrored_world_rank(s), processes = nb_mirrored_world_size(s);
    if (rank != 0) /* rank 0 alone speaks */
        freopen("/dev/null", "w", stdout);
    nb_summary_writer *summary = logdir && rank == 0 ? nb_summary_writer_open(logdir) : NULL;

    nb_scope *outer = nb_scope_begin();
    nb_device_push(nb_mirrored_device(s, 0)); /* data, batches and losses live on replica 0 */
    double t0 = progress_now();
    /* images as f32 [n, 784] in [0, 1], labels as i64 [n] */
    fashion_set data = fashion_load_set("mirrored_mnist", dir, NB_SHAPE(784), quick ? 4000 : 0, quick ? 2000 : 0, quick);
    int64_t n = nb_tensor_dim(data.x_train, 0);
    printf("Fashion-MNIST: %lld training and %lld test images (loaded in %.1f s)\n", (long long)n,
           (long long)nb_tensor_dim(data.x_test, 0), progress_now() - t0);
    printf("%d replica%s:", replicas, replicas > 1 ? "s" : "");
    for (int r = 0; r < replicas; r++)
        printf(" %s", nb_mirrored_device(s, r));
    if (processes > 1)
        printf(" in each of %d processes: %d in all", processes, nb_mirrored_world_replicas(s));
    printf(" (global batch %d)\n", BATCH);

    /* He-initialised weights, zero biases, as in fashion_mnist; one copy per replica. */
    nb_variable *params[MLP_PARAMS];
    mlp_init(params, s);
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    /* Running sum of loss * rows, kept on the device so that the loop never waits. */
    nb_variable *loss_sum = nb_variable_new("loss_sum", nb_zeros(NB_F64, NB_SCALAR));
    nb_variable_set_trainable(loss_sum, false);

    int64_t *order = malloc(sizeof *order * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    const int64_t steps = steps_per_epoch(n, BATCH, max_steps);
    double test_acc = 0, first_loss = -1, last_loss = 0;
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double start_time = progress_now();
        nb_scope *es = nb_scope_begin();
        for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        nb_tensor *perm = nb_from_buffer(NB_I64, NB_SHAPE(n), order);
        nb_variable_assign(loss_sum, nb_zeros(NB_F64, NB_SCALAR));
        int64_t seen = 0;
        progress bar;
        progress_begin(&bar, epoch, steps);
        for (int64_t step = 0; step < steps; step++) {
            nb_scope *sc = nb_scope_begin();
            int64_t start = step * BATCH, len = n - start < BATCH ? n - start : BATCH;
            /* this process's share of the global batch (all of it in one process) */
            int64_t lo = len * rank / processes, hi = len * (rank + 1) / processes;
            nb_tensor *idx = nb_slice(perm, NB_SHAPE(start + lo), NB_SHAPE(hi - lo));
            nb_tensor *batch[2] = {nb_gather(data.x_train, idx), nb_gather(data.y_train, idx)};
            nb_tensor *loss;
            /* MEAN weights each replica by its rows: the update of one device on the
             * batch; the loss is the global batch's */
            nb_mirrored_step(s, opt, MLP_PARAMS, params, train_step, NULL, 2, batch, NB_REDUCE_MEAN, &loss);
            nb_variable_assign_add(loss_sum, nb_mul_scalar(loss, (double)len));
            seen += len;
            if (first_loss < 0)
                first_loss = nb_tensor_item(loss);
            if (progress_due(&bar, step + 1)) /* reading the sum waits for the device */
                progress_show(&bar, step + 1, nb_tensor_item(nb_read(loss_sum)) / (double)seen, seen);
            nb_scope_end(sc);
        }
        progress_end(&bar);
        last_loss = nb_tensor_item(nb_read(loss_sum)) / (double)seen;
        double seconds = progress_now() - start_time;
        test_acc = evaluate(s, data.x_test, data.y_test, params);
        printf("epoch %d: loss %.4f, test accuracy %.2f%%, %.0f images/s\n", epoch, last_loss,
               100.0 * test_acc, (double)seen / seconds);
        fflush(stdout);
        epoch_summaries(summary, epoch, last_loss, -1, test_acc);
        mlp_summaries(summary, epoch, params);
        nb_scope_end(es);
    }
    printf("test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_summary_writer_close(summary);

    free(order);
    nb_variable_free(loss_sum);
    mlp_free(params);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    nb_mirrored_free(s);
    /* The full run reaches 87% in 5 epochs on any number of replicas; the quick
     * one must at least bring the loss down. */
    if (quick ? !(last_loss < first_loss) : epochs >= 5 && max_steps == 0 && test_acc < 0.87) {
        fprintf(stderr, "mirrored_mnist: %s\n",
                quick ? "the loss did not go down" : "test accuracy below 87%");
        return 1;
    }
    return 0;
}
