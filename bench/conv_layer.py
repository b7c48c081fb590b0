"""PyTorch side of bench/conv_layer.c: 2-D convolution layers, forward and
forward+backward (the image and the filter gradients), channels-last (NHWC)
f32, at 56x56 with 64 channels: 3x3 64->64, 1x1 64->64, 3x3 depthwise 64.

Usage: conv_layer.py CPU_BATCH GPU_BATCH REPS
Prints "version V", then "cpu.<layer>.<fwd|step> MS" and, with CUDA,
"cuda.<layer>.<fwd|step> MS" (median milliseconds), or "PyTorch: not installed"."""
import sys

from torch_peer import arg, median_wall, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402 - after need_torch has found torch

CPU_BATCH = arg(1, 8)
GPU_BATCH = arg(2, 32)
R = arg(3, 10)
WARM = 3
LAYERS = [("3x3", 3, 1), ("1x1", 1, 1), ("dw3x3", 3, 64)]  # name, kernel, groups


def bench(device, batch, k, groups):
    g = torch.Generator().manual_seed(1)
    cl = torch.channels_last
    x = torch.rand(batch, 64, 56, 56, generator=g).to(device).to(memory_format=cl)
    w = (torch.rand(64, 64 // groups, k, k, generator=g) - 0.5).to(device).to(memory_format=cl)
    gy = torch.rand(batch, 64, 56, 56, generator=g).to(device).to(memory_format=cl)
    cuda = device == "cuda"

    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, padding=k // 2, groups=groups)
        if cuda:
            torch.cuda.synchronize()

    xr = x.detach().requires_grad_()
    wr = w.detach().requires_grad_()

    def step():
        y = F.conv2d(xr, wr, padding=k // 2, groups=groups)
        xr.grad = None
        wr.grad = None
        y.backward(gy)
        if cuda:
            torch.cuda.synchronize()

    return [median_wall(fn, R, WARM, 1e6) for fn in (fwd, step)]


print("version", torch.__version__)
for name, k, groups in LAYERS:
    f, s = bench("cpu", CPU_BATCH, k, groups)
    print(f"cpu.{name}.fwd", f)
    print(f"cpu.{name}.step", s)
    sys.stdout.flush()
if torch.cuda.is_available():
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    for name, k, groups in LAYERS:
        f, s = bench("cuda", GPU_BATCH, k, groups)
        print(f"cuda.{name}.fwd", f)
        print(f"cuda.{name}.step", s)
