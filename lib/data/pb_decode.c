/* The protocol buffer wire-format decoder declared in pb_decode.h. */
#include "pb_decode.h"

bool pb_read_varint(pb_reader *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end)
            return false;
        uint8_t b = *r->p++;
        if (i == 9 && b > 1)
            return false; /* past 64 bits */
        x |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

bool pb_read_tag(pb_reader *r, uint32_t *field, int *wire)
{
    uint64_t t;
    if (!pb_read_varint(r, &t))
        return false;
    uint64_t f = t >> 3;
    int w = (int)(t & 7);
    if (f == 0 || f > 0x1FFFFFFF || w > 5)
        return false;
    *field = (uint32_t)f;
    *wire = w;
    return true;
}

bool pb_read_bytes(pb_reader *r, pb_reader *sub)
{
    uint64_t n;
    if (!pb_read_varint(r, &n) || n > (uint64_t)(r->end - r->p))
        return false;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return true;
}

bool pb_read_fixed32(pb_reader *r, uint32_t *v)
{
    if (r->end - r->p < 4)
        return false;
    *v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    return true;
}

bool pb_read_fixed64(pb_reader *r, uint64_t *v)
{
    uint32_t lo, hi;
    if (r->end - r->p < 8 || !pb_read_fixed32(r, &lo) || !pb_read_fixed32(r, &hi))
        return false;
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

static bool skip(pb_reader *r, uint32_t field, int wire, int depth)
{
    uint64_t v;
    uint32_t u;
    pb_reader sub;
    switch (wire) {
    case PB_VARINT: return pb_read_varint(r, &v);
    case PB_FIXED64: return pb_read_fixed64(r, &v);
    case PB_BYTES: return pb_read_bytes(r, &sub);
    case PB_FIXED32: return pb_read_fixed32(r, &u);
    case PB_GROUP_START:
        if (depth >= 64)
            return false;
        for (;;) {
            uint32_t f;
            int w;
            if (!pb_read_tag(r, &f, &w))
                return false;
            if (w == PB_GROUP_END)
                return f == field;
            if (!skip(r, f, w, depth + 1))
                return false;
        }
    default: return false; /* a group end without its start */
    }
}

bool pb_skip(pb_reader *r, uint32_t field, int wire) { return skip(r, field, wire, 0); }
