//! Memory-bound CPU kernels on all cores, as bench lines
//! (`bench\t<workload>\t<impl>\t<metric>\t<value>\t<unit>`):
//! `copy_f32_16M` (a plain parallel memory copy, the bandwidth yardstick),
//! `add_f32_16M`, `sum_f32_16M`, `layer_norm_8192x768` (fwd, fwd+bwd),
//! `softmax_8192x1024`, `gelu_16M` (exact GELU forward, and its fused
//! backward `gelu_backward(g, x)`), each in GB/s of bytes read plus written, and the
//! allocator's effect: the same workloads with the caching allocator on and
//! off. Every figure is the best of repeated runs (the machine is shared);
//! the load average is printed first. With `TESSERA_TORCH_PYTHON` set to a
//! Python with PyTorch, `torch_elementwise.py` prints PyTorch's lines for the
//! same workloads in the same run.

use std::time::{Duration, Instant};

use rayon::prelude::*;
use tessera_tensor::{alloc, BinaryOp, GeluApprox, SimdLevel, Tensor};

const N16M: usize = 1 << 24;

fn main() {
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let one = load.split_whitespace().next().unwrap_or("?");
        println!("bench\tmachine\tload\tloadavg_1min\t{one}\tprocs");
    }
    println!(
        "# simd level {}, {} threads",
        SimdLevel::best().name(),
        rayon::current_num_threads()
    );
    let gb = |bytes: usize, secs: f64| bytes as f64 / secs / 1e9;
    let line =
        |w: &str, metric: &str, v: f64, unit: &str| println!("bench\t{w}\ttessera\t{metric}\t{v:.2}\t{unit}");

    let a = Tensor::from_vec(values(N16M, 1), &[N16M]).expect("shape");
    let b = Tensor::from_vec(values(N16M, 2), &[N16M]).expect("shape");
    let src = values(N16M, 3);
    let mut dst = vec![0.0f32; N16M];
    let chunk = N16M.div_ceil(rayon::current_num_threads() * 4);
    let t = best(|| {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
    });
    let copy = gb(2 * 4 * N16M, t);
    line("copy_f32_16M", "bandwidth", copy, "GB/s");

    let add = gb(3 * 4 * N16M, best(|| drop(a.add(&b).expect("add"))));
    line("add_f32_16M", "bandwidth", add, "GB/s");
    line("add_f32_16M", "fraction_of_copy", add / copy, "ratio");
    let sum = gb(4 * N16M, best(|| drop(a.sum(&[], false).expect("sum"))));
    line("sum_f32_16M", "bandwidth", sum, "GB/s");
    line("sum_f32_16M", "fraction_of_copy", sum / copy, "ratio");

    let (rows, k) = (8192usize, 768usize);
    let x = Tensor::from_vec(values(rows * k, 4), &[rows, k]).expect("shape");
    let w = Tensor::from_vec(values(k, 5), &[k]).expect("shape");
    let bias = Tensor::from_vec(values(k, 6), &[k]).expect("shape");
    let dy = Tensor::from_vec(values(rows * k, 7), &[rows, k]).expect("shape");
    let bytes = 4 * rows * k;
    let fwd = || {
        x.layer_norm_forward(&[k], Some(&w), Some(&bias), 1e-5)
            .expect("layer_norm")
    };
    line(
        "layer_norm_8192x768",
        "fwd_bandwidth",
        gb(2 * bytes, best(|| drop(fwd()))),
        "GB/s",
    );
    let step = || {
        let (_, mean, rstd) = fwd();
        Tensor::layer_norm_backward(&dy, &x, &mean, &rstd, &[k], Some(&w)).expect("backward")
    };
    line(
        "layer_norm_8192x768",
        "fwd_bwd_bandwidth",
        gb(5 * bytes, best(|| drop(step()))),
        "GB/s",
    );

    let s = Tensor::from_vec(values(8192 * 1024, 8), &[8192, 1024]).expect("shape");
    let sbytes = 2 * 4 * 8192 * 1024;
    let soft = || drop(s.softmax(-1).expect("softmax"));
    line(
        "softmax_8192x1024",
        "fwd_bandwidth",
        gb(sbytes, best(soft)),
        "GB/s",
    );

    let gelu = gb(
        2 * 4 * N16M,
        best(|| drop(a.gelu(GeluApprox::None).expect("gelu"))),
    );
    line("gelu_16M", "fwd_bandwidth", gelu, "GB/s");
    let gelu_bwd = best(|| drop(b.binary_op(BinaryOp::GeluErfBackward, &a).expect("gelu_backward")));
    line("gelu_16M", "bwd_bandwidth", gb(3 * 4 * N16M, gelu_bwd), "GB/s");

    // The allocator: the same workloads with freed blocks cached or not.
    let chain = || {
        let y = a
            .mul(&b)
            .and_then(|y| y.add(&a))
            .and_then(|y| y.relu())
            .expect("chain");
        drop(y.exp().expect("exp"));
    };
    for (name, bytes, f) in [
        ("softmax_8192x1024", sbytes, &soft as &dyn Fn()),
        ("chain4_f32_16M", 4 * 3 * 4 * N16M, &chain as &dyn Fn()),
    ] {
        for on in [true, false] {
            alloc::set_caching(on);
            let v = gb(bytes, best(f));
            line(
                name,
                if on {
                    "cache_on_bandwidth"
                } else {
                    "cache_off_bandwidth"
                },
                v,
                "GB/s",
            );
        }
        alloc::set_caching(true);
    }

    match std::env::var("TESSERA_TORCH_PYTHON") {
        Ok(py) => {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_elementwise.py");
            let threads = rayon::current_num_threads().to_string();
            match std::process::Command::new(py).arg(script).arg(threads).output() {
                Ok(out) => print!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => println!("# pytorch comparison failed to start: {e}"),
            }
        }
        Err(_) => println!("# pytorch comparison skipped: set TESSERA_TORCH_PYTHON to a python with torch"),
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// The best time in seconds of `f` over about 0.6 s of runs (at least 5).
fn best(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 5 || start.elapsed() < Duration::from_millis(600) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}
