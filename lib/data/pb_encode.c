/* nabla — the protocol-buffer encoder of pb_encode.h: tags and varints in
 * base-128 little-endian groups, fixed-width numbers little-endian whatever
 * the host's order. */
#include "lib/data/pb_encode.h"

#include <stdlib.h>
#include <string.h>

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

void nb__pb_clear(nb_pb *b)
{
    b->size = 0;
    b->failed = false;
}

void nb__pb_free(nb_pb *b)
{
    free(b->data);
    *b = (nb_pb){0};
}

/* Room for n more bytes; false (and failed set) when there is none. */
static bool reserve(nb_pb *b, size_t n)
{
    if (b->failed)
        return false;
    if (n > SIZE_MAX / 2 - b->size) {
        b->failed = true;
        return false;
    }
    if (b->size + n <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->size + n)
        cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

static void raw_varint(nb_pb *b, uint64_t v)
{
    if (!reserve(b, 10))
        return;
    while (v >= 0x80) {
        b->data[b->size++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b->data[b->size++] = (uint8_t)v;
}

static void raw_le(nb_pb *b, uint64_t v, int bytes)
{
    if (!reserve(b, (size_t)bytes))
        return;
    for (int i = 0; i < bytes; i++)
        b->data[b->size++] = (uint8_t)(v >> (8 * i));
}

static void tag(nb_pb *b, uint32_t field, int wire) { raw_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static uint64_t double_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

void nb__pb_varint(nb_pb *b, uint32_t field, uint64_t value)
{
    tag(b, field, WIRE_VARINT);
    raw_varint(b, value);
}

void nb__pb_double(nb_pb *b, uint32_t field, double value)
{
    tag(b, field, WIRE_FIXED64);
    raw_le(b, double_bits(value), 8);
}

void nb__pb_float(nb_pb *b, uint32_t field, float value)
{
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    tag(b, field, WIRE_FIXED32);
    raw_le(b, u, 4);
}

void nb__pb_bytes(nb_pb *b, uint32_t field, const void *p, size_t n)
{
    tag(b, field, WIRE_LEN);
    raw_varint(b, n);
    if (n && reserve(b, n)) {
        memcpy(b->data + b->size, p, n);
        b->size += n;
    }
}

void nb__pb_message(nb_pb *b, uint32_t field, const nb_pb *sub)
{
    if (sub->failed) {
        b->failed = true;
        return;
    }
    nb__pb_bytes(b, field, sub->data, sub->size);
}

/* The head of a packed field of n fixed-width values: its tag and length, with
 * room reserved for the values. Returns false, b marked failed, when the
 * length passes SIZE_MAX or the room cannot be had. */
static bool packed_fixed_head(nb_pb *b, uint32_t field, size_t n, size_t width)
{
    if (n > SIZE_MAX / width) {
        b->failed = true;
        return false;
    }
    tag(b, field, WIRE_LEN);
    raw_varint(b, (uint64_t)(n * width));
    return reserve(b, n * width);
}

void nb__pb_packed_doubles(nb_pb *b, uint32_t field, const double *v, size_t n)
{
    if (!packed_fixed_head(b, field, n, 8))
        return;
    for (size_t i = 0; i < n; i++)
        raw_le(b, double_bits(v[i]), 8);
}

void nb__pb_packed_floats(nb_pb *b, uint32_t field, const float *v, size_t n)
{
    if (!packed_fixed_head(b, field, n, 4))
        return;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        raw_le(b, u, 4);
    }
}

void nb__pb_packed_varints(nb_pb *b, uint32_t field, const int64_t *v, size_t n)
{
    size_t len = 0; /* at most 10 bytes a value: no overflow below SIZE_MAX / 10 values */
    if (n > SIZE_MAX / 10) {
        b->failed = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t u = (uint64_t)v[i];
        do {
            len++;
            u >>= 7;
        } while (u);
    }
    tag(b, field, WIRE_LEN);
    raw_varint(b, len);
    for (size_t i = 0; i < n; i++)
        raw_varint(b, (uint64_t)v[i]);
}
