/* The mirrored strategy on GPUs. One card is split into four logical GPUs:
 * one step over 2 and 4 of them equals one step on one GPU (f64 and f32), the
 * copies stay bit-equal over 20 steps, all-reduce matches a CPU reference and
 * the algorithm is "copies" (device copies; NCCL cannot span logical GPUs of
 * one card). With two or more cards, also a strategy over one logical GPU per
 * card (NCCL when built in, else copies) with the same checks. Exits 77
 * (skipped) where there is no GPU, or fails naming why when NB_REQUIRE_GPU=1. */
#include "check.h"

#define MAXR 64

static int logical_per_card; /* logical GPUs per physical one */
static int cards;            /* physical GPUs */

/* ---- helpers ------------------------------------------------------------------ */

/* Largest |a - b| / max(|a|, |b|, 1e-6) over the elements; INFINITY when
 * either is missing or the shapes differ. */
static double rel_diff(const nb_tensor *a, const nb_tensor *b)
{
    if (!a || !b || !has_shape(b, nb_tensor_shape(a)))
        return INFINITY;
    double *x = check_read_doubles(a), *y = check_read_doubles(b), worst = 0;
    if (!x || !y)
        worst = INFINITY;
    for (int64_t i = 0; x && y && i < nb_tensor_numel(a); i++) {
        double d = fabs(x[i] - y[i]) / fmax(fmax(fabs(x[i]), fabs(y[i])), 1e-6);
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    free(x);
    free(y);
    return worst;
}

/* ---- the model: tanh MLP, mean squared error per row ------------------------------ */

#define DIN 16
#define DHID 32
#define DOUT 4

static nb_tensor *mlp_loss(nb_variable *const *v, nb_tensor *const *in)
{
    nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[0], nb_read(v[0])), nb_read(v[1])));
    nb_tensor *out = nb_add(nb_matmul(h, nb_read(v[2])), nb_read(v[3]));
    return nb_mean_all(nb_mean(nb_square(nb_sub(out, in[1])), NB_AXES(1), false));
}

static nb_status mlp_step(nb_replica *r, int n_in, nb_tensor *const *in, int nv, nb_variable *const *vars,
                          nb_tensor **loss, nb_tensor **grads, void *user)
{
    (void)r, (void)n_in, (void)user;
    nb_tape *tape = nb_tape_begin();
    *loss = mlp_loss(vars, in);
    if (!*loss)
        return nb_error();
    return nb_tape_gradient_vars(tape, *loss, nv, vars, grads);
}

/* Trains on a strategy over devs and, beside it, plain variables on devs[0];
 * after `steps` steps compares every copy with the plain model (tol) and with
 * replica 0's copy (bit for bit). */
static void mirrored_vs_one(const char *const *devs, int n, nb_dtype dt, int64_t rows, int steps,
                            double tol, const char *want_algorithm)
{
    nb_scope *sc = nb_scope_begin();
    char what[160];
    snprintf(what, sizeof what, "%s %s n=%d rows=%lld steps=%d", devs[0], nb_dtype_name(dt), n,
             (long long)rows, steps);
    nb_mirrored *s = nb_mirrored_new(n, devs);
    CHECKF(s != NULL, "%s: nb_mirrored_new", what);
    if (!s) {
        nb_error_clear();
        nb_scope_end(sc);
        return;
    }
    nb_mirrored_stats st;
    CHECK_OK(nb_mirrored_get_stats(s, &st));
    printf("  %s: algorithm %s\n", what, st.algorithm ? st.algorithm : "(null)");
    if (want_algorithm)
        CHECKF(st.algorithm && strcmp(st.algorithm, want_algorithm) == 0, "%s: algorithm %s, expected %s",
               what, st.algorithm ? st.algorithm : "(null)", want_algorithm);
    else
        CHECKF(st.algorithm && (strcmp(st.algorithm, "nccl") == 0 || strcmp(st.algorithm, "copies") == 0),
               "%s: algorithm %s", what, st.algorithm ? st.algorithm : "(null)");

    CHECK_OK(nb_device_push(devs[0]));
    nb_tensor *init[4] = {
        nb_random_normal(dt, NB_SHAPE(DIN, DHID), 0, 0.3, 1),
        nb_random_normal(dt, NB_SHAPE(DHID), 0, 0.3, 2),
        nb_random_normal(dt, NB_SHAPE(DHID, DOUT), 0, 0.3, 3),
        nb_random_normal(dt, NB_SHAPE(DOUT), 0, 0.3, 4),
    };
    nb_tensor *in[2] = {nb_random_normal(dt, NB_SHAPE(rows, DIN), 0, 1, 5),
                        nb_random_normal(dt, NB_SHAPE(rows, DOUT), 0, 1, 6)};
    nb_variable *mv[4], *pv[4];
    for (int i = 0; i < 4; i++) {
        mv[i] = nb_mirrored_variable_new(s, "mlp", init[i]);
        pv[i] = nb_variable_new("mlp", init[i]);
    }
    nb_optimizer *mopt = nb_sgd_new(0.1), *popt = nb_sgd_new(0.1);
    double mloss = NAN, ploss = NAN;
    for (int k = 0; k < steps; k++) {
        nb_scope *ks = nb_scope_begin();
        nb_tensor *loss = NULL;
        CHECK_OK(nb_mirrored_step(s, mopt, 4, mv, mlp_step, NULL, 2, in, NB_REDUCE_MEAN, &loss));
        mloss = loss ? nb_tensor_item(loss) : NAN;
        nb_tape *tape = nb_tape_begin();
        nb_tensor *l = mlp_loss(pv, in), *g[4] = {0};
        CHECK_OK(nb_tape_gradient_vars(tape, l, 4, pv, g));
        CHECK_OK(nb_optimizer_apply(popt, 4, pv, g));
        ploss = l ? nb_tensor_item(l) : NAN;
        nb_scope_end(ks);
    }
    CHECK_OK(nb_device_pop());
    CHECKF(fabs(mloss - ploss) <= tol * fmax(fabs(ploss), 1e-6), "%s: loss %.17g, one device %.17g", what,
           mloss, ploss);
    for (int i = 0; i < 4; i++) {
        nb_tensor *ref = nb_read(pv[i]), *c0 = nb_mirrored_variable_read(mv[i], 0);
        for (int r = 0; r < n; r++) {
            nb_tensor *c = nb_mirrored_variable_read(mv[i], r);
            double e = rel_diff(c, ref);
            CHECKF(e <= tol, "%s: var %d replica %d differs from one device by %.3g", what, i, r, e);
            CHECKF(on_device(c, devs[r]), "%s: var %d replica %d on %s", what, i, r,
                   c ? nb_tensor_device(c) : "(null)");
            CHECKF(same_bits(c, c0), "%s: var %d replica %d not bit-equal to replica 0", what, i, r);
        }
    }
    for (int i = 0; i < 4; i++) {
        nb_variable_free(mv[i]);
        nb_variable_free(pv[i]);
    }
    nb_optimizer_free(mopt);
    nb_optimizer_free(popt);
    nb_mirrored_free(s);
    nb_scope_end(sc);
}

/* All-reduce on the strategy against sums made on the CPU in replica order. */
static void all_reduce_vs_cpu(const char *const *devs, int n, nb_dtype dt, int64_t len)
{
    nb_scope *sc = nb_scope_begin();
    nb_mirrored *s = nb_mirrored_new(n, devs);
    CHECK(s != NULL);
    if (!s) {
        nb_error_clear();
        nb_scope_end(sc);
        return;
    }
    nb_tensor *per[MAXR], *out[MAXR];
    for (int r = 0; r < n; r++) {
        CHECK_OK(nb_device_push(devs[r]));
        per[r] = nb_random_normal(dt, NB_SHAPE(len), 0, 1, 100 + (uint64_t)r);
        CHECK_OK(nb_device_pop());
    }
    for (int red = 0; red < 2; red++) {
        CHECK_OK(nb_mirrored_all_reduce(s, (nb_reduction)red, per, out));
        /* the reference: on the CPU, in replica order */
        nb_tensor *ref = nb_to_device(per[0], "/cpu:0");
        for (int r = 1; r < n; r++)
            ref = nb_add(ref, nb_to_device(per[r], "/cpu:0"));
        if (red == NB_REDUCE_MEAN)
            ref = nb_div(ref, nb_scalar(dt, n));
        for (int r = 0; r < n; r++) {
            CHECKF(on_device(out[r], devs[r]), "all_reduce %s len %lld: out[%d] on %s", nb_dtype_name(dt),
                   (long long)len, r, out[r] ? nb_tensor_device(out[r]) : "(null)");
            CHECKF(same_bits(out[r], out[0]), "all_reduce %s len %lld: out[%d] differs from out[0]",
                   nb_dtype_name(dt), (long long)len, r);
        }
        /* |a - b| / (1 + |b|): NCCL may sum in another order */
        double *a = check_read_doubles(out[0]), *b = check_read_doubles(ref), e = a && b ? 0 : INFINITY;
        for (int64_t i = 0; a && b && i < len; i++) {
            double d = fabs(a[i] - b[i]) / (1 + fabs(b[i]));
            e = d > e || isnan(d) ? (isnan(d) ? INFINITY : d) : e;
        }
        free(a);
        free(b);
        CHECKF(e <= (dt == NB_F64 ? 4e-15 : 2e-6), "all_reduce %s %s len %lld on %d: error %.3g",
               red ? "MEAN" : "SUM", nb_dtype_name(dt), (long long)len, n, e);
    }
    nb_mirrored_free(s);
    nb_scope_end(sc);
}

/* ---- cases ------------------------------------------------------------------------ */

static const char *logical[MAXR];   /* the first logical GPUs, all on card 0 when it is split */
static const char *per_card[MAXR];  /* one logical GPU per card */

/* One step over 2 and 4 logical GPUs equals one step on one GPU; f64 to 1e-12,
 * f32 to 1e-5; the copies match bit for bit after 20 steps; algorithm "copies". */
static void test_logical_gpus(void)
{
    int n = logical_per_card >= 4 ? 4 : logical_per_card;
    for (int k = 2; k <= n; k += 2) {
        printf("logical GPUs on one card: %d\n", k);
        mirrored_vs_one(logical, k, NB_F64, 7, 1, 1e-12, "copies");
        mirrored_vs_one(logical, k, NB_F32, 7, 1, 1e-5, "copies");
        mirrored_vs_one(logical, k, NB_F64, 10, 20, 1e-10, "copies");
        mirrored_vs_one(logical, k, NB_F32, 10, 20, 1e-3, "copies");
        mirrored_vs_one(logical, k, NB_F64, 1, 1, 1e-12, "copies"); /* replicas with no rows */
    }
}

static void test_logical_all_reduce(void)
{
    int n = logical_per_card >= 4 ? 4 : logical_per_card;
    static const int64_t sizes[] = {1, 3, 5, 1000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        all_reduce_vs_cpu(logical, n, NB_F64, sizes[i]);
        all_reduce_vs_cpu(logical, n, NB_F32, sizes[i]);
    }
}

/* With two or more cards: one logical GPU per card, NCCL when it is built in. */
static void test_one_per_card(void)
{
    printf("one logical GPU per card: %d cards\n", cards);
    mirrored_vs_one(per_card, cards, NB_F64, 7, 1, 1e-12, NULL);
    mirrored_vs_one(per_card, cards, NB_F32, 7, 1, 1e-5, NULL);
    mirrored_vs_one(per_card, cards, NB_F32, 10, 20, 1e-3, NULL);
    all_reduce_vs_cpu(per_card, cards, NB_F64, 1027);
    all_reduce_vs_cpu(per_card, cards, NB_F32, 1 << 20);
}

int main(void)
{
    cards = nb_physical_gpu_count();
    logical_per_card = cards == 1 ? 4 : 2;
    if (nb_set_logical_gpu_devices(logical_per_card) != NB_OK)
        return 1;
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return check_no_gpu("test_distribute_gpu");
    printf("%d physical GPU(s), %d logical per card, %d logical GPUs\n", cards, logical_per_card,
           nb_device_count(NB_DEVICE_GPU));
    /* Logical GPUs are numbered card by card: card c holds c * per_card ... */
    for (int i = 0; i < logical_per_card && i < MAXR; i++)
        logical[i] = nb_device_name(NB_DEVICE_GPU, i);
    for (int c = 0; c < cards && c < MAXR; c++)
        per_card[c] = nb_device_name(NB_DEVICE_GPU, c * logical_per_card);
    RUN(test_logical_gpus);
    RUN(test_logical_all_reduce);
    if (cards >= 2)
        RUN(test_one_per_card);
    return check_finish();
}
