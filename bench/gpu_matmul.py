"""PyTorch side of bench/gpu_matmul.c: an N x N x N float32 matmul on cuda:0 with
TF32 off and on; then the rows of its second table (SHAPE_ROWS, the same keys
as shape_rows in gpu_matmul.c) in TF32 and bf16, each printed as
"<key>_<tf32|bf16> ms" (the small shapes with 20 B matmuls per timed batch).

Arguments: N, matmuls per timed batch, timed batches. Prints "version V", then
"f32" and "tf32" (median milliseconds per matmul, timed with torch.cuda.Event
around each batch) and "f32_err", "tf32_err" (||C - ref|| / ||ref|| on 16 rows,
the reference in float64), or "PyTorch: ..." when PyTorch or CUDA is missing."""
import sys

from torch_peer import arg, median_events_ms, need_torch

torch = need_torch(cuda=True)

N = arg(1, 4096)
B = arg(2, 10)  # matmuls per timed batch
R = arg(3, 20)  # timed batches


def set_tf32(on):
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # PyTorch 2.9 and later
        m.fp32_precision = "tf32" if on else "ieee"
    else:
        m.allow_tf32 = on


torch.set_grad_enabled(False)
dev = torch.device("cuda:0")
g = torch.Generator(device=dev).manual_seed(1)
a = torch.rand(N, N, device=dev, generator=g) * 2 - 1
b = torch.rand(N, N, device=dev, generator=g) * 2 - 1
rows = torch.arange(16, device=dev) * 2654435761 % N
ref = a[rows].double() @ b.double()


def median_ms():
    def batch():
        for _ in range(B):
            a @ b

    return median_events_ms(batch, R, B)


def rel_err():
    c = (a @ b)[rows].double()
    return ((c - ref).norm() / ref.norm()).item()


print("version", torch.__version__)
for name, on in (("f32", False), ("tf32", True)):
    set_tf32(on)
    print(name + "_err", rel_err())
    print(name, median_ms())
    sys.stdout.flush()
set_tf32(False)

# key, a's logical shape, a transposed (a view of the swapped shape), b's, b
# transposed, small (20 B per batch); "square" is N x N x N, in bf16 only.
SHAPE_ROWS = (
    ("square", (N, N), False, (N, N), False, False),
    ("mlp", (64, 784), False, (784, 256), False, True),
    ("mlp_dw", (784, 64), True, (64, 256), False, True),
    ("mlp_dx", (64, 256), False, (256, 784), True, True),
    ("bmm", (16, 128, 64), False, (16, 64, 128), False, True),
    ("bmm_bcast", (16, 128, 64), False, (64, 128), False, True),
)


def operand(shape, transposed, dtype):
    if not transposed:
        return (torch.rand(shape, device=dev, generator=g) * 2 - 1).to(dtype)
    stored = shape[:-2] + (shape[-1], shape[-2])
    return (torch.rand(stored, device=dev, generator=g) * 2 - 1).to(dtype).transpose(-1, -2)


for key, sa, ta, sb, tb, small in SHAPE_ROWS:
    for mode in ("tf32", "bf16"):
        if key == "square" and mode == "tf32":
            continue  # the first table's
        set_tf32(mode == "tf32")
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        x, y = operand(sa, ta, dtype), operand(sb, tb, dtype)
        per = 20 * B if small else B

        def batch():
            for _ in range(per):
                x @ y

        print(key + "_" + mode, median_events_ms(batch, R, per))
        sys.stdout.flush()
set_tf32(False)
