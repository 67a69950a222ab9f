//! Joining and splitting along a dimension: `cat`, `stack` (copies) and
//! `split`, `split_with_sizes`, `chunk` (views).

#[cfg(test)]
mod tests;

use std::borrow::Borrow;

use rayon::prelude::*;

use crate::strided::PAR_THRESHOLD;
use crate::{dim_index, Element, Error, Result, Tensor};

impl Tensor {
    /// The tensors joined along `dim` (PyTorch's `torch.cat`): all must have
    /// the same rank and equal sizes outside `dim`; the result's dtype is
    /// their promoted dtype ([`crate::DType::promote`]). Errors when the list is
    /// empty, the tensors are 0-d, ranks or sizes differ, `dim` is out of
    /// range, or the devices differ.
    pub fn cat<T: Borrow<Tensor>>(tensors: &[T], dim: isize) -> Result<Tensor> {
        const OP: &str = "cat";
        let first = tensors
            .first()
            .ok_or_else(|| Error::arg(OP, "expects a non-empty list of tensors"))?
            .borrow();
        if first.ndim() == 0 {
            return Err(Error::shape(
                OP,
                "zero-dimensional tensors cannot be concatenated",
            ));
        }
        let d = dim_index(OP, dim, first.ndim())?;
        let mut dtype = first.dtype();
        let mut total = 0usize;
        for t in tensors {
            let t = t.borrow();
            first.device().same_as(t.device(), OP)?;
            let fits = t.ndim() == first.ndim()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(k, (a, b))| k == d || a == b);
            if !fits {
                let shapes: Vec<&[usize]> = tensors.iter().map(|t| t.borrow().shape()).collect();
                return Err(Error::shape(
                    OP,
                    format!("shapes {shapes:?} differ outside dimension {d}"),
                ));
            }
            dtype = dtype.promote(t.dtype());
            total += t.shape()[d];
        }
        let mut shape = first.shape().to_vec();
        shape[d] = total;
        let parts = tensors
            .iter()
            .map(|t| t.borrow().to_dtype(dtype))
            .collect::<Result<Vec<Tensor>>>()?;
        let ps: &[Tensor] = &parts;
        crate::backend::dispatch(OP, &[&ps])?.cat(ps, d, &shape)
    }

    /// The tensors, which must all have the same shape, joined along a new
    /// dimension `dim` (which may be `ndim`; PyTorch's `torch.stack`).
    /// Errors when the list is empty, shapes differ, or `dim` is out of range.
    pub fn stack<T: Borrow<Tensor>>(tensors: &[T], dim: isize) -> Result<Tensor> {
        const OP: &str = "stack";
        let first = tensors
            .first()
            .ok_or_else(|| Error::arg(OP, "expects a non-empty list of tensors"))?
            .borrow();
        let d = dim_index(OP, dim, first.ndim() + 1)?;
        let mut views = Vec::with_capacity(tensors.len());
        for t in tensors {
            let t = t.borrow();
            if t.shape() != first.shape() {
                let shapes: Vec<&[usize]> = tensors.iter().map(|t| t.borrow().shape()).collect();
                return Err(Error::shape(OP, format!("expects equal shapes, got {shapes:?}")));
            }
            views.push(t.unsqueeze(d as isize)?);
        }
        Tensor::cat(&views, d as isize)
    }

    /// Views of consecutive pieces of `size` elements along `dim`; the last
    /// may be shorter (PyTorch's `split` with an int). A dimension of size 0
    /// gives one empty piece. Errors when `dim` is out of range or `size` is
    /// 0 for a non-empty dimension.
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        const OP: &str = "split";
        let d = dim_index(OP, dim, self.ndim())?;
        let n = self.shape()[d];
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        if size == 0 {
            return Err(Error::arg(
                OP,
                format!("split size 0 cannot split dimension {d} of size {n}"),
            ));
        }
        (0..n)
            .step_by(size)
            .map(|start| self.narrow(d as isize, start, size.min(n - start)))
            .collect()
    }

    /// Views of consecutive pieces of the given sizes along `dim` (PyTorch's
    /// `split_with_sizes`). Errors when `dim` is out of range or the sizes do
    /// not add up to the size of `dim`.
    pub fn split_with_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        const OP: &str = "split_with_sizes";
        let d = dim_index(OP, dim, self.ndim())?;
        let n = self.shape()[d];
        let sum = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if sum != Some(n) {
            return Err(Error::arg(
                OP,
                format!("sizes {sizes:?} do not add up to {n}, the size of dimension {d}"),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let piece = self.narrow(d as isize, start, s);
                start += s;
                piece
            })
            .collect()
    }

    /// At most `chunks` views along `dim`, each of `ceil(size / chunks)`
    /// elements but the last (PyTorch's `chunk`, which may return fewer
    /// pieces than asked). Errors when `chunks` is 0 or `dim` is out of range.
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        const OP: &str = "chunk";
        let d = dim_index(OP, dim, self.ndim())?;
        if chunks == 0 {
            return Err(Error::arg(OP, "number of chunks must be positive, got 0"));
        }
        self.split(self.shape()[d].div_ceil(chunks), d as isize)
    }
}

/// Joins contiguous `parts` (all of dtype `E`) along `d` into `shape`. The
/// output is a sequence of rows, one per coordinate of the dims before `d`,
/// each the concatenation of the parts' matching rows; rows are copied whole.
/// The CPU kernel of [`Tensor::cat`]: `parts` (one dtype) joined along
/// `d` into `shape`.
pub(crate) fn cpu_cat(parts: &[Tensor], d: usize, shape: &[usize]) -> Result<Tensor> {
    let parts = parts
        .iter()
        .map(Tensor::contiguous)
        .collect::<Result<Vec<Tensor>>>()?;
    let dtype = parts.first().map_or(crate::DType::F32, Tensor::dtype);
    crate::with_dtype!(dtype, E => cat_kernel::<E>(&parts, d, shape))
}

fn cat_kernel<E: Element>(parts: &[Tensor], d: usize, shape: &[usize]) -> Result<Tensor> {
    let pre: usize = shape[..d].iter().product();
    let row: usize = shape[d..].iter().product();
    let srcs: Vec<(&[E], usize)> = parts
        .iter()
        .map(|p| {
            let s = p.as_slice::<E>().expect("parts are contiguous and of dtype E");
            (s, s.len() / pre.max(1))
        })
        .collect();
    Tensor::build::<E>("cat", shape, |out| {
        if out.is_empty() {
            return;
        }
        let fill_row = |r: usize, dst: &mut [E]| {
            let mut at = 0;
            for &(s, n) in &srcs {
                copy(&mut dst[at..at + n], &s[r * n..r * n + n]);
                at += n;
            }
        };
        // Few long rows: parallelism is inside each copy; many short rows:
        // split the rows across threads.
        let rows_per_task = (PAR_THRESHOLD / row.max(1)).max(1);
        if pre <= rows_per_task || row > PAR_THRESHOLD {
            for (r, dst) in out.chunks_mut(row).enumerate() {
                fill_row(r, dst);
            }
        } else {
            out.par_chunks_mut(row * rows_per_task)
                .enumerate()
                .for_each(|(t, block)| {
                    for (k, dst) in block.chunks_mut(row).enumerate() {
                        fill_row(t * rows_per_task + k, dst);
                    }
                });
        }
    })
}

/// `dst.copy_from_slice(src)`, split across threads when long.
fn copy<E: Element>(dst: &mut [E], src: &[E]) {
    if dst.len() > PAR_THRESHOLD {
        dst.par_chunks_mut(PAR_THRESHOLD)
            .zip(src.par_chunks(PAR_THRESHOLD))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        dst.copy_from_slice(src);
    }
}
