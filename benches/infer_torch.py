"""PyTorch eager twin of benches/infer.rs: torchvision's resnet50 (written
out, so torchvision is not needed) in eval mode under torch.inference_mode(),
on as many threads as this process may use. Prints the run times in seconds,
one per line, after 2 warm-up runs.

usage: python infer_torch.py BATCH RUNS
"""
import os
import sys
import time

import torch
from torch import nn


class Bottleneck(nn.Module):
    """torchvision's Bottleneck: 1x1, 3x3 (the stride), 1x1 x4, BN after each."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        idt = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + idt)


def resnet50():
    layers, cin = [], 64
    for i, (w, n) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for b in range(n):
            layers.append(Bottleneck(cin, w, 2 if (b == 0 and i > 0) else 1))
            cin = w * 4
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2048, 1000))


def main():
    batch, runs = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    net = resnet50().eval()
    assert sum(p.numel() for p in net.parameters()) == 25_557_032
    x = torch.randn(batch, 3, 224, 224)
    with torch.inference_mode():
        for _ in range(2):
            net(x)
        for _ in range(runs):
            t = time.perf_counter()
            net(x)
            print(time.perf_counter() - t)


if __name__ == "__main__":
    main()
