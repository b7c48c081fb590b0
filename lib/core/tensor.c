/* Tensor objects: pooled structs, reference counts, geometry, views, reading back. */
#include "core.h"
#include "capture.h"
#include "backend.h"
#include "op_phases.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t g_next_id = 1;

/* Making and freeing a tensor takes no locked instruction (each cost as much
 * as the rest of a small op's bookkeeping): ids come from g_next_id in
 * blocks of ID_BLOCK a thread (unique, but not in the order of making across
 * threads: nothing compares them), and each thread counts the tensors it
 * made less those it freed in a counter of its own, on a list that
 * nb_live_tensors sums; a thread that exits adds its count to g_live_gone. */
enum { ID_BLOCK = 1024 };

typedef struct live_count {
    atomic_int_fast64_t n; /* written by its thread alone; read by nb_live_tensors */
    struct live_count *next;
    bool listed, gone; /* gone: the thread is exiting, and counts into g_live_gone */
} live_count;

/* A small per-thread free list keeps malloc off the hot path. Structs freed on
 * another thread simply join that thread's list. */
/* Under AddressSanitizer nothing is pooled, so a use after release is caught. */
#if NB_ASAN
#define NB_TENSOR_POOL_MAX 0
#else
#define NB_TENSOR_POOL_MAX 4096
#endif
/* The thread's pool of tensor structs (NB_TENSOR_POOL_MAX), id block and live count:
 * one thread-local, so that a function reaches all of it through one TLS
 * access (in the shared library each is a call). */
static _Thread_local struct {
    nb_tensor *head;
    int n;
    uint64_t id_next, id_end;
    live_count live;
} tl_tensors;
static pthread_mutex_t g_live_lock = PTHREAD_MUTEX_INITIALIZER;
static live_count *g_live_list;
static atomic_int_fast64_t g_live_gone;

uint64_t nb__next_tensor_id(void)
{
    if (tl_tensors.id_next == tl_tensors.id_end) {
        tl_tensors.id_next = atomic_fetch_add_explicit(&g_next_id, ID_BLOCK, memory_order_relaxed);
        tl_tensors.id_end = tl_tensors.id_next + ID_BLOCK;
    }
    return tl_tensors.id_next++;
}

/* Adds d to the calling thread's count of live tensors. */
static inline void live_add(int64_t d)
{
    if (__builtin_expect(!tl_tensors.live.listed, 0)) {
        if (tl_tensors.live.gone) { /* a tensor let go after the thread's drain (another destructor's) */
            atomic_fetch_add_explicit(&g_live_gone, d, memory_order_relaxed);
            return;
        }
        nb__thread_track(); /* nb__tensor_pool_drain takes it off the list */
        pthread_mutex_lock(&g_live_lock);
        tl_tensors.live.next = g_live_list;
        g_live_list = &tl_tensors.live;
        tl_tensors.live.listed = true;
        pthread_mutex_unlock(&g_live_lock);
    }
    atomic_store_explicit(&tl_tensors.live.n, atomic_load_explicit(&tl_tensors.live.n, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

int64_t nb_live_tensors(void)
{
    pthread_mutex_lock(&g_live_lock);
    int64_t n = atomic_load_explicit(&g_live_gone, memory_order_relaxed);
    for (const live_count *c = g_live_list; c; c = c->next)
        n += atomic_load_explicit(&c->n, memory_order_relaxed);
    pthread_mutex_unlock(&g_live_lock);
    return n;
}

static nb_tensor *tensor_alloc(void)
{
    nb_tensor *t = tl_tensors.head;
    if (t) {
        tl_tensors.head = t->next_free;
        tl_tensors.n--;
    } else {
        t = malloc(sizeof *t);
        if (!t)
            return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "tensor: out of host memory");
    }
    atomic_init(&t->refs, 1);
    t->id = nb__next_tensor_id();
    t->next_free = NULL;
    live_add(1);
    return t;
}

void nb__tensor_pool_drain(void)
{
    while (tl_tensors.head) {
        nb_tensor *t = tl_tensors.head;
        tl_tensors.head = t->next_free;
        free(t);
    }
    tl_tensors.n = 0;
    tl_tensors.live.gone = true; /* the thread exits: its count joins the gone threads' */
    if (tl_tensors.live.listed) {
        pthread_mutex_lock(&g_live_lock);
        live_count **p = &g_live_list;
        while (*p && *p != &tl_tensors.live)
            p = &(*p)->next;
        if (*p)
            *p = tl_tensors.live.next;
        atomic_fetch_add_explicit(&g_live_gone, atomic_load_explicit(&tl_tensors.live.n, memory_order_relaxed),
                                  memory_order_relaxed);
        atomic_store_explicit(&tl_tensors.live.n, 0, memory_order_relaxed);
        tl_tensors.live.listed = false;
        pthread_mutex_unlock(&g_live_lock);
    }
}

static void tensor_free(nb_tensor *t)
{
    int phase = nb__phase_enter(NB_PHASE_RELEASE);
    nb__storage_release(t->storage);
    live_add(-1);
    if (tl_tensors.n < NB_TENSOR_POOL_MAX) {
        if (tl_tensors.n == 0)
            nb__thread_track();
        t->next_free = tl_tensors.head;
        tl_tensors.head = t;
        tl_tensors.n++;
    } else {
        free(t);
    }
    nb__phase_leave(phase);
}

void nb__retain(nb_tensor *t)
{
    if (t)
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
}

void nb__release(nb_tensor *t)
{
    if (t && nb__drop_ref(&t->refs))
        tensor_free(t);
}

void nb_release(nb_tensor *t) { nb__release(t); }

int64_t nb__shape_numel(int ndim, const int64_t *shape)
{
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)
            return 0; /* whatever the other dims are */
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n))
            return -1;
    return n;
}

bool nb__shape_fits(const char *who, bool allocates, nb_dtype dtype, int ndim, const int64_t *shape)
{
    int64_t span = (int64_t)nb_dtype_size(dtype);
    bool fits = true;
    for (int i = 0; i < ndim && fits; i++)
        fits = !__builtin_mul_overflow(span, shape[i] > 1 ? shape[i] : 1, &span);
    if (fits)
        return true;
    char s[NB_SHAPE_STR_MAX];
    nb__shape_str(ndim, shape, s, sizeof s);
    int64_t numel = nb__shape_numel(ndim, shape), bytes;
    if (allocates && (numel < 0 || __builtin_mul_overflow(numel, (int64_t)nb_dtype_size(dtype), &bytes)))
        nb__fail(NB_ERR_OUT_OF_MEMORY, "%s: a %s tensor of shape %s would need more bytes than any device can hold",
                 who, nb_dtype_name(dtype), s);
    else
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: shape %s of %s is too large: its dims (a zero dim counted as 1) "
                 "take more than 2^63 bytes", who, s, nb_dtype_name(dtype));
    return false;
}

void nb__contiguous_strides(int ndim, const int64_t *shape, size_t elem, int64_t *strides)
{
    /* Saturates rather than wraps for a caller that has not checked the shape
     * with nb__shape_fits (every tensor's shape is checked, so none reaches here). */
    int64_t s = (int64_t)elem;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s))
            s = INT64_MAX;
    }
}

void nb__tensor_finish_geometry(nb_tensor *t)
{
    t->numel = nb__shape_numel(t->ndim, t->shape);
    int64_t expect = (int64_t)nb_dtype_size(t->dtype);
    bool contiguous = true;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) {
            contiguous = false;
            break;
        }
        expect *= t->shape[i];
    }
    t->contiguous = contiguous || t->numel == 0;
}

/* NB_DEBUG_POISON=1 fills every new output with NaN (floats) or a large odd
 * value (integers) before a kernel writes it, so an element a kernel forgets to
 * write fails a test instead of passing by luck. The tests run with it on. */
bool nb__debug_poison(void)
{
    static atomic_int state; /* 0 unknown, 1 off, 2 on */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (!s) {
        const char *env = getenv("NB_DEBUG_POISON");
        s = env && env[0] && strcmp(env, "0") != 0 ? 2 : 1;
        atomic_store(&state, s);
    }
    return s == 2;
}

static void poison(nb_tensor *t)
{
    if (t->numel == 0)
        return;
    double value = nb__is_floating(t->dtype) ? NAN : t->dtype == NB_BOOL ? 1 : t->dtype == NB_U8 ? 0xA5 : -0x5A5A5A5;
    nb_view v = nb__view(t);
    (void)t->device->backend->fill(t->device, &v, value);
}

static nb_tensor *tensor_new(const char *who, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape)
{
    size_t elem = nb_dtype_size(dtype), bytes = 0;
    if (ndim < 0 || ndim > NB_MAX_DIMS)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: %d dims is outside [0, %d]", who, ndim, NB_MAX_DIMS);
    if ((unsigned)dtype >= NB_DTYPE_COUNT || !(dev->backend->dtypes & (1u << dtype)))
        return nb__fail_null(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", who, nb_dtype_name(dtype),
                             dev->name);
    if (nb__capture_check_device(dev, who))
        return NULL;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char sh[NB_SHAPE_STR_MAX];
            return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: shape %s has a negative dim", who,
                                 nb__shape_str(ndim, shape, sh, sizeof sh));
        }
    }
    if (!nb__shape_fits(who, true, dtype, ndim, shape))
        return NULL;
    int64_t numel = nb__shape_numel(ndim, shape); /* fits: neither can overflow */
    bytes = (size_t)numel * elem;
    /* The allocators' own messages then say which op ran out of memory. */
    const char *outer = nb__error_context(who);
    nb_storage *s = nb__storage_new(dev, bytes);
    nb_tensor *t = s ? tensor_alloc() : NULL;
    nb__error_context(outer);
    if (!s)
        return NULL;
    if (!t) {
        nb__storage_release(s);
        return NULL;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = numel;
    t->contiguous = true;
    t->offset = 0;
    t->storage = s;
    t->device = dev;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    nb__contiguous_strides(ndim, shape, elem, t->strides);
    if (nb__debug_poison())
        poison(t);
    return t;
}

nb_tensor *nb__tensor_new(const char *who, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape)
{
    int phase = nb__phase_enter(NB_PHASE_TENSOR);
    nb_tensor *t = tensor_new(who, dev, dtype, ndim, shape);
    nb__phase_leave(phase);
    return t;
}

nb_tensor *nb__tensor_on_storage(nb_storage *s, nb_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t offset)
{
    nb_tensor *t = tensor_alloc();
    if (!t) {
        nb__storage_release(s);
        return NULL;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    t->storage = s;
    t->device = s->device;
    nb__tensor_finish_geometry(t);
    return t;
}

nb_tensor *nb__tensor_view(const nb_tensor *base, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset)
{
    nb_tensor *t = tensor_alloc();
    if (!t)
        return NULL;
    t->dtype = base->dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    t->storage = base->storage;
    atomic_fetch_add_explicit(&base->storage->refs, 1, memory_order_relaxed);
    t->device = base->device;
    nb__tensor_finish_geometry(t);
    return t;
}

bool nb__same_shape(const nb_tensor *a, const nb_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

bool nb__view_is_contiguous(const nb_view *v)
{
    if (v->numel == 0)
        return true;
    int64_t expect = (int64_t)nb_dtype_size(v->dtype);
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->strides[d] != expect)
            return false;
        expect *= v->shape[d];
    }
    return true;
}

/* ---- properties ---------------------------------------------------------- */

size_t nb_dtype_size(nb_dtype d)
{
    static const size_t sizes[NB_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1, 1};
    return (unsigned)d < NB_DTYPE_COUNT ? sizes[d] : 0;
}

const char *nb_dtype_name(nb_dtype d)
{
    static const char *names[NB_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "bool", "u8"};
    return (unsigned)d < NB_DTYPE_COUNT ? names[d] : "invalid";
}

nb_dtype nb_tensor_dtype(const nb_tensor *t) { return t ? t->dtype : NB_F32; }
int nb_tensor_ndim(const nb_tensor *t) { return t ? t->ndim : -1; }
int64_t nb_tensor_numel(const nb_tensor *t) { return t ? t->numel : -1; }
bool nb_tensor_is_contiguous(const nb_tensor *t) { return t && t->contiguous; }
const char *nb_tensor_device(const nb_tensor *t) { return t ? t->device->name : ""; }

int64_t nb_tensor_dim(const nb_tensor *t, int i)
{
    if (!t)
        return -1;
    if (i < 0)
        i += t->ndim;
    return i >= 0 && i < t->ndim ? t->shape[i] : -1;
}

int64_t nb_tensor_stride(const nb_tensor *t, int i)
{
    if (!t)
        return 0;
    if (i < 0)
        i += t->ndim;
    return i >= 0 && i < t->ndim ? t->strides[i] : 0;
}

nb_shape nb_tensor_shape(const nb_tensor *t)
{
    nb_shape s = {0, {0}};
    if (t) {
        s.ndim = t->ndim;
        memcpy(s.dims, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    return s;
}

char *nb__shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t n = 0;
    if (size == 0)
        return buf;
    buf[0] = '\0';
    if (ndim < 0 || ndim > NB_MAX_DIMS) { /* never read past an nb_shape's dims */
        snprintf(buf, size, "(a shape of %d dims)", ndim);
        return buf;
    }
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

char *nb_shape_format(nb_shape shape, char *buf, size_t size)
{
    return nb__shape_str(shape.ndim, shape.dims, buf, size);
}

/* ---- reading back --------------------------------------------------------- */

nb_status nb_tensor_read(const nb_tensor *t, void *dst, size_t size)
{
    if (!t)
        return nb_error() ? nb_error() : nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tensor_read: tensor is NULL");
    /* A broadcast view can have more elements than any buffer has bytes. */
    size_t need = 0;
    bool huge = __builtin_mul_overflow((size_t)t->numel, nb_dtype_size(t->dtype), &need);
    if (!dst || huge || size < need) {
        char bytes[32];
        if (huge)
            snprintf(bytes, sizeof bytes, "more than 2^64");
        else
            snprintf(bytes, sizeof bytes, "%zu", need);
        return nb__fail(NB_ERR_INVALID_ARGUMENT,
                        "nb_tensor_read: buffer of %zu bytes is too small for %lld %s elements (%s bytes)", size,
                        (long long)t->numel, nb_dtype_name(t->dtype), bytes);
    }
    if (need == 0)
        return NB_OK;
    if (nb__capture_check(t->device, "nb_tensor_read", "reading a tensor to the host"))
        return nb_error();
    const nb_backend *be = t->device->backend;
    if (t->contiguous)
        return be->copy_to_host(t->device, dst, nb__data(t), need);
    /* Gather the strided view into a contiguous temporary on its device first. */
    nb_tensor *tmp = nb__tensor_new("nb_tensor_read", t->device, t->dtype, t->ndim, t->shape);
    if (!tmp)
        return nb_error();
    nb_view out = nb__view(tmp), in = nb__view(t);
    nb_status st = be->copy(t->device, &out, &in);
    if (st == NB_OK)
        st = be->copy_to_host(t->device, dst, nb__data(tmp), need);
    nb__release(tmp);
    return st;
}

static double element_as_double(nb_dtype d, const void *p)
{
    switch (d) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    case NB_BOOL:
    case NB_U8: return *(const uint8_t *)p;
    case NB_F16: {
        uint16_t h = *(const uint16_t *)p;
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    case NB_BF16: {
        uint32_t bits = (uint32_t)*(const uint16_t *)p << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    default: return NAN;
    }
}

double nb_tensor_get(const nb_tensor *t, int64_t flat)
{
    if (!t) {
        nb__null_input("nb_tensor_get", 0);
        return NAN;
    }
    if (flat < 0 || flat >= t->numel) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "nb_tensor_get: index %lld out of range for %lld elements",
                 (long long)flat, (long long)t->numel);
        return NAN;
    }
    int64_t off = 0, rem = flat;
    for (int i = t->ndim - 1; i >= 0; i--) {
        off += (rem % t->shape[i]) * t->strides[i];
        rem /= t->shape[i];
    }
    if (nb__capture_check(t->device, "nb_tensor_get", "reading a tensor to the host"))
        return NAN;
    unsigned char buf[8];
    size_t es = nb_dtype_size(t->dtype);
    if (t->device->backend->copy_to_host(t->device, buf, (char *)nb__data(t) + off, es) != NB_OK)
        return NAN;
    return element_as_double(t->dtype, buf);
}

double nb_tensor_item(const nb_tensor *t)
{
    if (!t) {
        nb__null_input("nb_tensor_item", 0);
        return NAN;
    }
    if (t->numel != 1) {
        char s[NB_SHAPE_STR_MAX];
        nb__fail(NB_ERR_SHAPE, "nb_tensor_item: tensor of shape %s has %lld elements, not 1",
                 nb__shape_str(t->ndim, t->shape, s, sizeof s), (long long)t->numel);
        return NAN;
    }
    return nb_tensor_get(t, 0);
}
