/* Deterministic mode: nb_set_deterministic returns the old setting and
 * nb_deterministic reads it; NB_DETERMINISTIC in the environment sets it (in a
 * child process, this test run again, since the variable is read once); and
 * with it on, an embedding gradient (gather with heavily repeated indices, so
 * many rows add into one), sums of a large f32 tensor and a running sum give
 * the same bits on two runs, on the CPU and on every GPU present (that part is
 * skipped without one). */
#include "check.h"

#include <sys/wait.h>
#include <unistd.h>

static const char *self_path;

/* Runs this test as "--child EXPECT" with NB_DETERMINISTIC set to value (unset
 * when NULL); true when the child found nb_deterministic() == expect. */
static bool child_sees(const char *value, bool expect)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        if (value)
            setenv("NB_DETERMINISTIC", value, 1);
        else
            unsetenv("NB_DETERMINISTIC");
        char *args[] = {(char *)self_path, "--child", expect ? "1" : "0", NULL};
        execv(self_path, args);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The child: the first nabla call reads the environment. */
static int child_main(bool expect)
{
    bool on = nb_deterministic();
    if (on != expect) {
        fprintf(stderr, "child: nb_deterministic() is %d with NB_DETERMINISTIC=%s\n", on,
                getenv("NB_DETERMINISTIC") ? getenv("NB_DETERMINISTIC") : "(unset)");
        return 1;
    }
    /* setting it still works after the environment said otherwise */
    if (nb_set_deterministic(!expect) != expect || nb_deterministic() != !expect)
        return 1;
    return 0;
}

static void test_setting(void)
{
    bool old = nb_set_deterministic(true);
    CHECK(nb_deterministic());
    CHECK(nb_set_deterministic(true) == true);
    CHECK(nb_set_deterministic(false) == true);
    CHECK(!nb_deterministic());
    CHECK(nb_set_deterministic(false) == false);
    CHECK(nb_set_deterministic(true) == false);
    CHECK(nb_deterministic());
    nb_set_deterministic(old);
    CHECK(nb_deterministic() == old);
}

static void test_environment(void)
{
    CHECK(child_sees("1", true));
    CHECK(child_sees("0", false));
    CHECK(child_sees("", false));
    CHECK(child_sees(NULL, false));
}

/* The results whose summation order atomics could change, computed on the
 * device pushed now (or the CPU). */
#define N_RESULTS 5
static void compute(nb_tensor **out)
{
    /* an embedding: 20000 lookups into 64 rows, so each row's gradient adds
     * about 300 contributions */
    nb_tensor *table = nb_random_normal(NB_F32, NB_SHAPE(64, 48), 0, 1, 1);
    nb_tensor *ids = nb_cast(nb_random_uniform(NB_F64, NB_SHAPE(20000), 0, 64, 2), NB_I32);
    nb_tensor *w = nb_random_normal(NB_F32, NB_SHAPE(20000, 48), 0, 1, 3);
    nb_tape *tape = nb_tape_begin();
    CHECK_OK(nb_tape_watch(tape, table));
    nb_tensor *loss = nb_sum_all(nb_mul(nb_gather(table, ids), w));
    out[0] = NULL;
    CHECK_OK(nb_tape_gradient(tape, loss, NB_TENSORS(table), &out[0]));
    out[1] = loss;
    /* sums of a large f32 tensor: all of it, over rows, over columns */
    nb_tensor *big = nb_random_normal(NB_F32, NB_SHAPE(2048, 2049), 0.25, 1, 4);
    out[2] = nb_sum_all(big);
    out[3] = nb_sum(big, NB_AXES(0), false);
    /* a long running sum */
    out[4] = nb_cumsum(nb_reshape(big, NB_SHAPE(2049, 2048)), 0, false, false);
}

/* Two runs with deterministic mode on give the same bits. */
static void check_twice(const char *device)
{
    nb_tensor *a[N_RESULTS], *b[N_RESULTS];
    compute(a);
    compute(b);
    for (int i = 0; i < N_RESULTS; i++) {
        CHECKF(a[i] && on_device(a[i], device), "result %d on %s", i, device);
        CHECKF(same_bits(a[i], b[i]), "result %d differs between two runs on %s", i, device);
    }
}

static void test_cpu_bit_identical(void)
{
    bool old = nb_set_deterministic(true);
    check_twice("/cpu:0");
    nb_set_deterministic(old);
}

static void test_gpu_bit_identical(void)
{
    int n = nb_device_count(NB_DEVICE_GPU);
    if (n == 0) {
        const char *why = nb_gpu_unavailable_reason();
        printf("test_deterministic: no GPU (%s): the GPU part is skipped\n", why ? why : "none found");
        return;
    }
    bool old = nb_set_deterministic(true);
    bool soft = nb_set_soft_placement(false); /* the GPU's own kernels, or an error */
    for (int i = 0; i < n; i++) {
        const char *name = nb_device_name(NB_DEVICE_GPU, i);
        CHECK_OK(nb_device_push(name));
        check_twice(name);
        CHECK_OK(nb_device_pop());
    }
    nb_set_soft_placement(soft);
    nb_set_deterministic(old);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child_main(strcmp(argv[2], "1") == 0);
    self_path = access("/proc/self/exe", X_OK) == 0 ? "/proc/self/exe" : argv[0];
    RUN(test_setting);
    RUN(test_environment);
    RUN(test_cpu_bit_identical);
    RUN(test_gpu_bit_identical);
    return check_finish();
}
