//! Slicing a master weight for one rank and gathering it back (Megatron's
//! `_initialize_affine_weight_cpu` and its inverse).

use tessera_tensor::{Error, Result, Tensor};

use super::mappings::comm_error;
use super::TpComm;
use crate::comm::CommExt;

/// Rank `rank`'s part of `master` split along `dim` over `t` ranks: the dim
/// is cut into `t · stride` equal pieces and the rank keeps pieces
/// `rank, rank + t, rank + 2t, ...` concatenated (stride 1: one contiguous
/// block; stride 3: `q_r, k_r, v_r` of a fused QKV). Errors when the dim
/// does not divide by `t · stride` or `t`/`stride` is 0.
pub fn shard(master: &Tensor, dim: usize, stride: usize, rank: usize, t: usize) -> Result<Tensor> {
    let piece = piece_len(master, dim, stride, t, "shard")?;
    if rank >= t {
        return Err(Error::index("shard", format!("rank {rank} of a group of {t}")));
    }
    let parts = (0..stride)
        .map(|j| master.narrow(dim as isize, (j * t + rank) * piece, piece))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, dim as isize)?.contiguous()
}

/// The inverse of [`shard`] over the group: every rank's part gathered and
/// put back in the master's layout (a collective; every rank gets it).
/// Errors when the parts' shapes differ or a collective fails.
pub fn unshard(comm: &TpComm, local: &Tensor, dim: usize, stride: usize) -> Result<Tensor> {
    let t = comm.world_size();
    if t == 1 {
        return Ok(local.clone());
    }
    let rows = *local
        .shape()
        .first()
        .ok_or_else(|| Error::shape("unshard", "cannot gather a 0-d shard"))?;
    let all = comm.all_gather(local).map_err(comm_error("unshard"))?;
    let parts = (0..t)
        .map(|k| all.narrow(0, k * rows, rows))
        .collect::<Result<Vec<_>>>()?;
    let piece = piece_len(local, dim, stride, 1, "unshard")?;
    let mut pieces = Vec::with_capacity(t * stride);
    for j in 0..stride {
        for p in &parts {
            pieces.push(p.narrow(dim as isize, j * piece, piece)?);
        }
    }
    Tensor::cat(&pieces, dim as isize)?.contiguous()
}

fn piece_len(t: &Tensor, dim: usize, stride: usize, n: usize, op: &'static str) -> Result<usize> {
    let size = *t
        .shape()
        .get(dim)
        .ok_or_else(|| Error::index(op, format!("dim {dim} of shape {:?}", t.shape())))?;
    let parts = n.checked_mul(stride).unwrap_or(0);
    if parts == 0 || size % parts != 0 {
        return Err(Error::shape(
            op,
            format!(
                "dim {dim} of shape {:?} does not split into {n} ranks × stride {stride}",
                t.shape()
            ),
        ));
    }
    Ok(size / parts)
}
