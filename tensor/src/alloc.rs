//! The caching allocator behind CPU storage.
//!
//! Large blocks freed to the system are unmapped, and the next allocation of
//! that size page-faults on every 4 KiB page as it is first written — on the
//! machines we measure that costs a training step more than its arithmetic.
//! So freed blocks of at least [`MIN_CACHED`] bytes are kept in per-size-class
//! free lists and handed out again. The cache is bounded (by default 4 GiB,
//! `TESSERA_CPU_CACHE_BYTES` overrides it at start-up) and can be emptied with
//! [`release_cached`] or turned off with [`set_caching`].
//!
//! Memory is never handed out uninitialised: new blocks come zeroed from the
//! system, reused blocks still hold the values last written to them.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Alignment of every block: a cache line, and enough for AVX-512 loads.
pub const ALIGN: usize = 64;

/// Blocks smaller than this go straight to the system allocator, which
/// already recycles small blocks without page faults.
pub const MIN_CACHED: usize = 64 * 1024;

const DEFAULT_LIMIT: usize = 4 << 30;

static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
static CACHING: AtomicBool = AtomicBool::new(true);

struct Cache {
    free: HashMap<usize, Vec<SendPtr>>,
    limit: usize,
}

struct SendPtr(NonNull<u8>);
// SAFETY: a cached block is plain memory owned by the cache alone.
unsafe impl Send for SendPtr {}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let limit = std::env::var("TESSERA_CPU_CACHE_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_LIMIT);
        Mutex::new(Cache {
            free: HashMap::new(),
            limit,
        })
    })
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    // The cache holds no invariant a panic elsewhere could break.
    cache().lock().unwrap_or_else(|e| e.into_inner())
}

/// The capacity actually reserved for a request of `bytes`: requests of
/// [`MIN_CACHED`] and above round up to one of four classes per power of two
/// (at most 25% slack), so blocks of nearby sizes are interchangeable.
/// Sizes whose class would overflow saturate to `usize::MAX`, which no
/// allocation satisfies.
pub fn size_class(bytes: usize) -> usize {
    if bytes < MIN_CACHED {
        return bytes.max(1).next_multiple_of(ALIGN);
    }
    let pow = usize::BITS - 1 - bytes.leading_zeros();
    let step = 1usize << (pow - 2);
    bytes.checked_next_multiple_of(step).unwrap_or(usize::MAX)
}

/// A block of `size_class(bytes)` bytes aligned to [`ALIGN`], and whether
/// it is known to be zeroed (fresh from the system) rather than reused.
/// `None` when the system cannot provide it (or the size exceeds
/// `isize::MAX`): callers turn that into an error instead of aborting.
pub(crate) fn allocate(bytes: usize) -> Option<(NonNull<u8>, bool)> {
    let cap = size_class(bytes);
    if cap >= MIN_CACHED {
        if let Some(p) = lock().free.get_mut(&cap).and_then(Vec::pop) {
            CACHED_BYTES.fetch_sub(cap, Ordering::Relaxed);
            return Some((p.0, false));
        }
    }
    let layout = Layout::from_size_align(cap, ALIGN).ok()?;
    // SAFETY: cap > 0 and the layout is valid.
    let p = unsafe { alloc_zeroed(layout) };
    if p.is_null() && cached_bytes() > 0 {
        // Cached blocks of other sizes may be what stands in the way.
        release_cached();
        // SAFETY: as above.
        return NonNull::new(unsafe { alloc_zeroed(layout) }).map(|p| (p, true));
    }
    NonNull::new(p).map(|p| (p, true))
}

/// Returns a block obtained from [`allocate`] for `bytes`.
///
/// # Safety
/// `ptr` must come from `allocate(bytes)` and not be used afterwards.
pub(crate) unsafe fn free(ptr: NonNull<u8>, bytes: usize) {
    let cap = size_class(bytes);
    if cap >= MIN_CACHED && CACHING.load(Ordering::Relaxed) {
        let mut c = lock();
        if CACHED_BYTES.load(Ordering::Relaxed) + cap <= c.limit {
            c.free.entry(cap).or_default().push(SendPtr(ptr));
            CACHED_BYTES.fetch_add(cap, Ordering::Relaxed);
            return;
        }
    }
    // SAFETY: allocated by `allocate` with this layout.
    unsafe {
        dealloc(
            ptr.as_ptr(),
            Layout::from_size_align(cap, ALIGN).expect("valid layout"),
        )
    };
}

/// Bytes held in the cache's free lists right now.
pub fn cached_bytes() -> usize {
    CACHED_BYTES.load(Ordering::Relaxed)
}

/// Returns every cached block to the system.
pub fn release_cached() {
    let mut c = lock();
    for (cap, blocks) in c.free.drain() {
        for p in blocks {
            CACHED_BYTES.fetch_sub(cap, Ordering::Relaxed);
            // SAFETY: cached blocks were allocated with this layout and are unused.
            unsafe {
                dealloc(
                    p.0.as_ptr(),
                    Layout::from_size_align(cap, ALIGN).expect("valid layout"),
                )
            };
        }
    }
}

/// Turns caching of freed blocks on or off (off also empties the cache);
/// returns the previous setting. Benchmarks use it to show what caching buys.
pub fn set_caching(enabled: bool) -> bool {
    let prev = CACHING.swap(enabled, Ordering::Relaxed);
    if !enabled {
        release_cached();
    }
    prev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_bound_slack_and_align() {
        for bytes in [
            1,
            63,
            64,
            65,
            4096,
            MIN_CACHED - 1,
            MIN_CACHED,
            MIN_CACHED + 1,
            1 << 20,
            (1 << 20) + 3,
            123_456_789,
        ] {
            let c = size_class(bytes);
            assert!(c >= bytes && c.is_multiple_of(ALIGN), "{bytes} -> {c}");
            if bytes >= MIN_CACHED {
                assert!(c - bytes <= bytes / 4, "{bytes} -> {c}");
            }
        }
    }

    #[test]
    fn impossible_sizes_are_refused_not_aborted() {
        assert_eq!(size_class(usize::MAX), usize::MAX);
        for bytes in [usize::MAX, isize::MAX as usize, 1 << 60] {
            assert!(allocate(bytes).is_none(), "{bytes}");
        }
    }

    #[test]
    fn freed_blocks_are_reused() {
        let bytes = 3 << 20;
        let (p, fresh) = allocate(bytes).unwrap();
        assert!(fresh || !CACHING.load(Ordering::Relaxed) || cached_bytes() > 0);
        // SAFETY: from allocate(bytes), not used again.
        unsafe { free(p, bytes) };
        let (q, fresh) = allocate(bytes).unwrap();
        // Another test thread may have taken the block in between; then it is fresh.
        assert!(q == p || fresh);
        // SAFETY: as above.
        unsafe { free(q, bytes) };
    }
}
