//! Absurd sizes are errors, not aborts: shape products are checked in every
//! layout constructor, and memory that cannot be allocated is an
//! `Error::OutOfMemory` naming the op, the shape and the bytes.

use tessera_tensor::{DType, Error, Layout, Storage, Tensor};

/// Asserts `r` is an error whose message holds every one of `needles`.
fn fails_naming<T: std::fmt::Debug>(r: tessera_tensor::Result<T>, needles: &[&str]) -> Error {
    let e = r.expect_err("an absurd size must be an error");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "`{msg}` lacks `{n}`");
    }
    e
}

#[test]
fn overflowing_shape_products_are_errors() {
    let t = Tensor::zeros(&[1, 4], DType::F32).unwrap();
    // 2^62 · 4 wraps to 0 in usize: it used to give numel() == 0.
    fails_naming(t.expand([1 << 62, 4]), &["expand", "4611686018427387904"]);
    fails_naming(t.broadcast_to(&[usize::MAX, 4]), &["broadcast_to"]);
    fails_naming(t.reshape([1 << 62, 4, 0]).map(|_| ()), &["reshape"]);
    let l = Layout::contiguous(&[1 << 62, 4]);
    assert_eq!(l.numel(), usize::MAX, "numel saturates instead of wrapping");
    fails_naming(Layout::try_new(vec![1 << 62, 4], vec![0, 0], 0), &["layout"]);
    fails_naming(
        Tensor::from_storage(Storage::zeros::<f32>("t", 4).unwrap(), l),
        &["layout"],
    );
    fails_naming(
        Tensor::build::<f32>("mine", &[1 << 62, 4], |_| {}),
        &["mine", "[4611686018427387904, 4]"],
    );
    fails_naming(
        Tensor::from_slice(&[1.0f32], &[1 << 32, 1 << 32]),
        &["from_slice"],
    );
    // A zero size makes the others harmless, as in PyTorch.
    let e = Tensor::zeros(&[0, usize::MAX, usize::MAX], DType::F32).unwrap();
    assert_eq!(e.numel(), 0);
    assert_eq!(e.sum(&[], false).unwrap().to_scalar::<f32>().unwrap(), 0.0);
}

#[test]
fn one_hot_with_absurd_class_counts_is_an_error() {
    let idx = Tensor::from_vec(vec![3i64], &[]).unwrap();
    fails_naming(idx.one_hot(Some(usize::MAX)), &["one_hot"]);
    let idx = Tensor::from_vec(vec![3i64, 1], &[2]).unwrap();
    fails_naming(idx.one_hot(Some(usize::MAX)), &["one_hot"]);
    fails_naming(idx.one_hot(Some(1 << 62)), &["one_hot"]);
}

/// 2^46 f32 elements (256 TiB) exceed any x86-64 address space, so these
/// allocations fail whatever the overcommit policy.
const HUGE: usize = 1 << 46;

#[test]
fn allocation_failure_is_an_error_naming_op_shape_and_bytes() {
    let bytes = (HUGE * 4).to_string();
    let shape = format!("[{HUGE}]");
    let oom = |r: tessera_tensor::Result<Tensor>, op: &str, needles: &[&str]| {
        let e = fails_naming(r, needles);
        assert!(matches!(e, Error::OutOfMemory { .. }), "{op}: {e:?}");
        assert_eq!(e.op(), op);
    };
    oom(Tensor::zeros(&[HUGE], DType::F32), "zeros", &[&shape, &bytes]);
    oom(Tensor::ones(&[HUGE], DType::F32), "ones", &[&shape, &bytes]);
    oom(Tensor::full(&[HUGE], 2.0, DType::F32), "full", &[&shape, &bytes]);
    oom(Tensor::randn(&[HUGE], DType::F32), "normal", &[&shape, &bytes]);
    oom(
        Tensor::rand(&[1 << 23, 1 << 23], DType::F32),
        "uniform",
        &["[8388608, 8388608]", &bytes],
    );
    oom(
        Tensor::arange(0.0, 1e18, 1.0, DType::F32),
        "arange",
        &["1000000000000000000", "4000000000000000000 bytes"],
    );
    oom(
        Tensor::linspace(0.0, 1.0, HUGE, DType::F64),
        "linspace",
        &[&shape, &(HUGE * 8).to_string()],
    );
    // A broadcast view of 2^46 elements is fine; materialising it is not.
    let v = Tensor::ones(&[1], DType::F32).unwrap().expand([HUGE]).unwrap();
    assert_eq!(v.numel(), HUGE);
    oom(v.contiguous(), "contiguous", &[&shape, &bytes]);
    oom(v.add_scalar(1.0), "add_scalar", &[&shape]);
    oom(v.exp(), "exp", &[&shape]);
    // A 2^23 × 2^23 product of small operands (PyTorch: a "1M×1M matmul").
    let col = Tensor::ones(&[1 << 23, 1], DType::F32).unwrap();
    let row = Tensor::ones(&[1, 1 << 23], DType::F32).unwrap();
    oom(col.matmul(&row), "matmul", &["[8388608, 8388608]", &bytes]);
    oom(col.add(&row), "add", &["[8388608, 8388608]"]);
    let e = v.to_vec::<f32>().unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { op: "to_vec", .. }), "{e}");
    // The process carries on: ordinary allocations still work.
    assert_eq!(
        Tensor::ones(&[3], DType::F32)
            .unwrap()
            .sum(&[], false)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        3.0
    );
}
