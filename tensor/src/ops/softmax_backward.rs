//! The backward of softmax and log_softmax along one dim, from the forward's
//! output: one fused pass per lane (the lane's Σ, then the gradient).

use rayon::prelude::*;

use crate::ops::norm_common::{check_float, check_grad};
use crate::simd::{kernels, Level};
use crate::strided::PAR_THRESHOLD;
use crate::{dim_index, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// The gradient of [`Tensor::softmax`] along `dim` given its output `y`
    /// and the output gradient `dy`: dx = y·(dy − Σ dy·y). Errors when `dy`
    /// and `y` differ in shape, dtype or device, for non-float dtypes, and
    /// for an out-of-range dim.
    pub fn softmax_backward(dy: &Tensor, y: &Tensor, dim: isize) -> Result<Tensor> {
        dispatch("softmax_backward", dy, y, dim, false)
    }

    /// The gradient of [`Tensor::log_softmax`] along `dim` given its output
    /// `y` and the output gradient `dy`: dx = dy − exp(y)·Σ dy. Errors as
    /// [`Tensor::softmax_backward`].
    pub fn log_softmax_backward(dy: &Tensor, y: &Tensor, dim: isize) -> Result<Tensor> {
        dispatch("log_softmax_backward", dy, y, dim, true)
    }
}

/// Checks the operands, then runs the backend's kernel.
fn dispatch(op: &'static str, dy: &Tensor, y: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
    let backend = crate::backend::dispatch(op, &[dy, y])?;
    check_float(op, y)?;
    check_grad(op, dy, y)?;
    dim_index(op, dim, y.ndim().max(1))?;
    backend.softmax_backward(op, dy, y, dim, log)
}

/// The CPU kernel of [`Tensor::softmax_backward`] (`log`: of
/// [`Tensor::log_softmax_backward`]), reported as `op`.
pub(crate) fn cpu(op: &'static str, dy: &Tensor, y: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
    lanes_backward(op, dy, y, dim, log)
}

fn lanes_backward(op: &'static str, dy: &Tensor, y: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
    check_float(op, y)?;
    check_grad(op, dy, y)?;
    if y.ndim() == 0 {
        dim_index(op, dim, 1)?;
        let (dy1, y1) = (dy.reshape([1])?, y.reshape([1])?);
        return lanes_backward(op, &dy1, &y1, 0, log)?.reshape([]);
    }
    let d = dim_index(op, dim, y.ndim())? as isize;
    let (yt, dyt) = (
        y.transpose(d, -1)?.contiguous()?,
        dy.transpose(d, -1)?.contiguous()?,
    );
    let k = yt.shape()[yt.ndim() - 1];
    if yt.numel() == 0 {
        return y.zeros_like(None);
    }
    let min_rows = (PAR_THRESHOLD / k).max(1);
    let dx = crate::with_float_dtype!(y.dtype(), T => {
        let (ys, dys) = (yt.as_slice::<T>()?, dyt.as_slice::<T>()?);
        Tensor::build_overwrite::<T>(op, yt.shape(), |dx| {
            dx.par_chunks_mut(k).with_min_len(min_rows).enumerate().for_each(|(r, out)| {
                let (yr, gr) = (&ys[r * k..(r + 1) * k], &dys[r * k..(r + 1) * k]);
                row::<T>(yr, gr, out, log)
            })
        })?
    }, else unreachable!("checked to be float"));
    dx.transpose(d, -1)?.contiguous()
}

/// One lane of the backward in `T`'s math type (SIMD kernels for f32).
fn row<T: FloatElement>(y: &[T], dy: &[T], dx: &mut [T], log: bool) {
    if let (Some(y), Some(dy), Some(dx)) = (as_f32(y), as_f32(dy), as_f32_mut(dx)) {
        return kernels::softmax_backward(Level::best(), y, dy, dx, log);
    }
    let s = crate::ops::reduce::cpu::pairwise(y.len(), &|i| {
        if log {
            dy[i].to_math()
        } else {
            dy[i].to_math() * y[i].to_math()
        }
    });
    for ((o, &yi), &gi) in dx.iter_mut().zip(y).zip(dy) {
        let (yi, gi) = (yi.to_math(), gi.to_math());
        *o = T::from_math(if log { gi - yi.exp() * s } else { yi * (gi - s) });
    }
}

/// `s` as f32 when `T` is f32.
pub(crate) fn as_f32<T: FloatElement>(s: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32, so the slice is reinterpreted as itself.
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// `s` as mutable f32 when `T` is f32.
pub(crate) fn as_f32_mut<T: FloatElement>(s: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32, so the slice is reinterpreted as itself.
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}
