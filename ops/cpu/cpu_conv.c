/* The conv2d entries on the CPU.
 *
 * f32 goes to oneDNN (cpu_conv_dnnl.c) when the build has it, unless the plain
 * path is forced (NB_CONV_PLAIN=1 in the environment, or
 * nb__cpu_conv_set_plain for tests). The plain path, for f64 and for builds
 * without oneDNN, works on NHWC images (NCHW ones are transposed into scratch
 * and back):
 *   forward          per image and group, im2col into a [P*Q, R*S*C/G]
 *                    matrix and one built-in gemm with the filter's group
 *                    columns (a 1x1 stride-1 convolution with no padding on
 *                    any side and one group uses the image itself as that
 *                    matrix: pointwise() checks every one of those); images
 *                    shared out over the
 *                    thread pool, each gemm then running on its thread;
 *   backward data    per image and group, the gemm with the filter transposed
 *                    into a column matrix, then col2im adding it into dx;
 *   backward filter  the batch split into one chunk per thread, each summing
 *                    col^T @ dy over its images into its own partial, the
 *                    partials added at the end;
 *   depthwise        (one input channel per group, channel multiplier M):
 *                    direct loops over output rows, input rows and filter
 *                    taps, vectorised along the channels, since im2col would
 *                    turn each into many tiny gemms. */
#include "cpu_internal.h"
#include "nb_config.h"

#include <stdlib.h>

static atomic_int g_plain = -1; /* -1: not read yet */

bool nb__cpu_conv_set_plain(bool on)
{
    bool was = nb__cpu_conv_plain();
    atomic_store(&g_plain, on ? 1 : 0);
    return was;
}

bool nb__cpu_conv_plain(void)
{
    int v = atomic_load(&g_plain);
    if (v < 0) {
        const char *e = getenv("NB_CONV_PLAIN");
        int want = e && e[0] && strcmp(e, "0") != 0;
        atomic_compare_exchange_strong(&g_plain, &v, want);
        v = atomic_load(&g_plain);
    }
    return v == 1;
}

#define CT float
#define CG nb__cpu_gemm_f32
#define CN _f32
#include "cpu_conv_impl.inc"
#undef CT
#undef CG
#undef CN
#define CT double
#define CG nb__cpu_gemm_f64
#define CN _f64
#include "cpu_conv_impl.inc"
#undef CT
#undef CG
#undef CN

/* [N, A, B] <-> [N, B, A] per image (NCHW <-> NHWC with A, B = C, H*W). */
static void swap_inner(const char *src, char *dst, int64_t N, int64_t A, int64_t B, size_t es)
{
    for (int64_t n = 0; n < N; n++) {
        const char *s = src + (size_t)(n * A * B) * es;
        char *d = dst + (size_t)(n * A * B) * es;
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < B; b++)
                memcpy(d + (size_t)(b * A + a) * es, s + (size_t)(a * B + b) * es, es);
    }
}

typedef enum which { FWD, DATA, FILTER } which;
static const char *const names[3] = {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"};

/* out/a/b as in the table: FWD y, x, w; DATA dx, dy, w; FILTER dw, x, dy. */
static nb_status run_plain(which k, const nb_conv2d_desc *d, void *out, const void *a, const void *b, nb_dtype dt)
{
    bool f32 = dt == NB_F32;
    switch (k) {
    case FWD: return f32 ? conv_fwd_f32(d, out, a, b) : conv_fwd_f64(d, out, a, b);
    case DATA: return f32 ? conv_bwd_data_f32(d, out, a, b) : conv_bwd_data_f64(d, out, a, b);
    default: return f32 ? conv_bwd_filter_f32(d, out, a, b) : conv_bwd_filter_f64(d, out, a, b);
    }
}

static nb_status conv(nb_device *dev, which k, const nb_conv2d_desc *d, const nb_view *out, const nb_view *a,
                      const nb_view *b)
{
    nb_dtype dt = out->dtype;
    if (dt != NB_F32 && dt != NB_F64)
        return nb__cpu_unsupported(dev, names[k], dt);
    if (a->dtype != dt || b->dtype != dt)
        return nb__fail(NB_ERR_DTYPE, "%s: dtypes %s, %s -> %s differ", names[k], nb_dtype_name(a->dtype),
                        nb_dtype_name(b->dtype), nb_dtype_name(dt));
    if (!out->contiguous || !a->contiguous || !b->contiguous)
        return nb__fail(NB_ERR_INTERNAL, "%s: views must be contiguous", names[k]);
#if NB_HAVE_DNNL
    if (dt == NB_F32 && !nb__cpu_conv_plain()) {
        nb_status st = nb__cpu_conv2d_dnnl((int)k, d, out->data, a->data, b->data);
        if (st != NB_ERR_UNSUPPORTED)
            return st;
        /* a shape oneDNN refused: the plain path (no error was recorded) */
    }
#endif
    if (!d->nchw)
        return run_plain(k, d, out->data, a->data, b->data, dt);
    /* NCHW: the images through NHWC scratch */
    const size_t es = (size_t)nb__cpu_esize(dt);
    const int64_t HW = d->H * d->W, PQ = d->P * d->Q;
    const int64_t xs = d->N * HW * d->C, ys = d->N * PQ * d->K;
    /* which views are images: FWD y (out, K) x (a, C); DATA dx (out, C) dy (a, K); FILTER x (a, C) dy (b, K) */
    void *t_out = NULL, *t_a = NULL, *t_b = NULL;
    size_t n_out = 0, n_a = 0, n_b = 0;
    nb_status st = NB_ERR_OUT_OF_MEMORY;
    if (k == FWD) {
        n_out = (size_t)ys * es, n_a = (size_t)xs * es;
    } else if (k == DATA) {
        n_out = (size_t)xs * es, n_a = (size_t)ys * es;
    } else {
        n_a = (size_t)xs * es, n_b = (size_t)ys * es;
    }
    if ((n_out && !(t_out = nb__cpu_alloc(dev, n_out))) || !(t_a = nb__cpu_alloc(dev, n_a)) ||
        (n_b && !(t_b = nb__cpu_alloc(dev, n_b))))
        goto done;
    if (k == FWD) {
        swap_inner(a->data, t_a, d->N, d->C, HW, es);
        if ((st = run_plain(k, d, t_out, t_a, b->data, dt)) == NB_OK)
            swap_inner(t_out, out->data, d->N, PQ, d->K, es);
    } else if (k == DATA) {
        swap_inner(a->data, t_a, d->N, d->K, PQ, es);
        if ((st = run_plain(k, d, t_out, t_a, b->data, dt)) == NB_OK)
            swap_inner(t_out, out->data, d->N, HW, d->C, es);
    } else {
        swap_inner(a->data, t_a, d->N, d->C, HW, es);
        swap_inner(b->data, t_b, d->N, d->K, PQ, es);
        st = run_plain(k, d, out->data, t_a, t_b, dt);
    }
done:
    if (t_out)
        nb__cpu_free(dev, t_out, n_out);
    if (t_a)
        nb__cpu_free(dev, t_a, n_a);
    if (t_b)
        nb__cpu_free(dev, t_b, n_b);
    return st;
}

nb_status nb__cpu_conv2d(nb_device *dev, const nb_conv2d_desc *d, const nb_view *y, const nb_view *x,
                         const nb_view *w)
{
    return conv(dev, FWD, d, y, x, w);
}

nb_status nb__cpu_conv2d_backward_data(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dx,
                                       const nb_view *dy, const nb_view *w)
{
    return conv(dev, DATA, d, dx, dy, w);
}

nb_status nb__cpu_conv2d_backward_filter(nb_device *dev, const nb_conv2d_desc *d, const nb_view *dw,
                                         const nb_view *x, const nb_view *dy)
{
    return conv(dev, FILTER, d, dw, x, dy);
}
