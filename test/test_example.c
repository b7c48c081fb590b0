/* tf.train.Example parsing: the fixture test/data/make_example_fixture.py wrote
 * (its path is the first argument), and hand-made malformed inputs; writing
 * Examples with nb_example_write and reading them back. */
#include "test/check.h"

#include <unistd.h>

static unsigned char *fixture;
static size_t fixture_size;

static void test_values(void)
{
    const nb_feature_spec specs[] = {
        {"floats", NB_FEATURE_FLOAT, 3},    {"floats_unpacked", NB_FEATURE_FLOAT, -1},
        {"ints", NB_FEATURE_INT64, 4},      {"ints_unpacked", NB_FEATURE_INT64, 2},
        {"label", NB_FEATURE_INT64, 1},     {"name", NB_FEATURE_BYTES, 11},
        {"empty", NB_FEATURE_FLOAT, 0},     {"merged", NB_FEATURE_FLOAT, -1},
        {"switched", NB_FEATURE_INT64, -1},
    };
    enum { N = sizeof specs / sizeof *specs };
    nb_tensor *out[N];
    CHECK_OK(nb_example_parse(fixture, fixture_size, N, specs, out));
    if (!out[0])
        return;
    float f[3];
    nb_tensor_read(out[0], f, sizeof f);
    CHECK(nb_tensor_dtype(out[0]) == NB_F32 && f[0] == 1.5f && f[1] == -2.25f && f[2] == 3e10f);
    CHECK(has_shape(out[1], NB_SHAPE(2)) && nb_tensor_get(out[1], 0) == 0.5 && nb_tensor_get(out[1], 1) == 7);
    int64_t iv[4];
    nb_tensor_read(out[2], iv, sizeof iv);
    CHECK(nb_tensor_dtype(out[2]) == NB_I64 && iv[0] == 1 && iv[1] == -1 && iv[2] == INT64_C(1) << 62 &&
          iv[3] == INT64_MIN);
    CHECK(nb_tensor_get(out[3], 0) == 42 && nb_tensor_get(out[3], 1) == -7);
    CHECK(has_shape(out[4], NB_SHAPE(1)) && nb_tensor_item(out[4]) == 3); /* the last entry wins */
    char name[11];
    nb_tensor_read(out[5], name, sizeof name);
    CHECK(nb_tensor_dtype(out[5]) == NB_U8 && memcmp(name, "hello\0world", 11) == 0);
    CHECK(has_shape(out[6], NB_SHAPE(0)));
    CHECK(has_shape(out[7], NB_SHAPE(3)) && nb_tensor_get(out[7], 2) == 3);
    CHECK(has_shape(out[8], NB_SHAPE(1)) && nb_tensor_item(out[8]) == 5);
}

static void test_spec_errors(void)
{
    nb_tensor *out[2] = {NULL, NULL};
    nb_feature_spec s[2] = {{"floats", NB_FEATURE_FLOAT, -1}, {"nothere", NB_FEATURE_FLOAT, -1}};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT && !out[0] && !out[1]);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_example_parse", "'nothere'", "missing");
    s[1] = (nb_feature_spec){"ints", NB_FEATURE_FLOAT, -1};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'ints'", "int64_list", "float_list");
    s[1] = (nb_feature_spec){"floats", NB_FEATURE_FLOAT, 4};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'floats'", "3 values", "4");
    s[1] = (nb_feature_spec){"two_bytes", NB_FEATURE_BYTES, -1};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'two_bytes'", "2 byte strings");
    s[1] = (nb_feature_spec){"name", NB_FEATURE_BYTES, 3};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'name'", "11 bytes");
    s[1] = (nb_feature_spec){NULL, NB_FEATURE_BYTES, 3};
    CHECK(nb_example_parse(fixture, fixture_size, 2, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "spec 1 has no name");
    CHECK(nb_example_parse(NULL, 4, 1, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "data is NULL");
    CHECK(nb_example_parse(fixture, fixture_size, 0, s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_example_parse");
    CHECK(nb_example_parse(fixture, fixture_size, 1, s, NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "out is NULL");
}

/* Every truncation of the fixture fails cleanly or (for a cut between whole
 * fields) parses; none crashes or leaks. */
static void test_truncations(void)
{
    nb_feature_spec s = {"label", NB_FEATURE_INT64, -1};
    nb_tensor *out[1];
    for (size_t n = 0; n < fixture_size; n++) {
        nb_status st = nb_example_parse(fixture, n, 1, &s, out);
        CHECK(st == NB_OK || st == NB_ERR_IO || st == NB_ERR_INVALID_ARGUMENT);
        CHECK((st == NB_OK) == (out[0] != NULL));
        nb_error_clear();
    }
}

static void test_malformed(void)
{
    nb_feature_spec s = {"x", NB_FEATURE_INT64, -1};
    nb_tensor *out[1];
    static const struct {
        const char *what;
        unsigned char bytes[16];
        size_t n;
    } bad[] = {
        {"an 11-byte varint", {0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, 12},
        {"a varint past 64 bits", {0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02}, 11},
        {"field number 0", {0x00, 0x01}, 2},
        {"wire type 6", {0x0E, 0x01}, 2},
        {"a length past the end", {0x0A, 0x05, 0x0A}, 3},
        {"a lone group end", {0x0C}, 1},
        {"an unclosed group", {0x0B, 0x08, 0x01}, 3},
        {"a truncated fixed64", {0x09, 1, 2, 3}, 4},
        {"a group closed by another field", {0x0B, 0x14}, 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECKF(nb_example_parse(bad[i].bytes, bad[i].n, 1, &s, out) == NB_ERR_IO && !out[0], "%s", bad[i].what);
        CHECK_ERROR(NB_ERR_IO, "nb_example_parse", "malformed");
    }
    /* Packed floats that are not whole: features {feature {key "x" value {float_list {value: 3 bytes}}}} */
    const unsigned char odd[] = {0x0A, 0x0E, 0x0A, 0x0C, 0x0A, 0x01, 'x', 0x12, 0x07, 0x12, 0x05, 0x0A, 0x03, 1, 2, 3};
    nb_feature_spec f = {"x", NB_FEATURE_FLOAT, -1};
    CHECK(nb_example_parse(odd, sizeof odd, 1, &f, out) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "multiple of 4");
    /* Deep groups are refused, not recursed into without end. */
    unsigned char deep[200];
    for (size_t i = 0; i < sizeof deep; i++)
        deep[i] = 0x0B;
    CHECK(nb_example_parse(deep, sizeof deep, 1, &s, out) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "malformed");
    /* Unknown fields of every wire type alone are fine: then "x" is missing. */
    const unsigned char unknown[] = {0x10, 0x01, 0x19, 1, 2, 3, 4, 5, 6, 7, 8, 0x22, 0x00, 0x2B, 0x2C, 0x35, 1, 2, 3, 4};
    CHECK(nb_example_parse(unknown, sizeof unknown, 1, &s, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'x' is missing");
}

/* Every dtype an Example holds, written and parsed back exactly (f64 through
 * float), and the refusals. */
static void test_write_round_trip(void)
{
    char path[] = "/tmp/nb_example_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    const uint8_t img[5] = {0, 7, 255, 0, 9};
    const int64_t lab[2] = {-3, (int64_t)1 << 62};
    const double w[3] = {0.5, -2.25, 1e30};
    const int32_t c[2] = {-1, 2147483647};
    nb_tensor *vals[5] = {nb_from_buffer(NB_U8, NB_SHAPE(5), img), nb_from_buffer(NB_I64, NB_SHAPE(2), lab),
                          nb_from_buffer(NB_F64, NB_SHAPE(3), w), nb_from_buffer(NB_I32, NB_SHAPE(1, 2), c),
                          nb_zeros(NB_F32, NB_SHAPE(0))};
    const char *names[5] = {"image", "label", "w", "c", "empty"};
    nb_tfrecord_writer *wr = nb_tfrecord_writer_open(path);
    CHECK(wr != NULL);
    CHECK_OK(nb_example_write(wr, 5, names, vals));
    CHECK_OK(nb_example_write(wr, 1, names + 1, vals + 1));
    CHECK(nb_example_write(wr, 1, names, (nb_tensor *const[]){nb_zeros(NB_F32, NB_SHAPE(2))}) == NB_OK);
    CHECK(nb_example_write(wr, 0, names, vals) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_example_write", "n must be");
    CHECK(nb_example_write(wr, 1, (const char *const[]){""}, vals) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_example_write", "no name");
    CHECK_OK(nb_tfrecord_writer_close(wr));

    nb_tfrecord_reader *rd = nb_tfrecord_reader_open(path);
    CHECK(rd != NULL);
    const void *data = NULL;
    size_t size = 0;
    CHECK_OK(nb_tfrecord_next(rd, &data, &size));
    const nb_feature_spec specs[5] = {{"image", NB_FEATURE_BYTES, 5}, {"label", NB_FEATURE_INT64, 2},
                                      {"w", NB_FEATURE_FLOAT, 3}, {"c", NB_FEATURE_INT64, 2},
                                      {"empty", NB_FEATURE_FLOAT, 0}};
    nb_tensor *out[5] = {NULL};
    CHECK_OK(nb_example_parse(data, size, 5, specs, out));
    if (out[0] && out[1] && out[2] && out[3] && out[4]) {
        for (int i = 0; i < 5; i++)
            CHECK(nb_tensor_get(out[0], i) == img[i]);
        CHECK(nb_tensor_get(out[1], 0) == -3 && nb_tensor_get(out[1], 1) == (double)((int64_t)1 << 62));
        for (int i = 0; i < 3; i++)
            CHECK(nb_tensor_get(out[2], i) == (double)(float)w[i]);
        CHECK(nb_tensor_get(out[3], 0) == -1 && nb_tensor_get(out[3], 1) == 2147483647);
        CHECK(nb_tensor_numel(out[4]) == 0);
    }
    CHECK_OK(nb_tfrecord_next(rd, &data, &size));
    nb_tensor *one = NULL;
    CHECK_OK(nb_example_parse(data, size, 1, specs + 1, &one));
    CHECK(one && nb_tensor_get(one, 1) == (double)((int64_t)1 << 62));
    CHECK_OK(nb_tfrecord_next(rd, &data, &size));
    CHECK(nb_tfrecord_next(rd, &data, &size) == NB_ERR_OUT_OF_RANGE); /* the refused writes left nothing */
    nb_tfrecord_reader_close(rd);
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s test/data/example.bin\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        fprintf(stderr, "test_example: cannot open %s\n", argv[1]);
        return 1;
    }
    fixture = malloc(4096);
    fixture_size = fread(fixture, 1, 4096, f);
    fclose(f);
    RUN(test_values);
    RUN(test_spec_errors);
    RUN(test_truncations);
    RUN(test_malformed);
    RUN(test_write_round_trip);
    free(fixture);
    return check_finish();
}
