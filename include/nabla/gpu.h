/* nabla — the CUDA backend's own controls: memory statistics, the caching
 * allocator's mode, TF32 and device properties.
 *
 * Every GPU ("/gpu:N") has a caching allocator shared by the logical GPUs that
 * split one physical card (see nb_set_logical_gpu_devices): memory a tensor gives
 * back is kept for the next tensor of a similar size instead of being returned
 * to CUDA, so a training step in steady state never calls cudaMalloc. When CUDA
 * runs out of memory the allocator frees what it caches and tries once more
 * before it fails with NB_ERR_OUT_OF_MEMORY.
 *
 * A device argument names any GPU ("/gpu:0", "gpu:1", "/device:GPU:0"); a CPU
 * or an unknown name is NB_ERR_DEVICE. In a build without CUDA every function
 * here returns NB_ERR_UNSUPPORTED (and zeroes its output), except the TF32
 * switch and nb_gpu_host_waits, which say what they do then. */
#ifndef NABLA_GPU_H
#define NABLA_GPU_H

#include <nabla/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A snapshot of one physical GPU's allocator. Byte counts are of the rounded
 * block sizes the allocator hands out, unless the field says otherwise. */
typedef struct nb_gpu_memory_stats {
    size_t in_use;          /* bytes in blocks held by live tensors and kernels */
    size_t requested;       /* bytes those blocks were asked for (before rounding) */
    size_t peak_in_use;     /* largest in_use since start or nb_gpu_reset_peak_memory */
    size_t cached;          /* bytes in free blocks kept for reuse */
    size_t graph_held;      /* bytes in free blocks kept by recorded steps
                               (nabla/graph.h) for their replays, until freed */
    size_t reserved;        /* bytes taken from CUDA: in_use + cached + graph_held
                               + the free part of the reserve arena */
    size_t peak_reserved;   /* largest reserved since start or the last reset */
    size_t arena;           /* size of the reserve arena, 0 when growing on demand */
    bool growth_allowed;    /* false: the arena is a hard cap (see nb_gpu_set_reserve) */
    uint64_t allocations;   /* allocations served */
    uint64_t cache_hits;    /* of them, served from the cache */
    uint64_t device_mallocs;/* cudaMalloc calls made */
    uint64_t cache_flushes; /* times the cache was emptied to retry an allocation */
    uint64_t failures;      /* allocations that failed with NB_ERR_OUT_OF_MEMORY */
    size_t device_free;     /* free memory on the card now (cudaMemGetInfo) */
    size_t device_total;    /* total memory on the card */
} nb_gpu_memory_stats;

/* Writes the allocator statistics of the physical GPU under device to *out (all
 * logical GPUs on one card share them). Returns NB_OK, NB_ERR_DEVICE for a name
 * that is not a GPU, NB_ERR_INVALID_ARGUMENT for a NULL out, NB_ERR_BACKEND when
 * CUDA fails; *out is zeroed on failure. The caller owns *out. */
nb_status nb_gpu_get_memory_stats(const char *device, nb_gpu_memory_stats *out);

/* Sets peak_in_use and peak_reserved to their current values. Returns NB_OK or
 * NB_ERR_DEVICE. */
nb_status nb_gpu_reset_peak_memory(const char *device);

/* Gives every cached (free) block of the device's card back to CUDA, waiting for
 * the card's queued work first; blocks of the reserve arena go back to the arena.
 * device NULL means every GPU. Returns NB_OK, NB_ERR_DEVICE, NB_ERR_BACKEND
 * when a CUDA call fails, or NB_ERR_UNSUPPORTED while a stream of the card is
 * being recorded (nabla/graph.h: the wait would end the recording). Tensors
 * that are alive are not touched. Out of memory, the allocator empties the
 * cache itself, except during such a recording. */
nb_status nb_gpu_empty_cache(const char *device);

/* Chooses how the card under device gets memory.
 * bytes == 0: grow on demand with cudaMalloc (the default); a reserve arena that
 *   is no longer used is given back.
 * bytes > 0: reserve an arena of bytes now (one cudaMalloc) and carve blocks
 *   from it; when it is full, grow with cudaMalloc if allow_growth, else fail
 *   with NB_ERR_OUT_OF_MEMORY (the arena is then a hard cap).
 * Returns NB_OK; NB_ERR_OUT_OF_MEMORY when the arena cannot be had (a current
 * arena was given back first, to make room for the new one: memory is then
 * taken on demand); NB_ERR_INVALID_ARGUMENT when a current arena still holds
 * live blocks (free them first); NB_ERR_DEVICE for a name that is not a GPU;
 * NB_ERR_UNSUPPORTED while a stream of the card is being recorded. */
nb_status nb_gpu_set_reserve(const char *device, size_t bytes, bool allow_growth);

/* Lets float32 matmuls use TF32 tensor cores (faster, about 10 bits of
 * mantissa in the products). Off by default. Process-wide; returns the old
 * setting (false, and no effect, in a build without CUDA). */
bool nb_gpu_set_tf32(bool on);

/* Whether TF32 is on. */
bool nb_gpu_tf32(void);

/* How many times the backend has made the host wait for the GPU under device
 * since the process started; for tests and profiling. Each wait counts one:
 * - reading values: nb_tensor_read, nb_tensor_item, nb_tensor_get, a copy to a
 *   CPU device, and nb_synchronize (per GPU it waits for);
 * - an upload from the host that finds its pinned staging buffer's previous
 *   copy still running (uploads of 1 MiB or more go through a copy stream and
 *   overlap the work already queued);
 * - emptying the allocator's cache (nb_gpu_empty_cache, nb_gpu_set_reserve,
 *   the out-of-memory retry): a wait for the whole card, counted on every
 *   logical GPU of it.
 * Other ops on GPU tensors, tapes and optimizer steps never wait, so the count
 * stays put until a program reads a value. cudaMalloc (on a cache miss) and
 * one-time setup are not counted. Returns the count, or -1 and NB_ERR_DEVICE
 * for a name that is not a GPU; 0 in a build without CUDA. */
int64_t nb_gpu_host_waits(const char *device);

/* Properties of the physical card under a GPU device. */
typedef struct nb_gpu_properties {
    char name[256];          /* e.g. "NVIDIA H100 80GB HBM3" */
    int physical;            /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    int logical_per_gpu;     /* logical GPUs sharing this card */
    int compute_major, compute_minor;
    int multiprocessors;
    size_t total_memory;     /* bytes */
    int clock_khz;           /* SM clock, 0 when CUDA does not report it */
    int memory_bus_width;    /* bits, 0 when CUDA does not report it */
} nb_gpu_properties;

/* Writes the properties of the card under device to *out (owned by the caller).
 * Returns NB_OK, NB_ERR_DEVICE for a name that is not a GPU,
 * NB_ERR_INVALID_ARGUMENT for a NULL out. */
nb_status nb_gpu_device_properties(const char *device, nb_gpu_properties *out);

/* Why this process has no GPU device, or NULL when it has one: the CUDA error
 * met while looking (with the CUDA versions the driver and the runtime
 * support, so a driver older than the toolkit shows), or that this build has no
 * CUDA backend. A static string. Looks for devices first if nothing has yet. */
const char *nb_gpu_unavailable_reason(void);

#ifdef __cplusplus
}
#endif
#endif
