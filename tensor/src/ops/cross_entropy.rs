//! Cross-entropy over class logits with class-index targets, as one fused
//! pass per row (max, Σ exp, Σ x and the target's logit together), and its
//! backward producing dlogits directly — PyTorch's `cross_entropy` with
//! `ignore_index`, `label_smoothing` and `reduction`, without class weights.
//!
//! With C classes, smoothing ε and lse = log Σ exp(x), a row with target t
//! has loss (1 − ε)·(lse − x_t) + ε/C·Σ_c (lse − x_c), and
//! dloss/dx_c = softmax_c − ε/C − (1 − ε)·[c = t].

#[cfg(feature = "cuda")]
#[path = "cross_entropy_cuda.rs"]
pub(crate) mod cuda;

use rayon::prelude::*;

use crate::ops::softmax_backward::{as_f32, as_f32_mut};
use crate::simd::{kernels, norm, Level};
use crate::strided::PAR_THRESHOLD;
use crate::{DType, Error, FloatElement, FloatMath, Result, Tensor};

/// How per-element losses are combined (PyTorch's `reduction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// One loss per target element, shaped like the target.
    None,
    /// The mean over the targets that are not ignored (NaN when all are).
    #[default]
    Mean,
    /// The sum over all targets.
    Sum,
}

/// The options of [`Tensor::cross_entropy`], PyTorch's defaults by
/// [`Default`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyOptions {
    /// Targets equal to this contribute neither loss nor gradient (−100).
    pub ignore_index: i64,
    /// ε in [0, 1]: the target distribution is (1 − ε)·one-hot + ε/C (0).
    pub label_smoothing: f64,
    /// How the losses are combined (mean).
    pub reduction: Reduction,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: -100,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
        }
    }
}

impl Tensor {
    /// The forward half of the fused cross-entropy kernel pair (the loss
    /// itself, with soft targets and on every device, is
    /// `Var::cross_entropy`): the cross-entropy of the logits `self` (shape
    /// `[C]`, `[N, C]` or `[N, C, d1, …]`, classes along dim 1 as in
    /// PyTorch) against i64 class indices `target` (shape `[]`, `[N]` or
    /// `[N, d1, …]`). Returns the loss (0-d for mean and sum, target-shaped
    /// for none, in the logits' dtype) and the saved log-sum-exp of each row
    /// (f32, or f64 for f64 logits) that [`Tensor::cross_entropy_backward`]
    /// takes. Errors for non-float logits, non-i64 targets, mismatched
    /// shapes, a target outside `0..C` that is not `ignore_index`, or ε
    /// outside [0, 1].
    pub fn cross_entropy_forward(
        &self,
        target: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "cross_entropy";
        let be = crate::backend::dispatch(OP, &[self, target])?;
        check(OP, self, target, &opts)?;
        be.cross_entropy(self, target, opts)
    }

    /// dlogits of [`Tensor::cross_entropy_forward`] given the loss gradient `dloss`
    /// (0-d for mean and sum, target-shaped for none), the logits, the
    /// target, the saved log-sum-exp and the same options. Returns a tensor
    /// shaped like the logits. Errors when any shape or dtype disagrees
    /// with the forward's.
    pub fn cross_entropy_backward(
        dloss: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        lse: &Tensor,
        opts: CrossEntropyOptions,
    ) -> Result<Tensor> {
        const OP: &str = "cross_entropy_backward";
        let be = crate::backend::dispatch(OP, &[dloss, logits, target, lse])?;
        let c = check(OP, logits, target, &opts)?;
        let n = logits.numel() / c.max(1);
        if lse.numel() != n || !lse.dtype().is_float() {
            return Err(Error::shape(
                OP,
                format!(
                    "saved lse of shape {:?} ({}) does not match {n} rows",
                    lse.shape(),
                    lse.dtype()
                ),
            ));
        }
        let want: &[usize] = if opts.reduction == Reduction::None {
            target.shape()
        } else {
            &[]
        };
        if dloss.shape() != want || !dloss.dtype().is_float() {
            return Err(Error::shape(
                OP,
                format!(
                    "dloss of shape {:?} ({}) should have shape {want:?}",
                    dloss.shape(),
                    dloss.dtype()
                ),
            ));
        }
        be.cross_entropy_backward(dloss, logits, target, lse, opts)
    }
}

/// The CPU kernel of [`Tensor::cross_entropy_forward`] (operands checked
/// but for the target range).
pub(crate) fn cpu_forward(
    x: &Tensor,
    target: &Tensor,
    opts: CrossEntropyOptions,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "cross_entropy";
    let (rows, targets) = prepare(OP, x, target, &opts)?;
    let c = rows.shape()[1];
    crate::with_float_dtype!(rows.dtype(), T => {
        let xs = rows.as_slice::<T>()?;
        let eps = opts.label_smoothing;
        let stats: Vec<(f64, f64)> = xs
            .par_chunks(c.max(1))
            .zip(targets.par_iter())
            .with_min_len((PAR_THRESHOLD / c.max(1)).max(1))
            .map(|(x, &t)| row_loss::<T>(x, t, opts.ignore_index, eps))
            .collect();
        let losses: Vec<f64> = stats.iter().map(|s| s.0).collect();
        let lse: Vec<f64> = stats.iter().map(|s| s.1).collect();
        let count = targets.iter().filter(|&&t| t != opts.ignore_index).count();
        let loss = match opts.reduction {
            Reduction::None => {
                let v: Vec<T> = losses.iter().map(|&l| <T as crate::Element>::from_f64(l)).collect();
                Tensor::from_vec(v, target.shape())?
            }
            Reduction::Sum => Tensor::scalar(<T as crate::Element>::from_f64(losses.iter().sum())),
            Reduction::Mean => Tensor::scalar(<T as crate::Element>::from_f64(losses.iter().sum::<f64>() / count as f64)),
        };
        let n = lse.len();
        let lse = if rows.dtype() == DType::F64 {
            Tensor::from_vec(lse, &[n])?
        } else {
            Tensor::from_vec(lse.iter().map(|&v| v as f32).collect(), &[n])?
        };
        Ok((loss, lse))
    }, else unreachable!("checked to be float"))
}

/// The CPU kernel of [`Tensor::cross_entropy_backward`] (operands checked
/// but for the target range).
pub(crate) fn cpu_backward(
    dloss: &Tensor,
    logits: &Tensor,
    target: &Tensor,
    lse: &Tensor,
    opts: CrossEntropyOptions,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy_backward";
    let (rows, targets) = prepare(OP, logits, target, &opts)?;
    let c = rows.shape()[1];
    let lse = lse.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let g = dloss.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let count = targets.iter().filter(|&&t| t != opts.ignore_index).count() as f64;
    let scale = |r: usize| match opts.reduction {
        Reduction::None => g[r],
        Reduction::Sum => g[0],
        Reduction::Mean => g[0] / count,
    };
    let eps = opts.label_smoothing;
    let dx = crate::with_float_dtype!(rows.dtype(), T => {
        let xs = rows.as_slice::<T>()?;
        Tensor::build_overwrite::<T>(OP, rows.shape(), |dx| {
            if c == 0 {
                return;
            }
            dx.par_chunks_mut(c)
                .enumerate()
                .with_min_len((PAR_THRESHOLD / c).max(1))
                .for_each(|(r, out)| {
                    let t = targets[r];
                    let s = if t == opts.ignore_index { 0.0 } else { scale(r) };
                    row_grad::<T>(&xs[r * c..(r + 1) * c], t, lse[r], s, eps, out);
                })
        })?
    }, else unreachable!("checked to be float"));
    restore(dx, logits.shape())
}

/// The number of classes, after checking the dtypes, the shapes and ε.
fn check(op: &'static str, x: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Result<usize> {
    x.device().same_as(target.device(), op)?;
    if !x.dtype().is_float() || target.dtype() != DType::I64 {
        return Err(Error::dtype(
            op,
            format!(
                "expects float logits and i64 targets, got {} and {}",
                x.dtype(),
                target.dtype()
            ),
        ));
    }
    if !(0.0..=1.0).contains(&opts.label_smoothing) {
        return Err(Error::arg(
            op,
            format!("label_smoothing must be in [0, 1], got {}", opts.label_smoothing),
        ));
    }
    let mut want: Vec<usize> = x.shape().to_vec();
    let ok = match x.ndim() {
        0 => false,
        1 => target.ndim() == 0,
        _ => {
            want.remove(1);
            target.shape() == want.as_slice()
        }
    };
    if !ok {
        return Err(Error::shape(
            op,
            format!(
                "logits of shape {:?} do not match target of shape {:?}",
                x.shape(),
                target.shape()
            ),
        ));
    }
    Ok(if x.ndim() == 1 { x.shape()[0] } else { x.shape()[1] })
}

/// The logits as contiguous rows `[N, C]` (checked by [`check`]).
pub(crate) fn rows(x: &Tensor, c: usize) -> Result<Tensor> {
    match x.ndim() {
        1 => x.reshape([1, c])?.contiguous(),
        2 => x.contiguous(),
        nd => x.permute(&moved_last(nd))?.reshape(((), c))?.contiguous(),
    }
}

/// The targets as a vector after checking that each is a class in `0..c`
/// or `ignore_index`.
pub(crate) fn checked_targets(
    op: &'static str,
    target: &Tensor,
    c: usize,
    ignore_index: i64,
) -> Result<Vec<i64>> {
    let targets = target.cpu()?.contiguous()?.to_vec::<i64>()?;
    if let Some(&bad) = targets
        .iter()
        .find(|&&t| t != ignore_index && !(0..c as i64).contains(&t))
    {
        return Err(Error::index(
            op,
            format!("target {bad} is out of range for {c} classes"),
        ));
    }
    Ok(targets)
}

/// The logits as contiguous rows `[N, C]` and the targets as a vector,
/// after checking dtypes, shapes, the target range and ε.
fn prepare(
    op: &'static str,
    x: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions,
) -> Result<(Tensor, Vec<i64>)> {
    let c = check(op, x, target, opts)?;
    Ok((rows(x, c)?, checked_targets(op, target, c, opts.ignore_index)?))
}

/// The permutation moving dim 1 of an `nd`-dim tensor last.
fn moved_last(nd: usize) -> Vec<isize> {
    let mut p: Vec<isize> = (0..nd as isize).filter(|&d| d != 1).collect();
    p.push(1);
    p
}

/// `[N·d…, C]` rows back in the logits' shape.
pub(crate) fn restore(rows: Tensor, shape: &[usize]) -> Result<Tensor> {
    match shape.len() {
        1 | 2 => rows.reshape(shape),
        nd => {
            let mut moved = shape.to_vec();
            let c = moved.remove(1);
            moved.push(c);
            let mut inverse = vec![0isize; nd];
            for (k, &d) in moved_last(nd).iter().enumerate() {
                inverse[d as usize] = k as isize;
            }
            rows.reshape(&moved)?.permute(&inverse)?.contiguous()
        }
    }
}

/// (loss, lse) of one row with target `t`.
fn row_loss<T: FloatElement>(x: &[T], t: i64, ignore: i64, eps: f64) -> (f64, f64) {
    let c = x.len();
    let (lse, sum) = if let Some(x) = as_f32(x) {
        let level = Level::best();
        let (m, s) = kernels::max_sumexp(level, x);
        ((m + s.ln()) as f64, kernels::sum(level, x) as f64)
    } else {
        let m = x
            .iter()
            .fold(T::Math::NEG_INFINITY, |a, v| a.max_nan(v.to_math()));
        let s = crate::ops::reduce::cpu::pairwise(c, &|i| (x[i].to_math() - m).exp());
        let sum = crate::ops::reduce::cpu::pairwise(c, &|i| x[i].to_math());
        ((m + s.ln()).f64(), sum.f64())
    };
    if t == ignore {
        return (0.0, lse);
    }
    let nll = lse - x[t as usize].to_math().f64();
    let smooth = if eps > 0.0 { lse - sum / c as f64 } else { 0.0 };
    ((1.0 - eps) * nll + eps * smooth, lse)
}

/// One row of dlogits: s·(softmax − ε/C) − s·(1 − ε) at the target.
fn row_grad<T: FloatElement>(x: &[T], t: i64, lse: f64, s: f64, eps: f64, out: &mut [T]) {
    let c = x.len();
    let smooth = eps / c as f64;
    if s == 0.0 {
        out.fill(T::from_math(T::Math::ZERO));
        return;
    }
    if let (Some(xf), Some(of)) = (as_f32(x), as_f32_mut(out)) {
        norm::cross_entropy_backward_row(Level::best(), xf, lse as f32, s as f32, smooth as f32, of);
        let ti = t as usize;
        of[ti] = (of[ti] as f64 - s * (1.0 - eps)) as f32;
        return;
    }
    let (l, sm, sc) = (T::Math::of(lse), T::Math::of(smooth), T::Math::of(s));
    for (i, (o, v)) in out.iter_mut().zip(x).enumerate() {
        let mut g = (v.to_math() - l).exp() - sm;
        if i as i64 == t {
            g = g - T::Math::of(1.0 - eps);
        }
        *o = T::from_math(g * sc);
    }
}
