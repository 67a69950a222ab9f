//! Squeeze-and-excitation channel attention (timm's `SEModule`).

use tessera_autograd::Var;
use tessera_tensor::{Error, Result};

use crate::{Conv2d, Conv2dOptions, Module};

/// Squeeze-and-excitation (timm's `SEModule`, Hu et al.): the input
/// `[B, C, H, W]` is averaged over `H, W`, passed through `fc1` (1×1 conv
/// `C → rd`, bias), an activation, `fc2` (1×1 conv `rd → C`, bias) and a
/// sigmoid, and the result gates the input channel-wise. State-dict keys
/// `fc1.weight, fc1.bias, fc2.weight, fc2.bias` as in timm.
#[derive(Module)]
pub struct SqueezeExcite {
    /// The reduction `C → rd`.
    pub fc1: Conv2d,
    /// The activation between the convolutions (timm's default is ReLU;
    /// CoAtNet uses SiLU).
    pub act: Box<dyn Module>,
    /// The expansion `rd → C`.
    pub fc2: Conv2d,
}

impl SqueezeExcite {
    /// An SE block over `channels` with `rd_channels` hidden channels and
    /// the activation `act`, with PyTorch's default conv init. Errors when
    /// a channel count is 0.
    pub fn new(channels: usize, rd_channels: usize, act: impl Module + 'static) -> Result<Self> {
        if channels == 0 || rd_channels == 0 {
            return Err(Error::arg(
                "SqueezeExcite::new",
                format!("channels {channels} and rd_channels {rd_channels} must be positive"),
            ));
        }
        let opts = Conv2dOptions::default();
        Ok(SqueezeExcite {
            fc1: Conv2d::new(channels, rd_channels, 1, opts)?,
            act: Box::new(act),
            fc2: Conv2d::new(rd_channels, channels, 1, opts)?,
        })
    }
}

impl Module for SqueezeExcite {
    /// Errors when the input is not `[B, C, H, W]` with this block's `C`.
    fn forward(&self, input: &Var) -> Result<Var> {
        let c = self.fc1.weight.shape()[1];
        if input.ndim() != 4 || input.shape()[1] != c {
            return Err(Error::shape(
                "SqueezeExcite",
                format!("expected input [B, {c}, H, W], got {:?}", input.shape()),
            ));
        }
        let s = input.mean(&[2, 3], true)?;
        let s = self.fc1.forward(&s)?;
        let s = self.act.forward(&s)?;
        let gate = self.fc2.forward(&s)?.sigmoid()?;
        input.mul(&gate)
    }
}
