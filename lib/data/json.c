/* nabla — the strict, bounded JSON reader (json.h says what it reads and how
 * it fails). Each read checks the end of the text before every byte; a
 * string's buffer is sized from the bytes up to its closing quote, which its
 * decoded form never exceeds. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool nb__json_fail(nb_json *js, const char *fmt, ...)
{
    if (js->failed)
        return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(js->error, sizeof js->error, fmt, ap);
    va_end(ap);
    js->failed = true;
    return false;
}

/* Steps over JSON's four white-space bytes, never past the end. */
static void skip_ws(nb_json *js)
{
    while (js->p < js->end && (*js->p == ' ' || *js->p == '\t' || *js->p == '\n' || *js->p == '\r'))
        js->p++;
}

bool nb__json_expect(nb_json *js, char c)
{
    skip_ws(js);
    if (js->p < js->end && *js->p == c) {
        js->p++;
        return true;
    }
    return nb__json_fail(js, "expected '%c' at byte %td of the %s", c, js->p - js->start, js->name);
}

/* The value of a hex digit, or -1. */
static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

char *nb__json_string(nb_json *js)
{
    if (!nb__json_expect(js, '"'))
        return NULL;
    const char *start = js->p;
    /* An upper bound of the decoded length: the bytes up to the closing quote,
     * an escaped quote not being one (an escape never decodes longer than it is
     * written). */
    size_t cap = 16;
    for (const char *q = start; q < js->end && *q != '"'; q++) {
        cap++;
        if (*q == '\\' && q + 1 < js->end) {
            q++;
            cap++;
        }
    }
    char *out = malloc(cap + 4);
    if (!out) {
        nb__json_fail(js, "out of host memory");
        return NULL;
    }
    size_t n = 0;
    while (js->p < js->end) {
        unsigned char c = (unsigned char)*js->p++;
        if (c == '"') {
            out[n] = '\0';
            return out;
        }
        if (c < 0x20) {
            nb__json_fail(js, "a control character in a string");
            break;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        if (js->p >= js->end)
            break;
        char e = *js->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            out[n++] = map[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') {
            nb__json_fail(js, "a bad escape '\\%c'", e);
            break;
        }
        uint32_t cp = 0;
        for (int k = 0; k < 4; k++) {
            int h = js->p < js->end ? hexval(*js->p++) : -1;
            if (h < 0) {
                nb__json_fail(js, "a bad \\u escape");
                free(out);
                return NULL;
            }
            cp = cp << 4 | (uint32_t)h;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
            uint32_t lo = 0;
            bool ok = js->end - js->p >= 6 && js->p[0] == '\\' && js->p[1] == 'u';
            for (int k = 0; ok && k < 4; k++) {
                int h = hexval(js->p[2 + k]);
                ok = h >= 0;
                lo = lo << 4 | (uint32_t)(h >= 0 ? h : 0);
            }
            if (!ok || lo < 0xDC00 || lo > 0xDFFF) {
                nb__json_fail(js, "an unpaired surrogate in a \\u escape");
                break;
            }
            js->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            nb__json_fail(js, "an unpaired surrogate in a \\u escape");
            break;
        }
        if (cp == 0) {
            nb__json_fail(js, "a NUL character in a string");
            break;
        }
        /* Six input bytes at least became at most four output bytes. */
        if (cp < 0x80) {
            out[n++] = (char)cp;
        } else if (cp < 0x800) {
            out[n++] = (char)(0xC0 | cp >> 6);
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[n++] = (char)(0xE0 | cp >> 12);
            out[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[n++] = (char)(0xF0 | cp >> 18);
            out[n++] = (char)(0x80 | (cp >> 12 & 0x3F));
            out[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    nb__json_fail(js, "an unterminated string");
    free(out);
    return NULL;
}

bool nb__json_uint(nb_json *js, uint64_t *out)
{
    skip_ws(js);
    if (js->p >= js->end || *js->p < '0' || *js->p > '9')
        return nb__json_fail(js, "expected a non-negative integer");
    if (*js->p == '0' && js->end - js->p > 1 && js->p[1] >= '0' && js->p[1] <= '9')
        return nb__json_fail(js, "an integer with a leading zero");
    uint64_t x = 0;
    while (js->p < js->end && *js->p >= '0' && *js->p <= '9') {
        x = x * 10 + (uint64_t)(*js->p++ - '0');
        if (x > (UINT64_C(1) << 62))
            return nb__json_fail(js, "an integer past 2^62");
    }
    if (js->p < js->end && (*js->p == '.' || *js->p == 'e' || *js->p == 'E'))
        return nb__json_fail(js, "a number that is not an integer");
    *out = x;
    return true;
}

char nb__json_peek(nb_json *js)
{
    skip_ws(js);
    return js->p < js->end ? *js->p : 0;
}

int nb__json_next(nb_json *js, char close)
{
    char c = nb__json_peek(js);
    if (c != ',' && c != close)
        return -1;
    js->p++;
    return c == ',';
}
