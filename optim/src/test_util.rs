//! Helpers for the optimizer tests: f64 parameters and fixed gradients.

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::Tensor;

use crate::Optimizer;

/// An f64 parameter holding `values` in `shape`.
pub(crate) fn param(values: &[f64], shape: &[usize]) -> Parameter {
    Parameter::new(Tensor::from_vec(values.to_vec(), shape).unwrap())
}

/// Parameters and their gradients, each gradient holding the listed values.
pub(crate) fn grads_of(list: &[(&[f64], &[usize])]) -> (Vec<Parameter>, Gradients) {
    let mut grads = Gradients::default();
    let mut params = Vec::new();
    for (v, shape) in list {
        let p = param(&vec![0.0; v.len()], shape);
        grads.insert(p.id().unwrap(), Tensor::from_vec(v.to_vec(), shape).unwrap());
        params.push(p);
    }
    (params, grads)
}

/// Gradients giving each listed parameter the listed values.
pub(crate) fn fixed_grads(list: &[(&Parameter, &[f64])]) -> Gradients {
    let mut grads = Gradients::default();
    for (p, v) in list {
        grads.insert(p.id().unwrap(), Tensor::from_vec(v.to_vec(), &p.shape()).unwrap());
    }
    grads
}

/// `n` steps of `opt` with the same fixed gradients.
pub(crate) fn run_steps(opt: &mut dyn Optimizer, list: &[(&Parameter, &[f64])], n: usize) {
    let grads = fixed_grads(list);
    for _ in 0..n {
        opt.step(&grads).unwrap();
    }
}

/// The values of a parameter.
pub(crate) fn values(p: &Parameter) -> Vec<f64> {
    p.tensor().unwrap().to_vec::<f64>().unwrap()
}

/// Asserts elementwise |a − b| ≤ tol·max(1, |b|).
pub(crate) fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * y.abs().max(1.0),
            "{what}[{i}]: got {x}, expected {y} (tol {tol})"
        );
    }
}
