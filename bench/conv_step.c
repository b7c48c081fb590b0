/* One training step of samples/fashion_cnn.c's network at batch 64: two conv
 * (3x3, SAME) - batch norm - relu - 2x2 max pool blocks, dropout, dense
 * 3136-128-10, sparse softmax cross-entropy, backward, Adam. On /cpu:0, and on
 * /gpu:0 when there is one, beside the same step in PyTorch eager from Python
 * (bench/conv_step.py, NHWC there too: channels_last). On the GPU also in
 * mixed precision: nabla's layers under nb_set_compute_dtype(NB_BF16) beside
 * PyTorch's torch.autocast(dtype=torch.bfloat16), both with f32 variables.
 *
 *   conv_step [--reps R] [--no-peer]
 *
 * Each figure is the median over R steps after a warm-up; a GPU step ends with
 * nb_synchronize() (torch.cuda.synchronize() on the PyTorch side). */
#include "bench_util.h"
#include <nabla/layers.h>
#include <nabla/nabla.h>

#define WARM 5
#define BATCH 64

typedef struct net {
    nb_conv2d_layer conv1, conv2;
    nb_batch_norm_layer bn1, bn2;
    nb_dense_layer fc1, fc2;
    nb_dropout_layer drop1, drop2;
} net;

static nb_tensor *forward(net *m, const nb_tensor *x)
{
    const nb_pool2d_opts pool = {{2, 2}, {2, 2}, NB_PAD_VALID, {0}, NB_NHWC};
    nb_tensor *h = nb_conv2d_apply(&m->conv1, x);
    h = nb_max_pool2d(nb_relu(nb_batch_norm_apply(&m->bn1, h, true)), &pool);
    h = nb_conv2d_apply(&m->conv2, h);
    h = nb_max_pool2d(nb_relu(nb_batch_norm_apply(&m->bn2, h, true)), &pool);
    h = nb_dropout_apply(&m->drop1, nb_reshape(h, NB_SHAPE(-1, 7 * 7 * 64)), true);
    h = nb_dropout_apply(&m->drop2, nb_relu(nb_dense_apply(&m->fc1, h)), true);
    return nb_dense_apply(&m->fc2, h);
}

typedef struct step_run {
    net *m;
    nb_tensor *x, *y;
    nb_variable **all; /* the 10 trainable variables */
    nb_optimizer *opt;
} step_run;

static void train_step(void *ctx)
{
    step_run *r = ctx;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(forward(r->m, r->x), r->y));
    nb_tensor *g[10];
    nb_tape_gradient_vars(tape, loss, 10, r->all, g);
    nb_optimizer_apply(r->opt, 10, r->all, g);
}

static double bench_device(const char *device, int reps, nb_dtype compute)
{
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    nb_variable_scope_push(compute == NB_BF16 ? "bf16" : device[1] == 'g' ? "gpu" : "cpu", false);
    nb_set_compute_dtype(compute);
    int64_t labels[BATCH];
    for (int i = 0; i < BATCH; i++)
        labels[i] = (i * 7 + 3) % 10;
    nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(BATCH, 28, 28, 1), 0, 1, 1);
    nb_tensor *y = nb_from_buffer(NB_I64, NB_SHAPE(BATCH), labels);
    net m;
    nb_conv2d_init(&m.conv1, "conv1", 1, 32, 3, 3, NULL, false, NB_F32, 1);
    nb_batch_norm_init(&m.bn1, "bn1", 32, 0.99, 1e-3, NB_NHWC, NB_F32);
    nb_conv2d_init(&m.conv2, "conv2", 32, 64, 3, 3, NULL, false, NB_F32, 2);
    nb_batch_norm_init(&m.bn2, "bn2", 64, 0.99, 1e-3, NB_NHWC, NB_F32);
    nb_dropout_init(&m.drop1, 0.25, 3);
    nb_dense_init(&m.fc1, "dense1", 7 * 7 * 64, 128, true, NB_F32, 4);
    nb_dropout_init(&m.drop2, 0.4, 5);
    nb_dense_init(&m.fc2, "dense2", 128, 10, true, NB_F32, 6);
    nb_variable *p[8] = {m.conv1.kernel, m.bn1.gamma, m.bn1.beta, m.conv2.kernel,
                         m.bn2.gamma,    m.bn2.beta,  m.fc1.kernel, m.fc1.bias};
    nb_variable *q[2] = {m.fc2.kernel, m.fc2.bias};
    nb_variable *all[10];
    for (int i = 0; i < 8; i++)
        all[i] = p[i];
    all[8] = q[0], all[9] = q[1];
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    step_run run = {&m, x, y, all, opt};
    double med = bench_median_ms(train_step, &run, WARM, reps);
    nb_optimizer_free(opt);
    nb_conv2d_free(&m.conv1);
    nb_conv2d_free(&m.conv2);
    nb_batch_norm_free(&m.bn1);
    nb_batch_norm_free(&m.bn2);
    nb_dense_free(&m.fc1);
    nb_dense_free(&m.fc2);
    nb_set_compute_dtype(NB_F32);
    nb_variable_scope_pop();
    nb_device_pop();
    nb_scope_end(outer);
    return med;
}

int main(int argc, char **argv)
{
    int reps = 30;
    bool peer = true;
    BENCH_OPTIONS(argc, argv, BENCH_REPS(&reps), BENCH_NO_PEER(&peer));
    nb_set_error_handler(nb_error_handler_exit, NULL);

    double cpu = bench_device("/cpu:0", reps, NB_F32);
    bool gpu = nb_device_count(NB_DEVICE_GPU) > 0;
    double gpu_ms = gpu ? bench_device("/gpu:0", reps * 10, NB_F32) : 0;
    double gpu_bf16 = gpu ? bench_device("/gpu:0", reps * 10, NB_BF16) : 0;

    bench_peer pr;
    bench_peer_run(&pr, peer, "conv_step.py", "%d", reps);
    bench_header("CNN training step (fashion_cnn's network), batch 64 (median, warm-up first)",
                 "milliseconds per step", &pr);
    bench_row("/cpu:0 (torch: cpu)", cpu, bench_peer_get(&pr, "cpu"));
    if (gpu) {
        bench_row("/gpu:0 (torch: cuda)", gpu_ms, bench_peer_get(&pr, "cuda"));
        bench_row("/gpu:0 bf16 compute (torch: autocast bf16)", gpu_bf16, bench_peer_get(&pr, "cuda_bf16"));
        printf("  bf16 against f32 on /gpu:0: %.2fx\n", gpu_ms / gpu_bf16);
    } else
        return bench_no_gpu("/gpu:0", nb_gpu_unavailable_reason());
    return 0;
}
