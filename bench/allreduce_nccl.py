"""NCCL beside bench/allreduce.c: torch.distributed all_reduce (SUM) of one f32
tensor per GPU, 4 KiB up to MAX_BYTES in powers of 4, one process per GPU, on 2
GPUs and on 4 when there are 4.

    python3 allreduce_nccl.py [MAX_BYTES] [REPS]

Prints "version V" and "ncclN_BYTES US" (median microseconds of all_reduce then
torch.cuda.synchronize(), after a warm-up; reps as in allreduce.c), or a line
"PyTorch: ..." saying why it did not run."""
import statistics
import sys
import time

from torch_peer import arg, join_group, need_torch, spawn_for_result

torch = need_torch()
import torch.distributed as dist  # noqa: E402 - after need_torch has found torch

MAX_BYTES = arg(1, 256 << 20)
MAX_REPS = arg(2, 50)


def sizes():
    b = 4 << 10
    while b <= min(MAX_BYTES, 256 << 20):
        yield b
        b *= 4


def worker(rank, world, port, queue):
    torch.cuda.set_device(rank)
    join_group("nccl", rank, world, port)
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


if __name__ == "__main__":
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2 or not dist.is_nccl_available():
        print("PyTorch: NCCL reference skipped (needs >= 2 GPUs and NCCL)")
        sys.exit(0)
    print("version", torch.__version__)
    for world in (2, 4):
        if world > gpus:
            continue
        for b, us in spawn_for_result(worker, world):
            print("nccl%d_%d" % (world, b), us)
        sys.stdout.flush()
