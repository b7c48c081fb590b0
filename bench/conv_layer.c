/* 2-D convolution layers at 56x56 with 64 channels, f32 NHWC (PyTorch:
 * channels-last), SAME padding, stride 1: 3x3 64->64, 1x1 64->64 and 3x3
 * depthwise 64. Forward alone and forward+backward (a tape's gradients for
 * the image and the filter, seeded with a fixed output gradient), in GFLOP/s
 * (2 N P Q K R S C/G per pass, three passes for forward+backward), on /cpu:0
 * and on /gpu:0 when there is one, beside PyTorch eager from Python
 * (bench/conv_layer.py) in the same run.
 *
 *   conv_layer [--reps R] [--cpu-batch B] [--gpu-batch B] [--plain] [--no-peer]
 *
 * Batch 32 on a GPU; batch 8 on the CPU by default (32 takes long on small
 * machines). --plain runs nabla's CPU convolutions on the im2col path instead
 * of oneDNN (NB_CONV_PLAIN=1). Each figure is the median over R runs after a
 * warm-up; a GPU run ends with nb_synchronize() (torch.cuda.synchronize()).
 * Before timing, nabla's forward is checked against a double-precision direct
 * convolution at a few output points. TF32 is off on both sides. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>
#include <nabla/nn.h>

#define WARM 3

typedef struct layer {
    const char *name, *label;
    int k, groups;
} layer;

static const layer layers[] = {
    {"3x3", "3x3 64->64", 3, 1},
    {"1x1", "1x1 64->64", 1, 1},
    {"dw3x3", "3x3 depthwise 64", 3, 64},
};
#define N_LAYERS (int)(sizeof layers / sizeof *layers)

static double flops(int batch, const layer *l)
{
    return 2.0 * batch * 56 * 56 * 64 * l->k * l->k * (64 / l->groups);
}

/* nabla's forward at a few points against a direct sum in double: the largest
 * relative error. */
static double check(nb_tensor *y, nb_tensor *x, nb_tensor *w, const layer *l)
{
    double worst = 0;
    int64_t B = nb_tensor_shape(x).dims[0];
    for (int t = 0; t < 16; t++) {
        int64_t n = t % B, p = (t * 13) % 56, q = (t * 29 + 5) % 56, k = (t * 7) % 64;
        int64_t cg = 64 / l->groups, g = k / (64 / l->groups);
        double s = 0, mag = 0;
        for (int r = 0; r < l->k; r++)
            for (int c2 = 0; c2 < l->k; c2++) {
                int64_t h = p - l->k / 2 + r, ww = q - l->k / 2 + c2;
                if (h < 0 || h >= 56 || ww < 0 || ww >= 56)
                    continue;
                for (int64_t c = 0; c < cg; c++) {
                    double a = nb_tensor_get(x, ((n * 56 + h) * 56 + ww) * 64 + g * cg + c);
                    double b = nb_tensor_get(w, ((r * l->k + c2) * cg + c) * 64 + k);
                    s += a * b;
                    mag += fabs(a * b);
                }
            }
        double got = nb_tensor_get(y, ((n * 56 + p) * 56 + q) * 64 + k);
        double e = fabs(got - s) / (mag + 1e-30);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

typedef struct conv_run {
    nb_tensor *x, *w, *gy; /* gy: the output gradient */
    const nb_conv2d_opts *o;
} conv_run;

static void conv_forward(void *ctx)
{
    conv_run *r = ctx;
    nb_conv2d(r->x, r->w, r->o);
}

/* The forward and a tape's gradients for the image and the filter. */
static void conv_step(void *ctx)
{
    conv_run *r = ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, r->x);
    nb_tape_watch(tape, r->w);
    nb_tensor *y = nb_conv2d(r->x, r->w, r->o), *g[2];
    nb_tape_gradient_ex(tape, y, r->gy, 2, (nb_tensor *const[]){r->x, r->w}, g, NB_UNCONNECTED_NULL);
}

/* Median milliseconds of the forward ([0]) and forward+backward ([1]). */
static void bench_layer(const char *device, int batch, const layer *l, int reps, double out[2], double *err)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(batch, 56, 56, 64), 0, 1, 1);
    nb_tensor *w = nb_random_uniform(NB_F32, NB_SHAPE(l->k, l->k, 64 / l->groups, 64), -0.5, 0.5, 2);
    nb_tensor *gy = nb_random_uniform(NB_F32, NB_SHAPE(batch, 56, 56, 64), 0, 1, 3);
    nb_conv2d_opts o = {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, l->groups, NB_NHWC};
    {
        nb_scope *s = nb_scope_begin();
        *err = check(nb_conv2d(x, w, &o), x, w, l);
        nb_scope_end(s);
    }
    conv_run run = {x, w, gy, &o};
    out[0] = bench_median_ms(conv_forward, &run, WARM, reps);
    out[1] = bench_median_ms(conv_step, &run, WARM, reps);
    nb_device_pop();
    nb_scope_end(outer);
}

static void row(const char *what, double gf, double peer_ms, double fl)
{
    if (peer_ms > 0) {
        double pg = fl / (peer_ms * 1e6);
        printf("%-40s %10.1f %10.1f %9.2fx\n", what, gf, pg, gf / pg);
    } else {
        printf("%-40s %10.1f %10s %10s\n", what, gf, "-", "-");
    }
}

static int run_device(const char *device, const char *peer_prefix, int batch, int reps, const bench_peer *p)
{
    char title[160];
    snprintf(title, sizeof title, "Conv2d layers on %s, f32 NHWC 56x56x64, batch %d, SAME (median of %d)", device,
             batch, reps);
    bench_header(title, "GFLOP/s", p);
    printf("%-40s %10s %10s %10s\n", "", "", "", "nabla/torch");
    int bad = 0;
    for (int i = 0; i < N_LAYERS; i++) {
        const layer *l = &layers[i];
        double ms[2], err;
        bench_layer(device, batch, l, reps, ms, &err);
        if (!(err < 1e-4)) {
            printf("%s: nabla's forward is off by %g (relative)\n", l->label, err);
            bad = 1;
        }
        double fl = flops(batch, l);
        char what[96], key[64];
        snprintf(what, sizeof what, "%s forward", l->label);
        snprintf(key, sizeof key, "%s.%s.fwd", peer_prefix, l->name);
        row(what, fl / (ms[0] * 1e6), bench_peer_get(p, key), fl);
        snprintf(what, sizeof what, "%s forward+backward", l->label);
        snprintf(key, sizeof key, "%s.%s.step", peer_prefix, l->name);
        row(what, 3 * fl / (ms[1] * 1e6), bench_peer_get(p, key), 3 * fl);
    }
    return bad;
}

int main(int argc, char **argv)
{
    int reps = 10, cpu_batch = 8, gpu_batch = 32;
    bool peer = true, plain = false;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NUMBER("--cpu-batch", "B", &cpu_batch, 1),
                  BENCH_NUMBER("--gpu-batch", "B", &gpu_batch, 1), BENCH_FLAG("--plain", &plain, true),
                  BENCH_NO_PEER(&peer));
    if (plain)
        setenv("NB_CONV_PLAIN", "1", 1);
    nb_set_error_handler(nb_error_handler_exit, NULL);
    bench_peer p;
    bench_peer_run(&p, peer, "conv_layer.py", "%d %d %d", cpu_batch, gpu_batch, reps);
    int bad = run_device("/cpu:0", "cpu", cpu_batch, reps, &p);
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return bench_no_gpu("Conv2d layers on /gpu:0", nb_gpu_unavailable_reason()) || bad;
    return run_device("/gpu:0", "cuda", gpu_batch, reps, &p) || bad;
}
