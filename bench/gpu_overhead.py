"""PyTorch side of bench/gpu_overhead.c: per-op overhead of tiny ops on cuda:0.

Arguments: ops per timed batch, timed batches. Each batch ends with one
torch.cuda.synchronize(). Prints one line per figure, "name microseconds", or
"PyTorch: ..." when PyTorch or CUDA is missing."""
import statistics
import sys
import time
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

K = int(sys.argv[1]) if len(sys.argv) > 1 else 1000  # ops per timed batch
R = int(sys.argv[2]) if len(sys.argv) > 2 else 200   # timed batches


def median_us(fn, per):
    for _ in range(max(3, R // 10)):  # warm-up
        fn()
    samples = []
    for _ in range(R):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / per / 1000.0)
    return statistics.median(samples)


torch.set_grad_enabled(True)
dev = torch.device("cuda:0")
x = torch.rand(1, device=dev) + 1
y = torch.rand(1, device=dev) + 1


def add_plain():
    for _ in range(K):
        x + y
    torch.cuda.synchronize()


xg = (torch.rand(1, device=dev) + 1).requires_grad_()


def add_taped():
    for _ in range(K):
        xg + y
    torch.cuda.synchronize()


x16 = torch.randn(16, device=dev, requires_grad=True)


def fwd_bwd():
    for _ in range(K // 10):
        x16.grad = None
        (x16 * x16 + x16).sum().backward()
    torch.cuda.synchronize()


print("version", torch.__version__)
print("add_plain", median_us(add_plain, K))
print("add_taped", median_us(add_taped, K))
print("fwd_bwd", median_us(fwd_bwd, K // 10))
sys.stdout.flush()
