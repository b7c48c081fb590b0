/* nabla internal — a strict, bounded JSON reader for headers of files read
 * from outside (safetensors checkpoints).
 *
 * The reader walks a text of known length in place and never reads past its
 * end; it keeps no state but the nb_json it is given and allocates only the
 * strings it returns. It reads the pieces a schema asks for, one at a time:
 * punctuation, strings (every escape decoded to UTF-8, surrogates paired, no
 * NUL), and non-negative integers up to 2^62 (no sign, fraction or exponent).
 * The caller knows the schema, so it decides what comes next; it stops at the
 * first failure, which the reader keeps as a message (the first one only,
 * later ones are dropped) and never records as nabla's error: the caller
 * wraps it in its own (nb__fail with the file's name).
 *
 * Every function that fails returns false, NULL or -1 and leaves failed set
 * and error holding the message; once failed, the reader's position is
 * unspecified and further calls only fail. */
#ifndef NB_DATA_JSON_H
#define NB_DATA_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nb_json {
    const char *start, *p, *end; /* the text, the next byte to read, one past its end */
    const char *name;            /* what the text is, for messages: "... at byte 7 of the <name>" */
    bool failed;                 /* error holds the first failure */
    char error[512];
} nb_json;

/* A reader at the start of text[0, len), which the caller keeps alive while it
 * reads; name (kept, not copied) says what the text is in messages. Cannot
 * fail. */
static inline nb_json nb__json_reader(const char *text, size_t len, const char *name)
{
    nb_json js = {text, text, text + len, name, false, {0}};
    return js;
}

/* Records a failure (printf-style message) unless one is recorded already, and
 * returns false, so a schema's checks can say `return nb__json_fail(...)`. */
bool nb__json_fail(nb_json *js, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The next character after white space, or 0 at the end of the text (a NUL
 * byte reads as 0 too); the reader stays on it. Cannot fail. */
char nb__json_peek(nb_json *js);

/* Consumes white space and then c: true, or false with "expected 'c' at byte N
 * of the <name>". */
bool nb__json_expect(nb_json *js, char c);

/* Reads a string literal: a new NUL-terminated, UTF-8 string the caller frees
 * (with no NUL inside: a \u0000 is refused). NULL on a missing or unterminated
 * quote, a control character, a bad escape, an unpaired surrogate, or no
 * memory, each with its message. */
char *nb__json_string(nb_json *js);

/* Reads a non-negative integer no larger than 2^62 into *out: true, or false
 * for a sign, a leading zero, a fraction, an exponent or a larger number. */
bool nb__json_uint(nb_json *js, uint64_t *out);

/* After an element of an object or array closed by `close` ('}' or ']'):
 * consumes a ',' and returns 1 (another element follows) or consumes close and
 * returns 0; returns -1 for anything else, recording nothing, so that the
 * caller says where in its schema. */
int nb__json_next(nb_json *js, char close);

#endif
