/* Multi-device: A^10 + B^10 for two random n x n matrices, first on one device,
 * then with A^10 on one device and B^10 on another at the same time.
 *
 *   matrix_power [--device NAME] [--steps N] [--size N] [--quick]
 *
 * Uses /gpu:0 and /gpu:1: two GPUs, or one GPU split into two logical GPUs
 * (each with a stream of its own); with no GPU, two logical CPU devices /cpu:0
 * and /cpu:1. --device picks the single-device run's device; --steps is the
 * number of timed repetitions (the best is shown). Each device's chain runs on a
 * thread of its own, with its own scope and device stack. */
#include <nabla/nabla.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#include "command_line.h"

#define POWER 10

static double now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* m^k by repeated products, on the device m lies on. */
static nb_tensor *matpow(nb_tensor *m, int k)
{
    nb_tensor *r = m;
    for (int i = 1; i < k; i++)
        r = nb_matmul(r, m);
    return r;
}

typedef struct job {
    const char *device;
    nb_tensor *m;      /* input, on any device */
    nb_tensor *result; /* m^POWER on device, owned by the thread that started the job */
} job;

/* Runs on its own thread: pushes the device, computes, and waits for the device
 * so that the timing covers the work. */
static void *run_job(void *arg)
{
    job *j = arg;
    nb_scope *s = nb_scope_begin();
    nb_device_push(j->device);
    j->result = nb_keep(matpow(nb_to_device(j->m, j->device), POWER)); /* out of the scope */
    nb_synchronize();
    nb_device_pop();
    nb_scope_end(s);
    return NULL;
}

/* max|a - b| / max|a|, computed on a's device. */
static double rel_diff(nb_tensor *a, nb_tensor *b)
{
    nb_scope *s = nb_scope_begin();
    double d = nb_tensor_item(nb_max(nb_abs(nb_sub(a, nb_to_device(b, nb_tensor_device(a)))),
                                     NB_ALL_AXES, false));
    double m = nb_tensor_item(nb_max(nb_abs(a), NB_ALL_AXES, false));
    nb_scope_end(s);
    return d / (m > 0 ? m : 1);
}

int main(int argc, char **argv)
{
    /* Before any device is used: one GPU becomes two logical GPUs, and two
     * logical CPUs serve where there is no GPU. */
    if (nb_physical_gpu_count() == 1)
        nb_set_logical_gpu_devices(2);
    nb_set_logical_cpu_devices(2);
    nb_set_error_handler(nb_error_handler_exit, NULL);

    bool two_gpus = nb_device_count(NB_DEVICE_GPU) >= 2;
    const char *dev[2] = {two_gpus ? "/gpu:0" : "/cpu:0", two_gpus ? "/gpu:1" : "/cpu:1"};
    const char *single = dev[0];
    int size = 1000, reps = 3;
    OPTIONS_READ(argc, argv, "usage: %s [--device NAME] [--steps N] [--size N] [--quick]\n",
                 OPTION_TEXT("--device", &single), OPTION_NUMBER("--steps", &reps), OPTION_NUMBER("--size", &size),
                 OPTION_SETS("--quick", &size, 256), OPTION_SETS("--quick", &reps, 1));
    const int64_t n = size;

    nb_scope *outer = nb_scope_begin();
    /* Entries N(0, 1/n): the powers neither explode nor vanish. */
    nb_tensor *a = nb_random_normal(NB_F32, NB_SHAPE(n, n), 0, 1 / sqrt((double)n), 1);
    nb_tensor *b = nb_random_normal(NB_F32, NB_SHAPE(n, n), 0, 1 / sqrt((double)n), 2);
    printf("A^%d + B^%d for %lld x %lld matrices; devices %s and %s%s\n", POWER, POWER,
           (long long)n, (long long)n, dev[0], dev[1],
           two_gpus && nb_physical_gpu_count() == 1 ? " (two logical GPUs sharing one card)" : "");

    /* Warm up each device (library handles, kernels, allocator). */
    for (int d = 0; d < 2; d++) {
        nb_scope *s = nb_scope_begin();
        nb_device_push(dev[d]);
        nb_matmul(nb_to_device(a, dev[d]), nb_to_device(b, dev[d]));
        nb_synchronize();
        nb_device_pop();
        nb_scope_end(s);
    }
    if (strcmp(single, dev[0]) && strcmp(single, dev[1])) {
        nb_scope *s = nb_scope_begin();
        nb_device_push(single);
        nb_matmul(a, b);
        nb_synchronize();
        nb_device_pop();
        nb_scope_end(s);
    }

    double best_single = INFINITY, best_split = INFINITY;
    nb_tensor *c_single = NULL, *c_split = NULL;
    for (int r = 0; r < reps; r++) {
        /* One device does both powers. */
        nb_scope *s = nb_scope_begin();
        double t0 = now();
        nb_device_push(single);
        nb_tensor *c = nb_add(matpow(nb_to_device(a, single), POWER),
                              matpow(nb_to_device(b, single), POWER));
        nb_synchronize();
        nb_device_pop();
        double t1 = now();
        double one = t1 - t0;
        if (one < best_single)
            best_single = one;
        if (r == reps - 1)
            c_single = nb_keep(c); /* to the outer scope */
        nb_scope_end(s);

        /* Two devices, each on a thread of its own; the sum on the first. */
        s = nb_scope_begin();
        t0 = now();
        job jobs[2] = {{dev[0], a, NULL}, {dev[1], b, NULL}};
        pthread_t th[2];
        for (int d = 0; d < 2; d++)
            if (pthread_create(&th[d], NULL, run_job, &jobs[d]) != 0) {
                fprintf(stderr, "matrix_power: cannot start a thread\n");
                return 1;
            }
        for (int d = 0; d < 2; d++)
            pthread_join(th[d], NULL);
        nb_device_push(dev[0]);
        c = nb_add(jobs[0].result, jobs[1].result); /* B^10 is copied to the first device */
        nb_synchronize();
        nb_device_pop();
        t1 = now();
        if (t1 - t0 < best_split)
            best_split = t1 - t0;
        printf("run %d: one device %.3f s, two devices %.3f s\n", r + 1, one, t1 - t0);
        nb_release(jobs[0].result); /* the threads handed these to us */
        nb_release(jobs[1].result);
        if (r == reps - 1)
            c_split = nb_keep(c);
        nb_scope_end(s);
    }

    double diff = rel_diff(c_single, c_split);
    printf("single device (%s): %.3f s\n", single, best_single);
    printf("two devices (%s + %s): %.3f s  (speed-up %.2fx)\n", dev[0], dev[1], best_split,
           best_single / best_split);
    printf("results agree to %.2e (max |difference| / max |value|)\n", diff);
    nb_scope_end(outer);
    if (!(diff < 1e-3)) {
        fprintf(stderr, "matrix_power: the two results differ by %.3e\n", diff);
        return 1;
    }
    return 0;
}
