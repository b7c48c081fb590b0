/* One training step of a 784-256-10 MLP at batch 64: forward, sparse softmax
 * cross-entropy, backward, SGD update. On /cpu:0, and on /gpu:0 when there is one,
 * beside the same step in PyTorch eager from Python (bench/mlp_step.py); on the
 * CPU and the GPU also captured once (nb_graph_capture) and replayed (on the
 * GPU beside PyTorch's torch.cuda.CUDAGraph replay of the same step; PyTorch
 * has no CPU counterpart, so that row stands beside its eager CPU step).
 *
 *   mlp_step [--reps R] [--no-peer]
 *
 * Each figure is the median over R steps after a warm-up; a GPU step ends with
 * nb_synchronize() (torch.cuda.synchronize() on the PyTorch side). */
#include "bench_util.h"
#include <math.h>
#include <nabla/nabla.h>

#define WARM 20

typedef struct mlp {
    nb_variable *p[4];
    nb_optimizer *opt;
} mlp;

static void mlp_init(mlp *m)
{
    m->p[0] = nb_variable_new("w1", nb_random_normal(NB_F32, NB_SHAPE(784, 256), 0, sqrt(2.0 / 784), 2));
    m->p[1] = nb_variable_new("b1", nb_zeros(NB_F32, NB_SHAPE(256)));
    m->p[2] = nb_variable_new("w2", nb_random_normal(NB_F32, NB_SHAPE(256, 10), 0, sqrt(1.0 / 256), 3));
    m->p[3] = nb_variable_new("b2", nb_zeros(NB_F32, NB_SHAPE(10)));
    m->opt = nb_sgd_new(0.01);
}

static void mlp_free(mlp *m)
{
    nb_optimizer_free(m->opt);
    for (int i = 0; i < 4; i++)
        nb_variable_free(m->p[i]);
}

/* The step (nb_graph_step_fn): inputs x [64, 784] and labels [64]; output the loss. */
static nb_status mlp_train(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    mlp *m = user;
    (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], nb_read(m->p[0])), nb_read(m->p[1])));
    nb_tensor *logits = nb_add(nb_matmul(h, nb_read(m->p[2])), nb_read(m->p[3]));
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, in[1]));
    nb_tensor *g[4];
    nb_tape_gradient_vars(tape, loss, 4, m->p, g);
    nb_status st = nb_optimizer_apply(m->opt, 4, m->p, g);
    out[0] = nb_keep(loss);
    nb_scope_end(s);
    return st;
}

typedef struct step_run {
    mlp *m;
    nb_tensor **in;
    nb_graph *g; /* NULL: eager */
} step_run;

static void train_step(void *ctx)
{
    step_run *r = ctx;
    nb_tensor *loss;
    if (r->g) /* the inputs stay in the graph, as PyTorch's static ones */
        nb_graph_replay(r->g, NULL, &loss);
    else
        mlp_train(r->m, 2, r->in, 1, &loss);
}

/* Median microseconds per step: eager, or (graph) one capture then replays,
 * whose count of kernels and copies goes to *nodes. */
static double bench_device(const char *device, int reps, bool graph, int64_t *nodes)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    int64_t labels[64];
    for (int i = 0; i < 64; i++)
        labels[i] = (i * 7 + 3) % 10;
    nb_tensor *in[2] = {nb_random_normal(NB_F32, NB_SHAPE(64, 784), 0, 1, 1),
                        nb_from_buffer(NB_I64, NB_SHAPE(64), labels)};
    mlp m;
    mlp_init(&m);
    nb_graph *g = NULL;
    if (graph)
        nb_graph_capture(device, mlp_train, &m, 2, in, 1, NULL, &g);
    if (nodes)
        *nodes = nb_graph_nodes(g);
    step_run run = {&m, in, g};
    double med = bench_median_ms(train_step, &run, WARM, reps) * 1e3;
    nb_graph_free(g);
    mlp_free(&m);
    nb_device_pop();
    nb_scope_end(outer);
    return med;
}

int main(int argc, char **argv)
{
    int reps = 200;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);

    int64_t cpu_nodes = 0, gpu_nodes = 0;
    double cpu = bench_device("/cpu:0", reps, false, NULL);
    double cpu_graph = bench_device("/cpu:0", reps, true, &cpu_nodes);
    bool gpu = nb_device_count(NB_DEVICE_GPU) > 0;
    double gpu_us = gpu ? bench_device("/gpu:0", reps, false, NULL) : 0;
    double graph_us = gpu ? bench_device("/gpu:0", reps, true, &gpu_nodes) : 0;

    bench_peer p;
    bench_peer_run(&p, peer, "mlp_step.py", "%d", reps);
    bench_header("MLP 784-256-10 training step, batch 64 (median, warm-up first)",
                 "microseconds per step", &p);
    bench_row("/cpu:0 (torch: cpu)", cpu, bench_peer_get(&p, "cpu"));
    bench_row("/cpu:0 graph replay (torch: cpu)", cpu_graph, bench_peer_get(&p, "cpu"));
    if (gpu)
        bench_row("/gpu:0 (torch: cuda)", gpu_us, bench_peer_get(&p, "cuda"));
    if (gpu) {
        bench_row("/gpu:0 graph replay (torch: CUDA graph)", graph_us, bench_peer_get(&p, "cuda_graph"));
        bench_row("/gpu:0 graph replay (torch: cuda eager)", graph_us, bench_peer_get(&p, "cuda"));
    }
    printf("a captured step launches %lld kernels and copies on /cpu:0", (long long)cpu_nodes);
    if (gpu)
        printf(", %lld on /gpu:0", (long long)gpu_nodes);
    printf("\n");
    if (!gpu)
        return bench_no_gpu("/gpu:0", nb_gpu_unavailable_reason());
    return 0;
}
