/* libFuzzer target for the IDX reader. Each input is an IDX image, gzipped or
 * plain, read twice: from memory (nb_idx_read_memory) and from a file holding
 * the same bytes (nb_idx_read). The two must agree. A failure must be an
 * error with a message naming the reader; a success must be a CPU tensor
 * whose dtype, shape and bytes are what the header and payload say (checked
 * against this file's own decoding for plain images); nb_idx_read_share's
 * every third row must be the whole read's. Any disagreement, crash,
 * sanitizer report or leaked tensor is a finding. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nabla/nabla.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_idx"
#include "fuzz_util.h"

static char path[512]; /* the file nb_idx_read reads: one per process */

static void remove_file(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("NB_NUM_THREADS", "1", 0); /* one thread: faster and reproducible runs */
    fuzz_temp_file(path, sizeof path, "idx");
    atexit(remove_file);
    return 0;
}

static void write_file(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL, "cannot write %s", path);
    REQUIRE(size == 0 || fwrite(data, 1, size, f) == size, "short write to %s", path);
    REQUIRE(fclose(f) == 0, "cannot close %s", path);
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads t's bytes into a new buffer (caller frees). */
static uint8_t *bytes_of(const nb_tensor *t, size_t *n)
{
    *n = (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    uint8_t *b = malloc(*n ? *n : 1);
    REQUIRE(b != NULL, "out of memory");
    nb_status st = nb_tensor_read(t, b, *n);
    REQUIRE(st == NB_OK, "reading back %zu bytes: %s", *n, nb_error_message());
    return b;
}

/* A plain image that was read: its header and payload, decoded here, must be
 * the tensor's dtype, shape and (host-order) bytes. */
static void check_plain(const uint8_t *data, size_t size, const nb_tensor *t)
{
    REQUIRE(size >= 4 && data[0] == 0 && data[1] == 0, "a tensor from a bad header");
    nb_dtype want;
    switch (data[2]) {
    case 0x08: case 0x09: want = NB_U8; break;
    case 0x0C: want = NB_I32; break;
    case 0x0D: want = NB_F32; break;
    case 0x0E: want = NB_F64; break;
    default: REQUIRE(0, "a tensor from type code 0x%02x", data[2]); return;
    }
    int ndim = data[3];
    REQUIRE(nb_tensor_dtype(t) == want, "dtype %s, header says %s", nb_dtype_name(nb_tensor_dtype(t)),
            nb_dtype_name(want));
    REQUIRE(ndim >= 1 && ndim <= NB_MAX_DIMS && nb_tensor_ndim(t) == ndim, "%d dims, header says %d",
            nb_tensor_ndim(t), ndim);
    REQUIRE(size >= 4 + 4 * (size_t)ndim, "a tensor from a truncated header");
    /* The reader's promise: the dims, a zero one counted as 1, take at most
     * 2^48 bytes, in whatever order they come. */
    size_t elem = nb_dtype_size(want), n;
    uint64_t count = 1, span = elem;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = be32(data + 4 + 4 * i);
        REQUIRE(nb_tensor_dim(t, i) == (int64_t)d, "dim %d is %lld, header says %u", i,
                (long long)nb_tensor_dim(t, i), d);
        REQUIRE(d <= 1 || span <= (UINT64_C(1) << 48) / d, "dims past 2^48 bytes were accepted");
        span *= d ? d : 1;
        count *= d;
    }
    size_t payload = size - 4 - 4 * (size_t)ndim;
    REQUIRE(count * elem == payload, "%llu elements of %zu bytes from a %zu-byte payload",
            (unsigned long long)count, elem, payload);
    REQUIRE(nb_tensor_numel(t) == (int64_t)count, "numel %lld, dims say %llu", (long long)nb_tensor_numel(t),
            (unsigned long long)count);
    uint8_t *got = bytes_of(t, &n);
    const uint8_t *src = data + 4 + 4 * (size_t)ndim;
    const uint16_t one = 1;
    const bool little = *(const uint8_t *)&one == 1;
    for (size_t i = 0; i < n; i++) {
        size_t e = i / elem, k = i % elem;
        uint8_t want_byte = src[e * elem + (little ? elem - 1 - k : k)];
        REQUIRE(got[i] == want_byte, "byte %zu is 0x%02x, the payload says 0x%02x", i, got[i], want_byte);
    }
    free(got);
}

static bool expected_failure(nb_status code)
{
    return code == NB_ERR_IO || code == NB_ERR_UNSUPPORTED;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t live = nb_live_tensors();
    nb_scope *scope = nb_scope_begin();
    REQUIRE(scope != NULL, "no scope");

    nb_tensor *m = nb_idx_read_memory(size ? data : NULL, size);
    char mmsg[1024];
    snprintf(mmsg, sizeof mmsg, "%s", nb_error_message());
    nb_status mcode = nb_error_clear();
    if (!m) {
        REQUIRE(expected_failure(mcode), "memory read failed with %s: %s", nb_status_name(mcode), mmsg);
        REQUIRE(strncmp(mmsg, "nb_idx_read_memory: buffer of ", 30) == 0, "message '%s'", mmsg);
    } else {
        REQUIRE(mcode == NB_OK, "a tensor and an error %s", nb_status_name(mcode));
        REQUIRE(strcmp(nb_tensor_device(m), "/cpu:0") == 0, "on %s", nb_tensor_device(m));
        if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b))
            check_plain(data, size, m);
    }

    write_file(data, size);
    nb_tensor *f = nb_idx_read(path);
    char fmsg[1024];
    snprintf(fmsg, sizeof fmsg, "%s", nb_error_message());
    nb_status fcode = nb_error_clear();
    /* gzread reads ahead, so a corrupt gzip stream can fail the file reader
     * earlier than the memory one, with another code; otherwise they agree. */
    bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    REQUIRE((m == NULL) == (f == NULL) && (mcode == fcode || gzip), "memory gave %s, the file %s (%s)",
            nb_status_name(mcode), nb_status_name(fcode), fmsg);
    if (!f) {
        REQUIRE(strncmp(fmsg, "nb_idx_read: ", 13) == 0 && strstr(fmsg, path), "message '%s'", fmsg);
    } else {
        REQUIRE(nb_tensor_dtype(f) == nb_tensor_dtype(m) && nb_tensor_ndim(f) == nb_tensor_ndim(m),
                "the file and memory readers disagree on dtype or ndim");
        for (int i = 0; i < nb_tensor_ndim(f); i++)
            REQUIRE(nb_tensor_dim(f, i) == nb_tensor_dim(m, i), "dim %d differs", i);
        size_t nf, nm;
        uint8_t *bf = bytes_of(f, &nf), *bm = bytes_of(m, &nm);
        REQUIRE(nf == nm && memcmp(bf, bm, nf) == 0, "the two readers read different bytes");
        free(bf);
        free(bm);
    }

    /* Every third row from row 1: fails where the whole read fails (a corrupt
     * gzip stream may fail with another code), else is the whole read's rows
     * 1, 4, 7, ... */
    nb_tensor *sh = nb_idx_read_share(path, 3, 1);
    char smsg[1024];
    snprintf(smsg, sizeof smsg, "%s", nb_error_message());
    nb_status scode = nb_error_clear();
    REQUIRE((sh == NULL) == (f == NULL) && (scode == fcode || gzip), "the whole read gave %s, the share %s (%s)",
            nb_status_name(fcode), nb_status_name(scode), smsg);
    if (!sh) {
        REQUIRE(strncmp(smsg, "nb_idx_read_share: ", 19) == 0 && strstr(smsg, path), "message '%s'", smsg);
    } else {
        int64_t rows = nb_tensor_dim(f, 0), k = rows > 1 ? (rows - 1 + 2) / 3 : 0;
        REQUIRE(nb_tensor_dtype(sh) == nb_tensor_dtype(f) && nb_tensor_ndim(sh) == nb_tensor_ndim(f) &&
                    nb_tensor_dim(sh, 0) == k, "the share has %lld rows of %lld", (long long)nb_tensor_dim(sh, 0),
                (long long)rows);
        for (int i = 1; i < nb_tensor_ndim(f); i++)
            REQUIRE(nb_tensor_dim(sh, i) == nb_tensor_dim(f, i), "the share's dim %d differs", i);
        size_t nf, ns;
        uint8_t *bf = bytes_of(f, &nf), *bs = bytes_of(sh, &ns);
        size_t row = rows ? nf / (size_t)rows : 0;
        for (int64_t j = 0; row > 0 && j < k; j++) /* rows of no bytes: nothing to compare, however many */
            REQUIRE(memcmp(bs + (size_t)j * row, bf + (size_t)(1 + 3 * j) * row, row) == 0,
                    "the share's row %lld is not row %lld", (long long)j, (long long)(1 + 3 * j));
        free(bf);
        free(bs);
    }

    nb_scope_end(scope);
    REQUIRE_CLEAN(live);
    return 0;
}
