/* The MLP of the Fashion-MNIST samples (fashion_mnist, mirrored_mnist,
 * fashion_tfrecord): 784 -> 256 -> 128 -> 10 with relu between, its variables
 * dense1/w, dense1/b, ..., dense3/b in that order (header-only). */
#ifndef NB_SAMPLES_FASHION_MLP_H
#define NB_SAMPLES_FASHION_MLP_H

#include <nabla/nabla.h>
#include <math.h>
#include <stdio.h>

#define MLP_PARAMS 6

/* Variable i of the MLP (0 .. MLP_PARAMS - 1): its name to name, and its
 * initial value on the current device: He-initialised weights, zero biases. */
static inline nb_tensor *mlp_initial(int i, char name[32])
{
    const int64_t sizes[4] = {784, 256, 128, 10};
    int l = i / 2;
    snprintf(name, 32, "dense%d/%s", l + 1, i % 2 ? "b" : "w");
    if (i % 2)
        return nb_zeros(NB_F32, NB_SHAPE(sizes[l + 1]));
    return nb_truncated_normal(NB_F32, NB_SHAPE(sizes[l], sizes[l + 1]), 0, sqrt(2.0 / (double)sizes[l]), 100 + l);
}

/* The MLP's variables on the current device; with a strategy s, mirrored
 * variables, one copy on each of its replicas. */
static inline void mlp_init(nb_variable *p[MLP_PARAMS], nb_mirrored *s)
{
    for (int i = 0; i < MLP_PARAMS; i++) {
        char name[32];
        nb_tensor *t = mlp_initial(i, name);
        p[i] = s ? nb_mirrored_variable_new(s, name, t) : nb_variable_new(name, t);
    }
}

/* x [B, 784] -> logits [B, 10]. Inside a replica function nb_read gives that
 * replica's copy of each variable. */
static inline nb_tensor *mlp_forward(nb_tensor *x, nb_variable *const *p)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
    h = nb_relu(nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3])));
    return nb_add(nb_matmul(h, nb_read(p[4])), nb_read(p[5]));
}

/* mlp_forward as training.h's classifier takes it: the model is the variables
 * (the same in training and at inference). */
static inline nb_tensor *mlp_logits(void *params, nb_tensor *x, bool training)
{
    (void)training;
    return mlp_forward(x, params);
}

/* Histograms of the three weight matrices, tagged dense1/w ... dense3/w (w
 * may be NULL: none). */
static inline void mlp_summaries(nb_summary_writer *w, int epoch, nb_variable *const *p)
{
    if (!w)
        return;
    for (int l = 0; l < 3; l++) {
        char tag[32];
        snprintf(tag, sizeof tag, "dense%d/w", l + 1);
        nb_summary_histogram(w, tag, epoch, nb_read(p[2 * l]));
    }
}

static inline void mlp_free(nb_variable *p[MLP_PARAMS])
{
    for (int i = 0; i < MLP_PARAMS; i++)
        nb_variable_free(p[i]);
}

#endif
