/* Collectives over GPUs through NCCL: the nb_collective of the CUDA backend.
 *
 * One communicator per rank, all made at once by ncclCommInitAll in one
 * process. Each rank's work goes on its device's own stream, so an all-reduce
 * is ordered after the kernels that wrote the gradients with no host wait.
 * Each rank is driven from its own host thread: NCCL may block a rank's call
 * until the other ranks reach theirs, so one thread calling every rank in turn
 * would hang. Built only when NCCL is found (NB_HAVE_NCCL).
 *
 * Across processes (the mirrored strategy under mpirun with one GPU per
 * process): one communicator of one rank per process, made and used in
 * NCCL's nonblocking mode and polled against a deadline, aborted when it
 * passes, so a dead process is an error on the others, not a hang. */
#include "gpu_internal.h"

#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0) /* the value 9 since; a C file never sees CUDA's bf16 macro */
    case NB_BF16: *out = (ncclDataType_t)9; return true;
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

/* ---- across processes -------------------------------------------------------------- */

/* One process's rank of a communicator over processes: nonblocking (NCCL's
 * calls return at once and the caller polls), so a rank that never arrives is
 * a timeout and an abort, not a hang. */
typedef struct nb_gpu_nccl_world {
    ncclComm_t comm;
    nb_gpu_ctx *ctx;
    bool aborted;
} nb_gpu_nccl_world;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pause_briefly(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static nb_status nccl_world_make_id(void *id)
{
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)id);
    return r == ncclSuccess ? NB_OK : nccl_fail(r, "ncclGetUniqueId", "this process");
}

/* Polls the communicator's state until it leaves ncclInProgress, at most
 * until deadline. */
static ncclResult_t world_settle(ncclComm_t comm, double deadline, bool *late)
{
    ncclResult_t state = ncclInProgress;
    *late = false;
    while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress) {
        if (now_s() > deadline) {
            *late = true;
            break;
        }
        pause_briefly();
    }
    return state;
}

static nb_status nccl_world_comm_new(nb_device *dev, int rank, int size, const void *id, double timeout_s,
                                     void **out)
{
    *out = NULL;
    nb_gpu_nccl_world *w = calloc(1, sizeof *w);
    if (!w)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nccl: no host memory for a communicator");
    nb_status st = nb__gpu_enter(dev, "nccl", &w->ctx);
    if (st) {
        free(w);
        return st;
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&w->comm, size, uid, rank, &config);
    bool late = false;
    if (r == ncclSuccess || r == ncclInProgress)
        r = world_settle(w->comm, now_s() + timeout_s, &late);
    if (r != ncclSuccess || late) {
        if (w->comm)
            (void)ncclCommAbort(w->comm);
        free(w);
        if (late)
            return nb__fail(NB_ERR_TIMEOUT,
                            "nccl: the communicator over %d processes did not form within %g s on %s (rank %d): a "
                            "process died or stopped answering",
                            size, timeout_s, dev->name, rank);
        return nccl_fail(r, "ncclCommInitRankConfig", dev->name);
    }
    *out = w;
    return NB_OK;
}

static nb_status nccl_world_sum(void *comm, int n_bufs, void *const *bufs, const int64_t *counts, nb_dtype dtype,
                                double timeout_s)
{
    nb_gpu_nccl_world *w = comm;
    nb_gpu_ctx *ctx = w->ctx;
    if (w->aborted)
        return nb__fail(NB_ERR_TIMEOUT, "nccl: the communicator on %s was aborted after an earlier timeout",
                        ctx->dev->name);
    ncclDataType_t type;
    if (!nccl_type(dtype, &type))
        return nb__fail(NB_ERR_DTYPE, "nccl: cannot sum %s across processes on %s", nb_dtype_name(dtype),
                        ctx->dev->name);
    nb_status st = nb__gpu_set_device(ctx->ordinal, ctx->dev->name);
    if (st)
        return st;
    const double deadline = now_s() + timeout_s;
    bool late = false;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n_bufs && (r == ncclSuccess || r == ncclInProgress); i++)
        if (counts[i] > 0)
            r = ncclAllReduce(bufs[i], bufs[i], (size_t)counts[i], type, ncclSum, w->comm, ctx->stream);
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress)
        r = end;
    if (r == ncclSuccess || r == ncclInProgress)
        r = world_settle(w->comm, deadline, &late); /* the calls enqueued */
    /* then the sums themselves, on the stream */
    while (!late && r == ncclSuccess) {
        cudaError_t e = cudaStreamQuery(ctx->stream);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            return nb__gpu_cuda_fail(e, "cudaStreamQuery", ctx->dev->name);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(w->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            r = async;
        else if (now_s() > deadline)
            late = true;
        else
            pause_briefly();
    }
    (void)cudaGetLastError(); /* cudaErrorNotReady is not an error */
    if (late) {
        (void)ncclCommAbort(w->comm); /* frees the stream of the stuck sums */
        w->aborted = true;
        return nb__fail(NB_ERR_TIMEOUT,
                        "nccl: the sum across processes did not finish within %g s on %s: a process died or "
                        "stopped answering (the communicator was aborted)",
                        timeout_s, ctx->dev->name);
    }
    return r == ncclSuccess ? NB_OK : nccl_fail(r, "ncclAllReduce", ctx->dev->name);
}

static void nccl_world_comm_free(void *comm)
{
    nb_gpu_nccl_world *w = comm;
    if (!w)
        return;
    if (!w->aborted && nb__gpu_set_device(w->ctx->ordinal, w->ctx->dev->name) == NB_OK) {
        nb__gpu_count_wait(w->ctx);
        (void)cudaStreamSynchronize(w->ctx->stream);
        nb__gpu_count_card_wait(w->ctx->phys);
        (void)ncclCommDestroy(w->comm);
    }
    free(w);
}

const nb_collective nb__gpu_nccl = {
    .name = "nccl",
    .comm_new = nccl_comm_new,
    .all_reduce_sum = nccl_all_reduce_sum,
    .comm_free = nccl_comm_free,
    .world_id_bytes = sizeof(ncclUniqueId),
    .world_make_id = nccl_world_make_id,
    .world_comm_new = nccl_world_comm_new,
    .world_sum = nccl_world_sum,
    .world_comm_free = nccl_world_comm_free,
};
