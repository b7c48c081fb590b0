/* Pipeline parallelism's throughput: the training step (sparse softmax
 * cross-entropy, SGD 0.01) of an MLP 784-H-H-H-10 whose first layer sits on
 * one device and the other three on a second, run
 *   - on one device (every layer on the first: the reference),
 *   - model-parallel, plain (each layer under nb_device_push of its device:
 *     one thread, one device busy at a time),
 *   - pipelined through nb_pipeline with GPipe and with 1F1B, M = 2, 4, 8
 *     micro-batches,
 * printing steps per second, each against the plain model-parallel step, the
 * pipeline's bubble (measured on the last step, and the schedule's ideal
 * (S-1)/(M+S-1)) and the most micro-batches stage 0 held at once.
 *
 *   pipeline_step [--reps R] [--batch B] [--hidden H] [--no-peer]
 *
 * The devices are two logical GPUs of the first GPU where there is one, else
 * two logical CPU devices (which share the machine's cores: the plain step's
 * kernels use every core, each stage's only its own thread's). There is no
 * PyTorch peer (PyTorch has no eager pipeline of its own to compare with:
 * torch.distributed.pipelining needs processes); --no-peer is accepted for
 * bench/run.sh. Figures come from the median step over R steps (default 30)
 * after a warm-up; the configurations take turns in rounds. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define WARM 5
#define ROUNDS 3
#define LAYERS 4

static const char *devs[2];
static int64_t sizes[LAYERS + 1] = {784, 512, 512, 512, 10};

typedef struct model {
    nb_variable *v[2 * LAYERS];
    nb_tensor *x, *y; /* the batch, fixed, on the first device */
    bool split;       /* layers 2-4 on the second device */
    nb_optimizer *opt;
    nb_pipeline *p; /* NULL: no pipeline */
    int m;
} model;

static const char *device_of(const model *m, int layer) { return devs[m->split && layer > 0 ? 1 : 0]; }

static void model_init(model *m, bool split, int64_t batch)
{
    m->split = split;
    int64_t *labels = malloc(sizeof *labels * (size_t)batch);
    for (int64_t i = 0; i < batch; i++)
        labels[i] = (i * 7 + 3) % 10;
    nb_device_push(devs[0]);
    m->x = nb_random_normal(NB_F32, NB_SHAPE(batch, 784), 0, 1, 1); /* no scope open: ours */
    m->y = nb_from_buffer(NB_I64, NB_SHAPE(batch), labels);
    nb_device_pop();
    free(labels);
    nb_scope *sc = nb_scope_begin();
    for (int l = 0; l < LAYERS; l++) {
        nb_device_push(device_of(m, l));
        m->v[2 * l] = nb_variable_new("w", nb_random_normal(NB_F32, NB_SHAPE(sizes[l], sizes[l + 1]), 0,
                                                             sqrt(2.0 / (double)sizes[l]), 2 + (uint64_t)l));
        m->v[2 * l + 1] = nb_variable_new("b", nb_zeros(NB_F32, NB_SHAPE(sizes[l + 1])));
        nb_device_pop();
    }
    nb_scope_end(sc);
    m->opt = nb_sgd_new(0.01);
    m->p = NULL;
}

static void model_free(model *m)
{
    for (int i = 0; i < 2 * LAYERS; i++)
        nb_variable_free(m->v[i]);
    nb_release(m->x);
    nb_release(m->y);
    nb_optimizer_free(m->opt);
    nb_pipeline_free(m->p);
}

static nb_tensor *layers(const model *m, int first, int last, nb_tensor *x)
{
    for (int l = first; l < last; l++) {
        x = nb_add(nb_matmul(x, nb_read(m->v[2 * l])), nb_read(m->v[2 * l + 1]));
        if (l < LAYERS - 1)
            x = nb_relu(x);
    }
    return x;
}

/* The plain step: each layer under its device, one tape, one update. */
static void plain_step(void *ctx)
{
    model *m = ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *x = m->x;
    for (int l = 0; l < LAYERS; l++) {
        nb_device_push(device_of(m, l));
        x = layers(m, l, l + 1, x);
        nb_device_pop();
    }
    nb_device_push(device_of(m, LAYERS - 1));
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(x, m->y));
    nb_device_pop();
    nb_tensor *g[2 * LAYERS];
    nb_tape_gradient_vars(tape, loss, 2 * LAYERS, m->v, g);
    nb_optimizer_apply(m->opt, 2 * LAYERS, m->v, g);
}

static nb_status first_stage(nb_stage *st, nb_tensor *x, nb_tensor **y, void *m)
{
    (void)st;
    *y = layers(m, 0, 1, x);
    return *y ? NB_OK : nb_error();
}

static nb_status last_stage(nb_stage *st, nb_tensor *x, nb_tensor **y, void *m)
{
    *y = nb_mean_all(nb_sparse_softmax_cross_entropy(layers(m, 1, LAYERS, x), nb_stage_input(st, 1)));
    return *y ? NB_OK : nb_error();
}

static void pipelined_step(void *ctx)
{
    model *m = ctx;
    nb_pipeline_step(m->p, m->opt, m->m, NB_TENSORS(m->x, m->y), NB_REDUCE_MEAN, NULL);
}

#define CONFIGS 8

int main(int argc, char **argv)
{
    int reps = 30, batch = 256, hidden = 512;
    bool run_peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NUMBER("--batch", "B", &batch, 8),
                  BENCH_NUMBER("--hidden", "H", &hidden, 1), BENCH_NO_PEER(&run_peer));
    (void)run_peer;
    bool gpu = nb_physical_gpu_count() > 0;
    if ((gpu ? nb_set_logical_gpu_devices(2) : nb_set_logical_cpu_devices(2)) != NB_OK) {
        fprintf(stderr, "pipeline_step: %s\n", nb_error_message());
        return 1;
    }
    nb_set_error_handler(nb_error_handler_exit, NULL);
    devs[0] = gpu ? "/gpu:0" : "/cpu:0";
    devs[1] = gpu ? "/gpu:1" : "/cpu:1";
    for (int l = 1; l < LAYERS; l++)
        sizes[l] = hidden;

    const char *names[CONFIGS] = {"one device", "model-parallel", "GPipe M=2", "GPipe M=4",
                                  "GPipe M=8",  "1F1B M=2",       "1F1B M=4",  "1F1B M=8"};
    model models[CONFIGS];
    for (int c = 0; c < CONFIGS; c++) {
        model *m = &models[c];
        model_init(m, c > 0, batch);
        if (c >= 2) {
            m->m = 1 << (1 + (c - 2) % 3);
            m->p = nb_pipeline_new(2, devs);
            nb_pipeline_set_stage(m->p, 0, first_stage, m, 2, m->v);
            nb_pipeline_set_stage(m->p, 1, last_stage, m, 2 * LAYERS - 2, m->v + 2);
            nb_pipeline_set_schedule(m->p, c < 5 ? NB_PIPELINE_GPIPE : NB_PIPELINE_1F1B);
        }
    }
    printf("pipeline_step: MLP 784-%d-%d-%d-10, batch %d, layer 1 on %s, layers 2-4 on %s%s\n", hidden, hidden,
           hidden, batch, devs[0], devs[1], gpu ? "" : " (logical CPU devices)");
    /* Rounds of every configuration in turn; the best round's median each. */
    double ms[CONFIGS];
    for (int c = 0; c < CONFIGS; c++)
        ms[c] = INFINITY;
    for (int r = 0; r < ROUNDS; r++)
        for (int c = 0; c < CONFIGS; c++) {
            double t = bench_median_ms(c < 2 ? plain_step : pipelined_step, &models[c], WARM, reps);
            ms[c] = t < ms[c] ? t : ms[c];
        }
    printf("  %-16s %10s %10s %10s %9s %9s %9s\n", "", "ms/step", "steps/s", "vs plain", "bubble", "ideal",
           "held");
    for (int c = 0; c < CONFIGS; c++) {
        printf("  %-16s %10.2f %10.1f %9.2fx", names[c], ms[c], 1e3 / ms[c], ms[1] / ms[c]);
        if (models[c].p) {
            nb_pipeline_stats s;
            nb_pipeline_get_stats(models[c].p, &s);
            printf(" %9.2f %9.2f %9d", s.bubble, s.ideal_bubble, s.stage_peak_in_flight[0]);
        }
        printf("\n");
    }
    printf("  (bubble: 1 - mean stage busy time / step time, on the last step; held: micro-batches\n"
           "   whose activations stage 0 kept at once)\n");
    for (int c = 0; c < CONFIGS; c++)
        model_free(&models[c]);
    return 0;
}
