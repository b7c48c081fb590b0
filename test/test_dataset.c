/* Datasets: sources, shuffle, repeat, batch, map, prefetch, their errors, and a
 * batch fed to a mirrored strategy. */
#include "test/check.h"

#include <unistd.h>

/* Reads every element's first component of a dataset of scalars (or the first
 * value of each) into vals (at most cap); returns how many, -1 on an error. */
static int64_t drain(nb_dataset *ds, double *vals, int64_t cap)
{
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    if (!it)
        return -1;
    nb_tensor *out[NB_DATASET_MAX_COMPONENTS];
    int64_t k = 0;
    nb_status st;
    while (k < cap) {
        nb_scope *s = nb_scope_begin();
        st = nb_dataset_next(it, out);
        if (st == NB_OK)
            vals[k++] = nb_tensor_get(out[0], 0);
        nb_scope_end(s);
        if (st)
            break;
    }
    nb_dataset_iterator_free(it);
    return k;
}

static nb_dataset *range_ds(int64_t n)
{
    nb_tensor *t = nb_arange(NB_F64, 0, (double)n, 1);
    return nb_dataset_from_tensors(1, &t);
}

static void test_from_tensors(void)
{
    nb_tensor *x = nb_reshape(nb_arange(NB_F32, 0, 12, 1), NB_SHAPE(4, 3));
    nb_tensor *y = nb_arange(NB_I64, 10, 14, 1);
    nb_tensor *ts[2] = {x, y};
    nb_dataset *ds = nb_dataset_from_tensors(2, ts);
    CHECK(nb_dataset_components(ds) == 2);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[2];
    for (int i = 0; i < 4; i++) {
        CHECK_OK(nb_dataset_next(it, out));
        CHECK(has_shape(out[0], NB_SHAPE(3)) && has_shape(out[1], NB_SCALAR));
        CHECK(nb_tensor_dtype(out[0]) == NB_F32 && nb_tensor_dtype(out[1]) == NB_I64);
        CHECK(nb_tensor_get(out[0], 2) == 3 * i + 2 && nb_tensor_item(out[1]) == 10 + i);
    }
    CHECK(nb_dataset_next(it, out) == NB_ERR_OUT_OF_RANGE && out[0] == NULL && out[1] == NULL);
    CHECK(nb_error() == NB_OK); /* the end is not an error */
    CHECK(nb_dataset_next(it, out) == NB_ERR_OUT_OF_RANGE);
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
}

/* Shards: index, index + count, ...; every shard together is the whole, each
 * element once; a batch of a shard; bad arguments. */
static void test_shard(void)
{
    for (int count = 1; count <= 4; count++) {
        int seen[11] = {0};
        for (int index = 0; index < count; index++) {
            nb_dataset *ds = nb_dataset_shard(range_ds(11), count, index);
            nb_dataset_iterator *it = nb_dataset_iterate(ds);
            nb_tensor *out[1];
            int k = 0;
            while (nb_dataset_next(it, out) == NB_OK) {
                int v = (int)nb_tensor_item(out[0]);
                CHECKF(v == index + k * count, "shard %d of %d: element %d is %d", index, count, k, v);
                if (v >= 0 && v < 11)
                    seen[v]++;
                k++;
            }
            CHECK(nb_error() == NB_OK);
            nb_dataset_iterator_free(it);
            nb_dataset_free(ds);
        }
        for (int v = 0; v < 11; v++)
            CHECKF(seen[v] == 1, "%d shards: element %d seen %d times", count, v, seen[v]);
    }
    /* a shard batched: rows 1, 4, 7 then 10 */
    nb_dataset *ds = nb_dataset_batch(nb_dataset_shard(range_ds(11), 3, 1), 3, false);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[1];
    CHECK_OK(nb_dataset_next(it, out));
    CHECK(has_shape(out[0], NB_SHAPE(3)) && nb_tensor_get(out[0], 0) == 1 && nb_tensor_get(out[0], 2) == 7);
    CHECK_OK(nb_dataset_next(it, out));
    CHECK(has_shape(out[0], NB_SHAPE(1)) && nb_tensor_get(out[0], 0) == 10);
    CHECK(nb_dataset_next(it, out) == NB_ERR_OUT_OF_RANGE);
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
    CHECK(nb_dataset_shard(range_ds(5), 0, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_shard", "index 0 of 0");
    CHECK(nb_dataset_shard(range_ds(5), 2, 2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_shard", "index 2 of 2");
    CHECK(nb_dataset_shard(NULL, 2, 0) == NULL);
}

/* The dataset keeps its tensors: they outlive the scope that made them, and the
 * elements outlive the iterator and the dataset. */
static void test_ownership(void)
{
    nb_dataset *ds;
    nb_scope *s = nb_scope_begin();
    ds = range_ds(3);
    nb_scope_end(s);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[1];
    CHECK_OK(nb_dataset_next(it, out));
    CHECK_OK(nb_dataset_next(it, out));
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
    CHECK(nb_tensor_item(out[0]) == 1);
}

static void test_batch(void)
{
    nb_tensor *x = nb_reshape(nb_arange(NB_F32, 0, 20, 1), NB_SHAPE(10, 2));
    nb_tensor *y = nb_arange(NB_I64, 0, 10, 1);
    nb_tensor *ts[2] = {x, y};
    for (int drop = 0; drop <= 1; drop++) {
        nb_dataset *ds = nb_dataset_batch(nb_dataset_from_tensors(2, ts), 4, drop);
        nb_dataset_iterator *it = nb_dataset_iterate(ds);
        nb_tensor *out[2];
        int64_t sizes[3] = {0}, k = 0;
        nb_status st;
        while ((st = nb_dataset_next(it, out)) == NB_OK && k < 3) {
            CHECK(nb_tensor_dim(out[0], 1) == 2 && nb_tensor_ndim(out[1]) == 1);
            CHECK(nb_tensor_get(out[0], 1) == 8 * k + 1 && nb_tensor_get(out[1], 0) == 4 * k);
            sizes[k++] = nb_tensor_dim(out[0], 0);
        }
        CHECK(st == NB_ERR_OUT_OF_RANGE);
        CHECKF(k == (drop ? 2 : 3) && sizes[0] == 4 && sizes[1] == 4 && sizes[2] == (drop ? 0 : 2),
               "drop %d: %lld batches of %lld, %lld, %lld", drop, (long long)k, (long long)sizes[0],
               (long long)sizes[1], (long long)sizes[2]);
        nb_dataset_iterator_free(it);
        nb_dataset_free(ds);
    }
}

/* Elements that are not rows of one tensor (here mapped) are stacked. */
static nb_status times_ten(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    out[0] = nb_mul_scalar(in[0], 10);
    out[1] = nb_add_scalar(in[0], 0.5);
    return NB_OK;
}

static void test_map(void)
{
    nb_dataset *ds = nb_dataset_map(range_ds(5), 2, times_ten, NULL);
    CHECK(nb_dataset_components(ds) == 2);
    double v[8];
    CHECK(drain(ds, v, 8) == 5);
    for (int i = 0; i < 5; i++)
        CHECK(v[i] == 10 * i);
    nb_dataset *b = nb_dataset_batch(ds, 2, false);
    nb_dataset_iterator *it = nb_dataset_iterate(b);
    nb_tensor *out[2];
    CHECK_OK(nb_dataset_next(it, out));
    CHECK_OK(nb_dataset_next(it, out));
    CHECK(has_shape(out[0], NB_SHAPE(2)) && nb_tensor_get(out[0], 1) == 30 && nb_tensor_get(out[1], 0) == 2.5);
    nb_dataset_iterator_free(it);
    nb_dataset_free(b);
}

static void test_repeat(void)
{
    double v[40];
    nb_dataset *ds = nb_dataset_repeat(range_ds(3), 2);
    CHECK(drain(ds, v, 40) == 6);
    for (int i = 0; i < 6; i++)
        CHECK(v[i] == i % 3);
    nb_dataset_free(ds);
    ds = nb_dataset_repeat(range_ds(3), -1); /* forever: a bounded read */
    CHECK(drain(ds, v, 40) == 40 && v[39] == 39 % 3);
    nb_dataset_free(ds);
    ds = nb_dataset_repeat(range_ds(3), 0);
    CHECK(drain(ds, v, 40) == 0);
    nb_dataset_free(ds);
    /* Batches across the epochs' border, as TensorFlow's repeat().batch(). */
    ds = nb_dataset_batch(nb_dataset_repeat(range_ds(3), 3), 4, false);
    CHECK(drain(ds, v, 40) == 3 && v[0] == 0 && v[1] == 1 && v[2] == 2);
    nb_dataset_free(ds);
    /* An empty dataset repeated forever ends. */
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0, 3));
    ds = nb_dataset_repeat(nb_dataset_from_tensors(1, &e), -1);
    CHECK(drain(ds, v, 40) == 0);
    nb_dataset_free(ds);
}

/* Whether v[0..n) holds each of 0..n-1 once. */
static bool is_permutation(const double *v, int n)
{
    int seen[256] = {0};
    for (int i = 0; i < n; i++) {
        int k = (int)v[i];
        if (k < 0 || k >= n || v[i] != k || seen[k]++)
            return false;
    }
    return true;
}

static void test_shuffle(void)
{
    enum { N = 100 };
    for (int64_t buf = 1; buf <= 1000; buf *= 10) {
        double a[2 * N], b[2 * N];
        nb_dataset *da = nb_dataset_repeat(nb_dataset_shuffle(range_ds(N), buf, 42), 2);
        nb_dataset *db = nb_dataset_repeat(nb_dataset_shuffle(range_ds(N), buf, 42), 2);
        CHECK(drain(da, a, 2 * N) == 2 * N && drain(db, b, 2 * N) == 2 * N);
        CHECKF(memcmp(a, b, sizeof a) == 0, "buffer %lld: one seed, two orders", (long long)buf);
        CHECKF(is_permutation(a, N) && is_permutation(a + N, N), "buffer %lld: not every element once", (long long)buf);
        if (buf == 1) {
            for (int i = 0; i < N; i++) /* a buffer of one keeps the order */
                CHECK(a[i] == i);
        } else {
            CHECKF(memcmp(a, a + N, sizeof a / 2) != 0, "buffer %lld: both epochs in one order", (long long)buf);
            bool moved = false;
            for (int i = 0; i < N; i++)
                moved |= a[i] != i;
            CHECK(moved);
        }
        /* A second pass over one dataset is a new epoch too. */
        CHECK(drain(da, b, 2 * N) == 2 * N && (buf == 1 || memcmp(a, b, sizeof a) != 0));
        nb_dataset_free(da);
        nb_dataset_free(db);
        nb_dataset *dc = nb_dataset_shuffle(range_ds(N), buf, 43);
        CHECK(drain(dc, b, N) == N && (buf == 1 || memcmp(a, b, sizeof a / 2) != 0));
        nb_dataset_free(dc);
    }
}

/* A generator of the squares 0, 1, 4, ... below its limit. */
static nb_status squares(void *user, int64_t index, int n, nb_tensor **out)
{
    (void)n;
    if (index >= *(int64_t *)user)
        return NB_ERR_OUT_OF_RANGE;
    out[0] = nb_scalar(NB_F32, (double)(index * index));
    nb_zeros(NB_F32, NB_SHAPE(3)); /* a temporary: released by the dataset */
    return NB_OK;
}

static nb_status failing(void *user, int64_t index, int n, nb_tensor **out)
{
    (void)user, (void)n;
    if (index == 3)
        return nb_reshape(nb_zeros(NB_F32, NB_SHAPE(2)), NB_SHAPE(3)) ? NB_OK : nb_error();
    out[0] = nb_scalar(NB_F32, (double)index);
    return NB_OK;
}

static void test_generator(void)
{
    int64_t limit = 6;
    nb_dataset *ds = nb_dataset_from_generator(1, squares, &limit);
    double v[10];
    for (int pass = 0; pass < 2; pass++) {
        CHECK(drain(ds, v, 10) == 6);
        CHECK(v[5] == 25 && v[2] == 4);
    }
    /* An error pending before the call stays the pending one; the generator
     * does not take it for its own. */
    nb_reshape(nb_zeros(NB_F32, NB_SHAPE(2)), NB_SHAPE(5));
    nb_dataset_iterator *gi = nb_dataset_iterate(ds);
    nb_tensor *one[1];
    CHECK(nb_dataset_next(gi, one) == NB_OK && nb_tensor_item(one[0]) == 0);
    CHECK_ERROR(NB_ERR_SHAPE, "[5]");
    nb_dataset_iterator_free(gi);
    nb_dataset_free(ds);
    ds = nb_dataset_from_generator(1, failing, NULL);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[1];
    for (int i = 0; i < 3; i++)
        CHECK_OK(nb_dataset_next(it, out));
    CHECK(nb_dataset_next(it, out) == NB_ERR_SHAPE && out[0] == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape");
    CHECK(nb_dataset_next(it, out) == NB_ERR_SHAPE); /* stays failed */
    CHECK_ERROR(NB_ERR_SHAPE, "nb_dataset_next", "failed earlier");
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
}

static nb_dataset *pipeline(const char *prefetch_device)
{
    nb_tensor *x = nb_reshape(nb_arange(NB_F32, 0, 300, 1), NB_SHAPE(100, 3));
    nb_tensor *y = nb_arange(NB_I64, 0, 100, 1);
    nb_tensor *ts[2] = {x, y};
    nb_dataset *ds = nb_dataset_batch(nb_dataset_repeat(nb_dataset_shuffle(nb_dataset_from_tensors(2, ts), 30, 7), 3),
                                      16, false);
    return prefetch_device ? nb_dataset_prefetch(ds, 3, prefetch_device) : ds;
}

static void test_prefetch(void)
{
    nb_dataset *plain = pipeline(NULL), *ahead = pipeline("/cpu:0");
    nb_dataset_iterator *a = nb_dataset_iterate(plain), *b = nb_dataset_iterate(ahead);
    nb_tensor *oa[2], *ob[2];
    int batches = 0;
    nb_status sa, sb;
    for (;;) {
        nb_scope *s = nb_scope_begin();
        sa = nb_dataset_next(a, oa);
        sb = nb_dataset_next(b, ob);
        bool same = sa == sb && (sa || (same_bits(oa[0], ob[0]) && same_bits(oa[1], ob[1])));
        CHECKF(same, "batch %d differs", batches);
        if (sa == NB_OK && on_device(ob[0], "/cpu:0"))
            batches++;
        nb_scope_end(s);
        if (sa || !same)
            break;
    }
    CHECK(sa == NB_ERR_OUT_OF_RANGE && batches == 19);
    nb_dataset_iterator_free(a);
    nb_dataset_iterator_free(b);
    /* Freed early, with batches waiting and the thread blocked on a full queue. */
    b = nb_dataset_iterate(ahead);
    CHECK_OK(nb_dataset_next(b, ob));
    nb_dataset_iterator_free(b);
    nb_dataset_free(plain);
    nb_dataset_free(ahead);
    /* An error on the thread reaches the consumer after the elements before it. */
    nb_dataset *ds = nb_dataset_prefetch(nb_dataset_from_generator(1, failing, NULL), 2, NULL);
    b = nb_dataset_iterate(ds);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(nb_dataset_next(b, ob));
        CHECK(nb_tensor_item(ob[0]) == i);
    }
    CHECK(nb_dataset_next(b, ob) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape");
    nb_dataset_iterator_free(b);
    nb_dataset_free(ds);
}

/* Element i has i + 1 values. */
static nb_status ragged(void *user, int64_t index, int n, nb_tensor **out)
{
    (void)user, (void)n;
    out[0] = nb_zeros(NB_F32, NB_SHAPE(index + 1));
    return NB_OK;
}

static void test_errors(void)
{
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(4, 2)), *b = nb_zeros(NB_F32, NB_SHAPE(5)), *s = nb_scalar(NB_F32, 1);
    nb_tensor *ab[2] = {a, b}, *an[2] = {a, NULL};
    CHECK(nb_dataset_from_tensors(2, ab) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors", "5 rows", "4");
    CHECK(nb_dataset_from_tensors(2, an) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors", "tensor 1 is NULL");
    CHECK(nb_dataset_from_tensors(1, &s) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors", "0-d");
    CHECK(nb_dataset_from_tensors(0, ab) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors", "0 tensors");
    CHECK(nb_dataset_from_tensors(1, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors");
    CHECK(nb_dataset_batch(nb_dataset_from_tensors(1, &a), 0, false) == NULL); /* the input is freed */
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_batch", "batch_size 0");
    CHECK(nb_dataset_shuffle(nb_dataset_from_tensors(1, &a), -2, 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_shuffle", "-2");
    CHECK(nb_dataset_map(nb_dataset_from_tensors(1, &a), 1, NULL, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_map");
    CHECK(nb_dataset_prefetch(nb_dataset_from_tensors(1, &a), 0, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_prefetch");
    CHECK(nb_dataset_from_generator(1, NULL, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_generator");
    /* NULL flows through a chain without a second error. */
    CHECK(nb_dataset_batch(nb_dataset_shuffle(nb_dataset_from_tensors(2, ab), 4, 1), 2, false) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_from_tensors");
    CHECK(nb_dataset_iterate(NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_iterate");
    nb_tensor *out[1];
    CHECK(nb_dataset_next(NULL, out) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_next");
    CHECK(nb_dataset_from_idx("/nonexistent/file-idx1-ubyte") == NULL);
    CHECK_ERROR(NB_ERR_IO, "/nonexistent/file-idx1-ubyte");
    nb_dataset_free(NULL);
    nb_dataset_iterator_free(NULL);
    CHECK(nb_dataset_map(nb_dataset_from_tensors(1, &a), 0, times_ten, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_map", "0 outputs");
    /* Elements of two shapes cannot be stacked. */
    nb_dataset *ds = nb_dataset_batch(nb_dataset_from_generator(1, ragged, NULL), 2, false);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    CHECK(nb_dataset_next(it, out) == NB_ERR_SHAPE && out[0] == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "stack: input 1");
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
}

/* An IDX pair, written here, read back as a dataset. */
static void test_idx(void)
{
    const unsigned char images[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 2, 1, 2, 3, 4, 5, 6};
    const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9};
    const unsigned char labels2[] = {0, 0, 8, 1, 0, 0, 0, 2, 7, 8};
    char pi[64], pl[64], pl2[64];
    snprintf(pi, sizeof pi, "/tmp/nb_test_dataset_%d_i", (int)getpid());
    snprintf(pl, sizeof pl, "/tmp/nb_test_dataset_%d_l", (int)getpid());
    snprintf(pl2, sizeof pl2, "/tmp/nb_test_dataset_%d_l2", (int)getpid());
    FILE *f = fopen(pi, "wb");
    fwrite(images, 1, sizeof images, f);
    fclose(f);
    f = fopen(pl, "wb");
    fwrite(labels, 1, sizeof labels, f);
    fclose(f);
    f = fopen(pl2, "wb");
    fwrite(labels2, 1, sizeof labels2, f);
    fclose(f);
    nb_dataset *ds = nb_dataset_from_idx_pair(pi, pl);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[2];
    CHECK_OK(nb_dataset_next(it, out));
    CHECK_OK(nb_dataset_next(it, out));
    CHECK(has_shape(out[0], NB_SHAPE(1, 2)) && nb_tensor_get(out[0], 1) == 4 && nb_tensor_item(out[1]) == 8);
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
    ds = nb_dataset_from_idx(pl);
    double v[4];
    CHECK(drain(ds, v, 4) == 3 && v[2] == 9);
    nb_dataset_free(ds);
    CHECK(nb_dataset_from_idx_pair(pi, pl2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "3 images", "2 labels");
    remove(pi);
    remove(pl);
    remove(pl2);
}

/* A shard of an IDX source keeps only its rows (folded into the source, or
 * a shard of the source once read: the same elements); a shard of a shard;
 * data errors come with the first pass. */
static void test_idx_shard(void)
{
    unsigned char images[8 + 8 + 14] = {0, 0, 8, 2, 0, 0, 0, 7, 0, 0, 0, 2};
    unsigned char labels[8 + 7] = {0, 0, 8, 1, 0, 0, 0, 7};
    for (int r = 0; r < 7; r++) {
        images[12 + 2 * r] = (unsigned char)(2 * r);
        images[13 + 2 * r] = (unsigned char)(2 * r + 1);
        labels[8 + r] = (unsigned char)(100 + r);
    }
    char pi[64], pl[64];
    snprintf(pi, sizeof pi, "/tmp/nb_test_dataset_%d_si", (int)getpid());
    snprintf(pl, sizeof pl, "/tmp/nb_test_dataset_%d_sl", (int)getpid());
    FILE *f = fopen(pi, "wb");
    fwrite(images, 1, 12 + 14, f);
    fclose(f);
    f = fopen(pl, "wb");
    fwrite(labels, 1, 15, f);
    fclose(f);
    for (int count = 1; count <= 8; count++)
        for (int index = 0; index < count; index++)
            for (int read_first = 0; read_first < 2; read_first++) {
                nb_dataset *src = nb_dataset_from_idx_pair(pi, pl);
                if (read_first) { /* read once: the shard then drops rows */
                    nb_dataset_iterator *it0 = nb_dataset_iterate(src);
                    CHECK(it0 != NULL);
                    nb_dataset_iterator_free(it0);
                }
                nb_dataset *ds = nb_dataset_shard(src, count, index);
                nb_dataset_iterator *it = nb_dataset_iterate(ds);
                nb_tensor *out[2];
                int k = 0;
                nb_status st;
                while ((st = nb_dataset_next(it, out)) == NB_OK) {
                    int r = index + k * count;
                    CHECKF(nb_tensor_get(out[0], 1) == 2 * r + 1 && nb_tensor_item(out[1]) == 100 + r,
                           "IDX shard %d of %d (read first: %d): element %d", index, count, read_first, k);
                    k++;
                }
                CHECKF(st == NB_ERR_OUT_OF_RANGE && k == (7 - index + count - 1) / count,
                       "IDX shard %d of %d: %d elements", index, count, k);
                nb_dataset_iterator_free(it);
                nb_dataset_free(ds);
            }
    /* a shard of a shard: rows 1 + 2 (0 + 3 k) = 1, 7, ... */
    nb_dataset *ds = nb_dataset_shard(nb_dataset_shard(nb_dataset_from_idx(pl), 2, 1), 3, 0);
    double v[8];
    CHECK(drain(ds, v, 8) == 1 && v[0] == 101);
    nb_dataset_free(ds);
    /* data cut short: the header is fine, the first pass fails naming the file */
    f = fopen(pi, "wb");
    fwrite(images, 1, 12 + 13, f);
    fclose(f);
    ds = nb_dataset_shard(nb_dataset_from_idx(pi), 2, 1);
    CHECK(ds != NULL);
    CHECK(nb_dataset_iterate(ds) == NULL);
    CHECK_ERROR(NB_ERR_IO, pi, "truncated data");
    nb_dataset_free(ds);
    remove(pi);
    remove(pl);
}

/* Inverts the byte at offset in the file at path. */
static void flip_byte(const char *path, long offset)
{
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, offset, SEEK_SET);
    int c = fgetc(f);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
}

/* A shard of a TFRecord source: its records, the others seeked over (their
 * data and its CRC unread: a bad data CRC in another shard's record goes
 * unseen, a bad length CRC does not). */
static void test_tfrecord_shard(void)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/nb_test_dataset_%d_s.tfrecord", (int)getpid());
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    unsigned char rec[8];
    for (int i = 0; i < 7; i++) {
        memset(rec, 10 + i, sizeof rec);
        CHECK_OK(nb_tfrecord_write(w, rec, (size_t)i + 1)); /* record i: i + 1 bytes of 10 + i */
    }
    CHECK_OK(nb_tfrecord_writer_close(w));
    for (int count = 1; count <= 4; count++)
        for (int index = 0; index < count; index++) {
            nb_dataset *ds = nb_dataset_shard(nb_dataset_from_tfrecord(path), count, index);
            nb_dataset_iterator *it = nb_dataset_iterate(ds);
            nb_tensor *out[1];
            int k = 0;
            nb_status st;
            while ((st = nb_dataset_next(it, out)) == NB_OK) {
                int r = index + k * count;
                CHECKF(nb_tensor_dim(out[0], 0) == r + 1 && nb_tensor_get(out[0], 0) == 10 + r,
                       "TFRecord shard %d of %d: element %d", index, count, k);
                k++;
            }
            CHECKF(st == NB_ERR_OUT_OF_RANGE && k == (7 - index + count - 1) / count,
                   "TFRecord shard %d of %d: %d elements", index, count, k);
            nb_dataset_iterator_free(it);
            nb_dataset_free(ds);
        }
    /* record 0 (offset 0, 1 byte: its data CRC at bytes 13-16) gets a bad data CRC */
    flip_byte(path, 13);
    nb_dataset *ds = nb_dataset_shard(nb_dataset_from_tfrecord(path), 2, 1);
    double v[8];
    CHECK(drain(ds, v, 8) == 3 && v[0] == 11 && v[2] == 15);
    nb_dataset_free(ds);
    ds = nb_dataset_shard(nb_dataset_from_tfrecord(path), 2, 0);
    CHECK(drain(ds, v, 8) == 0);
    CHECK_ERROR(NB_ERR_IO, "bad data CRC", "byte offset 13");
    nb_dataset_free(ds);
    /* record 0's length CRC broken: skipping it fails */
    flip_byte(path, 8);
    ds = nb_dataset_shard(nb_dataset_from_tfrecord(path), 2, 1);
    CHECK(drain(ds, v, 8) == 0);
    CHECK_ERROR(NB_ERR_IO, "nb_tfrecord_skip", "bad length CRC");
    nb_dataset_free(ds);
    remove(path);
}

/* Records of a TFRecord file parsed as tf.train.Examples, batched and read ahead. */
static void test_tfrecord_examples(void)
{
    /* features {label: int64 [7], x: float [1, 1, 1, 1]}; byte 17 is the label */
    unsigned char ex[45] = {0x0a, 0x2b, 0x0a, 0x0e, 0x0a, 0x05, 0x6c, 0x61, 0x62, 0x65, 0x6c, 0x12, 0x05, 0x1a, 0x03,
                            0x0a, 0x01, 0x07, 0x0a, 0x19, 0x0a, 0x01, 0x78, 0x12, 0x14, 0x12, 0x12, 0x0a, 0x10, 0x00,
                            0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x80, 0x3f};
    char path[64];
    snprintf(path, sizeof path, "/tmp/nb_test_dataset_%d.tfrecord", (int)getpid());
    nb_tfrecord_writer *w = nb_tfrecord_writer_open(path);
    for (int i = 0; i < 5; i++) {
        ex[17] = (unsigned char)i;
        CHECK_OK(nb_tfrecord_write(w, ex, sizeof ex));
    }
    CHECK_OK(nb_tfrecord_writer_close(w));
    const nb_feature_spec specs[2] = {{"label", NB_FEATURE_INT64, 1}, {"x", NB_FEATURE_FLOAT, 4}};
    nb_dataset *ds = nb_dataset_from_tfrecord(path);
    double v[8];
    CHECK(drain(ds, v, 8) == 5 && v[0] == 0x0a); /* the raw records */
    ds = nb_dataset_prefetch(nb_dataset_batch(nb_dataset_parse_examples(ds, 2, specs), 2, false), 2, NULL);
    for (int pass = 0; pass < 2; pass++) {
        nb_dataset_iterator *it = nb_dataset_iterate(ds);
        nb_tensor *out[2];
        int64_t k = 0;
        nb_status st;
        while ((st = nb_dataset_next(it, out)) == NB_OK) {
            CHECK(has_shape(out[1], NB_SHAPE(nb_tensor_dim(out[0], 0), 4)) && nb_tensor_get(out[1], 3) == 1);
            CHECK(has_shape(out[0], NB_SHAPE(nb_tensor_dim(out[0], 0), 1)) && nb_tensor_get(out[0], 0) == k);
            k += nb_tensor_dim(out[0], 0);
        }
        CHECK(st == NB_ERR_OUT_OF_RANGE && k == 5);
        nb_dataset_iterator_free(it);
    }
    nb_dataset_free(ds);
    /* A record that is no Example fails the pass, naming the parser. */
    w = nb_tfrecord_writer_open(path);
    CHECK_OK(nb_tfrecord_write(w, ex, sizeof ex));
    CHECK_OK(nb_tfrecord_write(w, "\x0a\x7f", 2));
    CHECK_OK(nb_tfrecord_writer_close(w));
    ds = nb_dataset_parse_examples(nb_dataset_from_tfrecord(path), 2, specs);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *out[2];
    CHECK_OK(nb_dataset_next(it, out));
    CHECK(nb_dataset_next(it, out) == NB_ERR_IO && !out[0]);
    CHECK_ERROR(NB_ERR_IO, "nb_example_parse", "malformed");
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
    remove(path);
    CHECK(nb_dataset_from_tfrecord(path) == NULL);
    CHECK_ERROR(NB_ERR_IO, path);
    CHECK(nb_dataset_parse_examples(range_ds(3), 0, specs) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_parse_examples", "0 specs");
    nb_tensor *pair[2] = {nb_zeros(NB_U8, NB_SHAPE(2, 3)), nb_zeros(NB_U8, NB_SHAPE(2))};
    CHECK(nb_dataset_parse_examples(nb_dataset_from_tensors(2, pair), 2, specs) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_dataset_parse_examples", "2 components");
    ds = nb_dataset_parse_examples(range_ds(3), 2, specs);
    it = nb_dataset_iterate(ds);
    CHECK(nb_dataset_next(it, out) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_dataset_parse_examples", "f64");
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
}

/* A replica's rows of the global batch, summed: the strategy splits the batch. */
static nb_status replica_sum(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out, void *user)
{
    (void)n_in, (void)n_out, (void)user;
    out[0] = nb_scalar(NB_F64, (double)nb_replica_rows(r));
    out[1] = nb_sum_all(in[1]);
    return NB_OK;
}

static void test_mirrored(void)
{
    /* the two logical CPU devices main made, named: the default devices are the
     * GPUs where there are some, and a machine may have only one */
    const char *const cpus[2] = {"/cpu:0", "/cpu:1"};
    nb_mirrored *m = nb_mirrored_new(2, cpus);
    CHECK(nb_mirrored_replicas(m) == 2);
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(10, 3)), *y = nb_arange(NB_F64, 0, 10, 1);
    nb_tensor *ts[2] = {x, y};
    nb_dataset *ds = nb_dataset_batch(nb_dataset_from_tensors(2, ts), 7, false);
    nb_dataset_iterator *it = nb_dataset_iterate(ds);
    nb_tensor *batch[2], *outs[4];
    CHECK_OK(nb_dataset_next(it, batch));
    CHECK_OK(nb_mirrored_run(m, replica_sum, NULL, 2, batch, 2, outs));
    CHECK(nb_tensor_item(outs[0]) == 4 && nb_tensor_item(outs[2]) == 3);
    CHECK(nb_tensor_item(outs[1]) == 0 + 1 + 2 + 3 && nb_tensor_item(outs[3]) == 4 + 5 + 6);
    CHECK_OK(nb_dataset_next(it, batch)); /* the remainder: 3 rows */
    CHECK_OK(nb_mirrored_run(m, replica_sum, NULL, 2, batch, 2, outs));
    CHECK(nb_tensor_item(outs[0]) == 2 && nb_tensor_item(outs[3]) == 9);
    nb_dataset_iterator_free(it);
    nb_dataset_free(ds);
    nb_mirrored_free(m);
}

int main(void)
{
    nb_set_logical_cpu_devices(2);
    RUN(test_from_tensors);
    RUN(test_shard);
    RUN(test_ownership);
    RUN(test_batch);
    RUN(test_map);
    RUN(test_repeat);
    RUN(test_shuffle);
    RUN(test_generator);
    RUN(test_prefetch);
    RUN(test_errors);
    RUN(test_idx);
    RUN(test_idx_shard);
    RUN(test_tfrecord_shard);
    RUN(test_tfrecord_examples);
    RUN(test_mirrored);
    return check_finish();
}
