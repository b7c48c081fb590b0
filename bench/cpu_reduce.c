/* Reductions on /cpu:0, eager, f32, beside PyTorch eager from Python
 * (bench/cpu_reduce.py), same machine, same run:
 *
 *   sum over axis 0 of [4096, 1024]       sum over axis 1 of [4096, 1024]
 *   sum of all of [4096, 1024]            max over axis 0 of [4096, 1024]
 *   max over axis 1 of [4096, 1024]       sum over axis 0 of [100352, 64]
 *                                         (a convolution's bias gradient)
 *
 *   bench_cpu_reduce [--reps R] [--no-peer]
 *
 * Inputs are normal random; nabla sums f32 in double, PyTorch in float. The
 * accumulating loops are compiled for the CPU's widest vectors (NB_CPU_SIMD
 * caps them). Figures: milliseconds per op, median of R after a warm-up. */
#include "bench_util.h"
#include <nabla/nabla.h>

typedef struct red_case {
    const char *name, *peer;
    nb_tensor *(*fn)(const nb_tensor *x, nb_axes axes, bool keepdims);
    bool tall;  /* on the [100352, 64] tensor */
    nb_axes axes;
} red_case;

typedef struct timed {
    const red_case *c;
    nb_tensor *x;
} timed;

static void once(void *ctx)
{
    const timed *t = ctx;
    nb_scope *s = nb_scope_begin();
    if (!t->c->fn(t->x, t->c->axes, false))
        fprintf(stderr, "%s: %s\n", t->c->name, nb_error_message());
    nb_scope_end(s);
}

int main(int argc, char **argv)
{
    int reps = 30;
    bool run_peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&run_peer));
    const red_case cases[] = {
        {"sum over axis 0 of [4096, 1024]", "sum0", nb_sum, false, NB_AXES(0)},
        {"sum over axis 1 of [4096, 1024]", "sum1", nb_sum, false, NB_AXES(1)},
        {"sum of all of [4096, 1024]", "sum_all", nb_sum, false, NB_AXES(0, 1)},
        {"max over axis 0 of [4096, 1024]", "max0", nb_max, false, NB_AXES(0)},
        {"max over axis 1 of [4096, 1024]", "max1", nb_max, false, NB_AXES(1)},
        {"sum over axis 0 of [100352, 64]", "sum0_tall", nb_sum, true, NB_AXES(0)},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(4096, 1024), 0, 1, 1);
    nb_tensor *tall = nb_random_normal(NB_F32, NB_SHAPE(100352, 64), 0, 1, 2);
    double ms[sizeof cases / sizeof cases[0]];
    for (int i = 0; i < n_cases; i++)
        ms[i] = bench_median_ms(once, &(timed){&cases[i], cases[i].tall ? tall : x}, 2, reps);
    bench_peer p;
    bench_peer_run(&p, run_peer, "cpu_reduce.py", "%d", reps);
    bench_header("Reductions on /cpu:0, eager (f32)", "milliseconds per op", &p);
    for (int i = 0; i < n_cases; i++)
        bench_row(cases[i].name, ms[i], bench_peer_get(&p, cases[i].peer));
    bench_cpu_footer(&p);
    nb_scope_end(s);
    return 0;
}
