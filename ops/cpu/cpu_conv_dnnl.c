/* f32 convolutions through oneDNN (DNNL 2.x C API), when the build has it.
 *
 * Images stay in the caller's layout (dnnl_nhwc or dnnl_nchw memory over the
 * tensors' own data), except where a stride leaves the image's last rows or
 * columns unread: oneDNN then gets only the corner that is read, copied into
 * a dense scratch image (entry_new says why). The filter is HWIO [R, S, C / G, K] with output channel
 * k = g * K/G + o, which oneDNN's logical order (g, o, i, h, w) sees through
 * explicit strides; the primitive is created with dnnl_format_tag_any weights
 * so that it picks its fast blocked layout, and the filter (or the filter
 * gradient) goes through a reorder into (out of) that layout on each call.
 *
 * A primitive is created once per (direction, descriptor) and kept in a small
 * hash table for the life of the process; creation and execution run under
 * one mutex (the CPU stream and the library-managed scratchpads are not meant
 * for concurrent use, and oneDNN spreads one execution over all cores itself).
 * A shape oneDNN refuses returns NB_ERR_UNSUPPORTED with nothing recorded, and
 * the caller runs the plain path. */
#include "cpu_internal.h"
#include "nb_config.h"

#if NB_HAVE_DNNL

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>

#if NB_DNNL_DLOPEN
/* oneDNN is loaded on first use rather than linked. Debian's build runs on
 * OpenMP, whose threads by default spin for a while after each parallel region
 * and then take the cores from nabla's own pool (batch norm, pooling and relu
 * between two convolutions ran a third slower on two cores). libgomp reads
 * its spin setting when it loads, so it must be set before oneDNN is loaded:
 * GOMP_SPINCOUNT=0 unless the program chose a wait policy itself (or had
 * OpenMP loaded already, which then keeps its own). The functions used: */
#define DNNL_FUNCTIONS(X) \
    X(dnnl_engine_create) \
    X(dnnl_engine_destroy) \
    X(dnnl_stream_create) \
    X(dnnl_stream_wait) \
    X(dnnl_memory_desc_init_by_tag) \
    X(dnnl_memory_desc_init_by_strides) \
    X(dnnl_memory_desc_get_size) \
    X(dnnl_memory_desc_equal) \
    X(dnnl_memory_create) \
    X(dnnl_memory_destroy) \
    X(dnnl_primitive_desc_create) \
    X(dnnl_primitive_desc_destroy) \
    X(dnnl_primitive_desc_query_md) \
    X(dnnl_primitive_create) \
    X(dnnl_primitive_destroy) \
    X(dnnl_primitive_execute) \
    X(dnnl_reorder_primitive_desc_create) \
    X(dnnl_dilated_convolution_forward_desc_init) \
    X(dnnl_dilated_convolution_backward_data_desc_init) \
    X(dnnl_dilated_convolution_backward_weights_desc_init)
#define DECLARE(f) static __typeof__(&f) p_##f;
DNNL_FUNCTIONS(DECLARE)
#undef DECLARE

/* Loads the library and its functions; false (logged at debug level) when it
 * is missing or lacks one, and convolutions take the plain path. */
static bool dnnl_load(void)
{
    if (!getenv("GOMP_SPINCOUNT") && !getenv("OMP_WAIT_POLICY"))
        setenv("GOMP_SPINCOUNT", "0", 0);
    void *lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        nb__log(NB_LOG_DEBUG, "conv2d: oneDNN not loaded (%s); the plain path serves f32", dlerror());
        return false;
    }
#define LOAD(f)                                                                                   \
    if (!(p_##f = (__typeof__(&f))dlsym(lib, #f))) {                                              \
        nb__log(NB_LOG_DEBUG, "conv2d: oneDNN lacks %s; the plain path serves f32", #f);         \
        return false;                                                                             \
    }
    DNNL_FUNCTIONS(LOAD)
#undef LOAD
    return true;
}

/* From here on each name calls through its pointer. */
#define dnnl_engine_create (*p_dnnl_engine_create)
#define dnnl_engine_destroy (*p_dnnl_engine_destroy)
#define dnnl_stream_create (*p_dnnl_stream_create)
#define dnnl_stream_wait (*p_dnnl_stream_wait)
#define dnnl_memory_desc_init_by_tag (*p_dnnl_memory_desc_init_by_tag)
#define dnnl_memory_desc_init_by_strides (*p_dnnl_memory_desc_init_by_strides)
#define dnnl_memory_desc_get_size (*p_dnnl_memory_desc_get_size)
#define dnnl_memory_desc_equal (*p_dnnl_memory_desc_equal)
#define dnnl_memory_create (*p_dnnl_memory_create)
#define dnnl_memory_destroy (*p_dnnl_memory_destroy)
#define dnnl_primitive_desc_create (*p_dnnl_primitive_desc_create)
#define dnnl_primitive_desc_destroy (*p_dnnl_primitive_desc_destroy)
#define dnnl_primitive_desc_query_md (*p_dnnl_primitive_desc_query_md)
#define dnnl_primitive_create (*p_dnnl_primitive_create)
#define dnnl_primitive_destroy (*p_dnnl_primitive_destroy)
#define dnnl_primitive_execute (*p_dnnl_primitive_execute)
#define dnnl_reorder_primitive_desc_create (*p_dnnl_reorder_primitive_desc_create)
#define dnnl_dilated_convolution_forward_desc_init (*p_dnnl_dilated_convolution_forward_desc_init)
#define dnnl_dilated_convolution_backward_data_desc_init (*p_dnnl_dilated_convolution_backward_data_desc_init)
#define dnnl_dilated_convolution_backward_weights_desc_init (*p_dnnl_dilated_convolution_backward_weights_desc_init)
#else
/* Linked as usual (the sanitizer builds: LeakSanitizer cannot scan the threads
 * of an OpenMP runtime that came in through dlopen). */
static bool dnnl_load(void) { return true; }
#endif

typedef struct dnnl_entry {
    struct dnnl_entry *next;
    int which;
    nb_conv2d_desc d;
    dnnl_primitive_t conv;
    dnnl_memory_desc_t img_a, img_b;   /* the images' memory: x/dy (a), y/dx/dy (b), as the direction uses */
    dnnl_memory_desc_t user_w, opt_w;  /* the HWIO filter and the primitive's own layout */
    dnnl_primitive_t reorder;          /* user -> opt (forward, data) or opt -> user (filter); NULL when equal */
    size_t opt_bytes;
    int64_t Hc, Wc; /* the rows and columns of the image the convolution reads */
} dnnl_entry;

#define DNNL_BUCKETS 64
static dnnl_entry *g_table[DNNL_BUCKETS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static int g_state; /* 0 not tried, 1 ready, -1 unavailable */

static uint64_t hash_desc(int which, const nb_conv2d_desc *d)
{
    const int64_t v[] = {which, d->N, d->H, d->W, d->C, d->K, d->R, d->S, d->P, d->Q, d->stride[0], d->stride[1],
                         d->dilation[0], d->dilation[1], d->pad[0], d->pad[1], d->groups, d->nchw};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return h;
}

static bool same_desc(const nb_conv2d_desc *a, const nb_conv2d_desc *b)
{
    return a->N == b->N && a->H == b->H && a->W == b->W && a->C == b->C && a->K == b->K && a->R == b->R &&
           a->S == b->S && a->P == b->P && a->Q == b->Q && a->stride[0] == b->stride[0] &&
           a->stride[1] == b->stride[1] && a->dilation[0] == b->dilation[0] && a->dilation[1] == b->dilation[1] &&
           a->pad[0] == b->pad[0] && a->pad[1] == b->pad[1] && a->groups == b->groups && a->nchw == b->nchw;
}

/* The image memory descriptor: logical dims always (N, C, H, W). */
static dnnl_status_t image_md(dnnl_memory_desc_t *md, int64_t N, int64_t C, int64_t H, int64_t W, bool nchw)
{
    dnnl_dims_t dims = {N, C, H, W};
    return dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, nchw ? dnnl_nchw : dnnl_nhwc);
}

/* The HWIO filter: logical (O, I, H, W), grouped (G, O/G, I/G, H, W). */
static dnnl_status_t filter_md(dnnl_memory_desc_t *md, const nb_conv2d_desc *d, bool any)
{
    const int64_t G = d->groups, Cg = d->C / G, Kg = d->K / G;
    if (G == 1) {
        dnnl_dims_t dims = {d->K, Cg, d->R, d->S};
        if (any)
            return dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, dnnl_format_tag_any);
        dnnl_dims_t st = {1, d->K, d->S * Cg * d->K, Cg * d->K};
        return dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, st);
    }
    dnnl_dims_t dims = {G, Kg, Cg, d->R, d->S};
    if (any)
        return dnnl_memory_desc_init_by_tag(md, 5, dims, dnnl_f32, dnnl_format_tag_any);
    dnnl_dims_t st = {Kg, 1, d->K, d->S * Cg * d->K, Cg * d->K};
    return dnnl_memory_desc_init_by_strides(md, 5, dims, dnnl_f32, st);
}

static void entry_free(dnnl_entry *e)
{
    if (e->conv)
        dnnl_primitive_destroy(e->conv);
    if (e->reorder)
        dnnl_primitive_destroy(e->reorder);
    free(e);
}

/* Builds the primitives of one direction; NULL when oneDNN refuses the shape. */
static dnnl_entry *entry_new(int which, const nb_conv2d_desc *d)
{
    dnnl_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->which = which;
    e->d = *d;
    dnnl_memory_desc_t x_md, y_md, w_any;
    dnnl_dims_t strides = {d->stride[0], d->stride[1]};
    dnnl_dims_t dil = {d->dilation[0] - 1, d->dilation[1] - 1}; /* oneDNN counts from 0 */
    dnnl_dims_t pl = {d->pad[0], d->pad[1]}, pr;
    /* The bottom/right pads that give P and Q. Where they come out negative
     * (the last rows or columns are never read: a stride that does not land on
     * them), oneDNN is shown only the rows and columns that are read, a corner
     * of the image with its own strides, and no trailing pad: its jit 1x1
     * backward-weights kernel (2.6) overruns the heap when given the unread
     * rows with a pad clamped to 0. Every problem oneDNN sees then reads its
     * whole image. The corner goes through a dense scratch image (execute):
     * oneDNN runs a view with the full image's strides on its slow reference
     * kernel. */
    int64_t prh = (d->P - 1) * d->stride[0] + d->dilation[0] * (d->R - 1) + 1 - d->H - d->pad[0];
    int64_t prw = (d->Q - 1) * d->stride[1] + d->dilation[1] * (d->S - 1) + 1 - d->W - d->pad[1];
    pr[0] = prh > 0 ? prh : 0;
    pr[1] = prw > 0 ? prw : 0;
    e->Hc = d->H + (prh < 0 ? prh : 0);
    e->Wc = d->W + (prw < 0 ? prw : 0);
    dnnl_primitive_desc_t fwd_pd = NULL, pd = NULL, rpd = NULL;
    dnnl_convolution_desc_t cd;
    bool ok = image_md(&x_md, d->N, d->C, e->Hc, e->Wc, d->nchw) == dnnl_success &&
              image_md(&y_md, d->N, d->K, d->P, d->Q, d->nchw) == dnnl_success &&
              filter_md(&w_any, d, true) == dnnl_success && filter_md(&e->user_w, d, false) == dnnl_success;
    /* forward (the hint of the backward directions too) */
    ok = ok && dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &x_md,
                                                          &w_any, NULL, &y_md, strides, dil, pl, pr) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&fwd_pd, &cd, NULL, g_engine, NULL) == dnnl_success;
    if (ok && which == 0) {
        pd = fwd_pd;
        fwd_pd = NULL;
        e->img_a = x_md, e->img_b = y_md;
    } else if (ok && which == 1) {
        ok = dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &x_md, &w_any, &y_md,
                                                               strides, dil, pl, pr) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, fwd_pd) == dnnl_success;
        e->img_a = y_md, e->img_b = x_md;
    } else if (ok) {
        ok = dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &x_md, &w_any, NULL,
                                                                  &y_md, strides, dil, pl, pr) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, NULL, g_engine, fwd_pd) == dnnl_success;
        e->img_a = x_md, e->img_b = y_md;
    }
    if (ok) {
        const dnnl_memory_desc_t *w = dnnl_primitive_desc_query_md(
            pd, which == 2 ? dnnl_query_diff_weights_md : dnnl_query_weights_md, 0);
        ok = w != NULL;
        if (ok)
            e->opt_w = *w;
    }
    ok = ok && dnnl_primitive_create(&e->conv, pd) == dnnl_success;
    if (ok && !dnnl_memory_desc_equal(&e->opt_w, &e->user_w)) {
        e->opt_bytes = dnnl_memory_desc_get_size(&e->opt_w);
        const dnnl_memory_desc_t *from = which == 2 ? &e->opt_w : &e->user_w, *to = which == 2 ? &e->user_w : &e->opt_w;
        ok = dnnl_reorder_primitive_desc_create(&rpd, from, g_engine, to, g_engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&e->reorder, rpd) == dnnl_success;
    }
    if (fwd_pd)
        dnnl_primitive_desc_destroy(fwd_pd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
    if (!ok) {
        entry_free(e);
        return NULL;
    }
    return e;
}

static void engine_init(void)
{
    if (!dnnl_load() || dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) {
        g_state = -1;
        return;
    }
    if (dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(g_engine);
        g_state = -1;
        return;
    }
    g_state = 1;
}

static nb_status mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md, const void *p)
{
    return dnnl_memory_create(m, md, g_engine, (void *)p) == dnnl_success ? NB_OK : NB_ERR_BACKEND;
}

/* Between the [N, C, H, W] image full (in its own layout) and its top-left
 * Hc x Wc corner as a dense image: to_full false copies the corner out; true
 * copies it back in and zeroes the rest of full (the rows and columns a
 * convolution never reads get no gradient). */
static void corner_copy(const nb_conv2d_desc *d, float *full, float *corner, int64_t Hc, int64_t Wc, bool to_full)
{
    const int64_t planes = d->nchw ? d->N * d->C : d->N, ce = d->nchw ? 1 : d->C; /* elements per pixel */
    const size_t row = sizeof(float) * (size_t)(Wc * ce), rest = sizeof(float) * (size_t)((d->W - Wc) * ce);
    for (int64_t i = 0; i < planes; i++) {
        float *img = full + i * d->H * d->W * ce, *cor = corner + i * Hc * Wc * ce;
        for (int64_t h = 0; h < Hc; h++) {
            if (!to_full) {
                memcpy(cor + h * Wc * ce, img + h * d->W * ce, row);
                continue;
            }
            memcpy(img + h * d->W * ce, cor + h * Wc * ce, row);
            if (rest)
                memset(img + (h * d->W + Wc) * ce, 0, rest);
        }
        if (to_full && Hc < d->H)
            memset(img + Hc * d->W * ce, 0, sizeof(float) * (size_t)((d->H - Hc) * d->W * ce));
    }
}

/* Runs e on the data; under g_lock. */
static nb_status execute(const dnnl_entry *e, void *out, const void *a, const void *b)
{
    static const char *const names[3] = {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"};
    dnnl_memory_t ma = NULL, mb = NULL, mw = NULL, mo = NULL;
    void *opt = NULL;
    nb_status st = NB_OK;
    const int w_arg = e->which == 2 ? DNNL_ARG_DIFF_WEIGHTS : DNNL_ARG_WEIGHTS;
    /* the filter's user pointer: b for forward and data, out for filter */
    const void *user_w = e->which == 2 ? out : b;
    /* the image (x, or dx for the data gradient) as its dense read corner */
    const bool cropped = e->Hc < e->d.H || e->Wc < e->d.W;
    const size_t corner_bytes = cropped ? sizeof(float) * (size_t)(e->d.N * e->d.C * e->Hc * e->Wc) : 0;
    float *corner = NULL;
    if ((e->reorder && !(opt = nb__cpu_alloc_quiet(e->opt_bytes))) ||
        (cropped && !(corner = nb__cpu_alloc_quiet(corner_bytes)))) {
        if (opt)
            nb__cpu_free(NULL, opt, e->opt_bytes);
        return nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: out of memory on /cpu:0", names[e->which]);
    }
    if (corner && e->which != 1) {
        corner_copy(&e->d, (float *)a, corner, e->Hc, e->Wc, false);
        a = corner;
    }
    void *img_out = corner && e->which == 1 ? corner : out;
    dnnl_exec_arg_t args[3];
    dnnl_status_t ds = dnnl_success;
    if ((st = mem(&mw, &e->user_w, user_w)) || (e->reorder && (st = mem(&mo, &e->opt_w, opt))))
        goto done;
    if (e->which == 0) {
        if ((st = mem(&ma, &e->img_a, a)) || (st = mem(&mb, &e->img_b, out)))
            goto done;
        args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, ma};
        args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mo ? mo : mw};
        args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, mb};
    } else if (e->which == 1) {
        if ((st = mem(&ma, &e->img_a, a)) || (st = mem(&mb, &e->img_b, img_out)))
            goto done;
        args[0] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, ma};
        args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mo ? mo : mw};
        args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, mb};
    } else {
        if ((st = mem(&ma, &e->img_a, a)) || (st = mem(&mb, &e->img_b, b)))
            goto done;
        args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, ma};
        args[1] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, mb};
        args[2] = (dnnl_exec_arg_t){w_arg, mo ? mo : mw};
    }
    if (e->reorder && e->which != 2) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, mw}, {DNNL_ARG_TO, mo}};
        ds = dnnl_primitive_execute(e->reorder, g_stream, 2, r);
    }
    if (ds == dnnl_success)
        ds = dnnl_primitive_execute(e->conv, g_stream, 3, args);
    if (ds == dnnl_success && e->reorder && e->which == 2) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, mo}, {DNNL_ARG_TO, mw}};
        ds = dnnl_primitive_execute(e->reorder, g_stream, 2, r);
    }
    if (ds == dnnl_success)
        ds = dnnl_stream_wait(g_stream);
    if (ds != dnnl_success)
        st = NB_ERR_BACKEND;
    else if (corner && e->which == 1)
        corner_copy(&e->d, out, corner, e->Hc, e->Wc, true);
done:
    if (st == NB_ERR_BACKEND)
        nb__fail(NB_ERR_BACKEND, "%s: oneDNN failed on /cpu:0 (status %d)", names[e->which], (int)ds);
    if (ma)
        dnnl_memory_destroy(ma);
    if (mb)
        dnnl_memory_destroy(mb);
    if (mw)
        dnnl_memory_destroy(mw);
    if (mo)
        dnnl_memory_destroy(mo);
    if (opt)
        nb__cpu_free(NULL, opt, e->opt_bytes);
    if (corner)
        nb__cpu_free(NULL, corner, corner_bytes);
    return st;
}

nb_status nb__cpu_conv2d_dnnl(int which, const nb_conv2d_desc *d, void *out, const void *a, const void *b)
{
    pthread_mutex_lock(&g_lock);
    if (g_state == 0)
        engine_init();
    if (g_state < 0) {
        pthread_mutex_unlock(&g_lock);
        return NB_ERR_UNSUPPORTED;
    }
    uint64_t h = hash_desc(which, d) % DNNL_BUCKETS;
    dnnl_entry *e = g_table[h];
    while (e && !(e->which == which && same_desc(&e->d, d)))
        e = e->next;
    if (!e) {
        e = entry_new(which, d);
        if (!e) {
            pthread_mutex_unlock(&g_lock);
            return NB_ERR_UNSUPPORTED;
        }
        e->next = g_table[h];
        g_table[h] = e;
    }
    nb_status st = execute(e, out, a, b);
    pthread_mutex_unlock(&g_lock);
    return st;
}

#endif
