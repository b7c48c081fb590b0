/* Layers: their variables' names, shapes, initial values and trainable flags,
 * what apply computes (against the ops it stands for), batch norm's moving
 * averages, dropout's changing masks, and errors. */
#include "check.h"

#include <nabla/layers.h>

static double max_abs_diff(nb_tensor *a, nb_tensor *b)
{
    return nb_tensor_item(nb_max(nb_abs(nb_sub(a, b)), NB_ALL_AXES, false));
}

static void test_dense(void)
{
    nb_dense_layer d;
    CHECK_OK(nb_dense_init(&d, "dense", 5, 3, true, NB_F64, 1));
    CHECK(strcmp(nb_variable_name(d.kernel), "dense/kernel") == 0);
    CHECK(strcmp(nb_variable_name(d.bias), "dense/bias") == 0);
    CHECK(nb_variable_shape(d.kernel).ndim == 2 && nb_variable_shape(d.kernel).dims[0] == 5 &&
          nb_variable_shape(d.kernel).dims[1] == 3);
    CHECK(nb_tensor_item(nb_sum_all(nb_abs(nb_read(d.bias)))) == 0);
    double limit = sqrt(6.0 / 8);
    CHECK(nb_tensor_item(nb_max(nb_abs(nb_read(d.kernel)), NB_ALL_AXES, false)) <= limit);
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(4, 5), 0, 1, 2);
    nb_variable_assign(d.bias, nb_full(NB_F64, NB_SHAPE(3), 0.5));
    nb_tensor *want = nb_add(nb_matmul(x, nb_read(d.kernel)), nb_read(d.bias));
    CHECK(max_abs_diff(nb_dense_apply(&d, x), want) == 0);
    /* a second layer of that name is refused, and leaves nothing behind */
    nb_dense_layer dup;
    int before = nb_variables_list(NULL, 0);
    CHECK(nb_dense_init(&dup, "dense", 5, 3, true, NB_F64, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "dense/kernel");
    CHECK(nb_variables_list(NULL, 0) == before);
    nb_dense_free(&dup); /* safe on a failed init */
    CHECK(nb_dense_init(&dup, "bad", 0, 3, true, NB_F64, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dense_init", "'bad'", "in is 0");
    /* under a pushed scope the names nest */
    CHECK_OK(nb_variable_scope_push("model", false));
    nb_dense_layer inner;
    CHECK_OK(nb_dense_init(&inner, "head", 3, 2, false, NB_F32, 3));
    CHECK_OK(nb_variable_scope_pop());
    CHECK(strcmp(nb_variable_name(inner.kernel), "model/head/kernel") == 0 && inner.bias == NULL);
    CHECK(nb_dense_apply(&inner, nb_ones(NB_F64, NB_SHAPE(2, 3))) == NULL); /* f64 input, f32 kernel */
    CHECK_ERROR(NB_ERR_DTYPE, "matmul");
    nb_dense_free(&inner);
    nb_dense_free(&d);
    CHECK(d.kernel == NULL && d.bias == NULL);
    nb_dense_free(&d); /* twice is fine */
}

static void test_conv2d(void)
{
    nb_conv2d_layer c;
    CHECK_OK(nb_conv2d_init(&c, "conv1", 3, 8, 3, 3, NULL, true, NB_F64, 4));
    CHECK(strcmp(nb_variable_name(c.kernel), "conv1/kernel") == 0);
    nb_shape ks = nb_variable_shape(c.kernel);
    CHECK(ks.ndim == 4 && ks.dims[0] == 3 && ks.dims[1] == 3 && ks.dims[2] == 3 && ks.dims[3] == 8);
    CHECK(c.opts.padding == NB_PAD_SAME);
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(2, 6, 5, 3), 0, 1, 5);
    nb_variable_assign(c.bias, nb_arange(NB_F64, 0, 8, 1));
    nb_tensor *y = nb_conv2d_apply(&c, x);
    CHECK(y && nb_tensor_dim(y, 1) == 6 && nb_tensor_dim(y, 2) == 5 && nb_tensor_dim(y, 3) == 8);
    nb_tensor *want = nb_add(nb_conv2d(x, nb_read(c.kernel), &c.opts), nb_read(c.bias));
    CHECK(y && max_abs_diff(y, want) == 0);
    /* groups must divide both channel counts */
    nb_conv2d_opts g = {.groups = 2, .padding = NB_PAD_VALID};
    nb_conv2d_layer bad;
    CHECK(nb_conv2d_init(&bad, "conv_bad", 3, 8, 3, 3, &g, true, NB_F64, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv_bad", "groups");
    /* NCHW: the bias broadcasts over axis 1 */
    nb_conv2d_opts nchw = {.padding = NB_PAD_VALID, .format = NB_NCHW};
    nb_conv2d_layer cn;
    CHECK_OK(nb_conv2d_init(&cn, "conv_nchw", 3, 4, 2, 2, &nchw, true, NB_F64, 6));
    nb_variable_assign(cn.bias, nb_arange(NB_F64, 1, 5, 1));
    nb_tensor *xn = nb_random_normal(NB_F64, NB_SHAPE(1, 3, 4, 4), 0, 1, 7);
    nb_tensor *yn = nb_conv2d_apply(&cn, xn);
    CHECK(yn && nb_tensor_dim(yn, 1) == 4 && nb_tensor_dim(yn, 2) == 3);
    nb_tensor *wn = nb_add(nb_conv2d(xn, nb_read(cn.kernel), &nchw), nb_reshape(nb_read(cn.bias), NB_SHAPE(1, 4, 1, 1)));
    CHECK(yn && max_abs_diff(yn, wn) == 0);
    nb_conv2d_free(&cn);
    nb_conv2d_free(&c);
}

static void test_batch_norm(void)
{
    nb_batch_norm_layer bn;
    CHECK_OK(nb_batch_norm_init(&bn, "bn", 3, 0.9, 1e-3, NB_NHWC, NB_F64));
    CHECK(strcmp(nb_variable_name(bn.moving_mean), "bn/moving_mean") == 0);
    CHECK(strcmp(nb_variable_name(bn.moving_variance), "bn/moving_variance") == 0);
    CHECK(nb_variable_trainable(bn.gamma) && nb_variable_trainable(bn.beta));
    CHECK(!nb_variable_trainable(bn.moving_mean) && !nb_variable_trainable(bn.moving_variance));
    nb_tensor *x = nb_add_scalar(nb_mul_scalar(nb_random_normal(NB_F64, NB_SHAPE(4, 5, 2, 3), 0, 1, 8), 2.0), 1.0);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, x);
    nb_tensor *y = nb_batch_norm_apply(&bn, x, true);
    CHECK(y != NULL);
    /* the moving averages moved 10% of the way to the batch's statistics */
    nb_tensor *mean = nb_mean(x, NB_AXES(0, 1, 2), false);
    nb_tensor *var = nb_mul_scalar(nb_mean(nb_square(nb_sub(x, mean)), NB_AXES(0, 1, 2), false), 40.0 / 39.0);
    CHECK(max_abs_diff(nb_read(bn.moving_mean), nb_mul_scalar(mean, 0.1)) < 1e-12);
    CHECK(max_abs_diff(nb_read(bn.moving_variance), nb_add_scalar(nb_mul_scalar(var, 0.1), 0.9)) < 1e-12);
    /* nothing about the moving averages is on the tape: the gradient of y's sum
     * through batch norm (gamma 1) is zero up to rounding */
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(y), 1, &x, &g));
    CHECK(g && nb_tensor_item(nb_max(nb_abs(g), NB_ALL_AXES, false)) < 1e-9);
    nb_tape_free(tape);
    /* inference uses the moving averages */
    nb_tensor *yi = nb_batch_norm_apply(&bn, x, false);
    nb_tensor *want = nb_div(nb_sub(x, nb_read(bn.moving_mean)), nb_sqrt(nb_add_scalar(nb_read(bn.moving_variance), 1e-3)));
    CHECK(yi && max_abs_diff(yi, want) < 1e-12);
    nb_batch_norm_layer bad;
    CHECK(nb_batch_norm_init(&bad, "bn_bad", 3, 1.5, 0, NB_NHWC, NB_F64) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "bn_bad", "momentum");
    nb_batch_norm_free(&bn);
}

static void test_layer_norm_embedding_dropout(void)
{
    nb_layer_norm_layer ln;
    CHECK_OK(nb_layer_norm_init(&ln, "ln", 6, 1e-5, NB_F64));
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(3, 6), 2, 3, 9);
    nb_tensor *y = nb_layer_norm_apply(&ln, x);
    CHECK(y && nb_tensor_item(nb_max(nb_abs(nb_mean(y, NB_AXES(-1), false)), NB_ALL_AXES, false)) < 1e-12);
    nb_layer_norm_free(&ln);

    nb_embedding_layer e;
    CHECK_OK(nb_embedding_init(&e, "embed", 10, 4, NB_F32, 10));
    CHECK(strcmp(nb_variable_name(e.table), "embed/embeddings") == 0);
    CHECK(nb_tensor_item(nb_max(nb_abs(nb_read(e.table)), NB_ALL_AXES, false)) <= 0.05);
    const int64_t ids[5] = {3, 3, 0, 9, 3};
    nb_tensor *iv = nb_from_buffer(NB_I64, NB_SHAPE(5), ids);
    nb_tensor *rows = nb_embedding_apply(&e, iv);
    CHECK(rows && nb_tensor_dim(rows, 0) == 5 && nb_tensor_dim(rows, 1) == 4);
    CHECK(rows && max_abs_diff(rows, nb_gather(nb_read(e.table), iv)) == 0);
    nb_embedding_free(&e);

    nb_dropout_layer d;
    CHECK_OK(nb_dropout_init(&d, 0.5, 11));
    nb_tensor *ones = nb_ones(NB_F32, NB_SHAPE(1000));
    nb_tensor *a = nb_dropout_apply(&d, ones, true), *b = nb_dropout_apply(&d, ones, true);
    CHECK(a && b && max_abs_diff(a, b) > 0); /* each training call draws a new mask */
    CHECK(a && fabs(nb_tensor_item(nb_mean_all(a)) - 1.0) < 0.15);
    nb_tensor *off = nb_dropout_apply(&d, ones, false);
    CHECK(off && max_abs_diff(off, ones) == 0);
    nb_dropout_layer again;
    CHECK_OK(nb_dropout_init(&again, 0.5, 11));
    CHECK(max_abs_diff(nb_dropout_apply(&again, ones, true), a) == 0); /* the same seed, the same masks */
    CHECK(nb_dropout_init(&again, 1.0, 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "rate");
}

static void test_trainable_list(void)
{
    nb_variables_free_all();
    nb_dense_layer d;
    nb_batch_norm_layer bn;
    CHECK_OK(nb_dense_init(&d, "d", 2, 2, true, NB_F32, 1));
    CHECK_OK(nb_batch_norm_init(&bn, "b", 2, 0, 0, NB_NHWC, NB_F32));
    nb_variable *vars[8];
    CHECK(nb_variables_list(NULL, 0) == 6);
    CHECK(nb_trainable_variables(vars, 8) == 4);
    CHECK(vars[0] == d.kernel && vars[1] == d.bias && vars[2] == bn.gamma && vars[3] == bn.beta);
    CHECK(bn.momentum == 0.99 && bn.epsilon == 1e-3);
    nb_dense_free(&d);
    nb_batch_norm_free(&bn);
}

int main(void)
{
    RUN(test_dense);
    RUN(test_conv2d);
    RUN(test_batch_norm);
    RUN(test_layer_norm_embedding_dropout);
    RUN(test_trainable_list);
    nb_variables_free_all();
    return check_finish();
}
