//! Vocabulary-parallel cross-entropy (Megatron's `cross_entropy.py`, spec
//! §6.4): the loss over logits split along the vocabulary, with three
//! all-reduces of one scalar per token instead of gathering the logits.

use tessera_autograd::{record, Var};
use tessera_tensor::{DType, Error, Result, Tensor};

use super::mappings::comm_error;
use super::TpComm;
use crate::comm::CommExt;
use crate::element::ReduceOp;

/// The per-token cross-entropy `log Σ_v exp(x_v) − x_target` of the logits
/// `logits` `[..., V/t]` (this rank's vocabulary slice, rows
/// `rank·V/t ..`), for the i64 `target` shaped like the logits without
/// their last dim; returns the loss with the target's shape, equal on every
/// rank. Issues exactly three all-reduces (max, target logit, sum of
/// exponentials); backward is local: `softmax − onehot` on this rank's
/// slice, times the incoming gradient.
///
/// Errors when the logits are not f32, the shapes do not fit, a target is
/// outside `0 .. V`, or a collective fails.
pub fn vocab_parallel_cross_entropy(logits: &Var, target: &Tensor, comm: &TpComm) -> Result<Var> {
    const OP: &str = "vocab_parallel_cross_entropy";
    let x = logits.tensor();
    if x.dtype() != DType::F32 || target.dtype() != DType::I64 {
        return Err(Error::dtype(
            OP,
            format!(
                "needs f32 logits and i64 targets, got {} and {}",
                x.dtype(),
                target.dtype()
            ),
        ));
    }
    let (lead, part) = match x.shape().split_last() {
        Some((&v, lead)) if v > 0 && lead == target.shape() => (lead.to_vec(), v),
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                    "logits {:?} must be the target's shape {:?} plus a non-empty vocabulary dim",
                    x.shape(),
                    target.shape()
                ),
            ))
        }
    };
    let start = comm.rank() * part;
    let vocab = part * comm.world_size();
    let tokens = target.to_vec::<i64>()?;
    if let Some(bad) = tokens.iter().find(|&&y| y < 0 || y as u64 >= vocab as u64) {
        return Err(Error::index(
            OP,
            format!("target {bad} outside the vocabulary 0..{vocab}"),
        ));
    }
    let own = move |y: i64| (y as usize).checked_sub(start).filter(|&k| k < part);
    let mut z = x.contiguous()?.to_vec::<f32>()?;

    let local_max: Vec<f32> = z
        .chunks(part)
        .map(|row| row.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let mx = all_reduce(comm, local_max, &lead, ReduceOp::Max)?;
    z.chunks_mut(part)
        .zip(&mx)
        .for_each(|(row, m)| row.iter_mut().for_each(|v| *v -= m));

    let pred_local: Vec<f32> = z
        .chunks(part)
        .zip(&tokens)
        .map(|(row, &y)| own(y).map_or(0.0, |k| row[k]))
        .collect();
    let pred = all_reduce(comm, pred_local, &lead, ReduceOp::Sum)?;

    z.iter_mut().for_each(|v| *v = v.exp());
    let sum_local: Vec<f32> = z.chunks(part).map(|row| row.iter().sum()).collect();
    let sum_exp = all_reduce(comm, sum_local, &lead, ReduceOp::Sum)?;

    let loss: Vec<f32> = sum_exp.iter().zip(&pred).map(|(s, p)| s.ln() - p).collect();
    let loss = Tensor::from_vec(loss, &lead)?;
    let shape = x.shape().to_vec();
    Ok(record(OP, loss, &[logits], move |g, _| {
        let g = g.contiguous()?.to_vec::<f32>()?;
        let mut softmax = z;
        for (((row, s), &y), dl) in softmax.chunks_mut(part).zip(&sum_exp).zip(&tokens).zip(&g) {
            row.iter_mut().for_each(|v| *v /= s);
            if let Some(k) = own(y) {
                row[k] -= 1.0;
            }
            row.iter_mut().for_each(|v| *v *= dl);
        }
        Ok(vec![Some(Tensor::from_vec(softmax, &shape)?)])
    }))
}

/// One all-reduce of a per-token vector over the group.
fn all_reduce(comm: &TpComm, v: Vec<f32>, lead: &[usize], op: ReduceOp) -> Result<Vec<f32>> {
    let t = Tensor::from_vec(v, lead)?;
    comm.all_reduce(&t, op)
        .map_err(comm_error("vocab_parallel_cross_entropy"))?
        .to_vec::<f32>()
}
