/* One training step of a 784-256-10 MLP at batch 64: forward, sparse softmax
 * cross-entropy, backward, SGD update. On /cpu:0, and on /gpu:0 when there is one,
 * beside the same step in PyTorch eager from Python (bench/mlp_step.py).
 *
 *   mlp_step [--reps R] [--no-peer]
 *
 * Each figure is the median over R steps after a warm-up; a GPU step ends with
 * nb_synchronize() (torch.cuda.synchronize() on the PyTorch side). */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define WARM 20

static double bench_device(const char *device, int reps)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    int64_t labels[64];
    for (int i = 0; i < 64; i++)
        labels[i] = (i * 7 + 3) % 10;
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(64, 784), 0, 1, 1);
    nb_tensor *y = nb_from_buffer(NB_I64, NB_SHAPE(64), labels);
    nb_variable *p[4] = {
        nb_variable_new("w1", nb_random_normal(NB_F32, NB_SHAPE(784, 256), 0, sqrt(2.0 / 784), 2)),
        nb_variable_new("b1", nb_zeros(NB_F32, NB_SHAPE(256))),
        nb_variable_new("w2", nb_random_normal(NB_F32, NB_SHAPE(256, 10), 0, sqrt(1.0 / 256), 3)),
        nb_variable_new("b2", nb_zeros(NB_F32, NB_SHAPE(10))),
    };
    nb_optimizer *opt = nb_sgd_new(0.01);
    double *v = malloc(sizeof *v * (size_t)reps);
    for (int i = 0; i < WARM + reps; i++) {
        double t0 = bench_now();
        nb_scope *s = nb_scope_begin();
        nb_tape *tape = nb_tape_begin();
        nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
        nb_tensor *logits = nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3]));
        nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, y));
        nb_tensor *g[4];
        nb_tape_gradient_vars(tape, loss, 4, p, g);
        nb_optimizer_apply(opt, 4, p, g);
        nb_scope_end(s);
        nb_synchronize();
        if (i >= WARM)
            v[i - WARM] = (bench_now() - t0) * 1e6;
    }
    double m = bench_median(v, reps);
    free(v);
    nb_optimizer_free(opt);
    for (int i = 0; i < 4; i++)
        nb_variable_free(p[i]);
    nb_device_pop();
    nb_scope_end(outer);
    return m;
}

int main(int argc, char **argv)
{
    int reps = 200;
    bool peer = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-peer"))
            peer = false;
        else {
            fprintf(stderr, "usage: %s [--reps R] [--no-peer]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    nb_set_error_handler(nb_error_handler_exit, NULL);

    double cpu = bench_device("/cpu:0", reps);
    bool gpu = nb_device_count(NB_DEVICE_GPU) > 0;
    double gpu_us = gpu ? bench_device("/gpu:0", reps) : 0;

    bench_peer p = {0};
    if (peer) {
        char args[32];
        snprintf(args, sizeof args, "%d", reps);
        bench_run_peer(&p, "mlp_step.py", args);
    } else {
        snprintf(p.status, sizeof p.status, "PyTorch: not run (--no-peer)");
    }
    bench_header("MLP 784-256-10 training step, batch 64 (median, warm-up first)",
                 "microseconds per step", &p);
    bench_row("/cpu:0 (torch: cpu)", cpu, bench_peer_get(&p, "cpu"));
    if (gpu)
        bench_row("/gpu:0 (torch: cuda)", gpu_us, bench_peer_get(&p, "cuda"));
    else
        return bench_no_gpu("/gpu:0", nb_gpu_unavailable_reason());
    return 0;
}
