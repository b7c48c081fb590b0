/* The public GPU functions of a build without CUDA (which registers no GPU
 * backend): each says it is not available. */
#include "lib/core/core.h"
#include "lib/core/backend.h"
#include <nabla/gpu.h>

#include <string.h>

static const char no_cuda[] = "this build of nabla has no CUDA backend";

const char *nb_gpu_unavailable_reason(void) { return no_cuda; }

static nb_status unsupported(const char *who)
{
    return nb__fail(NB_ERR_UNSUPPORTED, "%s: %s", who, no_cuda);
}

nb_status nb_gpu_get_memory_stats(const char *device, nb_gpu_memory_stats *out)
{
    (void)device;
    if (out)
        memset(out, 0, sizeof *out);
    return unsupported("nb_gpu_get_memory_stats");
}

nb_status nb_gpu_reset_peak_memory(const char *device)
{
    (void)device;
    return unsupported("nb_gpu_reset_peak_memory");
}

nb_status nb_gpu_empty_cache(const char *device)
{
    (void)device;
    return unsupported("nb_gpu_empty_cache");
}

nb_status nb_gpu_set_reserve(const char *device, size_t bytes, bool allow_growth)
{
    (void)device;
    (void)bytes;
    (void)allow_growth;
    return unsupported("nb_gpu_set_reserve");
}

bool nb_gpu_set_tf32(bool on)
{
    (void)on;
    return false;
}

bool nb_gpu_tf32(void) { return false; }

int64_t nb_gpu_host_waits(const char *device)
{
    (void)device;
    return 0; /* no GPU, so the host never waited for one */
}

nb_status nb_gpu_device_properties(const char *device, nb_gpu_properties *out)
{
    (void)device;
    if (out)
        memset(out, 0, sizeof *out);
    return unsupported("nb_gpu_device_properties");
}
