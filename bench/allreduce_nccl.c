/* NCCL called directly, the reference beside the strategy's all-reduce in
 * bench_allreduce: ncclAllReduce (SUM, f32, out of place) over the first n GPUs,
 * one communicator per GPU from ncclCommInitAll, the calls grouped from one
 * thread as nccl-tests does in its single-thread mode. Built only when NCCL is. */
#include "allreduce_nccl.h"
#include "bench_util.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

struct nccl_ref {
    int n;
    size_t cap;
    ncclComm_t comm[NCCL_REF_MAX];
    cudaStream_t stream[NCCL_REF_MAX];
    void *send[NCCL_REF_MAX], *recv[NCCL_REF_MAX];
};

static bool cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return true;
    fprintf(stderr, "NCCL reference: %s: %s\n", what, cudaGetErrorString(e));
    return false;
}

nccl_ref *nccl_ref_new(int n, size_t max_bytes)
{
    int have = 0;
    if (n < 2 || n > NCCL_REF_MAX || cudaGetDeviceCount(&have) != cudaSuccess || have < n)
        return NULL;
    nccl_ref *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->n = n;
    r->cap = max_bytes;
    int devs[NCCL_REF_MAX];
    for (int i = 0; i < n; i++)
        devs[i] = i;
    ncclResult_t nr = ncclCommInitAll(r->comm, n, devs);
    if (nr != ncclSuccess) {
        fprintf(stderr, "NCCL reference: ncclCommInitAll: %s\n", ncclGetErrorString(nr));
        free(r);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!cuda_ok(cudaSetDevice(i), "cudaSetDevice") ||
            !cuda_ok(cudaStreamCreateWithFlags(&r->stream[i], cudaStreamNonBlocking), "cudaStreamCreate") ||
            !cuda_ok(cudaMalloc(&r->send[i], max_bytes), "cudaMalloc") ||
            !cuda_ok(cudaMalloc(&r->recv[i], max_bytes), "cudaMalloc") ||
            !cuda_ok(cudaMemset(r->send[i], 0, max_bytes), "cudaMemset")) {
            r->n = i + 1; /* free what was made */
            nccl_ref_free(r);
            return NULL;
        }
    }
    return r;
}

/* One all-reduce on every GPU, then a wait for all of them. */
static bool once(nccl_ref *r, size_t count)
{
    ncclGroupStart();
    for (int i = 0; i < r->n; i++)
        ncclAllReduce(r->send[i], r->recv[i], count, ncclFloat32, ncclSum, r->comm[i], r->stream[i]);
    ncclResult_t nr = ncclGroupEnd();
    if (nr != ncclSuccess) {
        fprintf(stderr, "NCCL reference: ncclAllReduce: %s\n", ncclGetErrorString(nr));
        return false;
    }
    for (int i = 0; i < r->n; i++)
        if (!cuda_ok(cudaSetDevice(i), "cudaSetDevice") || !cuda_ok(cudaStreamSynchronize(r->stream[i]), "sync"))
            return false;
    return true;
}

double nccl_ref_time(nccl_ref *r, size_t bytes, int reps)
{
    if (!r || bytes > r->cap || reps < 1)
        return -1;
    double *v = malloc(sizeof *v * (size_t)reps);
    if (!v)
        return -1;
    int warm = reps < 5 ? 1 : 3;
    double median = -1;
    for (int k = 0; k < warm + reps; k++) {
        double t0 = bench_now();
        if (!once(r, bytes / 4))
            goto done;
        if (k >= warm)
            v[k - warm] = (bench_now() - t0) * 1e6;
    }
    median = bench_median(v, reps);
done:
    free(v);
    return median;
}

void nccl_ref_free(nccl_ref *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        cudaSetDevice(i);
        if (r->stream[i])
            cudaStreamSynchronize(r->stream[i]);
        if (r->comm[i])
            ncclCommDestroy(r->comm[i]);
        if (r->stream[i])
            cudaStreamDestroy(r->stream[i]);
        cudaFree(r->send[i]);
        cudaFree(r->recv[i]);
    }
    free(r);
}
