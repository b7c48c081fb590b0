/* Datasets: sources (tensors, IDX files, a callback), transformations (shard,
 * shuffle, repeat, batch, map, prefetch) and iterators over them.
 *
 * Inside, an iterator's next() gives an element whose tensors are plain
 * references (retained, owned by no scope): each step opens a scope for its
 * temporaries, retains what it keeps and ends the scope, so nothing depends on
 * the thread it ran on and a prefetch thread can hand elements to the consumer.
 * nb_dataset_next gives them to the caller's scope with nb__own.
 *
 * Rows of a tensor source travel unmade: an element remembers its source and
 * row, and is turned into views only when something looks at it. A batch of
 * such rows from one source is then one gather per component instead of a
 * stack of batch_size views. */
#include "../core/core.h"
#include "idx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum ds_kind {
    DS_TENSORS, DS_GENERATOR, DS_TFRECORD, DS_SHARD, DS_SHUFFLE, DS_REPEAT, DS_BATCH, DS_MAP, DS_PARSE, DS_PREFETCH
} ds_kind;

struct nb_dataset {
    ds_kind kind;
    int n; /* components per element */
    nb_dataset *input;
    /* DS_TENSORS */
    nb_tensor *tensors[NB_DATASET_MAX_COMPONENTS];
    int64_t length;
    /* DS_GENERATOR, DS_MAP */
    nb_dataset_generator_fn gen;
    nb_dataset_map_fn map;
    void *user;
    /* DS_SHUFFLE */
    int64_t buffer_size;
    uint64_t seed;
    _Atomic uint64_t passes; /* passes started, for the per-pass seeds */
    /* DS_REPEAT, DS_SHARD */
    int64_t count;
    /* DS_SHARD */
    int64_t index;
    /* DS_BATCH */
    int64_t batch_size;
    bool drop_remainder;
    /* DS_PREFETCH */
    int depth;
    const char *device; /* a static name, or NULL */
    /* DS_TFRECORD: the file; DS_PARSE: the specs, their names copied */
    char *path;
    nb_feature_spec *specs;
    /* DS_TENSORS from IDX files: read on the first pass, only the rows
     * share_index, share_index + share_count, ... of idx_rows (a shard of
     * the source, before any pass, changes the share instead of reading and
     * dropping rows) */
    char *idx_paths[2];
    int64_t idx_rows, share_count, share_index;
    bool loaded;
    pthread_mutex_t load_mu;
};

/* One element: n tensors, or (src set) row `row` of a tensor source not made yet. */
typedef struct elem {
    nb_tensor *t[NB_DATASET_MAX_COMPONENTS];
    const nb_dataset *src;
    int64_t row;
} elem;

typedef struct prefetch_state prefetch_state;

struct nb_dataset_iterator {
    nb_dataset *ds;
    nb_dataset_iterator *input;
    nb_status done; /* NB_OK while running; the end or the error that stopped it */
    int64_t pos;    /* tensors, generator: next index; repeat: passes done */
    bool got_any;   /* repeat: whether this pass gave an element */
    /* shuffle */
    elem *buf;
    int64_t buf_n;
    bool input_done;
    uint64_t rng;
    prefetch_state *pf;
    nb_tfrecord_reader *reader;
};

#define END NB_ERR_OUT_OF_RANGE

static nb_status it_next(nb_dataset_iterator *it, elem *e);
static nb_dataset_iterator *it_new(nb_dataset *ds);
static void it_free(nb_dataset_iterator *it);

static void elem_clear(elem *e, int n)
{
    for (int i = 0; i < n; i++) {
        nb__release(e->t[i]);
        e->t[i] = NULL;
    }
    e->src = NULL;
}

/* Turns a pending row into views of its source's tensors. */
static nb_status elem_make(elem *e, int n)
{
    if (!e->src)
        return NB_OK;
    for (int i = 0; i < n; i++) {
        const nb_tensor *b = e->src->tensors[i];
        e->t[i] = nb__tensor_view(b, b->ndim - 1, b->shape + 1, b->strides + 1, b->offset + e->row * b->strides[0]);
        if (!e->t[i]) {
            e->src = NULL;
            elem_clear(e, n);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_next: out of host memory");
        }
    }
    e->src = NULL;
    return NB_OK;
}

/* Retains the n tensors a callback wrote to out (inside the caller's scope) into e;
 * a NULL one fails naming who. */
static nb_status elem_take(elem *e, int n, nb_tensor **out, const char *who)
{
    for (int i = 0; i < n; i++)
        if (!out[i])
            return nb_error() ? nb_error()
                              : nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: component %d of %d is NULL", who, i, n);
    for (int i = 0; i < n; i++) {
        nb__retain(out[i]);
        e->t[i] = out[i];
    }
    return NB_OK;
}

/* ---- datasets ------------------------------------------------------------------ */

static nb_dataset *ds_alloc(ds_kind kind, int n, nb_dataset *input, const char *who)
{
    nb_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        nb_dataset_free(input);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    ds->kind = kind;
    ds->n = n;
    ds->input = input;
    return ds;
}

/* For a transformation given a bad argument: fails (the message may read the
 * input), then frees the input. */
#define BAD_ARG(input, ...)                                                                  \
    (nb__fail(NB_ERR_INVALID_ARGUMENT, __VA_ARGS__), nb_dataset_free(input), (nb_dataset *)NULL)

nb_dataset *nb_dataset_from_tensors(int n, nb_tensor *const *ts)
{
    const char *who = "nb_dataset_from_tensors";
    if (n < 1 || n > NB_DATASET_MAX_COMPONENTS)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d tensors (1 to %d allowed)", who, n,
                             NB_DATASET_MAX_COMPONENTS);
    if (!ts)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the tensor array is NULL", who);
    for (int i = 0; i < n; i++) {
        if (!ts[i])
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: tensor %d is NULL", who, i);
        if (ts[i]->ndim < 1)
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: tensor %d is 0-d; each needs a first dim to slice",
                                 who, i);
        if (ts[i]->shape[0] != ts[0]->shape[0])
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT,
                                 "%s: tensor %d has %lld rows, tensor 0 has %lld; all need the same first dim", who,
                                 i, (long long)ts[i]->shape[0], (long long)ts[0]->shape[0]);
    }
    nb_dataset *ds = ds_alloc(DS_TENSORS, n, NULL, who);
    if (!ds)
        return NULL;
    for (int i = 0; i < n; i++) {
        nb__retain(ts[i]);
        ds->tensors[i] = ts[i];
    }
    ds->length = ts[0]->shape[0];
    return ds;
}

/* An IDX source of n files (images, then labels): their headers are read and
 * checked now, their rows on the first pass (idx_load). */
static nb_dataset *from_idx(const char *who, int n, const char *const *paths)
{
    nb_idx_header h[2];
    for (int i = 0; i < n; i++) {
        if (!paths[i])
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: path %d is NULL", who, i);
        if (nb__idx_read_header(who, paths[i], &h[i]))
            return NULL;
    }
    if (n == 2 && h[0].shape[0] != h[1].shape[0])
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %s has %lld images, %s has %lld labels", who, paths[0],
                             (long long)h[0].shape[0], paths[1], (long long)h[1].shape[0]);
    nb_dataset *ds = ds_alloc(DS_TENSORS, n, NULL, who);
    if (!ds)
        return NULL;
    pthread_mutex_init(&ds->load_mu, NULL);
    ds->idx_rows = ds->length = h[0].shape[0];
    ds->share_count = 1;
    for (int i = 0; i < n; i++)
        if (!(ds->idx_paths[i] = strdup(paths[i]))) {
            nb_dataset_free(ds);
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        }
    return ds;
}

nb_dataset *nb_dataset_from_idx(const char *path)
{
    return from_idx("nb_dataset_from_idx", 1, &path);
}

nb_dataset *nb_dataset_from_idx_pair(const char *images_path, const char *labels_path)
{
    return from_idx("nb_dataset_from_idx_pair", 2, (const char *[]){images_path, labels_path});
}

/* Reads an IDX source's share of rows, once: the first iterator does, under
 * the lock, and later ones find the tensors there. */
static nb_status idx_load(nb_dataset *ds)
{
    if (!ds->idx_paths[0])
        return NB_OK;
    pthread_mutex_lock(&ds->load_mu);
    nb_status st = NB_OK;
    if (!ds->loaded) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *t[2] = {NULL, NULL};
        for (int i = 0; i < ds->n && s && !st; i++) {
            t[i] = nb_idx_read_share(ds->idx_paths[i], ds->share_count, ds->share_index);
            if (!t[i])
                st = nb_error();
            else if (t[i]->shape[0] != ds->length)
                st = nb__fail(NB_ERR_IO, "nb_dataset_next: '%s' has changed since the dataset was made: %lld rows in "
                              "this share, %lld expected", ds->idx_paths[i], (long long)t[i]->shape[0],
                              (long long)ds->length);
        }
        if (!s)
            st = nb_error();
        for (int i = 0; i < ds->n && !st; i++) {
            nb__retain(t[i]);
            ds->tensors[i] = t[i];
        }
        ds->loaded = st == NB_OK;
        nb_scope_end(s);
    }
    pthread_mutex_unlock(&ds->load_mu);
    return st;
}

nb_dataset *nb_dataset_from_generator(int n, nb_dataset_generator_fn fn, void *user)
{
    const char *who = "nb_dataset_from_generator";
    if (!fn)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the function is NULL", who);
    if (n < 1 || n > NB_DATASET_MAX_COMPONENTS)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d components (1 to %d allowed)", who, n,
                             NB_DATASET_MAX_COMPONENTS);
    nb_dataset *ds = ds_alloc(DS_GENERATOR, n, NULL, who);
    if (ds) {
        ds->gen = fn;
        ds->user = user;
    }
    return ds;
}

nb_dataset *nb_dataset_from_tfrecord(const char *path)
{
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path); /* fails now, naming the file, if it cannot */
    if (!r)
        return NULL;
    nb_tfrecord_reader_close(r);
    nb_dataset *ds = ds_alloc(DS_TFRECORD, 1, NULL, "nb_dataset_from_tfrecord");
    if (ds && !(ds->path = strdup(path))) {
        nb_dataset_free(ds);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_dataset_from_tfrecord: out of host memory");
    }
    return ds;
}

nb_dataset *nb_dataset_parse_examples(nb_dataset *ds, int n, const nb_feature_spec *specs)
{
    if (!ds)
        return NULL;
    if (n < 1 || n > NB_DATASET_MAX_COMPONENTS || !specs)
        return BAD_ARG(ds, "nb_dataset_parse_examples: %d specs%s (1 to %d allowed)", n, specs ? "" : " at NULL",
                       NB_DATASET_MAX_COMPONENTS);
    if (ds->n != 1)
        return BAD_ARG(ds, "nb_dataset_parse_examples: elements of %d components; the records are one", ds->n);
    for (int i = 0; i < n; i++)
        if (!specs[i].name)
            return BAD_ARG(ds, "nb_dataset_parse_examples: spec %d has no name", i);
    nb_dataset *out = ds_alloc(DS_PARSE, n, ds, "nb_dataset_parse_examples");
    if (!out)
        return NULL;
    out->specs = calloc((size_t)n, sizeof *out->specs);
    for (int i = 0; out->specs && i < n; i++) {
        out->specs[i] = specs[i];
        if (!(out->specs[i].name = strdup(specs[i].name))) {
            nb_dataset_free(out);
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_dataset_parse_examples: out of host memory");
        }
    }
    if (!out->specs) {
        nb_dataset_free(out);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_dataset_parse_examples: out of host memory");
    }
    return out;
}

nb_dataset *nb_dataset_shuffle(nb_dataset *ds, int64_t buffer_size, uint64_t seed)
{
    if (!ds)
        return NULL;
    if (buffer_size < 1)
        return BAD_ARG(ds, "nb_dataset_shuffle: buffer_size %lld (at least 1)", (long long)buffer_size);
    nb_dataset *out = ds_alloc(DS_SHUFFLE, ds->n, ds, "nb_dataset_shuffle");
    if (out) {
        out->buffer_size = buffer_size;
        out->seed = seed;
    }
    return out;
}

nb_dataset *nb_dataset_shard(nb_dataset *ds, int64_t count, int64_t index)
{
    if (!ds)
        return NULL;
    if (count < 1 || index < 0 || index >= count)
        return BAD_ARG(ds, "nb_dataset_shard: index %lld of %lld shards (count >= 1, 0 <= index < count)",
                       (long long)index, (long long)count);
    /* An IDX source not yet read takes the shard as its share: the other rows
     * are never kept. */
    if (ds->kind == DS_TENSORS && ds->idx_paths[0] && ds->share_count <= INT64_MAX / count) {
        pthread_mutex_lock(&ds->load_mu);
        bool fold = !ds->loaded;
        if (fold) {
            ds->share_index += ds->share_count * index;
            ds->share_count *= count;
            ds->length = ds->idx_rows > ds->share_index
                             ? (ds->idx_rows - ds->share_index + ds->share_count - 1) / ds->share_count
                             : 0;
        }
        pthread_mutex_unlock(&ds->load_mu);
        if (fold)
            return ds;
    }
    nb_dataset *out = ds_alloc(DS_SHARD, ds->n, ds, "nb_dataset_shard");
    if (out) {
        out->count = count;
        out->index = index;
    }
    return out;
}

nb_dataset *nb_dataset_repeat(nb_dataset *ds, int64_t count)
{
    if (!ds)
        return NULL;
    nb_dataset *out = ds_alloc(DS_REPEAT, ds->n, ds, "nb_dataset_repeat");
    if (out)
        out->count = count;
    return out;
}

nb_dataset *nb_dataset_batch(nb_dataset *ds, int64_t batch_size, bool drop_remainder)
{
    if (!ds)
        return NULL;
    if (batch_size < 1)
        return BAD_ARG(ds, "nb_dataset_batch: batch_size %lld (at least 1)", (long long)batch_size);
    nb_dataset *out = ds_alloc(DS_BATCH, ds->n, ds, "nb_dataset_batch");
    if (out) {
        out->batch_size = batch_size;
        out->drop_remainder = drop_remainder;
    }
    return out;
}

nb_dataset *nb_dataset_map(nb_dataset *ds, int n_out, nb_dataset_map_fn fn, void *user)
{
    if (!ds)
        return NULL;
    if (!fn)
        return BAD_ARG(ds, "nb_dataset_map: the function is NULL");
    if (n_out < 1 || n_out > NB_DATASET_MAX_COMPONENTS)
        return BAD_ARG(ds, "nb_dataset_map: %d outputs (1 to %d allowed)", n_out, NB_DATASET_MAX_COMPONENTS);
    nb_dataset *out = ds_alloc(DS_MAP, n_out, ds, "nb_dataset_map");
    if (out) {
        out->map = fn;
        out->user = user;
    }
    return out;
}

nb_dataset *nb_dataset_prefetch(nb_dataset *ds, int n, const char *device)
{
    if (!ds)
        return NULL;
    if (n < 1)
        return BAD_ARG(ds, "nb_dataset_prefetch: %d elements ahead (at least 1)", n);
    nb_device *dev = NULL;
    if (device && !(dev = nb__device_resolve(device, "nb_dataset_prefetch"))) {
        nb_dataset_free(ds);
        return NULL;
    }
    nb_dataset *out = ds_alloc(DS_PREFETCH, ds->n, ds, "nb_dataset_prefetch");
    if (out) {
        out->depth = n;
        out->device = dev ? dev->name : NULL;
    }
    return out;
}

int nb_dataset_components(const nb_dataset *ds) { return ds ? ds->n : 0; }

void nb_dataset_free(nb_dataset *ds)
{
    while (ds) {
        nb_dataset *input = ds->input;
        for (int i = 0; i < NB_DATASET_MAX_COMPONENTS; i++)
            nb__release(ds->tensors[i]);
        for (int i = 0; ds->specs && i < ds->n; i++)
            free((char *)ds->specs[i].name);
        free(ds->specs);
        free(ds->path);
        if (ds->idx_paths[0])
            pthread_mutex_destroy(&ds->load_mu);
        free(ds->idx_paths[0]);
        free(ds->idx_paths[1]);
        free(ds);
        ds = input;
    }
}

/* ---- sources ------------------------------------------------------------------- */

static nb_status tensors_next(nb_dataset_iterator *it, elem *e)
{
    if (it->pos >= it->ds->length)
        return END;
    e->src = it->ds;
    e->row = it->pos++;
    return NB_OK;
}

static nb_status generator_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    nb_tensor *out[NB_DATASET_MAX_COMPONENTS] = {0};
    nb_status st = ds->gen(ds->user, it->pos, ds->n, out);
    if (st == NB_OK && nb_error())
        st = nb_error();
    if (st == NB_OK)
        st = elem_take(e, ds->n, out, "nb_dataset_from_generator");
    else if (st != END && !nb_error())
        nb__fail(st, "nb_dataset_from_generator: the function failed with %s at element %lld",
                 nb_status_name(st), (long long)it->pos);
    nb_scope_end(s);
    if (st == NB_OK)
        it->pos++;
    return st;
}

/* Record i of the file: a new NB_U8 tensor of its bytes on /cpu:0. */
static nb_status tfrecord_next(nb_dataset_iterator *it, elem *e)
{
    const void *data;
    size_t size;
    nb_status st = nb_tfrecord_next(it->reader, &data, &size);
    if (st)
        return st;
    nb_tensor *t = nb__tensor_new("nb_dataset_from_tfrecord", nb__device_cpu0(), NB_U8, 1,
                                  (int64_t[]){(int64_t)size});
    if (!t)
        return nb_error();
    if (size)
        memcpy(nb__data(t), data, size);
    e->t[0] = t;
    return NB_OK;
}

/* ---- shard --------------------------------------------------------------------- */

/* Moves it past one element without making it where the source can: a row of
 * a tensor source is counted, a TFRecord record's data are seeked over and a
 * parse is not done; anything else is made and dropped. */
static nb_status it_skip(nb_dataset_iterator *it)
{
    switch (it->ds->kind) {
    case DS_TENSORS:
        if (it->pos >= it->ds->length)
            return END;
        it->pos++;
        return NB_OK;
    case DS_TFRECORD: return nb_tfrecord_skip(it->reader);
    case DS_PARSE: return it_skip(it->input);
    default: {
        elem e = {0};
        nb_status st = it_next(it, &e);
        if (st == NB_OK)
            elem_clear(&e, it->ds->n);
        return st;
    }
    }
}

/* The input's elements index, index + count, ...: the others are skipped
 * (it->pos counts the input's). */
static nb_status shard_next(nb_dataset_iterator *it, elem *e)
{
    const nb_dataset *ds = it->ds;
    while (it->pos % ds->count != ds->index) {
        nb_status st = it_skip(it->input);
        if (st)
            return st;
        it->pos++;
    }
    nb_status st = it_next(it->input, e);
    if (st == NB_OK)
        it->pos++;
    return st;
}

/* ---- shuffle ------------------------------------------------------------------- */

/* splitmix64: the per-pass seed and the draws. */
static uint64_t mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias. */
static int64_t draw(uint64_t *state, int64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n, r;
    do
        r = mix(state);
    while (r >= limit);
    return (int64_t)(r % (uint64_t)n);
}

static nb_status shuffle_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    if (!it->buf) {
        size_t cap = (size_t)(ds->buffer_size < 1024 ? ds->buffer_size : 1024);
        it->buf = calloc(cap, sizeof *it->buf);
        if (!it->buf)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_shuffle: out of host memory for a buffer of %zu",
                            cap);
        it->pos = (int64_t)cap; /* the buffer's capacity */
    }
    while (!it->input_done && it->buf_n < ds->buffer_size) { /* fill */
        if (it->buf_n == it->pos) {
            int64_t cap = it->pos * 2 < ds->buffer_size ? it->pos * 2 : ds->buffer_size;
            elem *b = realloc(it->buf, sizeof *b * (size_t)cap);
            if (!b)
                return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_shuffle: out of host memory for a buffer of %lld",
                                (long long)cap);
            it->buf = b;
            it->pos = cap;
        }
        elem *slot = &it->buf[it->buf_n];
        memset(slot, 0, sizeof *slot);
        nb_status st = it_next(it->input, slot);
        if (st == END)
            it->input_done = true;
        else if (st)
            return st;
        else
            it->buf_n++;
    }
    if (it->buf_n == 0)
        return END;
    int64_t k = draw(&it->rng, it->buf_n);
    *e = it->buf[k];
    if (!it->input_done) { /* refill the slot */
        elem *slot = &it->buf[k];
        memset(slot, 0, sizeof *slot);
        nb_status st = it_next(it->input, slot);
        if (st == NB_OK)
            return NB_OK;
        if (st != END) {
            it->buf[k] = *e; /* keep it for freeing */
            memset(e, 0, sizeof *e);
            return st;
        }
        it->input_done = true;
    }
    it->buf[k] = it->buf[--it->buf_n];
    return NB_OK;
}

/* ---- repeat, batch, map ---------------------------------------------------------- */

static nb_status repeat_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    for (;;) {
        if (ds->count >= 0 && it->pos >= ds->count)
            return END;
        if (!it->input) {
            it->input = it_new(ds->input);
            if (!it->input)
                return nb_error();
            it->got_any = false;
        }
        nb_status st = it_next(it->input, e);
        if (st != END) {
            it->got_any |= st == NB_OK;
            return st;
        }
        it_free(it->input);
        it->input = NULL;
        it->pos++;
        if (!it->got_any)
            return END; /* an empty pass: every later one would be empty too */
    }
}

/* Stacks (or, for rows of one tensor source, gathers) k elements into e. */
static nb_status batch_make(const nb_dataset *ds, elem *parts, int64_t k, elem *e)
{
    int n = ds->n;
    bool rows = true;
    for (int64_t j = 0; j < k; j++)
        rows &= parts[j].src == parts[0].src && parts[j].src != NULL;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    nb_status st = NB_OK;
    nb_tensor *out[NB_DATASET_MAX_COMPONENTS] = {0};
    if (rows) {
        const nb_dataset *src = parts[0].src;
        int64_t *idx = malloc(sizeof *idx * (size_t)k);
        if (!idx) {
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_batch: out of host memory");
        } else {
            for (int64_t j = 0; j < k; j++)
                idx[j] = parts[j].row;
            for (int i = 0; i < n && st == NB_OK; i++) {
                const char *dev = nb_tensor_device(src->tensors[i]);
                if ((st = nb_device_push(dev)) != NB_OK)
                    break;
                nb_tensor *ix = nb_from_buffer(NB_I64, NB_SHAPE(k), idx);
                out[i] = ix ? nb_gather(src->tensors[i], ix) : NULL;
                nb_device_pop();
                if (!out[i])
                    st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
            }
            free(idx);
        }
    } else {
        nb_tensor **xs = malloc(sizeof *xs * (size_t)k);
        if (!xs)
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_batch: out of host memory");
        for (int64_t j = 0; j < k && st == NB_OK; j++)
            st = elem_make(&parts[j], n);
        for (int i = 0; i < n && st == NB_OK; i++) {
            for (int64_t j = 0; j < k; j++)
                xs[j] = parts[j].t[i];
            out[i] = nb_stack((int)k, xs, 0);
            if (!out[i])
                st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        }
        free(xs);
    }
    if (st == NB_OK)
        st = elem_take(e, n, out, "nb_dataset_batch");
    nb_scope_end(s);
    return st;
}

static nb_status batch_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    if (ds->batch_size > INT32_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_dataset_batch: batch_size %lld is past nb_stack's %d",
                        (long long)ds->batch_size, INT32_MAX);
    size_t cap = (size_t)(ds->batch_size < 4096 ? ds->batch_size : 4096);
    elem *parts = calloc(cap, sizeof *parts);
    if (!parts)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_batch: out of host memory");
    int64_t k = 0;
    nb_status st = NB_OK;
    while (k < ds->batch_size) {
        if ((size_t)k == cap) {
            size_t c2 = cap * 2 < (size_t)ds->batch_size ? cap * 2 : (size_t)ds->batch_size;
            elem *p = realloc(parts, sizeof *p * c2);
            if (!p) {
                st = nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_batch: out of host memory");
                break;
            }
            memset(p + cap, 0, sizeof *p * (c2 - cap));
            parts = p;
            cap = c2;
        }
        st = it_next(it->input, &parts[k]);
        if (st)
            break;
        k++;
    }
    if (st == END && k > 0 && !(ds->drop_remainder && k < ds->batch_size))
        st = NB_OK;
    if (st == NB_OK)
        st = batch_make(ds, parts, k, e);
    for (int64_t j = 0; j < k; j++)
        elem_clear(&parts[j], ds->n);
    free(parts);
    return st;
}

static nb_status map_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    elem in = {0};
    nb_status st = it_next(it->input, &in);
    if (st == NB_OK)
        st = elem_make(&in, ds->input->n);
    if (st)
        return st;
    nb_scope *s = nb_scope_begin();
    if (!s) {
        elem_clear(&in, ds->input->n);
        return nb_error();
    }
    nb_tensor *out[NB_DATASET_MAX_COMPONENTS] = {0};
    st = ds->map(ds->user, ds->input->n, in.t, ds->n, out);
    if (st == NB_OK && nb_error())
        st = nb_error();
    if (st == NB_OK)
        st = elem_take(e, ds->n, out, "nb_dataset_map");
    else if (!nb_error())
        nb__fail(st, "nb_dataset_map: the function failed with %s", nb_status_name(st));
    nb_scope_end(s);
    elem_clear(&in, ds->input->n);
    return st;
}

/* A record's bytes (component 0, NB_U8 1-d) parsed as a tf.train.Example. */
static nb_status parse_next(nb_dataset_iterator *it, elem *e)
{
    nb_dataset *ds = it->ds;
    elem in = {0};
    nb_status st = it_next(it->input, &in);
    if (st == NB_OK)
        st = elem_make(&in, 1);
    if (st)
        return st;
    nb_tensor *rec = in.t[0];
    if (rec->dtype != NB_U8 || rec->ndim != 1) {
        char buf[64];
        st = nb__fail(NB_ERR_DTYPE, "nb_dataset_parse_examples: a record is %s %s; it must be 1-d u8 bytes",
                      nb_dtype_name(rec->dtype), nb__shape_str(rec->ndim, rec->shape, buf, sizeof buf));
        elem_clear(&in, 1);
        return st;
    }
    size_t size = (size_t)rec->numel;
    unsigned char *bytes = malloc(size ? size : 1);
    nb_scope *s = bytes ? nb_scope_begin() : NULL;
    if (!s) {
        free(bytes);
        elem_clear(&in, 1);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_parse_examples: out of host memory for %zu bytes", size);
    }
    nb_tensor *out[NB_DATASET_MAX_COMPONENTS] = {0};
    st = nb_tensor_read(rec, bytes, size);
    if (st == NB_OK && (st = nb_device_push(nb_tensor_device(rec))) == NB_OK) { /* parsed where the bytes were */
        st = nb_example_parse(bytes, size, ds->n, ds->specs, out);
        nb_device_pop();
    }
    if (st == NB_OK)
        st = elem_take(e, ds->n, out, "nb_dataset_parse_examples");
    nb_scope_end(s);
    free(bytes);
    elem_clear(&in, 1);
    return st;
}

/* ---- prefetch ------------------------------------------------------------------ */

struct prefetch_state {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    elem *ring;
    int head, count, depth;
    bool stop;
    nb_status end;  /* NB_OK while the thread runs; then END or its error */
    char msg[1024]; /* the error's message */
};

/* Copies e's tensors to the dataset's device (a new reference each). */
static nb_status to_device(const nb_dataset *ds, elem *e)
{
    nb_status st = elem_make(e, ds->n);
    if (st || !ds->device)
        return st;
    nb_scope *s = nb_scope_begin();
    if (!s)
        return nb_error();
    for (int i = 0; i < ds->n && st == NB_OK; i++) {
        nb_tensor *c = nb_to_device(e->t[i], ds->device);
        if (!c) {
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
        } else {
            nb__retain(c);
            nb__release(e->t[i]);
            e->t[i] = c;
        }
    }
    nb_scope_end(s);
    return st;
}

static void *prefetch_main(void *arg)
{
    nb_dataset_iterator *it = arg;
    prefetch_state *pf = it->pf;
    nb__thread_track();
    for (;;) {
        pthread_mutex_lock(&pf->mu);
        while (!pf->stop && pf->count == pf->depth)
            pthread_cond_wait(&pf->cv, &pf->mu);
        bool stop = pf->stop;
        pthread_mutex_unlock(&pf->mu);
        if (stop)
            break;
        elem e = {0};
        nb_status st = it_next(it->input, &e);
        if (st == NB_OK && (st = to_device(it->ds, &e)) != NB_OK)
            elem_clear(&e, it->ds->n);
        pthread_mutex_lock(&pf->mu);
        if (st == NB_OK) {
            pf->ring[(pf->head + pf->count) % pf->depth] = e;
            pf->count++;
        } else {
            pf->end = st;
            snprintf(pf->msg, sizeof pf->msg, "%s", nb_error_message());
        }
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        if (st)
            break;
    }
    nb_error_clear();
    return NULL;
}

static nb_status prefetch_start(nb_dataset_iterator *it)
{
    prefetch_state *pf = calloc(1, sizeof *pf);
    elem *ring = calloc((size_t)it->ds->depth, sizeof *ring);
    if (!pf || !ring) {
        free(pf);
        free(ring);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_iterate: out of host memory");
    }
    pf->ring = ring;
    pf->depth = it->ds->depth;
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    it->pf = pf;
    if (pthread_create(&pf->thread, NULL, prefetch_main, it) != 0) {
        pthread_mutex_destroy(&pf->mu);
        pthread_cond_destroy(&pf->cv);
        free(ring);
        free(pf);
        it->pf = NULL;
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_dataset_iterate: cannot start a prefetch thread");
    }
    return NB_OK;
}

static void prefetch_stop(nb_dataset_iterator *it)
{
    prefetch_state *pf = it->pf;
    pthread_mutex_lock(&pf->mu);
    pf->stop = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
    pthread_join(pf->thread, NULL);
    for (int j = 0; j < pf->count; j++)
        elem_clear(&pf->ring[(pf->head + j) % pf->depth], it->ds->n);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    free(pf->ring);
    free(pf);
    it->pf = NULL;
}

static nb_status prefetch_next(nb_dataset_iterator *it, elem *e)
{
    prefetch_state *pf = it->pf;
    pthread_mutex_lock(&pf->mu);
    while (pf->count == 0 && pf->end == NB_OK)
        pthread_cond_wait(&pf->cv, &pf->mu);
    nb_status st = NB_OK;
    if (pf->count > 0) {
        *e = pf->ring[pf->head];
        pf->head = (pf->head + 1) % pf->depth;
        pf->count--;
        pthread_cond_broadcast(&pf->cv);
    } else {
        st = pf->end;
    }
    pthread_mutex_unlock(&pf->mu);
    if (st != NB_OK && st != END)
        nb__fail(st, "%s", pf->msg);
    return st;
}

/* ---- iterators ----------------------------------------------------------------- */

static nb_dataset_iterator *it_new(nb_dataset *ds)
{
    nb_dataset_iterator *it = calloc(1, sizeof *it);
    if (!it)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_dataset_iterate: out of host memory");
    it->ds = ds;
    if (ds->kind == DS_SHUFFLE) {
        uint64_t pass = atomic_fetch_add(&ds->passes, 1);
        uint64_t st = ds->seed ^ 0x5DEECE66Du;
        it->rng = mix(&st) + pass * 0xD1B54A32D192ED03u;
        it->rng = mix(&it->rng);
    }
    if (ds->kind == DS_TENSORS && idx_load(ds)) {
        free(it);
        return NULL;
    }
    if (ds->kind == DS_TFRECORD && !(it->reader = nb_tfrecord_reader_open(ds->path))) {
        free(it);
        return NULL;
    }
    if (ds->input && ds->kind != DS_REPEAT && !(it->input = it_new(ds->input))) {
        free(it);
        return NULL;
    }
    if (ds->kind == DS_PREFETCH && prefetch_start(it) != NB_OK) {
        it_free(it);
        return NULL;
    }
    return it;
}

static void it_free(nb_dataset_iterator *it)
{
    if (!it)
        return;
    if (it->pf)
        prefetch_stop(it);
    for (int64_t j = 0; j < it->buf_n; j++)
        elem_clear(&it->buf[j], it->ds->n);
    free(it->buf);
    nb_tfrecord_reader_close(it->reader);
    it_free(it->input);
    free(it);
}

static nb_status it_next(nb_dataset_iterator *it, elem *e)
{
    switch (it->ds->kind) {
    case DS_TENSORS: return tensors_next(it, e);
    case DS_GENERATOR: return generator_next(it, e);
    case DS_TFRECORD: return tfrecord_next(it, e);
    case DS_PARSE: return parse_next(it, e);
    case DS_SHARD: return shard_next(it, e);
    case DS_SHUFFLE: return shuffle_next(it, e);
    case DS_REPEAT: return repeat_next(it, e);
    case DS_BATCH: return batch_next(it, e);
    case DS_MAP: return map_next(it, e);
    case DS_PREFETCH: return prefetch_next(it, e);
    }
    return nb__fail(NB_ERR_INTERNAL, "nb_dataset_next: unknown dataset kind %d", (int)it->ds->kind);
}

nb_dataset_iterator *nb_dataset_iterate(nb_dataset *ds)
{
    if (!ds)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_dataset_iterate: the dataset is NULL");
    return it_new(ds);
}

static nb_status next_element(nb_dataset_iterator *it, nb_tensor **out);

nb_status nb_dataset_next(nb_dataset_iterator *it, nb_tensor **out)
{
    /* An error already pending is set aside, so that the pipeline's functions
     * see only their own, and restored ahead of any new one. */
    if (nb_error() == NB_OK)
        return next_element(it, out);
    nb_error_saved saved;
    nb__error_stash(&saved);
    nb_status st = next_element(it, out);
    nb__error_unstash(&saved);
    return st;
}

static nb_status next_element(nb_dataset_iterator *it, nb_tensor **out)
{
    if (!it || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_dataset_next: %s is NULL", it ? "out" : "the iterator");
    int n = it->ds->n;
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (it->done == END)
        return END;
    if (it->done)
        return nb__fail(it->done, "nb_dataset_next: the iterator failed earlier with %s",
                        nb_status_name(it->done));
    elem e = {0};
    nb_status st = it_next(it, &e);
    if (st == NB_OK)
        st = elem_make(&e, n);
    if (st) {
        it->done = st;
        return st;
    }
    for (int i = 0; i < n; i++) {
        if (!nb__own(e.t[i])) { /* it was released */
            for (int j = i + 1; j < n; j++)
                nb__release(e.t[j]);
            for (int j = 0; j < n; j++)
                out[j] = NULL; /* those owned already are the scope's */
            return it->done = nb_error();
        }
        out[i] = e.t[i];
    }
    return NB_OK;
}

void nb_dataset_iterator_free(nb_dataset_iterator *it) { it_free(it); }
