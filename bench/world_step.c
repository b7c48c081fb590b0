/* One process of the multi-process benchmark (bench/world.sh starts it under
 * mpirun with 1, 2 and 4 processes): the training step of bench/mlp_step.c's
 * MLP (784-256-10, SGD 0.01) through nb_mirrored_new_world with one CPU
 * replica per process, each process taking its share of a fixed global batch;
 * then the all-reduce of a 25 MiB f32 gradient inside a step beside
 * MPI_Allreduce called directly on a buffer of the same size. Rank 0 prints
 * one line:
 *
 *   world P images_per_s STEP_US allreduce_us NABLA_US mpi_us MPI_US world_us WORLD_US
 *
 * (WORLD_US: the sum across processes alone, by the strategy's clock)
 *
 *   world_step [--reps R] [--batch B] */
#include "bench_util.h"

#include <math.h>
#include <mpi.h>
#include <nabla/nabla.h>

#define WARM 10

static nb_status step_fn(nb_replica *r, int n_in, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                         nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_in, (void)user;
    nb_tape *t = nb_tape_begin();
    nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], nb_read(vars[0])), nb_read(vars[1])));
    nb_tensor *logits = nb_add(nb_matmul(h, nb_read(vars[2])), nb_read(vars[3]));
    *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, in[1]));
    return nb_tape_gradient_vars(t, *loss, n_vars, vars, grads);
}

/* loss = sum(w x) / n: one pass for the loss, one for the gradient */
static nb_status big_fn(nb_replica *r, int n_in, nb_tensor *const *in, int n_vars, nb_variable *const *vars,
                        nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_in, (void)user;
    nb_tape *t = nb_tape_begin();
    *loss = nb_mul_scalar(nb_sum_all(nb_mul(nb_read(vars[0]), in[0])), 1.0 / (double)nb_tensor_numel(in[0]));
    return nb_tape_gradient_vars(t, *loss, n_vars, vars, grads);
}

int main(int argc, char **argv)
{
    int reps = 100;
    int64_t batch = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
    }
    if (reps < 1)
        reps = 1;
    nb_set_error_handler(nb_error_handler_exit, NULL);
    const char *cpu[1] = {"/cpu:0"};
    nb_mirrored *s = nb_mirrored_new_world(1, cpu);
    int rank = nb_mirrored_world_rank(s), size = nb_mirrored_world_size(s);

    /* the model, and this process's share of the global batch */
    int64_t lo = batch * rank / size, hi = batch * (rank + 1) / size;
    int64_t *labels = malloc(sizeof *labels * (size_t)(hi - lo > 0 ? hi - lo : 1));
    for (int64_t i = lo; i < hi; i++)
        labels[i - lo] = (i * 7 + 3) % 10;
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(hi - lo, 784), 0, 1, 1 + (uint64_t)rank);
    nb_tensor *y = nb_from_buffer(NB_I64, NB_SHAPE(hi - lo), labels);
    free(labels);
    nb_variable *p[4];
    nb_scope *sc = nb_scope_begin();
    p[0] = nb_mirrored_variable_new(s, "w1", nb_random_normal(NB_F32, NB_SHAPE(784, 256), 0, sqrt(2.0 / 784), 2));
    p[1] = nb_mirrored_variable_new(s, "b1", nb_zeros(NB_F32, NB_SHAPE(256)));
    p[2] = nb_mirrored_variable_new(s, "w2", nb_random_normal(NB_F32, NB_SHAPE(256, 10), 0, sqrt(1.0 / 256), 3));
    p[3] = nb_mirrored_variable_new(s, "b2", nb_zeros(NB_F32, NB_SHAPE(10)));
    nb_scope_end(sc);
    nb_optimizer *opt = nb_sgd_new(0.01);

    double *t = malloc(sizeof *t * (size_t)reps);
    for (int i = 0; i < WARM + reps; i++) {
        nb_scope *ss = nb_scope_begin();
        double t0 = bench_now();
        nb_mirrored_step(s, opt, NB_VARS(p[0], p[1], p[2], p[3]), step_fn, NULL, NB_TENSORS(x, y), NB_REDUCE_MEAN,
                         NULL);
        if (i >= WARM)
            t[i - WARM] = bench_now() - t0;
        nb_scope_end(ss);
    }
    double step_s = bench_median(t, reps);

    /* The all-reduce inside a step: a model of one 25 MiB variable whose
     * step is otherwise a few passes over it (loss sum(w x) / n). Its cost is
     * the strategy's step less the same step on one device without a strategy
     * (packing, the sum across processes, the copies), beside MPI_Allreduce
     * called directly on a buffer of the same size. */
    const int64_t n = (int64_t)25 << 18; /* f32 elements */
    int ar_reps = reps < 20 ? reps : 20;
    nb_tensor *xb = nb_random_uniform(NB_F32, NB_SHAPE(n), -1, 1, 9);
    nb_variable *wb;
    nb_variable *wp = nb_variable_new("plain", nb_zeros(NB_F32, NB_SHAPE(n)));
    sc = nb_scope_begin();
    wb = nb_mirrored_variable_new(s, "big", nb_zeros(NB_F32, NB_SHAPE(n)));
    nb_scope_end(sc);
    nb_mirrored_stats before = {0}, after = {0};
    for (int i = 0; i < 3 + ar_reps; i++) {
        nb_scope *ss = nb_scope_begin();
        if (i == 3)
            nb_mirrored_get_stats(s, &before);
        double t0 = bench_now();
        nb_mirrored_step(s, opt, NB_VARS(wb), big_fn, NULL, NB_TENSORS(xb), NB_REDUCE_SUM, NULL);
        if (i >= 3)
            t[i - 3] = bench_now() - t0;
        nb_scope_end(ss);
    }
    double strategy_s = bench_median(t, ar_reps);
    /* the sum across processes alone (the strategy's own clock), per step */
    nb_mirrored_get_stats(s, &after);
    double world_s = after.world_sums > before.world_sums ? (after.world_seconds - before.world_seconds) / ar_reps : 0;
    for (int i = 0; i < 3 + ar_reps; i++) {
        nb_scope *ss = nb_scope_begin();
        double t0 = bench_now();
        nb_tape *tape = nb_tape_begin();
        nb_tensor *loss = nb_mul_scalar(nb_sum_all(nb_mul(nb_read(wp), xb)), 1.0 / (double)n), *g[1];
        nb_tape_gradient_vars(tape, loss, NB_VARS(wp), g);
        nb_optimizer_apply(opt, NB_VARS(wp), g);
        if (i >= 3)
            t[i - 3] = bench_now() - t0;
        nb_scope_end(ss);
    }
    double plain_s = bench_median(t, ar_reps);
    double nb_s = strategy_s - plain_s;
    float *raw = malloc(sizeof *raw * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        raw[i] = 1.0f;
    for (int i = 0; i < 3 + ar_reps; i++) {
        double t0 = bench_now();
        MPI_Allreduce(MPI_IN_PLACE, raw, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (i >= 3)
            t[i - 3] = bench_now() - t0;
    }
    double mpi_s = bench_median(t, ar_reps);
    if (rank == 0)
        printf("world %d images_per_s %.0f step_us %.1f allreduce_us %.0f mpi_us %.0f world_us %.0f\n", size,
               (double)batch / step_s, step_s * 1e6, nb_s * 1e6, mpi_s * 1e6, world_s * 1e6);
    free(raw);
    free(t);
    nb_release(xb);
    nb_variable_free(wb);
    nb_variable_free(wp);
    nb_release(x);
    nb_release(y);
    for (int i = 0; i < 4; i++)
        nb_variable_free(p[i]);
    nb_optimizer_free(opt);
    nb_mirrored_free(s);
    return 0;
}
