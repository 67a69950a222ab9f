//! GPU dispatch of layer_norm and its backward: the fused one-block-per-row
//! kernels, statistics in f32.

use tessera_cuda_kernels::ops::layernorm::{layer_norm_bwd, layer_norm_bwd_workspace, layer_norm_fwd};

use crate::cuda::{
    common_device, contiguous, contiguous_ptr, kernel_err, launch, no_kernel, same_device, with_kernel_float,
    Output,
};
use crate::ops::norm_common::check_grad;
use crate::{DType, Error, Result, Tensor};

/// (y, mean, rstd) of the GPU tensor `x` normalized over its trailing dims
/// `normalized_shape`, as [`Tensor::layer_norm`].
///
/// Errors: shapes, dtypes or devices that disagree, `eps` not positive (the
/// kernel divides by sqrt(var + eps) in f32), a device failure.
pub(crate) fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm";
    let (rows, cols, stat_shape) = split(OP, x, normalized_shape)?;
    same_device(OP, &[&x, &weight, &bias])?;
    let state = common_device(OP, &[x])?;
    let w = param(OP, "weight", weight, x, cols)?;
    let b = param(OP, "bias", bias, x, cols)?;
    let x = contiguous(x)?;
    let y = Output::new(OP, &state, x.dtype(), x.numel())?;
    let mean = Output::new(OP, &state, DType::F32, rows)?;
    let rstd = Output::new(OP, &state, DType::F32, rows)?;
    with_kernel_float!(x.dtype(), T => {
        let l = layer_norm_fwd::<T>(
            contiguous_ptr(&x),
            w.as_ref().map(contiguous_ptr),
            b.as_ref().map(contiguous_ptr),
            y.ptr(), mean.ptr(), rstd.ptr(), rows, cols, eps as f32,
        ).map_err(kernel_err(OP, state.device()))?;
        if rows > 0 {
            launch(OP, &state, &[l])?;
        }
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} tensors", x.dtype()))));
    Ok((
        y.into_tensor(x.shape()),
        mean.into_tensor(&stat_shape),
        rstd.into_tensor(&stat_shape),
    ))
}

/// (dx, dweight, dbias) of [`layer_norm`] on the GPU, as
/// [`Tensor::layer_norm_backward`].
///
/// Errors as [`layer_norm`], and when `dy` does not match `x`.
pub(crate) fn layer_norm_backward(
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm_backward";
    let (rows, cols, _) = split(OP, x, normalized_shape)?;
    same_device(OP, &[&x, &dy, &mean, &rstd, &weight])?;
    let state = common_device(OP, &[x, dy, mean, rstd])?;
    check_grad(OP, dy, x)?;
    let w = param(OP, "weight", weight, x, cols)?;
    let stat = |what: &str, t: &Tensor| -> Result<Tensor> {
        if t.numel() != rows {
            return Err(Error::shape(
                OP,
                format!("{what} of shape {:?} should have {rows} elements", t.shape()),
            ));
        }
        contiguous(&t.to_dtype(DType::F32)?)
    };
    let (mean, rstd) = (stat("mean", mean)?, stat("rstd", rstd)?);
    let (x, dy) = (contiguous(x)?, contiguous(dy)?);
    let dx = Output::new(OP, &state, x.dtype(), x.numel())?;
    let dw = Output::new(OP, &state, x.dtype(), cols)?;
    let db = Output::new(OP, &state, x.dtype(), cols)?;
    let ws = Output::new(OP, &state, DType::F32, layer_norm_bwd_workspace(rows, cols))?;
    with_kernel_float!(x.dtype(), T => {
        let ls = layer_norm_bwd::<T>(
            contiguous_ptr(&x),
            w.as_ref().map(contiguous_ptr),
            contiguous_ptr(&dy),
            contiguous_ptr(&mean),
            contiguous_ptr(&rstd),
            dx.ptr(), dw.ptr(), db.ptr(), ws.ptr::<f32>(), rows, cols,
        ).map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &ls)?;
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} tensors", x.dtype()))));
    Ok((
        dx.into_tensor(x.shape()),
        dw.into_tensor(normalized_shape),
        db.into_tensor(normalized_shape),
    ))
}

/// (rows, row length, statistics shape) of `x` normalized over
/// `normalized_shape`; errors when `x` does not end with it.
fn split(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
    let lead = x.ndim().checked_sub(normalized_shape.len());
    match lead {
        Some(l) if !normalized_shape.is_empty() && x.shape()[l..] == *normalized_shape => {
            let mut stat_shape = x.shape()[..l].to_vec();
            stat_shape.resize(x.ndim(), 1);
            Ok((
                x.shape()[..l].iter().product(),
                normalized_shape.iter().product(),
                stat_shape,
            ))
        }
        _ => Err(Error::shape(
            op,
            format!(
                "input of shape {:?} does not end with normalized_shape {normalized_shape:?}",
                x.shape()
            ),
        )),
    }
}

/// An optional weight/bias: `cols` elements on `x`'s device, in `x`'s
/// dtype (converted on the device), contiguous.
fn param(
    op: &'static str,
    what: &str,
    t: Option<&Tensor>,
    x: &Tensor,
    cols: usize,
) -> Result<Option<Tensor>> {
    let Some(t) = t else { return Ok(None) };
    x.device().same_as(t.device(), op)?;
    if !t.dtype().is_float() || t.numel() != cols {
        return Err(Error::shape(
            op,
            format!(
                "{what} of shape {:?} ({}) should be a float tensor of {cols} elements for input of shape {:?}",
                t.shape(),
                t.dtype(),
                x.shape()
            ),
        ));
    }
    Ok(Some(contiguous(&t.to_dtype(x.dtype())?)?))
}
