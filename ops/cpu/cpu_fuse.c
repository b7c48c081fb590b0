/* A fused elementwise chain on the CPU (cpu_fuse.h). */
#include "cpu_fuse.h"

#include <stdlib.h>

_Static_assert(NB_FUSE_MAX_SLOTS <= NB_CPU_MAX_OPS, "a chain's operands must fit one iteration");

enum { FUSE_TILE = 256 }; /* elements per tile: 2 KiB a result at 8 bytes, all tiles in L1 */

typedef struct step {
    nb_cpu_loop_fn fn;
    void *arg; /* un, fill or copy, or NULL: what fn reads as its context */
    nb_cpu_un_ctx un;
    nb_cpu_fill_ctx fill;
    nb_cpu_copy_ctx copy;
} step;

struct nb_cpu_fused {
    nb_fuse_plan plan;
    nb_cpu_iter it; /* over the slots kept in memory */
    bool heavy;
    int ext[NB_FUSE_MAX_SLOTS];  /* a memory slot's operand of the iteration, or -1 */
    int tile[NB_FUSE_MAX_SLOTS]; /* an internal slot's tile, or -1 */
    step steps[NB_FUSE_MAX_CALLS];
    /* a chain that feeds a reduction (plan.fed >= 0): its call */
    nb_reduce_op red_op;
    nb_view red_out, red_x;
};

/* One pass of fused_loop: where dst is set, the fed slot's elements go to
 * dst, element flat at dst[flat - base] (the iteration keeps the fed slot as
 * an operand, its memory never touched, so that it always has one). */
typedef struct pass {
    const nb_cpu_fused *f;
    char *dst;
    int64_t base;
} pass;

/* The loop c's kernel runs, with its context in s (s->arg); NULL where there
 * is none. */
static nb_cpu_loop_fn resolve(const nb_fuse_call *c, step *s, bool *heavy)
{
    *heavy = false;
    s->arg = NULL;
    switch (c->kind) {
    case NB_FUSE_BINARY:
        return nb__cpu_binary_loop((nb_binary_op)c->op, c->out->dtype, c->x->dtype, c->y->dtype, heavy);
    case NB_FUSE_UNARY:
        s->arg = &s->un;
        return nb__cpu_unary_loop((nb_unary_op)c->op, c->out->dtype, c->x->dtype, c->alpha, &s->un, heavy);
    case NB_FUSE_FILL:
        s->arg = &s->fill;
        return nb__cpu_fill_loop(c->out->dtype, c->alpha, &s->fill);
    case NB_FUSE_COPY:
        s->arg = &s->copy;
        return nb__cpu_copy_loop(c->out->dtype, c->x->dtype, &s->copy);
    case NB_FUSE_WHERE:
        return nb__cpu_where_loop(c->out->dtype, c->cond->dtype, c->x->dtype, c->y->dtype);
    default:
        return NULL;
    }
}

static bool supported(void *user, const nb_fuse_call *c)
{
    (void)user;
    step s;
    bool heavy;
    return resolve(c, &s, &heavy) != NULL;
}

/* Prepares f's loops and iteration for the k calls its plan holds. */
static void prepare(nb_cpu_fused *f, const nb_fuse_call *calls, int k)
{
    const nb_fuse_plan *p = &f->plan;
    const nb_view *kept[NB_FUSE_MAX_SLOTS];
    int n_ext = 0, n_tiles = 0;
    for (int i = 0; i < p->n_slots; i++) {
        f->ext[i] = p->slots[i].internal ? -1 : n_ext;
        f->tile[i] = p->slots[i].internal ? n_tiles++ : -1;
        if (!p->slots[i].internal)
            kept[n_ext++] = &p->slots[i].v;
    }
    nb__cpu_iter_init(&f->it, n_ext, kept);
    for (int i = 0; i < k; i++) {
        step *s = &f->steps[i];
        bool heavy;
        s->fn = resolve(&calls[i], s, &heavy);
        f->heavy = f->heavy || heavy;
    }
}

int nb__cpu_fuse_plan(const nb_fuse_call *calls, int n, nb_fuse_dead_fn dead, void *user, nb_cpu_fused **out)
{
    *out = NULL;
    nb_cpu_fused *f = calloc(1, sizeof *f);
    if (!f)
        return 0;
    int k = nb__fuse_plan(calls, n, NB_FUSE_MAX_SLOTS, supported, dead, user, &f->plan);
    if (k < 2) {
        free(f);
        return 0;
    }
    prepare(f, calls, k);
    *out = f;
    return k;
}

int nb__cpu_fuse_plan_reduce(const nb_fuse_call *calls, int n, nb_reduce_op op, const nb_fuse_feed *feed,
                             nb_fuse_dead_fn dead, void *user, nb_cpu_fused **out)
{
    *out = NULL;
    if (n < 1 || !nb__cpu_reduce_can_feed(op, feed->out, feed->x))
        return 0;
    nb_cpu_fused *f = calloc(1, sizeof *f);
    if (!f)
        return 0;
    if (nb__fuse_plan_feed(calls, n, NB_FUSE_MAX_SLOTS, supported, dead, user, feed, &f->plan) != n) {
        free(f);
        return 0;
    }
    prepare(f, calls, n);
    f->red_op = op;
    f->red_out = *feed->out;
    f->red_x = *feed->x;
    *out = f;
    return n;
}

/* A run of n elements of the iteration: each tile through every call. */
static void fused_loop(void *ctx, int64_t n, char *const *p, const int64_t *s, int64_t flat)
{
    const pass *pa = ctx;
    const nb_cpu_fused *f = pa->f;
    const nb_fuse_plan *plan = &f->plan;
    _Alignas(64) char tiles[NB_FUSE_MAX_SLOTS][FUSE_TILE * 8];
    for (int64_t j = 0; j < n; j += FUSE_TILE) {
        int64_t m = n - j < FUSE_TILE ? n - j : FUSE_TILE;
        for (int i = 0; i < plan->n_steps; i++) {
            const nb_fuse_step *ps = &plan->steps[i];
            char *pp[4];
            int64_t ss[4];
            for (int o = 0; o < ps->n_ops; o++) {
                int sl = ps->slot[o], e = f->ext[sl];
                if (sl == plan->fed && pa->dst) {
                    ss[o] = nb__cpu_esize(plan->slots[sl].v.dtype);
                    pp[o] = pa->dst + (flat + j - pa->base) * ss[o];
                } else if (e >= 0) {
                    pp[o] = p[e] + j * s[e];
                    ss[o] = s[e];
                } else {
                    pp[o] = tiles[f->tile[sl]];
                    ss[o] = nb__cpu_esize(plan->slots[sl].v.dtype);
                }
            }
            f->steps[i].fn(f->steps[i].arg, m, pp, ss, flat + j);
        }
    }
}

/* The reduction's producer: the chain over x's elements [flat, flat + n), x into dst. */
static void produce(void *ctx, int64_t flat, int64_t n, char *dst)
{
    const nb_cpu_fused *f = ctx;
    pass ps = {f, dst, flat};
    nb__cpu_iter_range(&f->it, fused_loop, &ps, flat, flat + n);
}

void nb__cpu_fused_run(const nb_cpu_fused *f)
{
    if (f->plan.fed >= 0) {
        nb__cpu_reduce_fed(f->red_op, &f->red_out, &f->red_x, produce, (void *)f, f->heavy);
        return;
    }
    pass ps = {f, NULL, 0};
    nb__cpu_iter_run(&f->it, fused_loop, &ps, f->heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN);
}

void nb__cpu_fused_free(nb_cpu_fused *f) { free(f); }
