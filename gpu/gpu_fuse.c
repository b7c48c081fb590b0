/* The recording's pending chain on a GPU: deferred calls, their flush, and the
 * compiled kernels' cache (gpu_fuse.h). */
#include "gpu_fuse.h"
#include "gpu_internal.h"

#include "lib/core/capture.h"

#include <stdlib.h>
#include <string.h>

/* ---- compiled kernels, cached by (architecture, source) for the process ---- */

typedef struct compiled {
    int arch;
    char *src;
    cudaLibrary_t lib;
    cudaKernel_t kernel;
} compiled;

enum { CACHE_MAX = 512 };
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static compiled g_cache[CACHE_MAX];
static int g_cache_n;
static int64_t g_launches; /* __atomic */

int64_t nb__gpu_fused_launches(void) { return __atomic_load_n(&g_launches, __ATOMIC_RELAXED); }

/* The kernel of src for c's card, compiled and loaded on first use; NULL with
 * the error recorded where it cannot be (remembered: a chain that failed is
 * not compiled again). Loading a library is no stream work, but a thread
 * that records in thread-local mode may not make such calls: the mode is
 * relaxed around it. */
static cudaKernel_t kernel_for(nb_gpu_ctx *c, const char *src)
{
    int arch = c->phys->cc_major * 10 + c->phys->cc_minor;
    pthread_mutex_lock(&g_cache_lock);
    for (int i = 0; i < g_cache_n; i++) {
        if (g_cache[i].arch == arch && !strcmp(g_cache[i].src, src)) {
            cudaKernel_t k = g_cache[i].kernel;
            pthread_mutex_unlock(&g_cache_lock);
            if (!k)
                nb__fail(NB_ERR_BACKEND, "fused kernel: this chain failed to compile before");
            return k;
        }
    }
    if (g_cache_n == CACHE_MAX) {
        pthread_mutex_unlock(&g_cache_lock);
        nb__fail(NB_ERR_UNSUPPORTED, "fused kernel: %d chains compiled already", CACHE_MAX);
        return NULL;
    }
    void *cubin = NULL;
    size_t size = 0;
    cudaKernel_t k = NULL;
    cudaLibrary_t lib = NULL;
    char *copy = strdup(src);
    nb_status st = copy ? nb__gpu_fuse_compile(src, arch, &cubin, &size)
                        : nb__fail(NB_ERR_OUT_OF_MEMORY, "fused kernel: out of host memory");
    if (st == NB_OK) {
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        cudaError_t e = cudaLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
        if (e == cudaSuccess)
            e = cudaLibraryGetKernel(&k, lib, "nb_fused");
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (lib)
                (void)cudaLibraryUnload(lib);
            lib = NULL;
            k = NULL;
            nb__fail(NB_ERR_BACKEND, "fused kernel: loading it failed on %s: %s", c->dev->name, cudaGetErrorString(e));
        }
    }
    free(cubin);
    /* NVRTC missing is not remembered per chain: it is one failed dlopen */
    if (copy && st != NB_ERR_UNSUPPORTED) {
        g_cache[g_cache_n++] = (compiled){arch, copy, lib, k};
        copy = NULL;
    }
    free(copy);
    pthread_mutex_unlock(&g_cache_lock);
    return k;
}

/* ---- the pending chain ---- */

enum { MAX_FREED = 256 };

typedef struct pending {
    nb_fuse_call call;
    nb_view out, x, y; /* the call's views (it points at these) */
} pending;

typedef struct chain {
    nb_gpu_ctx *c;
    bool flushing;
    int n;
    pending calls[NB_FUSE_MAX_CALLS];
    int n_freed;
    struct {
        char *p;
        size_t n;
    } freed[MAX_FREED]; /* blocks given back since the chain began, not handed out again */
} chain;

static _Thread_local chain *tl_chain;

bool nb__gpu_fuse_deferring(const nb_gpu_ctx *c) { return tl_chain && tl_chain->c == c && !tl_chain->flushing; }

void nb__gpu_fuse_start(nb_gpu_ctx *c)
{
    if (tl_chain || !nb__graph_fusion())
        return;
    chain *ch = calloc(1, sizeof *ch);
    if (ch) {
        ch->c = c;
        tl_chain = ch;
    }
}

void nb__gpu_fuse_note_free(nb_gpu_ctx *c, void *p, size_t nbytes)
{
    chain *ch = tl_chain;
    if (!ch || ch->c != c || !p)
        return;
    if (ch->n_freed < MAX_FREED) { /* full: later blocks count as alive (always correct) */
        ch->freed[ch->n_freed].p = p;
        ch->freed[ch->n_freed++].n = nbytes;
    }
}

void nb__gpu_fuse_note_alloc(nb_gpu_ctx *c, void *p, size_t nbytes)
{
    chain *ch = tl_chain;
    if (!ch || ch->c != c || !p)
        return;
    char *lo = p, *hi = lo + nbytes;
    int w = 0;
    for (int i = 0; i < ch->n_freed; i++)
        if (!(ch->freed[i].p < hi && lo < ch->freed[i].p + ch->freed[i].n))
            ch->freed[w++] = ch->freed[i];
    ch->n_freed = w;
}

static bool dead_now(void *user, const nb_view *v, int64_t last)
{
    (void)last;
    const chain *ch = user;
    const char *p = v->data;
    for (int i = 0; i < ch->n_freed; i++)
        if (p >= ch->freed[i].p && p < ch->freed[i].p + ch->freed[i].n)
            return true;
    return false;
}

static bool never_dead(void *user, const nb_view *v, int64_t last)
{
    (void)user, (void)v, (void)last;
    return false;
}

static bool supported(void *user, const nb_fuse_call *c)
{
    (void)user;
    return nb__gpu_fuse_supported(c);
}

/* One call by its own kernel. */
static nb_status launch_one(nb_gpu_ctx *c, const nb_fuse_call *k)
{
    switch (k->kind) {
    case NB_FUSE_FILL: return nb__gpu_fill(c, k->out, k->alpha);
    case NB_FUSE_UNARY: return nb__gpu_unary(c, (nb_unary_op)k->op, k->out, k->x, k->alpha);
    default: return nb__gpu_binary(c, (nb_binary_op)k->op, k->out, k->x, k->y);
    }
}

/* The plan's kernel, or NB_ERR_UNSUPPORTED (with no error left recorded)
 * where it cannot be made: the calls then run one by one. */
static nb_status launch_fused(nb_gpu_ctx *c, const nb_fuse_plan *p)
{
    nb_gpu_fuse_geo g;
    nb_gpu_fuse_args a;
    nb__gpu_fuse_geometry(p, &g, &a);
    char *src = nb__gpu_fuse_source(p, &g);
    nb_error_saved saved;
    nb__error_stash(&saved);
    cudaKernel_t k = src ? kernel_for(c, src) : NULL;
    free(src);
    nb__error_unstash(&saved); /* a chain that cannot compile runs unfused, silently */
    if (!k)
        return NB_ERR_UNSUPPORTED;
    long long blocks = (a.n + 255) / 256;
    long long most = (long long)c->phys->sm_count * 32;
    if (blocks > most)
        blocks = most;
    if (blocks < 1)
        blocks = 1;
    void *args[1] = {&a};
    cudaError_t e = cudaLaunchKernel((const void *)k, (dim3){(unsigned)blocks, 1, 1}, (dim3){256, 1, 1}, args, 0, c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return nb__fail(NB_ERR_BACKEND, "launch of a fused elementwise kernel failed on %s: %s", c->dev->name,
                        cudaGetErrorString(e));
    }
    __atomic_add_fetch(&g_launches, 1, __ATOMIC_RELAXED);
    return NB_OK;
}

nb_status nb__gpu_fuse_flush(nb_gpu_ctx *c)
{
    chain *ch = tl_chain;
    if (!ch || ch->c != c || ch->n == 0 || ch->flushing)
        return NB_OK;
    ch->flushing = true;
    nb_fuse_call calls[NB_FUSE_MAX_CALLS];
    for (int i = 0; i < ch->n; i++)
        calls[i] = ch->calls[i].call;
    nb_status st = NB_OK;
    int done = 0;
    if (ch->n >= 2) {
        nb_fuse_plan plan;
        int k = nb__fuse_plan(calls, ch->n, NB_FUSE_MAX_SLOTS, supported, dead_now, ch, &plan);
        if (k == ch->n) {
            st = launch_fused(c, &plan);
            if (st == NB_OK)
                done = ch->n;
            else if (st == NB_ERR_UNSUPPORTED)
                st = NB_OK;
        }
    }
    for (int i = done; i < ch->n && st == NB_OK; i++)
        st = launch_one(c, &calls[i]);
    ch->n = 0;
    ch->n_freed = 0;
    ch->flushing = false;
    return st;
}

nb_status nb__gpu_fuse_defer(nb_gpu_ctx *c, const nb_fuse_call *call, bool *deferred)
{
    chain *ch = tl_chain;
    *deferred = false;
    if (!ch || ch->c != c || ch->flushing || !nb__gpu_fuse_supported(call))
        return NB_OK;
    /* Room, and a plan that takes the chain with the call: else the chain goes first. */
    bool joins = ch->n == 0;
    if (!joins && ch->n < NB_FUSE_MAX_CALLS) {
        nb_fuse_call calls[NB_FUSE_MAX_CALLS];
        for (int i = 0; i < ch->n; i++)
            calls[i] = ch->calls[i].call;
        calls[ch->n] = *call;
        nb_fuse_plan plan;
        joins = nb__fuse_plan(calls, ch->n + 1, NB_FUSE_MAX_SLOTS, supported, never_dead, ch, &plan) == ch->n + 1;
    }
    if (!joins) {
        nb_status st = nb__gpu_fuse_flush(c);
        if (st)
            return st;
    }
    pending *p = &ch->calls[ch->n++];
    p->call = *call;
    p->out = *call->out;
    p->call.out = &p->out;
    if (call->x) {
        p->x = *call->x;
        p->call.x = &p->x;
    }
    if (call->y) {
        p->y = *call->y;
        p->call.y = &p->y;
    }
    p->call.index = ch->n - 1;
    *deferred = true;
    return NB_OK;
}

nb_status nb__gpu_fuse_stop(nb_gpu_ctx *c, bool keep)
{
    chain *ch = tl_chain;
    if (!ch || ch->c != c)
        return NB_OK;
    nb_status st = keep ? nb__gpu_fuse_flush(c) : NB_OK;
    tl_chain = NULL;
    free(ch);
    return st;
}
