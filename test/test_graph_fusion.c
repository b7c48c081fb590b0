/* Fused elementwise chains in a recorded step (nb_graph_set_fusion): a
 * replay with fusion gives the same bits as the step run eagerly and as a
 * replay without it — f32, f64 and i32 (and f16, bf16, i64 on a GPU), sizes
 * around the CPU's tile (1, 255, 256, 257) and past the threads' split,
 * a product and a sum (rounded apart, never one fma),
 * inputs with 0, -0, ±inf and NaN, a broadcast operand, a comparison, an
 * in-place update, a temporary that a later call still reads, one the step
 * returns, casts (f32 to f16, bf16 and back, to i32, at their rounding and
 * edge points), where (a leaky ReLU, NaN and inf in the branch not taken, a
 * broadcast condition), a training step with a tape and an optimizer, and 150 random
 * steps (40 on a GPU) (chains of 4 to 24 ops, casts, wheres, views, broadcasts, transposes, overlapping
 * slices, sums, means, maxima, minima and products of temporaries, whole or by
 * rows or columns, inner scopes whose temporaries die, in-place updates of a
 * variable) — and the chain replaces its calls (fewer nodes). On the CPU a
 * chain whose result only a reduction reads runs into it (mean((a - b)^2),
 * sum(exp(x)), max, min, prod; all or rows; f32, f64, i32, i64; sizes around
 * the tile and the producer's piece of 256 and the reduction's chunks of 32768;
 * columns, K around the column tile of 256), one node fewer, the same bits; a
 * transposed view and a result read after the reduction stay apart.
 *
 *   test_graph_fusion [--gpu]    (--gpu: the same on /gpu:0, where each chain
 *                                 is one kernel compiled by NVRTC; 77 without) */
#include "check.h"

#include <math.h>

static const char *g_device = "/cpu:0";
static bool g_gpu;
static int g_poison; /* NB_DEBUG_POISON=1: every new output is filled first, a recorded call */

/* n values of dt from seed, every 7th an edge point. */
static nb_tensor *values(nb_dtype dt, int64_t n, uint64_t seed)
{
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    static const double edges[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-30, -88.5};
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        v[i] = dt == NB_I32 || dt == NB_I64 ? floor(u * 4e9 - 2e9) : i % 7 == 3 ? edges[(i / 7) % 7] : 6 * u - 3;
    }
    nb_tensor *t = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(n), v), dt);
    free(v);
    return t;
}

/* t's values in (-1, 1), NaN taken to 0: sums that tell inputs apart. */
static nb_tensor *finite_values(nb_tensor *t)
{
    t = nb_tanh(t);
    return nb_where(nb_equal(t, t), t, nb_zeros_like(t));
}

/* ---- steps ---- */

/* exp((a + b) * c), its temporaries let go inside the step. */
static nb_status chain_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    nb_dtype dt = nb_tensor_dtype(in[0]);
    nb_tensor *r = dt == NB_I32 || dt == NB_I64 ? nb_mul(nb_add(in[0], in[1]), in[2])
                                                    : nb_exp(nb_mul(nb_add(in[0], in[1]), in[2]));
    out[0] = nb_keep(r);
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* a * b + c: the fused kernel must round the product before the sum, as
 * two kernels do (a GPU compiler would contract them into one fma). */
static nb_status madd_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_add(nb_mul(in[0], in[1]), in[2]));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* The sum t = a + b kept as an output, then t * c - a and (t > c). */
static nb_status kept_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    nb_tensor *t = nb_add(in[0], in[1]);
    out[0] = nb_keep(t);
    out[1] = nb_keep(nb_sub(nb_mul(t, in[2]), in[0]));
    out[2] = nb_keep(nb_greater(t, in[2]));
    nb_scope_end(s);
    return out[0] && out[1] && out[2] ? NB_OK : nb_error();
}

/* The chain's first result read again after it by a reduction. */
static nb_status read_after_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    nb_tensor *t = nb_add(in[0], in[1]);
    out[0] = nb_keep(nb_tanh(nb_mul(t, in[2])));
    out[1] = nb_keep(nb_sum_all(t));
    nb_scope_end(s);
    return out[0] && out[1] ? NB_OK : nb_error();
}

/* relu(x + bias) * 0.5 with bias [cols] broadcast over rows. */
static nb_status bias_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_mul_scalar(nb_relu(nb_add(in[0], in[1])), 0.5));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* x through f16 and back, through bf16 and back, and (1000 x) to i32. */
static nb_status cast_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_cast(nb_cast(in[0], NB_F16), NB_F32));
    out[1] = nb_keep(nb_cast(nb_cast(in[0], NB_BF16), NB_F32));
    out[2] = nb_keep(nb_cast(nb_mul_scalar(in[0], 1000.0), NB_I32));
    nb_scope_end(s);
    return out[0] && out[1] && out[2] ? NB_OK : nb_error();
}

/* where(x > 0, x, 0.1 x), the zeros made in the step. */
static nb_status leaky_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = in[0];
    out[0] = nb_keep(nb_where(nb_greater(x, nb_zeros_like(x)), x, nb_mul_scalar(x, 0.1)));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* where(a > b, exp(a), log(b)): inf and NaN in both branches, taken or not. */
static nb_status select_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_where(nb_greater(in[0], in[1]), nb_exp(in[0]), nb_log(in[1])));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* tanh(where(cond, x, y) * x) with cond [cols] (bool) broadcast over rows. */
static nb_status row_select_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_scope *s = nb_scope_begin();
    out[0] = nb_keep(nb_tanh(nb_mul(nb_where(in[2], in[0], in[1]), in[0])));
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* ---- capture helpers ---- */

typedef nb_status (*step_fn)(void *, int, nb_tensor *const *, int, nb_tensor **);

/* Captures fn with fusion on or off, replays it on `later`, and checks each
 * replay's outputs against the step run eagerly on the same inputs. Returns
 * the graph's node count (-1 on failure). */
static int64_t check_replays(step_fn fn, void *user, bool fuse, int n_in, nb_tensor *const *first,
                             nb_tensor *const *later, int n_out)
{
    bool was = nb_graph_set_fusion(fuse);
    nb_graph *g = NULL;
    nb_tensor *got[4] = {0}, *want[4] = {0};
    nb_status st = nb_graph_capture(g_device, fn, user, n_in, first, n_out, got, &g);
    nb_graph_set_fusion(was);
    CHECK_OK(st);
    if (st)
        return -1;
    CHECK(nb_graph_recorded(g));
    int64_t nodes = nb_graph_nodes(g);
    for (int rep = 0; rep < 3; rep++) {
        nb_tensor *const *in = rep % 2 ? first : later;
        CHECK_OK(nb_graph_replay(g, in, got));
        CHECK_OK(fn(user, n_in, in, n_out, want));
        for (int o = 0; o < n_out; o++)
            CHECKF(same_bits(got[o], want[o]), "output %d of replay %d (fusion %s)", o, rep, fuse ? "on" : "off");
    }
    nb_graph_free(g);
    return nodes;
}

/* ---- cases ---- */

static void chain_bits(void)
{
    static const int64_t sizes[] = {1, 255, 256, 257, 5000, 70001};
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_F16, NB_BF16, NB_I64};
    for (size_t d = 0; d < (g_gpu ? 6u : 3u); d++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int64_t n = sizes[k];
            nb_tensor *first[3], *later[3];
            for (int i = 0; i < 3; i++) {
                first[i] = values(dts[d], n, 10 + (uint64_t)i);
                later[i] = values(dts[d], n, 20 + (uint64_t)i);
            }
            int64_t fused = check_replays(chain_step, NULL, true, 3, first, later, 1);
            int64_t plain = check_replays(chain_step, NULL, false, 3, first, later, 1);
            /* add, mul[, exp] (each after its output's poison fill under
             * NB_DEBUG_POISON) as one call */
            bool ints = dts[d] == NB_I32 || dts[d] == NB_I64;
            CHECKF(g_gpu ? fused < plain : plain == (ints ? 2 : 3) * (1 + g_poison) && fused == 1, "%s n=%lld: %lld nodes fused, %lld not",
                   nb_dtype_name(dts[d]), (long long)n, (long long)fused, (long long)plain);
            fused = check_replays(madd_step, NULL, true, 3, first, later, 1);
            plain = check_replays(madd_step, NULL, false, 3, first, later, 1);
            CHECKF(g_gpu ? fused < plain : plain == 2 * (1 + g_poison) && fused == 1,
                   "a * b + c, %s n=%lld: %lld nodes fused, %lld not", nb_dtype_name(dts[d]), (long long)n,
                   (long long)fused, (long long)plain);
        }
    }
}

static void kept_and_read_after(void)
{
    nb_tensor *first[3], *later[3];
    for (int i = 0; i < 3; i++) {
        first[i] = values(NB_F32, 3000, 30 + (uint64_t)i);
        later[i] = values(NB_F32, 3000, 40 + (uint64_t)i);
    }
    int64_t fused = check_replays(kept_step, NULL, true, 3, first, later, 3);
    int64_t plain = check_replays(kept_step, NULL, false, 3, first, later, 3);
    CHECKF(g_gpu ? fused < plain : fused == 1 && plain == 4 * (1 + g_poison), "kept: %lld nodes fused, %lld not", (long long)fused, (long long)plain);
    for (int i = 0; i < 3; i++) { /* the sum must differ between the inputs */
        first[i] = finite_values(first[i]);
        later[i] = finite_values(later[i]);
    }
    fused = check_replays(read_after_step, NULL, true, 3, first, later, 2);
    plain = check_replays(read_after_step, NULL, false, 3, first, later, 2);
    /* t is read by the chain and then only by the sum: the chain runs into
     * the sum (t never stored), the sum's poison fill (another shape) a call
     * of its own ahead of it */
    CHECKF(g_gpu ? fused < plain : fused == 1 + g_poison && plain == 4 * (1 + g_poison), "read after: %lld nodes fused, %lld not", (long long)fused, (long long)plain);
}

static void broadcast(void)
{
    nb_tensor *first[2] = {nb_reshape(values(NB_F64, 7 * 33, 1), NB_SHAPE(7, 33)), values(NB_F64, 33, 2)};
    nb_tensor *later[2] = {nb_reshape(values(NB_F64, 7 * 33, 3), NB_SHAPE(7, 33)), values(NB_F64, 33, 4)};
    int64_t fused = check_replays(bias_step, NULL, true, 2, first, later, 1);
    CHECKF(fused == 1, "bias: %lld nodes fused", (long long)fused);
    /* a transposed operand: the chain walks strided memory */
    nb_tensor *tf[2] = {nb_transpose(first[0], 0, 1), nb_reshape(values(NB_F64, 7, 5), NB_SHAPE(7))};
    nb_tensor *tl[2] = {nb_transpose(later[0], 0, 1), nb_reshape(values(NB_F64, 7, 6), NB_SHAPE(7))};
    fused = check_replays(bias_step, NULL, true, 2, tf, tl, 1);
    CHECKF(fused >= 1, "transposed: %lld nodes", (long long)fused);
}

/* n f32 values: the edge points and the points where f16, bf16 and i32
 * round, tie or overflow, then random ones, from seed. */
static nb_tensor *cast_values(int64_t n, uint64_t seed)
{
    static const double edges[] = {
        0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN,
        1.0 + 0x1p-11, 1.0 + 0x3p-11, 1.0 + 0x1p-12, 65504.0, 65519.0, 65520.0, -65520.0, /* f16: ties, overflow */
        0x1p-24, 0x1p-25, 0x3p-26, 1e-8, -0x1p-14,                                       /* f16 subnormals */
        1.0 + 0x1p-8, 1.0 + 0x3p-8, 1.0 + 0x1p-9, 0x1.ffp127, -0x1.ff8p127, 3.4e38,       /* bf16 */
        0x1p-130, -0x1p-149, 1e-45,                                                      /* f32 subnormals */
        2147483.5, -2147483.648, 2147484.0, -2147485.0, 2.5e-4, -0.0009, 1e30, -1e30,     /* x 1000 to i32 */
    };
    enum { N_EDGES = sizeof edges / sizeof *edges };
    double *v = malloc(sizeof(double) * (size_t)n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        v[i] = i < N_EDGES ? edges[(i + (int64_t)seed) % N_EDGES] : (u - 0.5) * ldexp(1.0, (int)(s % 40) - 20);
    }
    nb_tensor *t = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(n), v), NB_F32);
    free(v);
    return t;
}

static void cast_chain(void)
{
    static const int64_t sizes[] = {37, 257, 70001};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        nb_tensor *first[1] = {cast_values(sizes[k], 1)}, *later[1] = {cast_values(sizes[k], 2)};
        int64_t fused = check_replays(cast_step, NULL, true, 1, first, later, 3);
        int64_t plain = check_replays(cast_step, NULL, false, 1, first, later, 3);
        /* five casts and a scale (each after its poison fill) as one call */
        CHECKF(g_gpu ? fused < plain : fused == 1 && plain == 6 * (1 + g_poison), "n=%lld: %lld nodes fused, %lld not",
               (long long)sizes[k], (long long)fused, (long long)plain);
    }
    /* the values the casts give, by the rules nb_cast states */
    nb_tensor *x = nb_from_buffer(NB_F64, NB_SHAPE(6), (double[]){1.0 + 0x1p-11, 1.0 + 0x3p-11, 65520.0, NAN, -0.0, 3e9});
    x = nb_cast(x, NB_F32);
    nb_tensor *got[3];
    CHECK_OK(cast_step(NULL, 1, &x, 3, got));
    float h[6], b[6];
    int32_t i[6];
    CHECK_OK(nb_tensor_read(got[0], h, sizeof h));
    CHECK_OK(nb_tensor_read(got[1], b, sizeof b));
    CHECK_OK(nb_tensor_read(got[2], i, sizeof i));
    CHECK(h[0] == 1.0f && h[1] == 1.0f + 0x1p-9f && isinf(h[2]) && isnan(h[3]) && h[4] == 0 && signbit(h[4]));
    CHECK(b[0] == 1.0f && b[2] == 65536.0f && isnan(b[3]) && signbit(b[4]));
    CHECK(i[0] == 1000 && i[3] == 0 && i[5] == INT32_MAX);
}

static void where_chains(void)
{
    static const int64_t sizes[] = {1, 300, 70001};
    static const nb_dtype dts[] = {NB_F32, NB_F64};
    for (size_t d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int64_t n = sizes[k];
            nb_tensor *first[2] = {values(dts[d], n, 50), values(dts[d], n, 51)};
            nb_tensor *later[2] = {values(dts[d], n, 52), values(dts[d], n, 53)};
            int64_t fused = check_replays(leaky_step, NULL, true, 1, first, later, 1);
            int64_t plain = check_replays(leaky_step, NULL, false, 1, first, later, 1);
            /* zeros, x > 0, 0.1 x and where (each after its poison fill) as one call */
            CHECKF(g_gpu ? fused < plain : fused == 1 && plain == 4 * (1 + g_poison),
                   "leaky %s n=%lld: %lld nodes fused, %lld not", nb_dtype_name(dts[d]), (long long)n, (long long)fused,
                   (long long)plain);
            fused = check_replays(select_step, NULL, true, 2, first, later, 1);
            plain = check_replays(select_step, NULL, false, 2, first, later, 1);
            CHECKF(g_gpu ? fused < plain : fused == 1 && plain == 4 * (1 + g_poison),
                   "select %s n=%lld: %lld nodes fused, %lld not", nb_dtype_name(dts[d]), (long long)n, (long long)fused,
                   (long long)plain);
        }
    }
    /* the leaky ReLU's values */
    nb_tensor *x = nb_from_buffer(NB_F32, NB_SHAPE(4), (float[]){2.0f, -2.0f, -0.0f, NAN});
    nb_tensor *y;
    CHECK_OK(leaky_step(NULL, 1, &x, 1, &y));
    float v[4];
    CHECK_OK(nb_tensor_read(y, v, sizeof v));
    CHECK(v[0] == 2.0f && v[1] == -2.0f * 0.1f && v[2] == 0 && signbit(v[2]) && isnan(v[3]));
    /* a condition [cols] broadcast over rows */
    int64_t rows = 9, cols = 41;
    nb_tensor *first[3] = {nb_reshape(values(NB_F32, rows * cols, 60), NB_SHAPE(rows, cols)),
                           nb_reshape(values(NB_F32, rows * cols, 61), NB_SHAPE(rows, cols)),
                           nb_greater(values(NB_F32, cols, 62), nb_zeros(NB_F32, NB_SHAPE(cols)))};
    nb_tensor *later[3] = {nb_reshape(values(NB_F32, rows * cols, 63), NB_SHAPE(rows, cols)),
                           nb_reshape(values(NB_F32, rows * cols, 64), NB_SHAPE(rows, cols)),
                           nb_greater(values(NB_F32, cols, 65), nb_zeros(NB_F32, NB_SHAPE(cols)))};
    int64_t fused = check_replays(row_select_step, NULL, true, 3, first, later, 1);
    int64_t plain = check_replays(row_select_step, NULL, false, 3, first, later, 1);
    CHECKF(g_gpu ? fused < plain : fused == 1 && plain == 3 * (1 + g_poison), "broadcast cond: %lld nodes fused, %lld not",
           (long long)fused, (long long)plain);
}

/* ---- chains that run into a reduction ---- */

typedef enum { R_MSE, R_SUM_EXP, R_SUM_INT, R_MAX, R_MIN, R_PROD } red_chain;
typedef enum { AX_ALL, AX_ROWS, AX_COLS, AX_TRANSPOSED, AX_READ_AFTER } red_axes;
typedef struct red_case {
    red_chain chain;
    red_axes axes;
} red_case;

/* The chain's result on [rows, cols] inputs a, b: what the reduction reads. */
static nb_tensor *red_chain_of(red_chain c, nb_tensor *a, nb_tensor *b)
{
    switch (c) {
    case R_MSE: return nb_square(nb_sub(a, b));
    case R_SUM_EXP: return nb_exp(a);
    case R_SUM_INT: return nb_add(nb_mul(a, b), a);
    case R_MAX: return nb_add(nb_mul(a, b), a);
    case R_MIN: return nb_sub(a, nb_mul(b, b));
    case R_PROD: return nb_add_scalar(nb_mul_scalar(nb_mul(a, b), 1.0 / 64), 1.0); /* near 1: products stay finite */
    }
    return NULL;
}

static nb_tensor *red_of(red_chain c, nb_tensor *t, nb_axes axes)
{
    switch (c) {
    case R_MSE: return nb_mean(t, axes, false);
    case R_SUM_EXP: case R_SUM_INT: return nb_sum(t, axes, false);
    case R_MAX: return nb_max(t, axes, false);
    case R_MIN: return nb_min(t, axes, false);
    case R_PROD: return nb_prod(t, axes, false);
    }
    return NULL;
}

/* The chain of c on in[0], in[1], then its reduction; the chain's temporaries let go. */
static nb_status reduce_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)n_out;
    const red_case *c = user;
    nb_scope *s = nb_scope_begin();
    nb_tensor *t = red_chain_of(c->chain, in[0], in[1]);
    switch (c->axes) {
    case AX_ALL: out[0] = red_of(c->chain, t, NB_ALL_AXES); break;
    case AX_ROWS: out[0] = red_of(c->chain, t, NB_AXES(-1)); break;
    case AX_COLS: out[0] = red_of(c->chain, t, NB_AXES(0)); break;
    case AX_TRANSPOSED: out[0] = red_of(c->chain, nb_transpose(t, 0, 1), NB_AXES(-1)); break;
    case AX_READ_AFTER: /* t is read again after the reduction */
        out[0] = red_of(c->chain, t, NB_ALL_AXES);
        out[1] = nb_keep(nb_mul_scalar(t, 2.0));
        break;
    }
    out[0] = nb_keep(out[0]);
    nb_scope_end(s);
    return out[0] ? NB_OK : nb_error();
}

/* check_replays with the reduce calls kept apart from the chains (fusion of
 * the chains only, NB_GRAPH_FUSE_REDUCE=0). */
static int64_t check_replays_chains_only(step_fn fn, void *user, int n_in, nb_tensor *const *first,
                                         nb_tensor *const *later, int n_out)
{
    setenv("NB_GRAPH_FUSE_REDUCE", "0", 1);
    int64_t nodes = check_replays(fn, user, true, n_in, first, later, n_out);
    unsetenv("NB_GRAPH_FUSE_REDUCE");
    return nodes;
}

/* Replays c on [rows, cols] inputs of dt (edge points, or finite values
 * whose sums tell the inputs apart), with the reduction fused, with the
 * chains fused only, and unfused, each against eager; returns how many
 * nodes fusing the reduction saved (-1 on a failure). */
static int64_t check_reduce(red_case c, nb_dtype dt, int64_t rows, int64_t cols, bool finite, uint64_t seed)
{
    nb_scope *s = nb_scope_begin();
    nb_tensor *first[2], *later[2];
    for (int i = 0; i < 2; i++) {
        first[i] = values(dt, rows * cols, seed + (uint64_t)i);
        later[i] = values(dt, rows * cols, seed + 10 + (uint64_t)i);
        if (finite) {
            first[i] = finite_values(first[i]);
            later[i] = finite_values(later[i]);
        }
        first[i] = nb_reshape(first[i], NB_SHAPE(rows, cols));
        later[i] = nb_reshape(later[i], NB_SHAPE(rows, cols));
    }
    int n_out = c.axes == AX_READ_AFTER ? 2 : 1;
    int64_t fused = check_replays(reduce_step, &c, true, 2, first, later, n_out);
    int64_t chains = check_replays_chains_only(reduce_step, &c, 2, first, later, n_out);
    int64_t plain = check_replays(reduce_step, &c, false, 2, first, later, n_out);
    nb_scope_end(s);
    CHECKF(fused > 0 && chains >= fused && plain >= chains, "%lld nodes fused, %lld chains only, %lld not",
           (long long)fused, (long long)chains, (long long)plain);
    return fused > 0 ? chains - fused : -1;
}

/* Nodes that fusing a reduction of rows of n saves: one (the reduce call),
 * but for n == 1 under NB_DEBUG_POISON, where the result's poison fill has
 * the chain's shape and so joins the chain when reductions are kept apart. */
static int64_t expect_saved(int64_t n) { return n == 1 && g_poison ? 0 : 1; }

static void into_reduce(void)
{
    /* around the tile and the producer's piece (256), a few pieces, the rows split
     * and the full reduction's chunks (32768, split from 65536 on) */
    static const int64_t sizes[] = {1, 255, 256, 257, 511, 513, 2047, 2048, 2049, 32767, 32768, 32769,
                                    65535, 65536, 65537, 70001};
    static const struct { red_chain c; nb_dtype dt; } all[] = {
        {R_MSE, NB_F32}, {R_MSE, NB_F64}, {R_SUM_EXP, NB_F32}, {R_SUM_EXP, NB_F64},
        {R_SUM_INT, NB_I32}, {R_SUM_INT, NB_I64}, {R_MAX, NB_F32}, {R_MAX, NB_I32},
        {R_MIN, NB_F64}, {R_MIN, NB_I64}, {R_PROD, NB_F32}, {R_PROD, NB_F64}, {R_PROD, NB_I32},
    };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        for (size_t j = 0; j < sizeof all / sizeof *all; j++) {
            for (int finite = 0; finite < 2; finite++) {
                bool ints = all[j].dt == NB_I32 || all[j].dt == NB_I64;
                if (ints && finite)
                    continue;
                int64_t saved = check_reduce((red_case){all[j].c, AX_ALL}, all[j].dt, 1, sizes[k], finite, 100 + j);
                CHECKF(saved == expect_saved(sizes[k]), "chain %d %s n=%lld%s: fusing the reduction saved %lld nodes", (int)all[j].c,
                       nb_dtype_name(all[j].dt), (long long)sizes[k], finite ? " (finite)" : "", (long long)saved);
            }
        }
    }
    /* a full reduction split into 64 chunks of 32768 and more */
    CHECK(check_reduce((red_case){R_SUM_EXP, AX_ALL}, NB_F32, 1, 64 * 32768 + 7, true, 200) == 1);
    CHECK(check_reduce((red_case){R_MSE, AX_ALL}, NB_F64, 1031, 2053, true, 201) == 1);
}

static void into_row_reduce(void)
{
    /* rows over the last axis: short rows made many at a time, rows around
     * and past the producer's piece made piece by piece, many rows split
     * across the threads */
    static const int64_t shapes[][2] = {{1, 1},   {7, 1},    {3, 5},    {300, 7}, {9, 255},  {40, 257},
                                        {6, 256}, {4, 513},  {5, 2047}, {5, 2048}, {3, 2049}, {4, 5000},
                                        {2, 70001}, {1000, 97}, {70001, 3}};
    static const struct { red_chain c; nb_dtype dt; } all[] = {
        {R_MSE, NB_F32}, {R_SUM_EXP, NB_F64}, {R_SUM_INT, NB_I64}, {R_MAX, NB_F64}, {R_MIN, NB_I32}, {R_PROD, NB_F32},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        for (size_t j = 0; j < sizeof all / sizeof *all; j++) {
            bool ints = all[j].dt == NB_I32 || all[j].dt == NB_I64;
            int64_t saved = check_reduce((red_case){all[j].c, AX_ROWS}, all[j].dt, shapes[k][0], shapes[k][1], !ints,
                                         300 + j);
            CHECKF(saved == expect_saved(shapes[k][1]), "rows: chain %d %s [%lld, %lld]: fusing the reduction saved %lld nodes", (int)all[j].c,
                   nb_dtype_name(all[j].dt), (long long)shapes[k][0], (long long)shapes[k][1], (long long)saved);
        }
    }
}

int nb__thread_count(void); /* lib/core: the kernels' threads */

static void into_col_reduce(void)
{
    const bool one_thread = nb__thread_count() == 1;
    /* columns (the leading dim reduced, as a bias gradient): K around the
     * column tile of 256 (K = 1 is a full reduction; narrow tiles make several
     * rows at a time, the last tile of 257 one element a row), one row, a few,
     * many rows, and enough work to split the tiles across the threads */
    static const int64_t shapes[][2] = {{1, 1},    {1, 7},   {1, 255}, {1, 256},  {1, 257},   {1, 1000},
                                        {3, 1},    {3, 7},   {3, 255}, {3, 256},  {3, 257},   {3, 1000},
                                        {70001, 1}, {70001, 7}, {2049, 257}, {300, 1000}, {513, 255}, {130, 256}};
    static const struct { red_chain c; nb_dtype dt; } all[] = {
        {R_MSE, NB_F32}, {R_SUM_EXP, NB_F64}, {R_SUM_INT, NB_I32}, {R_SUM_INT, NB_I64}, {R_MAX, NB_F32},
        {R_MAX, NB_I64}, {R_MIN, NB_F64},     {R_MIN, NB_I32},     {R_PROD, NB_F32},    {R_PROD, NB_I64},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        for (size_t j = 0; j < sizeof all / sizeof *all; j++) {
            bool ints = all[j].dt == NB_I32 || all[j].dt == NB_I64;
            for (int finite = 0; finite < 2 - ints; finite++) {
                int64_t saved = check_reduce((red_case){all[j].c, AX_COLS}, all[j].dt, shapes[k][0], shapes[k][1],
                                             finite, 500 + j);
                /* the GPU keeps reductions apart; on the CPU one row is rows of 1 (expect_saved),
                 * one column a full reduction, and columns fuse only where kernels run on one
                 * thread or the rows split among the threads (at least 8 grains of 32768
                 * elements, and at most 8 column tiles of 256) */
                bool columns = shapes[k][0] > 1 && shapes[k][1] > 1;
                bool rows_split = shapes[k][0] * shapes[k][1] >= 8 * 32768 && shapes[k][1] <= 8 * 256;
                CHECKF(g_gpu || saved == (one_thread || !columns || rows_split ? expect_saved(shapes[k][0]) : 0),
                       "cols: chain %d %s [%lld, %lld]%s: fusing the reduction saved %lld nodes", (int)all[j].c,
                       nb_dtype_name(all[j].dt), (long long)shapes[k][0], (long long)shapes[k][1],
                       finite ? " (finite)" : "", (long long)saved);
            }
        }
    }
}

static void not_into_reduce(void)
{
    /* a transposed view of the result, a result read after the reduction:
     * the chain stores its result and the reduction reads it, as without
     * this fusion */
    static const red_axes axes[] = {AX_TRANSPOSED, AX_READ_AFTER};
    static const int64_t shapes[][2] = {{5, 3}, {300, 257}, {3, 70001}};
    for (size_t a = 0; a < 2; a++) {
        for (size_t k = 0; k < 3; k++) {
            int64_t saved = check_reduce((red_case){R_MSE, axes[a]}, NB_F32, shapes[k][0], shapes[k][1], true, 400 + a);
            CHECKF(saved == 0, "axes %d [%lld, %lld]: %lld nodes saved", (int)axes[a], (long long)shapes[k][0],
                   (long long)shapes[k][1], (long long)saved);
        }
    }
}

/* The edge points themselves: every reduction of a chain over 0, -0, ±inf
 * and NaN, fused, against eager, and the values the kernels promise. */
static void reduce_edges(void)
{
    static const double sets[][4] = {
        {-0.0, -0.0, -0.0, -0.0}, {0.0, -0.0, 0.0, -0.0}, {INFINITY, 1, 2, 3}, {-INFINITY, INFINITY, 0, 1},
        {NAN, 1, 2, 3},           {1, 2, 3, NAN},           {-INFINITY, -INFINITY, -INFINITY, -INFINITY},
    };
    static const red_chain chains[] = {R_MSE, R_SUM_EXP, R_MAX, R_MIN, R_PROD};
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        for (int dt = 0; dt < 2; dt++) {
            nb_dtype d = dt ? NB_F64 : NB_F32;
            nb_tensor *a = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(1, 4), sets[k]), d);
            nb_tensor *b = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(1, 4), sets[(k + 3) % 7]), d);
            nb_tensor *first[2] = {a, b}, *later[2] = {b, a};
            for (size_t c = 0; c < sizeof chains / sizeof *chains; c++) {
                red_case rc = {chains[c], AX_ALL};
                CHECKF(check_replays(reduce_step, &rc, true, 2, first, later, 1) > 0, "edges %zu, chain %zu", k, c);
            }
        }
    }
    /* sum(exp(x)) over -inf and 0 is 1; max over a NaN is NaN; -0 - -0 squared sums to +0 */
    red_case se = {R_SUM_EXP, AX_ALL}, mx = {R_MAX, AX_ALL}, ms = {R_MSE, AX_ALL};
    nb_tensor *x[2] = {nb_from_buffer(NB_F32, NB_SHAPE(1, 2), (float[]){-INFINITY, 0.0f}),
                       nb_from_buffer(NB_F32, NB_SHAPE(1, 2), (float[]){1.0f, NAN})};
    nb_tensor *z[2] = {nb_from_buffer(NB_F32, NB_SHAPE(1, 2), (float[]){-0.0f, -0.0f}),
                       nb_from_buffer(NB_F32, NB_SHAPE(1, 2), (float[]){-0.0f, -0.0f})};
    nb_graph *g[3] = {0};
    nb_tensor *got[3] = {0};
    CHECK_OK(nb_graph_capture(g_device, reduce_step, &se, 2, x, 1, &got[0], &g[0]));
    CHECK_OK(nb_graph_capture(g_device, reduce_step, &mx, 2, x, 1, &got[1], &g[1]));
    CHECK_OK(nb_graph_capture(g_device, reduce_step, &ms, 2, z, 1, &got[2], &g[2]));
    float v[3] = {0, 0, 1};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(nb_graph_replay(g[i], NULL, &got[i]));
        CHECK_OK(nb_tensor_read(got[i], &v[i], sizeof v[i]));
        nb_graph_free(g[i]);
    }
    CHECK(v[0] == 1.0f && isnan(v[1]) && v[2] == 0 && !signbit(v[2]));
}

/* ---- a training step: tape, gradients, an in-place update ---- */

typedef struct net {
    nb_variable *w, *b;
} net;

static nb_status train_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)n_out;
    net *m = user;
    nb_scope *s = nb_scope_begin();
    nb_tape *tape = nb_tape_begin();
    nb_tape_watch_variable(tape, m->w);
    nb_tape_watch_variable(tape, m->b);
    nb_tensor *h = nb_add(nb_matmul(in[0], nb_read(m->w)), nb_read(m->b));
    nb_tensor *loss = nb_mean_all(nb_square(nb_sub(nb_tanh(h), in[1])));
    nb_variable *vars[2] = {m->w, m->b};
    nb_tensor *g[2] = {0};
    nb_status st = nb_tape_gradient_vars(tape, loss, 2, vars, g);
    nb_tape_free(tape);
    for (int i = 0; i < 2 && st == NB_OK; i++) /* in place: v -= 0.1 * g */
        st = nb_variable_assign_sub(vars[i], nb_mul_scalar(g[i], 0.1));
    out[0] = st ? NULL : nb_keep(loss);
    nb_scope_end(s);
    return st ? st : out[0] ? NB_OK : nb_error();
}

static void net_init(net *m)
{
    m->w = nb_variable_new("w", nb_reshape(values(NB_F32, 24 * 16, 7), NB_SHAPE(24, 16)));
    m->b = nb_variable_new("b", nb_zeros(NB_F32, NB_SHAPE(16)));
    /* no edge points in the weights: a NaN would make every step alike */
    nb_variable_assign(m->w, nb_mul_scalar(nb_tanh(nb_read(m->w)), 0.3));
}

static void training(void)
{
    net m[2];
    int64_t nodes[2];
    nb_tensor *x = finite_values(nb_reshape(values(NB_F32, 32 * 24, 8), NB_SHAPE(32, 24)));
    nb_tensor *y = nb_mul_scalar(finite_values(nb_reshape(values(NB_F32, 32 * 16, 9), NB_SHAPE(32, 16))), 0.5);
    for (int f = 0; f < 2; f++) {
        net_init(&m[f]);
        bool was = nb_graph_set_fusion(f == 1);
        nb_graph *g = NULL;
        nb_tensor *loss = NULL;
        CHECK_OK(nb_graph_capture(g_device, train_step, &m[f], 2, (nb_tensor *[]){x, y}, 1, &loss, &g));
        nb_graph_set_fusion(was);
        nodes[f] = nb_graph_nodes(g);
        for (int i = 0; i < 20; i++)
            CHECK_OK(nb_graph_replay(g, NULL, &loss));
        nb_graph_free(g);
    }
    /* and eagerly */
    net e;
    net_init(&e);
    nb_tensor *loss;
    for (int i = 0; i < 21; i++)
        CHECK_OK(train_step(&e, 2, (nb_tensor *[]){x, y}, 1, &loss));
    for (int f = 0; f < 2; f++) {
        CHECKF(same_bits(nb_read(m[f].w), nb_read(e.w)), "w, fusion %d", f);
        CHECKF(same_bits(nb_read(m[f].b), nb_read(e.b)), "b, fusion %d", f);
        nb_variable_free(m[f].w);
        nb_variable_free(m[f].b);
    }
    nb_variable_free(e.w);
    nb_variable_free(e.b);
    CHECKF(nodes[1] < nodes[0], "a training step fuses: %lld nodes, %lld unfused", (long long)nodes[1],
           (long long)nodes[0]);
    printf("training step: %lld recorded calls, %lld fused\n", (long long)nodes[0], (long long)nodes[1]);
}

/* ---- random steps: every chain the planner sees must keep eager's bits ---- */

enum { PROG_MAX = 24, STACK_MAX = 64 };
typedef enum {
    I_UNARY, I_SCALAR, I_BINARY, I_BIAS, I_TRANSPOSE, I_SLICE, I_SUM, I_SCOPE, I_VAR_ADD, I_VAR_READ, I_CAST, I_WHERE
} instr_kind;
typedef struct instr {
    instr_kind kind;
    int a, b, op, len; /* stack picks (taken modulo its size), the op, a scope's length */
    double alpha;
} instr;
typedef struct program {
    int n, side;
    instr at[PROG_MAX];
    nb_variable *v;
} program;

typedef nb_tensor *(*unary_fn)(const nb_tensor *);
typedef nb_tensor *(*binary_fn)(const nb_tensor *, const nb_tensor *);
typedef nb_tensor *(*scalar_fn)(const nb_tensor *, double);
static const unary_fn k_unary[] = {nb_neg, nb_abs, nb_exp, nb_tanh, nb_sigmoid, nb_relu, nb_square, nb_sqrt,
                                   nb_log, nb_gelu, nb_sin, nb_softplus};
static const binary_fn k_binary[] = {nb_add, nb_sub, nb_mul, nb_div, nb_maximum, nb_minimum, nb_pow};
static const scalar_fn k_scalar[] = {nb_mul_scalar, nb_add_scalar, nb_pow_scalar, nb_leaky_relu};
/* a cast's round trip goes through one of these and back */
static const nb_dtype k_cast_via[] = {NB_F16, NB_BF16, NB_F32, NB_F64, NB_I32};

/* a itself, or one of its reductions (over all, its rows, or its columns), by op */
static nb_tensor *reduced(nb_tensor *a, int op)
{
    switch (op % 8) {
    case 1: return nb_mean_all(a);
    case 2: return nb_max(a, NB_ALL_AXES, false);
    case 3: return nb_min(a, NB_AXES(-1), true);
    case 4: return nb_prod(a, NB_AXES(-1), false);
    case 5: return nb_mean(a, NB_AXES(-1), false);
    case 6: return nb_sum(a, NB_AXES(0), false);
    default: return a;
    }
}

/* Runs p's instructions from i (up to end) on the stack; returns where it stopped. */
static int run_instrs(const program *p, int i, int end, nb_tensor **stack, int *n, nb_tensor *const *in,
                      nb_tensor **acc)
{
    while (i < end) {
        const instr *k = &p->at[i++];
        nb_tensor *a = stack[k->a % *n], *b = stack[k->b % *n], *r = NULL;
        switch (k->kind) {
        case I_UNARY: r = k_unary[k->op % 12](a); break;
        case I_SCALAR: r = k_scalar[k->op % 4](a, k->alpha); break;
        case I_BINARY: r = k_binary[k->op % 7](a, b); break;
        case I_BIAS: r = nb_add(a, in[2]); break;
        case I_TRANSPOSE: r = nb_transpose(a, 0, 1); break;
        case I_SLICE: r = nb_slice(in[3], NB_SHAPE(k->op % 3, 0), NB_SHAPE(p->side, p->side)); break;
        case I_SUM: { /* a reduction of a chain's result that dies right after it */
            nb_scope *s = nb_scope_begin();
            nb_tensor *t = reduced(k->op % 3 ? k_unary[k->len % 12](a) : a, k->op);
            if (t != a) /* made in this scope */
                t = nb_keep(t);
            nb_scope_end(s);
            *acc = nb_add(*acc, nb_sum_all(t));
            break;
        }
        case I_VAR_ADD: nb_variable_assign_add(p->v, nb_mul_scalar(a, 0.125)); break;
        case I_VAR_READ: r = nb_read(p->v); break;
        case I_CAST: r = nb_cast(nb_cast(a, k_cast_via[k->op % 5]), nb_tensor_dtype(a)); break;
        case I_WHERE: /* the condition from the pair, or from the bias broadcast over rows */
            r = nb_where(k->op % 3 ? nb_greater(a, b) : nb_less(in[2], nb_zeros_like(in[2])), a,
                         k->op % 2 ? b : k_unary[k->len % 12](b));
            break;
        case I_SCOPE: { /* its temporaries die at its end; its last result is kept */
            nb_scope *s = nb_scope_begin();
            int base = *n;
            nb_tensor *acc_before = *acc;
            i = run_instrs(p, i, i + k->len < end ? i + k->len : end, stack, n, in, acc);
            nb_tensor *last = *n > base ? stack[*n - 1] : NULL;
            if (*acc != acc_before) /* made in this scope */
                nb_keep(*acc);
            if (last)
                nb_keep(last);
            nb_scope_end(s);
            *n = base;
            r = last;
            break;
        }
        }
        if (r && *n < STACK_MAX)
            stack[(*n)++] = r;
    }
    return i;
}

/* in: x0, x1 [side, side], bias [side], wide [side + 2, side]; out: the last
 * result and the sum of the sums taken on the way. */
static nb_status program_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)n_out;
    const program *p = user;
    nb_tensor *stack[STACK_MAX] = {in[0], in[1]};
    int n = 2;
    nb_tensor *acc = nb_zeros(nb_tensor_dtype(in[0]), NB_SHAPE());
    run_instrs(p, 0, p->n, stack, &n, in, &acc);
    out[0] = nb_contiguous(stack[n - 1]);
    out[1] = acc;
    return out[0] && out[1] ? NB_OK : nb_error();
}

static uint64_t next_u(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s >> 11;
}

static void random_steps(void)
{
    int programs = 0;
    /* a GPU compiles each new chain (NVRTC): fewer programs there */
    const uint64_t n_programs = g_gpu ? 40 : 150;
    for (uint64_t seed = 1; seed <= n_programs; seed++) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ull;
        program p = {.n = 4 + (int)(next_u(&s) % (PROG_MAX - 3)), .side = 1 + (int)(next_u(&s) % 37)};
        nb_dtype dt = seed % 2 ? NB_F32 : NB_F64;
        for (int i = 0; i < p.n; i++) {
            instr *k = &p.at[i];
            int r = (int)(next_u(&s) % 100);
            k->kind = r < 24 ? I_UNARY : r < 33 ? I_SCALAR : r < 53 ? I_BINARY : r < 58 ? I_BIAS : r < 63 ? I_TRANSPOSE
                      : r < 67 ? I_SLICE : r < 72 ? I_SUM : r < 79 ? I_SCOPE : r < 83 ? I_VAR_ADD : r < 86 ? I_VAR_READ
                      : r < 93 ? I_CAST : I_WHERE;
            k->a = (int)(next_u(&s) % 64), k->b = (int)(next_u(&s) % 64), k->op = (int)(next_u(&s) % 64);
            k->len = 1 + (int)(next_u(&s) % 5);
            k->alpha = ((double)(next_u(&s) % 17) - 8) / 4;
        }
        int side = p.side;
        nb_tensor *ins[2][4];
        for (int j = 0; j < 2; j++) {
            ins[j][0] = nb_reshape(values(dt, side * side, 100 * seed + 10 * j), NB_SHAPE(side, side));
            ins[j][1] = nb_reshape(values(dt, side * side, 100 * seed + 10 * j + 1), NB_SHAPE(side, side));
            ins[j][2] = values(dt, side, 100 * seed + 10 * j + 2);
            ins[j][3] = nb_reshape(values(dt, (side + 2) * side, 100 * seed + 10 * j + 3), NB_SHAPE(side + 2, side));
        }
        nb_tensor *init = nb_reshape(values(dt, side * side, 7 * seed), NB_SHAPE(side, side));
        program eager = p;
        p.v = nb_variable_new("v", init);
        eager.v = nb_variable_new("v_eager", init);
        nb_graph *g = NULL;
        nb_tensor *got[2], *want[2];
        nb_status st = nb_graph_capture(g_device, program_step, &p, 4, ins[0], 2, got, &g);
        CHECKF(st == NB_OK, "program %llu: %s", (unsigned long long)seed, nb_error_message());
        if (st == NB_OK) {
            CHECK_OK(program_step(&eager, 4, ins[0], 2, want));
            for (int rep = 0; rep < 3; rep++) {
                nb_tensor *const *in = ins[(rep + 1) % 2];
                CHECK_OK(nb_graph_replay(g, in, got));
                CHECK_OK(program_step(&eager, 4, in, 2, want));
                for (int o = 0; o < 2; o++)
                    CHECKF(same_bits(got[o], want[o]), "program %llu (%s, side %d), output %d of replay %d",
                           (unsigned long long)seed, nb_dtype_name(dt), side, o, rep);
            }
            CHECKF(same_bits(nb_read(p.v), nb_read(eager.v)), "program %llu: the variable", (unsigned long long)seed);
            programs++;
            nb_graph_free(g);
        }
        nb_variable_free(p.v);
        nb_variable_free(eager.v);
        nb_error_clear();
    }
    printf("random steps: %d programs replayed as eager ran them\n", programs);
}

static void setting(void)
{
    bool was = nb_graph_set_fusion(false);
    CHECK(was); /* on by default */
    CHECK(!nb_graph_set_fusion(true));
    CHECK(nb_graph_set_fusion(was));
}

int main(int argc, char **argv)
{
    const char *poison = getenv("NB_DEBUG_POISON");
    g_poison = poison && !strcmp(poison, "1");
    if (argc > 1 && !strcmp(argv[1], "--gpu")) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_graph_fusion --gpu");
        g_device = "/gpu:0";
        g_gpu = true;
    }
    /* everything on the device: the inputs, the eager references, the steps */
    nb_device_push(g_device);
    RUN(setting);
    RUN(chain_bits);
    RUN(kept_and_read_after);
    RUN(broadcast);
    RUN(cast_chain);
    RUN(where_chains);
    RUN(into_reduce);
    RUN(into_row_reduce);
    RUN(into_col_reduce);
    RUN(not_into_reduce);
    RUN(reduce_edges);
    RUN(training);
    RUN(random_steps);
    nb_device_pop();
    return check_finish();
}
