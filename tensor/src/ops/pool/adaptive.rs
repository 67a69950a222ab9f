//! Adaptive average pooling: output cell `o` of `out` along an input of
//! `size` averages input indices `floor(o·size/out) .. ceil((o+1)·size/out)`
//! (PyTorch's start/end formulas).

use std::ops::Range;

use super::{check_float, fill_planes, plane_dims, scatter_planes};
use crate::{Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// Adaptive average pooling of a 3-D `[C, H, W]` or 4-D `[N, C, H, W]`
    /// tensor to spatial size `out` (`[OH, OW]`).
    ///
    /// Errors when the tensor is not 3-D/4-D or not float, or has an empty
    /// spatial dimension.
    pub fn adaptive_avg_pool2d(&self, out: [usize; 2]) -> Result<Tensor> {
        const OP: &str = "adaptive_avg_pool2d";
        let be = crate::backend::dispatch(OP, &[self])?;
        check_float(OP, self)?;
        spatial(OP, self.shape())?;
        let shape = out_shape(self.shape(), out);
        plane_dims(OP, &shape).and_then(|_| {
            out[0]
                .checked_mul(out[1])
                .ok_or_else(|| super::too_large(OP, &shape))
        })?;
        be.adaptive_avg_pool2d(self, out)
    }
}

/// `shape` with its last two sizes replaced by `out`.
pub(super) fn out_shape(shape: &[usize], out: [usize; 2]) -> Vec<usize> {
    let mut s = shape.to_vec();
    let nd = s.len();
    s[nd - 2..].copy_from_slice(&out);
    s
}

/// The CPU kernel of [`Tensor::adaptive_avg_pool2d`] (input and sizes checked).
pub(crate) fn cpu_adaptive_avg_pool2d(x: &Tensor, out: [usize; 2]) -> Result<Tensor> {
    let (_, h, w) = plane_dims("adaptive_avg_pool2d", x.shape())?;
    let shape = out_shape(x.shape(), out);
    let plane = out[0] * out[1];
    let x = x.contiguous()?;
    Ok(crate::with_float_dtype!(x.dtype(), S => {
        let xs = x.as_slice::<S>()?;
        fill_planes::<S>(&shape, plane, |pl, o| {
            let src = &xs[pl * h * w..(pl + 1) * h * w];
            for oy in 0..out[0] {
                let ys = bounds(oy, out[0], h);
                for ox in 0..out[1] {
                    let xr = bounds(ox, out[1], w);
                    let mut sum = <<S as FloatElement>::Math as FloatMath>::ZERO;
                    for y in ys.clone() {
                        for v in &src[y * w + xr.start..y * w + xr.end] {
                            sum += v.to_math();
                        }
                    }
                    let count = <<S as FloatElement>::Math as FloatMath>::of((ys.len() * xr.len()) as f64);
                    o[oy * out[1] + ox] = S::from_math(sum / count);
                }
            }
        })?
    }, else unreachable!("checked float")))
}

/// The gradient of [`Tensor::adaptive_avg_pool2d`] with respect to its input
/// of shape `input_shape`, given `grad_out` (whose last two sizes are the
/// pooled size): each output gradient is spread evenly over its window.
///
/// Errors when the shapes do not fit each other or `grad_out` is not float.
pub fn adaptive_avg_pool2d_backward(grad_out: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d_backward";
    let be = crate::backend::dispatch(OP, &[grad_out])?;
    check_float(OP, grad_out)?;
    spatial(OP, input_shape)?;
    let nd = input_shape.len();
    if grad_out.ndim() != nd || grad_out.shape()[..nd - 2] != input_shape[..nd - 2] {
        return Err(Error::shape(
            OP,
            format!(
                "grad_out {:?} does not fit input shape {input_shape:?}",
                grad_out.shape()
            ),
        ));
    }
    be.adaptive_avg_pool2d_backward(grad_out, input_shape)
}

/// The CPU kernel of [`adaptive_avg_pool2d_backward`] (shapes checked).
pub(crate) fn cpu_adaptive_avg_pool2d_backward(grad_out: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
    let (_, h, w) = plane_dims("adaptive_avg_pool2d_backward", input_shape)?;
    let nd = input_shape.len();
    let (oh, ow) = (grad_out.shape()[nd - 2], grad_out.shape()[nd - 1]);
    Ok(crate::with_float_dtype!(grad_out.dtype(), S => {
        let go = crate::ops::math_view::math_view::<S>(grad_out)?;
        scatter_planes::<S>(input_shape, h * w, oh * ow, |pl, gi| {
            for oy in 0..oh {
                let ys = bounds(oy, oh, h);
                for ox in 0..ow {
                    let xr = bounds(ox, ow, w);
                    let count = <<S as FloatElement>::Math as FloatMath>::of((ys.len() * xr.len()) as f64);
                    let v = go[(pl * oh + oy) * ow + ox] / count;
                    for y in ys.clone() {
                        for g in &mut gi[y * w + xr.start..y * w + xr.end] {
                            *g += v;
                        }
                    }
                }
            }
        })?
    }, else unreachable!("checked float")))
}

/// `(planes, H, W)` of a 3-D/4-D shape with non-empty spatial dimensions.
fn spatial(op: &'static str, shape: &[usize]) -> Result<(usize, usize, usize)> {
    let (planes, h, w) = plane_dims(op, shape)?;
    if h == 0 || w == 0 {
        return Err(Error::shape(
            op,
            format!("input spatial dimensions must be non-empty, got shape {shape:?}"),
        ));
    }
    Ok((planes, h, w))
}

/// PyTorch's adaptive window of output cell `o` among `out` over `size` inputs.
fn bounds(o: usize, out: usize, size: usize) -> Range<usize> {
    (o * size / out)..((o + 1) * size).div_ceil(out)
}
