/* Data-parallel training throughput: the step of bench/mlp_step.c's MLP
 * (784-256-10, sparse softmax cross-entropy, SGD 0.01) at one global batch,
 * through the mirrored strategy on 1, 2 and 4 replicas (2 also captured once
 * and replayed: nb_mirrored_capture), beside the plain step on
 * one device without a strategy, and beside PyTorch on the CPU in one process
 * and with DistributedDataParallel over two processes (gloo, one thread each,
 * half the batch each; bench/mirrored_step_ddp.py).
 *
 *   mirrored_step [--reps R] [--batch B] [--no-peer]
 *
 * The replicas are GPUs when there are any (as many as there are), else logical
 * CPU devices. Figures are images of the global batch per second, from the
 * median step over R steps (default 100) after a warm-up; each step ends with
 * nb_synchronize(). The configurations take turns in rounds. */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define WARM 20
#define ROUNDS 5

typedef struct model {
    nb_variable *p[4];
    nb_tensor *x, *y; /* the global batch, fixed */
} model;

/* The variables of the MLP (mirrored over s, or plain on the current device). */
static void model_init(model *m, nb_mirrored *s, int64_t batch)
{
    int64_t *labels = malloc(sizeof *labels * (size_t)batch);
    for (int64_t i = 0; i < batch; i++)
        labels[i] = (i * 7 + 3) % 10;
    m->x = nb_random_normal(NB_F32, NB_SHAPE(batch, 784), 0, 1, 1); /* no scope open: ours */
    m->y = nb_from_buffer(NB_I64, NB_SHAPE(batch), labels);
    free(labels);
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    nb_scope *sc = nb_scope_begin();
    nb_tensor *init[4] = {
        nb_random_normal(NB_F32, NB_SHAPE(784, 256), 0, sqrt(2.0 / 784), 2),
        nb_zeros(NB_F32, NB_SHAPE(256)),
        nb_random_normal(NB_F32, NB_SHAPE(256, 10), 0, sqrt(1.0 / 256), 3),
        nb_zeros(NB_F32, NB_SHAPE(10)),
    };
    for (int i = 0; i < 4; i++)
        m->p[i] = s ? nb_mirrored_variable_new(s, names[i], init[i]) : nb_variable_new(names[i], init[i]);
    nb_scope_end(sc);
}

static void model_free(model *m)
{
    for (int i = 0; i < 4; i++)
        nb_variable_free(m->p[i]);
    nb_release(m->x);
    nb_release(m->y);
}

static nb_tensor *loss_of(nb_tensor *x, nb_tensor *y, nb_variable *const *p)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
    nb_tensor *logits = nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3]));
    return nb_mean_all(nb_sparse_softmax_cross_entropy(logits, y));
}

static nb_status replica_step(nb_replica *r, int n_inputs, nb_tensor *const *in, int n_vars,
                              nb_variable *const *vars, nb_tensor **loss, nb_tensor **grads,
                              void *user)
{
    (void)r, (void)n_inputs, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = loss_of(in[0], in[1], vars);
    return nb_tape_gradient_vars(tape, *loss, n_vars, vars, grads);
}

/* One configuration: a model and its optimizer, stepped through the strategy s,
 * or plainly on one device when s is NULL. */
typedef struct config {
    nb_mirrored *s;
    const char *device; /* where the batch lives */
    model m;
    nb_optimizer *opt;
    double *times; /* seconds per step */
    int n_times;
    bool captured;       /* the step captured once (nb_mirrored_capture), then replayed */
    nb_mirrored_graph *g;
} config;

static void config_init(config *c, nb_mirrored *s, const char *device, int64_t batch, int total)
{
    c->s = s;
    c->device = s ? nb_mirrored_device(s, 0) : device;
    nb_device_push(c->device);
    model_init(&c->m, s, batch);
    nb_device_pop();
    c->opt = nb_sgd_new(0.01);
    c->times = malloc(sizeof *c->times * (size_t)total);
    c->n_times = 0;
    c->captured = false;
    c->g = NULL;
}

/* Runs `steps` steps, keeping their times when `timed`. */
static void config_run(config *c, int steps, bool timed)
{
    nb_device_push(c->device);
    for (int i = 0; i < steps; i++) {
        double t0 = bench_now();
        nb_scope *sc = nb_scope_begin();
        if (c->s && c->captured && c->g) {
            nb_mirrored_graph_replay(c->g, (nb_tensor *[]){c->m.x, c->m.y}, NULL);
        } else if (c->s && c->captured) {
            nb_mirrored_capture(c->s, c->opt, 4, c->m.p, replica_step, NULL, NB_TENSORS(c->m.x, c->m.y),
                                NB_REDUCE_MEAN, NULL, &c->g);
        } else if (c->s) {
            nb_mirrored_step(c->s, c->opt, 4, c->m.p, replica_step, NULL, NB_TENSORS(c->m.x, c->m.y),
                             NB_REDUCE_MEAN, NULL);
        } else {
            nb_tape *tape = nb_tape_begin();
            nb_tensor *loss = loss_of(c->m.x, c->m.y, c->m.p), *g[4];
            nb_tape_gradient_vars(tape, loss, 4, c->m.p, g);
            nb_optimizer_apply(c->opt, 4, c->m.p, g);
        }
        nb_scope_end(sc);
        nb_synchronize();
        if (timed)
            c->times[c->n_times++] = bench_now() - t0;
    }
    nb_device_pop();
}

/* Images per second from the median step; frees the configuration. */
static double config_finish(config *c, int64_t batch)
{
    double ips = (double)batch / bench_median(c->times, c->n_times);
    nb_mirrored_graph_free(c->g);
    free(c->times);
    nb_optimizer_free(c->opt);
    model_free(&c->m);
    return ips;
}

static void row(const char *what, double images_per_s, double single)
{
    printf("%-44s %10.0f %10.2f\n", what, images_per_s, images_per_s / single);
}

int main(int argc, char **argv)
{
    int reps = 100, batch_arg = 256;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NUMBER("--batch", "B", &batch_arg, 4), BENCH_NO_PEER(&peer));
    const int64_t batch = batch_arg;

    /* Split the CPU before any other nabla call (CPU devices only). */
    int gpus = nb_physical_gpu_count();
    if (gpus == 0 && bench_gpu_required()) /* never pass off CPU figures as GPU ones */
        return bench_no_gpu("Mirrored strategy step over GPUs", nb_gpu_unavailable_reason());
    if (gpus == 0)
        nb_set_logical_cpu_devices(4);
    nb_set_error_handler(nb_error_handler_exit, NULL);
    const char *single = gpus ? "/gpu:0" : "/cpu:0";

    /* The configurations take turns, ROUNDS rounds of reps / ROUNDS steps, so that
     * a slow spell of the machine falls on all of them alike. */
    int counts[3] = {1, 2, 4}, per_round = (reps + ROUNDS - 1) / ROUNDS;
    config cf[5];
    int n_cf = 0;
    config_init(&cf[n_cf++], NULL, single, batch, per_round * ROUNDS);
    nb_mirrored *strategies[3] = {NULL, NULL, NULL};
    for (int c = 0; c < 3; c++) {
        if (gpus && counts[c] > gpus)
            continue; /* GPUs only: as many replicas as there are */
        strategies[c] = nb_mirrored_new(counts[c], NULL);
        config_init(&cf[n_cf++], strategies[c], NULL, batch, per_round * ROUNDS);
    }
    /* 2 replicas once more, the step captured and replayed */
    nb_mirrored *captured = strategies[1] ? nb_mirrored_new(2, NULL) : NULL;
    int captured_k = -1;
    if (captured) {
        captured_k = n_cf;
        config_init(&cf[n_cf++], captured, NULL, batch, per_round * ROUNDS);
        cf[captured_k].captured = true;
    }
    for (int k = 0; k < n_cf; k++)
        config_run(&cf[k], WARM, false);
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < n_cf; k++)
            config_run(&cf[k], per_round, true);
    double single_ips = config_finish(&cf[0], batch), ips[3] = {0, 0, 0};
    double captured_ips = captured ? config_finish(&cf[captured_k], batch) : 0;
    nb_mirrored_free(captured);
    const char *algorithm = "-";
    for (int c = 0, k = 1; c < 3; c++) {
        if (!strategies[c])
            continue;
        ips[c] = config_finish(&cf[k++], batch);
        nb_mirrored_stats st;
        nb_mirrored_get_stats(strategies[c], &st);
        algorithm = st.algorithm;
        nb_mirrored_free(strategies[c]);
    }

    bench_peer p;
    bench_peer_run(&p, peer, "mirrored_step_ddp.py", "%d %lld", reps, (long long)batch);

    printf("\nMLP 784-256-10 training step (SGD), global batch %lld: images per second\n",
           (long long)batch);
    printf("(median step after a warm-up; replicas on %s, all-reduce \"%s\")\n",
           gpus ? "GPUs" : "logical CPU devices", algorithm);
    bench_peer_line(&p, "the PyTorch rows are skipped");
    printf("%-44s %10s %10s\n", "", "images/s", "vs single");
    row(gpus ? "nabla, /gpu:0, no strategy" : "nabla, /cpu:0, no strategy", single_ips, single_ips);
    for (int c = 0; c < 3; c++) {
        char what[64];
        snprintf(what, sizeof what, "nabla, mirrored strategy, %d replica%s", counts[c],
                 counts[c] > 1 ? "s" : "");
        if (ips[c] > 0)
            row(what, ips[c], single_ips);
        else
            printf("%-44s (skipped: %d GPU%s)\n", what, gpus, gpus > 1 ? "s" : "");
        if (c == 1 && captured_ips > 0)
            row("nabla, mirrored strategy, 2, captured", captured_ips, single_ips);
    }
    double torch1 = bench_peer_get(&p, "torch1"), ddp2 = bench_peer_get(&p, "ddp2");
    if (torch1 > 0)
        row("PyTorch CPU, one process", torch1, single_ips);
    if (ddp2 > 0)
        row("PyTorch CPU, DDP over 2 processes (gloo)", ddp2, single_ips);

    printf("\n");
    if (ips[1] > 0)
        printf("strategy(2) / one device without strategy: %.2f (target >= 0.90)\n", ips[1] / single_ips);
    if (gpus)
        printf("strategy(2) / PyTorch DDP(2): - (ours on GPUs, PyTorch's on the CPU)\n");
    else if (ips[1] > 0 && ddp2 > 0)
        printf("strategy(2) / PyTorch DDP(2):              %.2fx (target >= 1.5x)\n", ips[1] / ddp2);
    else
        printf("strategy(2) / PyTorch DDP(2): - (PyTorch not run)\n");
    return 0;
}
