//! Linear, Identity and Flatten.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{DType, Result, Tensor};

use crate::{init, Module};

/// `y = x Wᵀ + b` over the last dimension (`torch.nn.Linear`): weight
/// `[out_features, in_features]`, optional bias `[out_features]`, both
/// initialised as PyTorch does (U(±1/√in_features)).
#[derive(Debug, Clone, Module)]
pub struct Linear {
    /// The weight, `[out_features, in_features]`.
    pub weight: Parameter,
    /// The bias, `[out_features]`, when the layer has one.
    pub bias: Option<Parameter>,
}

impl Linear {
    /// A Linear layer `in_features → out_features` in f32 with PyTorch's
    /// default init, drawn from the default generator. Errors only if the
    /// parameters cannot be allocated.
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = Parameter::new(Tensor::zeros(&[out_features, in_features], DType::F32)?);
        let bias = match bias {
            true => Some(Parameter::new(Tensor::zeros(&[out_features], DType::F32)?)),
            false => None,
        };
        init::default_layer_init(&weight, bias.as_ref())?;
        Ok(Linear { weight, bias })
    }

    /// The number of input features.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// The number of output features.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl Module for Linear {
    fn forward(&self, input: &Var) -> Result<Var> {
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        input.linear(&self.weight.var()?, b.as_ref())
    }
}

/// Returns its input unchanged (`torch.nn.Identity`).
#[derive(Debug, Clone, Copy, Default, Module)]
pub struct Identity;

impl Module for Identity {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.clone())
    }
}

/// Flattens dimensions `start_dim ..= end_dim` into one (`torch.nn.Flatten`,
/// default `1, -1`: everything but the batch dimension).
#[derive(Debug, Clone, Copy, Module)]
pub struct Flatten {
    /// The first dimension flattened.
    #[module(skip)]
    pub start_dim: isize,
    /// The last dimension flattened (inclusive).
    #[module(skip)]
    pub end_dim: isize,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }
}

impl Module for Flatten {
    /// Errors when a dimension is out of range or `start_dim > end_dim`.
    fn forward(&self, input: &Var) -> Result<Var> {
        input.flatten(self.start_dim, self.end_dim)
    }
}
