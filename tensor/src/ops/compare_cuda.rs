//! GPU dispatch of the comparisons, the logical ops and `where`: the
//! elementwise kernels of `tessera-cuda-kernels` over strided, broadcast
//! operands, with bool (byte) conditions and results.

use tessera_cuda_kernels::ops::elementwise::{compare as compare_launch, where_ as where_launch, CompareOp};

use crate::cuda::{common_device, kernel_err, launch, no_kernel, operand, with_element_size, Output};
use crate::ops::binary::promoted;
use crate::{broadcast_shapes, DType, Result, Tensor};

/// `op` of the GPU tensors `a` and `b` (one dtype), broadcast, as bool.
///
/// Errors: different devices, shapes that do not broadcast, a dtype without
/// kernels (f64, integers other than i64), a device failure.
pub(crate) fn compare(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let state = common_device(name, &[a, b])?;
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    let (la, lb) = (a.layout().broadcast_to(&shape)?, b.layout().broadcast_to(&shape)?);
    let out = Output::new(name, &state, DType::Bool, shape.iter().product())?;
    macro_rules! go {
        ($T:ty) => {
            compare_launch::<$T>(op, operand(a, &la), operand(b, &lb), out.ptr(), &shape)
        };
    }
    let l = match a.dtype() {
        DType::F32 => go!(f32),
        DType::F16 => go!(crate::f16),
        DType::BF16 => go!(crate::bf16),
        DType::I64 => go!(i64),
        DType::Bool => go!(u8),
        d => return Err(no_kernel(name, state.device(), format_args!("{d} tensors"))),
    }
    .map_err(kernel_err(name, state.device()))?;
    launch(name, &state, &[l])?;
    Ok(out.into_tensor(&shape))
}

/// `op` of the GPU tensor `x` and the scalar `s`, reported as `name`: a
/// float tensor compares in its own dtype with `s` rounded to it, as on the
/// CPU; an i64 tensor with an integral `s` as integers (the CPU's f64
/// comparison gives the same answer there).
///
/// Errors: other dtypes, an i64 tensor against a fractional or
/// out-of-range `s`, a bool tensor against anything but 0 (the CPU compares
/// those in f64, which no kernel does), a device failure.
pub(crate) fn compare_scalar(name: &'static str, op: CompareOp, x: &Tensor, s: f64) -> Result<Tensor> {
    // A float compares with the scalar in its dtype; bool only with 0 (logical_not).
    let kernel = match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => true,
        DType::I64 => s.fract() == 0.0 && (-(2f64.powi(63))..2f64.powi(63)).contains(&s),
        DType::Bool => s == 0.0,
        _ => false,
    };
    if !kernel {
        return Err(no_kernel(
            name,
            x.device(),
            format_args!("{} tensors against {s}", x.dtype()),
        ));
    }
    let s = Tensor::full(&[], s, x.dtype())?.to_device(x.device())?;
    compare(op, x, &s)
}

/// The logical `op` (and, or, xor) of the truth values of `a` and `b`:
/// directly when they share a dtype, else of their `!= 0` masks.
///
/// Errors as [`compare`].
pub(crate) fn logical(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype() == b.dtype() {
        return compare(op, a, b);
    }
    let mask = |t: &Tensor| match t.dtype() {
        DType::Bool => Ok(t.clone()),
        _ => compare_scalar(op.name(), CompareOp::Ne, t, 0.0),
    };
    compare(op, &mask(a)?, &mask(b)?)
}

/// `a` where the bool `cond` is true, else `b`, all three broadcast, in
/// the promoted dtype of `a` and `b`.
///
/// Errors: shapes that do not broadcast, a device failure.
pub(crate) fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "where";
    let state = common_device(OP, &[cond, a, b])?;
    let (a, b) = promoted(a, b, None)?;
    let shape = broadcast_shapes(OP, &broadcast_shapes(OP, cond.shape(), a.shape())?, b.shape())?;
    let lc = cond.layout().broadcast_to(&shape)?;
    let (la, lb) = (a.layout().broadcast_to(&shape)?, b.layout().broadcast_to(&shape)?);
    let out = Output::new(OP, &state, a.dtype(), shape.iter().product())?;
    let l = with_element_size!(a.dtype(), T => where_launch::<T>(
        operand(cond, &lc),
        operand(&a, &la),
        operand(&b, &lb),
        out.ptr(),
        &shape,
    ))
    .map_err(kernel_err(OP, state.device()))?;
    launch(OP, &state, &[l])?;
    Ok(out.into_tensor(&shape))
}
