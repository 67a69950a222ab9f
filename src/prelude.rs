//! The names most training scripts need: `use tessera::prelude::*;`.
//!
//! Tensors and autograd, the nn layers and losses, the optimizers, LR
//! schedules and their helpers, the data loader, and the facade's
//! [`Error`]/[`Result`] (every crate's error converts into it, so `?` works
//! across crates). Names a script rarely needs stay in their crates
//! (`tessera::nn::models`, `tessera::parallel`, ...).

pub use crate::{Error, Result};

pub use tessera_tensor::{bf16, f16, manual_seed, DType, Device, GeluApprox, PadMode, Tensor};

pub use tessera_autograd::{
    checkpoint, enable_grad, is_grad_enabled, no_grad, CrossEntropyOptions, Gradients, Parameter, Reduction,
    Target, Var,
};

pub use tessera_nn::{
    AdaptiveAvgPool2d, AvgPool2d, BCEWithLogitsLoss, BatchNorm, BatchNormOptions, Buffer, Conv2d,
    Conv2dOptions, CrossEntropyLoss, Dropout, Embedding, Flatten, GroupNorm, Identity, LayerNorm, Linear,
    MSELoss, MaxPool2d, Module, ModuleList, MultiheadAttention, NLLLoss, ReLU, Sequential, SiLU, Sigmoid,
    Softmax, Tanh, TransformerEncoderLayer, TransformerOptions, GELU,
};

pub use tessera_optim::{
    clip_grad_norm, clip_grad_value, param_groups_weight_decay, Adagrad, AdagradOptions, Adam, AdamOptions,
    AdamW, AdamWOptions, CosineLR, CosineOptions, GradAccumulator, GradScaler, GradScalerOptions, Lamb,
    LambOptions, Lars, LarsOptions, LinearWarmup, LrScheduler, MultiStepLR, OneCycleLR, OneCycleOptions,
    Optimizer, ParamGroup, RmsProp, RmsPropOptions, Sgd, SgdOptions, StepLR,
};

pub use tessera_data::{DataLoader, Dataset, TensorDataset};
