//! Data parallelism (DDP, ZeRO) checked against its oracle: one process
//! training on the concatenated batch. The model and the data are
//! dyadic (small integers over powers of two) in f64, so sums are exact in
//! any order and power-of-two world sizes must agree bitwise.

mod ddp;
mod zero;
mod zero3;

use tessera_autograd::{Gradients, Parameter, Reduction, Var};
use tessera_nn::{Linear, Module};
use tessera_tensor::{Result, Tensor};

/// A two-layer perceptron, `in → hidden → out` with ReLU, in f64.
#[derive(Module)]
pub struct Net {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Module for Net {
    fn forward(&self, x: &Var) -> Result<Var> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
}

pub const IN: usize = 4;
pub const HIDDEN: usize = 8;
pub const OUT: usize = 2;

/// A dyadic value in [-1/2, 1/2] from an index and a seed.
fn dyadic(seed: u64, i: usize) -> f64 {
    let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    ((h >> 33) % 9) as f64 / 8.0 - 0.5
}

fn param(seed: u64, shape: &[usize]) -> Parameter {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| dyadic(seed, i)).collect();
    Parameter::new(Tensor::from_vec(v, shape).unwrap())
}

impl Net {
    /// The network with weights drawn from `seed`.
    pub fn new(seed: u64) -> Net {
        Net {
            fc1: Linear {
                weight: param(seed, &[HIDDEN, IN]),
                bias: Some(param(seed + 1, &[HIDDEN])),
            },
            fc2: Linear {
                weight: param(seed + 2, &[OUT, HIDDEN]),
                bias: Some(param(seed + 3, &[OUT])),
            },
        }
    }

    /// Overwrites every parameter with `values` (as [`Net::values`] gives).
    pub fn set_values(&self, values: &[Vec<f64>]) {
        for (p, v) in self.parameters().iter().zip(values) {
            p.set(Tensor::from_vec(v.clone(), &p.shape()).unwrap()).unwrap();
        }
    }

    /// Every parameter's values, in definition order.
    pub fn values(&self) -> Vec<Vec<f64>> {
        self.parameters()
            .iter()
            .map(|p| p.tensor().unwrap().to_vec::<f64>().unwrap())
            .collect()
    }
}

/// Rows `rows` of step `step`'s global batch: inputs `[rows, IN]` and
/// targets `[rows, OUT]`, small integers.
pub fn batch(step: usize, rows: std::ops::Range<usize>) -> (Var, Var) {
    let n = rows.len();
    let x: Vec<f64> = rows
        .clone()
        .flat_map(|r| (0..IN).map(move |c| ((r * 3 + c * 5 + step * 7) % 5) as f64 - 2.0))
        .collect();
    let t: Vec<f64> = rows
        .flat_map(|r| (0..OUT).map(move |o| ((r + o * 3 + step) % 3) as f64 - 1.0))
        .collect();
    (
        Var::constant(Tensor::from_vec(x, &[n, IN]).unwrap()),
        Var::constant(Tensor::from_vec(t, &[n, OUT]).unwrap()),
    )
}

/// The mean squared error of `model` on rows `rows` of step `step`.
pub fn loss(model: &dyn Module, step: usize, rows: std::ops::Range<usize>) -> Var {
    let (x, t) = batch(step, rows);
    model.forward(&x).unwrap().mse_loss(&t, Reduction::Mean).unwrap()
}

/// Each parameter's gradient in `grads`, in definition order.
pub fn grad_values(model: &dyn Module, grads: &Gradients) -> Vec<Vec<f64>> {
    model
        .parameters()
        .iter()
        .map(|p| {
            p.grad(grads)
                .expect("every parameter has a gradient")
                .to_vec::<f64>()
                .unwrap()
        })
        .collect()
}

/// Asserts `a == b` bitwise when `exact`, else within a relative 1e-12.
pub fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], exact: bool, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: parameter count");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        for (i, (u, v)) in x.iter().zip(y).enumerate() {
            if exact {
                assert_eq!(u.to_bits(), v.to_bits(), "{what}: parameter {k}[{i}]: {u} vs {v}");
            } else {
                assert!(
                    (u - v).abs() <= 1e-12 * (1.0 + v.abs()),
                    "{what}: parameter {k}[{i}]: {u} vs {v}"
                );
            }
        }
    }
}
