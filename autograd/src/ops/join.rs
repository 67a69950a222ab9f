//! Joining and splitting [`Var`]s: `cat`, `stack`, and the multi-output
//! `split`, `split_with_sizes` and `chunk` (one node whose outputs are the
//! pieces).

use std::borrow::Borrow;

use tessera_tensor::{dim_index, Error, Result, Tensor};

use super::index::zeros;
use super::registry::{self as reg, Op};
use super::{check_same, record_op, record_op_multi};
use crate::Var;

impl Var {
    /// The values joined along `dim` (PyTorch's `torch.cat`); each receives
    /// its slice of the output gradient.
    ///
    /// Errors when the list is empty, the dtypes or devices differ, or as
    /// [`Tensor::cat`].
    pub fn cat<T: Borrow<Var>>(vars: &[T], dim: isize) -> Result<Var> {
        let vars: Vec<&Var> = vars.iter().map(Borrow::borrow).collect();
        if let Some(c) = crate::autocast::cast_inputs(reg::CAT, &vars)? {
            return Var::cat(&c, dim);
        }
        let first = check_list(reg::CAT, &vars)?;
        let y = Tensor::cat(&vars.iter().map(|v| v.tensor()).collect::<Vec<_>>(), dim)?;
        let d = dim_index(reg::CAT.name(), dim, first.ndim())?;
        let sizes: Vec<usize> = vars.iter().map(|v| v.shape()[d]).collect();
        record_op(reg::CAT, y, &vars, move |g, needs| {
            let mut start = 0;
            let mut grads = Vec::with_capacity(sizes.len());
            for (&len, &need) in sizes.iter().zip(needs) {
                grads.push(if need {
                    Some(g.narrow(d as isize, start, len)?)
                } else {
                    None
                });
                start += len;
            }
            Ok(grads)
        })
    }

    /// The values, all of one shape, joined along a new dimension `dim`
    /// (PyTorch's `torch.stack`); each receives its slice of the gradient.
    ///
    /// Errors when the list is empty, the dtypes or devices differ, or as
    /// [`Tensor::stack`].
    pub fn stack<T: Borrow<Var>>(vars: &[T], dim: isize) -> Result<Var> {
        let vars: Vec<&Var> = vars.iter().map(Borrow::borrow).collect();
        if let Some(c) = crate::autocast::cast_inputs(reg::STACK, &vars)? {
            return Var::stack(&c, dim);
        }
        check_list(reg::STACK, &vars)?;
        let y = Tensor::stack(&vars.iter().map(|v| v.tensor()).collect::<Vec<_>>(), dim)?;
        let d = dim_index(reg::STACK.name(), dim, y.ndim())? as isize;
        record_op(reg::STACK, y, &vars, move |g, needs| {
            needs
                .iter()
                .enumerate()
                .map(|(i, &need)| {
                    if need {
                        g.select(d, i as isize).map(Some)
                    } else {
                        Ok(None)
                    }
                })
                .collect()
        })
    }

    /// Consecutive pieces of `size` elements along `dim`, the last possibly
    /// shorter (PyTorch's `split` with an int), as outputs of one node.
    ///
    /// Errors as [`Tensor::split`].
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Var>> {
        let pieces = self.tensor().split(size, dim)?;
        pieces_node(reg::SPLIT, self, pieces, dim)
    }

    /// Consecutive pieces of the given sizes along `dim` (PyTorch's
    /// `split_with_sizes`), as outputs of one node.
    ///
    /// Errors as [`Tensor::split_with_sizes`].
    pub fn split_with_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Var>> {
        let pieces = self.tensor().split_with_sizes(sizes, dim)?;
        pieces_node(reg::SPLIT, self, pieces, dim)
    }

    /// At most `chunks` pieces along `dim` (PyTorch's `chunk`), as outputs
    /// of one node.
    ///
    /// Errors as [`Tensor::chunk`].
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Var>> {
        let pieces = self.tensor().chunk(chunks, dim)?;
        pieces_node(reg::CHUNK, self, pieces, dim)
    }
}

/// Checks that `vars` is non-empty with one dtype and device; returns the
/// first.
fn check_list<'a>(op: Op, vars: &[&'a Var]) -> Result<&'a Var> {
    let first = *vars
        .first()
        .ok_or_else(|| Error::arg(op.name(), "needs at least one value"))?;
    for v in &vars[1..] {
        check_same(op, first, v)?;
    }
    Ok(first)
}

/// Records the pieces of `x` along `dim` as outputs of one node, whose
/// backward joins the pieces' gradients (zeros for pieces no gradient
/// reached).
fn pieces_node(op: Op, x: &Var, pieces: Vec<Tensor>, dim: isize) -> Result<Vec<Var>> {
    let shapes: Vec<Vec<usize>> = pieces.iter().map(|p| p.shape().to_vec()).collect();
    record_op_multi(op, pieces, &[x], move |gs, _| {
        if gs.len() == 1 {
            if let Some(g) = &gs[0] {
                return Ok(vec![Some(g.clone())]);
            }
        }
        let parts = gs
            .iter()
            .zip(&shapes)
            .map(|(g, shape)| match g {
                Some(g) => Ok(g.clone()),
                None => zeros_for(gs, shape),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(vec![Some(Tensor::cat(&parts, dim)?)])
    })
}

/// Zeros of `shape` like the first gradient present.
fn zeros_for(gs: &[Option<Tensor>], shape: &[usize]) -> Result<Tensor> {
    let g = gs
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| Error::arg("split", "internal: backward ran with no gradient"))?;
    zeros(g, shape)
}
