/* Placement across logical CPU devices: errors, copies, gradients across devices,
 * and the placement log. */
#include "check.h"
#include "lib/core/backend.h"
#include "ops/op.h"

static int placement_lines;
static void count_log(nb_log_level level, const char *msg, void *user)
{
    (void)level, (void)user;
    if (strstr(msg, "on /cpu:1"))
        placement_lines++;
}

static void test_two_devices(void)
{
    CHECK(nb_device_count(NB_DEVICE_CPU) == 2);
    CHECK(strcmp(nb_device_name(NB_DEVICE_CPU, 1), "/cpu:1") == 0);
    nb_tensor *a = nb_random_normal(NB_F64, NB_SHAPE(3), 0, 1, 1);
    CHECK_OK(nb_device_push("/cpu:1"));
    nb_tensor *b = nb_random_normal(NB_F64, NB_SHAPE(3), 0, 1, 2);
    CHECK_OK(nb_device_pop());
    CHECK(strcmp(nb_tensor_device(b), "/cpu:1") == 0);

    /* Nothing pushed: inputs on two devices are an error naming both. */
    CHECK(nb_add(a, b) == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "add", "/cpu:0", "/cpu:1");

    /* Pushed: inputs are copied there, and gradients flow back across. */
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, a);
    nb_tape_watch(tape, b);
    nb_log_callback old = nb_set_log_callback(count_log, NULL);
    nb_set_log_device_placement(true);
    CHECK_OK(nb_device_push("/cpu:1"));
    nb_tensor *y = nb_sum_all(nb_mul(a, b));
    CHECK_OK(nb_device_pop());
    nb_set_log_device_placement(false);
    nb_set_log_callback(old, NULL);
    CHECK(placement_lines >= 2);
    CHECK(strcmp(nb_tensor_device(y), "/cpu:1") == 0);
    nb_tensor *g[2];
    CHECK_OK(nb_tape_gradient(tape, y, NB_TENSORS(a, b), g));
    CHECK(strcmp(nb_tensor_device(g[0]), "/cpu:0") == 0);
    CHECK(strcmp(nb_tensor_device(g[1]), "/cpu:1") == 0);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(nb_tensor_get(g[0], i), nb_tensor_get(b, i), 1e-15);

    /* An explicit copy is an op too. */
    nb_tensor *c = nb_to_device(a, "/cpu:1");
    CHECK(strcmp(nb_tensor_device(c), "/cpu:1") == 0 && nb_tensor_get(c, 2) == nb_tensor_get(a, 2));
    CHECK(nb_to_device(a, "/cpu:0") == a);
}

/* nb_to_device's errors name nb_to_device, not the device stack it no longer uses. */
static void test_to_device_messages(void)
{
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(2));
    CHECK(nb_to_device(x, "/tpu:0") == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_to_device", "/tpu:0");
    bool soft = nb_set_soft_placement(false);
    CHECK(nb_to_device(x, "/gpu:99") == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "nb_to_device", "/gpu:99", "strict");
    nb_set_soft_placement(soft);
    CHECK(strcmp(nb_device_current(), "/cpu:0") == 0); /* nothing left pushed */
}

/* A device whose backend lacks one kernel: /cpu:1's table with a supports
 * entry that refuses sin. Ops it lacks fall back to /cpu:0 (soft placement) or
 * fail naming the op, the device and the dtype (strict). */
static nb_backend picky;
static bool picky_supports(const nb_device *dev, nb_kernel k, int variant, nb_dtype dtype)
{
    if (k == NB_K_UNARY && variant == NB_UN_SIN)
        return false;
    return nb__device_cpu0()->backend->supports(dev, k, variant, dtype);
}

static void test_capability_fallback(void)
{
    nb_device *cpu1 = nb__device_find("/cpu:1", "test");
    CHECK(cpu1 != NULL);
    const nb_backend *saved = cpu1->backend;
    picky = *saved;
    picky.supports = picky_supports;
    CHECK(nb__supports(cpu1, NB_K_UNARY, NB_UN_SIN, NB_F64));
    cpu1->backend = &picky;
    CHECK(!nb__supports(cpu1, NB_K_UNARY, NB_UN_SIN, NB_F64));

    CHECK_OK(nb_device_push("/cpu:1"));
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(5), 0, 1, 3);
    CHECK_OK(nb_device_pop());
    warning_count fallback_warnings = {"sin: /cpu:1 does not run it for dtype f64; running it on /cpu:0", 0};
    nb_log_callback old = nb_set_log_callback(count_warnings, &fallback_warnings);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, x);
    nb_tensor *y = nb_sin(x), *y2 = nb_sin(x); /* the second falls back without a second warning */
    nb_tensor *z = nb_cos(x);                 /* a kernel it has stays where its input is */
    nb_set_log_callback(old, NULL);
    CHECK(y && y2 && z);
    CHECK(fallback_warnings.n == 1);
    CHECK(strcmp(nb_tensor_device(y), "/cpu:0") == 0);
    CHECK(strcmp(nb_tensor_device(z), "/cpu:1") == 0);
    /* The values are sin's, and the gradient flows back across the copy. */
    double xv[5], yv[5], gv[5];
    CHECK_OK(nb_tensor_read(x, xv, sizeof xv));
    CHECK_OK(nb_tensor_read(y, yv, sizeof yv));
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(yv[i], sin(xv[i]), 1e-15);
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(y), 1, &x, &g));
    CHECK(g && strcmp(nb_tensor_device(g), "/cpu:1") == 0);
    CHECK_OK(nb_tensor_read(g, gv, sizeof gv));
    for (int i = 0; i < 5; i++)
        CHECK_NEAR(gv[i], cos(xv[i]), 1e-15);
    nb_tape_free(tape);

    /* Strict placement: an error naming the op, the device and the dtype. */
    bool soft = nb_set_soft_placement(false);
    CHECK(nb_sin(x) == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "sin", "/cpu:1", "f64", "strict");
    nb_set_soft_placement(soft);
    cpu1->backend = saved;
}

int main(void)
{
    if (nb_set_logical_cpu_devices(2) != NB_OK)
        return 1;
    RUN(test_two_devices);
    RUN(test_to_device_messages);
    RUN(test_capability_fallback);
    return check_finish();
}
