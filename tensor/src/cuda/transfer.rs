//! Copies between devices, GPU `contiguous`, strided copies between
//! layouts on one GPU, and GPU dtype casts.

use tessera_cuda_kernels::ops::elementwise::{cast as cast_launch, copy_strided, Operand};

use super::{
    contiguous_ptr, device, device_buffer, launch, operand, state_of, with_kernel_float, DeviceBuffer, Output,
};
use crate::{DType, Device, Layout, Result, Storage, Tensor};

/// `t`'s value on `to` (a different device than `t`'s), contiguous.
/// Errors as [`Tensor::to_device`].
pub(crate) fn transfer(t: &Tensor, to: Device) -> Result<Tensor> {
    const OP: &str = "to_device";
    match (t.device(), to) {
        (Device::Cpu, Device::Cuda(n)) => {
            let state = device(OP, n)?;
            let src = t.contiguous()?;
            let size = t.dtype().size_in_bytes();
            let start = src.layout().offset() * size;
            let bytes = if src.numel() == 0 {
                &[][..]
            } else {
                &src.storage().as_bytes()[start..start + src.numel() * size]
            };
            let buf = DeviceBuffer::upload(OP, &state, bytes)?;
            Ok(Tensor::from_parts(
                Storage::from_device(buf, t.dtype(), t.numel()),
                Layout::contiguous(t.shape()),
            ))
        }
        (Device::Cuda(_), Device::Cpu) => download(OP, t),
        (Device::Cuda(_), Device::Cuda(_)) => download(OP, t)?.to_device(to),
        (Device::Cpu, Device::Cpu) => Ok(t.clone()),
    }
}

/// The storage range `t` reaches, copied to the host and seen through
/// `t`'s layout (shifted), then made contiguous there.
fn download(op: &'static str, t: &Tensor) -> Result<Tensor> {
    let Some((lo, hi)) = t.layout().storage_range() else {
        return crate::with_dtype!(t.dtype(), T => Tensor::build::<T>(op, t.shape(), |_| {}));
    };
    let size = t.dtype().size_in_bytes();
    let bytes = device_buffer(op, t)?.download(op, lo * size..hi * size)?;
    let storage = Storage::from_raw_bytes(op, t.dtype(), &bytes)?;
    let layout = Layout::new(t.shape().to_vec(), t.strides().to_vec(), t.layout().offset() - lo);
    Tensor::from_parts(storage, layout).contiguous()
}

/// A contiguous copy of the GPU tensor `t` (or `t` itself when it already
/// is), by the strided copy kernel of its element size (every dtype).
pub(crate) fn contiguous(t: &Tensor) -> Result<Tensor> {
    const OP: &str = "contiguous";
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    let state = state_of(OP, t)?;
    let out = Output::new(OP, &state, t.dtype(), t.numel())?;
    copy_into(OP, t, &out, &Layout::contiguous(t.shape()))?;
    Ok(out.into_tensor(t.shape()))
}

/// Copies the GPU tensor `src` (any layout, any dtype) into `dst`, a fresh
/// output of `src`'s dtype on the same device, at the positions the layout
/// `at` (shaped like `src`, over `dst`'s elements) names. `at` must be
/// injective (a view: narrow, select, a slice, a permutation); the copy
/// kernel refuses a layout that writes one element twice or reaches past
/// `dst`.
///
/// Errors, naming `op`: those, and a device failure.
pub(crate) fn copy_into(op: &'static str, src: &Tensor, dst: &Output, at: &Layout) -> Result<()> {
    let state = state_of(op, src)?;
    debug_assert_eq!(src.dtype(), dst.dtype());
    let sl = src.layout();
    let l = super::with_element_size!(src.dtype(), T => copy_strided::<T>(
        operand(src, sl),
        Operand {
            ptr: dst.ptr::<T>(),
            offset: at.offset(),
            strides: at.strides(),
        },
        src.shape(),
    ))
    .map_err(super::kernel_err(op, state.device()))?;
    launch(op, &state, &[l])
}

/// The GPU tensor `t` converted to `dtype` (not its dtype): between f32,
/// f16 and bf16 by the cast kernel (round to nearest even, as the CPU
/// does), other pairs through the host with the CPU's conversion.
pub(crate) fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "to_dtype";
    let x = contiguous(t)?;
    let state = state_of(OP, &x)?;
    let direct = with_kernel_float!(x.dtype(), I => with_kernel_float!(dtype, O => {
        let out = Output::new(OP, &state, dtype, x.numel())?;
        let l = cast_launch::<I, O>(contiguous_ptr(&x), out.ptr(), x.numel())
            .map_err(super::kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
        Some(out.into_tensor(x.shape()))
    }, else None), else None);
    match direct {
        Some(y) => Ok(y),
        None => x.cpu()?.to_dtype(dtype)?.to_device(x.device()),
    }
}
