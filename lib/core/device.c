/* The device registry, device names, the per-thread device stack and placement
 * settings. */
#include "core.h"
#include "capture.h"
#include "backend.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB_MAX_DEVICES 64
#define NB_DEVICE_STACK_MAX 32

#define NB_KIND_COUNT 2 /* nb_device_kind: CPU, GPU */

/* Per kind: its backend (NULL when none is built in), its devices, and how many
 * logical devices each physical one becomes. */
static const nb_backend *g_backend[NB_KIND_COUNT];
static nb_device g_devs[NB_KIND_COUNT][NB_MAX_DEVICES];
static int g_n[NB_KIND_COUNT];
static int g_logical[NB_KIND_COUNT] = {1, 1};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_backends_once = PTHREAD_ONCE_INIT;
static atomic_bool g_initialised;
static atomic_bool g_soft_placement = true;
static atomic_bool g_log_placement;
static atomic_int g_deterministic = -1; /* -1: not yet read from NB_DETERMINISTIC */

static _Thread_local nb_device *tl_stack[NB_DEVICE_STACK_MAX];
static _Thread_local int tl_depth;

#define g_cpus g_devs[NB_DEVICE_CPU]
#define g_n_cpus g_n[NB_DEVICE_CPU]
#define g_n_gpus g_n[NB_DEVICE_GPU]

static bool env_on(const char *name)
{
    const char *env = getenv(name);
    return env && env[0] && strcmp(env, "0") != 0;
}

/* Takes the build's backends, one per kind; only the registry's own setup, so
 * a second backend of a kind is a build mistake, reported once. */
static void backends_init(void)
{
    nb_backend_list list = nb__builtin_backends();
    for (int i = 0; i < list.n; i++) {
        const nb_backend *b = list.backends[i];
        if ((unsigned)b->kind >= NB_KIND_COUNT || g_backend[b->kind])
            nb__log(NB_LOG_WARNING, "backend '%s' ignored: its device kind already has a backend", b->name);
        else
            g_backend[b->kind] = b;
    }
}

const nb_backend *nb__backend_of_kind(nb_device_kind kind)
{
    pthread_once(&g_backends_once, backends_init);
    return (unsigned)kind < NB_KIND_COUNT ? g_backend[kind] : NULL;
}

static void registry_init(void)
{
    for (int k = 0; k < NB_KIND_COUNT; k++) {
        const nb_backend *b = nb__backend_of_kind((nb_device_kind)k);
        g_n[k] = b ? b->discover(g_devs[k], NB_MAX_DEVICES, g_logical[k]) : 0;
    }
    if (env_on("NB_LOG_DEVICE_PLACEMENT"))
        atomic_store(&g_log_placement, true);
    atomic_store(&g_initialised, true);
}

static inline void ensure_init(void)
{
    if (!atomic_load_explicit(&g_initialised, memory_order_acquire))
        pthread_once(&g_once, registry_init);
}

/* Why kind has no devices, for messages: the backend's reason, or that none is
 * built in. Static. */
static const char *kind_unavailable(nb_device_kind kind)
{
    const nb_backend *b = nb__backend_of_kind(kind);
    if (!b)
        return kind == NB_DEVICE_GPU ? "this build of nabla has no CUDA backend" : "no backend is built in";
    return b->unavailable ? b->unavailable() : NULL;
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

nb_status nb_set_logical_cpu_devices(int n)
{
    return set_logical(&g_logical[NB_DEVICE_CPU], n, "nb_set_logical_cpu_devices");
}
nb_status nb_set_logical_gpu_devices(int n)
{
    return set_logical(&g_logical[NB_DEVICE_GPU], n, "nb_set_logical_gpu_devices");
}

int nb_device_count(nb_device_kind kind)
{
    ensure_init();
    return (unsigned)kind < NB_KIND_COUNT ? g_n[kind] : 0;
}

const char *nb_device_name(nb_device_kind kind, int index)
{
    ensure_init();
    if ((unsigned)kind < NB_KIND_COUNT && index >= 0 && index < g_n[kind])
        return g_devs[kind][index].name;
    return NULL;
}

bool nb_cuda_built(void) { return nb__backend_of_kind(NB_DEVICE_GPU) != NULL; }

int nb_physical_gpu_count(void)
{
    const nb_backend *b = nb__backend_of_kind(NB_DEVICE_GPU);
    return b && b->physical_count ? b->physical_count() : 0;
}

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
    if ((unsigned)kind < NB_KIND_COUNT && index < g_n[kind])
        *dev = &g_devs[kind][index];
    return true;
}

nb_device *nb__device_find(const char *name, const char *who)
{
    nb_device *dev;
    if (!lookup(name, who, &dev) || dev)
        return dev;
    return nb__fail_null(NB_ERR_DEVICE, "%s: unknown device '%s' (this process has %d CPU and %d GPU devices%s)",
                         who, name, g_n_cpus, g_n_gpus, nb_cuda_built() ? "" : "; CUDA is not built in");
}

nb_device *nb__device_resolve(const char *name, const char *who)
{
    nb_device *dev;
    if (!lookup(name, who, &dev) || dev)
        return dev;
    if (!atomic_load(&g_soft_placement))
        return nb__fail_null(NB_ERR_DEVICE, "%s: device '%s' does not exist and placement is strict (%d GPU devices)",
                             who, name, g_n_gpus);
    nb_device_kind kind = NB_DEVICE_GPU;
    int index;
    parse_name(name, &kind, &index);
    const char *why = kind_unavailable(kind);
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

bool nb__soft_placement(void) { return atomic_load_explicit(&g_soft_placement, memory_order_relaxed); }

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

/* Waits for every device (card NULL) or every device on card's physical
 * device: each one, even after another failed, so that none is left running
 * behind an error. Returns the first failure, whose message stays the
 * pending error. */
static nb_status synchronize_each(const nb_device *card)
{
    nb_status first = NB_OK;
    nb_error_saved saved;
    for (int k = 0; k < NB_KIND_COUNT; k++)
        for (int i = 0; i < g_n[k]; i++) {
            nb_device *d = &g_devs[k][i];
            if (card && (d->kind != card->kind || d->physical != card->physical))
                continue;
            nb_status st = d->backend->synchronize(d);
            if (st && !first) {
                first = st;
                nb__error_stash(&saved);
            }
        }
    if (first)
        nb__error_unstash(&saved);
    return first;
}

nb_status nb_synchronize(void)
{
    if (nb__capture_check(NULL, "nb_synchronize", "waiting for the devices"))
        return nb_error();
    ensure_init();
    return synchronize_each(NULL);
}

nb_status nb__device_synchronize_card(nb_device *dev)
{
    ensure_init();
    return synchronize_each(dev);
}

bool nb_deterministic(void)
{
    int v = atomic_load_explicit(&g_deterministic, memory_order_relaxed);
    if (v < 0) {
        int env = env_on("NB_DETERMINISTIC");
        if (!atomic_compare_exchange_strong(&g_deterministic, &v, env))
            return v > 0; /* set meanwhile */
        return env;
    }
    return v > 0;
}

bool nb_set_deterministic(bool on)
{
    bool old = nb_deterministic();
    atomic_store(&g_deterministic, on ? 1 : 0);
    return old;
}
