//! GPU dispatch of embedding: the row-gather kernel. Indices are checked
//! on the host first (one copy back), so an out-of-range index is the same
//! `Err` as on the CPU rather than a NaN row.

use tessera_cuda_kernels::ops::embedding::embedding_fwd;

use super::{check_range, index_values};
use crate::cuda::{
    common_device, contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, Output,
};
use crate::{Error, Result, Tensor};

/// Rows of the GPU table `weight` (`[V, D]`) picked by the i64 `indices`.
///
/// Errors as [`Tensor::embedding`], plus a dtype without kernels or a
/// device failure.
pub(crate) fn embedding(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    const OP: &str = "embedding";
    let state = common_device(OP, &[weight, indices])?;
    if weight.ndim() != 2 {
        return Err(Error::shape(
            OP,
            format!("weight must be 2-d [V, D], got shape {:?}", weight.shape()),
        ));
    }
    let (vocab, dim) = (weight.shape()[0], weight.shape()[1]);
    check_range(OP, &index_values(OP, indices)?, 0, vocab)?;
    let (w, idx) = (contiguous(weight)?, contiguous(indices)?);
    let n = idx.numel();
    let mut shape = indices.shape().to_vec();
    shape.push(dim);
    let out = Output::new(OP, &state, w.dtype(), n * dim)?;
    with_kernel_float!(w.dtype(), T => {
        let l = embedding_fwd::<T>(contiguous_ptr(&w), contiguous_ptr(&idx), out.ptr(), n, vocab, dim)
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} tables", w.dtype()))));
    Ok(out.into_tensor(&shape))
}
