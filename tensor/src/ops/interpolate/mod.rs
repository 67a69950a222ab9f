//! Bilinear interpolation of `[N, C, H, W]` tensors (PyTorch's
//! `F.interpolate(mode="bilinear")` / `upsample_bilinear2d`) and its backward.
//!
//! Source coordinates follow PyTorch exactly: with `align_corners` the
//! corners map onto corners (`src = dst·(in−1)/(out−1)`); without, pixel
//! centres map (`src = max((dst+0.5)·s − 0.5, 0)` with `s = 1/scale` when a
//! scale factor was given, else `in/out`). Coordinates and blends run in
//! the math type (f32 for f32/f16/bf16, f64 for f64), as PyTorch does.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use crate::ops::math_view::math_view;
use crate::ops::norm_common::check_float;
use crate::{Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// `F.interpolate(self, size=.., scale_factor=.., mode="bilinear",
    /// align_corners=..)` for a 4-D `[N, C, H, W]` tensor: give exactly one
    /// of `size` (`[OH, OW]`) and `scale_factor` (then `OH = floor(H·sh)`,
    /// and the factors themselves set the coordinate scale, as PyTorch does
    /// without `recompute_scale_factor`).
    ///
    /// Errors when both or neither of `size`/`scale_factor` is given, a
    /// factor is not positive and finite, the output would be empty, or the
    /// tensor is not a 4-D float tensor with non-empty spatial dimensions.
    pub fn interpolate_bilinear(
        &self,
        size: Option<[usize; 2]>,
        scale_factor: Option<[f64; 2]>,
        align_corners: bool,
    ) -> Result<Tensor> {
        const OP: &str = "interpolate_bilinear";
        same_device!(OP, self);
        match (size, scale_factor) {
            (Some(s), None) => self.upsample_bilinear2d(s, align_corners, [None, None]),
            (None, Some(f)) => {
                if f.iter().any(|&v| !(v.is_finite() && v > 0.0)) {
                    return Err(Error::arg(
                        OP,
                        format!("scale factors must be positive and finite, got {f:?}"),
                    ));
                }
                let (h, w) = spatial(OP, self.shape())?;
                let out = [(h as f64 * f[0]).floor(), (w as f64 * f[1]).floor()];
                if out.iter().any(|&o| o > usize::MAX as f64 / 2.0) {
                    return Err(Error::arg(
                        OP,
                        format!("scale factors {f:?} give an output too large for memory"),
                    ));
                }
                self.upsample_bilinear2d(
                    [out[0] as usize, out[1] as usize],
                    align_corners,
                    [Some(f[0]), Some(f[1])],
                )
            }
            _ => Err(Error::arg(OP, "give exactly one of size and scale_factor")),
        }
    }

    /// ATen's `upsample_bilinear2d`: bilinear resampling of a 4-D
    /// `[N, C, H, W]` tensor to `[N, C, OH, OW]` = `out`. `scales` are the
    /// optional scale factors that set the coordinate scale when
    /// `align_corners` is false (see the module docs).
    ///
    /// Errors when the tensor is not a 4-D float tensor with non-empty
    /// spatial dimensions or `out` has a zero.
    pub fn upsample_bilinear2d(
        &self,
        out: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        const OP: &str = "upsample_bilinear2d";
        let be = crate::backend::dispatch(OP, &[self])?;
        check_float(OP, self)?;
        spatial(OP, self.shape())?;
        check_out(OP, out)?;
        be.upsample_bilinear2d(self, out, align_corners, scales)
    }

    /// The CPU kernel of [`Tensor::upsample_bilinear2d`] (arguments checked).
    pub(crate) fn upsample_bilinear2d_cpu(
        &self,
        out: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        const OP: &str = "upsample_bilinear2d";
        let (h, w) = spatial(OP, self.shape())?;
        let x = self.contiguous()?;
        let (n, c) = (self.shape()[0], self.shape()[1]);
        Ok(crate::with_float_dtype!(self.dtype(), S => {
            let xs = x.as_slice::<S>()?;
            let ys = taps::<<S as FloatElement>::Math>(OP, h, out[0], align_corners, scales[0])?;
            let xt = taps::<<S as FloatElement>::Math>(OP, w, out[1], align_corners, scales[1])?;
            crate::ops::pool::fill_planes::<S>(&[n, c, out[0], out[1]], out[0] * out[1], |pl, o| {
                let src = &xs[pl * h * w..(pl + 1) * h * w];
                let at = |y: usize, x: usize| src[y * w + x].to_math();
                for (oy, ty) in ys.iter().enumerate() {
                    for (ox, tx) in xt.iter().enumerate() {
                        let top = tx.l0 * at(ty.i0, tx.i0) + tx.l1 * at(ty.i0, tx.i1);
                        let bottom = tx.l0 * at(ty.i1, tx.i0) + tx.l1 * at(ty.i1, tx.i1);
                        o[oy * out[1] + ox] = S::from_math(ty.l0 * top + ty.l1 * bottom);
                    }
                }
            })?
        }, else unreachable!("checked float")))
    }
}

/// The gradient of [`Tensor::upsample_bilinear2d`] with respect to its input
/// of shape `input_shape` `[N, C, H, W]`, given `grad_out` `[N, C, OH, OW]`
/// and the same `align_corners` and `scales`: each output gradient is
/// spread over its four source pixels with the forward's weights.
///
/// Errors when the shapes do not fit each other or `grad_out` is not float.
pub fn upsample_bilinear2d_backward(
    grad_out: &Tensor,
    input_shape: &[usize],
    align_corners: bool,
    scales: [Option<f64>; 2],
) -> Result<Tensor> {
    const OP: &str = "upsample_bilinear2d_backward";
    let be = crate::backend::dispatch(OP, &[grad_out])?;
    check_float(OP, grad_out)?;
    spatial(OP, input_shape)?;
    spatial(OP, grad_out.shape())?;
    if grad_out.shape()[..2] != input_shape[..2] {
        return Err(Error::shape(
            OP,
            format!(
                "grad_out {:?} does not fit input shape {input_shape:?}",
                grad_out.shape()
            ),
        ));
    }
    be.upsample_bilinear2d_backward(grad_out, input_shape, align_corners, scales)
}

/// The CPU kernel of [`upsample_bilinear2d_backward`] (shapes checked).
pub(crate) fn cpu_upsample_bilinear2d_backward(
    grad_out: &Tensor,
    input_shape: &[usize],
    align_corners: bool,
    scales: [Option<f64>; 2],
) -> Result<Tensor> {
    const OP: &str = "upsample_bilinear2d_backward";
    let (h, w) = spatial(OP, input_shape)?;
    let (oh, ow) = (grad_out.shape()[2], grad_out.shape()[3]);
    Ok(crate::with_float_dtype!(grad_out.dtype(), S => {
        let go = math_view::<S>(grad_out)?;
        let ys = taps::<<S as FloatElement>::Math>(OP, h, oh, align_corners, scales[0])?;
        let xt = taps::<<S as FloatElement>::Math>(OP, w, ow, align_corners, scales[1])?;
        let mut gi = crate::tensor::try_vec(OP, input_shape)?;
        gi.resize(input_shape.iter().product(), <<S as FloatElement>::Math as FloatMath>::ZERO);
        let plane = |(pl, g): (usize, &mut [<S as FloatElement>::Math])| {
            for (oy, ty) in ys.iter().enumerate() {
                for (ox, tx) in xt.iter().enumerate() {
                    let v = go[(pl * oh + oy) * ow + ox];
                    g[ty.i0 * w + tx.i0] += ty.l0 * tx.l0 * v;
                    g[ty.i0 * w + tx.i1] += ty.l0 * tx.l1 * v;
                    g[ty.i1 * w + tx.i0] += ty.l1 * tx.l0 * v;
                    g[ty.i1 * w + tx.i1] += ty.l1 * tx.l1 * v;
                }
            }
        };
        if gi.len() > crate::strided::PAR_THRESHOLD {
            gi.par_chunks_mut(h * w).enumerate().for_each(plane);
        } else {
            gi.chunks_mut(h * w).enumerate().for_each(plane);
        }
        Tensor::from_vec(gi.into_iter().map(S::from_math).collect::<Vec<S>>(), input_shape)?
    }, else unreachable!("checked float")))
}

/// The two source indices of one output coordinate and their weights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tap<T> {
    pub(crate) i0: usize,
    pub(crate) i1: usize,
    pub(crate) l0: T,
    pub(crate) l1: T,
}

/// PyTorch's `area_pixel_compute_scale`, `area_pixel_compute_source_index`
/// and `guard_index_and_lambda` for every output coordinate along one axis.
/// Errors, naming `op`, when memory for them is out.
pub(crate) fn taps<T: FloatMath>(
    op: &'static str,
    input: usize,
    output: usize,
    align_corners: bool,
    scale: Option<f64>,
) -> Result<Vec<Tap<T>>> {
    let mut taps = crate::tensor::try_vec(op, &[output])?;
    let s = if align_corners {
        if output > 1 {
            T::of((input - 1) as f64) / T::of((output - 1) as f64)
        } else {
            T::ZERO
        }
    } else {
        match scale {
            Some(f) if f > 0.0 => T::of(1.0 / f),
            _ => T::of(input as f64) / T::of(output as f64),
        }
    };
    let half = T::of(0.5);
    taps.extend((0..output).map(|dst| {
        let d = T::of(dst as f64);
        let real = if align_corners {
            s * d
        } else {
            let r = s * (d + half) - half;
            if r < T::ZERO {
                T::ZERO
            } else {
                r
            }
        };
        let i0 = (real.floor().f64() as usize).min(input - 1);
        let mut l1 = real - T::of(i0 as f64);
        if l1 < T::ZERO {
            l1 = T::ZERO;
        } else if l1 > T::ONE {
            l1 = T::ONE;
        }
        let i1 = if i0 < input - 1 { i0 + 1 } else { i0 };
        Tap {
            i0,
            i1,
            l0: T::ONE - l1,
            l1,
        }
    }));
    Ok(taps)
}

/// `(H, W)` of a 4-D shape with non-empty spatial dimensions.
pub(crate) fn spatial(op: &'static str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [_, _, h, w] if *h > 0 && *w > 0 => Ok((*h, *w)),
        _ => Err(Error::shape(
            op,
            format!("expects a 4-D [N, C, H, W] shape with H, W > 0, got {shape:?}"),
        )),
    }
}

fn check_out(op: &'static str, out: [usize; 2]) -> Result<()> {
    if out.contains(&0) {
        return Err(Error::shape(op, format!("output size {out:?} must be positive")));
    }
    Ok(())
}
