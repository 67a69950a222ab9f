//! Inference of torchvision's ResNet-50 (eval mode: BatchNorm on its running
//! statistics, no autograd graph) on 3×224×224 inputs: `infer_resnet50_b1`,
//! the latency of one image (median of the runs), and `infer_resnet50_b32`,
//! the throughput at batch 32 (best of the rounds), on all cores. When
//! `TESSERA_TORCH_PYTHON` names a Python with torch, the same figures for
//! PyTorch eager under `torch.inference_mode()` (`benches/infer_torch.py`,
//! its ResNet-50 written out so torchvision is not needed) and the ratio.
//!
//! `cargo bench --bench infer [-- --runs N]`

use std::process::Command;
use std::time::Instant;

use tessera::autograd::{no_grad, Var};
use tessera::nn::models::{ResNet, ResNetConfig};
use tessera::nn::Module;
use tessera::tensor::{manual_seed, DType, Tensor};

/// torchvision's `resnet50()` parameter count (the twin asserts it too).
const RESNET50_PARAMETERS: usize = 25_557_032;

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# {} threads, {runs} runs per workload; load average at start: {}",
        rayon::current_num_threads(),
        load.trim()
    );
    manual_seed(0);
    let mut model = ResNet::new(&ResNetConfig::resnet50()).expect("model builds");
    assert_eq!(model.num_parameters(), RESNET50_PARAMETERS);
    model.eval();
    let torch_python = std::env::var("TESSERA_TORCH_PYTHON").ok();
    for batch in [1usize, 32] {
        let name = format!("infer_resnet50_b{batch}");
        let x = Var::constant(Tensor::randn(&[batch, 3, 224, 224], DType::F32).unwrap());
        let forward = || no_grad(|| model.forward(&x).unwrap());
        for _ in 0..2 {
            forward();
        }
        let mut times: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let y = forward();
                assert_eq!(y.shape(), &[batch, 1000]);
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let ours = report(&name, "tessera", &times, batch);
        match &torch_python {
            Some(py) => torch(py, &name, batch, runs, ours),
            None => println!("# TESSERA_TORCH_PYTHON not set: skipped PyTorch eager for {name}"),
        }
    }
}

/// Prints the bench line of a workload from its sorted run times: the
/// median latency in ms at batch 1, else the best throughput in images/s;
/// returns that figure.
fn report(name: &str, imp: &str, sorted: &[f64], batch: usize) -> f64 {
    if batch == 1 {
        let ms = sorted[sorted.len() / 2] * 1e3;
        println!("bench\t{name}\t{imp}\tlatency\t{ms:.2}\tms");
        ms
    } else {
        let rate = batch as f64 / sorted[0];
        println!("bench\t{name}\t{imp}\tthroughput\t{rate:.1}\timages/s");
        rate
    }
}

/// Runs the PyTorch twin and prints its line and our ratio to it (speed:
/// > 1 means tessera is faster, for latency and throughput alike).
fn torch(py: &str, name: &str, batch: usize, runs: usize, ours: f64) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/infer_torch.py");
    let out = match Command::new(py)
        .args([script, &batch.to_string(), &runs.to_string()])
        .output()
    {
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
    let mut times: Vec<f64> = out.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    if times.len() != runs {
        println!("# torch {name}: expected {runs} run times, got {out:?}");
        return;
    }
    times.sort_by(f64::total_cmp);
    let theirs = report(name, "torch_eager", &times, batch);
    let speed = if batch == 1 { theirs / ours } else { ours / theirs };
    println!("bench\t{name}\ttessera/torch\tratio\t{speed:.3}\tx");
}
