//! Losses as modules: CrossEntropyLoss, NLLLoss, MSELoss,
//! BCEWithLogitsLoss. Each holds PyTorch's options and has
//! `forward(input, target)`.

use tessera_autograd::{CrossEntropyOptions, Reduction, Target, Var};
use tessera_tensor::{Result, Tensor};

/// Cross-entropy of logits against class indices or class probabilities
/// (`torch.nn.CrossEntropyLoss`): ignore_index, label smoothing, reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrossEntropyLoss {
    /// ignore_index (-100), label_smoothing (0), reduction (mean).
    pub options: CrossEntropyOptions,
}

impl CrossEntropyLoss {
    /// The loss with PyTorch's defaults.
    pub fn new() -> CrossEntropyLoss {
        CrossEntropyLoss::default()
    }

    /// The same loss with label smoothing `eps`.
    pub fn label_smoothing(mut self, eps: f64) -> CrossEntropyLoss {
        self.options.label_smoothing = eps;
        self
    }

    /// The loss of `input` (`[N, C, ...]` logits) against i64 class indices
    /// `target` (`[N, ...]`). Errors as [`Var::cross_entropy`].
    pub fn forward(&self, input: &Var, target: &Tensor) -> Result<Var> {
        input.cross_entropy(Target::Indices(target), &self.options)
    }

    /// The loss against class probabilities shaped like `input` (soft
    /// labels from MixUp/CutMix). Errors as [`Var::cross_entropy`].
    pub fn forward_probs(&self, input: &Var, target: &Tensor) -> Result<Var> {
        input.cross_entropy(Target::Probs(target), &self.options)
    }
}

/// Negative log-likelihood of log-probabilities against class indices
/// (`torch.nn.NLLLoss`).
#[derive(Debug, Clone, Copy)]
pub struct NLLLoss {
    /// Targets equal to this are skipped (default -100).
    pub ignore_index: i64,
    /// How the per-sample losses are reduced (default mean).
    pub reduction: Reduction,
}

impl Default for NLLLoss {
    fn default() -> Self {
        NLLLoss {
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

impl NLLLoss {
    /// The loss of log-probabilities `input` against i64 `target`. Errors
    /// as [`Var::nll_loss`].
    pub fn forward(&self, input: &Var, target: &Tensor) -> Result<Var> {
        input.nll_loss(target, self.ignore_index, self.reduction)
    }
}

/// Mean squared error (`torch.nn.MSELoss`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MSELoss {
    /// How the squared errors are reduced (default mean).
    pub reduction: Reduction,
}

impl MSELoss {
    /// `reduce((input − target)²)`; gradients flow to both. Errors when
    /// the shapes do not broadcast or the dtypes differ.
    pub fn forward(&self, input: &Var, target: &Var) -> Result<Var> {
        input.mse_loss(target, self.reduction)
    }
}

/// Binary cross-entropy on logits (`torch.nn.BCEWithLogitsLoss`), with an
/// optional positive-class weight per class.
#[derive(Debug, Clone, Default)]
pub struct BCEWithLogitsLoss {
    /// Weight of positive examples, broadcast over the classes.
    pub pos_weight: Option<Tensor>,
    /// How the per-element losses are reduced (default mean).
    pub reduction: Reduction,
}

impl BCEWithLogitsLoss {
    /// The loss of logits `input` against probabilities `target` of the
    /// same shape. Errors as [`Var::bce_with_logits`].
    pub fn forward(&self, input: &Var, target: &Tensor) -> Result<Var> {
        input.bce_with_logits(target, self.pos_weight.as_ref(), self.reduction)
    }
}
