/* Fashion-MNIST with a small convolutional network: two conv - batch norm -
 * relu - max pool blocks, dropout and two dense layers, trained with Adam
 * (learning rate 1e-3, then 3e-4 and 1e-4 over the last fifths of the
 * epochs); runs on the GPU when there is one.
 *
 *   fashion_cnn [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick]
 *               [--logdir DIR] [--save FILE] [--compute f32|bf16|f16] [--graph]
 *
 * --compute bf16 or f16 trains in mixed precision (nb_set_compute_dtype): the
 * convolutions and dense layers multiply in that dtype, the variables stay
 * f32; f16 also scales the loss (nb_loss_scaler). On a GPU the products run
 * in it; on the CPU they are emulated (rounded to it around f32 products).
 * --graph captures the training step once (nb_graph_capture: a CUDA graph on
 * a GPU) and replays it for every later batch of its shape, the last, shorter
 * batch of an epoch running as an eager step; the dropout masks, Adam's
 * numbers and the learning-rate decay are those of eager steps, so it trains
 * as the eager run does; with f16, the loss scaler's check, skip and scale
 * stay on the device in the replays.
 * --steps caps the steps per epoch; --quick trains on 2000 images for one
 * epoch; --logdir writes TensorBoard summaries; --save writes the trained
 * variables to a safetensors checkpoint. The data are the four IDX files of
 * Fashion-MNIST (apt-get install dataset-fashion-mnist). */
#include <nabla/nabla.h>
#include <nabla/layers.h>
#include <stdio.h>
#include <string.h>

#include "command_line.h"
#include "fashion_data.h"
#include "progress.h"
#include "training.h"

#define BATCH 64

typedef struct model {
    nb_conv2d_layer conv1, conv2;
    nb_batch_norm_layer bn1, bn2;
    nb_dense_layer fc1, fc2;
    nb_dropout_layer drop1, drop2;
} model;

static void model_init(model *m)
{
    /* No conv bias: batch norm's beta does its work. */
    nb_conv2d_init(&m->conv1, "conv1", 1, 32, 3, 3, NULL, false, NB_F32, 1);
    nb_batch_norm_init(&m->bn1, "bn1", 32, 0.99, 1e-3, NB_NHWC, NB_F32);
    nb_conv2d_init(&m->conv2, "conv2", 32, 64, 3, 3, NULL, false, NB_F32, 2);
    nb_batch_norm_init(&m->bn2, "bn2", 64, 0.99, 1e-3, NB_NHWC, NB_F32);
    nb_dropout_init(&m->drop1, 0.1, 3);
    nb_dense_init(&m->fc1, "dense1", 7 * 7 * 64, 128, true, NB_F32, 4);
    nb_dropout_init(&m->drop2, 0.3, 5);
    nb_dense_init(&m->fc2, "dense2", 128, 10, true, NB_F32, 6);
}

static void model_free(model *m)
{
    nb_conv2d_free(&m->conv1);
    nb_batch_norm_free(&m->bn1);
    nb_conv2d_free(&m->conv2);
    nb_batch_norm_free(&m->bn2);
    nb_dense_free(&m->fc1);
    nb_dense_free(&m->fc2);
}

/* x [B, 28, 28, 1] -> logits [B, 10]. */
static nb_tensor *forward(model *m, const nb_tensor *x, bool training)
{
    const nb_pool2d_opts pool = {{2, 2}, {2, 2}, NB_PAD_VALID, {0}, NB_NHWC};
    nb_tensor *h = nb_conv2d_apply(&m->conv1, x);                                   /* [B, 28, 28, 32] */
    h = nb_max_pool2d(nb_relu(nb_batch_norm_apply(&m->bn1, h, training)), &pool);   /* [B, 14, 14, 32] */
    h = nb_conv2d_apply(&m->conv2, h);                                              /* [B, 14, 14, 64] */
    h = nb_max_pool2d(nb_relu(nb_batch_norm_apply(&m->bn2, h, training)), &pool);   /* [B, 7, 7, 64] */
    h = nb_dropout_apply(&m->drop1, nb_reshape(h, NB_SHAPE(-1, 7 * 7 * 64)), training);
    h = nb_dropout_apply(&m->drop2, nb_relu(nb_dense_apply(&m->fc1, h)), training);
    return nb_dense_apply(&m->fc2, h);
}

/* forward as training.h's classifier takes it. */
static nb_tensor *logits(void *m, nb_tensor *x, bool training)
{
    return forward(m, x, training);
}

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);

    const char *dir = FASHION_DIR, *logdir = NULL, *save = NULL;
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    int epochs = 5, max_steps = 0;
    bool quick = false; /* a short run; missing data then skips (exit 77) */
    const char *compute = "f32";
    bool graph = false;
    OPTIONS_READ(argc, argv,
                 "usage: %s [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick] [--logdir DIR] "
                 "[--save FILE] [--compute f32|bf16|f16] [--graph]\n",
                 FASHION_OPTIONS(&dir, &device, &epochs, &max_steps, &quick, &logdir), OPTION_TEXT("--save", &save),
                 OPTION_TEXT("--compute", &compute), OPTION_FLAG("--graph", &graph));
    nb_dtype compute_dtype = !strcmp(compute, "bf16") ? NB_BF16 : !strcmp(compute, "f16") ? NB_F16 : NB_F32;
    if (compute_dtype == NB_F32 && strcmp(compute, "f32")) {
        fprintf(stderr, "fashion_cnn: --compute takes f32, bf16 or f16, not '%s'\n", compute);
        return 2;
    }
    nb_set_compute_dtype(compute_dtype);

    nb_summary_writer *summary = logdir ? nb_summary_writer_open(logdir) : NULL;
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    double t0 = progress_now();
    /* images as f32 [n, 28, 28, 1] in [0, 1] (NHWC), labels as i64 [n] */
    fashion_set data =
        fashion_load_set("fashion_cnn", dir, NB_SHAPE(28, 28, 1), quick ? 2000 : 0, quick ? 1000 : 0, quick);
    int64_t n = nb_tensor_dim(data.x_train, 0);
    printf("Fashion-MNIST CNN: %lld training and %lld test images on %s, computing in %s%s%s (loaded in %.1f s)\n",
           (long long)n, (long long)nb_tensor_dim(data.x_test, 0), nb_device_current(), compute,
           compute_dtype == NB_F32 ? "" : " with f32 variables", graph ? ", the step captured and replayed" : "",
           progress_now() - t0);

    model m;
    model_init(&m);
    nb_variable *params[16];
    int n_params = nb_trainable_variables(params, 16);
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    /* f16's narrow range needs the loss scaled (torch.amp.GradScaler's defaults) */
    nb_loss_scaler *scaler = compute_dtype == NB_F16 ? nb_loss_scaler_new(65536, 2, 0.5, 2000) : NULL;
    classifier_graph step_graph = {0};
    const classifier cnn = {.forward = logits, .model = &m, .n_vars = n_params, .vars = params, .opt = opt,
                            .scaler = scaler, .graph = graph ? &step_graph : NULL};
    epoch_sums sums = epoch_sums_new();

    nb_tensor *train[2] = {data.x_train, data.y_train};
    nb_dataset *batches = nb_dataset_batch(nb_dataset_shuffle(nb_dataset_from_tensors(2, train), n, 7), BATCH, false);
    const int64_t steps = steps_per_epoch(n, BATCH, max_steps);
    double test_acc = 0;
    printf("%d trainable variables; epoch   loss    train acc  test acc  images/s  seconds\n", n_params);
    for (int epoch = 1; epoch <= epochs; epoch++) {
        /* a step-wise decay for the last epochs: the finer steps settle in a
         * better minimum than a constant rate reaches in the budget */
        double lr = 5 * (epoch - 1) < 3 * epochs ? 1e-3 : epoch < epochs ? 3e-4 : 1e-4;
        nb_optimizer_set_learning_rate(opt, lr);
        double start_time = progress_now();
        nb_scope *es = nb_scope_begin();
        /* each step: the loss, its gradients by a tape, Adam's update (training.h) */
        train_epoch(&cnn, batches, steps, epoch, &sums);
        double loss, train_acc;
        epoch_sums_read(&sums, &loss, &train_acc);
        double train_seconds = progress_now() - start_time;
        test_acc = accuracy_in_chunks(&cnn, data.x_test, data.y_test, 500);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %8.0f  %7.1f\n", epoch, loss, 100.0 * train_acc, 100.0 * test_acc,
               (double)sums.seen / train_seconds, progress_now() - start_time);
        fflush(stdout);
        epoch_summaries(summary, epoch, loss, train_acc, test_acc);
        if (summary) {
            nb_summary_histogram(summary, "conv1/kernel", epoch, nb_read(m.conv1.kernel));
            nb_summary_histogram(summary, "conv2/kernel", epoch, nb_read(m.conv2.kernel));
        }
        nb_scope_end(es);
    }
    printf("test accuracy: %.2f%%\n", 100.0 * test_acc);
    if (graph)
        printf("the step was captured once (%s) and replayed %lld times; %lld eager steps (shorter batches)\n",
               nb_graph_recorded(step_graph.step) ? "recorded on the device" : "run again at each replay",
               (long long)step_graph.replays, (long long)step_graph.eager_steps);
    classifier_graph_free(&step_graph);
    nb_summary_writer_close(summary);
    if (save) {
        nb_variable *all[32];
        int k = nb_variables_list(all, 32);
        k = k < 32 ? k : 32;
        nb_checkpoint_save(save, k, all, opt); /* the moving averages and Adam's slots too */
        printf("saved %d variables to %s\n", k, save);
    }

    nb_dataset_free(batches);
    epoch_sums_free(&sums);
    model_free(&m);
    nb_optimizer_free(opt);
    if (scaler)
        printf("loss scale %g at the end; %lld steps skipped for overflow\n", nb_loss_scaler_get_scale(scaler),
               (long long)nb_loss_scaler_skipped(scaler));
    nb_loss_scaler_free(scaler);
    nb_device_pop();
    nb_scope_end(outer);
    /* A sanity floor: even the quick run is far above chance (10%). */
    return accuracy_floor("fashion_cnn", epochs, test_acc, quick ? 0.4 : 0.85);
}
