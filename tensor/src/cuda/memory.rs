//! The public face of a GPU's caching allocator and stream, as
//! `torch.cuda.memory_stats`, `empty_cache`, `reset_peak_memory_stats` and
//! `synchronize`.

use tessera_cuda_kernels::MemoryStats;

use super::{device, kernel_err, DeviceState};
use crate::{Device, Error, Result};

impl Device {
    /// The counters of this GPU's caching allocator (bytes allocated,
    /// reserved, their peaks, cache hits), opening the device if needed.
    ///
    /// Errors: [`Error::Device`] for [`Device::Cpu`] (its cache is
    /// [`crate::alloc`]'s) or a device that cannot be opened.
    pub fn memory_stats(self) -> Result<MemoryStats> {
        Ok(gpu(self, "memory_stats")?.allocator().stats())
    }

    /// Gives the cached (free) blocks of this GPU's caching allocator back
    /// to the device; blocks of live tensors stay.
    ///
    /// Errors: as [`Device::memory_stats`], or a driver error freeing.
    pub fn empty_cache(self) -> Result<()> {
        const OP: &str = "empty_cache";
        let state = gpu(self, OP)?;
        state.allocator().empty_cache().map_err(kernel_err(OP, self))
    }

    /// Restarts the peaks of [`Device::memory_stats`] from the current values.
    ///
    /// Errors: as [`Device::memory_stats`].
    pub fn reset_peak_memory_stats(self) -> Result<()> {
        gpu(self, "reset_peak_memory_stats")?.allocator().reset_peak();
        Ok(())
    }

    /// Waits until every kernel and copy issued to this device has
    /// finished (a no-op on the CPU, whose ops finish before returning).
    ///
    /// Errors: a device that cannot be opened, or a failure of earlier
    /// asynchronous work surfacing here.
    pub fn synchronize(self) -> Result<()> {
        const OP: &str = "synchronize";
        if self.is_cpu() {
            return Ok(());
        }
        let state = gpu(self, OP)?;
        state.runtime().synchronize().map_err(kernel_err(OP, self))
    }
}

fn gpu(dev: Device, op: &'static str) -> Result<std::sync::Arc<DeviceState>> {
    match dev {
        Device::Cuda(n) => device(op, n),
        Device::Cpu => Err(Error::device(
            op,
            "cpu has no CUDA caching allocator (see tessera_tensor::alloc for the CPU cache)",
        )),
    }
}
