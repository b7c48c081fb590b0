/* Copies between host and device and between devices, and synchronize.
 *
 * Host -> device goes through two pinned staging buffers per device (4 MiB
 * each): the host copies into a free slot and queues an asynchronous DMA, so an
 * upload never waits for the stream's earlier work (a pageable cudaMemcpyAsync
 * may). Uploads larger than STAGE_LIMIT (or with no pinned memory) use a
 * pageable copy and wait for it, since the caller may free src on return; the
 * transfer dominates their cost anyway.
 * Device -> host waits for the stream (the caller reads the bytes next). */
#include "gpu_internal.h"

#include <string.h>

#define STAGE_LIMIT ((size_t)32 << 20)

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
    }
    c->stage_state = 1;
}

nb_status nb__gpu_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return NB_OK;
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "copy_from_host", &c);
    if (st)
        return st;
    if (nbytes > STAGE_LIMIT) {
        /* The caller may free src when we return: wait for the copy. */
        NB_GPU_CALL(c, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyHostToDevice, c->stream);
        nb__gpu_count_wait(c);
        NB_GPU_CALL(c, cudaStreamSynchronize, c->stream);
        return NB_OK;
    }
    pthread_mutex_lock(&c->stage_lock);
    if (c->stage_state == 0)
        stage_init(c);
    if (c->stage_state < 0) {
        pthread_mutex_unlock(&c->stage_lock);
        NB_GPU_CALL(c, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyHostToDevice, c->stream);
        nb__gpu_count_wait(c);
        NB_GPU_CALL(c, cudaStreamSynchronize, c->stream);
        return NB_OK;
    }
    cudaError_t e = cudaSuccess;
    const char *call = "";
    for (size_t done = 0; done < nbytes && e == cudaSuccess;) {
        int s = c->stage_next;
        c->stage_next = (s + 1) % NB_GPU_STAGE_SLOTS;
        if (c->stage_used[s]) {
            /* The slot's last DMA has usually finished: wait (and count it) only
             * when it has not. */
            call = "cudaEventQuery";
            e = cudaEventQuery(c->stage_event[s]);
            if (e == cudaErrorNotReady) {
                (void)cudaGetLastError(); /* not an error: keep it from a later launch check */
                nb__gpu_count_wait(c);
                call = "cudaEventSynchronize";
                e = cudaEventSynchronize(c->stage_event[s]);
            }
            if (e != cudaSuccess)
                break;
        }
        size_t k = nbytes - done < NB_GPU_STAGE_BYTES ? nbytes - done : NB_GPU_STAGE_BYTES;
        memcpy(c->stage[s], (const char *)src + done, k);
        if ((e = cudaMemcpyAsync((char *)dst + done, c->stage[s], k, cudaMemcpyHostToDevice, c->stream)) !=
            cudaSuccess) {
            call = "cudaMemcpyAsync";
            break;
        }
        if ((e = cudaEventRecord(c->stage_event[s], c->stream)) != cudaSuccess) {
            call = "cudaEventRecord";
            /* the slot may still be read by the DMA: wait before anyone reuses it */
            nb__gpu_count_wait(c);
            (void)cudaStreamSynchronize(c->stream);
            break;
        }
        c->stage_used[s] = true;
        done += k;
    }
    pthread_mutex_unlock(&c->stage_lock);
    return e == cudaSuccess ? NB_OK : nb__gpu_cuda_fail(e, call, dev->name);
}

nb_status nb__gpu_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0)
        return NB_OK;
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "copy_to_host", &c);
    if (st)
        return st;
    NB_GPU_CALL(c, cudaMemcpyAsync, dst, src, nbytes, cudaMemcpyDeviceToHost, c->stream);
    bool fetched = nb__gpu_index_error_fetch(c);
    nb__gpu_count_wait(c);
    NB_GPU_CALL(c, cudaStreamSynchronize, c->stream);
    return nb__gpu_index_error_report(c, fetched); /* a bad index met by an earlier kernel */
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
    bool fetched = nb__gpu_index_error_fetch(c);
    nb__gpu_count_wait(c);
    NB_GPU_CALL(c, cudaStreamSynchronize, c->stream);
    return nb__gpu_index_error_report(c, fetched);
}
