//! Group normalization on the GPU: each (sample, group) row of
//! `per_group · S` elements is normalized by the fused LayerNorm kernels
//! (`layernorm.cu`, statistics in f32), then the per-channel affine is
//! applied with broadcast device ops; the backward feeds dy·weight to the
//! LayerNorm backward and sums dy and dy·x̂ per channel.

use super::Groups;
use crate::{DType, Result, Tensor};

/// A per-channel `[C]` tensor as f32 `[1, C, 1]`.
fn per_channel(t: &Tensor, c: usize) -> Result<Tensor> {
    t.to_dtype(DType::F32)?.reshape([1, c, 1])
}

/// (y, mean, rstd) of the checked GPU input, as
/// [`Tensor::group_norm_forward`]; mean and rstd are f32 `[N, groups]`.
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn forward(
    x: &Tensor,
    g: &Groups,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let rows = x.to_dtype(DType::F32)?.reshape([g.n * g.groups, g.k()])?;
    let (xhat, mean, rstd) = rows.layer_norm_forward(&[g.k()], None, None, eps)?;
    let mut y = xhat.reshape([g.n, g.c, g.s])?;
    if let Some(w) = weight {
        y = y.mul(&per_channel(w, g.c)?)?;
    }
    if let Some(b) = bias {
        y = y.add(&per_channel(b, g.c)?)?;
    }
    let stats = [g.n, g.groups];
    Ok((
        y.reshape(x.shape())?.to_dtype(x.dtype())?,
        mean.to_dtype(DType::F32)?.reshape(stats)?,
        rstd.to_dtype(DType::F32)?.reshape(stats)?,
    ))
}

/// (dx, dweight, dbias) of group normalization on the GPU, as
/// [`Tensor::group_norm_backward`].
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn backward(
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    g: &Groups,
    weight: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (r, k) = (g.n * g.groups, g.k());
    let dy3 = dy.to_dtype(DType::F32)?.reshape([g.n, g.c, g.s])?;
    let dxhat = match weight {
        Some(w) => dy3.mul(&per_channel(w, g.c)?)?,
        None => dy3.clone(),
    };
    let xr = x.to_dtype(DType::F32)?.reshape([r, k])?;
    let stat = |t: &Tensor| t.to_dtype(DType::F32)?.reshape([r, 1]);
    let (mean, rstd) = (stat(mean)?, stat(rstd)?);
    let (dx, _, _) = Tensor::layer_norm_backward(&dxhat.reshape([r, k])?, &xr, &mean, &rstd, &[k], None)?;
    let xhat = xr.sub(&mean)?.mul(&rstd)?.reshape([g.n, g.c, g.s])?;
    let dw = dy3.mul(&xhat)?.sum(&[0, 2], false)?;
    let db = dy3.sum(&[0, 2], false)?;
    Ok((
        dx.reshape(x.shape())?.to_dtype(x.dtype())?,
        dw.to_dtype(x.dtype())?,
        db.to_dtype(x.dtype())?,
    ))
}
