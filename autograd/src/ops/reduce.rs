//! Reductions on [`Var`] (sum, mean, amax/amin, prod, var/std, logsumexp,
//! norm) and their gradients. `dims` empty means every dim; `keepdim` keeps
//! reduced dims as size 1 — the tensor crate's conventions.

use tessera_tensor::{Error, Result, Tensor};

use super::registry::{self as reg, Op};
use super::{record_op, reduced_dims, unreduce};
use crate::autocast::autocast_entry;
use crate::Var;

/// Records a one-input reduction whose gradient is `grad(g)`.
fn reduction(
    op: Op,
    y: Tensor,
    x: &Var,
    grad: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
) -> Result<Var> {
    record_op(op, y, &[x], move |g, _| Ok(vec![Some(grad(g)?)]))
}

/// The number of elements each output of a reduction over `dims` covers.
fn count(shape: &[usize], dims: &[isize]) -> Result<usize> {
    Ok(reduced_dims(shape.len(), dims)?
        .iter()
        .map(|&d| shape[d])
        .product())
}

/// `t` with the reduced dims re-inserted as size 1 (when `keepdim` dropped
/// them), so it broadcasts against the input.
fn keep(t: &Tensor, ndim: usize, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    if keepdim {
        return Ok(t.clone());
    }
    let mut ds = reduced_dims(ndim, dims)?;
    ds.sort_unstable();
    let mut t = t.clone();
    for d in ds {
        t = t.unsqueeze(d as isize)?;
    }
    Ok(t)
}

impl Var {
    /// The sum over `dims`. Errors as [`Tensor::sum`].
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        autocast_entry!(reg::SUM, [self], |c| c[0].sum(dims, keepdim));
        let y = self.tensor().sum(dims, keepdim)?;
        let (shape, dims) = (self.shape().to_vec(), dims.to_vec());
        reduction(reg::SUM, y, self, move |g| unreduce(g, &shape, &dims, keepdim))
    }

    /// The mean over `dims`. Errors as [`Tensor::mean`].
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        autocast_entry!(reg::MEAN, [self], |c| c[0].mean(dims, keepdim));
        let y = self.tensor().mean(dims, keepdim)?;
        let (shape, dims) = (self.shape().to_vec(), dims.to_vec());
        let n = count(&shape, &dims)?;
        reduction(reg::MEAN, y, self, move |g| {
            unreduce(&g.div_scalar(n as f64)?, &shape, &dims, keepdim)
        })
    }

    /// The maximum over `dims` (PyTorch's `amax`); the gradient is split
    /// evenly among the elements equal to the maximum. Errors as
    /// [`Tensor::max`].
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        let y = self.tensor().max(dims, keepdim)?;
        self.extreme_grad(reg::MAX, y, dims, keepdim)
    }

    /// The minimum over `dims` (PyTorch's `amin`); the gradient is split
    /// evenly among the elements equal to the minimum. Errors as
    /// [`Tensor::min`].
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        let y = self.tensor().min(dims, keepdim)?;
        self.extreme_grad(reg::MIN, y, dims, keepdim)
    }

    fn extreme_grad(&self, op: Op, y: Tensor, dims: &[isize], keepdim: bool) -> Result<Var> {
        let x = self.tensor().clone();
        let y_keep = keep(&y, x.ndim(), dims, keepdim)?;
        let (dims, nd) = (dims.to_vec(), x.ndim());
        reduction(op, y, self, move |g| {
            let hit = x.eq(&y_keep)?.to_dtype(x.dtype())?;
            let ties = hit.sum(&dims, true)?;
            let share = keep(g, nd, &dims, keepdim)?.div(&ties)?;
            hit.mul(&share)
        })
    }

    /// The product over `dims`. The gradient of each element is the product
    /// of the others (computed with prefix and suffix products, so zeros
    /// are handled exactly). Errors as [`Tensor::prod`].
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        autocast_entry!(reg::PROD, [self], |c| c[0].prod(dims, keepdim));
        let y = self.tensor().prod(dims, keepdim)?;
        let x = self.tensor().clone();
        let dims = dims.to_vec();
        reduction(reg::PROD, y, self, move |g| {
            let others = product_of_others(&x, &dims)?;
            others.mul(&keep(g, x.ndim(), &dims, keepdim)?)
        })
    }

    /// The variance over `dims` with `correction`; the gradient is
    /// 2·(x − mean)·g / (N − correction). Errors as [`Tensor::var`].
    pub fn var(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Var> {
        let y = self.tensor().var(dims, correction, keepdim)?;
        let x = self.tensor().clone();
        let dims = dims.to_vec();
        let n = count(x.shape(), &dims)? as f64;
        reduction(reg::VAR, y, self, move |g| {
            let centered = x.sub(&x.mean(&dims, true)?)?;
            let scale = 2.0 / (n - correction).max(0.0);
            centered
                .mul(&keep(g, x.ndim(), &dims, keepdim)?)?
                .mul_scalar(scale)
        })
    }

    /// The standard deviation over `dims` with `correction`; the gradient is
    /// (x − mean)·g / ((N − correction)·std), 0 where std = 0. Errors as
    /// [`Tensor::std`].
    pub fn std(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Var> {
        let y = self.tensor().std(dims, correction, keepdim)?;
        let x = self.tensor().clone();
        let y_keep = keep(&y, x.ndim(), dims, keepdim)?;
        let dims = dims.to_vec();
        let n = count(x.shape(), &dims)? as f64;
        reduction(reg::STD, y, self, move |g| {
            let centered = x.sub(&x.mean(&dims, true)?)?;
            let denom = y_keep.mul_scalar((n - correction).max(0.0))?;
            let share = zero_where_zero(&keep(g, x.ndim(), &dims, keepdim)?, &denom)?;
            centered.mul(&share)
        })
    }

    /// log Σ exp(x) over `dims`; the gradient is g·exp(x − y). Errors as
    /// [`Tensor::logsumexp`].
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        autocast_entry!(reg::LOGSUMEXP, [self], |c| c[0].logsumexp(dims, keepdim));
        let y = self.tensor().logsumexp(dims, keepdim)?;
        let x = self.tensor().clone();
        let y_keep = keep(&y, x.ndim(), dims, keepdim)?;
        let dims = dims.to_vec();
        reduction(reg::LOGSUMEXP, y, self, move |g| {
            x.sub(&y_keep)?.exp()?.mul(&keep(g, x.ndim(), &dims, keepdim)?)
        })
    }

    /// The vector p-norm over `dims` (PyTorch's `linalg.vector_norm`). The
    /// gradient is g·sign(x)·|x|^(p−1)/‖x‖^(p−1) (0 where the norm is 0);
    /// for p = ±∞ it is split evenly among the elements whose |x| is the
    /// extreme; for p = 0 it is 0. Errors as [`Tensor::norm`].
    pub fn norm(&self, p: f64, dims: &[isize], keepdim: bool) -> Result<Var> {
        autocast_entry!(reg::NORM, [self], |c| c[0].norm(p, dims, keepdim));
        let y = self.tensor().norm(p, dims, keepdim)?;
        let x = self.tensor().clone();
        let y_keep = keep(&y, x.ndim(), dims, keepdim)?;
        let dims = dims.to_vec();
        reduction(reg::NORM, y, self, move |g| {
            let g = keep(g, x.ndim(), &dims, keepdim)?;
            if p == 0.0 {
                return x.zeros_like(None);
            }
            let sign = x.sign()?;
            if p.is_infinite() {
                let hit = x.abs()?.eq(&y_keep)?.to_dtype(x.dtype())?;
                let ties = hit.sum(&dims, true)?;
                return hit.mul(&sign)?.mul(&g.div(&ties)?);
            }
            // sign(x)·(|x|/‖x‖)^(p−1)·g, written so p = 1 and p = 2 need no pow.
            let ratio = zero_where_zero(&x.abs()?, &y_keep)?;
            let factor = if p == 1.0 {
                Ok(sign)
            } else if p == 2.0 {
                ratio.mul(&sign)
            } else {
                ratio.pow_scalar(p - 1.0)?.mul(&sign)
            }?;
            let zero_norm = y_keep.eq_scalar(0.0)?;
            let factor = Tensor::where_(&zero_norm, &Tensor::zeros(&[], x.dtype())?, &factor)?;
            factor.mul(&g)
        })
    }

    /// softmax along `dim`; the gradient is y·(g − Σ g·y), one fused pass
    /// per lane on the CPU ([`Tensor::softmax_backward`]), composed from
    /// primitives elsewhere. Errors as [`Tensor::softmax`].
    pub fn softmax(&self, dim: isize) -> Result<Var> {
        autocast_entry!(reg::SOFTMAX, [self], |c| c[0].softmax(dim));
        let y = self.tensor().softmax(dim)?;
        let saved = y.clone();
        reduction(reg::SOFTMAX, y, self, move |g| {
            if saved.device().is_cpu() {
                return Tensor::softmax_backward(g, &saved, dim);
            }
            let d = lane_dim(&saved, dim)?;
            let dot = g.mul(&saved)?.sum(&d, true)?;
            saved.mul(&g.sub(&dot)?)
        })
    }

    /// log_softmax along `dim`; the gradient is g − exp(y)·Σ g, one fused
    /// pass per lane on the CPU ([`Tensor::log_softmax_backward`]),
    /// composed from primitives elsewhere. Errors as
    /// [`Tensor::log_softmax`].
    pub fn log_softmax(&self, dim: isize) -> Result<Var> {
        autocast_entry!(reg::LOG_SOFTMAX, [self], |c| c[0].log_softmax(dim));
        let y = self.tensor().log_softmax(dim)?;
        let saved = y.clone();
        reduction(reg::LOG_SOFTMAX, y, self, move |g| {
            if saved.device().is_cpu() {
                return Tensor::log_softmax_backward(g, &saved, dim);
            }
            let d = lane_dim(&saved, dim)?;
            g.sub(&saved.exp()?.mul(&g.sum(&d, true)?)?)
        })
    }

    /// Running sums along `dim`; the gradient is the reversed running sum
    /// of g. Errors as [`Tensor::cumsum`].
    pub fn cumsum(&self, dim: isize) -> Result<Var> {
        autocast_entry!(reg::CUMSUM, [self], |c| c[0].cumsum(dim));
        let y = self.tensor().cumsum(dim)?;
        reduction(reg::CUMSUM, y, self, move |g| {
            if g.ndim() == 0 {
                return Ok(g.clone());
            }
            g.flip(&[dim])?.cumsum(dim)?.flip(&[dim])
        })
    }
}

/// The dim a softmax along `dim` ran over, as a reduction list (empty for a
/// 0-d value, whose single lane is everything).
fn lane_dim(t: &Tensor, dim: isize) -> Result<Vec<isize>> {
    Ok(if t.ndim() == 0 { Vec::new() } else { vec![dim] })
}

/// `a / d` elementwise (broadcasting), 0 where `d` is 0. Errors as the
/// tensor ops it is made of.
fn zero_where_zero(a: &Tensor, d: &Tensor) -> Result<Tensor> {
    let q = a.div(d)?;
    Tensor::where_(&d.eq_scalar(0.0)?, &q.zeros_like(None)?, &q)
}

/// For every element of `x`, the product of the other elements of its
/// reduction group over `dims` (empty = all), shaped like `x`: the
/// exclusive prefix product times the exclusive suffix product, as tensor
/// ops on `x`'s device.
fn product_of_others(x: &Tensor, dims: &[isize]) -> Result<Tensor> {
    let nd = x.ndim();
    let red = reduced_dims(nd, dims)?;
    if !x.dtype().is_float() {
        return Err(Error::dtype(
            "prod",
            format!("gradients need a float tensor, got {}", x.dtype()),
        ));
    }
    // Move the reduced dims last and merge them: rows × k, one group per row.
    let perm: Vec<usize> = (0..nd)
        .filter(|d| !red.contains(d))
        .chain(red.iter().copied())
        .collect();
    let perm_i: Vec<isize> = perm.iter().map(|&d| d as isize).collect();
    let moved = x.permute(&perm_i)?.contiguous()?;
    let k: usize = red.iter().map(|&d| x.shape()[d]).product();
    let rows = moved.numel().checked_div(k).unwrap_or(0);
    let others = if k == 0 || rows == 0 {
        moved.zeros_like(None)?
    } else {
        let m = moved.reshape([rows, k])?;
        let exclusive = |t: &Tensor| -> Result<Tensor> {
            let ones = t.narrow(1, 0, 1)?.ones_like(None)?;
            let scan = t.narrow(1, 0, k - 1)?.cumprod(1)?;
            Tensor::cat(&[ones, scan], 1)
        };
        let prefix = exclusive(&m)?;
        let suffix = exclusive(&m.flip(&[1])?)?.flip(&[1])?;
        prefix.mul(&suffix)?.reshape(moved.shape())?
    };
    let mut inverse = vec![0isize; nd];
    for (k, &d) in perm.iter().enumerate() {
        inverse[d] = k as isize;
    }
    others.permute(&inverse)
}
