//! The CUDA runtime interface: the few device operations a tensor backend
//! needs (memory, copies, kernel launches, one library GEMM, a barrier),
//! with two implementations: [`crate::Gpu`], a real device through cudarc,
//! and, with the feature `cuda-emu`, [`crate::emu::Emu`], the CPU emulator
//! that runs the very same kernels compiled as C++.
//!
//! # Stream semantics
//!
//! A device has one in-order stream, and every method of [`Runtime`] is
//! ordered on it: a kernel sees every earlier copy and kernel complete, a
//! freed block may be handed out again at once because whatever runs next
//! runs after the work that used it. Only [`Runtime::copy_dtoh`] and
//! [`Runtime::synchronize`] make the host wait. The emulator runs each call
//! to completion before it returns, which is one valid schedule of that
//! stream (so its errors name the very call that caused them).
//!
//! # Which runtime a process uses
//!
//! [`open`] decides once per process, from `TESSERA_CUDA_EMU`:
//! - `1`: the emulator (an error without the feature `cuda-emu`);
//! - `0`: the driver only (without a GPU, opening a device is an error);
//! - unset: the driver when libcuda loads and reports at least one GPU,
//!   else the emulator when the feature `cuda-emu` is on, else the driver's
//!   "no CUDA driver found" / "no CUDA device" error.
//!
//! A machine with a GPU thus always uses it unless told otherwise, and a
//! build with `cuda-emu` (as `cargo test --all-features` is) runs its CUDA
//! paths on the emulator where there is none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::launch::{DevPtr, Launch};
use crate::ops::gemm::GemmShape;
use crate::{Error, Result};

/// Which implementation runs a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// A GPU through the CUDA driver; kernels compiled by NVRTC.
    Driver,
    /// The CPU emulator of `emu/` (feature `cuda-emu`): kernels compiled
    /// as C++ at build time, device memory in host allocations.
    Emulator,
}

/// What a backend needs to know about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The ordinal `cuda:N` was opened with.
    pub ordinal: usize,
    /// Driver or emulator.
    pub kind: RuntimeKind,
    /// The device's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Bytes of device memory.
    pub total_memory: usize,
    /// Streaming multiprocessors (the emulator reports one per host core).
    pub multiprocessors: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most dynamic shared memory one block may opt into, in bytes.
    pub max_shared_memory_per_block: u32,
    /// Threads per warp.
    pub warp_size: u32,
}

impl DeviceInfo {
    /// The architecture name NVRTC compiles for, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// One CUDA device: its memory, its stream, and the launch of this crate's
/// kernels on it. Addresses are device addresses as kernels see them.
///
/// The `unsafe` methods take raw device addresses: the caller guarantees
/// that every address range named lies inside a live allocation of this
/// runtime (the emulator checks, and returns [`Error::Emulator`]; a GPU
/// may fault or corrupt memory).
///
/// `RefUnwindSafe` because tensors hold their device, and a test (or a
/// user) may catch a panic across a borrowed tensor.
pub trait Runtime: Send + Sync + std::panic::RefUnwindSafe {
    /// The device's properties.
    fn info(&self) -> &DeviceInfo;

    /// `bytes` bytes of uninitialised device memory (at least one byte, so
    /// that a 0-byte request still has an address), aligned to 256 bytes.
    ///
    /// Errors: [`Error::OutOfMemory`] when the device cannot hold it, or a
    /// driver error.
    fn alloc(&self, bytes: usize) -> Result<u64>;

    /// Returns a block from [`Runtime::alloc`], ordered on the stream.
    ///
    /// Errors: a driver error, or (emulator) an address that is not a live
    /// allocation.
    ///
    /// # Safety
    /// `addr` comes from `alloc` on this runtime and is not used afterwards.
    unsafe fn free(&self, addr: u64) -> Result<()>;

    /// Copies `src` to `dst`; returns once `src` may be reused (the copy
    /// itself may still be in flight, ordered before later work).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies in one live allocation.
    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()>;

    /// Copies `dst.len()` bytes at `src` into `dst`, after every earlier
    /// operation on the stream (waits for them).
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies in one live allocation.
    unsafe fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()>;

    /// Copies `bytes` bytes from `src` to `dst` on the device.
    ///
    /// # Safety
    /// Both ranges lie in live allocations and do not overlap.
    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;

    /// Sets `bytes` bytes at `dst` to `value`.
    ///
    /// # Safety
    /// The range lies in one live allocation.
    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()>;

    /// Runs `l` (a [`Launch`] from one of the typed wrappers of
    /// [`crate::ops`]); a grid with a zero dimension does nothing.
    ///
    /// Errors: compilation or driver failures; on the emulator also the
    /// faults it catches (see [`Error::Emulator`]).
    ///
    /// # Safety
    /// Every pointer in `l` addresses live memory of this device with at
    /// least the length given to the wrapper that built `l`; buffers the
    /// kernel writes are not used by anything else until it has run.
    unsafe fn launch(&self, l: &Launch) -> Result<()>;

    /// The f32 GEMM of `g` (row-major, as [`crate::ops::gemm::gemm`]) by
    /// the vendor library: cuBLAS on a GPU, an f32 reference on the
    /// emulator.
    ///
    /// Errors: shapes and lengths as [`crate::ops::gemm::check_sgemm`],
    /// sizes beyond cuBLAS's `i32`, cuBLAS missing or failing.
    ///
    /// # Safety
    /// As [`Runtime::launch`]: `a`, `b`, `c` address live memory of their
    /// stated lengths, `c` written by nothing else meanwhile.
    unsafe fn sgemm(&self, g: &GemmShape, a: DevPtr<f32>, b: DevPtr<f32>, c: DevPtr<f32>) -> Result<()>;

    /// Waits until every operation issued so far has finished.
    ///
    /// Errors: a driver error (an earlier asynchronous failure surfaces here).
    fn synchronize(&self) -> Result<()>;
}

/// `cuda:ordinal` opened with the runtime this process uses (see the
/// module docs), shared by every caller: the same device is opened once.
///
/// Errors: [`Error::NoDriver`], [`Error::NoDevice`] (no such device, or
/// `TESSERA_CUDA_EMU` names an emulator this build lacks or is not `0` or
/// `1`), [`Error::NoNvrtc`].
pub fn open(ordinal: usize) -> Result<Arc<dyn Runtime>> {
    static OPEN: OnceLock<Mutex<HashMap<usize, Arc<dyn Runtime>>>> = OnceLock::new();
    let mut open = OPEN
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = open.get(&ordinal) {
        return Ok(rt.clone());
    }
    let rt: Arc<dyn Runtime> = match selected()? {
        RuntimeKind::Driver => Arc::new(crate::Gpu::new(ordinal)?),
        RuntimeKind::Emulator => emulator(ordinal)?,
    };
    open.insert(ordinal, rt.clone());
    Ok(rt)
}

/// The runtime [`open`] uses in this process, decided on first call.
///
/// Errors: `TESSERA_CUDA_EMU` set to something other than `0` or `1`, or
/// to `1` in a build without the feature `cuda-emu` ([`Error::NoDevice`]).
pub fn selected() -> Result<RuntimeKind> {
    static KIND: OnceLock<std::result::Result<RuntimeKind, String>> = OnceLock::new();
    KIND.get_or_init(select).clone().map_err(Error::NoDevice)
}

/// The number of devices [`open`] can open (0 without a driver or emulator).
pub fn device_count() -> usize {
    match selected() {
        Ok(RuntimeKind::Driver) => crate::gpu::device_count(),
        Ok(RuntimeKind::Emulator) => emulated_devices(),
        Err(_) => 0,
    }
}

fn select() -> std::result::Result<RuntimeKind, String> {
    let forced = match std::env::var("TESSERA_CUDA_EMU").as_deref() {
        Err(_) | Ok("") => None,
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        Ok(v) => return Err(format!("TESSERA_CUDA_EMU must be 0 or 1, got {v:?}")),
    };
    let emulator = cfg!(feature = "cuda-emu");
    match forced {
        Some(true) if !emulator => Err(
            "TESSERA_CUDA_EMU=1 asks for the emulated device, but this build lacks the feature `cuda-emu`"
                .into(),
        ),
        Some(true) => Ok(RuntimeKind::Emulator),
        Some(false) => Ok(RuntimeKind::Driver),
        None if emulator && crate::gpu::device_count() == 0 => Ok(RuntimeKind::Emulator),
        None => Ok(RuntimeKind::Driver),
    }
}

#[cfg(feature = "cuda-emu")]
fn emulator(ordinal: usize) -> Result<Arc<dyn Runtime>> {
    Ok(Arc::new(crate::emu::Emu::new(ordinal)?))
}

#[cfg(not(feature = "cuda-emu"))]
fn emulator(_ordinal: usize) -> Result<Arc<dyn Runtime>> {
    Err(Error::NoDevice("this build lacks the feature `cuda-emu`".into()))
}

#[cfg(feature = "cuda-emu")]
fn emulated_devices() -> usize {
    crate::emu::device_count()
}

#[cfg(not(feature = "cuda-emu"))]
fn emulated_devices() -> usize {
    0
}

#[cfg(all(test, feature = "cuda-emu"))]
#[path = "runtime_tests.rs"]
mod tests;
