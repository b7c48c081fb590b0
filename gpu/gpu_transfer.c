/* Copies between host and device and between devices, and synchronize.
 *
 * Host -> device goes through pinned staging buffers (4 MiB each, a pair for
 * each stream below): the host copies a chunk into free bytes of a slot and
 * queues an asynchronous DMA from them, so an upload never waits for the
 * stream's earlier work (a pageable cudaMemcpyAsync may), and the caller may
 * free src on return since every byte has been copied into pinned memory by
 * then. Uploads fill a slot one after another; the host waits (and counts it)
 * only when it turns to a slot whose last DMA is still running.
 * - Small uploads (under 1 MiB) are queued on the device's stream.
 * - Larger ones are queued on a per-device copy stream, its two slots used in
 *   turn (double buffering: the host fills one while the other's DMA runs), and
 *   the device's stream waits on an event recorded after the last chunk. The
 *   DMAs then overlap the kernels already queued instead of following them.
 *
 * The ordering of a large upload into dst, which keeps it from racing:
 *   1. The copy stream's first DMA waits for an event: the one the allocator
 *      recorded on the device's stream when dst's block was last freed (its
 *      earlier users' kernels are all before it), when dst is the start of a
 *      block that went through the cache; nothing when the block came fresh
 *      from CUDA or the arena (idle when it went back); and, for anything
 *      else, a fence recorded now on the device's stream (everything queued
 *      there so far): a destination inside a block, one the allocator does not
 *      know, or any upload while NB_DEBUG_POISON is on, since the poison fill
 *      of the new tensor is queued on the device's stream after the block was
 *      handed out (an upload that overtook it was overwritten with NaNs).
 *      Nothing else is queued on a fresh tensor before its upload: uploads go
 *      into tensors just made (nb_from_buffer, a copy to the device, a
 *      checkpoint read).
 *   2. A staging slot is refilled by the host only after the event recorded
 *      behind its last DMA has completed (waited for, and counted, when not).
 *   3. The device's stream waits for copy_done, recorded on the copy stream
 *      after the last chunk, before any later kernel, read or free: a block
 *      freed after the upload is fenced behind the DMA too.
 * With no pinned memory, copies are pageable and wait for their copy.
 * Device -> host waits for the stream (the caller reads the bytes next).
 * Device -> host and synchronize are where an out-of-range index recorded by an
 * earlier kernel (gather, scatter_add) is reported: the call fails with that
 * op's error after finishing its own work. */
#include "gpu_internal.h"

#include <string.h>

#define COPY_STREAM_MIN ((size_t)1 << 20)

/* Pinned buffers and their events; on any failure staging is off for good and
 * copies are pageable (correct, maybe slower). Called with stage_lock held. */
static void stage_init(nb_gpu_ctx *c)
{
    c->stage_state = -1;
    for (int i = 0; i < NB_GPU_STAGE_SLOTS; i++) {
        if (cudaHostAlloc(&c->stage[i], NB_GPU_STAGE_BYTES, cudaHostAllocPortable) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->stage_event[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            for (int j = 0; j <= i; j++) {
                if (c->stage[j]) {
                    nb__gpu_count_card_wait(c->phys); /* cudaFreeHost waits for the card */
                    (void)cudaFreeHost(c->stage[j]);
                }
                if (c->stage_event[j])
                    (void)cudaEventDestroy(c->stage_event[j]);
                c->stage[j] = NULL;
                c->stage_event[j] = NULL;
            }
            return;
        }
        c->stage_used[i] = false;
        c->stage_fill[i] = 0;
    }
    c->stage_state = 1;
    /* The copy stream is optional: without it large uploads use the stream. */
    if (cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking) != cudaSuccess) {
        c->copy_stream = NULL;
    } else if (cudaEventCreateWithFlags(&c->copy_done, cudaEventDisableTiming) != cudaSuccess ||
               cudaEventCreateWithFlags(&c->copy_fence, cudaEventDisableTiming) != cudaSuccess) {
        if (c->copy_done)
            (void)cudaEventDestroy(c->copy_done);
        (void)cudaStreamDestroy(c->copy_stream);
        c->copy_stream = NULL;
        c->copy_done = NULL;
    }
    (void)cudaGetLastError();
}

/* Queues the chunks of an upload through the staging slots on stream q.
 * Uploads fill a pair's current slot one after another (at 256-byte
 * boundaries): the host writes only bytes no queued DMA reads, and the slot's
 * event, recorded again after each DMA, follows every one of them, since all
 * DMAs of a pair go to one stream. When a chunk does not fit, the pair turns
 * to its other slot, waiting for that slot's last DMA first (and counting the
 * wait) only when it has not finished. So a step's small uploads (a batch and
 * its labels) share a slot with those of the steps before, and the host waits
 * for none of them until 4 MiB have passed; a large upload's 4 MiB chunks
 * still alternate between the two slots. Called with stage_lock held; on
 * failure *call names the CUDA call. */
static cudaError_t staged_copy(nb_gpu_ctx *c, int pair, cudaStream_t q, void *dst, const void *src,
                               size_t nbytes, const char **call)
{
    cudaError_t e = cudaSuccess;
    for (size_t done = 0; done < nbytes && e == cudaSuccess;) {
        size_t k = nbytes - done < NB_GPU_STAGE_BYTES ? nbytes - done : NB_GPU_STAGE_BYTES;
        int s = 2 * pair + c->stage_next[pair];
        size_t at = (c->stage_fill[s] + 255) & ~(size_t)255;
        if (c->stage_fill[s] == 0 || at > NB_GPU_STAGE_BYTES - k) {
            if (c->stage_fill[s] > 0) { /* full: the other slot */
                c->stage_next[pair] ^= 1;
                s = 2 * pair + c->stage_next[pair];
            }
            if (c->stage_used[s]) {
                /* The slot's last DMA has usually finished: wait (and count
                 * it) only when it has not. */
                *call = "cudaEventQuery";
                e = cudaEventQuery(c->stage_event[s]);
                if (e == cudaErrorNotReady) {
                    (void)cudaGetLastError(); /* not an error: keep it from a later launch check */
                    nb__gpu_count_wait(c);
                    *call = "cudaEventSynchronize";
                    e = cudaEventSynchronize(c->stage_event[s]);
                }
                if (e != cudaSuccess)
                    break;
            }
            c->stage_fill[s] = 0;
            at = 0;
        }
        char *slot = (char *)c->stage[s] + at;
        memcpy(slot, (const char *)src + done, k);
        if ((e = cudaMemcpyAsync((char *)dst + done, slot, k, cudaMemcpyHostToDevice, q)) != cudaSuccess) {
            *call = "cudaMemcpyAsync";
            break;
        }
        if ((e = cudaEventRecord(c->stage_event[s], q)) != cudaSuccess) {
            *call = "cudaEventRecord";
            /* the slot may still be read by the DMA: wait before anyone reuses it */
            nb__gpu_count_wait(c);
            (void)cudaStreamSynchronize(q);
            c->stage_used[s] = false;
            c->stage_fill[s] = 0;
            break;
        }
        c->stage_used[s] = true;
        c->stage_fill[s] = at + k;
        done += k;
    }
    return e;
}

nb_status nb__gpu_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return NB_OK;
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "copy_from_host", &c);
    if (st || (st = nb__gpu_not_recording(c, "copy_from_host")) != NB_OK)
        return st;
    pthread_mutex_lock(&c->stage_lock);
    if (c->stage_state == 0)
        stage_init(c);
    if (c->stage_state < 0) {
        pthread_mutex_unlock(&c->stage_lock);
        /* The caller may free src when we return: wait for the copy. */
        NB_GPU_CALL(c, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyHostToDevice, c->stream);
        nb__gpu_count_wait(c);
        NB_GPU_CALL(c, cudaStreamSynchronize, c->stream);
        return NB_OK;
    }
    cudaError_t e = cudaSuccess;
    const char *call = "";
    if (nbytes < COPY_STREAM_MIN || !c->copy_stream) {
        e = staged_copy(c, 0, c->stream, dst, src, nbytes, &call);
    } else {
        /* The copy stream writes dst only after the block's earlier users (1. above). */
        if (nb__debug_poison() || !nb__gpu_block_fence(c, dst, c->copy_stream)) {
            call = "cudaEventRecord";
            e = cudaEventRecord(c->copy_fence, c->stream);
            if (e == cudaSuccess) {
                call = "cudaStreamWaitEvent";
                e = cudaStreamWaitEvent(c->copy_stream, c->copy_fence, 0);
            }
        }
        if (e == cudaSuccess)
            e = staged_copy(c, 1, c->copy_stream, dst, src, nbytes, &call);
        /* Whatever was queued, the device's stream must not run ahead of it. */
        cudaError_t e2 = cudaEventRecord(c->copy_done, c->copy_stream);
        if (e2 == cudaSuccess)
            e2 = cudaStreamWaitEvent(c->stream, c->copy_done, 0);
        if (e2 != cudaSuccess) {
            /* No ordering: wait for the copy stream instead. */
            (void)cudaGetLastError();
            nb__gpu_count_wait(c);
            cudaError_t e3 = cudaStreamSynchronize(c->copy_stream);
            if (e == cudaSuccess && e3 != cudaSuccess) { /* else the upload is done, and ordered by the wait */
                e = e3;
                call = "cudaStreamSynchronize";
            }
        }
    }
    pthread_mutex_unlock(&c->stage_lock);
    return e == cudaSuccess ? NB_OK : nb__gpu_cuda_fail(e, call, dev->name);
}

nb_status nb__gpu_not_recording(nb_gpu_ctx *c, const char *who)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return NB_OK; /* the wait that follows reports what is wrong with the stream */
    }
    if (cs == cudaStreamCaptureStatusNone)
        return NB_OK;
    return nb__fail(NB_ERR_UNSUPPORTED, "%s: %s is recording a step (nb_graph_capture) on another thread; it can "
                    "be waited for once the recording ends", who, c->dev->name);
}

/* Waits for c's stream (counted), and reports an index an earlier kernel
 * found out of range (nb__gpu_index_error_fetch). */
static nb_status wait_stream(nb_gpu_ctx *c)
{
    bool fetched = nb__gpu_index_error_fetch(c);
    nb__gpu_count_wait(c);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    nb_status st = nb__gpu_index_error_report(c, fetched, e == cudaSuccess);
    return e != cudaSuccess ? nb__gpu_cuda_fail(e, "cudaStreamSynchronize", c->dev->name) : st;
}

nb_status nb__gpu_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return NB_OK;
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "copy_to_host", &c);
    if (st)
        return st;
    if ((st = nb__gpu_not_recording(c, "copy_to_host")) != NB_OK)
        return st;
    NB_GPU_CALL(c, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyDeviceToHost, c->stream);
    return wait_stream(c); /* and a bad index met by an earlier kernel */
}

/* Peer access between two cards, enabled once per ordered pair when the
 * hardware allows it (cudaMemcpyPeerAsync works without it, staged through the
 * host). */
static pthread_mutex_t g_peer_lock = PTHREAD_MUTEX_INITIALIZER;
static signed char g_peer[NB_GPU_MAX_PHYS][NB_GPU_MAX_PHYS]; /* 0 unknown, 1 on, -1 off */

static void enable_peer(int from, int to)
{
    if (from < 0 || to < 0 || from >= NB_GPU_MAX_PHYS || to >= NB_GPU_MAX_PHYS)
        return;
    pthread_mutex_lock(&g_peer_lock);
    if (g_peer[from][to] == 0) {
        int can = 0;
        g_peer[from][to] = -1;
        if (cudaDeviceCanAccessPeer(&can, from, to) == cudaSuccess && can) {
            cudaError_t e = cudaDeviceEnablePeerAccess(to, 0); /* from is current */
            if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled)
                g_peer[from][to] = 1;
        }
        (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&g_peer_lock);
}

static nb_status copy_gpu_gpu(nb_device *dev, void *dst, nb_device *src_dev, const void *src, size_t nbytes)
{
    nb_gpu_ctx *cs, *cd;
    nb_status st = nb__gpu_enter(src_dev, "copy_between", &cs);
    if (st || (st = nb__gpu_enter(dev, "copy_between", &cd)) != NB_OK)
        return st;
    if (cs == cd) {
        NB_GPU_CALL(cd, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyDeviceToDevice, cd->stream);
        return NB_OK;
    }
    /* The copy runs on the destination's stream after the source's queued work;
     * the source's stream then waits for the copy, so the source block is not
     * reused (in stream order) before the copy has read it. */
    if ((st = nb__gpu_stream_wait(cd, cs)) != NB_OK) /* leaves cd's card current */
        return st;
    if (cs->ordinal == cd->ordinal) {
        NB_GPU_CALL(cd, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyDeviceToDevice, cd->stream);
    } else {
        enable_peer(cd->ordinal, cs->ordinal);
        NB_GPU_CALL(cd, cudaMemcpyPeerAsync, dst, cd->ordinal, src, cs->ordinal, nbytes, cd->stream);
    }
    return nb__gpu_stream_wait(cs, cd);
}

nb_status nb__gpu_copy_between(nb_device *dev, void *dst, nb_device *src_dev, const void *src,
                               size_t nbytes)
{
    if (nbytes == 0)
        return NB_OK;
    if (dev->kind == NB_DEVICE_GPU && src_dev->kind == NB_DEVICE_GPU)
        return copy_gpu_gpu(dev, dst, src_dev, src, nbytes);
    if (dev->kind == NB_DEVICE_GPU) {
        /* from host memory: let the host device finish writing it first */
        if (src_dev->backend && src_dev->backend->synchronize) {
            nb_status st = src_dev->backend->synchronize(src_dev);
            if (st)
                return st;
        }
        return nb__gpu_copy_from_host(dev, dst, src, nbytes);
    }
    if (src_dev->kind == NB_DEVICE_GPU)
        return nb__gpu_copy_to_host(src_dev, dst, src, nbytes);
    return nb__fail(NB_ERR_INTERNAL, "copy_between: GPU backend called for %s -> %s", src_dev->name,
                    dev->name);
}

nb_status nb__gpu_synchronize(nb_device *dev)
{
    nb_gpu_ctx *c = dev->ctx;
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE))
        return NB_OK; /* never used: nothing queued, and no context made for it */
    nb_status st = nb__gpu_set_device(c->ordinal, dev->name);
    if (st)
        return st;
    if ((st = nb__gpu_not_recording(c, "synchronize")) != NB_OK)
        return st;
    return wait_stream(c);
}
