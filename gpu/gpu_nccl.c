/* Collectives over GPUs through NCCL: the nb_collective of the CUDA backend.
 *
 * One communicator per rank, all made at once by ncclCommInitAll in one
 * process. Each rank's work goes on its device's own stream, so an all-reduce
 * is ordered after the kernels that wrote the gradients with no host wait.
 * Each rank is driven from its own host thread: NCCL may block a rank's call
 * until the other ranks reach theirs, so one thread calling every rank in turn
 * would hang. Built only when NCCL is found (NB_HAVE_NCCL). */
#include "gpu_internal.h"

#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct nb_gpu_nccl_comm {
    int n;
    ncclComm_t *comms; /* comms[r]: rank r's communicator */
    nb_gpu_ctx **ctxs; /* ctxs[r]: rank r's device; its stream carries the work */
} nb_gpu_nccl_comm;

/* Records NB_ERR_BACKEND "<call> failed on <devs>: <NCCL's string>" with NCCL's
 * last message when it has one (the codes alone are generic); returns
 * NB_ERR_BACKEND. */
static nb_status nccl_fail(ncclResult_t r, const char *call, const char *devs)
{
    const char *detail = "";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    detail = ncclGetLastError(NULL);
    if (!detail)
        detail = "";
#endif
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %s%s%s%s", call, devs, ncclGetErrorString(r),
                    detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

/* NCCL's element type for dtype: false for a dtype it cannot sum (NB_BOOL). */
static bool nccl_type(nb_dtype dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case NB_F32: *out = ncclFloat32; return true;
    case NB_F64: *out = ncclFloat64; return true;
    case NB_F16: *out = ncclFloat16; return true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0) && defined(__CUDA_BF16_TYPES_EXIST__)
    case NB_BF16: *out = ncclBfloat16; return true;
#endif
    case NB_I32: *out = ncclInt32; return true;
    case NB_I64: *out = ncclInt64; return true;
    case NB_U8: *out = ncclUint8; return true;
    default: return false;
    }
}

/* Host memory only; the communicators are destroyed by the caller. */
static void comm_release(nb_gpu_nccl_comm *c)
{
    if (!c)
        return;
    free(c->comms);
    free(c->ctxs);
    free(c);
}

/* "/gpu:0, /gpu:1, ..." into buf (cut short when it does not fit). */
static void device_list(int n, nb_device *const *devs, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && used < size; r++) {
        int k = snprintf(buf + used, size - used, "%s%s", r ? ", " : "", devs[r]->name);
        if (k < 0)
            break;
        used += (size_t)k;
    }
}

/* Checks that devs are n >= 2 GPUs on distinct cards, creates their streams and
 * one NCCL communicator per rank. NB_OK with *out set; NB_ERR_UNSUPPORTED for
 * devices that cannot share a communicator, NB_ERR_OUT_OF_MEMORY, or
 * NB_ERR_BACKEND when CUDA or NCCL fails (all recorded). */
static nb_status nccl_comm_new(int n, nb_device *const *devs, void **out)
{
    *out = NULL;
    if (n < 2 || !devs)
        return nb__fail(NB_ERR_UNSUPPORTED, "nccl: a communicator needs two devices or more, got %d", n);
    for (int r = 0; r < n; r++) {
        if (!devs[r])
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "nccl: device %d of %d is NULL", r, n);
        if (devs[r]->kind != NB_DEVICE_GPU)
            return nb__fail(NB_ERR_UNSUPPORTED, "nccl: %s is not a GPU device", devs[r]->name);
    }
    /* NCCL needs one rank per card: two ranks on one card may hang. */
    for (int r = 1; r < n; r++) {
        const nb_gpu_ctx *a = devs[r]->ctx;
        for (int q = 0; q < r; q++) {
            const nb_gpu_ctx *b = devs[q]->ctx;
            if (a->ordinal == b->ordinal)
                return nb__fail(NB_ERR_UNSUPPORTED, "nccl: %s and %s are on one card (CUDA device %d)",
                                devs[q]->name, devs[r]->name, a->ordinal);
        }
    }

    nb_gpu_nccl_comm *c = calloc(1, sizeof *c);
    int *ordinals = calloc((size_t)n, sizeof *ordinals);
    if (c) {
        c->n = n;
        c->comms = calloc((size_t)n, sizeof *c->comms);
        c->ctxs = calloc((size_t)n, sizeof *c->ctxs);
    }
    if (!c || !ordinals || !c->comms || !c->ctxs) {
        comm_release(c);
        free(ordinals);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nccl: no host memory for a communicator over %d devices", n);
    }
    /* Every stream exists before any collective is queued on it. */
    for (int r = 0; r < n; r++) {
        nb_status st = nb__gpu_enter(devs[r], "nccl", &c->ctxs[r]);
        if (st) {
            comm_release(c);
            free(ordinals);
            return st;
        }
        ordinals[r] = c->ctxs[r]->ordinal;
    }

    ncclResult_t res = ncclCommInitAll(c->comms, n, ordinals);
    free(ordinals);
    if (res != ncclSuccess) {
        char names[NB_GPU_MAX_PHYS * (sizeof devs[0]->name + 2)];
        device_list(n, devs, names, sizeof names);
        nb_status st = nccl_fail(res, "ncclCommInitAll", names);
        /* A rank whose initialisation began holds resources only abort frees. */
        for (int r = 0; r < n; r++)
            if (c->comms[r])
                (void)ncclCommAbort(c->comms[r]);
        comm_release(c);
        return st;
    }
    *out = c;
    return NB_OK;
}

/* Queues the sums of rank's buffers on its stream as one NCCL group. NB_OK once
 * queued; NB_ERR_INVALID_ARGUMENT for a bad rank or count, NB_ERR_DTYPE for a
 * dtype NCCL cannot sum, NB_ERR_BACKEND when CUDA or NCCL fails (all recorded).
 * Arguments are checked before anything is queued; since every rank gets the
 * same counts and dtype, the ranks fail alike instead of leaving peers waiting. */
static nb_status nccl_all_reduce_sum(void *comm, int rank, int n_bufs, const void *const *send,
                                     void *const *recv, const int64_t *counts, nb_dtype dtype)
{
    nb_gpu_nccl_comm *c = comm;
    if (!c || rank < 0 || rank >= c->n)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nccl all_reduce_sum: rank %d is outside [0, %d)", rank,
                        c ? c->n : 0);
    nb_gpu_ctx *ctx = c->ctxs[rank];
    if (n_bufs < 0 || (n_bufs > 0 && (!send || !recv || !counts)))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nccl all_reduce_sum: bad buffer list (%d buffers) on %s",
                        n_bufs, ctx->dev->name);
    ncclDataType_t type;
    if (!nccl_type(dtype, &type))
        return nb__fail(NB_ERR_DTYPE, "nccl all_reduce_sum: cannot sum %s on %s", nb_dtype_name(dtype),
                        ctx->dev->name);
    for (int i = 0; i < n_bufs; i++) {
        bool too_big = false;
#if INT64_MAX > SIZE_MAX
        too_big = counts[i] > (int64_t)SIZE_MAX;
#endif
        if (counts[i] < 0 || too_big)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "nccl all_reduce_sum: count %lld of buffer %d on %s",
                            (long long)counts[i], i, ctx->dev->name);
    }

    nb_status st = nb__gpu_set_device(ctx->ordinal, ctx->dev->name);
    if (st)
        return st;
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess)
        return nccl_fail(res, "ncclGroupStart", ctx->dev->name);
    const char *call = "ncclAllReduce";
    for (int i = 0; i < n_bufs && res == ncclSuccess; i++)
        if (counts[i] > 0)
            res = ncclAllReduce(send[i], recv[i], (size_t)counts[i], type, ncclSum, c->comms[rank],
                                ctx->stream);
    /* The group is closed even after a failure: it belongs to this thread and
     * would swallow its next NCCL calls. */
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess && end != ncclSuccess) {
        res = end;
        call = "ncclGroupEnd";
    }
    return res == ncclSuccess ? NB_OK : nccl_fail(res, call, ctx->dev->name);
}

/* Waits for every rank's stream, then destroys the communicators. Failures
 * cannot be returned: they are logged as warnings. NULL is ignored. */
static void nccl_comm_free(void *comm)
{
    nb_gpu_nccl_comm *c = comm;
    if (!c)
        return;
    for (int r = 0; r < c->n; r++) {
        nb_gpu_ctx *ctx = c->ctxs[r];
        if (nb__gpu_set_device(ctx->ordinal, ctx->dev->name) != NB_OK)
            continue;
        nb__gpu_count_wait(ctx);
        cudaError_t e = cudaStreamSynchronize(ctx->stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            nb__log(NB_LOG_WARNING, "nccl: cudaStreamSynchronize failed on %s: %s", ctx->dev->name,
                    cudaGetErrorString(e));
        }
    }
    for (int r = 0; r < c->n; r++) {
        nb_gpu_ctx *ctx = c->ctxs[r];
        nb__gpu_count_card_wait(ctx->phys); /* it frees device memory: cudaFree waits for the card */
        ncclResult_t res = ncclCommDestroy(c->comms[r]);
        if (res != ncclSuccess)
            nb__log(NB_LOG_WARNING, "nccl: ncclCommDestroy failed on %s: %s", ctx->dev->name,
                    ncclGetErrorString(res));
    }
    comm_release(c);
}

const nb_collective nb__gpu_nccl = {
    .name = "nccl",
    .comm_new = nccl_comm_new,
    .all_reduce_sum = nccl_all_reduce_sum,
    .comm_free = nccl_comm_free,
};
