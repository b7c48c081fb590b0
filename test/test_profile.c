/* Per-phase op profiling (nabla/profile.h): counts that follow the ops run,
 * phases that are never negative, nothing counted while off, per-thread totals. */
#include "check.h"

#include <pthread.h>

enum { N = 50 };

static nb_tensor *xa, *xb;

static void inputs_begin(void)
{
    xa = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 1);
    xb = nb_random_uniform(NB_F32, NB_SHAPE(1), 1, 2, 2);
}

/* The case's scope (RUN's) owns the inputs and releases them. */
static void inputs_end(void)
{
    xa = xb = NULL;
}

static bool all_zero(const nb_op_profile *p)
{
    bool zero = p->ops == 0 && p->overhead_ns == 0;
    for (int ph = 0; ph < NB_PHASE_COUNT; ph++)
        zero = zero && p->ns[ph] == 0 && p->entries[ph] == 0;
    return zero;
}

/* N untaped adds in a scope, with profiling on or not. */
static void adds_in_scope(bool taped)
{
    nb_scope *s = nb_scope_begin();
    if (taped) {
        nb_tape *tape = nb_tape_begin();
        nb_tape_watch(tape, xa);
    }
    for (int i = 0; i < N; i++)
        CHECK(nb_add(xa, xb) != NULL);
    CHECK_OK(nb_scope_end(s));
}

static void test_off_counts_nothing(void)
{
    inputs_begin();
    CHECK(!nb_op_profiling());
    nb_op_profile_reset();
    adds_in_scope(false);
    nb_op_profile p;
    CHECK_OK(nb_op_profile_get(&p));
    CHECK(all_zero(&p));
    inputs_end();
}

static void test_counts_follow_the_ops(void)
{
    inputs_begin();
    for (int taped = 0; taped < 2; taped++) {
        nb_set_op_profiling(true);
        CHECK(nb_op_profiling());
        adds_in_scope(taped);
        nb_op_profile p;
        CHECK_OK(nb_op_profile_get(&p));
        nb_set_op_profiling(false);
        CHECK(p.ops == N);
        CHECK(p.entries[NB_PHASE_CHECKS] == N);
        CHECK(p.entries[NB_PHASE_TENSOR] == N);
        CHECK(p.entries[NB_PHASE_ALLOC] == N);
        CHECK(p.entries[NB_PHASE_KERNEL] == N);
        CHECK(p.entries[NB_PHASE_RECORD] == (taped ? N : 0));
        CHECK(p.entries[NB_PHASE_SCOPE] == N + 1); /* each result handed over, one scope end */
        CHECK(p.entries[NB_PHASE_RELEASE] == N);   /* the results; the inputs live on */
        CHECK(p.entries[NB_PHASE_FREE] == N);
        /* The CPU has no device to enter and launches nothing. */
        CHECK(p.entries[NB_PHASE_DEVICE_ENTRY] == 0);
        CHECK(p.entries[NB_PHASE_LAUNCH] == 0);
        CHECK(p.entries[NB_PHASE_LAUNCH_CHECK] == 0);
        CHECK(p.ns[NB_PHASE_DEVICE_ENTRY] == 0 && p.ns[NB_PHASE_LAUNCH] == 0);
        int64_t sum = 0;
        for (int ph = 0; ph < NB_PHASE_COUNT; ph++) {
            CHECK(p.ns[ph] >= 0);
            sum += p.ns[ph];
        }
        CHECK(sum + p.overhead_ns > 0);
        CHECK(p.boundary_ns >= 0);
        CHECK(p.overhead_ns >= 0);
    }
    inputs_end();
}

static void test_off_keeps_and_on_resets(void)
{
    inputs_begin();
    nb_set_op_profiling(true);
    adds_in_scope(false);
    nb_set_op_profiling(false);
    nb_op_profile before, after;
    CHECK_OK(nb_op_profile_get(&before));
    CHECK(before.ops == N);
    adds_in_scope(false); /* off: the totals stay as they were */
    CHECK_OK(nb_op_profile_get(&after));
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    nb_set_op_profiling(true); /* on again: from zero */
    CHECK_OK(nb_op_profile_get(&after));
    CHECK(after.ops == 0 && after.entries[NB_PHASE_CHECKS] == 0);
    nb_op_profile_reset();
    CHECK_OK(nb_op_profile_get(&after));
    CHECK(after.ops == 0);
    nb_set_op_profiling(false);
    nb_op_profile_reset();
    CHECK_OK(nb_op_profile_get(&after));
    CHECK(all_zero(&after));
    inputs_end();
}

/* A failed op is counted, and its phases end with it: the next op's checks
 * are entered once more, not left running. */
static void test_failed_op(void)
{
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(2)), *b = nb_zeros(NB_F32, NB_SHAPE(3));
    nb_set_op_profiling(true);
    CHECK(nb_add(a, b) == NULL);
    CHECK(nb_error() == NB_ERR_SHAPE);
    nb_error_clear();
    nb_tensor *c = nb_add(a, a);
    CHECK(c != NULL);
    nb_op_profile p;
    CHECK_OK(nb_op_profile_get(&p));
    nb_set_op_profiling(false);
    CHECK(p.ops == 2);
    CHECK(p.entries[NB_PHASE_CHECKS] == 2);
    CHECK(p.entries[NB_PHASE_TENSOR] == 1); /* the failed one made no output */
    /* a, b and c belong to the case's scope (RUN's) */
}

static void *thread_adds(void *arg)
{
    nb_op_profile *out = arg;
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(4));
    for (int i = 0; i < N; i++)
        nb_release(nb_add(a, a));
    nb_release(a);
    nb_op_profile_get(out);
    return NULL;
}

/* Profiling is the calling thread's: another thread's ops are not counted,
 * and that thread, which never turned it on, counts nothing. */
static void test_per_thread(void)
{
    nb_set_op_profiling(true);
    nb_op_profile theirs, mine;
    memset(&theirs, 0xff, sizeof theirs);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_adds, &theirs) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_OK(nb_op_profile_get(&mine));
    nb_set_op_profiling(false);
    CHECK(all_zero(&theirs));
    CHECK(mine.ops == 0);
}

static void test_bad_arguments_and_names(void)
{
    CHECK(nb_op_profile_get(NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK(strstr(nb_error_message(), "nb_op_profile_get") != NULL);
    nb_error_clear();
    CHECK(strcmp(nb_op_phase_name(NB_PHASE_COUNT), "invalid") == 0);
    CHECK(strcmp(nb_op_phase_name((nb_op_phase)-1), "invalid") == 0);
    for (int i = 0; i < NB_PHASE_COUNT; i++) {
        CHECK(strcmp(nb_op_phase_name((nb_op_phase)i), "invalid") != 0);
        for (int j = 0; j < i; j++)
            CHECK(strcmp(nb_op_phase_name((nb_op_phase)i), nb_op_phase_name((nb_op_phase)j)) != 0);
    }
    CHECK(strcmp(nb_op_phase_name(NB_PHASE_LAUNCH), "launch") == 0);
}

/* On a GPU: the launch phases are entered, one check per launch; and the
 * short adds the launch path treats specially (one element, a dense run
 * shorter than a vector) give the CPU's values in every dtype, next to a
 * broadcast one that takes the strided kernel. */
static void test_gpu_launch_path(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        printf("test_gpu_launch_path: no GPU, skipped\n");
        return;
    }
    static const nb_dtype dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64}; /* add's dtypes */
    const nb_shape shapes[][2] = {{NB_SHAPE(1), NB_SHAPE(1)},       {NB_SHAPE(3), NB_SHAPE(3)},
                                  {NB_SHAPE(1, 3), NB_SHAPE(1, 3)}, {NB_SHAPE(3), NB_SHAPE(1)},
                                  {NB_SHAPE(2, 1), NB_SHAPE(1, 1)}, {NB_SHAPE(5), NB_SHAPE(5)}};
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
            nb_scope *s = nb_scope_begin();
            nb_tensor *a = nb_cast(nb_random_uniform(NB_F32, shapes[k][0], 1, 9, 10 + k), dtypes[d]);
            nb_tensor *b = nb_cast(nb_random_uniform(NB_F32, shapes[k][1], 1, 9, 20 + k), dtypes[d]);
            nb_tensor *ga = nb_to_device(a, "/gpu:0"), *gb = nb_to_device(b, "/gpu:0");
            nb_set_op_profiling(true);
            nb_tensor *gsum = nb_add(ga, gb);
            nb_op_profile p;
            CHECK_OK(nb_op_profile_get(&p));
            nb_set_op_profiling(false);
            CHECK(p.ops == 1);
            CHECK(p.entries[NB_PHASE_DEVICE_ENTRY] >= 1);
            CHECK(p.entries[NB_PHASE_LAUNCH] >= 1); /* the add, and the poison fill under NB_DEBUG_POISON */
            CHECK(p.entries[NB_PHASE_LAUNCH_CHECK] == p.entries[NB_PHASE_LAUNCH]);
            nb_tensor *back = nb_to_device(gsum, "/cpu:0");
            /* The exact sum rounded once to the dtype: what one IEEE add gives
             * (f16 and bf16 are added in float, where their sum is exact). */
            nb_tensor *exact = nb_add(nb_cast(a, NB_F64), nb_cast(b, NB_F64));
            nb_tensor *ref = nb_cast(nb_cast(exact, dtypes[d]), NB_F64);
            nb_tensor *diff = nb_abs(nb_sub(nb_cast(back, NB_F64), ref));
            double err = nb_tensor_item(nb_sum_all(diff));
            if (err != 0.0)
                fprintf(stderr, "gpu add, %s, case %zu: off the CPU by %g\n", nb_dtype_name(dtypes[d]), k, err);
            CHECK(err == 0.0);
            CHECK_OK(nb_scope_end(s));
        }
    }
}

int main(void)
{
    RUN(test_off_counts_nothing);
    RUN(test_counts_follow_the_ops);
    RUN(test_off_keeps_and_on_resets);
    RUN(test_failed_op);
    RUN(test_per_thread);
    RUN(test_bad_arguments_and_names);
    RUN(test_gpu_launch_path);
    return check_finish();
}
