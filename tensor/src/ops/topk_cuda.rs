//! GPU `topk`, `sort` and `argsort`: the `topk` kernel of `reduce.cu` (one
//! thread per line keeps its best k in the CPU's total order: NaN above
//! every number, ties by position), over the lines along the dim moved
//! last. The same values and positions as the CPU.

use tessera_cuda_kernels::ops::reduce::topk as topk_launch;

use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, state_of, with_kernel_float, Output,
};
use crate::{DType, Result, Tensor};

/// The first `k` (checked ≤ the size) elements of the GPU tensor `x` along
/// dim `d`, largest first when `largest`, and their i64 positions.
///
/// Errors: a dtype without kernels (f64, integers), a device failure.
pub(crate) fn topk(x: &Tensor, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
    const OP: &str = "topk";
    let state = state_of(OP, x)?;
    let last = x.ndim() - 1;
    let lines = contiguous(&x.transpose(d as isize, last as isize)?)?;
    let n = lines.shape()[last];
    let count: usize = lines.shape()[..last].iter().product();
    let mut shape = lines.shape().to_vec();
    shape[last] = k;
    with_kernel_float!(x.dtype(), T => {
        let vals = Output::new(OP, &state, x.dtype(), count * k)?;
        let idx = Output::new(OP, &state, DType::I64, count * k)?;
        if count * k > 0 {
            let l = topk_launch::<T>(contiguous_ptr(&lines), vals.ptr(), idx.ptr(), count, n, k, largest)
                .map_err(kernel_err(OP, state.device()))?;
            launch(OP, &state, &[l])?;
        }
        let back = |t: Tensor| -> Result<Tensor> { t.transpose(d as isize, last as isize)?.contiguous() };
        Ok((back(vals.into_tensor(&shape))?, back(idx.into_tensor(&shape))?))
    }, else Err(no_kernel(OP, state.device(), format_args!("{} tensors", x.dtype()))))
}
