/* Reductions: reduce (SUM MEAN MAX MIN PROD) and arg_reduce.
 *
 * reduce: f32, f64, i32, i64 (out has x's dtype). f32 sums and products
 * accumulate in double; integer sums and products in wrapping 64-bit; float
 * MAX/MIN propagate NaN, and any float result that is NaN is the default NaN;
 * integer MEAN truncates. The reduced dims (out size 1, x size > 1) and the
 * kept dims are coalesced separately; then either
 *  - each output element reduces runs along the innermost reduced dim (a
 *    dense run in 32 or 64 lanes, four vectors of accumulators), or
 *  - when the innermost kept dim is contiguous and the reduced one is not
 *    (column sums such as a bias gradient), tiles of up to 256 outputs
 *    accumulate row by row, four rows a pass, which vectorises across the
 *    outputs.
 * Large work splits over output elements; a full reduction over fixed chunks
 * of the input, and a column reduction of few tiles over fixed parts of its
 * rows, whose partials combine in a fixed order (so the result does not
 * depend on the number of threads).
 *
 * A reduction of a dense x over its trailing dims (or all of them), or over
 * its leading ones (columns), can also be fed (nb__cpu_reduce_fed): a fused
 * chain makes x's elements up to 256 at a time in a thread's scratch just
 * before they are reduced, so x is never stored. The
 * splits, chunks, lanes and combining order are the ones above, through the
 * same functions, so the bits are the same.
 *
 * arg_reduce: f32, f64, i32, i64, bool, u8 -> i64, index of the first max/min
 * (a NaN counts as the extreme: the first NaN wins). */
#include "cpu_internal.h"

#include <math.h>

/* A function of which the program holds one machine code: never inlined nor
 * cloned for a constant argument (GCC's constprop copies). */
#if defined(__clang__)
#define RED_ONE_COPY __attribute__((noinline))
#else
#define RED_ONE_COPY __attribute__((noinline, noclone))
#endif

/* NAME, a void function of PARAMS called with ARGS, as NAME##_body compiled
 * for each vector level, one machine code each (RED_ONE_COPY), and picked at
 * run time, so that the eager and the fed paths run the same code. */
#define RED_SIMD_COPIES(NAME, PARAMS, ARGS) NB_CPU_SIMD_COPIES(NAME, RED_ONE_COPY, PARAMS, ARGS)
/* The same for the integer reductions, one copy for the build's baseline: GCC
 * 12's AVX-512 copy of the i32 lanes loop summed wrong (test_backend_ops). */
#define RED_SCALAR_COPY(NAME, PARAMS, ARGS) RED_ONE_COPY static void NAME PARAMS { NAME##_body ARGS; }

/* Before the lanes' loop over 8: kept a loop, which the vectoriser takes
 * whole. Unrolled first (-O3, cpu_internal.h), its 8 selects of a float max
 * or min were left scalar. */
#define RED_KEEP_LOOP _Pragma("GCC unroll 1")

/* Lanes of a dense run's accumulation: four 512-bit vectors of accumulators
 * for floats, whose chains of adds or selects overlap where one vector's
 * waited on itself (one thread, [256, 1024] f32 in L2: max over rows 52 ->
 * 22 us, sum of all 24 -> 19 us; f32 sums stay bound by their conversions
 * to double); the integer reductions, compiled for the baseline, keep eight.
 * FEED_PIECE is a multiple of each. */
#define RED_LANES_DOUBLE 32
#define RED_LANES_FLOAT 64
#define RED_LANES_INT 8

#define RED_TILE 256
#define RED_ROWS 64 /* short rows reduced per call */
#define RED_MAX_PARTIALS 64
/* Elements a producer writes at a time into a thread's scratch: the chain's
 * own tile, so the scratch stays in L1 beside the chain's tiles (larger
 * pieces measured slower: 2048 took 11.8 ms where 256 took 9.4 ms for
 * mean((a - b)^2) on 64 MiB f32, one thread); a multiple of the lanes. */
#define FEED_PIECE 256
_Static_assert(FEED_PIECE % RED_LANES_DOUBLE == 0 && FEED_PIECE % RED_LANES_FLOAT == 0 && FEED_PIECE % RED_LANES_INT == 0,
               "a piece must end on a lane boundary");
/* Elements (rows of a column tile, each padded to 64 bytes) one call of
 * NAME##_colacc takes, so that a fed block of rows stays in L1; the eager and
 * the fed paths both call it on blocks of red_col_rows rows. */
#define RED_COL_SPAN 2048
_Static_assert(RED_COL_SPAN % FEED_PIECE == 0 && RED_COL_SPAN >= RED_TILE, "a block holds whole pieces");

/* Neighbouring column tiles a fed reduction makes at once, row by row: one
 * tile's piece of a row of 1024 f32 is a page of its own, and reading the
 * chain's inputs a piece a page took twice as long as the chain apart
 * ([4096, 1024] f32, one thread). */
#define RED_COL_GROUP 4

/* Rows of a column tile w wide (elements of es bytes) per NAME##_colacc call. */
static inline int64_t red_col_rows(int64_t w, int64_t es)
{
    const int64_t padded = (w * es + 63) / 64 * 64 / es;
    return RED_COL_SPAN / padded;
}

typedef struct red_plan {
    int nk, nr;
    int64_t kshape[NB_MAX_DIMS];
    int64_t kst[2][NB_MAX_DIMS]; /* kept dims: [0] x strides, [1] out strides */
    int64_t rshape[NB_MAX_DIMS];
    int64_t rst[1][NB_MAX_DIMS]; /* reduced dims: x strides */
    int64_t knumel, rnumel;
    const char *x;
    char *out;
    bool mean;
} red_plan;

/* A reduction fed by a producer (nb__cpu_reduce_fed): x is dense and each
 * output reads a contiguous range of it. */
typedef struct red_feed {
    const red_plan *pl;
    nb_cpu_produce_fn produce;
    void *ctx;
    int64_t grain; /* elements a task of the row split takes at least */
    bool cols;     /* column sums of a dense [rnumel, knumel] x, as NAME##_cols */
} red_feed;

/* Makes rows [r, r + m) of g neighbouring column tiles w wide from column j0
 * of fd's dense [rnumel, K] x, each of es bytes, into scratch, tile q's at
 * scratch + q * tile_bytes: where one tile is all of K, the rows as one
 * contiguous range, piece by piece; else each row's piece, starting on 64
 * bytes as produce wants its dst (so x's inputs are read along their rows).
 * Returns the bytes from one row's piece to the next. */
static int64_t red_fed_rows(const red_feed *fd, int64_t es, int64_t r, int64_t m, int64_t j0, int64_t w, int64_t g,
                            char *scratch, int64_t tile_bytes)
{
    const int64_t kin = fd->pl->kshape[0];
    if (w == kin) {
        for (int64_t f = 0; f < m * kin; f += FEED_PIECE)
            fd->produce(fd->ctx, r * kin + f, m * kin - f < FEED_PIECE ? m * kin - f : FEED_PIECE, scratch + f * es);
        return w * es;
    }
    const int64_t ws = (w * es + 63) / 64 * 64;
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < g; q++)
            fd->produce(fd->ctx, (r + i) * kin + j0 + q * RED_TILE, w, scratch + q * tile_bytes + i * ws);
    return ws;
}

/* The column tiles of pl (up to RED_TILE outputs each) run by fn over ctx,
 * split across the threads; a tile's bits do not depend on the split. */
static void red_run_cols(const red_plan *pl, nb_range_fn fn, void *ctx)
{
    const int64_t kin = pl->kshape[pl->nk - 1];
    const int64_t units = pl->knumel / kin * ((kin + RED_TILE - 1) / RED_TILE);
    const int64_t total = pl->knumel * pl->rnumel, per = total / units + 1;
    if (total < 2 * NB_CPU_GRAIN)
        fn(ctx, 0, units);
    else
        nb__parallel_for(units, NB_CPU_GRAIN / per + 1, fn, ctx);
}

/* The chunks a full reduction of pl splits into, whose partials combine in
 * order (the bits depend on this count, so eager and fed reductions both ask
 * here), or 0 where it does not split. */
static int64_t red_full_parts(const red_plan *pl)
{
    if (pl->knumel != 1 || pl->rnumel < 2 * NB_CPU_GRAIN)
        return 0;
    const int64_t parts = pl->rnumel / NB_CPU_GRAIN;
    return parts > RED_MAX_PARTIALS ? RED_MAX_PARTIALS : parts;
}

/* Units (a column tile's part of the rows) a split column reduction runs at most. */
#define RED_COL_MAX_UNITS 16

/* Row parts each column tile of pl splits into, whose partial columns
 * combine in order, or 1 where it does not split: only a [rows, K]
 * reduction of few tiles (a bias gradient's [N*H*W, C] is one), which
 * otherwise leaves threads idle. The count depends on the sizes alone, never
 * on the threads, since the bits depend on it; eager and fed ask here. */
static int64_t red_col_parts(const red_plan *pl)
{
    if (pl->nk != 1 || pl->nr != 1)
        return 1;
    const int64_t ntiles = (pl->kshape[0] + RED_TILE - 1) / RED_TILE;
    int64_t parts = pl->knumel * pl->rnumel / (4 * NB_CPU_GRAIN);
    if (parts > RED_COL_MAX_UNITS / ntiles)
        parts = RED_COL_MAX_UNITS / ntiles;
    return parts > 1 ? parts : 1;
}

/* ---- one macro stamps out every (op, dtype) ------------------------------------ */

#define RED_IMPL(NAME, T, ACC, INIT, COMB, MEANDIV, LANES, COPIES)                           \
    /* Dense runs, fed or read from memory, meet their elements in the same order (the lanes, \
     * then the close); where two NaNs meet, which one an add keeps follows the order of the  \
     * instruction's operands, which the compiler picks per copy, so NAME##_store makes any   \
     * NaN the default one */                                                                 \
    /* rows x0..x3, in that order, into w column accumulators (parameters, so that restrict \
     * tells the vectoriser that acc is none of them) */                                      \
    __attribute__((always_inline)) static inline void NAME##_acc4(ACC *restrict acc, const T *restrict x0, \
                                                                  const T *restrict x1,       \
                                                                  const T *restrict x2,       \
                                                                  const T *restrict x3, int64_t w) \
    {                                                                                         \
        for (int64_t j = 0; j < w; j++) {                                                     \
            ACC a = acc[j];                                                                   \
            a = COMB(a, (ACC)x0[j]);                                                          \
            a = COMB(a, (ACC)x1[j]);                                                          \
            a = COMB(a, (ACC)x2[j]);                                                          \
            acc[j] = COMB(a, (ACC)x3[j]);                                                     \
        }                                                                                     \
    }                                                                                         \
    /* rows rows of w (<= RED_TILE) column accumulators, row i at xr + i * rs bytes, into  \
     * acc in row order: the eager and the fed column paths both accumulate here */           \
    __attribute__((always_inline)) static inline void NAME##_colacc_body(ACC *restrict acc,  \
                                                                         const char *xr,      \
                                                                         int64_t rows,        \
                                                                         int64_t rs, int64_t w) \
    {                                                                                         \
        int64_t i = 0;                                                                        \
        for (; i + 4 <= rows; i += 4) /* each acc[j] loaded and stored once per 4 rows */     \
            NAME##_acc4(acc, (const T *)(xr + i * rs), (const T *)(xr + (i + 1) * rs),         \
                        (const T *)(xr + (i + 2) * rs), (const T *)(xr + (i + 3) * rs), w);    \
        for (; i < rows; i++) {                                                               \
            const T *restrict x = (const T *)(xr + i * rs);                                   \
            for (int64_t j = 0; j < w; j++)                                                   \
                acc[j] = COMB(acc[j], (ACC)x[j]);                                             \
        }                                                                                     \
    }                                                                                         \
    COPIES(NAME##_colacc, (ACC *restrict acc, const char *xr, int64_t rows, int64_t rs, int64_t w), \
                    (acc, xr, rows, rs, w))                                                   \
    /* the lanes' part of a dense run: n (a multiple of LANES) elements, element i into lane \
     * i % LANES; the lanes are held in registers, several vectors of them, so that their    \
     * chains of adds overlap */                                                              \
    __attribute__((always_inline)) static inline void NAME##_lanes_body(ACC *restrict a, const T *restrict x, \
                                                                        int64_t n)            \
    {                                                                                         \
        ACC v[LANES];                                                                         \
        for (int j = 0; j < LANES; j++)                                                       \
            v[j] = a[j];                                                                      \
        for (int64_t i = 0; i < n; i += LANES)                                                \
            RED_KEEP_LOOP for (int j = 0; j < LANES; j++)                                     \
                v[j] = COMB(v[j], (ACC)x[i + j]);                                             \
        for (int j = 0; j < LANES; j++)                                                       \
            a[j] = v[j];                                                                      \
    }                                                                                         \
    COPIES(NAME##_lanes, (ACC *restrict a, const T *restrict x, int64_t n), (a, x, n))        \
    /* the lanes combined pairwise (lane j with lane j + half, halving), then the run's last  \
     * n (< LANES) elements in order, into *r */                                              \
    __attribute__((always_inline)) static inline void NAME##_close_body(const ACC *lanes, const T *x, \
                                                                        int64_t n, ACC *r)    \
    {                                                                                         \
        ACC a[LANES];                                                                         \
        memcpy(a, lanes, sizeof a);                                                           \
        for (int half = LANES / 2; half >= 1; half /= 2)                                      \
            for (int j = 0; j < half; j++)                                                    \
                a[j] = COMB(a[j], a[j + half]);                                               \
        ACC v = a[0];                                                                         \
        for (int64_t i = 0; i < n; i++)                                                       \
            v = COMB(v, (ACC)x[i]);                                                           \
        *r = v;                                                                               \
    }                                                                                         \
    COPIES(NAME##_close, (const ACC *lanes, const T *x, int64_t n, ACC *r), (lanes, x, n, r)) \
    /* a dense run of n elements into *r: the lanes and the close in one call */             \
    __attribute__((always_inline)) static inline void NAME##_dense_body(const T *x, int64_t n, ACC *r) \
    {                                                                                         \
        ACC a[LANES];                                                                         \
        for (int j = 0; j < LANES; j++)                                                       \
            a[j] = INIT;                                                                      \
        const int64_t nl = n - n % LANES;                                                     \
        NAME##_lanes_body(a, x, nl);                                                          \
        NAME##_close_body(a, x + nl, n - nl, r);                                              \
    }                                                                                         \
    COPIES(NAME##_dense, (const T *x, int64_t n, ACC *r), (x, n, r))                          \
    /* a full reduction's n partials, in order */                                             \
    RED_ONE_COPY static ACC NAME##_combine(const ACC *part, int64_t n)           \
    {                                                                                         \
        ACC acc = INIT;                                                                       \
        for (int64_t c = 0; c < n; c++)                                                       \
            acc = COMB(acc, part[c]);                                                         \
        return acc;                                                                           \
    }                                                                                         \
    /* rows dense runs of rn (<= FEED_PIECE) elements each, row i at rowp[i], into res[i]:    \
     * a short row's lanes and close in one function called once for many rows, so a       \
     * reduction of short rows pays no call per row */                                       \
    __attribute__((always_inline)) static inline void NAME##_rows_body(ACC *restrict res,   \
                                                                       const char *const *rowp, \
                                                                       int64_t rows, int64_t rn) \
    {                                                                                         \
        const int64_t n8 = rn - rn % 8;                                                       \
        for (int64_t r = 0; r < rows; r++) {                                                  \
            const T *restrict x = (const T *)rowp[r];                                         \
            ACC a[8] = {INIT, INIT, INIT, INIT, INIT, INIT, INIT, INIT};                      \
            for (int64_t i = 0; i < n8; i += 8)                                               \
                RED_KEEP_LOOP for (int j = 0; j < 8; j++)                                     \
                    a[j] = COMB(a[j], (ACC)x[i + j]);                                         \
            ACC v = INIT;                                                                     \
            for (int j = 0; j < 8; j++)                                                       \
                v = COMB(v, a[j]);                                                            \
            for (int64_t i = n8; i < rn; i++)                                                 \
                v = COMB(v, (ACC)x[i]);                                                       \
            res[r] = v;                                                                       \
        }                                                                                     \
    }                                                                                         \
    COPIES(NAME##_rows, (ACC *restrict res, const char *const *rowp, int64_t rows, int64_t rn), \
                    (res, rowp, rows, rn))                                                    \
    /* n elements from p with byte stride s */                                                \
    static inline ACC NAME##_run(const char *p, int64_t n, int64_t s)                         \
    {                                                                                         \
        if (s == (int64_t)sizeof(T)) {                                                        \
            ACC r;                                                                            \
            NAME##_dense((const T *)p, n, &r);                                                \
            return r;                                                                         \
        }                                                                                     \
        ACC r = INIT;                                                                         \
        for (int64_t i = 0; i < n; i++)                                                       \
            r = COMB(r, (ACC) * (const T *)(p + i * s));                                      \
        return r;                                                                             \
    }                                                                                         \
    /* the reduced elements [b, e) (row-major over the reduced dims) from base */             \
    static ACC NAME##_range(const red_plan *pl, const char *base, int64_t b, int64_t e)       \
    {                                                                                         \
        const int nr = pl->nr;                                                                \
        const int64_t inner = pl->rshape[nr - 1], sin = pl->rst[0][nr - 1];                   \
        if (nr == 1)                                                                          \
            return NAME##_run(base + b * sin, e - b, sin);                                    \
        ACC acc = INIT;                                                                       \
        int64_t idx[NB_MAX_DIMS], off[1], row = b / inner, pos = b % inner;                   \
        for (int d = nr - 2; d >= 0; d--) {                                                   \
            idx[d] = row % pl->rshape[d];                                                     \
            row /= pl->rshape[d];                                                             \
        }                                                                                     \
        off[0] = nb__cpu_offset(nr - 1, idx, pl->rst[0]);                                     \
        for (int64_t f = b; f < e;) {                                                         \
            int64_t n = inner - pos < e - f ? inner - pos : e - f;                            \
            acc = COMB(acc, NAME##_run(base + off[0] + pos * sin, n, sin));                   \
            f += n;                                                                           \
            pos = 0;                                                                          \
            if (f < e)                                                                        \
                nb__cpu_index_next(nr - 1, pl->rshape, idx, 1, off, pl->rst);                 \
        }                                                                                     \
        return acc;                                                                           \
    }                                                                                         \
    static inline void NAME##_store(const red_plan *pl, char *o, ACC acc)                     \
    {                                                                                         \
        T v = (T)(pl->mean ? MEANDIV(acc, pl->rnumel) : acc);                                 \
        /* which of several NaNs survives depends on the lanes and the copy's operand order: \
         * every float NaN result is the one default NaN */                                   \
        if (v != v)                                                                           \
            v = (T)NAN;                                                                       \
        *(T *)o = v;                                                                          \
    }                                                                                         \
    /* output elements [b, e), one run-wise reduction each */                                 \
    static void NAME##_outs(void *ctx, int64_t b, int64_t e)                                  \
    {                                                                                         \
        const red_plan *pl = ctx;                                                             \
        int64_t idx[NB_MAX_DIMS], off[2];                                                     \
        nb__cpu_index_at(pl->nk, pl->kshape, b, idx, 2, off, pl->kst);                         \
        const int64_t rn = pl->rnumel;                                                        \
        if (pl->nr == 1 && pl->rst[0][0] == (int64_t)sizeof(T) && rn <= FEED_PIECE) {         \
            /* short dense rows: as a fed reduction reduces them (NAME##_fed_outs) */         \
            const char *rowp[RED_ROWS];                                                       \
            char *outp[RED_ROWS];                                                             \
            ACC res[RED_ROWS];                                                                \
            for (int64_t f = b; f < e;) {                                                     \
                int64_t m = 0;                                                                \
                for (; m < RED_ROWS && f < e; m++, f++) {                                     \
                    rowp[m] = pl->x + off[0];                                                 \
                    outp[m] = pl->out + off[1];                                               \
                    if (f + 1 < e)                                                            \
                        nb__cpu_index_next(pl->nk, pl->kshape, idx, 2, off, pl->kst);         \
                }                                                                             \
                NAME##_rows(res, rowp, m, rn);                                                \
                for (int64_t i = 0; i < m; i++)                                               \
                    NAME##_store(pl, outp[i], res[i]);                                        \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        for (int64_t f = b; f < e; f++) {                                                     \
            NAME##_store(pl, pl->out + off[1], NAME##_range(pl, pl->x + off[0], 0, pl->rnumel)); \
            if (f + 1 < e)                                                                    \
                nb__cpu_index_next(pl->nk, pl->kshape, idx, 2, off, pl->kst);                 \
        }                                                                                     \
    }                                                                                         \
    /* column tiles [b, e): up to RED_TILE contiguous outputs accumulated row by row */       \
    static void NAME##_cols(void *ctx, int64_t b, int64_t e)                                  \
    {                                                                                         \
        const red_plan *pl = ctx;                                                             \
        const int nk = pl->nk, nr = pl->nr;                                                   \
        const int64_t kin = pl->kshape[nk - 1], ntiles = (kin + RED_TILE - 1) / RED_TILE;     \
        const int64_t rin = pl->rshape[nr - 1], sin = pl->rst[0][nr - 1];                     \
        ACC acc[RED_TILE];                                                                    \
        for (int64_t u = b; u < e; u++) {                                                     \
            int64_t outer = u / ntiles, t = u % ntiles, idx[NB_MAX_DIMS];                     \
            for (int d = nk - 2; d >= 0; d--) {                                               \
                idx[d] = outer % pl->kshape[d];                                               \
                outer /= pl->kshape[d];                                                       \
            }                                                                                 \
            int64_t j0 = t * RED_TILE, w = kin - j0 < RED_TILE ? kin - j0 : RED_TILE;         \
            const char *xb = pl->x + nb__cpu_offset(nk - 1, idx, pl->kst[0]) + j0 * (int64_t)sizeof(T); \
            T *o = (T *)(pl->out + nb__cpu_offset(nk - 1, idx, pl->kst[1])) + j0;             \
            for (int64_t j = 0; j < w; j++)                                                   \
                acc[j] = INIT;                                                                \
            int64_t ridx[NB_MAX_DIMS] = {0}, roff[1] = {0};                                   \
            int64_t nouter = pl->rnumel / rin;                                                \
            const int64_t block = red_col_rows(w, (int64_t)sizeof(T));                        \
            for (int64_t r = 0; r < nouter; r++) {                                            \
                for (int64_t ri = 0; ri < rin; ri += block)                                   \
                    NAME##_colacc(acc, xb + roff[0] + ri * sin, rin - ri < block ? rin - ri : block, \
                                  sin, w);                                                    \
                if (r + 1 < nouter)                                                           \
                    nb__cpu_index_next(nr - 1, pl->rshape, ridx, 1, roff, pl->rst);           \
            }                                                                                 \
            for (int64_t j = 0; j < w; j++)                                                   \
                NAME##_store(pl, (char *)(o + j), acc[j]);                                    \
        }                                                                                     \
    }                                                                                         \
    typedef struct NAME##_partials {                                                          \
        const red_plan *pl;                                                                   \
        int64_t parts;                                                                        \
        ACC part[RED_MAX_PARTIALS];                                                           \
    } NAME##_partials;                                                                        \
    static void NAME##_part(void *ctx, int64_t b, int64_t e)                                  \
    {                                                                                         \
        NAME##_partials *pp = ctx;                                                            \
        const int64_t rn = pp->pl->rnumel;                                                    \
        for (int64_t c = b; c < e; c++)                                                       \
            pp->part[c] = NAME##_range(pp->pl, pp->pl->x, rn * c / pp->parts,                 \
                                       rn * (c + 1) / pp->parts);                             \
    }                                                                                         \
    /* a column reduction split by rows (red_col_parts), eager (fd NULL) or fed: unit u is   \
     * tile u / parts over its part u % parts of the rows, into part[u] */                    \
    typedef struct NAME##_colsplit {                                                          \
        const red_plan *pl;                                                                   \
        const red_feed *fd;                                                                   \
        int64_t parts;                                                                        \
        ACC part[RED_COL_MAX_UNITS][RED_TILE];                                                \
    } NAME##_colsplit;                                                                        \
    static void NAME##_colpart(void *ctx, int64_t b, int64_t e)                               \
    {                                                                                         \
        NAME##_colsplit *cs = ctx;                                                            \
        const red_plan *pl = cs->pl;                                                          \
        const red_feed *fd = cs->fd;                                                          \
        const int64_t kin = pl->kshape[0], rn = pl->rnumel, es = (int64_t)sizeof(T);          \
        _Alignas(64) char scratch[RED_COL_SPAN * sizeof(T)];                                  \
        for (int64_t u = b; u < e; u++) {                                                     \
            const int64_t t = u / cs->parts, p = u % cs->parts, j0 = t * RED_TILE;           \
            const int64_t w = kin - j0 < RED_TILE ? kin - j0 : RED_TILE;                      \
            const int64_t lo = rn * p / cs->parts, hi = rn * (p + 1) / cs->parts;             \
            const int64_t block = red_col_rows(w, es);                                        \
            ACC *acc = cs->part[u];                                                           \
            for (int64_t j = 0; j < w; j++)                                                   \
                acc[j] = INIT;                                                                \
            for (int64_t r = lo; r < hi; r += block) {                                        \
                const int64_t m = hi - r < block ? hi - r : block;                            \
                if (!fd) {                                                                    \
                    NAME##_colacc(acc, pl->x + r * pl->rst[0][0] + j0 * es, m, pl->rst[0][0], w); \
                    continue;                                                                 \
                }                                                                             \
                const int64_t ws = red_fed_rows(fd, es, r, m, j0, w, 1, scratch, 0);          \
                NAME##_colacc(acc, scratch, m, ws, w);                                        \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* pl's column reduction split into parts row parts per tile, eager (fd NULL) or fed:    \
     * the units run over the threads, then each tile's partial columns, combined in order,  \
     * are stored */                                                                          \
    static void NAME##_colsplit_run(const red_plan *pl, const red_feed *fd, int64_t parts)    \
    {                                                                                         \
        NAME##_colsplit cs;                                                                   \
        cs.pl = pl;                                                                           \
        cs.fd = fd;                                                                           \
        cs.parts = parts;                                                                     \
        const int64_t kin = pl->kshape[0], ntiles = (kin + RED_TILE - 1) / RED_TILE;          \
        nb__parallel_for(ntiles * parts, 1, NAME##_colpart, &cs);                             \
        for (int64_t j = 0; j < kin; j++) {                                                   \
            const int64_t u0 = j / RED_TILE * parts, jt = j % RED_TILE;                       \
            ACC a = INIT;                                                                     \
            for (int64_t p = 0; p < parts; p++)                                               \
                a = COMB(a, cs.part[u0 + p][jt]);                                             \
            NAME##_store(pl, pl->out + j * pl->kst[1][0], a);                                 \
        }                                                                                     \
    }                                                                                         \
    static void NAME(const red_plan *pl, bool cols)                                           \
    {                                                                                         \
        const int64_t total = pl->knumel * pl->rnumel, parts = red_full_parts(pl);            \
        const int64_t col_parts = cols ? red_col_parts(pl) : 1;                               \
        if (col_parts > 1) {                                                                  \
            NAME##_colsplit_run(pl, NULL, col_parts);                                         \
        } else if (cols) {                                                                    \
            red_run_cols(pl, NAME##_cols, (void *)pl);                                        \
        } else if (parts) {                                                                   \
            NAME##_partials pp;                                                               \
            pp.pl = pl;                                                                       \
            pp.parts = parts;                                                                 \
            nb__parallel_for(pp.parts, 1, NAME##_part, &pp);                                  \
            NAME##_store(pl, pl->out, NAME##_combine(pp.part, pp.parts));                     \
        } else if (total < 2 * NB_CPU_GRAIN) {                                                \
            NAME##_outs((void *)pl, 0, pl->knumel);                                           \
        } else {                                                                              \
            nb__parallel_for(pl->knumel, NB_CPU_GRAIN / (pl->rnumel + 1) + 1, NAME##_outs,    \
                             (void *)pl);                                                     \
        }                                                                                     \
    }                                                                                         \
    /* NAME##_run over x's dense elements [flat, flat + n), made piece by piece in scratch:  \
     * every piece but the last is a multiple of 8, so each element meets the lane and the   \
     * order it meets in one run over memory */                                               \
    static ACC NAME##_fed_run(const red_feed *fd, char *scratch, int64_t flat, int64_t n)     \
    {                                                                                         \
        ACC a[LANES];                                                                         \
        for (int j = 0; j < LANES; j++)                                                       \
            a[j] = INIT;                                                                      \
        for (;;) {                                                                            \
            const int64_t m = n < FEED_PIECE ? n : FEED_PIECE;                                \
            fd->produce(fd->ctx, flat, m, scratch);                                           \
            if (m == n) {                                                                     \
                const int64_t ml = m - m % LANES;                                             \
                NAME##_lanes(a, (const T *)scratch, ml);                                      \
                ACC r;                                                                        \
                NAME##_close(a, (const T *)scratch + ml, m - ml, &r);                         \
                return r;                                                                     \
            }                                                                                 \
            NAME##_lanes(a, (const T *)scratch, m);                                           \
            flat += m, n -= m;                                                                \
        }                                                                                     \
    }                                                                                         \
    /* NAME##_outs for rows [b, e) of a dense x: short rows made several at a time */         \
    static void NAME##_fed_outs(void *ctx, int64_t b, int64_t e)                              \
    {                                                                                         \
        const red_feed *fd = ctx;                                                             \
        const red_plan *pl = fd->pl;                                                          \
        const int64_t rn = pl->rnumel, os = pl->kst[1][0];                                    \
        _Alignas(64) char scratch[FEED_PIECE * sizeof(T)];                                    \
        if (rn > FEED_PIECE) {                                                                \
            for (int64_t f = b; f < e; f++)                                                   \
                NAME##_store(pl, pl->out + f * os, NAME##_fed_run(fd, scratch, f * rn, rn));  \
            return;                                                                           \
        }                                                                                     \
        const int64_t batch = FEED_PIECE / rn;                                                \
        const char *rowp[FEED_PIECE];                                                         \
        ACC res[FEED_PIECE];                                                                  \
        for (int64_t f = b; f < e; f += batch) {                                              \
            const int64_t m = e - f < batch ? e - f : batch;                                  \
            fd->produce(fd->ctx, f * rn, m * rn, scratch);                                    \
            for (int64_t i = 0; i < m; i++)                                                   \
                rowp[i] = scratch + i * rn * (int64_t)sizeof(T);                              \
            NAME##_rows(res, rowp, m, rn);                                                    \
            for (int64_t i = 0; i < m; i++)                                                   \
                NAME##_store(pl, pl->out + (f + i) * os, res[i]);                             \
        }                                                                                     \
    }                                                                                         \
    /* NAME##_cols for column tiles [b, e) of a dense [rnumel, K] x: for each block of rows, \
     * the rows' pieces of up to RED_COL_GROUP neighbouring tiles of one width made into      \
     * scratch row by row (so x's inputs are read along their rows; whole rows at once where  \
     * one tile is all of K), then each tile's block accumulated as NAME##_cols does */        \
    static void NAME##_fed_cols(void *ctx, int64_t b, int64_t e)                              \
    {                                                                                         \
        const red_feed *fd = ctx;                                                             \
        const red_plan *pl = fd->pl;                                                          \
        const int64_t kin = pl->kshape[0], rn = pl->rnumel, es = (int64_t)sizeof(T);          \
        _Alignas(64) char scratch[RED_COL_GROUP][RED_COL_SPAN * sizeof(T)];                   \
        ACC acc[RED_COL_GROUP][RED_TILE];                                                     \
        for (int64_t t = b; t < e;) {                                                         \
            const int64_t j0 = t * RED_TILE, w = kin - j0 < RED_TILE ? kin - j0 : RED_TILE;   \
            int64_t g = 1; /* the full tiles after t join it; a narrower last one goes alone */ \
            while (w == RED_TILE && g < RED_COL_GROUP && t + g < e && kin - j0 - g * RED_TILE >= RED_TILE) \
                g++;                                                                          \
            const int64_t block = red_col_rows(w, es);                                        \
            for (int64_t q = 0; q < g; q++)                                                   \
                for (int64_t j = 0; j < w; j++)                                               \
                    acc[q][j] = INIT;                                                         \
            for (int64_t r = 0; r < rn; r += block) {                                         \
                const int64_t m = rn - r < block ? rn - r : block;                            \
                const int64_t ws = red_fed_rows(fd, es, r, m, j0, w, g, scratch[0], (int64_t)sizeof scratch[0]); \
                for (int64_t q = 0; q < g; q++)                                               \
                    NAME##_colacc(acc[q], scratch[q], m, ws, w);                              \
            }                                                                                 \
            for (int64_t q = 0; q < g; q++)                                                   \
                for (int64_t j = 0; j < w; j++)                                               \
                    NAME##_store(pl, pl->out + (j0 + q * RED_TILE + j) * es, acc[q][j]);      \
            t += g;                                                                           \
        }                                                                                     \
    }                                                                                         \
    typedef struct NAME##_fed_partials {                                                      \
        const red_feed *fd;                                                                   \
        int64_t parts;                                                                        \
        ACC part[RED_MAX_PARTIALS];                                                           \
    } NAME##_fed_partials;                                                                    \
    static void NAME##_fed_part(void *ctx, int64_t b, int64_t e)                              \
    {                                                                                         \
        NAME##_fed_partials *pp = ctx;                                                        \
        const int64_t rn = pp->fd->pl->rnumel;                                                \
        _Alignas(64) char scratch[FEED_PIECE * sizeof(T)];                                    \
        for (int64_t c = b; c < e; c++) {                                                     \
            const int64_t lo = rn * c / pp->parts, hi = rn * (c + 1) / pp->parts;             \
            pp->part[c] = NAME##_fed_run(pp->fd, scratch, lo, hi - lo);                       \
        }                                                                                     \
    }                                                                                         \
    /* NAME's splits and combining order, x made by fd->produce */                            \
    static void NAME##_fed(const red_feed *fd)                                                \
    {                                                                                         \
        const red_plan *pl = fd->pl;                                                          \
        const int64_t parts = red_full_parts(pl), col_parts = fd->cols ? red_col_parts(pl) : 1; \
        if (col_parts > 1) {                                                                  \
            NAME##_colsplit_run(pl, fd, col_parts);                                           \
        } else if (fd->cols) {                                                                \
            red_run_cols(pl, NAME##_fed_cols, (void *)fd);                                    \
        } else if (parts) {                                                                   \
            NAME##_fed_partials pp;                                                           \
            pp.fd = fd;                                                                       \
            pp.parts = parts;                                                                 \
            nb__parallel_for(pp.parts, 1, NAME##_fed_part, &pp);                              \
            NAME##_store(pl, pl->out, NAME##_combine(pp.part, pp.parts));                     \
        } else if (pl->knumel * pl->rnumel < 2 * fd->grain) {                                 \
            NAME##_fed_outs((void *)fd, 0, pl->knumel);                                       \
        } else { /* rows are independent: any split gives the same bits */                    \
            nb__parallel_for(pl->knumel, fd->grain / (pl->rnumel + 1) + 1, NAME##_fed_outs,   \
                             (void *)fd);                                                     \
        }                                                                                     \
    }

#define ADD(a, v) ((a) + (v))
#define MUL(a, v) ((a) * (v))
/* Two selects, not (v > a || v != v): GCC makes that branches, which keep
 * the lanes from vectorising. */
#define FMAX(a, v) ((v) != (v) ? (v) : (v) > (a) ? (v) : (a))
#define FMIN(a, v) ((v) != (v) ? (v) : (v) < (a) ? (v) : (a))
#define IMAX(a, v) ((v) > (a) ? (v) : (a))
#define IMIN(a, v) ((v) < (a) ? (v) : (a))
#define UADD(a, v) ((int64_t)((uint64_t)(a) + (uint64_t)(v)))
#define UMUL(a, v) ((int64_t)((uint64_t)(a) * (uint64_t)(v)))
#define FDIV(acc, n) ((acc) / (double)(n))
#define IDIV(acc, n) ((n) ? (acc) / (int64_t)(n) : 0)

RED_IMPL(red_sum_f32, float, double, 0.0, ADD, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_sum_f64, double, double, 0.0, ADD, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_sum_i32, int32_t, int64_t, 0, UADD, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_sum_i64, int64_t, int64_t, 0, UADD, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_prod_f32, float, double, 1.0, MUL, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_prod_f64, double, double, 1.0, MUL, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_prod_i32, int32_t, int64_t, 1, UMUL, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_prod_i64, int64_t, int64_t, 1, UMUL, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_max_f32, float, float, -INFINITY, FMAX, FDIV, RED_LANES_FLOAT, RED_SIMD_COPIES)
RED_IMPL(red_max_f64, double, double, -INFINITY, FMAX, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_max_i32, int32_t, int32_t, INT32_MIN, IMAX, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_max_i64, int64_t, int64_t, INT64_MIN, IMAX, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_min_f32, float, float, INFINITY, FMIN, FDIV, RED_LANES_FLOAT, RED_SIMD_COPIES)
RED_IMPL(red_min_f64, double, double, INFINITY, FMIN, FDIV, RED_LANES_DOUBLE, RED_SIMD_COPIES)
RED_IMPL(red_min_i32, int32_t, int32_t, INT32_MAX, IMIN, IDIV, RED_LANES_INT, RED_SCALAR_COPY)
RED_IMPL(red_min_i64, int64_t, int64_t, INT64_MAX, IMIN, IDIV, RED_LANES_INT, RED_SCALAR_COPY)

typedef void (*red_fn)(const red_plan *pl, bool cols);
typedef void (*red_fed_fn)(const red_feed *fd);
typedef struct red_entry {
    red_fn run;
    red_fed_fn fed;
} red_entry;
#define RED_DT(name, dt) {red_##name##_##dt, red_##name##_##dt##_fed}
#define RED_ENTRY(OP, name)                                                                   \
    [OP] = {[NB_F32] = RED_DT(name, f32), [NB_F64] = RED_DT(name, f64),                       \
            [NB_I32] = RED_DT(name, i32), [NB_I64] = RED_DT(name, i64)}
static const red_entry red_table[5][NB_DTYPE_COUNT] = {
    RED_ENTRY(NB_RED_SUM, sum), RED_ENTRY(NB_RED_MEAN, sum), RED_ENTRY(NB_RED_MAX, max),
    RED_ENTRY(NB_RED_MIN, min), RED_ENTRY(NB_RED_PROD, prod),
};
static const char *const red_names[5] = {"sum", "mean", "max", "min", "prod"};

/* Checks the call and coalesces its dims into *pl (its table entry in *e,
 * whether columns accumulate row by row in *cols). Fails as nb__cpu_reduce
 * does, or where quiet returns the code and records nothing (a query);
 * out->numel == 0 is left to the caller. */
#define RED_FAIL(code, ...) (quiet ? (code) : nb__fail(code, __VA_ARGS__))
static nb_status red_setup(nb_device *dev, bool quiet, nb_reduce_op op, const nb_view *out, const nb_view *x,
                           red_plan *pl, const red_entry **e, bool *cols)
{
    if ((unsigned)op > NB_RED_PROD)
        return RED_FAIL(NB_ERR_INVALID_ARGUMENT, "reduce: unknown op %d", (int)op);
    *e = (unsigned)x->dtype < NB_DTYPE_COUNT ? &red_table[op][x->dtype] : NULL;
    if (!*e || !(*e)->run)
        return quiet ? NB_ERR_DTYPE : nb__cpu_unsupported(dev, red_names[op], x->dtype);
    if (out->dtype != x->dtype)
        return RED_FAIL(NB_ERR_DTYPE, "%s: output dtype %s differs from input dtype %s",
                        red_names[op], nb_dtype_name(out->dtype), nb_dtype_name(x->dtype));
    if (out->ndim != x->ndim)
        return RED_FAIL(NB_ERR_SHAPE, "%s: output has %d dims, input %d", red_names[op],
                        out->ndim, x->ndim);
    pl->nk = pl->nr = 0;
    pl->knumel = pl->rnumel = 1;
    pl->x = (const char *)x->data;
    pl->out = (char *)out->data;
    pl->mean = op == NB_RED_MEAN;
    for (int d = 0; d < x->ndim; d++) {
        int64_t size = x->shape[d], xs = x->strides[d];
        if (size == 1)
            continue;
        if (out->shape[d] == 1) {
            pl->rnumel *= size;
            if (pl->nr > 0 && pl->rst[0][pl->nr - 1] == xs * size) {
                pl->rshape[pl->nr - 1] *= size;
                pl->rst[0][pl->nr - 1] = xs;
            } else {
                pl->rshape[pl->nr] = size;
                pl->rst[0][pl->nr++] = xs;
            }
        } else {
            if (out->shape[d] != size)
                return RED_FAIL(NB_ERR_SHAPE, "%s: output dim %d is %lld, input's %lld",
                                red_names[op], d, (long long)out->shape[d], (long long)size);
            pl->knumel *= size;
            nb__cpu_append_dim(&pl->nk, pl->kshape, pl->kst, size, xs, out->strides[d]);
        }
    }
    const int64_t es = nb__cpu_esize(x->dtype);
    nb__cpu_one_dim_at_least(&pl->nk, pl->kshape, pl->kst);
    if (pl->nr == 0) {
        pl->nr = 1;
        pl->rshape[0] = 1;
        pl->rst[0][0] = es;
    }
    if (pl->rnumel == 0) { /* an empty reduction: the identity everywhere */
        pl->nr = 1;
        pl->rshape[0] = 0;
        pl->rst[0][0] = es;
    }
    *cols = pl->rst[0][pl->nr - 1] != es && pl->rnumel > 1 && pl->kst[0][pl->nk - 1] == es &&
            pl->kst[1][pl->nk - 1] == es && pl->kshape[pl->nk - 1] >= 4;
    return NB_OK;
}

nb_status nb__cpu_reduce(nb_device *dev, nb_reduce_op op, const nb_view *out, const nb_view *x)
{
    red_plan pl;
    const red_entry *e = NULL;
    bool cols = false;
    nb_status st = red_setup(dev, false, op, out, x, &pl, &e, &cols);
    if (st || out->numel == 0)
        return st;
    e->run(&pl, cols);
    return NB_OK;
}

/* The plan of a reduction a producer can feed: dense x and a dense out, the
 * reduced dims trailing (one run per output, or a full reduction's chunks) or
 * leading (column tiles, *cols set). */
static bool fed_setup(nb_reduce_op op, const nb_view *out, const nb_view *x, red_plan *pl,
                      const red_entry **e, bool *cols)
{
    *cols = false;
    if (!nb__view_is_contiguous(x) || x->numel <= 0 || red_setup(NULL, true, op, out, x, pl, e, cols) ||
        !(*e)->fed)
        return false;
    const int64_t es = nb__cpu_esize(x->dtype);
    if (pl->nr != 1 || pl->nk != 1)
        return false;
    if (*cols) /* the kept dims contiguous in x and out (red_setup's test), the reduced ones above them */
        return pl->rst[0][0] == pl->knumel * es;
    return pl->rst[0][0] == es && (pl->knumel == 1 || pl->kst[0][0] == pl->rnumel * es);
}

bool nb__cpu_reduce_can_feed(nb_reduce_op op, const nb_view *out, const nb_view *x)
{
    red_plan pl;
    const red_entry *e = NULL;
    bool cols;
    if (!fed_setup(op, out, x, &pl, &e, &cols))
        return false;
    /* A fed column reduction runs the chain inside the column tiles' split,
     * which has few tasks unless the rows split too (red_col_parts): with two
     * threads it measured slower than the chain apart ([100000, 100] f32:
     * 15.5 ms against 12.9), with one faster (18.1 against 18.8; [4096, 1024]:
     * 7.6 against 9.1). So only where kernels run on one thread or the rows
     * split. Asked when the step is planned: a replay feeds what was planned
     * whatever the threads then. */
    return !cols || nb__thread_count() == 1 || nb__thread_serial() || red_col_parts(&pl) > 1;
}

bool nb__cpu_reduce_fed(nb_reduce_op op, const nb_view *out, const nb_view *x, nb_cpu_produce_fn produce,
                        void *ctx, bool heavy)
{
    red_plan pl;
    const red_entry *e = NULL;
    bool cols;
    if (!fed_setup(op, out, x, &pl, &e, &cols))
        return false;
    red_feed fd = {&pl, produce, ctx, heavy ? NB_CPU_GRAIN_HEAVY : NB_CPU_GRAIN, cols};
    e->fed(&fd);
    return true;
}

/* ---- arg_reduce ------------------------------------------------------------------------- */

typedef struct arg_plan {
    int nk;
    int64_t kshape[NB_MAX_DIMS];
    int64_t kst[2][NB_MAX_DIMS];
    int64_t len, stride; /* along the axis */
    const char *x;
    char *out;
} arg_plan;

#define ARG_IMPL(NAME, T, BETTER)                                                             \
    static void NAME(void *ctx, int64_t b, int64_t e)                                         \
    {                                                                                         \
        const arg_plan *pl = ctx;                                                             \
        int64_t idx[NB_MAX_DIMS], off[2];                                                     \
        nb__cpu_index_at(pl->nk, pl->kshape, b, idx, 2, off, pl->kst);                         \
        const int64_t len = pl->len, s = pl->stride;                                          \
        for (int64_t f = b; f < e; f++) {                                                     \
            const char *p = pl->x + off[0];                                                   \
            T best = *(const T *)p;                                                           \
            int64_t bi = 0;                                                                   \
            for (int64_t i = 1; i < len; i++) {                                               \
                const T v = *(const T *)(p + i * s);                                          \
                if (BETTER(v, best)) {                                                        \
                    best = v;                                                                 \
                    bi = i;                                                                   \
                }                                                                             \
            }                                                                                 \
            *(int64_t *)(pl->out + off[1]) = bi;                                              \
            if (f + 1 < e)                                                                    \
                nb__cpu_index_next(pl->nk, pl->kshape, idx, 2, off, pl->kst);                 \
        }                                                                                     \
    }
#define FGT(v, best) ((v) > (best) || ((v) != (v) && (best) == (best)))
#define FLT(v, best) ((v) < (best) || ((v) != (v) && (best) == (best)))
#define IGT(v, best) ((v) > (best))
#define ILT(v, best) ((v) < (best))
ARG_IMPL(argmax_f32, float, FGT)
ARG_IMPL(argmax_f64, double, FGT)
ARG_IMPL(argmax_i32, int32_t, IGT)
ARG_IMPL(argmax_i64, int64_t, IGT)
ARG_IMPL(argmax_u8, uint8_t, IGT)
ARG_IMPL(argmin_f32, float, FLT)
ARG_IMPL(argmin_f64, double, FLT)
ARG_IMPL(argmin_i32, int32_t, ILT)
ARG_IMPL(argmin_i64, int64_t, ILT)
ARG_IMPL(argmin_u8, uint8_t, ILT)

static const nb_range_fn arg_table[2][NB_DTYPE_COUNT] = {
    {[NB_F32] = argmin_f32, [NB_F64] = argmin_f64, [NB_I32] = argmin_i32,
     [NB_I64] = argmin_i64, [NB_BOOL] = argmin_u8, [NB_U8] = argmin_u8},
    {[NB_F32] = argmax_f32, [NB_F64] = argmax_f64, [NB_I32] = argmax_i32,
     [NB_I64] = argmax_i64, [NB_BOOL] = argmax_u8, [NB_U8] = argmax_u8},
};

nb_status nb__cpu_arg_reduce(nb_device *dev, bool is_max, const nb_view *out, const nb_view *x,
                             int axis)
{
    const char *name = is_max ? "argmax" : "argmin";
    nb_range_fn fn = (unsigned)x->dtype < NB_DTYPE_COUNT ? arg_table[is_max][x->dtype] : NULL;
    if (!fn)
        return nb__cpu_unsupported(dev, name, x->dtype);
    if (out->dtype != NB_I64)
        return nb__fail(NB_ERR_DTYPE, "%s: output dtype %s is not i64", name,
                        nb_dtype_name(out->dtype));
    if (axis < 0)
        axis += x->ndim;
    if (axis < 0 || axis >= x->ndim || out->ndim != x->ndim)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d out of range for %d dims", name,
                        axis, x->ndim);
    if (out->numel == 0)
        return NB_OK;
    if (x->shape[axis] == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: axis %d is empty", name, axis);
    arg_plan pl;
    pl.nk = 0;
    pl.len = x->shape[axis];
    pl.stride = x->strides[axis];
    pl.x = (const char *)x->data;
    pl.out = (char *)out->data;
    int64_t kn = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == axis || x->shape[d] == 1)
            continue;
        nb__cpu_append_dim(&pl.nk, pl.kshape, pl.kst, x->shape[d], x->strides[d], out->strides[d]);
        kn *= x->shape[d];
    }
    nb__cpu_one_dim_at_least(&pl.nk, pl.kshape, pl.kst);
    if (kn * pl.len < 2 * NB_CPU_GRAIN)
        fn(&pl, 0, kn);
    else
        nb__parallel_for(kn, NB_CPU_GRAIN / pl.len + 1, fn, &pl);
    return NB_OK;
}
