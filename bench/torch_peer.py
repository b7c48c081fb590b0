"""What the PyTorch peers of the benchmarks share: importing torch quietly, or
saying in one "PyTorch: ..." line why there is no peer; their arguments; their
clocks (the host's, or CUDA events); and the processes of the distributed ones.

A peer prints "name value" lines, which bench_util.h's bench_run_peer reads;
the benchmark runs it from this folder, so `import torch_peer` finds this file."""
import os
import socket
import statistics
import sys
import time
import warnings


def need_torch(cuda=False):
    """torch, or a "PyTorch: ..." line and exit 0 (the benchmark then shows its
    own figures only) when it is not installed, or cuda is asked and missing."""
    warnings.filterwarnings("ignore")
    try:
        import torch
    except Exception:  # ImportError, or a broken install
        print("PyTorch: not installed")
        sys.exit(0)
    if cuda and not torch.cuda.is_available():
        print("PyTorch: no CUDA device")
        sys.exit(0)
    return torch


def arg(i, default, kind=int):
    """The i-th command-line argument as kind, or default when it is absent."""
    return kind(sys.argv[i]) if len(sys.argv) > i else default


def median_wall(fn, reps, warm, ns_per_unit, per=1):
    """Median host time of fn over reps calls after warm untimed ones, in units
    of ns_per_unit nanoseconds (1e6: ms), divided by per (ops in one call)."""
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / per / ns_per_unit)
    return statistics.median(samples)


def median_synced_ms(fn, reps, warm, cuda):
    """median_wall of fn in milliseconds, each call followed by
    torch.cuda.synchronize() when cuda (so a GPU call is timed to its end)."""

    def timed():
        fn()
        if cuda:
            import torch

            torch.cuda.synchronize()

    return median_wall(timed, reps, warm, 1e6)


def median_events_ms(batch, reps, per, warm=3):
    """Median milliseconds per op of batch() (per ops), timed on cuda:0 with
    CUDA events around each call, after warm untimed calls."""
    import torch

    for _ in range(warm):
        batch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        batch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / per)
    return statistics.median(samples)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(backend, rank, world, port):
    """Joins this process to a process group of world on this machine."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)


def spawn_for_result(worker, world, *args):
    """Runs worker(rank, world, port, queue, *args) in world fresh processes and
    returns what rank 0 put in the queue."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(world, free_port(), queue) + args, nprocs=world, join=True)
    return queue.get()
