//! A first look at tessera's tensors: creation, views, broadcasting,
//! reductions, and a timed matrix product reported in GFLOP/s.
//!
//! Run with `cargo run --release --example quickstart`.

use std::time::Instant;

use tessera::prelude::*;
use tessera::tensor::manual_seed;

fn main() -> Result<()> {
    // Creation and views: `t()` and `narrow` share storage, they never copy.
    let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.reshape([2, 3])?;
    println!("a =\n{a}");
    let at = a.t()?;
    println!(
        "a.t() is a view: {} (strides {:?})",
        at.shares_storage(&a),
        at.strides()
    );
    println!("a[:, 1:] =\n{}", a.narrow(1, 1, 2)?);

    // Broadcasting: [2, 3] + [3] and [2, 1] * [3].
    let row = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3])?;
    let col = Tensor::from_vec(vec![1.0f32, -1.0], &[2, 1])?;
    println!("a + row =\n{}", a.add(&row)?);
    println!("col * row =\n{}", col.mul(&row)?);

    // Reductions over any set of dims, and a numerically stable softmax.
    println!("sum over dim 1: {}", a.sum(&[1], false)?);
    println!("mean of all: {}", a.mean(&[], false)?);
    println!("softmax over dim 1 =\n{}", a.softmax(1)?);

    // A timed GEMM on all cores.
    manual_seed(0);
    let n = 1024;
    let x = Tensor::randn(&[n, n], DType::F32)?;
    let y = Tensor::randn(&[n, n], DType::F32)?;
    x.matmul(&y)?; // warm-up: packing buffers and thread pool
    let reps = 5;
    let start = Instant::now();
    for _ in 0..reps {
        x.matmul(&y)?;
    }
    let secs = start.elapsed().as_secs_f64() / reps as f64;
    let gflops = 2.0 * (n as f64).powi(3) / secs / 1e9;
    println!(
        "matmul {n}x{n}x{n} f32 on {} cores: {:.2} ms, {gflops:.1} GFLOP/s",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        secs * 1e3
    );
    Ok(())
}
