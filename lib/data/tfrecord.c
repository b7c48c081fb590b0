/* nabla — reading and writing TFRecord files (include/nabla/tfrecord.h).
 *
 * Both sides go through stdio. The writer frames each record (length, its
 * masked CRC32C, data, the data's masked CRC32C) into a 64 KiB stdio buffer.
 * The reader trusts nothing: each header's CRC is checked before its length is
 * used, and a length is checked against what is left of the file (its size
 * taken again when a record seems to run past it, for a file still being
 * written) before any memory is reserved for it. A failure is kept, so every
 * later call reports the same corrupt spot. */
#include "lib/core/core.h"
#include "lib/data/crc32c.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { HEADER_BYTES = 12, FOOTER_BYTES = 4, STDIO_BUFFER = 1 << 16 };

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c)
        memcpy(c, s, n);
    return c;
}

/* ---- the writer ---------------------------------------------------------------------------- */

struct nb_tfrecord_writer {
    FILE *fp;
    char *path;
    uint64_t offset; /* bytes written so far: where the next record starts */
    char *buffer;    /* stdio's buffer */
};

nb_tfrecord_writer *nb_tfrecord_writer_open(const char *path)
{
    const char *who = "nb_tfrecord_writer_open";
    if (!path)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: path is NULL", who);
    nb_tfrecord_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = copy_string(path);
        w->buffer = malloc(STDIO_BUFFER);
    }
    if (!w || !w->path || !w->buffer) {
        if (w) {
            free(w->path);
            free(w->buffer);
        }
        free(w);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: '%s': out of host memory", who, path);
    }
    errno = 0;
    w->fp = fopen(path, "wb");
    if (!w->fp) {
        int e = errno;
        free(w->path);
        free(w->buffer);
        free(w);
        return nb__fail_null(NB_ERR_IO, "%s: cannot create '%s': %s", who, path, e ? strerror(e) : "unknown error");
    }
    setvbuf(w->fp, w->buffer, _IOFBF, STDIO_BUFFER);
    return w;
}

nb_status nb_tfrecord_write(nb_tfrecord_writer *w, const void *data, size_t size)
{
    const char *who = "nb_tfrecord_write";
    if (!w)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: writer is NULL", who);
    if (!data && size)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: '%s': data is NULL (size %zu)", who, w->path, size);
    uint8_t head[HEADER_BYTES], foot[FOOTER_BYTES];
    put_le64(head, (uint64_t)size);
    put_le32(head + 8, nb__crc32c_masked(head, 8));
    put_le32(foot, nb__crc32c_masked(data, size));
    errno = 0;
    if (fwrite(head, 1, sizeof head, w->fp) != sizeof head || (size && fwrite(data, 1, size, w->fp) != size) ||
        fwrite(foot, 1, sizeof foot, w->fp) != sizeof foot) {
        int e = errno;
        return nb__fail(NB_ERR_IO, "%s: '%s': cannot write the record of %zu bytes at byte offset %llu: %s", who,
                        w->path, size, (unsigned long long)w->offset, e ? strerror(e) : "write error");
    }
    w->offset += HEADER_BYTES + (uint64_t)size + FOOTER_BYTES;
    return NB_OK;
}

nb_status nb_tfrecord_writer_flush(nb_tfrecord_writer *w)
{
    if (!w)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_writer_flush: writer is NULL");
    errno = 0;
    if (fflush(w->fp) != 0) {
        int e = errno;
        return nb__fail(NB_ERR_IO, "nb_tfrecord_writer_flush: '%s': cannot write the records before byte offset "
                        "%llu: %s", w->path, (unsigned long long)w->offset, e ? strerror(e) : "write error");
    }
    return NB_OK;
}

nb_status nb_tfrecord_writer_close(nb_tfrecord_writer *w)
{
    if (!w)
        return NB_OK;
    nb_status st = NB_OK;
    errno = 0;
    if (fclose(w->fp) != 0) {
        int e = errno;
        st = nb__fail(NB_ERR_IO, "nb_tfrecord_writer_close: '%s': cannot write the records before byte offset "
                      "%llu: %s", w->path, (unsigned long long)w->offset, e ? strerror(e) : "write error");
    }
    free(w->buffer); /* after fclose, which last uses it */
    free(w->path);
    free(w);
    return st;
}

/* ---- the reader ---------------------------------------------------------------------------- */

struct nb_tfrecord_reader {
    FILE *fp;
    char *path;
    uint64_t offset;    /* where the next record starts */
    uint64_t file_size; /* as last seen */
    uint8_t *record;    /* the last record's bytes */
    size_t cap;
    bool at_end;
    const char *who;    /* the public function running */
    nb_status failed;   /* a kept failure, repeated by every later call */
    char *failure;      /* its message */
};

nb_tfrecord_reader *nb_tfrecord_reader_open(const char *path)
{
    const char *who = "nb_tfrecord_reader_open";
    if (!path)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: path is NULL", who);
    nb_tfrecord_reader *r = calloc(1, sizeof *r);
    if (r)
        r->path = copy_string(path);
    if (!r || !r->path) {
        free(r);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: '%s': out of host memory", who, path);
    }
    errno = 0;
    r->fp = fopen(path, "rb");
    struct stat sb;
    if (!r->fp || fstat(fileno(r->fp), &sb) != 0 || S_ISDIR(sb.st_mode)) {
        int e = errno;
        if (r->fp && S_ISDIR(sb.st_mode))
            e = EISDIR;
        if (r->fp)
            fclose(r->fp);
        free(r->path);
        free(r);
        return nb__fail_null(NB_ERR_IO, "%s: cannot open '%s': %s", who, path, e ? strerror(e) : "unknown error");
    }
    r->file_size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
    return r;
}

/* Records a failure of nb_tfrecord_next, to be repeated by later calls. */
static nb_status reader_fail(nb_tfrecord_reader *r, nb_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static nb_status reader_fail(nb_tfrecord_reader *r, nb_status code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->failed = code;
    free(r->failure);
    r->failure = copy_string(msg);
    return nb__fail(code, "%s: '%s': %s", r->who, r->path, msg);
}

/* Reads n bytes; false when fewer came, with *got set to how many did. */
static bool read_exact(nb_tfrecord_reader *r, void *dst, size_t n, size_t *got)
{
    *got = n ? fread(dst, 1, n, r->fp) : 0;
    return *got == n;
}

static const char *read_problem(nb_tfrecord_reader *r)
{
    return ferror(r->fp) ? "read error" : "end of file";
}

/* Reads the next record's header and checks it: its length's CRC, and that the
 * data and their CRC fit in what is left of the file (checked before anything
 * is allocated). Returns NB_OK with *length set, NB_ERR_OUT_OF_RANGE at the
 * end (nothing recorded), or a failure recorded by reader_fail. who names the
 * public function. */
static nb_status read_header(nb_tfrecord_reader *r, const char *who, uint64_t *length_out)
{
    if (!r)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: reader is NULL", who);
    r->who = who;
    if (r->failed)
        return nb__fail(r->failed, "%s: '%s': %s", who, r->path, r->failure ? r->failure : "an earlier read failed");
    if (r->at_end)
        return NB_ERR_OUT_OF_RANGE;

    const uint64_t start = r->offset;
    uint8_t head[HEADER_BYTES];
    size_t got;
    if (!read_exact(r, head, sizeof head, &got)) {
        if (got == 0 && !ferror(r->fp)) {
            r->at_end = true;
            return NB_ERR_OUT_OF_RANGE; /* the end: no error recorded */
        }
        return reader_fail(r, NB_ERR_IO, "truncated header at byte offset %llu (%zu of %d bytes: %s)",
                           (unsigned long long)start, got, HEADER_BYTES, read_problem(r));
    }
    const uint64_t length = get_le64(head);
    const uint32_t stored = get_le32(head + 8), computed = nb__crc32c_masked(head, 8);
    if (stored != computed)
        return reader_fail(r, NB_ERR_IO,
                           "bad length CRC at byte offset %llu (record at byte offset %llu: stored 0x%08x, "
                           "computed 0x%08x over the length %llu)",
                           (unsigned long long)(start + 8), (unsigned long long)start, stored, computed,
                           (unsigned long long)length);

    /* The data and their CRC must fit in what is left of the file. */
    const uint64_t body = start + HEADER_BYTES;
    uint64_t left = r->file_size > body ? r->file_size - body : 0;
    if (length > left || left - length < FOOTER_BYTES) {
        struct stat sb;
        if (fstat(fileno(r->fp), &sb) == 0 && sb.st_size > 0)
            r->file_size = (uint64_t)sb.st_size;
        left = r->file_size > body ? r->file_size - body : 0;
    }
    if (length > left)
        return reader_fail(r, NB_ERR_IO,
                           "the length %llu at byte offset %llu is larger than the rest of the file (%llu bytes "
                           "after the header)",
                           (unsigned long long)length, (unsigned long long)start, (unsigned long long)left);
    if (left - length < FOOTER_BYTES)
        return reader_fail(r, NB_ERR_IO, "truncated data CRC at byte offset %llu (%llu of %d bytes)",
                           (unsigned long long)(body + length), (unsigned long long)(left - length), FOOTER_BYTES);
    *length_out = length;
    return NB_OK;
}

nb_status nb_tfrecord_next(nb_tfrecord_reader *r, const void **data, size_t *size)
{
    if (data)
        *data = NULL;
    if (size)
        *size = 0;
    if (r && (!data || !size))
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_next: %s is NULL", !data ? "data" : "size");
    uint64_t length;
    nb_status st = read_header(r, "nb_tfrecord_next", &length);
    if (st)
        return st;
    const uint64_t start = r->offset, body = start + HEADER_BYTES;
    if (length > SIZE_MAX - 1)
        return reader_fail(r, NB_ERR_OUT_OF_MEMORY, "the record at byte offset %llu has %llu bytes, more than "
                           "this machine can address", (unsigned long long)start, (unsigned long long)length);

    size_t n = (size_t)length, got;
    if (n + 1 > r->cap) {
        uint8_t *grown = realloc(r->record, n + 1);
        if (!grown)
            return nb__fail(NB_ERR_OUT_OF_MEMORY,
                            "nb_tfrecord_next: '%s': out of host memory for the record of %zu bytes at byte offset "
                            "%llu", r->path, n, (unsigned long long)start);
        r->record = grown;
        r->cap = n + 1;
    }
    if (!read_exact(r, r->record, n, &got))
        return reader_fail(r, NB_ERR_IO, "truncated data at byte offset %llu (%zu of %zu bytes: %s)",
                           (unsigned long long)body, got, n, read_problem(r));
    uint8_t foot[FOOTER_BYTES];
    if (!read_exact(r, foot, sizeof foot, &got))
        return reader_fail(r, NB_ERR_IO, "truncated data CRC at byte offset %llu (%zu of %d bytes: %s)",
                           (unsigned long long)(body + length), got, FOOTER_BYTES, read_problem(r));
    const uint32_t dstored = get_le32(foot), dcomputed = nb__crc32c_masked(r->record, n);
    if (dstored != dcomputed)
        return reader_fail(r, NB_ERR_IO,
                           "bad data CRC at byte offset %llu (record at byte offset %llu of %zu bytes: stored "
                           "0x%08x, computed 0x%08x)",
                           (unsigned long long)(body + length), (unsigned long long)start, n, dstored, dcomputed);
    r->offset = body + length + FOOTER_BYTES;
    *data = r->record;
    *size = n;
    return NB_OK;
}

nb_status nb_tfrecord_skip(nb_tfrecord_reader *r)
{
    uint64_t length;
    nb_status st = read_header(r, "nb_tfrecord_skip", &length);
    if (st)
        return st;
    const uint64_t next = r->offset + HEADER_BYTES + length + FOOTER_BYTES;
    if (next > (uint64_t)INT64_MAX || fseeko(r->fp, (off_t)next, SEEK_SET) != 0)
        return reader_fail(r, NB_ERR_IO, "cannot move past the record at byte offset %llu (%llu bytes): %s",
                           (unsigned long long)r->offset, (unsigned long long)length, strerror(errno));
    r->offset = next;
    return NB_OK;
}

uint64_t nb_tfrecord_reader_offset(const nb_tfrecord_reader *r) { return r ? r->offset : 0; }

void nb_tfrecord_reader_close(nb_tfrecord_reader *r)
{
    if (!r)
        return;
    fclose(r->fp);
    free(r->record);
    free(r->failure);
    free(r->path);
    free(r);
}
