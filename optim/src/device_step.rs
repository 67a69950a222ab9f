//! [`DeviceStep`]: how a [`crate::engine::Rule`] names its fused GPU
//! kernel (used with the feature `cuda`).

/// The fused device kernel a rule's step is, with its hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceStep {
    /// Adam (coupled weight decay) or AdamW (`decoupled`).
    Adam {
        /// Learning rate.
        lr: f64,
        /// β1.
        beta1: f64,
        /// β2.
        beta2: f64,
        /// ε.
        eps: f64,
        /// Weight decay λ.
        weight_decay: f64,
        /// AdamW's decoupled decay.
        decoupled: bool,
        /// Ascend instead of descend.
        maximize: bool,
    },
    /// SGD with momentum, dampening, Nesterov, coupled weight decay.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum.
        momentum: f64,
        /// Dampening.
        dampening: f64,
        /// Weight decay.
        weight_decay: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// Ascend instead of descend.
        maximize: bool,
    },
    /// LAMB (timm `Lamb`): Adam moments of the clipped gradients and a
    /// per-tensor trust ratio.
    Lamb {
        /// Learning rate.
        lr: f64,
        /// β1.
        beta1: f64,
        /// β2.
        beta2: f64,
        /// ε.
        eps: f64,
        /// Weight decay λ.
        weight_decay: f64,
        /// Divide the moments by 1 − βᵗ.
        bias_correction: bool,
        /// Scale the gradient by 1 − β1 in the first moment.
        grad_averaging: bool,
        /// Clip the trust ratio at 1.
        trust_clip: bool,
        /// Trust ratio without weight decay too.
        always_adapt: bool,
        /// Decoupled weight decay.
        decoupled_decay: bool,
        /// The gradients are divided by this (global norm clipping, ≥ 1).
        clip: f64,
    },
}
