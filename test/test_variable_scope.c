/* Tests of the variable registry (nb_variables_list, nb_variable_find,
 * nb_variables_free_all) and of variable scopes (nb_variable_scope_push/pop,
 * nb_get_variable): names joined with '/', reuse inherited by inner scopes,
 * TensorFlow 1's errors for a duplicate, a missing or a mismatched variable,
 * the initializers, and scopes being per thread. */
#include "check.h"

#include <pthread.h>

static const nb_initializer zeros = {NB_INIT_ZEROS, 0, 0, 0};

static void test_registry(void)
{
    int before = nb_variables_list(NULL, 0);
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2));
    nb_variable *a = nb_variable_new("reg/a", x), *b = nb_variable_new("reg/b", x), *c = nb_variable_new("reg/a", x);
    CHECK(nb_variables_list(NULL, 0) == before + 3);
    nb_variable *all[64];
    int n = nb_variables_list(all, 64);
    CHECK(n == before + 3 && n <= 64);
    CHECK(all[n - 3] == a && all[n - 2] == b && all[n - 1] == c); /* creation order */
    CHECK(nb_variable_find("reg/a") == a); /* the oldest of two with one name */
    CHECK(nb_variable_find("reg/b") == b);
    CHECK(nb_variable_find("reg/none") == NULL && nb_error() == NB_OK);
    CHECK(nb_variable_find(NULL) == NULL);
    nb_variable_free(a);
    CHECK(nb_variable_find("reg/a") == c);
    CHECK(nb_variables_list(all, 1) == before + 2);
    nb_variable_free(b);
    nb_variable_free(c);
    CHECK(nb_variables_list(NULL, 0) == before);
    CHECK(nb_variable_find("reg/a") == NULL);
}

static void test_scope_names(void)
{
    CHECK(strcmp(nb_variable_scope_name(), "") == 0);
    nb_variable *top = nb_get_variable("bias", NB_SHAPE(3), NB_F32, zeros);
    CHECK(top && strcmp(nb_variable_name(top), "bias") == 0);
    CHECK_OK(nb_variable_scope_push("model", false));
    CHECK_OK(nb_variable_scope_push("dense", false));
    CHECK(strcmp(nb_variable_scope_name(), "model/dense") == 0);
    nb_variable *k = nb_get_variable("kernel", NB_SHAPE(4, 3), NB_F32, zeros);
    CHECK(k && strcmp(nb_variable_name(k), "model/dense/kernel") == 0);
    CHECK(nb_variable_find("model/dense/kernel") == k);
    CHECK_OK(nb_variable_scope_pop());
    CHECK(strcmp(nb_variable_scope_name(), "model") == 0);
    CHECK_OK(nb_variable_scope_pop());
    CHECK(strcmp(nb_variable_scope_name(), "") == 0);
    CHECK(nb_variable_scope_pop() == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_variable_scope_pop", "no variable scope");
    CHECK(nb_variable_scope_push("", false) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_variable_scope_push", "empty");
    CHECK(nb_variable_scope_push(NULL, false) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "NULL");
    /* Too deep and too long are refused with nothing pushed. */
    int pushed = 0;
    while (nb_variable_scope_push("s", false) == NB_OK)
        pushed++;
    CHECK(pushed == 64);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "at most 64");
    while (nb_variable_scope_pop() == NB_OK)
        pushed--;
    nb_error_clear();
    CHECK(pushed == 0);
    char longname[300];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK(nb_variable_scope_push(longname, false) == NB_ERR_INVALID_ARGUMENT);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "at most 255");
    CHECK(strcmp(nb_variable_scope_name(), "") == 0);
    nb_variable_free(top);
    nb_variable_free(k);
}

static void test_reuse(void)
{
    CHECK_OK(nb_variable_scope_push("net", false));
    nb_variable *w = nb_get_variable("w", NB_SHAPE(2, 3), NB_F32, zeros);
    CHECK(w != NULL);
    /* Made twice outside reuse: refused, as tf.get_variable does. */
    CHECK(nb_get_variable("w", NB_SHAPE(2, 3), NB_F32, zeros) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_get_variable", "'net/w' already exists");
    CHECK_OK(nb_variable_scope_pop());

    CHECK_OK(nb_variable_scope_push("net", true));
    CHECK(nb_get_variable("w", NB_SHAPE(2, 3), NB_F32, zeros) == w);
    CHECK(nb_get_variable("w", NB_SHAPE(3, 2), NB_F32, zeros) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "'net/w'", "[2, 3]", "[3, 2]");
    CHECK(nb_get_variable("w", NB_SHAPE(2, 3), NB_F64, zeros) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "'net/w'", "f32", "f64");
    CHECK(nb_get_variable("missing", NB_SHAPE(1), NB_F32, zeros) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'net/missing' does not exist");
    /* Reuse is inherited by inner scopes, even one pushed without it. */
    CHECK_OK(nb_variable_scope_push("inner", false));
    CHECK(nb_get_variable("u", NB_SHAPE(1), NB_F32, zeros) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'net/inner/u' does not exist");
    CHECK_OK(nb_variable_scope_pop());
    CHECK_OK(nb_variable_scope_pop());
    CHECK(nb_get_variable(NULL, NB_SHAPE(1), NB_F32, zeros) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "nb_get_variable", "NULL");
    nb_variable_free(w);
}

static void test_initializers(void)
{
    nb_variable *c = nb_get_variable("init/c", NB_SHAPE(5), NB_F64, (nb_initializer){NB_INIT_CONSTANT, 2.5, 0, 0});
    nb_tensor *t = nb_read(c);
    for (int i = 0; i < 5; i++)
        CHECK(nb_tensor_get(t, i) == 2.5);
    nb_initializer normal = {NB_INIT_NORMAL, 1.0, 0.5, 42};
    nb_variable *n1 = nb_get_variable("init/n1", NB_SHAPE(100), NB_F32, normal);
    nb_variable *n2 = nb_get_variable("init/n2", NB_SHAPE(100), NB_F32, normal);
    CHECK(same_bits(nb_read(n1), nb_read(n2))); /* one seed, one draw */
    double mean = nb_tensor_item(nb_mean_all(nb_read(n1)));
    CHECK(fabs(mean - 1.0) < 0.2);
    nb_initializer glorot = {NB_INIT_GLOROT_UNIFORM, 0, 0, 7};
    nb_variable *g = nb_get_variable("init/g", NB_SHAPE(20, 30), NB_F32, glorot);
    double limit = sqrt(6.0 / 50.0), top = 0;
    nb_tensor *gv = nb_read(g);
    for (int i = 0; i < 600; i++) {
        double x = fabs(nb_tensor_get(gv, i));
        CHECK(x <= limit);
        top = x > top ? x : top;
    }
    CHECK(top > 0.8 * limit);

    /* The variance-scaling kinds: a [3, 3, 16, 32] filter (fan_in 144, fan_out
     * 288), 4608 values; the sample variance is within 10% of the named one,
     * and the truncated ones never pass two standard deviations. */
    const struct {
        nb_init_kind kind;
        double var;
        bool truncated;
    } vs[] = {
        {NB_INIT_GLOROT_NORMAL, 2.0 / 432, true},
        {NB_INIT_HE_NORMAL, 2.0 / 144, true},
        {NB_INIT_HE_UNIFORM, 2.0 / 144, false},
        {NB_INIT_GLOROT_UNIFORM, 2.0 / 432, false},
    };
    for (size_t k = 0; k < sizeof vs / sizeof *vs; k++) {
        char name[32];
        snprintf(name, sizeof name, "init/vs%zu", k);
        nb_variable *v = nb_get_variable(name, NB_SHAPE(3, 3, 16, 32), NB_F64, (nb_initializer){vs[k].kind, 0, 0, 9});
        CHECK(v != NULL);
        if (!v)
            continue;
        double *w = malloc(4608 * sizeof *w), sum = 0, sq = 0, peak = 0;
        CHECK_OK(nb_tensor_read(nb_read(v), w, 4608 * sizeof *w));
        for (int i = 0; i < 4608; i++) {
            sum += w[i];
            sq += w[i] * w[i];
            peak = fabs(w[i]) > peak ? fabs(w[i]) : peak;
        }
        double m = sum / 4608, var = sq / 4608 - m * m;
        CHECK(fabs(var / vs[k].var - 1) < 0.1);
        double bound = vs[k].truncated ? 2 * sqrt(vs[k].var) / 0.87962566103423978 : sqrt(3 * vs[k].var);
        CHECK(peak <= bound * (1 + 1e-12));
        free(w);
    }
    nb_variable *tn = nb_get_variable("init/tn", NB_SHAPE(1000), NB_F64,
                                      (nb_initializer){NB_INIT_TRUNCATED_NORMAL, 3.0, 0.5, 1});
    CHECK(nb_tensor_item(nb_max(nb_read(tn), NB_ALL_AXES, false)) <= 4.0);
    CHECK(nb_tensor_item(nb_min(nb_read(tn), NB_ALL_AXES, false)) >= 2.0);
    nb_variable *un = nb_get_variable("init/un", NB_SHAPE(1000), NB_F64, (nb_initializer){NB_INIT_UNIFORM, 0.05, 0, 1});
    CHECK(nb_tensor_item(nb_max(nb_abs(nb_read(un)), NB_ALL_AXES, false)) <= 0.05);
    CHECK(nb_tensor_item(nb_max(nb_abs(nb_read(un)), NB_ALL_AXES, false)) > 0.045);
    CHECK(nb_get_variable("init/bad", NB_SHAPE(2), NB_F32, (nb_initializer){(nb_init_kind)99, 0, 0, 0}) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "'init/bad'", "initializer");
    CHECK(nb_variable_find("init/bad") == NULL);
    int before = nb_variables_list(NULL, 0);
    CHECK(nb_variables_free_all() == before);
    CHECK(nb_variables_list(NULL, 0) == 0);
    CHECK(nb_variable_find("init/c") == NULL);
}

/* Scopes are per thread: a scope pushed here is not seen by another thread. */
static void *other_thread(void *arg)
{
    const char **seen = arg;
    *seen = strcmp(nb_variable_scope_name(), "") == 0 ? "top" : "leaked";
    nb_variable_scope_push("worker", false);
    nb_variable *v = nb_get_variable("v", NB_SCALAR, NB_F32, zeros);
    if (!v || strcmp(nb_variable_name(v), "worker/v") != 0)
        *seen = "wrong name";
    nb_variable_scope_pop();
    return v;
}

static void test_threads(void)
{
    CHECK_OK(nb_variable_scope_push("main", false));
    const char *seen = NULL;
    pthread_t th;
    void *made = NULL;
    CHECK(pthread_create(&th, NULL, other_thread, &seen) == 0);
    CHECK(pthread_join(th, &made) == 0);
    CHECK(seen && strcmp(seen, "top") == 0);
    CHECK(made && nb_variable_find("worker/v") == made);
    CHECK(strcmp(nb_variable_scope_name(), "main") == 0);
    CHECK_OK(nb_variable_scope_pop());
    nb_variable_free(made);
}

int main(void)
{
    RUN(test_registry);
    RUN(test_scope_names);
    RUN(test_reuse);
    RUN(test_initializers);
    RUN(test_threads);
    CHECK(nb_variables_list(NULL, 0) == 0);
    return check_finish();
}
