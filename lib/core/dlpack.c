/* nabla — DLPack exchange (nabla/dlpack.h): a tensor handed out holds a
 * reference that the receiver's deleter call releases; a tensor taken in is a
 * tensor over storage whose release calls the producer's deleter. Neither
 * copies, except a read-only tensor taken in. */
#include "lib/core/backend.h"
#include "lib/core/capture.h"
#include "lib/core/core.h"

#include <nabla/dlpack.h>
#include <stdlib.h>
#include <string.h>

/* ---- dtypes and devices -------------------------------------------------------- */

static const struct {
    nb_dtype dtype;
    uint8_t code, bits;
} dtype_codes[] = {
    {NB_F32, kDLFloat, 32}, {NB_F64, kDLFloat, 64}, {NB_F16, kDLFloat, 16}, {NB_BF16, kDLBfloat, 16},
    {NB_I32, kDLInt, 32},   {NB_I64, kDLInt, 64},   {NB_BOOL, kDLBool, 8},  {NB_U8, kDLUInt, 8},
};
#define N_CODES (sizeof dtype_codes / sizeof dtype_codes[0])
_Static_assert(N_CODES == NB_DTYPE_COUNT, "every dtype has a DLPack code");

static bool dtype_from_code(DLDataType t, nb_dtype *out)
{
    for (size_t i = 0; i < N_CODES; i++)
        if (dtype_codes[i].code == t.code && dtype_codes[i].bits == t.bits) {
            *out = dtype_codes[i].dtype;
            return true;
        }
    return false;
}

static const char *device_type_name(DLDeviceType t)
{
    switch (t) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    case kDLROCM: return "kDLROCM";
    case kDLOneAPI: return "kDLOneAPI";
    case kDLMetal: return "kDLMetal";
    case kDLVulkan: return "kDLVulkan";
    case kDLOpenCL: return "kDLOpenCL";
    default: return "device type";
    }
}

/* The nabla device for a DLPack one: host memory is /cpu:0's; a CUDA card's
 * is the first nabla GPU on it. NULL and NB_ERR_DEVICE when there is none. */
static nb_device *device_for(DLDevice d, const char *who)
{
    if (d.device_type == kDLCPU || d.device_type == kDLCUDAHost)
        return nb__device_cpu0();
    if (d.device_type == kDLCUDA || d.device_type == kDLCUDAManaged) {
        int n = nb_device_count(NB_DEVICE_GPU);
        for (int i = 0; i < n; i++) {
            nb_device *dev = nb__device_find(nb_device_name(NB_DEVICE_GPU, i), who);
            if (dev && dev->physical == d.device_id)
                return dev;
        }
        nb_error_clear(); /* a lookup's miss: the error below says more */
    }
    return nb__fail_null(NB_ERR_DEVICE, "%s: %s %d: nabla has no such device (%d GPUs)", who,
                         device_type_name(d.device_type), (int)d.device_id, nb_device_count(NB_DEVICE_GPU));
}

/* ---- handing out --------------------------------------------------------------- */

typedef struct exported {
    DLManagedTensorVersioned m;
    nb_tensor *t;
    int64_t shape[NB_MAX_DIMS], strides[NB_MAX_DIMS];
} exported;

static void exported_delete(DLManagedTensorVersioned *m)
{
    exported *e = m->manager_ctx;
    nb__release(e->t);
    free(e);
}

DLManagedTensorVersioned *nb_to_dlpack(nb_tensor *t)
{
    const char *who = "nb_to_dlpack";
    if (!t)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the tensor is NULL", who);
    nb_device *dev = t->device;
    if (nb__capture_check(dev, who, "handing memory to another library"))
        return NULL;
    DLDevice where;
    if (dev->kind == NB_DEVICE_CPU)
        where = (DLDevice){kDLCPU, 0};
    else if (dev->kind == NB_DEVICE_GPU)
        where = (DLDevice){kDLCUDA, dev->physical};
    else
        return nb__fail_null(NB_ERR_UNSUPPORTED, "%s: DLPack cannot name device %s", who, dev->name);
    if (dev->kind == NB_DEVICE_GPU && dev->backend->synchronize(dev))
        return NULL;
    exported *e = calloc(1, sizeof *e);
    if (!e)
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    const int64_t elem = (int64_t)nb_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        e->shape[i] = t->shape[i];
        e->strides[i] = t->strides[i] / elem;
    }
    nb__retain(t);
    e->t = t;
    e->m = (DLManagedTensorVersioned){
        .version = {1, 0},
        .manager_ctx = e,
        .deleter = exported_delete,
        .flags = 0,
        .dl_tensor = {.data = t->storage->data,
                      .device = where,
                      .ndim = t->ndim,
                      .dtype = {dtype_codes[t->dtype].code, dtype_codes[t->dtype].bits, 1},
                      .shape = e->shape,
                      .strides = e->strides,
                      .byte_offset = (uint64_t)t->offset},
    };
    return &e->m;
}

/* ---- taking in ----------------------------------------------------------------- */

/* Who to tell when nabla is done with the memory: the versioned or the
 * unversioned deleter; dev, the device the memory was taken in on. */
typedef struct producer {
    DLManagedTensorVersioned *versioned;
    DLManagedTensor *unversioned;
    nb_device *dev;
} producer;

/* Calls the producer's deleter, if it gave one. */
static void producer_tell(const producer *p)
{
    if (p->versioned && p->versioned->deleter)
        p->versioned->deleter(p->versioned);
    if (p->unversioned && p->unversioned->deleter)
        p->unversioned->deleter(p->unversioned);
}

/* The last tensor over taken-in memory went: kernels queued on the card may
 * still use it, and the producer may hand it out at once (its stream knows
 * nothing of nabla's), so the card is waited for first. Not while this thread
 * records a step, which runs nothing and cannot wait. */
static void producer_done(void *ctx)
{
    producer *p = ctx;
    if (p->dev && p->dev->kind != NB_DEVICE_CPU && !nb__capture_current() &&
        nb__device_synchronize_card(p->dev) != NB_OK)
        nb__log(NB_LOG_WARNING, "dlpack: waiting for %s before letting its memory go failed: %s", p->dev->name,
                nb_error_message());
    producer_tell(p);
    free(p);
}

/* A heap copy of who_made_it, for the storage to tell later. Returns NULL
 * (error recorded) when its tensor is NULL, or when out of host memory, having
 * then told the producer at once (its tensor is let go either way). */
static producer *producer_new(const char *who, producer who_made_it)
{
    if (!who_made_it.versioned && !who_made_it.unversioned)
        return nb__fail_null(NB_ERR_INVALID_ARGUMENT, "%s: the tensor is NULL", who);
    producer *p = malloc(sizeof *p);
    if (!p) {
        producer_tell(&who_made_it);
        return nb__fail_null(NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", who);
    }
    *p = who_made_it;
    return p;
}

/* The bytes from data to one past the last element (0 when empty); false when
 * a stride is negative or the sum passes what memory can hold. */
static bool span_bytes(const DLTensor *dl, const int64_t *strides, int64_t elem, uint64_t *out)
{
    uint64_t last = 0; /* the last element's index, in elements */
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] == 0) {
            *out = 0;
            return true;
        }
        if (strides[i] < 0)
            return false;
        uint64_t step = (uint64_t)(dl->shape[i] - 1);
        if (strides[i] && step > (UINT64_MAX / 2 - last) / (uint64_t)strides[i])
            return false;
        last += step * (uint64_t)strides[i];
    }
    if (last >= (uint64_t)INT64_MAX / (uint64_t)elem)
        return false;
    *out = (last + 1) * (uint64_t)elem;
    return true;
}

/* The tensor over dl's memory, or a copy (read_only); p is told when nabla is
 * done, and at once on failure or after a copy. */
static nb_tensor *take_in(const char *who, const DLTensor *dl, bool read_only, producer *p)
{
    nb_tensor *result = NULL;
    char dims[NB_SHAPE_STR_MAX] = "";
    if (dl->ndim < 0 || dl->ndim > NB_MAX_DIMS || (dl->ndim > 0 && !dl->shape)) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: %d dims%s (0 to %d, with a shape)", who, (int)dl->ndim,
                 dl->ndim > 0 && !dl->shape ? " and no shape" : "", NB_MAX_DIMS);
        goto done;
    }
    nb__shape_str(dl->ndim, dl->shape, dims, sizeof dims);
    for (int i = 0; i < dl->ndim; i++)
        if (dl->shape[i] < 0) {
            nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: shape %s has a negative dim", who, dims);
            goto done;
        }
    nb_dtype dtype;
    if (dl->dtype.lanes != 1) {
        nb__fail(NB_ERR_UNSUPPORTED, "%s: %d lanes per element (vector types are not taken)", who,
                 (int)dl->dtype.lanes);
        goto done;
    }
    if (!dtype_from_code(dl->dtype, &dtype)) {
        nb__fail(NB_ERR_DTYPE, "%s: DLPack type code %d with %d bits has no nabla dtype", who, (int)dl->dtype.code,
                 (int)dl->dtype.bits);
        goto done;
    }
    nb_device *dev = device_for(dl->device, who);
    if (!dev)
        goto done;
    /* a replay would read memory the producer has taken back by then */
    if (nb__capture_check(dev, who, "taking in another library's memory"))
        goto done;
    if (!(dev->backend->dtypes & (1u << dtype))) {
        nb__fail(NB_ERR_DTYPE, "%s: dtype %s is not supported on %s", who, nb_dtype_name(dtype), dev->name);
        goto done;
    }
    const int64_t elem = (int64_t)nb_dtype_size(dtype);
    int64_t strides[NB_MAX_DIMS], row_major = 1;
    for (int i = dl->ndim - 1; i >= 0; i--) { /* no overflow: span_bytes checks the extent */
        strides[i] = dl->strides ? dl->strides[i] : row_major;
        row_major = dl->shape[i] > 1 && row_major <= INT64_MAX / dl->shape[i] ? row_major * dl->shape[i] : row_major;
    }
    uint64_t span;
    if (!span_bytes(dl, strides, elem, &span)) {
        nb__fail(NB_ERR_UNSUPPORTED, "%s: shape %s with those strides (a negative one, or past 2^63 bytes) is "
                 "not taken", who, dims);
        goto done;
    }
    if (!dl->data && span) {
        nb__fail(NB_ERR_INVALID_ARGUMENT, "%s: shape %s of %s with no data", who, dims, nb_dtype_name(dtype));
        goto done;
    }
    if (dl->byte_offset > (uint64_t)INT64_MAX - span || ((uintptr_t)dl->data + dl->byte_offset) % (uint64_t)elem) {
        nb__fail(NB_ERR_UNSUPPORTED, "%s: element 0 at %p + %llu is not aligned to the %lld bytes of %s", who,
                 dl->data, (unsigned long long)dl->byte_offset, (long long)elem, nb_dtype_name(dtype));
        goto done;
    }
    int64_t byte_strides[NB_MAX_DIMS];
    for (int i = 0; i < dl->ndim; i++) /* span_bytes bounds the rest; a size-1 dim's stride steps nowhere */
        byte_strides[i] = span && dl->shape[i] > 1 ? strides[i] * elem : 0;

    /* Writable memory: the storage tells the producer when the last tensor
     * over it goes. Read-only memory: copied below, and let go here. */
    nb_storage *s = nb__storage_wrap(dev, dl->data, (size_t)(dl->byte_offset + span),
                                     read_only ? NULL : producer_done, p);
    if (!s)
        goto done;
    if (!read_only) {
        p->dev = dev;
        p = NULL;
    }
    nb_tensor *t = nb__tensor_on_storage(s, dtype, dl->ndim, dl->shape, byte_strides, (int64_t)dl->byte_offset);
    if (!t)
        goto done;
    if (!read_only)
        return nb__own(t);
    /* A read-only tensor: copied into memory of nabla's own, then let go. */
    nb_tensor *copy = nb__tensor_new(who, dev, dtype, dl->ndim, dl->shape);
    if (copy) {
        nb_view out = nb__view(copy), in = nb__view(t);
        nb_status st = dev->backend->copy(dev, &out, &in);
        if (!st && dev->kind != NB_DEVICE_CPU)
            st = dev->backend->synchronize(dev);
        if (st) {
            nb__release(copy);
            copy = NULL;
        }
    }
    nb__release(t);
    if (copy)
        result = nb__own(copy);
done:
    if (p)
        producer_done(p);
    return result;
}

nb_tensor *nb_from_dlpack(DLManagedTensorVersioned *m)
{
    const char *who = "nb_from_dlpack";
    producer *p = producer_new(who, (producer){.versioned = m});
    if (!p)
        return NULL;
    if (m->version.major != 1) {
        unsigned major = m->version.major, minor = m->version.minor;
        producer_done(p);
        return nb__fail_null(NB_ERR_UNSUPPORTED, "%s: DLPack version %u.%u (nabla takes 1.x)", who, major, minor);
    }
    return take_in(who, &m->dl_tensor, (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, p);
}

nb_tensor *nb_from_dlpack_unversioned(DLManagedTensor *m)
{
    const char *who = "nb_from_dlpack_unversioned";
    producer *p = producer_new(who, (producer){.unversioned = m});
    if (!p)
        return NULL;
    return take_in(who, &m->dl_tensor, false, p);
}
