"""PyTorch twin of autograd/benches/attention.rs: F.scaled_dot_product_attention
forward + backward on q, k, v of [8, 6, 256, 64] f32 (loss = sum of the
output), best of 3 rounds of N iterations after 3 warm-up ones, on as many
threads as this process may use. Prints the bench line of the ms per
iteration.

usage: python attention_torch.py ITERS
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

NAME = "attention_b8h6s256d64"


def main():
    iters = int(sys.argv[1])
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 6, 256, 64, requires_grad=True) for _ in range(3))

    def step():
        out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    for _ in range(3):
        step()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            step()
        best = min(best, (time.perf_counter() - t) / iters)
    print(f"bench\t{NAME}\ttorch\tfwd_bwd\t{best * 1e3:.3f}\tms")


if __name__ == "__main__":
    main()
