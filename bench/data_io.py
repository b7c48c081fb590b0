"""PyTorch side of bench/data_io.c: a checkpoint of VARS f32 tensors of ELEMS
elements saved with safetensors.torch.save_file (also followed by an fsync of
the file and its folder, the durability nabla's save has) and loaded back into
existing tensors, and TensorBoard scalars through
torch.utils.tensorboard.SummaryWriter.

Arguments: a scratch folder, VARS, ELEMS, repetitions. Prints "name milliseconds"
or "name microseconds" lines, or "PyTorch: ..." when something is missing."""
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    from safetensors.torch import load_file, save_file
except Exception as e:  # noqa: BLE001 - any import failure: no peer
    print(f"PyTorch: torch with safetensors is not installed ({type(e).__name__})")
    sys.exit(0)
from torch_peer import median_wall  # noqa: E402

scratch, n_vars, elems, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
params = {f"layer{i}/kernel": torch.randn(elems) for i in range(n_vars)}
path = os.path.join(scratch, "peer.safetensors")


def timed(fn):
    """Median seconds of fn after one untimed call."""
    return median_wall(fn, reps, 1, 1e9)


def save():
    save_file(params, path)


def save_fsync():
    save_file(params, path)
    for p, flags in ((path, os.O_RDONLY), (scratch, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(p, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def restore():
    loaded = load_file(path)
    with torch.no_grad():
        for k, v in params.items():
            v.copy_(loaded[k])


print("version", torch.__version__)
print("save_ms", timed(save) * 1e3)
print("save_fsync_ms", timed(save_fsync) * 1e3)
print("restore_ms", timed(restore) * 1e3)
os.remove(path)
try:
    from torch.utils.tensorboard import SummaryWriter
except Exception:  # noqa: BLE001 - tensorboard missing: no scalar figure
    sys.exit(0)
w = SummaryWriter(os.path.join(scratch, "peer-logs"))
K = 10000
t0 = time.perf_counter()
for i in range(K):
    w.add_scalar("loss", 1.0 / (i + 1), i)
w.flush()
print("scalar_us", (time.perf_counter() - t0) / K * 1e6)
w.close()
