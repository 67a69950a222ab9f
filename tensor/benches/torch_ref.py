"""PyTorch reference rates for the tessera-tensor benches.

Usage: torch_ref.py {gemm|conv} THREADS

Says `ready` once torch is imported, then reads workload names from stdin,
one per line, and answers each as soon as it has measured it with
`<workload>\t<median GFLOP/s>\t<best GFLOP/s>` (`<workload>\tunknown` for a
name it does not know), with the same shapes, flop counts and repetitions
as the Rust benches. The bench asks right after
measuring its own run of the workload, so both figures come from the same
minute of a machine whose speed drifts. Always wall-clock time: PyTorch's
OpenMP threads spin while they wait, so its CPU time says nothing.
"""

import sys
import time

import torch

GEMM = [
    ("gemm_f32_64", 64, 64, 64, False, False),
    ("gemm_f32_128", 128, 128, 128, False, False),
    ("gemm_f32_256", 256, 256, 256, False, False),
    ("gemm_f32_512", 512, 512, 512, False, False),
    ("gemm_f32_1024", 1024, 1024, 1024, False, False),
    ("gemm_f32_2048", 2048, 2048, 2048, False, False),
    ("gemm_f32_128x784x512", 128, 784, 512, False, False),
    ("gemm_f32_4096x768x3072", 4096, 768, 3072, False, False),
    ("gemm_f32_1024_tn", 1024, 1024, 1024, True, False),
    ("gemm_f32_1024_nt", 1024, 1024, 1024, False, True),
    ("gemm_f32_8320x192x192_nt", 8320, 192, 192, False, True),
    ("gemm_f32_8320x768x192", 8320, 768, 192, False, False),
    ("gemm_f32_768x8320x192_tn", 768, 8320, 192, True, False),
    ("gemm_f32_192x8320x192_tn", 192, 8320, 192, True, False),
    ("gemm_bf16_256", 256, 256, 256, False, False),
    ("gemm_bf16_512", 512, 512, 512, False, False),
    ("gemm_bf16_1024", 1024, 1024, 1024, False, False),
    ("gemm_bf16_2048", 2048, 2048, 2048, False, False),
    ("gemm_bf16_4096", 4096, 4096, 4096, False, False),
    ("gemm_bf16_128x784x512", 128, 784, 512, False, False),
    ("gemm_bf16_128x512x512_nt", 128, 512, 512, False, True),
    ("gemm_bf16_512x128x784_tn", 512, 128, 784, True, False),
]

# (name, batch, in channels, out channels, size): 3x3, padding 1, stride 1.
CONV = [
    ("conv2d_fwd_bwd_1x32x28", 128, 1, 32, 28),
    ("conv2d_fwd_bwd_32x64x14", 128, 32, 64, 14),
]


def rates(flop, reps, f):
    """Median and best GFLOP/s of `reps` runs of f after one warm-up."""
    f()
    secs = []
    for _ in range(max(reps, 1)):
        t = time.perf_counter()
        f()
        secs.append(time.perf_counter() - t)
    secs.sort()
    best = max(secs[0], 1e-9)
    return flop / secs[len(secs) // 2] / 1e9, flop / best / 1e9


def reps_for(flop):
    return max(5, min(1000, int(2e11 / flop)))


def emit(name, r):
    print(f"{name}\t{r[0]:.3f}\t{r[1]:.3f}", flush=True)


def operand(rows, cols, t, g):
    if t:
        return torch.rand(cols, rows, generator=g).mul_(2).sub_(1).t()
    return torch.rand(rows, cols, generator=g).mul_(2).sub_(1)


def gemm_workloads():
    """Workload name -> a function measuring it (operands made on call)."""

    def measure(name, m, k, n, ta, tb):
        g = torch.Generator().manual_seed(0)
        a, b = operand(m, k, ta, g), operand(k, n, tb, g)
        if name.startswith("gemm_bf16"):
            a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        flop = 2.0 * m * n * k
        return rates(flop, reps_for(flop), lambda: torch.matmul(a, b))

    return {w[0]: (lambda w=w: measure(*w)) for w in GEMM}


def conv_workloads():
    """Workload name -> a function measuring it (tensors made on call)."""

    def measure(n, c, o, s, what):
        g = torch.Generator().manual_seed(0)
        x = torch.rand(n, c, s, s, generator=g)
        w = torch.rand(o, c, 3, 3, generator=g)
        b = torch.rand(o, generator=g)
        gy = torch.rand(n, o, s, s, generator=g)
        flop = 2.0 * n * o * s * s * c * 9
        if what == "fwd":
            f = lambda: torch.nn.functional.conv2d(x, w, b, padding=1)
        else:
            mask = [what == "grad_input", what == "grad_weight", False]
            f = lambda: torch.ops.aten.convolution_backward(
                gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask
            )
        return rates(flop, reps_for(flop), f)

    return {
        f"{name}_{what}": (lambda shape=(n, c, o, s), what=what: measure(*shape, what))
        for name, n, c, o, s in CONV
        for what in ("fwd", "grad_input", "grad_weight")
    }


def main():
    what, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    workloads = {"gemm": gemm_workloads, "conv": conv_workloads}[what]()
    print("ready", flush=True)
    with torch.no_grad():
        for line in sys.stdin:
            name = line.strip()
            if name in workloads:
                emit(name, workloads[name]())
            else:
                print(f"{name}\tunknown", flush=True)


if __name__ == "__main__":
    main()
