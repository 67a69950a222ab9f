//! Where a tensor's storage lives.

use crate::{Error, Result};

/// The device a tensor lives on. `Cuda(ordinal)` exists only with the cargo
/// feature `cuda`; without it every tensor is on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, computed by the rayon + SIMD CPU backend.
    #[default]
    Cpu,
    /// The CUDA device with this ordinal: a GPU, or with the feature
    /// `cuda-emu` the CPU emulator of one where no GPU is present (or
    /// `TESSERA_CUDA_EMU=1`).
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

impl Device {
    /// True for [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// `Ok(())` when `self` and `other` are the same device, else a
    /// [`Error::Device`] naming `op` and both devices.
    pub fn same_as(self, other: Device, op: &'static str) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(Error::device(
                op,
                format!("operands are on different devices: {self} and {other}"),
            ))
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}
