"""PyTorch side of bench/cpu_math.c: exp, sigmoid, silu, tanh, softplus, sin, cos, log,
x^1.7, the exact GELU, and softmax and log_softmax over the last dim, on an f32 CPU tensor of uniform
values in [-8, 8) (log and pow: in (0, 16)), eager; then new random tensors of its shape (normal,
uniform, and normal truncated at 2 sd); then exp, sigmoid, tanh, sin, log and x^1.7 (of values in
(0, 16)), softplus and the exact GELU of as many bytes of f64. Arguments: rows, columns, timed repetitions. Prints
"name milliseconds" lines."""
from torch_peer import arg, median_wall, need_torch

torch = need_torch()
ROWS = arg(1, 16384)
COLS = arg(2, 1024)
R = arg(3, 10)
torch.set_grad_enabled(False)
x = torch.rand(ROWS, COLS) * 16 - 8
xp = torch.rand(ROWS, COLS) * 16 + 2**-20
xd = torch.rand(ROWS // 2, COLS, dtype=torch.float64) * 16 - 8
xdp = torch.rand(ROWS // 2, COLS, dtype=torch.float64) * 16 + 2**-20
F = torch.nn.functional

print("version", torch.__version__)
print("threads", torch.get_num_threads())
print("exp", median_wall(lambda: torch.exp(x), R, 2, 1e6))
print("sigmoid", median_wall(lambda: torch.sigmoid(x), R, 2, 1e6))
print("silu", median_wall(lambda: F.silu(x), R, 2, 1e6))
print("tanh", median_wall(lambda: torch.tanh(x), R, 2, 1e6))
print("sin", median_wall(lambda: torch.sin(x), R, 2, 1e6))
print("cos", median_wall(lambda: torch.cos(x), R, 2, 1e6))
print("log", median_wall(lambda: torch.log(xp), R, 2, 1e6))
print("pow", median_wall(lambda: torch.pow(xp, 1.7), R, 2, 1e6))
print("gelu", median_wall(lambda: F.gelu(x), R, 2, 1e6))
print("softplus", median_wall(lambda: F.softplus(x), R, 2, 1e6))
print("softmax", median_wall(lambda: torch.softmax(x, -1), R, 2, 1e6))
print("log_softmax", median_wall(lambda: torch.log_softmax(x, -1), R, 2, 1e6))
print("randn", median_wall(lambda: torch.randn(ROWS, COLS), R, 2, 1e6))
print("rand", median_wall(lambda: torch.rand(ROWS, COLS), R, 2, 1e6))
print("trunc_normal", median_wall(lambda: torch.nn.init.trunc_normal_(torch.empty(ROWS, COLS)), R, 2, 1e6))
print("exp_f64", median_wall(lambda: torch.exp(xd), R, 2, 1e6))
print("sigmoid_f64", median_wall(lambda: torch.sigmoid(xd), R, 2, 1e6))
print("tanh_f64", median_wall(lambda: torch.tanh(xd), R, 2, 1e6))
print("sin_f64", median_wall(lambda: torch.sin(xd), R, 2, 1e6))
print("log_f64", median_wall(lambda: torch.log(xdp), R, 2, 1e6))
print("softplus_f64", median_wall(lambda: F.softplus(xd), R, 2, 1e6))
print("pow_f64", median_wall(lambda: torch.pow(xdp, 1.7), R, 2, 1e6))
print("gelu_f64", median_wall(lambda: F.gelu(xd), R, 2, 1e6))
