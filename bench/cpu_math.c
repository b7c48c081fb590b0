/* The CPU's transcendental ops, eager, on f32 tensors, beside the same ops in
 * PyTorch eager from Python (bench/cpu_math.py), same machine, same run.
 *
 *   bench_cpu_math [--mib M] [--reps R] [--no-peer]
 *
 * Each tensor holds M MiB of f32 (default 64: past the caches), uniform in
 * [-8, 8) (log's and pow's in (0, 16)). The ops: exp, sigmoid, silu, tanh,
 * softplus, sin, cos, log, x^1.7, the exact GELU, softmax and log_softmax over rows of 1024,
 * and new random tensors of the same shape (normal, uniform, and normal
 * truncated at 2 sd: torch.randn, torch.rand, torch.nn.init.trunc_normal_);
 * then exp, sigmoid, tanh, sin, log and x^1.7 (of values in (0, 16)),
 * softplus and the exact GELU of M MiB of f64 in [-8, 8).
 * exp, log, log1p, tanh, erfc, sin, cos and pow (nb_expf and the rest,
 * lib/core/formulas.h), the double exp, expm1, tanh, sin, cos, log, log1p, pow, erf
 * and erfc, the ops
 * made of them and the random generator run in vectorised loops, compiled
 * for the CPU's widest vectors (NB_CPU_SIMD caps them: "baseline", "avx2",
 * "avx512").
 * Figures: milliseconds per op, median of R after a warm-up. */
#include "bench_util.h"
#include <nabla/nabla.h>

typedef struct op_case {
    const char *name, *peer;
    nb_tensor *(*fn)(const nb_tensor *x);
    int input; /* IN_ALL: x; IN_POSITIVE: the values in (0, 16); IN_F64(_POSITIVE): those in f64 */
} op_case;
enum { IN_ALL, IN_POSITIVE, IN_F64, IN_F64_POSITIVE };

static nb_tensor *softmax_rows(const nb_tensor *x) { return nb_softmax(x, -1); }
static nb_tensor *log_softmax_rows(const nb_tensor *x) { return nb_log_softmax(x, -1); }
static nb_tensor *pow_1_7(const nb_tensor *x) { return nb_pow_scalar(x, 1.7); }
static nb_tensor *normal_like(const nb_tensor *x) { return nb_random_normal(NB_F32, nb_tensor_shape(x), 0, 1, 7); }
static nb_tensor *uniform_like(const nb_tensor *x) { return nb_random_uniform(NB_F32, nb_tensor_shape(x), 0, 1, 8); }
static nb_tensor *truncated_like(const nb_tensor *x)
{
    return nb_truncated_normal(NB_F32, nb_tensor_shape(x), 0, 1, 9);
}

typedef struct timed {
    nb_tensor *(*fn)(const nb_tensor *x);
    nb_tensor *x;
} timed;

static void once(void *ctx)
{
    const timed *t = ctx;
    nb_scope *s = nb_scope_begin();
    if (!t->fn(t->x))
        fprintf(stderr, "op: %s\n", nb_error_message());
    nb_scope_end(s);
}

int main(int argc, char **argv)
{
    int mib = 64, reps = 10;
    bool run_peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_NUMBER("--mib", "M", &mib, 1), BENCH_REPS(&reps), BENCH_NO_PEER(&run_peer));
    const int64_t cols = 1024, rows = ((int64_t)mib * 1024 * 1024 / 4 + cols - 1) / cols;
    const op_case cases[] = {
        {"exp", "exp", nb_exp, IN_ALL},
        {"sigmoid", "sigmoid", nb_sigmoid, IN_ALL},
        {"silu", "silu", nb_silu, IN_ALL},
        {"tanh", "tanh", nb_tanh, IN_ALL},
        {"softplus", "softplus", nb_softplus, IN_ALL},
        {"sin", "sin", nb_sin, IN_ALL},
        {"cos", "cos", nb_cos, IN_ALL},
        {"log (of values in (0, 16))", "log", nb_log, IN_POSITIVE},
        {"x^1.7 (of values in (0, 16))", "pow", pow_1_7, IN_POSITIVE},
        {"gelu (exact, erfc)", "gelu", nb_gelu, IN_ALL},
        {"softmax over rows of 1024", "softmax", softmax_rows, IN_ALL},
        {"log_softmax over rows of 1024", "log_softmax", log_softmax_rows, IN_ALL},
        {"new random normal tensor", "randn", normal_like, IN_ALL},
        {"new random uniform tensor", "rand", uniform_like, IN_ALL},
        {"new truncated normal tensor (2 sd)", "trunc_normal", truncated_like, IN_ALL},
        {"exp, f64", "exp_f64", nb_exp, IN_F64},
        {"sigmoid, f64", "sigmoid_f64", nb_sigmoid, IN_F64},
        {"tanh, f64", "tanh_f64", nb_tanh, IN_F64},
        {"sin, f64", "sin_f64", nb_sin, IN_F64},
        {"log, f64 (of values in (0, 16))", "log_f64", nb_log, IN_F64_POSITIVE},
        {"softplus, f64", "softplus_f64", nb_softplus, IN_F64},
        {"x^1.7, f64 (of values in (0, 16))", "pow_f64", pow_1_7, IN_F64_POSITIVE},
        {"gelu (exact, erfc), f64", "gelu_f64", nb_gelu, IN_F64},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(rows, cols), -8, 8, 1);
    nb_tensor *xp = nb_random_uniform(NB_F32, NB_SHAPE(rows, cols), 0x1p-20, 16, 2);
    nb_tensor *xd = nb_random_uniform(NB_F64, NB_SHAPE(rows / 2, cols), -8, 8, 3); /* the same bytes */
    nb_tensor *xdp = nb_random_uniform(NB_F64, NB_SHAPE(rows / 2, cols), 0x1p-20, 16, 4);
    double ms[sizeof cases / sizeof cases[0]];
    for (int i = 0; i < n_cases; i++) {
        nb_tensor *in = cases[i].input == IN_POSITIVE       ? xp
                        : cases[i].input == IN_F64          ? xd
                        : cases[i].input == IN_F64_POSITIVE ? xdp
                                                            : x;
        ms[i] = bench_median_ms(once, &(timed){cases[i].fn, in}, 2, reps);
    }
    bench_peer p;
    bench_peer_run(&p, run_peer, "cpu_math.py", "%lld %lld %d", (long long)rows, (long long)cols, reps);
    char title[160];
    snprintf(title, sizeof title, "Transcendental ops on /cpu:0, eager (f32, [%lld, %lld], %d MiB)", (long long)rows,
             (long long)cols, mib);
    bench_header(title, "milliseconds per op", &p);
    for (int i = 0; i < n_cases; i++)
        bench_row(cases[i].name, ms[i], bench_peer_get(&p, cases[i].peer));
    bench_cpu_footer(&p);
    nb_scope_end(s);
    return 0;
}
