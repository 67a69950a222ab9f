//! GPU dispatch of max and average pooling: the `pool.cu` kernels of
//! `tessera-cuda-kernels`. The forwards sum (or compare) each window in the
//! CPU's order and the backwards gather in the CPU's scatter order, so both
//! give the same bits.

use std::sync::Arc;

use tessera_cuda_kernels::ops::pool::{
    avg_pool2d_bwd, avg_pool2d_fwd, max_pool2d_bwd, max_pool2d_fwd, AvgGeom, AvgWindows, PoolGeom,
};

use super::{plane_dims, Window};
use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, DeviceState, Output,
};
use crate::{DType, Result, Tensor};

/// Max pooling of the checked GPU input `x` with window `w`: values and i64
/// plane indices.
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn max_pool2d(state: &Arc<DeviceState>, x: &Tensor, w: &Window) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    let x = contiguous(x)?;
    let (planes, _, _) = plane_dims(OP, x.shape())?;
    let geom = geometry(w, planes);
    let shape = w.out_shape();
    let n = planes * w.oh * w.ow;
    with_kernel_float!(x.dtype(), T => {
        let y = Output::new(OP, state, x.dtype(), n)?;
        let idx = Output::new(OP, state, DType::I64, n)?;
        let l = max_pool2d_fwd::<T>(&geom, contiguous_ptr(&x), y.ptr(), idx.ptr())
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
        Ok((y.into_tensor(&shape), idx.into_tensor(&shape)))
    }, else Err(no_kernel(OP, state.device(), x.dtype())))
}

/// The input gradient of max pooling from the forward's `indices`
/// (checked against `grad_out` and `input_shape` by the caller), summed in
/// f32 in the CPU's order and rounded to `grad_out`'s dtype. Indices outside
/// their plane add nothing (the CPU errs; the device does not read them
/// back to check).
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn max_pool2d_backward(
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    indices: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let (planes, h, w) = plane_dims(OP, input_shape)?;
    let (go, idx) = (contiguous(grad_out)?, contiguous(indices)?);
    let outs = go.numel() / planes.max(1);
    let dx = Output::zeros(OP, state, DType::F32, planes * h * w)?;
    with_kernel_float!(go.dtype(), T => {
        let l = max_pool2d_bwd::<T>(planes, h * w, outs, contiguous_ptr(&go), contiguous_ptr(&idx), dx.ptr())
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
    }, else return Err(no_kernel(OP, state.device(), go.dtype())));
    dx.into_tensor(input_shape).to_dtype(grad_out.dtype())
}

fn geometry(w: &Window, planes: usize) -> PoolGeom {
    PoolGeom {
        planes,
        input: [w.h, w.w],
        output: [w.oh, w.ow],
        kernel: w.p.kernel,
        stride: w.p.stride,
        padding: w.p.padding,
        dilation: w.p.dilation,
    }
}

/// Average pooling of the checked GPU input `x` with window `w`.
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn avg_pool2d(state: &Arc<DeviceState>, x: &Tensor, w: &Window) -> Result<Tensor> {
    let (planes, _, _) = plane_dims("avg_pool2d", x.shape())?;
    avg_forward("avg_pool2d", state, x, &avg_geometry(w, planes), &w.out_shape())
}

/// The input gradient of average pooling with window `w` (`grad_out`
/// checked against it).
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn avg_pool2d_backward(state: &Arc<DeviceState>, grad_out: &Tensor, w: &Window) -> Result<Tensor> {
    let (planes, _, _) = plane_dims("avg_pool2d_backward", grad_out.shape())?;
    let mut shape = w.out_shape();
    let nd = shape.len();
    shape[nd - 2..].copy_from_slice(&[w.h, w.w]);
    avg_backward(
        "avg_pool2d_backward",
        state,
        grad_out,
        &avg_geometry(w, planes),
        &shape,
    )
}

/// Adaptive average pooling of the checked GPU input `x` to `out`.
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn adaptive_avg_pool2d(state: &Arc<DeviceState>, x: &Tensor, out: [usize; 2]) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    let (planes, h, w) = plane_dims(OP, x.shape())?;
    let g = adaptive_geometry(planes, [h, w], out);
    avg_forward(OP, state, x, &g, &super::adaptive::out_shape(x.shape(), out))
}

/// The input gradient of adaptive average pooling (shapes checked).
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn adaptive_avg_pool2d_backward(
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d_backward";
    let (planes, h, w) = plane_dims(OP, input_shape)?;
    let nd = grad_out.ndim();
    let out = [grad_out.shape()[nd - 2], grad_out.shape()[nd - 1]];
    avg_backward(
        OP,
        state,
        grad_out,
        &adaptive_geometry(planes, [h, w], out),
        input_shape,
    )
}

fn avg_forward(
    op: &'static str,
    state: &Arc<DeviceState>,
    x: &Tensor,
    g: &AvgGeom,
    shape: &[usize],
) -> Result<Tensor> {
    let x = contiguous(x)?;
    with_kernel_float!(x.dtype(), T => {
        let y = Output::new(op, state, x.dtype(), shape.iter().product())?;
        let l = avg_pool2d_fwd::<T>(g, contiguous_ptr(&x), y.ptr()).map_err(kernel_err(op, state.device()))?;
        launch(op, state, &[l])?;
        Ok(y.into_tensor(shape))
    }, else Err(no_kernel(op, state.device(), x.dtype())))
}

fn avg_backward(
    op: &'static str,
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    g: &AvgGeom,
    shape: &[usize],
) -> Result<Tensor> {
    let go = contiguous(grad_out)?;
    with_kernel_float!(go.dtype(), T => {
        let dx = Output::new(op, state, go.dtype(), shape.iter().product())?;
        let l = avg_pool2d_bwd::<T>(g, contiguous_ptr(&go), dx.ptr()).map_err(kernel_err(op, state.device()))?;
        launch(op, state, &[l])?;
        Ok(dx.into_tensor(shape))
    }, else Err(no_kernel(op, state.device(), go.dtype())))
}

fn avg_geometry(w: &Window, planes: usize) -> AvgGeom {
    AvgGeom {
        planes,
        input: [w.h, w.w],
        output: [w.oh, w.ow],
        windows: AvgWindows::Fixed {
            kernel: w.p.kernel,
            stride: w.p.stride,
            padding: w.p.padding,
            count_include_pad: w.p.count_include_pad,
            divisor: w.p.divisor_override,
        },
    }
}

fn adaptive_geometry(planes: usize, input: [usize; 2], output: [usize; 2]) -> AvgGeom {
    AvgGeom {
        planes,
        input,
        output,
        windows: AvgWindows::Adaptive,
    }
}
