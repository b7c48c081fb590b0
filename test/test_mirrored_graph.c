/* The mirrored strategy's captured step (nb_mirrored_capture): a capture and
 * replays give the variables (every replica's copy) and losses of eager
 * nb_mirrored_step calls, bit for bit, over 2 and 3 replicas of logical CPU
 * devices (or the GPUs' logical devices with --gpu), in f64 with momentum and
 * f32 with Adam, MEAN and SUM, an uneven batch, a learning rate changed and
 * eager steps run between replays; the bad arguments and a replica that
 * breaks a capture rule are refused, naming it, without hanging, and the
 * strategy goes on.
 *
 *   test_mirrored_graph [--gpu]     (--gpu: on a GPU's logical devices; 77 without one) */
#include "check.h"

#define FEAT 6
#define HID 8
#define OUT 3
#define STEPS 40

static const char *g_kind = "/cpu:"; /* the replicas' device kind */

typedef struct model {
    nb_variable *v[4];
    nb_optimizer *opt;
} model;

static nb_mirrored *strategy(int n)
{
    char names[4][16];
    const char *devs[4];
    for (int r = 0; r < n; r++) {
        snprintf(names[r], sizeof names[r], "%s%d", g_kind, r);
        devs[r] = names[r];
    }
    return nb_mirrored_new(n, devs);
}

static void model_init(model *m, nb_mirrored *s, nb_dtype dt, bool adam)
{
    nb_scope *sc = nb_scope_begin();
    nb_device_push("/cpu:0");
    m->v[0] = nb_mirrored_variable_new(s, "w1", nb_cast(nb_random_normal(NB_F64, NB_SHAPE(FEAT, HID), 0, 0.5, 1), dt));
    m->v[1] = nb_mirrored_variable_new(s, "b1", nb_zeros(dt, NB_SHAPE(HID)));
    m->v[2] = nb_mirrored_variable_new(s, "w2", nb_cast(nb_random_normal(NB_F64, NB_SHAPE(HID, OUT), 0, 0.5, 2), dt));
    m->v[3] = nb_mirrored_variable_new(s, "b2", nb_cast(nb_random_uniform(NB_F64, NB_SHAPE(OUT), -0.1, 0.1, 3), dt));
    nb_device_pop();
    nb_scope_end(sc);
    m->opt = adam ? nb_adam_new(0.01, 0.9, 0.999, 1e-7) : nb_sgd_momentum_new(0.05, 0.9, false);
}

static void model_free(model *m)
{
    for (int i = 0; i < 4; i++)
        nb_variable_free(m->v[i]);
    nb_optimizer_free(m->opt);
}

/* Step i's batch (on the CPU): rows of features and a fixed teacher's targets. */
static void batch(int i, nb_dtype dt, int64_t rows, nb_tensor **in)
{
    nb_device_push("/cpu:0");
    nb_tensor *x = nb_random_normal(NB_F64, NB_SHAPE(rows, FEAT), 0, 1, 100 + (uint64_t)i);
    nb_tensor *teacher = nb_random_normal(NB_F64, NB_SHAPE(FEAT, OUT), 0, 1, 7);
    in[0] = nb_cast(x, dt);
    in[1] = nb_cast(nb_tanh(nb_matmul(x, teacher)), dt);
    nb_device_pop();
}

typedef struct step_user {
    nb_reduction red;
    int break_on; /* -1, or the replica that reads a tensor to the host */
} step_user;

static nb_status replica_step(nb_replica *r, int n_in, nb_tensor *const *in, int nv, nb_variable *const *v,
                              nb_tensor **loss, nb_tensor **grads, void *user)
{
    const step_user *u = user;
    (void)n_in;
    nb_tape *tape = nb_tape_begin();
    nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[0], nb_read(v[0])), nb_read(v[1])));
    nb_tensor *out = nb_add(nb_matmul(h, nb_read(v[2])), nb_read(v[3]));
    nb_tensor *per_row = nb_mean(nb_square(nb_sub(out, in[1])), NB_AXES(1), false);
    *loss = u->red == NB_REDUCE_SUM ? nb_sum_all(per_row) : nb_mean_all(per_row);
    if (nb_replica_index(r) == u->break_on && isnan(nb_tensor_item(*loss)))
        return nb_error();
    return nb_tape_gradient_vars(tape, *loss, nv, v, grads);
}

/* Every copy of every variable, as bytes. */
static size_t read_all(const model *m, int n, unsigned char *buf, size_t cap)
{
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        for (int r = 0; r < n; r++) {
            nb_scope *sc = nb_scope_begin();
            nb_tensor *t = nb_to_device(nb_mirrored_variable_read(m->v[i], r), "/cpu:0");
            size_t bytes = (size_t)nb_tensor_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
            bool ok = at + bytes <= cap && nb_tensor_read(t, buf + at, bytes) == NB_OK;
            nb_scope_end(sc);
            if (!ok)
                return 0;
            at += bytes;
        }
    }
    return at;
}

/* STEPS eager steps against a capture and replays (steps 20-22 eager ones),
 * from the same start; the learning rate halved at step 30. */
static void same_as_eager(int n, nb_dtype dt, bool adam, nb_reduction red, int64_t rows)
{
    static unsigned char a[1 << 16], b[1 << 16];
    double loss_eager[STEPS], loss_graph[STEPS];
    step_user u = {red, -1};

    nb_mirrored *s = strategy(n);
    model m;
    model_init(&m, s, dt, adam);
    for (int i = 0; i < STEPS; i++) {
        nb_scope *sc = nb_scope_begin();
        if (i == 30)
            nb_optimizer_set_learning_rate(m.opt, nb_optimizer_learning_rate(m.opt) * 0.5);
        nb_tensor *in[2], *loss = NULL;
        batch(i, dt, rows, in);
        CHECK_OK(nb_mirrored_step(s, m.opt, 4, m.v, replica_step, &u, 2, in, red, &loss));
        loss_eager[i] = loss ? nb_tensor_item(loss) : NAN;
        nb_scope_end(sc);
    }
    size_t na = read_all(&m, n, a, sizeof a);
    int64_t iters = nb_optimizer_iterations(m.opt);
    model_free(&m);
    nb_mirrored_free(s);

    s = strategy(n);
    model_init(&m, s, dt, adam);
    nb_mirrored_graph *g = NULL;
    for (int i = 0; i < STEPS; i++) {
        nb_scope *sc = nb_scope_begin();
        if (i == 30)
            nb_optimizer_set_learning_rate(m.opt, nb_optimizer_learning_rate(m.opt) * 0.5);
        nb_tensor *in[2], *loss = NULL;
        batch(i, dt, rows, in);
        if (i == 0)
            CHECK_OK(nb_mirrored_capture(s, m.opt, 4, m.v, replica_step, &u, 2, in, red, &loss, &g));
        else if (i >= 20 && i < 23) /* eager steps between replays: the variables move */
            CHECK_OK(nb_mirrored_step(s, m.opt, 4, m.v, replica_step, &u, 2, in, red, &loss));
        else
            CHECK_OK(nb_mirrored_graph_replay(g, in, &loss));
        loss_graph[i] = loss ? nb_tensor_item(loss) : NAN;
        nb_scope_end(sc);
        if (!g)
            break;
    }
    CHECK(nb_mirrored_graph_nodes(g) > 10 * n);
    CHECK(nb_optimizer_iterations(m.opt) == iters);
    nb_mirrored_stats st;
    CHECK_OK(nb_mirrored_get_stats(s, &st));
    CHECK(st.steps == STEPS);
    nb_mirrored_graph_free(g);
    size_t nb = read_all(&m, n, b, sizeof b);
    model_free(&m);
    nb_mirrored_free(s);

    CHECK(na > 0 && na == nb && memcmp(a, b, na) == 0);
    int diff = -1;
    for (int i = 0; i < STEPS && diff < 0; i++)
        if (memcmp(&loss_eager[i], &loss_graph[i], sizeof(double)) != 0)
            diff = i;
    if (diff >= 0)
        fprintf(stderr, "[%s] %d replicas %s %s %s rows %lld: loss of step %d: eager %.17g, graph %.17g\n",
                check_current, n, nb_dtype_name(dt), adam ? "adam" : "momentum", red == NB_REDUCE_SUM ? "sum" : "mean",
                (long long)rows, diff, loss_eager[diff], loss_graph[diff]);
    CHECK(diff < 0);
    CHECK(isfinite(loss_eager[STEPS - 1]) && loss_eager[STEPS - 1] < loss_eager[0]);
}

static void bitwise_two(void)
{
    same_as_eager(2, NB_F64, false, NB_REDUCE_MEAN, 16);
    same_as_eager(2, NB_F32, true, NB_REDUCE_MEAN, 16);
}

static void bitwise_three_uneven(void)
{
    same_as_eager(3, NB_F64, true, NB_REDUCE_MEAN, 10);
    same_as_eager(3, NB_F32, false, NB_REDUCE_SUM, 11);
}

static void refusals(void)
{
    nb_mirrored *s = strategy(2);
    model m;
    model_init(&m, s, NB_F64, false);
    step_user u = {NB_REDUCE_MEAN, -1};
    nb_tensor *in[2], *one[2], *loss = NULL;
    batch(0, NB_F64, 8, in);
    batch(1, NB_F64, 1, one);
    nb_mirrored_graph *g = (nb_mirrored_graph *)&u; /* must come back NULL */

    CHECK(nb_mirrored_capture(s, m.opt, 4, m.v, replica_step, &u, 2, in, NB_REDUCE_MEAN, &loss, NULL) ==
          NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_capture", "out is NULL");
    CHECK(nb_mirrored_capture(NULL, m.opt, 4, m.v, replica_step, &u, 2, in, NB_REDUCE_MEAN, &loss, &g) ==
          NB_ERR_INVALID_ARGUMENT);
    CHECK(g == NULL && loss == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_mirrored_capture", "strategy");
    /* one row for two replicas: one would record nothing */
    CHECK(nb_mirrored_capture(s, m.opt, 4, m.v, replica_step, &u, 2, one, NB_REDUCE_MEAN, &loss, &g) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_mirrored_capture", "replica 1", "none");
    /* replica 1 reads to the host: refused naming it and the call; no hang */
    u.break_on = 1;
    CHECK(nb_mirrored_capture(s, m.opt, 4, m.v, replica_step, &u, 2, in, NB_REDUCE_MEAN, &loss, &g) ==
          NB_ERR_UNSUPPORTED);
    CHECK(g == NULL);
    CHECK_ERROR(NB_ERR_UNSUPPORTED, "nb_mirrored_capture", "replica 1", "nb_tensor_get");
    /* the strategy goes on: a capture, replays and their checks */
    u.break_on = -1;
    CHECK_OK(nb_mirrored_capture(s, m.opt, 4, m.v, replica_step, &u, 2, in, NB_REDUCE_MEAN, &loss, &g));
    CHECK(g && loss);
    CHECK_OK(nb_mirrored_graph_replay(g, in, NULL));
    nb_tensor *wide[2] = {nb_zeros(NB_F64, NB_SHAPE(8, FEAT + 1)), in[1]};
    CHECK(nb_mirrored_graph_replay(g, wide, &loss) == NB_ERR_SHAPE);
    CHECK_ERROR(NB_ERR_SHAPE, "nb_mirrored_graph_replay", "input 0", "[8, 7]", "[8, 6]");
    nb_tensor *f32[2] = {nb_cast(in[0], NB_F32), in[1]};
    CHECK(nb_mirrored_graph_replay(g, f32, &loss) == NB_ERR_DTYPE);
    CHECK_ERROR(NB_ERR_DTYPE, "nb_mirrored_graph_replay", "f32", "f64");
    CHECK(nb_mirrored_graph_replay(g, (nb_tensor *[]){in[0], NULL}, &loss) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "input 1 is NULL");
    CHECK(nb_mirrored_graph_replay(NULL, in, &loss) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "the graph is NULL");
    CHECK_OK(nb_mirrored_graph_replay(g, in, &loss));
    CHECK(loss && isfinite(nb_tensor_item(loss)));
    nb_mirrored_graph_free(g);
    nb_mirrored_graph_free(NULL);
    CHECK(nb_mirrored_graph_nodes(NULL) == 0);
    model_free(&m);
    nb_mirrored_free(s);
}

int main(int argc, char **argv)
{
    nb_set_logical_cpu_devices(3);
    nb_set_deterministic(true);
    if (argc > 1 && !strcmp(argv[1], "--gpu")) {
        /* the split before any device is used: nb_device_count would fix it */
        if (nb_physical_gpu_count() == 0)
            return check_no_gpu("test_mirrored_graph --gpu");
        CHECK_OK(nb_set_logical_gpu_devices(3));
        if (nb_device_count(NB_DEVICE_GPU) < 3)
            return check_no_gpu("test_mirrored_graph --gpu");
        g_kind = "/gpu:";
    }
    RUN(bitwise_two);
    RUN(bitwise_three_uneven);
    RUN(refusals);
    return check_finish();
}
