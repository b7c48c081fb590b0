"""PyTorch side of bench/norm.c: layer_norm over the last axis of [64, 512]
and [4096, 768] f32 with weight and bias, forward and forward+backward (the
input, weight and bias gradients), and batch_norm in inference mode on
[32, 64, 28, 28] channels-last (NHWC) f32.

Usage: norm.py REPS
Prints "version V", then "cpu.<case>.<fwd|step> MS" and, with CUDA,
"cuda.<case>.<fwd|step> MS" (median milliseconds), or "PyTorch: not installed"."""
import sys

from torch_peer import arg, median_synced_ms, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402 - after need_torch has found torch

R = arg(1, 20)
WARM = 3
LN = [("ln64x512", 64, 512), ("ln4096x768", 4096, 768)]  # name, rows, dim


def median_ms(fn, cuda):
    return median_synced_ms(fn, R, WARM, cuda)


def bench_ln(device, rows, dim):
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(rows, dim, generator=g) * 5 - 2).to(device)
    w = (torch.rand(dim, generator=g) + 0.5).to(device)
    b = (torch.rand(dim, generator=g) * 2 - 1).to(device)
    gy = (torch.rand(rows, dim, generator=g) * 2 - 1).to(device)
    cuda = device == "cuda"

    def fwd():
        with torch.no_grad():
            F.layer_norm(x, (dim,), w, b, 1e-5)

    xr, wr, br = (t.detach().requires_grad_() for t in (x, w, b))

    def step():
        y = F.layer_norm(xr, (dim,), wr, br, 1e-5)
        xr.grad = wr.grad = br.grad = None
        y.backward(gy)

    return median_ms(fwd, cuda), median_ms(step, cuda)


def bench_bn(device):
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(32, 64, 28, 28, generator=g) * 5 - 2).to(device).to(memory_format=torch.channels_last)
    w = (torch.rand(64, generator=g) + 0.5).to(device)
    b = (torch.rand(64, generator=g) * 2 - 1).to(device)
    m = (torch.rand(64, generator=g) * 2 - 1).to(device)
    v = (torch.rand(64, generator=g) * 1.5 + 0.5).to(device)

    def fwd():
        with torch.no_grad():
            F.batch_norm(x, m, v, w, b, training=False, eps=1e-5)

    return median_ms(fwd, device == "cuda")


print("version", torch.__version__)
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
for dev in devices:
    for name, rows, dim in LN:
        f, s = bench_ln(dev, rows, dim)
        print(f"{dev}.{name}.fwd", f)
        print(f"{dev}.{name}.step", s)
        sys.stdout.flush()
    print(f"{dev}.bn_infer.fwd", bench_bn(dev))
    sys.stdout.flush()
