/* Plain nested-loop references for the convolutions and pooling, in long
 * double, that test_conv, test_nn, test_conv_search and the fuzz target
 * fuzz_conv compare nabla with. They follow TensorFlow's rules (SAME pads
 * with the odd row at the bottom and right, VALID none, explicit ones as
 * given) and work them out themselves, not through the library.
 *
 * Convolutions: x and dx NHWC [N, H, W, C], filters HWIO [R, S, C / G, K],
 * y and dy NHWC [N, P, Q, K]. Pooling: arrays in the case's own layout. Each
 * returned array is malloc'd; the caller frees it. */
#ifndef NB_TEST_CONV_REF_H
#define NB_TEST_CONV_REF_H

#include <nabla/nn.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- convolutions ------------------------------------------------------------------ */

/* One convolution's geometry: the sizes given, and P, Q, strides, dilations,
 * top/left pads and groups as conv_resolve works them out. */
typedef struct conv_geo {
    int64_t N, H, W, C, K, R, S, P, Q, G;
    int sh, sw, dh, dw, pt, pl;
} conv_geo;

/* Fills g's P, Q, strides, dilations, leading pads and groups from o (zeros
 * as the defaults); false when the output would be smaller than 1x1. */
static inline bool conv_resolve(conv_geo *g, const nb_conv2d_opts *o)
{
    int s[2] = {o->stride[0] ? o->stride[0] : 1, o->stride[1] ? o->stride[1] : 1};
    int d[2] = {o->dilation[0] ? o->dilation[0] : 1, o->dilation[1] ? o->dilation[1] : 1};
    int64_t in[2] = {g->H, g->W}, k[2] = {g->R, g->S}, out[2];
    int lo[2];
    for (int i = 0; i < 2; i++) {
        int64_t span = d[i] * (k[i] - 1) + 1, a = 0, b = 0;
        if (o->padding == NB_PAD_EXPLICIT) {
            a = o->pad[2 * i];
            b = o->pad[2 * i + 1];
        } else if (o->padding == NB_PAD_SAME) {
            int64_t n = (in[i] + s[i] - 1) / s[i], t = (n - 1) * s[i] + span - in[i];
            t = t < 0 ? 0 : t;
            a = t / 2;
            b = t - a;
        }
        lo[i] = (int)a;
        if (in[i] + a + b < span)
            return false;
        out[i] = (in[i] + a + b - span) / s[i] + 1;
    }
    g->P = out[0], g->Q = out[1];
    g->sh = s[0], g->sw = s[1], g->dh = d[0], g->dw = d[1], g->pt = lo[0], g->pl = lo[1];
    g->G = o->groups ? o->groups : 1;
    return true;
}

/* The input pixel (h, w) that tap (r, t) of output (p, q) reads; false where
 * it falls on the padding. */
static inline bool conv_ref_tap(const conv_geo *g, int64_t p, int64_t q, int64_t r, int64_t t, int64_t *h,
                                int64_t *w)
{
    *h = p * g->sh - g->pt + r * g->dh;
    *w = q * g->sw - g->pl + t * g->dw;
    return *h >= 0 && *h < g->H && *w >= 0 && *w < g->W;
}

/* One product of the convolution: the flat indices of the x, w and y
 * elements it joins. */
typedef void conv_ref_term(void *ctx, int64_t xi, int64_t wi, int64_t yi);

/* Calls f on every product the convolution forms, in the order n, p, q, k
 * (the output), r, t (the tap, skipped on the padding), c (k's group's
 * channels). Each reference below sums its products into its own array in
 * this order, so every element's terms come in the order its own loops
 * would take them. */
static inline void conv_ref_each_term(const conv_geo *g, conv_ref_term *f, void *ctx)
{
    int64_t Cg = g->C / g->G, Kg = g->K / g->G;
    for (int64_t n = 0; n < g->N; n++)
        for (int64_t p = 0; p < g->P; p++)
            for (int64_t q = 0; q < g->Q; q++)
                for (int64_t k = 0; k < g->K; k++)
                    for (int64_t r = 0; r < g->R; r++)
                        for (int64_t t = 0; t < g->S; t++) {
                            int64_t h, ww;
                            if (!conv_ref_tap(g, p, q, r, t, &h, &ww))
                                continue;
                            for (int64_t c = 0; c < Cg; c++)
                                f(ctx, ((n * g->H + h) * g->W + ww) * g->C + (k / Kg) * Cg + c,
                                  ((r * g->S + t) * Cg + c) * g->K + k, ((n * g->P + p) * g->Q + q) * g->K + k);
                        }
}

/* The two arrays a reference multiplies and the long double sums it keeps. */
typedef struct conv_ref_sums {
    const double *a, *b;
    long double *acc;
} conv_ref_sums;

static inline void conv_ref_fwd_term(void *ctx, int64_t xi, int64_t wi, int64_t yi)
{
    conv_ref_sums *s = ctx;
    s->acc[yi] += (long double)s->a[xi] * s->b[wi];
}

static inline void conv_ref_data_term(void *ctx, int64_t xi, int64_t wi, int64_t yi)
{
    conv_ref_sums *s = ctx;
    s->acc[xi] += (long double)s->a[yi] * s->b[wi];
}

static inline void conv_ref_filter_term(void *ctx, int64_t xi, int64_t wi, int64_t yi)
{
    conv_ref_sums *s = ctx;
    s->acc[wi] += (long double)s->a[xi] * s->b[yi];
}

/* Sums the products of a and b into n elements through term; returns them
 * rounded to double in a malloc'd array. */
static inline double *conv_ref_sum(const conv_geo *g, conv_ref_term *term, const double *a, const double *b,
                                   int64_t n)
{
    size_t len = (size_t)(n > 0 ? n : 1);
    conv_ref_sums s = {a, b, calloc(len, sizeof(long double))};
    conv_ref_each_term(g, term, &s);
    double *out = malloc(sizeof(double) * len);
    for (int64_t i = 0; i < n; i++)
        out[i] = (double)s.acc[i];
    free(s.acc);
    return out;
}

/* y = x (*) w. */
static inline double *conv_ref_fwd(const conv_geo *g, const double *x, const double *w)
{
    return conv_ref_sum(g, conv_ref_fwd_term, x, w, g->N * g->P * g->Q * g->K);
}

/* dx: the transpose of the convolution applied to dy (its gradient for x). */
static inline double *conv_ref_data(const conv_geo *g, const double *dy, const double *w)
{
    return conv_ref_sum(g, conv_ref_data_term, dy, w, g->N * g->H * g->W * g->C);
}

/* dw: the filter gradient from x and dy, summed over the batch. */
static inline double *conv_ref_filter(const conv_geo *g, const double *x, const double *dy)
{
    return conv_ref_sum(g, conv_ref_filter_term, x, dy, g->R * g->S * (g->C / g->G) * g->K);
}

/* ---- pooling ----------------------------------------------------------------------- */

typedef struct pool_case {
    int64_t N, H, W, C;
    nb_pool2d_opts o;
} pool_case;

/* A pooling's output size, leading pads, window and strides. */
typedef struct pool_geo {
    int64_t P, Q, pt, pl, R, S, sh, sw;
} pool_geo;

static inline pool_geo pool_geo_of(const pool_case *c)
{
    pool_geo g = {0};
    g.R = c->o.window[0], g.S = c->o.window[1];
    g.sh = c->o.stride[0] ? c->o.stride[0] : g.R;
    g.sw = c->o.stride[1] ? c->o.stride[1] : g.S;
    int64_t pb = 0, pr = 0;
    if (c->o.padding == NB_PAD_SAME) {
        int64_t P = (c->H + g.sh - 1) / g.sh, Q = (c->W + g.sw - 1) / g.sw;
        int64_t th = (P - 1) * g.sh + g.R - c->H, tw = (Q - 1) * g.sw + g.S - c->W;
        th = th < 0 ? 0 : th, tw = tw < 0 ? 0 : tw;
        g.pt = th / 2, pb = th - g.pt, g.pl = tw / 2, pr = tw - g.pl;
    } else if (c->o.padding == NB_PAD_EXPLICIT) {
        g.pt = c->o.pad[0], pb = c->o.pad[1], g.pl = c->o.pad[2], pr = c->o.pad[3];
    }
    /* 0 when the window is larger than the padded image (no output) */
    g.P = c->H + g.pt + pb < g.R ? 0 : (c->H + g.pt + pb - g.R) / g.sh + 1;
    g.Q = c->W + g.pl + pr < g.S ? 0 : (c->W + g.pl + pr - g.S) / g.sw + 1;
    return g;
}

/* The flat index of (n, h, w, ch) in an image of H x W in the case's layout. */
static inline int64_t pool_idx(const pool_case *c, int64_t n, int64_t h, int64_t w, int64_t ch, int64_t H, int64_t W)
{
    return c->o.format == NB_NCHW ? ((n * c->C + ch) * H + h) * W + w : ((n * H + h) * W + w) * c->C + ch;
}

/* out: the pooled values; arg (max only, may be NULL): the flat input index of
 * each window's first maximum (row-major window order; a NaN wins). */
static inline void pool_ref(const pool_case *c, bool is_max, const double *x, double *out, int64_t *arg)
{
    pool_geo g = pool_geo_of(c);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t p = 0; p < g.P; p++)
            for (int64_t q = 0; q < g.Q; q++)
                for (int64_t ch = 0; ch < c->C; ch++) {
                    double m = -INFINITY, sum = 0;
                    int64_t best = -1, cnt = 0;
                    for (int64_t r = 0; r < g.R; r++)
                        for (int64_t s = 0; s < g.S; s++) {
                            int64_t h = p * g.sh - g.pt + r, w = q * g.sw - g.pl + s;
                            if (h < 0 || h >= c->H || w < 0 || w >= c->W)
                                continue;
                            int64_t i = pool_idx(c, n, h, w, ch, c->H, c->W);
                            double v = x[i];
                            cnt++;
                            sum += v;
                            if (best < 0 || (!isnan(m) && (v > m || isnan(v)))) {
                                m = v;
                                best = i;
                            }
                        }
                    int64_t o = pool_idx(c, n, p, q, ch, g.P, g.Q);
                    out[o] = is_max ? m : sum / (double)cnt;
                    if (arg)
                        arg[o] = best;
                }
}

/* dx (zeroed here, the input's size) from dy (the output's): max pooling sends
 * each window's dy to its first maximum, average pooling spreads it evenly over
 * the window's elements inside the image. */
static inline void pool_ref_grad(const pool_case *c, bool is_max, const double *x, const double *dy, double *dx)
{
    pool_geo g = pool_geo_of(c);
    int64_t n_in = c->N * c->H * c->W * c->C, n_out = c->N * g.P * g.Q * c->C;
    memset(dx, 0, sizeof(double) * (size_t)n_in);
    if (is_max) {
        double *out = malloc(sizeof(double) * (size_t)n_out);
        int64_t *arg = malloc(sizeof(int64_t) * (size_t)n_out);
        pool_ref(c, true, x, out, arg);
        for (int64_t i = 0; i < n_out; i++)
            dx[arg[i]] += dy[i];
        free(out);
        free(arg);
        return;
    }
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t p = 0; p < g.P; p++)
            for (int64_t q = 0; q < g.Q; q++)
                for (int64_t ch = 0; ch < c->C; ch++) {
                    int64_t cnt = 0;
                    for (int pass = 0; pass < 2; pass++)
                        for (int64_t r = 0; r < g.R; r++)
                            for (int64_t s = 0; s < g.S; s++) {
                                int64_t h = p * g.sh - g.pt + r, w = q * g.sw - g.pl + s;
                                if (h < 0 || h >= c->H || w < 0 || w >= c->W)
                                    continue;
                                if (pass == 0)
                                    cnt++;
                                else
                                    dx[pool_idx(c, n, h, w, ch, c->H, c->W)] +=
                                        dy[pool_idx(c, n, p, q, ch, g.P, g.Q)] / (double)cnt;
                            }
                }
}

#endif
