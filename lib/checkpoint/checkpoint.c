/* nabla — safetensors checkpoints of variables and optimizer state, and the
 * checkpoint manager.
 *
 * Saving takes every tensor (variables through nb_read, slots through
 * nb_optimizer_get_slot), sorts the entries by name, writes a small JSON
 * header and the data to a temporary file, syncs it and renames it over the
 * target. A CPU tensor's bytes are written straight from its storage (the
 * entry holds a reference, and a read is a snapshot: an update meanwhile moves
 * the variable, not the bytes); a GPU tensor's, or any multi-byte one on a
 * big-endian host, go through a host copy. Restoring reads the 8-byte length
 * and the header only after checking them against the file's size, reads the
 * header with the strict, bounded JSON reader of lib/data/json.h against
 * safetensors' schema (an object of tensor objects and an optional
 * "__metadata__" object of strings), checks that the tensors tile the data
 * exactly, checks every requested tensor, and only then reads bytes. The
 * plain CPU variables' bytes are read first, in one read split over the
 * thread pool, straight into the tensors their updates would write (each
 * one's own value when no read holds it, else a fresh one, as lib/variable's
 * copy-on-write does); the other variables, and slots, are then read into a
 * new tensor each and assigned. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "lib/core/core.h"
#include "lib/core/recording.h"
#include "lib/data/json.h"
#include "lib/variable/variable_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nabla/checkpoint.h>

#define HEADER_MAX (100u << 20) /* the Python package's own limit on the header */
#define IO_CHUNK ((size_t)4 << 20) /* a write's unit of writeback; the least a read hands another thread */

/* ---- dtypes --------------------------------------------------------------------- */

/* Every safetensors dtype, so a file's layout can be checked whole; nabla's
 * dtype for the ones it has, else -1. */
static const struct {
    const char *name;
    int size;
    int nb;
} g_dtypes[] = {
    {"F32", 4, NB_F32},   {"F64", 8, NB_F64},  {"F16", 2, NB_F16},    {"BF16", 2, NB_BF16},
    {"I32", 4, NB_I32},   {"I64", 8, NB_I64},  {"U8", 1, NB_U8},      {"BOOL", 1, NB_BOOL},
    {"I8", 1, -1},        {"I16", 2, -1},      {"U16", 2, -1},        {"U32", 4, -1},
    {"U64", 8, -1},       {"F8_E5M2", 1, -1},  {"F8_E4M3", 1, -1},
};
#define N_DTYPES ((int)(sizeof g_dtypes / sizeof *g_dtypes))

static int dtype_index_of_nb(nb_dtype dt)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (g_dtypes[i].nb == (int)dt)
            return i;
    return -1;
}

static bool host_little(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* Reverses each elem-byte element in place (a big-endian host). */
static void swap_bytes(uint8_t *p, size_t n, int elem)
{
    if (elem <= 1 || host_little())
        return;
    for (size_t i = 0; i + (size_t)elem <= n; i += (size_t)elem)
        for (int a = 0, b = elem - 1; a < b; a++, b--) {
            uint8_t t = p[i + a];
            p[i + a] = p[i + b];
            p[i + b] = t;
        }
}

/* ---- a growing string ----------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        b->failed = true;
    else
        sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal of s. */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            sb_printf(b, "\\u%04x", *c);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- saving --------------------------------------------------------------------- */

typedef struct entry {
    char *name;
    int dtype;   /* index into g_dtypes */
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    const uint8_t *data; /* the bytes, little-endian: in src's storage, or host */
    uint8_t *host;       /* an owned host copy, or NULL */
    nb_tensor *src;      /* a reference to the tensor data lies in, or NULL */
    size_t bytes;
} entry;

typedef struct entries {
    entry *e;
    int n, cap;
} entries;

static void entries_free(entries *es)
{
    for (int i = 0; i < es->n; i++) {
        free(es->e[i].name);
        free(es->e[i].host);
        if (es->e[i].src)
            nb__release(es->e[i].src);
    }
    free(es->e);
}

/* Whether t's bytes can be written as they lie: a contiguous CPU tensor whose
 * elements are little-endian already, outside any capture (where reading to
 * the host is refused, as nb_tensor_read says). */
static bool writable_in_place(const nb_tensor *t, int elem)
{
    return t->device->kind == NB_DEVICE_CPU && t->contiguous && (elem == 1 || host_little()) &&
           !nb__capture_current();
}

/* Adds t under name (joined "<name>/<slot>" when slot is set): a reference to
 * t when its bytes can be written from its storage, else a host copy. NB_OK,
 * or the error with nothing added. */
static nb_status entries_add(entries *es, const char *who, const char *path, const char *name, const char *slot,
                             const nb_tensor *t)
{
    if (es->n == es->cap) {
        int cap = es->cap ? 2 * es->cap : 16;
        entry *e = realloc(es->e, sizeof *e * (size_t)cap);
        if (!e)
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory", who, path);
        es->e = e;
        es->cap = cap;
    }
    entry *e = &es->e[es->n];
    memset(e, 0, sizeof *e);
    e->dtype = dtype_index_of_nb(t->dtype);
    if (e->dtype < 0)
        return nb__fail(NB_ERR_DTYPE, "%s: %s: tensor '%s' has dtype %s, which safetensors lacks", who, path, name,
                        nb_dtype_name(t->dtype));
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    e->bytes = (size_t)t->numel * nb_dtype_size(t->dtype);
    size_t nlen = strlen(name), slen = slot ? strlen(slot) + 1 : 0;
    bool direct = e->bytes == 0 || writable_in_place(t, g_dtypes[e->dtype].size);
    e->name = malloc(nlen + slen + 1);
    e->host = direct ? NULL : malloc(e->bytes);
    if (!e->name || (!direct && !e->host)) {
        free(e->name);
        free(e->host);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory for tensor '%s'", who, path, name);
    }
    memcpy(e->name, name, nlen);
    if (slot) {
        e->name[nlen] = '/';
        memcpy(e->name + nlen + 1, slot, slen - 1);
    }
    e->name[nlen + slen] = '\0';
    if (direct) {
        if (e->bytes) {
            nb__retain((nb_tensor *)t);
            e->src = (nb_tensor *)t;
            e->data = nb__data(t);
        }
        es->n++;
        return NB_OK;
    }
    nb_status st = nb_tensor_read(t, e->host, e->bytes);
    if (st) {
        free(e->name);
        free(e->host);
        return st;
    }
    swap_bytes(e->host, e->bytes, g_dtypes[e->dtype].size);
    e->data = e->host;
    es->n++;
    return NB_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* The variables to act on: vars, or a new list of every registered one (*owned
 * set then; the caller frees it). */
static nb_variable *const *variables_or_all(const char *who, int *n, nb_variable *const *vars, nb_variable ***owned)
{
    *owned = NULL;
    if (vars && *n > 0)
        return vars;
    for (;;) {
        int count = nb_variables_list(NULL, 0);
        nb_variable **all = malloc(sizeof *all * (size_t)(count ? count : 1));
        if (!all)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        int again = nb_variables_list(all, count);
        if (again <= count) {
            *n = again;
            *owned = all;
            return all;
        }
        free(all); /* variables were made meanwhile: list again */
    }
}

/* Builds the header JSON (padded) for sorted entries and metadata pairs. */
static void build_header(sbuf *b, const entries *es, char meta[][2][64], int n_meta)
{
    sb_puts(b, "{");
    if (n_meta) {
        sb_puts(b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i)
                sb_puts(b, ",");
            sb_json_string(b, meta[i][0]);
            sb_puts(b, ":");
            sb_json_string(b, meta[i][1]);
        }
        sb_puts(b, "}");
    }
    uint64_t off = 0;
    for (int i = 0; i < es->n; i++) {
        const entry *e = &es->e[i];
        if (i || n_meta)
            sb_puts(b, ",");
        sb_json_string(b, e->name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", g_dtypes[e->dtype].name);
        for (int d = 0; d < e->ndim; d++)
            sb_printf(b, "%s%" PRId64, d ? "," : "", e->shape[d]);
        sb_printf(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + e->bytes);
        off += e->bytes;
    }
    sb_puts(b, "}");
    while (!b->failed && b->len % 8)
        sb_puts(b, " ");
}

/* Writes all n bytes of buf to fd, retrying interrupted and partial writes.
 * Returns 0, an errno, or -1 for a write that made no progress. */
static int write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 && errno ? errno : -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* A file being written whose pages are handed to the disk as they fill, so
 * that the final fsync waits for the last few only. */
typedef struct writer {
    int fd;
    uint64_t written, started; /* bytes written; bytes whose writeback was started */
} writer;

/* Writes all n bytes of buf at the end of w, starting the writeback of every
 * IO_CHUNK written. Returns write_all's answer. */
static int writer_put(writer *w, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        size_t k = n < IO_CHUNK ? n : IO_CHUNK;
        int err = write_all(w->fd, p, k);
        if (err)
            return err;
        p += k;
        n -= k;
        w->written += k;
#ifdef SYNC_FILE_RANGE_WRITE
        /* Only starts the writes (no wait, no durability): fsync still
         * decides. A failure here is fsync's to report. */
        if (w->written - w->started >= IO_CHUNK) {
            (void)sync_file_range(w->fd, (off_t)w->started, (off_t)(w->written - w->started), SYNC_FILE_RANGE_WRITE);
            w->started = w->written;
        }
#endif
    }
    return 0;
}

/* Writes header and entries to path atomically (see checkpoint.h). */
static nb_status write_file_atomic(const char *who, const char *path, const sbuf *header, const entries *es)
{
    char tmp[PATH_MAX];
    int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (len < 0 || (size_t)len >= sizeof tmp)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: path '%s' is too long", who, path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return nb__fail(NB_ERR_IO, "%s: %s: cannot create '%s': %s", who, path, tmp, strerror(errno));
    uint8_t len8[8];
    uint64_t hl = header->len;
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(hl >> (8 * i));
    /* Unbuffered writes straight from the entries: no copy through stdio. */
    writer w = {fd, 0, 0};
    int err = writer_put(&w, len8, 8);
    if (!err)
        err = writer_put(&w, header->p, header->len);
    for (int i = 0; !err && i < es->n; i++)
        err = writer_put(&w, es->e[i].data, es->e[i].bytes);
    if (!err && fsync(fd) != 0)
        err = errno ? errno : -1;
    if (close(fd) != 0 && !err)
        err = errno ? errno : -1;
    if (!err && rename(tmp, path) != 0)
        err = errno ? errno : -1;
    if (err) {
        unlink(tmp);
        return nb__fail(NB_ERR_IO, "%s: %s: writing failed: %s", who, path, err > 0 ? strerror(err) : "short write");
    }
    /* The rename is durable once the directory is synced. */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return NB_OK;
}

/* The optimizer's hyper-parameters as they are saved. */
static const char *const g_hyper[] = {"learning_rate", "momentum", "nesterov", "beta1", "beta2", "epsilon",
                                      "weight_decay"};
#define N_HYPER ((int)(sizeof g_hyper / sizeof *g_hyper))

nb_status nb_checkpoint_save(const char *path, int n, nb_variable *const *vars, const nb_optimizer *opt_c)
{
    const char *who = "nb_checkpoint_save";
    if (!path || !*path)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: path is %s", who, path ? "empty" : "NULL");
    if (n < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: n is %d", who, path, n);
    nb_optimizer *opt = (nb_optimizer *)opt_c; /* only read: slots are copied out */
    nb_variable **owned;
    nb_variable *const *list = variables_or_all(who, &n, vars, &owned);
    if (!list)
        return nb_error();

    entries es = {0};
    nb_status st = NB_OK;
    int token = nb__tapes_pause(); /* reading for a file is no part of a computation */
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
    const char *const *slot_names = NULL;
    int n_slots = nb_optimizer_slot_names(opt, &slot_names);
    for (int i = 0; i < n && !st; i++) {
        nb_variable *v = list[i];
        if (!v) {
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: variable %d is NULL", who, path, i);
            break;
        }
        const char *name = nb_variable_name(v);
        if (strcmp(name, "__metadata__") == 0 || !*name) {
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: variable %d is named '%s', which a file cannot hold",
                          who, path, i, name);
            break;
        }
        nb_tensor *t = nb_read(v);
        st = t ? entries_add(&es, who, path, name, NULL, t) : nb_error();
        for (int s = 0; s < n_slots && !st; s++) {
            nb_tensor *slot = nb_optimizer_get_slot(opt, v, slot_names[s]);
            if (slot)
                st = entries_add(&es, who, path, name, slot_names[s], slot);
            else if (nb_error())
                st = nb_error();
        }
    }
    if (scope)
        nb_scope_end(scope);
    nb__tapes_resume(token);
    free(owned);

    if (!st) {
        if (es.n > 1) /* (qsort wants a non-NULL array even for none) */
            qsort(es.e, (size_t)es.n, sizeof *es.e, entry_cmp);
        for (int i = 1; i < es.n && !st; i++)
            if (strcmp(es.e[i - 1].name, es.e[i].name) == 0)
                st = nb__fail(NB_ERR_INVALID_ARGUMENT,
                              "%s: %s: two tensors are named '%s' (two variables, or a variable and a slot)", who,
                              path, es.e[i].name);
    }
    if (!st) {
        char meta[2 + N_HYPER][2][64];
        int n_meta = 0;
        snprintf(meta[n_meta][0], 64, "format");
        snprintf(meta[n_meta++][1], 64, "nabla");
        if (opt) {
            snprintf(meta[n_meta][0], 64, "nabla.optimizer");
            snprintf(meta[n_meta++][1], 64, "%s", nb_optimizer_kind(opt));
            snprintf(meta[n_meta][0], 64, "nabla.optimizer.iterations");
            snprintf(meta[n_meta++][1], 64, "%" PRId64, nb_optimizer_iterations(opt));
            for (int h = 0; h < N_HYPER; h++) {
                double x = nb_optimizer_hyperparameter(opt, g_hyper[h]);
                if (isnan(x))
                    continue;
                snprintf(meta[n_meta][0], 64, "nabla.optimizer.%s", g_hyper[h]);
                snprintf(meta[n_meta++][1], 64, "%.17g", x);
            }
        }
        sbuf header = {0};
        build_header(&header, &es, meta, n_meta);
        if (header.failed)
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory for the header", who, path);
        else
            st = write_file_atomic(who, path, &header, &es);
        free(header.p);
    }
    entries_free(&es);
    return st;
}

/* ---- the header's schema, read with json.h -------------------------------------- */

typedef struct tensor_info {
    char *name;
    int dtype; /* index into g_dtypes */
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    uint64_t begin, end;
} tensor_info;

typedef struct header {
    tensor_info *t;
    int n, cap;
    char **meta; /* key, value, key, value, ... */
    int n_meta;
} header;

static void header_free(header *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->t[i].name);
    free(h->t);
    for (int i = 0; i < 2 * h->n_meta; i++)
        free(h->meta[i]);
    free(h->meta);
}

/* "[a, b, ...]" of at most max non-negative integers; returns the count or -1. */
static int parse_uint_array(nb_json *js, uint64_t *out, int max, const char *what, const char *name)
{
    if (!nb__json_expect(js, '['))
        return -1;
    int n = 0;
    if (nb__json_peek(js) == ']') {
        js->p++;
        return 0;
    }
    for (;;) {
        uint64_t x = 0;
        if (n == max) {
            nb__json_fail(js, "tensor '%s': %s has more than %d entries", name, what, max);
            return -1;
        }
        if (!nb__json_uint(js, &x))
            return -1;
        out[n++] = x;
        int more = nb__json_next(js, ']');
        if (more > 0)
            continue;
        if (more == 0)
            return n;
        nb__json_fail(js, "tensor '%s': expected ',' or ']' in %s", name, what);
        return -1;
    }
}

static bool parse_metadata(nb_json *js, header *h)
{
    if (!nb__json_expect(js, '{'))
        return false;
    if (nb__json_peek(js) == '}') {
        js->p++;
        return true;
    }
    for (;;) {
        char *k = nb__json_string(js);
        if (!k)
            return false;
        for (int i = 0; i < h->n_meta; i++)
            if (strcmp(h->meta[2 * i], k) == 0) {
                nb__json_fail(js, "__metadata__ holds '%s' twice", k);
                free(k);
                return false;
            }
        if (!nb__json_expect(js, ':')) {
            free(k);
            return false;
        }
        if (nb__json_peek(js) != '"') {
            nb__json_fail(js, "__metadata__ value of '%s' is not a string", k);
            free(k);
            return false;
        }
        char *v = nb__json_string(js);
        if (!v) {
            free(k);
            return false;
        }
        char **m = realloc(h->meta, sizeof *m * (size_t)(2 * h->n_meta + 2));
        if (!m) {
            free(k);
            free(v);
            return nb__json_fail(js, "out of host memory");
        }
        h->meta = m;
        m[2 * h->n_meta] = k;
        m[2 * h->n_meta + 1] = v;
        h->n_meta++;
        int more = nb__json_next(js, '}');
        if (more > 0)
            continue;
        if (more == 0)
            return true;
        return nb__json_fail(js, "expected ',' or '}' in __metadata__");
    }
}

/* One tensor's object {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static bool parse_tensor(nb_json *js, tensor_info *t)
{
    if (!nb__json_expect(js, '{'))
        return false;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    if (nb__json_peek(js) == '}')
        return nb__json_fail(js, "tensor '%s' has no dtype, shape or data_offsets", t->name);
    for (;;) {
        char *k = nb__json_string(js);
        if (!k)
            return false;
        bool ok = nb__json_expect(js, ':');
        if (ok && strcmp(k, "dtype") == 0 && !have_dtype) {
            have_dtype = true;
            char *d = nb__json_string(js);
            ok = d != NULL;
            t->dtype = -1;
            for (int i = 0; ok && i < N_DTYPES; i++)
                if (strcmp(d, g_dtypes[i].name) == 0)
                    t->dtype = i;
            if (ok && t->dtype < 0)
                ok = nb__json_fail(js, "tensor '%s' has unknown dtype '%.32s'", t->name, d);
            free(d);
        } else if (ok && strcmp(k, "shape") == 0 && !have_shape) {
            have_shape = true;
            uint64_t dims[NB_MAX_DIMS];
            int nd = parse_uint_array(js, dims, NB_MAX_DIMS, "shape", t->name);
            ok = nd >= 0;
            t->ndim = ok ? nd : 0;
            for (int i = 0; i < t->ndim; i++)
                t->shape[i] = (int64_t)dims[i];
        } else if (ok && strcmp(k, "data_offsets") == 0 && !have_offsets) {
            have_offsets = true;
            uint64_t off[2];
            int no = parse_uint_array(js, off, 2, "data_offsets", t->name);
            ok = no >= 0;
            if (ok && no != 2)
                ok = nb__json_fail(js, "tensor '%s': data_offsets has %d entries, not 2", t->name, no);
            if (ok && off[1] < off[0])
                ok = nb__json_fail(js, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", t->name,
                          off[0], off[1]);
            if (ok) {
                t->begin = off[0];
                t->end = off[1];
            }
        } else if (ok) {
            ok = nb__json_fail(js, "tensor '%s' has %s key '%.32s'", t->name,
                      strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets") ? "an unknown" : "a repeated",
                      k);
        }
        free(k);
        if (!ok)
            return false;
        int more = nb__json_next(js, '}');
        if (more > 0)
            continue;
        if (more == 0)
            break;
        return nb__json_fail(js, "tensor '%s': expected ',' or '}'", t->name);
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return nb__json_fail(js, "tensor '%s' lacks %s", t->name, !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return true;
}

static bool parse_header(nb_json *js, header *h)
{
    if (!nb__json_expect(js, '{'))
        return false;
    bool have_meta = false;
    if (nb__json_peek(js) == '}') {
        js->p++;
    } else {
        for (;;) {
            char *k = nb__json_string(js);
            if (!k)
                return false;
            if (!nb__json_expect(js, ':')) {
                free(k);
                return false;
            }
            if (strcmp(k, "__metadata__") == 0) {
                free(k);
                if (have_meta)
                    return nb__json_fail(js, "__metadata__ appears twice");
                have_meta = true;
                if (!parse_metadata(js, h))
                    return false;
            } else {
                if (h->n == h->cap) {
                    int cap = h->cap ? 2 * h->cap : 16;
                    tensor_info *t = realloc(h->t, sizeof *t * (size_t)cap);
                    if (!t) {
                        free(k);
                        return nb__json_fail(js, "out of host memory");
                    }
                    h->t = t;
                    h->cap = cap;
                }
                tensor_info *t = &h->t[h->n++];
                memset(t, 0, sizeof *t);
                t->name = k;
                if (!parse_tensor(js, t))
                    return false;
            }
            int more = nb__json_next(js, '}');
            if (more > 0)
                continue;
            if (more == 0)
                break;
            return nb__json_fail(js, "expected ',' or '}' after a tensor");
        }
    }
    if (nb__json_peek(js) != 0)
        return nb__json_fail(js, "bytes after the header's object");
    return true;
}

static int info_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tensor_info *)a)->name, ((const tensor_info *)b)->name);
}

static int info_begin_cmp(const void *a, const void *b)
{
    const tensor_info *x = *(const tensor_info *const *)a, *y = *(const tensor_info *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Checks names unique, sizes against shapes, and that the tensors tile the
 * data_len bytes of data exactly. NB_OK or NB_ERR_IO. */
static nb_status check_layout(const char *who, const char *path, header *h, uint64_t data_len)
{
    if (h->n > 1)
        qsort(h->t, (size_t)h->n, sizeof *h->t, info_name_cmp);
    for (int i = 1; i < h->n; i++)
        if (strcmp(h->t[i - 1].name, h->t[i].name) == 0)
            return nb__fail(NB_ERR_IO, "%s: %s: tensor '%s' appears twice in the header", who, path, h->t[i].name);
    for (int i = 0; i < h->n; i++) {
        tensor_info *t = &h->t[i];
        uint64_t bytes = (uint64_t)g_dtypes[t->dtype].size;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t dim = (uint64_t)t->shape[d];
            if (dim && bytes > (UINT64_C(1) << 62) / dim)
                return nb__fail(NB_ERR_IO, "%s: %s: tensor '%s': its shape holds more than 2^62 bytes", who, path,
                                t->name);
            bytes *= dim;
        }
        if (t->end > data_len)
            return nb__fail(NB_ERR_IO,
                            "%s: %s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] lie past the %" PRIu64
                            " bytes of data (the file is truncated or the offsets out of bounds)",
                            who, path, t->name, t->begin, t->end, data_len);
        if (t->end - t->begin != bytes)
            return nb__fail(NB_ERR_IO,
                            "%s: %s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                            " bytes; its dtype and shape need %" PRIu64,
                            who, path, t->name, t->begin, t->end, t->end - t->begin, bytes);
    }
    tensor_info **by = malloc(sizeof *by * (size_t)(h->n > 0 ? h->n : 1));
    if (!by)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory", who, path);
    for (int i = 0; i < h->n; i++)
        by[i] = &h->t[i];
    qsort(by, (size_t)h->n, sizeof *by, info_begin_cmp);
    uint64_t at = 0;
    nb_status st = NB_OK;
    for (int i = 0; i < h->n && !st; i++) {
        if (by[i]->begin < at)
            st = nb__fail(NB_ERR_IO, "%s: %s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                     "] overlap tensor '%s'", who, path, by[i]->name, by[i]->begin, by[i]->end,
                          by[i - 1]->name);
        else if (by[i]->begin > at)
            st = nb__fail(NB_ERR_IO, "%s: %s: tensor '%s': data_offsets begin at %" PRIu64
                                     ", leaving bytes %" PRIu64 " to %" PRIu64 " of the data unused", who, path,
                          by[i]->name, by[i]->begin, at, by[i]->begin);
        at = by[i]->end;
    }
    if (!st && at != data_len)
        st = nb__fail(NB_ERR_IO, "%s: %s: the tensors cover %" PRIu64 " of the %" PRIu64
                                 " bytes of data (the file has bytes no tensor names)", who, path, at, data_len);
    free(by);
    return st;
}

static const tensor_info *find_info(const header *h, const char *name)
{
    tensor_info key = {.name = (char *)name};
    return h->n > 0 ? bsearch(&key, h->t, (size_t)h->n, sizeof *h->t, info_name_cmp) : NULL;
}

static const char *find_meta(const header *h, const char *key)
{
    for (int i = 0; i < h->n_meta; i++)
        if (strcmp(h->meta[2 * i], key) == 0)
            return h->meta[2 * i + 1];
    return NULL;
}

/* Checks tensor name in the file against a variable's dtype and shape. */
static nb_status check_against(const char *who, const char *path, const tensor_info *t, const char *name,
                               nb_variable *v)
{
    if (!t)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: no tensor '%s' in the file", who, path, name);
    nb_dtype dt = nb_variable_dtype(v);
    nb_shape s = nb_variable_shape(v);
    bool same = s.ndim == t->ndim;
    for (int d = 0; same && d < s.ndim; d++)
        same = s.dims[d] == t->shape[d];
    if (!same || g_dtypes[t->dtype].nb != (int)dt) {
        char sv[NB_SHAPE_STR_MAX], sf[NB_SHAPE_STR_MAX];
        int fi = dtype_index_of_nb(dt);
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: tensor '%s' is %s %s in the file; variable '%s' is %s %s",
                        who, path, name, g_dtypes[t->dtype].name, nb__shape_str(t->ndim, t->shape, sf, sizeof sf),
                        nb_variable_name(v), fi >= 0 ? g_dtypes[fi].name : nb_dtype_name(dt),
                        nb_shape_format(s, sv, sizeof sv));
    }
    return NB_OK;
}

/* Reads all n bytes at offset at of fd into buf, retrying interrupted and
 * partial reads. Returns false on an error or end of file. */
static bool read_at(int fd, void *buf, size_t n, uint64_t at)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        at += (uint64_t)k;
        n -= (size_t)k;
    }
    return true;
}

/* A tensor's bytes in the file and the host memory they go to; before: the
 * bytes of the spans before it in one read_spans call. */
typedef struct span {
    const tensor_info *t;
    uint8_t *dst;
    uint64_t before;
} span;

typedef struct read_job {
    int fd;
    uint64_t data_start;
    const span *s;
    int n;
    atomic_int failed; /* the first span found unreadable, or -1 */
} read_job;

/* Reads bytes [begin, end) of the spans laid end to end. */
static void read_range(void *ctx, int64_t begin, int64_t end)
{
    read_job *j = ctx;
    uint64_t b = (uint64_t)begin, e = (uint64_t)end;
    int lo = 0, hi = j->n - 1; /* the last span that starts at or before b */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->s[mid].before <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int i = lo; i < j->n && j->s[i].before < e; i++) {
        const span *s = &j->s[i];
        uint64_t len = s->t->end - s->t->begin;
        uint64_t from = b > s->before ? b - s->before : 0, to = e - s->before < len ? e - s->before : len;
        if (from < to && !read_at(j->fd, s->dst + from, (size_t)(to - from), j->data_start + s->t->begin + from)) {
            int none = -1;
            atomic_compare_exchange_strong(&j->failed, &none, i);
        }
    }
}

/* Reads n spans' bytes from fd (their before fields are filled here) and makes
 * them host-endian. The bytes of all of them are split over the thread pool
 * at once, as copies from the page cache go faster on several cores. Returns
 * NB_OK or NB_ERR_IO (a short read: the file shrank or the disk failed), with
 * the spans then partly written. */
static nb_status read_spans(const char *who, const char *path, int fd, uint64_t data_start, span *s, int n)
{
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        s[i].before = total;
        total += s[i].t->end - s[i].t->begin;
    }
    read_job j = {fd, data_start, s, n, -1};
    if (total)
        nb__parallel_for((int64_t)total, (int64_t)IO_CHUNK, read_range, &j);
    int bad = atomic_load(&j.failed);
    if (bad >= 0)
        return nb__fail(NB_ERR_IO, "%s: %s: tensor '%s': could not read its %zu bytes (truncated?)", who, path,
                        s[bad].t->name, (size_t)(s[bad].t->end - s[bad].t->begin));
    for (int i = 0; i < n; i++)
        swap_bytes(s[i].dst, (size_t)(s[i].t->end - s[i].t->begin), g_dtypes[s[i].t->dtype].size);
    return NB_OK;
}

/* Reads tensor t's bytes from fd and makes a tensor of them on device dev
 * (owned by the current scope); NULL and the error on failure. On the CPU the
 * bytes are read straight into the tensor's storage; another device gets them
 * through a host buffer. */
static nb_tensor *load_tensor(const char *who, const char *path, int fd, uint64_t data_start,
                              const tensor_info *t, const char *dev)
{
    size_t bytes = (size_t)(t->end - t->begin);
    nb_shape s = {t->ndim, {0}};
    memcpy(s.dims, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    if (nb_device_push(dev) != NB_OK)
        return NULL;
    nb_tensor *x = nb_empty((nb_dtype)g_dtypes[t->dtype].nb, s);
    nb_device_pop();
    if (!x || bytes == 0)
        return x;
    bool host = x->device->kind == NB_DEVICE_CPU;
    uint8_t *buf = host ? nb__data(x) : malloc(bytes);
    if (!buf)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory for tensor '%s' (%zu bytes)", who, path,
                             t->name, bytes);
    span one = {t, buf, 0};
    if (read_spans(who, path, fd, data_start, &one, 1) != NB_OK) {
        if (!host)
            free(buf);
        return NULL;
    }
    if (!host) {
        nb_status st = x->device->backend->copy_from_host(x->device, nb__data(x), buf, bytes);
        free(buf);
        if (st != NB_OK)
            return NULL;
    }
    return x;
}

/* Whether v is restored by restore_in_place: a plain variable on the CPU,
 * outside any capture. A mirrored variable has a value per replica, which
 * nb_variable_assign writes; a capture must see the write as an assignment's
 * kernel. */
static bool in_place_ok(nb_variable *v)
{
    return !nb__variable_mirror_owner(v) && !nb__capture_current() &&
           nb__variable_value(v)->device->kind == NB_DEVICE_CPU;
}

/* Restores the n variables of list that in_place_ok takes by reading their
 * bytes, all in one read_spans, into the tensors their updates would write:
 * each one's own value, unless a read still holds that (then a fresh tensor,
 * so the read keeps its values). This skips load_tensor's new tensor and
 * nb_variable_assign's copy of it. Returns NB_OK, or the error with no
 * variable moved; after a failed read those written in place may hold part
 * of the file's bytes. */
static nb_status restore_in_place(const char *who, const char *path, int fd, uint64_t data_start, const header *h,
                                  int n, nb_variable *const *list)
{
    span *s = malloc(sizeof *s * (size_t)(n > 0 ? n : 1));
    nb_variable **vs = malloc(sizeof *vs * (size_t)(n > 0 ? n : 1));
    nb_tensor **dst = malloc(sizeof *dst * (size_t)(n > 0 ? n : 1));
    nb_status st = s && vs && dst ? NB_OK : nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory", who, path);
    int m = 0;
    for (int i = 0; i < n && !st; i++) {
        if (!in_place_ok(list[i]))
            continue;
        nb_tensor *d = nb__variable_update_target(list[i], who);
        if (!d) {
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
            break;
        }
        vs[m] = list[i];
        dst[m] = d;
        s[m] = (span){find_info(h, nb_variable_name(list[i])), nb__data(d), 0};
        m++;
    }
    if (!st)
        st = read_spans(who, path, fd, data_start, s, m);
    for (int k = 0; k < m; k++) {
        if (!st)
            nb__variable_commit(vs[k], dst[k]);
        else if (dst[k] != nb__variable_value(vs[k]))
            nb__release(dst[k]);
    }
    free(s);
    free(vs);
    free(dst);
    return st;
}

/* Parses a decimal int64 >= 0 with nothing after it. */
static bool parse_count(const char *s, int64_t *out)
{
    if (!s || !*s)
        return false;
    int64_t x = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || x > (INT64_MAX - 9) / 10)
            return false;
        x = x * 10 + (*s - '0');
    }
    *out = x;
    return true;
}

nb_status nb_checkpoint_restore(const char *path, int n, nb_variable *const *vars, nb_optimizer *opt)
{
    const char *who = "nb_checkpoint_restore";
    if (!path || !*path)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: path is %s", who, path ? "empty" : "NULL");
    if (n < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: n is %d", who, path, n);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return nb__fail(NB_ERR_IO, "%s: %s: cannot open: %s", who, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return nb__fail(NB_ERR_IO, "%s: %s: not a regular file", who, path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    uint8_t len8[8];
    if (size < 8 || !read_at(fd, len8, 8, 0)) {
        close(fd);
        return nb__fail(NB_ERR_IO, "%s: %s: %" PRIu64 " bytes, too short for the 8-byte header length", who, path,
                        size);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > size - 8 || hlen > HEADER_MAX || hlen < 2) {
        close(fd);
        return nb__fail(NB_ERR_IO, "%s: %s: header length %" PRIu64 " %s (the file holds %" PRIu64 " bytes)", who,
                        path, hlen, hlen < 2 ? "is too small" : hlen > size - 8 ? "runs past the end of the file"
                                                                                   : "is past the 100 MiB limit",
                        size);
    }
    char *text = malloc((size_t)hlen);
    if (!text) {
        close(fd);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: %s: out of host memory for the header", who, path);
    }
    if (!read_at(fd, text, (size_t)hlen, 8)) {
        free(text);
        close(fd);
        return nb__fail(NB_ERR_IO, "%s: %s: could not read the %" PRIu64 "-byte header (truncated?)", who, path, hlen);
    }
    header h = {0};
    nb_json js = nb__json_reader(text, (size_t)hlen, "header");
    nb_status st = parse_header(&js, &h)
                       ? NB_OK
                       : nb__fail(NB_ERR_IO, "%s: %s: malformed safetensors header: %s", who, path, js.error);
    free(text);
    uint64_t data_start = 8 + hlen;
    if (!st)
        st = check_layout(who, path, &h, size - data_start);

    nb_variable **owned = NULL;
    nb_variable *const *list = NULL;
    if (!st && !(list = variables_or_all(who, &n, vars, &owned)))
        st = nb_error();
    const char *const *slot_names = NULL;
    int n_slots = nb_optimizer_slot_names(opt, &slot_names);
    int64_t iterations = 0;
    if (!st && opt) {
        const char *kind = find_meta(&h, "nabla.optimizer");
        if (!kind)
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: the file holds no optimizer state", who, path);
        else if (strcmp(kind, nb_optimizer_kind(opt)) != 0)
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: the file holds %s optimizer state; the optimizer is %s",
                          who, path, kind, nb_optimizer_kind(opt));
        else if (!parse_count(find_meta(&h, "nabla.optimizer.iterations"), &iterations))
            st = nb__fail(NB_ERR_IO, "%s: %s: __metadata__ 'nabla.optimizer.iterations' is missing or not a count",
                          who, path);
    }
    /* Every check before anything changes. */
    char name[4096];
    for (int i = 0; i < n && !st; i++) {
        nb_variable *v = list[i];
        if (!v) {
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s: variable %d is NULL", who, path, i);
            break;
        }
        st = check_against(who, path, find_info(&h, nb_variable_name(v)), nb_variable_name(v), v);
        for (int s = 0; s < n_slots && !st; s++) {
            snprintf(name, sizeof name, "%s/%s", nb_variable_name(v), slot_names[s]);
            const tensor_info *t = find_info(&h, name);
            if (t)
                st = check_against(who, path, t, name, v);
        }
    }
    /* Then the values: plain CPU variables at once, then the others and the slots. */
    int token = nb__tapes_pause();
    if (!st)
        st = restore_in_place(who, path, fd, data_start, &h, n, list);
    for (int i = 0; i < n && !st; i++) {
        nb_variable *v = list[i];
        nb_scope *scope = nb_scope_begin();
        if (!scope) {
            st = nb_error() ? nb_error() : NB_ERR_INTERNAL;
            break;
        }
        const char *dev = nb_variable_device(v);
        if (!in_place_ok(v)) {
            nb_tensor *x = load_tensor(who, path, fd, data_start, find_info(&h, nb_variable_name(v)), dev);
            st = x ? nb_variable_assign(v, x) : nb_error();
        }
        for (int s = 0; s < n_slots && !st; s++) {
            snprintf(name, sizeof name, "%s/%s", nb_variable_name(v), slot_names[s]);
            const tensor_info *t = find_info(&h, name);
            if (!t)
                continue;
            nb_tensor *y = load_tensor(who, path, fd, data_start, t, dev);
            st = y ? nb_optimizer_set_slot(opt, v, slot_names[s], y) : nb_error();
        }
        nb_scope_end(scope);
    }
    nb__tapes_resume(token);
    if (!st && opt)
        st = nb_optimizer_set_iterations(opt, iterations);
    free(owned);
    header_free(&h);
    close(fd);
    return st;
}

/* ---- the manager ---------------------------------------------------------------- */

struct nb_checkpoint_manager {
    char *dir, *prefix;
    int max_to_keep;
    char *latest;
};

nb_checkpoint_manager *nb_checkpoint_manager_new(const char *dir, const char *prefix, int max_to_keep)
{
    const char *who = "nb_checkpoint_manager_new";
    if (!dir || !*dir || !prefix || !*prefix || strchr(prefix, '/'))
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %s", who,
                             !dir || !*dir ? "dir is NULL or empty" : "prefix is NULL, empty or holds a '/'");
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return nb__fail_null(NB_ERR_IO, "%s: %s is not a directory", who, dir);
    nb_checkpoint_manager *m = calloc(1, sizeof *m);
    if (m) {
        m->dir = strdup(dir);
        m->prefix = strdup(prefix);
    }
    if (!m || !m->dir || !m->prefix) {
        nb_checkpoint_manager_free(m);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    m->max_to_keep = max_to_keep;
    return m;
}

void nb_checkpoint_manager_free(nb_checkpoint_manager *m)
{
    if (!m)
        return;
    free(m->dir);
    free(m->prefix);
    free(m->latest);
    free(m);
}

/* The step of a file named "<prefix>-<digits>.safetensors", or -1. */
static int64_t step_of(const char *file, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (strncmp(file, prefix, pl) != 0 || file[pl] != '-')
        return -1;
    const char *d = file + pl + 1, *dot = strchr(d, '.');
    if (!dot || dot == d || strcmp(dot, ".safetensors") != 0 || dot - d > 18)
        return -1;
    int64_t x = 0;
    for (const char *c = d; c < dot; c++) {
        if (*c < '0' || *c > '9')
            return -1;
        x = x * 10 + (*c - '0');
    }
    return x;
}

static int step_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The steps of this manager's checkpoints in its dir, sorted; a new array (the
 * caller frees) and *n, or NULL with the error. */
static int64_t *list_steps(nb_checkpoint_manager *m, const char *who, int *n)
{
    *n = 0;
    DIR *d = opendir(m->dir);
    if (!d)
        return nb__fail_null(NB_ERR_IO, "%s: cannot list %s: %s", who, m->dir, strerror(errno));
    int cap = 16;
    int64_t *steps = malloc(sizeof *steps * (size_t)cap);
    struct dirent *e;
    while (steps && (e = readdir(d))) {
        int64_t s = step_of(e->d_name, m->prefix);
        if (s < 0)
            continue;
        if (*n == cap) {
            int64_t *grown = realloc(steps, sizeof *steps * (size_t)(cap *= 2));
            if (!grown) {
                free(steps);
                steps = NULL;
                break;
            }
            steps = grown;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    if (!steps)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    qsort(steps, (size_t)*n, sizeof *steps, step_cmp);
    return steps;
}

static char *path_of(const nb_checkpoint_manager *m, int64_t step)
{
    size_t len = strlen(m->dir) + strlen(m->prefix) + 48;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s-%" PRId64 ".safetensors", m->dir, m->prefix, step);
    return p;
}

nb_status nb_checkpoint_manager_save(nb_checkpoint_manager *m, int64_t step, int n, nb_variable *const *vars,
                                     const nb_optimizer *opt)
{
    const char *who = "nb_checkpoint_manager_save";
    if (!m || step < 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", who, !m ? "manager is NULL" : "step is negative");
    char *path = path_of(m, step);
    if (!path)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    nb_status st = nb_checkpoint_save(path, n, vars, opt);
    free(path);
    if (st || m->max_to_keep <= 0)
        return st;
    int count;
    int64_t *steps = list_steps(m, who, &count);
    if (!steps)
        return nb_error();
    for (int i = 0; i + m->max_to_keep < count && !st; i++) {
        char *old = path_of(m, steps[i]);
        if (!old)
            st = nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
        else if (unlink(old) != 0 && errno != ENOENT)
            st = nb__fail(NB_ERR_IO, "%s: cannot delete %s: %s", who, old, strerror(errno));
        free(old);
    }
    free(steps);
    return st;
}

const char *nb_checkpoint_manager_latest(nb_checkpoint_manager *m)
{
    if (!m)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "nb_checkpoint_manager_latest: manager is NULL");
    int count;
    int64_t *steps = list_steps(m, "nb_checkpoint_manager_latest", &count);
    if (!steps)
        return NULL;
    free(m->latest);
    m->latest = count ? path_of(m, steps[count - 1]) : NULL;
    free(steps);
    if (count && !m->latest)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "nb_checkpoint_manager_latest: out of host memory");
    return m->latest;
}
