//! CPU kernels shared by layer_norm, group_norm and batch_norm: per-row
//! statistics, the normalize-and-affine pass, the row backward formula and
//! per-channel parameter-gradient sums. Rows and channels are independent,
//! so parallel splits cannot change the results.

use rayon::prelude::*;

use crate::ops::reduce::cpu::pairwise;
use crate::strided::PAR_THRESHOLD;
use crate::{DType, Error, FloatElement, FloatMath, Result, Tensor};

/// Rows of `k` elements per parallel task, so that small inputs stay on one thread.
fn min_rows(k: usize) -> usize {
    (PAR_THRESHOLD / k.max(1)).max(1)
}

/// Per-row means and reciprocal standard deviations, in the math type.
pub(crate) type RowStats<T> = (Vec<<T as FloatElement>::Math>, Vec<<T as FloatElement>::Math>);

/// Mean and 1/sqrt(biased var + eps) of each of the `rows` rows of `k`
/// elements of the contiguous `x`, two-pass and pairwise in the math type
/// (NaN for empty rows, as 0/0). Errors, naming `op`, when memory for the
/// statistics is out.
pub(crate) fn row_stats<T: FloatElement>(
    op: &'static str,
    x: &[T],
    rows: usize,
    k: usize,
    eps: f64,
) -> Result<RowStats<T>> {
    let kf = T::Math::of(k as f64);
    let eps = T::Math::of(eps);
    let mut stats = (
        crate::tensor::try_vec(op, &[rows])?,
        crate::tensor::try_vec(op, &[rows])?,
    );
    stats.par_extend((0..rows).into_par_iter().with_min_len(min_rows(k)).map(|r| {
        let row = &x[r * k..(r + 1) * k];
        let mean = pairwise(k, &|i| row[i].to_math()) / kf;
        let var = pairwise(k, &|i| {
            let d = row[i].to_math() - mean;
            d * d
        }) / kf;
        (mean, T::Math::ONE / (var + eps).sqrt())
    }));
    Ok(stats)
}

/// `y = (x − mean[r])·rstd[r]·w + b` over rows of `k` elements, where
/// `affine(r, i)` gives (w, b) for element `i` of row `r`.
pub(crate) fn rows_forward<T: FloatElement>(
    x: &[T],
    k: usize,
    mean: &[T::Math],
    rstd: &[T::Math],
    affine: impl Fn(usize, usize) -> (T::Math, T::Math) + Sync,
) -> Vec<T> {
    let mut y = vec![T::ZERO; x.len()];
    if k == 0 {
        return y;
    }
    y.par_chunks_mut(k)
        .with_min_len(min_rows(k))
        .enumerate()
        .for_each(|(r, out)| {
            let row = &x[r * k..(r + 1) * k];
            for (i, o) in out.iter_mut().enumerate() {
                let (w, b) = affine(r, i);
                *o = T::from_math((row[i].to_math() - mean[r]) * rstd[r] * w + b);
            }
        });
    y
}

/// The input gradient of a per-row normalization with per-element scale
/// `w(r, i)`: with g = dy·w and x̂ = (x − mean)·rstd,
/// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)).
pub(crate) fn rows_backward<T: FloatElement>(
    dy: &[T],
    x: &[T],
    k: usize,
    mean: &[T::Math],
    rstd: &[T::Math],
    w: impl Fn(usize, usize) -> T::Math + Sync,
) -> Vec<T> {
    let mut dx = vec![T::ZERO; x.len()];
    if k == 0 {
        return dx;
    }
    let kf = T::Math::of(k as f64);
    dx.par_chunks_mut(k)
        .with_min_len(min_rows(k))
        .enumerate()
        .for_each(|(r, out)| {
            let (xr, dyr) = (&x[r * k..(r + 1) * k], &dy[r * k..(r + 1) * k]);
            let (m, s) = (mean[r], rstd[r]);
            let g = |i: usize| dyr[i].to_math() * w(r, i);
            let xhat = |i: usize| (xr[i].to_math() - m) * s;
            let a = pairwise(k, &g) / kf;
            let b = pairwise(k, &|i| g(i) * xhat(i)) / kf;
            for (i, o) in out.iter_mut().enumerate() {
                *o = T::from_math(s * (g(i) - a - xhat(i) * b));
            }
        });
    dx
}

/// For data laid out `[n, c, s]` (contiguous), Σ over n and s of
/// `f(n, c, flat index)` per channel c, as two f64 sums per channel (used
/// for Σ dy·x̂ and Σ dy). Parallel over blocks of channels; each channel is
/// always summed in the same order.
pub(crate) fn channel_sums(
    n: usize,
    c: usize,
    s: usize,
    f: impl Fn(usize, usize, usize) -> (f64, f64) + Sync,
) -> (Vec<f64>, Vec<f64>) {
    const BLOCK: usize = 16;
    let mut sums = vec![(0.0, 0.0); c];
    let min_blocks = (PAR_THRESHOLD / (BLOCK * n * s).max(1)).max(1);
    sums.par_chunks_mut(BLOCK)
        .with_min_len(min_blocks)
        .enumerate()
        .for_each(|(blk, acc)| {
            for ni in 0..n {
                for (j, a) in acc.iter_mut().enumerate() {
                    let ci = blk * BLOCK + j;
                    let base = (ni * c + ci) * s;
                    for si in 0..s {
                        let (p, q) = f(ni, ci, base + si);
                        a.0 += p;
                        a.1 += q;
                    }
                }
            }
        });
    sums.into_iter().unzip()
}

/// The dtype statistics are returned in: f64 for f64 input, else f32.
pub(crate) fn stats_dtype(x: DType) -> DType {
    if x == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// A tensor of `shape` in [`stats_dtype`]`(dtype)` holding `v`; errors
/// when memory is out.
pub(crate) fn stats_tensor<M: FloatMath>(v: &[M], shape: &[usize], dtype: DType) -> Result<Tensor> {
    const OP: &str = "normalization statistics";
    if stats_dtype(dtype) == DType::F64 {
        Tensor::build::<f64>(OP, shape, |o| o.iter_mut().zip(v).for_each(|(o, x)| *o = x.f64()))
    } else {
        Tensor::build::<f32>(OP, shape, |o| {
            o.iter_mut().zip(v).for_each(|(o, x)| *o = x.f64() as f32)
        })
    }
}

/// A contiguous tensor of `shape` and `T`'s dtype holding `v`; errors when
/// memory is out.
pub(crate) fn tensor_from<T: crate::Element>(v: &[T], shape: &[usize]) -> Result<Tensor> {
    Tensor::build_overwrite::<T>("normalization", shape, |o| o.copy_from_slice(v))
}

/// The values of an optional parameter (weight, bias, saved statistic) as
/// `M`, checked to have `numel` elements; `None` when absent. Errors name
/// `op` and the parameter.
pub(crate) fn param<M: FloatMath>(
    op: &'static str,
    what: &str,
    t: Option<&Tensor>,
    x: &Tensor,
    numel: usize,
) -> Result<Option<Vec<M>>> {
    let Some(t) = t else { return Ok(None) };
    x.device().same_as(t.device(), op)?;
    if !t.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("{what} must be a float tensor, got {}", t.dtype()),
        ));
    }
    if t.numel() != numel {
        return Err(Error::shape(
            op,
            format!(
                "{what} of shape {:?} should have {numel} elements for input of shape {:?}",
                t.shape(),
                x.shape()
            ),
        ));
    }
    let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
    Ok(Some(v.into_iter().map(M::of).collect()))
}

/// Errors unless `x` is a float tensor; names `op`.
pub(crate) fn check_float(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(
            op,
            format!(
                "expects a float tensor, got {}; cast with to_dtype first",
                x.dtype()
            ),
        ))
    }
}

/// Errors unless `dy` matches `x` in shape, dtype and device; names `op`.
pub(crate) fn check_grad(op: &'static str, dy: &Tensor, x: &Tensor) -> Result<()> {
    x.device().same_as(dy.device(), op)?;
    if dy.shape() != x.shape() || dy.dtype() != x.dtype() {
        return Err(Error::shape(
            op,
            format!(
                "grad of shape {:?} ({}) does not match input of shape {:?} ({})",
                dy.shape(),
                dy.dtype(),
                x.shape(),
                x.dtype()
            ),
        ));
    }
    Ok(())
}

/// Errors unless `eps` is finite and ≥ 0; names `op`.
pub(crate) fn check_eps(op: &'static str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::arg(op, format!("eps must be finite and ≥ 0, got {eps}")))
    }
}
