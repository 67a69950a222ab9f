//! GPU dispatch of the reductions (`ReduceOp`), mean, max_dim/min_dim and argmax/argmin: one kernel launch
//! per reduced dimension over the contiguous input viewed as
//! `[outer, len, inner]`.

use tessera_cuda_kernels::ops::reduce::{arg_extreme as arg_extreme_launch, reduce as reduce_launch};

use crate::backend::ReduceOp;

use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, state_of, with_kernel_float, Output,
};
use crate::{dim_index, dim_indices, DType, Error, Result, Tensor};

/// `op` over `dims` (all when empty). Sums and products over several dims
/// accumulate in f32 throughout and round once, as on the CPU; max and min
/// stay in the dtype (they round nothing).
///
/// Errors: bad dims, an empty max/min, a dtype without kernels, a device
/// failure.
pub(crate) fn reduce(t: &Tensor, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let name = op.name();
    if !t.dtype().is_float() {
        // The CPU gives integer sums and products in i64; no kernel does.
        return Err(no_kernel(name, t.device(), format_args!("{} tensors", t.dtype())));
    }
    let ds = resolve(name, t, dims)?;
    let work = if ds.len() > 1 && op.has_identity() {
        DType::F32
    } else {
        t.dtype()
    };
    let y = over_dims(name, &t.to_dtype(work)?, &ds, op, t.dtype())?;
    squeeze(y.to_dtype(t.dtype())?, &ds, keepdim)
}

/// The mean over `dims`: the f32 sum divided by the count, rounded once.
///
/// Errors as [`sum`].
pub(crate) fn mean(t: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let ds = resolve("mean", t, dims)?;
    let n: usize = ds.iter().map(|&d| t.shape()[d]).product();
    let s = over_dims("mean", &t.to_dtype(DType::F32)?, &ds, ReduceOp::Sum, t.dtype())?;
    let m = s.div_scalar(n as f64)?.to_dtype(t.dtype())?;
    squeeze(m, &ds, keepdim)
}

/// The max (`max`) or min along `dim` and the index of its first
/// occurrence (`max_dim`/`min_dim`).
///
/// Errors: as [`arg_extreme`].
pub(crate) fn extreme_dim(t: &Tensor, dim: isize, keepdim: bool, max: bool) -> Result<(Tensor, Tensor)> {
    let (op, r) = if max {
        ("max_dim", ReduceOp::Max)
    } else {
        ("min_dim", ReduceOp::Min)
    };
    let d = dim_index(op, dim, t.ndim().max(1))?;
    Ok((
        reduce(t, r, &[dim], keepdim)?,
        arg_extreme(t, Some(d as isize), keepdim, max)?,
    ))
}

/// The (i64) index of the first maximum (`max`) or minimum along `dim`, or
/// of the flattened tensor when `None`; a NaN counts as the extreme either
/// way, as in PyTorch.
///
/// Errors: an empty reduction, a bad dim, a dtype without kernels.
pub(crate) fn arg_extreme(t: &Tensor, dim: Option<isize>, keepdim: bool, max: bool) -> Result<Tensor> {
    let op = if max { "argmax" } else { "argmin" };
    let (x, d) = match dim {
        Some(dim) if t.ndim() > 0 => (contiguous(t)?, dim_index(op, dim, t.ndim())?),
        _ => {
            if let Some(dim) = dim {
                dim_index(op, dim, 1)?;
            }
            (contiguous(t)?.reshape(t.numel())?, 0)
        }
    };
    let (outer, len, inner) = split(&x, d);
    if len == 0 {
        return Err(empty(op, t));
    }
    let state = state_of(op, &x)?;
    let out = Output::new(op, &state, DType::I64, outer * inner)?;
    with_kernel_float!(x.dtype(), T => {
        let l = arg_extreme_launch::<T>(contiguous_ptr(&x), out.ptr(), outer, len, inner, max)
            .map_err(kernel_err(op, state.device()))?;
        if outer * inner > 0 {
            launch(op, &state, &[l])?;
        }
    }, else return Err(no_kernel(op, state.device(), format_args!("{} tensors", x.dtype()))));
    let mut shape = x.shape().to_vec();
    shape[d] = 1;
    let y = out.into_tensor(&shape);
    match dim {
        Some(_) if t.ndim() > 0 => squeeze(y, &[d], keepdim),
        _ if keepdim => y.reshape(vec![1; t.ndim()]),
        _ => y.reshape([]),
    }
}

/// The dims to reduce, sorted (every dim when `dims` is empty).
fn resolve(op: &'static str, t: &Tensor, dims: &[isize]) -> Result<Vec<usize>> {
    if t.ndim() == 0 {
        dim_indices(op, dims, 1)?;
        return Ok(Vec::new());
    }
    let mut ds = if dims.is_empty() {
        (0..t.ndim()).collect()
    } else {
        dim_indices(op, dims, t.ndim())?
    };
    ds.sort_unstable();
    Ok(ds)
}

/// `t` reduced over each of `ds` in turn (kept as size 1), last dim first.
fn over_dims(op: &'static str, t: &Tensor, ds: &[usize], r: ReduceOp, user_dtype: DType) -> Result<Tensor> {
    let mut x = contiguous(t)?;
    for &d in ds.iter().rev() {
        x = over_dim(op, &x, d, r, user_dtype)?;
    }
    Ok(x)
}

fn over_dim(op: &'static str, x: &Tensor, d: usize, r: ReduceOp, user_dtype: DType) -> Result<Tensor> {
    let (outer, len, inner) = split(x, d);
    let mut shape = x.shape().to_vec();
    shape[d] = 1;
    if len == 1 {
        return x.reshape(shape);
    }
    let state = state_of(op, x)?;
    if len == 0 {
        return match r {
            ReduceOp::Sum => Ok(Output::zeros(op, &state, x.dtype(), outer * inner)?.into_tensor(&shape)),
            ReduceOp::Prod => Output::zeros(op, &state, x.dtype(), outer * inner)?
                .into_tensor(&shape)
                .add_scalar(1.0),
            ReduceOp::Max | ReduceOp::Min => Err(empty(op, x)),
        };
    }
    let out = Output::new(op, &state, x.dtype(), outer * inner)?;
    with_kernel_float!(x.dtype(), T => {
        let l = reduce_launch::<T>(r, contiguous_ptr(x), out.ptr(), outer, len, inner)
            .map_err(kernel_err(op, state.device()))?;
        if outer * inner > 0 {
            launch(op, &state, &[l])?;
        }
        Ok(out.into_tensor(&shape))
    }, else Err(no_kernel(op, state.device(), format_args!("{user_dtype} tensors"))))
}

/// `(outer, len, inner)` of dim `d` of a contiguous tensor.
fn split(x: &Tensor, d: usize) -> (usize, usize, usize) {
    let s = x.shape();
    (s[..d].iter().product(), s[d], s[d + 1..].iter().product())
}

/// `y` (with the reduced dims `ds` of size 1) without them unless `keepdim`.
fn squeeze(y: Tensor, ds: &[usize], keepdim: bool) -> Result<Tensor> {
    if keepdim {
        return Ok(y);
    }
    let shape: Vec<usize> = y
        .shape()
        .iter()
        .enumerate()
        .filter(|(d, _)| !ds.contains(d))
        .map(|(_, &n)| n)
        .collect();
    y.reshape(shape)
}

fn empty(op: &'static str, t: &Tensor) -> Error {
    Error::shape(
        op,
        format!("cannot reduce over an empty dimension of shape {:?}", t.shape()),
    )
}
