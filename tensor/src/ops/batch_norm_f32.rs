//! The f32 batch-norm kernels on SIMD planes (one sample's channel: `s`
//! contiguous elements of an `[n, c, s]` input). Per-channel sums are f32
//! plane sums accumulated in f64 in sample order, PyTorch's CPU scheme; one
//! task sums one channel, so nothing depends on the thread count. The
//! normalization and the input gradient are written plane by plane with the
//! generic path's coefficients and order of operations, so they equal its
//! results bit for bit.

use rayon::prelude::*;

use crate::simd::norm::{self, BatchNormGrad};
use crate::simd::{kernels, Level};
use crate::strided::PAR_THRESHOLD;
use crate::{Result, Tensor};

/// Per-channel (mean, biased variance) of `x` `[n, c, s]` in two passes.
/// The second sums squares about the f32-rounded mean m₃₂ and removes that
/// rounding exactly: Σ(x − m)² = Σ(x − m₃₂)² − N·(m − m₃₂)². NaN for an
/// empty channel.
pub(crate) fn stats(x: &[f32], n: usize, c: usize, s: usize) -> (Vec<f64>, Vec<f64>) {
    let count = (n * s) as f64;
    let level = Level::best();
    (0..c)
        .into_par_iter()
        .with_min_len(channels_per_task(n * s))
        .map(|ci| {
            let sum: f64 = (0..n)
                .map(|ni| kernels::sum(level, plane(x, ni, ci, c, s)) as f64)
                .sum();
            let mean = sum / count;
            let m32 = mean as f32;
            let sq: f64 = (0..n)
                .map(|ni| kernels::sum_sq_dev(level, plane(x, ni, ci, c, s), m32) as f64)
                .sum();
            let shift = mean - m32 as f64;
            let var = sq / count - shift * shift;
            // Rounding can leave a constant channel a hair below zero; NaN
            // (an empty channel) stays.
            (mean, if var < 0.0 { 0.0 } else { var })
        })
        .unzip()
}

/// y = x·scale + shift with channel `ci`'s `coef[ci]` = (scale, shift),
/// plane by plane, as a tensor of `shape`; errors when memory is out.
pub(crate) fn normalize(
    x: &[f32],
    c: usize,
    s: usize,
    coef: &[(f32, f32)],
    shape: &[usize],
) -> Result<Tensor> {
    let level = Level::best();
    Tensor::build_overwrite::<f32>("batch_norm", shape, |y| {
        if s == 0 {
            return;
        }
        y.par_chunks_mut(s)
            .with_min_len(planes_per_task(s))
            .enumerate()
            .for_each(|(p, yp)| {
                let (scale, shift) = coef[p % c];
                norm::batch_norm_plane(level, &x[p * s..(p + 1) * s], scale, shift, yp);
            })
    })
}

/// Per-channel (Σ dy·(x − mean), Σ dy) over `[n, c, s]`: the dot products
/// run about the f32-rounded mean m₃₂, and Σ dy·(x − m) =
/// Σ dy·(x − m₃₂) − (m − m₃₂)·Σ dy restores the exact centre.
pub(crate) fn grad_sums(
    dy: &[f32],
    x: &[f32],
    n: usize,
    c: usize,
    s: usize,
    mean: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let level = Level::best();
    (0..c)
        .into_par_iter()
        .with_min_len(channels_per_task(n * s))
        .map(|ci| {
            let m32 = mean[ci] as f32;
            let (mut dot, mut sum) = (0.0f64, 0.0f64);
            for ni in 0..n {
                let (d, xp) = (plane(dy, ni, ci, c, s), plane(x, ni, ci, c, s));
                sum += kernels::sum(level, d) as f64;
                dot += kernels::dot_dev(level, d, xp, m32) as f64;
            }
            (dot - (mean[ci] - m32 as f64) * sum, sum)
        })
        .unzip()
}

/// dx = k·dy + a·(x − mean)·invstd + b with channel `ci`'s `coef[ci]`,
/// plane by plane, as a tensor of `shape`; errors when memory is out.
pub(crate) fn input_grad(
    dy: &[f32],
    x: &[f32],
    c: usize,
    s: usize,
    coef: &[BatchNormGrad],
    shape: &[usize],
) -> Result<Tensor> {
    let level = Level::best();
    Tensor::build_overwrite::<f32>("batch_norm_backward", shape, |dx| {
        if s == 0 {
            return;
        }
        dx.par_chunks_mut(s)
            .with_min_len(planes_per_task(s))
            .enumerate()
            .for_each(|(p, dxp)| {
                let span = p * s..(p + 1) * s;
                norm::batch_norm_backward_plane(level, &x[span.clone()], &dy[span], coef[p % c], dxp);
            })
    })
}

/// Sample `ni`'s plane of channel `ci`.
fn plane(x: &[f32], ni: usize, ci: usize, c: usize, s: usize) -> &[f32] {
    &x[(ni * c + ci) * s..][..s]
}

/// Channels one task sums at least, so a small input is not split finer
/// than the parallel threshold.
fn channels_per_task(per_channel: usize) -> usize {
    (PAR_THRESHOLD / per_channel.max(1)).max(1)
}

/// Planes one task writes at least (see [`channels_per_task`]).
fn planes_per_task(s: usize) -> usize {
    (PAR_THRESHOLD / s.max(1)).max(1)
}
