/* nabla — tensors to and from other libraries through DLPack 1.x
 * (DLManagedTensorVersioned), without copying: PyTorch, JAX, CuPy, NumPy and
 * any C library that speaks it see the same memory as nabla.
 *
 *     DLManagedTensorVersioned *m = nb_to_dlpack(t);   // hand it over
 *     ...the other library calls m->deleter(m) when it is done...
 *
 *     nb_tensor *u = nb_from_dlpack(theirs);           // take one in
 *
 * The types below are DLPack's ABI (major version 1). They are declared here
 * unless the program included DLPack's own dlpack.h first; including it after
 * this header is harmless (its include guard is this one's). */
#ifndef NABLA_DLPACK_H
#define NABLA_DLPACK_H

#include <nabla/types.h>
#include <stdint.h>

#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3, /* pinned host memory */
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLOpaqueHandle = 3U,
    kDLBfloat = 4U,
    kDLComplex = 5U,
    kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
    uint8_t code;   /* a DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes; /* 1 for a scalar type */
} DLDataType;

typedef struct {
    void *data;           /* the allocation's start; element 0 is at data + byte_offset */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;     /* in elements; NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* The unversioned form (DLPack before 1.0; PyTorch's torch.utils.dlpack.to_dlpack). */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif /* DLPACK_DLPACK_H_ */

#ifdef __cplusplus
extern "C" {
#endif

/* Hands t's memory to another library without copying: returns a
 * DLManagedTensorVersioned (version 1.0, flags 0) describing t as it is
 * (shape, strides in elements, a broadcast dim's stride 0; data is the start
 * of t's storage and byte_offset the place of element 0), on kDLCPU 0 for a
 * CPU device and kDLCUDA <physical GPU> for a GPU (logical GPUs of one card
 * give the same id). The result holds a reference to t: whoever receives it
 * calls its deleter exactly once (from any thread) when done, which releases
 * that reference and frees the struct; t itself stays the caller's. On a GPU,
 * t's device is synchronized first, so the memory holds its values for any
 * stream; the receiver's work on it must be finished before it calls the
 * deleter (nabla may hand the memory out again at once). nabla never writes into a tensor once made (a variable's update
 * writes into its own storage only while nothing else holds it), and the
 * receiver should not either: t, its views and the tapes that recorded it
 * would see the change.
 * Fails, returning NULL, with NB_ERR_INVALID_ARGUMENT for NULL, NB_ERR_DTYPE
 * for a dtype DLPack has no code for (none today), NB_ERR_UNSUPPORTED inside a
 * captured step (nabla/graph.h) or on a device kind DLPack cannot name,
 * NB_ERR_OUT_OF_MEMORY, or the device's error from synchronizing. */
DLManagedTensorVersioned *nb_to_dlpack(nb_tensor *t);

/* Takes in a tensor of another library without copying: returns a new
 * nb_tensor, owned by the current scope, over m's memory, on /cpu:0 for
 * kDLCPU and kDLCUDAHost, on the first nabla GPU device of physical GPU
 * device_id for kDLCUDA and kDLCUDAManaged. The memory must hold its values
 * already (a GPU producer's work on it finished, or ordered before nabla's
 * stream). When the last nabla tensor over it goes, m->deleter(m) is called,
 * once, on whichever thread released it, after the devices of its card have
 * finished nabla's work (a GPU tensor: a wait; not while that thread records
 * a step). A read-only tensor
 * (DLPACK_FLAG_BITMASK_READ_ONLY) is copied instead, and its deleter called
 * before this returns, since nabla may not keep memory it must not write
 * into as a tensor a variable could take over.
 * Takes over m whatever happens: on failure its deleter has been called
 * (none is called for NULL). Returns NULL with NB_ERR_INVALID_ARGUMENT for NULL
 * m, a negative dim, more than NB_MAX_DIMS dims or a NULL shape;
 * NB_ERR_UNSUPPORTED for a major version other than 1 (whose other fields are
 * not read, as DLPack requires), inside a captured step (nabla/graph.h: a
 * replay would outlive the memory), a negative stride, more than one lane or an
 * element not aligned to its size; NB_ERR_DTYPE for a type nabla has no dtype
 * for (the message names its code and bits); NB_ERR_DEVICE for a device
 * nabla has not got (naming its type and id); NB_ERR_OUT_OF_MEMORY. */
nb_tensor *nb_from_dlpack(DLManagedTensorVersioned *m);

/* nb_from_dlpack for the unversioned DLManagedTensor (which has no flags: the
 * memory is taken as writable), with the same results and failures. */
nb_tensor *nb_from_dlpack_unversioned(DLManagedTensor *m);

#ifdef __cplusplus
}
#endif
#endif
