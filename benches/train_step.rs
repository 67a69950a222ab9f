//! Training-step throughput: `train_step_mlp` (784-512-512-10, ReLU) and
//! `train_step_cnn` (the MNIST CNN of `examples/train_mnist.rs`), batch 128,
//! f32, cross-entropy, SGD with momentum, all cores. Prints samples/s and
//! the peak resident memory of each workload as bench lines, and, when
//! `TESSERA_TORCH_PYTHON` names a Python with torch, the same figures for
//! PyTorch eager (`benches/train_step_torch.py`) and the ratio.
//!
//! Each figure is the best of 3 rounds of N steps (after 3 warm-up steps):
//! the machines we measure on are shared, and the best round is the one
//! least disturbed by other load. Both implementations of a workload are
//! measured back to back.
//!
//! `cargo bench --bench train_step [-- --steps N]`

use std::process::Command;
use std::time::Instant;

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::models::{mnist_cnn, mnist_mlp};
use tessera::nn::{Module, Sequential};
use tessera::optim::{Optimizer, Sgd, SgdOptions};
use tessera::tensor::{manual_seed, DType, Tensor};

const BATCH: usize = 128;

/// Builds a workload's model.
type BuildModel = fn() -> tessera::tensor::Result<Sequential>;
const ROUNDS: usize = 3;

fn main() {
    let steps: usize = std::env::args()
        .skip_while(|a| a != "--steps")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# {} threads, batch {BATCH}, {steps} timed steps; load average at start: {}",
        rayon::current_num_threads(),
        load.trim()
    );
    let torch_python = std::env::var("TESSERA_TORCH_PYTHON").ok();
    let workloads: [(&str, BuildModel, &[usize]); 2] = [
        ("train_step_mlp", || mnist_mlp(&[512, 512]), &[BATCH, 784]),
        ("train_step_cnn", mnist_cnn, &[BATCH, 1, 28, 28]),
    ];
    for (name, build, input) in workloads {
        reset_peak_rss();
        let model = build().expect("model builds");
        let (rate, phases) = measure(&model, input, steps);
        let rss = peak_rss_mib();
        println!("bench\t{name}\ttessera\tthroughput\t{rate:.1}\tsamples/s");
        println!("bench\t{name}\ttessera\tpeak_rss\t{rss:.1}\tMiB");
        println!(
            "# {name} tessera phases (ms per step, best round): forward {:.2}, loss {:.2}, backward {:.2}, optimizer {:.2}, drop {:.2}",
            phases[0], phases[1], phases[2], phases[3], phases[4]
        );
        match &torch_python {
            Some(py) => torch(py, steps, name, rate),
            None => println!("# TESSERA_TORCH_PYTHON not set: skipped PyTorch eager for {name}"),
        }
    }
}

/// Samples per second of the best of [`ROUNDS`] rounds of `steps` training
/// steps on random inputs of `shape`, after 3 warm-up steps; and the time
/// per step of its phases (forward, loss, backward, optimizer step, freeing
/// the graph and gradients) in ms, from the best of [`ROUNDS`] further
/// rounds timed phase by phase.
fn measure(model: &Sequential, shape: &[usize], steps: usize) -> (f64, [f64; 5]) {
    manual_seed(0);
    let x = Var::constant(Tensor::randn(shape, DType::F32).unwrap());
    let y = Tensor::randint(0, 10, &[BATCH], DType::I64).unwrap();
    let opts = SgdOptions {
        lr: 0.01,
        momentum: 0.9,
        ..Default::default()
    };
    let mut opt = Sgd::new(model.parameters(), opts).unwrap();
    let ce = CrossEntropyOptions::default();
    let mut step = || {
        let loss = model
            .forward(&x)
            .unwrap()
            .cross_entropy(Target::Indices(&y), &ce)
            .unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    };
    for _ in 0..3 {
        step();
    }
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..steps {
            step();
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mut phases = [f64::INFINITY; 5];
    for _ in 0..ROUNDS {
        let mut round = [0.0f64; 5];
        for _ in 0..steps {
            let mut t = Instant::now();
            let mut lap = |k: usize| {
                round[k] += t.elapsed().as_secs_f64();
                t = Instant::now();
            };
            let out = model.forward(&x).unwrap();
            lap(0);
            let loss = out.cross_entropy(Target::Indices(&y), &ce).unwrap();
            lap(1);
            let grads = loss.backward().unwrap();
            lap(2);
            opt.step(&grads).unwrap();
            lap(3);
            drop((out, loss, grads));
            lap(4);
        }
        if round.iter().sum::<f64>() < phases.iter().sum::<f64>() {
            phases = round;
        }
    }
    let per_step = |s: f64| s * 1e3 / steps as f64;
    ((steps * BATCH) as f64 / best, phases.map(per_step))
}

/// Resets VmHWM (Linux ≥ 4.0), so each workload reports its own peak.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// VmHWM, the peak resident set size, in MiB (0 where unavailable).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs the PyTorch twin of workload `name` in its own process and prints
/// its lines and our ratio to it (`rate` is ours).
fn torch(py: &str, steps: usize, name: &str, rate: f64) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/train_step_torch.py");
    let out = Command::new(py).args([script, name, &steps.to_string()]).output();
    let out = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            println!(
                "# torch {name} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            println!("# could not run {py}: {e}");
            return;
        }
    };
    print!("{out}");
    let theirs = out
        .lines()
        .filter(|l| l.contains("\tthroughput\t"))
        .find_map(|l| l.split('\t').nth(4).and_then(|v| v.parse::<f64>().ok()));
    if let Some(t) = theirs {
        println!("bench\t{name}\ttessera/torch\tratio\t{:.3}\tx", rate / t);
    }
}
