//! The caching allocator behind CPU storage.
//!
//! Large blocks freed to the system are unmapped, and the next allocation of
//! that size page-faults on every page as it is first written — on the
//! machines we measure that costs a training step more than its arithmetic.
//! So freed blocks of at least [`MIN_CACHED`] bytes are kept in per-size-class
//! free lists and handed out again. The cache is bounded (by default 4 GiB,
//! `TESSERA_CPU_CACHE_BYTES` overrides it at start-up) and can be emptied with
//! [`release_cached`] or turned off with [`set_caching`].
//!
//! The cache hardly raises the high-water mark of the blocks it manages:
//! blocks in use plus blocks cached stay within the most ever in use at
//! once plus a [`headroom`], and a request the cache cannot serve first
//! returns cached blocks of other sizes beyond that. A training step's forward takes its activations
//! from the blocks its last backward freed, but the backward's gradient
//! blocks are not kept idle beside the next forward's activations (ResNet-18
//! at batch 128 kept 219 MiB idle at its peak before). Those blocks are
//! mapped anonymously, so what the cache returns leaves the resident set,
//! and blocks of 2 MiB and more ask for transparent huge pages, which make
//! the first touch of a fresh block cheap.
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

/// Blocks of at least this many bytes are advised to use transparent huge
/// pages (x86-64's 2 MiB).
#[cfg(unix)]
const HUGE_PAGE: usize = 2 << 20;

/// `Cache::cached`, readable without the lock.
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
static CACHING: AtomicBool = AtomicBool::new(true);

/// The free lists and the accounting of blocks of at least [`MIN_CACHED`].
struct Cache {
    free: HashMap<usize, Vec<SendPtr>>,
    /// The most bytes the free lists may hold.
    limit: usize,
    /// Bytes in the free lists.
    cached: usize,
    /// Bytes of the blocks handed out and not yet returned.
    in_use: usize,
    /// The most `in_use` has been.
    peak: usize,
}

struct SendPtr(NonNull<u8>);
// SAFETY: a cached block is plain memory owned by the cache alone.
unsafe impl Send for SendPtr {}

impl Cache {
    fn new(limit: usize) -> Cache {
        Cache {
            free: HashMap::new(),
            limit,
            cached: 0,
            in_use: 0,
            peak: 0,
        }
    }

    /// A cached block of class `cap`, now in use; or `None`, after returning
    /// to the system the cached blocks a fresh block of `cap` would lift
    /// above the high-water mark (the caller then allocates one and calls
    /// [`Cache::fresh`]).
    fn take(&mut self, cap: usize) -> Option<NonNull<u8>> {
        if let Some(p) = self.free.get_mut(&cap).and_then(Vec::pop) {
            self.cached -= cap;
            self.in_use += cap;
            return Some(p.0);
        }
        let in_use = self.in_use.saturating_add(cap);
        let mark = self.peak.saturating_add(headroom(self.peak));
        self.trim(mark.max(in_use) - in_use);
        None
    }

    /// Counts a fresh block of class `cap` in use.
    fn fresh(&mut self, cap: usize) {
        self.in_use += cap;
        self.peak = self.peak.max(self.in_use);
    }

    /// Takes back a block of class `cap` in use: into the free lists when
    /// `keep` and the limit allows, else it is handed back for the caller
    /// to return to the system.
    fn put(&mut self, p: NonNull<u8>, cap: usize, keep: bool) -> Option<NonNull<u8>> {
        self.in_use -= cap;
        if !keep || self.cached + cap > self.limit {
            return Some(p);
        }
        self.free.entry(cap).or_default().push(SendPtr(p));
        self.cached += cap;
        None
    }

    /// Returns cached blocks to the system, the largest classes first, until
    /// at most `budget` bytes stay cached.
    fn trim(&mut self, budget: usize) {
        while self.cached > budget {
            let Some(cap) = self
                .free
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(&k, _)| k)
                .max()
            else {
                return;
            };
            let p = self
                .free
                .get_mut(&cap)
                .and_then(Vec::pop)
                .expect("a non-empty class");
            self.cached -= cap;
            // SAFETY: cached blocks came from system_alloc(cap) and are unused.
            unsafe { system_free(p.0, cap) };
        }
    }
}

/// How far above the high-water mark `peak` in-use plus cached blocks may
/// go: 1/16 of it, and at least [`MIN_HEADROOM`]. Without it a step whose
/// size classes peak at different moments (a small CNN's) returns and
/// re-maps blocks every step (MNIST CNN: 4580 -> 2930 samples/s).
fn headroom(peak: usize) -> usize {
    (peak / 16).max(MIN_HEADROOM)
}

/// The least [`headroom`]: what a small model's whole working set takes.
const MIN_HEADROOM: usize = 32 << 20;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let limit = std::env::var("TESSERA_CPU_CACHE_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_LIMIT);
        Mutex::new(Cache::new(limit))
    })
}

/// Runs `f` on the cache under its lock and publishes its cached bytes.
fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    // The cache holds no invariant a panic elsewhere could break.
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    let r = f(&mut c);
    CACHED_BYTES.store(c.cached, Ordering::Relaxed);
    r
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
    if cap < MIN_CACHED {
        return system_alloc(cap).map(|p| (p, true));
    }
    if let Some(p) = with_cache(|c| c.take(cap)) {
        return Some((p, false));
    }
    let p = system_alloc(cap).or_else(|| {
        // Cached blocks of other sizes may be what stands in the way.
        release_cached();
        system_alloc(cap)
    })?;
    with_cache(|c| c.fresh(cap));
    Some((p, true))
}

/// Returns a block obtained from [`allocate`] for `bytes`.
///
/// # Safety
/// `ptr` must come from `allocate(bytes)` and not be used afterwards.
pub(crate) unsafe fn free(ptr: NonNull<u8>, bytes: usize) {
    let cap = size_class(bytes);
    let ptr = if cap < MIN_CACHED {
        Some(ptr)
    } else {
        with_cache(|c| c.put(ptr, cap, CACHING.load(Ordering::Relaxed)))
    };
    if let Some(p) = ptr {
        // SAFETY: allocated by `allocate`, so by system_alloc(cap).
        unsafe { system_free(p, cap) };
    }
}

/// Bytes held in the cache's free lists right now.
pub fn cached_bytes() -> usize {
    CACHED_BYTES.load(Ordering::Relaxed)
}

/// Returns every cached block to the system.
pub fn release_cached() {
    with_cache(|c| c.trim(0));
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

/// A zeroed block of `cap > 0` bytes aligned to [`ALIGN`]. Cacheable sizes
/// are mapped anonymously on Unix, so [`system_free`] returns them to the
/// system: through malloc, glibc's sliding mmap threshold would keep freed
/// blocks of a few MiB in its heap, out of the cache's reach and in the
/// resident set.
fn system_alloc(cap: usize) -> Option<NonNull<u8>> {
    #[cfg(unix)]
    if cap >= MIN_CACHED {
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        if cap >= HUGE_PAGE {
            // Transparent huge pages where the system grants them on
            // request: a first touch then faults in 2 MiB, not 4 KiB. A
            // refusal only costs the small pages.
            // SAFETY: advice on the mapping just made.
            unsafe { libc::madvise(p, cap, libc::MADV_HUGEPAGE) };
        }
        // Mappings are page-aligned and zero-filled.
        return NonNull::new(p.cast());
    }
    let layout = Layout::from_size_align(cap, ALIGN).ok()?;
    // SAFETY: cap > 0 and the layout is valid.
    NonNull::new(unsafe { alloc_zeroed(layout) })
}

/// Returns a block of `cap` bytes from [`system_alloc`].
///
/// # Safety
/// `p` must come from `system_alloc(cap)` and not be used afterwards.
unsafe fn system_free(p: NonNull<u8>, cap: usize) {
    #[cfg(unix)]
    if cap >= MIN_CACHED {
        // SAFETY: the whole mapping made by system_alloc(cap), unused now. It
        // can only fail for arguments that did not come from mmap.
        let rc = unsafe { libc::munmap(p.as_ptr().cast(), cap) };
        debug_assert_eq!(rc, 0, "munmap of a block of {cap} bytes");
        return;
    }
    // SAFETY: allocated by system_alloc with this layout.
    unsafe {
        dealloc(
            p.as_ptr(),
            Layout::from_size_align(cap, ALIGN).expect("valid layout"),
        )
    }
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

    /// A block of class `cap` as `allocate` gets one on a miss.
    fn fresh_block(c: &mut Cache, cap: usize) -> NonNull<u8> {
        let p = system_alloc(cap).unwrap();
        c.fresh(cap);
        p
    }

    /// A private cache, so other tests' allocations cannot interfere. The
    /// blocks are mapped, never touched, so they cost no memory.
    #[test]
    fn the_cache_stays_within_the_high_water_mark_and_its_headroom() {
        const U: usize = 16 << 20;
        let mut c = Cache::new(DEFAULT_LIMIT);
        // A "forward": three 4U blocks at once (peak 12U, headroom 2U), freed.
        let blocks: Vec<_> = (0..3).map(|_| fresh_block(&mut c, 4 * U)).collect();
        for p in blocks {
            assert!(c.put(p, 4 * U, true).is_none());
        }
        assert_eq!((c.in_use, c.cached, c.peak), (0, 12 * U, 12 * U));
        assert_eq!(headroom(c.peak), 2 * U);
        // A hit: no fresh memory, no trimming.
        let a = c.take(4 * U).unwrap();
        assert_eq!((c.in_use, c.cached), (4 * U, 8 * U));
        // A miss for 6U: 4U + 6U in use leaves 14U − 10U = 4U for the cache,
        // so one cached 4U block goes back.
        assert!(c.take(6 * U).is_none());
        assert_eq!(c.cached, 4 * U);
        let b = fresh_block(&mut c, 6 * U);
        assert_eq!((c.in_use, c.peak), (10 * U, 12 * U));
        // A miss for 2U: 12U in use leaves 2U, so the last 4U block goes.
        assert!(c.take(2 * U).is_none());
        assert_eq!(c.cached, 0);
        let d = fresh_block(&mut c, 2 * U);
        for (p, cap) in [(a, 4 * U), (b, 6 * U), (d, 2 * U)] {
            assert!(c.put(p, cap, true).is_none());
            assert!(c.in_use + c.cached <= c.peak + headroom(c.peak));
        }
        // Not keeping, or a full cache, hands the block back.
        let e = c.take(2 * U).unwrap();
        let e = c.put(e, 2 * U, false).unwrap();
        // SAFETY: from system_alloc(2U), handed back unused.
        unsafe { system_free(e, 2 * U) };
        c.limit = c.cached;
        let f = c.take(4 * U).unwrap();
        c.limit -= 1;
        let f = c.put(f, 4 * U, true).unwrap();
        // SAFETY: as above.
        unsafe { system_free(f, 4 * U) };
        c.trim(0);
        assert_eq!((c.cached, c.in_use), (0, 0));
        assert!(c.free.values().all(Vec::is_empty));
    }
}
