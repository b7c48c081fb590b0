/* The cost of a tiny op: a one-element add with no tape, the same add recorded by
 * a tape, and forward + backward of (x*x + x).sum() for a 16-element x (eager,
 * and captured once with nb_graph_capture then replayed), beside the same work
 * in PyTorch eager from Python (bench/overhead.py). On /cpu:0, and on /gpu:0
 * too when there is one (or on the one device --device names).
 *
 *   overhead [--device NAME] [--ops K] [--reps R] [--no-peer] [--phases]
 *
 * --phases adds, under each device's table, where an add's time goes: the mean
 * nanoseconds per op of each phase (nabla/profile.h) for the untaped and the
 * taped add, from R more batches run with op profiling on. Profiling reads the
 * clock at every phase boundary; its estimated cost is taken out of the
 * phases and shown on a row of its own, so the phases (exclusive, "other"
 * included) should add up to about the table's figure.
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

/* fwd_bwd's step, captured: x16 in, its gradient out. */
static nb_graph *g_fwd_bwd;

static nb_status fwd_bwd_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, in[0]);
    nb_tensor *z = nb_sum_all(nb_add(nb_mul(in[0], in[0]), in[0]));
    return nb_tape_gradient(tape, z, 1, in, out);
}

static void fwd_bwd_replayed(void)
{
    for (int i = 0; i < K / 10; i++)
        nb_graph_replay(g_fwd_bwd, NULL, NULL);
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

/* The calling thread's phase totals over R batches of fn, after one warm-up. */
static void profile_batches(void (*fn)(void), nb_op_profile *out)
{
    fn();
    nb_set_op_profiling(true); /* starts from zero */
    for (int i = 0; i < R; i++)
        fn();
    nb_op_profile_get(out);
    nb_set_op_profiling(false);
}

static double per_op(const nb_op_profile *p, int64_t ns) { return p->ops ? (double)ns / (double)p->ops : 0.0; }

/* Where an add's time goes on the pushed device: mean ns per op of each phase. */
static void print_phases(const char *device, double plain_us, double taped_us)
{
    nb_op_profile prof[2];
    profile_batches(add_plain, &prof[0]);
    profile_batches(add_taped, &prof[1]);
    printf("\nPhases of a 1-element add on %s (mean ns per op over %d batches of %d ops, profiling on;\n"
           "one boundary's own cost, %lld ns, taken out of each)\n",
           device, R, K, (long long)prof[0].boundary_ns);
    printf("%-34s %10s %10s\n", "phase", "no tape", "taped");
    int64_t wall[2] = {0, 0};
    for (int ph = 0; ph < NB_PHASE_COUNT; ph++) {
        printf("%-34s %10.1f %10.1f\n", nb_op_phase_name((nb_op_phase)ph), per_op(&prof[0], prof[0].ns[ph]),
               per_op(&prof[1], prof[1].ns[ph]));
        wall[0] += prof[0].ns[ph];
        wall[1] += prof[1].ns[ph];
    }
    printf("%-34s %10.1f %10.1f\n", "sum of the phases", per_op(&prof[0], wall[0]), per_op(&prof[1], wall[1]));
    printf("%-34s %10.1f %10.1f\n", "profiling's own cost (taken out)", per_op(&prof[0], prof[0].overhead_ns),
           per_op(&prof[1], prof[1].overhead_ns));
    printf("%-34s %10.1f %10.1f\n", "wall without profiling (table)", plain_us * 1e3, taped_us * 1e3);
    printf("%-34s %10lld %10lld\n", "ops counted", (long long)prof[0].ops, (long long)prof[1].ops);
    printf("(other: the batch loop, its scope and tape calls, and the wait for the device at its end;\n"
           " kernel: the CPU's computation, or the GPU's dtype dispatch and launch geometry)\n");
}

/* Measures on one device and prints its table (and its phases when asked). */
static void measure(const char *device, bool peer, bool phases)
{
    bool gpu = strncmp(device, "/gpu", 4) == 0;
    nb_device_push(device);
    xa = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 1);
    xb = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 2);
    x16 = nb_random_normal(NB_F32, NB_SHAPE(16), 0, 1, 3);
    double plain = median_us(add_plain, K);
    double taped = median_us(add_taped, K);
    double fb = median_us(fwd_bwd, K / 10);
    nb_graph_capture(device, fwd_bwd_step, NULL, 1, &x16, 1, NULL, &g_fwd_bwd);
    double fb_graph = median_us(fwd_bwd_replayed, K / 10);
    nb_graph_free(g_fwd_bwd);

    bench_peer p;
    bench_peer_run(&p, peer, "overhead.py", "%s %d %d", gpu ? "cuda" : "cpu", K, R);
    char title[256];
    snprintf(title, sizeof title, "Small-op overhead on %s (median of %d batches of %d ops, warm-up first)",
             device, R, K);
    bench_header(title, "microseconds per op", &p);
    bench_row("add, 1 element, no tape", plain, bench_peer_get(&p, "add_plain"));
    bench_row("add, 1 element, recorded by a tape", taped, bench_peer_get(&p, "add_taped"));
    bench_row("(x*x + x).sum() fwd+bwd, 16 elements", fb, bench_peer_get(&p, "fwd_bwd"));
    bench_row("the same, captured once and replayed", fb_graph, bench_peer_get(&p, "fwd_bwd"));
    if (phases)
        print_phases(device, plain, taped);
    nb_release(xa);
    nb_release(xb);
    nb_release(x16);
    nb_device_pop();
}

int main(int argc, char **argv)
{
    bool peer = true, phases = false;
    const char *device = NULL;
    BENCH_OPTIONS(argc, argv, BENCH_TEXT("--device", "NAME", &device), BENCH_NUMBER("--ops", "K", &K, 10),
                  BENCH_REPS(&R), BENCH_NO_PEER(&peer), BENCH_FLAG("--phases", &phases, true));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_set_soft_placement(false); /* never time the CPU in place of a missing GPU */
    if (device) {
        measure(device, peer, phases);
        return 0;
    }
    measure("/cpu:0", peer, phases);
    if (nb_device_count(NB_DEVICE_GPU) > 0)
        measure("/gpu:0", peer, phases);
    else
        return bench_no_gpu("Small-op overhead on /gpu:0", nb_gpu_unavailable_reason());
    return 0;
}
