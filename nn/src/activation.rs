//! Activation modules and Dropout.

use tessera_autograd::Var;
use tessera_tensor::{GeluApprox, Result};

use crate::{Module, Training};

/// Defines a parameter-free activation module calling one `Var` method.
macro_rules! activation {
    ($(#[$doc:meta])* $ty:ident, |$x:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, Module)]
        pub struct $ty;

        impl Module for $ty {
            fn forward(&self, $x: &Var) -> Result<Var> {
                $body
            }
        }
    };
}

activation!(
    /// `max(x, 0)` (`torch.nn.ReLU`).
    ReLU, |x| x.relu()
);
activation!(
    /// `x · σ(x)` (`torch.nn.SiLU`).
    SiLU, |x| x.silu()
);
activation!(
    /// `1 / (1 + e^-x)` (`torch.nn.Sigmoid`).
    Sigmoid, |x| x.sigmoid()
);
activation!(
    /// `tanh(x)` (`torch.nn.Tanh`).
    Tanh, |x| x.tanh()
);

/// GELU, exact (erf, PyTorch's default) or with the tanh approximation
/// (`torch.nn.GELU(approximate=...)`).
#[derive(Debug, Clone, Copy, Default, Module)]
pub struct GELU {
    /// Exact (`None`) or tanh approximation.
    #[module(skip)]
    pub approximate: GeluApprox,
}

impl Module for GELU {
    fn forward(&self, input: &Var) -> Result<Var> {
        input.gelu(self.approximate)
    }
}

/// Softmax along `dim` (`torch.nn.Softmax(dim)`).
#[derive(Debug, Clone, Copy, Module)]
pub struct Softmax {
    /// The dimension that sums to 1.
    #[module(skip)]
    pub dim: isize,
}

impl Module for Softmax {
    /// Errors when `dim` is out of range.
    fn forward(&self, input: &Var) -> Result<Var> {
        input.softmax(self.dim)
    }
}

/// Zeroes each element with probability `p` in training mode and scales
/// the rest by `1 / (1 − p)`; the identity in eval mode
/// (`torch.nn.Dropout`). Masks come from the default generator.
#[derive(Debug, Clone, Module)]
pub struct Dropout {
    /// The drop probability.
    #[module(skip)]
    pub p: f64,
    training: Training,
}

impl Dropout {
    /// A dropout layer with probability `p` (PyTorch's default is 0.5), in
    /// training mode. Errors when `p` is outside [0, 1].
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(tessera_tensor::Error::arg(
                "Dropout::new",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(Dropout {
            p,
            training: Training::default(),
        })
    }
}

impl Module for Dropout {
    fn forward(&self, input: &Var) -> Result<Var> {
        if !self.training.get() || self.p == 0.0 {
            return Ok(input.clone());
        }
        input.dropout(self.p, true)
    }
}
