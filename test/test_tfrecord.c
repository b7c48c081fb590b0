/* TFRecord files: CRC32C against its known vector and a bitwise reference;
 * writing and reading back many records (empty and large ones among them);
 * every single-byte corruption and every truncation of a small file refused
 * with NB_ERR_IO and the byte offset of the bad field; a length far past the
 * end of the file refused before anything is allocated; a fixture written by
 * test/data/make_fixtures.py (its path is argv[1]) read back; NULL arguments. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"
#include "lib/data/crc32c.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];
static const char *fixture_path;

static const char *tmp_path(const char *name)
{
    static char p[4][320];
    static int k;
    char *s = p[k++ % 4];
    snprintf(s, sizeof p[0], "%s/%s", tmpdir, name);
    return s;
}

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c(void)
{
    CHECK(nb__crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(nb__crc32c(0, NULL, 0) == 0);
    /* Split anywhere, started at any alignment, it agrees with the bitwise form. */
    uint8_t buf[300];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 131 + 17);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += 7) {
            uint32_t want = crc32c_bitwise(buf + off, n);
            CHECK(nb__crc32c(0, buf + off, n) == want);
            size_t half = n / 3;
            CHECK(nb__crc32c(nb__crc32c(0, buf + off, half), buf + off + half, n - half) == want);
        }
    uint32_t c = 0x12345678u;
    CHECK(nb__crc32c_mask(c) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
}

/* The bytes of record i of the round trip: sizes 0, 1, ..., some large. */
static size_t record_size(int i)
{
    if (i == 7)
        return (size_t)3 << 20; /* larger than the stdio buffers */
    if (i % 50 == 0)
        return 0;
    return (size_t)(i * 37 % 5000);
}

static void fill_record(uint8_t *p, size_t n, int i)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (uint8_t)(k * 29 + (size_t)i * 7 + (k >> 8));
}

static void test_round_trip(void)
{
    enum { N = 300 };
    const char *path = tmp_path("round.tfrecord");
    uint8_t *buf = malloc((size_t)3 << 20);
    CHECK(buf != NULL);
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    CHECK(w != NULL);
    if (!w || !buf) {
        free(buf);
        return;
    }
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        size_t n = record_size(i);
        fill_record(buf, n, i);
        CHECK_OK(nb_tfrecord_write(w, n ? buf : NULL, n));
        total += 16 + n;
        if (i == 100)
            CHECK_OK(nb_tfrecord_writer_flush(w));
    }
    CHECK_OK(nb_tfrecord_writer_close(w));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == total);

    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    CHECK(r != NULL);
    if (!r) {
        free(buf);
        return;
    }
    uint64_t offset = 0;
    for (int i = 0; i < N; i++) {
        const void *data = NULL;
        size_t size = 99;
        CHECK(nb_tfrecord_reader_offset(r) == offset);
        CHECK_OK(nb_tfrecord_next(r, &data, &size));
        size_t n = record_size(i);
        fill_record(buf, n, i);
        CHECKF(data != NULL && size == n && memcmp(data, buf, n) == 0, "record %d of %zu bytes", i, n);
        offset += 16 + n;
    }
    for (int k = 0; k < 2; k++) { /* the end, and again: no error recorded */
        const void *data = buf;
        size_t size = 5;
        CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_OUT_OF_RANGE);
        CHECK(data == NULL && size == 0 && nb_error() == NB_OK);
    }
    nb_tfrecord_reader_close(r);
    free(buf);
}

/* A small file of three records: 0, 5 and 20 bytes. Returns its size. */
static const size_t small_sizes[3] = {0, 5, 20};
static size_t small_file(uint8_t *out)
{
    const char *path = tmp_path("small.tfrecord");
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    uint8_t rec[20];
    for (int i = 0; i < 3; i++) {
        fill_record(rec, small_sizes[i], i);
        CHECK_OK(nb_tfrecord_write(w, rec, small_sizes[i]));
    }
    CHECK_OK(nb_tfrecord_writer_close(w));
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(out, 1, 256, f) : 0;
    if (f)
        fclose(f);
    CHECK(n == 3 * 16 + 25);
    return n;
}

static void write_bytes(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(n == 0 || fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* Reads every record of path; returns how many read before the end or the
 * first failure, and whether it ended in failure (error left pending). */
static int read_all(const char *path, bool *failed)
{
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    CHECK(r != NULL);
    int count = 0;
    *failed = false;
    for (;;) {
        const void *data;
        size_t size;
        nb_status st = nb_tfrecord_next(r, &data, &size);
        if (st == NB_ERR_OUT_OF_RANGE) {
            CHECK(data == NULL && size == 0 && nb_error() == NB_OK);
            break;
        }
        if (st != NB_OK) {
            *failed = true;
            CHECK(data == NULL && size == 0 && nb_error() == st);
            break;
        }
        CHECK(data != NULL);
        count++;
    }
    nb_tfrecord_reader_close(r);
    return count;
}

static void test_corrupt_bytes(void)
{
    uint8_t good[256], bad[256];
    size_t n = small_file(good);
    const char *path = tmp_path("flipped.tfrecord");
    for (size_t p = 0; p < n; p++) {
        memcpy(bad, good, n);
        bad[p] ^= 0x20;
        write_bytes(path, bad, n);
        /* The record holding p, and the field. */
        size_t start = 0;
        int rec = 0;
        while (p >= start + 16 + small_sizes[rec])
            start += 16 + small_sizes[rec++];
        char want[200];
        if (p < start + 12)
            snprintf(want, sizeof want, "bad length CRC at byte offset %zu (record at byte offset %zu", start + 8,
                     start);
        else
            snprintf(want, sizeof want, "bad data CRC at byte offset %zu (record at byte offset %zu",
                     start + 12 + small_sizes[rec], start);
        bool failed;
        int count = read_all(path, &failed);
        CHECKF(failed && count == rec, "byte %zu flipped: %d records, failed %d", p, count, failed);
        CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_next: '", path, want);
    }
}

static void test_truncated(void)
{
    uint8_t good[256];
    size_t n = small_file(good);
    const char *path = tmp_path("cut.tfrecord");
    for (size_t cut = 0; cut < n; cut++) {
        write_bytes(path, good, cut);
        size_t start = 0;
        int rec = 0;
        while (rec < 3 && cut >= start + 16 + small_sizes[rec])
            start += 16 + small_sizes[rec++];
        bool failed;
        int count = read_all(path, &failed);
        CHECKF(count == rec, "cut at %zu: %d records", cut, count);
        if (cut == start) { /* at a record's boundary: a shorter, valid file */
            CHECKF(!failed, "cut at %zu failed: %s", cut, nb_error_message());
            continue;
        }
        CHECKF(failed, "cut at %zu was accepted", cut);
        char want[200];
        size_t len = small_sizes[rec], left = cut - start;
        if (left < 12)
            snprintf(want, sizeof want, "truncated header at byte offset %zu (%zu of 12 bytes", start, left);
        else if (len > left - 12)
            snprintf(want, sizeof want, "the length %zu at byte offset %zu is larger than the rest of the file (%zu",
                     len, start, left - 12);
        else
            snprintf(want, sizeof want, "truncated data CRC at byte offset %zu", start + 12 + len);
        CHECK_ERROR(NB_ERR_IO, path, want);
    }
}

/* A header with a valid CRC claiming 2^62 bytes: refused by the size check,
 * with nothing reserved; the failure is kept for later calls. */
static void test_huge_length(void)
{
    uint8_t head[16 + 8];
    uint64_t len = UINT64_C(1) << 62;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = nb__crc32c_masked(head, 8);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(c >> (8 * i));
    memset(head + 12, 0xab, sizeof head - 12);
    const char *path = tmp_path("huge.tfrecord");
    write_bytes(path, head, sizeof head);
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    const void *data;
    size_t size;
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, path, "the length 4611686018427387904 at byte offset 0 is larger than the rest of the file (12 bytes");
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_IO && data == NULL);
    CHECK_ERROR(NB_ERR_IO, path, "at byte offset 0");
    nb_tfrecord_reader_close(r);
}

/* The same records as RECORDS in test/data/make_fixtures.py. */
static size_t fixture_record(int i, uint8_t *p)
{
    switch (i) {
    case 0: return 0;
    case 1: p[0] = 'a'; return 1;
    case 2: memcpy(p, "hello, tfrecord", 15); return 15;
    case 3:
        for (int k = 0; k < 256; k++)
            p[k] = (uint8_t)k;
        return 256;
    default:
        for (int k = 0; k < 1000; k++)
            p[k] = (uint8_t)((k * 7 + 3) & 0xff);
        return 1000;
    }
}

static void test_python_fixture(void)
{
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(fixture_path);
    CHECK(r != NULL);
    if (!r)
        return;
    uint8_t want[1000];
    for (int i = 0; i < 5; i++) {
        const void *data;
        size_t size;
        CHECK_OK(nb_tfrecord_next(r, &data, &size));
        size_t n = fixture_record(i, want);
        CHECKF(data && size == n && memcmp(data, want, n) == 0, "fixture record %d", i);
    }
    const void *data;
    size_t size;
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_OUT_OF_RANGE);
    CHECK(data == NULL);
    CHECK(nb_tfrecord_reader_offset(r) == 1352);
    nb_tfrecord_reader_close(r);
}

static void test_bad_arguments(void)
{
    CHECK(nb_tfrecord_writer_open(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_writer_open");
    CHECK(nb_tfrecord_writer_open(tmp_path("no/such/dir/x.tfrecord")) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_writer_open: cannot create '", "no/such/dir");
    CHECK(nb_tfrecord_reader_open(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_reader_open");
    CHECK(nb_tfrecord_reader_open(tmp_path("missing.tfrecord")) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_reader_open: cannot open '", "missing.tfrecord");
    CHECK(nb_tfrecord_reader_open(tmpdir) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_reader_open", tmpdir);
    CHECK(nb_tfrecord_write(NULL, "x", 1) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_write");
    CHECK(nb_tfrecord_writer_flush(NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_writer_flush");
    CHECK_OK(nb_tfrecord_writer_close(NULL));
    nb_tfrecord_reader_close(NULL);
    CHECK(nb_tfrecord_reader_offset(NULL) == 0);

    nb_tfrecord_writer *w = nb_tfrecord_writer_open(tmp_path("args.tfrecord"));
    CHECK(nb_tfrecord_write(w, NULL, 3) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_write", "data is NULL");
    CHECK_OK(nb_tfrecord_writer_close(w));
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(tmp_path("args.tfrecord"));
    const void *data;
    size_t size;
    CHECK(nb_tfrecord_next(r, NULL, &size) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_next: data is NULL");
    CHECK(nb_tfrecord_next(NULL, &data, &size) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_next: reader is NULL");
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_OUT_OF_RANGE); /* an empty file */
    CHECK(data == NULL && size == 0);
    nb_tfrecord_reader_close(r);
}

/* nb_tfrecord_skip moves past records of any size (the next read is the next
 * record, the offset advances by the record's 16 + size bytes), reports the
 * end like nb_tfrecord_next, fails on a truncated record's header and on a
 * length past the file's end, and keeps its failure. */
static void test_skip(void)
{
    const char *path = tmp_path("skip.tfrecord");
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    static uint8_t big[70000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 31);
    CHECK_OK(nb_tfrecord_write(w, big, sizeof big));
    CHECK_OK(nb_tfrecord_write(w, "", 0));
    CHECK_OK(nb_tfrecord_write(w, "abc", 3));
    CHECK_OK(nb_tfrecord_writer_close(w));
    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    const void *data;
    size_t size;
    CHECK_OK(nb_tfrecord_skip(r));
    CHECK(nb_tfrecord_reader_offset(r) == 16 + sizeof big);
    CHECK_OK(nb_tfrecord_skip(r));
    CHECK_OK(nb_tfrecord_next(r, &data, &size));
    CHECK(size == 3 && memcmp(data, "abc", 3) == 0);
    CHECK(nb_tfrecord_skip(r) == NB_ERR_OUT_OF_RANGE);
    CHECK(nb_error() == NB_OK);
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_OUT_OF_RANGE);
    nb_tfrecord_reader_close(r);

    /* the file cut inside the first record's data: skipping it fails, and keeps failing */
    FILE *f = fopen(path, "r+b");
    CHECK(f && ftruncate(fileno(f), 12 + 1000) == 0);
    fclose(f);
    r = nb_tfrecord_reader_open(path);
    CHECK(nb_tfrecord_skip(r) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_skip", "skip.tfrecord", "larger than the rest of the file");
    CHECK(nb_tfrecord_next(r, &data, &size) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "larger than the rest of the file");
    nb_tfrecord_reader_close(r);
    f = fopen(path, "r+b");
    CHECK(f && ftruncate(fileno(f), 5) == 0);
    fclose(f);
    r = nb_tfrecord_reader_open(path);
    CHECK(nb_tfrecord_skip(r) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_skip", "truncated header");
    nb_tfrecord_reader_close(r);
    CHECK(nb_tfrecord_skip(NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_tfrecord_skip: reader is NULL");
}

int main(int argc, char **argv)
{
    if (!check_scratch_dir(tmpdir, sizeof tmpdir, "nb_tfrecord"))
        return 1;
    fixture_path = argc > 1 ? argv[1] : NULL;
    RUN(test_crc32c);
    RUN(test_round_trip);
    RUN(test_corrupt_bytes);
    RUN(test_truncated);
    RUN(test_huge_length);
    if (fixture_path)
        RUN(test_python_fixture);
    else {
        fprintf(stderr, "test_tfrecord: no fixture path given (argv[1]); the fixture case did not run\n");
        check_failures++;
    }
    RUN(test_bad_arguments);
    RUN(test_skip);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_finish();
}
