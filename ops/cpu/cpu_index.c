/* Indexing: gather, scatter_add, one_hot, and the index check alone.
 * gather: params f32, f64, i32, i64, bool, u8 (rows are moved as bytes);
 * scatter_add: f32, f64, i32, i64 (integers wrap); one_hot: out f32, f64, i32,
 * i64, bool, u8. Indices are i32 or i64 (one_hot also takes u8); gather and
 * scatter_add check every index before writing anything, so a bad index leaves
 * out untouched. Gather, scatter_add: params/out, indices and updates
 * contiguous (as backend.h says); one_hot's indices may have any strides. */
#include "cpu_internal.h"
#include "lib/core/formulas.h"

static inline bool cpu_dtype_ok(nb_dtype d)
{
    return d == NB_F32 || d == NB_F64 || d == NB_I32 || d == NB_I64 || d == NB_BOOL || d == NB_U8;
}

static inline int64_t index_at(const void *idx, bool i64, int64_t i)
{
    return i64 ? ((const int64_t *)idx)[i] : ((const int32_t *)idx)[i];
}

/* Checks every index against [0, rows); records the first bad one, in the
 * words the GPU's deferred report uses. */
static nb_status index_error(const char *op, long long value, int64_t position, int64_t rows)
{
    return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: index %lld at position %lld is outside [0, %lld) on /cpu:0", op,
                    value, (long long)position, (long long)rows);
}

static nb_status check_indices(const char *op, const nb_view *indices, int64_t rows)
{
    const int64_t n = indices->numel;
    if (indices->dtype == NB_I64) {
        const int64_t *ix = indices->data;
        for (int64_t i = 0; i < n; i++)
            if ((uint64_t)ix[i] >= (uint64_t)rows)
                return index_error(op, ix[i], i, rows);
    } else {
        const int32_t *ix = indices->data;
        for (int64_t i = 0; i < n; i++)
            if (ix[i] < 0 || (int64_t)ix[i] >= rows)
                return index_error(op, ix[i], i, rows);
    }
    return NB_OK;
}

nb_status nb__cpu_check_indices(nb_device *dev, const char *op, const nb_view *indices, int64_t limit)
{
    if (indices->dtype != NB_I32 && indices->dtype != NB_I64)
        return nb__cpu_unsupported(dev, op, indices->dtype);
    if (!indices->contiguous && indices->numel > 0)
        return nb__fail(NB_ERR_INTERNAL, "%s: the CPU index check needs contiguous indices", op);
    return check_indices(op, indices, limit);
}

static nb_status check_contiguous(const char *op, const char *what, const nb_view *v)
{
    if (!v->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: the CPU kernel needs contiguous %s", op, what);
    return NB_OK;
}

/* ---- gather ------------------------------------------------------------------------------ */

typedef struct gather_job {
    char *out;
    const char *params;
    const void *idx;
    bool i64;
    int64_t row_bytes;
} gather_job;

/* Rows of 4 and 8 bytes move as one fixed-size memcpy each, which compiles to
 * a single load and store: a row of two f32 (or four u8) from a view with an odd
 * offset is only 4-byte (1-byte) aligned, so it must not be read through a
 * uint64_t (uint32_t) pointer. */
static void gather_rows(void *ctx, int64_t b, int64_t e)
{
    const gather_job *j = ctx;
    const int64_t rb = j->row_bytes;
    if (rb == 4) {
        for (int64_t i = b; i < e; i++)
            memcpy(j->out + i * 4, j->params + index_at(j->idx, j->i64, i) * 4, 4);
    } else if (rb == 8) {
        for (int64_t i = b; i < e; i++)
            memcpy(j->out + i * 8, j->params + index_at(j->idx, j->i64, i) * 8, 8);
    } else {
        for (int64_t i = b; i < e; i++)
            memcpy(j->out + i * rb, j->params + index_at(j->idx, j->i64, i) * rb, (size_t)rb);
    }
}

nb_status nb__cpu_gather(nb_device *dev, const char *op, const nb_view *out,
                         const nb_view *params, const nb_view *indices)
{
    if (!op)
        op = "gather";
    if (!cpu_dtype_ok(params->dtype))
        return nb__cpu_unsupported(dev, op, params->dtype);
    if (indices->dtype != NB_I32 && indices->dtype != NB_I64)
        return nb__fail(NB_ERR_DTYPE, "%s: indices dtype %s is not i32 or i64", op,
                        nb_dtype_name(indices->dtype));
    if (out->dtype != params->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s differs from params dtype %s", op,
                        nb_dtype_name(out->dtype), nb_dtype_name(params->dtype));
    if (params->ndim < 1)
        return nb__fail(NB_ERR_SHAPE, "%s: params must have at least one dim", op);
    nb_status st;
    if ((st = check_contiguous(op, "params", params)) || (st = check_contiguous(op, "indices", indices)) ||
        (st = check_contiguous(op, "output", out)))
        return st;
    const int64_t rows = params->shape[0];
    const int64_t row_elems = rows > 0 ? params->numel / rows : 0;
    const int64_t n = indices->numel;
    if (out->numel != n * row_elems)
        return nb__fail(NB_ERR_SHAPE, "%s: output has %lld elements, expected %lld", op,
                        (long long)out->numel, (long long)(n * row_elems));
    if ((st = check_indices(op, indices, rows)))
        return st;
    if (n == 0 || row_elems == 0)
        return NB_OK;
    gather_job j = {out->data, params->data, indices->data, indices->dtype == NB_I64,
                    row_elems * nb__cpu_esize(params->dtype)};
    const int64_t total = n * j.row_bytes;
    if (total < ((int64_t)1 << 18))
        gather_rows(&j, 0, n);
    else
        nb__parallel_for(n, ((int64_t)1 << 17) / j.row_bytes + 1, gather_rows, &j);
    return NB_OK;
}

/* ---- scatter_add --------------------------------------------------------------------------- */

typedef struct scatter_job {
    char *out;
    const char *upd;
    const void *idx;
    bool i64;
    int64_t n, row; /* indices, elements per row */
} scatter_job;

/* Columns [b, e) of every row: each thread owns its columns, so no races. */
#define SCATTER_COLS(NAME, T, ADD)                                                           \
    static void NAME(void *ctx, int64_t b, int64_t e)                                        \
    {                                                                                        \
        const scatter_job *j = ctx;                                                          \
        T *out = (T *)j->out;                                                                \
        const T *upd = (const T *)j->upd;                                                    \
        for (int64_t i = 0; i < j->n; i++) {                                                 \
            T *restrict o = out + index_at(j->idx, j->i64, i) * j->row;                      \
            const T *restrict u = upd + i * j->row;                                          \
            for (int64_t c = b; c < e; c++)                                                  \
                o[c] = ADD(o[c], u[c]);                                                      \
        }                                                                                    \
    }
#define PLUS(a, b) ((a) + (b))
#define UPLUS32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define UPLUS64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
SCATTER_COLS(scatter_f32, float, PLUS)
SCATTER_COLS(scatter_f64, double, PLUS)
SCATTER_COLS(scatter_i32, int32_t, UPLUS32)
SCATTER_COLS(scatter_i64, int64_t, UPLUS64)

nb_status nb__cpu_scatter_add(nb_device *dev, const char *op, const nb_view *out,
                              const nb_view *indices, const nb_view *updates)
{
    if (!op)
        op = "scatter_add";
    nb_range_fn fn;
    switch (out->dtype) {
    case NB_F32: fn = scatter_f32; break;
    case NB_F64: fn = scatter_f64; break;
    case NB_I32: fn = scatter_i32; break;
    case NB_I64: fn = scatter_i64; break;
    default: return nb__cpu_unsupported(dev, op, out->dtype);
    }
    if (indices->dtype != NB_I32 && indices->dtype != NB_I64)
        return nb__fail(NB_ERR_DTYPE, "%s: indices dtype %s is not i32 or i64", op,
                        nb_dtype_name(indices->dtype));
    if (updates->dtype != out->dtype)
        return nb__fail(NB_ERR_DTYPE, "%s: updates dtype %s differs from output dtype %s", op,
                        nb_dtype_name(updates->dtype), nb_dtype_name(out->dtype));
    if (out->ndim < 1)
        return nb__fail(NB_ERR_SHAPE, "%s: output must have at least one dim", op);
    nb_status st;
    if ((st = check_contiguous(op, "output", out)) || (st = check_contiguous(op, "indices", indices)) ||
        (st = check_contiguous(op, "updates", updates)))
        return st;
    const int64_t rows = out->shape[0];
    const int64_t row = rows > 0 ? out->numel / rows : 0;
    const int64_t n = indices->numel;
    if (updates->numel != n * row)
        return nb__fail(NB_ERR_SHAPE, "%s: updates have %lld elements, expected %lld", op,
                        (long long)updates->numel, (long long)(n * row));
    if ((st = check_indices(op, indices, rows)))
        return st;
    if (n == 0 || row == 0)
        return NB_OK;
    scatter_job j = {out->data, updates->data, indices->data, indices->dtype == NB_I64, n, row};
    if (n * row < 2 * NB_CPU_GRAIN || row < 64)
        fn(&j, 0, row);
    else
        nb__parallel_for(row, 64 > NB_CPU_GRAIN / n ? 64 : NB_CPU_GRAIN / n, fn, &j);
    return NB_OK;
}

/* ---- one_hot ------------------------------------------------------------------------------------ */

typedef struct onehot_ctx {
    char *out;
    int64_t depth, es;
    nb_dtype idtype;
    uint64_t on, off; /* the two values' bit patterns in out's dtype */
} onehot_ctx;

#define ONEHOT_ROW(NAME, T)                                                                  \
    static void NAME(void *vctx, int64_t n, char *const *p, const int64_t *s, int64_t flat) \
    {                                                                                        \
        const onehot_ctx *c = vctx;                                                          \
        T on, off;                                                                           \
        memcpy(&on, &c->on, sizeof on);                                                      \
        memcpy(&off, &c->off, sizeof off);                                                   \
        const int64_t depth = c->depth;                                                      \
        T *o = (T *)c->out + flat * depth;                                                   \
        for (int64_t i = 0; i < n; i++, o += depth) {                                        \
            const char *ip = p[0] + i * s[0];                                                \
            int64_t k = c->idtype == NB_I64   ? *(const int64_t *)ip                         \
                        : c->idtype == NB_I32 ? *(const int32_t *)ip                         \
                                              : *(const uint8_t *)ip;                        \
            for (int64_t d = 0; d < depth; d++)                                              \
                o[d] = off;                                                                  \
            if (k >= 0 && k < depth)                                                         \
                o[k] = on;                                                                   \
        }                                                                                    \
    }
ONEHOT_ROW(onehot_1, uint8_t)
ONEHOT_ROW(onehot_4, uint32_t)
ONEHOT_ROW(onehot_8, uint64_t)

static uint64_t value_bits(nb_dtype d, double v)
{
    union { uint64_t u; float f; double d; int32_t i; int64_t l; uint8_t b; } x;
    x.u = 0;
    switch (d) {
    case NB_F32: x.f = (float)v; break;
    case NB_F64: x.d = v; break;
    case NB_I32: x.i = nb_cast_to_i32(v); break;
    case NB_I64: x.l = nb_cast_to_i64(v); break;
    case NB_BOOL: x.b = v != 0; break;
    default: x.b = nb_cast_to_u8(v); break; /* as fill and cast convert: through i32, wrapping */
    }
    return x.u;
}

nb_status nb__cpu_one_hot(nb_device *dev, const nb_view *out, const nb_view *indices, double on,
                          double off)
{
    if (!cpu_dtype_ok(out->dtype))
        return nb__cpu_unsupported(dev, "one_hot", out->dtype);
    if (indices->dtype != NB_I32 && indices->dtype != NB_I64 && indices->dtype != NB_U8)
        return nb__fail(NB_ERR_DTYPE, "one_hot: indices dtype %s is not an integer type",
                        nb_dtype_name(indices->dtype));
    nb_status st;
    if ((st = check_contiguous("one_hot", "output", out)))
        return st;
    if (out->ndim < 1)
        return nb__fail(NB_ERR_SHAPE, "one_hot: output must have at least one dim");
    onehot_ctx c;
    c.out = out->data;
    c.depth = out->shape[out->ndim - 1];
    c.es = nb__cpu_esize(out->dtype);
    c.idtype = indices->dtype;
    c.on = value_bits(out->dtype, on);
    c.off = value_bits(out->dtype, off);
    if (out->numel != indices->numel * c.depth)
        return nb__fail(NB_ERR_SHAPE, "one_hot: output has %lld elements, expected %lld",
                        (long long)out->numel, (long long)(indices->numel * c.depth));
    if (out->numel == 0)
        return NB_OK;
    nb_cpu_loop_fn fn = c.es == 1 ? onehot_1 : c.es == 4 ? onehot_4 : onehot_8;
    const nb_view *views[1] = {indices};
    nb__cpu_iter_views(1, views, fn, &c, NB_CPU_GRAIN / c.depth + 1);
    return NB_OK;
}
