/* The cost of a tiny op on /gpu:0: a one-element add with no tape, the same add
 * recorded by a tape, and forward + backward of (x*x + x).sum() for a 16-element
 * x, beside the same work in PyTorch from Python (bench/gpu_overhead.py).
 *
 *   gpu_overhead [--ops K] [--reps R] [--no-peer]
 *
 * Each figure is the median over R batches of K ops (after a warm-up), per op,
 * timed by the host clock; a batch ends with one nb_synchronize()
 * (torch.cuda.synchronize() on the PyTorch side), so the figure is the launch
 * cost of an op, or its device time if that is longer, not one round trip each.
 * Prints "no GPU: skipped" and exits 0 where there is no GPU. */
#include "bench_util.h"
#include <nabla/nabla.h>

#define TITLE "Small-op overhead on /gpu:0"

static int K = 1000, R = 200;
static nb_tensor *xa, *xb, *x16;

static void add_plain(void)
{
    nb_scope *s = nb_scope_begin();
    for (int i = 0; i < K; i++)
        nb_add(xa, xb);
    nb_scope_end(s);
    nb_synchronize();
}

static void add_taped(void)
{
    nb_scope *s = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, xa);
    for (int i = 0; i < K; i++)
        nb_add(xa, xb);
    nb_scope_end(s); /* frees the tape and its record */
    nb_synchronize();
}

static void fwd_bwd(void)
{
    for (int i = 0; i < K / 10; i++) {
        nb_scope *s = nb_scope_begin();
        nb_tape *tape = nb_tape_begin();
        nb_tape_watch(tape, x16);
        nb_tensor *z = nb_sum_all(nb_add(nb_mul(x16, x16), x16));
        nb_tensor *g;
        nb_tape_gradient(tape, z, 1, &x16, &g);
        nb_scope_end(s);
    }
    nb_synchronize();
}

/* Median microseconds per op of fn, which does `per` ops. */
static double median_us(void (*fn)(void), int per)
{
    for (int i = 0; i < (R / 10 > 3 ? R / 10 : 3); i++)
        fn();
    double *v = malloc(sizeof *v * (size_t)R);
    for (int i = 0; i < R; i++) {
        double t0 = bench_now();
        fn();
        v[i] = (bench_now() - t0) / per * 1e6;
    }
    double m = bench_median(v, R);
    free(v);
    return m;
}

int main(int argc, char **argv)
{
    bool peer = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ops") && i + 1 < argc)
            K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-peer"))
            peer = false;
        else {
            fprintf(stderr, "usage: %s [--ops K] [--reps R] [--no-peer]\n", argv[0]);
            return 2;
        }
    }
    if (K < 10)
        K = 10;
    if (R < 1)
        R = 1;
    nb_set_error_handler(nb_error_handler_exit, NULL);
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        printf("\n%s\n(no GPU: skipped%s)\n", TITLE, nb_cuda_built() ? "" : "; this build has no CUDA");
        return 0;
    }
    nb_set_soft_placement(false); /* never time the CPU by mistake */
    nb_device_push("/gpu:0");
    nb_gpu_properties props;
    nb_gpu_device_properties("/gpu:0", &props);

    xa = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 1);
    xb = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 2);
    x16 = nb_random_normal(NB_F32, NB_SHAPE(16), 0, 1, 3);
    double plain = median_us(add_plain, K);
    double taped = median_us(add_taped, K);
    double fb = median_us(fwd_bwd, K / 10);

    bench_peer p = {0};
    if (peer) {
        char args[64];
        snprintf(args, sizeof args, "%d %d", K, R);
        bench_run_peer(&p, "gpu_overhead.py", args);
    } else {
        snprintf(p.status, sizeof p.status, "PyTorch: not run (--no-peer)");
    }
    char title[512];
    snprintf(title, sizeof title,
             "%s (%s)\n(median of %d batches of %d ops, warm-up first, one synchronize per batch)", TITLE,
             props.name, R, K);
    bench_header(title, "microseconds per op", &p);
    bench_row("add, 1 element, no tape", plain, bench_peer_get(&p, "add_plain"));
    bench_row("add, 1 element, recorded by a tape", taped, bench_peer_get(&p, "add_taped"));
    bench_row("(x*x + x).sum() fwd+bwd, 16 elements", fb, bench_peer_get(&p, "fwd_bwd"));

    nb_release(xa);
    nb_release(xb);
    nb_release(x16);
    nb_device_pop();
    return 0;
}
