//! Indexing by integer tensors: `index_select`, `gather`, `scatter`,
//! `scatter_add`, `masked_fill`, `one_hot` (PyTorch semantics and shape
//! rules), plus `embedding` and its backward, [`embedding_backward`].
//!
//! Index tensors must be I64, like PyTorch's. Every index is checked against
//! its dimension before anything is written: a negative or out-of-range index
//! is an [`Error::Index`] naming the op, the value and the size.

mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod embedding;
#[cfg(test)]
mod tests;

use crate::{dim_index, DType, Element, Error, Layout, Result, Tensor};
use cpu::AddElement;

pub use embedding::embedding_backward;

impl Tensor {
    /// The slices `index[0], index[1], ...` of dimension `dim`, stacked along
    /// `dim` (PyTorch's `index_select`): the result has the shape of `self`
    /// with dimension `dim` resized to `index.numel()`. `index` is a 0-d or
    /// 1-d I64 tensor. Errors when `dim` is out of range, `index` is not I64
    /// or has more than one dimension, or an index is outside `0..size(dim)`.
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        let be = crate::backend::dispatch(OP, &[self, index])?;
        self.device().same_as(index.device(), OP)?;
        let d = dim_index(OP, dim, self.ndim())?;
        if index.ndim() > 1 {
            return Err(Error::shape(
                OP,
                format!("index must be 0-d or 1-d, got shape {:?}", index.shape()),
            ));
        }
        let idx = index_values(OP, index)?;
        check_range(OP, &idx, d, self.shape()[d])?;
        let mut shape = self.shape().to_vec();
        shape[d] = idx.len();
        let mut src_strides = self.strides().to_vec();
        src_strides[d] = 0;
        let src = Layout::new(shape.clone(), src_strides, self.layout().offset());
        let mut idx_strides = vec![0isize; shape.len()];
        idx_strides[d] = index.strides().first().copied().unwrap_or(0);
        let idx_layout = Layout::new(shape.clone(), idx_strides, index.layout().offset());
        let g = Gather {
            src,
            #[cfg(feature = "cuda")]
            dim: d,
            dim_stride: self.strides()[d],
            idx: idx_layout,
        };
        be.gather(OP, self, index, &g)
    }

    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim == 0`, and so on
    /// for the other dims (PyTorch's `gather`): the result has the shape of
    /// `index`. Errors when `dim` is out of range, `index` is not I64, its
    /// rank differs from `self`'s, `index.size(d) > self.size(d)` for some
    /// `d != dim`, or an index is outside `0..size(dim)`.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        let be = crate::backend::dispatch(OP, &[self, index])?;
        self.device().same_as(index.device(), OP)?;
        let d = dim_index(OP, dim, self.ndim())?;
        check_index_shape(OP, d, index.shape(), self.shape(), "self")?;
        let idx = index_values(OP, index)?;
        check_range(OP, &idx, d, self.shape()[d])?;
        let mut src_strides = self.strides().to_vec();
        src_strides[d] = 0;
        let g = Gather {
            src: Layout::new(index.shape().to_vec(), src_strides, self.layout().offset()),
            #[cfg(feature = "cuda")]
            dim: d,
            dim_stride: self.strides()[d],
            idx: index.layout().clone(),
        };
        be.gather(OP, self, index, &g)
    }

    /// A copy of `self` with `out[index[i][j]][j] = src[i][j]` for `dim == 0`,
    /// and so on for the other dims (PyTorch's `scatter`). Where an index
    /// repeats, the last write in row-major order of `index` wins. Errors when
    /// `dim` is out of range, `index` is not I64, `src`'s dtype differs from
    /// `self`'s, the ranks differ, `index.size(d)` exceeds `src.size(d)` or
    /// (for `d != dim`) `self.size(d)`, or an index is outside `0..size(dim)`.
    pub fn scatter(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_with("scatter", dim, index, Scatter::Src(src))
    }

    /// A copy of `self` with `out[index[i][j]][j] = value` for `dim == 0`, and
    /// so on (PyTorch's `scatter` with a scalar; `value` is converted to the
    /// dtype as [`Element::from_f64`] does). Errors as [`Tensor::scatter`].
    pub fn scatter_value(&self, dim: isize, index: &Tensor, value: f64) -> Result<Tensor> {
        self.scatter_with("scatter_value", dim, index, Scatter::Value(value))
    }

    /// A copy of `self` with `out[index[i][j]][j] += src[i][j]` for `dim == 0`,
    /// and so on (PyTorch's `scatter_add`). Repeated indices accumulate in
    /// row-major order of `index`, so the result does not depend on the
    /// thread count. Floats add in their own precision (f16/bf16 through
    /// f32), integers wrap, bools OR. Errors as [`Tensor::scatter`].
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_with("scatter_add", dim, index, Scatter::Add(src))
    }

    /// `value` where `mask` is true, `self` elsewhere (PyTorch's
    /// `masked_fill`; `value` is converted to the dtype as
    /// [`Element::from_f64`] does). `mask` is a Bool tensor and broadcasts
    /// with `self`. Errors when `mask` is not Bool or the shapes do not
    /// broadcast.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        const OP: &str = "masked_fill";
        let be = crate::backend::dispatch(OP, &[self, mask])?;
        if mask.dtype() != DType::Bool {
            return Err(Error::dtype(
                OP,
                format!("mask must be bool, got {}", mask.dtype()),
            ));
        }
        be.masked_fill(self, mask, value)
    }

    /// The CPU kernel of [`Tensor::masked_fill`] (`mask` checked to be bool).
    pub(crate) fn masked_fill_cpu(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        crate::with_dtype!(self.dtype(), T => {
            let v = T::from_f64(value);
            self.zip_map::<T, bool, T>(mask, "masked_fill", move |x, m| if m { v } else { x })
        })
    }

    /// The one-hot encoding of an I64 tensor of class indices: shape
    /// `self.shape() + [num_classes]`, I64, 1 at each index and 0 elsewhere
    /// (PyTorch's `one_hot`). `num_classes: None` uses `max + 1` (0 classes
    /// for an empty tensor). Errors when `self` is not I64 or an index is
    /// negative or not below `num_classes`.
    pub fn one_hot(&self, num_classes: Option<usize>) -> Result<Tensor> {
        const OP: &str = "one_hot";
        let idx = index_values(OP, self)?;
        if let Some(&neg) = idx.iter().find(|&&i| i < 0) {
            return Err(Error::index(OP, format!("class index {neg} is negative")));
        }
        let classes = match num_classes {
            Some(c) => c,
            None => idx.iter().max().map_or(0, |&m| m as usize + 1),
        };
        if let Some(&big) = idx.iter().find(|&&i| i as u64 >= classes as u64) {
            return Err(Error::index(
                OP,
                format!("class index {big} is out of range for {classes} classes"),
            ));
        }
        let mut shape = self.shape().to_vec();
        shape.push(classes);
        crate::tensor::checked_numel(OP, &shape)?;
        // A 1 scattered along the class dim of zeros, on `self`'s device.
        let zeros = Tensor::zeros(&shape, DType::I64)?.to_device(self.device())?;
        if classes == 0 {
            return Ok(zeros);
        }
        zeros.scatter_value(-1, &self.unsqueeze(-1)?, 1.0)
    }

    fn scatter_with(&self, op: &'static str, dim: isize, index: &Tensor, how: Scatter<'_>) -> Result<Tensor> {
        let src = match how {
            Scatter::Src(t) | Scatter::Add(t) => Some(t),
            Scatter::Value(_) => None,
        };
        let be = crate::backend::dispatch(op, &[self, index, &src])?;
        let d = dim_index(op, dim, self.ndim())?;
        check_index_shape(op, d, index.shape(), self.shape(), "self")?;
        // src seen over the index's shape.
        let vals = match src {
            Some(src) => {
                if src.dtype() != self.dtype() {
                    return Err(Error::dtype(
                        op,
                        format!("src is {} but self is {}", src.dtype(), self.dtype()),
                    ));
                }
                if src.ndim() != index.ndim() || index.shape().iter().zip(src.shape()).any(|(i, s)| i > s) {
                    return Err(Error::shape(
                        op,
                        format!(
                            "index of shape {:?} does not fit in src of shape {:?}",
                            index.shape(),
                            src.shape()
                        ),
                    ));
                }
                let mut vals = src.clone();
                for (k, &n) in index.shape().iter().enumerate() {
                    vals = vals.narrow(k as isize, 0, n)?;
                }
                Some(vals)
            }
            None => None,
        };
        let idx = index_values(op, index)?;
        check_range(op, &idx, d, self.shape()[d])?;
        let how = match (how, &vals) {
            (Scatter::Src(_), Some(v)) => Scatter::Src(v),
            (Scatter::Add(_), Some(v)) => Scatter::Add(v),
            (other, _) => other,
        };
        be.scatter(op, self, d, index, how)
    }
}

/// What a scatter writes (src seen over the index's shape).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scatter<'a> {
    /// The elements of src (the last write of a repeated index wins).
    Src(&'a Tensor),
    /// The elements of src, accumulated.
    Add(&'a Tensor),
    /// One value, converted to the dtype.
    Value(f64),
}

/// The CPU kernel of the checked scatter `how` of `x` along `d` by `index`,
/// reported as `op`.
pub(crate) fn cpu_scatter(
    op: &'static str,
    x: &Tensor,
    d: usize,
    index: &Tensor,
    how: Scatter<'_>,
) -> Result<Tensor> {
    let idx = index_values(op, index)?;
    let plan = cpu::ScatterPlan::new(d, index.shape(), x.shape());
    match how {
        Scatter::Value(value) => Ok(crate::with_dtype!(x.dtype(), T => {
            let v = T::from_f64(value);
            Tensor::build::<T>(op, x.shape(), |out| {
                x.copy_into(out);
                plan.run(out, &idx, |_| v, |o, e| *o = e);
            })?
        })),
        Scatter::Src(src) | Scatter::Add(src) => {
            let add = matches!(how, Scatter::Add(_));
            let vals = src.contiguous()?;
            Ok(crate::with_dtype!(x.dtype(), T => {
                let v = vals.as_slice::<T>()?;
                Tensor::build::<T>(op, x.shape(), |out| {
                    x.copy_into(out);
                    if add {
                        plan.run(out, &idx, |r| v[r], |o, e| *o = o.add(e));
                    } else {
                        plan.run(out, &idx, |r| v[r], |o, e| *o = e);
                    }
                })?
            }))
        }
    }
}

/// The plan of a gather (index_select, gather): output element `i` is the
/// source element at `src`'s offset of `i` plus `dim_stride` times the
/// index at `idx`'s offset of `i`; both layouts have the output's shape.
#[derive(Debug, Clone)]
pub(crate) struct Gather {
    /// The source over the output shape, stride 0 along `dim`.
    pub(crate) src: Layout,
    /// The indexed dim (the GPU kernel bounds its indices by its size).
    #[cfg(feature = "cuda")]
    pub(crate) dim: usize,
    /// The source's stride along `dim`.
    pub(crate) dim_stride: isize,
    /// The indices over the output shape.
    pub(crate) idx: Layout,
}

/// The CPU kernel of a checked [`Gather`] of `x` by `index`, reported as `op`.
pub(crate) fn cpu_gather(op: &'static str, x: &Tensor, index: &Tensor, g: &Gather) -> Result<Tensor> {
    crate::with_dtype!(x.dtype(), T =>
        cpu::gather_rows::<T>(op, x, &g.src, g.dim_stride, index, &g.idx, g.src.shape()))
}

/// The values of an index tensor in row-major order; errors, naming `op`,
/// when it is not I64.
pub(crate) fn index_values(op: &'static str, index: &Tensor) -> Result<Vec<i64>> {
    if index.dtype() != DType::I64 {
        return Err(Error::dtype(
            op,
            format!("index must be i64, got {}", index.dtype()),
        ));
    }
    index.to_vec::<i64>()
}

/// Checks every index lies in `0..size`; the error names `op`, the first
/// offending value, the dimension and its size.
pub(crate) fn check_range(op: &'static str, idx: &[i64], dim: usize, size: usize) -> Result<()> {
    match idx.iter().find(|&&i| i < 0 || i as u64 >= size as u64) {
        Some(&bad) => Err(Error::index(
            op,
            format!("index {bad} is out of range for dimension {dim} of size {size}"),
        )),
        None => Ok(()),
    }
}

/// PyTorch's gather/scatter shape rule: `index` has the rank of `target`
/// and is no larger in every dimension but `dim`.
fn check_index_shape(
    op: &'static str,
    dim: usize,
    index: &[usize],
    target: &[usize],
    name: &str,
) -> Result<()> {
    let fits = index.len() == target.len()
        && index
            .iter()
            .zip(target)
            .enumerate()
            .all(|(k, (i, t))| k == dim || i <= t);
    if fits {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!(
                "index of shape {index:?} does not fit {name} of shape {target:?} outside dimension {dim}"
            ),
        ))
    }
}
