//! GPU dispatch of softmax and log_softmax: the warp-per-row kernel over
//! the input with `dim` moved last.

use tessera_cuda_kernels::ops::softmax::softmax as softmax_launch;

use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, state_of, with_kernel_float, Output,
};
use crate::{dim_index, Result, Tensor};

/// softmax (or log_softmax when `log`) of the GPU tensor `t` along `dim`.
///
/// Errors: a bad dim, a dtype without kernels, a device failure.
pub(crate) fn softmax(t: &Tensor, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
    if t.ndim() == 0 {
        dim_index(op, dim, 1)?;
        return softmax(&t.reshape([1])?, op, 0, log)?.reshape([]);
    }
    let d = dim_index(op, dim, t.ndim())?;
    let last = t.ndim() - 1;
    let x = contiguous(&t.transpose(d as isize, last as isize)?)?;
    let cols = x.shape()[last];
    let state = state_of(op, &x)?;
    let out = Output::new(op, &state, x.dtype(), x.numel())?;
    with_kernel_float!(x.dtype(), T => {
        if x.numel() > 0 {
            let l = softmax_launch::<T>(contiguous_ptr(&x), out.ptr(), x.numel() / cols, cols, log)
                .map_err(kernel_err(op, state.device()))?;
            launch(op, &state, &[l])?;
        }
    }, else return Err(no_kernel(op, state.device(), format_args!("{} tensors", x.dtype()))));
    contiguous(&out.into_tensor(x.shape()).transpose(d as isize, last as isize)?)
}
