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
import sys

from torch_peer import arg, join_group, median_wall, need_torch, spawn_for_result

torch = need_torch()
import torch.distributed as dist  # noqa: E402 - after need_torch has found torch
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

R = arg(1, 100)
BATCH = arg(2, 256)
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

    return median_wall(step, R, WARM, 1000.0)


def ddp_worker(rank, world, port, queue):
    torch.set_num_threads(1)  # two processes on two cores
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    join_group("gloo", rank, world, port)
    us = median_step_us(world, rank)
    if rank == 0:
        queue.put(us)
    dist.barrier()
    dist.destroy_process_group()


def ddp(world):
    return spawn_for_result(ddp_worker, world)


if __name__ == "__main__":
    WORLDS = [int(w) for w in arg(3, "2", str).split(",")]
    print("version", torch.__version__)
    print("torch1", BATCH / (median_step_us(1, 0) * 1e-6))
    sys.stdout.flush()
    for w in WORLDS:
        print(f"ddp{w}", BATCH / (ddp(w) * 1e-6))
        sys.stdout.flush()
