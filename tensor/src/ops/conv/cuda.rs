//! GPU dispatch of conv2d and its backward: the im2col / col2im kernels of
//! `tessera-cuda-kernels` around the device GEMM of [`Tensor::matmul`]
//! (per sample `W[O, C·kh·kw] · cols[C·kh·kw, OH·OW]`, as a batched matmul
//! broadcasting the weight). One group only: grouped and depthwise
//! convolutions have no GPU path yet.

use std::sync::Arc;

use tessera_cuda_kernels::ops::conv::{col2im, im2col, ConvGeom};

use super::Geom;
use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, DeviceState, Output,
};
use crate::{Result, Tensor};

/// `conv2d(x, w) + bias` for checked GPU operands.
///
/// Errors: more than one group, a dtype without kernels (f64), a device
/// failure.
pub(crate) fn forward(
    state: &Arc<DeviceState>,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geom,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    one_group(OP, state, g)?;
    let cols = unfold(OP, state, x, g)?;
    let mut y = weight.reshape([g.o, g.kk()])?.matmul(&cols)?;
    if let Some(b) = bias {
        y = y.add(&b.reshape([g.o, 1])?)?;
    }
    y.reshape(g.out_shape())
}

/// The input gradient: `col2im(Wᵀ · grad_out)` per sample.
///
/// Errors as [`forward`].
pub(crate) fn backward_input(
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    weight: &Tensor,
    g: &Geom,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_input";
    one_group(OP, state, g)?;
    let go = grad_out.reshape([g.n, g.o, g.l()])?;
    let cols = contiguous(&weight.reshape([g.o, g.kk()])?.t()?.matmul(&go)?)?;
    with_kernel_float!(cols.dtype(), T => {
        let out = Output::new(OP, state, cols.dtype(), g.n * g.c * g.h * g.w)?;
        let l = col2im::<T>(&kernel_geom(g), contiguous_ptr(&cols), out.ptr())
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
        Ok(out.into_tensor(&[g.n, g.c, g.h, g.w]))
    }, else Err(no_kernel(OP, state.device(), cols.dtype())))
}

/// The weight gradient: `Σₙ grad_out[n] · cols[n]ᵀ`.
///
/// Errors as [`forward`].
pub(crate) fn backward_weight(
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    input: &Tensor,
    g: &Geom,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    one_group(OP, state, g)?;
    let cols = unfold(OP, state, input, g)?;
    let go = grad_out.reshape([g.n, g.o, g.l()])?;
    go.matmul(&cols.transpose(1, 2)?)?
        .sum(&[0], false)?
        .reshape([g.o, g.cg, g.kh, g.kw])
}

fn one_group(op: &'static str, state: &DeviceState, g: &Geom) -> Result<()> {
    if g.groups == 1 {
        Ok(())
    } else {
        Err(no_kernel(
            op,
            state.device(),
            format_args!("groups = {}", g.groups),
        ))
    }
}

/// The columns `[N, C·kh·kw, OH·OW]` of the GPU input `x`.
fn unfold(op: &'static str, state: &Arc<DeviceState>, x: &Tensor, g: &Geom) -> Result<Tensor> {
    let x = contiguous(x)?;
    with_kernel_float!(x.dtype(), T => {
        let out = Output::new(op, state, x.dtype(), g.n * g.kk() * g.l())?;
        let l = im2col::<T>(&kernel_geom(g), contiguous_ptr(&x), out.ptr())
            .map_err(kernel_err(op, state.device()))?;
        launch(op, state, &[l])?;
        Ok(out.into_tensor(&[g.n, g.kk(), g.l()]))
    }, else Err(no_kernel(op, state.device(), x.dtype())))
}

fn kernel_geom(g: &Geom) -> ConvGeom {
    ConvGeom {
        batch: g.n,
        channels: g.c,
        input: [g.h, g.w],
        kernel: [g.kh, g.kw],
        padding: g.padding,
        stride: g.stride,
        dilation: g.dilation,
    }
}
