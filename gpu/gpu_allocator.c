/* The caching allocator: one per physical card, shared by its logical devices.
 *
 * Sizes are rounded to classes: multiples of 512 bytes up to 1 MiB, of 128 KiB
 * up to 4 MiB (so that 1.3 MiB takes 1.375 MiB, not 2), of 2 MiB above. A freed
 * block goes to a free list of its class and is handed out again without
 * calling CUDA. A block remembers the stream (logical device) it was freed on:
 * that stream may reuse it at once (its later work is ordered after the earlier
 * use); another stream of the same card only once the event recorded at the
 * free has completed. Blocks of 1 MiB or more record that event on one-stream
 * cards too, so that an upload on the copy stream can wait for it
 * (nb__gpu_block_fence). Requests above 1 MiB take a cached block up to 25%
 * bigger than needed.
 *
 * Memory comes from cudaMalloc on demand (the default) or from an arena reserved
 * up front (nb_gpu_set_reserve), carved best-fit with coalescing, optionally
 * growing past it with cudaMalloc. When CUDA has no memory left the allocator
 * waits for the card, gives every cached block back (to CUDA or to the arena)
 * and tries once more before failing with NB_ERR_OUT_OF_MEMORY.
 *
 * While a stream is recorded into a graph (gpu_graph.cu), its allocations come
 * from a pool private to that graph instead, and the blocks it frees (the
 * pool's own and any other) stay with the pool: a replay writes the same
 * addresses, so none of them may go to anyone else while the graph lives.
 *
 * A hash table maps live pointers to their blocks, so free needs no header in
 * device memory. One mutex per card guards everything. */
#include "gpu_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_QUANTUM ((size_t)512)
#define N_SMALL (SMALL_LIMIT / SMALL_QUANTUM)
#define MID_LIMIT ((size_t)4 << 20)
#define MID_QUANTUM ((size_t)128 << 10)
#define LARGE_QUANTUM ((size_t)2 << 20)
#define MIB (1024.0 * 1024.0)

typedef struct block {
    char *ptr;
    size_t size;       /* the class size */
    size_t requested;  /* what the caller asked for */
    nb_gpu_ctx *owner; /* the stream that used it last */
    cudaEvent_t event; /* made on first need; recorded at free when the card has several streams */
    bool event_pending;
    bool fenced;       /* event was recorded at the last free (gpu_transfer's copy stream waits on it) */
    bool recycled;     /* handed out again from the cache: earlier users may still be queued */
    bool in_arena;
    struct nb_gpu_pool *pool; /* the recorded graph's pool it belongs to, or NULL */
    struct block *next;
} block;

struct nb_gpu_pool {
    nb_gpu_ctx *ctx;
    block *free; /* its blocks, freed (a replay may still write them) */
    block *held; /* blocks of the shared cache freed while recording */
};

typedef struct range {
    size_t off, size;
} range;

struct nb_gpu_allocator {
    pthread_mutex_t lock;
    nb_gpu_phys *phys;
    block *small[N_SMALL]; /* free lists by class */
    block *large;          /* free large blocks, ascending size */
    block *spare;          /* unused block records */
    block *retry;          /* idle blocks of an abandoned recording, for the next (counted in cached) */
    int recordings;        /* streams of this card being recorded: no card-wide wait meanwhile */
    block **table;         /* live blocks by pointer: open addressing */
    size_t table_cap, table_n;
    /* the reserve arena */
    char *arena;
    size_t arena_size;
    bool allow_growth;
    range *ranges; /* free parts of the arena, ascending offset */
    size_t n_ranges, cap_ranges;
    size_t arena_blocks; /* blocks carved out and not yet given back */
    /* statistics */
    size_t in_use, requested, peak_in_use, cached;
    size_t graph_held;    /* bytes of free blocks in recorded graphs' pools */
    size_t outside_arena; /* bytes of cudaMalloc'd blocks, live or cached */
    size_t peak_reserved;
    uint64_t allocations, cache_hits, device_mallocs, cache_flushes, failures;
};

bool nb__gpu_allocator_init(nb_gpu_phys *p)
{
    nb_gpu_allocator *a = calloc(1, sizeof *a);
    if (!a)
        return false;
    pthread_mutex_init(&a->lock, NULL);
    a->phys = p;
    a->allow_growth = true;
    p->alloc = a;
    return true;
}

static size_t round_size(size_t n)
{
    if (n == 0)
        n = 1;
    if (n <= SMALL_LIMIT)
        return (n + SMALL_QUANTUM - 1) & ~(SMALL_QUANTUM - 1);
    if (n <= MID_LIMIT)
        return (n + MID_QUANTUM - 1) & ~(MID_QUANTUM - 1);
    if (n > SIZE_MAX - LARGE_QUANTUM)
        return 0;
    return (n + LARGE_QUANTUM - 1) & ~(LARGE_QUANTUM - 1);
}

/* The step between classes of a size above SMALL_LIMIT. */
static size_t class_step(size_t size) { return size <= MID_LIMIT ? MID_QUANTUM : LARGE_QUANTUM; }

static size_t reserved_of(const nb_gpu_allocator *a) { return a->arena_size + a->outside_arena; }

static void note_peaks(nb_gpu_allocator *a)
{
    if (a->in_use > a->peak_in_use)
        a->peak_in_use = a->in_use;
    if (reserved_of(a) > a->peak_reserved)
        a->peak_reserved = reserved_of(a);
}

/* ---- block records and the live table --------------------------------------- */

static block *record_new(nb_gpu_allocator *a)
{
    block *b = a->spare;
    if (b)
        a->spare = b->next;
    else if (!(b = malloc(sizeof *b)))
        return NULL;
    memset(b, 0, sizeof *b);
    return b;
}

static void record_free(nb_gpu_allocator *a, block *b)
{
    if (b->event)
        (void)cudaEventDestroy(b->event);
    b->event = NULL;
    b->next = a->spare;
    a->spare = b;
}

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p >> 9;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

/* Grows the table, where needed, so that one more block fits: false when
 * out of host memory (nothing changed). */
static bool table_room(nb_gpu_allocator *a)
{
    if ((a->table_n + 1) * 2 > a->table_cap) {
        size_t cap = a->table_cap ? a->table_cap * 2 : 1024;
        block **t = calloc(cap, sizeof *t);
        if (!t)
            return false;
        for (size_t i = 0; i < a->table_cap; i++) {
            block *e = a->table[i];
            if (!e)
                continue;
            size_t j = slot_of(e->ptr, cap);
            while (t[j])
                j = (j + 1) & (cap - 1);
            t[j] = e;
        }
        free(a->table);
        a->table = t;
        a->table_cap = cap;
    }
    return true;
}

/* Adds b to the table, which table_room made room for. */
static void table_insert(nb_gpu_allocator *a, block *b)
{
    size_t mask = a->table_cap - 1, i = slot_of(b->ptr, a->table_cap);
    while (a->table[i])
        i = (i + 1) & mask;
    a->table[i] = b;
    a->table_n++;
}

static block *table_remove(nb_gpu_allocator *a, const void *p)
{
    if (!a->table_cap)
        return NULL;
    size_t mask = a->table_cap - 1, i = slot_of(p, a->table_cap);
    while (a->table[i] && a->table[i]->ptr != p)
        i = (i + 1) & mask;
    block *b = a->table[i];
    if (!b)
        return NULL;
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!a->table[j])
            break;
        size_t home = slot_of(a->table[j]->ptr, a->table_cap);
        bool home_in_gap = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!home_in_gap) {
            a->table[i] = a->table[j];
            i = j;
        }
    }
    a->table[i] = NULL;
    a->table_n--;
    return b;
}

/* ---- the arena ------------------------------------------------------------------ */

static char *arena_take(nb_gpu_allocator *a, size_t size)
{
    if (!a->arena)
        return NULL;
    /* Giving a block back adds at most one range: keep room for all of them. */
    if (a->arena_blocks + 2 > a->cap_ranges) {
        size_t cap = a->cap_ranges ? a->cap_ranges * 2 : 64;
        range *r = realloc(a->ranges, cap * sizeof *r);
        if (!r)
            return NULL;
        a->ranges = r;
        a->cap_ranges = cap;
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < a->n_ranges; i++)
        if (a->ranges[i].size >= size && (best == SIZE_MAX || a->ranges[i].size < a->ranges[best].size))
            best = i;
    if (best == SIZE_MAX)
        return NULL;
    range *r = &a->ranges[best];
    char *p = a->arena + r->off;
    r->off += size;
    r->size -= size;
    if (r->size == 0) {
        memmove(r, r + 1, (a->n_ranges - best - 1) * sizeof *r);
        a->n_ranges--;
    }
    a->arena_blocks++;
    return p;
}

static void arena_put(nb_gpu_allocator *a, char *p, size_t size)
{
    size_t off = (size_t)(p - a->arena);
    size_t lo = 0, hi = a->n_ranges; /* first range starting after off */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->ranges[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    bool join_prev = lo > 0 && a->ranges[lo - 1].off + a->ranges[lo - 1].size == off;
    bool join_next = lo < a->n_ranges && off + size == a->ranges[lo].off;
    if (join_prev && join_next) {
        a->ranges[lo - 1].size += size + a->ranges[lo].size;
        memmove(&a->ranges[lo], &a->ranges[lo + 1], (a->n_ranges - lo - 1) * sizeof *a->ranges);
        a->n_ranges--;
    } else if (join_prev) {
        a->ranges[lo - 1].size += size;
    } else if (join_next) {
        a->ranges[lo].off = off;
        a->ranges[lo].size += size;
    } else { /* capacity was ensured by arena_take */
        memmove(&a->ranges[lo + 1], &a->ranges[lo], (a->n_ranges - lo) * sizeof *a->ranges);
        a->ranges[lo].off = off;
        a->ranges[lo].size = size;
        a->n_ranges++;
    }
    a->arena_blocks--;
}

/* ---- the cache ------------------------------------------------------------------- */

/* Whether c's stream may use b now. */
static bool usable_by(block *b, nb_gpu_ctx *c)
{
    if (b->owner == c || !b->event_pending)
        return true;
    cudaError_t e = cudaEventQuery(b->event);
    if (e == cudaSuccess) {
        b->event_pending = false;
        return true;
    }
    (void)cudaGetLastError(); /* NotReady too, so that no later launch check reports it */
    return false;
}

/* Unlinks the first block of the list at *head in [lo, hi] that c may use,
 * preferring one c freed itself (own_only: only those, with no CUDA call). */
static block *take_from(block **head, size_t lo, size_t hi, nb_gpu_ctx *c, bool sorted, bool own_only)
{
    for (int pass = 0; pass < (own_only ? 1 : 2); pass++) {
        for (block **pp = head; *pp; pp = &(*pp)->next) {
            block *b = *pp;
            if (b->size < lo)
                continue;
            if (b->size > hi) {
                if (sorted)
                    break;
                continue;
            }
            if (pass == 0 ? b->owner == c : usable_by(b, c)) {
                *pp = b->next;
                b->next = NULL;
                return b;
            }
        }
        if (c->phys->n_logical == 1)
            break; /* one stream: every block is c's */
    }
    return NULL;
}

/* The largest block a request of size (a class size) may take: the class
 * itself up to 1 MiB, up to 25% more above. */
static size_t fit_limit(size_t size)
{
    if (size <= SMALL_LIMIT)
        return size;
    size_t step = class_step(size);
    return size + size / 4 / step * step;
}

/* A cached block for c of class size, or NULL. own_only: one c freed last,
 * which c's stream may use with no wait and no CUDA call (while c's stream
 * records a step: its work before the recording comes first on that stream). */
static block *take_cached(nb_gpu_allocator *a, nb_gpu_ctx *c, size_t size, bool own_only)
{
    block *b;
    if (size <= SMALL_LIMIT)
        b = take_from(&a->small[size / SMALL_QUANTUM - 1], size, size, c, false, own_only);
    else
        b = take_from(&a->large, size, fit_limit(size), c, true, own_only);
    if (b) {
        a->cached -= b->size;
        b->recycled = true;
    }
    return b;
}

static void cache_put(nb_gpu_allocator *a, block *b)
{
    if (b->size <= SMALL_LIMIT) {
        block **head = &a->small[b->size / SMALL_QUANTUM - 1];
        b->next = *head;
        *head = b;
    } else {
        block **pp = &a->large;
        while (*pp && (*pp)->size < b->size)
            pp = &(*pp)->next;
        b->next = *pp;
        *pp = b;
    }
    a->cached += b->size;
}

/* Gives one cached block back to the arena or to CUDA. */
static cudaError_t release_block(nb_gpu_allocator *a, block *b)
{
    cudaError_t e = cudaSuccess;
    if (b->in_arena) {
        arena_put(a, b->ptr, b->size);
    } else {
        e = cudaFree(b->ptr);
        a->outside_arena -= b->size;
    }
    record_free(a, b);
    return e;
}

/* Gives every block of the list at *head back (release_block); *first
 * keeps the first failure. */
static void release_list(nb_gpu_allocator *a, block **head, cudaError_t *first)
{
    while (*head) {
        block *b = *head;
        *head = b->next;
        cudaError_t e = release_block(a, b);
        if (*first == cudaSuccess)
            *first = e;
    }
}

/* Waits for the card and gives every cached block back. The card must be
 * current. On failure *call names the CUDA call that failed. */
static cudaError_t flush_cache(nb_gpu_allocator *a, const char **call)
{
    *call = "cudaDeviceSynchronize";
    if (a->cached == 0)
        return cudaSuccess;
    /* Queued kernels may still use cached blocks; arena blocks could otherwise go
     * to another stream at once. One host wait for the card (the cudaFree calls
     * below then find it idle). */
    nb__gpu_count_card_wait(a->phys);
    cudaError_t first = cudaDeviceSynchronize();
    if (first == cudaSuccess)
        *call = "cudaFree";
    for (size_t i = 0; i < N_SMALL; i++)
        release_list(a, &a->small[i], &first);
    release_list(a, &a->large, &first);
    release_list(a, &a->retry, &first);
    a->cached = 0;
    return first;
}

/* New memory of size for c: from the arena, else from CUDA (when growth is
 * allowed). NULL with *err set: cudaErrorMemoryAllocation when there is none. */
static char *fresh_memory(nb_gpu_allocator *a, size_t size, bool recording, bool *in_arena, cudaError_t *err,
                          const char **call)
{
    char *p = arena_take(a, size);
    *in_arena = p != NULL;
    *err = cudaErrorMemoryAllocation;
    if (p)
        return p;
    if (a->arena && !a->allow_growth)
        return NULL;
    void *q = NULL;
    a->device_mallocs++;
    /* While this thread records a stream, cudaMalloc is a call the capture
     * would refuse; it queues nothing, so let it through. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    bool swapped = recording && cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    cudaError_t e = cudaMalloc(&q, size);
    if (swapped)
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e == cudaSuccess) {
        a->outside_arena += size;
        return q;
    }
    (void)cudaGetLastError();
    *err = e;
    *call = "cudaMalloc";
    return NULL;
}

static block *pool_take(nb_gpu_pool *p, size_t size);

void *nb__gpu_malloc(nb_gpu_ctx *c, size_t nbytes)
{
    nb_gpu_allocator *a = c->phys->alloc;
    size_t size = round_size(nbytes);
    if (!size)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "gpu alloc: out of memory on %s: %zu bytes is too large",
                             c->dev->name, nbytes);
    pthread_mutex_lock(&a->lock);
    nb_gpu_pool *pool = c->rec_pool;
    /* Room in the table first, so that a block once taken is always handed out. */
    bool host_oom = !table_room(a);
    /* A recording takes its pool's blocks, then cached blocks its own stream
     * freed (they become the pool's: the graph keeps them). */
    block *b = NULL;
    if (!host_oom) {
        if (!pool)
            b = take_cached(a, c, size, false);
        else if ((b = pool_take(pool, size)) != NULL)
            a->graph_held -= b->size;
        else if ((b = take_cached(a, c, size, true)) != NULL)
            b->pool = pool;
    }
    cudaError_t err = cudaSuccess;
    const char *call = "cudaMalloc";
    bool flushed = false;
    if (b) {
        a->cache_hits++;
    } else if (!host_oom && !(b = record_new(a))) { /* the record before the memory: no cudaFree to undo it */
        host_oom = true;
    } else if (!host_oom) {
        /* Every CUDA call below is for c's card; a cache hit made none, so the
         * caller need not have made it current (gpu_alloc does not). */
        int cur = -1;
        char *p = NULL;
        bool in_arena = false;
        err = cudaGetDevice(&cur);
        if (err == cudaSuccess && cur != c->ordinal)
            err = cudaSetDevice(c->ordinal);
        bool current = err == cudaSuccess;
        if (!current)
            call = "cudaSetDevice";
        else
            p = fresh_memory(a, size, pool != NULL, &in_arena, &err, &call);
        /* Emptying the cache waits for the card, which a recording cannot,
         * nor may another thread while one of the card's streams records. */
        if (!p && current && err == cudaErrorMemoryAllocation && a->cached > 0 && !pool && !a->recordings) {
            a->cache_flushes++;
            flushed = true;
            cudaError_t fe = flush_cache(a, &call);
            if (fe != cudaSuccess) {
                err = fe;
            } else {
                p = fresh_memory(a, size, pool != NULL, &in_arena, &err, &call);
            }
        }
        if (p) {
            b->ptr = p;
            b->size = size;
            b->in_arena = in_arena;
            b->pool = pool;
        } else {
            record_free(a, b);
            b = NULL;
        }
    }
    if (b) {
        table_insert(a, b);
        a->allocations++;
        b->owner = c;
        b->requested = nbytes;
        a->in_use += b->size; /* a cached large block may exceed size */
        a->requested += nbytes;
        note_peaks(a);
        pthread_mutex_unlock(&a->lock);
        return b->ptr;
    }
    bool oom = host_oom || err == cudaErrorMemoryAllocation;
    if (oom)
        a->failures++;
    size_t in_use = a->in_use, reserved = reserved_of(a), arena = a->arena_size, cached = a->cached;
    bool capped = a->arena && !a->allow_growth;
    pthread_mutex_unlock(&a->lock);

    if (host_oom)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "gpu alloc: out of host memory for the block table of %s",
                             c->dev->name);
    if (err != cudaErrorMemoryAllocation || strcmp(call, "cudaSetDevice") == 0) {
        nb__gpu_cuda_fail(err, call, c->dev->name);
        return NULL;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        (void)cudaGetLastError();
    if (capped)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY,
                             "gpu alloc: out of memory on %s allocating %zu bytes (%.2f MiB): the reserve "
                             "arena of %.2f MiB is full (%.2f MiB in use) and growth is off",
                             c->dev->name, nbytes, nbytes / MIB, arena / MIB, in_use / MIB);
    char cache_note[96] = "after emptying its cache";
    if (!flushed && cached > 0)
        snprintf(cache_note, sizeof cache_note, "with %.2f MiB cached, not emptied while a step is recorded on the card",
                 cached / MIB);
    else if (!flushed)
        snprintf(cache_note, sizeof cache_note, "with nothing cached");
    return nb__fail_null(NB_ERR_OUT_OF_MEMORY,
                         "gpu alloc: out of memory on %s allocating %zu bytes (%.2f MiB): %.2f MiB in use "
                         "and %.2f MiB reserved by nabla %s, %.2f MiB free of %.2f MiB on the card",
                         c->dev->name, nbytes, nbytes / MIB, in_use / MIB, reserved / MIB, cache_note,
                         free_b / MIB, total_b / MIB);
}

void nb__gpu_free(nb_gpu_ctx *c, void *ptr)
{
    if (!ptr)
        return;
    nb_gpu_allocator *a = c->phys->alloc;
    pthread_mutex_lock(&a->lock);
    block *b = table_remove(a, ptr);
    if (!b) {
        pthread_mutex_unlock(&a->lock);
        nb__log(NB_LOG_WARNING, "gpu free: %p was not allocated on %s (ignored)", ptr, c->dev->name);
        return;
    }
    a->in_use -= b->size;
    a->requested -= b->requested;
    b->owner = c;
    /* A recorded graph's blocks stay with it; so do the others freed while it
     * is recorded (the recording may have read them before their free). */
    nb_gpu_pool *keep = b->pool ? b->pool : c->rec_pool;
    if (keep) {
        block **list = b->pool ? &keep->free : &keep->held;
        b->next = *list;
        *list = b;
        a->graph_held += b->size;
        pthread_mutex_unlock(&a->lock);
        return;
    }
    b->event_pending = false;
    b->fenced = false;
    if (c->phys->n_logical > 1 || b->size >= NB_GPU_FENCE_BYTES) {
        /* Another stream of this card may take the block once this event
         * completes; so may the copy stream of an upload into it
         * (nb__gpu_block_fence). */
        /* free cannot fail: errors here are not recorded, only worked around. */
        int cur = -1;
        cudaError_t e = cudaGetDevice(&cur);
        /* a free may run on another library's thread (a DLPack deleter): its
         * current card is put back */
        const int restore = e == cudaSuccess && cur != c->ordinal ? cur : -1;
        if (restore >= 0)
            e = cudaSetDevice(c->ordinal);
        if (e == cudaSuccess && !b->event)
            e = cudaEventCreateWithFlags(&b->event, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventRecord(b->event, c->stream);
        if (e == cudaSuccess) {
            b->event_pending = c->phys->n_logical > 1;
            b->fenced = true;
        } else if (c->phys->n_logical == 1) {
            (void)cudaGetLastError(); /* one stream: the block is safe for it as it is */
        } else {
            /* No event: make the block safe for everyone the slow way. */
            (void)cudaGetLastError();
            nb__gpu_count_wait(c);
            (void)cudaStreamSynchronize(c->stream);
        }
        if (restore >= 0 && cudaSetDevice(restore) != cudaSuccess)
            (void)cudaGetLastError();
    }
    cache_put(a, b);
    pthread_mutex_unlock(&a->lock);
}

bool nb__gpu_block_fence(nb_gpu_ctx *c, const void *ptr, cudaStream_t waiter)
{
    nb_gpu_allocator *a = c->phys->alloc;
    bool ok = false;
    pthread_mutex_lock(&a->lock);
    block *b = NULL;
    if (a->table_cap) {
        size_t mask = a->table_cap - 1, i = slot_of(ptr, a->table_cap);
        while (a->table[i] && a->table[i]->ptr != ptr)
            i = (i + 1) & mask;
        b = a->table[i];
    }
    if (b && !b->recycled) {
        ok = true; /* fresh from CUDA or the arena, which were idle when it last went back */
    } else if (b && b->fenced) {
        ok = cudaStreamWaitEvent(waiter, b->event, 0) == cudaSuccess;
        if (!ok)
            (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&a->lock);
    return ok;
}

/* ---- pools of recorded graphs ---------------------------------------------------- */

/* A block of p fit for size (fit_limit, as the cache), unlinked; NULL when none. */
static block *pool_take(nb_gpu_pool *p, size_t size)
{
    const size_t hi = fit_limit(size);
    for (block **pp = &p->free; *pp; pp = &(*pp)->next) {
        block *b = *pp;
        if (b->size >= size && b->size <= hi) {
            *pp = b->next;
            b->next = NULL;
            return b;
        }
    }
    return NULL;
}

nb_status nb__gpu_pool_start(nb_gpu_ctx *c, nb_gpu_pool **out)
{
    nb_gpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "graph capture: out of host memory on %s", c->dev->name);
    p->ctx = c;
    nb_gpu_allocator *a = c->phys->alloc;
    pthread_mutex_lock(&a->lock);
    /* An abandoned recording's blocks start the next one's pool: a step
     * recorded again (lib/graph) needs no third set of scratch memory. */
    while (a->retry) {
        block *b = a->retry;
        a->retry = b->next;
        a->cached -= b->size;
        a->graph_held += b->size;
        b->pool = p;
        b->next = p->free;
        p->free = b;
    }
    c->rec_pool = p;
    a->recordings++;
    pthread_mutex_unlock(&a->lock);
    *out = p;
    return NB_OK;
}

void nb__gpu_pool_stop(nb_gpu_ctx *c)
{
    nb_gpu_allocator *a = c->phys->alloc;
    pthread_mutex_lock(&a->lock);
    if (c->rec_pool)
        a->recordings--;
    c->rec_pool = NULL;
    pthread_mutex_unlock(&a->lock);
}

void nb__gpu_pool_release(nb_gpu_pool *p, bool abandoned)
{
    if (!p)
        return;
    nb_gpu_allocator *a = p->ctx->phys->alloc;
    pthread_mutex_lock(&a->lock);
    for (int list = 0; list < 2; list++) {
        block *b = list ? p->held : p->free;
        while (b) {
            block *next = b->next;
            a->graph_held -= b->size;
            b->pool = NULL;
            b->owner = p->ctx;
            b->event_pending = false; /* the caller waited for the stream */
            b->fenced = false;
            b->recycled = true;
            if (abandoned) { /* idle: the caller waited */
                b->next = a->retry;
                a->retry = b;
                a->cached += b->size;
            } else {
                cache_put(a, b);
            }
            b = next;
        }
    }
    /* The pool's live blocks (a variable's value, an optimizer's slot made
     * while recording) become ordinary blocks. */
    for (size_t i = 0; i < a->table_cap; i++)
        if (a->table[i] && a->table[i]->pool == p)
            a->table[i]->pool = NULL;
    pthread_mutex_unlock(&a->lock);
    free(p);
}

/* ---- the public functions ----------------------------------------------------------- */

nb_status nb_gpu_get_memory_stats(const char *device, nb_gpu_memory_stats *out)
{
    static const char who[] = "nb_gpu_get_memory_stats";
    if (!out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
    memset(out, 0, sizeof *out);
    nb_device *dev = nb__gpu_device_named(device, who);
    if (!dev)
        return NB_ERR_DEVICE;
    nb_gpu_ctx *c = dev->ctx;
    nb_gpu_allocator *a = c->phys->alloc;
    pthread_mutex_lock(&a->lock);
    out->in_use = a->in_use;
    out->requested = a->requested;
    out->peak_in_use = a->peak_in_use;
    out->cached = a->cached;
    out->graph_held = a->graph_held;
    out->reserved = reserved_of(a);
    out->peak_reserved = a->peak_reserved;
    out->arena = a->arena_size;
    out->growth_allowed = a->allow_growth || !a->arena;
    out->allocations = a->allocations;
    out->cache_hits = a->cache_hits;
    out->device_mallocs = a->device_mallocs;
    out->cache_flushes = a->cache_flushes;
    out->failures = a->failures;
    pthread_mutex_unlock(&a->lock);
    nb_status st = nb__gpu_set_device(c->ordinal, dev->name);
    if (st) {
        memset(out, 0, sizeof *out);
        return st;
    }
    cudaError_t e = cudaMemGetInfo(&out->device_free, &out->device_total);
    if (e != cudaSuccess) {
        memset(out, 0, sizeof *out);
        return nb__gpu_cuda_fail(e, "cudaMemGetInfo", dev->name);
    }
    return NB_OK;
}

nb_status nb_gpu_reset_peak_memory(const char *device)
{
    nb_device *dev = nb__gpu_device_named(device, "nb_gpu_reset_peak_memory");
    if (!dev)
        return NB_ERR_DEVICE;
    nb_gpu_allocator *a = ((nb_gpu_ctx *)dev->ctx)->phys->alloc;
    pthread_mutex_lock(&a->lock);
    a->peak_in_use = a->in_use;
    a->peak_reserved = reserved_of(a);
    pthread_mutex_unlock(&a->lock);
    return NB_OK;
}

static nb_status empty_one(nb_gpu_phys *p)
{
    nb_gpu_allocator *a = p->alloc;
    const char *name = p->first ? p->first->dev->name : "/gpu:?";
    pthread_mutex_lock(&a->lock);
    const bool empty = a->cached == 0;
    pthread_mutex_unlock(&a->lock);
    if (empty)
        return NB_OK;
    /* before the lock: a failure calls the error handler, which may ask the allocator */
    nb_status st = nb__gpu_set_device(p->ordinal, name);
    if (st)
        return st;
    pthread_mutex_lock(&a->lock);
    if (a->cached > 0 && a->recordings) {
        pthread_mutex_unlock(&a->lock);
        return nb__fail(NB_ERR_UNSUPPORTED, "nb_gpu_empty_cache: a step is being recorded on %s's card", name);
    }
    const char *call = "";
    cudaError_t e = a->cached > 0 ? flush_cache(a, &call) : cudaSuccess;
    pthread_mutex_unlock(&a->lock);
    return e != cudaSuccess ? nb__gpu_cuda_fail(e, call, name) : NB_OK;
}

nb_status nb_gpu_empty_cache(const char *device)
{
    if (!device) {
        /* Every card; a card never used has nothing cached and is not touched. */
        (void)nb_device_count(NB_DEVICE_GPU); /* make sure discovery ran */
        for (int i = 0; i < nb__gpu_phys_count(); i++) {
            nb_status st = empty_one(nb__gpu_phys_at(i));
            if (st)
                return st;
        }
        return NB_OK;
    }
    nb_device *dev = nb__gpu_device_named(device, "nb_gpu_empty_cache");
    if (!dev)
        return NB_ERR_DEVICE;
    return empty_one(((nb_gpu_ctx *)dev->ctx)->phys);
}

nb_status nb_gpu_set_reserve(const char *device, size_t bytes, bool allow_growth)
{
    static const char who[] = "nb_gpu_set_reserve";
    nb_device *dev = nb__gpu_device_named(device, who);
    if (!dev)
        return NB_ERR_DEVICE;
    nb_gpu_ctx *c = dev->ctx;
    nb_gpu_allocator *a = c->phys->alloc;
    nb_status st = nb__gpu_set_device(c->ordinal, dev->name);
    if (st)
        return st;
    size_t size = 0;
    if (bytes > 0 && !(size = round_size(bytes < LARGE_QUANTUM ? LARGE_QUANTUM : bytes)))
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %zu bytes is too large for %s", who, bytes, dev->name);

    pthread_mutex_lock(&a->lock);
    if (a->recordings) {
        pthread_mutex_unlock(&a->lock);
        return nb__fail(NB_ERR_UNSUPPORTED, "%s: a step is being recorded on %s's card", who, dev->name);
    }
    cudaError_t e = cudaSuccess;
    const char *call = "cudaMalloc";
    if (a->arena) {
        /* Cached arena blocks go back to the arena (and the others to CUDA). */
        e = flush_cache(a, &call);
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&a->lock);
            return nb__gpu_cuda_fail(e, call, dev->name);
        }
        if (a->arena_blocks > 0) {
            size_t live = a->arena_blocks;
            pthread_mutex_unlock(&a->lock);
            return nb__fail(NB_ERR_INVALID_ARGUMENT,
                            "%s: the reserve arena of %s still holds %zu live blocks; free them first", who,
                            dev->name, live);
        }
    }
    /* The old arena goes first, so that its memory can make the new one. */
    cudaError_t freed = cudaSuccess;
    if (a->arena) {
        nb__gpu_count_card_wait(a->phys); /* cudaFree waits for the card */
        freed = cudaFree(a->arena);
        if (freed != cudaSuccess)
            (void)cudaGetLastError();
        a->arena = NULL;
        a->arena_size = 0;
        a->n_ranges = 0;
        a->allow_growth = true;
    }
    void *fresh = NULL;
    if (size) {
        e = cudaMalloc(&fresh, size);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            a->cache_flushes++;
            e = flush_cache(a, &call);
            if (e == cudaSuccess) {
                call = "cudaMalloc";
                e = cudaMalloc(&fresh, size);
            }
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            pthread_mutex_unlock(&a->lock);
            if (e == cudaErrorMemoryAllocation)
                return nb__fail(NB_ERR_OUT_OF_MEMORY,
                                "%s: out of memory on %s reserving %zu bytes (%.2f MiB); there is no reserve now, "
                                "memory is taken as needed", who, dev->name, size, size / MIB);
            return nb__gpu_cuda_fail(e, call, dev->name);
        }
        a->device_mallocs++;
    }
    e = freed;
    a->arena = fresh;
    a->arena_size = size;
    a->n_ranges = 0;
    a->arena_blocks = 0;
    if (size) {
        if (!a->ranges) {
            a->ranges = malloc(64 * sizeof *a->ranges);
            a->cap_ranges = a->ranges ? 64 : 0;
        }
        if (a->ranges) {
            a->ranges[0].off = 0;
            a->ranges[0].size = size;
            a->n_ranges = 1;
        }
    }
    a->allow_growth = size ? allow_growth : true;
    note_peaks(a);
    pthread_mutex_unlock(&a->lock);
    return e == cudaSuccess ? NB_OK : nb__gpu_cuda_fail(e, "cudaFree", dev->name);
}
