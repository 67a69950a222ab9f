"""PyTorch eager twin of benches/train_step.rs: one workload per process
(so ru_maxrss is that workload's peak), same shapes, loss, optimizer and
best-of-rounds timing, on as many threads as this process may use.

usage: python train_step_torch.py {train_step_mlp|train_step_cnn|train_step_vit|train_step_resnet18_cifar}[_bf16] STEPS [serve]

A `_bf16` suffix runs forward and loss under torch.autocast("cpu", torch.bfloat16).
Alone it times 3 rounds of STEPS steps, each after 3 warm-up steps. With
`serve` (how the Rust bench runs it) it says `ready` after its first
steps, then times one such round per `round` line on stdin, answering
with the round's seconds, so that its rounds alternate with the Rust
side's on a machine whose speed drifts; at the end of input it reports
on the rounds it ran.
"""
import contextlib
import os
import resource
import sys
import time

import torch
from torch import nn

BATCH = 128


class Vit(nn.Module):
    """The ViT of train_step_vit: 4x4 patches of 3x32x32 (64 tokens + class
    token), width 192, 6 pre-norm GELU blocks with 3 heads and MLP 768."""

    def __init__(self):
        super().__init__()
        dim = 192
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 65, dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 3, 768, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(6))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls_token.expand(p.shape[0], -1, -1), p], 1) + self.pos_embed
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h)[:, 0])


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock (3x3, BN, ReLU, 3x3, BN, + shortcut)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idt = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + idt)


def resnet18_cifar():
    """torchvision's resnet18(num_classes=10) with the CIFAR stem (3x3
    stride-1 conv, no max-pool), written out so torchvision is not needed."""
    layers, cin = [], 64
    for i, w in enumerate([64, 128, 256, 512]):
        stride = 1 if i == 0 else 2
        layers += [BasicBlock(cin, w, stride), BasicBlock(w, w, 1)]
        cin = w
    return nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))


def model(name):
    if name == "train_step_resnet18_cifar":
        net = resnet18_cifar()
        assert sum(p.numel() for p in net.parameters()) == 11_173_962
        return net, (BATCH, 3, 32, 32)
    if name == "train_step_vit":
        net = Vit()
        assert sum(p.numel() for p in net.parameters()) == 2_693_578
        return net, (BATCH, 3, 32, 32)
    if name == "train_step_mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),
                             nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)), (BATCH, 784)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)), (BATCH, 1, 28, 28)


def main():
    name, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    base = name.removesuffix("_bf16")
    amp = ((lambda: torch.autocast("cpu", torch.bfloat16)) if base != name
           else contextlib.nullcontext)
    net, shape = model(base)
    x, y = torch.randn(*shape), torch.randint(0, 10, (BATCH,))
    if base == "train_step_vit":
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with amp():
            loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    def timed_round():
        # Warm-up steps first, as the Rust side: after an idle spell (the
        # other side's round) the first steps run slow (this MLP step at
        # 18k samples/s against 28k after 1.5 s idle on the 2-core VM).
        for _ in range(3):
            step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - t

    for _ in range(3):
        step()
    if sys.argv[3:] == ["serve"]:
        print("ready", flush=True)
        rounds = []
        for line in sys.stdin:
            if line.strip() == "round":
                rounds.append(timed_round())
                print(f"{rounds[-1]:.6f}", flush=True)
        if not rounds:
            return
    else:
        rounds = [timed_round() for _ in range(3)]  # as the Rust side
    rate = steps * BATCH / min(rounds)
    phases = None  # best round, timed phase by phase (as the Rust side)
    for _ in range(3):
        rnd = [0.0] * 5
        for _ in range(steps):
            t0 = time.perf_counter()
            with amp():
                out = net(x)
            t1 = time.perf_counter()
            with amp():
                loss = loss_fn(out, y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            del out, loss
            t5 = time.perf_counter()
            for k, (a, b) in enumerate([(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)]):
                rnd[k] += b - a
        if phases is None or sum(rnd) < sum(phases):
            phases = rnd
    ms = [p * 1e3 / steps for p in phases]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench\t{name}\ttorch_eager\tthroughput\t{rate:.1f}\tsamples/s")
    print(f"bench\t{name}\ttorch_eager\tpeak_rss\t{rss:.1f}\tMiB")
    print(f"# {name} torch phases (ms per step, best round): forward {ms[0]:.2f}, "
          f"loss {ms[1]:.2f}, backward {ms[2]:.2f}, optimizer {ms[3]:.2f}, drop {ms[4]:.2f}")


if __name__ == "__main__":
    main()
