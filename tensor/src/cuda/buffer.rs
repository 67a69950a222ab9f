//! Device memory behind a [`crate::Storage`] on a GPU, and the per-device
//! handle registry: each opened device is a [`Runtime`] (the CUDA driver, or
//! with the feature `cuda-emu` the CPU emulator where no GPU is present)
//! with a [`CachingAllocator`] in front of its memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tessera_cuda_kernels::{runtime, CachingAllocator, Error as KernelError, Launch, Runtime};

use crate::{Device, Error, Result};

/// One opened device: its runtime and its caching allocator.
pub(crate) struct DeviceState {
    pub(crate) ordinal: usize,
    alloc: CachingAllocator,
}

/// The opened devices, by ordinal. A device is opened on first use and
/// stays open for the life of the process (as PyTorch's contexts do).
static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<DeviceState>>>> = OnceLock::new();

/// The handle of `cuda:ordinal`, opening it on first use.
///
/// Errors ([`Error::Device`] naming `op`): no CUDA driver found, no such
/// device, NVRTC missing (kernels cannot be compiled), or a malformed
/// `TESSERA_CUDA_EMU` / `TESSERA_EMU_ORDER`.
pub(crate) fn device(op: &'static str, ordinal: usize) -> Result<Arc<DeviceState>> {
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    // The registry holds no invariant a panic elsewhere could break.
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let rt =
        runtime::open(ordinal).map_err(|e| Error::device(op, format!("cannot open cuda:{ordinal}: {e}")))?;
    let state = Arc::new(DeviceState {
        ordinal,
        alloc: CachingAllocator::new(rt),
    });
    map.insert(ordinal, state.clone());
    Ok(state)
}

/// A kernel-crate error as a tensor error naming `op` and the device:
/// argument errors stay argument errors, everything else is a device error.
pub(crate) fn kernel_err(op: &'static str, dev: Device) -> impl Fn(KernelError) -> Error {
    move |e| match e {
        KernelError::Arg { .. } => Error::arg(op, format!("on {dev}: {e}")),
        e => Error::device(op, format!("on {dev}: {e}")),
    }
}

/// Bytes on one GPU, a block of the device's caching allocator; returned
/// to its cache when dropped (safe at once: the device's one stream orders
/// every later use after the kernels that used it).
pub(crate) struct DeviceBuffer {
    state: Arc<DeviceState>,
    addr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    /// `bytes` uninitialised bytes on `state`'s device, for kernels that
    /// write every element.
    pub(crate) fn alloc(op: &'static str, state: &Arc<DeviceState>, bytes: usize) -> Result<Self> {
        let block = state.alloc.alloc(bytes).map_err(kernel_err(op, state.device()))?;
        Ok(DeviceBuffer {
            state: state.clone(),
            addr: block.addr,
            bytes,
        })
    }

    /// `bytes` zero bytes on `state`'s device.
    pub(crate) fn zeros(op: &'static str, state: &Arc<DeviceState>, bytes: usize) -> Result<Self> {
        let b = Self::alloc(op, state, bytes)?;
        // SAFETY: the block holds at least `bytes` bytes.
        unsafe { state.runtime().memset(b.addr, 0, bytes) }.map_err(kernel_err(op, state.device()))?;
        Ok(b)
    }

    /// A device copy of `src`. The runtime returns once `src` may be
    /// reused; the copy is ordered before every later kernel.
    pub(crate) fn upload(op: &'static str, state: &Arc<DeviceState>, src: &[u8]) -> Result<Self> {
        let b = Self::alloc(op, state, src.len())?;
        // SAFETY: the block holds at least `src.len()` bytes.
        unsafe { state.runtime().copy_htod(b.addr, src) }.map_err(kernel_err(op, state.device()))?;
        Ok(b)
    }

    /// The bytes `range` copied to the host (waits for every earlier launch).
    ///
    /// Errors: `range` beyond the buffer, or a device failure.
    pub(crate) fn download(&self, op: &'static str, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let dev = self.state.device();
        if range.start > range.end || range.end > self.bytes {
            return Err(Error::arg(
                op,
                format!(
                    "bytes {range:?} lie outside a buffer of {} bytes on {dev}",
                    self.bytes
                ),
            ));
        }
        let mut out = vec![0u8; range.len()];
        // SAFETY: `range` lies inside the buffer (checked above).
        unsafe {
            self.state
                .runtime()
                .copy_dtoh(self.addr + range.start as u64, &mut out)
        }
        .map_err(kernel_err(op, dev))?;
        Ok(out)
    }

    /// A device-to-device copy of the whole buffer.
    pub(crate) fn try_clone(&self, op: &'static str) -> Result<Self> {
        let b = Self::alloc(op, &self.state, self.bytes)?;
        // SAFETY: both blocks hold `bytes` bytes and are distinct.
        unsafe { self.state.runtime().copy_dtod(b.addr, self.addr, self.bytes) }
            .map_err(kernel_err(op, self.state.device()))?;
        Ok(b)
    }

    /// The device address of byte 0.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// The number of bytes (a 0-byte buffer still has an address).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device it lives on.
    pub(crate) fn state(&self) -> &Arc<DeviceState> {
        &self.state
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the block came from this allocator and the buffer is gone;
        // kernels still queued on the stream run before any reuse. The only
        // error (an unknown block) cannot happen for a block we own.
        let _ = unsafe { self.state.alloc.free(self.addr) };
    }
}

impl DeviceState {
    /// `Device::Cuda(ordinal)`.
    pub(crate) fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// The runtime that runs this device.
    pub(crate) fn runtime(&self) -> &Arc<dyn Runtime> {
        self.alloc.runtime()
    }

    /// The device's caching allocator.
    pub(crate) fn allocator(&self) -> &CachingAllocator {
        &self.alloc
    }

    /// Runs `l` on the device's stream.
    ///
    /// # Safety
    /// As [`Runtime::launch`]: every pointer in `l` addresses live memory of
    /// this device with the length the wrapper was given.
    pub(crate) unsafe fn launch(&self, op: &'static str, l: &Launch) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.runtime().launch(l) }.map_err(kernel_err(op, self.device()))
    }
}
