/* Scopes: per-thread stacks of owned tensor references (and other objects, such
 * as tapes, that a scope frees as it ends).
 *
 * A handle is not a pointer to the frame: frames are pooled for reuse, so a
 * pointer would name a new scope after the old one ended. The handle is the
 * scope's generation instead, unique across threads for the process's life, and
 * a stale or foreign handle matches no open frame. */
#include "core.h"
#include "op_phases.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct scope_object {
    void *obj;
    void (*destroy)(void *obj);
} scope_object;

struct nb__scope_frame {
    nb__scope_frame *parent;
    nb_tensor **items;
    int64_t n, cap;
    scope_object *objs;
    int n_objs, cap_objs;
    uintptr_t gen; /* the handle; 0 while pooled */
};

static _Thread_local nb__scope_frame *tl_top;
/* Ended frames are kept for reuse so a training loop allocates nothing. */
static _Thread_local nb__scope_frame *tl_spare;
static atomic_uintptr_t next_gen = 1;

static nb_scope *handle_of(const nb__scope_frame *f) { return (nb_scope *)f->gen; }

nb_scope *nb_scope_begin(void)
{
    nb__scope_frame *s = tl_spare;
    if (s) {
        tl_spare = s->parent;
    } else {
        nb__thread_track();
        s = calloc(1, sizeof *s);
        if (!s)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_scope_begin: out of host memory");
    }
    uintptr_t gen = atomic_fetch_add_explicit(&next_gen, 1, memory_order_relaxed);
    if (gen == 0) /* wrapped (only conceivable with a 32-bit uintptr_t): skip the null handle */
        gen = atomic_fetch_add_explicit(&next_gen, 1, memory_order_relaxed);
    s->parent = tl_top;
    s->n = 0;
    s->n_objs = 0;
    s->gen = gen;
    tl_top = s;
    return handle_of(s);
}

static void scope_close_top(void)
{
    nb__scope_frame *s = tl_top;
    /* Objects first: a tape holds references to tensors of this scope. */
    for (int i = s->n_objs - 1; i >= 0; i--)
        if (s->objs[i].obj)
            s->objs[i].destroy(s->objs[i].obj);
    s->n_objs = 0;
    for (int64_t i = s->n - 1; i >= 0; i--)
        nb__release(s->items[i]);
    s->n = 0;
    s->gen = 0;
    tl_top = s->parent;
    s->parent = tl_spare;
    tl_spare = s;
}

static nb_status scope_end(nb_scope *handle)
{
    nb__scope_frame *p = tl_top;
    while (p && (!handle || handle_of(p) != handle))
        p = p->parent;
    if (!p)
        return nb__fail(NB_ERR_INVALID_ARGUMENT,
                        handle ? "nb_scope_end: scope is not open on this thread (ended already, or begun on another thread)"
                               : "nb_scope_end: scope is NULL");
    while (tl_top != p)
        scope_close_top();
    scope_close_top();
    return NB_OK;
}

nb_status nb_scope_end(nb_scope *handle)
{
    int phase = nb__phase_enter(NB_PHASE_SCOPE);
    nb_status st = scope_end(handle);
    nb__phase_leave(phase);
    return st;
}

static bool scope_push(nb__scope_frame *s, nb_tensor *t)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        nb_tensor **items = realloc(s->items, sizeof *items * (size_t)cap);
        if (!items)
            return false;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = t;
    return true;
}

nb_tensor *nb__own(nb_tensor *t)
{
    int phase = nb__phase_enter(NB_PHASE_SCOPE);
    bool kept = !t || !tl_top || scope_push(tl_top, t);
    nb__phase_leave(phase);
    if (!kept) {
        nb__release(t);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "scope: out of host memory");
    }
    return t;
}

nb_tensor *nb_retain(nb_tensor *t)
{
    if (!t)
        return NULL;
    nb__retain(t);
    return nb__own(t);
}

nb_tensor *nb_keep(nb_tensor *t)
{
    if (!t)
        return NULL;
    if (!tl_top)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_keep: no scope is open");
    /* Search from the innermost scope and its newest entries: a kept tensor is
     * usually a recent result. */
    for (nb__scope_frame *s = tl_top; s; s = s->parent) {
        for (int64_t i = s->n - 1; i >= 0; i--) {
            if (s->items[i] != t)
                continue;
            memmove(s->items + i, s->items + i + 1, sizeof *s->items * (size_t)(s->n - i - 1));
            s->n--;
            if (s->parent && !scope_push(s->parent, t)) {
                nb__release(t);
                return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_keep: out of host memory");
            }
            return t;
        }
    }
    return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_keep: tensor is not owned by an open scope of this thread");
}

nb__scope_frame *nb__scope_adopt(void *obj, void (*destroy)(void *obj))
{
    nb__scope_frame *s = tl_top;
    if (!s)
        return NULL;
    if (s->n_objs == s->cap_objs) {
        int cap = s->cap_objs ? s->cap_objs * 2 : 4;
        scope_object *objs = realloc(s->objs, sizeof *objs * (size_t)cap);
        if (!objs)
            return NULL;
        s->objs = objs;
        s->cap_objs = cap;
    }
    s->objs[s->n_objs++] = (scope_object){obj, destroy};
    return s;
}

void nb__scope_forget(nb__scope_frame *s, const void *obj)
{
    if (!s || !s->gen)
        return;
    for (int i = 0; i < s->n_objs; i++)
        if (s->objs[i].obj == obj)
            s->objs[i].obj = NULL;
}

void nb__scope_spares_drain(void)
{
    while (tl_spare) {
        nb__scope_frame *s = tl_spare;
        tl_spare = s->parent;
        free(s->items);
        free(s->objs);
        free(s);
    }
}

/* The main thread's spares at process exit (other threads drain at their exit). */
__attribute__((destructor)) static void scope_cleanup(void) { nb__scope_spares_drain(); }
