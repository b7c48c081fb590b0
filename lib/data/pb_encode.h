/* nabla — a tiny protocol-buffer encoder: just what TensorBoard's Event and
 * Summary messages and tf.train.Example need (varints, fixed64 and fixed32
 * numbers, length-delimited bytes, nested messages, packed doubles, floats and
 * varints). Internal to the library.
 *
 * A message is built in an nb_pb, a growing byte buffer; a nested message is
 * built in its own nb_pb and appended with nb__pb_message. Appends never fail
 * one by one: running out of memory sets failed, later appends do nothing, and
 * the caller checks failed once at the end. */
#ifndef NB_DATA_PB_ENCODE_H
#define NB_DATA_PB_ENCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nb_pb {
    uint8_t *data;
    size_t size, cap;
    bool failed; /* an append ran out of memory */
} nb_pb;

/* Empties b (size 0, not failed), keeping its memory for reuse. */
void nb__pb_clear(nb_pb *b);
/* Frees b's memory and zeroes it. */
void nb__pb_free(nb_pb *b);

/* Wire type 0: an unsigned varint (int64 fields pass their value cast to uint64). */
void nb__pb_varint(nb_pb *b, uint32_t field, uint64_t value);
/* Wire type 1: a double, 8 bytes little-endian. */
void nb__pb_double(nb_pb *b, uint32_t field, double value);
/* Wire type 5: a float, 4 bytes little-endian. */
void nb__pb_float(nb_pb *b, uint32_t field, float value);
/* Wire type 2: n bytes at p (a string, a bytes field). */
void nb__pb_bytes(nb_pb *b, uint32_t field, const void *p, size_t n);
/* Wire type 2: the message built in sub. A failed sub fails b. */
void nb__pb_message(nb_pb *b, uint32_t field, const nb_pb *sub);
/* Wire type 2: n doubles, packed. */
void nb__pb_packed_doubles(nb_pb *b, uint32_t field, const double *v, size_t n);
/* Wire type 2: n floats, packed. */
void nb__pb_packed_floats(nb_pb *b, uint32_t field, const float *v, size_t n);
/* Wire type 2: n varints, packed (int64 values as their uint64 bits). */
void nb__pb_packed_varints(nb_pb *b, uint32_t field, const int64_t *v, size_t n);

#endif
