"""PyTorch side of bench/mirrored_step.c: the training step of a 784-256-10 MLP
(forward, softmax cross-entropy, backward, SGD update) at one global batch, on
the CPU, in one process and data-parallel with DistributedDataParallel over two
processes (gloo backend, one thread each, each with half the batch).

    python3 mirrored_step_ddp.py [REPS] [GLOBAL_BATCH] [WORLDS]

Prints "version V", "torch1 IMAGES_PER_S" (one process, default threads) and,
for each process count P in WORLDS (default "2"; "1,2,4" for bench/world.sh),
"ddpP IMAGES_PER_S" (images of the global batch per second, from the median
step of rank 0; P = 1 is one process of one thread, without DDP), or
"PyTorch: not installed"."""
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
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
except Exception:
    print("PyTorch: not installed")
    sys.exit(0)

R = int(sys.argv[1]) if len(sys.argv) > 1 else 100
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 256
WARM = 20


def median_step_us(world, rank):
    """Builds the model on this process's share of the batch; median step in us."""
    g = torch.Generator().manual_seed(1 + rank)
    rows = BATCH // world
    x = torch.randn(rows, 784, generator=g)
    y = torch.randint(0, 10, (rows,), generator=g)
    torch.manual_seed(1)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    if world > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()

    for _ in range(WARM):
        step()
    samples = []
    for _ in range(R):
        t0 = time.perf_counter_ns()
        step()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    return statistics.median(samples)


def ddp_worker(rank, world, port, queue):
    torch.set_num_threads(1)  # two processes on two cores
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    us = median_step_us(world, rank)
    if rank == 0:
        queue.put(us)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp(world):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(ddp_worker, args=(world, free_port(), queue), nprocs=world, join=True)
    return queue.get()


if __name__ == "__main__":
    WORLDS = [int(w) for w in (sys.argv[3] if len(sys.argv) > 3 else "2").split(",")]
    print("version", torch.__version__)
    print("torch1", BATCH / (median_step_us(1, 0) * 1e-6))
    sys.stdout.flush()
    for w in WORLDS:
        print(f"ddp{w}", BATCH / (ddp(w) * 1e-6))
        sys.stdout.flush()
