/* nb_idx_read and nb_idx_read_memory: valid IDX files of every type (plain
 * and gzipped) and every malformed file the docs promise to reject, with their
 * codes and messages; the memory reader against the file reader. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"

#include <stdint.h>
#include <unistd.h>
#include "nb_config.h"
#if NB_HAVE_ZLIB
#include <zlib.h>
#endif

static char tmpdir[256];
static char paths[64][320];
static int npaths;

/* A path in the temp dir, remembered for cleanup. */
static const char *tmp_path(const char *name)
{
    char *p = paths[npaths++ % 64];
    snprintf(p, sizeof paths[0], "%s/%s", tmpdir, name);
    return p;
}

/* Writes data, gzip-compressed when gz (plain in a build without zlib, where
 * the gzip cases then exercise the plain path). */
static void write_file(const char *path, const void *data, size_t n, bool gz)
{
#if NB_HAVE_ZLIB
    if (gz) {
        gzFile f = gzopen(path, "wb");
        CHECK(f != NULL);
        if (!f)
            return;
        if (n)
            CHECK(gzwrite(f, data, (unsigned)n) == (int)n);
        CHECK(gzclose(f) == Z_OK);
        return;
    }
#else
    (void)gz;
#endif
    {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f)
            return;
        if (n)
            CHECK(fwrite(data, 1, n, f) == n);
        fclose(f);
    }
}

/* Builds an IDX image in buf: header, big-endian dims, then payload (already
 * big-endian). Returns its size. */
static size_t build_idx(uint8_t *buf, uint8_t type, int ndim, const uint32_t *dims,
                        const void *payload, size_t payload_bytes)
{
    size_t n = 0;
    buf[n++] = 0;
    buf[n++] = 0;
    buf[n++] = type;
    buf[n++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[n++] = (uint8_t)(dims[i] >> 24);
        buf[n++] = (uint8_t)(dims[i] >> 16);
        buf[n++] = (uint8_t)(dims[i] >> 8);
        buf[n++] = (uint8_t)dims[i];
    }
    if (payload_bytes)
        memcpy(buf + n, payload, payload_bytes);
    return n + payload_bytes;
}

/* Big-endian bytes of one element of elem bytes. */
static void put_be(uint8_t *dst, const void *src, size_t elem)
{
    const uint8_t *s = src;
    uint16_t one = 1;
    bool little = *(uint8_t *)&one == 1;
    for (size_t i = 0; i < elem; i++)
        dst[i] = little ? s[elem - 1 - i] : s[i];
}

static void check_u8(bool gz)
{
    uint8_t payload[24], buf[128];
    for (int i = 0; i < 24; i++)
        payload[i] = (uint8_t)(i * 11 + 3);
    uint32_t dims[3] = {2, 3, 4};
    size_t n = build_idx(buf, 0x08, 3, dims, payload, sizeof payload);
    const char *path = tmp_path(gz ? "u8.idx.gz" : "u8.idx");
    write_file(path, buf, n, gz);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(nb_tensor_dtype(t) == NB_U8);
    CHECK(nb_tensor_ndim(t) == 3);
    CHECK(nb_tensor_dim(t, 0) == 2 && nb_tensor_dim(t, 1) == 3 && nb_tensor_dim(t, 2) == 4);
    CHECK(strcmp(nb_tensor_device(t), "/cpu:0") == 0);
    uint8_t back[24];
    CHECK_OK(nb_tensor_read(t, back, sizeof back));
    CHECK(memcmp(back, payload, sizeof back) == 0);
}

static void test_u8_plain(void) { check_u8(false); }
static void test_u8_gzip(void) { check_u8(true); }

static void test_i8_bits(void)
{
    int8_t vals[5] = {-128, -1, 0, 1, 127};
    uint8_t buf[64];
    uint32_t dims[1] = {5};
    size_t n = build_idx(buf, 0x09, 1, dims, vals, sizeof vals);
    const char *path = tmp_path("i8.idx");
    write_file(path, buf, n, false);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(nb_tensor_dtype(t) == NB_U8);
    CHECK(nb_tensor_get(t, 0) == 128 && nb_tensor_get(t, 1) == 255 && nb_tensor_get(t, 2) == 0);
    CHECK(nb_tensor_get(t, 3) == 1 && nb_tensor_get(t, 4) == 127);
}

static void check_i32(bool gz)
{
    int32_t vals[6] = {0, 1, -1, 305419896, INT32_MIN, INT32_MAX};
    uint8_t payload[24], buf[128];
    for (int i = 0; i < 6; i++)
        put_be(payload + 4 * i, &vals[i], 4);
    uint32_t dims[2] = {3, 2};
    size_t n = build_idx(buf, 0x0C, 2, dims, payload, sizeof payload);
    const char *path = tmp_path(gz ? "i32.idx.gz" : "i32.idx");
    write_file(path, buf, n, gz);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(nb_tensor_dtype(t) == NB_I32);
    CHECK(nb_tensor_dim(t, 0) == 3 && nb_tensor_dim(t, 1) == 2);
    int32_t back[6];
    CHECK_OK(nb_tensor_read(t, back, sizeof back));
    CHECK(memcmp(back, vals, sizeof back) == 0);
}

static void test_i32_plain(void) { check_i32(false); }
static void test_i32_gzip(void) { check_i32(true); }

static void test_f32(void)
{
    float vals[4] = {1.5f, -2.25f, 3.0e-7f, 12345.678f};
    uint8_t payload[16], buf[64];
    for (int i = 0; i < 4; i++)
        put_be(payload + 4 * i, &vals[i], 4);
    uint32_t dims[2] = {2, 2};
    size_t n = build_idx(buf, 0x0D, 2, dims, payload, sizeof payload);
    const char *path = tmp_path("f32.idx.gz");
    write_file(path, buf, n, true);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(nb_tensor_dtype(t) == NB_F32);
    float back[4];
    CHECK_OK(nb_tensor_read(t, back, sizeof back));
    CHECK(memcmp(back, vals, sizeof back) == 0);
}

static void test_f64(void)
{
    double vals[3] = {3.141592653589793, -1e300, 2.5e-310};
    uint8_t payload[24], buf[64];
    for (int i = 0; i < 3; i++)
        put_be(payload + 8 * i, &vals[i], 8);
    uint32_t dims[1] = {3};
    size_t n = build_idx(buf, 0x0E, 1, dims, payload, sizeof payload);
    const char *path = tmp_path("f64.idx");
    write_file(path, buf, n, false);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (!t)
        return;
    CHECK(nb_tensor_dtype(t) == NB_F64);
    double back[3];
    CHECK_OK(nb_tensor_read(t, back, sizeof back));
    CHECK(memcmp(back, vals, sizeof back) == 0);
}

/* A larger file, so the reader's growing buffer takes several rounds. */
static void test_large_gzip(void)
{
    enum { N = 3000, D = 1000 };
    size_t bytes = (size_t)N * D;
    uint8_t *buf = malloc(bytes + 64);
    uint8_t *payload = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        payload[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t dims[2] = {N, D};
    size_t n = build_idx(buf, 0x08, 2, dims, payload, bytes);
    const char *path = tmp_path("large.idx.gz");
    write_file(path, buf, n, true);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t != NULL);
    if (t) {
        CHECK(nb_tensor_numel(t) == (int64_t)bytes);
        uint8_t *back = malloc(bytes);
        CHECK_OK(nb_tensor_read(t, back, bytes));
        CHECK(memcmp(back, payload, bytes) == 0);
        free(back);
    }
    free(buf);
    free(payload);
}

/* Writes raw bytes, reads them, and checks the error code and message. */
static void expect_reject(const char *name, const void *data, size_t n, bool gz, nb_status code,
                          const char *what)
{
    const char *path = tmp_path(name);
    write_file(path, data, n, gz);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t == NULL);
    CHECK_ERROR(code, path, what);
}

static void test_missing(void)
{
    const char *path = tmp_path("no-such-file.idx.gz");
    CHECK(nb_idx_read(path) == NULL);
    CHECK_ERROR(NB_ERR_IO, path, "cannot open");
    CHECK(nb_idx_read(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_idx_read");
}

static void test_bad_magic(void)
{
    uint8_t buf[64];
    uint32_t dims[1] = {2};
    uint8_t payload[2] = {1, 2};
    size_t n = build_idx(buf, 0x08, 1, dims, payload, 2);
    buf[0] = 0x1f;
    expect_reject("magic0.idx", buf, n, false, NB_ERR_IO, "bad magic");
    buf[0] = 0;
    buf[1] = 7;
    expect_reject("magic1.idx.gz", buf, n, true, NB_ERR_IO, "bad magic");
    const char *text = "hello, this is not an IDX file\n";
    expect_reject("text.txt", text, strlen(text), false, NB_ERR_IO, "bad magic");
}

static void test_bad_type(void)
{
    uint8_t buf[64];
    uint32_t dims[1] = {2};
    uint8_t payload[2] = {1, 2};
    size_t n = build_idx(buf, 0x0A, 1, dims, payload, 2);
    expect_reject("type0a.idx", buf, n, false, NB_ERR_IO, "unknown element type");
    n = build_idx(buf, 0xFF, 1, dims, payload, 2);
    expect_reject("typeff.idx.gz", buf, n, true, NB_ERR_IO, "unknown element type");
    uint8_t p16[4] = {0, 1, 0, 2};
    n = build_idx(buf, 0x0B, 1, dims, p16, 4);
    expect_reject("i16.idx", buf, n, false, NB_ERR_UNSUPPORTED, "i16");
}

static void test_bad_ndim(void)
{
    uint8_t buf[128];
    uint8_t payload[1] = {5};
    size_t n = build_idx(buf, 0x08, 0, NULL, payload, 1);
    expect_reject("ndim0.idx", buf, n, false, NB_ERR_IO, "0 dims");
    uint32_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    n = build_idx(buf, 0x08, 9, dims, payload, 1);
    expect_reject("ndim9.idx.gz", buf, n, true, NB_ERR_IO, "9 dims");
    /* 8 dims is the most, and fine. */
    n = build_idx(buf, 0x08, 8, dims, payload, 1);
    const char *path = tmp_path("ndim8.idx");
    write_file(path, buf, n, false);
    nb_tensor *t = nb_idx_read(path);
    CHECK(t && nb_tensor_ndim(t) == 8 && nb_tensor_get(t, 0) == 5);
}

static void test_truncated(void)
{
    uint8_t buf[128];
    uint32_t dims[2] = {3, 4};
    uint8_t payload[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    size_t n = build_idx(buf, 0x08, 2, dims, payload, sizeof payload);
    expect_reject("empty.idx", buf, 0, false, NB_ERR_IO, "truncated header");
    expect_reject("head2.idx", buf, 2, false, NB_ERR_IO, "truncated header");
    expect_reject("dims.idx.gz", buf, 9, true, NB_ERR_IO, "truncated header");
    expect_reject("data.idx", buf, n - 1, false, NB_ERR_IO, "truncated data");
    expect_reject("data.idx.gz", buf, n - 5, true, NB_ERR_IO, "truncated data");
    /* A big header with a small file: refused without trusting the header's size. */
    uint32_t huge[3] = {60000, 60000, 60000};
    n = build_idx(buf, 0x0E, 3, huge, payload, sizeof payload);
    expect_reject("huge.idx", buf, n, false, NB_ERR_IO, "");
    uint32_t big[2] = {100000, 100000};
    n = build_idx(buf, 0x0D, 2, big, payload, sizeof payload);
    expect_reject("big.idx.gz", buf, n, true, NB_ERR_IO, "truncated data");
}

static void test_trailing(void)
{
    uint8_t buf[128];
    uint32_t dims[1] = {4};
    uint8_t payload[5] = {1, 2, 3, 4, 99};
    size_t n = build_idx(buf, 0x08, 1, dims, payload, sizeof payload);
    expect_reject("trail.idx", buf, n, false, NB_ERR_IO, "trailing data");
    expect_reject("trail.idx.gz", buf, n, true, NB_ERR_IO, "trailing data");
}

/* A gzip stream cut short: zlib reports it, and so do we. Without zlib, any
 * gzip file is refused with the reason. */
static void test_corrupt_gzip(void)
{
#if !NB_HAVE_ZLIB
    const uint8_t magic[16] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    expect_reject("nozlib.idx.gz", magic, sizeof magic, false, NB_ERR_IO, "without zlib");
    return;
#endif
    uint8_t payload[4000], buf[4100];
    for (int i = 0; i < 4000; i++)
        payload[i] = (uint8_t)(i * 7919 >> 3);
    uint32_t dims[1] = {4000};
    size_t n = build_idx(buf, 0x08, 1, dims, payload, sizeof payload);
    const char *full = tmp_path("whole.idx.gz");
    write_file(full, buf, n, true);
    FILE *f = fopen(full, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    uint8_t gz[8192];
    size_t gzn = fread(gz, 1, sizeof gz, f);
    fclose(f);
    CHECK(gzn > 40);
    expect_reject("cut.idx.gz", gz, gzn / 2, false, NB_ERR_IO, "truncated");
}

/* Dims whose product passes the limit are refused in any order, a zero dim
 * included: [0, 2^32-1, 2^32-1] used to pass (its byte count stopped at 0) and
 * made an empty tensor whose strides overflow. */
static void test_zero_dim_overflow(void)
{
    const uint32_t m = 0xffffffffu;
    const uint32_t orders[4][3] = {{0, m, m}, {m, 0, m}, {m, m, 0}, {m, m, m}};
    uint8_t buf[64];
    for (int i = 0; i < 4; i++) {
        size_t n = build_idx(buf, 0x08, 3, orders[i], NULL, 0);
        char name[32];
        snprintf(name, sizeof name, "huge%d.idx", i);
        expect_reject(name, buf, n, false, NB_ERR_IO, "too large");
        CHECK(nb_idx_read_memory(buf, n) == NULL);
        CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "buffer of 16 bytes", "4294967295", "too large");
    }
    /* Empty, with dims that fit: a tensor of no elements. */
    const uint32_t fit[3] = {0, 65536, 65536};
    size_t n = build_idx(buf, 0x0E, 3, fit, NULL, 0);
    nb_tensor *t = nb_idx_read_memory(buf, n);
    CHECK(t && nb_tensor_numel(t) == 0 && nb_tensor_dim(t, 2) == 65536 && nb_tensor_dtype(t) == NB_F64);
}

/* The whole file, as written to disk, into buf; returns its size. */
static size_t file_bytes(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* Reads data both ways and checks the memory reader agrees with the file
 * reader: the same tensor, or the same error code. */
static nb_tensor *read_both(const char *name, const uint8_t *data, size_t n)
{
    const char *path = tmp_path(name);
    write_file(path, data, n, false);
    nb_tensor *f = nb_idx_read(path);
    nb_status fcode = nb_error_clear();
    nb_tensor *m = nb_idx_read_memory(data, n);
    CHECK((f == NULL) == (m == NULL));
    CHECK(nb_error() == fcode);
    if (f && m)
        CHECK(same_bits(f, m));
    return m;
}

static void test_memory(void)
{
    uint8_t payload[6] = {9, 8, 7, 6, 5, 4}, buf[256], gz[512];
    uint32_t dims[2] = {2, 3};
    size_t n = build_idx(buf, 0x08, 2, dims, payload, sizeof payload);
    nb_tensor *t = read_both("mem.idx", buf, n);
    CHECK(t && nb_tensor_dim(t, 0) == 2 && nb_tensor_dim(t, 1) == 3 && nb_tensor_get(t, 5) == 4);
    CHECK(t && strcmp(nb_tensor_device(t), "/cpu:0") == 0);

    /* gzipped, as gzip writes it */
    const char *gzpath = tmp_path("mem.idx.gz");
    write_file(gzpath, buf, n, true);
    size_t gzn = file_bytes(gzpath, gz, sizeof gz);
    t = read_both("mem-copy.idx.gz", gz, gzn);
    CHECK(t && nb_tensor_numel(t) == 6 && nb_tensor_get(t, 0) == 9);
#if NB_HAVE_ZLIB
    /* two members one after the other read as one stream; anything after the
     * last member is ignored, as gzread does */
    uint8_t two[1024];
    const char *head = tmp_path("head.gz"), *tail = tmp_path("tail.gz");
    write_file(head, buf, 5, true);
    write_file(tail, buf + 5, n - 5, true);
    size_t k = file_bytes(head, two, sizeof two);
    k += file_bytes(tail, two + k, sizeof two - k);
    t = read_both("two.idx.gz", two, k);
    CHECK(t && nb_tensor_numel(t) == 6 && nb_tensor_get(t, 3) == 6);
    memcpy(two + k, "junk", 4);
    t = read_both("junk.idx.gz", two, k + 4);
    CHECK(t && nb_tensor_numel(t) == 6);
    /* a stream cut short, or garbage after the magic */
    CHECK(read_both("cut-mem.idx.gz", gz, gzn / 2) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "truncated");
    const uint8_t junk[12] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0x13};
    CHECK(read_both("bad-mem.idx.gz", junk, sizeof junk) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "buffer of 12 bytes");
#else
    CHECK(t == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "without zlib");
#endif

    /* the same refusals as from a file, naming the buffer */
    CHECK(read_both("mem-trunc.idx", buf, n - 1) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "buffer of 17 bytes", "truncated data");
    buf[n] = 1;
    CHECK(read_both("mem-trail.idx", buf, n + 1) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "trailing data");
    CHECK(read_both("mem-head.idx", buf, 3) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "truncated header");
    buf[1] = 1;
    CHECK(read_both("mem-magic.idx", buf, n) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "bad magic");
    CHECK(nb_idx_read_memory(NULL, 0) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_memory", "buffer of 0 bytes", "truncated header");
    CHECK(nb_idx_read_memory(NULL, 4) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_idx_read_memory", "NULL");
}

/* The real data set, where it is installed. */
static void test_fashion_mnist(void)
{
    const char *path = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(path, R_OK) != 0 || !NB_HAVE_ZLIB)
        return;
    nb_tensor *t = nb_idx_read(path);
    CHECK(t && nb_tensor_ndim(t) == 1 && nb_tensor_dim(t, 0) == 10000);
    CHECK(t && nb_tensor_dtype(t) == NB_U8);
    if (t) {
        nb_tensor *mx = nb_max(nb_cast(t, NB_I32), NB_ALL_AXES, false);
        CHECK(mx && nb_tensor_item(mx) == 9);
    }
}

/* nb_idx_read_share: every share of a [rows, 3] i32 file (plain and gzipped,
 * and across the reader's 1 MiB window) is the full read's rows index, index +
 * count, ...; the shares' rows together are the file; a bad file is refused
 * as nb_idx_read refuses it; bad arguments. */
static void check_share(bool gz, int64_t rows)
{
    size_t payload_bytes = (size_t)rows * 3 * 4;
    uint8_t *buf = malloc(payload_bytes + 64), *payload = malloc(payload_bytes);
    for (int64_t i = 0; i < rows * 3; i++) {
        int32_t v = (int32_t)(i * 7919 - 100000);
        put_be(payload + 4 * i, &v, 4);
    }
    uint32_t dims[2] = {(uint32_t)rows, 3};
    size_t n = build_idx(buf, 0x0C, 2, dims, payload, payload_bytes);
    const char *path = tmp_path(gz ? "share.idx.gz" : "share.idx");
    write_file(path, buf, n, gz);
    nb_tensor *all = nb_idx_read(path);
    CHECK(all != NULL);
    int64_t seen = 0;
    for (int64_t count = 1; count <= 5 && all; count++)
        for (int64_t index = 0; index < count; index++) {
            nb_tensor *t = nb_idx_read_share(path, count, index);
            int64_t k = rows > index ? (rows - index + count - 1) / count : 0;
            CHECKF(t && nb_tensor_dim(t, 0) == k && nb_tensor_dim(t, 1) == 3 && nb_tensor_dtype(t) == NB_I32,
                   "share %lld of %lld: %lld rows", (long long)index, (long long)count, (long long)k);
            for (int64_t j = 0; t && j < k; j += 1 + k / 7)
                for (int c = 0; c < 3; c++)
                    CHECKF(nb_tensor_get(t, j * 3 + c) == nb_tensor_get(all, (index + j * count) * 3 + c),
                           "share %lld of %lld, row %lld", (long long)index, (long long)count, (long long)j);
            if (count == 3)
                seen += t ? nb_tensor_dim(t, 0) : 0;
        }
    CHECK(seen == rows);
    /* cut short, or followed by a stray byte: refused in a share too */
    buf[n] = 9;
    write_file(path, buf, n + 1, gz);
    CHECK(nb_idx_read_share(path, 2, 1) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_share", "trailing data");
    write_file(path, buf, n - 1, gz);
    CHECK(nb_idx_read_share(path, 2, 0) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_share", "truncated data");
    free(buf);
    free(payload);
}

static void test_share(void)
{
    check_share(false, 10);
    check_share(true, 10);
    check_share(false, 100003); /* 1.2 MB: rows across the window's edges */
    check_share(true, 100003);
    uint8_t buf[64];
    uint32_t dims[2] = {5, 0};
    const char *path = tmp_path("share0.idx");
    write_file(path, buf, build_idx(buf, 0x08, 2, dims, NULL, 0), false);
    nb_tensor *t = nb_idx_read_share(path, 2, 0); /* rows of no bytes */
    CHECK(t && nb_tensor_dim(t, 0) == 3 && nb_tensor_dim(t, 1) == 0);
    t = nb_idx_read_share(path, 9, 7); /* past the last row */
    CHECK(t && nb_tensor_dim(t, 0) == 0);
    CHECK(nb_idx_read_share(path, 0, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_idx_read_share", "row 0 of every 0");
    CHECK(nb_idx_read_share(path, 2, 2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_idx_read_share");
    CHECK(nb_idx_read_share(NULL, 2, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_idx_read_share", "NULL");
    CHECK(nb_idx_read_share("/nonexistent/share.idx", 2, 1) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_idx_read_share", "/nonexistent/share.idx");
}

static void remove_all(void)
{
    for (int i = 0; i < npaths && i < 64; i++)
        unlink(paths[i]);
    rmdir(tmpdir);
}

int main(void)
{
    if (!check_scratch_dir(tmpdir, sizeof tmpdir, "nb_idx"))
        return 1;
    RUN(test_u8_plain);
    RUN(test_u8_gzip);
    RUN(test_i8_bits);
    RUN(test_i32_plain);
    RUN(test_i32_gzip);
    RUN(test_f32);
    RUN(test_f64);
    RUN(test_large_gzip);
    RUN(test_missing);
    RUN(test_bad_magic);
    RUN(test_bad_type);
    RUN(test_bad_ndim);
    RUN(test_truncated);
    RUN(test_trailing);
    RUN(test_corrupt_gzip);
    RUN(test_zero_dim_overflow);
    RUN(test_memory);
    RUN(test_share);
    RUN(test_fashion_mnist);
    remove_all();
    return check_finish();
}
