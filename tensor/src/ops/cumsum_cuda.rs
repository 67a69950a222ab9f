//! GPU running sums and products: the `scan` kernel of `reduce.cu` (one
//! thread per lane, in index order in f32, each prefix rounded to the
//! dtype, as the CPU), over the contiguous input viewed as
//! `[outer, len, inner]`.

use tessera_cuda_kernels::ops::reduce::{scan as scan_launch, ReduceOp};

use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, state_of, with_kernel_float, Output,
};
use crate::{dim_index, Result, Tensor};

/// The running sum (product when `prod`) of the GPU tensor `x` along
/// `dim`, reported as `op`.
///
/// Errors: a bad dim, integer or bool input (the CPU gives i64, which no
/// kernel does), f64, a device failure.
pub(crate) fn scan(op: &'static str, x: &Tensor, dim: isize, prod: bool) -> Result<Tensor> {
    let state = state_of(op, x)?;
    let d = dim_index(op, dim, x.ndim().max(1))?;
    let x = contiguous(x)?;
    let shape = x.shape();
    let (len, inner) = if shape.is_empty() {
        (1, 1)
    } else {
        (shape[d], shape[d + 1..].iter().product())
    };
    let outer = shape[..d.min(shape.len())].iter().product();
    let r = if prod { ReduceOp::Prod } else { ReduceOp::Sum };
    with_kernel_float!(x.dtype(), T => {
        let y = Output::new(op, &state, x.dtype(), x.numel())?;
        if len > 0 {
            let l = scan_launch::<T>(r, contiguous_ptr(&x), y.ptr(), outer, len, inner)
                .map_err(kernel_err(op, state.device()))?;
            launch(op, &state, &[l])?;
        }
        Ok(y.into_tensor(shape))
    }, else Err(no_kernel(op, state.device(), format_args!("{} tensors", x.dtype()))))
}
