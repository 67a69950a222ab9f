//! Losses on [`Var`]: cross-entropy with class indices (ignore_index, label
//! smoothing) as one node over the tensor crate's fused kernel and its
//! backward; cross-entropy with class probabilities, NLL, MSE and binary
//! cross-entropy with logits composed from differentiable primitives (so
//! their gradients come from the primitives' backward). Definitions follow
//! PyTorch's `torch.nn.functional`; the options types are the tensor
//! crate's.

use tessera_tensor::{DType, Error, Result, Tensor};

use super::record_op;
use super::registry as reg;
use crate::autocast::autocast_entry;
use crate::Var;

pub use tessera_tensor::{CrossEntropyOptions, Reduction};

/// The target of [`Var::cross_entropy`].
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// i64 class indices, shaped like the input without its class dim.
    Indices(&'a Tensor),
    /// Class probabilities shaped like the input (MixUp/CutMix soft labels).
    Probs(&'a Tensor),
}

impl Var {
    /// Cross-entropy between the logits `self` (`[C]`, `[N, C]` or
    /// `[N, C, d1, ...]`, classes along dim 1, or 0 for a 1-D input) and
    /// `target`, as PyTorch's `F.cross_entropy` without class weights:
    /// per sample `−Σ_c w_c · log_softmax(x)_c` with `w = (1−ε)·onehot(y) +
    /// ε/C` for an index `y` (zero for `ignore_index`) and
    /// `w = (1−ε)·p + ε/C` for probabilities `p`. The mean divides by the
    /// number of targets not ignored (NaN when all are), or by the number of
    /// samples for probability targets.
    ///
    /// Errors when the shapes do not fit, index targets are not i64 or hold
    /// a class outside `0..C` other than `ignore_index`, or `label_smoothing`
    /// is not in [0, 1].
    pub fn cross_entropy(&self, target: Target<'_>, opts: &CrossEntropyOptions) -> Result<Var> {
        autocast_entry!(reg::CROSS_ENTROPY, [self], |c| c[0].cross_entropy(target, opts));
        const OP: &str = "cross_entropy";
        let eps = opts.label_smoothing;
        if !(0.0..=1.0).contains(&eps) {
            return Err(Error::arg(
                OP,
                format!("label_smoothing must be in [0, 1], got {eps}"),
            ));
        }
        if let Target::Indices(t) = target {
            return fused_cross_entropy(self, t, *opts);
        }
        let logits = classes_last(OP, self)?;
        let logp = logits.log_softmax(-1)?;
        weighted_nll(
            OP,
            &logp,
            self.shape(),
            target,
            opts.ignore_index,
            eps,
            opts.reduction,
        )
    }

    /// Negative log-likelihood of the log-probabilities `self` (classes
    /// along dim 1, or 0 for a 1-D input) at the i64 class indices `target`
    /// (PyTorch's `F.nll_loss` without class weights): `−self[n, y_n]`,
    /// zero where `y_n == ignore_index`; the mean divides by the number of
    /// targets not ignored.
    ///
    /// Errors as [`Var::cross_entropy`].
    pub fn nll_loss(&self, target: &Tensor, ignore_index: i64, reduction: Reduction) -> Result<Var> {
        autocast_entry!(reg::NLL_LOSS, [self], |c| c[0].nll_loss(
            target,
            ignore_index,
            reduction
        ));
        const OP: &str = "nll_loss";
        let logp = classes_last(OP, self)?;
        weighted_nll(
            OP,
            &logp,
            self.shape(),
            Target::Indices(target),
            ignore_index,
            0.0,
            reduction,
        )
    }

    /// Mean squared error `(self − target)²`, reduced. Errors when dtypes or
    /// devices differ or the shapes do not broadcast.
    pub fn mse_loss(&self, target: &Var, reduction: Reduction) -> Result<Var> {
        autocast_entry!(reg::MSE_LOSS, [self, target], |c| c[0].mse_loss(&c[1], reduction));
        let d = self.sub(target)?;
        reduce(d.mul(&d)?, reduction, None)
    }

    /// Binary cross-entropy of the logits `self` against probabilities
    /// `target` of the same shape (PyTorch's
    /// `F.binary_cross_entropy_with_logits`): `(1 − y)·x + l·softplus(−x)`
    /// with `l = 1 + (pos_weight − 1)·y`, and `softplus(−x)` evaluated as
    /// `log1p(exp(−|x|)) + max(−x, 0)` so large |x| neither overflows nor
    /// loses the gradient. `pos_weight` broadcasts against the last dims.
    ///
    /// Errors when the shapes differ, `pos_weight` does not broadcast, or the
    /// value is not floating point.
    pub fn bce_with_logits(
        &self,
        target: &Tensor,
        pos_weight: Option<&Tensor>,
        reduction: Reduction,
    ) -> Result<Var> {
        autocast_entry!(reg::BCE_WITH_LOGITS, [self], |c| c[0]
            .bce_with_logits(target, pos_weight, reduction));
        const OP: &str = "bce_with_logits";
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::dtype(
                OP,
                format!("logits must be floating point, got {dtype}"),
            ));
        }
        if target.shape() != self.shape() {
            return Err(Error::shape(
                OP,
                format!(
                    "target shape {:?} differs from input shape {:?}",
                    target.shape(),
                    self.shape()
                ),
            ));
        }
        let c = |t: Tensor| t.to_dtype(dtype).map(Var::constant);
        let y = target.to_dtype(DType::F64)?;
        let log_weight = match pos_weight {
            Some(pw) => y
                .mul(&pw.to_dtype(DType::F64)?.sub_scalar(1.0)?)?
                .add_scalar(1.0)?,
            None => y.ones_like(None)?,
        };
        if log_weight.shape() != self.shape() {
            return Err(Error::shape(
                OP,
                format!(
                    "pos_weight of shape {:?} does not broadcast to {:?}",
                    log_weight.shape(),
                    self.shape()
                ),
            ));
        }
        // |x| and min(x, 0) as x times constant masks: exact on both sides
        // of 0, and the sum below is smooth there.
        let x = self.tensor().to_dtype(DType::F64)?;
        let sign = x
            .ge_scalar(0.0)?
            .to_dtype(DType::F64)?
            .mul_scalar(2.0)?
            .sub_scalar(1.0)?;
        let neg = x.lt_scalar(0.0)?.to_dtype(DType::F64)?;
        let abs = self.mul(&c(sign)?)?;
        let softplus_neg = abs.neg()?.exp()?.log1p()?.sub(&self.mul(&c(neg)?)?)?;
        let loss = self
            .mul(&c(y.rsub_scalar(1.0)?)?)?
            .add(&softplus_neg.mul(&c(log_weight)?)?)?;
        reduce(loss, reduction, None)
    }
}

/// Cross-entropy with class-index targets as one node: the tensor crate's
/// fused kernel (max, Σ exp and the target logit in one pass per row)
/// forward, and its dlogits kernel backward. The node saves the logits, the
/// targets and each row's log-sum-exp.
fn fused_cross_entropy(x: &Var, target: &Tensor, opts: CrossEntropyOptions) -> Result<Var> {
    let logits = x.tensor().clone();
    let (loss, lse) = logits.cross_entropy_forward(target, opts)?;
    let target = target.clone();
    record_op(reg::CROSS_ENTROPY, loss, &[x], move |g, _| {
        let dx = Tensor::cross_entropy_backward(g, &logits, &target, &lse, opts)?;
        Ok(vec![Some(dx)])
    })
}

/// The input with its class dim (1, or 0 for 1-D) moved last. Errors for a
/// 0-d input.
fn classes_last(op: &'static str, x: &Var) -> Result<Var> {
    match x.ndim() {
        0 => Err(Error::shape(
            op,
            "input must have a class dimension, got a 0-d value",
        )),
        1 | 2 => Ok(x.clone()),
        nd => {
            let mut perm: Vec<isize> = vec![0];
            perm.extend(2..nd as isize);
            perm.push(1);
            x.permute(&perm)
        }
    }
}

/// `−Σ_c logp[.., c]·w[.., c]` for the class weights `w` the target
/// defines, reduced. `logp` has its classes last; `in_shape` is the
/// caller's input shape (classes at dim 1, or 0 for 1-D).
fn weighted_nll(
    op: &'static str,
    logp: &Var,
    in_shape: &[usize],
    target: Target<'_>,
    ignore_index: i64,
    eps: f64,
    reduction: Reduction,
) -> Result<Var> {
    let classes = *logp.shape().last().expect("classes_last keeps a class dim");
    let rows_shape = &logp.shape()[..logp.ndim() - 1];
    let rows: usize = rows_shape.iter().product();
    let smooth = eps / classes as f64;
    let (weights, count) = match target {
        Target::Indices(t) => {
            if t.dtype() != DType::I64 || t.shape() != rows_shape {
                return Err(Error::shape(
                    op,
                    format!(
                        "class-index target must be i64 of shape {rows_shape:?} for input {in_shape:?}, got {} of shape {:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            let idx = t.contiguous()?.to_vec::<i64>()?;
            let mut w = vec![0.0f64; rows * classes];
            let mut count = 0usize;
            for (r, &k) in idx.iter().enumerate() {
                if k == ignore_index {
                    continue;
                }
                if k < 0 || k as u64 >= classes as u64 {
                    return Err(Error::index(
                        op,
                        format!(
                            "target class {k} is out of range for {classes} classes (input {in_shape:?})"
                        ),
                    ));
                }
                count += 1;
                let row = &mut w[r * classes..(r + 1) * classes];
                row.iter_mut().for_each(|v| *v = smooth);
                row[k as usize] += 1.0 - eps;
            }
            // Built where the targets were read (the indices are checked on
            // the host, like embedding's), then moved to the logits' device.
            (
                Tensor::from_vec(w, logp.shape())?.to_device(logp.device())?,
                count,
            )
        }
        Target::Probs(p) => {
            if p.shape() != in_shape || !p.dtype().is_float() {
                return Err(Error::shape(
                    op,
                    format!(
                        "probability target must be a float tensor of the input's shape {in_shape:?}, got {} of shape {:?}",
                        p.dtype(),
                        p.shape()
                    ),
                ));
            }
            let p = classes_last(op, &Var::constant(p.to_dtype(DType::F64)?))?.into_tensor();
            (p.mul_scalar(1.0 - eps)?.add_scalar(smooth)?, rows)
        }
    };
    let per = logp
        .mul(&Var::constant(weights.to_dtype(logp.dtype())?))?
        .sum(&[-1], false)?
        .neg()?;
    reduce(per, reduction, Some(count))
}

/// Reduces per-element losses; the mean divides by `count` when given, else
/// by the number of elements.
fn reduce(per: Var, reduction: Reduction, count: Option<usize>) -> Result<Var> {
    match reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => per.sum(&[], false),
        Reduction::Mean => {
            let n = count.unwrap_or(per.numel());
            per.sum(&[], false)?.div_scalar(n as f64)
        }
    }
}
