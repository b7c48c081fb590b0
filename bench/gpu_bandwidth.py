"""PyTorch side of bench/gpu_bandwidth.c: device-memory bandwidth on cuda:0.

Arguments: MiB per tensor, ops per timed batch, timed batches. Prints "version V", then
"copy", "scale", "add", "chain" (median milliseconds per op, timed with
torch.cuda.Event around each batch), or "PyTorch: ..." when PyTorch or CUDA is
missing."""
import sys

from torch_peer import arg, median_events_ms, need_torch

torch = need_torch(cuda=True)

MIB = arg(1, 256)
B = arg(2, 10)  # ops per timed batch
R = arg(3, 30)  # timed batches

torch.set_grad_enabled(False)
dev = torch.device("cuda:0")
n = MIB * (1 << 20) // 4
g = torch.Generator(device=dev).manual_seed(1)
a = torch.rand(n, device=dev, generator=g) * 2 - 1
b = torch.rand(n, device=dev, generator=g) * 2 - 1
c = torch.rand(n, device=dev, generator=g) * 2 - 1


def median_ms(fn):
    return median_events_ms(fn, R, B)


def op_copy():
    for _ in range(B):
        a.clone()  # contiguous, same dtype: one cudaMemcpyAsync


def op_scale():
    for _ in range(B):
        a * 2.0


def op_add():
    for _ in range(B):
        a + b


def op_chain():
    for _ in range(B):
        torch.exp((a + b) * c)


print("version", torch.__version__)
print("copy", median_ms(op_copy))
print("scale", median_ms(op_scale))
print("add", median_ms(op_add))
print("chain", median_ms(op_chain))
sys.stdout.flush()
