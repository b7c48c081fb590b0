/* Synchronous against asynchronous data parallelism on Fashion-MNIST: the
 * MLP of fashion_mnist (784 -> 256 -> 128 -> 10, Adam) trained twice on the
 * same devices for the same number of examples,
 *   - synchronously, by the mirrored strategy: every step splits a global
 *     batch of N x B rows over the N replicas and applies their mean gradient;
 *   - asynchronously, by N workers (nabla/async.h): each takes batches of B
 *     rows in turn, reads the current weights, and applies its gradient
 *     without waiting for the others (optionally within a staleness bound),
 * printing each run's loss curve, test accuracy and examples per second, and
 * the asynchronous run's mean and largest staleness.
 *
 *   async_vs_sync [--workers N] [--batch B] [--bound S] [--epochs N] [--data DIR] [--quick]
 *
 * --workers N (default 4): N GPUs where there are that many (else each GPU
 * split into logical GPUs), else N logical CPU devices. --bound S (default -1,
 * none) is the asynchronous run's staleness bound; 0 makes it synchronous too.
 * --quick trains on 4000 images for one epoch. */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command_line.h"
#include "fashion_data.h"
#include "fashion_mlp.h"
#include "progress.h"
#include "training.h"

#define CURVE_POINTS 8

static nb_status train_step(nb_replica *r, int n_inputs, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                            nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(mlp_forward(in[0], vars), in[1]));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

/* The losses of a run, one per update, with the rows each learned from. */
typedef struct curve {
    int64_t n, cap;
    double *loss;
    int64_t *rows;
} curve;

static void curve_add(curve *c, double loss, int64_t rows)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->loss = realloc(c->loss, sizeof *c->loss * (size_t)c->cap);
        c->rows = realloc(c->rows, sizeof *c->rows * (size_t)c->cap);
        if (!c->loss || !c->rows) {
            fprintf(stderr, "async_vs_sync: out of memory\n");
            exit(1);
        }
    }
    c->loss[c->n] = loss;
    c->rows[c->n++] = rows;
}

/* Prints the mean loss over each of CURVE_POINTS equal spans of examples. */
static void curve_print(const char *name, const curve *c)
{
    int64_t total = 0;
    for (int64_t i = 0; i < c->n; i++)
        total += c->rows[i];
    printf("  %-13s", name);
    int64_t i = 0, seen = 0;
    for (int p = 1; p <= CURVE_POINTS; p++) {
        double sum = 0;
        int64_t rows = 0;
        for (; i < c->n && seen < total * p / CURVE_POINTS; i++) {
            sum += c->loss[i] * (double)c->rows[i];
            rows += c->rows[i];
            seen += c->rows[i];
        }
        printf(" %7.4f", rows ? sum / (double)rows : 0.0);
    }
    printf("\n");
}

static void observe(const nb_async_update *u, void *user) { curve_add(user, u->loss, u->rows); }

static double test_accuracy(nb_variable **params, fashion_set *data)
{
    classifier c = {.forward = mlp_logits, .model = params, .n_vars = MLP_PARAMS, .vars = params};
    return accuracy_in_chunks(&c, data->x_test, data->y_test, 2000);
}

int main(int argc, char **argv)
{
    const char *dir = FASHION_DIR;
    int workers = 4, batch = 32, bound = -1, epochs = 2;
    bool quick = false;
    OPTIONS_READ(argc, argv, "usage: %s [--workers N] [--batch B] [--bound S] [--epochs N] [--data DIR] [--quick]\n",
                 OPTION_NUMBER("--workers", &workers), OPTION_NUMBER("--batch", &batch),
                 OPTION_NUMBER("--bound", &bound), OPTION_NUMBER("--epochs", &epochs), OPTION_TEXT("--data", &dir),
                 OPTION_QUICK(&quick, &epochs));
    if (workers < 1 || workers > 64 || batch < 1 || bound < -1) {
        fprintf(stderr, "async_vs_sync: --workers wants 1 to 64, --batch at least 1, --bound -1 or more\n");
        return 2;
    }
    int gpus = nb_physical_gpu_count();
    nb_status st = gpus == 0 ? nb_set_logical_cpu_devices(workers)
                   : gpus < workers ? nb_set_logical_gpu_devices((workers + gpus - 1) / gpus)
                                    : NB_OK;
    if (st != NB_OK) {
        fprintf(stderr, "async_vs_sync: %s\n", nb_error_message());
        return 1;
    }
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_mirrored *s = nb_mirrored_new(workers, NULL);
    nb_async *a = nb_async_new(workers, NULL, NULL);
    nb_async_set_staleness_bound(a, bound);

    nb_scope *outer = nb_scope_begin();
    nb_device_push(nb_mirrored_device(s, 0)); /* the data, and the asynchronous masters, live here */
    fashion_set data = fashion_load_set("async_vs_sync", dir, NB_SHAPE(784), quick ? 4000 : 0, quick ? 2000 : 0, quick);
    int64_t n = nb_tensor_dim(data.x_train, 0);
    printf("Fashion-MNIST: %lld training images, %d epoch%s; %d workers:", (long long)n, epochs, epochs > 1 ? "s" : "",
           workers);
    for (int w = 0; w < workers; w++)
        printf(" %s", nb_async_device(a, w));
    printf("\n");

    nb_variable *sync_p[MLP_PARAMS], *async_p[MLP_PARAMS];
    mlp_init(sync_p, s);
    for (int i = 0; i < MLP_PARAMS; i++) {
        char name[32];
        nb_tensor *t = mlp_initial(i, name);
        strcat(name, "'");
        async_p[i] = nb_async_variable_new(a, name, t);
    }
    nb_optimizer *sync_opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7), *async_opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);

    /* synchronous: global batches of workers x batch rows, in order */
    curve sync_curve = {0}, async_curve = {0};
    const int64_t global = (int64_t)workers * batch;
    double t0 = progress_now();
    for (int epoch = 0; epoch < epochs; epoch++)
        for (int64_t start = 0; start < n; start += global) {
            nb_scope *sc = nb_scope_begin();
            int64_t len = n - start < global ? n - start : global;
            nb_tensor *in[2] = {nb_slice(data.x_train, NB_SHAPE(start, 0), NB_SHAPE(len, -1)),
                                nb_slice(data.y_train, NB_SHAPE(start), NB_SHAPE(len))};
            nb_tensor *loss;
            nb_mirrored_step(s, sync_opt, MLP_PARAMS, sync_p, train_step, NULL, 2, in, NB_REDUCE_MEAN, &loss);
            curve_add(&sync_curve, nb_tensor_item(loss), len);
            nb_scope_end(sc);
        }
    double sync_seconds = progress_now() - t0;

    /* asynchronous: the same rows, batches of `batch` handed out in turn */
    nb_async_set_observer(a, observe, &async_curve);
    t0 = progress_now();
    for (int epoch = 0; epoch < epochs; epoch++)
        nb_async_train(a, async_opt, MLP_PARAMS, async_p, train_step, NULL, NB_TENSORS(data.x_train, data.y_train),
                       batch);
    double async_seconds = progress_now() - t0;
    nb_async_stats stats;
    nb_async_get_stats(a, &stats);

    double sync_acc = test_accuracy(sync_p, &data), async_acc = test_accuracy(async_p, &data);
    double examples = (double)n * epochs;
    printf("loss over %d spans of the %.0f examples:\n", CURVE_POINTS, examples);
    curve_print("synchronous", &sync_curve);
    curve_print("asynchronous", &async_curve);
    printf("synchronous:  %6lld updates of %lld rows, test accuracy %.2f%%, %.0f examples/s\n",
           (long long)sync_curve.n, (long long)global, 100 * sync_acc, examples / sync_seconds);
    printf("asynchronous: %6lld updates of %d rows, test accuracy %.2f%%, %.0f examples/s (%.2fx), staleness mean "
           "%.2f, largest %lld, bound %d%s\n",
           (long long)stats.updates, batch, 100 * async_acc, examples / async_seconds,
           sync_seconds / async_seconds, stats.mean_staleness, (long long)stats.max_staleness, bound,
           bound < 0 ? " (none)" : "");

    free(sync_curve.loss), free(sync_curve.rows), free(async_curve.loss), free(async_curve.rows);
    mlp_free(sync_p);
    mlp_free(async_p);
    nb_optimizer_free(sync_opt);
    nb_optimizer_free(async_opt);
    nb_device_pop();
    nb_scope_end(outer);
    nb_async_free(a);
    nb_mirrored_free(s);
    /* both must learn: the full run reaches 80% in two epochs either way; the
     * quick one (125 asynchronous updates, whose staleness depends on the
     * threads' timing: more under a sanitizer) only well above chance */
    double floor = quick ? 0.4 : 0.8;
    if (sync_acc < floor || async_acc < floor) {
        fprintf(stderr, "async_vs_sync: test accuracy below %.0f%%\n", 100 * floor);
        return 1;
    }
    return 0;
}
