"""PyTorch side of bench/gpu_reduce.c: the same float32 reductions, argmax and
cumsums on cuda:0.

Arguments: ops per timed batch, timed batches. Prints "version V", then one
"name microseconds" line per case (the median per op, timed with
torch.cuda.Event around each batch), or "PyTorch: ..." when PyTorch or CUDA is
missing."""
import statistics
import sys
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
except Exception:  # ImportError, or a broken install
    print("PyTorch: not installed")
    sys.exit(0)
if not torch.cuda.is_available():
    print("PyTorch: no CUDA device")
    sys.exit(0)

B = int(sys.argv[1]) if len(sys.argv) > 1 else 20  # ops per timed batch
R = int(sys.argv[2]) if len(sys.argv) > 2 else 20  # timed batches

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

    for _ in range(3):  # warm-up
        batch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(R):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        batch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / B * 1e3)
    return statistics.median(samples)


print("version", torch.__version__)
for name, fn in cases:
    print(name, median_us(fn))
    sys.stdout.flush()
