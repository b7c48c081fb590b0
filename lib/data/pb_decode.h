/* A small protocol buffer decoder: reads the wire format field by field from a
 * bounded byte range, refusing anything malformed. No schema, no allocation;
 * lib/data/example.c builds tf.train.Example parsing on it. */
#ifndef NB_DATA_PB_DECODE_H
#define NB_DATA_PB_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The wire types; 3 and 4 are the old groups' start and end. */
enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_BYTES = 2, PB_GROUP_START = 3, PB_GROUP_END = 4, PB_FIXED32 = 5 };

/* The bytes [p, end) still to read. Every function below returns false, and
 * leaves the reader where it failed, on input that is truncated or malformed. */
typedef struct pb_reader {
    const uint8_t *p, *end;
} pb_reader;

static inline pb_reader pb_reader_of(const void *data, size_t size)
{
    pb_reader r = {NULL, NULL};
    if (data) {
        r.p = (const uint8_t *)data;
        r.end = r.p + size;
    }
    return r;
}

static inline bool pb_done(const pb_reader *r) { return r->p >= r->end; }

/* A base-128 varint of at most 10 bytes whose value fits 64 bits. */
bool pb_read_varint(pb_reader *r, uint64_t *v);
/* A field's tag: its number (1 .. 2^29 - 1) and wire type (0 .. 5). */
bool pb_read_tag(pb_reader *r, uint32_t *field, int *wire);
/* A length-delimited field's contents, as a reader of its own (bounds checked). */
bool pb_read_bytes(pb_reader *r, pb_reader *sub);
/* Little-endian fixed-width values. */
bool pb_read_fixed32(pb_reader *r, uint32_t *v);
bool pb_read_fixed64(pb_reader *r, uint64_t *v);
/* Skips the value of a field of the given wire type whose tag was just read
 * (field is the tag's number, for matching a group's end). Groups nest at most
 * 64 deep; a lone group end is malformed. */
bool pb_skip(pb_reader *r, uint32_t field, int wire);

#endif
