/* Matrix products: batched, broadcasting batch dims, transposed views in place. */
#include "op.h"

static nb_status matmul_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *a = n->in[0], *b = n->in[1];
    /* A constant operand (data, usually) gets no product at all. */
    if (nb__needs_grad(n, 0) && !(gi[0] = nb__sum_to(nb_matmul(g[0], nb_transpose(b, -1, -2)), a->ndim, a->shape)))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 1) && !(gi[1] = nb__sum_to(nb_matmul(nb_transpose(a, -1, -2), g[0]), b->ndim, b->shape)))
        return nb__ok(NULL);
    return NB_OK;
}

static const nb_op_def matmul_def = {.name = "matmul", .grad = matmul_grad};

/* True when the last two dims have unit stride on one of them (a BLAS layout). */
static bool blas_layout(const nb_tensor *t)
{
    int64_t es = (int64_t)nb_dtype_size(t->dtype);
    int64_t rs = t->strides[t->ndim - 2], cs = t->strides[t->ndim - 1];
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    return (cs == es && (rs >= cols * es || rows == 1)) || (rs == es && (cs >= rows * es || cols == 1));
}

static nb_tensor *matmul_core(const nb_tensor *a, const nb_tensor *b)
{
    const char *op = "matmul";
    const nb_tensor *in[2] = {a, b};
    nb_device *dev = nb__op_place_kernel(op, 2, in, NB_K_MATMUL, 0, a->dtype);
    if (!dev)
        return NULL;
    a = in[0];
    b = in[1];
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
    int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
    char sa[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX];
    if (K != K2)
        return nb__fail_null(NB_ERR_SHAPE, "matmul: inner dims differ: %s x %s (%lld vs %lld)",
                             nb__shape_str(a->ndim, a->shape, sa, sizeof sa), nb__shape_str(b->ndim, b->shape, sb, sizeof sb),
                             (long long)K, (long long)K2);
    /* Broadcast the batch dims. */
    int nd = (a->ndim > b->ndim ? a->ndim : b->ndim);
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return nb__fail_null(NB_ERR_SHAPE, "matmul: batch dims of %s and %s do not broadcast",
                                 nb__shape_str(a->ndim, a->shape, sa, sizeof sa),
                                 nb__shape_str(b->ndim, b->shape, sb, sizeof sb));
        shape[i] = da == 1 ? db : da;
    }
    shape[nd - 2] = M;
    shape[nd - 1] = N;
    /* Strided operands that BLAS cannot take are copied (the copy is recorded). */
    if (!blas_layout(a) && !(a = in[0] = nb_contiguous(a)))
        return NULL;
    if (!blas_layout(b) && !(b = in[1] = nb_contiguous(b)))
        return NULL;
    nb_tensor *out = nb__out(op, dev, a->dtype, nd, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out);
    nb_status st;
    if (K == 0) {
        st = dev->backend->fill(dev, &vo, 0.0);
    } else {
        int64_t sha[NB_MAX_DIMS], shb[NB_MAX_DIMS];
        for (int i = 0; i < nd - 2; i++)
            sha[i] = shb[i] = shape[i];
        sha[nd - 2] = M, sha[nd - 1] = K, shb[nd - 2] = K, shb[nd - 1] = N;
        nb_view va = nb__view_broadcast(a, nd, sha), vb = nb__view_broadcast(b, nd, shb);
        st = dev->backend->matmul(dev, &vo, &va, &vb);
    }
    out = nb__kernel_done(st, out);
    return nb__finish(&matmul_def, 2, in, out, NULL);
}

nb_tensor *nb_matmul(const nb_tensor *a, const nb_tensor *b)
{
    const char *op = "matmul";
    if (!a)
        return nb__null_input(op, 0);
    if (!b)
        return nb__null_input(op, 1);
    if (nb__check_same_dtype(op, a, b) || nb__check_dtype(op, "input", a, NB_FLOATS))
        return NULL;
    if (a->ndim == 0 || b->ndim == 0)
        return nb__fail_null(NB_ERR_SHAPE, "matmul: operands must have at least 1 dim, got %d-d and %d-d",
                             a->ndim, b->ndim);
    if (a->ndim >= 2 && b->ndim >= 2)
        return matmul_core(a, b);
    /* A vector operand becomes a 1-row (a) or 1-column (b) matrix, dropped after. */
    const nb_tensor *a2 = a, *b2 = b;
    if (a->ndim == 1)
        a2 = nb_expand_dims(a, 0);
    if (b->ndim == 1)
        b2 = nb_expand_dims(b, 1);
    nb_tensor *y = matmul_core(a2, b2);
    /* Drop a's row dim first: with both vectors [1, 1] -> [1] -> []. */
    if (y && a->ndim == 1)
        y = nb_squeeze(y, -2);
    if (y && b->ndim == 1)
        y = nb_squeeze(y, -1);
    return y;
}
