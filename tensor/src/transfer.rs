//! Moving tensors between devices: [`Tensor::to_device`], [`Tensor::cpu`]
//! and, with the feature `cuda`, `Tensor::cuda`.

use crate::{Device, Result, Tensor};

impl Tensor {
    /// This tensor's value on `device`: `self` (no copy) when it is already
    /// there, else a contiguous copy. Host→GPU copies are asynchronous (the
    /// GPU's stream orders every later kernel behind them); GPU→host copies
    /// wait for the GPU.
    ///
    /// Errors ([`crate::Error::Device`], naming `to_device` and the device)
    /// when no CUDA driver is found, the device does not exist, or a copy
    /// fails.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        {
            crate::cuda::transfer(self, device)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("without the feature `cuda` every tensor is on the CPU")
    }

    /// This tensor's value in host memory: `self` when it is already there.
    /// Errors as [`Tensor::to_device`].
    pub fn cpu(&self) -> Result<Tensor> {
        self.to_device(Device::Cpu)
    }

    /// This tensor's value on `cuda:ordinal` (`to_device(Device::Cuda(ordinal))`).
    /// Errors as [`Tensor::to_device`].
    #[cfg(feature = "cuda")]
    pub fn cuda(&self, ordinal: usize) -> Result<Tensor> {
        self.to_device(Device::Cuda(ordinal))
    }
}
