//! The CUDA backend (feature `cuda`): GPU storage, host↔device copies, and
//! the helpers the per-op `cuda.rs` files launch `tessera-cuda-kernels`
//! kernels with.
//!
//! A device is a `tessera_cuda_kernels::Runtime` opened by
//! `runtime::open`: the CUDA driver on a GPU, or (feature `cuda-emu`) the
//! CPU emulator of the device where none is present, so this backend runs
//! in tests without a GPU. Its memory comes from a caching allocator
//! ([`crate::Device::memory_stats`], [`crate::Device::empty_cache`]).
//!
//! [`fused_optim`] holds the fused multi-tensor optimizer steps (Adam/AdamW,
//! SGD) that `tessera-optim` runs for parameters on a GPU.
//!
//! Every GPU op runs on its device's one stream, so launches, copies and
//! frees are ordered without explicit synchronisation; only a copy to the
//! host waits. Ops reach these kernels through the backend layer
//! ([`crate::backend`]), whose CUDA implementation names every op without
//! a GPU path; a CPU kernel that is nonetheless reached by GPU storage
//! panics in the storage accessor rather than read device memory.

mod buffer;
pub mod fused_optim;
mod memory;
mod transfer;

use std::sync::Arc;

use tessera_cuda_kernels::ops::elementwise::Operand;
use tessera_cuda_kernels::{DevPtr, Launch};

pub(crate) use crate::backend::{no_kernel, same_device};
pub(crate) use buffer::{device, kernel_err, DeviceBuffer, DeviceState};
pub(crate) use transfer::{cast, contiguous, copy_into, transfer};

use crate::{DType, Device, Error, Layout, Result, Storage, Tensor};

/// Runs `$body` with `$T` bound to the Rust type of `$dtype` when the
/// kernels exist for it (f32, f16, bf16); evaluates `$other` otherwise.
macro_rules! with_kernel_float {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_kernel_float;

/// Runs `$body` with `$T` bound to a Rust type of `$dtype`'s element size
/// (u8, f16, f32 or u64 for 1, 2, 4 or 8 bytes): the kernels that only move
/// elements (copies, gathers and scatters, `where`, tril/triu) serve every
/// dtype by its size.
macro_rules! with_element_size {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype.size_in_bytes() {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = $crate::f16;
                $body
            }
            4 => {
                type $T = f32;
                $body
            }
            _ => {
                type $T = u64;
                $body
            }
        }
    };
}
pub(crate) use with_element_size;

impl Tensor {
    /// True when the elements live on a GPU: the test at the top of every
    /// op with a CUDA path.
    pub(crate) fn is_cuda(&self) -> bool {
        !self.device().is_cpu()
    }
}

/// The device all of `ts` share, opened; errors, naming `op`, when they are
/// on different devices or not on a GPU.
pub(crate) fn common_device(op: &'static str, ts: &[&Tensor]) -> Result<Arc<DeviceState>> {
    let first = ts.first().ok_or_else(|| Error::arg(op, "no operands"))?;
    for t in ts {
        first.device().same_as(t.device(), op)?;
    }
    // Every operand's pointer is taken later: each must have memory.
    for t in ts {
        device_buffer(op, t)?;
    }
    state_of(op, first)
}

/// The opened device holding `t`. Errors, naming `op`, when `t` has no
/// device memory behind it (it is on the CPU).
pub(crate) fn state_of(op: &'static str, t: &Tensor) -> Result<Arc<DeviceState>> {
    Ok(device_buffer(op, t)?.state().clone())
}

/// The GPU buffer of `t`, or an error naming `op` when it has none.
pub(crate) fn device_buffer<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a DeviceBuffer> {
    t.storage().device_buffer().ok_or_else(|| {
        Error::device(
            op,
            format!(
                "the tensor has no device memory behind it (it is on {})",
                t.device()
            ),
        )
    })
}

/// The GPU buffer of `t`, which must be on a GPU: for the pointer helpers
/// below, called after [`state_of`] or [`common_device`] succeeded.
pub(crate) fn buffer_of(t: &Tensor) -> &DeviceBuffer {
    t.storage()
        .device_buffer()
        .expect("callers check that the tensor is on a GPU")
}

/// The whole storage of `t` as a device pointer of `T` (its dtype).
pub(crate) fn storage_ptr<T>(t: &Tensor) -> DevPtr<T> {
    debug_assert_eq!(std::mem::size_of::<T>(), t.dtype().size_in_bytes());
    DevPtr::from_raw(buffer_of(t).addr(), t.storage().len())
}

/// The elements of a contiguous `t` as a device pointer of `T`.
pub(crate) fn contiguous_ptr<T>(t: &Tensor) -> DevPtr<T> {
    debug_assert!(t.is_contiguous());
    if t.numel() == 0 {
        return DevPtr::from_raw(buffer_of(t).addr(), 0);
    }
    let off = (t.layout().offset() * std::mem::size_of::<T>()) as u64;
    DevPtr::from_raw(buffer_of(t).addr() + off, t.numel())
}

/// `t` as an elementwise operand over `layout` (its own layout, possibly
/// broadcast to the output shape).
pub(crate) fn operand<'a, T>(t: &Tensor, layout: &'a Layout) -> Operand<'a, T> {
    Operand {
        ptr: storage_ptr(t),
        offset: layout.offset(),
        strides: layout.strides(),
    }
}

/// A fresh output of `numel` elements of `dtype` on a GPU, written by
/// kernels through [`Output::ptr`] before it becomes a tensor.
pub(crate) struct Output {
    buf: DeviceBuffer,
    dtype: DType,
    numel: usize,
}

impl Output {
    /// Uninitialised memory, for kernels that write every element.
    pub(crate) fn new(
        op: &'static str,
        state: &Arc<DeviceState>,
        dtype: DType,
        numel: usize,
    ) -> Result<Self> {
        let bytes = bytes_of(op, dtype, numel)?;
        Ok(Output {
            buf: DeviceBuffer::alloc(op, state, bytes)?,
            dtype,
            numel,
        })
    }

    /// Zeroed memory, for kernels that accumulate.
    pub(crate) fn zeros(
        op: &'static str,
        state: &Arc<DeviceState>,
        dtype: DType,
        numel: usize,
    ) -> Result<Self> {
        let bytes = bytes_of(op, dtype, numel)?;
        Ok(Output {
            buf: DeviceBuffer::zeros(op, state, bytes)?,
            dtype,
            numel,
        })
    }

    /// The device pointer kernels write through.
    pub(crate) fn ptr<T>(&self) -> DevPtr<T> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        DevPtr::from_raw(self.buf.addr(), self.numel)
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The output as a contiguous tensor of `shape`.
    pub(crate) fn into_tensor(self, shape: &[usize]) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), self.numel);
        Tensor::from_parts(
            Storage::from_device(self.buf, self.dtype, self.numel),
            Layout::contiguous(shape),
        )
    }
}

fn bytes_of(op: &'static str, dtype: DType, numel: usize) -> Result<usize> {
    numel.checked_mul(dtype.size_in_bytes()).ok_or_else(|| {
        Error::arg(
            op,
            format!("{numel} elements of {dtype} overflow the address space"),
        )
    })
}

/// Launches `launches` in order on `state`'s stream; launches with an empty
/// grid (empty tensors) are skipped.
///
/// The pointers in each launch must come from [`storage_ptr`],
/// [`contiguous_ptr`], [`operand`] or [`Output::ptr`] of tensors and
/// outputs the caller holds until this returns: frees are stream-ordered,
/// so the memory outlives the kernels even if the tensors are dropped next.
pub(crate) fn launch(op: &'static str, state: &DeviceState, launches: &[Launch]) -> Result<()> {
    for l in launches {
        if l.grid.contains(&0) {
            continue;
        }
        // SAFETY: the wrappers that built `l` checked every pointer against
        // the length of the buffer it came from (see above); outputs are
        // fresh buffers nothing else reads or writes.
        unsafe { state.launch(op, l) }?;
    }
    Ok(())
}

/// A creation op for a GPU: `make` builds the tensor on the CPU (with
/// `opts`' dtype), then it is copied to `opts.device`. Used where no fill
/// kernel reproduces the CPU's values exactly (every dtype, any value).
///
/// Errors: those of `make`, and those of [`Tensor::to_device`].
pub(crate) fn host_then_upload(
    opts: crate::TensorOptions,
    make: impl FnOnce(crate::TensorOptions) -> Result<Tensor>,
) -> Result<Tensor> {
    let host = make(crate::TensorOptions {
        dtype: opts.dtype,
        device: Device::Cpu,
    })?;
    host.to_device(opts.device)
}
