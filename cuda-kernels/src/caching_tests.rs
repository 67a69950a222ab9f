use std::sync::Arc;

use super::*;
use crate::emu::{Emu, ThreadOrder};

/// An allocator over an emulated device of `capacity` bytes, and the device
/// (to see what it really holds).
fn allocator(capacity: usize) -> (CachingAllocator, Arc<Emu>) {
    let emu = Arc::new(Emu::with_order(0, ThreadOrder::Forward, capacity));
    (CachingAllocator::new(emu.clone()), emu)
}

#[test]
fn size_classes_round_up_with_bounded_slack() {
    assert_eq!(size_class(0).unwrap(), 512);
    assert_eq!(size_class(1).unwrap(), 512);
    assert_eq!(size_class(512).unwrap(), 512);
    assert_eq!(size_class(513).unwrap(), 1024);
    assert_eq!(size_class((1 << 20) - 1).unwrap(), 1 << 20);
    assert_eq!(size_class(1 << 20).unwrap(), 1 << 20);
    assert_eq!(size_class((1 << 20) + 1).unwrap(), (1 << 20) + (1 << 18));
    assert_eq!(size_class(3 << 20).unwrap(), 3 << 20);
    for bytes in (0..40).map(|i| 1usize << (i / 2) | (i * 7919)) {
        let c = size_class(bytes).unwrap();
        assert!(c >= bytes.max(1) && c.is_multiple_of(MIN_BLOCK), "{bytes} -> {c}");
        assert!(
            c - bytes.max(1) <= (bytes / 4).max(MIN_BLOCK),
            "{bytes} -> {c}: too much slack"
        );
    }
    assert!(matches!(size_class(usize::MAX), Err(Error::OutOfMemory { .. })));
}

#[test]
fn a_freed_block_is_reused_for_its_class_and_stats_follow() {
    let (a, emu) = allocator(1 << 30);
    let b1 = a.alloc(1000).unwrap();
    assert_eq!(b1.size, 1024);
    assert_eq!(b1.addr % 256, 0);
    let b2 = a.alloc(3 << 20).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.active_blocks),
        (1024 + (3 << 20), 1024 + (3 << 20), 2)
    );
    assert_eq!((s.device_allocations, s.cache_hits), (2, 0));
    assert_eq!(emu.used_bytes(), s.reserved);

    // SAFETY: nothing uses the blocks afterwards.
    unsafe { a.free(b1.addr) }.unwrap();
    let s = a.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.cached()),
        (3 << 20, 1024 + (3 << 20), 1024)
    );
    // A request of the same class gets the same block back, no device call.
    let b3 = a.alloc(700).unwrap();
    assert_eq!(b3, b1);
    let s = a.stats();
    assert_eq!((s.device_allocations, s.cache_hits, s.allocations), (2, 1, 3));
    // Another class does not take it.
    // SAFETY: as above.
    unsafe { a.free(b3.addr) }.unwrap();
    let b4 = a.alloc(2000).unwrap();
    assert_ne!(b4.addr, b1.addr);
    assert_eq!(a.stats().device_allocations, 3);

    // SAFETY: as above.
    unsafe {
        a.free(b2.addr).unwrap();
        a.free(b4.addr).unwrap();
    }
    let s = a.stats();
    assert_eq!((s.allocated, s.active_blocks), (0, 0));
    assert_eq!(s.peak_allocated, (3 << 20) + 2048);
    assert_eq!(s.peak_reserved, s.reserved);
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!((s.reserved, s.device_frees), (0, 3));
    assert_eq!(emu.used_bytes(), 0);
    a.reset_peak();
    assert_eq!(a.stats().peak_allocated, 0);
}

#[test]
fn cached_memory_is_given_back_before_running_out() {
    let (a, emu) = allocator(4 << 20);
    let big = a.alloc(3 << 20).unwrap();
    // SAFETY: nothing uses the block afterwards.
    unsafe { a.free(big.addr) }.unwrap();
    // 2 MiB does not fit beside the cached 3 MiB: the cache is emptied first.
    let b = a.alloc(2 << 20).unwrap();
    assert_eq!(a.stats().reserved, 2 << 20);
    assert_eq!(emu.used_bytes(), 2 << 20);
    // A request the device cannot hold at all is an error naming the size.
    let e = a.alloc(8 << 20).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { bytes, .. } if bytes == 8 << 20),
        "{e}"
    );
    assert_eq!(a.stats().allocated, 2 << 20, "a failed request changes nothing");
    // SAFETY: as above.
    unsafe { a.free(b.addr) }.unwrap();
}

#[test]
fn freeing_an_unknown_block_is_an_error() {
    let (a, _emu) = allocator(1 << 20);
    let b = a.alloc(10).unwrap();
    // SAFETY: nothing uses the block afterwards; the second free is refused.
    unsafe {
        a.free(b.addr).unwrap();
        let e = a.free(b.addr).unwrap_err();
        assert!(e.to_string().contains("not a live block"), "{e}");
        assert!(a.free(12345).is_err());
    }
    assert_eq!(a.stats().allocated, 0);
}

#[test]
fn dropping_the_allocator_gives_everything_back() {
    let (a, emu) = allocator(1 << 20);
    for n in [100, 5000, 70_000] {
        let b = a.alloc(n).unwrap();
        // SAFETY: nothing uses the block afterwards.
        unsafe { a.free(b.addr) }.unwrap();
    }
    assert!(emu.used_bytes() > 0);
    drop(a);
    assert_eq!(emu.used_bytes(), 0);
}
