"""PyTorch side of bench/cpu_reduce.c: sums and maxima of f32 CPU tensors over rows,
columns and all, eager. Argument: timed repetitions. Prints "name milliseconds" lines."""
from torch_peer import arg, median_wall, need_torch

torch = need_torch()
R = arg(1, 30)
torch.set_grad_enabled(False)
x = torch.randn(4096, 1024)
tall = torch.randn(100352, 64)

print("version", torch.__version__)
print("threads", torch.get_num_threads())
print("sum0", median_wall(lambda: x.sum(0), R, 2, 1e6))
print("sum1", median_wall(lambda: x.sum(1), R, 2, 1e6))
print("sum_all", median_wall(lambda: x.sum(), R, 2, 1e6))
print("max0", median_wall(lambda: x.amax(0), R, 2, 1e6))
print("max1", median_wall(lambda: x.amax(1), R, 2, 1e6))
print("sum0_tall", median_wall(lambda: tall.sum(0), R, 2, 1e6))
