//! A caching allocator over a [`Runtime`]'s device memory, as PyTorch's
//! CUDA caching allocator: `cudaMalloc`/`cudaFree` synchronise the device
//! and cost far more than a kernel, so freed blocks are kept in free lists
//! by size class and handed out again.
//!
//! Requests round up to a size class (multiples of 512 bytes below 1 MiB,
//! four classes per power of two above: at most 25% slack), and a free
//! block serves any later request of its class. Reusing a block at once is
//! safe because the device has one in-order stream (see
//! [`crate::runtime`]): whatever runs next runs after the work that used
//! it. When the device is out of memory the cache is emptied and the
//! allocation retried once, so cached blocks never cause an OOM.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result, Runtime};

/// Granularity of the small size classes (and the smallest block).
pub const MIN_BLOCK: usize = 512;

/// Requests from this size up round to four classes per power of two.
const LARGE: usize = 1 << 20;

/// Counters of a [`CachingAllocator`], in bytes of size-class blocks (what
/// PyTorch's `torch.cuda.memory_stats` reports as `allocated_bytes`,
/// `reserved_bytes` and their peaks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks handed out and not yet freed.
    pub allocated: usize,
    /// Bytes held from the device: allocated plus cached.
    pub reserved: usize,
    /// The most `allocated` has been since creation or the last
    /// [`CachingAllocator::reset_peak`].
    pub peak_allocated: usize,
    /// The most `reserved` has been, likewise.
    pub peak_reserved: usize,
    /// Blocks handed out and not yet freed.
    pub active_blocks: usize,
    /// Requests served so far.
    pub allocations: u64,
    /// Requests served from the cache (no device allocation).
    pub cache_hits: u64,
    /// Allocations asked of the device.
    pub device_allocations: u64,
    /// Blocks given back to the device (by [`CachingAllocator::empty_cache`]
    /// or an out-of-memory retry).
    pub device_frees: u64,
}

impl MemoryStats {
    /// Bytes held in the free lists (`reserved - allocated`).
    pub fn cached(&self) -> usize {
        self.reserved - self.allocated
    }
}

/// A block handed out by [`CachingAllocator::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Device address of its first byte (256-byte aligned).
    pub addr: u64,
    /// Its size class: bytes usable from `addr`, at least the request.
    pub size: usize,
}

/// The caching allocator of one device. Thread-safe.
pub struct CachingAllocator {
    rt: Arc<dyn Runtime>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Cached blocks by size class.
    free: BTreeMap<usize, Vec<u64>>,
    /// Size class of every block handed out, by address.
    live: HashMap<u64, usize>,
    stats: MemoryStats,
}

/// The size class a request of `bytes` is served from: multiples of
/// [`MIN_BLOCK`] below 1 MiB, four classes per power of two above.
///
/// Errors: a request so large its class would overflow `usize`.
pub fn size_class(bytes: usize) -> Result<usize> {
    let too_large = || Error::OutOfMemory {
        bytes,
        msg: "the request exceeds the address space".into(),
    };
    let bytes = bytes.max(1);
    if bytes < LARGE {
        return Ok(bytes.next_multiple_of(MIN_BLOCK));
    }
    let pow = usize::BITS - 1 - bytes.leading_zeros();
    let step = 1usize << (pow - 2);
    bytes.checked_next_multiple_of(step).ok_or_else(too_large)
}

impl CachingAllocator {
    /// An empty cache over `rt`'s memory.
    pub fn new(rt: Arc<dyn Runtime>) -> Self {
        CachingAllocator {
            rt,
            state: Mutex::new(State::default()),
        }
    }

    /// The device the memory comes from.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    /// A block of at least `bytes` bytes (uninitialised: fresh device
    /// memory, or whatever the block's last user left in it).
    ///
    /// Errors: [`Error::OutOfMemory`] when the device cannot hold it even
    /// after the cache is emptied, or a driver error.
    pub fn alloc(&self, bytes: usize) -> Result<Block> {
        let size = size_class(bytes)?;
        let mut st = self.lock();
        st.stats.allocations += 1;
        let cached = st.free.get_mut(&size).and_then(Vec::pop);
        let addr = match cached {
            Some(addr) => {
                st.stats.cache_hits += 1;
                addr
            }
            None => {
                let addr = match self.rt.alloc(size) {
                    Err(Error::OutOfMemory { .. }) if st.stats.cached() > 0 => {
                        self.release(&mut st)?;
                        self.rt.alloc(size)?
                    }
                    r => r?,
                };
                st.stats.device_allocations += 1;
                st.stats.reserved += size;
                st.stats.peak_reserved = st.stats.peak_reserved.max(st.stats.reserved);
                addr
            }
        };
        st.live.insert(addr, size);
        st.stats.allocated += size;
        st.stats.active_blocks += 1;
        st.stats.peak_allocated = st.stats.peak_allocated.max(st.stats.allocated);
        Ok(Block { addr, size })
    }

    /// Returns the block at `addr` to the cache; the next request of its
    /// size class may get it at once.
    ///
    /// Errors: `addr` is not a block handed out by this allocator (freed
    /// twice, or never allocated); nothing changes then.
    ///
    /// # Safety
    /// Nothing uses the block after this call except work already issued
    /// to the device's stream.
    pub unsafe fn free(&self, addr: u64) -> Result<()> {
        let mut st = self.lock();
        let size = st.live.remove(&addr).ok_or_else(|| {
            Error::arg(
                "free",
                format!("{addr:#x} is not a live block of this allocator (freed twice, or never allocated)"),
            )
        })?;
        st.free.entry(size).or_default().push(addr);
        st.stats.allocated -= size;
        st.stats.active_blocks -= 1;
        Ok(())
    }

    /// Gives every cached block back to the device (live blocks stay), as
    /// `torch.cuda.empty_cache()`.
    ///
    /// Errors: a driver error freeing a block (the blocks not yet given
    /// back stay cached).
    pub fn empty_cache(&self) -> Result<()> {
        let mut st = self.lock();
        self.release(&mut st)
    }

    /// The counters now.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Restarts the peaks from the current values, as
    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&self) {
        let mut st = self.lock();
        st.stats.peak_allocated = st.stats.allocated;
        st.stats.peak_reserved = st.stats.reserved;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent before anything can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, st: &mut State) -> Result<()> {
        while let Some(mut entry) = st.free.first_entry() {
            let size = *entry.key();
            while let Some(addr) = entry.get_mut().pop() {
                // SAFETY: a cached block is used by nothing but work already
                // on the stream, which the runtime's free is ordered after.
                if let Err(e) = unsafe { self.rt.free(addr) } {
                    entry.get_mut().push(addr);
                    return Err(e);
                }
                st.stats.reserved -= size;
                st.stats.device_frees += 1;
            }
            entry.remove();
        }
        Ok(())
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // Live blocks belong to buffers that hold the allocator alive, so
        // none are left; a failing free cannot be reported from a drop.
        let _ = self.empty_cache();
    }
}

#[cfg(all(test, feature = "cuda-emu"))]
#[path = "caching_tests.rs"]
mod tests;
