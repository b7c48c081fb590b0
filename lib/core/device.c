/* The device registry, device names, the per-thread device stack and placement
 * settings. */
#include "core.h"
#include "backend.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB_MAX_DEVICES 64
#define NB_DEVICE_STACK_MAX 32

static nb_device g_cpus[NB_MAX_DEVICES];
static nb_device g_gpus[NB_MAX_DEVICES];
static int g_n_cpus, g_n_gpus;
static int g_logical_cpus = 1, g_logical_gpus = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_bool g_initialised;
static atomic_bool g_soft_placement = true;
static atomic_bool g_log_placement;

static _Thread_local nb_device *tl_stack[NB_DEVICE_STACK_MAX];
static _Thread_local int tl_depth;

static void registry_init(void)
{
    g_n_cpus = g_logical_cpus;
    for (int i = 0; i < g_n_cpus; i++) {
        g_cpus[i].kind = NB_DEVICE_CPU;
        g_cpus[i].index = i;
        g_cpus[i].physical = 0;
        snprintf(g_cpus[i].name, sizeof g_cpus[i].name, "/cpu:%d", i);
        g_cpus[i].backend = &nb__cpu_backend;
        g_cpus[i].ctx = NULL;
    }
    g_n_gpus = nb__gpu_discover(g_gpus, NB_MAX_DEVICES, g_logical_gpus);
    const char *env = getenv("NB_LOG_DEVICE_PLACEMENT");
    if (env && env[0] && strcmp(env, "0") != 0)
        atomic_store(&g_log_placement, true);
    atomic_store(&g_initialised, true);
}

static inline void ensure_init(void)
{
    if (!atomic_load_explicit(&g_initialised, memory_order_acquire))
        pthread_once(&g_once, registry_init);
}

static nb_status set_logical(int *slot, int n, const char *who)
{
    if (atomic_load(&g_initialised))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: devices are already in use; call it before the first op", who);
    if (n < 1 || n > NB_MAX_DEVICES)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d logical devices is outside [1, %d]", who, n, NB_MAX_DEVICES);
    *slot = n;
    return NB_OK;
}

nb_status nb_set_logical_cpu_devices(int n) { return set_logical(&g_logical_cpus, n, "nb_set_logical_cpu_devices"); }
nb_status nb_set_logical_gpu_devices(int n) { return set_logical(&g_logical_gpus, n, "nb_set_logical_gpu_devices"); }

int nb_device_count(nb_device_kind kind)
{
    ensure_init();
    return kind == NB_DEVICE_CPU ? g_n_cpus : kind == NB_DEVICE_GPU ? g_n_gpus : 0;
}

const char *nb_device_name(nb_device_kind kind, int index)
{
    ensure_init();
    if (kind == NB_DEVICE_CPU && index >= 0 && index < g_n_cpus)
        return g_cpus[index].name;
    if (kind == NB_DEVICE_GPU && index >= 0 && index < g_n_gpus)
        return g_gpus[index].name;
    return NULL;
}

bool nb_cuda_built(void) { return nb__gpu_built(); }

int nb_physical_gpu_count(void) { return nb__gpu_physical_count(); }

nb_device *nb__device_cpu0(void)
{
    ensure_init();
    return &g_cpus[0];
}

/* Parses "/cpu:0", "cpu:0", "/device:GPU:1", "gpu", "/GPU:2" into kind and index. */
static bool parse_name(const char *name, nb_device_kind *kind, int *index)
{
    if (!name)
        return false;
    const char *p = name;
    if (*p == '/')
        p++;
    if (strncasecmp(p, "device:", 7) == 0)
        p += 7;
    if (strncasecmp(p, "cpu", 3) == 0)
        *kind = NB_DEVICE_CPU;
    else if (strncasecmp(p, "gpu", 3) == 0)
        *kind = NB_DEVICE_GPU;
    else
        return false;
    p += 3;
    if (*p == '\0') {
        *index = 0;
        return true;
    }
    if (*p != ':' || !isdigit((unsigned char)p[1]))
        return false;
    char *end;
    long v = strtol(p + 1, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000)
        return false;
    *index = (int)v;
    return true;
}

/* The device a well-formed name denotes: *dev, NULL when there is no such one.
 * false (NB_ERR_DEVICE recorded, naming who) for a malformed name. */
static bool lookup(const char *name, const char *who, nb_device **dev)
{
    ensure_init();
    nb_device_kind kind;
    int index;
    *dev = NULL;
    if (!parse_name(name, &kind, &index)) {
        nb__fail(NB_ERR_DEVICE, "%s: malformed device name '%s' (expected /cpu:N or /gpu:N)", who,
                 name ? name : "(null)");
        return false;
    }
    if (kind == NB_DEVICE_CPU && index < g_n_cpus)
        *dev = &g_cpus[index];
    else if (kind == NB_DEVICE_GPU && index < g_n_gpus)
        *dev = &g_gpus[index];
    return true;
}

nb_device *nb__device_find(const char *name, const char *who)
{
    nb_device *dev;
    if (!lookup(name, who, &dev) || dev)
        return dev;
    return nb__fail_null(NB_ERR_DEVICE, "%s: unknown device '%s' (this process has %d CPU and %d GPU devices%s)",
                         who, name, g_n_cpus, g_n_gpus, nb__gpu_built() ? "" : "; CUDA is not built in");
}

nb_device *nb__device_resolve(const char *name, const char *who)
{
    nb_device *dev;
    if (!lookup(name, who, &dev) || dev)
        return dev;
    if (!atomic_load(&g_soft_placement))
        return nb__fail_null(NB_ERR_DEVICE, "%s: device '%s' does not exist and placement is strict (%d GPU devices)",
                             who, name, g_n_gpus);
    const char *why = nb__gpu_unavailable();
    nb__log(NB_LOG_WARNING, "device '%s' does not exist (%d GPU devices%s%s); using /cpu:0", name, g_n_gpus,
            why ? ": " : "", why ? why : "");
    return &g_cpus[0];
}

nb_status nb_device_push(const char *name)
{
    ensure_init();
    if (tl_depth == NB_DEVICE_STACK_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_device_push: device stack is full (%d)", NB_DEVICE_STACK_MAX);
    nb_device *dev = nb__device_resolve(name, "nb_device_push");
    if (!dev)
        return nb_error() ? nb_error() : NB_ERR_DEVICE;
    tl_stack[tl_depth++] = dev;
    return NB_OK;
}

nb_status nb_device_pop(void)
{
    if (tl_depth == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_device_pop: the device stack is empty");
    tl_depth--;
    return NB_OK;
}

nb_device *nb__device_pushed(void) { return tl_depth ? tl_stack[tl_depth - 1] : NULL; }

nb_device *nb__device_default(void) { return tl_depth ? tl_stack[tl_depth - 1] : nb__device_cpu0(); }

const char *nb_device_current(void) { return nb__device_default()->name; }

bool nb_set_soft_placement(bool on) { return atomic_exchange(&g_soft_placement, on); }

bool nb_set_log_device_placement(bool on)
{
    ensure_init();
    return atomic_exchange(&g_log_placement, on);
}

bool nb__log_placement_enabled(void) { return atomic_load_explicit(&g_log_placement, memory_order_relaxed); }

void nb__log_op(const char *op, const nb_device *dev)
{
    if (nb__log_placement_enabled())
        nb__log(NB_LOG_INFO, "op %s on %s", op, dev->name);
}

nb_status nb_synchronize(void)
{
    ensure_init();
    for (int i = 0; i < g_n_gpus; i++) {
        nb_status st = g_gpus[i].backend->synchronize(&g_gpus[i]);
        if (st)
            return st;
    }
    return NB_OK;
}
