/* Planning elementwise chains for fusion (fusion.h). */
#include "fusion.h"

static bool same_shape(const nb_view *a, const nb_view *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* The same elements in the same order (strides of size-1 dims do not count). */
static bool same_view(const nb_view *a, const nb_view *b)
{
    if (a->data != b->data || a->dtype != b->dtype)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] > 1 && a->strides[d] != b->strides[d])
            return false;
    return true;
}

bool nb__fuse_same_place(const nb_view *a, const nb_view *b)
{
    return a && b && same_shape(a, b) && same_view(a, b);
}

static void span(const nb_view *v, char **lo, char **hi)
{
    char *l = v->data, *h = (char *)v->data + nb_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++) {
        int64_t reach = (v->shape[d] - 1) * v->strides[d];
        if (reach < 0)
            l += reach;
        else
            h += reach;
    }
    *lo = l, *hi = h;
}

/* The slot of v in p, added if new; -1 where v shares memory with a slot it
 * is not the same view as, or the slots are full. */
static int slot_of(nb_fuse_plan *p, int max_slots, const nb_view *v, bool write)
{
    for (int i = 0; i < p->n_slots; i++)
        if (same_view(&p->slots[i].v, v))
            return i;
    char *lo, *hi;
    span(v, &lo, &hi);
    for (int i = 0; i < p->n_slots; i++)
        if (lo < p->slots[i].hi && p->slots[i].lo < hi)
            return -1;
    if (p->n_slots == max_slots)
        return -1;
    p->slots[p->n_slots] = (nb_fuse_slot){.v = *v, .lo = lo, .hi = hi, .first_write = write};
    return p->n_slots++;
}

/* Adds c to the chain, or leaves p as it was and returns false. */
static bool add_call(nb_fuse_plan *p, int max_slots, const nb_fuse_call *c, const nb_view *shape)
{
    if (p->n_steps == NB_FUSE_MAX_CALLS)
        return false;
    nb_fuse_step s = {.kind = c->kind, .op = c->op, .alpha = c->alpha};
    const nb_view *ops[4] = {c->out, c->x, c->y, NULL};
    switch (c->kind) {
    case NB_FUSE_FILL: s.n_ops = 1; break;
    case NB_FUSE_UNARY: case NB_FUSE_COPY: s.n_ops = 2; break;
    case NB_FUSE_BINARY: s.n_ops = 3; break;
    case NB_FUSE_WHERE:
        s.n_ops = 4;
        ops[1] = c->cond, ops[2] = c->x, ops[3] = c->y;
        break;
    default: return false;
    }
    for (int o = 0; o < s.n_ops; o++)
        if (!ops[o] || !same_shape(ops[o], shape))
            return false;
    int n_slots = p->n_slots;
    /* reads first: an in-place call reads its output's slot before it writes it */
    for (int o = s.n_ops - 1; o >= 0; o--) {
        if ((s.slot[o] = slot_of(p, max_slots, ops[o], o == 0)) < 0) {
            p->n_slots = n_slots;
            return false;
        }
    }
    p->steps[p->n_steps++] = s;
    return true;
}

/* The longest head of calls[0 .. n) that adds to the chain (k calls). */
static int plan_head(const nb_fuse_call *calls, int n, int max_slots, nb_fuse_supported_fn supported, void *user,
                     nb_fuse_plan *p)
{
    if (max_slots > NB_FUSE_MAX_SLOTS)
        max_slots = NB_FUSE_MAX_SLOTS;
    p->n_steps = p->n_slots = p->n_internal = 0;
    p->fed = -1;
    if (n < 1 || !calls[0].out || calls[0].out->numel <= 0)
        return 0;
    int k = 0;
    while (k < n && supported(user, &calls[k]) && add_call(p, max_slots, &calls[k], calls[0].out))
        k++;
    return k;
}

/* Marks the results written first and dead after call number last internal;
 * returns the last such slot (-1: none) and their count in *n_written. */
static int mark_internal(nb_fuse_plan *p, nb_fuse_dead_fn dead, void *user, int64_t last, int *n_written)
{
    int last_written = -1;
    *n_written = 0;
    for (int i = 0; i < p->n_slots; i++) {
        nb_fuse_slot *sl = &p->slots[i];
        if (sl->first_write)
            last_written = i, (*n_written)++;
        sl->internal = sl->first_write && dead(user, &sl->v, last);
        p->n_internal += sl->internal;
    }
    return last_written;
}

int nb__fuse_plan(const nb_fuse_call *calls, int n, int max_slots, nb_fuse_supported_fn supported,
                  nb_fuse_dead_fn dead, void *user, nb_fuse_plan *p)
{
    int k = plan_head(calls, n, max_slots, supported, user, p);
    if (k < 2) {
        p->n_steps = p->n_slots = 0;
        return 0;
    }
    int n_written;
    int last_written = mark_internal(p, dead, user, calls[k - 1].index, &n_written);
    if (n_written > 0 && p->n_internal == n_written) { /* nothing would be seen: keep the last result */
        p->slots[last_written].internal = false;
        p->n_internal--;
    }
    return k;
}

int nb__fuse_plan_feed(const nb_fuse_call *calls, int n, int max_slots, nb_fuse_supported_fn supported,
                       nb_fuse_dead_fn dead, void *user, const nb_fuse_feed *feed, nb_fuse_plan *p)
{
    if (plan_head(calls, n, max_slots, supported, user, p) != n)
        goto none;
    int x = -1;
    for (int i = 0; i < p->n_slots; i++)
        if (nb__fuse_same_place(&p->slots[i].v, feed->x))
            x = i;
    if (x < 0 || !p->slots[x].first_write || !nb__view_is_contiguous(feed->x) ||
        !dead(user, feed->x, feed->index))
        goto none;
    char *lo, *hi;
    span(feed->out, &lo, &hi);
    for (int i = 0; i < p->n_slots; i++)
        if (lo < p->slots[i].hi && p->slots[i].lo < hi)
            goto none;
    int n_written;
    mark_internal(p, dead, user, calls[n - 1].index, &n_written);
    /* x is read by the reduction, so it is not dead after the chain: the
     * reduction's result is what is seen, and x is never stored */
    p->fed = x;
    return n;
none:
    p->n_steps = p->n_slots = p->n_internal = 0;
    p->fed = -1;
    return 0;
}
