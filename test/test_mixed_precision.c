/* Mixed precision (nb_set_compute_dtype): dense and conv2d layers multiply in
 * bf16 or f16 and keep f32 variables and gradients. On the CPU (emulated) the
 * products and the gradients match a double reference rounded as the policy
 * says, to one unit in the last place of the compute dtype; f32 and f64
 * layers are untouched; bad settings are refused. With --gpu, the GPU's
 * native products and gradients are compared with the CPU's emulation. */
#include "check.h"

static bool gpu_mode;

static uint64_t rng = 0x853C49E6748FEA9Bull;

static double rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static nb_tensor *random_f32(int64_t rows, int64_t cols)
{
    float *h = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        h[i] = (float)rnd();
    nb_tensor *t = nb_from_buffer(NB_F32, NB_SHAPE(rows, cols), h);
    free(h);
    return t;
}

/* v rounded to c (the CPU's conversion, straight from double). */
static double round_to(double v, nb_dtype c)
{
    nb_scope *s = nb_scope_begin();
    double r = nb_tensor_item(nb_cast(nb_cast(nb_scalar(NB_F64, v), c), NB_F64));
    nb_scope_end(s);
    return r;
}

static double *values(const nb_tensor *t)
{
    nb_scope *s = nb_scope_begin();
    int64_t n = nb_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    CHECK_OK(nb_tensor_read(nb_cast(t, NB_F64), v, sizeof(double) * (size_t)n));
    nb_scope_end(s);
    return v;
}

/* One unit in the last place of c at the magnitude of v. */
static double ulp(double v, nb_dtype c)
{
    int e;
    frexp(fabs(v) > 0x1p-14 ? v : 0x1p-14, &e);
    return ldexp(1.0, e - (c == NB_BF16 ? 8 : 11));
}

/* got[i] within one unit of c of want[i] (want rounded to c already). */
static int count_off(const double *got, const double *want, int64_t n, nb_dtype c, const char *what)
{
    int off = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= ulp(want[i], c))) {
            if (off++ < 3)
                fprintf(stderr, "%s %s: element %lld is %.9g, want %.9g\n", what, nb_dtype_name(c), (long long)i,
                        got[i], want[i]);
        }
    return off;
}

/* r(a) r(b) summed in double for a [m, k] times b [k, n] (transposes by flags). */
static double *product_ref(const double *a, const double *b, int64_t m, int64_t k, int64_t n, bool ta, bool tb,
                           nb_dtype c)
{
    double *out = malloc(sizeof(double) * (size_t)(m * n));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t q = 0; q < k; q++) {
                double x = ta ? a[q * m + i] : a[i * k + q], y = tb ? b[j * k + q] : b[q * n + j];
                s += round_to(x, c) * round_to(y, c);
            }
            out[i * n + j] = round_to(s, c);
        }
    return out;
}

static void test_setting(void)
{
    CHECK(nb_compute_dtype() == NB_F32);
    CHECK(nb_set_compute_dtype(NB_I32) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_set_compute_dtype", "i32");
    CHECK(nb_set_compute_dtype(NB_F64) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "f64");
    CHECK(nb_set_compute_dtype((nb_dtype)99) == NB_ERR_DTYPE);
    nb_error_clear();
    CHECK(nb_compute_dtype() == NB_F32);
    CHECK_OK(nb_set_compute_dtype(NB_BF16));
    CHECK(nb_compute_dtype() == NB_BF16);
    CHECK_OK(nb_set_compute_dtype(NB_F32));
}

/* A dense layer (no bias) under c: its product and both gradients against the
 * rounded double reference. */
static void dense_against_reference(nb_dtype c)
{
    const int64_t B = 12, I = 40, O = 9;
    nb_dense_layer d;
    CHECK_OK(nb_dense_init(&d, c == NB_BF16 ? "dense_bf16" : "dense_f16", I, O, false, NB_F32, 3));
    nb_tensor *x = random_f32(B, I), *g = random_f32(B, O);
    CHECK_OK(nb_set_compute_dtype(c));
    nb_tape *tape = nb_tape_begin_persistent();
    CHECK_OK(nb_tape_watch(tape, x));
    nb_tensor *y = nb_dense_apply(&d, x);
    CHECK(y && nb_tensor_dtype(y) == NB_F32);
    nb_tensor *loss = nb_sum_all(nb_mul(y, g)); /* its gradient at y is g */
    nb_tensor *grads[1] = {NULL}, *dw = NULL;
    CHECK_OK(nb_tape_gradient(tape, loss, 1, &x, grads));
    CHECK_OK(nb_tape_gradient_vars(tape, loss, 1, &d.kernel, &dw));
    CHECK_OK(nb_set_compute_dtype(NB_F32));
    CHECK(dw && nb_tensor_dtype(dw) == NB_F32 && grads[0] && nb_tensor_dtype(grads[0]) == NB_F32);

    double *hx = values(x), *hw = values(nb_read(d.kernel)), *hg = values(g), *hy = values(y);
    double *want_y = product_ref(hx, hw, B, I, O, false, false, c);
    /* dx = r(r(g) r(w)^T), dw = r(r(x)^T r(g)) */
    double *want_dx = product_ref(hg, hw, B, O, I, false, true, c);
    double *want_dw = product_ref(hx, hg, I, B, O, true, false, c);
    double *got_dx = values(grads[0]), *got_dw = values(dw);
    CHECK(count_off(hy, want_y, B * O, c, "product") == 0);
    CHECK(count_off(got_dx, want_dx, B * I, c, "input gradient") == 0);
    CHECK(count_off(got_dw, want_dw, I * O, c, "kernel gradient") == 0);
    /* every product value is one the compute dtype holds */
    int not_held = 0;
    for (int64_t i = 0; i < B * O; i++)
        not_held += round_to(hy[i], c) != hy[i];
    CHECK(not_held == 0);
    free(hx), free(hw), free(hg), free(hy), free(want_y), free(want_dx), free(want_dw), free(got_dx), free(got_dw);
    nb_dense_free(&d);
}

static void test_dense(void)
{
    dense_against_reference(NB_BF16);
    dense_against_reference(NB_F16);
}

/* f32 under the f32 policy and f64 under any: exactly the plain product. */
static void test_untouched(void)
{
    nb_dense_layer d32, d64;
    CHECK_OK(nb_dense_init(&d32, "plain32", 7, 5, true, NB_F32, 1));
    CHECK_OK(nb_dense_init(&d64, "plain64", 7, 5, true, NB_F64, 2));
    nb_tensor *x = random_f32(4, 7), *x64 = nb_cast(x, NB_F64);
    nb_tensor *want32 = nb_add(nb_matmul(x, nb_read(d32.kernel)), nb_read(d32.bias));
    nb_tensor *want64 = nb_add(nb_matmul(x64, nb_read(d64.kernel)), nb_read(d64.bias));
    nb_tensor *got32 = nb_dense_apply(&d32, x);
    CHECK_OK(nb_set_compute_dtype(NB_BF16));
    nb_tensor *got64 = nb_dense_apply(&d64, x64);
    nb_tensor *bf32 = nb_dense_apply(&d32, x);
    CHECK_OK(nb_set_compute_dtype(NB_F32));
    CHECK(nb_tensor_item(nb_sum_all(nb_abs(nb_sub(got32, want32)))) == 0);
    CHECK(nb_tensor_item(nb_sum_all(nb_abs(nb_sub(got64, want64)))) == 0);
    /* while bf16 does change an f32 layer */
    CHECK(nb_tensor_item(nb_sum_all(nb_abs(nb_sub(bf32, want32)))) > 0);
    nb_dense_free(&d32);
    nb_dense_free(&d64);
}

/* conv2d under bf16: its output is bf16-valued and near the f32 one (within
 * bf16's rounding of the operands: a few units of 2^-8 of the sums of
 * |products|). */
static void test_conv2d(void)
{
    nb_conv2d_layer cv;
    CHECK_OK(nb_conv2d_init(&cv, "conv_bf16", 3, 8, 3, 3, NULL, false, NB_F32, 4));
    float *h = malloc(sizeof(float) * 2 * 9 * 9 * 3);
    for (int i = 0; i < 2 * 9 * 9 * 3; i++)
        h[i] = (float)rnd();
    nb_tensor *x = nb_from_buffer(NB_F32, NB_SHAPE(2, 9, 9, 3), h);
    free(h);
    nb_tensor *f32 = nb_conv2d_apply(&cv, x);
    nb_tensor *mag = nb_conv2d(nb_abs(x), nb_abs(nb_read(cv.kernel)), &cv.opts);
    CHECK_OK(nb_set_compute_dtype(NB_BF16));
    nb_tensor *bf = nb_conv2d_apply(&cv, x);
    CHECK_OK(nb_set_compute_dtype(NB_F32));
    int64_t n = nb_tensor_numel(bf);
    double *hb = values(bf), *hf = values(f32), *hm = values(mag);
    int bad = 0, not_held = 0;
    for (int64_t i = 0; i < n; i++) {
        bad += !(fabs(hb[i] - hf[i]) <= 4 * 0x1p-8 * hm[i] + 1e-30);
        not_held += round_to(hb[i], NB_BF16) != hb[i];
    }
    CHECK(bad == 0 && not_held == 0);
    free(hb), free(hf), free(hm);
    nb_conv2d_free(&cv);
}

/* The GPU's native bf16 and f16 products and gradients against the CPU's
 * emulation: one unit of the compute dtype apart at most. */
static void gpu_against_cpu(nb_dtype c)
{
    nb_dense_layer d;
    CHECK_OK(nb_dense_init(&d, c == NB_BF16 ? "gpu_bf16" : "gpu_f16", 64, 48, false, NB_F32, 9));
    nb_tensor *x = random_f32(32, 64), *g = random_f32(32, 48);
    double *out[2][2];
    for (int on_gpu = 0; on_gpu < 2; on_gpu++) {
        nb_scope *s = nb_scope_begin();
        if (on_gpu)
            nb_device_push("/gpu:0");
        nb_variable *k = nb_variable_new("k", on_gpu ? nb_to_device(nb_read(d.kernel), "/gpu:0") : nb_read(d.kernel));
        nb_dense_layer dd = {k, NULL};
        nb_tensor *xs = on_gpu ? nb_to_device(x, "/gpu:0") : x, *gs = on_gpu ? nb_to_device(g, "/gpu:0") : g;
        CHECK_OK(nb_set_compute_dtype(c));
        nb_tape *tape = nb_tape_begin();
        nb_tensor *y = nb_dense_apply(&dd, xs), *dk = NULL;
        CHECK_OK(nb_tape_gradient_vars(tape, nb_sum_all(nb_mul(y, gs)), 1, &k, &dk));
        CHECK_OK(nb_set_compute_dtype(NB_F32));
        out[on_gpu][0] = values(y);
        out[on_gpu][1] = values(dk);
        if (on_gpu)
            nb_device_pop();
        nb_variable_free(k);
        nb_scope_end(s);
    }
    CHECK(count_off(out[1][0], out[0][0], 32 * 48, c, "GPU product") == 0);
    CHECK(count_off(out[1][1], out[0][1], 64 * 48, c, "GPU kernel gradient") == 0);
    for (int i = 0; i < 2; i++)
        free(out[i][0]), free(out[i][1]);
    nb_dense_free(&d);
}

static void test_gpu(void)
{
    gpu_against_cpu(NB_BF16);
    gpu_against_cpu(NB_F16);
}

int main(int argc, char **argv)
{
    gpu_mode = argc > 1 && strcmp(argv[1], "--gpu") == 0;
    if (gpu_mode) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_mixed_precision --gpu");
        RUN(test_gpu);
    } else {
        RUN(test_setting);
        RUN(test_dense);
        RUN(test_untouched);
        RUN(test_conv2d);
    }
    nb_variables_free_all();
    return check_finish();
}
