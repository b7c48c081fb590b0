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
    uint64_t loaded; /* the cards (CUDA ordinals below 64) it was loaded on */
} compiled;

enum { CACHE_MAX = 512 };
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static compiled g_cache[CACHE_MAX];
static int g_cache_n;

/* The entry of src for arch, or NULL when src was never compiled; its kernel
 * is NULL where compiling or loading failed for good. Under g_cache_lock. */
static compiled *cached(int arch, const char *src)
{
    for (int i = 0; i < g_cache_n; i++)
        if (g_cache[i].arch == arch && !strcmp(g_cache[i].src, src))
            return &g_cache[i];
    return NULL;
}

static int arch_of(const nb_gpu_ctx *c) { return c->phys->cc_major * 10 + c->phys->cc_minor; }

static uint64_t card_bit(const nb_gpu_ctx *c) { return c->ordinal >= 0 && c->ordinal < 64 ? 1ull << c->ordinal : 0; }

/* The kernel of src if it was compiled and loaded on c's card already, else
 * NULL: what a recording may use (it may not load code). */
static cudaKernel_t kernel_ready(nb_gpu_ctx *c, const char *src)
{
    pthread_mutex_lock(&g_cache_lock);
    compiled *e = cached(arch_of(c), src);
    cudaKernel_t k = e && (e->loaded & card_bit(c)) ? e->kernel : NULL;
    pthread_mutex_unlock(&g_cache_lock);
    return k;
}

/* Whether a load that failed with e would fail again: a bad or foreign image. */
static bool load_failed_for_good(cudaError_t e)
{
    return e == cudaErrorInvalidKernelImage || e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidPtx ||
           e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidSource || e == cudaErrorSymbolNotFound;
}

/* Compiles src for c's card unless that was done (or failed for good)
 * before, and loads it on c's card unless it was: a library's kernels load
 * on a card at their first use when CUDA loads lazily (its default), which
 * must not be a recording's launch. A chain whose compile or image failed is
 * not compiled again; NVRTC missing, or memory, is not remembered per chain.
 * Errors are recorded; preparing, the caller drops them. */
static void compile_once(nb_gpu_ctx *c, const char *src)
{
    int arch = arch_of(c);
    pthread_mutex_lock(&g_cache_lock);
    compiled *entry = cached(arch, src);
    if (!entry && g_cache_n < CACHE_MAX) {
        void *cubin = NULL;
        size_t size = 0;
        cudaKernel_t k = NULL;
        cudaLibrary_t lib = NULL;
        char *copy = strdup(src);
        nb_status st = copy ? nb__gpu_fuse_compile(src, arch, &cubin, &size)
                            : nb__fail(NB_ERR_OUT_OF_MEMORY, "fused kernel: out of host memory");
        bool remember = st == NB_ERR_BACKEND; /* NVRTC refused the source */
        if (st == NB_OK) {
            cudaError_t e = cudaLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
            if (e == cudaSuccess)
                e = cudaLibraryGetKernel(&k, lib, "nb_fused");
            remember = e == cudaSuccess || load_failed_for_good(e);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                if (lib)
                    (void)cudaLibraryUnload(lib);
                lib = NULL;
                k = NULL;
                nb__fail(NB_ERR_BACKEND, "fused kernel: loading it failed on %s: %s", c->dev->name,
                         cudaGetErrorString(e));
            }
        }
        free(cubin);
        if (copy && remember) {
            g_cache[g_cache_n] = (compiled){arch, copy, lib, k, 0};
            entry = &g_cache[g_cache_n++];
            copy = NULL;
        }
        free(copy);
    }
    if (entry && entry->kernel && !(entry->loaded & card_bit(c)) && card_bit(c)) {
        struct cudaFuncAttributes fa;
        cudaError_t e = nb__gpu_set_device(c->ordinal, c->dev->name) == NB_OK
                            ? cudaFuncGetAttributes(&fa, (const void *)entry->kernel)
                            : cudaErrorInvalidDevice;
        if (e == cudaSuccess)
            entry->loaded |= card_bit(c);
        else
            (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&g_cache_lock);
}

/* ---- the pending chain ---- */

enum { MAX_FREED = 256 };

typedef struct pending {
    nb_fuse_call call;
    nb_view out, x, y, cond; /* the call's views (it points at these) */
} pending;

typedef struct chain {
    nb_gpu_ctx *c;
    bool dry;       /* preparing: the calls run as usual, the chain is only compiled */
    bool passing;   /* preparing: the call just appended enters the device next */
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

static void start(nb_gpu_ctx *c, bool dry)
{
    if (tl_chain && tl_chain->dry) { /* a preparation left over: the recording replaces it */
        free(tl_chain);
        tl_chain = NULL;
    }
    if (tl_chain || !nb__graph_fusion())
        return;
    chain *ch = calloc(1, sizeof *ch);
    if (ch) {
        ch->c = c;
        ch->dry = dry;
        tl_chain = ch;
    }
}

void nb__gpu_fuse_start(nb_gpu_ctx *c) { start(c, false); }

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
    case NB_FUSE_COPY: return nb__gpu_copy(c, k->out, k->x);
    case NB_FUSE_WHERE: return nb__gpu_where(c, k->out, k->cond, k->x, k->y);
    default: return nb__gpu_binary(c, (nb_binary_op)k->op, k->out, k->x, k->y);
    }
}

/* The plan's kernel launched (recording), or compiled for later (preparing).
 * NB_ERR_UNSUPPORTED, with no error left recorded, where it is not ready:
 * the calls then run one by one. */
static nb_status launch_fused(nb_gpu_ctx *c, const nb_fuse_plan *p, bool dry)
{
    nb_gpu_fuse_geo g;
    nb_gpu_fuse_args a;
    nb__gpu_fuse_geometry(p, &g, &a);
    char *src = nb__gpu_fuse_source(p, &g);
    if (!src)
        return NB_ERR_UNSUPPORTED;
    if (dry) {
        nb_error_saved saved;
        nb__error_stash(&saved);
        compile_once(c, src); /* a chain that cannot compile runs unfused, silently */
        nb__error_restore(&saved);
        free(src);
        return NB_OK;
    }
    cudaKernel_t k = kernel_ready(c, src);
    free(src);
    if (!k)
        return NB_ERR_UNSUPPORTED;
    long long blocks = (a.n + 255) / 256;
    long long most = (long long)c->phys->sm_count * 32;
    if (blocks > most)
        blocks = most;
    if (blocks < 1)
        blocks = 1;
    void *args[1] = {&a};
    cudaError_t e = cudaLaunchKernel((const void *)k, (dim3){(unsigned)blocks, 1, 1}, (dim3){256, 1, 1}, args, 0,
                                     c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return nb__fail(NB_ERR_BACKEND, "launch of a fused elementwise kernel failed on %s: %s", c->dev->name,
                        cudaGetErrorString(e));
    }
    return NB_OK;
}

nb_status nb__gpu_fuse_flush(nb_gpu_ctx *c)
{
    chain *ch = tl_chain;
    if (!ch || ch->c != c || ch->flushing)
        return NB_OK;
    if (ch->passing) { /* the entry of the call just watched: it runs now */
        ch->passing = false;
        return NB_OK;
    }
    if (ch->n == 0)
        return NB_OK;
    ch->flushing = true;
    nb_fuse_call calls[NB_FUSE_MAX_CALLS];
    for (int i = 0; i < ch->n; i++)
        calls[i] = ch->calls[i].call;
    nb_status st = NB_OK;
    int done = ch->dry ? ch->n : 0; /* preparing, the calls ran already */
    if (ch->n >= 2) {
        nb_fuse_plan plan;
        int k = nb__fuse_plan(calls, ch->n, NB_FUSE_MAX_SLOTS, supported, dead_now, ch, &plan);
        if (k == ch->n) {
            st = launch_fused(c, &plan, ch->dry);
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
    if (call->cond) {
        p->cond = *call->cond;
        p->call.cond = &p->cond;
    }
    p->call.index = ch->n - 1;
    *deferred = !ch->dry;
    ch->passing = ch->dry;
    return NB_OK;
}

void nb__gpu_fuse_prepare(nb_gpu_ctx *c, bool on)
{
    if (on) {
        start(c, true);
    } else if (tl_chain && tl_chain->dry && tl_chain->c == c) {
        tl_chain->passing = false;
        (void)nb__gpu_fuse_stop(c, true); /* compiles the last chain; nothing runs */
    }
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
