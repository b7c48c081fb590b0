/* Strided N-d iteration shared by the elementwise kernels: dims coalesced once,
 * an index counter over the outer dims, the innermost dim handed to a loop
 * function, and large work split across the thread pool by flat index. */
#include "cpu_internal.h"

void nb__cpu_iter_init(nb_cpu_iter *it, int nops, const nb_view *const *views)
{
    const nb_view *v0 = views[0];
    it->nops = nops;
    it->numel = v0->numel;
    bool all_contiguous = true;
    for (int o = 0; o < nops; o++) {
        it->data[o] = (char *)views[o]->data;
        all_contiguous = all_contiguous && views[o]->contiguous;
    }
    if (all_contiguous) {
        it->ndim = 1;
        it->shape[0] = v0->numel;
        for (int o = 0; o < nops; o++)
            it->strides[o][0] = nb__cpu_esize(views[o]->dtype);
        return;
    }
    int nd = 0;
    for (int d = 0; d < v0->ndim; d++) {
        int64_t size = v0->shape[d];
        if (size == 1)
            continue;
        if (nd > 0) {
            bool merge = true;
            for (int o = 0; o < nops && merge; o++)
                merge = it->strides[o][nd - 1] == views[o]->strides[d] * size;
            if (merge) {
                it->shape[nd - 1] *= size;
                for (int o = 0; o < nops; o++)
                    it->strides[o][nd - 1] = views[o]->strides[d];
                continue;
            }
        }
        it->shape[nd] = size;
        for (int o = 0; o < nops; o++)
            it->strides[o][nd] = views[o]->strides[d];
        nd++;
    }
    if (nd == 0) {
        it->shape[0] = 1;
        for (int o = 0; o < nops; o++)
            it->strides[o][0] = nb__cpu_esize(views[o]->dtype);
        nd = 1;
    }
    it->ndim = nd;
}

void nb__cpu_iter_range(const nb_cpu_iter *it, nb_cpu_loop_fn fn, void *ctx, int64_t begin,
                        int64_t end)
{
    const int nd = it->ndim, no = it->nops;
    const int64_t inner = it->shape[nd - 1];
    int64_t s[NB_CPU_MAX_OPS];
    char *p[NB_CPU_MAX_OPS];
    for (int o = 0; o < no; o++)
        s[o] = it->strides[o][nd - 1];
    if (nd == 1) {
        for (int o = 0; o < no; o++)
            p[o] = it->data[o] + begin * s[o];
        fn(ctx, end - begin, p, s, begin);
        return;
    }
    /* Unravel begin over the outer dims. */
    int64_t idx[NB_MAX_DIMS], off[NB_CPU_MAX_OPS] = {0};
    int64_t row = begin / inner, pos = begin % inner;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = row % it->shape[d];
        row /= it->shape[d];
    }
    for (int o = 0; o < no; o++)
        off[o] = nb__cpu_offset(nd - 1, idx, it->strides[o]);
    int64_t flat = begin;
    while (flat < end) {
        int64_t n = inner - pos < end - flat ? inner - pos : end - flat;
        for (int o = 0; o < no; o++)
            p[o] = it->data[o] + off[o] + pos * s[o];
        fn(ctx, n, p, s, flat);
        flat += n;
        pos = 0;
        if (flat < end)
            nb__cpu_index_next(nd - 1, it->shape, idx, no, off, it->strides);
    }
}

void nb__cpu_iter_views(int nops, const nb_view *const *views, nb_cpu_loop_fn fn, void *ctx, int64_t grain)
{
    const int64_t n = views[0]->numel;
    if (n < 2 * grain) {
        char *p[NB_CPU_MAX_OPS];
        int64_t s[NB_CPU_MAX_OPS];
        bool contiguous = true;
        for (int o = 0; o < nops; o++) {
            contiguous = contiguous && views[o]->contiguous;
            p[o] = (char *)views[o]->data;
            s[o] = nb__cpu_esize(views[o]->dtype);
        }
        if (contiguous) {
            if (n > 0)
                fn(ctx, n, p, s, 0);
            return;
        }
    }
    nb_cpu_iter it;
    nb__cpu_iter_init(&it, nops, views);
    nb__cpu_iter_run(&it, fn, ctx, grain);
}

typedef struct iter_job {
    const nb_cpu_iter *it;
    nb_cpu_loop_fn fn;
    void *ctx;
} iter_job;

static void iter_job_run(void *ctx, int64_t begin, int64_t end)
{
    const iter_job *job = ctx;
    nb__cpu_iter_range(job->it, job->fn, job->ctx, begin, end);
}

void nb__cpu_iter_run(const nb_cpu_iter *it, nb_cpu_loop_fn fn, void *ctx, int64_t grain)
{
    if (it->numel <= 0)
        return;
    if (it->numel < 2 * grain) {
        nb__cpu_iter_range(it, fn, ctx, 0, it->numel);
        return;
    }
    iter_job job = {it, fn, ctx};
    nb__parallel_for(it->numel, grain, iter_job_run, &job);
}
