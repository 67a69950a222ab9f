//! GEMM throughput on all cores: `bench\tgemm_f32_<n>\ttessera\tthroughput\t<v>\tGFLOP/s`
//! for square n = 128 … 1024, each followed by its fraction of the nominal
//! f32 FMA peak (2 FMA units × 16 lanes × 2 flop × 3 GHz per core).

use std::time::{Duration, Instant};

use tessera_tensor::Tensor;

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = cores as f64 * 2.0 * 16.0 * 2.0 * 3.0;
    println!("bench\tfma_peak_f32_nominal\ttessera\tpeak\t{peak:.1}\tGFLOP/s");
    for n in [128usize, 256, 512, 1024] {
        let a = Tensor::from_vec(values(n * n, 1), &[n, n]).expect("shape");
        let b = Tensor::from_vec(values(n * n, 2), &[n, n]).expect("shape");
        let gflops = best_rate(2.0 * (n * n * n) as f64, || {
            std::hint::black_box(a.matmul(&b).expect("matmul"));
        });
        println!("bench\tgemm_f32_{n}\ttessera\tthroughput\t{gflops:.1}\tGFLOP/s");
        println!(
            "bench\tgemm_f32_{n}\ttessera\tfraction_of_peak\t{:.3}\tratio",
            gflops / peak
        );
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// The best rate in GFLOP/s over repeated runs of `f` for about half a second.
fn best_rate(flop: f64, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    while start.elapsed() < Duration::from_millis(500) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    flop / best / 1e9
}
