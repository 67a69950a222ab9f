"""PyTorch's figures for the workloads of elementwise.rs, as bench lines.

Usage: python torch_elementwise.py [threads]. Best of repeated runs.
"""
import sys
import time

import torch

N16M = 1 << 24


def best(f, min_s=0.6):
    f()
    t0, b, runs = time.perf_counter(), float("inf"), 0
    while runs < 5 or time.perf_counter() - t0 < min_s:
        t = time.perf_counter()
        f()
        b = min(b, time.perf_counter() - t)
        runs += 1
    return b


def line(w, metric, v, unit):
    print(f"bench\t{w}\tpytorch\t{metric}\t{v:.2f}\t{unit}")


def main():
    if len(sys.argv) > 1:
        torch.set_num_threads(int(sys.argv[1]))
    print(f"# pytorch {torch.__version__}, {torch.get_num_threads()} threads")
    gb = lambda nbytes, s: nbytes / s / 1e9
    a, b = torch.rand(N16M) * 2 - 1, torch.rand(N16M) * 2 - 1
    dst = torch.empty(N16M)
    copy = gb(8 * N16M, best(lambda: dst.copy_(a)))
    line("copy_f32_16M", "bandwidth", copy, "GB/s")
    add = gb(12 * N16M, best(lambda: a + b))
    line("add_f32_16M", "bandwidth", add, "GB/s")
    line("add_f32_16M", "fraction_of_copy", add / copy, "ratio")
    s = gb(4 * N16M, best(lambda: a.sum()))
    line("sum_f32_16M", "bandwidth", s, "GB/s")
    line("sum_f32_16M", "fraction_of_copy", s / copy, "ratio")

    line("gelu_16M", "fwd_bandwidth",
         gb(8 * N16M, best(lambda: torch.nn.functional.gelu(a))), "GB/s")
    line("gelu_16M", "bwd_bandwidth",
         gb(12 * N16M, best(lambda: torch.ops.aten.gelu_backward(b, a))), "GB/s")

    rows, k = 8192, 768
    x = torch.rand(rows, k) * 2 - 1
    w, bias = torch.rand(k), torch.rand(k)
    nbytes = 4 * rows * k
    with torch.no_grad():
        line("layer_norm_8192x768", "fwd_bandwidth",
             gb(2 * nbytes, best(lambda: torch.nn.functional.layer_norm(x, (k,), w, bias, 1e-5))), "GB/s")
    xg, wg, bg = x.clone().requires_grad_(), w.clone().requires_grad_(), bias.clone().requires_grad_()
    dy = torch.rand(rows, k)

    def step():
        y = torch.nn.functional.layer_norm(xg, (k,), wg, bg, 1e-5)
        y.backward(dy)

    line("layer_norm_8192x768", "fwd_bwd_bandwidth", gb(5 * nbytes, best(step)), "GB/s")
    sm = torch.rand(8192, 1024) * 2 - 1
    line("softmax_8192x1024", "fwd_bandwidth",
         gb(8 * 8192 * 1024, best(lambda: torch.softmax(sm, -1))), "GB/s")


if __name__ == "__main__":
    main()
