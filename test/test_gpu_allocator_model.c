/* The GPU caching allocator (gpu/gpu_allocator.c, compiled in here as it
 * is) run on the host against a model of CUDA: streams and events are vector
 * clocks, device memory has a capacity, and every CUDA call checks what a
 * real one would refuse (a cudaFree, a device wait or an event record while
 * a stream of the card is captured; a cudaMalloc from a capturing thread
 * outside relaxed mode). A random driver runs logical devices of one card:
 * allocations, frees, kernels that use blocks, graph recordings (abandoned
 * or kept), replays and frees of graphs, emptying the cache, changing the
 * reserve, running out of device memory, and (optionally) host allocations
 * that fail. After every step it checks the free lists, the live table, the
 * arena's ranges and the statistics (reserved = in_use + cached + graph_held
 * + the arena's free part), and on every device access that the access is
 * ordered after every earlier one on another stream that touched the same
 * bytes: a block handed to a stream while another may still use it is a
 * race. No GPU needed.
 *
 *   test_gpu_allocator_model [steps] [seed] [logical devices 1-3] [graphs 0/1]
 *                            [host failures, percent] [reserve 0/1]
 *
 * Exits 1 naming the violations found. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "gpu_model/gpu_internal.h"
#undef calloc
#undef malloc
#undef realloc

/* ---------------- failure injection for host memory ---------------- */
static int g_host_fail_pct = 0; /* percent of big callocs / record mallocs failing */
static unsigned long long rng_state = 88172645463325252ull;
static unsigned rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}
static int g_inject_armed = 0;
void *fake_calloc(size_t n, size_t s)
{
    if (g_inject_armed && n * s >= 8192 && (int)(rnd() % 100) < g_host_fail_pct)
        return NULL;
    return calloc(n, s);
}
void *fake_malloc(size_t n)
{
    if (g_inject_armed && n < 256 && (int)(rnd() % 1000) < g_host_fail_pct)
        return NULL; /* record_new */
    return malloc(n);
}
void *fake_realloc(void *p, size_t n) { return realloc(p, n); }

/* ---------------- violations ---------------- */
#define MAXV 64
static char g_viol[MAXV][300];
static int g_nviol, g_viol_total;
static const char *g_step_desc = "";
static void viol(const char *fmt, ...)
{
    g_viol_total++;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (int i = 0; i < g_nviol; i++)
        if (strncmp(g_viol[i], buf, 24) == 0)
            return;
    if (g_nviol < MAXV)
        snprintf(g_viol[g_nviol++], sizeof g_viol[0], "%s [during %s]", buf, g_step_desc);
}

/* ---------------- fake streams, events (vector clocks) ---------------- */
#define NCTX 3
#define NS (2 * NCTX) /* compute streams 0..NCTX-1, copy streams NCTX.. */
struct fstream { int id; };
static struct fstream g_streams[NS];
static int vc[NS][NS];      /* vc[s]: what stream s's next op is ordered after */
static int completed[NS];   /* ops of s completed (by seq) */
static int host_vc[NS];     /* what the host knows completed */
static bool capturing[NCTX];
static int cap_thread[NCTX];
static int cur_thread = 0;
static enum cudaStreamCaptureMode thread_mode[NCTX + 1];
static cudaError_t last_err;

typedef struct op { int s, seq, vcv[NS]; uintptr_t lo, hi; const char *what; } op;
#define MAXOPS 20000
static op ops[MAXOPS];
static int nops;

struct fevent { bool recorded; int vcv[NS]; bool in_capture; };

static bool any_capture(void)
{
    for (int i = 0; i < NCTX; i++)
        if (capturing[i])
            return true;
    return false;
}
static bool thread_capturing(void)
{
    for (int i = 0; i < NCTX; i++)
        if (capturing[i] && cap_thread[i] == cur_thread)
            return true;
    return false;
}
static int sid(cudaStream_t s) { return s->id; }
static bool stream_capturing(int s) { return s < NCTX && capturing[s]; }

/* next op of stream s (seq completed[s]+1) */
static op *next_op(int s)
{
    for (int i = 0; i < nops; i++)
        if (ops[i].s == s && ops[i].seq == completed[s] + 1)
            return &ops[i];
    return NULL;
}
static bool progress(int s)
{
    if (completed[s] >= vc[s][s])
        return false;
    op *o = next_op(s);
    if (o) {
        for (int t = 0; t < NS; t++)
            if (t != s && o->vcv[t] > completed[t])
                return false;
    }
    completed[s]++;
    return true;
}
static void random_progress(int n)
{
    for (int i = 0; i < n; i++)
        progress(rnd() % NS);
}
static void drain_stream(int s)
{
    int guard = 0;
    while (completed[s] < vc[s][s] && guard++ < 1000000)
        for (int t = 0; t < NS; t++)
            progress(t);
    for (int t = 0; t < NS; t++)
        if (vc[s][t] > host_vc[t])
            host_vc[t] = vc[s][t];
}
static void drain_all(void)
{
    for (int s = 0; s < NS; s++)
        drain_stream(s);
}
static void prune_ops(void)
{
    int w = 0;
    for (int i = 0; i < nops; i++)
        if (ops[i].seq > host_vc[ops[i].s] || ops[i].seq > completed[ops[i].s])
            ops[w++] = ops[i];
    nops = w;
}
/* enqueue an op touching [lo,hi) on stream s, checking happens-before */
static void enqueue(int s, uintptr_t lo, uintptr_t hi, const char *what)
{
    if (stream_capturing(s)) {
        viol("harness enqueued on capturing stream %d", s);
        return;
    }
    for (int i = 0; i < nops; i++) {
        op *o = &ops[i];
        if (o->hi <= lo || hi <= o->lo || o->s == s)
            continue;
        int known = vc[s][o->s] > host_vc[o->s] ? vc[s][o->s] : host_vc[o->s];
        if (o->seq > known)
            viol("RACE: %s on stream %d [%#lx,+%lu) not ordered after %s on stream %d (seq %d)", what, s,
                 (unsigned long)lo, (unsigned long)(hi - lo), o->what, o->s, o->seq);
    }
    if (nops >= MAXOPS) {
        drain_all();
        prune_ops();
    }
    vc[s][s]++;
    op *n = &ops[nops++];
    n->s = s;
    n->seq = vc[s][s];
    memcpy(n->vcv, vc[s], sizeof n->vcv);
    n->lo = lo;
    n->hi = hi;
    n->what = what;
}

/* ---------------- fake device memory ---------------- */
#define BASE ((uintptr_t)0x100000000ull)
static size_t g_cap = (size_t)96 << 20;
__attribute__((constructor)) static void cap_env(void) { const char *e = getenv("CAP_MIB"); if (e) g_cap = (size_t)atol(e) << 20; }
typedef struct dalloc { uintptr_t p; size_t n; } dalloc;
static dalloc dallocs[4096];
static int ndallocs;
static size_t dused;
static int g_fail_all_malloc = 0;

cudaError_t cudaMalloc(void **pp, size_t n)
{
    if (thread_capturing() && thread_mode[cur_thread] != cudaStreamCaptureModeRelaxed)
        viol("cudaMalloc from a capturing thread outside relaxed mode");
    if (g_fail_all_malloc || n > g_cap - dused) {
        last_err = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    /* first fit in address order, 512-aligned */
    uintptr_t at = BASE;
    int i;
    for (i = 0; i < ndallocs; i++) {
        if (dallocs[i].p >= at + n)
            break;
        uintptr_t e = dallocs[i].p + dallocs[i].n;
        e = (e + 511) & ~(uintptr_t)511;
        if (e > at)
            at = e;
    }
    memmove(&dallocs[i + 1], &dallocs[i], (ndallocs - i) * sizeof *dallocs);
    dallocs[i].p = at;
    dallocs[i].n = n;
    ndallocs++;
    dused += n;
    *pp = (void *)at;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (any_capture())
        viol("cudaFree (implicit device sync) while a stream of the card is captured");
    drain_all();
    prune_ops();
    for (int i = 0; i < ndallocs; i++)
        if (dallocs[i].p == (uintptr_t)p) {
            dused -= dallocs[i].n;
            memmove(&dallocs[i], &dallocs[i + 1], (ndallocs - i - 1) * sizeof *dallocs);
            ndallocs--;
            return cudaSuccess;
        }
    viol("cudaFree of unknown pointer %p", p);
    return 1;
}
static int n_events_live;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f)
{
    (void)f;
    *e = calloc(1, sizeof **e);
    n_events_live++;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    n_events_live--;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    int i = sid(s);
    if (stream_capturing(i))
        viol("cudaEventRecord on a capturing stream %d", i);
    e->recorded = true;
    memcpy(e->vcv, vc[i], sizeof e->vcv);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e->recorded)
        return cudaSuccess;
    for (int t = 0; t < NS; t++)
        if (e->vcv[t] > completed[t]) {
            last_err = cudaErrorNotReady;
            return cudaErrorNotReady;
        }
    for (int t = 0; t < NS; t++)
        if (e->vcv[t] > host_vc[t])
            host_vc[t] = e->vcv[t];
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f)
{
    (void)f;
    int i = sid(s);
    if (!e->recorded)
        return cudaSuccess;
    for (int t = 0; t < NS; t++)
        if (e->vcv[t] > vc[i][t])
            vc[i][t] = e->vcv[t];
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    int i = sid(s);
    if (stream_capturing(i))
        viol("cudaStreamSynchronize on capturing stream");
    if (thread_capturing())
        viol("cudaStreamSynchronize from a capturing thread");
    drain_stream(i);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    if (any_capture())
        viol("cudaDeviceSynchronize while a stream of the card is captured");
    drain_all();
    prune_ops();
    return cudaSuccess;
}
static int g_cur_dev = 0;
cudaError_t cudaGetDevice(int *d) { *d = g_cur_dev; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { g_cur_dev = d; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { cudaError_t e = last_err; last_err = 0; return e; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = g_cap - dused; *t = g_cap; return cudaSuccess; }
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m)
{
    enum cudaStreamCaptureMode old = thread_mode[cur_thread];
    thread_mode[cur_thread] = *m;
    *m = old;
    return cudaSuccess;
}

/* ---------------- fake nabla ---------------- */
static char g_err[512];
static int g_err_code;
static void record_error(nb_status code, const char *fmt, va_list ap)
{
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    g_err_code = code;
}
nb_status nb__fail(nb_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record_error(code, fmt, ap);
    va_end(ap);
    return code;
}
void *nb__fail_null(nb_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record_error(code, fmt, ap);
    va_end(ap);
    return NULL;
}
static int g_warnings;
void nb__log(nb_log_level l, const char *fmt, ...) { (void)l; (void)fmt; g_warnings++; }
nb_status nb__gpu_set_device(int o, const char *n) { (void)n; g_cur_dev = o; return NB_OK; }
nb_status nb__gpu_cuda_fail(cudaError_t e, const char *call, const char *name)
{
    return nb__fail(NB_ERR_BACKEND, "%s failed on %s: %d", call, name, e);
}
static nb_device g_devs[NCTX];
static nb_gpu_ctx g_ctx[NCTX];
static nb_gpu_phys g_phys;
nb_device *nb__gpu_device_named(const char *name, const char *who)
{
    (void)who;
    for (int i = 0; i < NCTX; i++)
        if (!strcmp(g_devs[i].name, name))
            return &g_devs[i];
    return NULL;
}
int nb_device_count(nb_device_kind k) { (void)k; return NCTX; }
int nb__gpu_phys_count(void) { return 1; }
nb_gpu_phys *nb__gpu_phys_at(int i) { return i == 0 ? &g_phys : NULL; }

/* ---------------- the allocator itself ---------------- */
#define calloc fake_calloc
#define malloc fake_malloc
#define realloc fake_realloc
#include "gpu/gpu_allocator.c"
#undef calloc
#undef malloc
#undef realloc

/* ---------------- invariants (peeking inside) ---------------- */
typedef struct lblock { uintptr_t p; size_t n; int ctx; int graph; /* -1 none */ bool pinned; } lblock;
#ifndef MAXLIVE
#define MAXLIVE 400
#endif
static lblock live[MAXLIVE];
static int nlive;

static int g_graphs_kept; /* recordings kept as graphs */
#define MAXG 8
typedef struct graph {
    bool alive, recording;
    int ctx;
    nb_gpu_pool *pool;
    uintptr_t lo[512], hi[512];
    int n;
} graph;
static graph graphs[MAXG];

static int g_check_stat_identity = 1;
static void check_invariants(void)
{
    nb_gpu_allocator *a = g_phys.alloc;
    size_t cached = 0, in_use = 0, arena_blocks = 0, arena_bytes = 0, outside = 0, pool_idle = 0;
    /* collect all block records */
    static block *seen[100000];
    int nseen = 0;
#define SEE(b)                                                                   \
    do {                                                                         \
        for (int k_ = 0; k_ < nseen; k_++)                                       \
            if (seen[k_] == (b))                                                 \
                viol("block %p in two places", (void *)(b));                     \
        seen[nseen++] = (b);                                                     \
        if ((b)->in_arena) {                                                     \
            arena_blocks++;                                                      \
            arena_bytes += (b)->size;                                            \
        } else                                                                   \
            outside += (b)->size;                                                \
    } while (0)
    for (size_t i = 0; i < N_SMALL; i++)
        for (block *b = a->small[i]; b; b = b->next) {
            SEE(b);
            if (b->size != (i + 1) * SMALL_QUANTUM)
                viol("small list %zu holds size %zu", i, b->size);
            if (b->pool)
                viol("cached (small) block %p still belongs to a pool", (void *)b);
            cached += b->size;
        }
    size_t prev = 0;
    for (block *b = a->large; b; b = b->next) {
        SEE(b);
        if (b->size < prev)
            viol("large list unsorted");
        if (b->size <= SMALL_LIMIT)
            viol("large list holds small size %zu", b->size);
        prev = b->size;
        if (b->pool)
            viol("cached (large) block %p still belongs to a pool", (void *)b);
        cached += b->size;
    }
    for (block *b = a->retry; b; b = b->next) {
        SEE(b);
        cached += b->size;
    }
    size_t tn = 0;
    for (size_t i = 0; i < a->table_cap; i++)
        if (a->table[i]) {
            block *b = a->table[i];
            SEE(b);
            tn++;
            in_use += b->size;
            /* findable */
            size_t mask = a->table_cap - 1, j = slot_of(b->ptr, a->table_cap);
            while (a->table[j] && a->table[j] != b)
                j = (j + 1) & mask;
            if (a->table[j] != b)
                viol("table entry unreachable by probing");
        }
    if (tn != a->table_n)
        viol("table_n %zu != %zu", a->table_n, tn);
    for (int g = 0; g < MAXG; g++)
        if (graphs[g].pool) {
            for (block *b = graphs[g].pool->free; b; b = b->next) {
                SEE(b);
                pool_idle += b->size;
                if (b->pool != graphs[g].pool)
                    viol("pool free list holds a block of another pool");
            }
            for (block *b = graphs[g].pool->held; b; b = b->next) {
                SEE(b);
                pool_idle += b->size;
            }
        }
    if (cached != a->cached)
        viol("cached stat %zu != %zu", a->cached, cached);
    if (in_use != a->in_use)
        viol("in_use stat %zu != %zu", a->in_use, in_use);
    if (arena_blocks != a->arena_blocks)
        viol("arena_blocks %zu != %zu", a->arena_blocks, arena_blocks);
    if (outside != a->outside_arena)
        viol("outside_arena %zu != %zu", a->outside_arena, outside);
    size_t dev_outside = dused - a->arena_size;
    if (dev_outside != outside)
        viol("device memory outside arena %zu != blocks %zu (leak)", dev_outside, outside);
    /* arena ranges */
    size_t free_r = 0;
    if (a->n_ranges > a->cap_ranges)
        viol("n_ranges > cap_ranges");
    for (size_t i = 0; i < a->n_ranges; i++) {
        range r = a->ranges[i];
        if (r.size == 0 || r.off + r.size > a->arena_size)
            viol("bad arena range");
        if (i && a->ranges[i - 1].off + a->ranges[i - 1].size >= r.off)
            viol("arena ranges overlap or not coalesced");
        free_r += r.size;
    }
    if (a->arena && free_r + arena_bytes != a->arena_size)
        viol("arena bytes: free %zu + blocks %zu != %zu", free_r, arena_bytes, a->arena_size);
    if (a->arena && a->n_ranges > a->arena_blocks + 1)
        viol("more ranges than blocks+1");
    /* documented identity: reserved = in_use + cached + arena free */
    if (reserved_of(a) != in_use + cached + free_r + pool_idle)
        viol("LEAK: reserved %zu != in_use + cached + arena free + pool idle (%zu)", reserved_of(a),
             in_use + cached + free_r + pool_idle);
    if (g_check_stat_identity && (reserved_of(a) != in_use + cached + a->graph_held + free_r || a->graph_held != pool_idle))
        viol("STAT: reserved %zu != in_use + cached + graph_held + arena free (%zu); pool-idle bytes %zu held %zu", reserved_of(a),
             in_use + cached + a->graph_held + free_r, pool_idle, a->graph_held);
    /* harness live blocks are in the table with enough size */
    for (int i = 0; i < nlive; i++) {
        block *b = NULL;
        size_t mask = a->table_cap - 1, j = slot_of((void *)live[i].p, a->table_cap);
        while (a->table[j] && a->table[j]->ptr != (char *)live[i].p)
            j = (j + 1) & mask;
        b = a->table[j];
        if (!b || b->size < live[i].n)
            viol("live block missing or too small");
    }
    /* no two live blocks overlap */
    for (int i = 0; i < nlive; i++)
        for (int j = i + 1; j < nlive; j++)
            if (live[i].p < live[j].p + (live[j].n ? live[j].n : 1) &&
                live[j].p < live[i].p + (live[i].n ? live[i].n : 1))
                viol("two live blocks overlap");
}

/* ---------------- the driver ---------------- */
static int recording_graph(int ctx)
{
    for (int g = 0; g < MAXG; g++)
        if (graphs[g].recording && graphs[g].ctx == ctx)
            return g;
    return -1;
}
static void graph_note(int g, uintptr_t lo, uintptr_t hi)
{
    if (graphs[g].n < 512) {
        graphs[g].lo[graphs[g].n] = lo;
        graphs[g].hi[graphs[g].n++] = hi;
    }
}
/* block handed to ctx: must not be memory a live graph (other than the one it
 * records) touches */
static void check_handout(int ctx, uintptr_t lo, uintptr_t hi)
{
    int rg = recording_graph(ctx);
    for (int g = 0; g < MAXG; g++) {
        if (!graphs[g].alive && !graphs[g].recording)
            continue;
        if (g == rg)
            continue;
        for (int k = 0; k < graphs[g].n; k++)
            if (graphs[g].lo[k] < hi && lo < graphs[g].hi[k])
                viol("GRAPH: block handed to ctx %d overlaps memory graph %d (ctx %d, %s) still replays", ctx, g,
                     graphs[g].ctx, graphs[g].recording ? "recording" : "alive");
    }
}
static size_t rand_size(void)
{
    switch (rnd() % 6) {
    case 0: return rnd() % 4096;
    case 1: return rnd() % (256 << 10);
    case 2: return (1 << 20) - 512 + rnd() % 1024;
    case 3: return (1 << 20) + rnd() % (3 << 20);
    case 4: return (4 << 20) + rnd() % (12 << 20);
    default: return 512 * (1 + rnd() % 8);
    }
}
static void use_block(int i, int on_ctx)
{
    lblock *l = &live[i];
    uintptr_t hi = l->p + (l->n ? l->n : 1);
    int g = recording_graph(on_ctx);
    if (g >= 0 && capturing[on_ctx]) {
        graph_note(g, l->p, hi);
        return;
    }
    enqueue(on_ctx, l->p, hi, "kernel");
}
static void do_malloc(int ctx)
{
    g_step_desc = "malloc";
    size_t n = rand_size();
    cur_thread = ctx;
    void *p = nb__gpu_malloc(&g_ctx[ctx], n);
    if (!p)
        return;
    if (nlive >= MAXLIVE) {
        nb__gpu_free(&g_ctx[ctx], p);
        return;
    }
    check_handout(ctx, (uintptr_t)p, (uintptr_t)p + (n ? n : 1));
    live[nlive++] = (lblock){(uintptr_t)p, n, ctx, -1, false};
    /* sometimes a big upload through the copy stream, as gpu_transfer does
     * (nothing queued on the block before it); else a kernel writes it */
    if (!(n >= (1 << 20) && !capturing[ctx] && rnd() % 3 == 0)) {
        use_block(nlive - 1, ctx);
    } else {
        g_step_desc = "upload";
        nb_gpu_ctx *c = &g_ctx[ctx];
        int cs = NCTX + ctx;
        if (!nb__gpu_block_fence(c, p, &g_streams[cs])) {
            struct fevent f;
            cudaEventRecord(&f, c->stream);
            cudaStreamWaitEvent(&g_streams[cs], &f, 0);
        }
        enqueue(cs, (uintptr_t)p, (uintptr_t)p + n, "upload DMA");
        struct fevent d;
        cudaEventRecord(&d, &g_streams[cs]);
        cudaStreamWaitEvent(c->stream, &d, 0);
    }
}
static void do_free(int i)
{
    g_step_desc = "free";
    lblock l = live[i];
    if (l.pinned)
        return;
    cur_thread = l.ctx;
    nb__gpu_free(&g_ctx[l.ctx], (void *)l.p);
    live[i] = live[--nlive];
}
static void do_begin(int ctx)
{
    g_step_desc = "begin";
    if (recording_graph(ctx) >= 0)
        return;
    int g;
    for (g = 0; g < MAXG; g++)
        if (!graphs[g].alive && !graphs[g].recording && !graphs[g].pool)
            break;
    if (g == MAXG)
        return;
    cur_thread = ctx;
    nb_gpu_pool *p;
    if (nb__gpu_pool_start(&g_ctx[ctx], &p) != NB_OK)
        return;
    graphs[g] = (graph){.recording = true, .ctx = ctx, .pool = p};
    capturing[ctx] = true;
    cap_thread[ctx] = ctx;
    thread_mode[ctx] = cudaStreamCaptureModeThreadLocal;
}
static void do_end(int ctx, bool keep)
{
    g_step_desc = keep ? "end(keep)" : "end(abandon)";
    int g = recording_graph(ctx);
    if (g < 0)
        return;
    cur_thread = ctx;
    capturing[ctx] = false;
    nb__gpu_pool_stop(&g_ctx[ctx]);
    graphs[g].recording = false;
    if (keep) {
        graphs[g].alive = true;
        g_graphs_kept++;
        /* blocks allocated outside the pool that the graph touches stay pinned
         * (lib/graph holds its inputs; variables hold theirs) */
        for (int i = 0; i < nlive; i++)
            for (int k = 0; k < graphs[g].n; k++)
                if (graphs[g].lo[k] == live[i].p) {
                    nb_gpu_allocator *a = g_phys.alloc;
                    size_t mask = a->table_cap - 1, j = slot_of((void *)live[i].p, a->table_cap);
                    while (a->table[j] && a->table[j]->ptr != (char *)live[i].p)
                        j = (j + 1) & mask;
                    live[i].pinned = true; /* lib/graph holds what its graph touches */
                }
    } else {
        cudaStreamSynchronize(g_ctx[ctx].stream);
        nb__gpu_pool_release(graphs[g].pool, true);
        graphs[g].pool = NULL;
        graphs[g].n = 0;
    }
}
static void do_replay(int g)
{
    g_step_desc = "replay";
    if (!graphs[g].alive)
        return;
    int ctx = graphs[g].ctx;
    if (capturing[ctx])
        return;
    for (int k = 0; k < graphs[g].n; k++)
        enqueue(ctx, graphs[g].lo[k], graphs[g].hi[k], "graph replay");
}
static void do_destroy(int g)
{
    g_step_desc = "destroy";
    if (!graphs[g].alive)
        return;
    int ctx = graphs[g].ctx;
    if (capturing[ctx]) /* modelled while the stream is not recorded (the backend then waits for the graph's own event) */
        return;
    cur_thread = ctx;
    cudaStreamSynchronize(g_ctx[ctx].stream);
    nb__gpu_pool_release(graphs[g].pool, false);
    graphs[g].alive = false;
    graphs[g].pool = NULL;
    /* unpin blocks no other live graph touches */
    for (int i = 0; i < nlive; i++) {
        bool still = false;
        for (int h = 0; h < MAXG; h++)
            if (h != g && (graphs[h].alive || graphs[h].recording))
                for (int k = 0; k < graphs[h].n; k++)
                    if (graphs[h].lo[k] == live[i].p)
                        still = true;
        if (!still)
            live[i].pinned = false;
    }
    graphs[g].n = 0;
}

static void setup(int n_logical)
{
    memset(&g_phys, 0, sizeof g_phys);
    for (int s = 0; s < NS; s++)
        g_streams[s].id = s;
    nb__gpu_allocator_init(&g_phys);
    g_phys.n_logical = n_logical;
    for (int i = 0; i < NCTX; i++) {
        snprintf(g_devs[i].name, sizeof g_devs[i].name, "/gpu:%d", i);
        g_devs[i].kind = NB_DEVICE_GPU;
        g_devs[i].ctx = &g_ctx[i];
        g_ctx[i] = (nb_gpu_ctx){.dev = &g_devs[i], .phys = &g_phys, .ordinal = 0, .stream = &g_streams[i]};
    }
    g_phys.first = &g_ctx[0];
}

int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 30000;
    unsigned long long seed = argc > 2 ? strtoull(argv[2], 0, 0) : 1;
    int n_logical = argc > 3 ? atoi(argv[3]) : NCTX;
    int graphs_on = argc > 4 ? atoi(argv[4]) : 1;
    g_host_fail_pct = argc > 5 ? atoi(argv[5]) : 0;
    int reserve_on = argc > 6 ? atoi(argv[6]) : 1;
    if (n_logical < 1 || n_logical > NCTX || steps < 1) {
        fprintf(stderr, "usage: %s [steps] [seed] [logical devices 1-%d] [graphs 0/1] [host failures %%] [reserve 0/1]\n",
                argv[0], NCTX);
        return 2;
    }
    rng_state ^= seed * 0x9E3779B97F4A7C15ull;
    setup(n_logical);
    g_inject_armed = 1;
    int nctx = n_logical;
    for (long st = 0; st < steps; st++) {
        unsigned r = rnd() % 1000;
        int ctx = rnd() % nctx;
        if (r < 300)
            do_malloc(ctx);
        else if (r < 560) {
            if (nlive)
                do_free(rnd() % nlive);
        } else if (r < 700) {
            if (nlive) {
                int i = rnd() % nlive;
                g_step_desc = "use";
                use_block(i, live[i].ctx);
            }
        } else if (r < 850) {
            random_progress(4);
        } else if (r < 860) {
            g_step_desc = "stream sync";
            if (!capturing[ctx]) {
                cur_thread = ctx;
                cudaStreamSynchronize(g_ctx[ctx].stream);
            }
        } else if (graphs_on && r < 880) {
            do_begin(ctx);
        } else if (graphs_on && r < 900) {
            do_end(ctx, rnd() % 3 != 0);
        } else if (graphs_on && r < 940) {
            do_replay(rnd() % MAXG);
        } else if (graphs_on && r < 955) {
            do_destroy(rnd() % MAXG);
        } else if (r < 960) {
            g_step_desc = "empty_cache";
            cur_thread = NCTX; /* some other thread */
            nb_gpu_empty_cache("/gpu:0");
        } else if (reserve_on && r < 963) {
            g_step_desc = "set_reserve";
            cur_thread = NCTX;
            nb_gpu_set_reserve("/gpu:0", (rnd() % 3) ? (size_t)(rnd() % 64) << 20 : 0, rnd() % 2);
        }
        check_invariants();
    }
    nb_gpu_allocator *a = g_phys.alloc;
    printf("%ld steps, seed %llu, %d logical devices, graphs %d, host failures %d%%, reserve %d: %d violations\n",
           steps, seed, n_logical, graphs_on, g_host_fail_pct, reserve_on, g_viol_total);
    printf("  allocations %llu (cache hits %llu), cudaMalloc %llu, cache emptied %llu, failures %llu\n",
           (unsigned long long)a->allocations, (unsigned long long)a->cache_hits,
           (unsigned long long)a->device_mallocs, (unsigned long long)a->cache_flushes,
           (unsigned long long)a->failures);
    for (int i = 0; i < g_nviol; i++)
        printf("  %s\n", g_viol[i]);
    /* the driver must have reached the interesting states */
    bool reached = a->allocations > 0 && (a->cache_hits > 0 || n_logical == 0) && (!graphs_on || g_graphs_kept > 0);
    if (!reached)
        printf("  the driver did not reach allocations, cache hits and kept graphs\n");
    return g_viol_total == 0 && reached ? 0 : 1;
}
