/* Elementwise ops of one and two inputs, with their gradients. */
#include "op.h"
#include "lib/core/op_phases.h"

#include <math.h>

/* ---- two inputs ------------------------------------------------------------ */

static const nb_op_def binary_defs[NB_BIN_COUNT];

static nb_tensor *binary_body(nb_binary_op kop, const nb_tensor *a, const nb_tensor *b)
{
    const nb_op_def *def = &binary_defs[kop];
    const char *op = def->name;
    if (!a)
        return nb__null_input(op, 0);
    if (!b)
        return nb__null_input(op, 1);
    if (nb__check_same_dtype(op, a, b) || nb__check_dtype(op, "input", a, nb__binary_dtypes(kop)))
        return NULL;
    const nb_tensor *in[2] = {a, b};
    nb_device *dev = nb__op_place_kernel(op, 2, in, NB_K_BINARY, kop, a->dtype);
    int nd;
    int64_t shape[NB_MAX_DIMS];
    if (!dev || !nb__broadcast(op, in[0], in[1], &nd, shape))
        return NULL;
    bool cmp = nb__binary_is_comparison(kop);
    nb_tensor *out = nb__out(op, dev, cmp ? NB_BOOL : a->dtype, nd, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), va = nb__view_broadcast(in[0], nd, shape), vb = nb__view_broadcast(in[1], nd, shape);
    int phase = nb__phase_enter(NB_PHASE_KERNEL);
    nb_status st = dev->backend->binary(dev, kop, &vo, &va, &vb);
    nb__phase_leave(phase);
    out = nb__kernel_done(st, out);
    return cmp ? nb__own(out) : nb__finish(def, 2, in, out, NULL);
}

/* The op timed by phases (nabla/profile.h): every return of the body ends it. */
static nb_tensor *binary(nb_binary_op kop, const nb_tensor *a, const nb_tensor *b)
{
    int phase = nb__phase_op_begin();
    nb_tensor *out = binary_body(kop, a, b);
    nb__phase_leave(phase);
    return out;
}

nb_tensor *nb__binary(nb_binary_op kop, const nb_tensor *a, const nb_tensor *b) { return binary(kop, a, b); }

static nb_status add_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__sum_to(g[0], SHAPE_OF(n->in[0]));
    gi[1] = nb__sum_to(g[0], SHAPE_OF(n->in[1]));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status sub_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__sum_to(g[0], SHAPE_OF(n->in[0]));
    gi[1] = nb__sum_to(nb_neg(g[0]), SHAPE_OF(n->in[1]));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status mul_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[0] = nb__sum_to(nb_mul(g[0], n->in[1]), SHAPE_OF(n->in[0]));
    gi[1] = nb__sum_to(nb_mul(g[0], n->in[0]), SHAPE_OF(n->in[1]));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status div_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *ga = nb_div(g[0], n->in[1]);
    gi[0] = nb__sum_to(ga, SHAPE_OF(n->in[0]));
    /* d(a/b)/db = -(a/b)/b */
    gi[1] = nb__sum_to(nb_neg(nb_mul(ga, nb_div(n->in[0], n->in[1]))), SHAPE_OF(n->in[1]));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status pow_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *a = n->in[0], *b = n->in[1];
    /* a^b * b / a would divide by zero at a = 0; b * a^(b-1) does not, except
     * where b = 0 (0 * 0^-1): a^0 is constant, so its slope is 0 there. */
    nb_tensor *one = nb__scalar_on(n->op->name, a->device, a->dtype, 1.0);
    nb_tensor *zero = nb__scalar_on(n->op->name, a->device, a->dtype, 0.0);
    nb_tensor *b_zero = nb_equal(b, zero);
    nb_tensor *da = nb_where(b_zero, zero, nb_mul(b, nb_pow(a, nb_sub(b, one))));
    /* Selected again after the product: a NaN from further on is no slope of a^0
     * either; and da, 0 there, keeps a second order off the unselected 0 * inf. */
    gi[0] = nb__sum_to(nb_where(b_zero, zero, nb_mul(g[0], da)), SHAPE_OF(a));
    /* d/db = a^b log a, taken as 0 where a <= 0 (where it is undefined). */
    nb_tensor *pos = nb_greater(a, zero);
    nb_tensor *loga = nb_where(pos, nb_log(nb_where(pos, a, one)), zero);
    gi[1] = nb__sum_to(nb_mul(g[0], nb_mul(nb_pow(a, b), loga)), SHAPE_OF(b));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status select_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi, bool is_max)
{
    nb_tensor *a = n->in[0], *b = n->in[1];
    /* The winner takes the gradient; a tie splits it in half (as PyTorch does:
     * the two slopes are equally good); where either is NaN it goes to b.
     * Selected, not multiplied, so an infinite gradient meets no zero. */
    nb_tensor *wins = is_max ? nb_greater(a, b) : nb_less(a, b);
    nb_tensor *tie = nb_equal(a, b);
    nb_tensor *zero = nb__scalar_on(n->op->name, a->device, a->dtype, 0.0);
    nb_tensor *half = nb_mul_scalar(g[0], 0.5);
    gi[0] = nb__sum_to(nb_where(wins, g[0], nb_where(tie, half, zero)), SHAPE_OF(a));
    gi[1] = nb__sum_to(nb_where(wins, zero, nb_where(tie, half, g[0])), SHAPE_OF(b));
    return nb__ok2(gi[0], gi[1]);
}

static nb_status maximum_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi) { return select_grad(n, g, gi, true); }
static nb_status minimum_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi) { return select_grad(n, g, gi, false); }

/* relu_grad(a, b) = a step(b): a gets g step(b); b, the step's argument, a
 * constant of the backward pass (see step_grad), gets nothing. */
static nb_status relu_grad_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    gi[1] = NULL;
    gi[0] = nb__sum_to(binary(NB_BIN_RELU_GRAD, g[0], n->in[1]), SHAPE_OF(n->in[0]));
    return nb__ok(gi[0]);
}

/* Comparisons: NB_BOOL results, never recorded. */
#define GRAD_OF_ARITH(name) name##_grad
#define GRAD_OF_CMP(name) NULL
static const nb_op_def binary_defs[NB_BIN_COUNT] = {
#define NB_BINARY(ID, op, dtypes, cost, kind, api) [NB_BIN_##ID] = {.name = #op, .grad = GRAD_OF_##kind(op)},
#include "lib/core/ops.def"
};

/* The public functions of the list's AB ops. */
#define WRAP_AB(ID, name) \
    nb_tensor *nb_##name(const nb_tensor *a, const nb_tensor *b) { return binary(NB_BIN_##ID, a, b); }
#define WRAP_OWN(ID, name)
#define WRAP_INTERNAL(ID, name)
#define NB_BINARY(ID, name, dtypes, cost, kind, api) WRAP_##api(ID, name)
#include "lib/core/ops.def"

/* Number of zeros in an integer tensor (-1 with the error recorded on failure).
 * Reads one value back: a host wait on a GPU, paid only by integer division. */
static int64_t count_zeros(const nb_tensor *b)
{
    nb_scope *scope = nb_scope_begin();
    if (!scope)
        return -1;
    nb_tensor *hits = nb_equal(b, nb__scalar_on("div", b->device, b->dtype, 0.0));
    double n = nb_tensor_item(nb_sum_all(nb_cast(hits, NB_I64)));
    nb_scope_end(scope);
    return nb_error() ? -1 : (int64_t)n;
}

nb_tensor *nb_div(const nb_tensor *a, const nb_tensor *b)
{
    /* An integer quotient by zero has no value: refused, as PyTorch and
     * TensorFlow do (the kernels would give 0). */
    if (a && b && a->dtype == b->dtype && (b->dtype == NB_I32 || b->dtype == NB_I64) && b->numel > 0) {
        int64_t zeros = count_zeros(b);
        if (zeros < 0)
            return NULL;
        if (zeros > 0) {
            char sb[NB_SHAPE_STR_MAX];
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "div: integer division by zero (%lld of the %s %s divisor's "
                                 "elements are 0)", (long long)zeros, nb_dtype_name(b->dtype),
                                 nb__shape_str(b->ndim, b->shape, sb, sizeof sb));
        }
    }
    return binary(NB_BIN_DIV, a, b);
}

/* ---- where ------------------------------------------------------------------ */

static nb_status where_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *c = n->in[0], *a = n->in[1], *b = n->in[2];
    nb_tensor *zero = nb__scalar_on(n->op->name, a->device, a->dtype, 0.0);
    gi[0] = gi[1] = gi[2] = NULL; /* no gradient to the condition */
    if (nb__needs_grad(n, 1) && !(gi[1] = nb__sum_to(nb_where(c, g[0], zero), SHAPE_OF(a))))
        return nb__ok(NULL);
    if (nb__needs_grad(n, 2) && !(gi[2] = nb__sum_to(nb_where(c, zero, g[0]), SHAPE_OF(b))))
        return nb__ok(NULL);
    return NB_OK;
}

static const nb_op_def where_def = {.name = "where", .grad = where_grad};

static nb_tensor *where_body(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b)
{
    const char *op = "where";
    if (!cond)
        return nb__null_input(op, 0);
    if (!a)
        return nb__null_input(op, 1);
    if (!b)
        return nb__null_input(op, 2);
    if (nb__check_dtype(op, "condition", cond, NB_MASK(NB_BOOL)) || nb__check_same_dtype(op, a, b))
        return NULL;
    const nb_tensor *in[3] = {cond, a, b};
    nb_device *dev = nb__op_place_kernel(op, 3, in, NB_K_WHERE, 0, a->dtype);
    int nd, nd2;
    int64_t ab[NB_MAX_DIMS], shape[NB_MAX_DIMS];
    if (!dev || !nb__broadcast(op, in[1], in[2], &nd, ab))
        return NULL;
    /* Broadcast the condition against the result of a and b. */
    nb_tensor probe = *in[1];
    probe.ndim = nd;
    for (int i = 0; i < nd; i++)
        probe.shape[i] = ab[i];
    if (!nb__broadcast(op, in[0], &probe, &nd2, shape))
        return NULL;
    nb_tensor *out = nb__out(op, dev, a->dtype, nd2, shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vc = nb__view_broadcast(in[0], nd2, shape),
            va = nb__view_broadcast(in[1], nd2, shape), vb = nb__view_broadcast(in[2], nd2, shape);
    int phase = nb__phase_enter(NB_PHASE_KERNEL);
    nb_status st = dev->backend->where(dev, &vo, &vc, &va, &vb);
    nb__phase_leave(phase);
    out = nb__kernel_done(st, out);
    return nb__finish(&where_def, 3, in, out, NULL);
}

nb_tensor *nb_where(const nb_tensor *cond, const nb_tensor *a, const nb_tensor *b)
{
    int phase = nb__phase_op_begin();
    nb_tensor *out = where_body(cond, a, b);
    nb__phase_leave(phase);
    return out;
}

/* ---- one input -------------------------------------------------------------- */

static const nb_op_def unary_defs[NB_UN_COUNT];

static nb_tensor *unary_body(nb_unary_op kop, const nb_tensor *x, double alpha)
{
    const nb_op_def *def = &unary_defs[kop];
    const char *op = def->name;
    if (!x)
        return nb__null_input(op, 0);
    if (nb__check_dtype(op, "input", x, nb__unary_dtypes(kop)))
        return NULL;
    const nb_tensor *in[1] = {x};
    nb_device *dev = nb__op_place_kernel(op, 1, in, NB_K_UNARY, kop, x->dtype);
    if (!dev)
        return NULL;
    nb_tensor *out = nb__out(op, dev, x->dtype, x->ndim, x->shape);
    if (!out)
        return NULL;
    nb_view vo = nb__view(out), vx = nb__view(in[0]);
    int phase = nb__phase_enter(NB_PHASE_KERNEL);
    nb_status st = dev->backend->unary(dev, kop, &vo, &vx, alpha);
    nb__phase_leave(phase);
    out = nb__kernel_done(st, out);
    nb_op_attrs attrs = {0};
    attrs.d[0] = alpha;
    return nb__finish(def, 1, in, out, &attrs);
}

nb_tensor *nb__unary(nb_unary_op kop, const nb_tensor *x, double alpha)
{
    int phase = nb__phase_op_begin();
    nb_tensor *out = unary_body(kop, x, alpha);
    nb__phase_leave(phase);
    return out;
}

nb_tensor *nb__step(const nb_tensor *x) { return nb__unary(NB_UN_STEP, x, 0.0); }

#define X (n->in[0])
#define Y (n->out[0])
#define G (g[0])
#define ALPHA (n->attrs.d[0])
#define GRAD(name, expr)                                                           \
    static nb_status name##_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi) \
    {                                                                              \
        (void)n, (void)g;                                                          \
        gi[0] = (expr);                                                            \
        return nb__ok(gi[0]);                                                      \
    }

/* The step mask inside relu's gradients is a constant of the backward pass: it
 * passes no gradient at all, where zeros would meet an infinite slope further
 * back as 0 * inf = NaN in a second-order gradient. */
static nb_status step_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    (void)n, (void)g;
    gi[0] = NULL;
    return NB_OK;
}

GRAD(neg, nb_neg(G))
GRAD(abs, nb_mul(G, nb_sign(X)))
GRAD(sign, nb_zeros_like(X))
GRAD(exp, nb_mul(G, Y))
GRAD(log, nb_div(G, X))
GRAD(sqrt, nb_div(nb_mul_scalar(G, 0.5), Y))
GRAD(rsqrt, nb_mul(G, nb_mul_scalar(nb_div(Y, X), -0.5)))
GRAD(square, nb_mul(G, nb_mul_scalar(X, 2.0)))
GRAD(sin, nb_mul(G, nb_cos(X)))
GRAD(cos, nb_neg(nb_mul(G, nb_sin(X))))
GRAD(tanh, nb_mul(G, nb_add_scalar(nb_neg(nb_square(Y)), 1.0)))
GRAD(erf, nb_mul(G, nb_mul_scalar(nb_exp(nb_neg(nb_square(X))), 1.1283791670955126)))
GRAD(sigmoid, nb_mul(G, nb_mul(Y, nb_add_scalar(nb_neg(Y), 1.0))))
GRAD(relu, binary(NB_BIN_RELU_GRAD, G, X))
GRAD(leaky_relu, nb_mul(G, nb_add_scalar(nb_mul_scalar(nb__step(X), 1.0 - ALPHA), ALPHA)))
/* gelu'(x) = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 */
GRAD(gelu, nb_mul(G, nb_add(nb_mul_scalar(nb_add_scalar(nb_erf(nb_mul_scalar(X, 0.7071067811865476)), 1.0), 0.5),
                            nb_mul(X, nb__unary(NB_UN_NORMAL_PDF, X, 0.0)))))
GRAD(softplus, nb_mul(G, nb_sigmoid(X)))
/* silu'(x) = s + x s (1 - s) = s (1 + x (1 - s)), s = sigmoid(x) */
static nb_status silu_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *s = nb_sigmoid(X);
    gi[0] = nb_mul(G, nb_mul(s, nb_add_scalar(nb_mul(X, nb_add_scalar(nb_neg(s), 1.0)), 1.0)));
    return nb__ok(gi[0]);
}
/* elu'(x) = exp(x) below 0, 1 elsewhere: from 0 up (both sides are 1 at 0;
 * the upper one makes the second derivative at 0 zero) and at NaN, as
 * PyTorch's. exp sees 0 off the lower side, so the unselected side stays
 * finite (at x = +inf, 0 * inf would be NaN in a second-order gradient). */
static nb_status elu_grad(const nb_node *n, nb_tensor *const *g, nb_tensor **gi)
{
    nb_tensor *zero = nb__scalar_on(n->op->name, X->device, X->dtype, 0.0);
    nb_tensor *lower = nb_less(X, zero);
    gi[0] = nb_where(lower, nb_mul(G, nb_exp(nb_where(lower, X, zero))), G);
    return nb__ok(gi[0]);
}
GRAD(reciprocal, nb_neg(nb_mul(G, nb_square(Y))))
GRAD(normal_pdf, nb_mul(G, nb_neg(nb_mul(X, Y))))
GRAD(add_scalar, G)
GRAD(mul_scalar, nb_mul_scalar(G, ALPHA))
/* x^0 is constant: slope 0 even at x = 0, where alpha * x^(alpha-1) is 0 * inf,
 * and whatever G is (0 * G would pass on a NaN, and a second order through G). */
GRAD(pow_scalar, ALPHA == 0.0 ? nb_zeros_like(X) : nb_mul(G, nb_mul_scalar(nb_pow_scalar(X, ALPHA - 1.0), ALPHA)))

/* Each op of the list with its gradient <name>_grad: an op without one does
 * not compile. */
static const nb_op_def unary_defs[NB_UN_COUNT] = {
#define NB_UNARY(ID, op, dtypes, cost, api) [NB_UN_##ID] = {.name = #op, .grad = op##_grad},
#include "lib/core/ops.def"
};

/* The public functions (declared in include/nabla/ops.h). */
#define WRAP_X(ID, name) \
    nb_tensor *nb_##name(const nb_tensor *x) { return nb__unary(NB_UN_##ID, x, 0.0); }
#define WRAP_XA(ID, name) \
    nb_tensor *nb_##name(const nb_tensor *x, double alpha) { return nb__unary(NB_UN_##ID, x, alpha); }
#define WRAP_INTERNAL(ID, name)
#define NB_UNARY(ID, name, dtypes, cost, api) WRAP_##api(ID, name)
#include "lib/core/ops.def"
