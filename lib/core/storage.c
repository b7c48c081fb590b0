/* Storage blocks: pooled headers around memory from the device's allocator. */
#include "core.h"
#include "backend.h"
#include "op_phases.h"

#include <stdlib.h>

/* Under AddressSanitizer nothing is pooled, so a use after release is caught. */
#if NB_ASAN
#define NB_STORAGE_POOL_MAX 0
#else
#define NB_STORAGE_POOL_MAX 4096
#endif
/* One thread-local for the pool, so that a function reaches all of it through
 * one TLS access (in the shared library each is a call). */
static _Thread_local struct {
    nb_storage *head;
    int n;
} tl_pool;

/* A header from this thread's pool, or from malloc when the pool is empty,
 * with one reference and every field set. Returns NULL (error recorded) when
 * out of host memory; the caller owns the header. */
static nb_storage *header_take(nb_device *dev, void *data, size_t nbytes, bool external,
                               void (*release)(void *ctx), void *ctx)
{
    nb_storage *s = tl_pool.head;
    if (s) {
        tl_pool.head = s->next_free;
        tl_pool.n--;
    } else if (!(s = malloc(sizeof *s))) {
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "storage: out of host memory");
    }
    atomic_init(&s->refs, 1);
    s->data = data;
    s->nbytes = nbytes;
    s->device = dev;
    s->next_free = NULL;
    s->external = external;
    s->release = release;
    s->release_ctx = ctx;
    __atomic_store_n(&s->stale, false, __ATOMIC_RELAXED);
    return s;
}

nb_storage *nb__storage_new(nb_device *dev, size_t nbytes)
{
    nb_storage *s = header_take(dev, NULL, nbytes, false, NULL, NULL);
    if (!s)
        return NULL;
    int phase = nb__phase_enter(NB_PHASE_ALLOC);
    s->data = dev->backend->alloc(dev, nbytes);
    nb__phase_leave(phase);
    if (!s->data) {
        free(s);
        return NULL; /* the allocator recorded the error */
    }
    return s;
}

nb_storage *nb__storage_wrap(nb_device *dev, void *data, size_t nbytes, void (*release)(void *ctx), void *ctx)
{
    return header_take(dev, data, nbytes, true, release, ctx);
}

void nb__storage_pool_drain(void)
{
    while (tl_pool.head) {
        nb_storage *s = tl_pool.head;
        tl_pool.head = s->next_free;
        free(s);
    }
    tl_pool.n = 0;
}

void nb__storage_release(nb_storage *s)
{
    if (!s || !nb__drop_ref(&s->refs))
        return;
    if (!s->external) {
        int phase = nb__phase_enter(NB_PHASE_FREE);
        s->device->backend->free(s->device, s->data, s->nbytes);
        nb__phase_leave(phase);
    }
    else if (s->release)
        s->release(s->release_ctx);
    if (tl_pool.n < NB_STORAGE_POOL_MAX) {
        if (tl_pool.n == 0)
            nb__thread_track();
        s->next_free = tl_pool.head;
        tl_pool.head = s;
        tl_pool.n++;
    } else {
        free(s);
    }
}
