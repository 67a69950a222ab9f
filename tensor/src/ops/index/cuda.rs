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

/// The checked [`super::Gather`] of the GPU tensor `x` by the GPU i64
/// `index` (index_select, gather), by element size (every dtype), reported
/// as `op`. The index values were checked by the caller.
///
/// Errors: a device failure.
pub(crate) fn gather(op: &'static str, x: &Tensor, index: &Tensor, g: &super::Gather) -> Result<Tensor> {
    let state = crate::cuda::common_device(op, &[x, index])?;
    let shape = g.src.shape();
    let out = crate::cuda::Output::new(op, &state, x.dtype(), shape.iter().product())?;
    let dim_size = x.shape()[g.dim];
    let idx = crate::cuda::operand::<i64>(index, &g.idx);
    let l =
        crate::cuda::with_element_size!(x.dtype(), T => tessera_cuda_kernels::ops::elementwise::gather::<T>(
            crate::cuda::operand(x, &g.src),
            g.dim,
            dim_size,
            g.dim_stride,
            idx,
            out.ptr(),
            shape,
        ))
        .map_err(crate::cuda::kernel_err(op, state.device()))?;
    crate::cuda::launch(op, &state, &[l])?;
    Ok(out.into_tensor(shape))
}

/// `value` (rounded to `x`'s dtype) where the bool `mask` is true, `x`
/// elsewhere, broadcast: the device's `where`.
///
/// Errors: shapes that do not broadcast, a dtype without kernels, a device
/// failure.
pub(crate) fn masked_fill(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    let v = Tensor::full(&[], value, x.dtype())?.to_device(x.device())?;
    let y = Tensor::where_(mask, &v, x)?;
    // `where` broadcasts `x` to the mask's shape as well; masked_fill keeps `x`'s.
    if y.shape() != x.shape() {
        return Err(Error::shape(
            "masked_fill",
            format!(
                "mask of shape {:?} does not broadcast to the input's shape {:?}",
                mask.shape(),
                x.shape()
            ),
        ));
    }
    Ok(y)
}

/// The checked scatter `how` of the GPU tensor `x` along `d` by the GPU
/// i64 `index` (values checked by the caller), reported as `op`: a
/// contiguous copy of `x` written in place by the scatter kernel (by
/// element size; accumulation for floats only).
///
/// Errors: scatter_add of an integer or bool tensor, a device failure.
pub(crate) fn scatter(
    op: &'static str,
    x: &Tensor,
    d: usize,
    index: &Tensor,
    how: super::Scatter<'_>,
) -> Result<Tensor> {
    use tessera_cuda_kernels::ops::elementwise::{scatter as scatter_launch, Operand, Scatter as How};
    let state = common_device(op, &[x, index])?;
    let out = Output::new(op, &state, x.dtype(), x.numel())?;
    crate::cuda::copy_into(op, x, &out, &crate::Layout::contiguous(x.shape()))?;
    let (src, h) = match how {
        super::Scatter::Src(s) => (Some(s), How::Src),
        super::Scatter::Add(s) => {
            if !x.dtype().is_float() {
                return Err(no_kernel(
                    op,
                    state.device(),
                    format_args!("{} tensors", x.dtype()),
                ));
            }
            (Some(s), How::Add)
        }
        super::Scatter::Value(v) => {
            // The value in x's dtype, converted as the CPU converts it.
            let one = Tensor::full(&[], v, x.dtype())?;
            let bytes = one.storage().as_bytes();
            let mut w = [0u8; 8];
            w[..bytes.len()].copy_from_slice(bytes);
            (None, How::Value(u64::from_le_bytes(w)))
        }
    };
    if let Some(s) = src {
        common_device(op, &[x, s])?;
    }
    let out_strides = crate::contiguous_strides(x.shape());
    macro_rules! go {
        ($T:ty) => {
            scatter_launch::<$T>(
                h,
                src.map(|s| crate::cuda::operand::<$T>(s, s.layout())),
                crate::cuda::operand::<i64>(index, index.layout()),
                Operand {
                    ptr: out.ptr::<$T>(),
                    offset: 0,
                    strides: &out_strides,
                },
                d,
                x.shape()[d],
                index.shape(),
            )
        };
    }
    let l = match (x.dtype(), h) {
        (DType::F16, How::Add) => go!(crate::f16),
        (DType::BF16, How::Add) => go!(crate::bf16),
        (dtype, _) => crate::cuda::with_element_size!(dtype, T => go!(T)),
    }
    .map_err(kernel_err(op, state.device()))?;
    launch(op, &state, &[l])?;
    Ok(out.into_tensor(x.shape()))
}
