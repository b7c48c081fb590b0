/* Normalisation, f32: layer_norm over the last axis of [64, 512] and
 * [4096, 768] with gamma and beta, forward alone and forward+backward (a
 * tape's gradients for x, gamma and beta, seeded with a fixed output
 * gradient), and batch_norm_infer's forward on NHWC [32, 28, 28, 64] (PyTorch:
 * channels-last), in milliseconds, on /cpu:0 and on /gpu:0 when there is one,
 * beside PyTorch eager from Python (bench/norm.py) in the same run.
 *
 *   norm [--reps R] [--no-peer]
 *
 * Each figure is the median over R runs after a warm-up; a GPU run ends with
 * nb_synchronize() (torch.cuda.synchronize()). Before timing, nabla's forward
 * is checked against a double-precision reference on a few rows. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>
#include <nabla/nn.h>

#define WARM 3

typedef struct ln_case {
    const char *name;
    int64_t rows, dim;
} ln_case;

static const ln_case ln_cases[] = {{"ln64x512", 64, 512}, {"ln4096x768", 4096, 768}};
#define N_LN (int)(sizeof ln_cases / sizeof *ln_cases)

/* The largest absolute error of layer_norm's y on a few rows of x, against a
 * reference in double. */
static double ln_check(nb_tensor *y, nb_tensor *x, nb_tensor *g, nb_tensor *b, int64_t rows, int64_t D)
{
    double worst = 0;
    for (int t = 0; t < 4; t++) {
        int64_t r = (t * 37) % rows;
        double s = 0, ss = 0;
        for (int64_t j = 0; j < D; j++)
            s += nb_tensor_get(x, r * D + j);
        double mu = s / (double)D;
        for (int64_t j = 0; j < D; j++) {
            double d = nb_tensor_get(x, r * D + j) - mu;
            ss += d * d;
        }
        double rstd = 1 / sqrt(ss / (double)D + 1e-5);
        for (int64_t j = 0; j < D; j++) {
            double want = (nb_tensor_get(x, r * D + j) - mu) * rstd * nb_tensor_get(g, j) + nb_tensor_get(b, j);
            double e = fabs(nb_tensor_get(y, r * D + j) - want);
            if (!(e <= worst))
                worst = isnan(e) ? INFINITY : e;
        }
    }
    return worst;
}

typedef struct ln_run {
    nb_tensor *x, *g, *b, *gy; /* gy: the output gradient */
} ln_run;

static void ln_forward(void *ctx)
{
    ln_run *r = ctx;
    nb_layer_norm(r->x, r->g, r->b, 1, 1e-5);
}

/* The forward and a tape's gradients for x, gamma and beta. */
static void ln_step(void *ctx)
{
    ln_run *r = ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, r->x);
    nb_tape_watch(tape, r->g);
    nb_tape_watch(tape, r->b);
    nb_tensor *y = nb_layer_norm(r->x, r->g, r->b, 1, 1e-5), *gr[3];
    nb_tape_gradient_ex(tape, y, r->gy, 3, (nb_tensor *const[]){r->x, r->g, r->b}, gr, NB_UNCONNECTED_NULL);
}

/* Median milliseconds of fn's forward ([0]) and, when step, forward+backward
 * ([1]). */
static double time_ln(const char *device, const ln_case *c, int reps, int mode, double *err)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(c->rows, c->dim), -2, 3, 1);
    nb_tensor *g = nb_random_uniform(NB_F32, NB_SHAPE(c->dim), 0.5, 1.5, 2);
    nb_tensor *b = nb_random_uniform(NB_F32, NB_SHAPE(c->dim), -1, 1, 3);
    nb_tensor *gy = nb_random_uniform(NB_F32, NB_SHAPE(c->rows, c->dim), -1, 1, 4);
    if (err) {
        nb_scope *s = nb_scope_begin();
        *err = ln_check(nb_layer_norm(x, g, b, 1, 1e-5), x, g, b, c->rows, c->dim);
        nb_scope_end(s);
    }
    ln_run run = {x, g, b, gy};
    double ms = bench_median_ms(mode == 0 ? ln_forward : ln_step, &run, WARM, reps);
    nb_device_pop();
    nb_scope_end(outer);
    return ms;
}

typedef struct bn_run {
    nb_tensor *x, *g, *b, *mean, *var;
} bn_run;

static void bn_forward(void *ctx)
{
    bn_run *r = ctx;
    nb_batch_norm_infer(r->x, r->g, r->b, r->mean, r->var, 1e-5, NB_NHWC);
}

/* batch_norm_infer's forward on NHWC [32, 28, 28, 64]: median milliseconds;
 * *err the largest absolute error on a few pixels against double. */
static double time_bn(const char *device, int reps, double *err)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    const int64_t C = 64;
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(32, 28, 28, C), -2, 3, 1);
    nb_tensor *g = nb_random_uniform(NB_F32, NB_SHAPE(C), 0.5, 1.5, 2);
    nb_tensor *b = nb_random_uniform(NB_F32, NB_SHAPE(C), -1, 1, 3);
    nb_tensor *m = nb_random_uniform(NB_F32, NB_SHAPE(C), -1, 1, 4);
    nb_tensor *var = nb_random_uniform(NB_F32, NB_SHAPE(C), 0.5, 2, 5);
    {
        nb_scope *s = nb_scope_begin();
        nb_tensor *y = nb_batch_norm_infer(x, g, b, m, var, 1e-5, NB_NHWC);
        *err = 0;
        for (int64_t t = 0; t < 64; t++) {
            int64_t i = (t * 7919 * C) % nb_tensor_numel(x) + t % C, c = i % C;
            double want = (nb_tensor_get(x, i) - nb_tensor_get(m, c)) / sqrt(nb_tensor_get(var, c) + 1e-5) *
                              nb_tensor_get(g, c) +
                          nb_tensor_get(b, c);
            double e = fabs(nb_tensor_get(y, i) - want);
            if (!(e <= *err))
                *err = isnan(e) ? INFINITY : e;
        }
        nb_scope_end(s);
    }
    bn_run run = {x, g, b, m, var};
    double ms = bench_median_ms(bn_forward, &run, WARM, reps);
    nb_device_pop();
    nb_scope_end(outer);
    return ms;
}

static int run_device(const char *device, const char *peer_prefix, int reps, const bench_peer *p)
{
    char title[160], what[96], key[64];
    snprintf(title, sizeof title, "Normalisation on %s, f32 (median of %d)", device, reps);
    bench_header(title, "milliseconds", p);
    int bad = 0;
    for (int i = 0; i < N_LN; i++) {
        const ln_case *c = &ln_cases[i];
        double err;
        double fwd = time_ln(device, c, reps, 0, &err);
        if (!(err < 1e-4)) {
            printf("layer_norm [%lld, %lld]: nabla's forward is off by %g\n", (long long)c->rows, (long long)c->dim,
                   err);
            bad = 1;
        }
        snprintf(what, sizeof what, "layer_norm [%lld, %lld] forward", (long long)c->rows, (long long)c->dim);
        snprintf(key, sizeof key, "%s.%s.fwd", peer_prefix, c->name);
        bench_row(what, fwd, bench_peer_get(p, key));
        double step = time_ln(device, c, reps, 1, NULL);
        snprintf(what, sizeof what, "layer_norm [%lld, %lld] fwd+bwd", (long long)c->rows, (long long)c->dim);
        snprintf(key, sizeof key, "%s.%s.step", peer_prefix, c->name);
        bench_row(what, step, bench_peer_get(p, key));
    }
    double err;
    double bn = time_bn(device, reps, &err);
    if (!(err < 1e-4)) {
        printf("batch_norm_infer: nabla's forward is off by %g\n", err);
        bad = 1;
    }
    snprintf(key, sizeof key, "%s.bn_infer.fwd", peer_prefix);
    bench_row("batch_norm_infer [32,28,28,64] NHWC", bn, bench_peer_get(p, key));
    return bad;
}

int main(int argc, char **argv)
{
    int reps = 20;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);
    bench_peer p;
    bench_peer_run(&p, peer, "norm.py", "%d", reps);
    int bad = run_device("/cpu:0", "cpu", reps, &p);
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return bench_no_gpu("Normalisation on /gpu:0", nb_gpu_unavailable_reason()) || bad;
    return run_device("/gpu:0", "cuda", reps, &p) || bad;
}
