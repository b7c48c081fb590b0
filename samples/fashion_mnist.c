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
#include <stdio.h>

#include "command_line.h"
#include "fashion_data.h"
#include "fashion_mlp.h"
#include "progress.h"
#include "training.h"

#define BATCH 128

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);

    const char *dir = FASHION_DIR, *logdir = NULL;
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    int epochs = 5, max_steps = 0;
    bool quick = false; /* a short run; missing data then skips (exit 77) */
    OPTIONS_READ(argc, argv,
                 "usage: %s [--data DIR] [--device NAME] [--epochs N] [--steps N] [--quick] [--logdir DIR]\n",
                 FASHION_OPTIONS(&dir, &device, &epochs, &max_steps, &quick, &logdir));

    nb_summary_writer *summary = logdir ? nb_summary_writer_open(logdir) : NULL;
    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    double t0 = progress_now();
    /* images as f32 [n, 784] in [0, 1], labels as i64 [n] */
    fashion_set data = fashion_load_set("fashion_mnist", dir, NB_SHAPE(784), quick ? 4000 : 0, quick ? 2000 : 0, quick);
    int64_t n = nb_tensor_dim(data.x_train, 0);
    printf("Fashion-MNIST: %lld training and %lld test images on %s (loaded in %.1f s)\n",
           (long long)n, (long long)nb_tensor_dim(data.x_test, 0), nb_device_current(), progress_now() - t0);

    nb_variable *params[MLP_PARAMS];
    mlp_init(params, NULL); /* He-initialised weights, zero biases */
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    const classifier mlp = {.forward = mlp_logits, .model = params, .n_vars = MLP_PARAMS, .vars = params, .opt = opt};
    epoch_sums sums = epoch_sums_new();

    /* Shuffled mini-batches: every pass over the dataset is a new order. */
    nb_tensor *train[2] = {data.x_train, data.y_train};
    nb_dataset *batches = nb_dataset_batch(nb_dataset_shuffle(nb_dataset_from_tensors(2, train), n, 1), BATCH, false);
    const int64_t steps = steps_per_epoch(n, BATCH, max_steps);
    double test_acc = 0;
    printf("epoch   loss    train acc  test acc  seconds\n");
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double start_time = progress_now();
        nb_scope *es = nb_scope_begin();
        /* each step: the loss, its gradients by a tape, Adam's update (training.h) */
        train_epoch(&mlp, batches, steps, epoch, &sums);
        double loss, train_acc;
        epoch_sums_read(&sums, &loss, &train_acc);
        test_acc = accuracy_in_chunks(&mlp, data.x_test, data.y_test, 1000);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %7.1f\n", epoch, loss, 100.0 * train_acc, 100.0 * test_acc,
               progress_now() - start_time);
        fflush(stdout);
        epoch_summaries(summary, epoch, loss, train_acc, test_acc);
        mlp_summaries(summary, epoch, params);
        nb_scope_end(es);
    }
    printf("final test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_summary_writer_close(summary);

    nb_dataset_free(batches);
    epoch_sums_free(&sums);
    mlp_free(params);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    /* A sanity floor: even the quick run is far above chance (10%). */
    return accuracy_floor("fashion_mnist", epochs, test_acc, quick ? 0.5 : 0.8);
}
