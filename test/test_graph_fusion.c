/* Fused elementwise chains in a recorded step (nb_graph_set_fusion): a
 * replay with fusion gives the same bits as the step run eagerly and as a
 * replay without it — f32, f64 and i32 (and f16, bf16, i64 on a GPU), sizes
 * around the CPU's tile (1, 255, 256, 257) and past the threads' split,
 * inputs with 0, -0, ±inf and NaN, a broadcast operand, a comparison, an
 * in-place update, a temporary that a later call still reads, one the step
 * returns, and a training step with a tape and an optimizer — and the chain
 * replaces its calls (fewer nodes).
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
    /* the sum's poison fill has another shape: a call of its own */
    CHECKF(g_gpu ? fused < plain : fused == 2 + g_poison && plain == 4 * (1 + g_poison), "read after: %lld nodes fused, %lld not", (long long)fused, (long long)plain);
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
    RUN(training);
    nb_device_pop();
    return check_finish();
}
