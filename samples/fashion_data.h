/* What the Fashion-MNIST samples share: finding the data set and reading its
 * IDX files (the samples include it; each stays one file of its own). */
#ifndef NB_SAMPLES_FASHION_DATA_H
#define NB_SAMPLES_FASHION_DATA_H

#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>

/* Where Debian and Ubuntu's dataset-fashion-mnist puts the four files. */
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* Says that DIR/NAME (path) is missing and how to get the data set, then exits:
 * 77 under --quick, which meson counts as a skipped test, 1 otherwise. */
static inline void fashion_missing(const char *prog, const char *path, bool quick)
{
    fprintf(stderr,
            "%s: cannot open %s\n"
            "  Install the data set with `apt-get install dataset-fashion-mnist`, or pass\n"
            "  --data DIR naming a folder with the four *-ubyte.gz files of Fashion-MNIST.\n",
            prog, path);
    exit(quick ? 77 : 1);
}

/* Reads DIR/NAME, keeping its first `limit` rows (all when limit <= 0): images
 * as f32 in [0, 1] of shape [n] + image_shape ({784} for an MLP, {28, 28, 1}
 * for NHWC convolutions), or labels as i64 [n]. The result is made on the
 * current device (the bytes are read on the CPU and copied there). */
static inline nb_tensor *fashion_load(const char *prog, const char *dir, const char *name, bool images,
                                      nb_shape image_shape, int64_t limit, bool quick)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fashion_missing(prog, path, quick);
    fclose(f);
    nb_tensor *t = nb_idx_read(path); /* u8 on the CPU: [n, 28, 28] or [n] */
    int64_t n = nb_tensor_dim(t, 0);
    if (limit > 0 && limit < n)
        n = limit;
    if (!images)
        return nb_cast(nb_slice(t, NB_SHAPE(0), NB_SHAPE(n)), NB_I64);
    nb_shape shape = {image_shape.ndim + 1, {-1}}, begin = {image_shape.ndim + 1, {0}},
             size = {image_shape.ndim + 1, {n}};
    for (int i = 0; i < image_shape.ndim; i++) {
        shape.dims[i + 1] = image_shape.dims[i];
        size.dims[i + 1] = -1;
    }
    t = nb_slice(nb_reshape(t, shape), begin, size);
    return nb_mul_scalar(nb_cast(t, NB_F32), 1.0 / 255);
}

/* The four files of Fashion-MNIST in DIR. */
typedef struct fashion_set {
    nb_tensor *x_train, *y_train, *x_test, *y_test;
} fashion_set;

/* Reads the training images and labels, then the test ones, each as
 * fashion_load makes them, keeping the first train_limit and test_limit rows
 * (all when 0). */
static inline fashion_set fashion_load_set(const char *prog, const char *dir, nb_shape image_shape,
                                           int64_t train_limit, int64_t test_limit, bool quick)
{
    fashion_set d;
    d.x_train = fashion_load(prog, dir, "train-images-idx3-ubyte.gz", true, image_shape, train_limit, quick);
    d.y_train = fashion_load(prog, dir, "train-labels-idx1-ubyte.gz", false, image_shape, train_limit, quick);
    d.x_test = fashion_load(prog, dir, "t10k-images-idx3-ubyte.gz", true, image_shape, test_limit, quick);
    d.y_test = fashion_load(prog, dir, "t10k-labels-idx1-ubyte.gz", false, image_shape, test_limit, quick);
    return d;
}

#endif
