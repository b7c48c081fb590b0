"""Python's safetensors package against nabla's checkpoints (test_checkpoint runs it).

  safetensors_interop.py check PATH   loads nabla's file with safetensors.torch and
                                      checks every tensor's dtype, shape and values
  safetensors_interop.py write PATH   writes a file with safetensors.torch for
                                      nabla to restore

Exits 0 when all is as expected, 1 (printing what differs) otherwise."""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def expected():
    """What test_checkpoint's test_python saves (the same numbers)."""
    return {
        "layer/f32": torch.tensor([0.5 * k - 1.0 for k in range(6)], dtype=torch.float32).reshape(2, 3),
        "layer/f64": torch.tensor([1e-300, -2.5, 3.0], dtype=torch.float64),
        "i64": torch.tensor([-1, 0, 1, 1 << 40], dtype=torch.int64).reshape(2, 2),
        "u8": torch.tensor([0, 1, 127, 200, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "i32": torch.tensor([-7, 1 << 30], dtype=torch.int32).reshape(1, 2, 1),
    }


def check(path):
    got = load_file(path)
    want = expected()
    bad = []
    if sorted(got) != sorted(want):
        bad.append(f"names {sorted(got)} != {sorted(want)}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            bad.append(f"{name}: got {g.dtype} {tuple(g.shape)} {g.flatten().tolist()}, "
                       f"want {w.dtype} {tuple(w.shape)} {w.flatten().tolist()}")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != "nabla":
        bad.append(f"metadata {meta}")
    for line in bad:
        print("safetensors_interop.py check:", line)
    return 1 if bad else 0


def write(path):
    tensors = {
        "a": torch.tensor([0.25 * k - 1 for k in range(6)], dtype=torch.float32).reshape(2, 3),
        "nested/b": torch.tensor([-3, 0, 5, 1 << 50], dtype=torch.int64),
        "c": torch.tensor(0.125, dtype=torch.float64),
        "e": torch.zeros(0, dtype=torch.uint8),
        "half": torch.tensor([1.5, -2.0], dtype=torch.float16),
        "brain": torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16),
    }
    save_file(tensors, path, metadata={"written_by": "safetensors"})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        print(__doc__)
        sys.exit(2)
    sys.exit(check(sys.argv[2]) if sys.argv[1] == "check" else write(sys.argv[2]))
