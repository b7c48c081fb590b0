/* Tests of the strict JSON reader (lib/data/json.h) that reads safetensors
 * headers: what it accepts (strings with every escape, surrogate pairs,
 * integers up to 2^62, white space), what it refuses and with which message,
 * that it keeps the first failure only, and that it never reads past the
 * length it was given. */
#include "check.h"
#include "lib/data/json.h"

#include <stdint.h>

static nb_json reader_of(const char *text) { return nb__json_reader(text, strlen(text), "text"); }

/* The string text decodes to, compared with want; the reader must then be at
 * the end. */
static void accepts_string(const char *text, const char *want)
{
    nb_json js = reader_of(text);
    char *s = nb__json_string(&js);
    CHECKF(s && strcmp(s, want) == 0, "%s: got '%s' (%s)", text, s ? s : "NULL", js.error);
    CHECKF(!js.failed && nb__json_peek(&js) == 0, "%s: not read to its end", text);
    free(s);
}

/* text is refused as a string, with a message holding why. */
static void refuses_string(const char *text, const char *why)
{
    nb_json js = reader_of(text);
    char *s = nb__json_string(&js);
    CHECKF(!s && js.failed && strstr(js.error, why), "%s: got '%s', message '%s'", text, s ? s : "NULL", js.error);
    free(s);
}

static void test_strings(void)
{
    accepts_string("\"\"", "");
    accepts_string("  \"w\"  ", "w");
    accepts_string("\"dense/w:0\"", "dense/w:0");
    accepts_string("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "a\"b\\c/d\b\f\n\r\t");
    accepts_string("\"\\u0041\\u00e9\\u20AC\"", "A\xc3\xa9\xe2\x82\xac");
    accepts_string("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80"); /* a surrogate pair */
    accepts_string("\"caf\xc3\xa9\"", "caf\xc3\xa9");          /* UTF-8 passes through */

    refuses_string("w", "expected '\"' at byte 0 of the text");
    refuses_string("\"w", "an unterminated string");
    refuses_string("\"w\\", "an unterminated string");
    refuses_string("\"a\nb\"", "a control character");
    refuses_string("\"\\x41\"", "a bad escape '\\x'");
    refuses_string("\"\\u00g1\"", "a bad \\u escape");
    refuses_string("\"\\u12\"", "a bad \\u escape");
    refuses_string("\"\\u0000\"", "a NUL character");
    refuses_string("\"\\ud83d\"", "an unpaired surrogate");
    refuses_string("\"\\ud83d\\u0041\"", "an unpaired surrogate");
    refuses_string("\"\\ude00\"", "an unpaired surrogate");
}

/* text reads as the integer want. */
static void accepts_uint(const char *text, uint64_t want)
{
    nb_json js = reader_of(text);
    uint64_t x = 7;
    CHECKF(nb__json_uint(&js, &x) && x == want, "%s: got %llu (%s)", text, (unsigned long long)x, js.error);
}

static void refuses_uint(const char *text, const char *why)
{
    nb_json js = reader_of(text);
    uint64_t x = 7;
    CHECKF(!nb__json_uint(&js, &x) && x == 7 && strstr(js.error, why), "%s: message '%s'", text, js.error);
}

static void test_integers(void)
{
    accepts_uint("0", 0);
    accepts_uint(" 24", 24);
    accepts_uint("4611686018427387904", UINT64_C(1) << 62);
    accepts_uint("12]", 12);

    refuses_uint("-1", "expected a non-negative integer");
    refuses_uint("+1", "expected a non-negative integer");
    refuses_uint("", "expected a non-negative integer");
    refuses_uint("01", "a leading zero");
    refuses_uint("4611686018427387905", "past 2^62");
    refuses_uint("99999999999999999999999", "past 2^62");
    refuses_uint("1.0", "not an integer");
    refuses_uint("1e3", "not an integer");
    refuses_uint("2E3", "not an integer");
}

/* Punctuation, white space, a list walked with nb__json_next, the first
 * failure kept. */
static void test_structure(void)
{
    nb_json js = reader_of(" {\t\"a\" :\r\n[1, 2,3 ] } ");
    uint64_t v[3] = {0};
    int n = 0, more = 1;
    CHECK(nb__json_expect(&js, '{'));
    char *k = nb__json_string(&js);
    CHECK(k && strcmp(k, "a") == 0);
    free(k);
    CHECK(nb__json_expect(&js, ':') && nb__json_expect(&js, '['));
    while (more > 0 && n < 3 && nb__json_uint(&js, &v[n++]))
        more = nb__json_next(&js, ']');
    CHECK(n == 3 && more == 0 && v[0] == 1 && v[1] == 2 && v[2] == 3);
    CHECK(nb__json_next(&js, '}') == 0);
    CHECK(nb__json_peek(&js) == 0 && !js.failed);

    /* nb__json_next records nothing on a wrong character: the schema says where. */
    js = reader_of("[1 2]");
    CHECK(nb__json_expect(&js, '[') && nb__json_uint(&js, &v[0]));
    CHECK(nb__json_next(&js, ']') == -1 && !js.failed);

    /* The first failure stays. */
    js = reader_of("x");
    CHECK(!nb__json_expect(&js, '{'));
    CHECK(!nb__json_fail(&js, "a later failure"));
    CHECKF(strcmp(js.error, "expected '{' at byte 0 of the text") == 0, "message '%s'", js.error);

    /* Bytes past the length given are never read: a string cut by the length
     * is unterminated, a number cut by it ends there. */
    const char *text = "\"abc\" 123";
    js = nb__json_reader(text, 3, "text");
    CHECK(!nb__json_string(&js) && strstr(js.error, "unterminated"));
    js = nb__json_reader(text + 6, 2, "text");
    CHECK(nb__json_uint(&js, &v[0]) && v[0] == 12 && nb__json_peek(&js) == 0);
    js = nb__json_reader(text, 0, "text");
    CHECK(nb__json_peek(&js) == 0 && !nb__json_expect(&js, '"'));
}

int main(void)
{
    RUN(test_strings);
    RUN(test_integers);
    RUN(test_structure);
    return check_finish();
}
