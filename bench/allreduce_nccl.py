"""NCCL beside bench/allreduce.c: torch.distributed all_reduce (SUM) of one f32
tensor per GPU, 4 KiB up to MAX_BYTES in powers of 4, one process per GPU, on 2
GPUs and on 4 when there are 4.

    python3 allreduce_nccl.py [MAX_BYTES] [REPS]

Prints "version V" and "ncclN_BYTES US" (median microseconds of all_reduce then
torch.cuda.synchronize(), after a warm-up; reps as in allreduce.c), or a line
"PyTorch: ..." saying why it did not run."""
import os
import socket
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except Exception:
    print("PyTorch: not installed")
    sys.exit(0)

MAX_BYTES = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
MAX_REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 50


def sizes():
    b = 4 << 10
    while b <= min(MAX_BYTES, 256 << 20):
        yield b
        b *= 4


def worker(rank, world, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    results = []
    for b in sizes():
        reps = min(MAX_REPS, max(3, MAX_REPS * (1 << 20) // b))  # as in allreduce.c
        warm = 1 if reps < 5 else 3
        t = torch.full((b // 4,), float(rank + 1), device="cuda")
        samples = []
        for i in range(warm + reps):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            if i >= warm:
                samples.append((time.perf_counter_ns() - t0) / 1000.0)
        results.append((b, statistics.median(samples)))
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2 or not dist.is_nccl_available():
        print("PyTorch: NCCL reference skipped (needs >= 2 GPUs and NCCL)")
        sys.exit(0)
    print("version", torch.__version__)
    ctx = mp.get_context("spawn")
    for world in (2, 4):
        if world > gpus:
            continue
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(world, free_port(), queue), nprocs=world, join=True)
        for b, us in queue.get():
            print("nccl%d_%d" % (world, b), us)
        sys.stdout.flush()
