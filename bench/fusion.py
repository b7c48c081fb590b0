"""PyTorch side of bench/fusion.c: exp((a + b) * c), the tanh form of GELU,
where(x > 0, x, 0.1 x), 2 x.to(bf16).to(f32), mean((a - b)^2), sum(exp(x))
and the sum over the rows of a [N / 64, 64] a * b on f32 CPU tensors, eager. Arguments: elements, timed repetitions. Prints
"name milliseconds" lines."""
from torch_peer import arg, median_wall, need_torch

torch = need_torch()
N = arg(1, 16 * 1024 * 1024)
R = arg(2, 20)
torch.set_grad_enabled(False)
a = torch.rand(N) * 2 - 1
b = torch.rand(N) * 2 - 1
c = torch.rand(N) * 2 - 1


def exp_chain():
    torch.exp((a + b) * c)


def gelu():
    x = a
    inner = x + (x * x * x) * 0.044715
    (x * 0.5) * (torch.tanh(inner * 0.7978845608028654) + 1.0)


def leaky_where():
    x = a
    torch.where(x > 0, x, x * 0.1)


def bf16_round_trip():
    a.to(torch.bfloat16).to(torch.float32) * 2.0


def mse():
    torch.mean((a - b) ** 2)


def sum_exp():
    torch.sum(torch.exp(a))


def col_sum():
    torch.sum(a.view(-1, 64) * b.view(-1, 64), 0)


print("version", torch.__version__)
print("threads", torch.get_num_threads())
print("exp_chain", median_wall(exp_chain, R, 2, 1e6))
print("gelu", median_wall(gelu, R, 2, 1e6))
print("leaky_where", median_wall(leaky_where, R, 2, 1e6))
print("bf16_round_trip", median_wall(bf16_round_trip, R, 2, 1e6))
print("mse", median_wall(mse, R, 2, 1e6))
print("sum_exp", median_wall(sum_exp, R, 2, 1e6))
print("col_sum", median_wall(col_sum, R, 2, 1e6))
