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
/// `label_smoothing` α (Megatron's argument of the same name) smooths the
/// target as `torch.nn.functional.cross_entropy(label_smoothing=α)` does
/// on the gathered logits: weight `1 − α + α/V` on the target and `α/V` on
/// every class, so the loss is `(1 − α)·CE − α·mean_v log softmax(x)_v`
/// and the gradient `softmax − (1 − α)·onehot − α/V`. The sum of the
/// logits that the mean needs travels in the third all-reduce. (Megatron
/// spreads α over the `K − 1` other classes instead, with `K` the size of
/// its local partition and the mean over it, so its smoothed loss differs
/// from torch's and, for t > 1, between ranks.)
///
/// Errors when the logits are not f32, the shapes do not fit, a target is
/// outside `0 .. V`, `label_smoothing` is outside `[0, 1]`, or a
/// collective fails.
pub fn vocab_parallel_cross_entropy(
    logits: &Var,
    target: &Tensor,
    comm: &TpComm,
    label_smoothing: f64,
) -> Result<Var> {
    const OP: &str = "vocab_parallel_cross_entropy";
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(Error::arg(
            OP,
            format!("label_smoothing must be in [0, 1], got {label_smoothing}"),
        ));
    }
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

    // Per token Σ exp(z) and, for label smoothing, Σ z: one all-reduce.
    let alpha = label_smoothing as f32;
    let width = if alpha > 0.0 { 2 } else { 1 };
    let sum_z: Vec<f32> = z.chunks(part).map(|row| row.iter().sum()).collect();
    z.iter_mut().for_each(|v| *v = v.exp());
    let mut sums_local = Vec::with_capacity(width * sum_z.len());
    for (row, sz) in z.chunks(part).zip(&sum_z) {
        sums_local.push(row.iter().sum::<f32>());
        if width == 2 {
            sums_local.push(*sz);
        }
    }
    let n = sums_local.len();
    let sums = all_reduce(comm, sums_local, &[n], ReduceOp::Sum)?;
    let sum_exp: Vec<f32> = sums.iter().step_by(width).copied().collect();

    let inv_v = 1.0 / vocab as f32;
    let loss: Vec<f32> = sums
        .chunks(width)
        .zip(&pred)
        .map(|(s, p)| match s {
            [se, sz] => se.ln() - (1.0 - alpha) * p - alpha * sz * inv_v,
            _ => s[0].ln() - p,
        })
        .collect();
    let loss = Tensor::from_vec(loss, &lead)?;
    let shape = x.shape().to_vec();
    Ok(record(OP, loss, &[logits], move |g, _| {
        let g = g.contiguous()?.to_vec::<f32>()?;
        let mut softmax = z;
        for (((row, s), &y), dl) in softmax.chunks_mut(part).zip(&sum_exp).zip(&tokens).zip(&g) {
            row.iter_mut().for_each(|v| *v /= s);
            if alpha > 0.0 {
                row.iter_mut().for_each(|v| *v -= alpha * inv_v);
            }
            if let Some(k) = own(y) {
                row[k] -= 1.0 - alpha;
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
