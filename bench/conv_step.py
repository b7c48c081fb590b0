"""PyTorch side of bench/conv_step.c: one training step of fashion_cnn's network
at batch 64 (two conv 3x3 SAME - batch norm - relu - 2x2 max pool blocks,
dropout, dense 3136-128-10, cross-entropy, backward, Adam), channels_last.

Prints "version V", then "cpu MS" and, with CUDA, "cuda MS" and "cuda_bf16
MS" (under torch.autocast with bfloat16) (median milliseconds per step), or
"PyTorch: not installed"."""
import sys

from torch_peer import arg, median_wall, need_torch

torch = need_torch()
import torch.nn as nn  # noqa: E402 - after need_torch has found torch
import torch.nn.functional as F  # noqa: E402

R = arg(1, 30)
WARM = 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32, eps=1e-3, momentum=0.01)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64, eps=1e-3, momentum=0.01)
        self.drop1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(7 * 7 * 64, 128)
        self.drop2 = nn.Dropout(0.4)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        h = self.drop1(torch.flatten(h, 1))
        h = self.drop2(F.relu(self.fc1(h)))
        return self.fc2(h)


def bench(device, reps, bf16=False):
    torch.manual_seed(1)
    x = torch.rand(64, 1, 28, 28).to(device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (64,)).to(device)
    net = Net().to(device).to(memory_format=torch.channels_last)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    cuda = device == "cuda"

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    return median_wall(step, reps, WARM, 1e6)


print("version", torch.__version__)
print("cpu", bench("cpu", R))
sys.stdout.flush()
if torch.cuda.is_available():
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("cuda", bench("cuda", R * 10))
    print("cuda_bf16", bench("cuda", R * 10, bf16=True))
