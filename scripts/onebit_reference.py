"""Independent NumPy implementations of 1-bit LAMB (spec §4.3, DeepSpeed's
`onebit/lamb.py`) and 0/1 Adam (spec §4.4, `onebit/zoadam.py`), without
DeepSpeed's first-call dry run, over the compressed all-reduce of §4.1 with
simulated ranks, on the least-squares problem of
`parallel/tests/it/onebit.rs` (the same data, bit for bit: the test's
splitmix-style hash, 16 rows a step split over the ranks, evaluation on
4096 rows of step 1,000,000).

It prints
* the parameters (weights, then bias) after 40 steps of 0/1 Adam at lr 0.02
  with var_freeze_step 20, var_update_scaler 2, local_step_scaler 3,
  local_step_clipper 4 (step 40 synchronises), for 2 and 4 ranks, as lines
  `zero_one <n> <v0> ... <v8>`: the fixture
  `parallel/tests/fixtures/onebit_zero_one_reference.txt` of
  `zero_one_adam_matches_the_reference`;
* the final loss of exact LAMB (never frozen) and of 1-bit LAMB on 2 ranks
  frozen at step 400 with DeepSpeed's default max_coeff (10), over 600
  steps of a linear lr decay from 0.02 to 0.002: the figures of
  `lamb_early_freeze_matches_the_reference`.

Usage: python3 scripts/onebit_reference.py   (NumPy only)
"""
import numpy as np

f32 = np.float32
D, ROWS, STEPS = 8, 16, 600
M64 = (1 << 64) - 1
W_STAR = ((np.arange(D) - 3.5) / 2).astype(f32)


def rand_u64(seed, rank, i):
    z = (seed ^ ((rank * 0x9E3779B97F4A7C15) & M64) ^ ((i * 0xD1B54A32D192ED03) & M64)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def unit(v):
    return f32((v >> 40) / float(1 << 24))


def batch(step, rows):
    x = np.array([[unit(rand_u64(step, r, c)) * f32(2) - f32(1) for c in range(D)] for r in rows], f32)
    noise = np.array([(unit(rand_u64(step + 999, r, 0)) - f32(0.5)) * f32(0.2) for r in rows], f32)
    return x, (x * W_STAR).sum(1).astype(f32) + noise


EVAL = batch(1_000_000, range(4096))


def loss(w, b):
    x, y = EVAL
    return float(np.mean((x @ w + b - y) ** 2))


def grads(w, b, x, y):
    d = 2 * (x @ w + b - y) / len(y)
    return [(x.T @ d).astype(f32), np.array([d.sum()], f32)]


def sign(x):
    return np.where(x >= 0, 1, -1).astype(f32)


def compressed_allreduce(bufs, worker_errors, server_errors):
    """Spec §4.1 for len(bufs) simulated ranks; returns the common output."""
    n, p = len(bufs), len(worker_errors[0])
    c = p // n
    avg = np.zeros(p, f32)
    for r in range(n):
        x = np.zeros(p, f32)
        x[: len(bufs[r])] = bufs[r]
        x += worker_errors[r]
        comp = (np.linalg.norm(x) / np.sqrt(p)) * sign(x)
        worker_errors[r] = x - comp
        avg += comp / n
    out = np.zeros(p, f32)
    for j in range(n):
        y = avg[j * c:(j + 1) * c] + server_errors[j]
        o = (np.linalg.norm(y) / np.sqrt(c)) * sign(y)
        server_errors[j] = y - o
        out[j * c:(j + 1) * c] = o
    return out[: len(bufs[0])]


def onebit_lamb(n, freeze, lr0=0.02, b1=0.9, b2=0.999, eps=1e-8, max_coeff=10.0, min_coeff=0.01,
                coeff_beta=0.9, factor_max=4.0, factor_min=0.5, threshold=0.1):
    params = [np.array([0.1 - 0.025 * i for i in range(D)], f32), np.array([0.1], f32)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    fresh = [np.zeros_like(p) for p in params]
    coeff_freeze, last_factor, scaling = [0.0, 0.0], [1.0, 1.0], None
    unit_len = n * (n * 8 // np.gcd(n, 8))
    padded = -(-(D + 1) // unit_len) * unit_len
    worker_errors = [np.zeros(padded, f32) for _ in range(n)]
    server_errors = [np.zeros(padded // n, f32) for _ in range(n)]
    per = ROWS // n
    for s in range(STEPS):
        lr = lr0 * (1 - 0.9 * s / STEPS)
        local = [grads(*params, *batch(s, range(r * per, (r + 1) * per))) for r in range(n)]
        if s < freeze:
            for k, p in enumerate(params):
                g = sum(gr[k] for gr in local) / f32(n)
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                if s + 1 == freeze:
                    fresh[k] = v[k].copy()
                u = m[k] / (np.sqrt(v[k]) + eps)
                wn, un = np.linalg.norm(p), np.linalg.norm(u)
                coeff = min(max(wn / un, min_coeff), max_coeff) if wn != 0 and un != 0 else 1.0
                if coeff != 1.0:
                    coeff_freeze[k] = coeff_beta * coeff_freeze[k] + (1 - coeff_beta) * coeff
                p -= f32(lr * coeff) * u
            continue
        if scaling is None:
            scales = [np.linalg.norm(mk) / np.sqrt(mk.size) for mk in m]
            united = sum(scales) / len(scales)
            scaling = [united / sc for sc in scales]
        last = [mk.copy() for mk in m]
        bufs = [np.concatenate([(b1 * m[k] + (1 - b1) * gr[k]) * f32(scaling[k]) for k in range(2)])
                for gr in local]
        out = compressed_allreduce(bufs, worker_errors, server_errors) if n > 1 else bufs[0]
        off = 0
        for k, p in enumerate(params):
            m[k] = out[off:off + p.size] / f32(scaling[k])
            off += p.size
            rec = (m[k] - b1 * last[k]) / (1 - b1)
            fresh[k] = b2 * fresh[k] + (1 - b2) * rec * rec
            denom = np.sqrt(v[k]) + eps
            factor = float((denom / (np.sqrt(fresh[k]) + eps)).max())
            factor = min(max(factor, factor_min), factor_max)
            factor = min(max(factor, last_factor[k] * (1 - threshold)), last_factor[k] * (1 + threshold))
            last_factor[k] = factor
            p -= f32(lr * coeff_freeze[k] * factor) * (m[k] / denom)
    return loss(*params)


def zero_one_adam(n, steps=40, lr=0.02, var_freeze_step=20, var_update_scaler=2, local_step_scaler=3,
                  local_step_clipper=4, b1=0.9, b2=0.999, eps=1e-8):
    """Every rank's own parameters (they differ between synchronisations)."""
    init = [np.array([0.1 - 0.025 * i for i in range(D)], f32), np.array([0.1], f32)]
    params = [[p.copy() for p in init] for _ in range(n)]
    m = [[np.zeros_like(p) for p in init] for _ in range(n)]
    v = [[np.zeros_like(p) for p in init] for _ in range(n)]
    base = None  # the parameters at the last synchronisation
    unit_len = n * (n * 8 // np.gcd(n, 8))
    sizes = [-(-p.size // unit_len) * unit_len for p in init]
    errors = [([np.zeros(s, f32) for _ in range(n)], [np.zeros(s // n, f32) for _ in range(n)]) for s in sizes]
    var_interval, var_counter, local_interval, local_counter = 1, 0, 1, 0
    lrs, frozen, per = 0.0, False, ROWS // n
    for t in range(1, steps + 1):
        local = [grads(*params[r], *batch(t - 1, range(r * per, (r + 1) * per))) for r in range(n)]
        if not frozen:
            kind = "variance" if t % var_interval == 0 else "compressed"
        else:
            kind = "sync" if t % local_interval == 0 else "local"
            lrs += lr
            if base is None:
                base = [p.copy() for p in params[0]]
        for k in range(len(init)):
            if kind == "variance":
                g = [sum(gr[k] for gr in local) / f32(n)] * n
            elif kind == "compressed":
                g = [compressed_allreduce([gr[k] for gr in local], *errors[k])] * n
            else:
                g = [gr[k] for gr in local]
            for r in range(n):
                if kind == "variance":
                    v[r][k] = b2 * v[r][k] + (1 - b2) * g[r] * g[r]
                m[r][k] = b1 * m[r][k] + (1 - b1) * g[r]
                d = f32(lr) * (m[r][k] / (np.sqrt(v[r][k]) + eps))
                params[r][k] = params[r][k] - d
            if kind == "sync":
                # Spec §4.4's `p -= u; ...; p += u/(sqrt(v)+eps)` with the
                # parameters of the last sync kept rather than recovered as
                # p - u (the same in exact arithmetic).
                bufs = [(params[r][k] - base[k]) * (np.sqrt(v[r][k]) + eps) for r in range(n)]
                avg = compressed_allreduce(bufs, *errors[k])
                base[k] = base[k] + avg / (np.sqrt(v[0][k]) + eps)
                for r in range(n):
                    m[r][k] = -avg / f32(lrs)
                    params[r][k] = base[k].copy()
        if kind == "sync":
            lrs = 0.0
        if not frozen:
            if kind == "variance":
                var_counter += 1
                if var_counter == var_update_scaler:
                    var_counter, var_interval = 0, var_interval * 2
            if t >= var_freeze_step:
                frozen = True
                for worker, server in errors:
                    for e in worker + server:
                        e[:] = 0
        else:
            local_counter += 1
            if local_counter == local_step_scaler:
                local_counter, local_interval = 0, min(local_step_clipper, local_interval * 2)
    return params


if __name__ == "__main__":
    for n in (2, 4):
        ranks = zero_one_adam(n)
        assert all(np.array_equal(np.concatenate(r), np.concatenate(ranks[0])) for r in ranks)
        vals = " ".join(np.format_float_positional(x, unique=True, trim="-") for x in np.concatenate(ranks[0]))
        print(f"zero_one {n} {vals}")
    print(f"exact LAMB (n = 1, never frozen): {onebit_lamb(1, STEPS + 1):.5f}")
    print(f"1-bit LAMB (n = 2, frozen at 400): {onebit_lamb(2, 400):.4f}")
