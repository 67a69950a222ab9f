//! Views on [`Var`]: reshape, transpose, permute, narrow/slice/select,
//! flip, expand, squeeze/unsqueeze, contiguous. The forward is the tensor
//! view (no copy); the backward views or scatters the gradient back into the
//! input's shape and saves nothing but shapes and arguments.

use tessera_tensor::{dim_index, Layout, Result, ShapeArg, Tensor};

use super::registry::{self as reg, Op};
use super::{embed, record_op, sum_to};
use crate::Var;

/// Records a view whose gradient is `grad(g)`.
fn view_op(
    op: Op,
    y: Tensor,
    x: &Var,
    grad: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
) -> Result<Var> {
    record_op(op, y, &[x], move |g, _| Ok(vec![Some(grad(g)?)]))
}

/// The gradient of a view that only adds or removes size-1 dims (or
/// regroups the elements): `g` reshaped back to the input's shape.
fn reshape_back(x: &Var) -> impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static {
    let shape = x.shape().to_vec();
    move |g| g.reshape(shape)
}

/// The gradient of an injective view described by `layout_of` (applied to
/// the contiguous layout of the input's shape): `g` scattered into zeros.
fn scatter_back(
    x: &Var,
    layout_of: impl FnOnce(&Layout) -> Result<Layout> + Send + 'static,
) -> impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static {
    let shape = x.shape().to_vec();
    move |g| embed(g, &shape, &layout_of(&Layout::contiguous(&shape))?)
}

impl Var {
    /// The elements reshaped to `shape`, which may hold one hole (`()` in a
    /// tuple, PyTorch's `-1`; see [`ShapeArg`]): a view when the strides
    /// allow, else a copy. Errors as [`Tensor::reshape`].
    pub fn reshape(&self, shape: impl Into<ShapeArg>) -> Result<Var> {
        view_op(
            reg::RESHAPE,
            self.tensor().reshape(shape)?,
            self,
            reshape_back(self),
        )
    }

    /// Like [`Var::reshape`] but never copies. Errors as [`Tensor::view`].
    pub fn view(&self, shape: impl Into<ShapeArg>) -> Result<Var> {
        view_op(reg::VIEW, self.tensor().view(shape)?, self, reshape_back(self))
    }

    /// Merges dims `start ..= end` into one (recorded as a reshape). Errors
    /// as [`Tensor::flatten`].
    pub fn flatten(&self, start: isize, end: isize) -> Result<Var> {
        view_op(
            reg::RESHAPE,
            self.tensor().flatten(start, end)?,
            self,
            reshape_back(self),
        )
    }

    /// Swaps dims `d0` and `d1`. Errors as [`Tensor::transpose`].
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Var> {
        view_op(reg::TRANSPOSE, self.tensor().transpose(d0, d1)?, self, move |g| {
            g.transpose(d0, d1)
        })
    }

    /// The matrix transpose; 0-d and 1-d values are returned as they are.
    /// Errors above 2 dims, as [`Tensor::t`].
    pub fn t(&self) -> Result<Var> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            _ => {
                self.tensor().t()?;
                self.transpose(0, 1)
            }
        }
    }

    /// Reorders the dims. Errors as [`Tensor::permute`].
    pub fn permute(&self, dims: &[isize]) -> Result<Var> {
        let y = self.tensor().permute(dims)?;
        let nd = self.ndim();
        let mut inverse = vec![0isize; nd];
        for (k, &d) in dims.iter().enumerate() {
            inverse[dim_index("permute", d, nd)?] = k as isize;
        }
        view_op(reg::PERMUTE, y, self, move |g| g.permute(&inverse))
    }

    /// The range `start .. start + len` of `dim`. Errors as [`Tensor::narrow`].
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Var> {
        let y = self.tensor().narrow(dim, start, len)?;
        view_op(
            reg::NARROW,
            y,
            self,
            scatter_back(self, move |l| l.narrow(dim, start, len)),
        )
    }

    /// Every `step`-th element of `start .. end` along `dim`. Errors as
    /// [`Tensor::slice`].
    pub fn slice(&self, dim: isize, start: usize, end: usize, step: usize) -> Result<Var> {
        let y = self.tensor().slice(dim, start, end, step)?;
        view_op(
            reg::SLICE,
            y,
            self,
            scatter_back(self, move |l| l.slice(dim, start, end, step)),
        )
    }

    /// Index `index` of `dim`, the dim removed (negative indices count from
    /// the end). Errors as [`Tensor::select`].
    pub fn select(&self, dim: isize, index: isize) -> Result<Var> {
        let y = self.tensor().select(dim, index)?;
        // select succeeded, so dim and index are in range.
        let d = dim_index("select", dim, self.ndim())?;
        let n = self.shape()[d] as isize;
        let i = if index < 0 { index + n } else { index } as usize;
        view_op(
            reg::SELECT,
            y,
            self,
            scatter_back(self, move |l| l.narrow(d as isize, i, 1)?.squeeze(d as isize)),
        )
    }

    /// Reverses the elements along `dims`. Errors as [`Tensor::flip`].
    pub fn flip(&self, dims: &[isize]) -> Result<Var> {
        let dims_back = dims.to_vec();
        view_op(reg::FLIP, self.tensor().flip(dims)?, self, move |g| {
            g.flip(&dims_back)
        })
    }

    /// Broadcasts to `shape`, where a hole (`()` in a tuple, PyTorch's
    /// `-1`; see [`ShapeArg`]) keeps a size; the gradient is summed back.
    /// Errors as [`Tensor::expand`].
    pub fn expand(&self, shape: impl Into<ShapeArg>) -> Result<Var> {
        let to = self.shape().to_vec();
        view_op(reg::EXPAND, self.tensor().expand(shape)?, self, move |g| {
            sum_to(g, &to)
        })
    }

    /// Broadcasts to `shape` (recorded as expand). Errors as
    /// [`Tensor::broadcast_to`].
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Var> {
        let to = self.shape().to_vec();
        view_op(reg::EXPAND, self.tensor().broadcast_to(shape)?, self, move |g| {
            sum_to(g, &to)
        })
    }

    /// Removes `dim`, which must have size 1. Errors as [`Tensor::squeeze`].
    pub fn squeeze(&self, dim: isize) -> Result<Var> {
        view_op(
            reg::SQUEEZE,
            self.tensor().squeeze(dim)?,
            self,
            reshape_back(self),
        )
    }

    /// Removes every size-1 dim (recorded as squeeze).
    pub fn squeeze_all(&self) -> Result<Var> {
        view_op(
            reg::SQUEEZE,
            self.tensor().squeeze_all()?,
            self,
            reshape_back(self),
        )
    }

    /// Inserts a size-1 dim at `dim`. Errors as [`Tensor::unsqueeze`].
    pub fn unsqueeze(&self, dim: isize) -> Result<Var> {
        view_op(
            reg::UNSQUEEZE,
            self.tensor().unsqueeze(dim)?,
            self,
            reshape_back(self),
        )
    }

    /// A contiguous copy, or `self` when already contiguous (nothing
    /// recorded then). The gradient passes through unchanged.
    pub fn contiguous(&self) -> Result<Var> {
        if self.tensor().is_contiguous() {
            return Ok(self.clone());
        }
        view_op(reg::CONTIGUOUS, self.tensor().contiguous()?, self, |g| {
            Ok(g.clone())
        })
    }
}
