//! `--precision {f32,bf16,f16}` of the training examples: PyTorch's
//! automatic mixed precision recipe. Under bf16/f16 the forward pass and
//! the loss run inside `autocast` (matmul/linear/conv in the low dtype,
//! softmax, norms and the loss in f32); the parameters stay f32, so they
//! are the optimizer's master weights and the casts' backward hands them
//! f32 gradients. f16 adds a `GradScaler` (PyTorch's defaults): the loss
//! is scaled before backward so small gradients survive f16's range, and
//! a step whose gradients overflowed is skipped and the scale backed off.

use std::str::FromStr;

use tessera::autograd::autocast;
use tessera::optim::{GradScaler, GradScalerOptions};
use tessera::tensor::{DType, Result};

/// The compute precision of a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    F32,
    Bf16,
    F16,
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "f16" | "fp16" => Ok(Precision::F16),
            _ => Err(format!("--precision takes f32, bf16 or f16, got {s}")),
        }
    }
}

impl Precision {
    /// The dtype autocast runs the GEMM-bound ops in; `None` for f32.
    pub fn autocast_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }

    /// Runs `f` (a forward pass and its loss) under autocast to this
    /// precision, or as it is for f32. Errors as `f` does.
    pub fn run<R>(self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        match self.autocast_dtype() {
            Some(d) => autocast(d, f),
            None => f(),
        }
    }

    /// The loss scaler of the run: enabled (PyTorch's defaults) for f16
    /// only; bf16 has f32's range and needs none, as in PyTorch.
    pub fn scaler(self) -> Result<GradScaler> {
        GradScaler::new(GradScalerOptions {
            enabled: self == Precision::F16,
            ..Default::default()
        })
    }
}
