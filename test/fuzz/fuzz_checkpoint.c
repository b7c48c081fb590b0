/* libFuzzer target for checkpoint restoring. Each input is written to a file
 * and restored twice: into a variable "w" (f32 [2, 3]) alone, and into "w" and
 * "b" (i64 [2]) with an Adam optimizer. A failure must be NB_ERR_IO or
 * NB_ERR_INVALID_ARGUMENT (or NB_ERR_OUT_OF_MEMORY) with a message naming
 * nb_checkpoint_restore and the file, and must leave the variables as they
 * were. A success is saved again and restored into fresh variables, which
 * must then hold the same bytes. Any crash, sanitizer report, leaked tensor
 * or disagreement is a finding. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nabla/nabla.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_checkpoint"
#include "fuzz_util.h"

static char path[512], again[520]; /* the files restored: one pair per process */

static void remove_files(void)
{
    unlink(path);
    unlink(again);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("NB_NUM_THREADS", "1", 0);
    fuzz_temp_file(path, sizeof path, "ckpt");
    snprintf(again, sizeof again, "%s.again", path);
    atexit(remove_files);
    return 0;
}

/* Whether two variables hold the same bytes. */
static bool same(nb_variable *a, nb_variable *b)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = nb_read(a), *y = nb_read(b);
    size_t n = (size_t)nb_tensor_numel(x) * nb_dtype_size(nb_tensor_dtype(x));
    uint8_t *p = malloc(n + 1), *q = malloc(n + 1);
    REQUIRE(p && q, "out of memory");
    bool eq = nb_tensor_read(x, p, n) == NB_OK && nb_tensor_read(y, q, n) == NB_OK && memcmp(p, q, n) == 0;
    free(p);
    free(q);
    nb_scope_end(s);
    return eq;
}

static void expect_refusal(nb_status st)
{
    const char *msg = nb_error_message();
    REQUIRE(st == NB_ERR_IO || st == NB_ERR_INVALID_ARGUMENT || st == NB_ERR_OUT_OF_MEMORY, "failed with %s: %s",
            nb_status_name(st), msg);
    REQUIRE(nb_error() == st, "returned %s, recorded %s", nb_status_name(st), nb_status_name(nb_error()));
    REQUIRE(strncmp(msg, "nb_checkpoint_restore: ", 23) == 0 && strstr(msg, path), "message '%s'", msg);
    nb_error_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t live = nb_live_tensors();
    FILE *f = fopen(path, "wb");
    REQUIRE(f && (size == 0 || fwrite(data, 1, size, f) == size) && fclose(f) == 0, "cannot write %s", path);

    float w0[6] = {9, 9, 9, 9, 9, 9};
    int64_t b0[2] = {42, 43};
    nb_scope *s = nb_scope_begin();
    nb_variable *w = nb_variable_new("w", nb_from_buffer(NB_F32, NB_SHAPE(2, 3), w0));
    nb_variable *b = nb_variable_new("b", nb_from_buffer(NB_I64, NB_SHAPE(2), b0));
    nb_variable *w_was = nb_variable_new("w_was", nb_from_buffer(NB_F32, NB_SHAPE(2, 3), w0));
    nb_variable *b_was = nb_variable_new("b_was", nb_from_buffer(NB_I64, NB_SHAPE(2), b0));
    nb_scope_end(s);
    REQUIRE(w && b && w_was && b_was, "cannot make variables: %s", nb_error_message());
    nb_optimizer *adam = nb_adam_new(0.01, 0.9, 0.999, 1e-7);

    nb_status st = nb_checkpoint_restore(path, 1, &w, NULL);
    if (st) {
        expect_refusal(st);
        REQUIRE(same(w, w_was), "a refused restore changed 'w'");
    }
    nb_variable *both[2] = {w, b};
    st = nb_checkpoint_restore(path, 2, both, adam);
    if (st) {
        expect_refusal(st);
    } else {
        /* Save what was restored and read it back into fresh variables. */
        REQUIRE(nb_checkpoint_save(again, 2, both, adam) == NB_OK, "saving again: %s", nb_error_message());
        s = nb_scope_begin();
        nb_variable *w2 = nb_variable_new("w", nb_zeros(NB_F32, NB_SHAPE(2, 3)));
        nb_variable *b2 = nb_variable_new("b", nb_zeros(NB_I64, NB_SHAPE(2)));
        nb_scope_end(s);
        nb_optimizer *adam2 = nb_adam_new(0.01, 0.9, 0.999, 1e-7);
        nb_variable *both2[2] = {w2, b2};
        REQUIRE(nb_checkpoint_restore(again, 2, both2, adam2) == NB_OK, "restoring our own save: %s",
                nb_error_message());
        REQUIRE(same(w, w2) && same(b, b2), "the second round trip changed a value");
        REQUIRE(nb_optimizer_iterations(adam2) == nb_optimizer_iterations(adam), "iterations differ");
        nb_optimizer_free(adam2);
        nb_variable_free(w2);
        nb_variable_free(b2);
        unlink(again);
    }
    nb_optimizer_free(adam);
    nb_variable_free(w);
    nb_variable_free(b);
    nb_variable_free(w_was);
    nb_variable_free(b_was);
    REQUIRE_CLEAN(live);
    return 0;
}
