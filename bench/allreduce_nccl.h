/* NCCL called directly (bench/allreduce_nccl.c), for bench_allreduce. */
#ifndef NB_BENCH_ALLREDUCE_NCCL_H
#define NB_BENCH_ALLREDUCE_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#define NCCL_REF_MAX 8

typedef struct nccl_ref nccl_ref;

/* Communicators and buffers of max_bytes on GPUs 0 .. n-1; NULL (with a line on
 * stderr) when there are fewer GPUs or NCCL fails. Freed with nccl_ref_free. */
nccl_ref *nccl_ref_new(int n, size_t max_bytes);
/* Median microseconds of one all-reduce of `bytes` (f32) after a warm-up; -1 on failure. */
double nccl_ref_time(nccl_ref *r, size_t bytes, int reps);
void nccl_ref_free(nccl_ref *r);

#endif
