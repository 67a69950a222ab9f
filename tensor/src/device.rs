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

    /// `Ok(())` when tensors can be placed on this device, as PyTorch's
    /// `torch.cuda.is_available()` but with the reason when not: always for
    /// the CPU; for `cuda:N` when that GPU (or, with the feature `cuda-emu`,
    /// its emulator) opens.
    ///
    /// Errors: [`Error::Device`] saying why the device cannot be used (no
    /// driver, no such ordinal, the emulator not enabled).
    pub fn available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => crate::cuda::device("Device::available", n).map(|_| ()),
        }
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

impl std::str::FromStr for Device {
    type Err = Error;

    /// Parses PyTorch's device strings: `cpu`, `cuda` (device 0) or
    /// `cuda:N`. Errors name the string; `cuda` in a build without the
    /// `cuda` feature is an error that says so.
    fn from_str(s: &str) -> Result<Device> {
        const OP: &str = "Device::from_str";
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        let ordinal = match s.strip_prefix("cuda") {
            Some("") => Some(0),
            Some(rest) => rest.strip_prefix(':').and_then(|n| n.parse::<usize>().ok()),
            None => None,
        };
        match ordinal {
            #[cfg(feature = "cuda")]
            Some(n) => Ok(Device::Cuda(n)),
            #[cfg(not(feature = "cuda"))]
            Some(_) => Err(Error::device(
                OP,
                format!("{s:?} needs a build with the cargo feature `cuda`"),
            )),
            None => Err(Error::arg(
                OP,
                format!("{s:?} is not a device (expected cpu, cuda or cuda:N)"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn parses_pytorch_device_strings() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        for bad in ["", "gpu", "cuda:", "cuda:x", "cuda1", "cpu:0"] {
            let err = bad.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        #[cfg(feature = "cuda")]
        {
            assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
            assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
            assert_eq!(
                Device::Cuda(3).to_string().parse::<Device>().unwrap(),
                Device::Cuda(3)
            );
        }
        #[cfg(not(feature = "cuda"))]
        assert!("cuda:1"
            .parse::<Device>()
            .unwrap_err()
            .to_string()
            .contains("feature `cuda`"));
    }
}
