/* The cost of a tiny op: a one-element add with no tape, the same add recorded by
 * a tape, and forward + backward of (x*x + x).sum() for a 16-element x, beside the
 * same work in PyTorch from Python (bench/overhead.py). On /cpu:0, and on /gpu:0
 * too when there is one (or on the one device --device names).
 *
 *   overhead [--device NAME] [--ops K] [--reps R] [--no-peer]
 *
 * Each figure is the median over R batches of K ops (after a warm-up), per op,
 * including the scope (or tape) that releases what the batch made, timed by the
 * host clock. A batch ends with one nb_synchronize() (torch.cuda.synchronize() on
 * the PyTorch side), so on a GPU the figure is an op's launch cost, or its device
 * time if that is longer, not one round trip each. */
#include "bench_util.h"
#include <nabla/nabla.h>

static int K = 1000, R = 200;
static nb_tensor *xa, *xb, *x16;

static void add_plain(void)
{
    nb_scope *s = nb_scope_begin();
    for (int i = 0; i < K; i++)
        nb_add(xa, xb);
    nb_synchronize();
    nb_scope_end(s);
}

static void add_taped(void)
{
    nb_scope *s = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, xa);
    for (int i = 0; i < K; i++)
        nb_add(xa, xb);
    nb_synchronize();
    nb_scope_end(s); /* frees the tape and its record */
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

/* Measures on one device and prints its table. */
static void measure(const char *device, bool peer)
{
    bool gpu = strncmp(device, "/gpu", 4) == 0;
    nb_device_push(device);
    xa = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 1);
    xb = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 2);
    x16 = nb_random_normal(NB_F32, NB_SHAPE(16), 0, 1, 3);
    double plain = median_us(add_plain, K);
    double taped = median_us(add_taped, K);
    double fb = median_us(fwd_bwd, K / 10);

    bench_peer p;
    bench_peer_run(&p, peer, "overhead.py", "%s %d %d", gpu ? "cuda" : "cpu", K, R);
    char title[256];
    snprintf(title, sizeof title, "Small-op overhead on %s (median of %d batches of %d ops, warm-up first)",
             device, R, K);
    bench_header(title, "microseconds per op", &p);
    bench_row("add, 1 element, no tape", plain, bench_peer_get(&p, "add_plain"));
    bench_row("add, 1 element, recorded by a tape", taped, bench_peer_get(&p, "add_taped"));
    bench_row("(x*x + x).sum() fwd+bwd, 16 elements", fb, bench_peer_get(&p, "fwd_bwd"));
    nb_release(xa);
    nb_release(xb);
    nb_release(x16);
    nb_device_pop();
}

int main(int argc, char **argv)
{
    bool peer = true;
    const char *device = NULL;
    BENCH_OPTIONS(argc, argv, BENCH_TEXT("--device", "NAME", &device), BENCH_NUMBER("--ops", "K", &K, 10),
                  BENCH_REPS(&R), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_set_soft_placement(false); /* never time the CPU in place of a missing GPU */
    if (device) {
        measure(device, peer);
        return 0;
    }
    measure("/cpu:0", peer);
    if (nb_device_count(NB_DEVICE_GPU) > 0)
        measure("/gpu:0", peer);
    else
        return bench_no_gpu("Small-op overhead on /gpu:0", nb_gpu_unavailable_reason());
    return 0;
}
