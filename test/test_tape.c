/* The tape: recording, gradients, persistence, nesting, custom gradients, checker. */
#include "check.h"

#include <pthread.h>

static nb_tensor *randn(nb_shape s, uint64_t seed) { return nb_random_normal(NB_F64, s, 0, 1, seed); }

static void test_used_twice_sums(void)
{
    nb_tensor *x = randn(NB_SHAPE(5), 1);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, x));
    nb_tensor *y = nb_sum_all(nb_add(nb_mul(x, x), x)); /* d/dx = 2x + 1 */
    nb_tensor *g;
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(nb_tensor_get(g, i), 2 * nb_tensor_get(x, i) + 1, 1e-12);
    /* A one-shot tape answers once. */
    nb_tensor *g2 = (nb_tensor *)1;
    CHECK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g2) == NB_ERR_TAPE && g2 == NULL);
    CHECK_ERROR(NB_ERR_TAPE, "already taken", "persistent");
}

static void test_persistent_and_unconnected(void)
{
    nb_tensor *x = randn(NB_SHAPE(3), 2), *z = randn(NB_SHAPE(2, 2), 3);
    nb_tape *tape = nb_tape_begin_persistent();
    nb_tape_watch(tape, x);
    nb_tape_watch(tape, z);
    nb_tensor *y = nb_sum_all(nb_sin(x));
    nb_tensor *w = nb_sum_all(nb_exp(x));
    nb_tensor *g[2];
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x, z), g));
    CHECK(g[0] && g[1] == NULL);
    CHECK_NEAR(nb_tensor_get(g[0], 1), cos(nb_tensor_get(x, 1)), 1e-12);
    CHECK_OK(nb_tape_gradient_ex(tape, w, NULL, NB_TENSORS(x, z), g, NB_UNCONNECTED_ZERO));
    CHECK_NEAR(nb_tensor_get(g[0], 2), exp(nb_tensor_get(x, 2)), 1e-12);
    CHECK(g[1] && nb_tensor_dim(g[1], 0) == 2 && nb_tensor_get(g[1], 3) == 0);
    /* Output gradients seed the target. */
    nb_tensor *v = nb_mul_scalar(x, 3.0);
    nb_tensor *seed = randn(NB_SHAPE(3), 4);
    CHECK_OK(nb_tape_gradient_ex(tape, v, seed, NB_TENSORS(x), g, NB_UNCONNECTED_NULL));
    CHECK_NEAR(nb_tensor_get(g[0], 0), 3 * nb_tensor_get(seed, 0), 1e-12);
    CHECK(nb_tape_gradient_ex(tape, v, randn(NB_SHAPE(4), 5), NB_TENSORS(x), g, NB_UNCONNECTED_NULL) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "output gradient", "[4]", "[3]");
    nb_tape_free(tape); /* freed early: the scope must not free it again */
}

static void test_pause_and_watch_errors(void)
{
    nb_tensor *x = randn(NB_SHAPE(3), 6);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, x);
    nb_tape_pause(tape);
    nb_tensor *hidden = nb_exp(x); /* not recorded */
    nb_tape_resume(tape);
    nb_tensor *y = nb_sum_all(nb_add(nb_mul(x, hidden), x));
    nb_tensor *g;
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
    /* hidden is a constant to the tape: d/dx = exp(x) + 1 */
    CHECK_NEAR(nb_tensor_get(g, 0), exp(nb_tensor_get(x, 0)) + 1, 1e-12);

    nb_tape *t2 = nb_tape_begin();
    nb_tensor *idx = nb_arange(NB_I64, 0, 3, 1);
    CHECK(nb_tape_watch(t2, idx) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_tape_watch", "i64");
    CHECK(nb_tape_gradient(t2, NULL, NB_TENSORS(x), &g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "target is NULL");
    /* A NULL from a failed op keeps the op's error. */
    CHECK(nb_tape_gradient(t2, nb_add(x, idx), NB_TENSORS(x), &g) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "add");
}

static void test_second_derivative(void)
{
    nb_tensor *x = randn(NB_SHAPE(4), 7);
    nb_tape *outer = nb_tape_begin();
    nb_tape_watch(outer, x);
    nb_tape *inner = nb_tape_begin();
    nb_tape_watch(inner, x);
    nb_tensor *y = nb_mul(nb_mul(x, x), x);
    nb_tensor *dy, *d2y, *d3y;
    CHECK_OK(nb_tape_gradient(inner, y, NB_TENSORS(x), &dy));
    nb_tape *outermost_check = outer; /* dy = 3x^2 recorded on outer */
    CHECK_OK(nb_tape_gradient(outermost_check, dy, NB_TENSORS(x), &d2y));
    for (int i = 0; i < 4; i++) {
        double xi = nb_tensor_get(x, i);
        CHECK_NEAR(nb_tensor_get(dy, i), 3 * xi * xi, 1e-12);
        CHECK_NEAR(nb_tensor_get(d2y, i), 6 * xi, 1e-12);
    }
    /* Third order through three tapes. */
    nb_tape *t3 = nb_tape_begin(), *t2 = nb_tape_begin(), *t1 = nb_tape_begin();
    nb_tape_watch(t3, x), nb_tape_watch(t2, x), nb_tape_watch(t1, x);
    nb_tensor *z = nb_sum_all(nb_mul(nb_sin(x), x));
    nb_tape_gradient(t1, z, NB_TENSORS(x), &dy);
    nb_tape_gradient(t2, dy, NB_TENSORS(x), &d2y);
    CHECK_OK(nb_tape_gradient(t3, d2y, NB_TENSORS(x), &d3y));
    double x0 = nb_tensor_get(x, 0);
    /* (x sin x)''' = -3 sin x - x cos x */
    CHECK_NEAR(nb_tensor_get(d3y, 0), -3 * sin(x0) - x0 * cos(x0), 1e-10);
}

/* loss(w1, w2) = mean(softplus(tanh(x w1) w2) - y); the Hessian-vector product
 * H v = d/dw (grad . v), against finite differences of the gradient. */
static nb_tensor *mlp_loss(nb_tensor *x, nb_tensor *w1, nb_tensor *w2)
{
    return nb_mean_all(nb_softplus(nb_matmul(nb_tanh(nb_matmul(x, w1)), w2)));
}

static void mlp_grad(nb_tensor *x, nb_tensor *w1, nb_tensor *w2, nb_tensor **g)
{
    nb_tape *t = nb_tape_begin();
    nb_tape_watch(t, w1), nb_tape_watch(t, w2);
    nb_tape_gradient(t, mlp_loss(x, w1, w2), NB_TENSORS(w1, w2), g);
}

static void test_hessian_vector_product(void)
{
    nb_tensor *x = randn(NB_SHAPE(6, 4), 10), *w1 = randn(NB_SHAPE(4, 5), 11), *w2 = randn(NB_SHAPE(5, 1), 12);
    nb_tensor *v1 = randn(NB_SHAPE(4, 5), 13), *v2 = randn(NB_SHAPE(5, 1), 14);
    nb_tape *outer = nb_tape_begin();
    nb_tape_watch(outer, w1), nb_tape_watch(outer, w2);
    nb_tensor *g[2], *hv[2];
    mlp_grad(x, w1, w2, g);
    nb_tensor *gv = nb_add(nb_sum_all(nb_mul(g[0], v1)), nb_sum_all(nb_mul(g[1], v2)));
    CHECK_OK(nb_tape_gradient(outer, gv, NB_TENSORS(w1, w2), hv));
    /* (grad(w + e v) - grad(w - e v)) / 2e */
    double e = 1e-5;
    nb_tensor *gp[2], *gm[2];
    mlp_grad(x, nb_add(w1, nb_mul_scalar(v1, e)), nb_add(w2, nb_mul_scalar(v2, e)), gp);
    mlp_grad(x, nb_sub(w1, nb_mul_scalar(v1, e)), nb_sub(w2, nb_mul_scalar(v2, e)), gm);
    for (int k = 0; k < 2; k++) {
        nb_tensor *fd = nb_mul_scalar(nb_sub(gp[k], gm[k]), 1 / (2 * e));
        double *ref = check_values(fd);
        CHECK(check_max_error(hv[k], ref, nb_tensor_numel(fd)) < 1e-7);
        free(ref);
    }
}

/* Custom gradient: forward y = x^2, backward deliberately 2x g scaled by user. */
static nb_status sq_forward(int n_in, nb_tensor *const *in, int n_out, nb_tensor **out, void *user)
{
    (void)n_in, (void)n_out, (void)user;
    out[0] = nb_square(in[0]);
    return out[0] ? NB_OK : nb_error();
}

static nb_status sq_backward(int n_in, nb_tensor *const *in, int n_out, nb_tensor *const *out,
                             nb_tensor *const *gout, nb_tensor **gin, void *user)
{
    (void)n_in, (void)n_out, (void)out;
    gin[0] = nb_mul(gout[0], nb_mul_scalar(in[0], *(double *)user));
    return gin[0] ? NB_OK : nb_error();
}

static nb_tensor *custom_fn(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    nb_tensor *y;
    if (nb_custom_gradient(1, in, 1, &y, sq_forward, sq_backward, user))
        return NULL;
    return nb_sin(y);
}

static void test_custom_gradient_and_checker(void)
{
    nb_tensor *x = randn(NB_SHAPE(3, 2), 20);
    double right = 2.0, wrong = 2.5, err;
    CHECK_OK(nb_gradient_check(custom_fn, &right, NB_TENSORS(x), 1e-6, 1e-6, &err));
    CHECK(err < 1e-6);
    /* The checker catches a wrong gradient and says where. */
    CHECK(nb_gradient_check(custom_fn, &wrong, NB_TENSORS(x), 1e-6, 1e-6, &err) == NB_ERR_TAPE);
    CHECK(err > 1e-3);
    CHECK_ERROR(NB_ERR_TAPE, "nb_gradient_check", "input 0 element");
    /* The custom op's own backward is what an outer tape differentiates. */
    nb_tape *outer = nb_tape_begin(), *inner = nb_tape_begin();
    nb_tape_watch(outer, x), nb_tape_watch(inner, x);
    nb_tensor *y;
    nb_custom_gradient(1, &x, 1, &y, sq_forward, sq_backward, &right);
    nb_tensor *g, *h;
    CHECK_OK(nb_tape_gradient(inner, nb_sum_all(y), NB_TENSORS(x), &g));
    CHECK_OK(nb_tape_gradient(outer, nb_sum_all(g), NB_TENSORS(x), &h));
    CHECK_NEAR(nb_tensor_get(h, 0), 2.0, 1e-12);
    nb_tensor *f32 = nb_ones(NB_F32, NB_SHAPE(2));
    CHECK(nb_gradient_check(custom_fn, &right, NB_TENSORS(f32), 1e-6, 1e-6, NULL) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "f64");
}

static void test_one_shot_releases(void)
{
    nb_tensor *x = randn(NB_SHAPE(100), 30);
    int64_t before = nb_live_tensors();
    nb_scope *s = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, x);
    nb_tensor *y = x;
    for (int i = 0; i < 10; i++)
        y = nb_tanh(y);
    nb_keep(nb_sum_all(y)); /* moves to the test's scope */
    nb_scope_end(s);        /* the scope's tensors go, the tape (in it) too */
    CHECK(nb_live_tensors() == before + 1);

    /* Out of scope ownership: a tape saves intermediates until its gradient. */
    nb_tape *t = nb_tape_begin();
    nb_tape_watch(t, x);
    nb_scope *s2 = nb_scope_begin();
    nb_tensor *z = x;
    for (int i = 0; i < 10; i++)
        z = nb_tanh(z);
    z = nb_keep(nb_sum_all(z));
    nb_scope_end(s2);
    int64_t saved = nb_live_tensors();
    CHECK(saved >= before + 10); /* the tape holds the chain */
    nb_tensor *g;
    CHECK_OK(nb_tape_gradient(t, z, NB_TENSORS(x), &g));
    CHECK(nb_live_tensors() <= before + 4); /* the loss above, z, g and nothing saved */
    nb_tape_free(t);
}

/* A NULL gradient array is refused, not written through. */
static void test_null_gradient_array(void)
{
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(2));
    nb_variable *v = nb_variable_new("v", x);
    nb_tape *t = nb_tape_begin_persistent();
    CHECK_OK(nb_tape_watch(t, x));
    nb_tensor *y = nb_sum_all(nb_mul(x, nb_read(v)));
    CHECK(nb_tape_gradient(t, y, 1, &x, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tape_gradient", "array", "NULL");
    CHECK(nb_tape_gradient_vars(t, y, 1, &v, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tape_gradient", "array", "NULL");
    nb_tensor *g = NULL;
    CHECK(nb_tape_gradient(t, y, -1, &x, &g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tape_gradient", "negative");
    nb_tape_free(t);
    nb_variable_free(v);
}

/* A freed tape leaves its buffers to the thread's next tapes: those start
 * empty (a tensor the old tape watched is not watched by the new one) and
 * grow past what they were given; a thread that ends gives them back (the
 * sanitizer build's leak check sees it). */
static nb_tensor *record_chain(nb_tape *tape, nb_tensor *x, int n)
{
    nb_tape_watch(tape, x);
    nb_tensor *y = x;
    for (int i = 0; i < n; i++)
        y = nb_add_scalar(nb_mul_scalar(y, -1.0), 1.0); /* d/dx = (-1)^n */
    return nb_sum_all(y);
}

static void *tape_thread(void *arg)
{
    nb_tensor *x = arg;
    for (int round = 0; round < 3; round++) {
        nb_scope *s = nb_scope_begin();
        nb_tape *tape = nb_tape_begin();
        nb_tensor *y = record_chain(tape, x, 500 * (round + 1)), *g;
        CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(x), &g));
        CHECK(nb_tensor_get(g, 0) == 1.0);
        nb_scope_end(s);
    }
    return NULL;
}

static void test_reused_buffers(void)
{
    nb_tensor *x = randn(NB_SHAPE(4), 40), *z = randn(NB_SHAPE(4), 41);
    nb_scope *s = nb_scope_begin();
    nb_tape *a = nb_tape_begin();
    nb_tensor *ya = record_chain(a, x, 3000); /* grows the nodes, the arena and the watched set */
    CHECK(ya != NULL);
    nb_tape_free(a);
    nb_tape *b = nb_tape_begin_persistent(); /* takes a's buffers */
    nb_tape_watch(b, z);
    nb_tensor *y = nb_sum_all(nb_mul(x, x)), *g = (nb_tensor *)1;
    CHECK_OK(nb_tape_gradient(b, y, NB_TENSORS(x), &g));
    CHECK(g == NULL); /* x was a's, not b's */
    nb_tensor *w = record_chain(b, z, 4000);
    CHECK_OK(nb_tape_gradient(b, w, NB_TENSORS(z), &g));
    CHECK(g && nb_tensor_get(g, 3) == 1.0);
    nb_tape_free(b);
    nb_scope_end(s);

    pthread_t t;
    CHECK(pthread_create(&t, NULL, tape_thread, x) == 0);
    pthread_join(t, NULL);
}

int main(void)
{
    RUN(test_used_twice_sums);
    RUN(test_persistent_and_unconnected);
    RUN(test_pause_and_watch_errors);
    RUN(test_second_derivative);
    RUN(test_hessian_vector_product);
    RUN(test_custom_gradient_and_checker);
    RUN(test_one_shot_releases);
    RUN(test_null_gradient_array);
    RUN(test_reused_buffers);
    return check_finish();
}
