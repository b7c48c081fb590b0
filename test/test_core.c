/* Tensors, views, creation, reading back, scopes, errors and devices. */
#include "check.h"
#include "lib/core/core.h"
#include <pthread.h>
#include <stdint.h>

static void test_creation_and_readback(void)
{
    nb_tensor *z = nb_zeros(NB_F32, NB_SHAPE(2, 3));
    nb_tensor *o = nb_ones(NB_F64, NB_SHAPE(4));
    nb_tensor *f = nb_full(NB_I32, NB_SHAPE(2, 2), 7);
    nb_tensor *s = nb_scalar(NB_F32, 2.5);
    CHECK(nb_tensor_ndim(z) == 2 && nb_tensor_dim(z, 0) == 2 && nb_tensor_dim(z, -1) == 3);
    CHECK(nb_tensor_numel(z) == 6 && nb_tensor_dtype(o) == NB_F64);
    CHECK(nb_tensor_get(z, 5) == 0 && nb_tensor_get(o, 3) == 1 && nb_tensor_get(f, 2) == 7);
    CHECK(nb_tensor_ndim(s) == 0 && nb_tensor_item(s) == 2.5);
    CHECK(strcmp(nb_tensor_device(z), "/cpu:0") == 0);

    float buf[6] = {1, -2, 3.5f, 4, 5, -6}, back[6];
    nb_tensor *b = nb_from_buffer(NB_F32, NB_SHAPE(3, 2), buf);
    CHECK_OK(nb_tensor_read(b, back, sizeof back));
    CHECK(memcmp(buf, back, sizeof buf) == 0);
    CHECK(nb_tensor_read(b, back, 8) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "too small");

    nb_tensor *r = nb_arange(NB_I64, 2, 11, 3); /* 2 5 8 */
    CHECK(nb_tensor_numel(r) == 3 && nb_tensor_get(r, 2) == 8);
    nb_tensor *rd = nb_arange(NB_F32, 1, 0, -0.25); /* 1 .75 .5 .25 */
    CHECK(nb_tensor_numel(rd) == 4 && nb_tensor_get(rd, 3) == 0.25);
    CHECK(nb_arange(NB_F32, 0, 1, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_arange");
    CHECK(nb_zeros(NB_F32, NB_SHAPE(2, -1)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_zeros", "negative");
    CHECK(nb_tensor_item(z) != nb_tensor_item(z)); /* NaN for 6 elements */
    CHECK_ERROR(NB_ERR_SHAPE, "nb_tensor_item", "[2, 3]");
}

static void test_random_reproducible(void)
{
    nb_tensor *a = nb_random_normal(NB_F64, NB_SHAPE(20000), 1.0, 2.0, 42);
    nb_tensor *b = nb_random_normal(NB_F64, NB_SHAPE(20000), 1.0, 2.0, 42);
    nb_tensor *c = nb_random_normal(NB_F64, NB_SHAPE(20000), 1.0, 2.0, 43);
    double *va = check_values(a), *vb = check_values(b), *vc = check_values(c);
    double mean = 0, var = 0;
    int same_c = 0;
    for (int i = 0; i < 20000; i++) {
        CHECK(va[i] == vb[i]);
        same_c += va[i] == vc[i];
        mean += va[i];
    }
    mean /= 20000;
    for (int i = 0; i < 20000; i++)
        var += (va[i] - mean) * (va[i] - mean);
    var /= 20000;
    CHECK(same_c < 10);
    CHECK_NEAR(mean, 1.0, 0.05);
    CHECK_NEAR(sqrt(var), 2.0, 0.05);
    free(va), free(vb), free(vc);

    nb_tensor *u = nb_random_uniform(NB_F32, NB_SHAPE(1000), -1, 3, 7);
    nb_tensor *t = nb_truncated_normal(NB_F32, NB_SHAPE(1000), 0, 1, 7);
    double *vu = check_values(u), *vt = check_values(t);
    for (int i = 0; i < 1000; i++) {
        CHECK(vu[i] >= -1 && vu[i] < 3);
        CHECK(fabs(vt[i]) <= 2.0);
    }
    free(vu), free(vt);
    CHECK(nb_random_normal(NB_I32, NB_SHAPE(3), 0, 1, 1) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_random_normal", "i32");
}

static void test_scopes(void)
{
    int64_t live = nb_live_tensors();
    nb_scope *outer = nb_scope_begin();
    nb_tensor *kept = NULL;
    nb_scope *inner = nb_scope_begin();
    for (int i = 0; i < 100; i++)
        nb_add(nb_ones(NB_F32, NB_SHAPE(4)), nb_ones(NB_F32, NB_SHAPE(4)));
    kept = nb_keep(nb_full(NB_F32, NB_SHAPE(2), 3));
    CHECK(nb_live_tensors() == live + 301);
    CHECK_OK(nb_scope_end(inner));
    CHECK(nb_live_tensors() == live + 1);
    CHECK(nb_tensor_get(kept, 1) == 3);
    CHECK_OK(nb_scope_end(outer));
    CHECK(nb_live_tensors() == live);
    CHECK(nb_scope_end(outer) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_scope_end", "not open");

    /* Ending an outer scope ends the ones inside it. */
    nb_scope *a = nb_scope_begin();
    nb_scope_begin();
    nb_ones(NB_F32, NB_SHAPE(3));
    CHECK_OK(nb_scope_end(a));
    CHECK(nb_live_tensors() == live);

    /* A tensor of an outer scope moves one further out. */
    nb_scope *o2 = nb_scope_begin();
    nb_tensor *far = nb_ones(NB_F32, NB_SHAPE(2));
    nb_scope *i2 = nb_scope_begin();
    CHECK(nb_keep(far) == far);
    nb_scope_end(i2);
    nb_scope_end(o2);
    CHECK(nb_tensor_get(far, 1) == 1); /* now the test's own scope holds it */
    CHECK(nb_live_tensors() == live + 1);
}

static void *end_scope_elsewhere(void *handle)
{
    nb_status st = nb_scope_end(handle);
    nb_error_clear();
    return (void *)(intptr_t)st;
}

/* A stale handle (its scope ended, and a new scope reuses the pooled frame) and
 * a handle from another thread are refused and end nothing. */
static void test_stale_scope_handle(void)
{
    int64_t live = nb_live_tensors();
    nb_scope *old = nb_scope_begin();
    CHECK_OK(nb_scope_end(old));
    nb_scope *fresh = nb_scope_begin();
    CHECK(fresh != old);
    nb_tensor *t = nb_ones(NB_F32, NB_SHAPE(2));
    CHECK(nb_scope_end(old) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_scope_end", "not open", "ended already");
    CHECK(nb_live_tensors() == live + 1 && nb_tensor_get(t, 0) == 1);

    pthread_t th;
    void *st = NULL;
    CHECK(pthread_create(&th, NULL, end_scope_elsewhere, fresh) == 0);
    pthread_join(th, &st);
    CHECK((nb_status)(intptr_t)st == NB_ERR_INVALID_ARGUMENT);
    CHECK(nb_live_tensors() == live + 1 && nb_tensor_get(t, 1) == 1);

    CHECK(nb_scope_end(NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_scope_end", "NULL");
    CHECK_OK(nb_scope_end(fresh));
    CHECK(nb_live_tensors() == live);
}

/* Run outside any scope: what nb_keep hands out of the last scope is the
 * caller's to release, and a tensor no scope owns cannot be kept. */
static void test_caller_ownership(void)
{
    check_current = "test_caller_ownership";
    int64_t live = nb_live_tensors();
    nb_scope *only = nb_scope_begin();
    nb_tensor *mine = nb_keep(nb_ones(NB_F32, NB_SHAPE(3)));
    nb_scope_end(only);
    CHECK(nb_live_tensors() == live + 1 && nb_tensor_get(mine, 0) == 1);
    nb_scope *s = nb_scope_begin();
    CHECK(nb_keep(mine) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_keep", "not owned");
    nb_scope_end(s);
    nb_release(mine);
    nb_tensor *loose = nb_zeros(NB_F32, NB_SHAPE(2)); /* no scope: caller-owned */
    CHECK(nb_live_tensors() == live + 1);
    nb_release(loose);
    CHECK(nb_live_tensors() == live);
}

static void test_views(void)
{
    nb_tensor *x = nb_arange(NB_F32, 0, 24, 1);
    nb_tensor *r = nb_reshape(x, NB_SHAPE(2, 3, 4));
    CHECK(nb_tensor_is_contiguous(r) && nb_tensor_get(r, 23) == 23);
    nb_tensor *t = nb_transpose(r, 0, 2); /* [4, 3, 2] */
    CHECK(!nb_tensor_is_contiguous(t) && nb_tensor_dim(t, 0) == 4);
    /* t[i][j][k] = r[k][j][i] = k*12 + j*4 + i */
    CHECK(nb_tensor_get(t, 1 * 6 + 2 * 2 + 1) == 1 * 12 + 2 * 4 + 1);
    float out[24];
    CHECK_OK(nb_tensor_read(t, out, sizeof out));
    CHECK(out[1] == 12 && out[2] == 4);
    nb_tensor *s = nb_slice(r, NB_SHAPE(1, 1, 0), NB_SHAPE(1, 2, -1));
    CHECK(nb_tensor_numel(s) == 8 && nb_tensor_get(s, 0) == 16);
    nb_tensor *b = nb_broadcast_to(nb_reshape(nb_arange(NB_F32, 0, 3, 1), NB_SHAPE(3, 1)), NB_SHAPE(3, 5));
    CHECK(nb_tensor_stride(b, 1) == 0 && nb_tensor_get(b, 7) == 1);
    nb_tensor *c = nb_contiguous(t);
    CHECK(nb_tensor_is_contiguous(c) && nb_tensor_get(c, 1) == 12);
}

static int handler_calls;
static void count_handler(nb_status code, const char *msg, void *user)
{
    (void)code, (void)msg;
    handler_calls += *(int *)user;
}

static void test_errors(void)
{
    CHECK(nb_error() == NB_OK && strcmp(nb_error_message(), "") == 0);
    nb_tensor *a = nb_ones(NB_F32, NB_SHAPE(2, 3)), *b = nb_ones(NB_F32, NB_SHAPE(4));
    /* The first error is kept through a chain of NULLs. */
    nb_tensor *y = nb_exp(nb_mul(nb_add(a, b), a));
    CHECK(y == NULL);
    CHECK(nb_error() == NB_ERR_SHAPE);
    CHECK(strstr(nb_error_message(), "add") && strstr(nb_error_message(), "[2, 3]") &&
          strstr(nb_error_message(), "[4]"));
    CHECK(nb_error_clear() == NB_ERR_SHAPE && nb_error() == NB_OK);
    CHECK(nb_exp(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "exp", "input 0 is NULL");
    CHECK(strcmp(nb_status_name(NB_ERR_DTYPE), "NB_ERR_DTYPE") == 0);

    int one = 1;
    nb_set_error_handler(count_handler, &one);
    nb_add(a, nb_ones(NB_F64, NB_SHAPE(2, 3)));
    nb_set_error_handler(NULL, NULL);
    CHECK(handler_calls == 1);
    CHECK_ERROR(NB_ERR_DTYPE, "add", "f32", "f64");
}

static void test_devices(void)
{
    CHECK(nb_device_count(NB_DEVICE_CPU) >= 1);
    CHECK(strcmp(nb_device_name(NB_DEVICE_CPU, 0), "/cpu:0") == 0);
    CHECK(nb_device_name(NB_DEVICE_CPU, 99) == NULL);
    CHECK(strcmp(nb_device_current(), "/cpu:0") == 0);
    CHECK(nb_device_push("/tpu:0") == NB_ERR_DEVICE);
    CHECK_ERROR(NB_ERR_DEVICE, "malformed", "/tpu:0");
    CHECK(nb_device_pop() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "empty");

    /* Soft placement: a missing GPU falls back with one warning. */
    int ngpu = nb_device_count(NB_DEVICE_GPU);
    if (ngpu < 8) {
        warning_count warnings = {"/gpu:7", 0};
        nb_log_callback old = nb_set_log_callback(count_warnings, &warnings);
        CHECK_OK(nb_device_push("/gpu:7"));
        CHECK_OK(nb_device_push("/gpu:99")); /* any index is a name; a missing one falls back */
        CHECK_OK(nb_device_pop());
        CHECK(strcmp(nb_device_current(), "/cpu:0") == 0);
        nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(2));
        CHECK(strcmp(nb_tensor_device(x), "/cpu:0") == 0);
        CHECK_OK(nb_device_pop());
        CHECK(warnings.n == 1); /* the /gpu:99 warning names /gpu:99, not /gpu:7 */
        nb_set_log_callback(old, NULL);
        /* Strict placement: an error naming the device. */
        nb_set_soft_placement(false);
        CHECK(nb_device_push("/gpu:7") == NB_ERR_DEVICE);
        CHECK_ERROR(NB_ERR_DEVICE, "/gpu:7", "strict");
        nb_set_soft_placement(true);
    }
    nb_set_soft_placement(false);
    CHECK(nb_to_device(nb_ones(NB_F32, NB_SHAPE(1)), "/cpu:9") == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "/cpu:9");
    nb_set_soft_placement(true);
    CHECK(nb_set_logical_cpu_devices(2) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "already in use");
}

/* An error handler that itself calls a failing op is not called again for
 * that failure (it used to recurse without end); the first error stays. */
static int handler_calls;
static void failing_handler(nb_status code, const char *message, void *user)
{
    (void)code, (void)message, (void)user;
    handler_calls++;
    nb_release(nb_add(nb_ones(NB_F32, NB_SHAPE(2)), nb_ones(NB_F32, NB_SHAPE(3)))); /* fails again */
}

static void test_reentrant_handler(void)
{
    handler_calls = 0;
    nb_error_handler old = nb_set_error_handler(failing_handler, NULL);
    CHECK(nb_reshape(nb_ones(NB_F32, NB_SHAPE(4)), NB_SHAPE(3)) == NULL);
    CHECK(handler_calls == 1);
    nb_set_error_handler(old, NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape");
    /* and the handler runs again for the next failure */
    nb_set_error_handler(failing_handler, NULL);
    CHECK(nb_reshape(nb_ones(NB_F32, NB_SHAPE(4)), NB_SHAPE(3)) == NULL);
    CHECK(handler_calls == 2);
    nb_set_error_handler(old, NULL);
    nb_error_clear();
}

/* Sizes past what int64 or memory can hold are errors before anything is
 * allocated or written (they used to wrap to small numbers and overflow the heap). */
static void test_huge_shapes(void)
{
    const int64_t big = (int64_t)1 << 62, g = (int64_t)1 << 32;
    CHECK(nb_zeros(NB_F32, NB_SHAPE(big)) == NULL); /* 2^64 bytes */
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "nb_zeros", "f32", "[4611686018427387904]");
    CHECK(nb_empty(NB_F64, NB_SHAPE(big)) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "nb_empty", "f64");
    CHECK(nb_zeros(NB_U8, NB_SHAPE(g, g)) == NULL); /* 2^64 elements: the count wraps to 0 */
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "nb_zeros", "u8", "[4294967296, 4294967296]");
    CHECK(nb_random_normal(NB_F32, NB_SHAPE(big, 4), 0, 1, 1) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "nb_random_normal", "f32");
    /* an empty tensor's other dims must still fit (as NumPy's rule has it): its
     * strides, and those of its views, would overflow otherwise */
    CHECK(nb_zeros(NB_F32, NB_SHAPE(0, big, big)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_zeros", "[0, 4611686018427387904, 4611686018427387904]", "zero dim");
    CHECK(nb_empty(NB_F32, NB_SHAPE(0, (int64_t)1 << 40, (int64_t)1 << 40)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_empty");
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0, (int64_t)1 << 30, (int64_t)1 << 30));
    CHECK(e && nb_tensor_numel(e) == 0);
    nb_tensor *ep = nb_permute(e, NB_AXES(2, 0, 1));
    CHECK(ep && nb_tensor_numel(ep) == 0 && nb_tensor_shape(ep).dims[0] == (int64_t)1 << 30);
    CHECK(nb_arange(NB_F32, 0, 1e30, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_arange", "too many");
    CHECK(nb_arange(NB_F64, -1e308, 1e308, 1e-300) == NULL); /* the count is inf */
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_arange");
    /* a broadcast view of 2^60 elements: views are fine, reading it into 16 bytes is not */
    nb_tensor *b = nb_broadcast_to(nb_ones(NB_F32, NB_SHAPE(1)), NB_SHAPE(big / 4));
    CHECK(b && nb_tensor_numel(b) == big / 4);
    char buf[16];
    CHECK(nb_tensor_read(b, buf, sizeof buf) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tensor_read", "16 bytes", "1152921504606846976");
    /* broadcasting two views to 2^64 elements */
    nb_tensor *one = nb_ones(NB_F32, NB_SHAPE(1, 1));
    CHECK(nb_add(nb_broadcast_to(one, NB_SHAPE(g, 1)), nb_broadcast_to(one, NB_SHAPE(1, g))) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "add", "[4294967296, 4294967296]");
}

/* A failure below an op (the allocator running out, a dtype the device cannot
 * hold) is reported under the op's name, not the allocator's or a kernel's. */
/* nb__error_stash / unstash / restore: unstash keeps an error raised in
 * between unless one was saved (the first wins); restore drops it. */
static void test_error_stash(void)
{
    nb_error_saved saved;
    nb__error_stash(&saved); /* nothing pending */
    nb__fail(NB_ERR_SHAPE, "inner: shapes");
    nb__error_unstash(&saved);
    CHECK(nb_error() == NB_ERR_SHAPE && strcmp(nb_error_message(), "inner: shapes") == 0);
    nb__error_stash(&saved); /* the shape error pending */
    CHECK(nb_error() == NB_OK);
    nb__fail(NB_ERR_DTYPE, "inner: dtypes");
    nb__error_unstash(&saved);
    CHECK(nb_error() == NB_ERR_SHAPE && strcmp(nb_error_message(), "inner: shapes") == 0);
    nb_error_clear();
    nb__error_stash(&saved);
    nb__fail(NB_ERR_DTYPE, "inner: dtypes");
    nb__error_restore(&saved);
    CHECK(nb_error() == NB_OK && strcmp(nb_error_message(), "") == 0);
    nb__fail(NB_ERR_SHAPE, "outer: shapes");
    nb__error_stash(&saved);
    nb__fail(NB_ERR_DTYPE, "inner: dtypes");
    nb__error_restore(&saved);
    CHECK(nb_error() == NB_ERR_SHAPE && strcmp(nb_error_message(), "outer: shapes") == 0);
    nb_error_clear();
}

static void test_errors_name_the_op(void)
{
    /* 2^62 bytes: a size int64 can count that no allocator gives */
    const int64_t half = (int64_t)1 << 30;
    nb_tensor *one = nb_ones(NB_I32, NB_SHAPE(1, 1));
    CHECK(nb_add(nb_broadcast_to(one, NB_SHAPE(half, 1)), nb_broadcast_to(one, NB_SHAPE(1, half))) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "add: ", "4611686018427387904 bytes");
    CHECK(nb_empty(NB_U8, NB_SHAPE((int64_t)1 << 62)) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "nb_empty: ", "4611686018427387904 bytes");
    /* the CPU holds f16 and bf16 (made, filled, converted, read) but computes
     * in neither: each op refuses them, naming itself, the dtype and the device */
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(3));
    nb_tensor *xb = nb_cast(x, NB_BF16), *z = nb_zeros(NB_F16, NB_SHAPE(2));
    CHECK(xb && nb_tensor_get(xb, 2) == 1 && z && nb_tensor_get(z, 1) == 0);
    CHECK(nb_full(NB_BF16, NB_SHAPE(2), 1.00390625) && nb_tensor_get(nb_full(NB_BF16, NB_SHAPE(1), 1.00390625), 0) == 1);
    CHECK(nb_random_uniform(NB_BF16, NB_SHAPE(2), 0, 1, 7) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_random_uniform", "bf16", "/cpu:0", "nb_cast");
    CHECK(nb_arange(NB_F16, 0, 4, 1) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_arange", "f16");
    CHECK(nb_one_hot(nb_zeros(NB_I32, NB_SHAPE(2)), 3, NB_F16) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "one_hot", "f16", "/cpu:0");
    CHECK(nb_mul(xb, xb) == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "mul", "bf16", "/cpu:0");
    CHECK(nb_matmul(nb_reshape(xb, NB_SHAPE(1, 3)), nb_reshape(xb, NB_SHAPE(3, 1))) == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "matmul", "bf16");
    CHECK(nb_sum_all(z) == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "sum", "f16");
    nb_variable *hv = nb_variable_new("half", z);
    nb_optimizer *sgd = nb_sgd_new(0.1);
    CHECK(hv && nb_optimizer_apply(sgd, 1, &hv, (nb_tensor *[]){z}) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "sgd_update", "f16", "/cpu:0");
    nb_optimizer_free(sgd);
    nb_variable_free(hv);
    /* the context ends with the allocation: a later error is not prefixed */
    CHECK(nb_add(x, nb_ones(NB_F32, NB_SHAPE(2))) == NULL);
    CHECK(strncmp(nb_error_message(), "add: ", 5) == 0);
    nb_error_clear();
}

int main(void)
{
    RUN(test_creation_and_readback);
    RUN(test_random_reproducible);
    RUN(test_scopes);
    RUN(test_stale_scope_handle);
    test_caller_ownership();
    RUN(test_views);
    RUN(test_errors);
    RUN(test_error_stash);
    RUN(test_devices);
    RUN(test_reentrant_handler);
    RUN(test_huge_shapes);
    RUN(test_errors_name_the_op);
    return check_finish();
}
