/* Tests of safetensors checkpoints (include/nabla/checkpoint.h): a round trip of
 * every CPU dtype; training resumed from a checkpoint, in this process and in a
 * fresh one (this executable run again with --resume), bit-identical to
 * training on; corrupt and mismatched files refused with messages naming the
 * problem; a restore into variables that a read holds or not (the read keeps
 * its values), with Adam's slots and a mirrored variable; the manager keeping
 * the last K and finding the latest; and files read and written by Python's
 * safetensors package (argv[1] is safetensors_interop.py; skipped with a
 * reason where python3 cannot import safetensors and torch).
 *   test_checkpoint [safetensors_interop.py]
 *   test_checkpoint --resume CHECKPOINT OUT   (the fresh process's part) */
#include "check.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256]; /* a temp dir for this run's files */
static const char *g_self, *g_script;

static void path_in(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/%s", g_dir, name); }

/* ---- the round trip ------------------------------------------------------------- */

static void test_dtypes(void)
{
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_U8, NB_BOOL};
    enum { N = sizeof dts / sizeof *dts };
    nb_variable *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "dtypes/%s", nb_dtype_name(dts[i]));
        uint8_t raw[2 * 3 * 8];
        for (size_t k = 0; k < sizeof raw; k++)
            raw[k] = (uint8_t)(37 * k + 11 * (size_t)i);
        if (dts[i] == NB_BOOL)
            for (size_t k = 0; k < sizeof raw; k++)
                raw[k] &= 1;
        if (dts[i] == NB_F32 || dts[i] == NB_F64) { /* finite values: no NaN payloads */
            for (int k = 0; k < 6; k++) {
                if (dts[i] == NB_F32)
                    ((float *)raw)[k] = (float)(k * 1.25 - 3.0);
                else
                    ((double *)raw)[k] = k * 0.1 - 1e300 * (k == 5);
            }
        }
        src[i] = nb_variable_new(name, nb_from_buffer(dts[i], NB_SHAPE(2, 3), raw));
        dst[i] = nb_variable_new(name, nb_zeros(dts[i], NB_SHAPE(2, 3)));
    }
    nb_variable *scalar = nb_variable_new("dtypes/scalar", nb_scalar(NB_F64, 2.5));
    nb_variable *empty = nb_variable_new("dtypes/empty", nb_zeros(NB_F32, NB_SHAPE(0, 4)));
    nb_variable *all_src[N + 2], *all_dst[N + 2];
    for (int i = 0; i < N; i++)
        all_src[i] = src[i], all_dst[i] = dst[i];
    all_src[N] = all_dst[N] = scalar;
    all_src[N + 1] = all_dst[N + 1] = empty;
    char path[512];
    path_in(path, sizeof path, "dtypes.safetensors");
    CHECK_OK(nb_checkpoint_save(path, N + 2, all_src, NULL));
    /* The layout: a header length, a header padded to 8 bytes, no temp file left. */
    FILE *f = fopen(path, "rb");
    uint8_t len8[8] = {0};
    CHECK(f && fread(len8, 1, 8, f) == 8);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--)
        hl = hl << 8 | len8[k];
    CHECK(hl % 8 == 0 && hl > 0 && hl < 4096);
    char head[4096] = {0};
    CHECK(f && fread(head, 1, (size_t)hl, f) == hl);
    CHECK(strstr(head, "\"dtypes/f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[") != NULL);
    CHECK(strstr(head, "\"dtypes/scalar\":{\"dtype\":\"F64\",\"shape\":[]") != NULL);
    CHECK(strstr(head, "\"dtypes/bool\":{\"dtype\":\"BOOL\"") && strstr(head, "\"U8\"") && strstr(head, "\"I64\""));
    if (f)
        fclose(f);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);

    nb_variable_assign(scalar, nb_scalar(NB_F64, 0));
    CHECK_OK(nb_checkpoint_restore(path, N + 2, all_dst, NULL));
    for (int i = 0; i < N; i++)
        CHECKF(same_bits(nb_read(src[i]), nb_read(dst[i])), "%s", nb_dtype_name(dts[i]));
    CHECK(nb_tensor_item(nb_read(scalar)) == 2.5);
    CHECK(has_shape(nb_read(empty), NB_SHAPE(0, 4)));
    for (int i = 0; i < N; i++) {
        nb_variable_free(src[i]);
        nb_variable_free(dst[i]);
    }
    nb_variable_free(scalar);
    nb_variable_free(empty);
}

/* ---- resuming training ---------------------------------------------------------- */

enum { BATCH = 8, IN = 4, HID = 6 };

typedef struct model {
    nb_variable *w1, *b1, *w2;
    nb_optimizer *opt;
} model;

static model model_new(uint64_t seed)
{
    model m;
    nb_scope *s = nb_scope_begin();
    m.w1 = nb_variable_new("mlp/w1", nb_random_normal(NB_F32, NB_SHAPE(IN, HID), 0, 0.5, seed));
    m.b1 = nb_variable_new("mlp/b1", nb_full(NB_F32, NB_SHAPE(HID), seed ? 0.1 : 0));
    m.w2 = nb_variable_new("mlp/w2", nb_random_normal(NB_F32, NB_SHAPE(HID, 1), 0, 0.5, seed + 1));
    nb_scope_end(s);
    m.opt = nb_adam_new(0.01, 0.9, 0.999, 1e-7);
    return m;
}

static void model_free(model *m)
{
    nb_variable_free(m->w1);
    nb_variable_free(m->b1);
    nb_variable_free(m->w2);
    nb_optimizer_free(m->opt);
}

/* One step on batch number step (the data depend only on it). */
static nb_status train_step(model *m, int step)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = nb_random_normal(NB_F32, NB_SHAPE(BATCH, IN), 0, 1, 1000 + (uint64_t)step);
    nb_tensor *y = nb_random_normal(NB_F32, NB_SHAPE(BATCH, 1), 0, 1, 5000 + (uint64_t)step);
    nb_tape *tape = nb_tape_begin();
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, nb_read(m->w1)), nb_read(m->b1)));
    nb_tensor *loss = nb_mean_all(nb_square(nb_sub(nb_matmul(h, nb_read(m->w2)), y)));
    nb_tensor *g[3] = {0};
    nb_status st = nb_tape_gradient_vars(tape, loss, NB_VARS(m->w1, m->b1, m->w2), g);
    if (!st)
        st = nb_optimizer_apply(m->opt, NB_VARS(m->w1, m->b1, m->w2), g);
    nb_scope_end(s);
    return st;
}

/* The three variables' bytes, concatenated (caller frees). */
static uint8_t *model_bytes(model *m, size_t *n)
{
    nb_variable *v[3] = {m->w1, m->b1, m->w2};
    *n = (size_t)(IN * HID + HID + HID) * 4;
    uint8_t *b = malloc(*n), *p = b;
    for (int i = 0; i < 3; i++) {
        nb_scope *s = nb_scope_begin();
        nb_tensor *t = nb_read(v[i]);
        size_t k = (size_t)nb_tensor_numel(t) * 4;
        nb_tensor_read(t, p, k);
        p += k;
        nb_scope_end(s);
    }
    return b;
}

enum { STEPS_BEFORE = 7, STEPS_AFTER = 9 };

static void test_resume(void)
{
    char path[512], out[512], cmd[2048];
    path_in(path, sizeof path, "resume.safetensors");
    path_in(out, sizeof out, "resume.out");
    model a = model_new(3);
    for (int i = 0; i < STEPS_BEFORE; i++)
        CHECK_OK(train_step(&a, i));
    CHECK_OK(nb_checkpoint_save(path, NB_VARS(a.w1, a.b1, a.w2), a.opt));
    for (int i = STEPS_BEFORE; i < STEPS_BEFORE + STEPS_AFTER; i++)
        CHECK_OK(train_step(&a, i));
    size_t na;
    uint8_t *want = model_bytes(&a, &na);

    /* Fresh variables (other values) and a fresh optimizer, in this process. */
    model b = model_new(0);
    CHECK_OK(nb_checkpoint_restore(path, NB_VARS(b.w1, b.b1, b.w2), b.opt));
    CHECK(nb_optimizer_iterations(b.opt) == STEPS_BEFORE);
    nb_tensor *slot = nb_optimizer_get_slot(b.opt, b.w1, "adam_v");
    CHECK(slot && nb_tensor_get(slot, 0) > 0);
    for (int i = STEPS_BEFORE; i < STEPS_BEFORE + STEPS_AFTER; i++)
        CHECK_OK(train_step(&b, i));
    size_t nb;
    uint8_t *got = model_bytes(&b, &nb);
    CHECK(na == nb && memcmp(want, got, na) == 0);
    free(got);

    /* Without the optimizer's state the run differs: the test can tell. */
    model c = model_new(0);
    CHECK_OK(nb_checkpoint_restore(path, NB_VARS(c.w1, c.b1, c.w2), NULL));
    for (int i = STEPS_BEFORE; i < STEPS_BEFORE + STEPS_AFTER; i++)
        CHECK_OK(train_step(&c, i));
    got = model_bytes(&c, &nb);
    CHECK(memcmp(want, got, na) != 0);
    free(got);

    /* A fresh process: this executable, run again to restore and train on. */
    snprintf(cmd, sizeof cmd, "'%s' --resume '%s' '%s'", g_self, path, out);
    CHECK(system(cmd) == 0);
    FILE *f = fopen(out, "rb");
    got = malloc(na);
    CHECK(f && fread(got, 1, na, f) == na && fgetc(f) == EOF);
    CHECK(memcmp(want, got, na) == 0);
    if (f)
        fclose(f);
    free(got);
    free(want);
    model_free(&a);
    model_free(&b);
    model_free(&c);
}

/* The fresh process's part of test_resume. */
static int resume_main(const char *path, const char *out)
{
    model m = model_new(0);
    nb_status st = nb_checkpoint_restore(path, NB_VARS(m.w1, m.b1, m.w2), m.opt);
    for (int i = STEPS_BEFORE; i < STEPS_BEFORE + STEPS_AFTER && !st; i++)
        st = train_step(&m, i);
    if (st) {
        fprintf(stderr, "resume: %s\n", nb_error_message());
        model_free(&m);
        return 1;
    }
    size_t n;
    uint8_t *b = model_bytes(&m, &n);
    FILE *f = fopen(out, "wb");
    int rc = f && fwrite(b, 1, n, f) == n && fclose(f) == 0 ? 0 : 1;
    free(b);
    model_free(&m);
    return rc;
}

/* ---- restoring into variables, read or not -------------------------------------- */

/* t's bytes in a new buffer (the caller frees) and their count; NULL on failure. */
static uint8_t *bytes_of(const nb_tensor *t, size_t *n)
{
    *n = t ? (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t)) : 0;
    uint8_t *b = t ? malloc(*n ? *n : 1) : NULL;
    if (b && nb_tensor_read(t, b, *n) != NB_OK) {
        free(b);
        b = NULL;
    }
    return b;
}

/* Whether t holds exactly the n bytes want. */
static bool holds(const nb_tensor *t, const uint8_t *want, size_t n)
{
    size_t k;
    uint8_t *b = bytes_of(t, &k);
    bool same = b && want && k == n && memcmp(b, want, n) == 0;
    free(b);
    return same;
}

enum { BIG = 3000001 }; /* f32: 12 MB, read in several unequal pieces */

/* A restore writes the file's values into variables and their Adam slots
 * whether or not a read holds a variable's value; a tensor read before keeps
 * its values; with no read held the variable keeps its tensor (restored in
 * place); a mirrored variable gets the values in every copy. */
static void test_restore_into(void)
{
    char path[512];
    path_in(path, sizeof path, "into.safetensors");
    nb_scope *s = nb_scope_begin();
    nb_variable *w = nb_variable_new("into/w", nb_arange(NB_F32, 0, BIG, 1));
    nb_variable *b = nb_variable_new("into/b", nb_full(NB_F32, NB_SHAPE(5, 7), 0.5));
    nb_mirrored *ms = nb_mirrored_new(2, (const char *[]){"/cpu:0", "/cpu:1"});
    nb_variable *m = ms ? nb_mirrored_variable_new(ms, "into/m", nb_arange(NB_F32, 10, 40, 1)) : NULL;
    CHECK(m != NULL);
    if (!m) {
        nb_scope_end(s);
        nb_mirrored_free(ms);
        return;
    }
    nb_optimizer *opt = nb_adam_new(0.01, 0.9, 0.999, 1e-7);
    CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w, b),
                                (nb_tensor *[]){nb_full(NB_F32, NB_SHAPE(BIG), 0.25),
                                                nb_full(NB_F32, NB_SHAPE(5, 7), -1)}));
    size_t nw, nbb, nm, nv, nmir;
    uint8_t *want_w = bytes_of(nb_read(w), &nw), *want_b = bytes_of(nb_read(b), &nbb);
    uint8_t *want_m = bytes_of(nb_optimizer_get_slot(opt, w, "adam_m"), &nm);
    uint8_t *want_v = bytes_of(nb_optimizer_get_slot(opt, w, "adam_v"), &nv);
    uint8_t *want_mir = bytes_of(nb_read(m), &nmir);
    CHECK(want_w && want_b && want_m && want_v && want_mir);
    CHECK_OK(nb_checkpoint_save(path, NB_VARS(w, b, m), opt));
    nb_scope_end(s);

    for (int held_read = 1; held_read >= 0; held_read--) {
        s = nb_scope_begin();
        /* Other values everywhere: variables, both copies of m, slots, count. */
        CHECK_OK(nb_variable_assign(w, nb_full(NB_F32, NB_SHAPE(BIG), -3)));
        CHECK_OK(nb_variable_assign(b, nb_full(NB_F32, NB_SHAPE(5, 7), 9)));
        CHECK_OK(nb_variable_assign(m, nb_full(NB_F32, NB_SHAPE(30), 7)));
        CHECK_OK(nb_optimizer_apply(opt, NB_VARS(w, b),
                                    (nb_tensor *[]){nb_full(NB_F32, NB_SHAPE(BIG), -2),
                                                    nb_full(NB_F32, NB_SHAPE(5, 7), 3)}));
        CHECK(!holds(nb_optimizer_get_slot(opt, w, "adam_m"), want_m, nm));
        nb_tensor *before = NULL;
        if (held_read) {
            before = nb_read(w);
        } else {
            nb_scope *peek = nb_scope_begin();
            before = nb_read(w); /* its address only: the read ends here */
            nb_scope_end(peek);
        }
        size_t nh = 0;
        uint8_t *held_bytes = held_read ? bytes_of(before, &nh) : NULL;

        CHECK_OK(nb_checkpoint_restore(path, NB_VARS(w, b, m), opt));
        nb_tensor *after = nb_read(w);
        CHECKF(holds(after, want_w, nw), "held_read %d", held_read);
        CHECKF(holds(nb_read(b), want_b, nbb), "held_read %d", held_read);
        CHECKF(holds(nb_optimizer_get_slot(opt, w, "adam_m"), want_m, nm), "held_read %d", held_read);
        CHECKF(holds(nb_optimizer_get_slot(opt, w, "adam_v"), want_v, nv), "held_read %d", held_read);
        CHECK(nb_optimizer_iterations(opt) == 1);
        for (int r = 0; r < 2; r++)
            CHECKF(holds(nb_mirrored_variable_read(m, r), want_mir, nmir), "held_read %d, replica %d", held_read, r);
        if (held_read) {
            CHECK(after != before);
            CHECK(holds(before, held_bytes, nh) && !holds(before, want_w, nw));
        } else {
            CHECK(after == before);
        }
        free(held_bytes);
        nb_scope_end(s);
    }
    free(want_w);
    free(want_b);
    free(want_m);
    free(want_v);
    free(want_mir);
    nb_optimizer_free(opt);
    nb_variable_free(w);
    nb_variable_free(b);
    nb_variable_free(m);
    nb_mirrored_free(ms);
}

/* ---- refusals ------------------------------------------------------------------- */

/* Writes a safetensors file of json (padded) and data to path. */
static void write_st(const char *path, const char *json, const void *data, size_t n)
{
    size_t hl = strlen(json), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(json, 1, hl, f);
    for (size_t i = hl; i < padded; i++)
        fputc(' ', f);
    if (n)
        fwrite(data, 1, n, f);
    fclose(f);
}

static void write_bytes(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (n)
        fwrite(b, 1, n, f);
    fclose(f);
}

/* Restores v from a file of json and n data bytes; checks the error and message parts. */
#define REFUSED(json, data, n, code, ...)                                                     \
    do {                                                                                     \
        write_st(bad, json, data, n);                                                        \
        CHECK(nb_checkpoint_restore(bad, 1, &v, NULL) == (code));                            \
        CHECK_ERROR(code, "nb_checkpoint_restore", bad, __VA_ARGS__);                        \
    } while (0)

static void test_refusals(void)
{
    char good[512], bad[512];
    path_in(good, sizeof good, "good.safetensors");
    path_in(bad, sizeof bad, "bad.safetensors");
    float vals[6] = {1, 2, 3, 4, 5, 6};
    nb_variable *v = nb_variable_new("w", nb_from_buffer(NB_F32, NB_SHAPE(2, 3), vals));
    CHECK_OK(nb_checkpoint_save(good, 1, &v, NULL));
    FILE *f = fopen(good, "rb");
    uint8_t whole[1024];
    size_t size = f ? fread(whole, 1, sizeof whole, f) : 0;
    if (f)
        fclose(f);
    CHECK(size > 32 && size < sizeof whole);

    /* Truncated at several points. */
    size_t cuts[] = {0, 3, 8, 12, size - 24 - 1, size - 24, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(bad, whole, cuts[i]);
        CHECK(nb_checkpoint_restore(bad, 1, &v, NULL) == NB_ERR_IO);
        const char *msg = nb_error_message();
        CHECKF(strstr(msg, bad) && (strstr(msg, "too short") || strstr(msg, "past the end") ||
                                    strstr(msg, "truncated") || strstr(msg, "malformed")),
               "cut at %zu: %s", cuts[i], msg);
        nb_error_clear();
    }
    /* A header length past the file, and a huge one. */
    uint8_t copy[1024];
    memcpy(copy, whole, size);
    copy[7] = 0x40;
    write_bytes(bad, copy, size);
    CHECK(nb_checkpoint_restore(bad, 1, &v, NULL) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, bad, "header length", "past the end");
    memcpy(copy, whole, size);
    copy[0] = 0xff, copy[1] = 0xff;
    write_bytes(bad, copy, size);
    CHECK(nb_checkpoint_restore(bad, 1, &v, NULL) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, bad, "header length");
    /* The variable is untouched by all of that. */
    CHECK(nb_tensor_get(nb_read(v), 5) == 6);

    uint8_t data[48] = {0};
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
            "\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[16,40]}}",
            data, 40, NB_ERR_IO, "overlap");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", data, 25, NB_ERR_IO,
            "cover 24 of the 25 bytes");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[4,28]}}", data, 28, NB_ERR_IO, "'w'",
            "unused");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,48]}}", data, 24, NB_ERR_IO, "'w'",
            "past the 24 bytes");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", data, 20, NB_ERR_IO, "'w'",
            "need 24");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
            "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,48]}}",
            data, 48, NB_ERR_IO, "'w' appears twice");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", data, 24, NB_ERR_IO, "malformed");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],}}", data, 24, NB_ERR_IO,
            "malformed");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", data, 24, NB_ERR_IO,
            "non-negative integer");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3.0],\"data_offsets\":[0,24]}}", data, 24, NB_ERR_IO,
            "not an integer");
    REFUSED("{\"w\":{\"dtype\":\"Q7\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", data, 24, NB_ERR_IO,
            "unknown dtype 'Q7'");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", data, 0, NB_ERR_IO, "lacks data_offsets");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":1}}", data, 24, NB_ERR_IO,
            "unknown key 'x'");
    REFUSED("{\"__metadata__\":{\"a\":1},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", data,
            24, NB_ERR_IO, "not a string");
    REFUSED("[1,2]", data, 0, NB_ERR_IO, "malformed", "expected '{'");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}} x", data, 24, NB_ERR_IO,
            "after the header");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", data, 4,
            NB_ERR_IO, "more than 8");
    /* Well formed, but not what the variable is. */
    REFUSED("{\"w\":{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,48]}}", data, 48,
            NB_ERR_INVALID_ARGUMENT, "'w' is F64 [2, 3] in the file", "F32 [2, 3]");
    REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}}", data, 24,
            NB_ERR_INVALID_ARGUMENT, "'w' is F32 [3, 2]", "F32 [2, 3]");
    REFUSED("{}", data, 0, NB_ERR_INVALID_ARGUMENT, "no tensor 'w'");
    REFUSED("{\"v\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", data, 24,
            NB_ERR_INVALID_ARGUMENT, "no tensor 'w'");
    /* Optimizer state asked of a file without any, or of another kind. */
    nb_optimizer *adam = nb_adam_new(0.1, 0.9, 0.999, 1e-7), *sgd = nb_sgd_new(0.1);
    CHECK(nb_checkpoint_restore(good, 1, &v, adam) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, good, "no optimizer state");
    CHECK_OK(nb_checkpoint_save(good, 1, &v, sgd));
    CHECK(nb_checkpoint_restore(good, 1, &v, adam) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, good, "sgd optimizer state", "adam");
    CHECK(nb_checkpoint_restore("/nonexistent/x.safetensors", 1, &v, NULL) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "/nonexistent/x.safetensors", "cannot open");
    CHECK(nb_tensor_get(nb_read(v), 5) == 6);

    /* Saving: an unwritable place leaves nothing; a good file survives a failed save. */
    CHECK(nb_checkpoint_save("/nonexistent/x.safetensors", 1, &v, NULL) == NB_ERR_IO);
    CHECK_ERROR(NB_ERR_IO, "nb_checkpoint_save", "/nonexistent/x.safetensors");
    nb_variable *twin = nb_variable_new("w", nb_zeros(NB_F32, NB_SHAPE(1)));
    CHECK(nb_checkpoint_save(good, NB_VARS(v, twin), NULL) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, good, "two tensors are named 'w'");
    CHECK_OK(nb_checkpoint_restore(good, 1, &v, sgd)); /* still the sgd save */
    nb_variable_free(twin);
    nb_optimizer_free(adam);
    nb_optimizer_free(sgd);
    nb_variable_free(v);
}

/* Every registered variable, by default: save all, change them, restore all. */
static void test_registered(void)
{
    CHECK(nb_variables_list(NULL, 0) == 0);
    CHECK_OK(nb_variable_scope_push("reg", false));
    nb_variable *a = nb_get_variable("a", NB_SHAPE(3), NB_F32, (nb_initializer){NB_INIT_CONSTANT, 1.5, 0, 0});
    nb_variable *b = nb_get_variable("b", NB_SHAPE(2, 2), NB_I64, (nb_initializer){NB_INIT_CONSTANT, 7, 0, 0});
    CHECK_OK(nb_variable_scope_pop());
    char path[512];
    path_in(path, sizeof path, "registered.safetensors");
    CHECK_OK(nb_checkpoint_save(path, 0, NULL, NULL));
    nb_variable_assign(a, nb_zeros(NB_F32, NB_SHAPE(3)));
    nb_variable_assign(b, nb_zeros(NB_I64, NB_SHAPE(2, 2)));
    CHECK_OK(nb_checkpoint_restore(path, 0, NULL, NULL));
    CHECK(nb_tensor_get(nb_read(a), 2) == 1.5 && nb_tensor_get(nb_read(b), 3) == 7);
    CHECK(nb_variables_free_all() == 2);
}

/* A variable on the GPU saves and restores through the host. */
static void test_gpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        printf("test_gpu: skipped: no GPU\n");
        return;
    }
    char path[512];
    path_in(path, sizeof path, "gpu.safetensors");
    CHECK_OK(nb_device_push("/gpu:0"));
    nb_variable *a = nb_variable_new("gpu/a", nb_arange(NB_F32, 0, 12, 1));
    nb_variable *b = nb_variable_new("gpu/a", nb_zeros(NB_F32, NB_SHAPE(12)));
    CHECK_OK(nb_device_pop());
    nb_optimizer *opt = nb_sgd_momentum_new(0.1, 0.9, false);
    nb_tensor *g = nb_ones(NB_F32, NB_SHAPE(12));
    CHECK_OK(nb_optimizer_apply(opt, 1, &a, &g));
    CHECK_OK(nb_checkpoint_save(path, 1, &a, opt));
    nb_optimizer *fresh = nb_sgd_momentum_new(0.1, 0.9, false);
    CHECK_OK(nb_checkpoint_restore(path, 1, &b, fresh));
    CHECK(on_device(nb_read(b), "/gpu:0") && same_bits(nb_read(a), nb_read(b)));
    nb_tensor *m = nb_optimizer_get_slot(fresh, b, "momentum");
    CHECK(m && on_device(m, "/gpu:0") && nb_tensor_get(m, 3) == 1);
    nb_optimizer_free(opt);
    nb_optimizer_free(fresh);
    nb_variable_free(a);
    nb_variable_free(b);
}

/* ---- the manager ---------------------------------------------------------------- */

static void test_manager(void)
{
    char sub[512], p[600];
    path_in(sub, sizeof sub, "ckpts");
    CHECK(mkdir(sub, 0700) == 0);
    nb_variable *v = nb_variable_new("m/v", nb_zeros(NB_F32, NB_SHAPE(2)));
    nb_checkpoint_manager *m = nb_checkpoint_manager_new(sub, "model", 2);
    CHECK(m && nb_checkpoint_manager_latest(m) == NULL && nb_error() == NB_OK);
    int64_t steps[] = {1, 2, 30, 4, 100};
    for (int i = 0; i < 5; i++) {
        nb_variable_assign(v, nb_full(NB_F32, NB_SHAPE(2), (double)steps[i]));
        CHECK_OK(nb_checkpoint_manager_save(m, steps[i], 1, &v, NULL));
    }
    /* The two largest steps remain. */
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/model-%lld.safetensors", sub, (long long)steps[i]);
        CHECKF((access(p, F_OK) == 0) == (steps[i] == 30 || steps[i] == 100), "%s", p);
    }
    snprintf(p, sizeof p, "%s/model-100.safetensors", sub);
    CHECK(nb_checkpoint_manager_latest(m) && strcmp(nb_checkpoint_manager_latest(m), p) == 0);
    /* A new manager (as in a new process) finds it by listing the directory;
     * files of another prefix and stray names are ignored. */
    snprintf(p, sizeof p, "%s/other-999.safetensors", sub);
    write_bytes(p, (const uint8_t *)"x", 1);
    snprintf(p, sizeof p, "%s/model-999.safetensors.tmp.1", sub);
    write_bytes(p, (const uint8_t *)"x", 1);
    nb_checkpoint_manager *again = nb_checkpoint_manager_new(sub, "model", 0);
    const char *latest = nb_checkpoint_manager_latest(again);
    snprintf(p, sizeof p, "%s/model-100.safetensors", sub);
    CHECK(latest && strcmp(latest, p) == 0);
    nb_variable_assign(v, nb_zeros(NB_F32, NB_SHAPE(2)));
    CHECK_OK(nb_checkpoint_restore(latest, 1, &v, NULL));
    CHECK(nb_tensor_get(nb_read(v), 1) == 100);
    CHECK(nb_checkpoint_manager_new("/nonexistent", "model", 1) == NULL);
    CHECK_ERROR(NB_ERR_IO, "nb_checkpoint_manager_new", "/nonexistent");
    CHECK(nb_checkpoint_manager_new(sub, "a/b", 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "prefix");
    nb_checkpoint_manager_free(m);
    nb_checkpoint_manager_free(again);
    nb_variable_free(v);
}

/* ---- Python's safetensors ------------------------------------------------------- */

static void test_python(void)
{
    if (!g_script) {
        printf("test_python: skipped: no interop script given (argv[1])\n");
        return;
    }
    if (system("python3 -c 'import safetensors, torch' >/dev/null 2>&1") != 0) {
        printf("test_python: skipped: python3 cannot import safetensors and torch\n");
        return;
    }
    char ours[512], theirs[512], cmd[2048];
    path_in(ours, sizeof ours, "ours.safetensors");
    path_in(theirs, sizeof theirs, "theirs.safetensors");
    /* (a) Python reads what we write; the script checks the same values. */
    float f[6];
    double d[3] = {1e-300, -2.5, 3.0};
    int64_t l[4] = {-1, 0, 1, (int64_t)1 << 40};
    uint8_t u[5] = {0, 1, 127, 200, 255}, bl[3] = {1, 0, 1};
    int32_t i32[2] = {-7, 1 << 30};
    for (int k = 0; k < 6; k++)
        f[k] = 0.5f * (float)k - 1.0f;
    nb_variable *vs[6] = {
        nb_variable_new("layer/f32", nb_from_buffer(NB_F32, NB_SHAPE(2, 3), f)),
        nb_variable_new("layer/f64", nb_from_buffer(NB_F64, NB_SHAPE(3), d)),
        nb_variable_new("i64", nb_from_buffer(NB_I64, NB_SHAPE(2, 2), l)),
        nb_variable_new("u8", nb_from_buffer(NB_U8, NB_SHAPE(5), u)),
        nb_variable_new("bool", nb_from_buffer(NB_BOOL, NB_SHAPE(3), bl)),
        nb_variable_new("i32", nb_from_buffer(NB_I32, NB_SHAPE(1, 2, 1), i32)),
    };
    CHECK_OK(nb_checkpoint_save(ours, 6, vs, NULL));
    snprintf(cmd, sizeof cmd, "python3 '%s' check '%s'", g_script, ours);
    CHECK(system(cmd) == 0);
    /* (b) We read what Python writes (with F16 and BF16 tensors we skip). */
    snprintf(cmd, sizeof cmd, "python3 '%s' write '%s'", g_script, theirs);
    CHECK(system(cmd) == 0);
    nb_variable *a = nb_variable_new("a", nb_zeros(NB_F32, NB_SHAPE(2, 3)));
    nb_variable *b = nb_variable_new("nested/b", nb_zeros(NB_I64, NB_SHAPE(4)));
    nb_variable *c = nb_variable_new("c", nb_zeros(NB_F64, NB_SCALAR));
    nb_variable *e = nb_variable_new("e", nb_zeros(NB_U8, NB_SHAPE(0)));
    CHECK_OK(nb_checkpoint_restore(theirs, NB_VARS(a, b, c, e), NULL));
    for (int k = 0; k < 6; k++)
        CHECK(nb_tensor_get(nb_read(a), k) == 0.25 * k - 1);
    CHECK(nb_tensor_get(nb_read(b), 0) == -3 && nb_tensor_get(nb_read(b), 3) == (double)((int64_t)1 << 50));
    CHECK(nb_tensor_item(nb_read(c)) == 0.125);
    printf("test_python: Python's safetensors read our file and wrote one we read\n");
    for (int k = 0; k < 6; k++)
        nb_variable_free(vs[k]);
    nb_variable_free(a);
    nb_variable_free(b);
    nb_variable_free(c);
    nb_variable_free(e);
}

static void remove_dir(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--resume") == 0)
        return resume_main(argv[2], argv[3]);
    g_self = argv[0];
    g_script = argc > 1 ? argv[1] : NULL;
    /* Two CPU devices, for a mirrored variable (before any device is used). */
    if (nb_set_logical_cpu_devices(2) != NB_OK) {
        fprintf(stderr, "nb_set_logical_cpu_devices: %s\n", nb_error_message());
        return 1;
    }
    if (!check_scratch_dir(g_dir, sizeof g_dir, "nb_ckpt"))
        return 1;
    RUN(test_dtypes);
    RUN(test_resume);
    RUN(test_restore_into);
    RUN(test_refusals);
    RUN(test_registered);
    RUN(test_gpu);
    RUN(test_manager);
    RUN(test_python);
    remove_dir();
    return check_finish();
}
