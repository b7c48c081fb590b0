/* Scopes: per-thread stacks of owned tensor references (and tapes). */
#include "core.h"

#include <stdlib.h>
#include <string.h>

struct nb_scope {
    nb_scope *parent;
    nb_tensor **items;
    int64_t n, cap;
    nb_tape **tapes;
    int n_tapes, cap_tapes;
    bool open;
};

static _Thread_local nb_scope *tl_top;
/* Ended scopes are kept for reuse so a training loop allocates nothing. */
static _Thread_local nb_scope *tl_spare;

void nb__tape_free_from_scope(nb_tape *tape); /* tape/tape.c */

nb_scope *nb_scope_begin(void)
{
    nb_scope *s = tl_spare;
    if (s) {
        tl_spare = s->parent;
    } else {
        nb__thread_track();
        s = calloc(1, sizeof *s);
        if (!s)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_scope_begin: out of host memory");
    }
    s->parent = tl_top;
    s->n = 0;
    s->n_tapes = 0;
    s->open = true;
    tl_top = s;
    return s;
}

static void scope_close_top(void)
{
    nb_scope *s = tl_top;
    /* Tapes first: they hold references to tensors of this scope. */
    for (int i = s->n_tapes - 1; i >= 0; i--)
        if (s->tapes[i])
            nb__tape_free_from_scope(s->tapes[i]);
    s->n_tapes = 0;
    for (int64_t i = s->n - 1; i >= 0; i--)
        nb__release(s->items[i]);
    s->n = 0;
    s->open = false;
    tl_top = s->parent;
    s->parent = tl_spare;
    tl_spare = s;
}

nb_status nb_scope_end(nb_scope *s)
{
    nb_scope *p = tl_top;
    while (p && p != s)
        p = p->parent;
    if (!s || !p)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_scope_end: scope is not open on this thread");
    while (tl_top != s)
        scope_close_top();
    scope_close_top();
    return NB_OK;
}

static bool scope_push(nb_scope *s, nb_tensor *t)
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
    if (t && tl_top && !scope_push(tl_top, t)) {
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
    for (nb_scope *s = tl_top; s; s = s->parent) {
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

nb_scope *nb__scope_adopt_tape(nb_tape *tape)
{
    nb_scope *s = tl_top;
    if (!s)
        return NULL;
    if (s->n_tapes == s->cap_tapes) {
        int cap = s->cap_tapes ? s->cap_tapes * 2 : 4;
        nb_tape **tapes = realloc(s->tapes, sizeof *tapes * (size_t)cap);
        if (!tapes)
            return NULL;
        s->tapes = tapes;
        s->cap_tapes = cap;
    }
    s->tapes[s->n_tapes++] = tape;
    return s;
}

void nb__scope_forget_tape(nb_scope *s, nb_tape *tape)
{
    if (!s || !s->open)
        return;
    for (int i = 0; i < s->n_tapes; i++)
        if (s->tapes[i] == tape)
            s->tapes[i] = NULL;
}

void nb__scope_spares_drain(void)
{
    while (tl_spare) {
        nb_scope *s = tl_spare;
        tl_spare = s->parent;
        free(s->items);
        free(s->tapes);
        free(s);
    }
}

/* The main thread's spares at process exit (other threads drain at their exit). */
__attribute__((destructor)) static void scope_cleanup(void) { nb__scope_spares_drain(); }
