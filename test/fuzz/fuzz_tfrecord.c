/* libFuzzer target for the TFRecord reader. Each input is written to a file
 * and read record by record until the end or a failure. A failure must be
 * NB_ERR_IO (or NB_ERR_OUT_OF_MEMORY) with a message naming nb_tfrecord_next,
 * the file and a byte offset; every record read must be framed in the input
 * exactly where the reader's offsets say, with the input's own bytes; the end
 * (NB_ERR_OUT_OF_RANGE, no error recorded) must be the input's end. The records read are then written again with
 * nb_tfrecord_writer and must reproduce the input's bytes up to that point.
 * A second reader skips every other record (nb_tfrecord_skip) and must frame
 * the input the same way.
 * Any disagreement, crash, sanitizer report or leak is a finding. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nabla/nabla.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_tfrecord"
#include "fuzz_util.h"

static char path[512], out_path[512]; /* one pair per process */

static void remove_files(void)
{
    unlink(path);
    unlink(out_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_temp_file(path, sizeof path, "tfrecord");
    fuzz_temp_file(out_path, sizeof out_path, "tfrecord_out");
    atexit(remove_files);
    return 0;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL, "cannot write %s", path);
    REQUIRE(size == 0 || fwrite(data, 1, size, f) == size, "short write to %s", path);
    REQUIRE(fclose(f) == 0, "cannot close %s", path);

    nb_tfrecord_reader *r = nb_tfrecord_reader_open(path);
    REQUIRE(r != NULL, "open failed: %s", nb_error_message());
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(out_path);
    REQUIRE(w != NULL, "open for writing failed: %s", nb_error_message());
    uint64_t offset = 0;
    int64_t n_read = 0;
    bool ended = false;
    for (;;) {
        const void *rec;
        size_t n;
        REQUIRE(nb_tfrecord_reader_offset(r) == offset, "offset %llu, expected %llu",
                (unsigned long long)nb_tfrecord_reader_offset(r), (unsigned long long)offset);
        nb_status st = nb_tfrecord_next(r, &rec, &n);
        if (st == NB_ERR_OUT_OF_RANGE) {
            REQUIRE(rec == NULL && n == 0 && offset == size, "the end at %llu of %zu bytes",
                    (unsigned long long)offset, size);
            REQUIRE(nb_error() == NB_OK, "an error at the end: %s", nb_error_message());
            ended = true;
            break;
        }
        if (st != NB_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", nb_error_message());
            nb_status code = nb_error_clear();
            REQUIRE(code == st && (st == NB_ERR_IO || st == NB_ERR_OUT_OF_MEMORY), "failed with %s: %s",
                    nb_status_name(st), msg);
            REQUIRE(rec == NULL && n == 0, "a record and a failure");
            REQUIRE(strncmp(msg, "nb_tfrecord_next: '", 19) == 0 && strstr(msg, path) &&
                        strstr(msg, "byte offset "), "message '%s'", msg);
            REQUIRE(offset < size, "a failure at the input's end: %s", msg);
            /* The failure is kept. */
            REQUIRE(nb_tfrecord_next(r, &rec, &n) == st && rec == NULL, "a second call after a failure");
            nb_error_clear();
            break;
        }
        REQUIRE(rec != NULL, "NB_OK without a record");
        REQUIRE(offset + 16 + n <= size, "a record of %zu bytes at %llu past the end of %zu", n,
                (unsigned long long)offset, size);
        REQUIRE(le64(data + offset) == n, "length field disagrees with %zu", n);
        REQUIRE(memcmp(rec, data + offset + 12, n) == 0, "record bytes differ from the input's");
        REQUIRE(nb_tfrecord_write(w, rec, n) == NB_OK, "write: %s", nb_error_message());
        offset += 16 + n;
        n_read++;
    }
    nb_tfrecord_reader_close(r);

    /* Skipping every other record: the same framing; the records read are the
     * input's; every record the first pass read is reached, and the end where
     * it ended (a skip checks less, so it may get further after a failure). */
    r = nb_tfrecord_reader_open(path);
    REQUIRE(r != NULL, "open failed: %s", nb_error_message());
    uint64_t at = 0;
    for (int64_t i = 0;; i++) {
        const void *rec = NULL;
        size_t n = 0;
        nb_status st = i % 2 ? nb_tfrecord_next(r, &rec, &n) : nb_tfrecord_skip(r);
        if (st == NB_ERR_OUT_OF_RANGE) {
            REQUIRE(at == size && nb_error() == NB_OK && i >= n_read && (!ended || i == n_read),
                    "the end after %lld records at %llu of %zu bytes (%s)", (long long)i, (unsigned long long)at,
                    size, nb_error_message());
            break;
        }
        if (st != NB_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", nb_error_message());
            nb_status code = nb_error_clear();
            REQUIRE(code == st && (st == NB_ERR_IO || st == NB_ERR_OUT_OF_MEMORY) && !ended && i >= n_read,
                    "record %lld (%s) failed with %s: %s", (long long)i, i % 2 ? "read" : "skipped",
                    nb_status_name(st), msg);
            REQUIRE(strstr(msg, i % 2 ? "nb_tfrecord_next: '" : "nb_tfrecord_skip: '") == msg &&
                        strstr(msg, "byte offset "), "message '%s'", msg);
            break;
        }
        REQUIRE(at + 16 + le64(data + at) == nb_tfrecord_reader_offset(r), "record %lld ends at %llu", (long long)i,
                (unsigned long long)nb_tfrecord_reader_offset(r));
        if (i % 2)
            REQUIRE(n == le64(data + at) && memcmp(rec, data + at + 12, n) == 0, "record %lld differs", (long long)i);
        at = nb_tfrecord_reader_offset(r);
    }
    nb_tfrecord_reader_close(r);
    REQUIRE(nb_tfrecord_writer_close(w) == NB_OK, "close: %s", nb_error_message());

    /* What was read, written again, is the input up to that point. */
    f = fopen(out_path, "rb");
    REQUIRE(f != NULL, "cannot read %s", out_path);
    uint8_t *again = malloc(offset + 1);
    REQUIRE(again != NULL, "out of memory");
    size_t got = fread(again, 1, offset + 1, f);
    fclose(f);
    REQUIRE(got == offset && memcmp(again, data, offset) == 0, "rewritten %zu bytes differ from the %llu read", got,
            (unsigned long long)offset);
    free(again);
    REQUIRE(nb_error() == NB_OK, "pending error: %s", nb_error_message());
    return 0;
}
