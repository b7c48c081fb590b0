/* Linear regression: fit s = w·x + b to noisy synthetic data by gradient descent.
 *
 *   linear_regression [--device NAME] [--steps N] [--quick]
 *
 * Prints the loss as it falls and the learned w and b beside the true ones. */
#include <nabla/nabla.h>
#include <stdio.h>

#include "command_line.h"

int main(int argc, char **argv)
{
    nb_set_error_handler(nb_error_handler_exit, NULL); /* print and exit on any error */

    int steps = 200;
    steps_options_read(argc, argv, &steps, 100);

    nb_scope *outer = nb_scope_begin();
    printf("linear regression on %s, %d steps\n", nb_device_current(), steps);

    /* 1000 examples of 3 features; s = x·w_true + b_true + noise. */
    const float w_true[3] = {2.0f, -3.4f, 0.5f};
    const float b_true = 4.2f;
    const int64_t n = 1000;
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(n, 3), 0, 1, 1);
    nb_tensor *wt = nb_from_buffer(NB_F32, NB_SHAPE(3, 1), w_true);
    nb_tensor *noise = nb_random_normal(NB_F32, NB_SHAPE(n, 1), 0, 0.01, 2);
    nb_tensor *s = nb_add(nb_add_scalar(nb_matmul(x, wt), b_true), noise);

    nb_variable *w = nb_variable_new("w", nb_zeros(NB_F32, NB_SHAPE(3, 1)));
    nb_variable *b = nb_variable_new("b", nb_zeros(NB_F32, NB_SHAPE(1)));
    nb_optimizer *opt = nb_sgd_new(0.1);

    for (int step = 0; step < steps; step++) {
        nb_scope *sc = nb_scope_begin(); /* releases every temporary of the step */
        nb_tape *tape = nb_tape_begin();
        nb_tensor *pred = nb_add(nb_matmul(x, nb_read(w)), nb_read(b));
        nb_tensor *loss = nb_mean_squared_error(pred, s);
        nb_tensor *grads[2];
        nb_tape_gradient_vars(tape, loss, NB_VARS(w, b), grads);
        nb_optimizer_apply(opt, NB_VARS(w, b), grads);
        if (step % 20 == 0 || step == steps - 1)
            printf("step %4d  loss %.6f\n", step, nb_tensor_item(loss));
        nb_scope_end(sc);
    }

    nb_tensor *wv = nb_read(w), *bv = nb_read(b);
    double worst = 0;
    printf("learned w = [");
    for (int i = 0; i < 3; i++) {
        double v = nb_tensor_get(wv, i);
        printf("%s%.4f", i ? ", " : "", v);
        if (v - w_true[i] > worst || w_true[i] - v > worst)
            worst = v > w_true[i] ? v - w_true[i] : w_true[i] - v;
    }
    printf("]  (true [%.4f, %.4f, %.4f])\n", w_true[0], w_true[1], w_true[2]);
    printf("learned b = %.4f  (true %.4f)\n", nb_tensor_get(bv, 0), b_true);

    nb_optimizer_free(opt);
    nb_variable_free(w);
    nb_variable_free(b);
    nb_device_pop();
    nb_scope_end(outer);
    if (steps >= 100 && worst > 0.05) {
        fprintf(stderr, "linear_regression: w is %.4f away from the truth\n", worst);
        return 1;
    }
    return 0;
}
