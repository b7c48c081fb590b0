/* nb_conv2d, nb_conv2d_transpose and nb_conv2d_filter_grad against plain
 * nested loops in double on random inputs: odd sizes, strides 1-3, dilations
 * 1-2, VALID/SAME/explicit pads, groups 1 and 2, depthwise with channel
 * multipliers 1 and 2, batches 1 and 3, NHWC and NCHW, f32 and f64; oneDNN
 * against the plain path (f32) when the build has oneDNN; gradient checks of
 * the first and second order in f64 for all three ops; the errors; a GPU
 * against the CPU when one is present. */
#include "check.h"
#include "conv_ref.h"

#include "nb_config.h"
#include "ops/cpu/cpu_internal.h"

#include <nabla/nn.h>

#undef TOL32
#define TOL32 1e-4 /* f32 sums of a few hundred products */

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53 * 2 - 1;
}

static double *rand_values(int64_t n)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = urand();
    return v;
}

/* An NHWC-ordered array as a tensor in the given format. */
static nb_tensor *image(const double *v, int64_t N, int64_t H, int64_t W, int64_t C, nb_dtype dt, bool nchw)
{
    int64_t n = N * H * W * C;
    nb_tensor *t = nb_from_buffer(NB_F64, NB_SHAPE(N, H, W, C), v);
    if (dt != NB_F64)
        t = nb_cast(t, dt);
    (void)n;
    return nchw ? nb_contiguous(nb_permute(t, NB_AXES(0, 3, 1, 2))) : t;
}

/* A result image in the given format, as NHWC-ordered values. */
static double *image_values(const nb_tensor *t, bool nchw)
{
    if (!t)
        return NULL;
    return check_values(nchw ? nb_contiguous(nb_permute(t, NB_AXES(0, 2, 3, 1))) : t);
}

static double max_err(const double *a, const double *b, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]) / (1.0 + fabs(b[i]));
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

typedef struct conv_case {
    int64_t N, H, W, C, K, R, S;
    nb_conv2d_opts o;
} conv_case;

static const conv_case cases[] = {
    {1, 5, 7, 3, 4, 3, 3, {{0, 0}, {0, 0}, NB_PAD_VALID, {0}, 0, 0}},
    {3, 9, 8, 4, 6, 3, 2, {{2, 1}, {1, 1}, NB_PAD_SAME, {0}, 1, 0}},
    {2, 11, 10, 5, 3, 3, 3, {{3, 3}, {1, 2}, NB_PAD_SAME, {0}, 1, 0}},
    {3, 7, 9, 6, 4, 2, 3, {{1, 2}, {2, 1}, NB_PAD_EXPLICIT, {1, 2, 0, 3}, 2, 0}},      /* groups 2 */
    {1, 8, 8, 4, 8, 3, 3, {{2, 2}, {1, 1}, NB_PAD_SAME, {0}, 2, 0}},                  /* groups 2 */
    {3, 6, 7, 5, 5, 3, 3, {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 5, 0}},                  /* depthwise M 1 */
    {2, 9, 6, 3, 6, 3, 2, {{2, 1}, {2, 1}, NB_PAD_EXPLICIT, {2, 1, 1, 0}, 3, 0}},     /* depthwise M 2 */
    {1, 10, 9, 4, 8, 5, 3, {{3, 2}, {1, 2}, NB_PAD_VALID, {0}, 4, 0}},               /* depthwise M 2 */
    {3, 6, 6, 8, 5, 1, 1, {{0, 0}, {0, 0}, NB_PAD_VALID, {0}, 0, 0}},                 /* pointwise */
    {2, 7, 5, 3, 4, 1, 1, {{2, 2}, {0, 0}, NB_PAD_VALID, {0}, 1, 0}},                 /* 1x1 strided */
    {1, 4, 4, 2, 3, 4, 4, {{1, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, 0}},                 /* 1x1 output */
    {2, 5, 6, 3, 2, 3, 3, {{1, 1}, {2, 2}, NB_PAD_EXPLICIT, {3, 3, 2, 4}, 1, 0}},     /* pads past the image */
    {2, 3, 4, 3, 2, 1, 1, {{1, 1}, {1, 1}, NB_PAD_EXPLICIT, {0, 2, 0, 1}, 1, 0}},     /* 1x1 padded below, right */
    {1, 4, 9, 8, 8, 1, 1, {{2, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, 0}},                 /* last row never read */
    {2, 8, 7, 16, 16, 3, 3, {{2, 2}, {1, 1}, NB_PAD_VALID, {0}, 1, 0}},               /* last row, column unread */
    {1, 6, 10, 8, 16, 1, 1, {{2, 3}, {1, 1}, NB_PAD_VALID, {0}, 2, 0}},               /* unread, groups 2 */
    /* depthwise (a GPU's own kernels): 3x3 (unrolled on NHWC) and other sizes */
    {2, 8, 9, 6, 6, 3, 3, {{2, 2}, {1, 1}, NB_PAD_SAME, {0}, 6, 0}},                  /* M 1, SAME odd pad */
    {2, 12, 11, 40, 40, 3, 3, {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 40, 0}},             /* M 1, 2 channel blocks */
    {1, 9, 10, 4, 8, 3, 3, {{1, 1}, {2, 2}, NB_PAD_SAME, {0}, 4, 0}},                 /* M 2, dilation 2 */
    {2, 10, 9, 5, 10, 3, 3, {{2, 2}, {2, 2}, NB_PAD_EXPLICIT, {3, 1, 0, 2}, 5, 0}},   /* M 2, unequal pads */
    {2, 7, 6, 3, 3, 5, 5, {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 3, 0}},                  /* 5x5 M 1 */
    {3, 5, 6, 4, 4, 1, 1, {{1, 2}, {1, 1}, NB_PAD_VALID, {0}, 4, 0}},                 /* 1x1 M 1 */
    {2, 4, 5, 3, 9, 1, 1, {{2, 1}, {1, 1}, NB_PAD_EXPLICIT, {0, 1, 1, 0}, 3, 0}},     /* 1x1 M 3, padded */
    {2, 2, 7, 3, 6, 3, 3, {{1, 1}, {1, 1}, NB_PAD_EXPLICIT, {0, 2, 2, 1}, 3, 0}},     /* H < R, M 2 */
    {1, 3, 2, 2, 4, 3, 3, {{2, 1}, {1, 2}, NB_PAD_SAME, {0}, 2, 0}},                  /* W < span, M 2 */
    {1, 13, 12, 2, 2, 3, 3, {{3, 3}, {1, 1}, NB_PAD_VALID, {0}, 2, 0}},               /* stride 3, last row unread */
};
#define N_CASES (sizeof cases / sizeof *cases)

/* One case in one dtype and format, all three ops against the references. */
static void run_case(const conv_case *cc, nb_dtype dt, bool nchw, const char *dev)
{
    nb_conv2d_opts o = cc->o;
    o.format = nchw ? NB_NCHW : NB_NHWC;
    conv_geo g = {cc->N, cc->H, cc->W, cc->C, cc->K, cc->R, cc->S, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(conv_resolve(&g, &o));
    int64_t Cg = g.C / g.G, nx = g.N * g.H * g.W * g.C, nw = g.R * g.S * Cg * g.K, ny = g.N * g.P * g.Q * g.K;
    double *xv = rand_values(nx), *wv = rand_values(nw), *dyv = rand_values(ny);
    double *y_ref = conv_ref_fwd(&g, xv, wv), *dx_ref = conv_ref_data(&g, dyv, wv), *dw_ref = conv_ref_filter(&g, xv, dyv);
    nb_tensor *x = nb_to_device(image(xv, g.N, g.H, g.W, g.C, dt, nchw), dev);
    nb_tensor *dy = nb_to_device(image(dyv, g.N, g.P, g.Q, g.K, dt, nchw), dev);
    nb_tensor *w = nb_from_buffer(NB_F64, NB_SHAPE(g.R, g.S, Cg, g.K), wv);
    w = nb_to_device(dt == NB_F64 ? w : nb_cast(w, dt), dev);
    double tol = dt == NB_F32 ? TOL32 : 1e-12;
    int64_t in_hw[2] = {g.H, g.W}, rs[2] = {g.R, g.S};
    nb_tensor *y = nb_conv2d(x, w, &o);
    nb_tensor *dx = nb_conv2d_transpose(dy, w, in_hw, &o);
    nb_tensor *dw = nb_conv2d_filter_grad(x, dy, rs, &o);
    CHECKF(y && dx && dw, "case %dx%dx%dx%d: %s", (int)g.N, (int)g.H, (int)g.W, (int)g.C, nb_error_message());
    if (y && dx && dw) {
        CHECK(has_shape(y, nchw ? NB_SHAPE(g.N, g.K, g.P, g.Q) : NB_SHAPE(g.N, g.P, g.Q, g.K)));
        double *yv = image_values(y, nchw), *dxv = image_values(dx, nchw), *dwv = check_values(dw);
        double e1 = max_err(yv, y_ref, ny), e2 = max_err(dxv, dx_ref, nx), e3 = max_err(dwv, dw_ref, nw);
        CHECKF(e1 <= tol && e2 <= tol && e3 <= tol * (dt == NB_F32 ? 3 : 1),
               "%s %s %s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] groups %lld: errors %g %g %g", dev,
               nb_dtype_name(dt), nchw ? "NCHW" : "NHWC", (long long)g.N, (long long)g.H, (long long)g.W,
               (long long)g.C, (long long)g.R, (long long)g.S, (long long)Cg, (long long)g.K, (long long)g.G, e1, e2,
               e3);
        free(yv);
        free(dxv);
        free(dwv);
    }
    nb_error_clear();
    free(xv), free(wv), free(dyv), free(y_ref), free(dx_ref), free(dw_ref);
}

static void values_cpu(void)
{
    for (size_t i = 0; i < N_CASES; i++)
        for (int f = 0; f < 2; f++) {
            run_case(&cases[i], NB_F64, f, "/cpu:0");
            run_case(&cases[i], NB_F32, f, "/cpu:0");
        }
}

/* The plain im2col path (oneDNN's when the build has it is the default for f32). */
static void values_cpu_plain(void)
{
    bool was = nb__cpu_conv_set_plain(true);
    for (size_t i = 0; i < N_CASES; i++)
        for (int f = 0; f < 2; f++)
            run_case(&cases[i], NB_F32, f, "/cpu:0");
    nb__cpu_conv_set_plain(was);
}

/* f32: oneDNN and the plain path give the same values (each also met the reference). */
static void dnnl_vs_plain(void)
{
    if (!NB_HAVE_DNNL)
        return;
    const int64_t sizes[][7] = {{4, 17, 15, 16, 32, 3, 3}, {2, 14, 14, 32, 32, 1, 1}, {2, 13, 13, 24, 24, 3, 3}};
    const int groups[] = {1, 1, 24};
    for (int i = 0; i < 3; i++) {
        const int64_t *s = sizes[i];
        nb_conv2d_opts o = {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, groups[i], NB_NHWC};
        nb_tensor *x = nb_random_uniform(NB_F32, NB_SHAPE(s[0], s[1], s[2], s[3]), -1, 1, 11 + (uint64_t)i);
        nb_tensor *w = nb_random_uniform(NB_F32, NB_SHAPE(s[5], s[6], s[3] / groups[i], s[4]), -1, 1, 21 + (uint64_t)i);
        nb_tensor *y = nb_conv2d(x, w, &o);
        nb_tensor *dy = nb_random_uniform(NB_F32, nb_tensor_shape(y), -1, 1, 31 + (uint64_t)i);
        int64_t hw[2] = {s[1], s[2]}, rs[2] = {s[5], s[6]};
        nb_tensor *dx = nb_conv2d_transpose(dy, w, hw, &o), *dw = nb_conv2d_filter_grad(x, dy, rs, &o);
        bool was = nb__cpu_conv_set_plain(true);
        nb_tensor *y2 = nb_conv2d(x, w, &o), *dx2 = nb_conv2d_transpose(dy, w, hw, &o),
                  *dw2 = nb_conv2d_filter_grad(x, dy, rs, &o);
        nb__cpu_conv_set_plain(was);
        CHECK(y && dx && dw && y2 && dx2 && dw2);
        if (!(y && dx && dw && y2 && dx2 && dw2))
            continue;
        double *a = check_values(y2), *b = check_values(dx2), *c = check_values(dw2);
        CHECKF(check_max_error(y, a, nb_tensor_numel(y)) <= 1e-4, "forward %d", i);
        CHECKF(check_max_error(dx, b, nb_tensor_numel(dx)) <= 1e-4, "backward data %d", i);
        CHECKF(check_max_error(dw, c, nb_tensor_numel(dw)) <= 1e-3, "backward filter %d", i);
        free(a), free(b), free(c);
    }
}

/* A 1x1 stride-1 convolution padded only at the bottom or right is not
 * pointwise: its output is larger than the image. The plain path once took the
 * image for its own im2col matrix there, reading past x (forward, filter
 * gradient) and writing past dx (transpose). f64, and f32 on both paths. */
static void padded_pointwise(void)
{
    const double xv[8] = {1, 10, 2, 20, 3, 30, 4, 40}, wv[2] = {1, 0}, want[6] = {1, 2, 0, 3, 4, 0};
    const double dyv[6] = {1, 2, 3, 4, 5, 6};
    nb_conv2d_opts o = {{1, 1}, {1, 1}, NB_PAD_EXPLICIT, {0, 0, 0, 1}, 1, NB_NHWC};
    int64_t hw[2] = {2, 2}, rs[2] = {1, 1};
    /* dx[h][w][c] = dy[h][w] * w[c] for w < 2; dw[c] = sum over the image of x[..][c] * dy */
    const double dx_want[8] = {1, 0, 2, 0, 4, 0, 5, 0};
    const double dw_want[2] = {1 * 1 + 2 * 2 + 3 * 4 + 4 * 5, 10 * 1 + 20 * 2 + 30 * 4 + 40 * 5};
    for (int path = 0; path < 3; path++) {
        nb_dtype dt = path == 0 ? NB_F64 : NB_F32;
        bool was = nb__cpu_conv_set_plain(path == 2);
        nb_tensor *x = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(1, 2, 2, 2), xv), dt);
        nb_tensor *w = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(1, 1, 2, 1), wv), dt);
        nb_tensor *dy = nb_cast(nb_from_buffer(NB_F64, NB_SHAPE(1, 2, 3, 1), dyv), dt);
        nb_tensor *y = nb_conv2d(x, w, &o);
        CHECKF(has_shape(y, NB_SHAPE(1, 2, 3, 1)) && check_max_error(y, want, 6) == 0, "path %d forward", path);
        nb_tensor *dx = nb_conv2d_transpose(dy, w, hw, &o);
        CHECKF(has_shape(dx, NB_SHAPE(1, 2, 2, 2)) && check_max_error(dx, dx_want, 8) == 0, "path %d transpose", path);
        nb_tensor *dw = nb_conv2d_filter_grad(x, dy, rs, &o);
        CHECKF(has_shape(dw, NB_SHAPE(1, 1, 2, 1)) && check_max_error(dw, dw_want, 2) == 0, "path %d filter", path);
        nb__cpu_conv_set_plain(was);
    }
}

/* A strided 1x1 convolution whose last rows are never read: oneDNN's f32 filter
 * gradient once corrupted the heap there (x [1, 4, 9, 8], strides (2, 1));
 * every even height up to 12 and both paths, several times each, against the
 * reference. */
static void unread_rows(void)
{
    for (int64_t H = 2; H <= 12; H++)
        for (int path = 0; path < 2; path++) {
            bool was = nb__cpu_conv_set_plain(path == 1);
            conv_case cc = {1, H, 9, 8, 8, 1, 1, {{2, 1}, {1, 1}, NB_PAD_VALID, {0}, 1, 0}};
            for (int rep = 0; rep < 3; rep++)
                run_case(&cc, NB_F32, rep == 2, "/cpu:0");
            nb__cpu_conv_set_plain(was);
        }
}

/* ---- gradients ---- */

typedef struct gctx {
    nb_conv2d_opts o;
    int64_t hw[2], rs[2];
    int which;  /* 0 conv2d, 1 transpose, 2 filter grad */
    bool second; /* through a first gradient: the sum of squares of a tape gradient */
} gctx;

static nb_tensor *apply(const gctx *c, nb_tensor *a, nb_tensor *b)
{
    switch (c->which) {
    case 0: return nb_conv2d(a, b, &c->o);
    case 1: return nb_conv2d_transpose(a, b, c->hw, &c->o);
    default: return nb_conv2d_filter_grad(a, b, c->rs, &c->o);
    }
}

static nb_tensor *grad_fn(int n, nb_tensor *const *in, void *user)
{
    (void)n;
    const gctx *c = user;
    if (!c->second)
        return apply(c, in[0], in[1]);
    /* d/d(in) of sum(op(a, b) * v), then a smooth function of both gradients */
    nb_tape *t = nb_tape_begin();
    nb_tape_watch(t, in[0]);
    nb_tape_watch(t, in[1]);
    nb_tensor *y = apply(c, in[0], in[1]);
    if (!y) {
        nb_tape_free(t);
        return NULL;
    }
    nb_tensor *v = nb_random_uniform(NB_F64, nb_tensor_shape(y), 0.5, 1.5, 77);
    nb_tensor *g[2] = {0};
    nb_tensor *src[2] = {in[0], in[1]};
    nb_status st = nb_tape_gradient(t, nb_sum_all(nb_square(nb_mul(y, v))), 2, src, g);
    nb_tape_free(t);
    if (st)
        return NULL;
    return nb_add(nb_sum_all(nb_square(g[0])), nb_sum_all(nb_square(g[1])));
}

static void gradients(void)
{
    const conv_case *sel[] = {&cases[1], &cases[3], &cases[6], &cases[11]};
    for (size_t i = 0; i < sizeof sel / sizeof *sel; i++)
        for (int which = 0; which < 3; which++)
            for (int second = 0; second < 2; second++)
                for (int f = 0; f < 2; f++) {
                    const conv_case *cc = sel[i];
                    gctx c = {cc->o, {cc->H, cc->W}, {cc->R, cc->S}, which, second};
                    c.o.format = f ? NB_NCHW : NB_NHWC;
                    conv_geo g = {cc->N, cc->H, cc->W, cc->C, cc->K, cc->R, cc->S, 0, 0, 0, 0, 0, 0, 0, 0, 0};
                    conv_resolve(&g, &c.o);
                    int64_t N = second ? 1 : g.N;
                    nb_shape xs = f ? NB_SHAPE(N, g.C, g.H, g.W) : NB_SHAPE(N, g.H, g.W, g.C);
                    nb_shape ys = f ? NB_SHAPE(N, g.K, g.P, g.Q) : NB_SHAPE(N, g.P, g.Q, g.K);
                    nb_shape ws = NB_SHAPE(g.R, g.S, g.C / g.G, g.K);
                    nb_shape s0 = which == 1 ? ys : xs, s1 = which == 2 ? ys : ws;
                    nb_tensor *in[2] = {nb_random_uniform(NB_F64, s0, -1, 1, 100 + i),
                                        nb_random_uniform(NB_F64, s1, -1, 1, 200 + i)};
                    double err = INFINITY;
                    nb_status st = nb_gradient_check(grad_fn, &c, 2, in, GC_EPS, second ? 1e-4 : GC_TOL, &err);
                    CHECKF(st == NB_OK, "gradient check case %zu op %d order %d %s: error %g: %s", i, which,
                           second + 1, f ? "NCHW" : "NHWC", err, st ? nb_error_message() : "");
                    nb_error_clear();
                }
}

/* ---- errors ---- */

static void errors(void)
{
    nb_tensor *x = nb_zeros(NB_F32, NB_SHAPE(2, 8, 8, 4)), *w = nb_zeros(NB_F32, NB_SHAPE(3, 3, 4, 6));
    nb_conv2d_opts o = {0};
    CHECK(nb_conv2d(NULL, w, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d");
    CHECK(nb_conv2d(x, NULL, NULL) == NULL);
    nb_error_clear();
    CHECK(nb_conv2d(nb_zeros(NB_F32, NB_SHAPE(8, 8, 4)), w, NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d", "4-d", "[8, 8, 4]");
    CHECK(nb_conv2d(x, nb_zeros(NB_F32, NB_SHAPE(3, 3, 5, 6)), NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d", "[2, 8, 8, 4]", "[3, 3, 5, 6]");
    o.groups = 3;
    CHECK(nb_conv2d(x, w, &o) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d", "groups 3", "[2, 8, 8, 4]");
    o = (nb_conv2d_opts){0};
    o.stride[0] = -1;
    CHECK(nb_conv2d(x, w, &o) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d", "stride");
    o = (nb_conv2d_opts){0};
    o.padding = NB_PAD_EXPLICIT;
    o.pad[2] = -1;
    CHECK(nb_conv2d(x, w, &o) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d", "pads");
    o = (nb_conv2d_opts){0};
    o.dilation[1] = 4;
    CHECK(nb_conv2d(x, w, &o) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d", "smaller than 1x1", "[2, 8, 8, 4]", "[3, 3, 4, 6]");
    CHECK(nb_conv2d(nb_zeros(NB_I32, NB_SHAPE(2, 8, 8, 4)), w, NULL) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "conv2d");
    CHECK(nb_conv2d(x, nb_zeros(NB_F64, NB_SHAPE(3, 3, 4, 6)), NULL) == NULL);
    CHECK_ERROR(NB_ERR_DTYPE, "conv2d");
    /* transpose: a size that does not give dy's */
    nb_tensor *dy = nb_zeros(NB_F32, NB_SHAPE(2, 6, 6, 6));
    int64_t bad[2] = {9, 8}, good[2] = {8, 8}, rs[2] = {3, 3};
    CHECK(nb_conv2d_transpose(dy, w, bad, NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d_transpose", "[9, 8]", "[2, 6, 6, 6]");
    CHECK(nb_conv2d_transpose(dy, w, NULL, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d_transpose");
    CHECK(nb_conv2d_transpose(nb_zeros(NB_F32, NB_SHAPE(2, 6, 6, 5)), w, good, NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d_transpose", "[2, 6, 6, 5]");
    /* strides > 1: several input sizes give one output size */
    nb_conv2d_opts s2 = {{2, 2}, {1, 1}, NB_PAD_SAME, {0}, 1, NB_NHWC};
    int64_t a[2] = {7, 7}, b[2] = {8, 8};
    nb_tensor *dy4 = nb_zeros(NB_F32, NB_SHAPE(2, 4, 4, 6));
    nb_tensor *t1 = nb_conv2d_transpose(dy4, w, a, &s2), *t2 = nb_conv2d_transpose(dy4, w, b, &s2);
    CHECK(t1 && has_shape(t1, NB_SHAPE(2, 7, 7, 4)) && t2 && has_shape(t2, NB_SHAPE(2, 8, 8, 4)));
    /* filter grad */
    CHECK(nb_conv2d_filter_grad(x, nb_zeros(NB_F32, NB_SHAPE(3, 6, 6, 6)), rs, NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d_filter_grad", "[2, 8, 8, 4]", "[3, 6, 6, 6]");
    CHECK(nb_conv2d_filter_grad(x, dy, NULL, NULL) == NULL);
    CHECK_ERROR(NB_ERR_INVALID_ARGUMENT, "conv2d_filter_grad");
    int64_t rs4[2] = {4, 4};
    CHECK(nb_conv2d_filter_grad(x, dy, rs4, NULL) == NULL);
    CHECK_ERROR(NB_ERR_SHAPE, "conv2d_filter_grad", "[2, 6, 6, 6]");
}

/* ---- a GPU against the CPU ---- */

static void gpu_vs_cpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0) {
        printf("test_conv: no GPU, GPU cases skipped\n");
        return;
    }
    const char *gpu = nb_device_name(NB_DEVICE_GPU, 0);
    for (size_t i = 0; i < N_CASES; i++)
        for (int f = 0; f < 2; f++) {
            run_case(&cases[i], NB_F64, f, gpu);
            run_case(&cases[i], NB_F32, f, gpu);
        }
}

/* A tensor's values as doubles, read through f32 on its own device (the
 * half types are not read directly). */
static double *values_via_f32(nb_tensor *t, bool nchw)
{
    return t ? image_values(nb_cast(t, NB_F32), nchw) : NULL;
}

/* |got - want| <= rel |want| + abs at every element; the worst excess (0 when none). */
static double excess(const double *got, const double *want, int64_t n, double rel, double abs)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) - (rel * fabs(want[i]) + abs);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* One case in f16 or bf16 on the device against the CPU in f32 from the same
 * rounded inputs: the products of two half values are exact in f32, so only
 * the order of the sums and the rounding of the result differ (a few ulps of
 * the half type, against an element's magnitude; a missed or extra term is
 * of the order of the values, 0.1 to 1). */
static void run_half_case(const conv_case *cc, nb_dtype dt, bool nchw, const char *dev)
{
    nb_scope *scope = nb_scope_begin();
    nb_conv2d_opts o = cc->o;
    o.format = nchw ? NB_NCHW : NB_NHWC;
    conv_geo g = {cc->N, cc->H, cc->W, cc->C, cc->K, cc->R, cc->S, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(conv_resolve(&g, &o));
    int64_t Cg = g.C / g.G, nx = g.N * g.H * g.W * g.C, nw = g.R * g.S * Cg * g.K, ny = g.N * g.P * g.Q * g.K;
    double *xv = rand_values(nx), *wv = rand_values(nw), *dyv = rand_values(ny);
    /* rounded to dt on the CPU once; both sides start from these */
    nb_tensor *xh = image(xv, g.N, g.H, g.W, g.C, NB_F64, nchw), *dyh = image(dyv, g.N, g.P, g.Q, g.K, NB_F64, nchw);
    nb_tensor *wh = nb_from_buffer(NB_F64, NB_SHAPE(g.R, g.S, Cg, g.K), wv);
    xh = nb_cast(xh, dt), dyh = nb_cast(dyh, dt), wh = nb_cast(wh, dt);
    nb_tensor *x = nb_to_device(xh, dev), *dy = nb_to_device(dyh, dev), *w = nb_to_device(wh, dev);
    nb_tensor *x32 = nb_cast(xh, NB_F32), *dy32 = nb_cast(dyh, NB_F32), *w32 = nb_cast(wh, NB_F32);
    int64_t in_hw[2] = {g.H, g.W}, rs[2] = {g.R, g.S};
    nb_tensor *y = nb_conv2d(x, w, &o), *dx = nb_conv2d_transpose(dy, w, in_hw, &o),
              *dw = nb_conv2d_filter_grad(x, dy, rs, &o);
    nb_tensor *y_ref = nb_conv2d(x32, w32, &o), *dx_ref = nb_conv2d_transpose(dy32, w32, in_hw, &o),
              *dw_ref = nb_conv2d_filter_grad(x32, dy32, rs, &o);
    CHECKF(y && dx && dw && y_ref && dx_ref && dw_ref, "%s %s case %dx%dx%dx%d: %s", dev, nb_dtype_name(dt),
           (int)g.N, (int)g.H, (int)g.W, (int)g.C, nb_error_message());
    if (y && dx && dw && y_ref && dx_ref && dw_ref) {
        /* bf16 keeps 8 significant bits, f16 11 */
        const double rel = dt == NB_BF16 ? 1e-2 : 2e-3, abs = dt == NB_BF16 ? 4e-3 : 1e-3;
        double *a = values_via_f32(y, nchw), *b = values_via_f32(dx, nchw), *c = values_via_f32(dw, false);
        double *ra = image_values(y_ref, nchw), *rb = image_values(dx_ref, nchw), *rc = check_values(dw_ref);
        double e1 = a && ra ? excess(a, ra, ny, rel, abs) : INFINITY;
        double e2 = b && rb ? excess(b, rb, nx, rel, abs) : INFINITY;
        double e3 = c && rc ? excess(c, rc, nw, rel, abs) : INFINITY;
        CHECKF(e1 == 0 && e2 == 0 && e3 == 0,
               "%s %s %s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] groups %lld: excess over the tolerance %g "
               "%g %g",
               dev, nb_dtype_name(dt), nchw ? "NCHW" : "NHWC", (long long)g.N, (long long)g.H, (long long)g.W,
               (long long)g.C, (long long)g.R, (long long)g.S, (long long)Cg, (long long)g.K, (long long)g.G, e1, e2,
               e3);
        free(a), free(b), free(c), free(ra), free(rb), free(rc);
    }
    nb_error_clear();
    free(xv), free(wv), free(dyv);
    nb_scope_end(scope);
}

/* Every case in f16 and bf16 on a GPU, both layouts. */
static void gpu_half_vs_cpu(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return;
    const char *gpu = nb_device_name(NB_DEVICE_GPU, 0);
    for (size_t i = 0; i < N_CASES; i++)
        for (int f = 0; f < 2; f++) {
            run_half_case(&cases[i], NB_F16, f, gpu);
            run_half_case(&cases[i], NB_BF16, f, gpu);
        }
}

/* A GPU's depthwise filter gradient (partial sums per slice, added in a
 * fixed order) gives the same bits every time, in every dtype; the shape has
 * many positions, so many slices. */
static void gpu_depthwise_repeats(void)
{
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return;
    nb_device_push(nb_device_name(NB_DEVICE_GPU, 0));
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (int i = 0; i < 4; i++)
        for (int f = 0; f < 2; f++) {
            nb_scope *s = nb_scope_begin();
            nb_conv2d_opts o = {{1, 1}, {1, 1}, NB_PAD_SAME, {0}, 48, f ? NB_NCHW : NB_NHWC};
            nb_shape xs = f ? NB_SHAPE(4, 48, 30, 29) : NB_SHAPE(4, 30, 29, 48);
            nb_tensor *x = nb_cast(nb_random_uniform(NB_F32, xs, -1, 1, 5), dts[i]);
            nb_tensor *dy = nb_cast(nb_random_uniform(NB_F32, xs, -1, 1, 6), dts[i]);
            int64_t rs[2] = {3, 3};
            nb_tensor *a = nb_cast(nb_conv2d_filter_grad(x, dy, rs, &o), NB_F64);
            nb_tensor *b = nb_cast(nb_conv2d_filter_grad(x, dy, rs, &o), NB_F64);
            double *av = check_values(a), *bv = check_values(b);
            CHECKF(av && bv && memcmp(av, bv, sizeof(double) * 3 * 3 * 48) == 0, "%s %s: two runs differ",
                   nb_dtype_name(dts[i]), f ? "NCHW" : "NHWC");
            free(av), free(bv);
            nb_scope_end(s);
        }
    nb_device_pop();
}

int main(void)
{
    RUN(values_cpu);
    RUN(values_cpu_plain);
    RUN(dnnl_vs_plain);
    RUN(padded_pointwise);
    RUN(unread_rows);
    RUN(gradients);
    RUN(errors);
    RUN(gpu_vs_cpu);
    RUN(gpu_half_vs_cpu);
    RUN(gpu_depthwise_repeats);
    return check_finish();
}
