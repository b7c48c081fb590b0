// Recording a step into a CUDA graph and replaying it (nb_graph_kernels, for
// lib/graph).
//
// begin starts stream capture on the device's stream in thread-local mode (a
// call that would wait for the device, from this thread, breaks the capture
// rather than another thread's work) and points the device's allocations at a
// pool private to the graph (gpu_allocator.c): the recorded kernels keep their
// addresses, and nothing else may get those blocks while the graph lives. end
// instantiates the graph. launch first stores the host numbers the replay
// reads (a step count, a learning rate) with one small kernel whose arguments
// carry them, so the host never writes memory a queued replay may still read,
// then launches the graph. An index check recorded in the step (gather, the
// label check) is armed again at each replay, so the next synchronising call
// reports a bad index as an eager step would.
#include "gpu_kernels.cuh"
#include "gpu_fuse.h" // after: core.h needs gpu_internal.h's atomics in C++

#include <cstdlib>

using namespace nbg;

namespace {

constexpr int kStoreChunk = 64; // doubles a launch carries (512 bytes of arguments)

struct Chunk {
    double v[kStoreChunk];
};

__global__ void k_store(double *dst, Chunk c, int n)
{
    const int i = threadIdx.x;
    if (i < n)
        dst[i] = c.v[i];
}

struct Rec {
    nb_gpu_ctx *c;
    nb_gpu_pool *pool;
    int armed_before; // the index check's state when recording began
};

struct Exec {
    cudaGraphExec_t exec;
    nb_gpu_pool *pool;
    bool arms_index;
    int64_t nodes;
    // recorded after the recording and after each replay: what may still use
    // the pool is behind it (NULL when it could not be made: the stream then)
    cudaEvent_t done;
};

nb_status begin(nb_device *dev, void **out)
{
    *out = nullptr;
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "nb_graph_capture", &c);
    if (st)
        return st;
    Rec *r = static_cast<Rec *>(calloc(1, sizeof(Rec)));
    if (!r)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_graph_capture: out of host memory on %s", dev->name);
    r->c = c;
    if ((st = nb__gpu_pool_start(c, &r->pool)) != NB_OK) {
        free(r);
        return st;
    }
    r->armed_before = __atomic_exchange_n(&c->index_armed, 0, __ATOMIC_RELAXED);
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        nb__gpu_pool_stop(c);
        nb__gpu_pool_release(r->pool, true); // nothing was allocated from it: kept for the next
        __atomic_or_fetch(&c->index_armed, r->armed_before, __ATOMIC_RELAXED);
        free(r);
        return nb__gpu_cuda_fail(e, "cudaStreamBeginCapture", dev->name);
    }
    nb__gpu_fuse_start(c); // elementwise chains recorded from here on may fuse
    *out = r;
    return NB_OK;
}

// Gives a pool back after the stream has finished the work queued before the
// recording (the blocks freed while recording may still be read by it).
void release_after_stream(nb_gpu_ctx *c, nb_gpu_pool *pool, bool abandoned)
{
    nb__gpu_count_wait(c);
    if (cudaStreamSynchronize(c->stream) != cudaSuccess)
        (void)cudaGetLastError();
    nb__gpu_pool_release(pool, abandoned);
}

nb_status end(nb_device *dev, void *rec, bool keep, void **out)
{
    *out = nullptr;
    Rec *r = static_cast<Rec *>(rec);
    nb_gpu_ctx *c = r->c;
    cudaGraph_t g = nullptr;
    // the pending chain is recorded last; one that fails to launch fails the recording
    const nb_status fused = nb__gpu_fuse_stop(c, keep);
    if (fused != NB_OK)
        keep = false;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    nb__gpu_pool_stop(c);
    const bool armed = __atomic_exchange_n(&c->index_armed, r->armed_before, __ATOMIC_RELAXED) != 0;
    nb_status st = NB_OK;
    const char *call = "cudaStreamEndCapture";
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
    if (e == cudaSuccess && keep) {
        call = "cudaGraphGetNodes";
        e = cudaGraphGetNodes(g, nullptr, &nodes);
        if (e == cudaSuccess) {
            call = "cudaGraphInstantiate";
            e = cudaGraphInstantiate(&exec, g, 0);
        }
    }
    if (g)
        (void)cudaGraphDestroy(g);
    Exec *x = nullptr;
    if (e != cudaSuccess) {
        // cudaErrorStreamCaptureInvalidated and its kin: a call the capture
        // cannot hold ran on this thread (the rules of lib/graph catch the
        // ones nabla knows; this is the rest).
        st = nb__fail(NB_ERR_BACKEND,
                      "nb_graph_capture: %s failed on %s: %s (a call in the step could not be recorded)", call,
                      dev->name, cudaGetErrorString(e));
        (void)cudaGetLastError();
    } else if (keep && !(x = static_cast<Exec *>(calloc(1, sizeof(Exec))))) {
        st = nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_graph_capture: out of host memory on %s", dev->name);
    }
    if (!x) {
        if (exec)
            (void)cudaGraphExecDestroy(exec);
        release_after_stream(c, r->pool, true); // lib/graph may record the step again
        free(r);
        return st ? st : fused;
    }
    x->exec = exec;
    x->pool = r->pool;
    x->arms_index = armed;
    x->nodes = (int64_t)nodes;
    if (cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(x->done, c->stream) != cudaSuccess) { // behind the work queued before the recording
        (void)cudaGetLastError();
        if (x->done)
            (void)cudaEventDestroy(x->done);
        x->done = nullptr;
    }
    free(r);
    *out = x;
    return NB_OK;
}

nb_status launch(nb_device *dev, void *exec, double *dev_params, int n, const double *params)
{
    Exec *x = static_cast<Exec *>(exec);
    nb_gpu_ctx *c;
    nb_status st = nb__gpu_enter(dev, "nb_graph_replay", &c);
    if (st || (st = nb__gpu_not_recording(c, "nb_graph_replay")) != NB_OK)
        return st;
    for (int at = 0; at < n; at += kStoreChunk) {
        const int k = n - at < kStoreChunk ? n - at : kStoreChunk;
        Chunk ch;
        memcpy(ch.v, params + at, sizeof(double) * (size_t)k);
        k_store<<<1, kStoreChunk, 0, c->stream>>>(dev_params + at, ch, k);
        if ((st = nb__gpu_launched(c, "nb_graph_replay")) != NB_OK)
            return st;
    }
    NB_GPU_CALL(c, cudaGraphLaunch, x->exec, c->stream);
    if (x->arms_index)
        nb__gpu_index_error_arm(c);
    if (x->done && cudaEventRecord(x->done, c->stream) != cudaSuccess) { // destroy then waits for the stream
        (void)cudaGetLastError();
        (void)cudaEventDestroy(x->done);
        x->done = nullptr;
    }
    return NB_OK;
}

int64_t nodes(const void *exec) { return static_cast<const Exec *>(exec)->nodes; }

// Waits for the graph's replays (its event: not the stream, which another
// thread may be recording a step on, and a wait would break), then gives its
// pool back and frees it. Records no error: a device that cannot be waited
// for is broken, and its blocks go back all the same, but for a wait that a
// recording refused (the event was recorded into another thread's capture),
// whose blocks are kept rather than handed out while a replay may run.
void destroy(nb_device *dev, void *exec)
{
    Exec *x = static_cast<Exec *>(exec);
    if (!x)
        return;
    nb_gpu_ctx *c = static_cast<nb_gpu_ctx *>(dev->ctx);
    nb_error_saved saved;
    nb__error_stash(&saved);
    cudaError_t e = cudaSuccess;
    if (nb__gpu_set_device(c->ordinal, dev->name) == NB_OK) {
        nb__gpu_count_wait(c);
        e = x->done ? cudaEventSynchronize(x->done) : cudaStreamSynchronize(c->stream);
        (void)cudaGetLastError();
    }
    if (e == cudaErrorCapturedEvent || e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit)
        nb__log(NB_LOG_WARNING, "nb_graph_free: %s is being recorded on another thread; the graph's memory is kept "
                                "(its last replay could not be waited for)", dev->name);
    else
        nb__gpu_pool_release(x->pool, false);
    (void)cudaGraphExecDestroy(x->exec);
    if (x->done)
        (void)cudaEventDestroy(x->done);
    (void)cudaGetLastError();
    nb__error_restore(&saved); /* what failed here: the pending error is the caller's again */
    free(x);
}

// Around the step's eager run before its recording: the chains it forms are
// compiled then (gpu_fuse.h), since the recording may not load code.
void prepare(nb_device *dev, bool on)
{
    nb_gpu_ctx *c;
    nb_error_saved saved;
    nb__error_stash(&saved);
    if (nb__gpu_enter(dev, "nb_graph_capture", &c) == NB_OK)
        nb__gpu_fuse_prepare(c, on);
    nb__error_restore(&saved);
}

} // namespace

extern "C" const nb_graph_kernels nb__gpu_graph_kernels = {begin, end, launch, nodes, destroy, prepare};
