"""1-bit Adam as spec §4.2 states it (DeepSpeed's non-bias-corrected form,
the compressed all-reduce of §4.1 with per-parameter error feedback), in
PyTorch, on the MNIST CNN of `train_mnist` with two simulated ranks
(batch 128 split in two, its one-cycle schedule with beta1 cycling, weight
decay 5e-4 added to the update): evidence for the warning in
`optim/src/onebit/adam.rs` that a short warm-up diverges.

After the freeze step and a few steps after it, it prints per parameter
(index, share of coordinates with sqrt(v) < 1e-6, largest |p|), and the
test accuracy after every epoch, or the step at which a parameter stopped
being finite.

With MASK_RATIO it also applies tessera's automatic exp-avg mask
(`OnebitAdam::with_variance_mask`): after each compressed exchange the
momentum is zeroed where v <= MASK_RATIO^2 * mean(v) over the parameter
(it prints how many coordinates that masks, and how many have v == 0).

Usage: python3 scripts/onebit_adam_mnist_freeze.py FREEZE_STEP LR EPOCHS [MASK_RATIO]
Measured (2 epochs, lr 0.001): Adam (FREEZE_STEP 1000000) 97.05%;
freeze 40 -> NaN at step 46; freeze 40, ratio 0.001 -> NaN at step 48;
ratio 0.01 -> 96.95% (12% of fc1's weights masked, 4% with v == 0);
ratio 0.1 -> 96.80%. Freeze 150, 3 epochs, no mask -> 97.65%.
"""
import gzip
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = "datasets/mnist/"


def idx(path):
    data = gzip.open(path).read()
    return np.frombuffer(data, np.uint8, offset=16 if data[3] == 3 else 8)


def load():
    x = torch.tensor(idx(ROOT + "train-images-idx3-ubyte.gz").reshape(-1, 1, 28, 28) / 255.0, dtype=torch.float32)
    y = torch.tensor(idx(ROOT + "train-labels-idx1-ubyte.gz").astype(np.int64))
    xt = torch.tensor(idx(ROOT + "t10k-images-idx3-ubyte.gz").reshape(-1, 1, 28, 28) / 255.0, dtype=torch.float32)
    yt = torch.tensor(idx(ROOT + "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    mean, std = x.mean(), x.std()
    return (x - mean) / std, y, (xt - mean) / std, yt


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def sign(x):
    return torch.where(x >= 0, 1.0, -1.0)


def compressed_allreduce(bufs, worker_errors, server_errors):
    n, p = len(bufs), worker_errors[0].numel()
    c = p // n
    avg = torch.zeros(p)
    for r in range(n):
        x = torch.zeros(p)
        x[: bufs[r].numel()] = bufs[r]
        x += worker_errors[r]
        comp = x.norm() / math.sqrt(p) * sign(x)
        worker_errors[r].copy_(x - comp)
        avg += comp / n
    out = torch.zeros(p)
    for j in range(n):
        y = avg[j * c:(j + 1) * c] + server_errors[j]
        o = y.norm() / math.sqrt(c) * sign(y)
        server_errors[j].copy_(y - o)
        out[j * c:(j + 1) * c] = o
    return out[: bufs[0].numel()]


def padded(numel, n):
    unit = n * (n * 8 // math.gcd(n, 8))
    return max(1, -(-numel // unit)) * unit


def one_cycle(step, total, max_lr):
    """(lr, beta1) of torch's OneCycleLR defaults (cosine, two phases)."""
    up = 0.3 * total - 1
    start, end = max_lr / 25, max_lr / 25 / 1e4

    def cos(a, b, p):
        return b + (a - b) / 2 * (math.cos(math.pi * p) + 1)

    if step <= up:
        p = step / up
        return cos(start, max_lr, p), cos(0.95, 0.85, p)
    p = (step - up) / (total - 1 - up)
    return cos(max_lr, end, p), cos(0.85, 0.95, p)


def train(freeze, max_lr, epochs, mask_ratio=None, n=2, seed=0, wd=5e-4, eps=1e-8, b2=0.999):
    x, y, xt, yt = load()
    torch.manual_seed(seed)
    net = cnn()
    params = list(net.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    errors = [None] * len(params)
    masks = [None] * len(params)
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = len(x) // 128
    total, step = epochs * steps_per_epoch, 0
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for b in range(steps_per_epoch):
            rows = perm[b * 128:(b + 1) * 128]
            per = 128 // n
            lr, b1 = one_cycle(step, total, max_lr)
            local = []
            for r in range(n):
                net.zero_grad()
                mine = rows[r * per:(r + 1) * per]
                F.cross_entropy(net(x[mine]), y[mine]).backward()
                local.append([p.grad.clone() for p in params])
            with torch.no_grad():
                for k, p in enumerate(params):
                    if step < freeze:
                        g = sum(gr[k] for gr in local) / n
                        m[k].mul_(b1).add_((1 - b1) * g)
                        v[k].mul_(b2).add_((1 - b2) * g * g)
                    else:
                        if errors[k] is None:
                            size = padded(p.numel(), n)
                            errors[k] = ([torch.zeros(size) for _ in range(n)],
                                         [torch.zeros(size // n) for _ in range(n)])
                        bufs = [(b1 * m[k] + (1 - b1) * gr[k]).flatten() for gr in local]
                        m[k] = compressed_allreduce(bufs, *errors[k]).view_as(p)
                        if mask_ratio is not None:
                            if masks[k] is None:
                                rms = v[k].mean().sqrt()
                                masks[k] = (v[k].sqrt() >= mask_ratio * rms).float()
                                print(f"mask {k}: {int((masks[k] == 0).sum())} of {p.numel()} masked, exactly-0 v: {int((v[k] == 0).sum())}")
                            m[k] = m[k] * masks[k]
                    p.add_(-lr * (m[k] / (v[k].sqrt() + eps) + wd * p))
            step += 1
            if step - freeze in (0, 1, 2, 5, 10):
                report = [(k, round(float((v[k].sqrt() < 1e-6).float().mean()), 4),
                           float(p.detach().abs().max())) for k, p in enumerate(params)]
                print(f"step {step} lr {lr:.6f}: {report}", flush=True)
            if any(not torch.isfinite(p).all() for p in params):
                return f"NaN at step {step}"
        with torch.no_grad():
            acc = (net(xt).argmax(1) == yt).float().mean().item() * 100
        print(f"epoch {epoch + 1}: test accuracy {acc:.2f}%", flush=True)
    return f"{acc:.2f}%"


if __name__ == "__main__":
    torch.set_num_threads(2)
    freeze, lr, epochs = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    ratio = float(sys.argv[4]) if len(sys.argv) > 4 else None
    print(train(freeze, lr, epochs, ratio))
