/* Indexing ops: gather (rows of params picked by integer indices), its gradient
 * scatter_add, and one_hot. Outputs are checked by nb__shape_fits first. */
#include "op.h"

#include <string.h>

/* ---- gather ------------------------------------------------------------------- */

static nb_status gather_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__scatter_add(n->in[1], g[0], SHAPE_OF(n->in[0]));
    gi[1] = NULL; /* indices get no gradient */
    return nb__ok(gi[0]);
}

static const nb_op_def gather_def = {.name = "gather", .grad = gather_grad};

nb_tensor *nb_gather(const nb_tensor *params, const nb_tensor *indices)
{
    const char *op = gather_def.name;
    if (!params)
        return nb__null_input(op, 0);
    if (!indices)
        return nb__null_input(op, 1);
    if (nb__check_dtype(op, "params", params, NB_NUMERIC) || nb__check_dtype(op, "indices", indices, NB_INTS))
        return NULL;
    char sp[NB_SHAPE_STR_MAX], si[NB_SHAPE_STR_MAX];
    int ndim = indices->ndim + params->ndim - 1;
    if (params->ndim < 1 || ndim > NB_MAX_DIMS)
        return nb__fail_null(NB_ERR_SHAPE, "%s: cannot gather rows of params %s with indices %s%s", op,
                             nb__shape_str(SHAPE_OF(params), sp, sizeof sp),
                             nb__shape_str(SHAPE_OF(indices), si, sizeof si),
                             params->ndim < 1 ? " (params need at least 1 dim)" : " (too many dims)");
    const nb_tensor *in[2] = {params, indices};
    nb_device *dev = nb__op_place_kernel(op, 2, in, NB_K_GATHER, 0, params->dtype);
    if (!dev)
        return NULL;
    int64_t shape[NB_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    memcpy(shape + indices->ndim, params->shape + 1, sizeof(int64_t) * (size_t)(params->ndim - 1));
    if (!nb__shape_fits(op, true, params->dtype, ndim, shape))
        return NULL;
    nb_tensor *out = nb__out(op, dev, params->dtype, ndim, shape);
    if (!out)
        return NULL;
    if (out->numel) {
        nb_tensor *tp, *ti;
        const nb_tensor *p = nb__dense(op, in[0], &tp);
        const nb_tensor *ix = p ? nb__dense(op, in[1], &ti) : NULL;
        if (ix) {
            nb_view vo = nb__view(out), vp = nb__view(p), vi = nb__view(ix);
            out = nb__kernel_done(dev->backend->gather(dev, op, &vo, &vp, &vi), out);
        } else {
            nb__release(out);
            out = NULL;
        }
        nb__release(tp);
        if (p)
            nb__release(ti);
    } else if (in[1]->numel) {
        /* Rows of no elements ([5, 0] params): nothing to move, but the
         * indices are still checked (queued on a GPU, as the kernel's are). */
        nb_tensor *ti;
        const nb_tensor *ix = nb__dense(op, in[1], &ti);
        nb_view vi = ix ? nb__view(ix) : (nb_view){0};
        if (!ix || dev->backend->check_indices(dev, op, &vi, params->shape[0])) {
            nb__release(out);
            out = NULL;
        }
        if (ix)
            nb__release(ti);
    }
    return nb__finish(&gather_def, 2, in, out, NULL);
}

/* ---- scatter_add (gather's gradient) ------------------------------------------ */

static nb_status scatter_add_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = NULL;
    gi[1] = nb_gather(g[0], n->in[0]);
    return nb__ok(gi[1]);
}

static const nb_op_def scatter_add_def = {.name = "scatter_add", .grad = scatter_add_grad};

nb_tensor *nb__scatter_add(const nb_tensor *indices, const nb_tensor *updates, int ndim, const int64_t *shape)
{
    const char *op = scatter_add_def.name;
    if (!indices)
        return nb__null_input(op, 0);
    if (!updates)
        return nb__null_input(op, 1);
    if (nb__check_dtype(op, "indices", indices, NB_INTS) || nb__check_dtype(op, "updates", updates, NB_NUMERIC))
        return NULL;
    char si[NB_SHAPE_STR_MAX], su[NB_SHAPE_STR_MAX], so[NB_SHAPE_STR_MAX];
    bool fits = ndim >= 1 && ndim <= NB_MAX_DIMS && updates->ndim == indices->ndim + ndim - 1;
    for (int i = 0; fits && i < updates->ndim; i++)
        fits = updates->shape[i] == (i < indices->ndim ? indices->shape[i] : shape[i - indices->ndim + 1]);
    if (!fits)
        return nb__fail_null(NB_ERR_SHAPE, "%s: updates %s do not fit indices %s into %s", op,
                             nb__shape_str(SHAPE_OF(updates), su, sizeof su),
                             nb__shape_str(SHAPE_OF(indices), si, sizeof si),
                             nb__shape_str(ndim, shape, so, sizeof so));
    const nb_tensor *in[2] = {indices, updates};
    nb_device *dev = nb__op_place_kernel(op, 2, in, NB_K_SCATTER_ADD, 0, updates->dtype);
    if (!dev)
        return NULL;
    nb_tensor *out = nb__out(op, dev, updates->dtype, ndim, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out);
    if (out->numel)
        out = nb__kernel_done(dev->backend->fill(dev, &vo, 0.0), out);
    if (out && updates->numel) {
        nb_tensor *ti, *tu;
        const nb_tensor *ix = nb__dense(op, in[0], &ti);
        const nb_tensor *u = ix ? nb__dense(op, in[1], &tu) : NULL;
        if (u) {
            nb_view vi = nb__view(ix), vu = nb__view(u);
            out = nb__kernel_done(dev->backend->scatter_add(dev, op, &vo, &vi, &vu), out);
        } else {
            nb__release(out);
            out = NULL;
        }
        nb__release(ti);
        if (ix)
            nb__release(tu);
    }
    return nb__finish(&scatter_add_def, 2, in, out, NULL);
}

/* ---- one_hot ------------------------------------------------------------------ */

nb_tensor *nb_one_hot(const nb_tensor *indices, int64_t depth, nb_dtype dtype)
{
    const char *op = "one_hot";
    if (!indices)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "indices", indices, NB_INTS))
        return NULL;
    if ((unsigned)dtype >= NB_DTYPE_COUNT)
        return nb__fail_null(NB_ERR_DTYPE, "%s: %d is not a dtype", op, (int)dtype);
    if (depth < 1)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: depth %lld must be at least 1", op, (long long)depth);
    if (indices->ndim >= NB_MAX_DIMS) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: indices %s already have the most dims (%d)", op,
                             nb__shape_str(SHAPE_OF(indices), s, sizeof s), NB_MAX_DIMS);
    }
    const nb_tensor *in[1] = {indices};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_ONE_HOT, 0, indices->dtype);
    if (!dev)
        return NULL;
    if (!nb__supports(dev, NB_K_ONE_HOT, 0, dtype)) /* the CPU holds f16 and bf16, computes in neither */
        return nb__fail_null(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", op, nb_dtype_name(dtype), dev->name);
    int64_t shape[NB_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = depth;
    if (!nb__shape_fits(op, true, dtype, indices->ndim + 1, shape))
        return NULL;
    nb_tensor *out = nb__out(op, dev, dtype, indices->ndim + 1, shape);
    if (!out || !out->numel)
        return nb__own(out);
    nb_tensor *tmp;
    const nb_tensor *ix = nb__dense(op, in[0], &tmp);
    if (!ix) {
        nb__release(out);
        return NULL;
    }
    nb_view vo = nb__view(out), vi = nb__view(ix);
    out = nb__kernel_done(dev->backend->one_hot(dev, &vo, &vi, 1.0, 0.0), out);
    nb__release(tmp);
    /* Not differentiable: integer indices are never watched, so nothing records. */
    return nb__own(out);
}
