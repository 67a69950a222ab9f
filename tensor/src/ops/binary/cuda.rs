//! GPU dispatch of the binary ops and their scalar forms: one elementwise
//! kernel over both strided operands with broadcasting (zero strides).

use tessera_cuda_kernels::ops::elementwise::binary as binary_launch;

use crate::backend::BinaryOp;
use crate::cuda::{common_device, kernel_err, launch, no_kernel, operand, with_kernel_float, Output};
use crate::{broadcast_shapes, DType, Result, Tensor};

/// `op` (kernel `k`) of `a` and `b` with broadcasting, in the promoted dtype
/// (f32 for true division of integers), as on the CPU.
///
/// Errors: operands on different devices, shapes that do not broadcast, a
/// promoted dtype without kernels (f64, integers, bool), a device failure.
pub(crate) fn binary(a: &Tensor, b: &Tensor, op: &'static str, k: BinaryOp) -> Result<Tensor> {
    let state = common_device(op, &[a, b])?;
    let mut dtype = a.dtype().promote(b.dtype());
    if (k == BinaryOp::Div || k.is_backward()) && !dtype.is_float() {
        dtype = DType::F32;
    }
    let shape = broadcast_shapes(op, a.shape(), b.shape())?;
    with_kernel_float!(dtype, T => {
        let (a, b) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
        let (la, lb) = (a.layout().broadcast_to(&shape)?, b.layout().broadcast_to(&shape)?);
        let out = Output::new(op, &state, dtype, shape.iter().product())?;
        let l = binary_launch::<T>(k, operand(&a, &la), operand(&b, &lb), out.ptr(), &shape)
            .map_err(kernel_err(op, state.device()))?;
        launch(op, &state, &[l])?;
        Ok(out.into_tensor(&shape))
    }, else Err(no_kernel(op, state.device(), format_args!("{dtype} tensors"))))
}

/// `x op s` (or `s op x` when `reversed`) for the scalar forms: computed in
/// f32 and rounded once for f16/bf16, as on the CPU; integer and bool
/// tensors become f32.
///
/// Errors as [`binary`].
pub(crate) fn scalar(x: &Tensor, s: f64, op: &'static str, k: BinaryOp, reversed: bool) -> Result<Tensor> {
    if x.dtype() == DType::F64 {
        return Err(no_kernel(op, x.device(), "f64 tensors"));
    }
    let wide = x.to_dtype(DType::F32)?;
    let s = Tensor::scalar(s as f32).to_device(x.device())?;
    let y = if reversed {
        binary(&s, &wide, op, k)?
    } else {
        binary(&wide, &s, op, k)?
    };
    Ok(if x.dtype().is_float() {
        y.to_dtype(x.dtype())?
    } else {
        y
    })
}
