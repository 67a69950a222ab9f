//! Autograd benchmarks, one `bench` line per figure:
//! - `tape_overhead`: forward + backward of a chain of 10,000 ops on
//!   1-element tensors, in µs per recorded op (bar: ≤ 2 µs), with the
//!   forward and backward shares;
//! - `mlp_784_512_512_10`: forward + backward of a 784-512-512-10 ReLU MLP
//!   with cross-entropy at batch 128 (f32), in samples/s.

use std::time::{Duration, Instant};

use tessera_autograd::{CrossEntropyOptions, Target, Var};
use tessera_tensor::{manual_seed, DType, Result, Tensor};

const CHAIN: usize = 10_000;
const BATCH: usize = 128;

/// Runs every workload, or only those whose names contain a command-line
/// argument (`cargo bench --bench tape -- tape_overhead`).
fn main() -> Result<()> {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    if wanted("tape_overhead") {
        tape_overhead()?;
    }
    if wanted("mlp_784_512_512_10") {
        mlp()?;
    }
    Ok(())
}

fn tape_overhead() -> Result<()> {
    let x = Var::leaf(Tensor::from_vec(vec![0.5f32], &[1])?);
    let w = Var::leaf(Tensor::from_vec(vec![0.999f32], &[1])?);
    let (mut best_fwd, mut best_bwd) = (f64::INFINITY, f64::INFINITY);
    let start = Instant::now();
    let mut runs = 0;
    while runs < 3 || start.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let mut y = x.clone();
        // Alternate a two-input op with a leaf (its gradient accumulates)
        // and a one-input op: CHAIN recorded ops in all.
        for i in 0..CHAIN {
            y = if i % 2 == 0 {
                y.mul(&w)?
            } else {
                y.add_scalar(0.001)?
            };
        }
        let fwd = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let grads = y.sum(&[], false)?.backward()?;
        std::hint::black_box(grads.get(&w));
        let bwd = t.elapsed().as_secs_f64();
        best_fwd = best_fwd.min(fwd);
        best_bwd = best_bwd.min(bwd);
        runs += 1;
    }
    let us = |s: f64| s * 1e6 / CHAIN as f64;
    println!(
        "bench\ttape_overhead\ttessera\tus_per_op\t{:.3}\tus",
        us(best_fwd + best_bwd)
    );
    println!(
        "bench\ttape_overhead\ttessera\tforward_us_per_op\t{:.3}\tus",
        us(best_fwd)
    );
    println!(
        "bench\ttape_overhead\ttessera\tbackward_us_per_op\t{:.3}\tus",
        us(best_bwd)
    );
    println!("bench\ttape_overhead\ttessera\tbar\t2.000\tus");
    Ok(())
}

fn mlp() -> Result<()> {
    manual_seed(0);
    let layer = |fan_in: usize, fan_out: usize| -> Result<(Var, Var)> {
        let bound = 1.0 / (fan_in as f64).sqrt();
        Ok((
            Var::leaf(Tensor::uniform(&[fan_out, fan_in], -bound, bound, DType::F32)?),
            Var::leaf(Tensor::uniform(&[fan_out], -bound, bound, DType::F32)?),
        ))
    };
    let layers = [layer(784, 512)?, layer(512, 512)?, layer(512, 10)?];
    let x = Var::constant(Tensor::randn(&[BATCH, 784], DType::F32)?);
    let labels = Tensor::randint(0, 10, &[BATCH], DType::I64)?;
    let step = || -> Result<()> {
        let mut h = x.clone();
        for (i, (w, b)) in layers.iter().enumerate() {
            h = h.linear(w, Some(b))?;
            if i + 1 < layers.len() {
                h = h.relu()?;
            }
        }
        let loss = h.cross_entropy(Target::Indices(&labels), &CrossEntropyOptions::default())?;
        std::hint::black_box(loss.backward()?);
        Ok(())
    };
    step()?;
    let start = Instant::now();
    let mut best = f64::INFINITY;
    while start.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        step()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "bench\tmlp_784_512_512_10\ttessera\tthroughput\t{:.0}\tsamples/s",
        BATCH as f64 / best
    );
    println!(
        "bench\tmlp_784_512_512_10\ttessera\tstep_time\t{:.3}\tms",
        best * 1e3
    );
    Ok(())
}
