"""PyTorch's version of `examples/train_mnist.rs`, for the README's figures.

The same recipe: the MNIST CNN (conv 1->32 - ReLU - pool - conv 32->64 -
ReLU - pool - 3136->128 - ReLU - 10, PyTorch's default init), pixels
normalized with the training set's mean and std, batch 128 reshuffled each
epoch, SGD (Nesterov momentum 0.9, weight decay 5e-4) under OneCycleLR
(max lr 0.1, PyTorch's defaults), test accuracy after every epoch. The clock
starts before the data is read, as the Rust example's does.

Usage: python3 scripts/train_mnist_torch.py [--data datasets/mnist]
    [--epochs 10] [--threads N] [--target 98] [--seed 0]

Prints one line per epoch and, when the target is reached,
`bench<TAB>mnist_time_to_98<TAB>torch<TAB>time<TAB><seconds><TAB>s`.
"""

import argparse
import gzip
import os
import struct
import time

import torch
from torch import nn


def read_idx(path):
    """An idx file (optionally gzipped) as a uint8 tensor of its shape."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    body = bytearray(data[4 + 4 * ndim :])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="datasets/mnist")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--target", type=float, default=98.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    clock = time.perf_counter()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    def split(prefix):
        x = read_idx(os.path.join(a.data, f"{prefix}-images-idx3-ubyte")).float() / 255.0
        y = read_idx(os.path.join(a.data, f"{prefix}-labels-idx1-ubyte")).long()
        return x.unsqueeze(1), y

    xtr, ytr = split("train")
    xte, yte = split("t10k")
    mean, std = xtr.mean().item(), xtr.std(unbiased=False).item()
    xtr, xte = (xtr - mean) / std, (xte - mean) / std

    net = model()
    steps = (len(ytr) + a.batch_size - 1) // a.batch_size
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.epochs * steps)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(a.seed)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    reached = None
    for epoch in range(a.epochs):
        net.train()
        perm = torch.randperm(len(ytr), generator=gen)
        t = time.perf_counter()
        for i in range(steps):
            idx = perm[i * a.batch_size : (i + 1) * a.batch_size]
            loss = loss_fn(net(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        train_secs = time.perf_counter() - t
        net.eval()
        with torch.no_grad():
            correct = sum(
                (net(xte[s : s + 1000]).argmax(1) == yte[s : s + 1000]).sum().item()
                for s in range(0, len(yte), 1000)
            )
        acc = 100.0 * correct / len(yte)
        elapsed = time.perf_counter() - clock
        print(f"epoch {epoch + 1:>2}: test acc {acc:.2f}% | {len(ytr) / train_secs:.0f} samples/s | {elapsed:.1f}s")
        if reached is None and acc >= a.target:
            reached = elapsed
            print(f"bench\tmnist_time_to_{a.target:.0f}\ttorch\ttime\t{elapsed:.2f}\ts")
            break
    if reached is None:
        print(f"did not reach {a.target}% in {a.epochs} epochs")


if __name__ == "__main__":
    main()
