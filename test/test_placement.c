/* Placement across logical CPU devices: errors, copies, gradients across devices,
 * and the placement log. */
#include "check.h"

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

int main(void)
{
    if (nb_set_logical_cpu_devices(2) != NB_OK)
        return 1;
    RUN(test_two_devices);
    RUN(test_to_device_messages);
    return check_finish();
}
