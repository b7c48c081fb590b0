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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fashion_data.h"
#include "progress.h"

#define BATCH 128

static bool quick; /* missing data then skips (exit 77) */

static double now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

static nb_tensor *model(nb_tensor *x, nb_variable *const *p)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
    h = nb_relu(nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3])));
    return nb_add(nb_matmul(h, nb_read(p[4])), nb_read(p[5]));
}

/* Rows whose largest logit is at the label, as an f32 0-d tensor. */
static nb_tensor *correct(nb_tensor *logits, nb_tensor *labels)
{
    return nb_sum_all(nb_cast(nb_equal(nb_argmax(logits, 1, false), labels), NB_F32));
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
        right += nb_tensor_item(correct(model(b[0], p), b[1]));
        seen += (double)nb_tensor_dim(b[0], 0);
        nb_scope_end(s);
    }
    nb_dataset_iterator_free(it);
    return seen > 0 ? right / seen : 0;
}

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);
    const char *dir = "/usr/share/datasets/fashion-mnist", *out = NULL;
    const char *device = nb_device_count(NB_DEVICE_GPU) > 0 ? "/gpu:0" : "/cpu:0";
    int epochs = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
            epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true, epochs = 1;
        else {
            fprintf(stderr, "usage: %s [--data DIR] [--out DIR] [--device NAME] [--epochs N] [--quick]\n", argv[0]);
            return 2;
        }
    }
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

    double t0 = now();
    int64_t n = convert(dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", train_path,
                        quick ? 4000 : 0);
    int64_t n_test = convert(dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", test_path,
                             quick ? 2000 : 0);
    printf("Fashion-MNIST as TFRecord: %lld training and %lld test Examples in %s (written in %.1f s)\n",
           (long long)n, (long long)n_test, out, now() - t0);

    nb_scope *outer = nb_scope_begin();
    nb_device_push(device);
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
    nb_dataset *train = pipeline(train_path, true, device), *test = pipeline(test_path, false, device);
    int64_t steps = (n + BATCH - 1) / BATCH;
    double test_acc = 0;
    printf("training on %s\nepoch   loss    train acc  test acc  images/s\n", nb_device_current());
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double start = now(), loss_sum = 0, right = 0;
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
            nb_tensor *logits = model(b[0], params);
            nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, b[1]));
            nb_tensor *grads[6];
            nb_tape_gradient_vars(tape, loss, 6, params, grads);
            nb_optimizer_apply(opt, 6, params, grads);
            loss_sum += nb_tensor_item(loss) * (double)len;
            right += nb_tensor_item(correct(logits, b[1]));
            seen += len;
            if (progress_due(&bar, step + 1))
                progress_show(&bar, step + 1, loss_sum / (double)seen, seen);
            nb_scope_end(s);
        }
        progress_end(&bar);
        nb_dataset_iterator_free(it);
        double secs = now() - start;
        test_acc = evaluate(test, params);
        printf("%5d  %7.4f  %8.2f%%  %7.2f%%  %8.0f\n", epoch, loss_sum / (double)seen, 100.0 * right / (double)seen,
               100.0 * test_acc, (double)seen / secs);
        fflush(stdout);
    }
    printf("test accuracy: %.2f%%\n", 100.0 * test_acc);
    nb_dataset_free(train);
    nb_dataset_free(test);
    for (int i = 0; i < 6; i++)
        nb_variable_free(params[i]);
    nb_optimizer_free(opt);
    nb_device_pop();
    nb_scope_end(outer);
    if (out == own && quick) {
        unlink(train_path);
        unlink(test_path);
        rmdir(out);
    }
    if (epochs > 0 && test_acc < (quick ? 0.5 : 0.8)) {
        fprintf(stderr, "fashion_tfrecord: test accuracy %.3f is too low\n", test_acc);
        return 1;
    }
    return 0;
}
