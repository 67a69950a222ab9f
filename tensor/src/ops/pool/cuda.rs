//! GPU dispatch of max pooling: the `pool.cu` kernels of
//! `tessera-cuda-kernels`. The backward gathers in the CPU's scatter order,
//! so both give the same bits.

use std::sync::Arc;

use tessera_cuda_kernels::ops::pool::{max_pool2d_bwd, max_pool2d_fwd, PoolGeom};

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
