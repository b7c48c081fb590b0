/* libFuzzer target for the strict JSON reader (lib/data/json.h) that reads
 * safetensors headers. Each input is a text read as one value of the subset
 * the reader knows (objects with string keys, arrays, strings, non-negative
 * integers), nested at most 16 deep, followed by nothing. The reader must
 * never step outside the text, must fail exactly when it says so and then
 * with a message, and what it reads must survive a round trip: each string
 * written back as a JSON literal, and each integer printed, reads back the
 * same. Any crash, sanitizer report, leak or disagreement is a finding. */
#include "lib/data/json.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_json"
#include "fuzz_util.h"

#define DEPTH_MAX 16

/* The reader is inside its text and its failure state agrees with ok. */
static void check_state(const nb_json *js, bool ok)
{
    REQUIRE(js->p >= js->start && js->p <= js->end, "position %td outside [0, %td]", js->p - js->start,
            js->end - js->start);
    if (ok)
        REQUIRE(!js->failed, "succeeded with a failure recorded: %s", js->error);
    else
        REQUIRE(js->failed && js->error[0], "failed without a message");
}

/* s written as a JSON string literal into a new buffer (the caller frees). */
static char *literal_of(const char *s, size_t *len)
{
    size_t n = strlen(s), cap = 6 * n + 3;
    char *out = malloc(cap);
    REQUIRE(out, "out of memory");
    size_t k = 0;
    out[k++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)*c;
        } else if (*c < 0x20) {
            k += (size_t)snprintf(out + k, cap - k, "\\u%04x", *c);
        } else {
            out[k++] = (char)*c;
        }
    }
    out[k++] = '"';
    out[k] = '\0';
    *len = k;
    return out;
}

static void round_trip_string(const char *s)
{
    size_t len;
    char *lit = literal_of(s, &len);
    nb_json js = nb__json_reader(lit, len, "literal");
    char *back = nb__json_string(&js);
    REQUIRE(back && strcmp(back, s) == 0, "the literal %s reads back as '%s' (%s)", lit, back ? back : "NULL",
            js.error);
    REQUIRE(js.p == js.end, "the literal %s was not read whole", lit);
    free(back);
    free(lit);
}

static void round_trip_uint(uint64_t x)
{
    char text[32];
    int len = snprintf(text, sizeof text, "%" PRIu64, x);
    nb_json js = nb__json_reader(text, (size_t)len, "number");
    uint64_t back = 0;
    REQUIRE(nb__json_uint(&js, &back) && back == x, "%s reads back as %" PRIu64, text, back);
}

/* Reads one value; false when the reader failed. */
static bool value(nb_json *js, int depth)
{
    if (depth > DEPTH_MAX)
        return nb__json_fail(js, "nested past %d", DEPTH_MAX);
    char c = nb__json_peek(js);
    check_state(js, true);
    bool ok;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        ok = nb__json_expect(js, c);
        int more = ok && nb__json_peek(js) == close ? nb__json_next(js, close) : 1;
        while (ok && more > 0) {
            if (c == '{') {
                char *k = nb__json_string(js);
                check_state(js, k != NULL);
                ok = k && nb__json_expect(js, ':');
                if (k)
                    round_trip_string(k);
                free(k);
            }
            ok = ok && value(js, depth + 1);
            more = ok ? nb__json_next(js, close) : -1;
            if (ok && more < 0)
                ok = nb__json_fail(js, "expected ',' or '%c'", close);
        }
    } else if (c == '"') {
        char *s = nb__json_string(js);
        ok = s != NULL;
        if (s) {
            round_trip_string(s);
            free(s);
        }
    } else {
        uint64_t x = UINT64_MAX;
        ok = nb__json_uint(js, &x);
        if (ok) {
            REQUIRE(x <= (UINT64_C(1) << 62), "%" PRIu64 " is past 2^62", x);
            round_trip_uint(x);
        } else {
            REQUIRE(x == UINT64_MAX, "a refused integer wrote its output");
        }
    }
    check_state(js, ok);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes, so that a read past the end is reported. */
    char *text = malloc(size ? size : 1);
    REQUIRE(text, "out of memory");
    if (size)
        memcpy(text, data, size);
    nb_json js = nb__json_reader(text, size, "input");
    bool ok = value(&js, 0);
    if (ok && nb__json_peek(&js) != 0)
        ok = nb__json_fail(&js, "bytes after the value");
    check_state(&js, ok);
    free(text);
    return 0;
}
