//! GPU dispatch of the unary ops: one elementwise kernel over the strided
//! input (contiguous fast path inside the kernel), f32/f16/bf16, computed
//! in f32 and rounded once, as on the CPU.

use tessera_cuda_kernels::ops::elementwise::{clamp as clamp_launch, unary as unary_launch};

use crate::backend::UnaryOp;
use crate::cuda::{kernel_err, launch, no_kernel, operand, state_of, with_kernel_float, Output};
use crate::{DType, Result, Tensor};

/// `k` of the GPU tensor `t`. Float-valued functions of integer and bool
/// tensors compute in f32 (cast on the GPU first), like the CPU;
/// dtype-keeping ops (neg, abs, relu, square, rounding) have no integer
/// kernel.
///
/// Errors: no kernel for the dtype (f64, integers for dtype-keeping ops),
/// or a device failure.
pub(crate) fn unary(t: &Tensor, k: UnaryOp) -> Result<Tensor> {
    let op = k.name();
    let x = if t.dtype().is_float() || k.keeps_dtype() {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?
    };
    let state = state_of(op, &x)?;
    with_kernel_float!(x.dtype(), T => {
        let out = Output::new(op, &state, x.dtype(), x.numel())?;
        let l = unary_launch::<T>(k, operand(&x, x.layout()), out.ptr(), x.shape())
            .map_err(kernel_err(op, state.device()))?;
        launch(op, &state, &[l])?;
        Ok(out.into_tensor(x.shape()))
    }, else Err(no_kernel(op, x.device(), format_args!("{} tensors", x.dtype()))))
}

/// The GPU tensor `x` clamped to [`lo`, `hi`] (bounds checked by the
/// caller), computed in f32 and rounded once, as the CPU's float kernel.
///
/// Errors: no kernel for the dtype (f64, integers, bool), a device failure.
pub(crate) fn clamp(x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    const OP: &str = "clamp";
    let state = state_of(OP, x)?;
    with_kernel_float!(x.dtype(), T => {
        let out = Output::new(OP, &state, x.dtype(), x.numel())?;
        let l = clamp_launch::<T>(operand(x, x.layout()), out.ptr(), x.shape(), lo as f32, hi as f32)
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
        Ok(out.into_tensor(x.shape()))
    }, else Err(no_kernel(OP, x.device(), format_args!("{} tensors", x.dtype()))))
}
