/* Several threads using nabla at once: each has its own scopes, tapes, device
 * stack and first error, and gets the same answers as one thread alone. */
#include "check.h"

#include <pthread.h>

#define THREADS 4

typedef struct job {
    uint64_t seed;
    double loss;     /* final loss of a small regression */
    nb_status error; /* the error this thread provoked, as it saw it */
    int64_t live_after;
} job;

/* Returns the last loss over the first (which it must have cut tenfold). */
static double train(uint64_t seed)
{
    nb_scope *outer = nb_scope_begin();
    /* Large enough that the kernels split across the pool. */
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(256, 300), 0, 1, seed);
    nb_tensor *w_true = nb_random_normal(NB_F64, NB_SHAPE(300, 1), 0, 1, seed + 1);
    nb_tensor *y = nb_matmul(x, w_true);
    nb_variable *w = nb_variable_new("w", nb_zeros(NB_F64, NB_SHAPE(300, 1)));
    nb_optimizer *opt = nb_adam_new(0.05, 0.9, 0.999, 1e-8);
    double loss = NAN, first = NAN;
    for (int step = 0; step < 60; step++) {
        nb_scope *s = nb_scope_begin();
        nb_tape *tape = nb_tape_begin();
        nb_tensor *l = nb_mean_squared_error(nb_matmul(x, nb_read(w)), y);
        nb_tensor *g;
        nb_tape_gradient_vars(tape, l, NB_VARS(w), &g);
        nb_optimizer_apply(opt, NB_VARS(w), &g);
        loss = nb_tensor_item(l);
        if (step == 0)
            first = loss;
        nb_scope_end(s);
    }
    nb_optimizer_free(opt);
    nb_variable_free(w);
    nb_scope_end(outer);
    return loss / first;
}

static void *worker(void *arg)
{
    job *j = arg;
    j->loss = train(j->seed);
    /* An error on this thread stays on this thread. */
    nb_scope *s = nb_scope_begin();
    nb_tensor *bad = nb_add(nb_ones(NB_F32, NB_SHAPE(2)), nb_ones(NB_F64, NB_SHAPE(2)));
    j->error = bad ? NB_OK : nb_error_clear();
    nb_scope_end(s);
    return NULL;
}

static void test_concurrent_training(void)
{
    double alone[THREADS];
    for (int i = 0; i < THREADS; i++)
        alone[i] = train(100 + 10 * (uint64_t)i);
    job jobs[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (job){.seed = 100 + 10 * (uint64_t)i};
        CHECK(pthread_create(&t[i], NULL, worker, &jobs[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(jobs[i].loss == alone[i]); /* the same arithmetic, bit for bit */
        CHECK(jobs[i].loss < 0.1);
        CHECK(jobs[i].error == NB_ERR_DTYPE);
    }
    CHECK(nb_error() == NB_OK); /* the other threads' errors did not land here */
}

int main(void)
{
    RUN(test_concurrent_training);
    return check_finish();
}
