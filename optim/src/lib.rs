//! # tessera-optim
//!
//! Optimizers, learning-rate schedules, gradient clipping and accumulation,
//! and dynamic loss scaling, with PyTorch's (and timm's) exact update
//! equations and defaults.
//!
//! - [`Optimizer`]: parameter groups with their own hyperparameters,
//!   `step(&grads)` with the [`tessera_autograd::Gradients`] that backward
//!   returns (no `zero_grad`), and state dicts saved as safetensors.
//!   Parameters are [`Parameter`] handles: the module reading a parameter
//!   and the optimizer updating it share one value.
//! - [`Sgd`], [`Adam`], [`AdamW`], [`Adagrad`], [`RmsProp`], [`Lamb`],
//!   [`Lars`]: each step is one fused pass per parameter over its flat
//!   buffer, gradient and state together, in place (no allocation after the
//!   first step, which creates the state). f16/bf16 parameters are
//!   stepped through f32 master copies with f32 state (ZeRO's 2 + 2 + 12
//!   bytes per parameter with Adam), saved in the state dict as
//!   `state.{k}.master`.
//! - [`OnebitAdam`], [`OnebitLamb`]: DeepSpeed's communication-compressed
//!   data-parallel optimizers over a [`CompressedReducer`] (implemented
//!   in `tessera-parallel` for every communicator).
//! - [`param_groups_weight_decay`] excludes biases and norm weights from
//!   weight decay, like timm.
//! - Schedules ([`LrScheduler`]): [`StepLR`], [`MultiStepLR`], [`CosineLR`]
//!   (timm's cosine with linear warm-up), [`OneCycleLR`], [`LinearWarmup`];
//!   and the LR range test [`lr_find`].
//! - [`clip_grad_norm`], [`clip_grad_value`], [`GradAccumulator`],
//!   [`GradScaler`].
//!
//! ```
//! use tessera_autograd::Parameter;
//! use tessera_optim::{Optimizer, Sgd, SgdOptions};
//! use tessera_tensor::Tensor;
//!
//! let w = Parameter::new(Tensor::from_vec(vec![1.0f32, 2.0], &[2])?);
//! let mut opt = Sgd::new(vec![w.clone()], SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() })?;
//! // loss = Σ w² / 2, so the gradient is w itself.
//! let mut grads = tessera_autograd::Gradients::default();
//! grads.insert(w.id().unwrap(), w.tensor()?);
//! opt.step(&grads)?;
//! assert_eq!(w.tensor()?.to_vec::<f32>()?, vec![0.9, 1.8]);
//! # Ok::<(), tessera_tensor::Error>(())
//! ```

mod accumulate;
mod adagrad;
mod adam;
mod clip;
mod engine;
#[cfg(test)]
mod engine_tests;
mod hyper;
mod kernel;
mod lamb;
mod lars;
mod lr_find;
mod master;
mod onebit;
mod optimizer;
mod rmsprop;
mod scaler;
mod schedule;
mod sgd;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod torch_reference_tests;

pub use accumulate::GradAccumulator;
pub use adagrad::{Adagrad, AdagradOptions, AdagradRule};
pub use adam::{Adam, AdamOptions, AdamRule, AdamW, AdamWOptions, AdamWRule};
pub use clip::{clip_grad_norm, clip_grad_value};
pub use engine::{DeviceStep, GroupOptimizer, Rule, StepCtx};
pub use hyper::Hyper;
pub use kernel::Bufs;
pub use lamb::{Lamb, LambOptions, LambRule};
pub use lars::{Lars, LarsOptions, LarsRule};
pub use lr_find::{lr_find, lr_find_with, LrFindOptions, LrFindResult, LrFindTarget};
pub use onebit::{
    padded_len, CompressedReducer, ErrorFeedback, OnebitAdam, OnebitLamb, OnebitLambConfig, OnebitOptions,
    WireStats, ZeroOneAdam, ZeroOneAdamConfig, ZeroOneStep, DEFAULT_VARIANCE_MASK,
};
pub use optimizer::{param_groups_weight_decay, Optimizer, ParamGroup};
pub use rmsprop::{RmsProp, RmsPropOptions, RmsPropRule};
pub use scaler::{GradScaler, GradScalerOptions};
pub use schedule::{
    Anneal, CosineLR, CosineOptions, LinearSchedule, LinearWarmup, LrScheduler, MultiStepLR,
    MultiStepSchedule, OneCycleLR, OneCycleOptions, OneCycleSchedule, Schedule, Scheduler, StepLR,
    StepSchedule,
};
pub use sgd::{Sgd, SgdOptions, SgdRule};
pub use tessera_autograd::Parameter;
pub use tessera_tensor::StateDict;
