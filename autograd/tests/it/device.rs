//! Backward on the CUDA backend (the emulated device under `cuda-emu`)
//! equals backward on the CPU: every derivative rule is made of tensor ops,
//! so the same graph runs on either device. Shapes come from proptest and
//! stay small. Elementwise rules round like the CPU's up to the kernels'
//! libm (2e-5 relative in f32); reductions (linear's bias, embedding's
//! atomics) sum in another order (1e-4). Without a device the tests print
//! why they skipped.
#![cfg(feature = "cuda")]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tessera_autograd::Var;
use tessera_tensor::{DType, Device, GeluApprox, Generator, Result, Tensor};

const DEV: Device = Device::Cuda(0);

fn gpu() -> bool {
    DEV.available()
        .map_err(|e| println!("skipped: no CUDA device ({e})"))
        .is_ok()
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.cpu()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

fn close(what: &str, cpu: &Tensor, gpu: &Tensor, rtol: f64) -> std::result::Result<(), TestCaseError> {
    prop_assert_eq!(gpu.device(), DEV, "{}: gradient left the device", what);
    prop_assert_eq!(cpu.shape(), gpu.shape(), "{}: shape", what);
    for (i, (c, g)) in values(cpu).into_iter().zip(values(gpu)).enumerate() {
        prop_assert!(
            c == g || (c.is_nan() && g.is_nan()) || (c - g).abs() <= rtol * (1.0 + c.abs()),
            "{}: element {}: cpu {} vs gpu {}",
            what,
            i,
            c,
            g
        );
    }
    Ok(())
}

type Unary = fn(&Var) -> Result<Var>;

/// The elementwise ops whose backward runs on the GPU.
const UNARY: [(&str, Unary); 17] = [
    ("neg", |x| x.neg()),
    ("abs", |x| x.abs()),
    ("exp", |x| x.exp()),
    ("log", |x| x.abs()?.add_scalar(0.5)?.log()),
    ("log1p", |x| x.abs()?.log1p()),
    ("expm1", |x| x.expm1()),
    ("sqrt", |x| x.abs()?.add_scalar(0.5)?.sqrt()),
    ("rsqrt", |x| x.abs()?.add_scalar(0.5)?.rsqrt()),
    ("recip", |x| x.abs()?.add_scalar(0.5)?.recip()),
    ("square", |x| x.square()),
    ("sin", |x| x.sin()),
    ("tanh", |x| x.tanh()),
    ("sigmoid", |x| x.sigmoid()),
    ("relu", |x| x.relu()),
    ("gelu", |x| {
        x.gelu(GeluApprox::None)?.add(&x.gelu(GeluApprox::Tanh)?)
    }),
    ("silu", |x| x.silu()),
    ("erf", |x| x.erf()),
];

/// `f` of a leaf holding `x`, backward with `g`: the leaf's gradient.
fn grad_of(f: Unary, x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let leaf = Var::leaf(x.clone());
    let grads = f(&leaf)?.backward_with(g)?;
    Ok(grads.get(&leaf).expect("the leaf needs a gradient").clone())
}

#[test]
fn elementwise_backward_on_the_device_equals_the_cpu() {
    if !gpu() {
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: 8,
        ..Config::default()
    });
    let shapes = prop::collection::vec(1usize..6, 1..4);
    runner
        .run(&(shapes, any::<u64>()), |(shape, seed)| {
            let (x, g) = (randn(&shape, seed), randn(&shape, seed ^ 1));
            let (xd, gd) = (x.to_device(DEV).unwrap(), g.to_device(DEV).unwrap());
            for (name, f) in UNARY {
                close(
                    name,
                    &grad_of(f, &x, &g).unwrap(),
                    &grad_of(f, &xd, &gd).unwrap(),
                    2e-5,
                )?;
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn embedding_and_bias_backward_on_the_device_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: 8,
        ..Config::default()
    });
    let case = (
        1usize..7,
        1usize..5,
        1usize..9,
        any::<u64>(),
        prop::option::of(0usize..7),
    );
    runner
        .run(&case, |(vocab, dim, n, seed, pad)| {
            let pad = pad.filter(|&p| p < vocab);
            let idx: Vec<i64> = (0..n).map(|i| ((seed as usize + 3 * i) % vocab) as i64).collect();
            let idx = Tensor::from_vec(idx, &[n]).unwrap();
            let (w, g) = (randn(&[vocab, dim], seed), randn(&[n, dim], seed ^ 2));
            let embed = |w: &Tensor, idx: &Tensor, g: &Tensor| -> Result<Tensor> {
                let leaf = Var::leaf(w.clone());
                let grads = leaf.embedding(idx, pad)?.backward_with(g)?;
                Ok(grads.get(&leaf).expect("gradient").clone())
            };
            let on_gpu = embed(
                &w.to_device(DEV).unwrap(),
                &idx.to_device(DEV).unwrap(),
                &g.to_device(DEV).unwrap(),
            );
            close("embedding", &embed(&w, &idx, &g).unwrap(), &on_gpu.unwrap(), 1e-4)?;
            // Linear's bias gradient: the column sums of the output gradient.
            let (b, go) = (randn(&[dim], seed ^ 3), randn(&[n, dim], seed ^ 4));
            let bias = |b: &Tensor, go: &Tensor, base: &Tensor| -> Result<Tensor> {
                let leaf = Var::leaf(b.clone());
                let grads = Var::constant(base.clone()).add(&leaf)?.backward_with(go)?;
                Ok(grads.get(&leaf).expect("gradient").clone())
            };
            let base = randn(&[n, dim], seed ^ 5);
            let on_gpu = bias(
                &b.to_device(DEV).unwrap(),
                &go.to_device(DEV).unwrap(),
                &base.to_device(DEV).unwrap(),
            );
            close("bias", &bias(&b, &go, &base).unwrap(), &on_gpu.unwrap(), 1e-4)?;
            Ok(())
        })
        .unwrap();
}

/// The losses built from gathers and elementwise ops: `nll_loss` (with
/// ignored rows, class dims at 1 of a 3-d input) and cross-entropy against
/// probabilities with label smoothing, forward and backward, every
/// reduction, on the device equal the CPU; nothing of them is built on the
/// host.
#[test]
fn nll_and_soft_target_losses_on_the_device_equal_the_cpu() {
    use tessera_autograd::{CrossEntropyOptions, Reduction, Target};
    if !gpu() {
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: 8,
        ..Config::default()
    });
    let case = (1usize..5, 2usize..7, 1usize..4, any::<u64>(), 0usize..3);
    runner
        .run(&case, |(n, classes, len, seed, red)| {
            let reduction = [Reduction::None, Reduction::Sum, Reduction::Mean][red];
            let x = randn(&[n, classes, len], seed);
            let idx: Vec<i64> = (0..n * len)
                .map(|i| match (seed as usize + 5 * i) % (classes + 1) {
                    k if k == classes => -100,
                    k => k as i64,
                })
                .collect();
            let idx = Tensor::from_vec(idx, &[n, len]).unwrap();
            let probs = randn(&[n, classes, len], seed ^ 7).softmax(1).unwrap();
            let g = |shape: &[usize]| randn(shape, seed ^ 9);
            type Loss = fn(&Var, &Tensor, &Tensor, Reduction) -> Result<Var>;
            let losses: [(&str, Loss); 2] = [
                ("nll_loss", |x, idx, _, r| {
                    x.log_softmax(1)?.nll_loss(idx, -100, r)
                }),
                ("cross_entropy probs", |x, _, p, r| {
                    let opts = CrossEntropyOptions {
                        reduction: r,
                        label_smoothing: 0.1,
                        ..CrossEntropyOptions::default()
                    };
                    x.cross_entropy(Target::Probs(p), &opts)
                }),
            ];
            for (name, loss) in losses {
                let run = |x: &Tensor, idx: &Tensor, p: &Tensor| -> Result<(Tensor, Tensor)> {
                    let leaf = Var::leaf(x.clone());
                    let y = loss(&leaf, idx, p, reduction)?;
                    let seed_grad = g(y.shape()).to_device(x.device())?;
                    let grads = y.backward_with(&seed_grad)?;
                    Ok((y.tensor().clone(), grads.get(&leaf).expect("gradient").clone()))
                };
                let (cy, cg) = run(&x, &idx, &probs).unwrap();
                let (gy, gg) = run(
                    &x.to_device(DEV).unwrap(),
                    &idx.to_device(DEV).unwrap(),
                    &probs.to_device(DEV).unwrap(),
                )
                .unwrap();
                close(&format!("{name} {reduction:?}"), &cy, &gy, 1e-5)?;
                close(&format!("{name} {reduction:?} gradient"), &cg, &gg, 1e-5)?;
            }
            Ok(())
        })
        .unwrap();
}
