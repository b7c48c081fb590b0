/* Asynchronous against synchronous data parallelism: an epoch of bench/
 * mlp_step.c's MLP (784-256-10, sparse softmax cross-entropy, SGD 0.01) over
 * a fixed random set of rows, with 2 and 4 workers, trained
 *   - synchronously by the mirrored strategy (global batches of W x B rows),
 *   - asynchronously by nabla/async.h's workers (batches of B rows, no bound),
 *   - stale-synchronously (bound 1),
 * printing examples per second, the asynchronous runs' ratio to the
 * synchronous one, and their mean and largest staleness. PyTorch has no
 * asynchronous trainer of its own to set beside it (its parameter-server
 * examples are RPC programs), so this benchmark has no peer column.
 *
 *   async_step [--reps R] [--batch B] [--rows N]
 *
 * The workers are GPUs where there are any (each split into logical GPUs to
 * make 4), else logical CPU devices. Each figure is the median of R epochs
 * (default 3) after one warm-up epoch; the configurations take turns. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

typedef struct run {
    int workers;
    int64_t bound; /* -2: synchronous through the strategy */
    nb_mirrored *s;
    nb_async *a;
    nb_variable *p[4];
    nb_optimizer *opt;
    nb_tensor *x, *y;
    int64_t batch;
} run;

static nb_status step_fn(nb_replica *r, int n_inputs, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                         nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], nb_read(vars[0])), nb_read(vars[1])));
    nb_tensor *logits = nb_add(nb_matmul(h, nb_read(vars[2])), nb_read(vars[3]));
    *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, in[1]));
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

static void run_init(run *r)
{
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    nb_scope *sc = nb_scope_begin();
    nb_tensor *init[4] = {nb_random_normal(NB_F32, NB_SHAPE(784, 256), 0, sqrt(2.0 / 784), 2),
                          nb_zeros(NB_F32, NB_SHAPE(256)),
                          nb_random_normal(NB_F32, NB_SHAPE(256, 10), 0, sqrt(1.0 / 256), 3),
                          nb_zeros(NB_F32, NB_SHAPE(10))};
    if (r->bound == -2)
        r->s = nb_mirrored_new(r->workers, NULL);
    else {
        r->a = nb_async_new(r->workers, NULL, NULL);
        nb_async_set_staleness_bound(r->a, r->bound);
    }
    for (int i = 0; i < 4; i++)
        r->p[i] = r->s ? nb_mirrored_variable_new(r->s, names[i], init[i]) : nb_async_variable_new(r->a, names[i], init[i]);
    nb_scope_end(sc);
    r->opt = nb_sgd_new(0.01);
}

/* One epoch over the rows. */
static void epoch(void *ctx)
{
    run *r = ctx;
    if (r->a) {
        nb_async_train(r->a, r->opt, 4, r->p, step_fn, NULL, NB_TENSORS(r->x, r->y), r->batch);
        return;
    }
    int64_t n = nb_tensor_dim(r->x, 0), global = r->batch * r->workers;
    for (int64_t start = 0; start < n; start += global) {
        nb_scope *sc = nb_scope_begin();
        int64_t len = n - start < global ? n - start : global;
        nb_tensor *in[2] = {nb_slice(r->x, NB_SHAPE(start, 0), NB_SHAPE(len, -1)),
                            nb_slice(r->y, NB_SHAPE(start), NB_SHAPE(len))};
        nb_mirrored_step(r->s, r->opt, 4, r->p, step_fn, NULL, 2, in, NB_REDUCE_MEAN, NULL);
        nb_scope_end(sc);
    }
}

static void run_free(run *r)
{
    for (int i = 0; i < 4; i++)
        nb_variable_free(r->p[i]);
    nb_optimizer_free(r->opt);
    nb_mirrored_free(r->s);
    nb_async_free(r->a);
}

int main(int argc, char **argv)
{
    int reps = 3, batch = 32, rows = 16384;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NUMBER("--batch", "B", &batch, 1),
                  BENCH_NUMBER("--rows", "N", &rows, 64));
    int gpus = nb_physical_gpu_count();
    if (gpus == 0 && bench_gpu_required())
        return bench_no_gpu("Asynchronous training over GPUs", nb_gpu_unavailable_reason());
    nb_status st = gpus == 0 ? nb_set_logical_cpu_devices(4)
                   : gpus < 4 ? nb_set_logical_gpu_devices((4 + gpus - 1) / gpus)
                              : NB_OK;
    if (st) {
        fprintf(stderr, "async_step: %s\n", nb_error_message());
        return 1;
    }
    nb_set_error_handler(nb_error_handler_exit, NULL);
    const char *kind = gpus ? "GPU" : "CPU";
    printf("Asynchronous vs synchronous training: MLP 784-256-10, SGD, %d rows per epoch, batch %d per worker, "
           "%s devices (%s%s)\n",
           rows, batch, kind, gpus ? "logical GPUs of " : "logical CPU devices on ", gpus ? "the GPUs" : "the cores");
    int64_t *labels = malloc(sizeof *labels * (size_t)rows);
    for (int i = 0; i < rows; i++)
        labels[i] = (i * 7 + 3) % 10;
    nb_device_push(nb_device_name(gpus ? NB_DEVICE_GPU : NB_DEVICE_CPU, 0));
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(rows, 784), 0, 1, 1);
    nb_tensor *y = nb_from_buffer(NB_I64, NB_SHAPE(rows), labels);
    free(labels);

    for (int workers = 2; workers <= 4; workers += 2) {
        run runs[3] = {{.workers = workers, .bound = -2}, {.workers = workers, .bound = -1}, {.workers = workers, .bound = 1}};
        const char *names[3] = {"synchronous (mirrored)", "asynchronous", "stale-synchronous, bound 1"};
        double ms[3][64];
        for (int k = 0; k < 3; k++) {
            runs[k].x = x, runs[k].y = y, runs[k].batch = batch;
            run_init(&runs[k]);
            epoch(&runs[k]); /* warm-up */
        }
        int r_max = reps < 64 ? reps : 64;
        for (int rep = 0; rep < r_max; rep++)
            for (int k = 0; k < 3; k++)
                ms[k][rep] = bench_median_ms(epoch, &runs[k], 0, 1);
        double sync_rate = 0;
        for (int k = 0; k < 3; k++) {
            double rate = rows / (bench_median(ms[k], r_max) * 1e-3);
            if (k == 0)
                sync_rate = rate;
            printf("  %d workers, %-28s %9.0f examples/s", workers, names[k], rate);
            if (k > 0) {
                nb_async_stats s;
                nb_async_get_stats(runs[k].a, &s);
                printf("  %.2fx synchronous, staleness mean %.2f, largest %lld", rate / sync_rate, s.mean_staleness,
                       (long long)s.max_staleness);
            }
            printf("\n");
            run_free(&runs[k]);
        }
    }
    nb_release(x);
    nb_release(y);
    nb_device_pop();
    return 0;
}
