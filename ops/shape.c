/* Shape ops: reshape, transpose/permute, expand_dims/squeeze, slice,
 * broadcast_to, contiguous, concat/stack and split, with their gradients.
 * Most are views of their input's storage; concat, stack and the copying cases
 * of reshape and contiguous go through the backend's strided `copy` kernel.
 * Every shape an op makes obeys one rule (NumPy's): its dims, a zero dim
 * counted as 1, times the element size fit in int64, so strides never
 * overflow, even those of an empty tensor. */
#include "op.h"

#include <stdlib.h>
#include <string.h>

static nb_shape shape_of(const nb_tensor *t)
{
    nb_shape s = {t->ndim, {0}};
    memcpy(s.dims, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return s;
}

/* Copies in (any strides) into a fresh contiguous tensor of in's shape laid out
 * as (ndim, shape) -- the same number of elements. Not scoped (refs = 1). */
static nb_tensor *copy_contiguous(const char *op, nb_device *dev, const nb_tensor *in, int ndim,
                                  const int64_t *shape)
{
    nb_tensor *out = nb__out(op, dev, in->dtype, ndim, shape);
    if (!out || in->numel == 0)
        return out;
    /* The kernel sees out with in's shape: both are row-major with no gaps. */
    nb_view vo = nb__view(out), vi = nb__view(in);
    vo.ndim = in->ndim;
    memcpy(vo.shape, in->shape, sizeof(int64_t) * (size_t)in->ndim);
    nb__contiguous_strides(in->ndim, in->shape, nb_dtype_size(in->dtype), vo.strides);
    return nb__kernel_done(dev->backend->copy(dev, &vo, &vi), out);
}

/* Places a one-input view op; returns the (possibly moved) input or NULL. */
static const nb_tensor *place1(const char *op, const nb_tensor *x, const nb_tensor **in)
{
    in[0] = x;
    return nb__op_place(op, 1, in) ? in[0] : NULL;
}

/* place1 for an op whose output has the given shape: first checks that such
 * an output fits in memory. Returns NULL (error recorded) when it does not. */
static const nb_tensor *place1_as(const char *op, const nb_tensor *x, nb_shape shape, const nb_tensor **in)
{
    if (!nb__shape_fits(op, false, x->dtype, shape.ndim, shape.dims))
        return NULL;
    return place1(op, x, in);
}

/* ---- reshape ------------------------------------------------------------------ */

static nb_status reshape_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb_reshape(g[0], shape_of(n->in[0]));
    return nb__ok(gi[0]);
}

static const nb_op_def reshape_def = {.name = "reshape", .grad = reshape_grad};

nb_tensor *nb_reshape(const nb_tensor *x, nb_shape shape)
{
    const char *op = "reshape";
    if (!x)
        return nb__null_input(op, 0);
    if (shape.ndim < 0 || shape.ndim > NB_MAX_DIMS)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d dims requested; at most %d are allowed", op, shape.ndim,
                             NB_MAX_DIMS);
    char sx[NB_SHAPE_STR_MAX], ss[NB_SHAPE_STR_MAX];
    int infer = -1;
    int64_t rest[NB_MAX_DIMS] = {0}; /* the given dims, the -1 left out */
    int n_rest = 0;
    for (int i = 0; i < shape.ndim; i++) {
        int64_t d = shape.dims[i];
        if (d == -1 && infer < 0) {
            infer = i;
        } else if (d < 0) {
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT,
                                 "%s: bad target shape %s (dims must be >= 0, with at most one -1)", op,
                                 nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss));
        } else {
            rest[n_rest++] = d;
        }
    }
    int64_t known = nb__shape_numel(n_rest, rest);
    if (known < 0)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: target shape %s has more elements than int64 can count", op,
                             nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss));
    if (infer >= 0) {
        if (known == 0 || x->numel % known != 0)
            return nb__fail_null(NB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) into %s", op,
                                 nb__shape_str(SHAPE_OF(x), sx, sizeof sx), (long long)x->numel,
                                 nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss));
        shape.dims[infer] = x->numel / known;
        known *= shape.dims[infer]; /* = x->numel: no overflow */
    }
    if (known != x->numel)
        return nb__fail_null(NB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) into %s (%lld elements)", op,
                             nb__shape_str(SHAPE_OF(x), sx, sizeof sx), (long long)x->numel,
                             nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss), (long long)known);
    const nb_tensor *in[1];
    const nb_tensor *src = place1_as(op, x, shape, in);
    if (!src)
        return NULL;
    nb_tensor *out;
    if (src->contiguous) {
        int64_t strides[NB_MAX_DIMS];
        nb__contiguous_strides(shape.ndim, shape.dims, nb_dtype_size(src->dtype), strides);
        out = nb__tensor_view(src, shape.ndim, shape.dims, strides, src->offset);
    } else {
        out = copy_contiguous(op, src->device, src, shape.ndim, shape.dims);
    }
    return nb__finish(&reshape_def, 1, in, out, NULL);
}

/* ---- transpose and permute ---------------------------------------------------- */

static nb_status permute_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_axes inv = {n->attrs.n, {0}};
    for (int i = 0; i < n->attrs.n; i++)
        inv.axes[n->attrs.i[i]] = i;
    gi[0] = nb_permute(g[0], inv);
    return nb__ok(gi[0]);
}

static const nb_op_def transpose_def = {.name = "transpose", .grad = permute_grad};
static const nb_op_def permute_def = {.name = "permute", .grad = permute_grad};

/* perm is already validated: a permutation of [0, x->ndim). */
static nb_tensor *permute_view(const nb_op_def *def, const nb_tensor *x, const int *perm)
{
    const nb_tensor *in[1];
    const nb_tensor *src = place1(def->name, x, in);
    if (!src)
        return NULL;
    int64_t shape[NB_MAX_DIMS], strides[NB_MAX_DIMS];
    nb_op_attrs attrs = {0};
    attrs.n = src->ndim;
    for (int i = 0; i < src->ndim; i++) {
        shape[i] = src->shape[perm[i]];
        strides[i] = src->strides[perm[i]];
        attrs.i[i] = perm[i];
    }
    nb_tensor *out = nb__tensor_view(src, src->ndim, shape, strides, src->offset);
    return nb__finish(def, 1, in, out, &attrs);
}

nb_tensor *nb_transpose(const nb_tensor *x, int dim0, int dim1)
{
    const char *op = transpose_def.name;
    if (!x)
        return nb__null_input(op, 0);
    int a = nb__axis(op, dim0, x->ndim);
    int b = a < 0 ? -1 : nb__axis(op, dim1, x->ndim);
    if (b < 0)
        return NULL;
    int perm[NB_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return permute_view(&transpose_def, x, perm);
}

nb_tensor *nb_permute(const nb_tensor *x, nb_axes axes)
{
    const char *op = permute_def.name;
    if (!x)
        return nb__null_input(op, 0);
    if (axes.n != x->ndim)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d axes given for a %d-d tensor; need a permutation of all %d",
                             op, axes.n, x->ndim, x->ndim);
    int perm[NB_MAX_DIMS], seen = 0;
    for (int i = 0; i < axes.n; i++) {
        int a = nb__axis(op, axes.axes[i], x->ndim);
        if (a < 0)
            return NULL;
        if (seen & (1 << a))
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is repeated", op, axes.axes[i]);
        seen |= 1 << a;
        perm[i] = a;
    }
    return permute_view(&permute_def, x, perm);
}

/* ---- expand_dims and squeeze -------------------------------------------------- */

static nb_status expand_dims_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb_squeeze(g[0], (int)n->attrs.i[0]);
    return nb__ok(gi[0]);
}

static nb_status squeeze_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb_expand_dims(g[0], (int)n->attrs.i[0]);
    return nb__ok(gi[0]);
}

static const nb_op_def expand_dims_def = {.name = "expand_dims", .grad = expand_dims_grad};
static const nb_op_def squeeze_def = {.name = "squeeze", .grad = squeeze_grad};

nb_tensor *nb_expand_dims(const nb_tensor *x, int axis)
{
    const char *op = expand_dims_def.name;
    if (!x)
        return nb__null_input(op, 0);
    if (x->ndim >= NB_MAX_DIMS) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: %s already has the most dims (%d)", op,
                             nb__shape_str(SHAPE_OF(x), s, sizeof s), NB_MAX_DIMS);
    }
    int a = nb__axis(op, axis, x->ndim + 1);
    if (a < 0)
        return NULL;
    const nb_tensor *in[1];
    const nb_tensor *src = place1(op, x, in);
    if (!src)
        return NULL;
    int64_t shape[NB_MAX_DIMS], strides[NB_MAX_DIMS];
    for (int i = 0, j = 0; i <= src->ndim; i++) {
        if (i == a) {
            /* A size-1 dim is never stepped along: its stride only has to look
             * row-major, and may be anything when that would overflow. */
            shape[i] = 1;
            strides[i] = (int64_t)nb_dtype_size(src->dtype);
            if (a < src->ndim &&
                __builtin_mul_overflow(src->strides[a], src->shape[a] ? src->shape[a] : 1, &strides[i]))
                strides[i] = (int64_t)nb_dtype_size(src->dtype);
        } else {
            shape[i] = src->shape[j];
            strides[i] = src->strides[j];
            j++;
        }
    }
    nb_op_attrs attrs = {0};
    attrs.i[0] = a;
    nb_tensor *out = nb__tensor_view(src, src->ndim + 1, shape, strides, src->offset);
    return nb__finish(&expand_dims_def, 1, in, out, &attrs);
}

nb_tensor *nb_squeeze(const nb_tensor *x, int axis)
{
    const char *op = squeeze_def.name;
    if (!x)
        return nb__null_input(op, 0);
    int a = nb__axis(op, axis, x->ndim);
    if (a < 0)
        return NULL;
    if (x->shape[a] != 1) {
        char s[NB_SHAPE_STR_MAX];
        return nb__fail_null(NB_ERR_SHAPE, "%s: dim %d of %s has size %lld, not 1", op, a,
                             nb__shape_str(SHAPE_OF(x), s, sizeof s), (long long)x->shape[a]);
    }
    const nb_tensor *in[1];
    const nb_tensor *src = place1(op, x, in);
    if (!src)
        return NULL;
    int64_t shape[NB_MAX_DIMS], strides[NB_MAX_DIMS];
    for (int i = 0, j = 0; i < src->ndim; i++) {
        if (i == a)
            continue;
        shape[j] = src->shape[i];
        strides[j] = src->strides[i];
        j++;
    }
    nb_op_attrs attrs = {0};
    attrs.i[0] = a;
    nb_tensor *out = nb__tensor_view(src, src->ndim - 1, shape, strides, src->offset);
    return nb__finish(&squeeze_def, 1, in, out, &attrs);
}

/* ---- slice -------------------------------------------------------------------- */

static nb_status slice_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    const nb_tensor *x = n->in[0];
    nb_shape before = {x->ndim, {0}}, after = {x->ndim, {0}};
    for (int i = 0; i < x->ndim; i++) {
        before.dims[i] = n->attrs.i[i];
        after.dims[i] = x->shape[i] - n->attrs.i[i] - n->attrs.i[NB_MAX_DIMS + i];
    }
    gi[0] = nb_pad(g[0], before, after, 0.0);
    return nb__ok(gi[0]);
}

static const nb_op_def slice_def = {.name = "slice", .grad = slice_grad};

nb_tensor *nb_slice(const nb_tensor *x, nb_shape begin, nb_shape size)
{
    const char *op = slice_def.name;
    if (!x)
        return nb__null_input(op, 0);
    char sx[NB_SHAPE_STR_MAX], sb[NB_SHAPE_STR_MAX], ss[NB_SHAPE_STR_MAX];
    if (begin.ndim != x->ndim || size.ndim != x->ndim)
        return nb__fail_null(NB_ERR_SHAPE, "%s: begin %s and size %s must each have one entry per dim of %s", op,
                             nb__shape_str(begin.ndim, begin.dims, sb, sizeof sb),
                             nb__shape_str(size.ndim, size.dims, ss, sizeof ss), nb__shape_str(SHAPE_OF(x), sx, sizeof sx));
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) {
        int64_t b = begin.dims[i], s = size.dims[i], d = x->shape[i];
        if (s == -1 && b >= 0 && b <= d)
            s = d - b;
        if (b < 0 || b > d || s < 0 || s > d - b)
            return nb__fail_null(NB_ERR_SHAPE, "%s: dim %d: begin %lld, size %lld is out of range for size %lld of %s",
                                 op, i, (long long)b, (long long)size.dims[i], (long long)d,
                                 nb__shape_str(SHAPE_OF(x), sx, sizeof sx));
        shape[i] = s;
    }
    const nb_tensor *in[1];
    const nb_tensor *src = place1(op, x, in);
    if (!src)
        return NULL;
    /* A non-empty slice starts at one of src's elements, so its offset is in
     * range; an empty one may begin past every dim's end, where the sum can
     * overflow, and reads nothing: it keeps src's offset. */
    int64_t offset = src->offset, step;
    bool empty = nb__shape_numel(src->ndim, shape) == 0, wrapped = false;
    nb_op_attrs attrs = {0};
    for (int i = 0; i < src->ndim; i++) {
        wrapped = wrapped || __builtin_mul_overflow(begin.dims[i], src->strides[i], &step) ||
                  __builtin_add_overflow(offset, step, &offset);
        attrs.i[i] = begin.dims[i];
        attrs.i[NB_MAX_DIMS + i] = shape[i];
    }
    if (empty || wrapped)
        offset = src->offset;
    nb_tensor *out = nb__tensor_view(src, src->ndim, shape, src->strides, offset);
    return nb__finish(&slice_def, 1, in, out, &attrs);
}

/* ---- broadcast_to ------------------------------------------------------------- */

static nb_status broadcast_to_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__sum_to(g[0], SHAPE_OF(n->in[0]));
    return nb__ok(gi[0]);
}

static const nb_op_def broadcast_to_def = {.name = "broadcast_to", .grad = broadcast_to_grad};

nb_tensor *nb_broadcast_to(const nb_tensor *x, nb_shape shape)
{
    const char *op = broadcast_to_def.name;
    if (!x)
        return nb__null_input(op, 0);
    char sx[NB_SHAPE_STR_MAX], ss[NB_SHAPE_STR_MAX];
    if (shape.ndim < x->ndim || shape.ndim > NB_MAX_DIMS)
        return nb__fail_null(NB_ERR_SHAPE, "%s: cannot broadcast %s to %s", op, nb__shape_str(SHAPE_OF(x), sx, sizeof sx),
                             nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss));
    int lead = shape.ndim - x->ndim;
    for (int i = 0; i < shape.ndim; i++) {
        int64_t want = shape.dims[i], have = i < lead ? 1 : x->shape[i - lead];
        if (want < 0 || (have != want && have != 1))
            return nb__fail_null(NB_ERR_SHAPE, "%s: cannot broadcast %s to %s (dim %d: %lld vs %lld)", op,
                                 nb__shape_str(SHAPE_OF(x), sx, sizeof sx),
                                 nb__shape_str(shape.ndim, shape.dims, ss, sizeof ss), i, (long long)have,
                                 (long long)want);
    }
    const nb_tensor *in[1];
    const nb_tensor *src = place1_as(op, x, shape, in);
    if (!src)
        return NULL;
    int64_t strides[NB_MAX_DIMS];
    for (int i = 0; i < shape.ndim; i++) {
        int j = i - lead;
        strides[i] = j < 0 || (src->shape[j] == 1 && shape.dims[i] != 1) ? 0 : src->strides[j];
    }
    nb_tensor *out = nb__tensor_view(src, shape.ndim, shape.dims, strides, src->offset);
    return nb__finish(&broadcast_to_def, 1, in, out, NULL);
}

/* ---- contiguous --------------------------------------------------------------- */

static nb_status identity_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    (void)n;
    gi[0] = g[0];
    return nb__ok(gi[0]);
}

static const nb_op_def contiguous_def = {.name = "contiguous", .grad = identity_grad};

nb_tensor *nb_contiguous(const nb_tensor *x)
{
    const char *op = contiguous_def.name;
    if (!x)
        return nb__null_input(op, 0);
    const nb_tensor *in[1];
    const nb_tensor *src = place1(op, x, in);
    if (!src)
        return NULL;
    if (src->contiguous)
        return nb_retain((nb_tensor *)src);
    nb_tensor *out = copy_contiguous(op, src->device, src, SHAPE_OF(src));
    return nb__finish(&contiguous_def, 1, in, out, NULL);
}

/* ---- concat and stack --------------------------------------------------------- */

/* attrs.i[0]: the axis of the output the inputs were joined on. */
static nb_status concat_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    int axis = (int)n->attrs.i[0];
    nb_shape begin = {g[0]->ndim, {0}};
    nb_status st = NB_OK;
    for (int k = 0; k < n->n_in; k++) {
        const nb_tensor *x = n->in[k];
        nb_shape size = shape_of(x);
        gi[k] = nb_slice(g[0], begin, size);
        begin.dims[axis] += x->shape[axis];
        if (!st)
            st = nb__ok(gi[k]);
    }
    return st;
}

static nb_status stack_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    int axis = (int)n->attrs.i[0];
    nb_shape begin = {g[0]->ndim, {0}}, size = shape_of(g[0]);
    size.dims[axis] = 1;
    nb_status st = NB_OK;
    for (int k = 0; k < n->n_in; k++) {
        begin.dims[axis] = k;
        gi[k] = nb_squeeze(nb_slice(g[0], begin, size), axis);
        if (!st)
            st = nb__ok(gi[k]);
    }
    return st;
}

static const nb_op_def concat_def = {.name = "concat", .grad = concat_grad};
static const nb_op_def stack_def = {.name = "stack", .grad = stack_grad};

/* concat (stacking false) joins on an existing axis; stack inserts a new one. */
static nb_tensor *join(const nb_op_def *def, bool stacking, int n, nb_tensor *const *xs, int axis)
{
    const char *op = def->name;
    if (n < 1 || !xs)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: needs at least one input (got %d)", op, xs ? n : 0);
    for (int i = 0; i < n; i++)
        if (!xs[i])
            return nb__null_input(op, i);
    const nb_tensor *x0 = xs[0];
    char s0[NB_SHAPE_STR_MAX], si[NB_SHAPE_STR_MAX];
    if (stacking && x0->ndim >= NB_MAX_DIMS)
        return nb__fail_null(NB_ERR_SHAPE, "%s: inputs of shape %s already have the most dims (%d)", op,
                             nb__shape_str(SHAPE_OF(x0), s0, sizeof s0), NB_MAX_DIMS);
    int out_ndim = x0->ndim + (stacking ? 1 : 0);
    int a = nb__axis(op, axis, out_ndim);
    if (a < 0)
        return NULL;
    for (int i = 1; i < n; i++) {
        const nb_tensor *x = xs[i];
        if (nb__check_same_dtype(op, x0, x))
            return NULL;
        bool fits = x->ndim == x0->ndim;
        for (int d = 0; fits && d < x0->ndim; d++)
            fits = x->shape[d] == x0->shape[d] || (!stacking && d == a);
        if (!fits)
            return nb__fail_null(NB_ERR_SHAPE, "%s: input %d has shape %s but input 0 has %s; %s", op, i,
                                 nb__shape_str(SHAPE_OF(x), si, sizeof si), nb__shape_str(SHAPE_OF(x0), s0, sizeof s0),
                                 stacking ? "stacked tensors must have one shape"
                                          : "they must match on every dim but the axis");
    }

    const nb_tensor *small[16];
    const nb_tensor **in = n <= 16 ? small : malloc(sizeof *in * (size_t)n);
    if (!in)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    for (int i = 0; i < n; i++)
        in[i] = xs[i];
    nb_tensor *out = NULL;
    nb_device *dev = nb__op_place(op, n, in);
    if (!dev)
        goto done;

    int64_t shape[NB_MAX_DIMS];
    for (int d = 0, j = 0; d < out_ndim; d++) {
        if (stacking && d == a) {
            shape[d] = n;
            continue;
        }
        shape[d] = x0->shape[j++];
    }
    if (!stacking) {
        shape[a] = 0;
        for (int i = 0; i < n; i++) {
            if (__builtin_add_overflow(shape[a], in[i]->shape[a], &shape[a])) {
                nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: dim %d of the inputs (%s, ...) sums past int64 at input %d (%s)",
                         op, a, nb__shape_str(SHAPE_OF(x0), s0, sizeof s0), i,
                         nb__shape_str(SHAPE_OF(in[i]), si, sizeof si));
                goto done;
            }
        }
    }
    if (!nb__shape_fits(op, true, x0->dtype, out_ndim, shape))
        goto done;
    out = nb__out(op, dev, x0->dtype, out_ndim, shape);
    if (!out)
        goto done;

    /* Copy each input into its part of out: a strided view of out's storage. */
    nb_view vo = nb__view(out);
    int64_t pos = 0;
    for (int i = 0; i < n && out; i++) {
        const nb_tensor *x = in[i];
        nb_view part = vo;
        part.data = (char *)vo.data + pos * vo.strides[a];
        if (stacking) {
            /* Drop the new axis: part has x's shape. */
            part.ndim = x->ndim;
            for (int d = a; d < x->ndim; d++) {
                part.shape[d] = vo.shape[d + 1];
                part.strides[d] = vo.strides[d + 1];
            }
            pos += 1;
        } else {
            part.shape[a] = x->shape[a];
            pos += x->shape[a];
        }
        part.numel = x->numel;
        part.contiguous = nb__view_is_contiguous(&part);
        if (x->numel == 0)
            continue;
        nb_view vx = nb__view(x);
        out = nb__kernel_done(dev->backend->copy(dev, &part, &vx), out);
    }
    nb_op_attrs attrs = {0};
    attrs.i[0] = a;
    out = nb__finish(def, n, in, out, &attrs);
done:
    if (in != small)
        free(in);
    return out;
}

nb_tensor *nb_concat(int n, nb_tensor *const *xs, int axis) { return join(&concat_def, false, n, xs, axis); }
nb_tensor *nb_stack(int n, nb_tensor *const *xs, int axis) { return join(&stack_def, true, n, xs, axis); }

/* ---- split -------------------------------------------------------------------- */

nb_status nb_split(const nb_tensor *x, int n, const int64_t *sizes, int axis, nb_tensor **out)
{
    const char *op = "split";
    if (out)
        for (int i = 0; i < n; i++)
            out[i] = NULL;
    if (!x) {
        nb__null_input(op, 0);
        return nb_error();
    }
    if (n < 1 || !out)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: needs n >= 1 pieces and an output array (got n = %d%s)", op, n,
                        out ? "" : ", out NULL");
    int a = nb__axis(op, axis, x->ndim);
    if (a < 0)
        return nb_error();
    char sx[NB_SHAPE_STR_MAX];
    int64_t dim = x->shape[a];
    if (!sizes && dim % n != 0)
        return nb__fail(NB_ERR_SHAPE, "%s: dim %d of %s (size %lld) does not divide into %d equal pieces", op, a,
                        nb__shape_str(SHAPE_OF(x), sx, sizeof sx), (long long)dim, n);
    if (sizes) {
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            if (sizes[i] < 0)
                return nb__fail(NB_ERR_SHAPE, "%s: piece %d has negative size %lld", op, i, (long long)sizes[i]);
            if (sizes[i] > dim - total) /* total <= dim here, so this cannot wrap */
                return nb__fail(NB_ERR_SHAPE, "%s: sizes up to piece %d sum past size %lld of dim %d of %s", op, i,
                                (long long)dim, a, nb__shape_str(SHAPE_OF(x), sx, sizeof sx));
            total += sizes[i];
        }
        if (total != dim)
            return nb__fail(NB_ERR_SHAPE, "%s: sizes sum to %lld but dim %d of %s has size %lld", op, (long long)total,
                            a, nb__shape_str(SHAPE_OF(x), sx, sizeof sx), (long long)dim);
    }
    const nb_tensor *in[1];
    const nb_tensor *src = place1(op, x, in);
    if (!src)
        return nb_error();
    nb_shape begin = {src->ndim, {0}}, size = shape_of(src);
    for (int i = 0; i < n; i++) {
        size.dims[a] = sizes ? sizes[i] : dim / n;
        out[i] = nb_slice(src, begin, size);
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                out[j] = NULL; /* still owned by the scope */
            return nb_error() ? nb_error() : NB_ERR_INTERNAL;
        }
        begin.dims[a] += size.dims[a];
    }
    return NB_OK;
}
