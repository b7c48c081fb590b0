/* Reductions, argmax and cumsum on /gpu:0 beside PyTorch from Python
 * (bench/gpu_reduce.py), f32, in microseconds per op and GB/s of input read:
 *
 *   sum over all of [4096, 4096]            sum over the last axis of [4096, 4096]
 *   sum over axis 0 of [4096, 4096]         argmax over axis 0 of [60000, 10]
 *   argmax over axis 1 of [60000, 10]       cumsum over the last axis of [4096, 4096]
 *   cumsum of a [1 << 24] vector
 *
 *   gpu_reduce [--batch B] [--reps R] [--no-peer]
 *
 * Each figure is the median over R batches of B ops (after a warm-up), timed by
 * the host clock between two synchronizes, per op. Inputs are uniform random in
 * [-1, 1); before timing, each op's result is checked against the same op on
 * /cpu:0 (sums and cumsums to a relative 1e-4 of the sum of |x| along the
 * reduced axis, argmax exactly). Built only with CUDA; prints why and exits 0
 * where there is no GPU (1 with NB_REQUIRE_GPU=1). */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define TITLE "Reductions, argmax and cumsum on /gpu:0"

static int B = 20, R = 20;

typedef enum { SUM_ALL, SUM_LAST, SUM_FIRST, ARGMAX0, ARGMAX1, CUMSUM_LAST, CUMSUM_VEC, N_CASES } kind;

static const struct {
    const char *name, *peer;
    int64_t rows, cols; /* cols 0: a vector of rows elements */
} cases[N_CASES] = {
    [SUM_ALL] = {"sum, all of [4096, 4096]", "sum_all", 4096, 4096},
    [SUM_LAST] = {"sum, axis 1 of [4096, 4096]", "sum_last", 4096, 4096},
    [SUM_FIRST] = {"sum, axis 0 of [4096, 4096]", "sum_first", 4096, 4096},
    [ARGMAX0] = {"argmax, axis 0 of [60000, 10]", "argmax0", 60000, 10},
    [ARGMAX1] = {"argmax, axis 1 of [60000, 10]", "argmax1", 60000, 10},
    [CUMSUM_LAST] = {"cumsum, axis 1 of [4096, 4096]", "cumsum_last", 4096, 4096},
    [CUMSUM_VEC] = {"cumsum of [1 << 24]", "cumsum_vec", 1 << 24, 0},
};

static nb_tensor *run(kind k, const nb_tensor *x)
{
    switch (k) {
    case SUM_ALL: return nb_sum(x, NB_ALL_AXES, false);
    case SUM_LAST: return nb_sum(x, NB_AXES(1), false);
    case SUM_FIRST: return nb_sum(x, NB_AXES(0), false);
    case ARGMAX0: return nb_argmax(x, 0, false);
    case ARGMAX1: return nb_argmax(x, 1, false);
    case CUMSUM_LAST: return nb_cumsum(x, 1, false, false);
    case CUMSUM_VEC: return nb_cumsum(x, 0, false, false);
    default: return NULL;
    }
}

static nb_tensor *input_for(kind k, const char *device)
{
    nb_device_push(device);
    nb_tensor *x = cases[k].cols ? nb_random_uniform(NB_F32, NB_SHAPE(cases[k].rows, cases[k].cols), -1, 1, 7 + k)
                                 : nb_random_uniform(NB_F32, NB_SHAPE(cases[k].rows), -1, 1, 7 + k);
    nb_device_pop();
    return x;
}

/* The GPU's result against the CPU's on the same values: true when close. */
static bool check(kind k, nb_tensor *xg)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *xc = nb_to_device(xg, "/cpu:0");
    nb_tensor *g = nb_to_device(run(k, xg), "/cpu:0"), *c = run(k, xc);
    bool ok = false;
    if (g && c) {
        if (k == ARGMAX0 || k == ARGMAX1) {
            ok = nb_tensor_item(nb_sum_all(nb_cast(nb_not_equal(g, c), NB_I64))) == 0;
        } else {
            /* the scale: sum of |x| along the reduced axis (all of it for sum_all) */
            nb_tensor *a = nb_abs(xc);
            double scale = k == SUM_ALL ? nb_tensor_item(nb_sum_all(a))
                         : nb_tensor_item(nb_max(nb_sum(a, NB_AXES(k == SUM_FIRST ? 0 : -1), false), NB_ALL_AXES,
                                                 false));
            double err = nb_tensor_item(nb_max(nb_abs(nb_sub(nb_cast(g, NB_F64), nb_cast(c, NB_F64))), NB_ALL_AXES,
                                               false));
            ok = err <= 1e-4 * scale + 1e-6;
            if (!ok)
                fprintf(stderr, "gpu_reduce: %s: error %.3g for a scale of %.3g\n", cases[k].name, err, scale);
        }
    }
    nb_scope_end(s);
    return ok;
}

/* Median microseconds per op. */
static double time_op(kind k, const nb_tensor *x)
{
    double *v = malloc(sizeof(double) * (size_t)R);
    for (int w = 0; w < 3; w++) {
        nb_scope *s = nb_scope_begin();
        for (int i = 0; i < B; i++)
            run(k, x);
        nb_scope_end(s);
    }
    for (int r = 0; r < R; r++) {
        nb_synchronize();
        double t0 = bench_now();
        nb_scope *s = nb_scope_begin();
        for (int i = 0; i < B; i++)
            run(k, x);
        nb_synchronize();
        v[r] = (bench_now() - t0) / B * 1e6;
        nb_scope_end(s);
    }
    double m = bench_median(v, R);
    free(v);
    return m;
}

int main(int argc, char **argv)
{
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_NUMBER("--batch", "B", &B, 1), BENCH_REPS(&R), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_gpu_properties props;
    if (!bench_gpu_ready(&props))
        return bench_no_gpu(TITLE, nb_gpu_unavailable_reason());

    double ms[N_CASES];
    bool ok = true, good[N_CASES];
    nb_device_push("/gpu:0");
    for (int k = 0; k < N_CASES; k++) {
        nb_tensor *x = input_for((kind)k, "/gpu:0");
        good[k] = check((kind)k, x);
        ok = ok && good[k];
        ms[k] = time_op((kind)k, x);
        nb_release(x);
    }
    nb_device_pop();

    bench_peer p;
    if (peer)
        nb_gpu_empty_cache("/gpu:0"); /* leave the card's memory to PyTorch */
    bench_peer_run(&p, peer, "gpu_reduce.py", "%d %d", B, R);
    printf("\n%s (%s): f32\n", TITLE, props.name);
    printf("(median of %d batches of %d, warm-up first, host clock between synchronizes)\n", R, B);
    bench_peer_line(&p, "nabla's figures only");
    printf("%-34s %10s %8s %10s %8s %10s\n", "us per op", "nabla", "GB/s", "PyTorch", "GB/s", "vs PyTorch");
    for (int k = 0; k < N_CASES; k++) {
        double bytes = (double)cases[k].rows * (double)(cases[k].cols ? cases[k].cols : 1) * sizeof(float);
        double pt = bench_peer_get(&p, cases[k].peer);
        printf("%-34s %10.1f %8.0f", cases[k].name, ms[k], bytes / (ms[k] * 1e-6) / 1e9);
        if (pt > 0)
            printf(" %10.1f %8.0f %9.2fx", pt, bytes / (pt * 1e-6) / 1e9, pt / ms[k]);
        else
            printf(" %10s %8s %10s", "-", "-", "-");
        printf("%s\n", good[k] ? "" : "  WRONG");
    }
    printf("(GB/s: input bytes read once per op; vs: how many times faster nabla is)\n");
    printf("%s\n", ok ? "(every result matches the CPU's)" : "CHECK FAILED: a result is wrong; its time means nothing");
    return ok ? 0 : 1;
}
