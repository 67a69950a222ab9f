//! Naive index arithmetic for the ops' unit tests: references built from it
//! share no code with the kernels they check.

use crate::test_util::rand_f64;
use crate::Tensor;

/// The multi-index of row-major position `lin` in `shape`.
pub fn unravel(mut lin: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = lin % shape[d];
        lin /= shape[d];
    }
    idx
}

/// The row-major position of `idx` in `shape`.
pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// `n` deterministic integers in `0..bound` from `seed`.
pub fn rand_indices(seed: u64, n: usize, bound: usize) -> Vec<i64> {
    rand_f64(seed, n)
        .into_iter()
        .map(|x| (((x + 1.0) / 2.0) * bound as f64).floor().min(bound as f64 - 1.0) as i64)
        .collect()
}

/// An I64 tensor of `shape` holding `v`.
pub fn i64_tensor(v: Vec<i64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).expect("shape matches")
}
