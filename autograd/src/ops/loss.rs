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
        let probs = match target {
            Target::Indices(t) => return fused_cross_entropy(self, t, *opts),
            Target::Probs(p) => p,
        };
        if probs.shape() != self.shape() || !probs.dtype().is_float() {
            return Err(Error::shape(
                OP,
                format!(
                    "probability target must be a float tensor of the input's shape {:?}, got {} of shape {:?}",
                    self.shape(),
                    probs.dtype(),
                    probs.shape()
                ),
            ));
        }
        let logp = classes_last(OP, self)?.log_softmax(-1)?;
        let classes = *logp.shape().last().expect("classes_last keeps a class dim");
        // The weights (1−ε)·p + ε/C in at least f32 on the logits' device,
        // rounded once to the logits' dtype.
        let wide = if logp.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let p = classes_last(
            OP,
            &Var::constant(probs.to_device(logp.device())?.to_dtype(wide)?),
        )?;
        let weights = p
            .tensor()
            .mul_scalar(1.0 - eps)?
            .add_scalar(eps / classes as f64)?
            .to_dtype(logp.dtype())?;
        let per = logp.mul(&Var::constant(weights))?.sum(&[-1], false)?.neg()?;
        reduce(per, opts.reduction)
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
        let rows_shape = &logp.shape()[..logp.ndim() - 1];
        if target.dtype() != DType::I64 || target.shape() != rows_shape {
            return Err(Error::shape(
                OP,
                format!(
                    "class-index target must be i64 of shape {rows_shape:?} for input {:?}, got {} of shape {:?}",
                    self.shape(),
                    target.dtype(),
                    target.shape()
                ),
            ));
        }
        let target = target.to_device(logp.device())?;
        let kept = target.ne_scalar(ignore_index as f64)?;
        // Ignored rows pick class 0 (always present) and are then zeroed, so
        // every index `gather` checks is a real class.
        let classes = target.masked_fill(&kept.logical_not()?, 0.0)?.unsqueeze(-1)?;
        let picked = logp.gather(-1, &classes).map_err(|e| match e {
            Error::Index { msg, .. } => Error::index(OP, format!("{msg} (input {:?})", self.shape())),
            e => e,
        })?;
        let kept = kept.to_dtype(logp.dtype())?;
        let per = picked.squeeze(-1)?.mul(&Var::constant(kept.clone()))?.neg()?;
        match reduction {
            Reduction::Mean => per.sum(&[], false)?.div(&Var::constant(kept.sum(&[], false)?)),
            r => reduce(per, r),
        }
    }

    /// Mean squared error `(self − target)²`, reduced. Errors when dtypes or
    /// devices differ or the shapes do not broadcast.
    pub fn mse_loss(&self, target: &Var, reduction: Reduction) -> Result<Var> {
        autocast_entry!(reg::MSE_LOSS, [self, target], |c| c[0].mse_loss(&c[1], reduction));
        let d = self.sub(target)?;
        reduce(d.mul(&d)?, reduction)
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
        reduce(loss, reduction)
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

/// Reduces per-element losses; the mean divides by the number of elements.
fn reduce(per: Var, reduction: Reduction) -> Result<Var> {
    match reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => per.sum(&[], false),
        Reduction::Mean => per.sum(&[], false)?.div_scalar(per.numel() as f64),
    }
}
