/* A binary classifier 5 -> 10 -> 1 (ReLU, sigmoid cross-entropy) trained by
 * gradient descent on synthetic, linearly separable data.
 *
 *   classifier [--device NAME] [--steps N] [--quick]
 *
 * Prints the loss as it falls and the accuracy on training and held-out data. */
#include <nabla/nabla.h>
#include <math.h>
#include <stdio.h>

#include "command_line.h"

/* Points x ~ N(0, 1) in 5-d, labelled 1 when x·v > 0.2, else 0 (as f32 [n, 1]). */
static void make_data(int64_t n, uint64_t seed, nb_tensor **x, nb_tensor **y)
{
    const float v[5] = {1.0f, -2.0f, 0.5f, 1.5f, -0.7f};
    *x = nb_random_normal(NB_F32, NB_SHAPE(n, 5), 0, 1, seed);
    nb_tensor *score = nb_matmul(*x, nb_from_buffer(NB_F32, NB_SHAPE(5, 1), v));
    *y = nb_cast(nb_greater(score, nb_scalar(NB_F32, 0.2)), NB_F32);
}

static nb_tensor *model(nb_tensor *x, nb_variable *const *p)
{
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(p[0])), nb_read(p[1])));
    return nb_add(nb_matmul(h, nb_read(p[2])), nb_read(p[3])); /* logits [n, 1] */
}

/* Fraction of examples where (logit > 0) matches the label. */
static double accuracy(nb_tensor *logits, nb_tensor *y)
{
    nb_tensor *pred = nb_cast(nb_greater(logits, nb_scalar(NB_F32, 0)), NB_F32);
    return nb_tensor_item(nb_mean_all(nb_cast(nb_equal(pred, y), NB_F32)));
}

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL);

    int steps = 1000;
    steps_options_read(argc, argv, &steps, 300);

    nb_scope *outer = nb_scope_begin();
    printf("binary classifier 5 -> 10 -> 1 on %s, %d steps\n", nb_device_current(), steps);

    nb_tensor *x, *y, *x_test, *y_test;
    make_data(1000, 1, &x, &y);
    make_data(500, 2, &x_test, &y_test);

    nb_variable *params[4] = {
        nb_variable_new("dense1/w", nb_random_normal(NB_F32, NB_SHAPE(5, 10), 0, sqrt(2.0 / 5), 9)),
        nb_variable_new("dense1/b", nb_zeros(NB_F32, NB_SHAPE(10))),
        nb_variable_new("dense2/w", nb_random_normal(NB_F32, NB_SHAPE(10, 1), 0, sqrt(1.0 / 10), 10)),
        nb_variable_new("dense2/b", nb_zeros(NB_F32, NB_SHAPE(1))),
    };
    nb_optimizer *opt = nb_sgd_new(0.5);

    for (int step = 0; step < steps; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tape *tape = nb_tape_begin();
        nb_tensor *logits = model(x, params);
        nb_tensor *loss = nb_mean_all(nb_sigmoid_cross_entropy(logits, y));
        nb_tensor *grads[4];
        nb_tape_gradient_vars(tape, loss, 4, params, grads);
        nb_optimizer_apply(opt, 4, params, grads);
        if (step % 100 == 0 || step == steps - 1)
            printf("step %4d  loss %.4f  train accuracy %.3f\n", step, nb_tensor_item(loss),
                   accuracy(logits, y));
        nb_scope_end(s);
    }

    nb_scope *s = nb_scope_begin();
    double train_acc = accuracy(model(x, params), y);
    double test_acc = accuracy(model(x_test, params), y_test);
    printf("accuracy: train %.1f%%, test %.1f%%\n", 100 * train_acc, 100 * test_acc);
    nb_scope_end(s);

    nb_optimizer_free(opt);
    for (int i = 0; i < 4; i++)
        nb_variable_free(params[i]);
    nb_device_pop();
    nb_scope_end(outer);
    if (test_acc < 0.9) {
        fprintf(stderr, "classifier: test accuracy %.3f is below 0.9\n", test_acc);
        return 1;
    }
    return 0;
}
