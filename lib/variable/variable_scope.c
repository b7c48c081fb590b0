/* The variable registry and variable scopes.
 *
 * The registry is one process-wide array of live variables in creation order,
 * guarded by a mutex: nb_variable_new (and the mirrored constructor) append,
 * nb_variable_free removes. It holds no references; what it hands out stays
 * valid until the variable is freed.
 *
 * Variable scopes are a per-thread stack of names joined with '/', each level
 * remembering its reuse flag (or-ed with the level around it), as TensorFlow 1's
 * tf.variable_scope. nb_get_variable makes or finds "<scope>/<name>" through
 * the registry. */
#include "variable_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry --------------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nb_variable **g_vars;
static int g_count, g_cap;

nb_status nb__variable_register(nb_variable *v, const char *who)
{
    pthread_mutex_lock(&g_lock);
    if (g_count == g_cap) {
        int cap = g_cap ? 2 * g_cap : 64;
        nb_variable **grown = cap > g_cap ? realloc(g_vars, sizeof *grown * (size_t)cap) : NULL;
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory registering '%s'", who,
                            nb_variable_name(v));
        }
        g_vars = grown;
        g_cap = cap;
    }
    g_vars[g_count++] = v;
    pthread_mutex_unlock(&g_lock);
    return NB_OK;
}

void nb__variable_unregister(nb_variable *v)
{
    pthread_mutex_lock(&g_lock);
    for (int i = g_count - 1; i >= 0; i--) {
        if (g_vars[i] == v) {
            memmove(g_vars + i, g_vars + i + 1, sizeof *g_vars * (size_t)(g_count - i - 1));
            g_count--;
            break;
        }
    }
    if (g_count == 0) { /* nothing left: give the array back (no leak at exit) */
        free(g_vars);
        g_vars = NULL;
        g_cap = 0;
    }
    pthread_mutex_unlock(&g_lock);
}

int nb_variables_list(nb_variable **out, int cap)
{
    pthread_mutex_lock(&g_lock);
    int n = g_count;
    for (int i = 0; out && i < n && i < cap; i++)
        out[i] = g_vars[i];
    pthread_mutex_unlock(&g_lock);
    return n;
}

int nb_trainable_variables(nb_variable **out, int cap)
{
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (int i = 0; i < g_count; i++) {
        if (!nb_variable_trainable(g_vars[i]))
            continue;
        if (out && n < cap)
            out[n] = g_vars[i];
        n++;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

nb_variable *nb_variable_find(const char *name)
{
    if (!name)
        return NULL;
    nb_variable *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count && !found; i++)
        if (strcmp(nb_variable_name(g_vars[i]), name) == 0)
            found = g_vars[i];
    pthread_mutex_unlock(&g_lock);
    return found;
}

int nb_variables_free_all(void)
{
    /* A snapshot, freed outside the lock (nb_variable_free takes it again).
     * Mirrored variables belong to their strategy and are left to it. */
    pthread_mutex_lock(&g_lock);
    int n = g_count;
    nb_variable **snap = n ? malloc(sizeof *snap * (size_t)n) : NULL;
    int k = 0;
    for (int i = 0; snap && i < n; i++)
        if (!nb__variable_mirror_owner(g_vars[i]))
            snap[k++] = g_vars[i];
    pthread_mutex_unlock(&g_lock);
    if (n && !snap) {
        nb__fail(NB_ERR_OUT_OF_MEMORY, "nb_variables_free_all: out of host memory");
        return 0;
    }
    for (int i = 0; i < k; i++)
        nb_variable_free(snap[i]);
    free(snap);
    return k;
}

/* ---- scopes --------------------------------------------------------------------- */

#define SCOPE_DEPTH 64
#define SCOPE_NAME_MAX 255
#define SCOPE_PATH_MAX 1023

typedef struct scope_stack {
    int depth;
    size_t len[SCOPE_DEPTH + 1]; /* the path's length at each depth; len[0] = 0 */
    bool reuse[SCOPE_DEPTH + 1];
    char path[SCOPE_PATH_MAX + 1];
} scope_stack;

static _Thread_local scope_stack t_scopes;

nb_status nb_variable_scope_push(const char *name, bool reuse)
{
    const char *who = "nb_variable_scope_push";
    scope_stack *s = &t_scopes;
    if (!name || !*name)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: scope name is %s", who, name ? "empty" : "NULL");
    size_t n = strlen(name), at = s->len[s->depth];
    if (n > SCOPE_NAME_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: scope name of %zu bytes; at most %d", who, n,
                        SCOPE_NAME_MAX);
    if (s->depth == SCOPE_DEPTH)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: scope '%s' would be level %d; at most %d", who, name,
                        SCOPE_DEPTH + 1, SCOPE_DEPTH);
    size_t total = at + (at ? 1 : 0) + n;
    if (total > SCOPE_PATH_MAX)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: scope path '%s/%s' is longer than %d bytes", who, s->path,
                        name, SCOPE_PATH_MAX);
    if (at)
        s->path[at++] = '/';
    memcpy(s->path + at, name, n + 1);
    s->depth++;
    s->len[s->depth] = total;
    s->reuse[s->depth] = reuse || s->reuse[s->depth - 1];
    return NB_OK;
}

nb_status nb_variable_scope_pop(void)
{
    scope_stack *s = &t_scopes;
    if (s->depth == 0)
        return nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_variable_scope_pop: no variable scope is open");
    s->depth--;
    s->path[s->len[s->depth]] = '\0';
    return NB_OK;
}

const char *nb_variable_scope_name(void) { return t_scopes.path; }

/* ---- nb_get_variable ------------------------------------------------------------ */

/* fan_in and fan_out of a variable's shape, as Keras counts them. */
static void fans(nb_shape shape, double *fan_in, double *fan_out)
{
    *fan_in = *fan_out = 1;
    if (shape.ndim == 1) {
        *fan_in = *fan_out = (double)shape.dims[0];
    } else if (shape.ndim >= 2) {
        double field = 1;
        for (int i = 0; i < shape.ndim - 2; i++)
            field *= (double)shape.dims[i];
        *fan_in = (double)shape.dims[shape.ndim - 2] * field;
        *fan_out = (double)shape.dims[shape.ndim - 1] * field;
    }
}

/* The standard deviation of a normal cut at +-2 sigma is 0.87962566 sigma. */
#define TRUNCATION_SCALE 0.87962566103423978

/* The initial value (owned by the current scope), or NULL with the error. */
static nb_tensor *initial_value(const char *who, const char *full, nb_shape shape, nb_dtype dtype,
                                nb_initializer init)
{
    switch (init.kind) {
    case NB_INIT_ZEROS:
        return nb_zeros(dtype, shape);
    case NB_INIT_CONSTANT:
        return nb_full(dtype, shape, init.value);
    case NB_INIT_NORMAL:
        return nb_random_normal(dtype, shape, init.value, init.stddev, init.seed);
    case NB_INIT_TRUNCATED_NORMAL:
        return nb_truncated_normal(dtype, shape, init.value, init.stddev, init.seed);
    case NB_INIT_UNIFORM:
        return nb_random_uniform(dtype, shape, -init.value, init.value, init.seed);
    case NB_INIT_GLOROT_UNIFORM:
    case NB_INIT_GLOROT_NORMAL:
    case NB_INIT_HE_NORMAL:
    case NB_INIT_HE_UNIFORM: {
        double fan_in, fan_out;
        fans(shape, &fan_in, &fan_out);
        bool he = init.kind == NB_INIT_HE_NORMAL || init.kind == NB_INIT_HE_UNIFORM;
        double denom = he ? fan_in : fan_in + fan_out; /* the variance is 2 / denom */
        double var = denom > 0 ? 2.0 / denom : 0.0;
        if (init.kind == NB_INIT_GLOROT_UNIFORM || init.kind == NB_INIT_HE_UNIFORM) {
            double limit = sqrt(3.0 * var); /* uniform in +-limit has variance limit^2 / 3 */
            return nb_random_uniform(dtype, shape, -limit, limit, init.seed);
        }
        return nb_truncated_normal(dtype, shape, 0.0, sqrt(var) / TRUNCATION_SCALE, init.seed);
    }
    }
    return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: variable '%s': unknown initializer kind %d", who, full,
                         (int)init.kind);
}

nb_variable *nb_get_variable(const char *name, nb_shape shape, nb_dtype dtype, nb_initializer init)
{
    const char *who = "nb_get_variable";
    scope_stack *s = &t_scopes;
    if (!name || !*name)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: variable name is %s", who, name ? "empty" : "NULL");
    size_t at = s->len[s->depth], n = strlen(name);
    char *full = malloc(at + 1 + n + 1);
    if (!full)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    if (at) {
        memcpy(full, s->path, at);
        full[at++] = '/';
    }
    memcpy(full + at, name, n + 1);

    nb_variable *v = nb_variable_find(full);
    bool reuse = s->reuse[s->depth];
    if (reuse) {
        if (!v) {
            nb__fail(NB_ERR_INVALID_ARGUMENT,
                     "%s: variable '%s' does not exist; scope '%s' reuses variables, so it is not made", who, full,
                     s->path);
        } else {
            nb_shape have = nb_variable_shape(v);
            bool same = have.ndim == shape.ndim;
            for (int i = 0; same && i < shape.ndim; i++)
                same = have.dims[i] == shape.dims[i];
            if (!same || nb_variable_dtype(v) != dtype) {
                char sh[NB_SHAPE_STR_MAX], sw[NB_SHAPE_STR_MAX];
                nb_shape_format(have, sh, sizeof sh);
                nb_shape_format(shape, sw, sizeof sw);
                nb__fail(!same ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                         "%s: variable '%s' is %s %s; asked for %s %s", who, full,
                         nb_dtype_name(nb_variable_dtype(v)), sh, nb_dtype_name(dtype), sw);
                v = NULL;
            }
        }
        free(full);
        return v;
    }
    if (v) {
        nb__fail(NB_ERR_INVALID_ARGUMENT,
                 "%s: variable '%s' already exists; push its scope with reuse to share it", who, full);
        free(full);
        return NULL;
    }
    nb_scope *scope = nb_scope_begin();
    v = NULL;
    if (scope) {
        nb_tensor *t = initial_value(who, full, shape, dtype, init);
        if (t)
            v = nb_variable_new(full, t);
        nb_scope_end(scope);
    }
    free(full);
    return v;
}
