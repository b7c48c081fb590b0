/* A search over the whole option space of nabla's convolutions and pooling,
 * shared by test_conv_search (a fixed set of seeds) and the libFuzzer target
 * fuzz_conv (bytes from the fuzzer).
 *
 * A configuration is decoded from a few bytes (cs_decode): for a convolution
 * batch 1-4, height and width 1-11, groups 1-4 with 1-4 input and 1-4 output
 * channels per group (depthwise with multipliers 1-4 when a group has one
 * input channel), kernels 1-4, strides 1-3, dilations 1-2, VALID, SAME or
 * explicit pads 0-3 on each side (asymmetric), NHWC or NCHW, f32 or f64; for
 * max and average pooling, windows 1-4, strides 1-3 or the window's, every
 * padding (explicit pads smaller than the window), NaNs now and then. Strides
 * larger than the kernel, dilations that skip rows and trailing rows and
 * columns that no window reads all come up.
 *
 * cs_run runs one configuration on every path the build has for it (on the
 * CPU oneDNN and the plain path for f32, the plain path for f64; on a GPU,
 * where there is one and asked for, cuDNN or nabla's own kernels in the
 * configuration's dtype and now and then in f16 and bf16) and compares each
 * with the references of conv_ref.h:
 *   convolution       y = conv2d(x, w), conv2d_transpose(dy, w) and
 *                     conv2d_filter_grad(x, dy), then the tape's first-order
 *                     gradients of all three and a second-order gradient
 *                     through a nested tape, each against its closed form
 *                     (conv2d's gradients are the other two ops, and so on);
 *   pooling           the pooled values, the tape's gradient, and the gradient
 *                     of that gradient with respect to the incoming one.
 * The inputs are small integers, so every sum of products is exact in f32 and
 * f64 and the paths must agree with the reference to the last bit but for the
 * averages' divisions. A configuration whose output would be empty must give
 * NB_ERR_SHAPE naming the op. Paths that agree with one reference agree with
 * each other. Under ASan, a kernel that reads or writes outside its buffers
 * stops the run. */
#ifndef NB_TEST_CONV_SEARCH_H
#define NB_TEST_CONV_SEARCH_H

#include "conv_ref.h"
#include "read_doubles.h"
#include "nb_config.h"
#include "ops/cpu/cpu_internal.h"

#include <nabla/nabla.h>

#include <stdarg.h>
#include <stdio.h>

typedef enum cs_kind { CS_CONV, CS_MAX_POOL, CS_AVG_POOL } cs_kind;

typedef struct cs_config {
    cs_kind kind;
    int64_t N, H, W, C, K, R, S; /* K: conv only; R, S: the kernel or the window */
    nb_conv2d_opts conv;
    nb_pool2d_opts pool;
    nb_dtype dtype;  /* NB_F32 or NB_F64 */
    bool nans;       /* pooling: a few NaNs among the inputs */
    uint32_t seed;   /* the input values */
} cs_config;

/* ---- decoding ---- */

typedef struct cs_bytes {
    const uint8_t *p;
    size_t n, at;
} cs_bytes;

/* The next byte, 0 past the end (so every input decodes). */
static inline unsigned cs_byte(cs_bytes *b)
{
    return b->at < b->n ? b->p[b->at++] : 0;
}

/* Fills c from the bytes: every byte string gives a configuration. */
static inline void cs_decode(const uint8_t *data, size_t size, cs_config *c)
{
    cs_bytes b = {data, size, 0};
    memset(c, 0, sizeof *c);
    unsigned k = cs_byte(&b) % 4;
    c->kind = k < 2 ? CS_CONV : k == 2 ? CS_MAX_POOL : CS_AVG_POOL;
    c->N = 1 + cs_byte(&b) % 4;
    c->H = 1 + cs_byte(&b) % 11;
    c->W = 1 + cs_byte(&b) % 11;
    c->R = 1 + cs_byte(&b) % 4;
    c->S = 1 + cs_byte(&b) % 4;
    unsigned f = cs_byte(&b);
    bool nchw = f & 1;
    c->dtype = f & 2 ? NB_F64 : NB_F32;
    c->nans = (f & 12) == 12;
    unsigned pad_mode = cs_byte(&b) % 3;
    int pads[4];
    for (int i = 0; i < 4; i++)
        pads[i] = (int)(cs_byte(&b) % 4);
    int strides[2] = {1 + (int)(cs_byte(&b) % 3), 1 + (int)(cs_byte(&b) % 3)};
    if (c->kind == CS_CONV) {
        int groups = 1 + (int)(cs_byte(&b) % 4);
        int64_t cg = 1 + cs_byte(&b) % 4, kg = 1 + cs_byte(&b) % 4;
        c->C = cg * groups;
        c->K = kg * groups;
        c->conv.stride[0] = strides[0], c->conv.stride[1] = strides[1];
        c->conv.dilation[0] = 1 + (int)(cs_byte(&b) % 2);
        c->conv.dilation[1] = 1 + (int)(cs_byte(&b) % 2);
        c->conv.padding = (nb_padding)pad_mode;
        if (pad_mode == NB_PAD_EXPLICIT)
            memcpy(c->conv.pad, pads, sizeof pads);
        c->conv.groups = groups;
        c->conv.format = nchw ? NB_NCHW : NB_NHWC;
    } else {
        c->C = 1 + cs_byte(&b) % 8;
        unsigned st = cs_byte(&b);
        c->pool.window[0] = (int)c->R, c->pool.window[1] = (int)c->S;
        /* stride 0 means the window's */
        c->pool.stride[0] = st & 1 ? 0 : strides[0];
        c->pool.stride[1] = st & 2 ? 0 : strides[1];
        c->pool.padding = (nb_padding)pad_mode;
        if (pad_mode == NB_PAD_EXPLICIT)
            for (int i = 0; i < 4; i++)
                c->pool.pad[i] = pads[i] % (int)(i < 2 ? c->R : c->S); /* each smaller than the window */
        c->pool.format = nchw ? NB_NCHW : NB_NHWC;
    }
    c->seed = (uint32_t)cs_byte(&b) | (uint32_t)cs_byte(&b) << 8;
}

/* The configuration in words, enough to rebuild it. */
static inline void cs_describe(const cs_config *c, char *buf, size_t n)
{
    static const char *const pads[3] = {"VALID", "SAME", "EXPLICIT"};
    if (c->kind == CS_CONV) {
        const nb_conv2d_opts *o = &c->conv;
        snprintf(buf, n,
                 "conv2d %s %s x [N %lld, H %lld, W %lld, C %lld] filter [%lld, %lld, %lld, %lld] groups %d "
                 "stride [%d, %d] dilation [%d, %d] %s pads [%d, %d, %d, %d] seed %u",
                 nb_dtype_name(c->dtype), o->format == NB_NCHW ? "NCHW" : "NHWC", (long long)c->N, (long long)c->H,
                 (long long)c->W, (long long)c->C, (long long)c->R, (long long)c->S, (long long)(c->C / o->groups),
                 (long long)c->K, o->groups, o->stride[0], o->stride[1], o->dilation[0], o->dilation[1],
                 pads[o->padding], o->pad[0], o->pad[1], o->pad[2], o->pad[3], c->seed);
    } else {
        const nb_pool2d_opts *o = &c->pool;
        snprintf(buf, n,
                 "%s %s %s%s x [N %lld, H %lld, W %lld, C %lld] window [%d, %d] stride [%d, %d] %s pads "
                 "[%d, %d, %d, %d] seed %u",
                 c->kind == CS_MAX_POOL ? "max_pool2d" : "avg_pool2d", nb_dtype_name(c->dtype),
                 o->format == NB_NCHW ? "NCHW" : "NHWC", c->nans ? " with NaNs" : "", (long long)c->N,
                 (long long)c->H, (long long)c->W, (long long)c->C, o->window[0], o->window[1], o->stride[0],
                 o->stride[1], pads[o->padding], o->pad[0], o->pad[1], o->pad[2], o->pad[3], c->seed);
    }
}

/* ---- running ---- */

/* What one run found: the first mismatch, in words. */
typedef struct cs_result {
    bool ok;
    char why[512];
} cs_result;

static inline void cs_fail(cs_result *r, const char *fmt, ...)
{
    if (!r->ok)
        return; /* the first finding is the one to see */
    r->ok = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
}

/* Small integers in [-8, 8] (xorshift on the configuration's seed). */
static inline double *cs_values(uint64_t *state, int64_t n)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = *state;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *state = x;
        v[i] = (double)((int64_t)((x >> 33) % 17) - 8);
    }
    return v;
}

/* One path: where the tensors live and what runs them. */
typedef struct cs_path {
    const char *name;   /* "/cpu:0 oneDNN", ... */
    const char *device; /* "/cpu:0", "/gpu:0" */
    nb_dtype dtype;
    bool plain;         /* the CPU's plain convolution path */
} cs_path;

/* The tolerance of a path's dtype, relative to 1 + |reference|: sums of small
 * integers are exact in f32 and f64 (a GPU engine that transforms its inputs,
 * Winograd's or FFT's, rounds a little); f16 and bf16 round the results. */
static inline double cs_tol(nb_dtype dt, bool divides)
{
    switch (dt) {
    case NB_F64: return divides ? 1e-14 : 0;
    case NB_F32: return 2e-6;
    case NB_F16: return 4e-3;
    default: return 3e-2;
    }
}

/* A tensor (NB_F32..., any device) as NHWC-ordered doubles when it is an image
 * in NCHW; NULL (with the error recorded) when it cannot be read. */
static inline double *cs_read(nb_tensor *t, bool nchw_image)
{
    if (t && nchw_image)
        t = nb_contiguous(nb_permute(t, NB_AXES(0, 2, 3, 1)));
    return check_read_doubles(t);
}

/* Compares t with ref (n values, NaN matching NaN); records the worst element. */
static inline void cs_compare(cs_result *r, const cs_path *p, const char *what, nb_tensor *t, bool nchw_image,
                              const double *ref, int64_t n, double tol)
{
    if (!r->ok)
        return;
    if (!t) {
        cs_fail(r, "%s: %s failed: %s", p->name, what, nb_error_message());
        return;
    }
    if (nb_tensor_numel(t) != n) {
        cs_fail(r, "%s: %s has %lld elements, expected %lld", p->name, what, (long long)nb_tensor_numel(t),
                (long long)n);
        return;
    }
    double *v = cs_read(t, nchw_image);
    if (!v) {
        cs_fail(r, "%s: %s could not be read: %s", p->name, what, nb_error_message());
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        bool both_nan = isnan(v[i]) && isnan(ref[i]);
        if (!both_nan && !(fabs(v[i] - ref[i]) <= tol * (1 + fabs(ref[i])))) {
            cs_fail(r, "%s: %s element %lld is %.17g, expected %.17g", p->name, what, (long long)i, v[i], ref[i]);
            break;
        }
    }
    free(v);
}

/* An NHWC-ordered array as a tensor of the path's dtype and device, in NCHW
 * when asked. */
/* t (f64, on the CPU) on the path's device in its dtype: moved first, since
 * the CPU holds no f16 or bf16. */
static inline nb_tensor *cs_on_path(const cs_path *p, nb_tensor *t)
{
    return nb_cast(nb_to_device(t, p->device), p->dtype);
}

static inline nb_tensor *cs_image(const cs_path *p, const double *v, int64_t N, int64_t H, int64_t W, int64_t C,
                                  bool nchw)
{
    nb_tensor *t = nb_from_buffer(NB_F64, NB_SHAPE(N, H, W, C), v);
    if (nchw)
        t = nb_contiguous(nb_permute(t, NB_AXES(0, 3, 1, 2)));
    return cs_on_path(p, t);
}

static inline nb_tensor *cs_filter(const cs_path *p, const double *v, int64_t R, int64_t S, int64_t Cg, int64_t K)
{
    return cs_on_path(p, nb_from_buffer(NB_F64, NB_SHAPE(R, S, Cg, K), v));
}

/* Gradients of target for two sources; false (recorded in r) on failure. */
static inline bool cs_grads(cs_result *r, const cs_path *p, const char *what, nb_tape *t, nb_tensor *target,
                            nb_tensor *a, nb_tensor *b, nb_tensor **ga, nb_tensor **gb)
{
    nb_tensor *src[2] = {a, b}, *g[2] = {NULL, NULL};
    nb_status st = target ? nb_tape_gradient(t, target, 2, src, g) : nb_error();
    if (st != NB_OK || !g[0] || !g[1]) {
        cs_fail(r, "%s: the gradient of %s failed: %s", p->name, what, nb_error_message());
        return false;
    }
    *ga = g[0], *gb = g[1];
    return true;
}

/* The convolution's checks on one path. */
static inline void cs_run_conv_path(const cs_config *c, const conv_geo *g, const cs_path *p, cs_result *r)
{
    const nb_conv2d_opts *o = &c->conv;
    const bool nchw = o->format == NB_NCHW;
    const int64_t Cg = c->C / g->G, nx = g->N * g->H * g->W * g->C, nw = g->R * g->S * Cg * g->K;
    const int64_t ny = g->N * g->P * g->Q * g->K;
    uint64_t state = 0x9E3779B97F4A7C15ull ^ c->seed;
    double *xv = cs_values(&state, nx), *wv = cs_values(&state, nw), *dyv = cs_values(&state, ny);
    double *zv = cs_values(&state, nx), *uv = cs_values(&state, nw);
    /* the closed forms: conv2d's gradients are the other two ops, and so on */
    double *y_ref = conv_ref_fwd(g, xv, wv), *dx_ref = conv_ref_data(g, dyv, wv), *dw_ref = conv_ref_filter(g, xv, dyv);
    double *zw_ref = conv_ref_fwd(g, zv, wv), *zdy_ref = conv_ref_filter(g, zv, dyv);
    double *du_ref = conv_ref_data(g, dyv, uv), *xu_ref = conv_ref_fwd(g, xv, uv);
    const double tol = cs_tol(p->dtype, false);
    bool was = nb__cpu_conv_set_plain(p->plain);
    nb_scope *s = nb_scope_begin();
    nb_tensor *x = cs_image(p, xv, g->N, g->H, g->W, g->C, nchw), *dy = cs_image(p, dyv, g->N, g->P, g->Q, g->K, nchw);
    nb_tensor *z = cs_image(p, zv, g->N, g->H, g->W, g->C, nchw);
    nb_tensor *w = cs_filter(p, wv, g->R, g->S, Cg, g->K), *u = cs_filter(p, uv, g->R, g->S, Cg, g->K);
    int64_t hw[2] = {g->H, g->W}, rs[2] = {g->R, g->S};
    if (!x || !dy || !z || !w || !u) {
        cs_fail(r, "%s: the inputs could not be made: %s", p->name, nb_error_message());
        goto done;
    }
    cs_compare(r, p, "conv2d", nb_conv2d(x, w, o), nchw, y_ref, ny, tol);
    cs_compare(r, p, "conv2d_transpose", nb_conv2d_transpose(dy, w, hw, o), nchw, dx_ref, nx, tol);
    cs_compare(r, p, "conv2d_filter_grad", nb_conv2d_filter_grad(x, dy, rs, o), false, dw_ref, nw, tol);
    if (!r->ok)
        goto done;
    nb_tensor *ga, *gb;
    /* conv2d: d sum(y * dy) / dx = transpose(dy, w), / dw = filter_grad(x, dy) */
    nb_tape *t = nb_tape_begin_persistent();
    nb_tape_watch(t, x), nb_tape_watch(t, w), nb_tape_watch(t, dy), nb_tape_watch(t, z);
    if (cs_grads(r, p, "conv2d", t, nb_sum_all(nb_mul(nb_conv2d(x, w, o), dy)), x, w, &ga, &gb)) {
        cs_compare(r, p, "conv2d's gradient for x", ga, nchw, dx_ref, nx, tol);
        cs_compare(r, p, "conv2d's gradient for the filter", gb, false, dw_ref, nw, tol);
    }
    /* transpose: d sum(transpose(dy, w) * z) / ddy = conv2d(z, w), / dw = filter_grad(z, dy) */
    if (r->ok &&
        cs_grads(r, p, "conv2d_transpose", t, nb_sum_all(nb_mul(nb_conv2d_transpose(dy, w, hw, o), z)), dy, w, &ga, &gb)) {
        cs_compare(r, p, "conv2d_transpose's gradient for dy", ga, nchw, zw_ref, ny, tol);
        cs_compare(r, p, "conv2d_transpose's gradient for the filter", gb, false, zdy_ref, nw, tol);
    }
    /* filter_grad: d sum(filter_grad(x, dy) * u) / dx = transpose(dy, u), / ddy = conv2d(x, u) */
    if (r->ok &&
        cs_grads(r, p, "conv2d_filter_grad", t, nb_sum_all(nb_mul(nb_conv2d_filter_grad(x, dy, rs, o), u)), x, dy, &ga, &gb)) {
        cs_compare(r, p, "conv2d_filter_grad's gradient for x", ga, nchw, du_ref, nx, tol);
        cs_compare(r, p, "conv2d_filter_grad's gradient for dy", gb, nchw, xu_ref, ny, tol);
    }
    nb_tape_free(t);
    /* second order: the filter gradient of sum(conv2d(x, w) * dy) taken on an
     * inner tape, then d sum(that * u) / dx and / ddy on the outer one */
    if (r->ok) {
        nb_tape *outer = nb_tape_begin();
        nb_tape_watch(outer, x), nb_tape_watch(outer, dy);
        nb_tape *inner = nb_tape_begin();
        nb_tape_watch(inner, w);
        nb_tensor *gw = NULL;
        nb_tensor *loss = nb_sum_all(nb_mul(nb_conv2d(x, w, o), dy));
        nb_status st = loss ? nb_tape_gradient(inner, loss, 1, &w, &gw) : nb_error();
        nb_tape_free(inner);
        if (st != NB_OK || !gw)
            cs_fail(r, "%s: conv2d's inner gradient failed: %s", p->name, nb_error_message());
        else if (cs_grads(r, p, "conv2d's filter gradient", outer, nb_sum_all(nb_mul(gw, u)), x, dy, &ga, &gb)) {
            cs_compare(r, p, "the second-order gradient for x", ga, nchw, du_ref, nx, tol);
            cs_compare(r, p, "the second-order gradient for dy", gb, nchw, xu_ref, ny, tol);
        }
        nb_tape_free(outer);
    }
done:
    nb_scope_end(s);
    nb__cpu_conv_set_plain(was);
    free(xv), free(wv), free(dyv), free(zv), free(uv);
    free(y_ref), free(dx_ref), free(dw_ref), free(zw_ref), free(zdy_ref), free(du_ref), free(xu_ref);
}

static inline nb_tensor *cs_pool_op(const cs_config *c, const nb_tensor *x)
{
    return c->kind == CS_MAX_POOL ? nb_max_pool2d(x, &c->pool) : nb_avg_pool2d(x, &c->pool);
}

/* Pooling's checks on one path; arrays in the configuration's layout. */
static inline void cs_run_pool_path(const cs_config *c, const pool_case *pc, const pool_geo *g, const cs_path *p,
                                    cs_result *r)
{
    const bool nchw = c->pool.format == NB_NCHW, is_max = c->kind == CS_MAX_POOL;
    const int64_t nx = c->N * c->H * c->W * c->C, ny = c->N * g->P * g->Q * c->C;
    uint64_t state = 0x9E3779B97F4A7C15ull ^ c->seed;
    double *xv = cs_values(&state, nx), *dyv = cs_values(&state, ny), *zv = cs_values(&state, nx);
    for (int64_t i = 0; i < nx; i++) {
        xv[i] /= 4; /* few values: many ties */
        if (c->nans && i % 7 == 3)
            xv[i] = NAN;
    }
    double *y_ref = malloc(sizeof(double) * (size_t)ny), *dx_ref = malloc(sizeof(double) * (size_t)nx);
    double *dd_ref = malloc(sizeof(double) * (size_t)ny);
    int64_t *arg = malloc(sizeof(int64_t) * (size_t)ny);
    pool_ref(pc, is_max, xv, y_ref, arg);
    pool_ref_grad(pc, is_max, xv, dyv, dx_ref);
    /* d/ddy of sum(dx * z): z at each window's first maximum, or z's window mean */
    if (is_max)
        for (int64_t i = 0; i < ny; i++)
            dd_ref[i] = zv[arg[i]];
    else
        pool_ref(pc, false, zv, dd_ref, NULL);
    const double tol = cs_tol(p->dtype, !is_max);
    const int64_t s4[4] = {c->N, nchw ? c->C : c->H, nchw ? c->H : c->W, nchw ? c->W : c->C};
    const int64_t o4[4] = {c->N, nchw ? c->C : g->P, nchw ? g->P : g->Q, nchw ? g->Q : c->C};
    nb_scope *s = nb_scope_begin();
    nb_shape xs = NB_SHAPE(s4[0], s4[1], s4[2], s4[3]), ys = NB_SHAPE(o4[0], o4[1], o4[2], o4[3]);
    nb_tensor *x = cs_on_path(p, nb_from_buffer(NB_F64, xs, xv));
    nb_tensor *dy = cs_on_path(p, nb_from_buffer(NB_F64, ys, dyv));
    nb_tensor *z = cs_on_path(p, nb_from_buffer(NB_F64, xs, zv));
    const char *op = is_max ? "max_pool2d" : "avg_pool2d";
    if (!x || !dy || !z) {
        cs_fail(r, "%s: the inputs could not be made: %s", p->name, nb_error_message());
        goto done;
    }
    cs_compare(r, p, op, cs_pool_op(c, x), false, y_ref, ny, tol);
    if (!r->ok)
        goto done;
    nb_tape *outer = nb_tape_begin();
    nb_tape_watch(outer, dy);
    nb_tape *inner = nb_tape_begin();
    nb_tape_watch(inner, x);
    nb_tensor *gx = NULL;
    nb_tensor *loss = nb_sum_all(nb_mul(cs_pool_op(c, x), dy));
    nb_status st = loss ? nb_tape_gradient(inner, loss, 1, &x, &gx) : nb_error();
    nb_tape_free(inner);
    if (st != NB_OK || !gx) {
        cs_fail(r, "%s: %s's gradient failed: %s", p->name, op, nb_error_message());
    } else {
        cs_compare(r, p, is_max ? "max_pool2d's gradient" : "avg_pool2d's gradient", gx, false, dx_ref, nx, tol);
        nb_tensor *gdy = NULL;
        nb_tensor *l2 = nb_sum_all(nb_mul(gx, z));
        if (r->ok && ((l2 ? nb_tape_gradient(outer, l2, 1, &dy, &gdy) : nb_error()) != NB_OK || !gdy))
            cs_fail(r, "%s: %s's second-order gradient failed: %s", p->name, op, nb_error_message());
        else
            cs_compare(r, p, "the second-order gradient for dy", gdy, false, dd_ref, ny, tol);
    }
    nb_tape_free(outer);
done:
    nb_scope_end(s);
    free(xv), free(dyv), free(zv), free(y_ref), free(dx_ref), free(dd_ref), free(arg);
}

/* The paths for a configuration: the CPU's (gpu false), or the first GPU's
 * (gpu true; none where there is no GPU). Returns how many it wrote. */
static inline int cs_paths(const cs_config *c, bool gpu, cs_path *out)
{
    int n = 0;
    if (!gpu) {
        if (c->kind == CS_CONV && c->dtype == NB_F32 && NB_HAVE_DNNL)
            out[n++] = (cs_path){"/cpu:0 oneDNN", "/cpu:0", NB_F32, false};
        out[n++] = (cs_path){c->kind == CS_CONV ? "/cpu:0 plain" : "/cpu:0", "/cpu:0", c->dtype, true};
        return n;
    }
    if (nb_device_count(NB_DEVICE_GPU) == 0)
        return 0;
    const char *g = nb_device_name(NB_DEVICE_GPU, 0);
    out[n++] = (cs_path){c->dtype == NB_F32 ? "/gpu:0 f32" : "/gpu:0 f64", g, c->dtype, false};
    if (c->seed % 4 == 0 && !c->nans) { /* the half types now and then */
        out[n++] = (cs_path){"/gpu:0 f16", g, NB_F16, false};
        out[n++] = (cs_path){"/gpu:0 bf16", g, NB_BF16, false};
    }
    return n;
}

/* A configuration with no output, on one path: the op must fail with
 * NB_ERR_SHAPE and a message holding want. */
static inline void cs_expect_empty(const cs_config *c, const cs_path *p, const char *want, cs_result *r)
{
    nb_scope *s = nb_scope_begin();
    bool nchw = (c->kind == CS_CONV ? c->conv.format : c->pool.format) == NB_NCHW;
    nb_tensor *x =
        cs_on_path(p, nb_zeros(NB_F64, nchw ? NB_SHAPE(c->N, c->C, c->H, c->W) : NB_SHAPE(c->N, c->H, c->W, c->C)));
    nb_tensor *y;
    if (c->kind == CS_CONV) {
        nb_tensor *w = cs_on_path(p, nb_zeros(NB_F64, NB_SHAPE(c->R, c->S, c->C / c->conv.groups, c->K)));
        y = nb_conv2d(x, w, &c->conv);
    } else {
        y = cs_pool_op(c, x);
    }
    if (y || nb_error() != NB_ERR_SHAPE || !strstr(nb_error_message(), want))
        cs_fail(r, "%s: an empty output gave %s: %s", p->name, nb_status_name(nb_error()), nb_error_message());
    nb_error_clear();
    nb_scope_end(s);
}

/* Runs c on the CPU's paths (gpu false) or the GPU's (gpu true). Clears any
 * error it provokes; leaves no tensors alive. */
static inline cs_result cs_run(const cs_config *c, bool gpu)
{
    cs_result r = {true, ""};
    cs_path paths[4];
    int np = cs_paths(c, gpu, paths);
    if (c->kind == CS_CONV) {
        conv_geo g = {c->N, c->H, c->W, c->C, c->K, c->R, c->S, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        bool empty = !conv_resolve(&g, &c->conv);
        for (int i = 0; i < np && r.ok; i++) {
            if (empty) /* no output: an error naming the op, on every path */
                cs_expect_empty(c, &paths[i], "conv2d: the output would be smaller than 1x1", &r);
            else
                cs_run_conv_path(c, &g, &paths[i], &r);
        }
    } else {
        pool_case pc = {c->N, c->H, c->W, c->C, c->pool};
        pool_geo g = pool_geo_of(&pc);
        const char *op = c->kind == CS_MAX_POOL ? "max_pool2d" : "avg_pool2d";
        for (int i = 0; i < np && r.ok; i++) {
            if (g.P < 1 || g.Q < 1)
                cs_expect_empty(c, &paths[i], op, &r);
            else
                cs_run_pool_path(c, &pc, &g, &paths[i], &r);
        }
    }
    nb_error_clear();
    return r;
}

#endif
