/* Fashion-MNIST through TFRecord files: converts the IDX files into TFRecord
 * files of tf.train.Example records ("image": 784 bytes, "label": one int64), then
 * trains the fashion_mnist MLP from them with a dataset pipeline: read records,
 * parse Examples, shuffle, batch, scale, prefetch. Runs on the GPU when there is
 * one.
 *
 *   fashion_tfrecord [--data DIR] [--out DIR] [--device NAME] [--epochs N] [--quick]
 *
 * --out is where the .tfrecord files go (default /tmp/nabla-fashion-tfrecord);
 * --quick converts and trains on 4000 images for one epoch, in a folder of its
 * own that it removes afterwards (so that runs side by side do not meet). */
#include <nabla/nabla.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "command_line.h"
#include "fashion_data.h"
#include "fashion_mlp.h"
#include "progress.h"
#include "training.h"

#define BATCH 128

static bool quick; /* missing data then skips (exit 77) */

/* Writes the first `limit` images and labels of DIR/IMAGES and DIR/LABELS as
 * Examples to PATH; returns how many. */
static int64_t convert(const char *dir, const char *images, const char *labels, const char *path, int64_t limit)
{
    char ip[1024], lp[1024];
    snprintf(ip, sizeof ip, "%s/%s", dir, images);
    snprintf(lp, sizeof lp, "%s/%s", dir, labels);
    struct stat st;
    if (stat(ip, &st) != 0 || stat(lp, &st) != 0) {
        fashion_missing("fashion_tfrecord", stat(ip, &st) != 0 ? ip : lp, quick);
    }
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = nb_reshape(nb_idx_read(ip), NB_SHAPE(-1, 784)); /* u8 on the CPU */
    nb_tensor *y = nb_cast(nb_idx_read(lp), NB_I64);
    int64_t n = nb_tensor_dim(x, 0);
    if (limit > 0 && limit < n)
        n = limit;
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    const char *names[2] = {"image", "label"};
    for (int64_t i = 0; i < n; i++) {
        nb_scope *r = nb_scope_begin();
        nb_tensor *f[2] = {nb_slice(x, NB_SHAPE(i, 0), NB_SHAPE(1, 784)), nb_slice(y, NB_SHAPE(i), NB_SHAPE(1))};
        nb_example_write(w, 2, names, f);
        nb_scope_end(r);
    }
    nb_tfrecord_writer_close(w);
    nb_scope_end(s);
    return n;
}

/* The batch as the model takes it: images f32 [B, 784] in [0, 1], labels [B]. */
static nb_status scale(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    out[0] = nb_mul_scalar(nb_cast(in[0], NB_F32), 1.0 / 255);
    out[1] = nb_reshape(in[1], NB_SHAPE(-1));
    return out[0] && out[1] ? NB_OK : nb_error();
}

/* Records of PATH parsed, (shuffled,) batched and scaled, ready on device. */
static nb_dataset *pipeline(const char *path, bool shuffle, const char *device)
{
    static const nb_feature_spec specs[2] = {{"image", NB_FEATURE_BYTES, 784}, {"label", NB_FEATURE_INT64, 1}};
    nb_dataset *ds = nb_dataset_parse_examples(nb_dataset_from_tfrecord(path), 2, specs);
    if (shuffle)
        ds = nb_dataset_shuffle(ds, 10000, 1);
    ds = nb_dataset_map(nb_dataset_batch(ds, shuffle ? BATCH : 1000, false), 2, scale, NULL);
    return nb_dataset_prefetch(ds, 2, device);
}

static double evaluate(nb_dataset *test, nb_variable *const *p)
{
    double right = 0, seen = 0;
    nb_dataset_iterator *it = nb_dataset_iterate(test);
    for (;;) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *b[2];
        if (nb_dataset_next(it, b) != NB_OK) {
            nb_scope_end(s);
            break;
        }
        right += nb_tensor_item(count_correct(mlp_forward(b[0], p), b[1]));
        seen += (double)nb_tensor_dim(b[0], 0);
        nb_scope_end(s);
    }
    nb_dataset_iterator_free(it);
    return seen > 0 ? right / seen : 0;
}

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);
    const char *dir = FASHION_DIR, *out = NULL;
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    int epochs = 5;
    OPTIONS_READ(argc, argv, "usage: %s [--data DIR] [--out DIR] [--device NAME] [--epochs N] [--quick]\n",
                 OPTION_TEXT("--data", &dir), OPTION_TEXT("--out", &out), OPTION_TEXT("--device", &device),
                 OPTION_NUMBER("--epochs", &epochs), OPTION_QUICK(&quick, &epochs));
    char own[256];
    if (!out) {
        snprintf(own, sizeof own, quick ? "/tmp/nabla-fashion-tfrecord-%d" : "/tmp/nabla-fashion-tfrecord",
                 (int)getpid());
        out = own;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fashion_tfrecord: cannot create %s\n", out);
        return 1;
    }
    char train_path[1024], test_path[1024];
    snprintf(train_path, sizeof train_path, "%s/train.tfrecord", out);
    snprintf(test_path, sizeof test_path, "%s/test.tfrecord", out);

    double t0 = progress_now();
    int64_t n = convert(dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", train_path,
                        quick ? 4000 : 0);
    int64_t n_test = convert(dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", test_path,
                             quick ? 2000 : 0);
    printf("Fashion-MNIST as TFRecord: %lld training and %lld test Examples in %s (written in %.1f s)\n",
           (long long)n, (long long)n_test, out, progress_now() - t0);

    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
    nb_variable *params[MLP_PARAMS];
    mlp_init(params, NULL); /* as in fashion_mnist */
    nb_optimizer *opt = nb_adam_new(1e-3, 0.9, 0.999, 1e-7);
    nb_dataset *train = pipeline(train_path, true, device), *test = pipeline(test_path, false, device);
    int64_t steps = (n + BATCH - 1) / BATCH;
    double test_acc = 0;
    printf("training on %s\nepoch   loss    train acc  test acc  images/s\n", nb_device_current());
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double start = progress_now(), loss_sum = 0, right = 0;
        int64_t seen = 0;
        nb_dataset_iterator *it = nb_dataset_iterate(train);
        progress bar;
        progress_begin(&bar, epoch, steps);
        for (int64_t step = 0; step < steps; step++) {
            nb_scope *s = nb_scope_begin();
            nb_tensor *b[2];
            if (nb_dataset_next(it, b) != NB_OK) {
                nb_scope_end(s);
                break;
            }
            int64_t len = nb_tensor_dim(b[0], 0);
            nb_tape *tape = nb_tape_begin();
            nb_tensor *logits = mlp_forward(b[0], params);
            nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, b[1]));
            nb_tensor *grads[MLP_PARAMS];
            nb_tape_gradient_vars(tape, loss, MLP_PARAMS, params, grads);
            nb_optimizer_apply(opt, MLP_PARAMS, params, grads);
            loss_sum += nb_tensor_item(loss) * (double)len;
            right += nb_tensor_item(count_correct(logits, b[1]));
            seen += len;
            if (progress_due(&bar, step + 1))
                progress_show(&bar, step + 1, loss_sum / (double)seen, seen);
            nb_scope_end(s);
        }
        progress_end(&bar);
        nb_dataset_iterator_free(it);
        double secs = progress_now() - start;
        test_acc = evaluate(test, params);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %8.0f\n", epoch, loss_sum / (double)seen, 100.0 * right / (double)seen,
               100.0 * test_acc, (double)seen / secs);
        fflush(stdout);
    }
    printf("test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_dataset_free(train);
    nb_dataset_free(test);
    mlp_free(params);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    if (out == own && quick) {
        unlink(train_path);
        unlink(test_path);
        rmdir(out);
    }
    return accuracy_floor("fashion_tfrecord", epochs, test_acc, quick ? 0.5 : 0.8);
}
