/* Scans: cumsum, the running sum along one axis, of any strided x into a
 * contiguous out.
 *
 * f32, f64, i32, i64. Each output element is the sum of its prefix (or
 * suffix, reversed) taken strictly in order along the axis: f32 accumulates in
 * double and rounds each output to f32 (PyTorch's CPU kernel does the same, so
 * its float results agree bit for bit; a float accumulator drifts on long rows
 * by the rounding of every step), f64 in double, i32 and i64 in wrapping
 * unsigned arithmetic (two's complement overflow, no undefined behaviour).
 *
 * The dims other than the axis are coalesced; when one of them has unit
 * stride in out (the innermost, when it lies after the axis) or else in x (a
 * transposed input), tiles of up to 256 rows neighbouring along it advance
 * together along the axis, which vectorises across the rows and keeps the
 * strided side's cache lines in use; otherwise each row runs alone. Work splits across the thread pool
 * by whole rows (tiles), never within one: every element is computed the same
 * way whatever the number of threads, so the result does not depend on it. */
#include "cpu_internal.h"

#define SCAN_TILE 256

typedef struct scan_plan {
    int nk;                      /* the other kept dims, outermost first */
    int64_t kshape[NB_MAX_DIMS];
    int64_t kst[2][NB_MAX_DIMS]; /* [0] x strides, [1] out strides (bytes) */
    int64_t width;               /* the tiled dim's size (1 when rows run alone) */
    int64_t wst[2];              /* its x and out strides */
    int64_t tiles;               /* tiles per kept position */
    int64_t len, xs, os;         /* along the axis: length and strides */
    const char *x;
    char *out;
    bool exclusive, reverse;
} scan_plan;

#define SCAN_IMPL(NAME, T, ACC)                                                               \
    /* w neighbouring rows from xp / op (their first elements along the axis) */              \
    static void NAME##_tile(const scan_plan *pl, const char *xp, char *op, int64_t w)         \
    {                                                                                         \
        const int64_t len = pl->len;                                                          \
        int64_t xs = pl->xs, os = pl->os;                                                     \
        if (pl->reverse) {                                                                    \
            xp += (len - 1) * xs;                                                             \
            op += (len - 1) * os;                                                             \
            xs = -xs;                                                                         \
            os = -os;                                                                         \
        }                                                                                     \
        const bool excl = pl->exclusive;                                                      \
        if (w == 1) {                                                                         \
            ACC acc = 0;                                                                      \
            for (int64_t i = 0; i < len; i++) {                                               \
                const ACC v = (ACC) * (const T *)(xp + i * xs);                               \
                if (excl) {                                                                   \
                    *(T *)(op + i * os) = (T)acc;                                             \
                    acc += v;                                                                 \
                } else {                                                                      \
                    acc += v;                                                                 \
                    *(T *)(op + i * os) = (T)acc;                                             \
                }                                                                             \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        ACC acc[SCAN_TILE];                                                                   \
        for (int64_t t = 0; t < w; t++)                                                       \
            acc[t] = 0;                                                                       \
        const int64_t wx = pl->wst[0], wo = pl->wst[1];                                       \
        for (int64_t i = 0; i < len; i++) {                                                   \
            const char *xr = xp + i * xs;                                                     \
            char *orow = op + i * os;                                                         \
            if (wx == (int64_t)sizeof(T) && wo == (int64_t)sizeof(T)) {                       \
                const T *restrict xv = (const T *)xr;                                         \
                T *restrict ov = (T *)orow;                                                   \
                if (excl)                                                                     \
                    for (int64_t t = 0; t < w; t++) {                                         \
                        ov[t] = (T)acc[t];                                                    \
                        acc[t] += (ACC)xv[t];                                                 \
                    }                                                                         \
                else                                                                          \
                    for (int64_t t = 0; t < w; t++) {                                         \
                        acc[t] += (ACC)xv[t];                                                 \
                        ov[t] = (T)acc[t];                                                    \
                    }                                                                         \
            } else {                                                                          \
                for (int64_t t = 0; t < w; t++) {                                             \
                    const ACC v = (ACC) * (const T *)(xr + t * wx);                           \
                    if (excl) {                                                               \
                        *(T *)(orow + t * wo) = (T)acc[t];                                    \
                        acc[t] += v;                                                          \
                    } else {                                                                  \
                        acc[t] += v;                                                          \
                        *(T *)(orow + t * wo) = (T)acc[t];                                    \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* work units [b, e): unit u is tile u % tiles of kept position u / tiles */              \
    static void NAME##_units(void *ctx, int64_t b, int64_t e)                                 \
    {                                                                                         \
        const scan_plan *pl = ctx;                                                            \
        int64_t idx[NB_MAX_DIMS], off[2], t = b % pl->tiles;                                  \
        nb__cpu_index_at(pl->nk, pl->kshape, b / pl->tiles, idx, 2, off, pl->kst);             \
        for (int64_t u = b; u < e; u++) {                                                     \
            const int64_t w0 = t * SCAN_TILE;                                                 \
            const int64_t w = pl->width - w0 < SCAN_TILE ? pl->width - w0 : SCAN_TILE;        \
            NAME##_tile(pl, pl->x + off[0] + w0 * pl->wst[0], pl->out + off[1] + w0 * pl->wst[1], \
                        w);                                                                   \
            if (++t == pl->tiles && u + 1 < e) {                                              \
                t = 0;                                                                        \
                nb__cpu_index_next(pl->nk, pl->kshape, idx, 2, off, pl->kst);                 \
            }                                                                                 \
        }                                                                                     \
    }

SCAN_IMPL(scan_f32, float, double)
SCAN_IMPL(scan_f64, double, double)
SCAN_IMPL(scan_i32, int32_t, uint32_t)
SCAN_IMPL(scan_i64, int64_t, uint64_t)

static const nb_range_fn scan_table[NB_DTYPE_COUNT] = {
    [NB_F32] = scan_f32_units, [NB_F64] = scan_f64_units,
    [NB_I32] = scan_i32_units, [NB_I64] = scan_i64_units,
};

nb_status nb__cpu_cumsum(nb_device *dev, const nb_view *out, const nb_view *x, int axis,
                         bool exclusive, bool reverse)
{
    nb_range_fn fn = (unsigned)x->dtype < NB_DTYPE_COUNT ? scan_table[x->dtype] : NULL;
    if (!fn)
        return nb__cpu_unsupported(dev, "cumsum", x->dtype);
    if (out->dtype != x->dtype)
        return nb__fail(NB_ERR_DTYPE, "cumsum: output dtype %s differs from input dtype %s",
                        nb_dtype_name(out->dtype), nb_dtype_name(x->dtype));
    if (axis < 0 || axis >= x->ndim || out->ndim != x->ndim)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "cumsum: axis %d out of range for %d dims", axis,
                        x->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (out->shape[d] != x->shape[d])
            return nb__fail(NB_ERR_SHAPE, "cumsum: output dim %d is %lld, input's %lld", d,
                            (long long)out->shape[d], (long long)x->shape[d]);
    if (out->numel == 0)
        return NB_OK;
    scan_plan pl;
    pl.nk = 0;
    pl.len = x->shape[axis];
    pl.xs = x->strides[axis];
    pl.os = out->strides[axis];
    pl.x = (const char *)x->data;
    pl.out = (char *)out->data;
    pl.exclusive = exclusive;
    pl.reverse = reverse;
    int64_t rows = 1;
    for (int d = 0; d < x->ndim; d++) {
        int64_t size = x->shape[d], xs = x->strides[d], os = out->strides[d];
        if (d == axis || size == 1)
            continue;
        rows *= size;
        nb__cpu_append_dim(&pl.nk, pl.kshape, pl.kst, size, xs, os);
    }
    const int64_t es = nb__cpu_esize(x->dtype);
    /* Tile out's unit-stride dim when it is a kept one (the innermost), else
     * x's, if either has one; rows then advance together along the axis. */
    int tile = -1;
    for (int d = pl.nk - 1; d >= 0 && tile < 0; d--)
        if (pl.kst[1][d] == es)
            tile = d;
    for (int d = pl.nk - 1; d >= 0 && tile < 0; d--)
        if (pl.kst[0][d] == es)
            tile = d;
    if (tile >= 0) {
        pl.width = pl.kshape[tile];
        pl.wst[0] = pl.kst[0][tile];
        pl.wst[1] = pl.kst[1][tile];
        for (int d = tile; d < pl.nk - 1; d++) {
            pl.kshape[d] = pl.kshape[d + 1];
            pl.kst[0][d] = pl.kst[0][d + 1];
            pl.kst[1][d] = pl.kst[1][d + 1];
        }
        pl.nk--;
    } else {
        pl.width = 1;
        pl.wst[0] = pl.wst[1] = 0;
    }
    pl.tiles = (pl.width + SCAN_TILE - 1) / SCAN_TILE;
    int64_t units = (rows / pl.width) * pl.tiles;
    int64_t per = pl.len * (pl.width < SCAN_TILE ? pl.width : SCAN_TILE); /* elements a unit */
    if (units < 2 || rows * pl.len < 2 * NB_CPU_GRAIN)
        fn(&pl, 0, units);
    else
        nb__parallel_for(units, NB_CPU_GRAIN / per + 1, fn, &pl);
    return NB_OK;
}
