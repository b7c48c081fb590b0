/* Elementwise chains of a recorded CPU step, planned and run as one pass (see
 * cpu_fuse.h). */
#include "cpu_fuse.h"

#include <stdlib.h>

enum {
    FUSE_MAX_CALLS = 32,
    FUSE_MAX_SLOTS = NB_CPU_MAX_OPS, /* distinct operands; each becomes an iteration operand or a tile */
    FUSE_TILE = 256,                 /* elements per tile: 2 KiB a slot at 8 bytes, all tiles in L1 */
};

/* A distinct operand of the chain: where its elements live while a tile runs. */
typedef struct slot {
    nb_view v;
    char *lo, *hi;     /* the bytes it spans */
    bool first_write;  /* the chain writes it before it reads it */
    int ext;           /* >= 0: operand ext of the iteration (memory) */
    int tile;          /* >= 0: tile buffer (never written to memory) */
} slot;

typedef struct step {
    nb_cpu_loop_fn fn;
    void *arg;     /* un or fill, or NULL: what fn reads as its context */
    nb_cpu_un_ctx un;
    nb_cpu_fill_ctx fill;
    int n_ops;     /* out[, x[, y]] */
    int slot[3];
} step;

struct nb_cpu_fused {
    nb_cpu_iter it; /* over the slots kept in memory */
    bool heavy;
    int n_steps, n_slots, n_tiles;
    step steps[FUSE_MAX_CALLS];
    slot slots[FUSE_MAX_SLOTS];
};

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

static void span(const nb_view *v, char **lo, char **hi)
{
    char *l = v->data, *h = (char *)v->data + nb__cpu_esize(v->dtype);
    for (int d = 0; d < v->ndim; d++) {
        int64_t reach = (v->shape[d] - 1) * v->strides[d];
        if (reach < 0)
            l += reach;
        else
            h += reach;
    }
    *lo = l, *hi = h;
}

/* The slot of v among f's, added if new; -1 where v shares memory with a slot
 * it is not the same view as, or the slots are full. */
static int slot_of(nb_cpu_fused *f, const nb_view *v, bool write)
{
    for (int i = 0; i < f->n_slots; i++)
        if (same_view(&f->slots[i].v, v))
            return i;
    char *lo, *hi;
    span(v, &lo, &hi);
    for (int i = 0; i < f->n_slots; i++)
        if (lo < f->slots[i].hi && f->slots[i].lo < hi)
            return -1;
    if (f->n_slots == FUSE_MAX_SLOTS)
        return -1;
    f->slots[f->n_slots] = (slot){.v = *v, .lo = lo, .hi = hi, .first_write = write, .ext = -1, .tile = -1};
    return f->n_slots++;
}

/* Adds c to the chain, or leaves f as it was and returns false. */
static bool add_call(nb_cpu_fused *f, const nb_cpu_fuse_call *c, const nb_view *shape)
{
    step s = {.n_ops = c->kind == NB_CPU_FUSE_BINARY ? 3 : c->kind == NB_CPU_FUSE_UNARY ? 2 : 1};
    bool heavy = false;
    if (c->kind == NB_CPU_FUSE_BINARY)
        s.fn = nb__cpu_binary_loop((nb_binary_op)c->op, c->out->dtype, c->x->dtype, c->y->dtype, &heavy);
    else if (c->kind == NB_CPU_FUSE_UNARY)
        s.fn = nb__cpu_unary_loop((nb_unary_op)c->op, c->out->dtype, c->x->dtype, c->alpha, &s.un, &heavy);
    else
        s.fn = nb__cpu_fill_loop(c->out->dtype, c->alpha, &s.fill);
    const nb_view *ops[3] = {c->out, s.n_ops > 1 ? c->x : NULL, s.n_ops > 2 ? c->y : NULL};
    if (!s.fn || f->n_steps == FUSE_MAX_CALLS)
        return false;
    for (int o = 0; o < s.n_ops; o++)
        if (!same_shape(ops[o], shape))
            return false;
    int n_slots = f->n_slots;
    /* reads first: an in-place call reads its output's slot before it writes it */
    for (int o = s.n_ops - 1; o >= 0; o--) {
        if ((s.slot[o] = slot_of(f, ops[o], o == 0)) < 0) {
            f->n_slots = n_slots;
            return false;
        }
    }
    f->heavy = f->heavy || heavy;
    f->steps[f->n_steps++] = s;
    return true;
}

/* Points each step at its own context (after the plan stops moving). */
static void bind_contexts(nb_cpu_fused *f, const nb_cpu_fuse_call *calls)
{
    for (int i = 0; i < f->n_steps; i++) {
        step *s = &f->steps[i];
        s->arg = calls[i].kind == NB_CPU_FUSE_UNARY ? (void *)&s->un
                 : calls[i].kind == NB_CPU_FUSE_FILL ? (void *)&s->fill
                                                     : NULL;
    }
}

int nb__cpu_fuse_plan(const nb_cpu_fuse_call *calls, int n, nb_cpu_fuse_dead_fn dead, void *user,
                      nb_cpu_fused **out)
{
    *out = NULL;
    if (n < 2 || calls[0].out->numel <= 0)
        return 0;
    nb_cpu_fused *f = calloc(1, sizeof *f);
    if (!f)
        return 0;
    int k = 0;
    while (k < n && add_call(f, &calls[k], calls[0].out))
        k++;
    if (k < 2) {
        free(f);
        return 0;
    }
    /* A result the chain writes before it reads it, dead after the chain,
     * lives in a tile only; the rest are read and written in memory. */
    const nb_view *kept[FUSE_MAX_SLOTS];
    int n_ext = 0, last_written = -1;
    for (int i = 0; i < f->n_slots; i++) {
        slot *sl = &f->slots[i];
        if (sl->first_write)
            last_written = i;
        if (sl->first_write && dead(user, &sl->v, calls[k - 1].index))
            sl->tile = f->n_tiles++;
    }
    if (f->n_tiles == f->n_slots) { /* nothing would be seen: keep the last result anyway */
        f->slots[last_written].tile = -1;
        f->n_tiles = 0;
        for (int i = 0; i < f->n_slots; i++)
            if (f->slots[i].tile >= 0)
                f->slots[i].tile = f->n_tiles++;
    }
    for (int i = 0; i < f->n_slots; i++) {
        if (f->slots[i].tile < 0) {
            f->slots[i].ext = n_ext;
            kept[n_ext++] = &f->slots[i].v;
        }
    }
    nb__cpu_iter_init(&f->it, n_ext, kept);
    bind_contexts(f, calls);
    *out = f;
    return k;
}

/* A run of n elements of the iteration: each tile through every call. */
static void fused_loop(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)
{
    const nb_cpu_fused *f = ctx;
    _Alignas(64) char tiles[FUSE_MAX_SLOTS][FUSE_TILE * 8];
    for (int64_t j = 0; j < n; j += FUSE_TILE) {
        int64_t m = n - j < FUSE_TILE ? n - j : FUSE_TILE;
        for (int i = 0; i < f->n_steps; i++) {
            const step *st = &f->steps[i];
            char *pp[3];
            int64_t ss[3];
            for (int o = 0; o < st->n_ops; o++) {
                const slot *sl = &f->slots[st->slot[o]];
                if (sl->ext >= 0) {
                    pp[o] = p[sl->ext] + j * s[sl->ext];
                    ss[o] = s[sl->ext];
                } else {
                    pp[o] = tiles[sl->tile];
                    ss[o] = nb__cpu_esize(sl->v.dtype);
                }
            }
            st->fn(st->arg, m, pp, ss, flat + j);
        }
    }
}

void nb__cpu_fused_run(const nb_cpu_fused *f)
{
    nb__cpu_iter_run(&f->it, fused_loop, (void *)f, f->heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
}

int nb__cpu_fused_elided(const nb_cpu_fused *f) { return f ? f->n_tiles : 0; }

void nb__cpu_fused_free(nb_cpu_fused *f) { free(f); }
