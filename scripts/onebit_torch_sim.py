"""Writes parallel/tests/fixtures/onebit_torch_sim.txt: DeepSpeed's reference
for the compressed all-reduce (`tests/onebit/test_nccl_backend.py::torch_sim`),
run for every rank of a simulated group in one process (the all-reduce is the
sum over the simulated ranks), on DeepSpeed's inputs `rand - 0.5 + 0.01*rank`.

Usage: python3 scripts/onebit_torch_sim.py   (torch from PyPI)

Format, one line per vector: `<name> <n> <rank> <v0> <v1> ...` with float32
values in shortest round-trip form. Names: input (rank's input), output (the
compressed average, the same on every rank; given for rank 0), worker_error,
server_error (the rank's chunk).
"""
import os

import numpy as np
import torch

N = 288  # divisible by n * lcm(n, 8) for n = 2, 3, 4: no padding


def sign_pm1(x):
    return x.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)


def torch_sim(inputs):
    n = len(inputs)
    compressed, worker_errors = [], []
    for a in inputs:
        scale = a.norm() / np.sqrt(a.numel())
        c = scale * sign_pm1(a)
        compressed.append(c)
        worker_errors.append(a - c)
    total = torch.zeros_like(inputs[0])
    for c in compressed:
        total += c
    avg = total.mul_(1 / n)
    server_sign = sign_pm1(avg)
    chunks = torch.chunk(avg, chunks=n)
    sign_chunks = torch.chunk(server_sign, n)
    server_scale = [ch.norm() / np.sqrt(ch.numel()) for ch in chunks]
    out = torch.cat([server_scale[i] * sign_chunks[i] for i in range(n)])
    server_errors = [chunks[r] - server_scale[r] * sign_chunks[r] for r in range(n)]
    return out, worker_errors, server_errors


def fmt(name, n, rank, t):
    vals = " ".join(np.format_float_positional(v, unique=True, trim="-") for v in t.numpy())
    return f"{name} {n} {rank} {vals}\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "parallel", "tests", "fixtures", "onebit_torch_sim.txt")
    lines = []
    for n in (2, 3, 4):
        torch.manual_seed(1000 + n)
        inputs = [torch.rand(N, dtype=torch.float32) - 0.5 + 0.01 * r for r in range(n)]
        out, we, se = torch_sim(inputs)
        for r in range(n):
            lines.append(fmt("input", n, r, inputs[r]))
            lines.append(fmt("worker_error", n, r, we[r]))
            lines.append(fmt("server_error", n, r, se[r]))
        lines.append(fmt("output", n, 0, out))
    with open(path, "w") as f:
        f.writelines(lines)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
