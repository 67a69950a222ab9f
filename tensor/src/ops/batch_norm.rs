//! Batch normalization over every dim but the channel dim 1: statistics,
//! forward in training and eval mode (with the running-stat update), and
//! backward.

#[cfg(feature = "cuda")]
#[path = "batch_norm_cuda.rs"]
pub(crate) mod cuda;

use rayon::prelude::*;

use crate::ops::batch_norm_f32;
use crate::ops::norm_common::{
    channel_sums, check_eps, check_float, check_grad, param, stats_tensor, tensor_from,
};
use crate::ops::reduce::moments;
use crate::simd::norm::BatchNormGrad;
use crate::{DType, Element, Error, FloatElement, FloatMath, Result, Tensor};

/// What `batch_norm` returns, on a [`Tensor`] (`BatchNormOutput<Tensor>`)
/// and on a `Var` (`BatchNormOutput<Var>`): the output and, in training,
/// the updated running statistics (for the caller to store).
#[derive(Debug, Clone)]
pub struct BatchNormOutput<T> {
    /// The normalized output, shaped and typed like the input.
    pub y: T,
    /// In training, the updated running mean (given one); else `None`.
    pub running_mean: Option<Tensor>,
    /// In training, the updated running variance (given one), updated with
    /// the unbiased batch variance as PyTorch does; else `None`.
    pub running_var: Option<Tensor>,
}

/// What [`Tensor::batch_norm_forward`] returns: [`BatchNormOutput`] plus
/// the statistics [`Tensor::batch_norm_backward`] takes.
#[derive(Debug, Clone)]
pub struct BatchNormForward {
    /// The normalized output, shaped and typed like the input.
    pub y: Tensor,
    /// The per-channel mean used (the batch mean in training, the running
    /// mean in eval), shape `[C]`, f32 (f64 for f64 input).
    pub mean: Tensor,
    /// The per-channel 1/sqrt(var + eps) used, like `mean`.
    pub invstd: Tensor,
    /// In training, the updated running mean (given one); else `None`.
    pub running_mean: Option<Tensor>,
    /// In training, the updated running variance (given one), updated with
    /// the unbiased batch variance as PyTorch does; else `None`.
    pub running_var: Option<Tensor>,
}

impl Tensor {
    /// Per-channel mean and biased variance of `x` (`[N, C, *]`) over every
    /// dim but 1, computed in f64 and returned as `[C]` tensors in f32 (f64
    /// for f64 input). Errors for non-float input or fewer than 2 dims.
    pub fn batch_norm_stats(&self) -> Result<(Tensor, Tensor)> {
        const OP: &str = "batch_norm_stats";
        let be = crate::backend::dispatch(OP, &[self])?;
        dims3(OP, self)?;
        be.batch_norm_stats(self)
    }

    /// Batch normalization of `x` (`[N, C, *]`), per channel:
    /// y = (x − mean)·invstd·weight plus bias. In training the batch statistics are used and the
    /// running stats (when given) come back updated:
    /// r ← (1 − momentum)·r + momentum·stat, with the unbiased batch variance
    /// for the running variance. In eval the running stats are used and are
    /// required. Errors for non-float input, fewer than 2 dims, parameters
    /// without C elements, eval without running stats, training with one
    /// value per channel, or a bad eps.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNormOutput<Tensor>> {
        let out =
            self.batch_norm_forward(running_mean, running_var, weight, bias, training, momentum, eps)?;
        Ok(BatchNormOutput {
            y: out.y,
            running_mean: out.running_mean,
            running_var: out.running_var,
        })
    }

    /// [`Tensor::batch_norm`] also returning the statistics
    /// [`Tensor::batch_norm_backward`] takes. Errors as
    /// [`Tensor::batch_norm`].
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_forward(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNormForward> {
        const OP: &str = "batch_norm";
        let be = crate::backend::dispatch(OP, &[self, &running_mean, &running_var, &weight, &bias])?;
        check_eps(OP, eps)?;
        let (n, c, s) = dims3(OP, self)?;
        for (name, p) in [
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("weight", weight),
            ("bias", bias),
        ] {
            check_param(OP, name, p, self, c)?;
        }
        if training && n * s <= 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "expected more than 1 value per channel when training, got input of shape {:?}",
                    self.shape()
                ),
            ));
        }
        if !training && (running_mean.is_none() || running_var.is_none()) {
            return Err(Error::arg(OP, "eval mode needs running_mean and running_var"));
        }
        be.batch_norm(
            self,
            running_mean,
            running_var,
            weight,
            bias,
            training,
            momentum,
            eps,
        )
    }

    /// The gradients of [`Tensor::batch_norm`] given `dy`, the input `x`
    /// and the `mean`/`invstd` [`Tensor::batch_norm_forward`] returned: (dx, dweight, dbias), dweight =
    /// Σ dy·x̂ and dbias = Σ dy per channel (`[C]`, `x`'s dtype). In training
    /// dx also flows through the batch statistics; in eval it is
    /// dy·weight·invstd. Errors when shapes, dtypes or sizes disagree.
    pub fn batch_norm_backward(
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        training: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "batch_norm_backward";
        let be = crate::backend::dispatch(OP, &[dy, x, mean, invstd, &weight])?;
        let (_, c, _) = dims3(OP, x)?;
        check_grad(OP, dy, x)?;
        check_param(OP, "mean", Some(mean), x, c)?;
        check_param(OP, "invstd", Some(invstd), x, c)?;
        check_param(OP, "weight", weight, x, c)?;
        be.batch_norm_backward(dy, x, mean, invstd, weight, training)
    }
}

/// The CPU kernel of [`Tensor::batch_norm_stats`] (input checked).
pub(crate) fn cpu_stats(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (mean, var) = stats(x, "batch_norm_stats")?;
    let c = [x.shape()[1]];
    Ok((
        stats_tensor(&mean, &c, x.dtype())?,
        stats_tensor(&var, &c, x.dtype())?,
    ))
}

/// Errors, naming `op`, unless the optional per-channel `t` is a float
/// tensor of `c` elements on `x`'s device.
fn check_param(op: &'static str, what: &str, t: Option<&Tensor>, x: &Tensor, c: usize) -> Result<()> {
    let Some(t) = t else { return Ok(()) };
    x.device().same_as(t.device(), op)?;
    if !t.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("{what} must be a float tensor, got {}", t.dtype()),
        ));
    }
    if t.numel() != c {
        return Err(Error::shape(
            op,
            format!(
                "{what} of shape {:?} should have {c} elements for input of shape {:?}",
                t.shape(),
                x.shape()
            ),
        ));
    }
    Ok(())
}

/// The CPU kernel of [`Tensor::batch_norm_forward`] (operands checked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpu_forward(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<BatchNormForward> {
    const OP: &str = "batch_norm";
    check_eps(OP, eps)?;
    let (n, c, s) = dims3(OP, input)?;
    let rm = param::<f64>(OP, "running_mean", running_mean, input, c)?;
    let rv = param::<f64>(OP, "running_var", running_var, input, c)?;
    let x = input.contiguous()?;
    let (mean, var, new_rm, new_rv) = if training {
        let count = n * s;
        if count <= 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "expected more than 1 value per channel when training, got input of shape {:?}",
                    input.shape()
                ),
            ));
        }
        let (mean, var) = stats(&x, OP)?;
        let unbias = count as f64 / (count - 1) as f64;
        let upd = |r: &[f64], stat: &[f64], scale: f64| -> Vec<f64> {
            r.iter()
                .zip(stat)
                .map(|(r, x)| (1.0 - momentum) * r + momentum * x * scale)
                .collect()
        };
        let new_rm = rm.map(|r| upd(&r, &mean, 1.0));
        let new_rv = rv.map(|r| upd(&r, &var, unbias));
        (mean, var, new_rm, new_rv)
    } else {
        match (rm, rv) {
            (Some(m), Some(v)) => (m, v, None, None),
            _ => return Err(Error::arg(OP, "eval mode needs running_mean and running_var")),
        }
    };
    let invstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let w = param::<f64>(OP, "weight", weight, input, c)?;
    let b = param::<f64>(OP, "bias", bias, input, c)?;
    // Per channel: y = x·scale + shift.
    let coef: Vec<(f64, f64)> = (0..c)
        .map(|ci| {
            let scale = invstd[ci] * w.as_ref().map_or(1.0, |w| w[ci]);
            (scale, b.as_ref().map_or(0.0, |b| b[ci]) - mean[ci] * scale)
        })
        .collect();
    let y = if input.dtype() == DType::F32 {
        let coef: Vec<(f32, f32)> = coef.iter().map(|&(a, b)| (a as f32, b as f32)).collect();
        batch_norm_f32::normalize(x.as_slice::<f32>()?, c, s, &coef, input.shape())?
    } else {
        crate::with_float_dtype!(input.dtype(), T => {
            type M = <T as FloatElement>::Math;
            let coef: Vec<(M, M)> = coef.iter().map(|&(a, b)| (M::of(a), M::of(b))).collect();
            let xs = x.as_slice::<T>()?;
            let y: Vec<T> = crate::ops::norm_common::rows_forward(xs, s.max(1), &vec![<M as FloatMath>::ZERO; n * c], &vec![<M as FloatMath>::ONE; n * c], |r, _| coef[r % c]);
            tensor_from(&y, input.shape())?
        }, else return Err(Error::dtype(OP, format!("expects a float tensor, got {}", input.dtype()))))
    };
    let running = |v: Option<Vec<f64>>, like: Option<&Tensor>| {
        v.zip(like)
            .map(|(v, t)| Tensor::from_slice(&v, &[c]).and_then(|r| r.to_dtype(t.dtype())))
    };
    Ok(BatchNormForward {
        y,
        mean: stats_tensor(&mean, &[c], input.dtype())?,
        invstd: stats_tensor(&invstd, &[c], input.dtype())?,
        running_mean: running(new_rm, running_mean).transpose()?,
        running_var: running(new_rv, running_var).transpose()?,
    })
}

/// The CPU kernel of [`Tensor::batch_norm_backward`] (operands checked).
pub(crate) fn cpu_backward(
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    training: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "batch_norm_backward";
    let (n, c, s) = dims3(OP, x)?;
    check_grad(OP, dy, x)?;
    let mean = param::<f64>(OP, "mean", Some(mean), x, c)?.unwrap_or_default();
    let invstd = param::<f64>(OP, "invstd", Some(invstd), x, c)?.unwrap_or_default();
    let w = param::<f64>(OP, "weight", weight, x, c)?;
    let (xc, dyc) = (x.contiguous()?, dy.contiguous()?);
    if x.dtype() == DType::F32 {
        let (xs, dys) = (xc.as_slice::<f32>()?, dyc.as_slice::<f32>()?);
        let (dot, db) = batch_norm_f32::grad_sums(dys, xs, n, c, s, &mean);
        let dw: Vec<f64> = dot.iter().zip(&invstd).map(|(d, i)| d * i).collect();
        let coef: Vec<BatchNormGrad> = (0..c)
            .map(|ci| {
                let [k, a, b] = grad_coef(w.as_deref(), &invstd, &dw, &db, ci, n * s, training);
                let (mean, invstd) = (mean[ci] as f32, invstd[ci] as f32);
                let [k, a, b] = [k, a, b].map(|v| v as f32);
                BatchNormGrad {
                    k,
                    a,
                    b,
                    mean,
                    invstd,
                }
            })
            .collect();
        let dx = batch_norm_f32::input_grad(dys, xs, c, s, &coef, x.shape())?;
        let to_f32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        return Ok((
            dx,
            tensor_from(&to_f32(&dw), &[c])?,
            tensor_from(&to_f32(&db), &[c])?,
        ));
    }
    crate::with_float_dtype!(x.dtype(), T => {
        type M = <T as FloatElement>::Math;
        let (xs, dys) = (xc.as_slice::<T>()?, dyc.as_slice::<T>()?);
        let (dw, db) = channel_sums(n, c, s, |_, ci, at| {
            let d = dys[at].to_f64();
            (d * (xs[at].to_f64() - mean[ci]) * invstd[ci], d)
        });
        let coef: Vec<[M; 4]> = (0..c)
            .map(|ci| {
                let [k, a, b] = grad_coef(w.as_deref(), &invstd, &dw, &db, ci, n * s, training);
                [M::of(k), M::of(a), M::of(b), M::of(mean[ci])]
            })
            .collect();
        let inv: Vec<M> = invstd.iter().map(|&v| M::of(v)).collect();
        let dx: Vec<T> = xs
            .par_iter()
            .zip(dys)
            .with_min_len(crate::strided::PAR_THRESHOLD)
            .enumerate()
            .map(|(i, (&xv, &d))| {
                let ci = (i / s.max(1)) % c.max(1);
                let [k, a, b, m] = coef[ci];
                T::from_math(k * d.to_math() + a * (xv.to_math() - m) * inv[ci] + b)
            })
            .collect();
        let to_t = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(<T as Element>::from_f64).collect() };
        Ok((tensor_from(&dx, x.shape())?, tensor_from(&to_t(dw), &[c])?, tensor_from(&to_t(db), &[c])?))
    }, else Err(Error::dtype(OP, format!("expects a float tensor, got {}", x.dtype()))))
}

/// Channel `ci`'s [k, a, b] of the input gradient
/// dx = k·dy + a·x̂ + b, x̂ = (x − mean)·invstd, from the parameter
/// gradients `dw` = Σ dy·x̂ and `db` = Σ dy over `count` elements.
fn grad_coef(
    w: Option<&[f64]>,
    invstd: &[f64],
    dw: &[f64],
    db: &[f64],
    ci: usize,
    count: usize,
    training: bool,
) -> [f64; 3] {
    let k = w.map_or(1.0, |w| w[ci]) * invstd[ci];
    if training {
        let count = count as f64;
        [k, -k * dw[ci] / count, -k * db[ci] / count]
    } else {
        [k, 0.0, 0.0]
    }
}

/// (N, C, product of the remaining dims) of a `[N, C, *]` float input.
fn dims3(op: &'static str, x: &Tensor) -> Result<(usize, usize, usize)> {
    check_float(op, x)?;
    if x.ndim() < 2 {
        return Err(Error::shape(
            op,
            format!("expects an input [N, C, *], got shape {:?}", x.shape()),
        ));
    }
    Ok((x.shape()[0], x.shape()[1], x.shape()[2..].iter().product()))
}

/// Per-channel (mean, biased var) over every dim but 1, in f64.
fn stats(x: &Tensor, op: &'static str) -> Result<(Vec<f64>, Vec<f64>)> {
    let (n, c, s) = dims3(op, x)?;
    if x.dtype() == DType::F32 {
        let x = x.contiguous()?;
        return Ok(batch_norm_f32::stats(x.as_slice::<f32>()?, n, c, s));
    }
    let dims: Vec<isize> = (0..x.ndim() as isize).filter(|&d| d != 1).collect();
    let m = moments(x, op, &dims)?;
    let mean = m
        .iter()
        .map(|a| if a.0 == 0.0 { f64::NAN } else { a.1 })
        .collect();
    let var = m.iter().map(|a| a.2 / a.0).collect();
    Ok((mean, var))
}
