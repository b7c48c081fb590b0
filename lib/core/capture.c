/* The rules of a captured step and the hooks of its recording (capture.h). */
#include "capture.h"
#include <nabla/graph.h>

#include <stdlib.h>

typedef struct hook {
    nb__capture_hooks h;
    void *ctx;
} hook;

struct nb__capture {
    uint64_t id;
    nb_device *dev;
    bool recording;
    bool failed;
    double *dev_params;
    int n_params;
    hook *hooks;
    int n_hooks, cap_hooks;
    bool no_in_place;   /* updates copy on write (nb__capture_no_in_place) */
    bool stale_reached; /* a stale storage's data was reached */
    nb_storage **stale; /* marked stale, each held */
    int n_stale, cap_stale;
};

static _Thread_local nb__capture *tl_capture;
static atomic_uint_fast64_t g_next_id = 1;
static atomic_bool g_fusion = true;

bool nb_graph_set_fusion(bool on) { return atomic_exchange(&g_fusion, on); }
bool nb__graph_fusion(void) { return atomic_load_explicit(&g_fusion, memory_order_relaxed); }

nb__capture *nb__capture_current(void) { return tl_capture; }
uint64_t nb__capture_id(const nb__capture *c) { return c->id; }
nb_device *nb__capture_device(const nb__capture *c) { return c->dev; }
bool nb__capture_recording(const nb__capture *c) { return c && c->recording; }

nb_status nb__capture_check(const nb_device *dev, const char *who, const char *what)
{
    const nb__capture *c = tl_capture;
    if (!c || (dev && dev != c->dev))
        return NB_OK;
    return nb__fail(NB_ERR_UNSUPPORTED,
                    "%s: %s cannot run in a step captured on %s: a replay runs only the step's kernels on its "
                    "device (pass host data as an input, return what the host needs as an output)",
                    who, what, c->dev->name);
}

nb_status nb__capture_check_device(const nb_device *dev, const char *who)
{
    const nb__capture *c = tl_capture;
    if (!c || dev == c->dev)
        return NB_OK;
    return nb__fail(NB_ERR_UNSUPPORTED,
                    "%s: a tensor on %s cannot be made in a step captured on %s: a graph runs on one device only",
                    who, dev->name, c->dev->name);
}

nb_status nb__capture_hook(nb__capture *c, const nb__capture_hooks *h, void *ctx)
{
    if (c->n_hooks == c->cap_hooks) {
        int cap = c->cap_hooks ? c->cap_hooks * 2 : 8;
        hook *p = realloc(c->hooks, sizeof *p * (size_t)cap);
        if (!p) {
            c->failed = true;
            if (h->release)
                h->release(ctx);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory for a hook");
        }
        c->hooks = p;
        c->cap_hooks = cap;
    }
    c->hooks[c->n_hooks++] = (hook){*h, ctx};
    return NB_OK;
}

double *nb__capture_params(nb__capture *c, int n, int *first)
{
    if (!c->dev_params || n < 1 || n > NB_CAPTURE_MAX_PARAMS - c->n_params) {
        c->failed = true;
        return nb__fail_null(NB_ERR_UNSUPPORTED,
                             "graph capture: a step on %s needs more than %d host values refreshed at each replay "
                             "(each optimizer update takes 8, each dropout 1)",
                             c->dev->name, NB_CAPTURE_MAX_PARAMS);
    }
    *first = c->n_params;
    c->n_params += n;
    return c->dev_params + *first;
}

bool nb__capture_in_place(const nb__capture *c) { return c && c->recording && !c->no_in_place; }
void nb__capture_no_in_place(nb__capture *c) { c->no_in_place = true; }
bool nb__capture_stale_reached(const nb__capture *c) { return c->stale_reached; }

void nb__stale_reached(void)
{
    nb__capture *c = tl_capture;
    if (c && c->recording)
        c->stale_reached = true;
}

nb_status nb__capture_mark_stale(nb__capture *c, nb_storage *s)
{
    if (c->n_stale == c->cap_stale) {
        int cap = c->cap_stale ? c->cap_stale * 2 : 8;
        nb_storage **p = realloc(c->stale, sizeof *p * (size_t)cap);
        if (!p) {
            c->failed = true;
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory");
        }
        c->stale = p;
        c->cap_stale = cap;
    }
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    c->stale[c->n_stale++] = s;
    __atomic_store_n(&s->stale, true, __ATOMIC_RELAXED);
    return NB_OK;
}

/* The stale marks end with the step: the closing work may touch that memory. */
static void clear_stale(nb__capture *c)
{
    for (int i = 0; i < c->n_stale; i++) {
        __atomic_store_n(&c->stale[i]->stale, false, __ATOMIC_RELAXED);
        nb__storage_release(c->stale[i]);
    }
    free(c->stale);
    c->stale = NULL;
    c->n_stale = c->cap_stale = 0;
}

nb__capture *nb__capture_enter(nb_device *dev, bool recording, double *dev_params)
{
    if (tl_capture)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT,
                             "graph capture: the calling thread already runs a captured step on %s",
                             tl_capture->dev->name);
    nb__capture *c = calloc(1, sizeof *c);
    if (!c)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory");
    c->id = atomic_fetch_add_explicit(&g_next_id, 1, memory_order_relaxed);
    c->dev = dev;
    c->recording = recording;
    c->dev_params = dev_params;
    tl_capture = c;
    return c;
}

static void release_hooks(nb__capture *c)
{
    for (int i = c->n_hooks - 1; i >= 0; i--)
        if (c->hooks[i].h.release)
            c->hooks[i].h.release(c->hooks[i].ctx);
    free(c->hooks);
    c->hooks = NULL;
    c->n_hooks = c->cap_hooks = 0;
}

void nb__capture_leave(nb__capture *c, bool kept)
{
    if (tl_capture == c)
        tl_capture = NULL;
    clear_stale(c);
    if (c->recording) {
        /* Still recording while the hooks queue their closing work: leave the
         * thread's capture first, so that the rules do not refuse it. */
        for (int i = c->n_hooks - 1; i >= 0; i--)
            if (c->hooks[i].h.at_end)
                c->hooks[i].h.at_end(c->hooks[i].ctx, kept);
    }
    c->recording = false;
    if (!kept)
        nb__capture_free(c);
}

bool nb__capture_failed(const nb__capture *c) { return c->failed; }

nb_status nb__capture_fail(nb__capture *c, nb_status st)
{
    c->failed = true;
    return st;
}

int nb__capture_param_count(const nb__capture *c) { return c->n_params; }

void nb__capture_before_replay(nb__capture *c, double *params)
{
    for (int i = 0; i < c->n_hooks; i++)
        if (c->hooks[i].h.before_replay)
            c->hooks[i].h.before_replay(c->hooks[i].ctx, params);
}

void nb__capture_after_replay(nb__capture *c)
{
    for (int i = 0; i < c->n_hooks; i++)
        if (c->hooks[i].h.after_replay)
            c->hooks[i].h.after_replay(c->hooks[i].ctx);
}

void nb__capture_free(nb__capture *c)
{
    if (!c)
        return;
    if (tl_capture == c)
        tl_capture = NULL;
    clear_stale(c);
    release_hooks(c);
    free(c);
}
