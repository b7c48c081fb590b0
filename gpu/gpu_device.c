/* GPU discovery, per-device contexts (stream, events) and CUDA error helpers. */
#include "gpu_fuse.h"
#include "gpu_internal.h"
#include "lib/core/op_phases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nb_gpu_phys g_phys[NB_GPU_MAX_PHYS];
static int g_n_phys;
/* The process sees one card: the CUDA runtime's current device is always 0,
 * so making it current costs no call (written once, by discovery, before the
 * registry is published). */
static bool g_one_card;

int nb__gpu_phys_count(void) { return g_n_phys; }

int nb__gpu_physical_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver, no device: simply none */
        return 0;
    }
    return n < NB_GPU_MAX_PHYS ? n : NB_GPU_MAX_PHYS;
}
nb_gpu_phys *nb__gpu_phys_at(int i) { return i >= 0 && i < g_n_phys ? &g_phys[i] : NULL; }

static void read_properties(nb_gpu_phys *p)
{
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, p->ordinal) == cudaSuccess) {
        snprintf(p->name, sizeof p->name, "%s", prop.name);
        p->cc_major = prop.major;
        p->cc_minor = prop.minor;
        p->sm_count = prop.multiProcessorCount;
        p->total_memory = prop.totalGlobalMem;
    } else {
        (void)cudaGetLastError();
        snprintf(p->name, sizeof p->name, "CUDA device %d", p->ordinal);
    }
    int v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, p->ordinal) == cudaSuccess)
        p->clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, p->ordinal) == cudaSuccess)
        p->bus_width = v;
    (void)cudaGetLastError();
    if (p->sm_count <= 0)
        p->sm_count = 16; /* a guess that keeps grid sizes sane */
}

/* Why discovery found no GPU; empty when it found one. Written once, by
 * discovery, before the registry is published. */
static char g_unavailable[384];

/* Keeps why there is no GPU, with the CUDA versions of the driver and the
 * runtime, and logs it: as a warning where a driver is installed (a driver
 * older than the toolkit is the usual broken setup), at DEBUG where there is
 * none (a machine without a GPU; pushing /gpu:N still warns, naming this). */
static void note_unavailable(const char *what, cudaError_t e)
{
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaGetLastError();
    char err[160] = "", drv[64] = "no CUDA driver is installed";
    if (e != cudaSuccess)
        snprintf(err, sizeof err, ": %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    if (driver > 0)
        snprintf(drv, sizeof drv, "the driver supports CUDA %d.%d", driver / 1000, driver % 1000 / 10);
    snprintf(g_unavailable, sizeof g_unavailable, "%s%s; %s, the runtime is CUDA %d.%d", what, err, drv,
             runtime / 1000, runtime % 1000 / 10);
    nb__log(driver > 0 ? NB_LOG_WARNING : NB_LOG_DEBUG, "no GPU: %s", g_unavailable);
}

const char *nb__gpu_unavailable(void) { return g_unavailable[0] ? g_unavailable : NULL; }

const char *nb_gpu_unavailable_reason(void)
{
    if (nb_device_count(NB_DEVICE_GPU) > 0)
        return NULL;
    return g_unavailable[0] ? g_unavailable : "no GPU was found";
}

/* Called once, from the device registry's initialisation. Makes no CUDA context:
 * streams are created when a device is first used. */
int nb__gpu_discover(nb_device *devices, int max, int logical_per_gpu)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        note_unavailable("cudaGetDeviceCount failed", e); /* no driver, no device: none */
        return 0;
    }
    if (n == 0) {
        note_unavailable("the CUDA driver reports no GPU", cudaSuccess);
        return 0;
    }
    if (logical_per_gpu < 1)
        logical_per_gpu = 1;
    g_one_card = n == 1;
    int count = 0;
    for (int o = 0; o < n && g_n_phys < NB_GPU_MAX_PHYS && count < max; o++) {
        nb_gpu_phys *p = &g_phys[g_n_phys];
        memset(p, 0, sizeof *p);
        p->ordinal = o;
        read_properties(p);
        if (!nb__gpu_allocator_init(p))
            break; /* discovery never fails: fewer devices instead */
        g_n_phys++;
        for (int l = 0; l < logical_per_gpu && count < max; l++) {
            nb_gpu_ctx *c = calloc(1, sizeof *c);
            if (!c)
                return count;
            nb_device *d = &devices[count];
            memset(d, 0, sizeof *d);
            d->kind = NB_DEVICE_GPU;
            d->index = count;
            d->physical = o;
            snprintf(d->name, sizeof d->name, "/gpu:%d", count);
            d->backend = &nb__gpu_backend;
            d->ctx = c;
            c->dev = d;
            c->phys = p;
            c->ordinal = o;
            c->slot = l;
            pthread_mutex_init(&c->lock, NULL);
            pthread_mutex_init(&c->stage_lock, NULL);
            pthread_mutex_init(&c->cudnn_lock, NULL);
            pthread_mutex_init(&c->index_lock, NULL);
            if (!p->first)
                p->first = c;
            p->n_logical++;
            count++;
        }
    }
    if (count == 0)
        note_unavailable("no GPU could be set up (out of host memory)", cudaSuccess);
    return count;
}

nb_status nb__gpu_cuda_fail(cudaError_t err, const char *call, const char *dev_name)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %s (%s)", call, dev_name,
                    cudaGetErrorString(err), cudaGetErrorName(err));
}

nb_status nb__gpu_launch_failed(const nb_gpu_ctx *c, const char *kernel, cudaError_t e)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return nb__fail(NB_ERR_BACKEND, "launch of kernel %s failed on %s: %s (%s)", kernel,
                    c->dev->name, cudaGetErrorString(e), cudaGetErrorName(e));
}

nb_status nb__gpu_launched(const nb_gpu_ctx *c, const char *kernel)
{
    int phase = nb__phase_enter(NB_PHASE_LAUNCH_CHECK);
    cudaError_t e = cudaGetLastError();
    nb__phase_leave(phase);
    if (e == cudaSuccess)
        return NB_OK;
    return nb__fail(NB_ERR_BACKEND, "launch of kernel %s failed on %s: %s (%s)", kernel,
                    c->dev->name, cudaGetErrorString(e), cudaGetErrorName(e));
}

nb_status nb__gpu_set_device(int ordinal, const char *dev_name)
{
    if (ordinal == 0 && g_one_card)
        return NB_OK;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == ordinal)
        return NB_OK;
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess)
        return nb__gpu_cuda_fail(e, "cudaSetDevice", dev_name);
    return NB_OK;
}

static nb_status ctx_create(nb_gpu_ctx *c)
{
    nb_status st = NB_OK;
    pthread_mutex_lock(&c->lock);
    if (!__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE)) {
        cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            st = nb__gpu_cuda_fail(e, "cudaStreamCreateWithFlags", c->dev->name);
        } else {
            e = cudaEventCreateWithFlags(&c->join_event, cudaEventDisableTiming);
            if (e != cudaSuccess) {
                st = nb__gpu_cuda_fail(e, "cudaEventCreateWithFlags", c->dev->name);
                (void)cudaStreamDestroy(c->stream);
                c->stream = NULL;
            } else {
                __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

nb_status nb__gpu_enter(nb_device *dev, const char *who, nb_gpu_ctx **out)
{
    (void)who;
    nb_gpu_ctx *c = dev->ctx;
    *out = NULL;
    int phase = nb__phase_enter(NB_PHASE_DEVICE_ENTRY);
    nb_status st = nb__gpu_set_device(c->ordinal, dev->name);
    if (!st && !__atomic_load_n(&c->ready, __ATOMIC_ACQUIRE))
        st = ctx_create(c);
    nb__phase_leave(phase);
    if (!st) /* a recording's pending elementwise chain runs before anything else on c */
        st = nb__gpu_fuse_flush(c);
    if (st)
        return st;
    *out = c;
    return NB_OK;
}

nb_device *nb__gpu_device_named(const char *name, const char *who)
{
    nb_device *dev = nb__device_find(name, who);
    if (!dev)
        return NULL;
    if (dev->kind != NB_DEVICE_GPU)
        return nb__fail_null(NB_ERR_DEVICE, "%s: '%s' is not a GPU device", who, name);
    return dev;
}

nb_status nb__gpu_stream_wait(nb_gpu_ctx *waiter, nb_gpu_ctx *on)
{
    if (waiter == on)
        return NB_OK;
    nb_status st = nb__gpu_set_device(on->ordinal, on->dev->name);
    if (st)
        return st;
    NB_GPU_CALL(on, cudaEventRecord, on->join_event, on->stream);
    if ((st = nb__gpu_set_device(waiter->ordinal, waiter->dev->name)) != NB_OK)
        return st;
    NB_GPU_CALL(waiter, cudaStreamWaitEvent, waiter->stream, on->join_event, 0);
    return NB_OK;
}

nb_status nb__gpu_index_error_record(nb_gpu_ctx *c, nb_gpu_index_error **out)
{
    *out = NULL;
    if (!__atomic_load_n(&c->index_err, __ATOMIC_ACQUIRE)) {
        nb_status st = NB_OK;
        pthread_mutex_lock(&c->lock);
        if (!c->index_err) {
            void *d = NULL, *h = NULL, *hd = NULL;
            cudaError_t e = cudaMalloc(&d, sizeof(nb_gpu_index_error));
            if (e != cudaSuccess) {
                st = nb__gpu_cuda_fail(e, "cudaMalloc", c->dev->name);
            } else if ((e = cudaHostAlloc(&h, sizeof(nb_gpu_index_error), cudaHostAllocMapped)) !=
                       cudaSuccess) {
                st = nb__gpu_cuda_fail(e, "cudaHostAlloc", c->dev->name);
                nb__gpu_count_card_wait(c->phys); /* cudaFree waits for the card */
                (void)cudaFree(d);
            } else if ((e = cudaHostGetDevicePointer(&hd, h, 0)) != cudaSuccess ||
                       (e = cudaMemsetAsync(d, 0, sizeof(nb_gpu_index_error), c->stream)) != cudaSuccess) {
                st = nb__gpu_cuda_fail(e, hd ? "cudaMemsetAsync" : "cudaHostGetDevicePointer", c->dev->name);
                nb__gpu_count_card_wait(c->phys);
                (void)cudaFree(d);
                (void)cudaFreeHost(h);
            } else {
                memset(h, 0, sizeof(nb_gpu_index_error));
                c->index_err_host = h;
                c->index_err_mapped = hd;
                __atomic_store_n(&c->index_err, (nb_gpu_index_error *)d, __ATOMIC_RELEASE);
            }
        }
        pthread_mutex_unlock(&c->lock);
        if (st)
            return st;
    }
    *out = c->index_err;
    return NB_OK;
}

/* Index checks never make the host wait: a kernel records the first bad index
 * in the device's record and the op returns at once. The record is read at the
 * next call that waits for the stream anyway (copy_to_host, synchronize), which
 * then fails with the op's error. */
void nb__gpu_index_error_arm(nb_gpu_ctx *c) { __atomic_store_n(&c->index_armed, 1, __ATOMIC_RELEASE); }

bool nb__gpu_index_error_fetch(nb_gpu_ctx *c)
{
    if (!__atomic_load_n(&c->index_armed, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&c->index_lock);
    nb_gpu_index_error *d = __atomic_load_n(&c->index_err, __ATOMIC_ACQUIRE);
    if (!__atomic_exchange_n(&c->index_armed, 0, __ATOMIC_ACQ_REL) || !d || !c->index_err_mapped) {
        pthread_mutex_unlock(&c->index_lock);
        return false;
    }
    if (nb__gpu_index_error_take(c->stream, d, c->index_err_mapped) != cudaSuccess) {
        (void)cudaGetLastError();
        __atomic_store_n(&c->index_armed, 1, __ATOMIC_RELEASE); /* try again at the next one */
        pthread_mutex_unlock(&c->index_lock);
        return false;
    }
    return true;
}

nb_status nb__gpu_index_error_report(nb_gpu_ctx *c, bool fetched, bool waited)
{
    if (!fetched)
        return NB_OK;
    nb_gpu_index_error *h = c->index_err_host, r = *h;
    if (waited)
        memset(h, 0, sizeof *h);
    else /* the take may not have run yet: the mirror is kept, and read at the next wait */
        __atomic_store_n(&c->index_armed, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->index_lock);
    if (!waited || !r.set)
        return NB_OK;
    const char *op = (const char *)(uintptr_t)r.op;
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: index %lld at position %lld is outside [0, %lld) on %s "
                    "(found by the GPU kernel, reported at the next synchronisation)",
                    op ? op : "gather", r.value, r.position, r.rows, c->dev->name);
}

int64_t nb_gpu_host_waits(const char *device)
{
    nb_device *dev = nb__gpu_device_named(device, "nb_gpu_host_waits");
    if (!dev)
        return -1;
    const nb_gpu_ctx *c = dev->ctx;
    return __atomic_load_n(&c->host_waits, __ATOMIC_RELAXED) +
           __atomic_load_n(&c->phys->card_waits, __ATOMIC_RELAXED);
}

nb_status nb_gpu_device_properties(const char *device, nb_gpu_properties *out)
{
    static const char who[] = "nb_gpu_device_properties";
    if (!out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
    memset(out, 0, sizeof *out);
    nb_device *dev = nb__gpu_device_named(device, who);
    if (!dev)
        return NB_ERR_DEVICE;
    const nb_gpu_phys *p = ((nb_gpu_ctx *)dev->ctx)->phys;
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->physical = p->ordinal;
    out->logical_per_gpu = p->n_logical;
    out->compute_major = p->cc_major;
    out->compute_minor = p->cc_minor;
    out->multiprocessors = p->sm_count;
    out->total_memory = p->total_memory;
    out->clock_khz = p->clock_khz;
    out->memory_bus_width = p->bus_width;
    return NB_OK;
}
