//! Dropout on [`Var`]: zeroes elements with probability `p` and scales the
//! rest by `1/(1-p)`, drawing the mask from this thread's default generator
//! (so gradient checkpointing, which restores that generator, replays it).

use tessera_tensor::{DType, Error, Result, Tensor, TensorOptions};

use super::record_op;
use super::registry as reg;
use crate::Var;

impl Var {
    /// Dropout with drop probability `p`: in training (`train`) each element
    /// is kept with probability `1 − p` and scaled by `1/(1 − p)` (all zero
    /// when `p == 1`), the mask drawn from the default generator as f32
    /// uniforms `u` (kept where `u ≥ p`); the gradient is the output gradient
    /// times the same scaled mask (only the bool mask is saved). Outside training,
    /// or with `p == 0`, returns `self` unchanged and draws nothing.
    ///
    /// Errors when `p` is not in [0, 1] or the value is not floating point.
    pub fn dropout(&self, p: f64, train: bool) -> Result<Var> {
        let op = reg::DROPOUT.name();
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::arg(
                op,
                format!("drop probability must be in [0, 1], got {p}"),
            ));
        }
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::dtype(
                op,
                format!("dropout needs a floating-point value, got {dtype}"),
            ));
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        let u = Tensor::rand(
            self.shape(),
            TensorOptions {
                dtype: DType::F32,
                device: self.device(),
            },
        )?;
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        let threshold = p as f32;
        // A bool mask (1 byte an element) is all the backward keeps.
        let keep = u.ge_scalar(threshold as f64)?;
        let y = masked_scale(self.tensor(), &keep, scale)?;
        record_op(reg::DROPOUT, y, &[self], move |g, _| {
            Ok(vec![Some(masked_scale(g, &keep, scale)?)])
        })
    }
}

/// `t · scale` where `keep` is true and 0 elsewhere, in `t`'s float dtype
/// (the product rounded once), as tensor ops. Errors for a non-float `t`.
fn masked_scale(t: &Tensor, keep: &Tensor, scale: f64) -> Result<Tensor> {
    if !t.dtype().is_float() {
        let op = reg::DROPOUT.name();
        return Err(Error::dtype(
            op,
            format!("dropout needs a floating-point value, got {}", t.dtype()),
        ));
    }
    let scaled = t.mul_scalar(scale)?;
    Tensor::where_(keep, &scaled, &scaled.zeros_like(None)?)
}
