//! DropPath (stochastic depth): drops a whole residual branch per sample.

use tessera_autograd::Var;
use tessera_tensor::{Error, Result, Tensor};

use crate::{Module, Training};

/// Stochastic depth (timm's `DropPath`): in training mode each sample of
/// the batch (dim 0) keeps its whole input with probability `1 − p`,
/// scaled by `1 / (1 − p)`, and is zeroed otherwise; the identity in eval
/// mode or with `p == 0`. The per-sample mask comes from the default
/// generator, so gradient checkpointing replays it. Applied to a residual
/// branch before the addition, it drops the branch (`x + drop_path(f(x))`).
#[derive(Debug, Clone, Module)]
pub struct DropPath {
    /// The probability of dropping a sample's branch.
    #[module(skip)]
    pub p: f64,
    training: Training,
}

impl DropPath {
    /// A DropPath with drop probability `p`, in training mode. Errors when
    /// `p` is outside [0, 1].
    pub fn new(p: f64) -> Result<DropPath> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::arg(
                "DropPath::new",
                format!("drop path probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(DropPath {
            p,
            training: Training::default(),
        })
    }
}

impl Module for DropPath {
    /// Errors when the input has no batch dimension or is not floating
    /// point.
    fn forward(&self, input: &Var) -> Result<Var> {
        if !self.training.get() || self.p == 0.0 {
            return Ok(input.clone());
        }
        if input.ndim() == 0 {
            return Err(Error::shape(
                "DropPath",
                "the input needs a batch dimension, got a scalar",
            ));
        }
        let mut shape = vec![1; input.ndim()];
        shape[0] = input.shape()[0];
        // Dropout of a per-sample column of ones is exactly the scaled
        // keep mask (`bernoulli(1 − p) / (1 − p)`), broadcast over the rest.
        let ones = Tensor::ones(&shape, (input.dtype(), input.device()))?;
        let mask = Var::constant(ones).dropout(self.p, true)?;
        input.mul(&mask)
    }
}

/// A residual branch `y` through `drop_path` when there is one (models keep
/// `None` at rate 0, as timm keeps an `Identity`).
pub(crate) fn drop_branch(drop_path: &Option<DropPath>, y: Var) -> Result<Var> {
    match drop_path {
        Some(dp) => dp.forward(&y),
        None => Ok(y),
    }
}

/// The drop-path rate of block `index` of `total`: linear from 0 to
/// `rate` (timm's `torch.linspace(0, rate, total)`).
pub(crate) fn drop_path_at(rate: f64, index: usize, total: usize) -> f64 {
    if total <= 1 {
        return 0.0;
    }
    rate * index as f64 / (total - 1) as f64
}
