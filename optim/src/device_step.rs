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
}
