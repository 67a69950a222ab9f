//! Device memory behind a [`crate::Storage`] on a GPU, the per-device
//! handle registry, and host↔device copies through a pinned staging buffer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result as cu, CudaSlice, DevicePtr, HostSlice, PinnedHostSlice};
use tessera_cuda_kernels::{Error as KernelError, Gpu};

use crate::{Device, Error, Result};

/// Copies up to this size go through the pinned staging buffer (so an
/// upload is an asynchronous DMA and the host thread goes on); larger ones
/// copy from pageable memory rather than pin that much host memory.
const STAGING_MAX: usize = 64 << 20;

/// One opened device: its kernel handle and its staging buffer.
pub(crate) struct DeviceState {
    pub(crate) gpu: Gpu,
    pub(crate) ordinal: usize,
    staging: Mutex<Option<PinnedHostSlice<u8>>>,
}

/// The opened devices, by ordinal. A device is opened on first use and
/// stays open for the life of the process (as PyTorch's contexts do).
static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<DeviceState>>>> = OnceLock::new();

/// The handle of `cuda:ordinal`, opening it on first use.
///
/// Errors ([`Error::Device`] naming `op`): no CUDA driver found, no such
/// device, or NVRTC missing (kernels cannot be compiled).
pub(crate) fn device(op: &'static str, ordinal: usize) -> Result<Arc<DeviceState>> {
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().map_err(|_| poisoned(op))?;
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let gpu = Gpu::new(ordinal).map_err(|e| Error::device(op, format!("cannot open cuda:{ordinal}: {e}")))?;
    let state = Arc::new(DeviceState {
        gpu,
        ordinal,
        staging: Mutex::new(None),
    });
    map.insert(ordinal, state.clone());
    Ok(state)
}

fn poisoned(op: &'static str) -> Error {
    Error::device(op, "a thread panicked while holding the CUDA device registry")
}

/// A kernel-crate error as a tensor error naming `op` and the device:
/// argument errors stay argument errors, everything else is a device error.
pub(crate) fn kernel_err(op: &'static str, dev: Device) -> impl Fn(KernelError) -> Error {
    move |e| match e {
        KernelError::Arg { .. } => Error::arg(op, format!("on {dev}: {e}")),
        e => Error::device(op, format!("on {dev}: {e}")),
    }
}

fn driver_err(op: &'static str, dev: Device) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::device(op, format!("CUDA driver error on {dev}: {e}"))
}

/// Bytes on one GPU. Freed (stream-ordered) when dropped.
pub(crate) struct DeviceBuffer {
    state: Arc<DeviceState>,
    data: CudaSlice<u8>,
    bytes: usize,
}

impl DeviceBuffer {
    /// `bytes` uninitialised bytes on `state`'s device, for kernels that
    /// write every element.
    pub(crate) fn alloc(op: &'static str, state: &Arc<DeviceState>, bytes: usize) -> Result<Self> {
        let stream = state.gpu.stream();
        // SAFETY: callers overwrite every byte before reading (kernel
        // outputs) or use `zeros`; 0-byte requests get one byte so the
        // allocation has an address.
        let data = unsafe { stream.alloc::<u8>(bytes.max(1)) }.map_err(driver_err(op, state.device()))?;
        Ok(DeviceBuffer {
            state: state.clone(),
            data,
            bytes,
        })
    }

    /// `bytes` zero bytes on `state`'s device.
    pub(crate) fn zeros(op: &'static str, state: &Arc<DeviceState>, bytes: usize) -> Result<Self> {
        let mut b = Self::alloc(op, state, bytes)?;
        let stream = state.gpu.stream().clone();
        stream
            .memset_zeros(&mut b.data)
            .map_err(driver_err(op, state.device()))?;
        Ok(b)
    }

    /// A device copy of `src`. Small copies are staged through pinned
    /// memory and return before the DMA finishes (stream order keeps every
    /// later kernel behind it).
    pub(crate) fn upload(op: &'static str, state: &Arc<DeviceState>, src: &[u8]) -> Result<Self> {
        let b = Self::alloc(op, state, src.len())?;
        let dev = state.device();
        let stream = state.gpu.stream();
        if src.is_empty() {
            return Ok(b);
        }
        let dst = b.addr();
        if src.len() > STAGING_MAX {
            // SAFETY: `dst` holds at least `src.len()` bytes; a pageable
            // copy returns only once `src` has been read.
            unsafe { cu::memcpy_htod_async(dst, src, stream.cu_stream()) }.map_err(driver_err(op, dev))?;
            return Ok(b);
        }
        let mut guard = state.staging.lock().map_err(|_| poisoned(op))?;
        let pinned = match guard.take() {
            Some(p) if p.len() >= src.len() => p,
            _ => {
                let cap = src.len().next_power_of_two().clamp(1 << 20, STAGING_MAX);
                // SAFETY: every byte copied out is written first, below.
                unsafe { state.gpu.context().alloc_pinned_with_flags::<u8>(cap, 0) }
                    .map_err(driver_err(op, dev))?
            }
        };
        let pinned = guard.insert(pinned);
        // Waits for the previous copy out of the staging buffer, if any.
        pinned.as_mut_slice().map_err(driver_err(op, dev))?[..src.len()].copy_from_slice(src);
        // SAFETY: used only on this stream; `_record_src` records the
        // buffer's event after the copy so the next writer waits for it.
        let (host, _record_src) = unsafe { pinned.stream_synced_slice(stream) };
        // SAFETY: `dst` holds at least `src.len()` bytes; the pinned buffer
        // outlives the copy (its drop and next write wait for the event).
        unsafe { cu::memcpy_htod_async(dst, &host[..src.len()], stream.cu_stream()) }
            .map_err(driver_err(op, dev))?;
        Ok(b)
    }

    /// The bytes `range` copied to the host (waits for every earlier launch).
    pub(crate) fn download(&self, op: &'static str, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let dev = self.state.device();
        let stream = self.state.gpu.stream();
        let n = range.len();
        let mut out = vec![0u8; n];
        if n == 0 {
            return Ok(out);
        }
        let (src, _record) = self.data.device_ptr(stream);
        let src = src + range.start as u64;
        if n > STAGING_MAX {
            // SAFETY: `range` lies inside the buffer (callers pass layout
            // ranges checked against the storage length).
            unsafe { cu::memcpy_dtoh_async(&mut out, src, stream.cu_stream()) }
                .map_err(driver_err(op, dev))?;
            stream.synchronize().map_err(driver_err(op, dev))?;
            return Ok(out);
        }
        let mut guard = self.state.staging.lock().map_err(|_| poisoned(op))?;
        let pinned = match guard.take() {
            Some(p) if p.len() >= n => p,
            _ => {
                let cap = n.next_power_of_two().clamp(1 << 20, STAGING_MAX);
                // SAFETY: only bytes the copy below writes are read.
                unsafe { self.state.gpu.context().alloc_pinned_with_flags::<u8>(cap, 0) }
                    .map_err(driver_err(op, dev))?
            }
        };
        let pinned = guard.insert(pinned);
        {
            // SAFETY: used only on this stream, as above.
            let (host, _record_dst) = unsafe { pinned.stream_synced_mut_slice(stream) };
            // SAFETY: as above.
            unsafe { cu::memcpy_dtoh_async(&mut host[..n], src, stream.cu_stream()) }
                .map_err(driver_err(op, dev))?;
        }
        stream.synchronize().map_err(driver_err(op, dev))?;
        out.copy_from_slice(&pinned.as_slice().map_err(driver_err(op, dev))?[..n]);
        Ok(out)
    }

    /// A device-to-device copy of the whole buffer.
    pub(crate) fn try_clone(&self, op: &'static str) -> Result<Self> {
        let mut b = Self::alloc(op, &self.state, self.bytes)?;
        let stream = self.state.gpu.stream().clone();
        stream
            .memcpy_dtod(&self.data, &mut b.data)
            .map_err(driver_err(op, self.state.device()))?;
        Ok(b)
    }

    /// The device address of byte 0.
    pub(crate) fn addr(&self) -> u64 {
        self.data.device_ptr(self.state.gpu.stream()).0
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

impl DeviceState {
    /// `Device::Cuda(ordinal)`.
    pub(crate) fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
}
