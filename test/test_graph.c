/* Step capture (nabla/graph.h): 100 steps as a capture and 99 replays give the
 * variables and losses of 100 eager steps, bit for bit (f32 and f64; SGD,
 * momentum, Adam; a learning rate changed between replays; a step that moves
 * its variables by copy-on-write and one that updates them in place; a
 * dropout layer applied twice per step; eager steps between replays, one of
 * them moving a variable), on the CPU (the step runs again) and, where there is a GPU, on it (recorded into a
 * CUDA graph); with a loss scaler and f16 products, from a scale so large
 * that the first steps overflow, and with infinite inputs at some steps, the
 * scale, the skipped and good steps and the optimizer's count too; every rule
 * of a captured step is refused with its message; a replay checks its inputs.
 *
 *   test_graph [--gpu]     (--gpu: the GPU cases only; 77 without a GPU) */
#include "check.h"

#include <nabla/dlpack.h>

#define FEAT 12
#define HID 16
#define CLASSES 5
#define BATCH 8
#define STEPS 100

typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM } opt_kind;

typedef struct model {
    nb_variable *v[4];
    nb_optimizer *opt;
    bool free_tape_first; /* update in place (no read holds the values) */
    bool dropout;         /* apply drop to the hidden layer, twice */
    nb_dropout_layer drop;
    nb_loss_scaler *scaler; /* NULL, or the loss scaling (with f16 products for f32) */
    int calls;            /* how many times the step ran */
} model;

static void model_init(model *m, nb_dtype dt, opt_kind k, const char *device)
{
    nb_device_push(device);
    nb_scope *s = nb_scope_begin();
    m->v[0] = nb_variable_new("w1", nb_cast(nb_random_normal(NB_F64, NB_SHAPE(FEAT, HID), 0, 0.4, 11), dt));
    m->v[1] = nb_variable_new("b1", nb_zeros(dt, NB_SHAPE(HID)));
    m->v[2] = nb_variable_new("w2", nb_cast(nb_random_normal(NB_F64, NB_SHAPE(HID, CLASSES), 0, 0.4, 12), dt));
    m->v[3] = nb_variable_new("b2", nb_cast(nb_random_uniform(NB_F64, NB_SHAPE(CLASSES), -0.1, 0.1, 13), dt));
    nb_scope_end(s);
    nb_device_pop();
    m->opt = k == OPT_SGD ? nb_sgd_new(0.1) : k == OPT_MOMENTUM ? nb_sgd_momentum_new(0.05, 0.9, true)
                                                                : nb_adam_new(0.01, 0.9, 0.999, 1e-7);
    m->calls = 0;
    m->free_tape_first = m->dropout = false;
    m->scaler = NULL;
    nb_dropout_init(&m->drop, 0.25, 77);
}

static void model_free(model *m)
{
    for (int i = 0; i < 4; i++)
        nb_variable_free(m->v[i]);
    nb_optimizer_free(m->opt);
    nb_loss_scaler_free(m->scaler);
}

/* The scaled runs: 2^40 overflows f16's products at first (so the first steps
 * are skipped, backing off), and growth every 4 good steps overflows again. */
static void model_scale(model *m)
{
    m->scaler = nb_loss_scaler_new(0x1p40, 2, 0.5, 4);
}

/* An infinite feature at these steps of a scaled run: a skipped step whatever
 * the scale. */
static bool poisoned(int i) { return i % 13 == 7; }

/* Batch i: features and labels that differ from step to step (on the CPU);
 * with inf, one feature infinite. */
static void batch_v(int i, nb_dtype dt, bool inf, nb_tensor **x, nb_tensor **y)
{
    int64_t labels[BATCH];
    for (int r = 0; r < BATCH; r++)
        labels[r] = (r * 3 + i * 7) % CLASSES;
    /* On the CPU whatever the current device: a GPU's normal draws may differ
     * in the last bit of an f64. */
    nb_device_push("/cpu:0");
    *x = nb_cast(nb_random_normal(NB_F64, NB_SHAPE(BATCH, FEAT), 0, 1, 1000 + (uint64_t)i), dt);
    *y = nb_from_buffer(NB_I64, NB_SHAPE(BATCH), labels);
    if (inf) {
        double spike[FEAT] = {[3] = INFINITY};
        *x = nb_add(*x, nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(FEAT), spike), dt)); /* column 3, every row */
    }
    nb_device_pop();
}


/* A product as f16 layers compute it on the CPU: operands and result rounded
 * to f16 (where a scaled gradient overflows), for f32 under a scaler. */
static nb_tensor *product(const model *m, nb_tensor *a, nb_tensor *b)
{
    if (!m->scaler || nb_tensor_dtype(a) != NB_F32)
        return nb_matmul(a, b);
#define F16(t) nb_cast(nb_cast((t), NB_F16), NB_F32)
    return F16(nb_matmul(F16(a), F16(b)));
#undef F16
}

/* One training step: forward, loss, gradients, update; the loss is the output. */
static nb_status train_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    model *m = user;
    (void)n_in;
    (void)n_out;
    m->calls++;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *h = nb_tanh(nb_add(product(m, in[0], nb_read(m->v[0])), nb_read(m->v[1])));
    if (m->dropout) /* two masks of one layer in a step: each replay draws both anew */
        h = nb_dropout_apply(&m->drop, nb_dropout_apply(&m->drop, h, true), true);
    nb_tensor *logits = nb_add(product(m, h, nb_read(m->v[2])), nb_read(m->v[3]));
    nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, in[1]));
    nb_tensor *g[4];
    nb_tensor *target = m->scaler ? nb_loss_scaler_scale(m->scaler, loss) : loss;
    nb_status st = nb_tape_gradient_vars(tape, target, 4, m->v, g);
    if (st)
        return st;
    if (m->free_tape_first) {
        /* Nothing else holds the values: the update is in place. */
        nb_tape_free(tape);
        h = logits = NULL;
    }
    if ((st = m->scaler ? nb_loss_scaler_step(m->scaler, m->opt, 4, m->v, g, NULL)
                        : nb_optimizer_apply(m->opt, 4, m->v, g)))
        return st;
    out[0] = loss;
    return NB_OK;
}

/* The variables' bytes, concatenated (read on the host after the steps). */
static size_t read_vars(const model *m, unsigned char *buf, size_t cap)
{
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        nb_tensor *t = nb_read(m->v[i]);
        size_t n = (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
        if (at + n > cap || nb_tensor_read(t, buf + at, n) != NB_OK)
            return 0;
        at += n;
    }
    return at;
}

/* How a run of same_as_eager differs from the plain one. */
typedef struct variant {
    bool in_place; /* the step frees its tape before the update */
    bool dropout;  /* the step applies a dropout layer twice */
    bool mixed;    /* steps 40-44 of the graph's run are eager ones, one of
                      them holding a read (the variables move) */
    bool scaled;   /* a loss scaler (model_scale), infinite inputs at the
                      poisoned steps */
} variant;

/* A scaled run's end: the scaler's state and the optimizer's count. */
typedef struct scaler_end {
    double scale;
    int64_t skipped, good, iterations;
} scaler_end;

static scaler_end scaler_end_of(const model *m)
{
    return (scaler_end){nb_loss_scaler_get_scale(m->scaler), nb_loss_scaler_skipped(m->scaler),
                        nb_loss_scaler_good_steps(m->scaler), nb_optimizer_iterations(m->opt)};
}

/* 100 eager steps against a capture and 99 replays, from the same start. */
static void same_as_eager_v(const char *device, nb_dtype dt, opt_kind k, variant var)
{
    static unsigned char a[8192 * 8], b[8192 * 8];
    double loss_eager[STEPS], loss_graph[STEPS];
    model m;

    /* eager */
    model_init(&m, dt, k, device);
    m.free_tape_first = var.in_place;
    m.dropout = var.dropout;
    if (var.scaled)
        model_scale(&m);
    nb_device_push(device);
    for (int i = 0; i < STEPS; i++) {
        nb_scope *s = nb_scope_begin();
        if (i == 60)
            nb_optimizer_set_learning_rate(m.opt, nb_optimizer_learning_rate(m.opt) * 0.5);
        if (i == 50 && var.scaled) /* between replays: the next one starts from it */
            CHECK_OK(nb_loss_scaler_set_state(m.scaler, 0x1p30, 3));
        nb_tensor *x, *y, *loss = NULL;
        batch_v(i, dt, var.scaled && poisoned(i), &x, &y);
        nb_tensor *in[2] = {nb_to_device(x, device), nb_to_device(y, device)};
        CHECK_OK(train_step(&m, 2, in, 1, &loss));
        loss_eager[i] = loss ? nb_tensor_item(loss) : NAN;
        nb_scope_end(s);
    }
    nb_device_pop();
    int64_t iters = nb_optimizer_iterations(m.opt);
    scaler_end end_eager = var.scaled ? scaler_end_of(&m) : (scaler_end){0};
    size_t na = read_vars(&m, a, sizeof a);
    model_free(&m);

    /* captured and replayed */
    model_init(&m, dt, k, device);
    m.free_tape_first = var.in_place;
    m.dropout = var.dropout;
    if (var.scaled)
        model_scale(&m);
    nb_graph *g = NULL;
    int eager_steps = 0;
    for (int i = 0; i < STEPS; i++) {
        nb_scope *s = nb_scope_begin();
        if (i == 60)
            nb_optimizer_set_learning_rate(m.opt, nb_optimizer_learning_rate(m.opt) * 0.5);
        if (i == 50 && var.scaled) /* between replays: the next one starts from it */
            CHECK_OK(nb_loss_scaler_set_state(m.scaler, 0x1p30, 3));
        nb_tensor *x, *y, *loss = NULL;
        batch_v(i, dt, var.scaled && poisoned(i), &x, &y); /* on the CPU: the graph copies them over */
        nb_tensor *in[2] = {x, y};
        if (i == 0) {
            CHECK_OK(nb_graph_capture(device, train_step, &m, 2, in, 1, &loss, &g));
        } else if (var.mixed && i >= 40 && i < 45) {
            /* eager steps between replays; at step 42 a read holds a value, so
             * the update moves that variable to a fresh tensor */
            nb_device_push(device);
            nb_tensor *held = i == 42 ? nb_read(m.v[0]) : NULL;
            nb_tensor *on[2] = {nb_to_device(x, device), nb_to_device(y, device)};
            CHECK_OK(train_step(&m, 2, on, 1, &loss));
            nb_device_pop();
            eager_steps++;
            (void)held;
        } else {
            CHECK_OK(nb_graph_replay(g, in, &loss));
        }
        loss_graph[i] = loss ? nb_tensor_item(loss) : NAN;
        nb_scope_end(s);
        if (!g)
            break;
    }
    CHECK(nb_optimizer_iterations(m.opt) == iters);
    if (var.scaled) {
        /* read back from the device after the replays: as the eager run left them */
        scaler_end e = scaler_end_of(&m);
        CHECKF(e.scale == end_eager.scale && e.skipped == end_eager.skipped && e.good == end_eager.good &&
                   e.iterations == end_eager.iterations,
               "eager: scale %g, %lld skipped, %lld good, %lld updates; graph: %g, %lld, %lld, %lld", end_eager.scale,
               (long long)end_eager.skipped, (long long)end_eager.good, (long long)end_eager.iterations, e.scale,
               (long long)e.skipped, (long long)e.good, (long long)e.iterations);
        /* the poisoned steps were skipped, and in f16 the overflows of the first ones */
        int64_t floor = (STEPS + 5) / 13 + (dt == NB_F32 ? 10 : 0);
        CHECKF(e.skipped >= floor && e.iterations == STEPS - e.skipped, "%lld skipped, %lld updates",
               (long long)e.skipped, (long long)e.iterations);
    }
    bool recorded = nb_graph_recorded(g);
    CHECK(recorded); /* a CUDA graph on a GPU, a list of kernel calls on the CPU */
    CHECK(!recorded || nb_graph_nodes(g) > 10);
    /* Recorded: the step ran for the warm-up and the recording only. */
    CHECK(m.calls == (recorded ? 2 + eager_steps : STEPS));
    nb_graph_free(g);
    size_t nbb = read_vars(&m, b, sizeof b);
    model_free(&m);

    CHECK(na > 0 && na == nbb);
    bool same = na == nbb && memcmp(a, b, na) == 0;
    CHECK(same);
    int diff = -1;
    for (int i = 0; i < STEPS && diff < 0; i++)
        if (memcmp(&loss_eager[i], &loss_graph[i], sizeof(double)) != 0)
            diff = i;
    if (diff >= 0)
        fprintf(stderr, "[%s] %s %s opt %d%s%s%s: loss of step %d: eager %.17g, graph %.17g\n", check_current,
                device, nb_dtype_name(dt), (int)k, var.in_place ? " in place" : "", var.dropout ? " dropout" : "",
                var.mixed ? " mixed" : "", diff, loss_eager[diff], loss_graph[diff]);
    CHECK(diff < 0);
    CHECK(isfinite(loss_eager[STEPS - 1]) && loss_eager[STEPS - 1] < loss_eager[0]);
}

static void same_as_eager(const char *device, nb_dtype dt, opt_kind k, bool in_place)
{
    same_as_eager_v(device, dt, k, (variant){.in_place = in_place});
}

/* The graph's device, and another one (logical CPU devices: the inputs, made
 * on /cpu:0, move to a graph on /cpu:1). */
static const char *g_device = "/cpu:1", *g_other = "/cpu:0";

static void bitwise_f64(void)
{
    for (int k = 0; k < 3; k++)
        same_as_eager(g_device, NB_F64, (opt_kind)k, false);
}

static void bitwise_f32(void)
{
    for (int k = 0; k < 3; k++)
        same_as_eager(g_device, NB_F32, (opt_kind)k, false);
}

static void bitwise_in_place(void)
{
    same_as_eager(g_device, NB_F32, OPT_ADAM, true);
    same_as_eager(g_device, NB_F64, OPT_MOMENTUM, true);
}

/* A dropout layer in the step: each replay draws the masks an eager step
 * would (a recorded mask reads its seed from device memory). */
static void bitwise_dropout(void)
{
    same_as_eager_v(g_device, NB_F32, OPT_ADAM, (variant){.dropout = true});
    same_as_eager_v(g_device, NB_F64, OPT_SGD, (variant){.dropout = true, .in_place = true});
}

/* Eager steps between replays, one moving a variable by copy-on-write: the
 * next replay starts from the values they left. */
static void bitwise_mixed(void)
{
    same_as_eager_v(g_device, NB_F32, OPT_ADAM, (variant){.mixed = true});
    same_as_eager_v(g_device, NB_F64, OPT_MOMENTUM, (variant){.mixed = true, .dropout = true});
}

/* A loss scaler in the step (f16 products for f32): the overflowing steps
 * are skipped on the device as eager steps skip them, with momentum and Adam,
 * updates in place and by copy-on-write, and eager steps between replays. */
static void bitwise_scaled(void)
{
    same_as_eager_v(g_device, NB_F32, OPT_MOMENTUM, (variant){.scaled = true});
    same_as_eager_v(g_device, NB_F32, OPT_ADAM, (variant){.scaled = true});
    same_as_eager_v(g_device, NB_F32, OPT_ADAM, (variant){.scaled = true, .in_place = true});
    same_as_eager_v(g_device, NB_F32, OPT_SGD, (variant){.scaled = true, .mixed = true, .dropout = true});
    same_as_eager_v(g_device, NB_F64, OPT_ADAM, (variant){.scaled = true, .mixed = true});
}

/* A step that uses its scaler from its second run on (the recording), or
 * sets its state. */
typedef struct late_scaler {
    nb_loss_scaler *ls;
    int runs;
    bool set_state;
} late_scaler;

static nb_status late_scaler_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    late_scaler *l = user;
    (void)n_in, (void)n_out;
    if (l->set_state)
        return nb_loss_scaler_set_state(l->ls, 8, 0);
    out[0] = l->runs++ ? nb_loss_scaler_scale(l->ls, in[0]) : nb_mul_scalar(in[0], 2.0);
    return out[0] ? NB_OK : nb_error();
}

/* What a scaler refuses in a captured step, and its state read back after
 * replays of a step without gradients (every step a good one). */
static void scaler_rules(void)
{
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(3)), *out = NULL;
    late_scaler l = {nb_loss_scaler_new(64, 2, 0.5, 2), 0, false};
    nb_graph *g = NULL;
    /* The state is placed on the device by the run before the recording. */
    CHECK(nb_graph_capture(g_device, late_scaler_step, &l, 1, &x, 1, &out, &g) == NB_ERR_UNSUPPORTED);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "nb_loss_scaler_scale", "placed on", g_device);
    CHECK(g == NULL && out == NULL && l.runs == 2);
    l.set_state = true;
    CHECK(nb_graph_capture(g_device, late_scaler_step, &l, 1, &x, 1, &out, &g) == NB_ERR_UNSUPPORTED);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "nb_loss_scaler_set_state", "captured on");
    CHECK(nb_loss_scaler_get_scale(l.ls) == 64 && nb_loss_scaler_good_steps(l.ls) == 0);
    nb_loss_scaler_free(l.ls);
}

/* A step of a scaler and an optimizer with no gradients: each is a good step. */
typedef struct empty_step {
    nb_loss_scaler *ls;
    nb_optimizer *opt;
    bool stepped;
} empty_step;

static nb_status empty_scaled_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    empty_step *e = user;
    (void)n_in, (void)n_out;
    e->stepped = true;
    out[0] = nb_loss_scaler_scale(e->ls, in[0]);
    return out[0] ? nb_loss_scaler_step(e->ls, e->opt, 0, NULL, NULL, &e->stepped) : nb_error();
}

static void scaler_readback(void)
{
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(2)), *out = NULL;
    empty_step e = {nb_loss_scaler_new(64, 2, 0.5, 3), nb_sgd_new(0.1), true};
    nb_graph *g = NULL;
    CHECK_OK(nb_graph_capture(g_device, empty_scaled_step, &e, 1, &x, 1, &out, &g));
    CHECK(!e.stepped); /* inside a captured step the outcome stays on the device */
    CHECK(out && nb_tensor_get(nb_to_device(out, "/cpu:0"), 1) == 64);
    for (int i = 0; i < 4; i++)
        CHECK_OK(nb_graph_replay(g, NULL, NULL));
    /* 5 good steps: the scale doubled after the third, 2 good since */
    CHECK(nb_loss_scaler_get_scale(e.ls) == 128 && nb_loss_scaler_good_steps(e.ls) == 2);
    CHECK(nb_loss_scaler_skipped(e.ls) == 0 && nb_optimizer_iterations(e.opt) == 5);
    /* an eager step between replays, then a replay that starts from it */
    nb_device_push(g_device);
    CHECK_OK(nb_loss_scaler_step(e.ls, e.opt, 0, NULL, NULL, &e.stepped));
    nb_device_pop();
    CHECK(e.stepped && nb_loss_scaler_get_scale(e.ls) == 256 && nb_loss_scaler_good_steps(e.ls) == 0);
    CHECK_OK(nb_optimizer_set_iterations(e.opt, 40));
    CHECK_OK(nb_graph_replay(g, NULL, &out));
    CHECK(out && nb_tensor_get(nb_to_device(out, "/cpu:0"), 0) == 256);
    CHECK(nb_loss_scaler_good_steps(e.ls) == 1 && nb_optimizer_iterations(e.opt) == 41);
    nb_graph_free(g);
    nb_optimizer_free(e.opt);
    nb_loss_scaler_free(e.ls);
}

/* ---- op by op: a replay gives each op's eager bits ------------------------------------ */

enum { OP_MATMUL, OP_MATMUL_TA, OP_MATMUL_TB, OP_TANH, OP_ADD_ROW, OP_XENT, OP_MEAN, OP_GRAD, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"matmul", "matmul a^T", "matmul b^T", "tanh", "add a row",
                                               "sparse_softmax_cross_entropy", "mean_all", "a tape gradient"};

static nb_status one_op(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    int op = *(int *)user;
    (void)n_in, (void)n_out;
    nb_tensor *a = in[0], *b = in[1], *labels = in[2];
    switch (op) {
    case OP_MATMUL: out[0] = nb_matmul(a, b); break;
    case OP_MATMUL_TA: out[0] = nb_matmul(nb_transpose(a, 0, 1), nb_matmul(a, b)); break;
    case OP_MATMUL_TB: out[0] = nb_matmul(nb_matmul(a, b), nb_transpose(b, 0, 1)); break;
    case OP_TANH: out[0] = nb_tanh(a); break;
    case OP_ADD_ROW: out[0] = nb_add(nb_matmul(a, b), nb_slice(b, NB_SHAPE(0, 0), NB_SHAPE(1, -1))); break;
    case OP_XENT: out[0] = nb_sparse_softmax_cross_entropy(nb_slice(nb_matmul(a, b), NB_SHAPE(0, 0), NB_SHAPE(-1, CLASSES)), labels); break;
    case OP_MEAN: out[0] = nb_mean_all(nb_matmul(a, b)); break;
    default: {
        nb_tape *t = nb_tape_begin();
        nb_tape_watch(t, a);
        nb_tape_watch(t, b);
        nb_tensor *logits = nb_slice(nb_tanh(nb_matmul(a, b)), NB_SHAPE(0, 0), NB_SHAPE(-1, CLASSES));
        nb_tensor *loss = nb_mean_all(nb_sparse_softmax_cross_entropy(logits, labels));
        nb_tensor *src[2] = {a, b}, *g[2];
        nb_status st = nb_tape_gradient(t, loss, 2, src, g);
        if (st)
            return st;
        out[0] = nb_concat(2, (nb_tensor *[]){nb_reshape(g[0], NB_SHAPE(-1)), nb_reshape(g[1], NB_SHAPE(-1))}, 0);
    }
    }
    return out[0] ? NB_OK : nb_error();
}

static void ops_bitwise(void)
{
    int64_t lab[BATCH];
    for (int r = 0; r < BATCH; r++)
        lab[r] = (r * 3) % CLASSES;
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_F64 : NB_F32;
        for (int op = 0; op < OP_COUNT; op++) {
            nb_scope *s = nb_scope_begin();
            nb_device_push(g_device);
            nb_tensor *in[3] = {nb_cast(nb_random_normal(NB_F64, NB_SHAPE(BATCH, FEAT), 0, 1, 5), dt),
                                nb_cast(nb_random_normal(NB_F64, NB_SHAPE(FEAT, HID), 0, 1, 6), dt),
                                nb_to_device(nb_from_buffer(NB_I64, NB_SHAPE(BATCH), lab), g_device)};
            nb_tensor *eager = NULL, *first = NULL, *again = NULL;
            nb_graph *g = NULL;
            CHECK_OK(one_op(&op, 3, in, 1, &eager));
            CHECK_OK(nb_graph_capture(g_device, one_op, &op, 3, in, 1, &first, &g));
            CHECK_OK(nb_graph_replay(g, in, &again));
            nb_graph_free(g);
            nb_device_pop();
            if (eager && first && again) {
                bool ok_first = same_bits(eager, first), ok_again = same_bits(eager, again);
                if (!ok_first || !ok_again)
                    fprintf(stderr, "[ops_bitwise] %s %s on %s: the %s differs from the eager op's\n", op_names[op],
                            nb_dtype_name(dt), g_device, !ok_first ? "warm-up" : "replay");
                CHECK(ok_first && ok_again);
            }
            nb_scope_end(s);
        }
    }
}

/* ---- the rules -------------------------------------------------------------------- */

typedef enum {
    RULE_ITEM, RULE_READ, RULE_FROM_BUFFER, RULE_SYNC, RULE_OTHER_DEVICE, RULE_COPY_OUT, RULE_VARIABLE,
    RULE_MIRRORED, RULE_NESTED, RULE_GRAPH_FREE, RULE_COUNT
} rule;

static const char *const rule_calls[RULE_COUNT] = {
    "nb_tensor_get", "nb_tensor_read", "nb_from_buffer", "nb_synchronize", "a tensor on /cpu:",
    "copy_to_device", "nb_variable_new", "nb_mirrored_run", "called inside a captured step", "nb_graph_free",
};

typedef struct rule_case {
    rule r;
    nb_mirrored *strategy;
    nb_graph *outer; /* a graph captured before: freeing it in a step is refused */
} rule_case;

static nb_status no_op_replica(nb_replica *r, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out, void *user)
{
    (void)user, (void)r, (void)n_in, (void)in, (void)n_out, (void)out;
    return NB_OK;
}

static nb_status nested_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)in, (void)n_out, (void)out;
    return NB_OK;
}

/* A step that breaks rule c->r after some ordinary work. */
static nb_status rule_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    rule_case *c = user;
    (void)n_in;
    (void)n_out;
    nb_tensor *y = nb_mul_scalar(in[0], 2.0);
    out[0] = y;
    double v[4] = {0};
    nb_graph *inner = NULL;
    switch (c->r) {
    case RULE_ITEM: return isnan(nb_tensor_item(nb_sum_all(y))) ? nb_error() : NB_OK;
    case RULE_READ: return nb_tensor_read(y, v, sizeof v);
    case RULE_FROM_BUFFER: return nb_from_buffer(NB_F64, NB_SHAPE(4), v) ? NB_OK : nb_error();
    case RULE_SYNC: return nb_synchronize();
    case RULE_OTHER_DEVICE: {
        nb_device_push(g_other);
        nb_tensor *z = nb_zeros(NB_F64, NB_SHAPE(2));
        nb_device_pop();
        return z ? NB_OK : nb_error();
    }
    case RULE_COPY_OUT: return nb_to_device(y, g_other) ? NB_OK : nb_error();
    case RULE_VARIABLE: return nb_variable_new("late", y) ? NB_OK : nb_error();
    case RULE_MIRRORED: return nb_mirrored_run(c->strategy, no_op_replica, NULL, 0, NULL, 0, NULL);
    case RULE_NESTED: {
        nb_status st = nb_graph_capture(g_device, nested_step, NULL, 1, in, 0, NULL, &inner);
        nb_graph_free(inner);
        return st;
    }
    case RULE_GRAPH_FREE: nb_graph_free(c->outer); return nb_error();
    default: return NB_OK;
    }
}

static void refusals(void)
{
    nb_mirrored *strategy = nb_mirrored_new(2, (const char *const[]){"/cpu:0", "/cpu:1"});
    nb_device_push(g_device);
    CHECK(strategy != NULL);
    nb_tensor *x = nb_ones(NB_F64, NB_SHAPE(4));
    nb_graph *outer = NULL;
    CHECK_OK(nb_graph_capture(g_device, nested_step, NULL, 1, &x, 0, NULL, &outer));
    for (int r = 0; r < RULE_COUNT; r++) {
        rule_case c = {(rule)r, strategy, outer};
        nb_graph *g = (nb_graph *)&c; /* must come back NULL */
        nb_tensor *out = NULL;
        nb_status st = nb_graph_capture(g_device, rule_step, &c, 1, &x, 1, &out, &g);
        CHECK(st == (r == RULE_NESTED ? NB_ERR_INVALID_ARGUMENT : NB_ERR_UNSUPPORTED));
        CHECK(g == NULL && out == NULL);
        if (r == RULE_NESTED)
            CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_graph_capture", rule_calls[r]);
        else
            CHECK_ERROR(NB_ERR_UNSUPPORTED, rule_calls[r], "cannot", "captured on");
    }
    /* The thread is in no capture afterwards: everything works again. */
    double v = 0;
    CHECK_OK(nb_tensor_read(nb_sum_all(x), &v, sizeof v));
    CHECK(v == 4);
    CHECK_OK(nb_graph_replay(outer, &x, NULL));
    nb_graph_free(outer); /* left alone by the refused call, freed here */
    nb_device_pop();
    nb_mirrored_free(strategy);
}

/* ---- replay's checks --------------------------------------------------------------- */

static nb_status double_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    out[0] = nb_mul_scalar(in[0], 2.0);
    out[1] = nb_sum_all(in[0]);
    return NB_OK;
}

static nb_status failing_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    int *calls = user;
    (void)n_in, (void)n_out, (void)in, (void)out;
    if (++*calls >= 2)
        return nb_reshape(in[0], NB_SHAPE(7)) ? NB_OK : nb_error();
    out[0] = nb_mul_scalar(in[0], 1.0);
    return NB_OK;
}

/* A step that returns a variable's value read before it updates the variable
 * (in place, or by copy-on-write since the read holds it): each replay's
 * output is the value before that replay's update, as an eager step's is. */
static nb_variable *g_counter;
static nb_status read_then_add(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out;
    nb_tensor *before = nb_read(g_counter);
    nb_status st = nb_variable_assign_add(g_counter, in[0]);
    out[0] = before;
    out[1] = nb_mul_scalar(nb_read(g_counter), 1.0);
    return st;
}

static void read_then_update(void)
{
    nb_device_push(g_device);
    g_counter = nb_variable_new("counter", nb_zeros(NB_F64, NB_SHAPE(3)));
    nb_tensor *one = nb_ones(NB_F64, NB_SHAPE(3));
    nb_graph *g = NULL;
    nb_tensor *out[2] = {NULL, NULL};
    CHECK_OK(nb_graph_capture(g_device, read_then_add, NULL, 1, &one, 2, out, &g));
    CHECK(out[0] && nb_tensor_get(out[0], 2) == 0 && nb_tensor_get(out[1], 2) == 1);
    for (int i = 1; i <= 3 && g; i++) {
        CHECK_OK(nb_graph_replay(g, &one, out));
        CHECKF(out[0] && nb_tensor_get(out[0], 2) == i, "replay %d returned %g read before its update", i,
               out[0] ? nb_tensor_get(out[0], 2) : -1.0);
        CHECKF(out[1] && nb_tensor_get(out[1], 2) == i + 1, "replay %d: %g after", i, out[1] ? nb_tensor_get(out[1], 2) : -1.0);
    }
    CHECK(nb_tensor_get(nb_read(g_counter), 0) == 4);
    nb_graph_free(g);
    nb_variable_free(g_counter);
    nb_device_pop();
}

/* A recording writes variables in place even where a read holds the old
 * value (the model's default step keeps its tape's reads to the end): its
 * graph has no more kernels than the step that frees them first, and 100
 * steps stay bitwise eager's (bitwise_f32 and the others). A step that uses
 * the old value after the update (a result computed from it, an output that
 * is it, a gradient that is it) is recorded again with copy-on-write: the
 * step runs three times at capture, and every replay still gives eager's
 * values. */
static void in_place_nodes(void)
{
    int64_t nodes[2] = {0, 0};
    for (int free_first = 0; free_first < 2; free_first++) {
        model m;
        model_init(&m, NB_F32, OPT_ADAM, g_device);
        m.free_tape_first = free_first;
        nb_tensor *x, *y;
        batch_v(0, NB_F32, false, &x, &y);
        nb_graph *g = NULL;
        CHECK_OK(nb_graph_capture(g_device, train_step, &m, 2, (nb_tensor *[]){x, y}, 0, NULL, &g));
        nodes[free_first] = nb_graph_nodes(g);
        CHECK(m.calls == 2);
        nb_graph_free(g);
        model_free(&m);
    }
    CHECKF(nodes[0] == nodes[1] && nodes[0] > 0, "kernels: %lld with reads held, %lld without", (long long)nodes[0],
           (long long)nodes[1]);
}

typedef enum { OLD_USED, OLD_RETURNED, OLD_AS_GRADIENT, OLD_KINDS } old_kind;
typedef struct old_step {
    nb_variable *w;
    nb_optimizer *opt;
    old_kind kind;
    int calls;
} old_step;

/* w -= 0.5 g with g = x (or w itself); out[0] = 2 w_before (or w_before), out[1] = w after. */
static nb_status old_value_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    old_step *s = user;
    (void)n_in, (void)n_out;
    s->calls++;
    nb_tensor *before = nb_read(s->w);
    nb_tensor *g = s->kind == OLD_AS_GRADIENT ? before : in[0];
    nb_status st = nb_optimizer_apply(s->opt, 1, &s->w, &g);
    out[0] = s->kind == OLD_USED ? nb_mul_scalar(before, 2.0) : before;
    out[1] = nb_mul_scalar(nb_read(s->w), 1.0);
    return st;
}

static void old_value_after_update(void)
{
    static const char *names[OLD_KINDS] = {"used after", "returned", "as its gradient"};
    for (int k = 0; k < OLD_KINDS; k++) {
        nb_device_push(g_device);
        old_step s = {nb_variable_new("w", nb_full(NB_F64, NB_SHAPE(5), 3.0)), nb_sgd_new(0.5), (old_kind)k, 0};
        nb_tensor *x = nb_full(NB_F64, NB_SHAPE(5), 1.0), *out[2] = {NULL, NULL};
        nb_graph *g = NULL;
        CHECK_OK(nb_graph_capture(g_device, old_value_step, &s, 1, &x, 2, out, &g));
        CHECKF(s.calls == 3, "%s: the step ran %d times at capture", names[k], s.calls);
        double w = 3.0;
        for (int i = 0; i < 4 && g; i++) {
            if (i > 0)
                CHECK_OK(nb_graph_replay(g, &x, out));
            double before = w;
            w = k == OLD_AS_GRADIENT ? w - 0.5 * w : w - 0.5;
            double want0 = k == OLD_USED ? 2 * before : before;
            CHECKF(out[0] && nb_tensor_get(out[0], 4) == want0 && out[1] && nb_tensor_get(out[1], 4) == w,
                   "%s, step %d: %g and %g, expected %g and %g", names[k], i + 1, out[0] ? nb_tensor_get(out[0], 4) : NAN,
                   out[1] ? nb_tensor_get(out[1], 4) : NAN, want0, w);
        }
        CHECK(nb_tensor_get(nb_read(s.w), 0) == w);
        nb_graph_free(g);
        nb_optimizer_free(s.opt);
        nb_variable_free(s.w);
        nb_device_pop();
    }
}

/* Two updates of one variable in a step, a read held between them (not
 * used by any kernel): both write the variable in place, so the graph has
 * the kernels of the step that holds nothing, and no copy of the variable
 * onto itself. */
typedef struct twice_step {
    nb_variable *w;
    nb_optimizer *opt;
    bool hold;
} twice_step;

static nb_status twice_updated_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    twice_step *s = user;
    (void)n_in, (void)n_out, (void)out;
    nb_tensor *g = in[0];
    nb_status st = nb_optimizer_apply(s->opt, 1, &s->w, &g);
    if (s->hold) /* the step's scope holds it to the end */
        nb_read(s->w);
    if (st == NB_OK)
        st = nb_optimizer_apply(s->opt, 1, &s->w, &g);
    return st;
}

static void twice_updated(void)
{
    int64_t nodes[2] = {0, 0};
    for (int hold = 0; hold < 2; hold++) {
        nb_device_push(g_device);
        twice_step s = {nb_variable_new("w", nb_full(NB_F64, NB_SHAPE(5), 3.0)), nb_sgd_new(0.5), hold};
        nb_tensor *x = nb_full(NB_F64, NB_SHAPE(5), 1.0);
        nb_graph *g = NULL;
        CHECK_OK(nb_graph_capture(g_device, twice_updated_step, &s, 1, &x, 0, NULL, &g));
        nodes[hold] = nb_graph_nodes(g);
        for (int i = 0; i < 3 && g; i++)
            CHECK_OK(nb_graph_replay(g, &x, NULL));
        CHECKF(nb_tensor_get(nb_read(s.w), 4) == -1.0, "hold %d: w = %g after four steps, expected -1", hold,
               nb_tensor_get(nb_read(s.w), 4));
        nb_graph_free(g);
        nb_optimizer_free(s.opt);
        nb_variable_free(s.w);
        nb_device_pop();
    }
    CHECKF(nodes[0] == nodes[1] && nodes[0] > 0, "kernels: %lld with a read held between the updates, %lld without",
           (long long)nodes[1], (long long)nodes[0]);
}

/* On a GPU, a step recorded again (its old value used after the update)
 * starts from the first recording's blocks: the capture reserves the
 * second recording's memory once, not on top of the first's. Each step holds
 * two 16 MiB outputs; the retried one also a 16 MiB copy of w. */
static nb_status retry_memory_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    old_step *s = user;
    (void)n_in, (void)n_out;
    s->calls++;
    nb_tensor *before = nb_read(s->w);
    nb_tensor *g = in[0];
    nb_status st = nb_optimizer_apply(s->opt, 1, &s->w, &g);
    out[0] = nb_mul_scalar(s->kind == OLD_USED ? before : nb_read(s->w), 2.0);
    out[1] = nb_mul_scalar(nb_read(s->w), 1.0);
    return st;
}

static void retry_memory(void)
{
    const int64_t n = 4 << 20; /* 16 MiB of f32 */
    const double mib = 1024.0 * 1024.0;
    double growth[2] = {0, 0};
    for (int retried = 0; retried < 2; retried++) {
        nb_device_push(g_device);
        old_step s = {nb_variable_new("w", nb_full(NB_F32, NB_SHAPE(n), 3.0)), nb_sgd_new(0.5),
                      retried ? OLD_USED : OLD_RETURNED, 0};
        nb_tensor *x = nb_full(NB_F32, NB_SHAPE(n), 1.0), *out[2] = {NULL, NULL};
        nb_gpu_memory_stats before, after;
        CHECK_OK(nb_gpu_empty_cache(g_device));
        CHECK_OK(nb_gpu_reset_peak_memory(g_device));
        CHECK_OK(nb_gpu_get_memory_stats(g_device, &before));
        nb_graph *g = NULL;
        CHECK_OK(nb_graph_capture(g_device, retry_memory_step, &s, 1, &x, 2, out, &g));
        CHECK_OK(nb_gpu_get_memory_stats(g_device, &after));
        growth[retried] = ((double)after.peak_reserved - (double)before.reserved) / mib;
        CHECKF(s.calls == (retried ? 3 : 2), "the step ran %d times at capture", s.calls);
        CHECK_OK(g ? nb_graph_replay(g, &x, out) : NB_ERR_INTERNAL);
        CHECK(out[0] && nb_tensor_get(out[0], n - 1) == (retried ? 5.0 : 4.0));
        nb_graph_free(g);
        nb_optimizer_free(s.opt);
        nb_variable_free(s.w);
        nb_device_pop();
    }
    CHECKF(growth[1] <= growth[0] + 16 + 4, "capture reserved %.1f MiB when recorded again, %.1f MiB once", growth[1],
           growth[0]);
}

/* A dropout layer's seed set anywhere between replays, below the recorded
 * one or far above it: each replay draws the mask an eager apply draws from
 * that seed (the offset travels as 64 bits, not as a rounded double). */
static nb_status dropout_only_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)n_in, (void)n_out;
    out[0] = nb_dropout_apply(user, in[0], true);
    return out[0] ? NB_OK : nb_error();
}

static void dropout_seed_set(void)
{
    nb_device_push(g_device);
    nb_dropout_layer layer;
    CHECK_OK(nb_dropout_init(&layer, 0.5, 1000));
    nb_tensor *x = nb_ones(NB_F32, NB_SHAPE(4096)), *out[1] = {NULL};
    nb_graph *g = NULL;
    CHECK_OK(nb_graph_capture(g_device, dropout_only_step, &layer, 1, &x, 1, out, &g));
    const uint64_t seeds[] = {1005, 1000, 998, 0, (uint64_t)1 << 60, 0x9E3779B97F4A7C15u, UINT64_MAX};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds && g; i++) {
        layer.seed = seeds[i];
        CHECK_OK(nb_graph_replay(g, &x, out));
        CHECKF(layer.seed == seeds[i] + 1, "seed %llu: the layer's seed moved to %llu", (unsigned long long)seeds[i],
               (unsigned long long)layer.seed);
        CHECKF(same_bits(out[0], nb_dropout(x, 0.5, seeds[i])), "seed %llu: the replay's mask is not eager's",
               (unsigned long long)seeds[i]);
    }
    nb_graph_free(g);
    nb_device_pop();
}

/* After a capture, eager updates of a variable nothing else reads write its
 * tensor in place, as before the capture: the graph's hold on it is no read
 * (before, every eager update moved the variable to a fresh tensor, and the
 * next replay copied it back). */
static nb_variable *g_w;
static nb_optimizer *g_sgd;
static nb_status sgd_only_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    (void)user, (void)n_in, (void)n_out, (void)out;
    nb_tensor *g = in[0];
    return nb_optimizer_apply(g_sgd, 1, &g_w, &g);
}

static const void *value_address(nb_variable *v)
{
    nb_scope *s = nb_scope_begin();
    DLManagedTensorVersioned *m = nb_to_dlpack(nb_read(v));
    const void *p = m ? (const char *)m->dl_tensor.data + m->dl_tensor.byte_offset : NULL;
    if (m)
        m->deleter(m);
    nb_scope_end(s);
    return p;
}

static void eager_after_capture(void)
{
    nb_device_push(g_device);
    g_w = nb_variable_new("w", nb_zeros(NB_F64, NB_SHAPE(64)));
    g_sgd = nb_sgd_new(0.125);
    nb_tensor *g = nb_ones(NB_F64, NB_SHAPE(64));
    nb_graph *graph = NULL;
    CHECK_OK(nb_graph_capture(g_device, sgd_only_step, NULL, 1, &g, 0, NULL, &graph));
    const void *at = value_address(g_w);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(nb_optimizer_apply(g_sgd, 1, &g_w, &g));
        CHECKF(value_address(g_w) == at, "eager update %d moved the variable", i);
    }
    CHECK_OK(graph ? nb_graph_replay(graph, &g, NULL) : NB_ERR_INTERNAL);
    CHECK(value_address(g_w) == at && nb_tensor_get(nb_read(g_w), 63) == -0.625);
    nb_tensor *held = nb_read(g_w); /* a read: the next update writes a fresh tensor, the replay copies back */
    CHECK_OK(nb_optimizer_apply(g_sgd, 1, &g_w, &g));
    CHECK(value_address(g_w) != at && nb_tensor_get(held, 0) == -0.625);
    CHECK_OK(graph ? nb_graph_replay(graph, &g, NULL) : NB_ERR_INTERNAL);
    CHECK(value_address(g_w) == at && nb_tensor_get(nb_read(g_w), 0) == -0.875);
    nb_graph_free(graph);
    nb_optimizer_free(g_sgd);
    nb_variable_free(g_w);
    nb_device_pop();
}

static void replay_checks(void)
{
    nb_tensor *x = nb_arange(NB_F32, 0, 6, 1), *outs[2] = {NULL, NULL};
    nb_graph *g = NULL;
    CHECK_OK(nb_graph_capture(g_device, double_step, NULL, 1, &x, 2, outs, &g));
    CHECK(g && !strcmp(nb_graph_device(g), g_device));
    CHECK(outs[0] && nb_tensor_get(nb_to_device(outs[1], "/cpu:0"), 0) == 15);
    nb_tensor *first = outs[0];
    /* New values in, new tensors out; the earlier outputs keep theirs. */
    nb_tensor *x2 = nb_add_scalar(x, 1.0);
    CHECK_OK(nb_graph_replay(g, &x2, outs));
    CHECK(outs[0] != first);
    CHECK(nb_tensor_get(nb_to_device(outs[1], "/cpu:0"), 0) == 21);
    CHECK(nb_tensor_get(nb_to_device(first, "/cpu:0"), 5) == 10);
    CHECK(nb_tensor_get(nb_to_device(outs[0], "/cpu:0"), 5) == 12);
    CHECK_OK(nb_graph_replay(g, &x2, NULL)); /* outputs not wanted */

    nb_tensor *bad_shape = nb_zeros(NB_F32, NB_SHAPE(7));
    CHECK(nb_graph_replay(g, &bad_shape, outs) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_graph_replay", "input 0", "[7]", "[6]");
    nb_tensor *bad_dtype = nb_zeros(NB_F64, NB_SHAPE(6));
    CHECK(nb_graph_replay(g, &bad_dtype, outs) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_graph_replay", "f64", "f32");
    nb_tensor *none = NULL;
    CHECK(nb_graph_replay(g, &none, outs) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");
    /* No inputs: the last step's again. */
    CHECK_OK(nb_graph_replay(g, NULL, outs));
    CHECK(nb_tensor_get(nb_to_device(outs[1], "/cpu:0"), 0) == 21);
    nb_graph_free(g);

    CHECK(nb_graph_replay(NULL, &x, outs) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "graph is NULL");
    CHECK(nb_graph_capture(g_device, NULL, NULL, 1, &x, 1, outs, &g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "fn is NULL");
    CHECK(nb_graph_capture(g_device, double_step, NULL, 1, &none, 2, outs, &g) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 0 is NULL");
    CHECK(nb_graph_capture("/tpu:0", double_step, NULL, 1, &x, 2, outs, &g) == NB_ERR_DEVICE);
    nb_error_clear();
    CHECK(g == NULL);

    /* The step's own error, at capture (on a GPU its second run records) or replay. */
    int calls = 0;
    nb_status st = nb_graph_capture(g_device, failing_step, &calls, 1, &x, 1, outs, &g);
    if (st == NB_OK) {
        CHECK(nb_graph_replay(g, &x, outs) == NB_ERR_SHAPE);
        CHECK_ERROR(NB_ERR_SHAPE, "reshape");
        nb_graph_free(g);
    } else {
        CHECK(st == NB_ERR_SHAPE && g == NULL);
        CHECK_ERROR(NB_ERR_SHAPE, "reshape");
    }
    nb_graph_free(NULL);
    CHECK(!nb_graph_recorded(NULL) && nb_graph_nodes(NULL) == 0 && nb_graph_device(NULL) == NULL);
}

/* ---- the CPU's recording: kernel errors at replay, memory kept ------------------------ */

typedef struct saving {
    nb_tensor *saved[2]; /* a tensor of each run of the step, held past it */
    int runs;
} saving;

/* Gathers rows of in[0] by in[1]; keeps a tensor made in the step. */
static nb_status gather_step(void *user, int n_in, nb_tensor *const *in, int n_out, nb_tensor **out)
{
    saving *sv = user;
    (void)n_in, (void)n_out;
    nb_tensor *rows = nb_gather(in[0], in[1]);
    nb_tensor *tripled = nb_mul_scalar(rows, 3.0);
    out[0] = nb_sum_all(tripled);
    if (sv->runs < 2) /* out of the step's scope, into the test's */
        sv->saved[sv->runs] = nb_keep(tripled);
    sv->runs++;
    return out[0] ? NB_OK : nb_error();
}

static void cpu_recording(void)
{
    nb_device_push(g_device);
    nb_tensor *table = nb_arange(NB_F64, 0, 12, 1); /* [0 .. 11] as rows of 3 */
    table = nb_reshape(table, NB_SHAPE(4, 3));
    int64_t idx[2] = {1, 3}, bad[2] = {1, 4};
    nb_tensor *ok_idx = nb_from_buffer(NB_I64, NB_SHAPE(2), idx);
    nb_tensor *bad_idx = nb_from_buffer(NB_I64, NB_SHAPE(2), bad);
    saving sv = {{NULL, NULL}, 0};
    nb_graph *g = NULL;
    nb_tensor *sum = NULL;
    nb_scope *held = nb_scope_begin();
    CHECK_OK(nb_graph_capture(g_device, gather_step, &sv, 2, (nb_tensor *[]){table, ok_idx}, 1, &sum, &g));
    CHECK(g && nb_graph_recorded(g) && nb_graph_nodes(g) >= 3);
    CHECK(sv.runs == 2 && sv.saved[0] && sv.saved[1]);
    /* rows 1 and 3: (3 + 4 + 5 + 9 + 10 + 11) * 3 */
    CHECK(sum && nb_tensor_item(sum) == 126);
    /* The recording's tensor, let go while the graph lives: its memory stays
     * the graph's (a replay writes it), which ASan would catch otherwise. */
    nb_scope_end(held);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(nb_graph_replay(g, (nb_tensor *[]){table, ok_idx}, &sum));
        CHECK(sum && nb_tensor_item(sum) == 126);
    }
    CHECK(sv.runs == 2); /* replays run no host code */
    /* An index out of range: the replay's gather fails, naming itself. */
    CHECK(nb_graph_replay(g, (nb_tensor *[]){table, bad_idx}, &sum) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "gather", "4");
    /* and the graph goes on */
    CHECK_OK(nb_graph_replay(g, (nb_tensor *[]){table, ok_idx}, &sum));
    CHECK(sum && nb_tensor_item(sum) == 126);
    nb_graph_free(g);
    nb_device_pop();
}

/* Two graphs keep blocks while they live: the first freed (which rebuilds
 * the filter nb__cpu_free reads of the blocks still kept), the second's
 * recorded tensor let go afterwards must still become the second graph's, not
 * the allocator's: eager tensors of its size made next keep their values
 * through the second graph's replays, which write that block. */
static void cpu_kept_after_another_graph(void)
{
    nb_device_push(g_device);
    nb_tensor *table = nb_reshape(nb_arange(NB_F64, 0, 12, 1), NB_SHAPE(4, 3));
    int64_t idx[2] = {1, 3};
    nb_tensor *ok_idx = nb_from_buffer(NB_I64, NB_SHAPE(2), idx);
    saving s1 = {{NULL, NULL}, 0}, s2 = {{NULL, NULL}, 0};
    nb_graph *g1 = NULL, *g2 = NULL;
    nb_tensor *sum = NULL;
    nb_scope *held2 = nb_scope_begin(); /* the tensors each step keeps */
    CHECK_OK(nb_graph_capture(g_device, gather_step, &s2, 2, (nb_tensor *[]){table, ok_idx}, 1, &sum, &g2));
    nb_scope *held1 = nb_scope_begin();
    CHECK_OK(nb_graph_capture(g_device, gather_step, &s1, 2, (nb_tensor *[]){table, ok_idx}, 1, &sum, &g1));
    nb_scope_end(held1); /* g1's recorded tensor goes to g1 */
    nb_graph_free(g1);
    nb_scope_end(held2); /* g2's goes to g2 */
    enum { N = 64 };
    nb_tensor *eager[N];
    for (int i = 0; i < N; i++)
        eager[i] = nb_full(NB_F64, NB_SHAPE(2, 3), -1.0); /* the size of the kept block */
    for (int i = 0; i < 3; i++) {
        CHECK_OK(nb_graph_replay(g2, (nb_tensor *[]){table, ok_idx}, &sum));
        CHECK(sum && nb_tensor_item(sum) == 126);
    }
    int changed = 0;
    for (int i = 0; i < N; i++) {
        double v[6] = {0};
        CHECK_OK(nb_tensor_read(eager[i], v, sizeof v));
        for (int j = 0; j < 6; j++)
            changed += v[j] != -1.0;
    }
    CHECKF(changed == 0, "%d elements of eager tensors written by the replays", changed);
    nb_graph_free(g2);
    nb_device_pop();
}

int main(int argc, char **argv)
{
    bool gpu_only = argc > 1 && !strcmp(argv[1], "--gpu");
    nb_set_logical_cpu_devices(2);
    nb_set_deterministic(true);
    if (gpu_only) {
        if (nb_device_count(NB_DEVICE_GPU) == 0)
            return check_no_gpu("test_graph --gpu");
        g_device = "/gpu:0";
        g_other = "/cpu:1";
    }
    RUN(ops_bitwise);
    RUN(bitwise_f64);
    RUN(bitwise_f32);
    RUN(bitwise_in_place);
    RUN(bitwise_dropout);
    RUN(dropout_seed_set);
    RUN(bitwise_mixed);
    RUN(bitwise_scaled);
    RUN(scaler_rules);
    RUN(scaler_readback);
    RUN(refusals);
    RUN(replay_checks);
    RUN(read_then_update);
    RUN(in_place_nodes);
    RUN(old_value_after_update);
    RUN(twice_updated);
    RUN(eager_after_capture);
    if (gpu_only)
        RUN(retry_memory);
    if (!gpu_only) /* a GPU's index errors surface later, at a synchronising call */
        RUN(cpu_recording);
    if (!gpu_only)
        RUN(cpu_kept_after_another_graph);
    return check_finish();
}
