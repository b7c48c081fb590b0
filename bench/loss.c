/* Sparse softmax cross-entropy, f32: the mean loss over logits [64, 10] (a
 * small classifier's batch), [4096, 1000] and [256, 32000] (a vocabulary),
 * forward alone and forward+backward (a tape's gradient for the logits), in
 * milliseconds, on /cpu:0 and on /gpu:0 when there is one, beside PyTorch's
 * F.cross_entropy from Python (bench/loss.py) in the same run.
 *
 *   loss [--reps R] [--no-peer]
 *
 * Each figure is the median over R runs after a warm-up; a GPU run ends with
 * nb_synchronize() (torch.cuda.synchronize()). Before timing, nabla's loss is
 * checked against a double-precision reference on a few rows. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define WARM 3

typedef struct xent_case {
    const char *name;
    int64_t rows, classes;
} xent_case;

static const xent_case cases[] = {{"ce64x10", 64, 10}, {"ce4096x1000", 4096, 1000}, {"ce256x32000", 256, 32000}};
#define N_CASES (int)(sizeof cases / sizeof *cases)

typedef struct xent_run {
    nb_tensor *x, *labels;
} xent_run;

static void xent_forward(void *ctx)
{
    xent_run *r = ctx;
    nb_mean_all(nb_sparse_softmax_cross_entropy(r->x, r->labels));
}

static void xent_step(void *ctx)
{
    xent_run *r = ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, r->x);
    nb_tensor *g;
    nb_tape_gradient(tape, nb_mean_all(nb_sparse_softmax_cross_entropy(r->x, r->labels)), 1, &r->x, &g);
    nb_tape_free(tape);
}

/* The largest absolute error of the per-row loss on a few rows, against double. */
static double xent_check(nb_tensor *loss, nb_tensor *x, nb_tensor *labels, int64_t rows, int64_t C)
{
    double worst = 0;
    for (int t = 0; t < 4; t++) {
        int64_t r = (t * 37) % rows;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, nb_tensor_get(x, r * C + j));
        for (int64_t j = 0; j < C; j++)
            s += exp(nb_tensor_get(x, r * C + j) - m);
        double want = m + log(s) - nb_tensor_get(x, r * C + (int64_t)nb_tensor_get(labels, r));
        double e = fabs(nb_tensor_get(loss, r) - want);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* Median milliseconds of the forward (step false) or forward+backward. */
static double time_case(const char *device, const xent_case *c, int reps, bool step, double *err)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(c->rows, c->classes), 0, 2, 1);
    nb_tensor *labels = nb_cast(nb_random_uniform(NB_F32, NB_SHAPE(c->rows), 0, (double)c->classes - 0.5, 2), NB_I64);
    if (err) {
        nb_scope *s = nb_scope_begin();
        *err = xent_check(nb_sparse_softmax_cross_entropy(x, labels), x, labels, c->rows, c->classes);
        nb_scope_end(s);
    }
    xent_run run = {x, labels};
    double ms = bench_median_ms(step ? xent_step : xent_forward, &run, WARM, reps);
    nb_device_pop();
    nb_scope_end(outer);
    return ms;
}

static int run_device(const char *device, const char *peer_prefix, int reps, const bench_peer *p)
{
    char title[160], what[96], key[64];
    snprintf(title, sizeof title, "Sparse softmax cross-entropy (mean) on %s, f32 (median of %d)", device, reps);
    bench_header(title, "milliseconds", p);
    int bad = 0;
    for (int i = 0; i < N_CASES; i++) {
        const xent_case *c = &cases[i];
        double err;
        double fwd = time_case(device, c, reps, false, &err);
        if (!(err < 1e-4)) {
            printf("[%lld, %lld]: nabla's loss is off by %g\n", (long long)c->rows, (long long)c->classes, err);
            bad = 1;
        }
        snprintf(what, sizeof what, "[%lld, %lld] forward", (long long)c->rows, (long long)c->classes);
        snprintf(key, sizeof key, "%s.%s.fwd", peer_prefix, c->name);
        bench_row(what, fwd, bench_peer_get(p, key));
        double step = time_case(device, c, reps, true, NULL);
        snprintf(what, sizeof what, "[%lld, %lld] fwd+bwd", (long long)c->rows, (long long)c->classes);
        snprintf(key, sizeof key, "%s.%s.step", peer_prefix, c->name);
        bench_row(what, step, bench_peer_get(p, key));
    }
    return bad;
}

int main(int argc, char **argv)
{
    int reps = 20;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    bench_peer p;
    bench_peer_run(&p, peer, "loss.py", "%d", reps);
    int bad = run_device("/cpu:0", "cpu", reps, &p);
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return bench_no_gpu("Sparse softmax cross-entropy on /gpu:0", nb_gpu_unavailable_reason()) || bad;
    return run_device("/gpu:0", "cuda", reps, &p) || bad;
}
