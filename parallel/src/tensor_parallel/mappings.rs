//! Megatron's conjugate communication operators (spec §6.1) as
//! differentiable ops on a tensor-parallel group.
//!
//! Each op runs its collective eagerly in forward and records a backward
//! that runs the conjugate collective; with a group of one rank every op is
//! the identity and records nothing. Activations are `[s, b, h]` (sequence
//! first), so the sequence-parallel ops split and gather dim 0, and the
//! tensor-parallel scatter/gather work on the last dim. Every rank of the
//! group must run the same ops in the same order (in backward too: the tape
//! runs nodes in reverse creation order, the same on every rank of a model
//! built the same way).

use tessera_autograd::{record, Var};
use tessera_tensor::{Error, Result, Tensor};

use super::TpComm;
use crate::comm::CommExt;
use crate::element::ReduceOp;

/// `f`: identity forward, all-reduce (sum) of the gradient backward. Put
/// in front of a column-parallel layer whose input is replicated.
pub fn copy_to_tensor_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    let c = comm.clone();
    Ok(record(
        "copy_to_tensor_parallel_region",
        x.tensor().clone(),
        &[x],
        move |g, _| {
            Ok(vec![Some(all_reduce(
                &c,
                g,
                "copy_to_tensor_parallel_region.backward",
            )?)])
        },
    ))
}

/// `g`: all-reduce (sum) forward, identity backward. Ends a row-parallel
/// layer: the partial products of the ranks are summed.
pub fn reduce_from_tensor_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    let y = all_reduce(comm, x.tensor(), "reduce_from_tensor_parallel_region")?;
    Ok(record("reduce_from_tensor_parallel_region", y, &[x], |g, _| {
        Ok(vec![Some(g.clone())])
    }))
}

/// Keeps this rank's slice of the last dim (forward); all-gathers the
/// gradient along the last dim (backward). Errors when the last dim does not
/// divide by the group size.
pub fn scatter_to_tensor_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    let y = own_slice(comm, x.tensor(), -1, "scatter_to_tensor_parallel_region")?;
    let c = comm.clone();
    Ok(record(
        "scatter_to_tensor_parallel_region",
        y,
        &[x],
        move |g, _| {
            Ok(vec![Some(gather_dim(
                &c,
                g,
                -1,
                "scatter_to_tensor_parallel_region.backward",
            )?)])
        },
    ))
}

/// All-gathers the last dim in rank order (forward); keeps this rank's
/// slice of the gradient (backward).
pub fn gather_from_tensor_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    let y = gather_dim(comm, x.tensor(), -1, "gather_from_tensor_parallel_region")?;
    let c = comm.clone();
    Ok(record(
        "gather_from_tensor_parallel_region",
        y,
        &[x],
        move |g, _| {
            Ok(vec![Some(own_slice(
                &c,
                g,
                -1,
                "gather_from_tensor_parallel_region.backward",
            )?)])
        },
    ))
}

/// Keeps this rank's slice of dim 0, the sequence (forward); all-gathers the
/// gradient along dim 0 (backward). Errors when dim 0 does not divide.
pub fn scatter_to_sequence_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    let y = own_slice(comm, x.tensor(), 0, "scatter_to_sequence_parallel_region")?;
    let c = comm.clone();
    Ok(record(
        "scatter_to_sequence_parallel_region",
        y,
        &[x],
        move |g, _| {
            Ok(vec![Some(gather_dim(
                &c,
                g,
                0,
                "scatter_to_sequence_parallel_region.backward",
            )?)])
        },
    ))
}

/// All-gathers dim 0, the sequence (forward). Backward reduce-scatters the
/// gradient along dim 0 when `tensor_parallel_output_grad` (the gathered
/// value feeds a tensor-parallel layer, so each rank holds a partial
/// gradient), and otherwise keeps this rank's slice (the consumer was
/// replicated, so every rank holds the whole gradient).
pub fn gather_from_sequence_parallel_region(
    x: &Var,
    comm: &TpComm,
    tensor_parallel_output_grad: bool,
) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    const OP: &str = "gather_from_sequence_parallel_region";
    let y = gather_dim(comm, x.tensor(), 0, OP)?;
    let c = comm.clone();
    Ok(record(OP, y, &[x], move |g, _| {
        let dx = if tensor_parallel_output_grad {
            reduce_scatter(&c, g, "gather_from_sequence_parallel_region.backward")?
        } else {
            own_slice(&c, g, 0, "gather_from_sequence_parallel_region.backward")?
        };
        Ok(vec![Some(dx)])
    }))
}

/// Reduce-scatters (sum) along dim 0, the sequence (forward); all-gathers
/// the gradient along dim 0 (backward). Ends a row-parallel layer under
/// sequence parallelism. Errors when dim 0 does not divide.
pub fn reduce_scatter_to_sequence_parallel_region(x: &Var, comm: &TpComm) -> Result<Var> {
    if comm.world_size() == 1 {
        return Ok(x.clone());
    }
    const OP: &str = "reduce_scatter_to_sequence_parallel_region";
    let y = reduce_scatter(comm, x.tensor(), OP)?;
    let c = comm.clone();
    Ok(record(OP, y, &[x], move |g, _| {
        Ok(vec![Some(gather_dim(
            &c,
            g,
            0,
            "reduce_scatter_to_sequence_parallel_region.backward",
        )?)])
    }))
}

/// A collective's error as the tensor error the autograd API carries,
/// naming the op.
pub(crate) fn comm_error(op: &'static str) -> impl Fn(crate::CommError) -> Error {
    move |e| Error::io(op, format!("tensor-parallel collective failed: {e}"))
}

/// The sum of `t` over the group.
pub(crate) fn all_reduce(comm: &TpComm, t: &Tensor, op: &'static str) -> Result<Tensor> {
    comm.all_reduce(t, ReduceOp::Sum).map_err(comm_error(op))
}

/// The reduce-scatter (sum) of `t` along dim 0.
fn reduce_scatter(comm: &TpComm, t: &Tensor, op: &'static str) -> Result<Tensor> {
    divisible(comm, t, 0, op)?;
    comm.reduce_scatter(t, ReduceOp::Sum).map_err(comm_error(op))
}

/// This rank's contiguous slice of dim `dim` (0 or -1).
fn own_slice(comm: &TpComm, t: &Tensor, dim: isize, op: &'static str) -> Result<Tensor> {
    let part = divisible(comm, t, dim, op)?;
    t.narrow(dim, comm.rank() * part, part)?.contiguous()
}

/// The ranks' tensors concatenated along dim `dim` (0 or -1), in rank order.
fn gather_dim(comm: &TpComm, t: &Tensor, dim: isize, op: &'static str) -> Result<Tensor> {
    if t.ndim() == 0 {
        return Err(Error::shape(op, "cannot gather a 0-d tensor"));
    }
    let all = comm.all_gather(t).map_err(comm_error(op))?;
    if dim == 0 {
        return Ok(all);
    }
    let rows = t.shape()[0];
    let parts = (0..comm.world_size())
        .map(|k| all.narrow(0, k * rows, rows))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, dim)
}

/// The size of dim `dim` divided by the group size; an error naming the op
/// when it does not divide.
fn divisible(comm: &TpComm, t: &Tensor, dim: isize, op: &'static str) -> Result<usize> {
    let n = comm.world_size();
    let d = if dim < 0 { t.ndim().checked_sub(1) } else { Some(0) };
    let size = d.and_then(|d| t.shape().get(d).copied());
    match size {
        Some(s) if s % n == 0 => Ok(s / n),
        _ => Err(Error::shape(
            op,
            format!(
                "dim {dim} of shape {:?} must divide by the tensor-parallel size {n}",
                t.shape()
            ),
        )),
    }
}
