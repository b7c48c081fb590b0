"""PyTorch side of bench/mlp_step.c: one training step of a 784-256-10 MLP at
batch 64 (forward, sparse softmax cross-entropy, backward, SGD update).

Prints "version V", then "cpu US" and, with CUDA, "cuda US" and "cuda_graph US"
(the step captured once with torch.cuda.graph and replayed) (median microseconds
per step), or "PyTorch: not installed"."""
import sys

from torch_peer import arg, median_wall, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402 - after need_torch has found torch

R = arg(1, 200)
WARM = 20


def bench(device, graph=False):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 784, generator=g).to(device)
    y = torch.randint(0, 10, (64,), generator=g).to(device)
    w1 = (torch.randn(784, 256, generator=g) * (2 / 784) ** 0.5).to(device).requires_grad_()
    b1 = torch.zeros(256, device=device, requires_grad=True)
    w2 = (torch.randn(256, 10, generator=g) * (1 / 256) ** 0.5).to(device).requires_grad_()
    b2 = torch.zeros(10, device=device, requires_grad=True)
    opt = torch.optim.SGD([w1, b1, w2, b2], lr=0.01)
    cuda = device == "cuda"

    def step():
        logits = torch.relu(x @ w1 + b1) @ w2 + b2
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(WARM):
        step()
    if graph:
        # The whole step in one CUDA graph (PyTorch's recipe: warm up on a side
        # stream, grads set to None so that backward allocates them in the pool).
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            logits = torch.relu(x @ w1 + b1) @ w2 + b2
            loss = F.cross_entropy(logits, y)
            loss.backward()
            opt.step()

        def step():
            g.replay()
            torch.cuda.synchronize()

        for _ in range(WARM):
            step()
    return median_wall(step, R, 0, 1000.0)


print("version", torch.__version__)
print("cpu", bench("cpu"))
sys.stdout.flush()
if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False
    print("cuda", bench("cuda"))
    sys.stdout.flush()
    try:
        print("cuda_graph", bench("cuda", graph=True))
    except Exception as e:  # a PyTorch that cannot capture this step
        print("cuda_graph_error", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
