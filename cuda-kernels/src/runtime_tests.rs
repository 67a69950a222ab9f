use std::sync::Arc;

use super::*;
use crate::emu::{with_thread_order, Emu, ThreadOrder};
use crate::ops::elementwise::fill;

fn emu(capacity: usize) -> Emu {
    Emu::with_order(0, ThreadOrder::Forward, capacity)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn copies_memset_and_launches_round_trip() {
    let e = emu(1 << 20);
    let a = e.alloc(40).unwrap();
    let b = e.alloc(40).unwrap();
    assert_eq!((a % 256, b % 256), (0, 0), "cudaMalloc alignment");
    let src: Vec<u8> = (0..40).collect();
    let mut back = vec![0u8; 40];
    // SAFETY: every range lies in `a` or `b` (40 bytes each).
    unsafe {
        e.copy_htod(a, &src).unwrap();
        e.memset(a + 8, 0xAB, 4).unwrap();
        e.copy_dtod(b, a, 40).unwrap();
        e.copy_dtoh(b, &mut back).unwrap();
    }
    let mut want = src.clone();
    want[8..12].fill(0xAB);
    assert_eq!(back, want);

    let l = fill::<f32>(DevPtr::from_raw(b, 10), 10, 2.5).unwrap();
    // SAFETY: `b` holds the 10 f32 the launch writes.
    unsafe { e.launch(&l).unwrap() };
    e.synchronize().unwrap();
    // SAFETY: as above.
    unsafe { e.copy_dtoh(b, &mut back).unwrap() };
    assert_eq!(f32s(&back), vec![2.5; 10]);
    // SAFETY: nothing uses the blocks afterwards.
    unsafe {
        e.free(a).unwrap();
        e.free(b).unwrap();
    }
    assert_eq!(e.used_bytes(), 0);
}

#[test]
fn ranges_outside_live_allocations_are_errors_naming_the_op() {
    let e = emu(1 << 20);
    let a = e.alloc(16).unwrap();
    let mut out = [0u8; 32];
    // SAFETY: the emulator checks every range and touches nothing outside.
    unsafe {
        let err = e.copy_htod(a + 8, &[0u8; 16]).unwrap_err();
        assert!(matches!(err, Error::Emulator { op: "copy_htod", .. }), "{err}");
        assert!(
            err.to_string().contains("not inside one live allocation"),
            "{err}"
        );
        let err = e.copy_dtoh(a, &mut out).unwrap_err();
        assert!(matches!(err, Error::Emulator { op: "copy_dtoh", .. }), "{err}");
        assert!(e.memset(a, 0, 17).is_err());
        assert!(e.copy_dtod(a, a + (1 << 40), 4).is_err());
        e.free(a).unwrap();
        let err = e.free(a).unwrap_err();
        assert!(err.to_string().contains("not a live allocation"), "{err}");
        assert!(e.copy_htod(a, &[1]).is_err(), "a freed block is not live");
    }
}

#[test]
fn bad_launches_and_exhausted_memory_are_errors() {
    let e = emu(4096);
    let err = e.alloc(8192).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { bytes: 8192, .. }), "{err}");
    let y = e.alloc(64).unwrap();
    let mut l = fill::<f32>(DevPtr::from_raw(y, 16), 16, 1.0).unwrap();
    l.args.pop();
    // SAFETY: refused before any thread runs.
    let err = unsafe { e.launch(&l) }.unwrap_err();
    assert!(
        err.to_string().contains("fill_f32") && err.to_string().contains("parameters"),
        "{err}"
    );
    l.kernel = "no_such_kernel".into();
    // SAFETY: as above.
    assert!(unsafe { e.launch(&l) }
        .unwrap_err()
        .to_string()
        .contains("unknown kernel"));
    let mut l = fill::<f32>(DevPtr::from_raw(y, 16), 16, 1.0).unwrap();
    l.block = [2048, 1, 1];
    // SAFETY: as above.
    assert!(unsafe { e.launch(&l) }
        .unwrap_err()
        .to_string()
        .contains("block size"));
    l.grid = [0, 1, 1];
    // SAFETY: an empty grid does nothing.
    unsafe { e.launch(&l) }.unwrap();
}

#[test]
fn thread_orders_parse_and_scope() {
    assert_eq!("forward".parse::<ThreadOrder>().unwrap(), ThreadOrder::Forward);
    assert_eq!(" reverse".parse::<ThreadOrder>().unwrap(), ThreadOrder::Reverse);
    assert_eq!("random".parse::<ThreadOrder>().unwrap(), ThreadOrder::Random(0));
    assert_eq!(
        "random:42".parse::<ThreadOrder>().unwrap(),
        ThreadOrder::Random(42)
    );
    for bad in ["backward", "random:x", "random:-1"] {
        let err = bad.parse::<ThreadOrder>().unwrap_err();
        assert!(err.to_string().contains("TESSERA_EMU_ORDER"), "{err}");
    }
    // A scope changes the order of this thread's launches and restores it.
    let e = emu(1 << 20);
    let mode = |e: &Emu| e.mode();
    assert_eq!(mode(&e), 0);
    with_thread_order(ThreadOrder::Reverse, || {
        assert_eq!(mode(&e), 1);
        with_thread_order(ThreadOrder::Random(7), || assert!(mode(&e) >= 2));
        assert_eq!(mode(&e), 1);
    });
    assert_eq!(mode(&e), 0);
}

/// Without a GPU (and `TESSERA_CUDA_EMU` unset or 1) the process runs on
/// the emulator; with one, on the driver unless told otherwise. Either
/// way a device opens once and is shared, and a missing ordinal is an error.
#[test]
fn open_picks_a_runtime_once_and_shares_devices() {
    let kind = selected().unwrap();
    match std::env::var("TESSERA_CUDA_EMU").as_deref() {
        Ok("1") => assert_eq!(kind, RuntimeKind::Emulator),
        Ok("0") => assert_eq!(kind, RuntimeKind::Driver),
        _ if crate::gpu::device_count() == 0 => assert_eq!(kind, RuntimeKind::Emulator),
        _ => assert_eq!(kind, RuntimeKind::Driver),
    }
    let count = device_count();
    if count == 0 {
        println!("skipped: no CUDA device ({})", open(0).err().unwrap());
        return;
    }
    let (a, b) = (open(0).unwrap(), open(0).unwrap());
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.info().kind, kind);
    assert_eq!(a.info().ordinal, 0);
    assert!(a.info().arch().starts_with("sm_"));
    let err = open(count).err().unwrap();
    assert!(matches!(err, Error::NoDevice(_)), "{err}");
}
