//! Device memory of a [`Gpu`]: stream-ordered allocation, and copies, small
//! ones through a pinned staging buffer so an upload is an asynchronous DMA
//! and the host thread goes on.

use cudarc::driver::{result as cu, sys, DriverError, HostSlice, PinnedHostSlice};

use super::{driver_err, poisoned, Gpu};
use crate::{Error, Result};

/// Copies up to this size go through the pinned staging buffer; larger ones
/// copy from pageable memory rather than pin that much host memory.
const STAGING_MAX: usize = 64 << 20;

fn alloc_err(bytes: usize) -> impl Fn(DriverError) -> Error {
    move |e| match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
            bytes,
            msg: e.to_string(),
        },
        _ => Error::Driver {
            op: "alloc",
            msg: e.to_string(),
        },
    }
}

impl Gpu {
    /// Stream-ordered `cuMemAllocAsync` where the device supports memory
    /// pools, else `cuMemAlloc`.
    pub(super) fn alloc_bytes(&self, bytes: usize) -> Result<u64> {
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        let bytes = bytes.max(1);
        // SAFETY: plain allocations on this context's stream.
        unsafe {
            if self.ctx.has_async_alloc() {
                cu::malloc_async(self.stream.cu_stream(), bytes)
            } else {
                cu::malloc_sync(bytes)
            }
        }
        .map_err(alloc_err(bytes))
    }

    /// # Safety
    /// `addr` comes from [`Gpu::alloc_bytes`] and is not used afterwards
    /// (except by work already on the stream).
    pub(super) unsafe fn free_bytes(&self, addr: u64) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        if self.ctx.has_async_alloc() {
            // SAFETY: stream-ordered: the block is released after earlier work.
            unsafe { cu::free_async(addr, self.stream.cu_stream()) }.map_err(driver_err("free"))
        } else {
            // A synchronous free must wait for the kernels that may use the block.
            self.stream.synchronize().map_err(driver_err("free"))?;
            // SAFETY: as promised by the caller, and nothing on the stream uses it any more.
            unsafe { cu::free_sync(addr) }.map_err(driver_err("free"))
        }
    }

    /// # Safety
    /// `dst .. dst + src.len()` lies in a live allocation of this device.
    pub(super) unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        let stream = &self.stream;
        if src.len() > STAGING_MAX {
            // SAFETY: `dst` holds `src.len()` bytes; a pageable copy returns
            // only once `src` has been read.
            return unsafe { cu::memcpy_htod_async(dst, src, stream.cu_stream()) }
                .map_err(driver_err("copy_htod"));
        }
        let mut guard = self.staging.lock().map_err(|_| poisoned())?;
        let pinned = self.staging_buffer(guard.take(), src.len())?;
        let pinned = guard.insert(pinned);
        // Waits for the previous copy out of the staging buffer, if any.
        pinned.as_mut_slice().map_err(driver_err("copy_htod"))?[..src.len()].copy_from_slice(src);
        // SAFETY: used only on this stream; `_record_src` records the
        // buffer's event after the copy so the next writer waits for it.
        let (host, _record_src) = unsafe { pinned.stream_synced_slice(stream) };
        // SAFETY: `dst` holds `src.len()` bytes; the pinned buffer outlives
        // the copy (its drop and next write wait for the event).
        unsafe { cu::memcpy_htod_async(dst, &host[..src.len()], stream.cu_stream()) }
            .map_err(driver_err("copy_htod"))
    }

    /// # Safety
    /// `src .. src + dst.len()` lies in a live allocation of this device.
    pub(super) unsafe fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        let stream = &self.stream;
        if n > STAGING_MAX {
            // SAFETY: the range is live device memory (caller).
            unsafe { cu::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
                .map_err(driver_err("copy_dtoh"))?;
            return stream.synchronize().map_err(driver_err("copy_dtoh"));
        }
        let mut guard = self.staging.lock().map_err(|_| poisoned())?;
        let pinned = self.staging_buffer(guard.take(), n)?;
        let pinned = guard.insert(pinned);
        {
            // SAFETY: used only on this stream, as in `htod`.
            let (host, _record_dst) = unsafe { pinned.stream_synced_mut_slice(stream) };
            // SAFETY: the range is live device memory (caller).
            unsafe { cu::memcpy_dtoh_async(&mut host[..n], src, stream.cu_stream()) }
                .map_err(driver_err("copy_dtoh"))?;
        }
        stream.synchronize().map_err(driver_err("copy_dtoh"))?;
        dst.copy_from_slice(&pinned.as_slice().map_err(driver_err("copy_dtoh"))?[..n]);
        Ok(())
    }

    /// # Safety
    /// Both ranges lie in live allocations of this device.
    pub(super) unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        // SAFETY: as promised by the caller.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("copy_dtod"))
    }

    /// # Safety
    /// The range lies in a live allocation of this device.
    pub(super) unsafe fn fill(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        // SAFETY: as promised by the caller.
        unsafe { cu::memset_d8_async(dst, value, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("memset"))
    }

    /// The staging buffer `current` if it holds `n` bytes, else a new one.
    fn staging_buffer(&self, current: Option<PinnedHostSlice<u8>>, n: usize) -> Result<PinnedHostSlice<u8>> {
        match current {
            Some(p) if p.len() >= n => Ok(p),
            _ => {
                let cap = n.next_power_of_two().clamp(1 << 20, STAGING_MAX);
                // SAFETY: every byte read from it is written first (by the
                // host before an upload, by the copy before a download).
                unsafe { self.ctx.alloc_pinned_with_flags::<u8>(cap, 0) }.map_err(driver_err("alloc_pinned"))
            }
        }
    }
}
