/* Elementwise chains on the CPU, eager and as a recorded step with and without
 * fusion (nb_graph_set_fusion), beside the same chains in PyTorch eager from
 * Python (bench/fusion.py), same machine, same run.
 *
 *   bench_fusion [--mib M] [--reps R] [--no-peer]
 *
 * Each tensor holds M MiB of f32 (default 64: far past the caches, so every
 * pass goes to memory). Four chains: exp((a + b) * c), three ops whose two
 * temporaries a fused replay never writes (4 tensors move instead of 8); the
 * tanh form of GELU on x, eight ops; a leaky ReLU written as
 * where(x > 0, x, 0.1 x) (zeros, compare, scale, select); and a round trip
 * through bf16 times a scale, 2 x.to(bf16).to(f32) (two casts and a scale).
 * Three chains feed a reduction: mean((a - b)^2), sum(exp(x)) and the sum
 * over the rows of a [n / 64, 64] product a b (a bias gradient's shape);
 * fused, the chain runs into the reduction and its result is never stored
 * (2, 1 and 2 tensors read instead of 2 + 2, 1 + 2 and 2 + 2 moved), beside the same steps with
 * the chains fused but the reduction kept apart (NB_GRAPH_FUSE_REDUCE=0).
 * Every step's temporaries are let go
 * inside it, as in a model's forward pass. Before anything is timed, the fused
 * replay's output is checked against the eager one, bit for bit. Figures:
 * milliseconds per step, median of R after a warm-up. */
#include "bench_util.h"
#include <nabla/nabla.h>

#define TITLE "Elementwise chains on /cpu:0, fused in a recorded step"

static nb_tensor *exp_chain(nb_tensor *const *in) { return nb_exp(nb_mul(nb_add(in[0], in[1]), in[2])); }

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static nb_tensor *gelu_chain(nb_tensor *const *in)
{
    nb_tensor *x = in[0];
    nb_tensor *inner = nb_add(x, nb_mul_scalar(nb_mul(nb_mul(x, x), x), 0.044715));
    return nb_mul(nb_mul_scalar(x, 0.5), nb_add_scalar(nb_tanh(nb_mul_scalar(inner, 0.7978845608028654)), 1.0));
}

/* where(x > 0, x, 0.1 x), the zeros made in the step */
static nb_tensor *leaky_chain(nb_tensor *const *in)
{
    nb_tensor *x = in[0];
    return nb_where(nb_greater(x, nb_zeros_like(x)), x, nb_mul_scalar(x, 0.1));
}

static nb_tensor *bf16_chain(nb_tensor *const *in) { return nb_mul_scalar(nb_cast(nb_cast(in[0], NB_BF16), NB_F32), 2.0); }

static nb_tensor *mse_chain(nb_tensor *const *in) { return nb_mean_all(nb_square(nb_sub(in[0], in[1]))); }

static nb_tensor *sum_exp_chain(nb_tensor *const *in) { return nb_sum_all(nb_exp(in[0])); }

/* a bias gradient's shape of sum: over the rows of a [n / 64, 64] product */
static nb_tensor *col_sum_chain(nb_tensor *const *in)
{
    const int64_t n = nb_tensor_numel(in[0]);
    return nb_sum(nb_mul(nb_reshape(in[0], NB_SHAPE(n / 64, 64)), nb_reshape(in[1], NB_SHAPE(n / 64, 64))),
                  NB_AXES(0), false);
}

typedef nb_tensor *(*chain_fn)(nb_tensor *const *in);

/* A step: the chain, its temporaries let go before it returns. */
static nb_status step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(((chain_fn)user)(in));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

typedef struct timed {
    chain_fn chain;
    nb_tensor *const *in;
    nb_graph *g;
} timed;

static void eager_once(void *ctx)
{
    const timed *t = ctx;
    t->chain(t->in);
}

static void replay_once(void *ctx)
{
    const timed *t = ctx;
    if (nb_graph_replay(t->g, NULL, NULL))
        fprintf(stderr, "replay: %s\n", nb_error_message());
}

static bool same_bits(const nb_tensor *a, const nb_tensor *b)
{
    size_t n = (size_t)nb_tensor_numel(a) * nb_dtype_size(nb_tensor_dtype(a));
    unsigned char *x = malloc(n), *y = malloc(n);
    bool same = x && y && !nb_tensor_read(a, x, n) && !nb_tensor_read(b, y, n) && !memcmp(x, y, n);
    free(x);
    free(y);
    return same;
}

/* Eager, recorded unfused, recorded fused and (where ms has a 4th place)
 * recorded with the chains fused but reductions kept apart
 * (NB_GRAPH_FUSE_REDUCE=0) times (ms) of chain; false when a replay's output
 * differs from the eager one. */
static bool time_chain(chain_fn chain, int n_in, nb_tensor *const *in, int reps, int n_ms, double *ms)
{
    timed t = {chain, in, NULL};
    ms[0] = bench_median_ms(eager_once, &t, 2, reps);
    bool ok = true;
    for (int mode = 0; mode < n_ms - 1; mode++) {
        nb_scope *s = nb_scope_begin();
        bool was = nb_graph_set_fusion(mode > 0);
        if (mode == 2)
            setenv("NB_GRAPH_FUSE_REDUCE", "0", 1);
        nb_tensor *out = NULL;
        nb_status st = nb_graph_capture("/cpu:0", step, (void *)chain, n_in, in, 1, &out, &t.g);
        unsetenv("NB_GRAPH_FUSE_REDUCE");
        nb_graph_set_fusion(was);
        if (st) {
            fprintf(stderr, "capture: %s\n", nb_error_message());
            nb_scope_end(s);
            return false;
        }
        nb_tensor *replayed = NULL;
        ok = ok && !nb_graph_replay(t.g, NULL, &replayed) && same_bits(replayed, chain(in));
        ms[1 + mode] = bench_median_ms(replay_once, &t, 2, reps);
        nb_graph_free(t.g);
        nb_scope_end(s);
    }
    return ok;
}

int main(int argc, char **argv)
{
    int mib = 64, reps = 20;
    bool run_peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_NUMBER("--mib", "M", &mib, 1), BENCH_REPS(&reps), BENCH_NO_PEER(&run_peer));
    int64_t n = (int64_t)mib * 1024 * 1024 / 4;
    nb_scope *s = nb_scope_begin();
    nb_tensor *in[3] = {nb_random_uniform(NB_F32, NB_SHAPE(n), -1, 1, 1),
                        nb_random_uniform(NB_F32, NB_SHAPE(n), -1, 1, 2),
                        nb_random_uniform(NB_F32, NB_SHAPE(n), -1, 1, 3)};
    double e[3], g[3], l[3], c[3], m[4], x[4], k[4];
    bool ok = time_chain(exp_chain, 3, in, reps, 3, e) && time_chain(gelu_chain, 1, in, reps, 3, g) &&
              time_chain(leaky_chain, 1, in, reps, 3, l) && time_chain(bf16_chain, 1, in, reps, 3, c) &&
              time_chain(mse_chain, 2, in, reps, 4, m) && time_chain(sum_exp_chain, 1, in, reps, 4, x) &&
              time_chain(col_sum_chain, 2, in, reps, 4, k);
    bench_peer p;
    bench_peer_run(&p, run_peer, "fusion.py", "%lld %d", (long long)n, reps);
    char title[160];
    snprintf(title, sizeof title, "%s (f32, %d MiB a tensor)", TITLE, mib);
    bench_header(title, "milliseconds per step", &p);
    double pe = bench_peer_get(&p, "exp_chain"), pg = bench_peer_get(&p, "gelu");
    double pl = bench_peer_get(&p, "leaky_where"), pc = bench_peer_get(&p, "bf16_round_trip");
    double pm = bench_peer_get(&p, "mse"), px = bench_peer_get(&p, "sum_exp"), pk = bench_peer_get(&p, "col_sum");
    bench_row("exp((a + b) * c), eager", e[0], pe);
    bench_row("the same, recorded, unfused", e[1], pe);
    bench_row("the same, recorded, fused", e[2], pe);
    bench_row("GELU (tanh form, 8 ops), eager", g[0], pg);
    bench_row("the same, recorded, unfused", g[1], pg);
    bench_row("the same, recorded, fused", g[2], pg);
    bench_row("where(x > 0, x, 0.1 x), eager", l[0], pl);
    bench_row("the same, recorded, unfused", l[1], pl);
    bench_row("the same, recorded, fused", l[2], pl);
    bench_row("2 x.to(bf16).to(f32), eager", c[0], pc);
    bench_row("the same, recorded, unfused", c[1], pc);
    bench_row("the same, recorded, fused", c[2], pc);
    bench_row("mean((a - b)^2), eager", m[0], pm);
    bench_row("the same, recorded, unfused", m[1], pm);
    bench_row("the same, chain fused, reduce apart", m[3], pm);
    bench_row("the same, chain fused into the mean", m[2], pm);
    bench_row("sum(exp(x)), eager", x[0], px);
    bench_row("the same, recorded, unfused", x[1], px);
    bench_row("the same, exp apart from the sum", x[3], px);
    bench_row("the same, exp fused into the sum", x[2], px);
    bench_row("sum over rows of [n/64, 64] a b, eager", k[0], pk);
    bench_row("the same, recorded, unfused", k[1], pk);
    bench_row("the same, product apart from the sum", k[3], pk);
    bench_row("the same, product fused into the sum", k[2], pk);
    printf("(fused over unfused: %.2fx, %.2fx, %.2fx and %.2fx; into the reduction over the chain alone: %.2fx, "
           "%.2fx and %.2fx; PyTorch's threads: %.0f)\n",
           e[1] / e[2], g[1] / g[2], l[1] / l[2], c[1] / c[2], m[3] / m[2], x[3] / x[2], k[3] / k[2],
           bench_peer_get(&p, "threads"));
    nb_scope_end(s);
    if (!ok) {
        printf("FAILED: a replay differs from the eager step\n");
        return 1;
    }
    return 0;
}
