"""PyTorch side of bench/loss.c: F.cross_entropy (mean) over logits [64, 10],
[4096, 1000] and [256, 32000] f32 with integer labels, forward and
forward+backward (the logits' gradient).

Usage: loss.py REPS
Prints "version V", then "cpu.<case>.<fwd|step> MS" and, with CUDA,
"cuda.<case>.<fwd|step> MS" (median milliseconds), or "PyTorch: not installed"."""
import sys

from torch_peer import arg, median_synced_ms, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402 - after need_torch has found torch

R = arg(1, 20)
WARM = 3
CASES = [("ce64x10", 64, 10), ("ce4096x1000", 4096, 1000), ("ce256x32000", 256, 32000)]  # name, rows, classes


def median_ms(fn, cuda):
    return median_synced_ms(fn, R, WARM, cuda)


def bench_case(device, rows, classes):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(rows, classes, generator=g) * 2).to(device)
    labels = torch.randint(0, classes, (rows,), generator=g).to(device)
    cuda = device == "cuda"

    def fwd():
        with torch.no_grad():
            F.cross_entropy(x, labels)

    xr = x.detach().requires_grad_()

    def step():
        (gx,) = torch.autograd.grad(F.cross_entropy(xr, labels), xr)

    return median_ms(fwd, cuda), median_ms(step, cuda)


print("version", torch.__version__)
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
for dev in devices:
    for name, rows, classes in CASES:
        f, s = bench_case(dev, rows, classes)
        print(f"{dev}.{name}.fwd", f)
        print(f"{dev}.{name}.step", s)
        sys.stdout.flush()
