/* Fashion-MNIST with a small convolutional network: two conv - batch norm -
 * relu - max pool blocks, dropout and two dense layers, trained with Adam
 * (learning rate 1e-3, then 3e-4 and 1e-4 over the last fifths of the
 * epochs); runs on the GPU when there is one.
 *
 *   fashion_cnn [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick]
 *               [--logdir DIR] [--save FILE]
 *
 * --steps caps the steps per epoch; --quick trains on 2000 images for one
 * epoch; --logdir writes TensorBoard summaries; --save writes the trained
 * variables to a safetensors checkpoint. The data are the four IDX files of
 * Fashion-MNIST (apt-get install dataset-fashion-mnist). */
#include <nabla/nabla.h>
#include <nabla/layers.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fashion_data.h"
#include "progress.h"

#define BATCH 64

static bool quick; /* --quick: a short run; missing data then skips (exit 77) */

/* Images as f32 [n, 28, 28, 1] in [0, 1] (NHWC), or labels as i64 [n], keeping
 * the first `limit` rows (all when limit <= 0). */
static nb_tensor *load(const char *dir, const char *name, bool images, int64_t limit)
{
    return fashion_load("fashion_cnn", dir, name, images, NB_SHAPE(28, 28, 1), limit, quick);
}

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

/* Number of rows whose largest logit is at the label, as an f32 0-d tensor. */
static nb_tensor *correct(nb_tensor *logits, nb_tensor *labels)
{
    return nb_sum_all(nb_cast(nb_equal(nb_argmax(logits, 1, false), labels), NB_F32));
}

static double evaluate(model *m, nb_tensor *x, nb_tensor *y)
{
    int64_t n = nb_tensor_dim(x, 0);
    double right = 0;
    for (int64_t start = 0; start < n; start += 500) {
        nb_scope *s = nb_scope_begin();
        int64_t len = n - start < 500 ? n - start : 500;
        nb_tensor *xb = nb_slice(x, NB_SHAPE(start, 0, 0, 0), NB_SHAPE(len, -1, -1, -1));
        nb_tensor *yb = nb_slice(y, NB_SHAPE(start), NB_SHAPE(len));
        right += nb_tensor_item(correct(forward(m, xb, false), yb));
        nb_scope_end(s);
    }
    return right / (double)n;
}

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);

    const char *dir = "/usr/share/datasets/fashion-mnist";
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    int epochs = 5, max_steps = 0;
    const char *logdir = NULL, *save = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
            epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            max_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true, epochs = 1;
        else if (!strcmp(argv[i], "--logdir") && i + 1 < argc)
            logdir = argv[++i];
        else if (!strcmp(argv[i], "--save") && i + 1 < argc)
            save = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick] [--logdir DIR] "
                    "[--save FILE]\n",
                    argv[0]);
            return 2;
        }
    }

    nb_summary_writer *summary = logdir ? nb_summary_writer_open(logdir) : NULL;
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    double t0 = progress_now();
    nb_tensor *x_train = load(dir, "train-images-idx3-ubyte.gz", true, quick ? 2000 : 0);
    nb_tensor *y_train = load(dir, "train-labels-idx1-ubyte.gz", false, quick ? 2000 : 0);
    nb_tensor *x_test = load(dir, "t10k-images-idx3-ubyte.gz", true, quick ? 1000 : 0);
    nb_tensor *y_test = load(dir, "t10k-labels-idx1-ubyte.gz", false, quick ? 1000 : 0);
    int64_t n = nb_tensor_dim(x_train, 0);
    printf("Fashion-MNIST CNN: %lld training and %lld test images on %s (loaded in %.1f s)\n", (long long)n,
           (long long)nb_tensor_dim(x_test, 0), nb_device_current(), progress_now() - t0);

    model m;
    model_init(&m);
    nb_variable *params[16];
    int n_params = nb_trainable_variables(params, 16);
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    /* Running sums of loss*rows and correct rows, on the device, so the loop
     * never waits for them. */
    nb_variable *stats = nb_variable_new("stats", nb_zeros(NB_F32, NB_SHAPE(2)));
    nb_variable_set_trainable(stats, false);

    nb_tensor *train[2] = {x_train, y_train};
    nb_dataset *batches = nb_dataset_batch(nb_dataset_shuffle(nb_dataset_from_tensors(2, train), n, 7), BATCH, false);
    int64_t steps_per_epoch = (n + BATCH - 1) / BATCH;
    if (max_steps > 0 && max_steps < steps_per_epoch)
        steps_per_epoch = max_steps;
    double test_acc = 0;
    printf("%d trainable variables; epoch   loss    train acc  test acc  images/s  seconds\n", n_params);
    for (int epoch = 1; epoch <= epochs; epoch++) {
        /* a step-wise decay for the last epochs: the finer steps settle in a
         * better minimum than a constant rate reaches in the budget */
        double lr = 5 * (epoch - 1) < 3 * epochs ? 1e-3 : epoch < epochs ? 3e-4 : 1e-4;
        nb_optimizer_set_learning_rate(opt, lr);
        double start_time = progress_now();
        nb_scope *es = nb_scope_begin();
        nb_dataset_iterator *it = nb_dataset_iterate(batches);
        nb_variable_assign(stats, nb_zeros(NB_F32, NB_SHAPE(2)));
        int64_t seen = 0;
        progress bar;
        progress_begin(&bar, epoch, steps_per_epoch);
        for (int64_t step = 0; step < steps_per_epoch; step++) {
            nb_scope *s = nb_scope_begin();
            nb_tensor *batch[2];
            if (nb_dataset_next(it, batch) != NB_OK) /* the end of the data (errors exit) */
                break;
            nb_tensor *xb = batch[0], *yb = batch[1];
            int64_t len = nb_tensor_dim(xb, 0);
            nb_tape *tape = nb_tape_begin();
            nb_tensor *logits = forward(&m, xb, true);
            nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, yb));
            nb_tensor *grads[16];
            nb_tape_gradient_vars(tape, loss, n_params, params, grads);
            nb_optimizer_apply(opt, n_params, params, grads);
            nb_tensor *both[2] = {nb_mul_scalar(loss, (double)len), correct(logits, yb)};
            nb_variable_assign_add(stats, nb_stack(2, both, 0));
            seen += len;
            if (progress_due(&bar, step + 1)) { /* reading the sums waits for the device */
                float run[2];
                nb_tensor_read(nb_read(stats), run, sizeof run);
                progress_show(&bar, step + 1, run[0] / (double)seen, seen);
            }
            nb_scope_end(s);
        }
        progress_end(&bar);
        nb_dataset_iterator_free(it);
        float sums[2];
        nb_tensor_read(nb_read(stats), sums, sizeof sums);
        double train_seconds = progress_now() - start_time;
        test_acc = evaluate(&m, x_test, y_test);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %8.0f  %7.1f\n", epoch, sums[0] / (double)seen,
               100.0 * sums[1] / (double)seen, 100.0 * test_acc, (double)seen / train_seconds,
               progress_now() - start_time);
        fflush(stdout);
        if (summary) {
            nb_summary_scalar(summary, "train/loss", epoch, sums[0] / (double)seen);
            nb_summary_scalar(summary, "train/accuracy", epoch, sums[1] / (double)seen);
            nb_summary_scalar(summary, "test/accuracy", epoch, test_acc);
            nb_summary_histogram(summary, "conv1/kernel", epoch, nb_read(m.conv1.kernel));
            nb_summary_histogram(summary, "conv2/kernel", epoch, nb_read(m.conv2.kernel));
        }
        nb_scope_end(es);
    }
    printf("test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_summary_writer_close(summary);
    if (save) {
        nb_variable *all[32];
        int k = nb_variables_list(all, 32);
        k = k < 32 ? k : 32;
        nb_checkpoint_save(save, k, all, opt); /* the moving averages and Adam's slots too */
        printf("saved %d variables to %s\n", k, save);
    }

    nb_dataset_free(batches);
    nb_variable_free(stats);
    model_free(&m);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    /* A sanity floor: even the quick run is far above chance (10%). */
    if (epochs > 0 && test_acc < (quick ? 0.4 : 0.85)) {
        fprintf(stderr, "fashion_cnn: test accuracy %.3f is too low\n", test_acc);
        return 1;
    }
    return 0;
}
