/* CPU memory: a caching allocator and host copies.
 *
 * Requests are rounded up to a size class (multiples of 64 up to 256 bytes, then
 * four classes per power of two, so at most 25% slack) and served 64-byte
 * aligned. A freed block goes to the freeing thread's cache for its class (so
 * the same sizes allocated again never reach malloc); when that cache holds
 * more than NB_CPU_THREAD_CACHE bytes, the block goes to the global cache
 * (mutex), and past NB_CPU_GLOBAL_CACHE bytes back to the system. A thread's
 * cache moves to the global one when the thread exits. Blocks above 64 MiB are
 * never cached. Blocks from 8 MiB ask for huge pages. Storage may be freed on another thread than it was allocated:
 * blocks of one class are interchangeable. */
#include "cpu_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define NB_CPU_ALIGN 64
/* Under AddressSanitizer nothing is cached, so a use after free is caught. */
#if NB_ASAN
#define NB_CPU_MAX_CACHED ((size_t)0)
#else
#define NB_CPU_MAX_CACHED ((size_t)64 << 20)
#endif
#define NB_CPU_THREAD_CACHE ((size_t)64 << 20)
#define NB_CPU_GLOBAL_CACHE ((size_t)1 << 30)
/* classes 0..3: 64..256; then 4 per power of two from (256, 512] to (32, 64] MiB */
#define NB_CPU_CLASSES (4 + 4 * 18)

typedef struct block {
    struct block *next;
} block;

typedef struct thread_cache {
    block *head[NB_CPU_CLASSES];
    size_t bytes;
} thread_cache;

static struct {
    pthread_mutex_t lock;
    block *head[NB_CPU_CLASSES];
    size_t bytes;
} g_cache = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

static atomic_int_fast64_t g_system_allocs, g_system_frees;

static _Thread_local thread_cache *tl_cache;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

/* Size class of a request of n bytes (n <= 64 MiB) and the class's block size. */
static inline int size_class(size_t n, size_t *size)
{
    if (n <= 256) {
        int c = n == 0 ? 0 : (int)((n - 1) >> 6);
        *size = (size_t)(c + 1) << 6;
        return c;
    }
    size_t m = n - 1;
    int e = 63 - __builtin_clzll((unsigned long long)m); /* 2^e <= m < 2^(e+1), e >= 8 */
    int sub = (int)((m >> (e - 2)) & 3);
    *size = (size_t)(5 + sub) << (e - 2);
    return 4 + (e - 8) * 4 + sub;
}

/* Blocks of at least NB_CPU_HUGE bytes (whose size classes are whole huge
 * pages already) start on a 2 MiB boundary and ask for transparent huge pages
 * (where the system has them in madvise mode): a new 128 MiB tensor then
 * takes 64 page faults instead of 32768 (exp of 16M doubles into a new
 * tensor, two threads: 63 -> 48 ms). */
#define NB_CPU_HUGE ((size_t)8 << 20)
#define NB_CPU_HUGE_PAGE ((size_t)2 << 20)

static void *system_alloc(size_t size)
{
    void *p;
#ifdef MADV_HUGEPAGE
    if (size >= NB_CPU_HUGE && !NB_ASAN) {
        p = aligned_alloc(NB_CPU_HUGE_PAGE, (size + NB_CPU_HUGE_PAGE - 1) / NB_CPU_HUGE_PAGE * NB_CPU_HUGE_PAGE);
        if (p)
            (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: refused, the pages are small */
    } else
#endif
        p = aligned_alloc(NB_CPU_ALIGN, size);
    if (p)
        atomic_fetch_add_explicit(&g_system_allocs, 1, memory_order_relaxed);
    return p;
}

static void system_free(void *p)
{
    atomic_fetch_add_explicit(&g_system_frees, 1, memory_order_relaxed);
    free(p);
}

static inline size_t class_size(int c)
{
    if (c < 4)
        return (size_t)(c + 1) << 6;
    int e = (c - 4) / 4 + 8, sub = (c - 4) % 4;
    return (size_t)(5 + sub) << (e - 2);
}

/* Moves a whole thread cache to the global cache (or the system, past its cap). */
static void flush_to_global(thread_cache *tc)
{
    pthread_mutex_lock(&g_cache.lock);
    for (int c = 0; c < NB_CPU_CLASSES; c++) {
        size_t size = class_size(c);
        while (tc->head[c]) {
            block *b = tc->head[c];
            tc->head[c] = b->next;
            if (g_cache.bytes + size <= NB_CPU_GLOBAL_CACHE) {
                b->next = g_cache.head[c];
                g_cache.head[c] = b;
                g_cache.bytes += size;
            } else {
                system_free(b);
            }
        }
    }
    tc->bytes = 0;
    pthread_mutex_unlock(&g_cache.lock);
}

static void thread_exit(void *arg)
{
    thread_cache *tc = arg;
    if (tc == tl_cache)
        tl_cache = NULL;
    flush_to_global(tc);
    free(tc);
}

static void key_init(void) { (void)pthread_key_create(&g_key, thread_exit); }

static thread_cache *get_cache(void)
{
    thread_cache *tc = tl_cache;
    if (tc)
        return tc;
    pthread_once(&g_key_once, key_init);
    tc = calloc(1, sizeof *tc);
    if (!tc)
        return NULL;
    if (pthread_setspecific(g_key, tc) != 0) {
        free(tc);
        return NULL;
    }
    tl_cache = tc;
    return tc;
}

void *nb__cpu_alloc_quiet(size_t nbytes)
{
    if (nbytes > NB_CPU_MAX_CACHED) {
        size_t size = (nbytes + NB_CPU_ALIGN - 1) & ~(size_t)(NB_CPU_ALIGN - 1);
        void *p = size >= nbytes ? system_alloc(size) : NULL;
        if (!p) {
            nb__cpu_alloc_trim();
            p = size >= nbytes ? system_alloc(size) : NULL;
        }
        return p;
    }
    size_t size;
    int c = size_class(nbytes, &size);
    thread_cache *tc = tl_cache ? tl_cache : get_cache();
    if (tc && tc->head[c]) {
        block *b = tc->head[c];
        tc->head[c] = b->next;
        tc->bytes -= size;
        return b;
    }
    pthread_mutex_lock(&g_cache.lock);
    block *b = g_cache.head[c];
    if (b) {
        g_cache.head[c] = b->next;
        g_cache.bytes -= size;
    }
    pthread_mutex_unlock(&g_cache.lock);
    if (b)
        return b;
    void *p = system_alloc(size);
    if (!p) {
        nb__cpu_alloc_trim();
        p = system_alloc(size);
    }
    return p;
}

void *nb__cpu_alloc(nb_device *dev, size_t nbytes)
{
    void *p = nb__cpu_alloc_quiet(nbytes);
    if (!p)
        nb__fail(NB_ERR_OUT_OF_MEMORY, "cpu alloc: out of memory allocating %zu bytes on %s",
                 nbytes, nb__cpu_dev_name(dev));
    return p;
}

void nb__cpu_free(nb_device *dev, void *ptr, size_t nbytes)
{
    (void)dev;
    if (!ptr || nb__cpu_graph_keeps(ptr)) /* a recorded step's lists still use it */
        return;
    if (nbytes > NB_CPU_MAX_CACHED) {
        system_free(ptr);
        return;
    }
    size_t size;
    int c = size_class(nbytes, &size);
    block *b = ptr;
    thread_cache *tc = tl_cache ? tl_cache : get_cache();
    if (tc && tc->bytes + size <= NB_CPU_THREAD_CACHE) {
        b->next = tc->head[c];
        tc->head[c] = b;
        tc->bytes += size;
        return;
    }
    pthread_mutex_lock(&g_cache.lock);
    if (g_cache.bytes + size <= NB_CPU_GLOBAL_CACHE) {
        b->next = g_cache.head[c];
        g_cache.head[c] = b;
        g_cache.bytes += size;
        b = NULL;
    }
    pthread_mutex_unlock(&g_cache.lock);
    if (b)
        system_free(b);
}

nb_cpu_alloc_stats nb__cpu_alloc_stats(void)
{
    nb_cpu_alloc_stats s;
    s.system_allocs = (int64_t)atomic_load(&g_system_allocs);
    s.system_frees = (int64_t)atomic_load(&g_system_frees);
    pthread_mutex_lock(&g_cache.lock);
    s.cached_bytes = (int64_t)g_cache.bytes;
    pthread_mutex_unlock(&g_cache.lock);
    return s;
}

void nb__cpu_alloc_trim(void)
{
    if (tl_cache)
        flush_to_global(tl_cache);
    pthread_mutex_lock(&g_cache.lock);
    for (int c = 0; c < NB_CPU_CLASSES; c++) {
        while (g_cache.head[c]) {
            block *b = g_cache.head[c];
            g_cache.head[c] = b->next;
            system_free(b);
        }
    }
    g_cache.bytes = 0;
    pthread_mutex_unlock(&g_cache.lock);
}

/* ---- copies ------------------------------------------------------------------------ */

typedef struct copy_job {
    char *dst;
    const char *src;
} copy_job;

static void copy_range(void *ctx, int64_t begin, int64_t end)
{
    const copy_job *j = ctx;
    memcpy(j->dst + begin, j->src + begin, (size_t)(end - begin));
}

static void copy_bytes(void *dst, const void *src, size_t nbytes)
{
    if (nbytes == 0 || dst == src)
        return;
    if (nbytes < ((size_t)8 << 20)) {
        memcpy(dst, src, nbytes);
        return;
    }
    copy_job j = {dst, src};
    nb__parallel_for((int64_t)nbytes, (int64_t)4 << 20, copy_range, &j);
}

nb_status nb__cpu_copy_from_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    (void)dev;
    copy_bytes(dst, src, nbytes);
    return NB_OK;
}

nb_status nb__cpu_copy_to_host(nb_device *dev, void *dst, const void *src, size_t nbytes)
{
    (void)dev;
    copy_bytes(dst, src, nbytes);
    return NB_OK;
}

nb_status nb__cpu_copy_between(nb_device *dev, void *dst, nb_device *src_dev, const void *src,
                               size_t nbytes)
{
    (void)dev;
    /* From another kind of device: its backend knows how to reach host memory. */
    if (src_dev && src_dev->backend && src_dev->backend != &nb__cpu_backend)
        return src_dev->backend->copy_to_host(src_dev, dst, src, nbytes);
    copy_bytes(dst, src, nbytes);
    return NB_OK;
}

nb_status nb__cpu_synchronize(nb_device *dev)
{
    (void)dev;
    return NB_OK;
}
