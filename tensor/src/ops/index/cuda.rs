//! GPU dispatch of embedding: the row-gather kernel. Indices are checked
//! on the host first (one copy back), so an out-of-range index is the same
//! `Err` as on the CPU rather than a NaN row.

use tessera_cuda_kernels::ops::embedding::{embedding_bwd, embedding_fwd};

use super::{check_range, index_values};
use crate::cuda::{
    common_device, contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, Output,
};
use crate::{DType, Error, Result, Tensor};

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

/// The gradient of [`embedding`] with respect to the `[num_weights, D]`
/// table on the GPU: rows scattered with f32 atomics (the summation order
/// of repeated indices is not fixed, so results equal the CPU's within f32
/// rounding), the `padding_idx` row zeroed, then rounded to `grad`'s dtype.
///
/// Errors as [`super::embedding_backward`], plus a dtype without kernels or
/// a device failure.
pub(crate) fn embedding_backward(
    grad: &Tensor,
    indices: &Tensor,
    num_weights: usize,
    padding_idx: Option<usize>,
) -> Result<Tensor> {
    const OP: &str = "embedding_backward";
    let state = common_device(OP, &[grad, indices])?;
    let (_, d) = super::embedding::check_embedding_backward(grad, indices, num_weights, padding_idx)?;
    let (g, idx) = (contiguous(grad)?, contiguous(indices)?);
    let n = idx.numel();
    let acc = Output::zeros(OP, &state, DType::F32, num_weights * d)?;
    with_kernel_float!(g.dtype(), T => {
        let l = embedding_bwd::<T>(contiguous_ptr(&g), contiguous_ptr(&idx), acc.ptr(), n, num_weights, d)
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} gradients", g.dtype()))));
    let mut gw = acc.into_tensor(&[num_weights, d]);
    if let Some(p) = padding_idx {
        let keep: Vec<f32> = (0..num_weights).map(|r| if r == p { 0.0 } else { 1.0 }).collect();
        let keep = Tensor::from_vec(keep, &[num_weights, 1])?.to_device(grad.device())?;
        gw = gw.mul(&keep)?;
    }
    gw.to_dtype(grad.dtype())
}
