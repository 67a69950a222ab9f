//! `embedding` (a row gather from a `[V, D]` table) and its backward, the
//! deterministic scatter-add of gradient rows into a `[V, D]` gradient.

use rayon::prelude::*;

use super::{check_range, cpu, index_values};
use crate::strided::PAR_THRESHOLD;
use crate::{Error, FloatElement, FloatMath, Layout, Result, Tensor};

impl Tensor {
    /// Looks up rows of the table `self` (`[V, D]`) by the I64 `indices` of
    /// any shape: the result has shape `indices.shape() + [D]` (PyTorch's
    /// `F.embedding(indices, weight, padding_idx)`). Rows are copied whole.
    /// `padding_idx` only matters for the gradient (`Var::embedding`); here
    /// it is checked to be a row, as PyTorch does. Errors when `self` is not
    /// 2-d, `indices` is not I64, an index is outside `0..V`, or
    /// `padding_idx` is not a row.
    pub fn embedding(&self, indices: &Tensor, padding_idx: Option<usize>) -> Result<Tensor> {
        const OP: &str = "embedding";
        if let (Some(p), Some(&rows)) = (padding_idx, self.shape().first()) {
            if p >= rows {
                return Err(Error::index(
                    OP,
                    format!(
                        "padding_idx {p} is out of range for a table of shape {:?}",
                        self.shape()
                    ),
                ));
            }
        }
        crate::backend::dispatch(OP, &[self, indices])?.embedding(self, indices)
    }

    /// The CPU kernel of [`Tensor::embedding`].
    pub(crate) fn embedding_cpu(&self, indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        self.device().same_as(indices.device(), OP)?;
        if self.ndim() != 2 {
            return Err(Error::shape(
                OP,
                format!("weight must be 2-d [V, D], got shape {:?}", self.shape()),
            ));
        }
        let idx = index_values(OP, indices)?;
        check_range(OP, &idx, 0, self.shape()[0])?;
        let mut shape = indices.shape().to_vec();
        shape.push(self.shape()[1]);
        let lead = indices.ndim();
        let mut src_strides = vec![0isize; lead];
        src_strides.push(self.strides()[1]);
        let src = Layout::new(shape.clone(), src_strides, self.layout().offset());
        let mut idx_strides = indices.strides().to_vec();
        idx_strides.push(0);
        let idx_layout = Layout::new(shape.clone(), idx_strides, indices.layout().offset());
        let dim_stride = self.strides()[0];
        Ok(crate::with_dtype!(self.dtype(), T =>
            cpu::gather_rows::<T>(OP, self, &src, dim_stride, indices, &idx_layout, &shape)?))
    }
}

/// The gradient of [`Tensor::embedding`] with respect to the `[num_weights,
/// D]` table: row `v` is the sum of the rows of `grad` (shape
/// `indices.shape() + [D]`, a float dtype) whose index is `v`, zero for
/// `padding_idx`. Each row accumulates in index order in the dtype's math
/// precision (f32 for f16/bf16) and rounds once; rows are summed in
/// parallel, so the result does not depend on the thread count. Errors when
/// `grad` is not float, `indices` is not I64, the shapes disagree, an index
/// is outside `0..num_weights`, or `padding_idx >= num_weights`.
pub fn embedding_backward(
    grad: &Tensor,
    indices: &Tensor,
    num_weights: usize,
    padding_idx: Option<usize>,
) -> Result<Tensor> {
    crate::backend::dispatch("embedding_backward", &[grad, indices])?.embedding_backward(
        grad,
        indices,
        num_weights,
        padding_idx,
    )
}

/// Checks the arguments of [`embedding_backward`]; returns the indices (read
/// back to the host) and the embedding width.
pub(crate) fn check_embedding_backward(
    grad: &Tensor,
    indices: &Tensor,
    num_weights: usize,
    padding_idx: Option<usize>,
) -> Result<(Vec<i64>, usize)> {
    const OP: &str = "embedding_backward";
    if grad.ndim() != indices.ndim() + 1 || grad.shape()[..indices.ndim()] != *indices.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "grad of shape {:?} is not indices shape {:?} plus one embedding dim",
                grad.shape(),
                indices.shape()
            ),
        ));
    }
    if let Some(p) = padding_idx.filter(|&p| p >= num_weights) {
        return Err(Error::index(
            OP,
            format!("padding_idx {p} is out of range for {num_weights} embeddings"),
        ));
    }
    let idx = index_values(OP, indices)?;
    check_range(OP, &idx, 0, num_weights)?;
    let d = grad.shape()[indices.ndim()];
    crate::tensor::checked_numel(OP, &[num_weights, d])?;
    Ok((idx, d))
}

/// The CPU kernel of [`embedding_backward`].
pub(crate) fn embedding_backward_cpu(
    grad: &Tensor,
    indices: &Tensor,
    num_weights: usize,
    padding_idx: Option<usize>,
) -> Result<Tensor> {
    const OP: &str = "embedding_backward";
    let (idx, d) = check_embedding_backward(grad, indices, num_weights, padding_idx)?;
    let grad = grad.contiguous()?;
    crate::with_float_dtype!(grad.dtype(), T => {
        let g = grad.as_slice::<T>()?;
        Tensor::build::<T>(OP, &[num_weights, d], |out| {
            accumulate_rows(out, g, &idx, d, padding_idx)
        })
    }, else Err(Error::dtype(OP, format!("grad must be a float dtype, got {}", grad.dtype()))))
}

/// `out[v] = Σ g[i]` over positions `i` with `idx[i] == v` (rows of `d`),
/// skipping `padding`. Positions are bucketed by row (a stable counting
/// sort), then each output row sums its bucket in index order.
fn accumulate_rows<T: FloatElement>(out: &mut [T], g: &[T], idx: &[i64], d: usize, padding: Option<usize>) {
    if d == 0 || idx.is_empty() {
        return;
    }
    let v = out.len() / d;
    let mut start = vec![0usize; v + 1];
    for &i in idx {
        start[i as usize + 1] += 1;
    }
    for k in 0..v {
        start[k + 1] += start[k];
    }
    let mut fill = start.clone();
    let mut order = vec![0usize; idx.len()];
    for (pos, &i) in idx.iter().enumerate() {
        order[fill[i as usize]] = pos;
        fill[i as usize] += 1;
    }
    let row = |(r, o): (usize, &mut [T])| {
        if Some(r) == padding || start[r] == start[r + 1] {
            return;
        }
        let mut acc = vec![<T::Math as FloatMath>::ZERO; d];
        for &pos in &order[start[r]..start[r + 1]] {
            for (a, &x) in acc.iter_mut().zip(&g[pos * d..pos * d + d]) {
                *a += x.to_math();
            }
        }
        for (y, a) in o.iter_mut().zip(acc) {
            *y = T::from_math(a);
        }
    };
    if g.len() > PAR_THRESHOLD {
        out.par_chunks_mut(d).enumerate().for_each(row);
    } else {
        out.chunks_mut(d).enumerate().for_each(row);
    }
}
