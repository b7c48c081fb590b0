/* tf.train.Example parsing: finds the requested features in a serialized
 * Example with the decoder of pb_decode.h and turns their lists into tensors.
 *
 *   Example  { Features features = 1; }
 *   Features { map<string, Feature> feature = 1; }   entries: {key = 1, value = 2}
 *   Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
 *                      Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }
 *   FloatList { repeated float value = 1; }  (packed or not)
 *   Int64List { repeated int64 value = 1; }  (packed or not) */
#include "../core/core.h"
#include "pb_decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHO "nb_example_parse"

typedef struct parse {
    const uint8_t *base; /* for offsets in messages */
    int n;
    const nb_feature_spec *specs;
    pb_reader *found;    /* per spec: its Feature message's bytes, p NULL when absent */
} parse;

static nb_status malformed(const parse *ps, const pb_reader *r, const char *what)
{
    return nb__fail(NB_ERR_IO, "%s: malformed Example at byte %lld: %s", WHO, (long long)(r->p - ps->base), what);
}

/* One map entry {key = 1, value = 2}: remembers value for a requested key. */
static nb_status map_entry(parse *ps, pb_reader r)
{
    pb_reader key = {NULL, NULL}, value = {NULL, NULL};
    bool has_value = false;
    while (!pb_done(&r)) {
        uint32_t f;
        int w;
        if (!pb_read_tag(&r, &f, &w))
            return malformed(ps, &r, "a bad tag in a feature map entry");
        bool ok = (f == 1 || f == 2) && w == PB_BYTES ? pb_read_bytes(&r, f == 1 ? &key : &value)
                                                      : pb_skip(&r, f, w);
        if (!ok)
            return malformed(ps, &r, "a truncated field in a feature map entry");
        has_value |= f == 2 && w == PB_BYTES;
    }
    size_t klen = (size_t)(key.end - key.p);
    for (int i = 0; i < ps->n; i++) {
        if (strlen(ps->specs[i].name) == klen && (klen == 0 || memcmp(ps->specs[i].name, key.p, klen) == 0)) {
            /* A missing value is an empty Feature; the last entry wins. */
            ps->found[i] = has_value ? value : (pb_reader){r.end, r.end};
        }
    }
    return NB_OK;
}

/* The next field 1 of r's message that holds bytes (Example's Features,
 * Features' map entries), skipping every other field: *out gets its bytes, or
 * out->p NULL at the message's end. Returns NB_OK, or malformed's error on a
 * bad tag or a truncated field; msg names r's message and field the one
 * sought, for those errors. */
static nb_status next_field1(const parse *ps, pb_reader *r, const char *msg, const char *field, pb_reader *out)
{
    char what[64];
    *out = (pb_reader){NULL, NULL};
    while (!pb_done(r)) {
        uint32_t f;
        int w;
        if (!pb_read_tag(r, &f, &w)) {
            snprintf(what, sizeof what, "a bad tag in %s", msg);
            return malformed(ps, r, what);
        }
        if (f == 1 && w == PB_BYTES) {
            if (pb_read_bytes(r, out))
                return NB_OK;
            snprintf(what, sizeof what, "a truncated %s", field);
            return malformed(ps, r, what);
        }
        if (!pb_skip(r, f, w)) {
            snprintf(what, sizeof what, "a truncated unknown field in %s", msg);
            return malformed(ps, r, what);
        }
    }
    return NB_OK;
}

static nb_status scan(parse *ps, pb_reader r)
{
    pb_reader features, entry;
    nb_status st;
    while (!(st = next_field1(ps, &r, "Example", "Features", &features)) && features.p) {
        while (!(st = next_field1(ps, &features, "Features", "feature map entry", &entry)) && entry.p) {
            if ((st = map_entry(ps, entry)))
                return st;
        }
        if (st)
            return st;
    }
    return st;
}

static const char *kind_name(uint32_t field)
{
    return field == 1 ? "bytes_list" : field == 2 ? "float_list" : field == 3 ? "int64_list" : "no list";
}

/* Walks one list message of the given kind (field 1 of Feature = bytes, 2 =
 * float, 3 = int64): counts its values, and stores them at dst when not NULL
 * (bytes: copies the single value's bytes; *count is then its length). */
static nb_status list_values(parse *ps, pb_reader r, uint32_t kind, int64_t *count, void *dst)
{
    while (!pb_done(&r)) {
        uint32_t f;
        int w;
        if (!pb_read_tag(&r, &f, &w))
            return malformed(ps, &r, "a bad tag in a value list");
        if (f != 1) {
            if (!pb_skip(&r, f, w))
                return malformed(ps, &r, "a truncated unknown field in a value list");
            continue;
        }
        if (kind == 1 && w == PB_BYTES) {
            pb_reader v;
            if (!pb_read_bytes(&r, &v))
                return malformed(ps, &r, "a truncated bytes value");
            if (dst)
                memcpy(dst, v.p, (size_t)(v.end - v.p)); /* only ever the one value */
            *count += 1;
        } else if (kind == 2 && w == PB_FIXED32) {
            uint32_t u;
            if (!pb_read_fixed32(&r, &u))
                return malformed(ps, &r, "a truncated float");
            if (dst)
                memcpy((float *)dst + *count, &u, 4);
            *count += 1;
        } else if (kind == 2 && w == PB_BYTES) {
            pb_reader v;
            if (!pb_read_bytes(&r, &v) || (v.end - v.p) % 4)
                return malformed(ps, &r, "packed floats not a multiple of 4 bytes");
            for (uint32_t u; pb_read_fixed32(&v, &u); *count += 1)
                if (dst)
                    memcpy((float *)dst + *count, &u, 4);
        } else if (kind == 3 && w == PB_VARINT) {
            uint64_t u;
            if (!pb_read_varint(&r, &u))
                return malformed(ps, &r, "a bad int64 varint");
            if (dst)
                ((int64_t *)dst)[*count] = (int64_t)u;
            *count += 1;
        } else if (kind == 3 && w == PB_BYTES) {
            pb_reader v;
            if (!pb_read_bytes(&r, &v))
                return malformed(ps, &r, "truncated packed int64s");
            while (!pb_done(&v)) {
                uint64_t u;
                if (!pb_read_varint(&v, &u))
                    return malformed(ps, &v, "a bad packed int64 varint");
                if (dst)
                    ((int64_t *)dst)[*count] = (int64_t)u;
                *count += 1;
            }
        } else if (!pb_skip(&r, f, w)) { /* value with another wire type: unknown */
            return malformed(ps, &r, "a truncated value");
        }
    }
    return NB_OK;
}

/* The Feature message of spec i becomes a tensor in *out. */
static nb_status feature(parse *ps, int i, nb_tensor **out)
{
    const nb_feature_spec *sp = &ps->specs[i];
    /* The oneof: the last list field seen names the kind; fields of that kind
     * from where it last began are merged (repeated fields concatenate). */
    pb_reader r = ps->found[i], from = r;
    uint32_t kind = 0;
    while (!pb_done(&r)) {
        const uint8_t *at = r.p;
        uint32_t f;
        int w;
        if (!pb_read_tag(&r, &f, &w))
            return malformed(ps, &r, "a bad tag in Feature");
        if (f >= 1 && f <= 3 && w == PB_BYTES && f != kind) {
            kind = f;
            from.p = at;
        }
        if (!pb_skip(&r, f, w))
            return malformed(ps, &r, "a truncated field in Feature");
    }
    uint32_t want = sp->kind == NB_FEATURE_BYTES ? 1 : sp->kind == NB_FEATURE_FLOAT ? 2 : 3;
    if (kind != want)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: feature '%s' holds %s, the spec asks for %s", WHO, sp->name,
                        kind_name(kind), kind_name(want));
    /* Count the values (for bytes: the values, then the one value's length). */
    int64_t count = 0;
    int64_t byte_len = 0;
    for (pb_reader q = from; !pb_done(&q);) {
        uint32_t f;
        int w;
        pb_read_tag(&q, &f, &w); /* checked above */
        pb_reader lst;
        if (f == kind && w == PB_BYTES) {
            pb_read_bytes(&q, &lst);
            if (kind == 1) {
                /* the length of the last value seen: there must be exactly one */
                for (pb_reader v = lst; !pb_done(&v);) {
                    uint32_t g;
                    int x;
                    if (!pb_read_tag(&v, &g, &x))
                        return malformed(ps, &v, "a bad tag in a value list");
                    pb_reader b;
                    if (g == 1 && x == PB_BYTES) {
                        if (!pb_read_bytes(&v, &b))
                            return malformed(ps, &v, "a truncated bytes value");
                        byte_len = b.end - b.p;
                    } else if (!pb_skip(&v, g, x)) {
                        return malformed(ps, &v, "a truncated unknown field in a value list");
                    }
                }
            }
            nb_status st = list_values(ps, lst, kind, &count, NULL);
            if (st)
                return st;
        } else {
            pb_skip(&q, f, w);
        }
    }
    if (kind == 1 && count != 1)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: feature '%s' holds %lld byte strings, the spec reads exactly 1",
                        WHO, sp->name, (long long)count);
    int64_t numel = kind == 1 ? byte_len : count;
    if (sp->count >= 0 && numel != sp->count)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: feature '%s' has %lld %s, the spec asks for %lld", WHO, sp->name,
                        (long long)numel, kind == 1 ? "bytes" : "values", (long long)sp->count);
    size_t elem = kind == 1 ? 1 : kind == 2 ? 4 : 8;
    void *buf = malloc((size_t)numel * elem + 1);
    if (!buf)
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory for feature '%s' (%lld values)", WHO, sp->name,
                        (long long)numel);
    int64_t filled = 0;
    for (pb_reader q = from; !pb_done(&q);) {
        uint32_t f;
        int w;
        pb_read_tag(&q, &f, &w);
        pb_reader lst;
        if (f == kind && w == PB_BYTES && pb_read_bytes(&q, &lst))
            list_values(ps, lst, kind, &filled, buf); /* checked by the count */
        else
            pb_skip(&q, f, w);
    }
    nb_dtype dt = kind == 1 ? NB_U8 : kind == 2 ? NB_F32 : NB_I64;
    *out = nb_from_buffer(dt, NB_SHAPE(numel), buf);
    free(buf);
    return *out ? NB_OK : nb_error();
}

nb_status nb_example_parse(const void *data, size_t size, int n, const nb_feature_spec *specs, nb_tensor **out)
{
    if (out && n > 0)
        for (int i = 0; i < n; i++)
            out[i] = NULL;
    if (!data && size)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: data is NULL with size %zu", WHO, size);
    if (n < 1 || !specs || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %s", WHO,
                        n < 1 ? "n is below 1" : !specs ? "specs is NULL" : "out is NULL");
    for (int i = 0; i < n; i++) {
        if (!specs[i].name)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: spec %d has no name", WHO, i);
        if ((unsigned)specs[i].kind > NB_FEATURE_BYTES)
            return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: spec '%s' has kind %d", WHO, specs[i].name,
                            (int)specs[i].kind);
    }
    pb_reader *found = calloc((size_t)n, sizeof *found);
    nb_scope *scope = found ? nb_scope_begin() : NULL; /* for the outputs until all are made */
    if (!scope) {
        free(found);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", WHO);
    }
    parse ps = {data, n, specs, found};
    nb_status st = scan(&ps, pb_reader_of(data, size));
    for (int i = 0; i < n && st == NB_OK; i++) {
        if (!found[i].p)
            st = nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: feature '%s' is missing", WHO, specs[i].name);
        else
            st = feature(&ps, i, &out[i]);
    }
    free(found);
    for (int i = 0; i < n && st == NB_OK; i++)
        nb__retain(out[i]);
    nb_scope_end(scope);
    for (int i = 0; i < n; i++) {
        if (st) {
            out[i] = NULL; /* made ones went with the scope */
        } else if (!nb__own(out[i])) { /* nb__own released it */
            st = nb_error();
            for (int j = i + 1; j < n; j++)
                nb__release(out[j]);
            for (int j = 0; j < n; j++)
                out[j] = NULL; /* those owned already are the scope's */
        }
    }
    return st;
}
