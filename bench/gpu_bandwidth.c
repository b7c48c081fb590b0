/* Device-memory bandwidth on /gpu:0: a device-to-device copy of a large f32 tensor
 * (nb_cast to its own dtype, which is one cudaMemcpyAsync) as the ceiling, then
 * x * 2, a + b and exp((a + b) * c) as a percentage of it, beside the same ops in
 * PyTorch from Python (bench/gpu_bandwidth.py, timed with torch.cuda.Event).
 *
 *   gpu_bandwidth [--mib M] [--batch B] [--reps R] [--no-peer]
 *
 * Each tensor holds M MiB (default 256: far larger than the L2 cache, so no
 * buffer rotation is needed). Each figure is the median over R batches of B ops
 * (after a warm-up), timed by the host clock between two nb_synchronize() calls,
 * per op. GB/s count the bytes each op reads plus the bytes it writes; the
 * three-op chain runs as three kernels (add, mul, exp) that move 8 tensors' worth
 * of bytes in all; captured into a graph (nb_graph_capture) it is one kernel
 * fused at the recording, which moves 4 (its replays are timed too, and their
 * output must equal the eager chain's bit for bit). Inputs are uniform random, and every op's output is checked
 * against a double-precision reference (outputs poisoned with NaN first) before
 * anything is timed. Prints why and exits 0 where there is no GPU (1 with NB_REQUIRE_GPU=1). */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define TITLE "Device-memory bandwidth on /gpu:0"

static int B = 10, R = 30;
static int64_t N;
static nb_tensor *a, *b, *c;

enum { K_COPY, K_SCALE, K_ADD, K_CHAIN };

/* One of the four ops on the inputs a, b, c. */
static nb_tensor *run_op(int kind)
{
    return kind == K_COPY    ? nb_cast(a, NB_F32)
           : kind == K_SCALE ? nb_mul_scalar(a, 2.0)
           : kind == K_ADD   ? nb_add(a, b)
                             : nb_exp(nb_mul(nb_add(a, b), c));
}

/* B ops of the kind *ctx names, each in a scope of its own. */
static void op_batch(void *ctx)
{
    const int kind = *(const int *)ctx;
    for (int i = 0; i < B; i++) {
        nb_scope *s = nb_scope_begin();
        run_op(kind);
        nb_scope_end(s);
    }
}

/* The chain as a captured step, its temporaries let go inside it. */
static nb_status chain_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_exp(nb_mul(nb_add(in[0], in[1]), in[2])));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

static nb_graph *g_chain;

static void replay_batch(void *ctx)
{
    (void)ctx;
    for (int i = 0; i < B; i++)
        nb_graph_replay(g_chain, NULL, NULL);
}

/* Whether the captured chain's output has the eager chain's bits. */
static bool fused_matches(float *h1, float *h2)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *replayed = NULL;
    nb_graph_replay(g_chain, NULL, &replayed);
    size_t bytes = (size_t)N * sizeof(float);
    bool same = !nb_tensor_read(replayed, h1, bytes) && !nb_tensor_read(run_op(K_CHAIN), h2, bytes) &&
                !memcmp(h1, h2, bytes);
    nb_scope_end(s);
    return same;
}

/* Median milliseconds per op of that kind, timed in batches of B. */
static double median_ms(int kind)
{
    return bench_median_ms(op_batch, &kind, 3, R) / B;
}

/* Leaves a few blocks of the output's size full of NaN in the allocator's cache,
 * so that an output the op fails to write shows up in the check. */
static void poison(void)
{
    nb_tensor *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = nb_full(NB_F32, NB_SHAPE(N), NAN);
    for (int i = 0; i < 4; i++)
        nb_release(p[i]);
}

/* ||out - ref|| / ||ref|| of one op, the reference in double from the host
 * copies of the inputs. NaN when any output element is NaN. */
static double check(int kind, const float *ha, const float *hb, const float *hc, float *hout)
{
    poison();
    nb_scope *s = nb_scope_begin();
    nb_tensor *y = run_op(kind);
    nb_tensor_read(y, hout, (size_t)N * sizeof(float));
    nb_scope_end(s);
    double num = 0, den = 0;
    for (int64_t i = 0; i < N; i++) {
        double r = kind == K_COPY    ? ha[i]
                   : kind == K_SCALE ? 2.0 * ha[i]
                   : kind == K_ADD   ? (double)ha[i] + hb[i]
                                     : exp(((double)ha[i] + hb[i]) * hc[i]);
        double d = hout[i] - r;
        if (isnan(hout[i]))
            return NAN;
        num += d * d;
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* One row of the GB/s table: both sides' rate and share of the ceiling. */
static void gbs_row(const char *what, double bytes, double ours_ms, double theirs_ms, double roof)
{
    double ours = bytes / (ours_ms * 1e-3) / 1e9;
    if (theirs_ms > 0) {
        double theirs = bytes / (theirs_ms * 1e-3) / 1e9;
        printf("%-40s %10.1f %6.1f%% %10.1f %6.1f%%\n", what, ours, 100 * ours / roof, theirs,
               100 * theirs / roof);
    } else {
        printf("%-40s %10.1f %6.1f%% %10s %7s\n", what, ours, 100 * ours / roof, "-", "-");
    }
}

int main(int argc, char **argv)
{
    int mib = 256;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_NUMBER("--mib", "M", &mib, 1), BENCH_NUMBER("--batch", "B", &B, 1), BENCH_REPS(&R),
                  BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    nb_gpu_properties props;
    if (!bench_gpu_ready(&props))
        return bench_no_gpu(TITLE, nb_gpu_unavailable_reason());
    nb_device_push("/gpu:0");

    N = (int64_t)mib * (1 << 20) / (int64_t)sizeof(float);
    a = nb_random_uniform(NB_F32, NB_SHAPE(N), -1, 1, 1);
    b = nb_random_uniform(NB_F32, NB_SHAPE(N), -1, 1, 2);
    c = nb_random_uniform(NB_F32, NB_SHAPE(N), -1, 1, 3);

    /* Correct first: each op against a double reference. */
    size_t bytes = (size_t)N * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes), *hout = malloc(bytes);
    if (!ha || !hb || !hc || !hout) {
        fprintf(stderr, "gpu_bandwidth: no host memory for the check (try --mib 64)\n");
        return 1;
    }
    nb_tensor_read(a, ha, bytes);
    nb_tensor_read(b, hb, bytes);
    nb_tensor_read(c, hc, bytes);
    nb_tensor *first = NULL;
    nb_graph_capture("/gpu:0", chain_step, NULL, 3, (nb_tensor *[]){a, b, c}, 1, &first, &g_chain);
    nb_release(first);
    bool fused_same = fused_matches(ha, hout);
    const char *names[4] = {"copy", "x * 2", "a + b", "exp((a + b) * c)"};
    double err[4];
    bool ok = true;
    for (int k = 0; k < 4; k++) {
        err[k] = check(k, ha, hb, hc, hout);
        ok = ok && err[k] < 1e-5; /* NaN fails too */
    }
    free(ha);
    free(hb);
    free(hc);
    free(hout);

    double t_copy = median_ms(K_COPY);
    double t_scale = median_ms(K_SCALE);
    double t_add = median_ms(K_ADD);
    double t_chain = median_ms(K_CHAIN);
    double t_fused = bench_median_ms(replay_batch, NULL, 3, R) / B;
    int64_t fused_nodes = nb_graph_nodes(g_chain);
    nb_graph_free(g_chain);

    bench_peer p;
    if (peer)
        nb_gpu_empty_cache("/gpu:0"); /* leave the card's memory to PyTorch */
    bench_peer_run(&p, peer, "gpu_bandwidth.py", "%d %d %d", mib, B, R);
    char title[512];
    snprintf(title, sizeof title,
             "%s (%s), f32 tensors of %d MiB\n(median of %d batches of %d ops, warm-up first, "
             "host clock between two synchronizes)",
             TITLE, props.name, mib, R, B);
    bench_header(title, "milliseconds per op", &p);
    bench_row("copy: nb_cast to f32 (cudaMemcpyAsync)", t_copy, bench_peer_get(&p, "copy"));
    bench_row("x * 2 (nb_mul_scalar)", t_scale, bench_peer_get(&p, "scale"));
    bench_row("a + b (nb_add)", t_add, bench_peer_get(&p, "add"));
    bench_row("exp((a + b) * c): 3 ops", t_chain, bench_peer_get(&p, "chain"));
    bench_row("the same, captured (fused)", t_fused, bench_peer_get(&p, "chain"));

    /* The ceiling: the faster of the two copies (both one cudaMemcpyAsync). */
    double tb = (double)bytes;
    double roof = 2 * tb / (t_copy * 1e-3) / 1e9;
    double their_copy = bench_peer_get(&p, "copy");
    if (their_copy > 0 && 2 * tb / (their_copy * 1e-3) / 1e9 > roof)
        roof = 2 * tb / (their_copy * 1e-3) / 1e9;
    printf("\nGB/s, bytes read + written; %% of the copy ceiling, %.1f GB/s (the faster copy)\n", roof);
    printf("%-40s %10s %7s %10s %7s\n", "", "nabla", "%", "PyTorch", "%");
    gbs_row("copy (1 read, 1 write)", 2 * tb, t_copy, their_copy, roof);
    gbs_row("x * 2 (1 read, 1 write)", 2 * tb, t_scale, bench_peer_get(&p, "scale"), roof);
    gbs_row("a + b (2 reads, 1 write)", 3 * tb, t_add, bench_peer_get(&p, "add"), roof);
    gbs_row("exp((a + b) * c) (5 reads, 3 writes)", 8 * tb, t_chain, bench_peer_get(&p, "chain"), roof);
    gbs_row("the same, captured (3 reads, 1 write)", 4 * tb, t_fused, -1, roof);
    printf("(the captured chain: %lld kernel%s, %s the eager chain's bits; 4 tensors at the ceiling: %.3f ms)\n",
           (long long)fused_nodes, fused_nodes == 1 ? "" : "s", fused_same ? "the same as" : "NOT",
           4 * tb / (roof * 1e9) * 1e3);
    printf("check, ||nabla - f64 reference|| / ||reference||:");
    for (int k = 0; k < 4; k++)
        printf("%s %s %.1e", k ? "," : "", names[k], err[k]);
    ok = ok && fused_same;
    printf("\n%s\n", ok ? "(all under 1e-5)" : "CHECK FAILED: an output is wrong; the times above mean nothing");

    nb_release(a);
    nb_release(b);
    nb_release(c);
    nb_device_pop();
    return ok ? 0 : 1;
}
