//! GPU bilinear resampling: the `resample.cu` kernels of
//! `tessera-cuda-kernels`, with the per-axis tap tables formed by the CPU's
//! own [`super::taps`] (shape-only data, uploaded once per call), so both
//! backends blend with the same weights; the backward scatters in the
//! CPU's order into f32, so both give the same bits.

use std::sync::Arc;

use tessera_cuda_kernels::ops::resample::{bilinear_bwd, bilinear_fwd, Bilinear, Tap};
use tessera_cuda_kernels::DevPtr;

use super::{spatial, taps};
use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, DeviceBuffer, DeviceState,
    Output,
};
use crate::{DType, Result, Tensor};

/// The tap table of one axis (`input` → `output`) on the device.
fn tap_table(
    op: &'static str,
    state: &Arc<DeviceState>,
    input: usize,
    output: usize,
    align_corners: bool,
    scale: Option<f64>,
) -> Result<DeviceBuffer> {
    let t: Vec<Tap> = taps::<f32>(op, input, output, align_corners, scale)?
        .into_iter()
        .map(|t| Tap {
            i0: t.i0,
            i1: t.i1,
            l0: t.l0,
            l1: t.l1,
        })
        .collect();
    DeviceBuffer::upload(op, state, bytemuck::cast_slice(&Tap::table(&t)))
}

/// Runs `f` with the geometry of resampling `planes` planes of `[h, w]` to
/// `out`, its tap tables on the device for the duration.
#[allow(clippy::too_many_arguments)]
fn with_geometry<R>(
    op: &'static str,
    state: &Arc<DeviceState>,
    planes: usize,
    [h, w]: [usize; 2],
    out: [usize; 2],
    align_corners: bool,
    scales: [Option<f64>; 2],
    f: impl FnOnce(&Bilinear) -> Result<R>,
) -> Result<R> {
    let rows = tap_table(op, state, h, out[0], align_corners, scales[0])?;
    let cols = tap_table(op, state, w, out[1], align_corners, scales[1])?;
    let g = Bilinear {
        planes,
        input: [h, w],
        output: out,
        rows: DevPtr::from_raw(rows.addr(), 3 * out[0]),
        cols: DevPtr::from_raw(cols.addr(), 3 * out[1]),
    };
    // The tables' frees are stream-ordered after the launches `f` makes.
    f(&g)
}

/// The checked GPU `[N, C, H, W]` input resampled to `out`, as
/// [`Tensor::upsample_bilinear2d`].
///
/// Errors: a dtype without kernels (f64), a device failure.
pub(crate) fn upsample(
    state: &Arc<DeviceState>,
    x: &Tensor,
    out: [usize; 2],
    align_corners: bool,
    scales: [Option<f64>; 2],
) -> Result<Tensor> {
    const OP: &str = "upsample_bilinear2d";
    let (h, w) = spatial(OP, x.shape())?;
    let x = contiguous(x)?;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let shape = [n, c, out[0], out[1]];
    with_kernel_float!(x.dtype(), T => with_geometry(OP, state, n * c, [h, w], out, align_corners, scales, |g| {
        let y = Output::new(OP, state, x.dtype(), shape.iter().product())?;
        let l = bilinear_fwd::<T>(g, contiguous_ptr(&x), y.ptr()).map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
        Ok(y.into_tensor(&shape))
    }), else Err(no_kernel(OP, state.device(), x.dtype())))
}

/// The input gradient of bilinear resampling on the GPU (shapes checked),
/// as [`super::upsample_bilinear2d_backward`].
///
/// Errors: a dtype without kernels, a device failure.
pub(crate) fn upsample_backward(
    state: &Arc<DeviceState>,
    grad_out: &Tensor,
    input_shape: &[usize],
    align_corners: bool,
    scales: [Option<f64>; 2],
) -> Result<Tensor> {
    const OP: &str = "upsample_bilinear2d_backward";
    let (h, w) = spatial(OP, input_shape)?;
    let go = contiguous(grad_out)?;
    let out = [go.shape()[2], go.shape()[3]];
    let planes = input_shape[0] * input_shape[1];
    let dx = Output::zeros(OP, state, DType::F32, planes * h * w)?;
    with_kernel_float!(go.dtype(), T => with_geometry(OP, state, planes, [h, w], out, align_corners, scales, |g| {
        let l = bilinear_bwd::<T>(g, contiguous_ptr(&go), dx.ptr()).map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])
    })?, else return Err(no_kernel(OP, state.device(), go.dtype())));
    dx.into_tensor(input_shape).to_dtype(grad_out.dtype())
}
