"""PyTorch side of bench/gpu_bandwidth.c: device-memory bandwidth on cuda:0.

Arguments: MiB per tensor, ops per timed batch, timed batches. Prints "version V", then
"copy", "scale", "add", "chain" (median milliseconds per op, timed with
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

MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 256
B = int(sys.argv[2]) if len(sys.argv) > 2 else 10  # ops per timed batch
R = int(sys.argv[3]) if len(sys.argv) > 3 else 30  # timed batches

torch.set_grad_enabled(False)
dev = torch.device("cuda:0")
n = MIB * (1 << 20) // 4
g = torch.Generator(device=dev).manual_seed(1)
a = torch.rand(n, device=dev, generator=g) * 2 - 1
b = torch.rand(n, device=dev, generator=g) * 2 - 1
c = torch.rand(n, device=dev, generator=g) * 2 - 1


def median_ms(fn):
    for _ in range(3):  # warm-up
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(R):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / B)
    return statistics.median(samples)


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
