"""nabla's DLPack exchange beside PyTorch, through ctypes on libnabla: a nabla
tensor handed to torch.from_dlpack (a "dltensor_versioned" capsule made here
from nb_to_dlpack's struct) and a torch tensor taken by nb_from_dlpack (from
torch's versioned capsule) and nb_from_dlpack_unversioned (from
torch.utils.dlpack.to_dlpack's), each side seeing the other's writes in the
same memory, and every deleter run once (nabla's live tensor count back where
it started, torch's storage freed only after nabla let go).

    python3 dlpack_interop.py path/to/libnabla.so

Exits 77 (skipped) where python3 cannot import torch."""
import ctypes
import gc
import sys

try:
    import torch
except ImportError:
    print("dlpack_interop: torch is not installed: skipped")
    sys.exit(77)

lib = ctypes.CDLL(sys.argv[1])
vp, c_double, c_int64 = ctypes.c_void_p, ctypes.c_double, ctypes.c_int64
NB_F64 = 1
for name, res, args in [
    ("nb_arange", vp, [ctypes.c_int, c_double, c_double, c_double]),
    ("nb_tensor_get", c_double, [vp, c_int64]),
    ("nb_tensor_numel", c_int64, [vp]),
    ("nb_release", None, [vp]),
    ("nb_live_tensors", c_int64, []),
    ("nb_to_dlpack", vp, [vp]),
    ("nb_from_dlpack", vp, [vp]),
    ("nb_from_dlpack_unversioned", vp, [vp]),
    ("nb_error_message", ctypes.c_char_p, []),
]:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, args

capi = ctypes.pythonapi
capi.PyCapsule_New.restype = ctypes.py_object
capi.PyCapsule_New.argtypes = [vp, ctypes.c_char_p, vp]
capi.PyCapsule_GetPointer.restype = vp
capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_SetName.restype = ctypes.c_int
capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAILED:", what, "|", lib.nb_error_message().decode(errors="replace"))


class Handed:
    """A nabla tensor offered to torch by the DLPack protocol's methods."""

    def __init__(self, managed):
        self.managed = managed

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return capi.PyCapsule_New(self.managed, b"dltensor_versioned", None)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


live0 = lib.nb_live_tensors()

# nabla -> torch: the same memory
t = lib.nb_arange(NB_F64, 0.0, 6.0, 1.0)  # no scope open: ours to release
check(t, "nb_arange")
m = lib.nb_to_dlpack(t)
check(m, "nb_to_dlpack")
x = torch.from_dlpack(Handed(m))
check(x.dtype == torch.float64 and x.shape == (6,) and x.tolist() == [0, 1, 2, 3, 4, 5], "torch sees nabla's values")
x[2] = 42.0
check(lib.nb_tensor_get(t, 2) == 42.0, "nabla sees torch's write")
lib.nb_release(t)
check(lib.nb_live_tensors() == live0 + 1, "torch's reference keeps the tensor")
y = x.view(2, 3)
del x
gc.collect()
check(lib.nb_live_tensors() == live0 + 1, "a torch view keeps it")
check(y[0, 2].item() == 42.0, "the view reads it")
del y
gc.collect()
check(lib.nb_live_tensors() == live0, "torch let go: the deleter ran once")

# torch -> nabla, versioned: the same memory; torch's storage outlives torch's tensor while nabla holds it
a = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()  # a transposed view: strides (1, 4)
cap = a.__dlpack__(max_version=(1, 0))
ptr = capi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
check(ptr, "torch gave a versioned capsule")
check(capi.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0, "the capsule is consumed")
u = lib.nb_from_dlpack(ptr)
check(u and lib.nb_tensor_numel(u) == 12, "nb_from_dlpack")
check(lib.nb_tensor_get(u, 1) == 4.0, "nabla reads the strided view as torch does")
a[0, 1] = -5.0
check(lib.nb_tensor_get(u, 1) == -5.0, "nabla sees torch's write")
base = a
del a, cap
gc.collect()
check(lib.nb_tensor_get(u, 11) == 11.0, "the memory stays while nabla holds it")
lib.nb_release(u)
check(lib.nb_live_tensors() == live0, "nabla let go")
check(base[3, 2].item() == 11.0, "torch's tensor is intact")

# torch -> nabla, unversioned (torch.utils.dlpack.to_dlpack)
b = torch.arange(5, dtype=torch.int64)
cap = torch.utils.dlpack.to_dlpack(b)
ptr = capi.PyCapsule_GetPointer(cap, b"dltensor")
check(capi.PyCapsule_SetName(cap, b"used_dltensor") == 0, "the capsule is consumed")
v = lib.nb_from_dlpack_unversioned(ptr)
check(v and lib.nb_tensor_get(v, 4) == 4.0, "nb_from_dlpack_unversioned")
b[4] = 9
check(lib.nb_tensor_get(v, 4) == 9.0, "nabla sees torch's write")
lib.nb_release(v)
check(lib.nb_live_tensors() == live0, "no nabla tensor left")

# The GPU, where both have one: nabla's /gpu:0 tensor as torch's cuda:0 tensor and back.
lib.nb_device_count.restype, lib.nb_device_count.argtypes = ctypes.c_int, [ctypes.c_int]
lib.nb_device_push.restype, lib.nb_device_push.argtypes = ctypes.c_int, [ctypes.c_char_p]
lib.nb_device_pop.restype, lib.nb_device_pop.argtypes = ctypes.c_int, []
if torch.cuda.is_available() and lib.nb_device_count(1) > 0:
    lib.nb_device_push(b"/gpu:0")
    t = lib.nb_arange(NB_F64, 0.0, 6.0, 1.0)
    lib.nb_device_pop()
    m = lib.nb_to_dlpack(t)
    check(m, "nb_to_dlpack on /gpu:0")
    handed = Handed(m)
    handed.__dlpack_device__ = lambda: (2, 0)  # kDLCUDA, card 0
    x = torch.from_dlpack(handed)
    check(x.is_cuda and x.tolist() == [0, 1, 2, 3, 4, 5], "torch sees nabla's GPU values")
    x[2] = 42.0
    torch.cuda.synchronize()
    check(lib.nb_tensor_get(t, 2) == 42.0, "nabla sees torch's GPU write")
    lib.nb_release(t)
    del x, handed
    gc.collect()
    check(lib.nb_live_tensors() == live0, "torch let go of the GPU tensor")
    g = torch.arange(4, dtype=torch.float64, device="cuda")
    cap = g.__dlpack__(max_version=(1, 0))
    ptr = capi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    capi.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    u = lib.nb_from_dlpack(ptr)
    check(u and lib.nb_tensor_get(u, 3) == 3.0, "nabla reads torch's GPU tensor")
    lib.nb_release(u)
    check(lib.nb_live_tensors() == live0, "no nabla tensor left")
    print("dlpack_interop: the GPU exchange ran")

print("dlpack_interop: %s" % ("ok" if failures == 0 else "%d failure(s)" % failures))
sys.exit(1 if failures else 0)
