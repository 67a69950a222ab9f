//! Indexing ops on [`Var`]: `index_select`, `gather`, `scatter_add`,
//! `masked_fill`, `embedding` and `topk`. Index and mask tensors are plain
//! [`Tensor`]s (they carry no gradient); each backward saves only them.

use tessera_tensor::ops::index::embedding_backward;
use tessera_tensor::{dim_index, PadMode, Result, Tensor, TensorOptions};

use super::registry as reg;
use super::{check_same, record_op, sum_to};
use crate::autocast::autocast_entry;
use crate::Var;

impl Var {
    /// The slices `index[0], index[1], ...` of dimension `dim` stacked along
    /// `dim` (PyTorch's `index_select`); repeated indices add their
    /// gradients.
    ///
    /// Errors as [`Tensor::index_select`].
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Var> {
        let y = self.tensor().index_select(dim, index)?;
        let d = dim_index(reg::INDEX_SELECT.name(), dim, self.ndim())?;
        let (shape, index) = (self.shape().to_vec(), index.clone());
        record_op(reg::INDEX_SELECT, y, &[self], move |g, _| {
            // Spread the 1-d index along `dim` of the gradient, then add.
            let mut unit = vec![1; g.ndim()];
            unit[d] = index.numel();
            let idx = index.reshape(unit)?.broadcast_to(g.shape())?;
            Ok(vec![Some(zeros(g, &shape)?.scatter_add(d as isize, &idx, g)?)])
        })
    }

    /// `out[i][j] = self[index[i][j]][j]` for `dim == 0`, and so on
    /// (PyTorch's `gather`); repeated indices add their gradients.
    ///
    /// Errors as [`Tensor::gather`].
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Var> {
        let y = self.tensor().gather(dim, index)?;
        let (shape, index) = (self.shape().to_vec(), index.clone());
        record_op(reg::GATHER, y, &[self], move |g, _| {
            Ok(vec![Some(zeros(g, &shape)?.scatter_add(dim, &index, g)?)])
        })
    }

    /// A copy of `self` with `out[index[i][j]][j] += src[i][j]` for
    /// `dim == 0`, and so on (PyTorch's `scatter_add`). `self` receives the
    /// output gradient unchanged, `src` the output gradient gathered at
    /// `index` (zero where `src` is larger than `index`).
    ///
    /// Errors as [`Tensor::scatter_add`], and when dtypes or devices differ.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Var) -> Result<Var> {
        autocast_entry!(reg::SCATTER_ADD, [self, src], |c| c[0]
            .scatter_add(dim, index, &c[1]));
        check_same(reg::SCATTER_ADD, self, src)?;
        let y = self.tensor().scatter_add(dim, index, src.tensor())?;
        let (src_shape, index) = (src.shape().to_vec(), index.clone());
        record_op(reg::SCATTER_ADD, y, &[self, src], move |g, needs| {
            let gs = if needs[1] {
                let picked = g.gather(dim, &index)?;
                // Zero-pad trailing ends up to `src`'s shape.
                let pads: Vec<usize> = src_shape
                    .iter()
                    .zip(index.shape())
                    .rev()
                    .flat_map(|(&s, &i)| [0, s - i])
                    .collect();
                Some(if pads.iter().all(|&p| p == 0) {
                    picked
                } else {
                    picked.pad(&pads, PadMode::Constant(0.0))?
                })
            } else {
                None
            };
            Ok(vec![needs[0].then(|| g.clone()), gs])
        })
    }

    /// `value` where the bool `mask` (broadcasting with `self`) is true,
    /// `self` elsewhere; the gradient is zero at the filled positions.
    ///
    /// Errors as [`Tensor::masked_fill`].
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Var> {
        let y = self.tensor().masked_fill(mask, value)?;
        let (shape, mask) = (self.shape().to_vec(), mask.clone());
        record_op(reg::MASKED_FILL, y, &[self], move |g, _| {
            Ok(vec![Some(sum_to(&g.masked_fill(&mask, 0.0)?, &shape)?)])
        })
    }

    /// Looks up rows of the table `self` (`[V, D]`) by the i64 `indices` of
    /// any shape, giving `indices.shape() + [D]` (PyTorch's
    /// `F.embedding(indices, self, padding_idx)`). The row `padding_idx`, if
    /// given, receives no gradient.
    ///
    /// Errors as [`Tensor::embedding`].
    pub fn embedding(&self, indices: &Tensor, padding_idx: Option<usize>) -> Result<Var> {
        let y = self.tensor().embedding(indices, padding_idx)?;
        let rows = self.shape()[0];
        let indices = indices.clone();
        record_op(reg::EMBEDDING, y, &[self], move |g, _| {
            Ok(vec![Some(embedding_backward(g, &indices, rows, padding_idx)?)])
        })
    }

    /// The `k` largest (or smallest) elements along `dim` and their i64
    /// positions (PyTorch's `topk`; the order is as [`Tensor::topk`]'s,
    /// sorted either way); the gradient of the values goes back to those
    /// positions.
    ///
    /// Errors as [`Tensor::topk`].
    pub fn topk(&self, k: usize, dim: isize, largest: bool, sorted: bool) -> Result<(Var, Tensor)> {
        let (values, idx) = self.tensor().topk(k, dim, largest, sorted)?;
        let (shape, saved) = (self.shape().to_vec(), idx.clone());
        let values = record_op(reg::TOPK, values, &[self], move |g, _| {
            Ok(vec![Some(zeros(g, &shape)?.scatter_add(dim, &saved, g)?)])
        })?;
        Ok((values, idx))
    }
}

/// A zero tensor of `shape` in `g`'s dtype and device.
pub(crate) fn zeros(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    Tensor::zeros(
        shape,
        TensorOptions {
            dtype: g.dtype(),
            device: g.device(),
        },
    )
}
