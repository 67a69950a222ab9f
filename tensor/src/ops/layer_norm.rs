//! Layer normalization over the trailing dims, forward (returning the
//! saved statistics) and backward, as PyTorch's `native_layer_norm`.

#[cfg(feature = "cuda")]
#[path = "layer_norm_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::layer_norm_f32;
use crate::ops::norm_common::{
    channel_sums, check_eps, check_float, check_grad, param, row_stats, rows_backward, rows_forward,
    stats_tensor, tensor_from,
};
use crate::{DType, Element, Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// Normalizes over the trailing dims `normalized_shape` (PyTorch's
    /// `F.layer_norm`): y = (x − mean)·rstd·weight + bias with
    /// rstd = 1/sqrt(var_biased + eps). Errors for non-float input, trailing
    /// dims that are not `normalized_shape`, weight/bias of another size, or
    /// a bad eps.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        Ok(self.layer_norm_forward(normalized_shape, weight, bias, eps)?.0)
    }

    /// [`Tensor::layer_norm`] also returning what
    /// [`Tensor::layer_norm_backward`] takes: (y, mean, rstd), where mean
    /// and rstd have shape `[*leading, 1, …]` (one 1 per normalized dim, as
    /// PyTorch) and dtype f32 (f64 for f64 input). Errors as
    /// [`Tensor::layer_norm`].
    pub fn layer_norm_forward(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm";
        crate::backend::dispatch(OP, &[&self as &dyn crate::backend::Operands, &weight, &bias])?.layer_norm(
            self,
            normalized_shape,
            weight,
            bias,
            eps,
        )
    }

    /// The CPU kernel of [`Tensor::layer_norm_forward`].
    pub(crate) fn layer_norm_cpu(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm";
        let (rows, k, stat_shape) = split(OP, self, normalized_shape)?;
        check_eps(OP, eps)?;
        let x = self.contiguous()?;
        if self.dtype() == DType::F32 && k > 0 {
            let w = param::<f32>(OP, "weight", weight, self, k)?.unwrap_or_default();
            let b = param::<f32>(OP, "bias", bias, self, k)?.unwrap_or_default();
            let (y, mean, rstd) =
                layer_norm_f32::forward(x.as_slice::<f32>()?, k, eps as f32, &w, &b, self.shape())?;
            return Ok((
                y,
                stats_tensor(&mean, &stat_shape, DType::F32)?,
                stats_tensor(&rstd, &stat_shape, DType::F32)?,
            ));
        }
        crate::with_float_dtype!(self.dtype(), T => {
            type M = <T as FloatElement>::Math;
            let w = param::<M>(OP, "weight", weight, self, k)?;
            let b = param::<M>(OP, "bias", bias, self, k)?;
            let xs = x.as_slice::<T>()?;
            let (mean, rstd) = row_stats(OP, xs, rows, k, eps)?;
            let y = rows_forward(xs, k, &mean, &rstd, |_, i| {
                (w.as_ref().map_or(<M as FloatMath>::ONE, |w| w[i]), b.as_ref().map_or(<M as FloatMath>::ZERO, |b| b[i]))
            });
            debug_assert_eq!(mean.len(), rows);
            Ok((
                tensor_from(&y, self.shape())?,
                stats_tensor(&mean, &stat_shape, self.dtype())?,
                stats_tensor(&rstd, &stat_shape, self.dtype())?,
            ))
        }, else Err(Error::dtype(OP, format!("expects a float tensor, got {}", x.dtype()))))
    }

    /// The gradients of [`Tensor::layer_norm`] given the output gradient
    /// `dy` and the saved `mean`/`rstd`: returns (dx, dweight, dbias), dx
    /// shaped like `x`, dweight = Σ dy·x̂ and dbias = Σ dy shaped
    /// `normalized_shape`, all in `x`'s dtype. `weight` is the forward's
    /// weight (None = 1). Errors when shapes, dtypes or sizes disagree.
    pub fn layer_norm_backward(
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm_backward";
        crate::backend::dispatch(
            OP,
            &[&dy as &dyn crate::backend::Operands, &x, &mean, &rstd, &weight],
        )?
        .layer_norm_backward(dy, x, mean, rstd, normalized_shape, weight)
    }

    /// The CPU kernel of [`Tensor::layer_norm_backward`].
    pub(crate) fn layer_norm_backward_cpu(
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm_backward";
        let (rows, k, _) = split(OP, x, normalized_shape)?;
        check_grad(OP, dy, x)?;
        let (x, dy) = (x.contiguous()?, dy.contiguous()?);
        if x.dtype() == DType::F32 && k > 0 {
            let w = param::<f32>(OP, "weight", weight, &x, k)?.unwrap_or_default();
            let mean = param::<f32>(OP, "mean", Some(mean), &x, rows)?.unwrap_or_default();
            let rstd = param::<f32>(OP, "rstd", Some(rstd), &x, rows)?.unwrap_or_default();
            let (dx, dw, db) = layer_norm_f32::backward(
                dy.as_slice::<f32>()?,
                x.as_slice::<f32>()?,
                k,
                &mean,
                &rstd,
                &w,
                x.shape(),
            )?;
            return Ok((
                dx,
                tensor_from(&dw, normalized_shape)?,
                tensor_from(&db, normalized_shape)?,
            ));
        }
        crate::with_float_dtype!(x.dtype(), T => {
            type M = <T as FloatElement>::Math;
            let w = param::<M>(OP, "weight", weight, &x, k)?;
            let mean = param::<M>(OP, "mean", Some(mean), &x, rows)?.unwrap_or_default();
            let rstd = param::<M>(OP, "rstd", Some(rstd), &x, rows)?.unwrap_or_default();
            let (xs, dys) = (x.as_slice::<T>()?, dy.as_slice::<T>()?);
            let dx = rows_backward(dys, xs, k, &mean, &rstd, |_, i| w.as_ref().map_or(<M as FloatMath>::ONE, |w| w[i]));
            let (dw, db) = channel_sums(rows, k, 1, |r, _, at| {
                let d = dys[at].to_f64();
                (d * (xs[at].to_f64() - mean[r].f64()) * rstd[r].f64(), d)
            });
            let to_t = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(<T as Element>::from_f64).collect() };
            Ok((
                tensor_from(&dx, x.shape())?,
                tensor_from(&to_t(dw), normalized_shape)?,
                tensor_from(&to_t(db), normalized_shape)?,
            ))
        }, else Err(Error::dtype(OP, format!("expects a float tensor, got {}", x.dtype()))))
    }
}

/// Checks `x` against `normalized_shape` and returns (rows, row length,
/// shape of the statistics).
fn split(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
    check_float(op, x)?;
    let nd = x.ndim();
    let lead = nd.checked_sub(normalized_shape.len());
    if normalized_shape.is_empty() || lead.is_none_or(|l| x.shape()[l..] != *normalized_shape) {
        return Err(Error::shape(
            op,
            format!(
                "input of shape {:?} does not end with normalized_shape {normalized_shape:?}",
                x.shape()
            ),
        ));
    }
    let lead = lead.unwrap_or(0);
    let mut stat_shape = x.shape()[..lead].to_vec();
    stat_shape.resize(nd, 1);
    Ok((
        x.shape()[..lead].iter().product(),
        normalized_shape.iter().product(),
        stat_shape,
    ))
}
