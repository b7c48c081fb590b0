/* libFuzzer target for tf.train.Example parsing. Each input is taken as a
 * serialized Example and parsed for features of every kind, once with any count
 * and once one at a time. A failure must be NB_ERR_IO (malformed bytes) or
 * NB_ERR_INVALID_ARGUMENT (a missing or mismatched feature) with a message
 * naming nb_example_parse and every output NULL; a success must give 1-d CPU
 * tensors of the spec's dtype, and parsing a feature alone must give the same
 * bytes. Any crash, sanitizer report or leaked tensor is a finding. */
#include <nabla/nabla.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_example"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("NB_NUM_THREADS", "1", 0);
    return 0;
}

static const nb_feature_spec specs[] = {
    {"label", NB_FEATURE_INT64, -1}, {"x", NB_FEATURE_FLOAT, -1}, {"name", NB_FEATURE_BYTES, -1},
    {"floats", NB_FEATURE_FLOAT, -1}, {"ints", NB_FEATURE_INT64, -1},
};
enum { N = sizeof specs / sizeof *specs };

static const nb_dtype dtypes[] = {NB_F32, NB_I64, NB_U8};

static uint8_t *bytes_of(const nb_tensor *t, size_t *n)
{
    *n = (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    uint8_t *b = malloc(*n ? *n : 1);
    REQUIRE(b && nb_tensor_read(t, b, *n) == NB_OK, "reading back %zu bytes", *n);
    return b;
}

static void check_result(nb_status st, int n, const nb_feature_spec *sp, nb_tensor **out)
{
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", nb_error_message());
        nb_status code = nb_error_clear();
        REQUIRE(code == st, "returned %s, recorded %s", nb_status_name(st), nb_status_name(code));
        REQUIRE(st == NB_ERR_IO || st == NB_ERR_INVALID_ARGUMENT, "failed with %s: %s", nb_status_name(st), msg);
        REQUIRE(strncmp(msg, "nb_example_parse: ", 18) == 0, "message '%s'", msg);
        for (int i = 0; i < n; i++)
            REQUIRE(out[i] == NULL, "output %d set after a failure", i);
        return;
    }
    REQUIRE(nb_error() == NB_OK, "NB_OK with an error pending: %s", nb_error_message());
    for (int i = 0; i < n; i++) {
        REQUIRE(out[i] && nb_tensor_ndim(out[i]) == 1 && nb_tensor_dtype(out[i]) == dtypes[sp[i].kind],
                "feature %s: a bad tensor", sp[i].name);
        REQUIRE(strcmp(nb_tensor_device(out[i]), "/cpu:0") == 0, "on %s", nb_tensor_device(out[i]));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t live = nb_live_tensors();
    nb_scope *scope = nb_scope_begin();
    REQUIRE(scope != NULL, "no scope");
    nb_tensor *all[N], *one[1];
    nb_status st = nb_example_parse(size ? data : NULL, size, N, specs, all);
    check_result(st, N, specs, all);
    for (int i = 0; i < N; i++) {
        nb_status s1 = nb_example_parse(size ? data : NULL, size, 1, &specs[i], one);
        check_result(s1, 1, &specs[i], one);
        if (st == NB_OK) { /* each feature parses alone too, to the same bytes */
            REQUIRE(s1 == NB_OK, "feature %s fails alone", specs[i].name);
            size_t na, nb;
            uint8_t *a = bytes_of(all[i], &na), *b = bytes_of(one[0], &nb);
            REQUIRE(na == nb && memcmp(a, b, na) == 0, "feature %s differs alone", specs[i].name);
            free(a);
            free(b);
        }
    }
    nb_scope_end(scope);
    REQUIRE_CLEAN(live);
    return 0;
}
