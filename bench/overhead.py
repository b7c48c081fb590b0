"""PyTorch side of bench/overhead.c: per-op overhead of tiny ops.

Arguments: device ("cpu" or "cuda"), ops per timed batch, timed batches. On
CUDA each batch ends with one torch.cuda.synchronize(). Prints one line per
figure, "name microseconds", or "PyTorch: ..." when PyTorch or the device is
missing."""
import sys

from torch_peer import arg, median_wall, need_torch

torch = need_torch()
DEVICE = arg(1, "cpu", str)
K = arg(2, 1000)  # ops per timed batch
R = arg(3, 200)  # timed batches
cuda = DEVICE == "cuda"
if cuda and not torch.cuda.is_available():
    print("PyTorch: no CUDA device")
    sys.exit(0)
dev = torch.device("cuda:0" if cuda else "cpu")


def sync():
    if cuda:
        torch.cuda.synchronize()


def median_us(fn, per):
    return median_wall(fn, R, max(3, R // 10), 1000.0, per)


torch.set_grad_enabled(True)
x = torch.rand(1, device=dev) + 1
y = torch.rand(1, device=dev) + 1
xg = (torch.rand(1, device=dev) + 1).requires_grad_()
x16 = torch.randn(16, device=dev, requires_grad=True)


def add_plain():
    for _ in range(K):
        x + y
    sync()


def add_taped():
    for _ in range(K):
        xg + y
    sync()


def fwd_bwd():
    for _ in range(K // 10):
        x16.grad = None
        (x16 * x16 + x16).sum().backward()
    sync()


print("version", torch.__version__)
if not cuda:
    print("threads", torch.get_num_threads())
print("add_plain", median_us(add_plain, K))
print("add_taped", median_us(add_taped, K))
print("fwd_bwd", median_us(fwd_bwd, K // 10))
