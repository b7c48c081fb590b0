/* The mirrored strategy's all-reduce: gradients packed into buckets, summed
 * across replicas with a collective library (NCCL) or through device copies.
 *
 * The copy path is reduce-scatter then all-gather. Replica r owns the r-th
 * 1/N of every bucket: it sums that part from all replicas in the fixed order
 * 0, 1, ..., N-1 (so two runs give the same bits), then every replica copies the
 * parts it does not own from their owners. Each replica reads about one bucket's
 * worth and writes about one, whatever N is: no replica is a funnel. CPU devices
 * share host memory, so their kernels read the other replicas' buffers in place;
 * other devices first copy the part into a temporary on their own device (the
 * backend orders that copy after the producer's queued work). */
#include "distribute_impl.h"
#include "world.h"

#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the bucket plan ----------------------------------------------------------- */

static bool plan_reserve(nb_bucket_plan *p, int n_vars, int n_buckets)
{
    if (n_vars > p->cap_vars) {
        int *b = realloc(p->bucket_of, sizeof *b * (size_t)n_vars);
        if (b)
            p->bucket_of = b;
        int64_t *o = realloc(p->offset_of, sizeof *o * (size_t)n_vars);
        if (o)
            p->offset_of = o;
        if (!b || !o)
            return false;
        p->cap_vars = n_vars;
    }
    if (n_buckets > p->cap_buckets) {
        nb_bucket *k = realloc(p->buckets, sizeof *k * (size_t)n_buckets);
        if (!k)
            return false;
        p->buckets = k;
        p->cap_buckets = n_buckets;
    }
    return true;
}

bool nb__bucket_plan_make(nb_bucket_plan *plan, int n, const nb_dtype *dtypes, const int64_t *numels,
                          const bool *present, size_t bucket_bytes)
{
    /* At most one bucket per variable. */
    if (!plan_reserve(plan, n, n > 0 ? n : 1)) {
        nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_mirrored_step: out of host memory for the bucket plan");
        return false;
    }
    plan->n_vars = n;
    plan->n_buckets = 0;
    for (int i = 0; i < n; i++)
        plan->bucket_of[i] = -1, plan->offset_of[i] = 0;
    /* One dtype at a time, in order of first appearance; within it, variables
     * in order, a bucket closing when the next gradient would overflow it. */
    for (int first = 0; first < n; first++) {
        if (!present[first] || plan->bucket_of[first] >= 0)
            continue;
        nb_dtype d = dtypes[first];
        size_t esize = nb_dtype_size(d);
        int open = -1;
        for (int i = first; i < n; i++) {
            if (!present[i] || dtypes[i] != d || plan->bucket_of[i] >= 0)
                continue;
            size_t bytes = (size_t)numels[i] * esize;
            if (open >= 0 && (size_t)plan->buckets[open].numel * esize + bytes > bucket_bytes)
                open = -1;
            if (open < 0) {
                open = plan->n_buckets++;
                plan->buckets[open] = (nb_bucket){d, 0};
            }
            plan->bucket_of[i] = open;
            plan->offset_of[i] = plan->buckets[open].numel;
            plan->buckets[open].numel += numels[i];
        }
    }
    return true;
}

void nb__bucket_plan_free(nb_bucket_plan *plan)
{
    free(plan->buckets);
    free(plan->bucket_of);
    free(plan->offset_of);
    memset(plan, 0, sizeof *plan);
}

/* ---- cached bucket tensors -------------------------------------------------------- */

void nb__bucket_cache_free(nb_bucket_cache *cache)
{
    for (int k = 0; k < cache->n; k++)
        nb__release(cache->tensors[k]);
    free(cache->tensors);
    free(cache->layout);
    memset(cache, 0, sizeof *cache);
}

/* Whether the cached buckets have the plan's dtypes and sizes (field by field:
 * the structs' padding bytes are unspecified). */
static bool cache_matches(const nb_bucket_cache *c, const nb_bucket_plan *plan)
{
    if (c->n != plan->n_buckets)
        return false;
    for (int k = 0; k < c->n; k++)
        if (c->layout[k].dtype != plan->buckets[k].dtype || c->layout[k].numel != plan->buckets[k].numel)
            return false;
    return true;
}

nb_status nb__bucket_cache_fit(nb_replica_state *rs, const nb_bucket_plan *plan)
{
    nb_bucket_cache *c = &rs->cache;
    if (cache_matches(c, plan))
        return NB_OK;
    nb__bucket_cache_free(c);
    if (plan->n_buckets == 0)
        return NB_OK;
    c->layout = malloc(sizeof *c->layout * (size_t)plan->n_buckets);
    c->tensors = calloc((size_t)plan->n_buckets, sizeof *c->tensors);
    if (!c->layout || !c->tensors) {
        nb__bucket_cache_free(c);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_mirrored_step: out of host memory for the buckets");
    }
    memcpy(c->layout, plan->buckets, sizeof *c->layout * (size_t)plan->n_buckets);
    c->n = plan->n_buckets;
    for (int k = 0; k < c->n; k++) {
        int64_t numel = plan->buckets[k].numel;
        if (!(c->tensors[k] = nb__tensor_new("all-reduce", rs->dev, plan->buckets[k].dtype, 1, &numel))) {
            nb__bucket_cache_free(c);
            return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
        }
    }
    return NB_OK;
}

/* ---- the copy path ----------------------------------------------------------------- */

/* Elements [lo, hi) of replica r's part of an n-element bucket split N ways. */
static void part_of(int64_t n, int parts, int r, int64_t *lo, int64_t *hi)
{
    /* n < 2^62 (it fits in memory), parts <= 64: no overflow in n / parts * r. */
    int64_t q = n / parts, rem = n % parts;
    *lo = q * r + (r < rem ? r : rem);
    *hi = *lo + q + (r < rem ? 1 : 0);
}

/* A 1-d contiguous view of count elements starting at element lo of t. */
static nb_view part_view(const nb_tensor *t, int64_t lo, int64_t count)
{
    nb_view v = nb__view(t);
    size_t esize = nb_dtype_size(t->dtype);
    v.data = (char *)v.data + (size_t)lo * esize;
    v.ndim = 1;
    v.shape[0] = count;
    v.strides[0] = (int64_t)esize;
    v.numel = count;
    v.contiguous = true;
    return v;
}

/* Temporary i (count elements like dst) of a reduction, made on first use. */
static nb_status temp(nb_replica_state *rs, nb_tensor **tmp, int i, const nb_tensor *dst, int64_t count)
{
    if (!tmp[i] && !(tmp[i] = nb__tensor_new("all-reduce", rs->dev, dst->dtype, 1, &count)))
        return nb_error() ? nb_error() : NB_ERR_OUT_OF_MEMORY;
    return NB_OK;
}

/* Replica s's part [lo, lo + count) of bucket src, readable by rs's kernels:
 * the buffer itself on CPU devices (one address space) and on rs's own device,
 * else a copy into temporary i on rs's device. */
static nb_status term(nb_replica_state *rs, const nb_replica_state *from, const nb_tensor *src, int64_t lo,
                      int64_t count, nb_tensor **tmp, int i, nb_view *out)
{
    *out = part_view(src, lo, count);
    if (from == rs || (rs->dev->kind == NB_DEVICE_CPU && from->dev->kind == NB_DEVICE_CPU))
        return NB_OK;
    nb_status st = temp(rs, tmp, i, src, count);
    if (st)
        return st;
    nb_view t = part_view(tmp[i], 0, count);
    st = rs->dev->backend->copy_between(rs->dev, t.data, from->dev, out->data,
                                                  (size_t)count * nb_dtype_size(src->dtype));
    *out = t;
    return st;
}

/* Reduce-scatter of one bucket: rs's part of dst = scale * sum of every
 * replica's part of src, added in replica order. */
static nb_status reduce_part(nb_replica_state *rs, int k, double scale)
{
    nb_mirrored *s = rs->s;
    const nb_backend *be = rs->dev->backend;
    nb_device *dev = rs->dev;
    const nb_tensor *dst = rs->ar_dst[k];
    int64_t lo, hi;
    part_of(dst->numel, s->n, rs->index, &lo, &hi);
    int64_t count = hi - lo;
    if (count == 0)
        return NB_OK;
    nb_view out = part_view(dst, lo, count);

    /* Up to two running sums (temporaries 0, 1) and two landing places for
     * copied parts (2, 3), each count long, made when first needed. */
    nb_tensor *tmp[4] = {NULL, NULL, NULL, NULL};
    nb_status st = NB_OK;
    if (s->n == 1) {
        nb_view in = part_view(rs->ar_src[k], lo, count);
        if (scale == 1.0) {
            if (in.data != out.data)
                st = be->copy(dev, &out, &in);
        } else if (in.data != out.data) {
            st = be->unary(dev, NB_UN_MUL_SCALAR, &out, &in, scale);
        } else if (!(st = temp(rs, tmp, 0, dst, count))) { /* kernels never alias output and input */
            nb_view t = part_view(tmp[0], 0, count);
            st = be->copy(dev, &t, &in);
            if (!st)
                st = be->unary(dev, NB_UN_MUL_SCALAR, &out, &t, scale);
        }
        goto done;
    }

    nb_view a, b;
    if ((st = term(rs, &s->reps[0], s->reps[0].ar_src[k], lo, count, tmp, 2, &a)) ||
        (st = term(rs, &s->reps[1], s->reps[1].ar_src[k], lo, count, tmp, 3, &b)))
        goto done;
    for (int from = 1; from < s->n; from++) {
        if (from > 1 && (st = term(rs, &s->reps[from], s->reps[from].ar_src[k], lo, count, tmp, 2 + from % 2, &b)))
            goto done;
        bool last = from == s->n - 1;
        /* The last sum goes straight to dst unless it must still be scaled or
         * dst's part is one of its inputs (in place). */
        bool direct = last && scale == 1.0 && out.data != a.data && out.data != b.data;
        if (!direct && (st = temp(rs, tmp, from % 2, dst, count)))
            goto done;
        nb_view target = direct ? out : part_view(tmp[from % 2], 0, count);
        if ((st = be->binary(dev, NB_BIN_ADD, &target, &a, &b)))
            goto done;
        a = target;
        if (last && !direct)
            st = scale == 1.0 ? be->copy(dev, &out, &a) : be->unary(dev, NB_UN_MUL_SCALAR, &out, &a, scale);
    }
done:
    for (int i = 0; i < 4; i++)
        nb__release(tmp[i]);
    return st;
}

/* All-gather of one bucket: copies every other replica's part of dst into rs's. */
static nb_status gather_parts(nb_replica_state *rs, int k)
{
    nb_mirrored *s = rs->s;
    const nb_tensor *mine = rs->ar_dst[k];
    size_t esize = nb_dtype_size(mine->dtype);
    for (int from = 0; from < s->n; from++) {
        if (from == rs->index)
            continue;
        int64_t lo, hi;
        part_of(mine->numel, s->n, from, &lo, &hi);
        if (hi == lo)
            continue;
        const nb_tensor *theirs = s->reps[from].ar_dst[k];
        nb_status st = rs->dev->backend->copy_between(rs->dev, (char *)nb__data(mine) + (size_t)lo * esize,
                                                      s->reps[from].dev,
                                                      (const char *)nb__data(theirs) + (size_t)lo * esize,
                                                      (size_t)(hi - lo) * esize);
        if (st)
            return st;
    }
    return NB_OK;
}

/* ---- through the collective ---------------------------------------------------------- */

/* Scaling first (into dst) keeps the collective a plain in-place sum. */
static nb_status collective_prepare(nb_replica_state *rs, int n_buckets, nb_tensor *const *src,
                                    nb_tensor *const *dst, double scale)
{
    nb_device *dev = rs->dev;
    nb_status st = NB_OK;
    for (int k = 0; k < n_buckets && !st; k++) {
        nb_view out = nb__view(dst[k]), in = nb__view(src[k]);
        if (scale != 1.0)
            st = dev->backend->unary(dev, NB_UN_MUL_SCALAR, &out, &in, scale);
        else if (in.data != out.data)
            st = dev->backend->copy(dev, &out, &in);
    }
    return st;
}

/* The run of buckets of one dtype that starts at bucket k (at most 64: one
 * grouped call each; the plan groups the dtypes): their data and counts to bufs
 * and counts; returns how many. */
static int dtype_run(int n_buckets, nb_tensor *const *dst, int k, void **bufs, int64_t *counts)
{
    int m = 0;
    for (nb_dtype d = dst[k]->dtype; k < n_buckets && m < 64 && dst[k]->dtype == d; k++, m++) {
        bufs[m] = nb__data(dst[k]);
        counts[m] = dst[k]->numel;
    }
    return m;
}

/* One grouped call per run of buckets of one dtype, in place. Every rank makes
 * the same calls: the layouts agree and the checks that can fail depend only
 * on them. */
static nb_status collective_sum(nb_replica_state *rs, int n_buckets, nb_tensor *const *dst)
{
    nb_mirrored *s = rs->s;
    void *bufs[64];
    int64_t counts[64];
    nb_status st = NB_OK;
    for (int k = 0; k < n_buckets && !st;) {
        int m = dtype_run(n_buckets, dst, k, bufs, counts);
        st = s->collective->all_reduce_sum(s->comm, rs->index, m, (const void *const *)bufs, bufs, counts,
                                           dst[k]->dtype);
        k += m;
    }
    return st;
}

/* ---- across processes ------------------------------------------------------------------ */

static bool all_reduce_local(nb_replica_state *rs, bool ok, int n_buckets, nb_tensor *const *src,
                             nb_tensor *const *dst, double scale);

/* Replica 0's part through the processes' collective (NCCL): one call per run
 * of buckets of one dtype, after a handshake that checks every process is
 * there with the same buckets. */
static nb_status world_sum_collective(nb_replica_state *rs, const char *who, int n_buckets, nb_tensor *const *dst)
{
    nb_mirrored *s = rs->s;
    char desc[64];
    int64_t total = 0;
    for (int k = 0; k < n_buckets; k++)
        total += dst[k]->numel;
    snprintf(desc, sizeof desc, "%d buckets, %lld elements", n_buckets, (long long)total);
    nb_status st = nb__world_handshake(who, "a sum (nccl)", desc, 0, NULL, NULL);
    void *bufs[64];
    int64_t counts[64];
    for (int k = 0; k < n_buckets && !st;) {
        int m = dtype_run(n_buckets, dst, k, bufs, counts);
        st = s->world_collective->world_sum(s->world_comm, m, bufs, counts, dst[k]->dtype, nb__world_timeout());
        k += m;
    }
    return st;
}

/* Replica 0's part: every bucket of dst summed with the other processes', in
 * host memory (a device's buckets through a staging buffer), or through the
 * processes' collective where the strategy has one. */
static nb_status world_sum_buckets(nb_replica_state *rs, const char *who, int n_buckets, nb_tensor *const *dst)
{
    nb_mirrored *s = rs->s;
    nb_device *dev = rs->dev;
    if (s->world_comm)
        return world_sum_collective(rs, who, n_buckets, dst);
    for (int k = 0; k < n_buckets; k++) {
        nb_tensor *b = dst[k];
        size_t bytes = (size_t)b->numel * nb_dtype_size(b->dtype);
        bool kept = false;
        if (dev->kind == NB_DEVICE_CPU) {
            /* in the bucket itself (no copy); a late message may land in it
             * after a timeout, so its storage then outlives the bucket */
            nb_status st = nb__world_sum(who, nb__data(b), b->numel, b->dtype, &kept);
            if (kept) {
                atomic_fetch_add(&b->storage->refs, 1);
                nb__world_keep(b->storage);
            }
            if (st)
                return st;
            continue;
        }
        if (bytes > s->host_bytes) {
            void *h = realloc(s->host, bytes);
            if (!h)
                return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for a %zu-byte bucket", who, bytes);
            s->host = h;
            s->host_bytes = bytes;
        }
        nb_status st = dev->backend->copy_to_host(dev, s->host, nb__data(b), bytes);
        if (!st)
            st = nb__world_sum(who, s->host, b->numel, b->dtype, &kept);
        if (kept) { /* the staging buffer is the world's now */
            nb__world_keep(s->host);
            s->host = NULL;
            s->host_bytes = 0;
        }
        if (!st)
            st = dev->backend->copy_from_host(dev, nb__data(b), s->host, bytes);
        if (st)
            return st;
    }
    return NB_OK;
}

/* The other replicas take replica 0's sums. */
static nb_status copy_from_first(nb_replica_state *rs, int n_buckets, nb_tensor *const *dst)
{
    nb_replica_state *first = &rs->s->reps[0];
    for (int k = 0; k < n_buckets; k++) {
        nb_tensor *mine = dst[k];
        const nb_tensor *theirs = first->ar_dst[k];
        nb_status st = rs->dev->backend->copy_between(rs->dev, nb__data(mine), first->dev, nb__data(theirs),
                                                      (size_t)mine->numel * nb_dtype_size(mine->dtype));
        if (st)
            return st;
    }
    return NB_OK;
}

/* After the process's own all-reduce: the sum with the other processes. */
static bool all_reduce_world(nb_replica_state *rs, const char *who, int n_buckets, nb_tensor *const *dst)
{
    nb_mirrored *s = rs->s;
    bool ok = true;
    if (rs->index == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        nb_status st = world_sum_buckets(rs, who, n_buckets, dst);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        s->world_ns += (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
        s->world_sums++;
        ok = st == NB_OK || nb__replica_failed(rs, st, "the all-reduce across processes failed");
    }
    if (!nb__mirrored_barrier(s, ok, NULL, NULL))
        return false;
    if (rs->index != 0) {
        nb_status st = copy_from_first(rs, n_buckets, dst);
        ok = st == NB_OK || nb__replica_failed(rs, st, "all-reduce: copying the processes' sums failed");
    }
    return nb__mirrored_barrier(s, ok, NULL, NULL);
}

bool nb__all_reduce_buckets(nb_replica_state *rs, const char *who, bool ok, int n_buckets, nb_tensor *const *src,
                            nb_tensor *const *dst, double scale)
{
    if (!all_reduce_local(rs, ok, n_buckets, src, dst, scale))
        return false;
    return !rs->s->world || all_reduce_world(rs, who, n_buckets, dst);
}

/* The all-reduce among this process's replicas. */
static bool all_reduce_local(nb_replica_state *rs, bool ok, int n_buckets, nb_tensor *const *src,
                             nb_tensor *const *dst, double scale)
{
    nb_mirrored *s = rs->s;
    rs->ar_src = src;
    rs->ar_dst = dst;
    /* Everyone's buffers are published (and filled, in stream order) before any
     * replica reads another's. */
    if (!nb__mirrored_barrier(s, ok, NULL, NULL))
        return false;
    if (s->comm) {
        /* A rank that skipped the collective would leave the others waiting in
         * it for ever: agree that every rank is ready before any calls it. */
        nb_status st = collective_prepare(rs, n_buckets, src, dst, scale);
        ok = st == NB_OK || nb__replica_failed(rs, st, "all-reduce: scaling the buffers failed");
        if (!nb__mirrored_barrier(s, ok, NULL, NULL))
            return false;
        st = collective_sum(rs, n_buckets, dst);
        ok = st == NB_OK || nb__replica_failed(rs, st, "all-reduce (%s) failed", s->collective->name);
        return nb__mirrored_barrier(s, ok, NULL, NULL);
    }
    for (int k = 0; k < n_buckets && ok; k++) {
        nb_status st = reduce_part(rs, k, scale);
        ok = st == NB_OK || nb__replica_failed(rs, st, "all-reduce: reducing bucket %d failed", k);
    }
    /* Every part is summed before anyone gathers it. */
    if (!nb__mirrored_barrier(s, ok, NULL, NULL))
        return false;
    /* Across processes, replica 0 alone gathers: it sums the whole buckets
     * with the other processes, and the others then copy its result. */
    bool gather = !s->world || rs->index == 0;
    for (int k = 0; k < n_buckets && ok && gather; k++) {
        nb_status st = gather_parts(rs, k);
        ok = st == NB_OK || nb__replica_failed(rs, st, "all-reduce: gathering bucket %d failed", k);
    }
    /* Nobody reuses a buffer another replica may still be reading. */
    return nb__mirrored_barrier(s, ok, NULL, NULL);
}
