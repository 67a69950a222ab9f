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

/// A safetensors file holding one f32 tensor `w` of `n` elements whose data
/// is a hole (sparse on disk); `None` when the file system cannot hold it.
fn sparse_safetensors(n: usize) -> Option<std::path::PathBuf> {
    use std::io::Write;
    let mut header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
        n * 4
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let path = std::env::temp_dir().join(format!("tessera-sparse-{}.safetensors", std::process::id()));
    let mut f = std::fs::File::create(&path).ok()?;
    f.write_all(&(header.len() as u64).to_le_bytes()).ok()?;
    f.write_all(header.as_bytes()).ok()?;
    match f.set_len((8 + header.len() + n * 4) as u64) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("skipped: a sparse file of {n} f32s cannot be made here: {e}");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

#[test]
fn copies_of_a_mapped_tensor_that_cannot_be_allocated_are_errors() {
    // Under `vm.overcommit_memory = 1` an 8 TiB allocation succeeds and the
    // copy would then exhaust memory page by page: nothing to test there.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        eprintln!("skipped: the kernel grants any allocation (vm.overcommit_memory = 1)");
        return;
    }
    // 2^41 f32 = 8 TiB: mapped read-only at no cost, more than any machine
    // we run on can allocate, and within ext4's 16 TiB file limit.
    let n = 1usize << 41;
    let Some(path) = sparse_safetensors(n) else {
        return;
    };
    let loaded = tessera_tensor::safetensors::load(&path);
    let _ = std::fs::remove_file(&path);
    let mut t = loaded.unwrap().remove("w").unwrap();
    assert!(t.storage().is_mapped() && t.numel() == n);
    let bytes = (n * 4).to_string();
    let e = fails_naming(t.storage().try_clone("clone"), &["clone", &bytes]);
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
    // Writing in place copies the mapped data first (copy-on-write).
    let e = fails_naming(t.make_mut::<f32>().map(|_| ()), &["make_mut", &bytes]);
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
    let one = Tensor::scalar(1.0f32);
    let e = fails_naming(
        t.zip_map_::<f32, f32>(&one, "add_", |a, b| a + b),
        &["add_", &bytes],
    );
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
    // The tensor still reads its file.
    assert!(t.storage().is_mapped());
    assert_eq!(t.narrow(0, n - 1, 1).unwrap().to_vec::<f32>().unwrap(), [0.0]);
}
