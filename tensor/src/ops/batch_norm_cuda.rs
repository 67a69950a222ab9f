//! Batch normalization on the GPU, composed of device ops over the input
//! viewed as `[N, C, S]`: per-channel mean and biased variance (two
//! passes), the running-stat update, `y = x·scale + shift` with per-channel
//! `scale = invstd·weight` and `shift = bias − mean·scale`, and the
//! backward's per-channel sums. Everything is computed in f32 and rounded
//! once to the input dtype; the CPU forms the statistics in f64, so the
//! two agree within f32 rounding.

use super::BatchNormForward;
use crate::{DType, Result, Tensor};

/// The input as f32 `[N, C, S]` and its (N, C, S).
fn as_ncs(x: &Tensor) -> Result<(Tensor, [usize; 3])> {
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let s = x.shape()[2..].iter().product();
    Ok((x.to_dtype(DType::F32)?.reshape([n, c, s])?, [n, c, s]))
}

/// A per-channel `[C]` tensor as f32 `[1, C, 1]`, broadcasting over `[N, C, S]`.
fn per_channel(t: &Tensor, c: usize) -> Result<Tensor> {
    t.to_dtype(DType::F32)?.reshape([1, c, 1])
}

/// Per-channel (mean, biased variance) of f32 `[N, C, S]`, as `[C]`.
fn moments(x3: &Tensor, c: usize) -> Result<(Tensor, Tensor)> {
    let mean = x3.mean(&[0, 2], false)?;
    let var = x3
        .sub(&mean.reshape([1, c, 1])?)?
        .square()?
        .mean(&[0, 2], false)?;
    Ok((mean, var))
}

/// Per-channel mean and biased variance of the checked GPU input, f32 `[C]`.
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn stats(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (x3, [_, c, _]) = as_ncs(x)?;
    moments(&x3, c)
}

/// `(1 − momentum)·r + momentum·scale·stat` in `r`'s dtype.
fn update(r: &Tensor, stat: &Tensor, momentum: f64, scale: f64) -> Result<Tensor> {
    r.to_dtype(DType::F32)?
        .mul_scalar(1.0 - momentum)?
        .add(&stat.mul_scalar(momentum * scale)?)?
        .to_dtype(r.dtype())
}

/// Batch normalization of the checked GPU input, as
/// [`Tensor::batch_norm_forward`]: `mean` and `invstd` come back as f32
/// `[C]`, the updated running stats in their own dtypes.
///
/// Errors: a dtype without kernels (f64), a device failure.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<BatchNormForward> {
    let (x3, [n, c, s]) = as_ncs(x)?;
    let (mean, var, new_rm, new_rv) = match (training, running_mean, running_var) {
        (true, rm, rv) => {
            let (mean, var) = moments(&x3, c)?;
            let count = (n * s) as f64;
            let unbias = count / (count - 1.0);
            let new_rm = rm.map(|r| update(r, &mean, momentum, 1.0)).transpose()?;
            let new_rv = rv.map(|r| update(r, &var, momentum, unbias)).transpose()?;
            (mean, var, new_rm, new_rv)
        }
        (false, Some(rm), Some(rv)) => (rm.to_dtype(DType::F32)?, rv.to_dtype(DType::F32)?, None, None),
        // The caller requires the running stats in eval.
        (false, _, _) => {
            return Err(crate::Error::arg(
                "batch_norm",
                "eval mode needs running_mean and running_var",
            ))
        }
    };
    // 1/√(var + eps) with a correctly rounded square root and division.
    let invstd = var.add_scalar(eps)?.sqrt()?.recip()?;
    let scale = match weight {
        Some(w) => invstd.mul(&w.to_dtype(DType::F32)?)?,
        None => invstd.clone(),
    };
    let shift = mean.mul(&scale)?.neg()?;
    let shift = match bias {
        Some(b) => shift.add(&b.to_dtype(DType::F32)?)?,
        None => shift,
    };
    let y = x3
        .mul(&per_channel(&scale, c)?)?
        .add(&per_channel(&shift, c)?)?
        .reshape(x.shape())?
        .to_dtype(x.dtype())?;
    Ok(BatchNormForward {
        y,
        mean,
        invstd,
        running_mean: new_rm,
        running_var: new_rv,
    })
}

/// The gradients (dx, dweight, dbias) of batch normalization on the GPU, as
/// [`Tensor::batch_norm_backward`]: dbias = Σ dy and dweight = Σ dy·x̂ per
/// channel; dx = k·(dy − (dbias + x̂·dweight)/count) in training and k·dy
/// in eval, with k = weight·invstd.
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn backward(
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    training: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x3, [n, c, s]) = as_ncs(x)?;
    let (dy3, _) = as_ncs(dy)?;
    let inv = per_channel(invstd, c)?;
    let xhat = x3.sub(&per_channel(mean, c)?)?.mul(&inv)?;
    let db = dy3.sum(&[0, 2], false)?;
    let dw = dy3.mul(&xhat)?.sum(&[0, 2], false)?;
    let k = match weight {
        Some(w) => inv.mul(&per_channel(w, c)?)?,
        None => inv,
    };
    let dx = if training {
        let count = (n * s) as f64;
        let mean_db = per_channel(&db, c)?.div_scalar(count)?;
        let mean_dw = per_channel(&dw, c)?.div_scalar(count)?;
        dy3.sub(&mean_db)?.sub(&xhat.mul(&mean_dw)?)?.mul(&k)?
    } else {
        dy3.mul(&k)?
    };
    Ok((
        dx.reshape(x.shape())?.to_dtype(x.dtype())?,
        dw.to_dtype(x.dtype())?,
        db.to_dtype(x.dtype())?,
    ))
}
