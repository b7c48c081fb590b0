/* Fashion-MNIST: an MLP 784 -> 256 -> 128 -> 10 trained with Adam on shuffled
 * mini-batches; runs on the GPU when there is one.
 *
 *   fashion_mnist [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick]
 *                 [--logdir DIR]
 *
 * --steps caps the steps per epoch; --quick trains on 4000 images for one epoch.
 * --logdir writes TensorBoard summaries there: each epoch's loss and accuracies
 * and histograms of the weights (tensorboard --logdir DIR shows them).
 * The data are the four IDX files of Fashion-MNIST (Debian/Ubuntu:
 * apt-get install dataset-fashion-mnist). */
#include <nabla/nabla.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fashion_data.h"
#include "progress.h"

#define BATCH 128

static bool quick; /* --quick: a short run; missing data then skips (exit 77) */

static double now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads images (as f32 [n, 784] in [0, 1]) or labels (as i64 [n]) from DIR/NAME,
 * keeping the first `limit` rows (all when limit <= 0). */
static nb_tensor *load(const char *dir, const char *name, bool images, int64_t limit)
{
    return fashion_load("fashion_mnist", dir, name, images, NB_SHAPE(784), limit, quick);
}

static nb_tensor *model(nb_tensor *x, nb_variable *const *p)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
    h = nb_relu(nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3])));
    return nb_add(nb_matmul(h, nb_read(p[4])), nb_read(p[5]));
}

/* Number of rows whose largest logit is at the label, as an f32 0-d tensor. */
static nb_tensor *correct(nb_tensor *logits, nb_tensor *labels)
{
    return nb_sum_all(nb_cast(nb_equal(nb_argmax(logits, 1, false), labels), NB_F32));
}

static double evaluate(nb_tensor *x, nb_tensor *y, nb_variable *const *p)
{
    int64_t n = nb_tensor_dim(x, 0);
    double right = 0;
    for (int64_t start = 0; start < n; start += 1000) {
        nb_scope *s = nb_scope_begin();
        int64_t len = n - start < 1000 ? n - start : 1000;
        nb_tensor *xb = nb_slice(x, NB_SHAPE(start, 0), NB_SHAPE(len, -1));
        nb_tensor *yb = nb_slice(y, NB_SHAPE(start), NB_SHAPE(len));
        right += nb_tensor_item(correct(model(xb, p), yb));
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
    const char *logdir = NULL;
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
        else {
            fprintf(stderr,
                    "usage: %s [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick] [--logdir DIR]\n",
                    argv[0]);
            return 2;
        }
    }

    nb_summary_writer *summary = logdir ? nb_summary_writer_open(logdir) : NULL;
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    double t0 = now();
    nb_tensor *x_train = load(dir, "train-images-idx3-ubyte.gz", true, quick ? 4000 : 0);
    nb_tensor *y_train = load(dir, "train-labels-idx1-ubyte.gz", false, quick ? 4000 : 0);
    nb_tensor *x_test = load(dir, "t10k-images-idx3-ubyte.gz", true, quick ? 2000 : 0);
    nb_tensor *y_test = load(dir, "t10k-labels-idx1-ubyte.gz", false, quick ? 2000 : 0);
    int64_t n = nb_tensor_dim(x_train, 0);
    printf("Fashion-MNIST: %lld training and %lld test images on %s (loaded in %.1f s)\n",
           (long long)n, (long long)nb_tensor_dim(x_test, 0), nb_device_current(), now() - t0);

    /* He-initialised weights, zero biases. */
    const int64_t sizes[4] = {784, 256, 128, 10};
    nb_variable *params[6];
    for (int l = 0; l < 3; l++) {
        char name[32];
        snprintf(name, sizeof name, "dense%d/w", l + 1);
        params[2 * l] = nb_variable_new(name, nb_truncated_normal(NB_F32, NB_SHAPE(sizes[l], sizes[l + 1]), 0,
                                                               sqrt(2.0 / (double)sizes[l]), 100 + l));
        snprintf(name, sizeof name, "dense%d/b", l + 1);
        params[2 * l + 1] = nb_variable_new(name, nb_zeros(NB_F32, NB_SHAPE(sizes[l + 1])));
    }
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    /* Running sums of loss*rows and correct rows, kept on the device so that the
     * training loop never waits for it. */
    nb_variable *stats = nb_variable_new("stats", nb_zeros(NB_F32, NB_SHAPE(2)));
    nb_variable_set_trainable(stats, false);

    /* Shuffled mini-batches: every pass over the dataset is a new order. */
    nb_tensor *train[2] = {x_train, y_train};
    nb_dataset *batches = nb_dataset_batch(nb_dataset_shuffle(nb_dataset_from_tensors(2, train), n, 1), BATCH, false);
    int64_t steps_per_epoch = (n + BATCH - 1) / BATCH;
    if (max_steps > 0 && max_steps < steps_per_epoch)
        steps_per_epoch = max_steps;
    double test_acc = 0;
    printf("epoch   loss    train acc  test acc  seconds\n");
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double start_time = now();
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
            nb_tensor *logits = model(xb, params);
            nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, yb));
            nb_tensor *grads[6];
            nb_tape_gradient_vars(tape, loss, 6, params, grads);
            nb_optimizer_apply(opt, 6, params, grads);
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
        test_acc = evaluate(x_test, y_test, params);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %7.1f\n", epoch, sums[0] / (double)seen,
               100.0 * sums[1] / (double)seen, 100.0 * test_acc, now() - start_time);
        fflush(stdout);
        if (summary) {
            nb_summary_scalar(summary, "train/loss", epoch, sums[0] / (double)seen);
            nb_summary_scalar(summary, "train/accuracy", epoch, sums[1] / (double)seen);
            nb_summary_scalar(summary, "test/accuracy", epoch, test_acc);
            for (int l = 0; l < 3; l++) {
                char tag[32];
                snprintf(tag, sizeof tag, "dense%d/w", l + 1);
                nb_summary_histogram(summary, tag, epoch, nb_read(params[2 * l]));
            }
        }
        nb_scope_end(es);
    }
    printf("final test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_summary_writer_close(summary);

    nb_dataset_free(batches);
    nb_variable_free(stats);
    for (int i = 0; i < 6; i++)
        nb_variable_free(params[i]);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    /* A sanity floor: even the quick run is far above chance (10%). */
    if (epochs > 0 && test_acc < (quick ? 0.5 : 0.8)) {
        fprintf(stderr, "fashion_mnist: test accuracy %.3f is too low\n", test_acc);
        return 1;
    }
    return 0;
}
