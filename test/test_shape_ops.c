/* Shape, index and copy ops: values against plain references on random inputs,
 * gradients by the checker in f64 (first and second order), views, devices, and
 * every failure path with its code and message. */
#include "check.h"

#include <stdint.h>

/* ---- helpers ------------------------------------------------------------------ */

static nb_tensor *randn(nb_dtype dt, nb_shape s, uint64_t seed) { return nb_random_normal(dt, s, 0, 1, seed); }
static nb_tensor *randn64(nb_shape s, uint64_t seed) { return randn(NB_F64, s, seed); }


static void unravel(int64_t f, int nd, const int64_t *shape, int64_t *idx)
{
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = f % shape[d];
        f /= shape[d];
    }
}

static int64_t ravel(int nd, const int64_t *shape, const int64_t *idx)
{
    int64_t f = 0;
    for (int d = 0; d < nd; d++)
        f = f * shape[d] + idx[d];
    return f;
}

/* Data movement is exact: values must match bit for bit (as doubles). */
#define CHECK_EXACT(t, ref, n) CHECK(check_max_error((t), (ref), (n)) == 0.0)

/* Reference of a permuted tensor: out dim d is x dim perm[d]. */
static void ref_permute(const double *xv, int nd, const int64_t *xshape, const int *perm, double *out)
{
    int64_t oshape[NB_MAX_DIMS], o[NB_MAX_DIMS], xi[NB_MAX_DIMS];
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        oshape[d] = xshape[perm[d]];
        n *= oshape[d];
    }
    for (int64_t f = 0; f < n; f++) {
        unravel(f, nd, oshape, o);
        for (int d = 0; d < nd; d++)
            xi[perm[d]] = o[d];
        out[f] = xv[ravel(nd, xshape, xi)];
    }
}

/* ---- the functions the gradient checker differentiates ------------------------- */

enum {
    GC_RESHAPE, GC_RESHAPE_T, GC_TRANSPOSE, GC_PERMUTE, GC_EXPAND, GC_SQUEEZE, GC_SLICE, GC_SLICE_T,
    GC_BROADCAST, GC_CONTIG, GC_CONCAT, GC_CONCAT_BCAST, GC_CONCAT_SELF, GC_STACK, GC_SPLIT, GC_SPLIT_SIZES,
    GC_GATHER, GC_GATHER_T, GC_CAST, GC_CAST_INT, GC_PAD, GC_PAD_T, GC_TO_DEVICE, GC_PUSHED_CONCAT, GC_CONCAT_MANY,
};

typedef struct gc_case {
    int which;
    const nb_tensor *aux; /* indices for gather */
} gc_case;

static nb_tensor *gc_fn(int n, nb_tensor *const *in, void *user)
{
    const gc_case *c = user;
    nb_tensor *x = in[0];
    (void)n;
    switch (c->which) {
    case GC_RESHAPE: return nb_reshape(x, NB_SHAPE(4, -1));
    case GC_RESHAPE_T: return nb_reshape(nb_transpose(x, 0, 2), NB_SHAPE(6, 4));
    case GC_TRANSPOSE: return nb_transpose(x, 0, -1);
    case GC_PERMUTE: return nb_permute(x, NB_AXES(2, 0, 1));
    case GC_EXPAND: return nb_mul(nb_expand_dims(x, 1), nb_expand_dims(x, -1)); /* [2,1,3]*[2,3,1] */
    case GC_SQUEEZE: return nb_squeeze(x, 1);
    case GC_SLICE: return nb_slice(x, NB_SHAPE(0, 1, 1), NB_SHAPE(2, -1, 2));
    case GC_SLICE_T: return nb_slice(nb_transpose(x, 0, 2), NB_SHAPE(1, 0, 0), NB_SHAPE(2, 2, -1));
    case GC_BROADCAST: return nb_broadcast_to(x, NB_SHAPE(2, 3, 4));
    case GC_CONTIG: return nb_contiguous(nb_transpose(x, 0, 1));
    case GC_CONCAT: return nb_concat(NB_TENSORS(in[0], in[1], in[2]), 1);
    case GC_CONCAT_BCAST: {
        nb_tensor *a = nb_broadcast_to(in[0], NB_SHAPE(3, 4)), *b = nb_broadcast_to(in[1], NB_SHAPE(2, 4));
        return nb_concat(NB_TENSORS(a, b, nb_transpose(in[2], 0, 1)), 0);
    }
    case GC_CONCAT_SELF: return nb_concat(NB_TENSORS(x, nb_square(x), x), -1);
    case GC_CONCAT_MANY: { /* 20 rows split apart and joined in reverse order */
        nb_tensor *p[20], *r[20];
        if (nb_split(x, 20, NULL, 0, p))
            return NULL;
        for (int i = 0; i < 20; i++)
            r[i] = i % 3 ? p[19 - i] : nb_square(p[19 - i]);
        return nb_concat(20, r, 0);
    }
    case GC_STACK: return nb_stack(NB_TENSORS(in[0], nb_transpose(in[1], 0, 1)), 1);
    case GC_SPLIT: {
        nb_tensor *p[3];
        if (nb_split(x, 3, NULL, 1, p))
            return NULL;
        return nb_add(nb_mul(p[0], p[2]), p[1]);
    }
    case GC_SPLIT_SIZES: {
        nb_tensor *p[3];
        const int64_t sizes[3] = {1, 0, 3};
        if (nb_split(x, 3, sizes, -1, p))
            return NULL;
        return nb_concat(NB_TENSORS(nb_square(p[2]), p[1], p[0]), 2);
    }
    case GC_GATHER: return nb_gather(x, c->aux);
    case GC_GATHER_T: return nb_gather(nb_transpose(x, 0, 1), c->aux);
    case GC_CAST: return nb_cast(x, NB_F64);
    case GC_CAST_INT: return nb_add(nb_cast(nb_cast(x, NB_I32), NB_F64), nb_square(x));
    case GC_PAD: return nb_pad(x, NB_SHAPE(1, 0, 2), NB_SHAPE(0, 2, 1), 0.5);
    case GC_PAD_T: return nb_pad(nb_transpose(x, 0, 1), NB_SHAPE(2, 1), NB_SHAPE(1, 0), -1.5);
    case GC_TO_DEVICE: return nb_mul(nb_to_device(in[0], "/cpu:1"), nb_to_device(in[1], "/cpu:1"));
    case GC_PUSHED_CONCAT: {
        nb_device_push("/cpu:1");
        nb_tensor *y = nb_concat(NB_TENSORS(in[0], in[1]), 0);
        nb_device_pop();
        return y;
    }
    }
    return NULL;
}

/* Second order: the checker differentiates d/dx sum(op(x)^2 * w), computed with
 * an inner tape, so every gradient function on the way must itself be recorded. */
static nb_tensor *gc_second(int n, nb_tensor *const *in, void *user)
{
    nb_tape *t = nb_tape_begin();
    for (int i = 0; i < n; i++)
        nb_tape_watch(t, in[i]);
    nb_tensor *y = gc_fn(n, in, user);
    if (!y)
        return NULL;
    nb_device_push(nb_tensor_device(y)); /* weights beside y, wherever fn put it */
    nb_tensor *w = nb_random_uniform(NB_F64, nb_tensor_shape(y), 0.5, 1.5, 77);
    nb_device_pop();
    nb_tensor *l = nb_sum_all(nb_mul(nb_square(y), w));
    nb_tensor *g = NULL;
    nb_tape_gradient(t, l, 1, in, &g);
    nb_tape_free(t);
    return g;
}

#define GRADCHECK(fn, which_, aux_, ...)                                                   \
    do {                                                                                   \
        gc_case c_ = {(which_), (aux_)};                                                   \
        double err_ = INFINITY;                                                            \
        CHECK_OK(nb_gradient_check((fn), &c_, NB_TENSORS(__VA_ARGS__), 1e-6, 1e-6, &err_)); \
        CHECK(err_ <= 1e-6);                                                               \
    } while (0)

/* ---- reshape ------------------------------------------------------------------ */

static void test_reshape(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3, 4), 11);
    double *xv = check_values(x);
    nb_tensor *y = nb_reshape(x, NB_SHAPE(4, -1));
    CHECK(has_shape(y, NB_SHAPE(4, 6)));
    CHECK(nb_tensor_is_contiguous(y));
    CHECK_EXACT(y, xv, 24);
    CHECK(has_shape(nb_reshape(x, NB_SHAPE(24)), NB_SHAPE(24)));
    CHECK(has_shape(nb_reshape(nb_reshape(x, NB_SHAPE(1, 24, 1)), NB_SHAPE(2, -1, 3)), NB_SHAPE(2, 4, 3)));
    /* A one-element tensor to 0-d and back. */
    nb_tensor *s = nb_reshape(nb_slice(x, NB_SHAPE(1, 2, 3), NB_SHAPE(1, 1, 1)), NB_SCALAR);
    CHECK(has_shape(s, NB_SCALAR) && nb_tensor_item(s) == xv[23]);

    /* Non-contiguous input: a copy in the transposed order. */
    nb_tensor *t = nb_transpose(x, 0, 2);
    CHECK(!nb_tensor_is_contiguous(t));
    double ref[24];
    ref_permute(xv, 3, (int64_t[]){2, 3, 4}, (int[]){2, 1, 0}, ref);
    nb_tensor *r = nb_reshape(t, NB_SHAPE(6, 4));
    CHECK(has_shape(r, NB_SHAPE(6, 4)) && nb_tensor_is_contiguous(r));
    CHECK_EXACT(r, ref, 24);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(2, 3, 4), 12);
    GRADCHECK(gc_fn, GC_RESHAPE, NULL, x64);
    GRADCHECK(gc_fn, GC_RESHAPE_T, NULL, x64);
    GRADCHECK(gc_second, GC_RESHAPE_T, NULL, x64);
}

/* ---- transpose and permute ------------------------------------------------------ */

static void test_transpose_permute(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3, 4), 21);
    double *xv = check_values(x);
    double ref[24];
    nb_tensor *t = nb_transpose(x, 0, -1);
    CHECK(has_shape(t, NB_SHAPE(4, 3, 2)));
    ref_permute(xv, 3, (int64_t[]){2, 3, 4}, (int[]){2, 1, 0}, ref);
    CHECK_EXACT(t, ref, 24);
    /* A view: strides swapped, no copy. */
    CHECK(nb_tensor_stride(t, 0) == 4 && nb_tensor_stride(t, 2) == 48);

    nb_tensor *p = nb_permute(x, NB_AXES(2, 0, 1));
    CHECK(has_shape(p, NB_SHAPE(4, 2, 3)));
    ref_permute(xv, 3, (int64_t[]){2, 3, 4}, (int[]){2, 0, 1}, ref);
    CHECK_EXACT(p, ref, 24);
    /* Transposing twice gives x back. */
    CHECK_EXACT(nb_transpose(nb_transpose(x, 1, 2), 2, 1), xv, 24);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(2, 3, 4), 22);
    GRADCHECK(gc_fn, GC_TRANSPOSE, NULL, x64);
    GRADCHECK(gc_fn, GC_PERMUTE, NULL, x64);
    GRADCHECK(gc_second, GC_PERMUTE, NULL, x64);
}

/* ---- expand_dims and squeeze ----------------------------------------------------- */

static void test_expand_squeeze(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3), 31);
    double *xv = check_values(x);
    CHECK(has_shape(nb_expand_dims(x, 0), NB_SHAPE(1, 2, 3)));
    CHECK(has_shape(nb_expand_dims(x, 1), NB_SHAPE(2, 1, 3)));
    CHECK(has_shape(nb_expand_dims(x, 2), NB_SHAPE(2, 3, 1)));
    CHECK(has_shape(nb_expand_dims(x, -1), NB_SHAPE(2, 3, 1)));
    nb_tensor *e = nb_expand_dims(x, 1);
    CHECK(nb_tensor_is_contiguous(e));
    CHECK_EXACT(e, xv, 6);
    nb_tensor *s = nb_squeeze(e, -2);
    CHECK(has_shape(s, NB_SHAPE(2, 3)));
    CHECK_EXACT(s, xv, 6);
    /* On a transposed view. */
    nb_tensor *te = nb_expand_dims(nb_transpose(x, 0, 1), 2);
    double ref[6];
    ref_permute(xv, 2, (int64_t[]){2, 3}, (int[]){1, 0}, ref);
    CHECK(has_shape(te, NB_SHAPE(3, 2, 1)));
    CHECK_EXACT(te, ref, 6);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(2, 3), 32);
    GRADCHECK(gc_fn, GC_EXPAND, NULL, x64);
    GRADCHECK(gc_second, GC_EXPAND, NULL, x64);
    nb_tensor *y64 = randn64(NB_SHAPE(2, 1, 4), 33);
    GRADCHECK(gc_fn, GC_SQUEEZE, NULL, y64);
}

/* ---- slice ---------------------------------------------------------------------- */

static void check_slice(nb_tensor *x, nb_shape begin, nb_shape size)
{
    double *xv = check_values(x);
    nb_shape xs = nb_tensor_shape(x), os = xs;
    for (int d = 0; d < xs.ndim; d++)
        os.dims[d] = size.dims[d] < 0 ? xs.dims[d] - begin.dims[d] : size.dims[d];
    int64_t n = 1, o[NB_MAX_DIMS], xi[NB_MAX_DIMS];
    for (int d = 0; d < os.ndim; d++)
        n *= os.dims[d];
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t f = 0; f < n; f++) {
        unravel(f, os.ndim, os.dims, o);
        for (int d = 0; d < os.ndim; d++)
            xi[d] = o[d] + begin.dims[d];
        ref[f] = xv[ravel(xs.ndim, xs.dims, xi)];
    }
    nb_tensor *y = nb_slice(x, begin, size);
    CHECK(has_shape(y, os));
    CHECK_EXACT(y, ref, n);
    free(ref);
    free(xv);
}

static void test_slice(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(3, 4, 5), 41);
    check_slice(x, NB_SHAPE(1, 0, 2), NB_SHAPE(2, 4, 3));
    check_slice(x, NB_SHAPE(0, 1, 1), NB_SHAPE(-1, -1, -1));
    check_slice(x, NB_SHAPE(2, 3, 4), NB_SHAPE(1, 1, 1));
    check_slice(x, NB_SHAPE(0, 4, 0), NB_SHAPE(3, 0, 5)); /* empty */
    /* A slice of a transposed tensor, and a slice of a slice. */
    check_slice(nb_transpose(x, 0, 2), NB_SHAPE(1, 1, 0), NB_SHAPE(3, 2, -1));
    check_slice(nb_slice(x, NB_SHAPE(1, 1, 1), NB_SHAPE(2, 3, 4)), NB_SHAPE(1, 0, 2), NB_SHAPE(1, 2, -1));
    /* A view: writing nothing, it shares x's strides. */
    nb_tensor *y = nb_slice(x, NB_SHAPE(1, 0, 2), NB_SHAPE(2, 4, 3));
    CHECK(!nb_tensor_is_contiguous(y) && nb_tensor_stride(y, 0) == nb_tensor_stride(x, 0));

    nb_tensor *x64 = randn64(NB_SHAPE(2, 3, 4), 42);
    GRADCHECK(gc_fn, GC_SLICE, NULL, x64);
    GRADCHECK(gc_fn, GC_SLICE_T, NULL, x64);
    GRADCHECK(gc_second, GC_SLICE, NULL, x64);
    GRADCHECK(gc_second, GC_SLICE_T, NULL, x64);
}

/* ---- broadcast_to ------------------------------------------------------------------ */

static void test_broadcast_to(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(3, 1), 51);
    double *xv = check_values(x);
    nb_tensor *y = nb_broadcast_to(x, NB_SHAPE(2, 3, 4));
    CHECK(has_shape(y, NB_SHAPE(2, 3, 4)));
    CHECK(nb_tensor_stride(y, 0) == 0 && nb_tensor_stride(y, 2) == 0 && nb_tensor_stride(y, 1) == 4);
    double ref[24];
    for (int i = 0; i < 24; i++)
        ref[i] = xv[(i / 4) % 3];
    CHECK_EXACT(y, ref, 24);
    /* Same shape: a plain view. */
    CHECK_EXACT(nb_broadcast_to(x, NB_SHAPE(3, 1)), xv, 3);
    /* Materialised through contiguous. */
    nb_tensor *c = nb_contiguous(y);
    CHECK(nb_tensor_is_contiguous(c));
    CHECK_EXACT(c, ref, 24);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(3, 1), 52);
    GRADCHECK(gc_fn, GC_BROADCAST, NULL, x64);
    GRADCHECK(gc_second, GC_BROADCAST, NULL, x64);
}

/* ---- contiguous ------------------------------------------------------------------- */

static void test_contiguous(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(3, 5), 61);
    CHECK(nb_contiguous(x) == x); /* already contiguous: x itself */
    double *xv = check_values(x), ref[15];
    ref_permute(xv, 2, (int64_t[]){3, 5}, (int[]){1, 0}, ref);
    nb_tensor *t = nb_transpose(x, 0, 1);
    nb_tensor *c = nb_contiguous(t);
    CHECK(c != t && nb_tensor_is_contiguous(c) && has_shape(c, NB_SHAPE(5, 3)));
    CHECK(nb_tensor_stride(c, 0) == 12 && nb_tensor_stride(c, 1) == 4);
    CHECK_EXACT(c, ref, 15);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(3, 4), 62);
    GRADCHECK(gc_fn, GC_CONTIG, NULL, x64);
    GRADCHECK(gc_second, GC_CONTIG, NULL, x64);
}

/* ---- concat and stack --------------------------------------------------------------- */

static void test_concat(void)
{
    nb_tensor *a = randn(NB_F32, NB_SHAPE(2, 3), 71), *b = randn(NB_F32, NB_SHAPE(2, 1), 72),
              *c = randn(NB_F32, NB_SHAPE(2, 2), 73);
    double *av = check_values(a), *bv = check_values(b), *cv = check_values(c);
    nb_tensor *y = nb_concat(NB_TENSORS(a, b, c), 1);
    CHECK(has_shape(y, NB_SHAPE(2, 6)));
    double ref[12];
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 3; j++)
            ref[i * 6 + j] = av[i * 3 + j];
        ref[i * 6 + 3] = bv[i];
        for (int j = 0; j < 2; j++)
            ref[i * 6 + 4 + j] = cv[i * 2 + j];
    }
    CHECK_EXACT(y, ref, 12);
    CHECK_EXACT(nb_concat(NB_TENSORS(a, b, c), -1), ref, 12);

    /* Axis 0, with a transposed input and an empty one. */
    nb_tensor *d = randn(NB_F32, NB_SHAPE(3, 2), 74);
    double *dv = check_values(d);
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0, 3));
    nb_tensor *z = nb_concat(NB_TENSORS(a, e, nb_transpose(d, 0, 1)), 0);
    CHECK(has_shape(z, NB_SHAPE(4, 3)));
    double ref0[12];
    for (int i = 0; i < 6; i++)
        ref0[i] = av[i];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            ref0[6 + i * 3 + j] = dv[j * 2 + i];
    CHECK_EXACT(z, ref0, 12);
    /* One input: a copy. */
    nb_tensor *one = nb_concat(NB_TENSORS(a), 0);
    CHECK(one && one != a);
    CHECK_EXACT(one, av, 6);

    /* Integer dtypes too. */
    int32_t iv[4] = {3, -7, 11, 5};
    nb_tensor *ia = nb_from_buffer(NB_I32, NB_SHAPE(2, 2), iv);
    nb_tensor *ic = nb_concat(NB_TENSORS(ia, ia), 1);
    CHECK(nb_tensor_dtype(ic) == NB_I32 && has_shape(ic, NB_SHAPE(2, 4)));
    double iref[8] = {3, -7, 3, -7, 11, 5, 11, 5};
    CHECK_EXACT(ic, iref, 8);
    free(av);
    free(bv);
    free(cv);
    free(dv);

    nb_tensor *x0 = randn64(NB_SHAPE(2, 3), 75), *x1 = randn64(NB_SHAPE(2, 1), 76), *x2 = randn64(NB_SHAPE(2, 2), 77);
    GRADCHECK(gc_fn, GC_CONCAT, NULL, x0, x1, x2);
    GRADCHECK(gc_second, GC_CONCAT, NULL, x0, x1, x2);
    /* Concat of broadcast views: each broadcast input's gradient sums its rows. */
    nb_tensor *b0 = randn64(NB_SHAPE(1, 4), 78), *b1 = randn64(NB_SHAPE(4), 79), *b2 = randn64(NB_SHAPE(4, 2), 80);
    GRADCHECK(gc_fn, GC_CONCAT_BCAST, NULL, b0, b1, b2);
    GRADCHECK(gc_second, GC_CONCAT_BCAST, NULL, b0, b1, b2);
    /* The same tensor twice: gradients add. */
    GRADCHECK(gc_fn, GC_CONCAT_SELF, NULL, x0);

    /* Many inputs (past any small fixed-size array). */
    nb_tensor *m = randn(NB_F32, NB_SHAPE(20, 3), 85);
    double *mv = check_values(m), mref[60];
    nb_tensor *rows[20];
    CHECK_OK(nb_split(m, 20, NULL, 0, rows));
    nb_tensor *rev[20];
    for (int i = 0; i < 20; i++) {
        rev[i] = rows[19 - i];
        for (int j = 0; j < 3; j++)
            mref[i * 3 + j] = mv[(19 - i) * 3 + j];
    }
    nb_tensor *mc = nb_concat(20, rev, 0);
    CHECK(has_shape(mc, NB_SHAPE(20, 3)));
    CHECK_EXACT(mc, mref, 60);
    free(mv);
    nb_tensor *m64 = randn64(NB_SHAPE(20, 2), 86);
    GRADCHECK(gc_fn, GC_CONCAT_MANY, NULL, m64);
    GRADCHECK(gc_second, GC_CONCAT_MANY, NULL, m64);
}

static void test_stack(void)
{
    nb_tensor *a = randn(NB_F32, NB_SHAPE(2, 3), 81), *b = randn(NB_F32, NB_SHAPE(2, 3), 82);
    double *av = check_values(a), *bv = check_values(b);
    double ref[12];
    nb_tensor *s0 = nb_stack(NB_TENSORS(a, b), 0);
    CHECK(has_shape(s0, NB_SHAPE(2, 2, 3)));
    for (int i = 0; i < 6; i++) {
        ref[i] = av[i];
        ref[6 + i] = bv[i];
    }
    CHECK_EXACT(s0, ref, 12);
    nb_tensor *s1 = nb_stack(NB_TENSORS(a, b), 1);
    CHECK(has_shape(s1, NB_SHAPE(2, 2, 3)));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            ref[i * 6 + j] = av[i * 3 + j];
            ref[i * 6 + 3 + j] = bv[i * 3 + j];
        }
    CHECK_EXACT(s1, ref, 12);
    nb_tensor *s2 = nb_stack(NB_TENSORS(a, b), -1);
    CHECK(has_shape(s2, NB_SHAPE(2, 3, 2)));
    for (int i = 0; i < 6; i++) {
        ref[2 * i] = av[i];
        ref[2 * i + 1] = bv[i];
    }
    CHECK_EXACT(s2, ref, 12);
    free(av);
    free(bv);

    nb_tensor *x0 = randn64(NB_SHAPE(2, 3), 83), *x1 = randn64(NB_SHAPE(3, 2), 84);
    GRADCHECK(gc_fn, GC_STACK, NULL, x0, x1);
    GRADCHECK(gc_second, GC_STACK, NULL, x0, x1);
}

/* ---- split -------------------------------------------------------------------------- */

static void test_split(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 6, 3), 91);
    double *xv = check_values(x);
    nb_tensor *p[3];
    CHECK_OK(nb_split(x, 3, NULL, 1, p));
    for (int k = 0; k < 3; k++) {
        CHECK(has_shape(p[k], NB_SHAPE(2, 2, 3)));
        double ref[12];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                for (int l = 0; l < 3; l++)
                    ref[(i * 2 + j) * 3 + l] = xv[(i * 6 + 2 * k + j) * 3 + l];
        CHECK_EXACT(p[k], ref, 12);
    }
    const int64_t sizes[3] = {1, 0, 5};
    CHECK_OK(nb_split(x, 3, sizes, -2, p));
    CHECK(has_shape(p[0], NB_SHAPE(2, 1, 3)) && has_shape(p[1], NB_SHAPE(2, 0, 3)) && has_shape(p[2], NB_SHAPE(2, 5, 3)));
    double ref[30];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++)
            for (int l = 0; l < 3; l++)
                ref[(i * 5 + j) * 3 + l] = xv[(i * 6 + 1 + j) * 3 + l];
    CHECK_EXACT(p[2], ref, 30);
    free(xv);

    nb_tensor *x64 = randn64(NB_SHAPE(2, 6, 4), 92);
    GRADCHECK(gc_fn, GC_SPLIT, NULL, x64);
    GRADCHECK(gc_fn, GC_SPLIT_SIZES, NULL, x64);
    GRADCHECK(gc_second, GC_SPLIT, NULL, x64);
}

/* ---- gather and one_hot ---------------------------------------------------------------- */

static void test_gather(void)
{
    nb_tensor *params = randn(NB_F32, NB_SHAPE(5, 3), 101);
    double *pv = check_values(params);
    const int64_t idx[6] = {4, 0, 4, 1, 1, 2}; /* repeats */
    nb_tensor *ix = nb_from_buffer(NB_I64, NB_SHAPE(2, 3), idx);
    nb_tensor *y = nb_gather(params, ix);
    CHECK(has_shape(y, NB_SHAPE(2, 3, 3)));
    double ref[18];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            ref[i * 3 + j] = pv[idx[i] * 3 + j];
    CHECK_EXACT(y, ref, 18);

    /* i32 indices of one dim, 3-d params, non-contiguous params and indices. */
    nb_tensor *p3 = randn(NB_F32, NB_SHAPE(4, 2, 3), 102);
    double *p3v = check_values(p3);
    const int32_t idx32[4] = {3, 3, 0, 2};
    nb_tensor *ix32 = nb_from_buffer(NB_I32, NB_SHAPE(4), idx32);
    nb_tensor *y3 = nb_gather(p3, ix32);
    CHECK(has_shape(y3, NB_SHAPE(4, 2, 3)));
    double ref3[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++)
            ref3[i * 6 + j] = p3v[idx32[i] * 6 + j];
    CHECK_EXACT(y3, ref3, 24);
    nb_tensor *pt = nb_transpose(params, 0, 1); /* [3, 5] */
    nb_tensor *ixt = nb_transpose(ix, 0, 1);    /* [3, 2], indices < 3 needed */
    const int64_t small[6] = {2, 0, 1, 1, 0, 2};
    nb_tensor *ixs = nb_transpose(nb_from_buffer(NB_I64, NB_SHAPE(2, 3), small), 0, 1); /* [3,2]: 2,1,0,0,1,2 */
    nb_tensor *yt = nb_gather(pt, ixs);
    CHECK(has_shape(yt, NB_SHAPE(3, 2, 5)));
    const int64_t ixs_flat[6] = {2, 1, 0, 0, 1, 2};
    double reft[30];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 5; j++)
            reft[i * 5 + j] = pv[j * 3 + ixs_flat[i]];
    CHECK_EXACT(yt, reft, 30);
    CHECK(has_shape(ixt, NB_SHAPE(3, 2)));

    /* Integer params. */
    const int32_t ip[6] = {10, -20, 30, -40, 50, -60};
    nb_tensor *ipar = nb_from_buffer(NB_I32, NB_SHAPE(3, 2), ip);
    nb_tensor *yi = nb_gather(ipar, nb_from_buffer(NB_I32, NB_SHAPE(2), (int32_t[]){2, 0}));
    double refi[4] = {50, -60, 10, -20};
    CHECK(nb_tensor_dtype(yi) == NB_I32);
    CHECK_EXACT(yi, refi, 4);
    free(pv);
    free(p3v);

    /* The gradient sums over repeated indices: row r gets count(r) times g. */
    nb_tensor *p64 = randn64(NB_SHAPE(5, 3), 103);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, p64);
    nb_tensor *l = nb_sum_all(nb_gather(p64, ix));
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, l, NB_TENSORS(p64), &g));
    const double counts[5] = {1, 2, 1, 0, 2};
    double gref[15];
    for (int r = 0; r < 5; r++)
        for (int j = 0; j < 3; j++)
            gref[r * 3 + j] = counts[r];
    CHECK_EXACT(g, gref, 15);

    GRADCHECK(gc_fn, GC_GATHER, ix, p64);
    GRADCHECK(gc_second, GC_GATHER, ix, p64);
    nb_tensor *q64 = randn64(NB_SHAPE(3, 5), 104);
    GRADCHECK(gc_fn, GC_GATHER_T, ix, q64);
    GRADCHECK(gc_second, GC_GATHER_T, ixt, q64);

    /* Rows of no elements: nothing is moved, but the indices are still checked. */
    nb_tensor *p0 = nb_zeros(NB_F32, NB_SHAPE(5, 0));
    const int64_t ok_ix[3] = {4, 0, 2}, bad_ix[3] = {4, 5, 0};
    nb_tensor *e = nb_gather(p0, nb_from_buffer(NB_I64, NB_SHAPE(3), ok_ix));
    CHECK(e && nb_tensor_ndim(e) == 2 && nb_tensor_dim(e, 0) == 3 && nb_tensor_dim(e, 1) == 0);
    CHECK(nb_gather(p0, nb_from_buffer(NB_I64, NB_SHAPE(3), bad_ix)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "index 5", "position 1", "[0, 5)");
}

static void test_one_hot(void)
{
    const int64_t idx[6] = {0, 3, 1, 2, 3, 1};
    nb_tensor *ix = nb_from_buffer(NB_I64, NB_SHAPE(2, 3), idx);
    nb_tensor *y = nb_one_hot(ix, 4, NB_F32);
    CHECK(has_shape(y, NB_SHAPE(2, 3, 4)) && nb_tensor_dtype(y) == NB_F32);
    double ref[24];
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 4; k++)
            ref[i * 4 + k] = idx[i] == k;
    CHECK_EXACT(y, ref, 24);
    /* i32 indices, i32 output, and a transposed index view. */
    const int32_t idx32[3] = {2, 0, 1};
    nb_tensor *y32 = nb_one_hot(nb_from_buffer(NB_I32, NB_SHAPE(3), idx32), 3, NB_I32);
    double ref32[9] = {0, 0, 1, 1, 0, 0, 0, 1, 0};
    CHECK(nb_tensor_dtype(y32) == NB_I32);
    CHECK_EXACT(y32, ref32, 9);
    nb_tensor *yt = nb_one_hot(nb_transpose(ix, 0, 1), 4, NB_F64);
    CHECK(has_shape(yt, NB_SHAPE(3, 2, 4)));
    double reft[24];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 4; k++)
                reft[(i * 2 + j) * 4 + k] = idx[j * 3 + i] == k;
    CHECK_EXACT(yt, reft, 24);
}

/* ---- cast, pad, stop_gradient ---------------------------------------------------------- */

static void test_cast(void)
{
    nb_tensor *x = randn64(NB_SHAPE(3, 4), 111);
    double *xv = check_values(x), ref[12];
    nb_tensor *f = nb_cast(x, NB_F32);
    CHECK(nb_tensor_dtype(f) == NB_F32 && has_shape(f, NB_SHAPE(3, 4)));
    for (int i = 0; i < 12; i++)
        ref[i] = (double)(float)xv[i];
    CHECK_EXACT(f, ref, 12);
    nb_tensor *same = nb_cast(x, NB_F64);
    CHECK(same && same != x);
    CHECK_EXACT(same, xv, 12);
    /* Transposed input. */
    double reft[12];
    ref_permute(xv, 2, (int64_t[]){3, 4}, (int[]){1, 0}, reft);
    CHECK_EXACT(nb_cast(nb_transpose(x, 0, 1), NB_F64), reft, 12);
    /* Integer-valued data round-trips through i32 and i64. */
    double iv[12];
    for (int i = 0; i < 12; i++)
        iv[i] = round(xv[i] * 100);
    nb_tensor *xi = nb_from_buffer(NB_F64, NB_SHAPE(3, 4), iv);
    nb_tensor *i32 = nb_cast(xi, NB_I32), *i64 = nb_cast(xi, NB_I64);
    CHECK(nb_tensor_dtype(i32) == NB_I32 && nb_tensor_dtype(i64) == NB_I64);
    CHECK_EXACT(i32, iv, 12);
    CHECK_EXACT(i64, iv, 12);
    CHECK_EXACT(nb_cast(i32, NB_F32), iv, 12);
    free(xv);

    /* f32 -> f64: the gradient comes back as f32. */
    nb_tensor *x32 = randn(NB_F32, NB_SHAPE(5), 112);
    nb_tensor *w = randn64(NB_SHAPE(5), 113);
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch(tape, x32);
    nb_tensor *l = nb_sum_all(nb_mul(nb_cast(x32, NB_F64), w));
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, l, NB_TENSORS(x32), &g));
    CHECK(g && nb_tensor_dtype(g) == NB_F32);
    double *wv = check_values(w), wref[5];
    for (int i = 0; i < 5; i++)
        wref[i] = (double)(float)wv[i];
    CHECK_EXACT(g, wref, 5);
    free(wv);

    nb_tensor *x64 = randn64(NB_SHAPE(3, 4), 114);
    GRADCHECK(gc_fn, GC_CAST, NULL, x64);
    GRADCHECK(gc_fn, GC_CAST_INT, NULL, x64); /* the integer path carries no gradient */
    GRADCHECK(gc_second, GC_CAST, NULL, x64);
}

static void check_pad(nb_tensor *x, nb_shape before, nb_shape after, double value)
{
    double *xv = check_values(x);
    nb_shape xs = nb_tensor_shape(x), os = xs;
    int64_t n = 1, o[NB_MAX_DIMS], xi[NB_MAX_DIMS];
    for (int d = 0; d < xs.ndim; d++) {
        os.dims[d] = before.dims[d] + xs.dims[d] + after.dims[d];
        n *= os.dims[d];
    }
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t f = 0; f < n; f++) {
        unravel(f, os.ndim, os.dims, o);
        bool inside = true;
        for (int d = 0; d < os.ndim; d++) {
            xi[d] = o[d] - before.dims[d];
            inside = inside && xi[d] >= 0 && xi[d] < xs.dims[d];
        }
        ref[f] = inside ? xv[ravel(xs.ndim, xs.dims, xi)] : value;
    }
    nb_tensor *y = nb_pad(x, before, after, value);
    CHECK(has_shape(y, os));
    CHECK(check_max_error(y, ref, n) <= 1e-7);
    free(ref);
    free(xv);
}

static void test_pad(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3, 4), 121);
    check_pad(x, NB_SHAPE(1, 0, 2), NB_SHAPE(0, 2, 1), 0.5);
    check_pad(x, NB_SHAPE(0, 0, 0), NB_SHAPE(0, 0, 0), 0.0);
    check_pad(nb_transpose(x, 0, 2), NB_SHAPE(2, 1, 0), NB_SHAPE(1, 1, 3), -2.25);
    const int32_t iv[4] = {1, -2, 3, -4};
    check_pad(nb_from_buffer(NB_I32, NB_SHAPE(2, 2), iv), NB_SHAPE(1, 1), NB_SHAPE(0, 2), 7);

    nb_tensor *x64 = randn64(NB_SHAPE(2, 3, 4), 122);
    GRADCHECK(gc_fn, GC_PAD, NULL, x64);
    GRADCHECK(gc_second, GC_PAD, NULL, x64);
    nb_tensor *y64 = randn64(NB_SHAPE(3, 2), 123);
    GRADCHECK(gc_fn, GC_PAD_T, NULL, y64);
}

static void test_stop_gradient(void)
{
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 131);
    double *xv = check_values(x);
    nb_tape *tape = nb_tape_begin_persistent();
    nb_tape_watch(tape, x);
    nb_tensor *s = nb_stop_gradient(x);
    CHECK(s && s != x && has_shape(s, NB_SHAPE(2, 3)));
    CHECK_EXACT(s, xv, 6);
    /* d/dx sum(sg(x) * x) = x, not 2x. */
    nb_tensor *l = nb_sum_all(nb_mul(s, x));
    nb_tensor *g = NULL;
    CHECK_OK(nb_tape_gradient(tape, l, NB_TENSORS(x), &g));
    CHECK(check_max_error(g, xv, 6) <= 1e-15);
    /* Nothing flows through it alone. */
    CHECK_OK(nb_tape_gradient(tape, nb_sum_all(nb_stop_gradient(nb_transpose(x, 0, 1))), NB_TENSORS(x), &g));
    CHECK(g == NULL);
    free(xv);
}

/* ---- devices ----------------------------------------------------------------------------- */

static int warnings;
static void count_log(nb_log_level level, const char *message, void *user)
{
    (void)message;
    (void)user;
    warnings += level == NB_LOG_WARNING;
}

static void test_devices(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3), 141);
    double *xv = check_values(x);
    CHECK(nb_to_device(x, "/cpu:0") == x);
    if (nb_device_count(NB_DEVICE_CPU) >= 2) {
        nb_tensor *y = nb_to_device(x, "/cpu:1");
        CHECK(y && y != x && strcmp(nb_tensor_device(y), "/cpu:1") == 0);
        CHECK_EXACT(y, xv, 6);
        /* A strided source is made contiguous first. */
        nb_tensor *yt = nb_to_device(nb_transpose(x, 0, 1), "/cpu:1");
        double ref[6];
        ref_permute(xv, 2, (int64_t[]){2, 3}, (int[]){1, 0}, ref);
        CHECK(strcmp(nb_tensor_device(yt), "/cpu:1") == 0);
        CHECK_EXACT(yt, ref, 6);
        /* With a device pushed, inputs are copied there; with none, two devices clash. */
        nb_device_push("/cpu:1");
        nb_tensor *c = nb_concat(NB_TENSORS(x, y), 0);
        nb_device_pop();
        CHECK(c && strcmp(nb_tensor_device(c), "/cpu:1") == 0 && has_shape(c, NB_SHAPE(4, 3)));
        CHECK(nb_concat(NB_TENSORS(x, y), 0) == NULL);
        CHECK_ERROR(NB_ERR_DEVICE, "concat", "/cpu:0", "/cpu:1");

        /* Gradients come back across devices, to the source's device. */
        nb_tensor *a = randn64(NB_SHAPE(2, 3), 142), *b = randn64(NB_SHAPE(2, 3), 143);
        nb_tape *tape = nb_tape_begin();
        nb_tape_watch(tape, a);
        nb_tensor *g = NULL;
        CHECK_OK(nb_tape_gradient(tape, nb_sum_all(nb_to_device(a, "/cpu:1")), NB_TENSORS(a), &g));
        CHECK(g && strcmp(nb_tensor_device(g), "/cpu:0") == 0);
        GRADCHECK(gc_fn, GC_TO_DEVICE, NULL, a, b);
        GRADCHECK(gc_second, GC_TO_DEVICE, NULL, a, b);
        GRADCHECK(gc_fn, GC_PUSHED_CONCAT, NULL, a, b);
    } else {
        fprintf(stderr, "test_devices: one CPU device only; cross-device copies not tested\n");
    }
    /* Soft placement: a missing GPU means the CPU, with a warning. */
    if (nb_device_count(NB_DEVICE_GPU) < 8) {
        nb_log_callback old = nb_set_log_callback(count_log, NULL);
        warnings = 0;
        CHECK(nb_to_device(x, "/gpu:7") == x);
        CHECK(warnings == 1);
        nb_set_log_callback(old, NULL);
        bool soft = nb_set_soft_placement(false);
        CHECK(nb_to_device(x, "/gpu:7") == NULL);
        CHECK_ERROR(NB_ERR_DEVICE, "/gpu:7");
        nb_set_soft_placement(soft);
    }
    CHECK(nb_to_device(x, "/tpu:0") == NULL);
    CHECK_ERROR(NB_ERR_DEVICE, "/tpu:0");
    free(xv);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_errors(void)
{
    nb_tensor *x = randn(NB_F32, NB_SHAPE(2, 3), 151);
    nb_tensor *d = randn64(NB_SHAPE(2, 3), 152);

    CHECK(nb_reshape(x, NB_SHAPE(4, 2)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape", "[2, 3]", "[4, 2]");
    CHECK(nb_reshape(x, NB_SHAPE(4, -1)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape", "[2, 3]", "[4, -1]");
    CHECK(nb_reshape(x, NB_SHAPE(-1, -1)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "reshape", "-1");

    CHECK(nb_transpose(x, 0, 5) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "transpose", "axis 5", "2-d");
    CHECK(nb_permute(x, NB_AXES(1, 1)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "permute", "repeated");
    CHECK(nb_permute(x, NB_AXES(1)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "permute", "1 axes", "2-d");
    CHECK(nb_expand_dims(x, 3) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "expand_dims", "axis 3");
    CHECK(nb_squeeze(x, 1) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "squeeze", "dim 1", "[2, 3]");
    CHECK(nb_squeeze(x, -3) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "squeeze", "axis -3");

    CHECK(nb_slice(x, NB_SHAPE(0, 2), NB_SHAPE(2, 2)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "slice", "dim 1", "[2, 3]");
    CHECK(nb_slice(x, NB_SHAPE(3, 0), NB_SHAPE(-1, 1)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "slice", "dim 0");
    CHECK(nb_slice(x, NB_SHAPE(0), NB_SHAPE(1)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "slice", "[2, 3]");

    CHECK(nb_broadcast_to(x, NB_SHAPE(2, 4)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "broadcast_to", "[2, 3]", "[2, 4]");
    CHECK(nb_broadcast_to(x, NB_SHAPE(3)) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "broadcast_to", "[2, 3]", "[3]");

    nb_tensor *y = randn(NB_F32, NB_SHAPE(3, 2), 153);
    CHECK(nb_concat(NB_TENSORS(x, y), 0) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "concat", "input 1", "[3, 2]", "[2, 3]");
    CHECK(nb_concat(NB_TENSORS(x, d), 0) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "concat", "f32", "f64");
    CHECK(nb_concat(NB_TENSORS(x, x), 2) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "concat", "axis 2");
    CHECK(nb_concat(0, NULL, 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "concat");
    CHECK(nb_stack(NB_TENSORS(x, y), 0) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "stack", "[3, 2]", "[2, 3]");
    CHECK(nb_stack(NB_TENSORS(x, x), 3) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stack", "axis 3");

    nb_tensor *p[4];
    CHECK(nb_split(x, 2, NULL, 1, p) == NB_ERR_SHAPE && p[0] == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "split", "[2, 3]", "2 equal");
    CHECK(nb_split(x, 2, (int64_t[]){1, 1}, 1, p) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "split", "sum to 2", "size 3");
    CHECK(nb_split(x, 2, NULL, -3, p) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "split", "axis -3");

    const int64_t bad[3] = {0, 5, 1};
    nb_tensor *ix = nb_from_buffer(NB_I64, NB_SHAPE(3), bad);
    CHECK(nb_gather(x, ix) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather");
    const int64_t neg[2] = {1, -1};
    CHECK(nb_gather(x, nb_from_buffer(NB_I64, NB_SHAPE(2), neg)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather");
    CHECK(nb_gather(x, d) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "gather", "indices", "f64");
    CHECK(nb_gather(nb_scalar(NB_F32, 2.5), ix) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "gather", "[]");
    CHECK(nb_one_hot(ix, 0, NB_F32) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "one_hot", "depth 0");
    CHECK(nb_one_hot(x, 3, NB_F32) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "one_hot", "f32");

    CHECK(nb_pad(x, NB_SHAPE(1), NB_SHAPE(1), 0) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "pad", "[2, 3]");
    CHECK(nb_pad(x, NB_SHAPE(1, -1), NB_SHAPE(0, 0), 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "pad", "dim 1");
    CHECK(nb_cast(x, NB_DTYPE_COUNT) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "cast");

    /* A NULL input keeps the first error through a chain. */
    nb_tensor *z = nb_reshape(x, NB_SHAPE(5));
    z = nb_transpose(nb_slice(nb_pad(nb_cast(nb_contiguous(nb_expand_dims(z, 0)), NB_F64), NB_SHAPE(1, 1),
                                     NB_SHAPE(1, 1), 0),
                              NB_SHAPE(0, 0), NB_SHAPE(1, 1)),
                     0, 1);
    z = nb_concat(NB_TENSORS(x, z), 0);
    z = nb_gather(z, ix);
    z = nb_stop_gradient(nb_broadcast_to(nb_squeeze(nb_permute(z, NB_AXES(0)), 0), NB_SHAPE(2)));
    z = nb_stack(NB_TENSORS(z), 0);
    CHECK(nb_split(z, 1, NULL, 0, p) != NB_OK);
    CHECK(z == NULL && nb_one_hot(z, 2, NB_F32) == NULL && nb_to_device(z, "/cpu:0") == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "reshape", "[2, 3]", "[5]");
    /* With no error pending, a NULL input is an error of its own. */
    CHECK(nb_slice(NULL, NB_SHAPE(0), NB_SHAPE(1)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "slice", "NULL");
    CHECK(nb_concat(NB_TENSORS(x, NULL), 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "concat", "input 1");
}

/* Float-to-integer casts have one rule on every device: truncate toward zero,
 * saturate at the type's range, NaN to 0 (u8 through i32, wrapping). */
static void test_cast_saturates(void)
{
    const float v[7] = {1e20f, -1e20f, NAN, INFINITY, -2.7f, 2.7f, 300.0f};
    nb_tensor *x = nb_from_buffer(NB_F32, NB_SHAPE(7), v);
    const double want32[7] = {2147483647.0, -2147483648.0, 0, 2147483647.0, -2, 2, 300};
    const double want64[7] = {9223372036854775807.0, -9223372036854775808.0, 0, 9223372036854775807.0, -2, 2, 300};
    const double want8[7] = {255, 0, 0, 255, 254, 2, 44};
    nb_tensor *i32 = nb_cast(x, NB_I32), *i64 = nb_cast(x, NB_I64), *u8 = nb_cast(x, NB_U8);
    for (int i = 0; i < 7; i++) {
        CHECK(nb_tensor_get(i32, i) == want32[i]);
        CHECK(nb_tensor_get(i64, i) == want64[i]);
        CHECK(nb_tensor_get(u8, i) == want8[i]);
    }
    nb_tensor *d = nb_cast(nb_cast(x, NB_F64), NB_I32);
    CHECK(nb_tensor_get(d, 0) == 2147483647.0 && nb_tensor_get(d, 2) == 0);
}

/* A bool is read as x != 0: a byte other than 0 and 1, from memory taken in
 * from elsewhere, converts as true to every dtype (as the GPU converts it). */
static void test_cast_bool_bytes(void)
{
    const uint8_t bytes[4] = {0, 1, 2, 255};
    nb_tensor *b = nb_from_buffer(NB_BOOL, NB_SHAPE(4), bytes);
    const nb_dtype to[6] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_U8, NB_F16};
    for (int t = 0; t < 6; t++) {
        nb_tensor *c = nb_cast(b, to[t]);
        nb_tensor *w = to[t] == NB_F16 ? nb_cast(c, NB_F64) : c;
        for (int i = 0; i < 4; i++)
            CHECKF(w && nb_tensor_get(w, i) == (bytes[i] != 0), "bool byte %d to %s: %g", bytes[i],
                   nb_dtype_name(to[t]), w ? nb_tensor_get(w, i) : -1.0);
    }
    nb_tensor *strided = nb_cast(nb_slice(b, NB_SHAPE(1), NB_SHAPE(3)), NB_I64);
    CHECK(strided && nb_tensor_get(strided, 1) == 1 && nb_tensor_get(strided, 2) == 1);
}

/* A reshape whose element count overflows int64 is refused (it used to wrap
 * to the input's count and give a view that reads out of bounds). */
static void test_reshape_overflow(void)
{
    const int64_t big = ((int64_t)1 << 62) + 1;
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(4));
    CHECK(nb_reshape(x, NB_SHAPE(big, 4)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "reshape", "more elements");
    CHECK(nb_reshape(x, NB_SHAPE(-1, big, 4)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "reshape");
    nb_tensor *e = nb_zeros(NB_F32, NB_SHAPE(0));
    nb_tensor *r = nb_reshape(e, NB_SHAPE(5, 0, 3)); /* zero elements either way */
    CHECK(r && nb_tensor_numel(r) == 0);
    /* Zero elements, but dims whose product (the zero aside) passes int64
     * bytes: refused like any other order of those dims, since the strides of
     * the view would overflow. */
    CHECK(nb_reshape(e, NB_SHAPE(big, 0, 3)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "reshape", "[4611686018427387905, 0, 3]", "too large");
    CHECK(nb_reshape(e, NB_SHAPE(0, (int64_t)1 << 40, (int64_t)1 << 40)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "reshape", "[0, 1099511627776, 1099511627776]", "too large");
    /* padding past int64, or past memory, is refused before anything is written */
    CHECK(nb_pad(x, NB_SHAPE(INT64_MAX), NB_SHAPE(INT64_MAX), 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "pad", "dim 0", "[4]");
    CHECK(nb_pad(x, NB_SHAPE((int64_t)1 << 62), NB_SHAPE(0), 0) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "f32");
    /* a shape claiming more than 8 dims: its messages never read past dims[8] */
    nb_shape bad = NB_SHAPE(4);
    bad.ndim = 1000;
    char buf[64];
    CHECK(strcmp(nb_shape_format(bad, buf, sizeof buf), "(a shape of 1000 dims)") == 0);
    CHECK(nb_broadcast_to(x, bad) == NULL);
    CHECK(nb_error() != NB_OK);
    nb_error_clear();
    CHECK(nb_slice(x, bad, bad) == NULL);
    CHECK(nb_error() != NB_OK);
    nb_error_clear();
    CHECK(nb_pad(x, bad, bad, 0) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "pad", "1000 dims");
}

/* Shapes past int64 from views: every op that makes a shape checks it first. */
static void test_shape_overflow(void)
{
    const int64_t e62 = (int64_t)1 << 62, e40 = (int64_t)1 << 40;
    nb_tensor *one = nb_ones(NB_U8, NB_SHAPE(1));

    /* broadcast_to: a view of 2^64 elements had numel -1. */
    CHECK(nb_broadcast_to(one, NB_SHAPE((int64_t)1 << 32, (int64_t)1 << 32)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "broadcast_to", "[4294967296, 4294967296]", "too large");
    CHECK(nb_broadcast_to(nb_ones(NB_F32, NB_SHAPE(1)), NB_SHAPE(0, e62, 4)) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "broadcast_to", "[0, 4611686018427387904, 4]", "f32");

    /* concat and stack of views whose sizes overflow: the axis sum wrapped
     * (signed overflow) before anything else was checked. */
    nb_tensor *big = nb_broadcast_to(one, NB_SHAPE(e62)); /* 2^62 one-byte elements, no storage */
    CHECK(big && nb_tensor_numel(big) == e62 && !nb_tensor_is_contiguous(big));
    CHECK(nb_concat(NB_TENSORS(big, big), 0) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "concat", "dim 0", "[4611686018427387904]", "past int64");
    CHECK(nb_stack(NB_TENSORS(big, big), 0) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "stack", "[2, 4611686018427387904]", "u8");
    nb_tensor *wide = nb_broadcast_to(nb_ones(NB_I32, NB_SHAPE(1, 1)), NB_SHAPE(0, e40));
    nb_tensor *w3 = nb_stack(NB_TENSORS(wide, wide, wide), 2); /* [0, 2^40, 3] fits */
    CHECK(w3 && nb_tensor_numel(w3) == 0 && nb_tensor_dim(w3, 2) == 3);
    nb_tensor *tall = nb_broadcast_to(nb_ones(NB_I32, NB_SHAPE(1, 1)), NB_SHAPE(0, e62 / 4));
    CHECK(nb_stack(NB_TENSORS(tall, tall), 1) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "stack", "[0, 2, 1152921504606846976]", "too large");

    /* gather: indices.shape + params.shape[1:] checked before any copy of a
     * non-contiguous params (which here would be 8 TB). */
    nb_tensor *params = nb_broadcast_to(nb_ones(NB_I32, NB_SHAPE(2, 1)), NB_SHAPE(2, e40));
    nb_tensor *ix = nb_broadcast_to(nb_zeros(NB_I64, NB_SHAPE(1)), NB_SHAPE((int64_t)1 << 30));
    CHECK(nb_gather(params, ix) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "gather", "[1073741824, 1099511627776]", "i32");
    nb_tensor *no_ix = nb_broadcast_to(nb_zeros(NB_I64, NB_SHAPE(1, 1)), NB_SHAPE(0, e40));
    CHECK(nb_gather(params, no_ix) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "[0, 1099511627776, 1099511627776]", "too large");

    /* one_hot: a depth past memory, or past int64 beside empty indices. */
    nb_tensor *three = nb_zeros(NB_I64, NB_SHAPE(3)), *none = nb_zeros(NB_I64, NB_SHAPE(0));
    CHECK(nb_one_hot(three, e62, NB_F32) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "one_hot", "[3, 4611686018427387904]", "f32");
    CHECK(nb_one_hot(three, INT64_MAX, NB_U8) == NULL);
    CHECK_ERROR(NB_ERR_OUT_OF_MEMORY, "one_hot", "[3, 9223372036854775807]");
    CHECK(nb_one_hot(none, e62, NB_F64) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "one_hot", "[0, 4611686018427387904]", "too large");
    nb_tensor *oh = nb_one_hot(none, e40, NB_U8); /* empty, and its dims fit */
    CHECK(oh && nb_tensor_numel(oh) == 0 && nb_tensor_dim(oh, 1) == e40);

    /* split: sizes that sum past int64 (they wrapped to the dim's size). */
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(4)), *p[3];
    CHECK(nb_split(x, 3, (int64_t[]){INT64_MAX, INT64_MAX, 6}, 0, p) == NB_ERR_SHAPE && p[0] == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "split", "piece 0", "size 4", "[4]");
    CHECK(nb_split(x, 3, (int64_t[]){3, INT64_MAX, 2}, 0, p) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "split", "piece 1");

    /* An empty slice that begins past every dim's end: its offset sum would
     * pass int64 ([1, 0, 2^60] f32 has strides [2^62, 2^62, 4]). */
    nb_tensor *z = nb_zeros(NB_F32, NB_SHAPE(1, 0, (int64_t)1 << 60));
    nb_tensor *s = nb_slice(z, NB_SHAPE(1, 0, (int64_t)1 << 60), NB_SHAPE(0, 0, 0));
    CHECK(s && nb_tensor_numel(s) == 0 && nb_tensor_ndim(s) == 3);
}

/* concat and stack copy non-contiguous inputs (transposed, sliced, broadcast)
 * into place with their values. */
static void test_join_views(void)
{
    const float v[6] = {0, 1, 2, 3, 4, 5};
    nb_tensor *a = nb_from_buffer(NB_F32, NB_SHAPE(2, 3), v);
    nb_tensor *t = nb_transpose(a, 0, 1);                                  /* [3, 2] */
    nb_tensor *sl = nb_slice(a, NB_SHAPE(0, 1), NB_SHAPE(2, 2));           /* [2, 2]: 1 2 / 4 5 */
    nb_tensor *bc = nb_broadcast_to(nb_scalar(NB_F32, 9), NB_SHAPE(3, 2)); /* all 9 */
    CHECK(!nb_tensor_is_contiguous(t) && !nb_tensor_is_contiguous(sl) && !nb_tensor_is_contiguous(bc));
    nb_tensor *c = nb_concat(NB_TENSORS(t, nb_transpose(sl, 0, 1), bc), 0); /* [8, 2] */
    const double want_c[16] = {0, 3, 1, 4, 2, 5, 1, 4, 2, 5, 9, 9, 9, 9, 9, 9};
    CHECK(has_shape(c, NB_SHAPE(8, 2)) && check_max_error(c, want_c, 16) == 0);
    nb_tensor *st = nb_stack(NB_TENSORS(t, bc), 1); /* [3, 2, 2] */
    const double want_s[12] = {0, 3, 9, 9, 1, 4, 9, 9, 2, 5, 9, 9};
    CHECK(has_shape(st, NB_SHAPE(3, 2, 2)) && check_max_error(st, want_s, 12) == 0);
}

int main(void)
{
    /* Two logical CPUs, before any device is used, for the cross-device cases. */
    nb_set_logical_cpu_devices(2);
    nb_error_clear();
    RUN(test_reshape);
    RUN(test_transpose_permute);
    RUN(test_expand_squeeze);
    RUN(test_slice);
    RUN(test_broadcast_to);
    RUN(test_contiguous);
    RUN(test_concat);
    RUN(test_stack);
    RUN(test_split);
    RUN(test_gather);
    RUN(test_one_hot);
    RUN(test_cast);
    RUN(test_pad);
    RUN(test_stop_gradient);
    RUN(test_devices);
    RUN(test_errors);
    RUN(test_cast_saturates);
    RUN(test_cast_bool_bytes);
    RUN(test_reshape_overflow);
    RUN(test_shape_overflow);
    RUN(test_join_views);
    return check_finish();
}
