//! MaxPool2d, AvgPool2d and AdaptiveAvgPool2d.

use tessera_autograd::Var;
use tessera_tensor::ops::pool::Pool2dParams;
use tessera_tensor::Result;

use crate::Module;

/// Max pooling over `[N, C, H, W]` (`torch.nn.MaxPool2d`).
#[derive(Debug, Clone, Copy, Module)]
pub struct MaxPool2d {
    /// Window, stride, padding, dilation and ceil mode.
    #[module(skip)]
    pub params: Pool2dParams,
}

impl MaxPool2d {
    /// A `k×k` window with stride `k` (PyTorch's default), no padding.
    pub fn new(kernel: usize) -> MaxPool2d {
        MaxPool2d {
            params: Pool2dParams::new(kernel),
        }
    }
}

impl Module for MaxPool2d {
    /// Errors as [`Var::max_pool2d`] (bad rank, window larger than the
    /// padded input, ...).
    fn forward(&self, input: &Var) -> Result<Var> {
        input.max_pool2d(&self.params)
    }
}

/// Average pooling over `[N, C, H, W]` (`torch.nn.AvgPool2d`).
#[derive(Debug, Clone, Copy, Module)]
pub struct AvgPool2d {
    /// Window, stride, padding, ceil mode and divisor settings.
    #[module(skip)]
    pub params: Pool2dParams,
}

impl AvgPool2d {
    /// A `k×k` window with stride `k`, no padding.
    pub fn new(kernel: usize) -> AvgPool2d {
        AvgPool2d {
            params: Pool2dParams::new(kernel),
        }
    }
}

impl Module for AvgPool2d {
    /// Errors as [`Var::avg_pool2d`].
    fn forward(&self, input: &Var) -> Result<Var> {
        input.avg_pool2d(&self.params)
    }
}

/// Average pooling to a fixed output size (`torch.nn.AdaptiveAvgPool2d`);
/// `[1, 1]` is global average pooling.
#[derive(Debug, Clone, Copy, Module)]
pub struct AdaptiveAvgPool2d {
    /// The output `(H, W)`.
    #[module(skip)]
    pub output_size: [usize; 2],
}

impl AdaptiveAvgPool2d {
    /// Pooling to `output_size`.
    pub fn new(output_size: [usize; 2]) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output_size }
    }
}

impl Module for AdaptiveAvgPool2d {
    /// Errors as [`Var::adaptive_avg_pool2d`].
    fn forward(&self, input: &Var) -> Result<Var> {
        input.adaptive_avg_pool2d(self.output_size)
    }
}
