/* The nabla side of the differential test (test/differential.py): reads small
 * straight-line programs of nabla ops from stdin, runs each under gradient tapes
 * and prints its value, the first-order gradient of sum(output * W) and the
 * second-order gradient of sum_k sum(grad_k * V_k) for every watched input.
 *
 * Input, whitespace-separated tokens, any number of programs:
 *   P id order persistent seeded   order 1 or 2; persistent: a persistent inner
 *                                  tape; seeded: W seeds the gradient (else the
 *                                  target is sum_all(output * W))
 *   I dtype watch ndim dims... values...   an input (the next variable)
 *   O name args...                 an op (the next variable); variables are
 *                                  numbered from 0 in order of definition
 *   W n values...                  weights of the output (the last variable)
 *   V k n values...                weights of watched input k's gradient
 *   E                              runs the gradients and prints
 * Output, one record a line:
 *   R id | V dtype ndim dims... n values... | G k n values... | H k n values... |
 *   X message (an error nabla reported) | L count (tensors leaked) | E
 * Values print with "%.17g" (nan, inf, -inf).
 *
 * NB_DIFF_DEVICE=/gpu:0 runs every program on that device (strict placement);
 * with no GPU there it exits 77 (skipped), or 1 under NB_REQUIRE_GPU=1. */
#include <nabla/nabla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VARS 128
#define MAX_ELEMS 65536

typedef struct prog {
    nb_tensor *var[MAX_VARS];
    int nvar;
    nb_tensor *src[MAX_VARS]; /* watched inputs, in order */
    int nsrc;
    nb_tape *outer, *inner;
    double *w;                /* output weights */
    int64_t nw;
    double *v[MAX_VARS];      /* second-order weights per source */
    int64_t nv[MAX_VARS];
    char bad[256];            /* a malformed program (the driver's fault) */
} prog;

/* ---- reading ---------------------------------------------------------------- */

static bool token(char *buf, size_t size)
{
    char fmt[16];
    snprintf(fmt, sizeof fmt, "%%%zus", size - 1);
    return scanf(fmt, buf) == 1;
}

static double read_double(void)
{
    char buf[64];
    if (!token(buf, sizeof buf))
        return NAN;
    return strtod(buf, NULL); /* takes nan, inf, -inf */
}

static long long read_int(void)
{
    char buf[64];
    if (!token(buf, sizeof buf))
        return 0;
    return strtoll(buf, NULL, 10);
}

static nb_dtype read_dtype(void)
{
    char buf[16];
    if (!token(buf, sizeof buf))
        return NB_DTYPE_COUNT;
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        if (strcmp(buf, nb_dtype_name((nb_dtype)d)) == 0)
            return (nb_dtype)d;
    return NB_DTYPE_COUNT;
}

static nb_shape read_shape(void)
{
    nb_shape s = {0, {0}};
    long long n = read_int();
    for (long long i = 0; i < n; i++) {
        long long d = read_int();
        if (i < NB_MAX_DIMS)
            s.dims[s.ndim++] = d;
    }
    return s;
}

/* Axes are written as a shape is: a count, then the values. */
static nb_axes read_axes(void)
{
    nb_shape s = read_shape();
    nb_axes a = {s.ndim, {0}};
    for (int i = 0; i < s.ndim; i++)
        a.axes[i] = (int)s.dims[i];
    return a;
}

/* A variable by number; NULL (and the program marked bad) when out of range. */
static nb_tensor *read_var(prog *p)
{
    long long i = read_int();
    if (i < 0 || i >= p->nvar) {
        snprintf(p->bad, sizeof p->bad, "variable %lld is not defined", i);
        return NULL;
    }
    return p->var[i];
}

static double *read_values(int64_t n)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; v && i < n; i++)
        v[i] = read_double();
    return v;
}

/* A host buffer of dtype from doubles (caller frees). */
static void *to_dtype(nb_dtype dt, const double *v, int64_t n)
{
    void *buf = malloc(nb_dtype_size(dt) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; buf && i < n; i++) {
        switch (dt) {
        case NB_F32: ((float *)buf)[i] = (float)v[i]; break;
        case NB_F64: ((double *)buf)[i] = v[i]; break;
        case NB_I32: ((int32_t *)buf)[i] = (int32_t)v[i]; break;
        case NB_I64: ((int64_t *)buf)[i] = (int64_t)v[i]; break;
        default: ((uint8_t *)buf)[i] = v[i] != 0; break;
        }
    }
    return buf;
}

static nb_tensor *from_doubles(nb_dtype dt, nb_shape s, const double *v)
{
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        n *= s.dims[i];
    void *buf = to_dtype(dt, v, n);
    nb_tensor *t = buf ? nb_from_buffer(dt, s, buf) : NULL;
    free(buf);
    return t;
}

/* ---- ops -------------------------------------------------------------------- */

typedef nb_tensor *(*unary_fn)(const nb_tensor *);
typedef nb_tensor *(*binary_fn)(const nb_tensor *, const nb_tensor *);
typedef nb_tensor *(*scalar_fn)(const nb_tensor *, double);
typedef nb_tensor *(*reduce_fn)(const nb_tensor *, nb_axes, bool);

/* The elementwise ops come from the list (lib/core/ops.def), by the form of
 * their public function; the others follow by hand. */
#define ONE_INPUT_X(name) {#name, nb_##name},
#define ONE_INPUT_XA(name)
#define ONE_INPUT_INTERNAL(name)
#define WITH_SCALAR_X(name)
#define WITH_SCALAR_XA(name) {#name, nb_##name},
#define WITH_SCALAR_INTERNAL(name)
#define TWO_INPUTS_AB(name) {#name, nb_##name},
#define TWO_INPUTS_OWN(name) {#name, nb_##name},
#define TWO_INPUTS_INTERNAL(name)

static const struct { const char *name; unary_fn fn; } unaries[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) ONE_INPUT_##api(name)
#include "lib/core/ops.def"
    {"sum_all", nb_sum_all}, {"mean_all", nb_mean_all}, {"contiguous", nb_contiguous},
    {"stop_gradient", nb_stop_gradient},
};

static const struct { const char *name; binary_fn fn; } binaries[] = {
#define NB_BINARY(ID, name, dtypes, cost, kind, api) TWO_INPUTS_##api(name)
#include "lib/core/ops.def"
    {"matmul", nb_matmul}, {"softmax_cross_entropy", nb_softmax_cross_entropy},
    {"sparse_softmax_cross_entropy", nb_sparse_softmax_cross_entropy},
    {"sigmoid_cross_entropy", nb_sigmoid_cross_entropy},
    {"mean_squared_error", nb_mean_squared_error}, {"gather", nb_gather},
};

static const struct { const char *name; scalar_fn fn; } scalars[] = {
#define NB_UNARY(ID, name, dtypes, cost, api) WITH_SCALAR_##api(name)
#include "lib/core/ops.def"
};

static const struct { const char *name; reduce_fn fn; } reductions[] = {
    {"sum", nb_sum}, {"mean", nb_mean}, {"max", nb_max}, {"min", nb_min},
    {"prod", nb_prod}, {"logsumexp", nb_logsumexp},
};

#define FIND(table, name, i)                                                                 \
    for (i = 0; i < (int)(sizeof table / sizeof *table); i++)                                \
        if (strcmp(table[i].name, name) == 0)                                                \
            break;                                                                           \
    if (i < (int)(sizeof table / sizeof *table))

/* Reads a list "n v1 .. vn" of variables into xs; returns n (at most MAX_VARS). */
static int read_var_list(prog *p, nb_tensor **xs)
{
    long long n = read_int();
    int k = 0;
    for (long long i = 0; i < n; i++) {
        nb_tensor *t = read_var(p);
        if (k < MAX_VARS)
            xs[k++] = t;
    }
    return k;
}

/* Runs one op line (after "O"); returns its result (NULL with nabla's error). */
static nb_tensor *run_op(prog *p, const char *name)
{
    int i;
    FIND(unaries, name, i) { nb_tensor *x = read_var(p); return nb_error() ? NULL : unaries[i].fn(x); }
    FIND(binaries, name, i) {
        nb_tensor *a = read_var(p), *b = read_var(p);
        return nb_error() ? NULL : binaries[i].fn(a, b);
    }
    FIND(scalars, name, i) {
        nb_tensor *x = read_var(p);
        double c = read_double();
        return nb_error() ? NULL : scalars[i].fn(x, c);
    }
    FIND(reductions, name, i) {
        nb_tensor *x = read_var(p);
        bool keep = read_int() != 0;
        nb_axes axes = read_axes();
        return nb_error() ? NULL : reductions[i].fn(x, axes, keep);
    }
    if (strcmp(name, "where") == 0) {
        nb_tensor *c = read_var(p), *a = read_var(p), *b = read_var(p);
        return nb_error() ? NULL : nb_where(c, a, b);
    }
    if (strcmp(name, "argmax") == 0 || strcmp(name, "argmin") == 0) {
        nb_tensor *x = read_var(p);
        int axis = (int)read_int();
        bool keep = read_int() != 0;
        if (nb_error())
            return NULL;
        return strcmp(name, "argmax") == 0 ? nb_argmax(x, axis, keep) : nb_argmin(x, axis, keep);
    }
    if (strcmp(name, "cumsum") == 0) {
        nb_tensor *x = read_var(p);
        int axis = (int)read_int();
        bool exclusive = read_int() != 0, reverse = read_int() != 0;
        return nb_error() ? NULL : nb_cumsum(x, axis, exclusive, reverse);
    }
    if (strcmp(name, "softmax") == 0 || strcmp(name, "log_softmax") == 0) {
        nb_tensor *x = read_var(p);
        int axis = (int)read_int();
        return nb_error() ? NULL : name[0] == 's' ? nb_softmax(x, axis) : nb_log_softmax(x, axis);
    }
    if (strcmp(name, "reshape") == 0 || strcmp(name, "broadcast_to") == 0) {
        nb_tensor *x = read_var(p);
        nb_shape s = read_shape();
        return nb_error() ? NULL : name[0] == 'r' ? nb_reshape(x, s) : nb_broadcast_to(x, s);
    }
    if (strcmp(name, "transpose") == 0) {
        nb_tensor *x = read_var(p);
        int d0 = (int)read_int(), d1 = (int)read_int();
        return nb_error() ? NULL : nb_transpose(x, d0, d1);
    }
    if (strcmp(name, "permute") == 0) {
        nb_tensor *x = read_var(p);
        nb_axes perm = read_axes();
        return nb_error() ? NULL : nb_permute(x, perm);
    }
    if (strcmp(name, "expand_dims") == 0 || strcmp(name, "squeeze") == 0) {
        nb_tensor *x = read_var(p);
        int axis = (int)read_int();
        return nb_error() ? NULL : name[0] == 'e' ? nb_expand_dims(x, axis) : nb_squeeze(x, axis);
    }
    if (strcmp(name, "slice") == 0) {
        nb_tensor *x = read_var(p);
        nb_shape begin = read_shape(), size = read_shape();
        return nb_error() ? NULL : nb_slice(x, begin, size);
    }
    if (strcmp(name, "pad") == 0) {
        nb_tensor *x = read_var(p);
        nb_shape before = read_shape(), after = read_shape();
        double value = read_double();
        return nb_error() ? NULL : nb_pad(x, before, after, value);
    }
    if (strcmp(name, "concat") == 0 || strcmp(name, "stack") == 0) {
        int axis = (int)read_int();
        nb_tensor *xs[MAX_VARS];
        int n = read_var_list(p, xs);
        if (nb_error())
            return NULL;
        return name[0] == 'c' ? nb_concat(n, xs, axis) : nb_stack(n, xs, axis);
    }
    if (strcmp(name, "split") == 0) {
        /* split x axis pick n sized sizes...: piece pick of n, equal when !sized */
        nb_tensor *x = read_var(p);
        int axis = (int)read_int(), pick = (int)read_int();
        long long n = read_int();
        bool sized = read_int() != 0;
        int64_t sizes[MAX_VARS] = {0};
        for (long long k = 0; sized && k < n; k++) {
            long long s = read_int();
            if (k < MAX_VARS)
                sizes[k] = s;
        }
        if (n < 1 || n > MAX_VARS || pick < 0 || pick >= n) {
            snprintf(p->bad, sizeof p->bad, "split: bad piece count %lld or pick %d", n, pick);
            return NULL;
        }
        nb_tensor *out[MAX_VARS] = {0};
        if (nb_error() || nb_split(x, (int)n, sized ? sizes : NULL, axis, out))
            return NULL;
        return out[pick]; /* the other pieces belong to the scope too */
    }
    if (strcmp(name, "one_hot") == 0) {
        nb_tensor *x = read_var(p);
        long long depth = read_int();
        nb_dtype dt = read_dtype();
        return nb_error() ? NULL : nb_one_hot(x, depth, dt);
    }
    if (strcmp(name, "cast") == 0) {
        nb_tensor *x = read_var(p);
        nb_dtype dt = read_dtype();
        return nb_error() ? NULL : nb_cast(x, dt);
    }
    snprintf(p->bad, sizeof p->bad, "unknown op %s", name);
    return NULL;
}

/* ---- printing --------------------------------------------------------------- */

static void print_value(double v)
{
    if (isnan(v))
        fputs(" nan", stdout);
    else if (isinf(v))
        fputs(v > 0 ? " inf" : " -inf", stdout);
    else
        printf(" %.17g", v);
}

static void print_values(const nb_tensor *t)
{
    int64_t n = nb_tensor_numel(t);
    printf(" %lld", (long long)n);
    for (int64_t i = 0; i < n; i++)
        print_value(nb_tensor_get(t, i));
    putchar('\n');
}

/* ---- one program ------------------------------------------------------------ */

/* Prints nabla's pending error on one line and clears it. */
static void report_error(void)
{
    printf("X %s: ", nb_status_name(nb_error()));
    for (const char *m = nb_error_message(); *m; m++)
        putchar(*m == '\n' ? ' ' : *m);
    putchar('\n');
    nb_error_clear();
}

/* The output's gradients (and the second order's) once the program has run. */
static void gradients(prog *p, bool seeded)
{
    nb_tensor *out = p->var[p->nvar - 1];
    nb_tensor *g[MAX_VARS] = {0}, *h[MAX_VARS] = {0};
    nb_dtype dt = nb_tensor_dtype(out);
    if (dt != NB_F32 && dt != NB_F64)
        return; /* no gradient to compare */
    if (p->nw != nb_tensor_numel(out)) {
        snprintf(p->bad, sizeof p->bad, "%lld weights for %lld outputs", (long long)p->nw,
                 (long long)nb_tensor_numel(out));
        return;
    }
    nb_tensor *w = from_doubles(dt, nb_tensor_shape(out), p->w);
    if (seeded) {
        if (nb_tape_gradient_ex(p->inner, out, w, p->nsrc, p->src, g, NB_UNCONNECTED_ZERO))
            return;
    } else {
        nb_tensor *target = nb_sum_all(nb_mul(out, w));
        if (nb_tape_gradient_ex(p->inner, target, NULL, p->nsrc, p->src, g, NB_UNCONNECTED_ZERO))
            return;
    }
    if (!p->outer) {
        for (int k = 0; k < p->nsrc; k++)
            printf("G %d", k), print_values(g[k]);
        return;
    }
    /* s = sum_k sum(g_k * V_k), in f64 whatever the sources' dtypes. */
    nb_tensor *s = nb_scalar(NB_F64, 0.0);
    for (int k = 0; k < p->nsrc; k++) {
        if (p->nv[k] != nb_tensor_numel(p->src[k])) {
            snprintf(p->bad, sizeof p->bad, "%lld second-order weights for input %d of %lld",
                     (long long)p->nv[k], k, (long long)nb_tensor_numel(p->src[k]));
            return;
        }
        nb_tensor *vk = from_doubles(nb_tensor_dtype(g[k]), nb_tensor_shape(g[k]), p->v[k]);
        nb_tensor *term = nb_sum_all(nb_mul(g[k], vk));
        if (nb_tensor_dtype(term) != NB_F64)
            term = nb_cast(term, NB_F64);
        s = nb_add(s, term);
    }
    if (nb_tape_gradient_ex(p->outer, s, NULL, p->nsrc, p->src, h, NB_UNCONNECTED_ZERO))
        return;
    for (int k = 0; k < p->nsrc; k++)
        printf("G %d", k), print_values(g[k]);
    for (int k = 0; k < p->nsrc; k++)
        printf("H %d", k), print_values(h[k]);
}

/* Reads and runs one program after its "P"; false at end of input. */
static bool run_program(void)
{
    long long id = read_int();
    int order = (int)read_int();
    bool persistent = read_int() != 0, seeded = read_int() != 0;
    prog *p = calloc(1, sizeof *p);
    if (!p)
        return false;
    int64_t live = nb_live_tensors();
    nb_scope *scope = nb_scope_begin();
    p->outer = order >= 2 ? nb_tape_begin() : NULL;
    p->inner = persistent ? nb_tape_begin_persistent() : nb_tape_begin();
    char word[64];
    bool ended = false, more = true;
    while (!ended && !p->bad[0]) {
        if (!token(word, sizeof word)) {
            more = false;
            snprintf(p->bad, sizeof p->bad, "input ended inside program %lld", id);
            break;
        }
        if (strcmp(word, "I") == 0) {
            nb_dtype dt = read_dtype();
            bool watch = read_int() != 0;
            nb_shape s = read_shape();
            int64_t n = 1;
            for (int i = 0; i < s.ndim; i++)
                n *= s.dims[i];
            if (dt == NB_DTYPE_COUNT || n < 0 || n > MAX_ELEMS || p->nvar == MAX_VARS) {
                snprintf(p->bad, sizeof p->bad, "bad input");
                break;
            }
            double *v = read_values(n);
            nb_tensor *t = v ? from_doubles(dt, s, v) : NULL;
            free(v);
            if (t && watch) {
                if (p->outer)
                    nb_tape_watch(p->outer, t);
                nb_tape_watch(p->inner, t);
                p->src[p->nsrc++] = t;
            }
            p->var[p->nvar++] = t;
        } else if (strcmp(word, "O") == 0) {
            char name[64];
            if (!token(name, sizeof name) || p->nvar == MAX_VARS) {
                snprintf(p->bad, sizeof p->bad, "bad op line");
                break;
            }
            nb_tensor *t = run_op(p, name);
            p->var[p->nvar++] = t;
        } else if (strcmp(word, "W") == 0) {
            p->nw = read_int();
            if (p->nw < 0 || p->nw > MAX_ELEMS || p->w) {
                snprintf(p->bad, sizeof p->bad, "bad weights");
                break;
            }
            p->w = read_values(p->nw);
        } else if (strcmp(word, "V") == 0) {
            long long k = read_int();
            int64_t n = read_int();
            if (k < 0 || k >= p->nsrc || n < 0 || n > MAX_ELEMS || p->v[k]) {
                snprintf(p->bad, sizeof p->bad, "bad second-order weights");
                break;
            }
            p->nv[k] = n;
            p->v[k] = read_values(n);
        } else if (strcmp(word, "E") == 0) {
            ended = true;
        } else {
            snprintf(p->bad, sizeof p->bad, "unexpected token %s", word);
        }
    }
    /* After a malformed line, skip to the program's end so the next one parses. */
    while (!ended && more) {
        if (!token(word, sizeof word))
            more = false;
        else
            ended = strcmp(word, "E") == 0;
    }
    printf("R %lld\n", id);
    if (!p->bad[0] && p->nvar > 0 && !nb_error()) {
        nb_tensor *out = p->var[p->nvar - 1];
        nb_shape s = nb_tensor_shape(out);
        printf("V %s %d", nb_dtype_name(nb_tensor_dtype(out)), s.ndim);
        for (int i = 0; i < s.ndim; i++)
            printf(" %lld", (long long)s.dims[i]);
        print_values(out);
        gradients(p, seeded);
    }
    if (p->bad[0])
        printf("X malformed program: %s\n", p->bad);
    if (nb_error())
        report_error();
    nb_scope_end(scope);
    if (nb_error())
        report_error();
    if (nb_live_tensors() != live)
        printf("L %lld\n", (long long)(nb_live_tensors() - live));
    printf("E\n");
    fflush(stdout);
    free(p->w);
    for (int k = 0; k < MAX_VARS; k++)
        free(p->v[k]);
    free(p);
    return more && ended;
}

/* Pushes NB_DIFF_DEVICE when it is set: 0 when the programs can run, else the
 * exit status. */
static int place(void)
{
    const char *dev = getenv("NB_DIFF_DEVICE");
    if (!dev || !dev[0])
        return 0;
    if (strncmp(dev, "/gpu", 4) == 0 && nb_physical_gpu_count() == 0) {
        const char *want = getenv("NB_REQUIRE_GPU");
        bool required = want && want[0] && strcmp(want, "0") != 0;
        const char *why = nb_gpu_unavailable_reason();
        fprintf(stderr, "differential_runner: no GPU for %s (%s): %s\n", dev, why ? why : "none found",
                required ? "FAILED, NB_REQUIRE_GPU=1 asks for one" : "skipped");
        return required ? 1 : 77;
    }
    nb_set_soft_placement(false);
    if (nb_device_push(dev) != NB_OK) {
        fprintf(stderr, "differential_runner: %s\n", nb_error_message());
        return 2;
    }
    return 0;
}

int main(void)
{
    int st = place();
    if (st)
        return st;
    char word[64];
    while (token(word, sizeof word)) {
        if (strcmp(word, "P") != 0) {
            fprintf(stderr, "differential_runner: expected P, got %s\n", word);
            return 2;
        }
        if (!run_program())
            break;
    }
    return 0;
}
