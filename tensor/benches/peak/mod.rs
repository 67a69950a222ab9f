//! Shared by the GEMM and convolution benches: the machine's f32 FMA peak
//! measured by a register-only loop, timing by medians, the bench-line
//! printer and the PyTorch reference runner.

use std::time::Instant;

mod twin;

use twin::Twin;

/// The median and best rate in GFLOP/s of `reps` timed runs of `f` (after
/// one warm-up run), each doing `flop` floating-point operations.
///
/// Wall-clock time; with `TESSERA_BENCH_CLOCK=cpu` instead the process's
/// CPU time divided by the rayon thread count: a diagnostic for a loaded
/// machine, where time spent preempted would otherwise count (it still
/// counts threads spinning while they wait, so it errs slow).
pub fn rates(flop: f64, reps: usize, mut f: impl FnMut()) -> Rate {
    f();
    let cpu = std::env::var("TESSERA_BENCH_CLOCK").is_ok_and(|v| v == "cpu");
    let threads = rayon::current_num_threads() as f64;
    let mut secs: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            if cpu {
                let t = process_cpu_secs();
                f();
                (process_cpu_secs() - t) / threads
            } else {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            }
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    Rate {
        median: flop / secs[secs.len() / 2] / 1e9,
        best: flop / secs[0] / 1e9,
    }
}

/// CPU seconds this process has run (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`).
fn process_cpu_secs() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: the C library's clock_gettime writes one timespec.
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// A throughput in GFLOP/s: the median and the best of several runs.
#[derive(Clone, Copy)]
pub struct Rate {
    /// The median run.
    pub median: f64,
    /// The fastest run (what a quiet machine gives, on a loaded one).
    pub best: f64,
}

impl Rate {
    /// The best median and the best run of several measurements of one
    /// workload: a busy machine only ever slows a run down, so the best
    /// round is the closest to the workload's own speed.
    pub fn best_of(rounds: &[Rate]) -> Rate {
        Rate {
            median: rounds.iter().map(|r| r.median).fold(0.0, f64::max),
            best: rounds.iter().map(|r| r.best).fold(0.0, f64::max),
        }
    }
}

/// The rounds of every workload of a bench, each round our run and then
/// PyTorch's (when `torch` is running), for [`Rounds::report`]. A bench
/// goes through all its workloads once per round, so a workload's rounds
/// lie a whole pass apart: a neighbour slowing this machine down for a
/// minute (on this VM it can halve the AVX-512 throughput) is then unlikely
/// to catch every round of one workload, and within a round both sides run
/// seconds apart.
pub struct Rounds {
    torch: Option<Torch>,
    /// The workloads in first-measured order.
    rows: Vec<Workload>,
}

/// One workload's rounds so far.
struct Workload {
    name: String,
    peak: Rate,
    ours: Vec<Rate>,
    torch: Vec<Rate>,
}

impl Rounds {
    /// No rounds yet, against `torch` when it is running.
    pub fn new(torch: Option<Torch>) -> Rounds {
        Rounds {
            torch,
            rows: Vec::new(),
        }
    }

    /// One round of `workload`: `ours`, then PyTorch's run of it.
    pub fn measure(&mut self, workload: &str, peak: Rate, ours: impl FnOnce() -> Rate) {
        let us = ours();
        let them = self.torch.as_mut().and_then(|t| t.measure(workload));
        let row = match self.rows.iter().position(|r| r.name == workload) {
            Some(at) => &mut self.rows[at],
            None => {
                self.rows.push(Workload {
                    name: workload.to_string(),
                    peak,
                    ours: Vec::new(),
                    torch: Vec::new(),
                });
                self.rows.last_mut().expect("just pushed")
            }
        };
        row.ours.push(us);
        row.torch.extend(them);
    }

    /// Reports each workload's best round of each side against its peak
    /// (impls `tessera` and `torch`) and the ratio of those medians
    /// (`tessera/torch`).
    pub fn report(self) {
        for w in &self.rows {
            let r = Rate::best_of(&w.ours);
            report(&w.name, "tessera", r, w.peak);
            if !w.torch.is_empty() {
                let t = Rate::best_of(&w.torch);
                report(&w.name, "torch", t, w.peak);
                line(&w.name, "tessera/torch", "ratio", r.median / t.median, "x");
            }
        }
    }
}

/// The `--rounds=N` argument of a bench (how many [`Rounds`] it runs), 3
/// when absent.
pub fn rounds_arg() -> usize {
    std::env::args()
        .find_map(|a| a.strip_prefix("--rounds=").and_then(|n| n.parse().ok()))
        .unwrap_or(3)
}

/// Reps for a product of `flop` operations: about half a second of work
/// at 400 GFLOP/s, at least 5 and at most 1000. Small products need the
/// many reps: this machine's neighbours slow it down in bursts of a tenth
/// of a second, which swallowed the whole 50-rep run of a 512³ product.
pub fn reps_for(flop: f64) -> usize {
    ((2e11 / flop) as usize).clamp(5, 1000)
}

/// Prints one bench line.
pub fn line(workload: &str, imp: &str, metric: &str, value: f64, unit: &str) {
    println!("bench\t{workload}\t{imp}\t{metric}\t{value:.3}\t{unit}");
}

/// Prints the throughput lines of one workload: median and best, and each
/// as a fraction of the same statistic of `peak`.
pub fn report(workload: &str, imp: &str, r: Rate, peak: Rate) {
    line(workload, imp, "throughput", r.median, "GFLOP/s");
    line(workload, imp, "fraction_of_peak", r.median / peak.median, "ratio");
    line(workload, imp, "throughput_best", r.best, "GFLOP/s");
    line(
        workload,
        imp,
        "fraction_of_peak_best",
        r.best / peak.best,
        "ratio",
    );
}

/// The f32 FMA peak of all cores in GFLOP/s, measured by independent
/// register-only FMA chains on every rayon thread (AVX-512 where the CPU
/// has it, else AVX2+FMA), median and best of several runs; prints it.
pub fn fma_peak() -> Rate {
    let threads = rayon::current_num_threads();
    let iters: u64 = 1_000_000;
    let (flop_per_iter, run): (f64, fn(u64) -> f32) = fma_loop();
    let flop = threads as f64 * iters as f64 * flop_per_iter;
    let r = rates(flop, 101, || {
        let sum: f32 = rayon::broadcast(|_| run(std::hint::black_box(iters)))
            .into_iter()
            .sum();
        std::hint::black_box(sum);
    });
    line("fma_peak_f32", "tessera", "throughput", r.median, "GFLOP/s");
    line("fma_peak_f32", "tessera", "throughput_best", r.best, "GFLOP/s");
    r
}

/// The bf16 dot-product peak of all cores in GFLOP/s (each `vdpbf16ps`
/// lane does two multiply-adds), measured like [`fma_peak`]; prints it, or
/// says why not and returns `None` where the CPU lacks AVX512-BF16.
#[allow(dead_code)] // only the GEMM bench probes it; the module is shared
pub fn bf16_peak() -> Option<Rate> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512bf16") {
        let threads = rayon::current_num_threads();
        let iters: u64 = 1_000_000;
        let flop = threads as f64 * iters as f64 * (CHAINS * 16 * 4) as f64;
        let r = rates(flop, 101, || {
            // SAFETY: the feature was just detected.
            rayon::broadcast(|_| unsafe { x86::dpbf16(std::hint::black_box(iters)) });
        });
        line("bf16_peak", "tessera", "throughput", r.median, "GFLOP/s");
        line("bf16_peak", "tessera", "throughput_best", r.best, "GFLOP/s");
        return Some(r);
    }
    println!("# bf16_peak skipped: the CPU lacks AVX512-BF16");
    None
}

/// The widest FMA loop this CPU runs: flop per iteration and the loop.
fn fma_loop() -> (f64, fn(u64) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY (of the call inside): the feature was just detected.
            return (CHAINS as f64 * 16.0 * 2.0, |n| unsafe { x86::fma512(n) });
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return (CHAINS as f64 * 8.0 * 2.0, |n| unsafe { x86::fma256(n) });
        }
    }
    (CHAINS as f64 * 2.0, scalar_fma)
}

/// Independent accumulator chains: more than FMA units × FMA latency.
const CHAINS: usize = 12;

fn scalar_fma(n: u64) -> f32 {
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..n {
        for a in &mut acc {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    acc.iter().sum()
}

/// The FMA loops in assembly, so every accumulator provably stays in a
/// register (a compiled array of vectors may live on the stack).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// `n` iterations of 12 independent 16-lane FMAs.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(n: u64) -> f32 {
        // SAFETY: touches only the named registers; avx512f is enabled.
        unsafe {
            asm!(
                "vpxord zmm0, zmm0, zmm0", "vmovaps zmm1, zmm0", "vmovaps zmm2, zmm0",
                "vmovaps zmm3, zmm0", "vmovaps zmm4, zmm0", "vmovaps zmm5, zmm0",
                "vmovaps zmm6, zmm0", "vmovaps zmm7, zmm0", "vmovaps zmm8, zmm0",
                "vmovaps zmm9, zmm0", "vmovaps zmm10, zmm0", "vmovaps zmm11, zmm0",
                "vmovaps zmm12, zmm0", "vmovaps zmm13, zmm0",
                "2:",
                "vfmadd231ps zmm0, zmm12, zmm13", "vfmadd231ps zmm1, zmm12, zmm13",
                "vfmadd231ps zmm2, zmm12, zmm13", "vfmadd231ps zmm3, zmm12, zmm13",
                "vfmadd231ps zmm4, zmm12, zmm13", "vfmadd231ps zmm5, zmm12, zmm13",
                "vfmadd231ps zmm6, zmm12, zmm13", "vfmadd231ps zmm7, zmm12, zmm13",
                "vfmadd231ps zmm8, zmm12, zmm13", "vfmadd231ps zmm9, zmm12, zmm13",
                "vfmadd231ps zmm10, zmm12, zmm13", "vfmadd231ps zmm11, zmm12, zmm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _,
                options(nomem, nostack),
            );
        }
        0.0
    }

    /// `n` iterations of 12 independent 16-lane bf16 pair dot products.
    #[allow(dead_code)] // see `bf16_peak`
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dpbf16(n: u64) {
        // SAFETY: touches only the named registers; avx512bf16 is enabled.
        unsafe {
            asm!(
                "vpxord zmm0, zmm0, zmm0", "vmovaps zmm1, zmm0", "vmovaps zmm2, zmm0",
                "vmovaps zmm3, zmm0", "vmovaps zmm4, zmm0", "vmovaps zmm5, zmm0",
                "vmovaps zmm6, zmm0", "vmovaps zmm7, zmm0", "vmovaps zmm8, zmm0",
                "vmovaps zmm9, zmm0", "vmovaps zmm10, zmm0", "vmovaps zmm11, zmm0",
                "vmovaps zmm12, zmm0", "vmovaps zmm13, zmm0",
                "2:",
                "vdpbf16ps zmm0, zmm12, zmm13", "vdpbf16ps zmm1, zmm12, zmm13",
                "vdpbf16ps zmm2, zmm12, zmm13", "vdpbf16ps zmm3, zmm12, zmm13",
                "vdpbf16ps zmm4, zmm12, zmm13", "vdpbf16ps zmm5, zmm12, zmm13",
                "vdpbf16ps zmm6, zmm12, zmm13", "vdpbf16ps zmm7, zmm12, zmm13",
                "vdpbf16ps zmm8, zmm12, zmm13", "vdpbf16ps zmm9, zmm12, zmm13",
                "vdpbf16ps zmm10, zmm12, zmm13", "vdpbf16ps zmm11, zmm12, zmm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _,
                options(nomem, nostack),
            );
        }
    }

    /// `n` iterations of 12 independent 8-lane FMAs.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(n: u64) -> f32 {
        // SAFETY: touches only the named registers; avx2 and fma are enabled.
        unsafe {
            asm!(
                "vxorps ymm0, ymm0, ymm0", "vmovaps ymm1, ymm0", "vmovaps ymm2, ymm0",
                "vmovaps ymm3, ymm0", "vmovaps ymm4, ymm0", "vmovaps ymm5, ymm0",
                "vmovaps ymm6, ymm0", "vmovaps ymm7, ymm0", "vmovaps ymm8, ymm0",
                "vmovaps ymm9, ymm0", "vmovaps ymm10, ymm0", "vmovaps ymm11, ymm0",
                "vmovaps ymm12, ymm0", "vmovaps ymm13, ymm0",
                "2:",
                "vfmadd231ps ymm0, ymm12, ymm13", "vfmadd231ps ymm1, ymm12, ymm13",
                "vfmadd231ps ymm2, ymm12, ymm13", "vfmadd231ps ymm3, ymm12, ymm13",
                "vfmadd231ps ymm4, ymm12, ymm13", "vfmadd231ps ymm5, ymm12, ymm13",
                "vfmadd231ps ymm6, ymm12, ymm13", "vfmadd231ps ymm7, ymm12, ymm13",
                "vfmadd231ps ymm8, ymm12, ymm13", "vfmadd231ps ymm9, ymm12, ymm13",
                "vfmadd231ps ymm10, ymm12, ymm13", "vfmadd231ps ymm11, ymm12, ymm13",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) n => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _,
                options(nomem, nostack),
            );
        }
        0.0
    }
}

/// PyTorch measuring the workloads of `tensor/benches/torch_ref.py <what>`
/// in a child process, one at a time when asked (see [`Rounds`]), so
/// both sides' figures come from the same minutes: this machine's speed
/// drifts between minutes, and measured a whole bench run apart the
/// ratios moved by 10%.
pub struct Torch(Twin);

impl Torch {
    /// Starts the script under the python `TESSERA_TORCH_PYTHON` names, on
    /// as many threads as the rayon pool has; `None`, saying why, when the
    /// variable is unset or the python does not start.
    pub fn start(what: &str) -> Option<Torch> {
        let Ok(py) = std::env::var("TESSERA_TORCH_PYTHON") else {
            println!("# torch reference skipped: set TESSERA_TORCH_PYTHON to a python with torch");
            return None;
        };
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_ref.py");
        let threads = rayon::current_num_threads().to_string();
        Twin::start(&py, &[script, what, &threads]).map(Torch)
    }

    /// PyTorch's rate on `workload`, measured now; `None`, saying why,
    /// when the script does not know the workload or has stopped (its
    /// error is on stderr).
    pub fn measure(&mut self, workload: &str) -> Option<Rate> {
        let line = self.0.ask(workload)?;
        let f: Vec<&str> = line.split('\t').collect();
        match (
            f.get(1).and_then(|v| v.parse().ok()),
            f.get(2).and_then(|v| v.parse().ok()),
        ) {
            (Some(median), Some(best)) => Some(Rate { median, best }),
            _ => {
                println!("# torch: {line}");
                None
            }
        }
    }
}
