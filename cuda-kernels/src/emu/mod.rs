//! The emulated CUDA device (feature `cuda-emu`): a [`Runtime`] that runs
//! this crate's kernels on the CPU.
//!
//! The build script compiles every kernel family of `src/kernels/` as C++
//! with `emu/cuda_emu.h` into a static library: each CUDA thread is a
//! user-space fiber, the blocks of a grid run one after another, and
//! threads switch at block barriers and warp collectives in a selectable
//! [`ThreadOrder`], so a result that depends on the order exposes a missing
//! barrier. Device memory is host memory ([`Emu::alloc`] hands out host
//! addresses) with guard bytes around every block; the device's one stream
//! is a lock, and every call runs to completion before it returns.
//!
//! The emulator reports what the hardware would not (or would as a crash)
//! as [`Error::Emulator`]: a kernel writing outside its buffers (guard bytes
//! checked after every launch), a divergent `__syncthreads`, a deadlock, a
//! lane leaving a warp collective, a copy or free outside the live
//! allocations, a launch whose arguments do not match the kernel's
//! parameters. It cannot tell the memory model, races between blocks,
//! timing, occupancy or bank conflicts: those need a GPU.
//!
//! Environment: `TESSERA_EMU_ORDER` (`forward`, the default; `reverse`;
//! `random` or `random:<seed>`) sets the thread order of devices opened
//! afterwards, `TESSERA_EMU_DEVICES` how many devices exist (default 2),
//! `TESSERA_EMU_MEMORY` the bytes of memory of each (default 8 GiB).
//! [`with_thread_order`] overrides the order for the launches of one
//! thread, as tests that compare orders do.

mod memory;
mod sgemm;

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use memory::Memory;

use crate::launch::{DevPtr, Launch};
use crate::ops::gemm::GemmShape;
use crate::runtime::{DeviceInfo, Runtime, RuntimeKind};
use crate::{Error, Result};

extern "C" {
    /// `emu/runtime.cpp`: runs a registered kernel over its whole grid on
    /// the calling thread; null on success, else a message owned by the
    /// calling thread.
    fn emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        smem: usize,
        args: *mut *mut c_void,
        arg_sizes: *const usize,
        nargs: usize,
        mode: u64,
    ) -> *const c_char;
}

/// Compute capability the emulator claims: sm_90 (227 KiB of shared memory
/// per block, as `emu_launch` enforces).
const COMPUTE_CAPABILITY: (u32, u32) = (9, 0);
const MAX_SHARED_MEMORY: u32 = 232_448;
const DEFAULT_DEVICES: usize = 2;
const DEFAULT_MEMORY: usize = 8 << 30;

/// The order in which the runnable threads of a block go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThreadOrder {
    /// Lowest thread index first.
    Forward,
    /// Highest thread index first.
    Reverse,
    /// A fresh random priority at every scheduling round, drawn from this
    /// seed (mixed with the launch's sequence number).
    Random(u64),
}

impl ThreadOrder {
    /// The order `TESSERA_EMU_ORDER` names (`forward` when unset).
    ///
    /// Errors: any other value than `forward`, `reverse`, `random` or
    /// `random:<seed>` ([`Error::NoDevice`], naming the value).
    pub fn from_env() -> Result<Self> {
        match std::env::var("TESSERA_EMU_ORDER") {
            Err(_) => Ok(ThreadOrder::Forward),
            Ok(v) => v.parse(),
        }
    }
}

impl std::str::FromStr for ThreadOrder {
    type Err = Error;

    /// Parses `forward`, `reverse`, `random` (seed 0) or `random:<seed>`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::NoDevice(format!(
                "TESSERA_EMU_ORDER must be forward, reverse, random or random:<seed>, got {s:?}"
            ))
        };
        match s.trim() {
            "forward" | "" => Ok(ThreadOrder::Forward),
            "reverse" => Ok(ThreadOrder::Reverse),
            "random" => Ok(ThreadOrder::Random(0)),
            other => match other.strip_prefix("random:") {
                Some(seed) => seed.parse().map(ThreadOrder::Random).map_err(|_| bad()),
                None => Err(bad()),
            },
        }
    }
}

thread_local! {
    static THREAD_ORDER: Cell<Option<ThreadOrder>> = const { Cell::new(None) };
}

/// Runs `f` with every kernel this thread launches on an emulated device
/// scheduled in `order` (whatever the device's own order), and returns its
/// result. Nested calls restore the outer order on return or unwind.
pub fn with_thread_order<R>(order: ThreadOrder, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<ThreadOrder>);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_ORDER.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(THREAD_ORDER.with(|o| o.replace(Some(order))));
    f()
}

/// The number of emulated devices: `TESSERA_EMU_DEVICES`, default 2 (0
/// when the variable is not a number: then no device opens, and
/// [`Emu::new`] says why).
pub fn device_count() -> usize {
    env_number("TESSERA_EMU_DEVICES", DEFAULT_DEVICES).unwrap_or(0)
}

/// The number in the environment variable `name`, `default` when unset.
///
/// Errors: a value that is not a non-negative integer ([`Error::NoDevice`]).
fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::NoDevice(format!("{name} must be a non-negative integer, got {v:?}"))),
    }
}

/// One emulated CUDA device.
pub struct Emu {
    info: DeviceInfo,
    order: ThreadOrder,
    /// The stream: held for the whole of every call, so calls run one at a
    /// time in the order they take it.
    memory: Mutex<Memory>,
    launches: AtomicU64,
}

impl Emu {
    /// Opens emulated device `ordinal` with the thread order and memory
    /// size the environment gives (see the module docs).
    ///
    /// Errors: [`Error::NoDevice`] for an ordinal beyond
    /// `TESSERA_EMU_DEVICES`, or a malformed `TESSERA_EMU_DEVICES`,
    /// `TESSERA_EMU_MEMORY` or `TESSERA_EMU_ORDER`.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = env_number("TESSERA_EMU_DEVICES", DEFAULT_DEVICES)?;
        if ordinal >= count {
            return Err(Error::NoDevice(format!(
                "cuda:{ordinal} does not exist: the emulator has {count} devices (TESSERA_EMU_DEVICES)"
            )));
        }
        let memory = env_number("TESSERA_EMU_MEMORY", DEFAULT_MEMORY)?;
        Ok(Self::with_order(ordinal, ThreadOrder::from_env()?, memory))
    }

    /// An emulated device of `memory` bytes scheduling threads in `order`,
    /// independent of the environment and of the devices [`crate::runtime::open`]
    /// hands out (its memory is its own).
    pub fn with_order(ordinal: usize, order: ThreadOrder, memory: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Emu {
            info: DeviceInfo {
                ordinal,
                kind: RuntimeKind::Emulator,
                name: "tessera CUDA emulator".into(),
                compute_capability: COMPUTE_CAPABILITY,
                total_memory: memory,
                multiprocessors: u32::try_from(cores).unwrap_or(u32::MAX),
                max_threads_per_block: 1024,
                max_shared_memory_per_block: MAX_SHARED_MEMORY,
                warp_size: 32,
            },
            order,
            memory: Mutex::new(Memory::new(memory)),
            launches: AtomicU64::new(0),
        }
    }

    /// The device's own thread order (a [`with_thread_order`] scope
    /// overrides it for one thread's launches).
    pub fn order(&self) -> ThreadOrder {
        self.order
    }

    /// Bytes of emulated device memory in live allocations.
    pub fn used_bytes(&self) -> usize {
        self.stream().used()
    }

    fn stream(&self) -> MutexGuard<'_, Memory> {
        // Every call leaves the table consistent before it can panic.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `mode` of `emu_launch` for the next launch from this thread.
    pub(crate) fn mode(&self) -> u64 {
        match THREAD_ORDER.with(Cell::get).unwrap_or(self.order) {
            ThreadOrder::Forward => 0,
            ThreadOrder::Reverse => 1,
            ThreadOrder::Random(seed) => {
                let n = self.launches.fetch_add(1, Ordering::Relaxed);
                // splitmix64 of seed and sequence number; modes 0 and 1 are taken.
                let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)).max(2)
            }
        }
    }
}

fn launch_err(l: &Launch, msg: impl std::fmt::Display) -> Error {
    Error::Emulator {
        op: "launch",
        msg: format!("{}: {msg}", l.kernel),
    }
}

impl Runtime for Emu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.stream().alloc(bytes)
    }

    unsafe fn free(&self, addr: u64) -> Result<()> {
        self.stream().free(addr)
    }

    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mem = self.stream();
        mem.check("copy_htod", dst, src.len())?;
        // SAFETY: the destination lies in a live block (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let mem = self.stream();
        mem.check("copy_dtoh", src, dst.len())?;
        // SAFETY: the source lies in a live block (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let mem = self.stream();
        mem.check("copy_dtod", src, bytes)?;
        mem.check("copy_dtod", dst, bytes)?;
        // SAFETY: both ranges lie in live blocks (checked above); `copy`
        // tolerates the overlap the contract forbids anyway.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        let mem = self.stream();
        mem.check("memset", dst, bytes)?;
        // SAFETY: the range lies in a live block (checked above).
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
        Ok(())
    }

    unsafe fn launch(&self, l: &Launch) -> Result<()> {
        if l.grid.contains(&0) {
            return Ok(());
        }
        if l.grid[1] > 65_535 || l.grid[2] > 65_535 || l.grid[0] > i32::MAX as u32 {
            return Err(launch_err(
                l,
                format!("grid {:?} beyond the device's limits", l.grid),
            ));
        }
        let name = CString::new(l.kernel.as_str()).map_err(|e| launch_err(l, e))?;
        let mut args: Vec<Vec<u8>> = l.args.iter().map(|a| a.0.clone()).collect();
        let sizes: Vec<usize> = args.iter().map(Vec::len).collect();
        let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(|a| a.as_mut_ptr() as *mut c_void).collect();
        let mode = self.mode();
        let mut mem = self.stream();
        // SAFETY: `emu_launch` reads `ptrs.len()` arguments of the sizes
        // given (checked against the kernel's parameters first); the
        // pointers inside them address live blocks (caller).
        let err = unsafe {
            emu_launch(
                name.as_ptr(),
                l.grid.as_ptr(),
                l.block.as_ptr(),
                l.shared_mem as usize,
                ptrs.as_mut_ptr(),
                sizes.as_ptr(),
                sizes.len(),
                mode,
            )
        };
        if !err.is_null() {
            // SAFETY: a NUL-terminated message owned by this thread, valid
            // until its next launch.
            let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
            return Err(launch_err(l, msg));
        }
        if let Some(msg) = mem.corrupted_guard() {
            mem.repair_guards();
            return Err(launch_err(l, msg));
        }
        Ok(())
    }

    unsafe fn sgemm(&self, g: &GemmShape, a: DevPtr<f32>, b: DevPtr<f32>, c: DevPtr<f32>) -> Result<()> {
        let mem = self.stream();
        crate::ops::gemm::check_sgemm(g, &a, &b, &c)?;
        for p in [&a, &b, &c] {
            mem.check("sgemm", p.addr(), p.len().saturating_mul(4))?;
        }
        // SAFETY: the three ranges lie in live blocks and hold what `g`
        // reaches (checked above); C is written by nothing else (caller).
        unsafe { sgemm::reference(g, a, b, c) };
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        // Every call has finished by the time it returned.
        Ok(())
    }
}
