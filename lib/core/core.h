/* nabla internal — the runtime core: tensors, storage, devices, errors, scopes.
 * Included by lib/, ops/, tape/ and gpu/; never installed. */
#ifndef NB_CORE_H
#define NB_CORE_H

#include <nabla/nabla.h>
#include <stdarg.h>
#include <stdatomic.h>

/* NB_ASAN: 1 when AddressSanitizer instruments this build. Pools and caches are
 * off then, so a use after release is caught. gcc says so with a macro, clang
 * with __has_feature. */
#if defined(__SANITIZE_ADDRESS__)
#define NB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NB_ASAN 1
#endif
#endif
#ifndef NB_ASAN
#define NB_ASAN 0
#endif

typedef struct nb_device nb_device;
typedef struct nb_backend nb_backend;

/* ---- storage and tensors --------------------------------------------------- */

/* Drops one reference from refs; true when it was the last, and the object
 * is the caller's to free. A sole holder (refs 1) needs no locked
 * instruction: no other thread holds a reference, so none can add one (a
 * reference is only ever copied from one held), and the acquire load orders
 * the free after the other holders' earlier drops. */
#ifndef __CUDACC__ /* C alone: nvcc's C++ spells the atomics otherwise */
static inline bool nb__drop_ref(atomic_int *refs)
{
    return atomic_load_explicit(refs, memory_order_acquire) == 1 ||
           atomic_fetch_sub_explicit(refs, 1, memory_order_acq_rel) == 1;
}
#endif

/* A reference-counted block of device memory; views share one. */
typedef struct nb_storage {
    atomic_int refs;
    void *data;
    size_t nbytes;
    nb_device *device;
    struct nb_storage *next_free; /* free-list link while pooled */
    /* memory another owner keeps (nb__storage_wrap): never the backend's to
     * free; release(release_ctx), when set, tells the owner it is let go */
    bool external;
    void (*release)(void *ctx);
    void *release_ctx;
    /* Set only while a step is recorded (capture.h, nb__capture_mark_stale):
     * the recording rewrote this memory in place while this storage's holders
     * kept the values from before; reaching its data tells the recording.
     * Read and written with __atomic builtins (this header is C++ too). */
    bool stale;
} nb_storage;

struct nb_tensor {
    atomic_int refs;
    nb_dtype dtype;
    int ndim;
    bool contiguous;     /* row-major with no gaps, from element 0 */
    int64_t numel;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS]; /* in bytes; 0 on broadcast dims */
    int64_t offset;      /* byte offset of element 0 in storage */
    nb_storage *storage;
    nb_device *device;
    uint64_t id;         /* unique for the process's lifetime; tapes key on it */
    struct nb_tensor *next_free;
};

/* A stale storage's data was reached (capture.c): the recording running on
 * this thread, if any, notes that it must be recorded again without writing
 * variables in place. */
void nb__stale_reached(void);

/* Pointer to element 0. Every kernel's view of a tensor comes through here. */
static inline void *nb__data(const nb_tensor *t)
{
    if (__builtin_expect(__atomic_load_n(&t->storage->stale, __ATOMIC_RELAXED), 0))
        nb__stale_reached();
    return (char *)t->storage->data + t->offset;
}

/* A plain description of a strided array for kernels: no ownership, no device. */
/* Bit masks of dtypes an op accepts. */
#define NB_MASK(d) (1u << (d))
#define NB_FLOATS (NB_MASK(NB_F32) | NB_MASK(NB_F64) | NB_MASK(NB_F16) | NB_MASK(NB_BF16))
#define NB_INTS (NB_MASK(NB_I32) | NB_MASK(NB_I64))
#define NB_NUMERIC (NB_FLOATS | NB_INTS)
#define NB_ALL_DTYPES (NB_NUMERIC | NB_MASK(NB_BOOL) | NB_MASK(NB_U8))

typedef struct nb_view {
    void *data;
    nb_dtype dtype;
    int ndim;
    bool contiguous;
    int64_t numel;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS]; /* bytes */
} nb_view;

/* The kernel view of a tensor, as it is, and of t broadcast to shape (ndim >=
 * t's; stride 0 on new dims): inline below, after nb__shape_numel. */
static inline nb_view nb__view(const nb_tensor *t);
static inline nb_view nb__view_broadcast(const nb_tensor *t, int ndim, const int64_t *shape);

/* Whether a view (say, of part of a tensor) is row-major with no gaps. */
bool nb__view_is_contiguous(const nb_view *v);

/* A new contiguous tensor with uninitialised storage on dev, not owned by any
 * scope (refs = 1). NULL and an error naming who (the op or function it is for)
 * on failure: NB_ERR_INVALID_ARGUMENT for a bad ndim or a negative dim,
 * NB_ERR_DTYPE for a dtype dev cannot hold, NB_ERR_OUT_OF_MEMORY for a size
 * past what any device can hold or that dev has not got. */
nb_tensor *nb__tensor_new(const char *who, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape);
/* A tensor (refs = 1, not scoped) over storage s with the given geometry
 * (byte strides, byte offset), taking over the caller's reference to s; on
 * failure (NULL, NB_ERR_OUT_OF_MEMORY) s is released. The geometry is the
 * caller's to check against s. */
nb_tensor *nb__tensor_on_storage(nb_storage *s, nb_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t offset);
/* A view of base's storage with the given geometry (refs = 1, not scoped). */
nb_tensor *nb__tensor_view(const nb_tensor *base, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset);
/* Reference counting without scopes. */
void nb__retain(nb_tensor *t);
void nb__release(nb_tensor *t);
/* Hands a fresh reference to the current scope (or the caller) and returns t. */
nb_tensor *nb__own(nb_tensor *t);

/* Whether a and b have the same dims (dtype and strides aside). */
bool nb__same_shape(const nb_tensor *a, const nb_tensor *b);
/* Recomputes numel and the contiguous flag from shape and strides. */
void nb__tensor_finish_geometry(nb_tensor *t);
/* Row-major byte strides for a shape. */
void nb__contiguous_strides(int ndim, const int64_t *shape, size_t elem, int64_t *strides);
/* Elements of a shape: 0 when a dim is 0 (whatever the others), -1 when a dim
 * is negative or the count overflows int64. */
int64_t nb__shape_numel(int ndim, const int64_t *shape);

/* Inline, so the caller's view is filled in place: returned from a call, the
 * 168-byte struct was built on the callee's stack and copied, unused dims and
 * all, which cost an eager op more than filling it. Only the first ndim dims
 * are set. */
static inline nb_view nb__view(const nb_tensor *t)
{
    nb_view v;
    v.data = nb__data(t);
    v.dtype = t->dtype;
    v.ndim = t->ndim;
    v.contiguous = t->contiguous;
    v.numel = t->numel;
    for (int i = 0; i < t->ndim; i++) {
        v.shape[i] = t->shape[i];
        v.strides[i] = t->strides[i];
    }
    return v;
}

static inline nb_view nb__view_broadcast(const nb_tensor *t, int ndim, const int64_t *shape)
{
    nb_view v;
    v.data = nb__data(t);
    v.dtype = t->dtype;
    v.ndim = ndim;
    int lead = ndim - t->ndim;
    bool same = lead == 0;
    for (int i = 0; i < ndim; i++) {
        v.shape[i] = shape[i];
        if (i < lead) {
            v.strides[i] = 0;
        } else {
            int j = i - lead;
            bool bcast = t->shape[j] == 1 && shape[i] != 1;
            v.strides[i] = bcast ? 0 : t->strides[j];
            same = same && !bcast;
        }
    }
    v.numel = nb__shape_numel(ndim, shape);
    v.contiguous = same && t->contiguous;
    return v;
}
/* Whether who may make a tensor of dtype and shape (dims known to be >= 0):
 * every tensor's dims, a zero dim counted as 1, times its element size fit in
 * int64, so no stride or offset of it or of its views can overflow, even when
 * it is empty. False with an error naming who, the shape and the dtype
 * otherwise: NB_ERR_OUT_OF_MEMORY when who allocates and the real size is past
 * int64 (no device holds it), else NB_ERR_INVALID_ARGUMENT (a view, or an empty
 * tensor whose other dims alone are too large). */
bool nb__shape_fits(const char *who, bool allocates, nb_dtype dtype, int ndim, const int64_t *shape);
/* Whether NB_DEBUG_POISON=1 is set: every new tensor is filled (NaN, or a large
 * odd integer) on its device before anything writes it. A backend whose copies
 * run on a stream of their own must order them after that fill. */
bool nb__debug_poison(void);
/* "[2, 3]" of a tensor or shape into buf; returns buf. */
char *nb__shape_str(int ndim, const int64_t *shape, char *buf, size_t size);
#define NB_SHAPE_STR_MAX 128

static inline bool nb__is_floating(nb_dtype d) {
    return d == NB_F32 || d == NB_F64 || d == NB_F16 || d == NB_BF16;
}
static inline bool nb__is_integer(nb_dtype d) {
    return d == NB_I32 || d == NB_I64 || d == NB_U8 || d == NB_BOOL;
}

/* ---- errors and logging ---------------------------------------------------- */

/* Records an error (kept only when none is pending), calls the handler, returns
 * code. The message should start with the op or function name. */
nb_status nb__fail(nb_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, returning NULL, for pointer-returning functions. */
void *nb__fail_null(nb_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* For an op given a NULL input: keeps a pending error, or records
 * NB_ERR_INVALID_ARGUMENT "<op>: input <i> is NULL". Returns NULL. */
void *nb__null_input(const char *op, int index);
void nb__log(nb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define NB_ERROR_MESSAGE_MAX 1024
/* A thread's pending error set aside while the thread does other work (a
 * mirrored strategy runs replica 0 on the caller's thread): stash moves it out
 * and clears it; unstash makes it pending again, ahead of any error raised
 * since, without calling the handler. */
/* Names what the calling thread is doing for errors recorded until it is
 * restored: each message then starts "who: " (the op a low-level failure, such
 * as an allocator's, happened for). Returns the previous context to restore;
 * NULL clears it. */
const char *nb__error_context(const char *who);

typedef struct nb_error_saved {
    nb_status code;
    char message[NB_ERROR_MESSAGE_MAX];
} nb_error_saved;
void nb__error_stash(nb_error_saved *out);
void nb__error_unstash(const nb_error_saved *in);
/* Puts back exactly what nb__error_stash saved, dropping any error raised
 * since: for a step whose failure is not the caller's (a cleanup, an
 * optional compile). */
void nb__error_restore(const nb_error_saved *in);

/* ---- devices --------------------------------------------------------------- */

struct nb_device {
    nb_device_kind kind;
    int index;        /* among devices of its kind: /gpu:<index> */
    int physical;     /* the physical GPU ordinal (logical GPUs share one) */
    char name[24];    /* "/gpu:1" */
    const nb_backend *backend;
    void *ctx;        /* the backend's own state: streams, handles, allocator */
};

/* The device ops run on now: the top of the thread's stack, or NULL when empty. */
nb_device *nb__device_pushed(void);
/* The device creation functions use: pushed or /cpu:0. */
nb_device *nb__device_default(void);
nb_device *nb__device_cpu0(void);
/* Finds a device by name; NULL and NB_ERR_DEVICE when unknown or malformed. */
nb_device *nb__device_find(const char *name, const char *who);
/* The same with soft placement, as nb_device_push resolves names: a missing
 * device is /cpu:0 with a one-line warning unless placement is strict. Errors
 * name who. */
nb_device *nb__device_resolve(const char *name, const char *who);
bool nb__log_placement_enabled(void);
/* Waits for every device of dev's kind on dev's physical card (a GPU's
 * logical devices share its memory): NB_OK, or the first failure recorded. */
nb_status nb__device_synchronize_card(nb_device *dev);
/* Whether soft placement is on (nb_set_soft_placement). */
bool nb__soft_placement(void);

/* ---- storage allocation ------------------------------------------------------ */

/* Storage of nbytes on dev (refs = 1); NULL and NB_ERR_OUT_OF_MEMORY. */
nb_storage *nb__storage_new(nb_device *dev, size_t nbytes);
void nb__storage_release(nb_storage *s);
/* Storage (refs = 1) over nbytes of memory at data on dev that another owner
 * keeps (nabla/dlpack.h): when its last reference goes, release(ctx) is
 * called, once, if not NULL, and the backend frees nothing. NULL and
 * NB_ERR_OUT_OF_MEMORY (release is then not called). */
nb_storage *nb__storage_wrap(nb_device *dev, void *data, size_t nbytes, void (*release)(void *ctx), void *ctx);

/* Filled tensors on a given device, owned by the current scope (lib/core/create.c). */
nb_tensor *nb__full_on(const char *who, nb_device *dev, nb_dtype dtype, int ndim, const int64_t *shape,
                       double value);
nb_tensor *nb__scalar_on(const char *who, nb_device *dev, nb_dtype dtype, double value);

/* ---- scopes ------------------------------------------------------------------ */

/* The frame behind an open scope (lib/core/scope.c); handles are not frames. */
typedef struct nb__scope_frame nb__scope_frame;
/* Registers obj with the current scope, which calls destroy(obj) as it ends
 * (before releasing its tensors). Returns the owning frame, or NULL when no
 * scope is open or host memory ran out (obj is then the caller's to free). */
nb__scope_frame *nb__scope_adopt(void *obj, void (*destroy)(void *obj));
/* Forgets obj, which its owner freed early; harmless once the scope has ended. */
void nb__scope_forget(nb__scope_frame *owner, const void *obj);

/* Logs "op on device" when device placement logging is on. */
void nb__log_op(const char *op, const nb_device *dev);

uint64_t nb__next_tensor_id(void);

/* ---- replicas ----------------------------------------------------------------- */

/* Marks the calling thread as running replica index of the strategy with the
 * given id (lib/distribute), until nb__replica_leave. */
void nb__replica_enter(uint64_t strategy, int index);
void nb__replica_leave(void);
/* The replica of that strategy the calling thread runs; -1 when none. */
int nb__replica_of(uint64_t strategy);
/* The id of the strategy the calling thread runs a replica of; 0 when none. */
uint64_t nb__replica_strategy(void);
/* A new strategy id (1, 2, ...), unique for the process's life: the mirrored
 * strategy and the asynchronous trainer draw from the one counter. */
uint64_t nb__replica_owner_new(void);

/* ---- threads ---------------------------------------------------------------- */

/* Makes sure the calling thread's caches (pooled tensors and storage headers,
 * spare scopes) are freed when it exits. Cheap after the first call. */
void nb__thread_track(void);
/* Each frees its part of the calling thread's caches (called at thread exit;
 * nb__tensor_pool_drain also hands its count of live tensors over). */
void nb__tensor_pool_drain(void);
void nb__storage_pool_drain(void);
void nb__scope_spares_drain(void);
/* Adds fn to what a tracked thread runs as it exits, before the core's own
 * drains: for the rooms above the core that keep per-thread caches (the
 * tape's spare buffers). At most NB_THREAD_EXIT_HOOKS of them; registering one
 * twice runs it once. Returns false when the list is full (fn then never
 * runs, and the caller should not cache). Thread-safe. */
enum { NB_THREAD_EXIT_HOOKS = 4 };
bool nb__thread_exit_hook(void (*fn)(void));

/* Runs fn(ctx, begin, end) over [0, n) in chunks of at least grain, on the pool's
 * threads and the caller; returns when all are done. Runs inline when n < 2*grain
 * or the pool has one thread. */
typedef void (*nb_range_fn)(void *ctx, int64_t begin, int64_t end);
void nb__parallel_for(int64_t n, int64_t grain, nb_range_fn fn, void *ctx);
int nb__thread_count(void);
/* Marks the calling thread serial: its kernels run on it alone (parallel loops
 * inline, matmul without BLAS threads). For threads that together already keep
 * every core busy, like the replicas of a mirrored strategy on CPU devices. */
void nb__thread_set_serial(bool on);
bool nb__thread_serial(void);

#endif
