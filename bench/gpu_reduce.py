"""PyTorch side of bench/gpu_reduce.c: the same float32 reductions, argmax and
cumsums on cuda:0.

Arguments: ops per timed batch, timed batches. Prints "version V", then one
"name microseconds" line per case (the median per op, timed with
torch.cuda.Event around each batch), or "PyTorch: ..." when PyTorch or CUDA is
missing."""
import sys

from torch_peer import arg, median_events_ms, need_torch

torch = need_torch(cuda=True)

B = arg(1, 20)  # ops per timed batch
R = arg(2, 20)  # timed batches

torch.set_grad_enabled(False)
dev = torch.device("cuda:0")
g = torch.Generator(device=dev).manual_seed(1)


def uniform(*shape):
    return torch.rand(*shape, device=dev, generator=g) * 2 - 1


square = uniform(4096, 4096)
tall = uniform(60000, 10)
vec = uniform(1 << 24)
cases = [
    ("sum_all", lambda: square.sum()),
    ("sum_last", lambda: square.sum(1)),
    ("sum_first", lambda: square.sum(0)),
    ("argmax0", lambda: tall.argmax(0)),
    ("argmax1", lambda: tall.argmax(1)),
    ("cumsum_last", lambda: square.cumsum(1)),
    ("cumsum_vec", lambda: vec.cumsum(0)),
]


def median_us(fn):
    def batch():
        for _ in range(B):
            fn()

    return median_events_ms(batch, R, B) * 1e3


print("version", torch.__version__)
for name, fn in cases:
    print(name, median_us(fn))
    sys.stdout.flush()
