//! Every public op on GPU storage returns an `Err` and never panics, shown
//! without a GPU: operands are [`Storage::fake_cuda`] tensors (on `cuda:0`,
//! no memory behind them), so an op that runs a CPU kernel on them panics
//! in the storage accessor, and a CUDA path errors when it asks for the
//! device. Each op is first run on valid CPU operands (it must succeed, so
//! a missing guard would really reach a kernel), then with every operand on
//! the fake GPU (creation ops may work where `cuda:0` opens, and must be an
//! `Err` elsewhere), then with the operands split between
//! the CPU and the GPU (the error must name both devices). A scan of the sources checks that
//! the table lists every public op.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::guard_cases::{cases, f, Case, Kind};
use crate::{Error, Result, Storage, Tensor};

/// `t`'s dtype and layout over fake GPU storage of the same length.
fn fake(t: &Tensor) -> Tensor {
    Tensor::from_parts(
        Storage::fake_cuda(t.dtype(), t.storage().len()),
        t.layout().clone(),
    )
}

/// Runs `case` with operand `k` on the fake GPU when `on_gpu(k)`.
fn run(case: &Case, on_gpu: impl Fn(usize) -> bool) -> std::thread::Result<Result<()>> {
    let inputs: Vec<Tensor> = case
        .inputs
        .iter()
        .enumerate()
        .map(|(k, t)| if on_gpu(k) { fake(t) } else { t.clone() })
        .collect();
    catch_unwind(AssertUnwindSafe(|| (case.f)(&inputs)))
}

/// The device placements to try: all on the GPU, then (for several
/// operands) each operand alone on the CPU and each alone on the GPU.
fn placements(n: usize) -> Vec<Vec<bool>> {
    let mut out = vec![vec![true; n]];
    if n > 1 {
        for k in 0..n {
            out.push((0..n).map(|j| j != k).collect());
            out.push((0..n).map(|j| j == k).collect());
        }
    }
    out
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn every_op_on_gpu_storage_errors_and_never_panics() {
    // With a GPU or the emulator (feature `cuda-emu`), creation on cuda:0 works.
    let gpu_present = crate::cuda::device("guard", 0).is_ok();
    let mut failures = Vec::new();
    for case in cases() {
        if !case.inputs.is_empty() {
            if let Err(e) = (case.f)(&case.inputs) {
                failures.push(format!(
                    "{}: the CPU operands should be valid, got {e}",
                    case.name
                ));
                continue;
            }
        }
        for placement in placements(case.inputs.len()) {
            let mixed = placement.iter().any(|&g| !g);
            let r = match run(&case, |k| placement[k]) {
                Err(p) => {
                    failures.push(format!(
                        "{} {placement:?}: panicked: {}",
                        case.name,
                        panic_text(&*p)
                    ));
                    continue;
                }
                Ok(r) => r,
            };
            match r {
                Ok(()) if case.kind == Kind::View && !mixed => {}
                Ok(()) if case.kind == Kind::Create && gpu_present => {}
                Ok(()) => failures.push(format!("{} {placement:?}: returned Ok", case.name)),
                Err(Error::Device { msg, .. })
                    if mixed && !(msg.contains("cpu") && msg.contains("cuda:0")) =>
                {
                    failures.push(format!(
                        "{} {placement:?}: should name both devices: {msg}",
                        case.name
                    ));
                }
                Err(Error::Device { .. } | Error::Io { .. }) => {}
                Err(e) => failures.push(format!("{} {placement:?}: not a device error: {e}", case.name)),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Ops without a CUDA path say so, and how to get the CPU result.
#[test]
fn guarded_ops_name_the_op_and_the_way_out() {
    let g = fake(&f(&[3, 4]));
    let e = g.cumsum(0).unwrap_err();
    assert_eq!(e.op(), "cumsum");
    assert!(e.to_string().contains("not implemented on cuda:0"), "{e}");
    assert!(e.to_string().contains(".to_device(Device::Cpu)"), "{e}");
    let e = f(&[3, 4]).cat_with(&g).unwrap_err();
    assert!(
        e.to_string().contains("cpu") && e.to_string().contains("cuda:0"),
        "{e}"
    );
    let shown = format!("{g}");
    assert!(
        shown.contains("device='cuda:0'") && shown.contains("to_device"),
        "{shown}"
    );
}

impl Tensor {
    fn cat_with(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::cat(&[self, other], 0)
    }
}

/// Public functions that take no tensor or only read metadata, or build CPU
/// tensors from host data.
const EXEMPT: &[&str] = &[
    // metadata and host constructors
    "shape",
    "size",
    "ndim",
    "numel",
    "dtype",
    "device",
    "layout",
    "strides",
    "storage",
    "is_contiguous",
    "shares_storage",
    "from_vec",
    "from_slice",
    "scalar",
    "from_storage",
    "from_shared",
    "build",
    "build_overwrite",
    "squeeze_all",
    "load",
    "load_with_metadata",
    "cuda",
    "map",
    "try_map",
    // parameter builders and kernel-geometry helpers (no tensors)
    "new",
    "stride",
    "padding",
    "dilation",
    "groups",
    "ceil_mode",
    "kk",
    "l",
    "out_shape",
    // forms drawing from an explicit generator forward to the tested ones
    "rand_with",
    "randn_with",
    "randint_with",
    "bernoulli_scalar_with",
    "randperm_with",
    "normal_with",
    "uniform_with",
    "trunc_normal_with",
    "save_with_metadata",
];

/// The sources of the public tensor API, relative to `src/`.
fn api_sources() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<_> = ["tensor.rs", "map.rs", "transfer.rs", "safetensors.rs"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    let mut dirs = vec![root.join("ops")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let skip = name.contains("test")
                || name.contains("cuda")
                || [
                    "naive.rs",
                    "gemm.rs",
                    "kernel.rs",
                    "pack.rs",
                    "im2col.rs",
                    "cpu.rs",
                ]
                .contains(&name.as_str());
            if p.is_dir() {
                dirs.push(p);
            } else if !skip && name.ends_with(".rs") {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn the_table_lists_every_public_op() {
    let listed: BTreeSet<&str> = cases()
        .iter()
        .map(|c| c.name)
        .chain(EXEMPT.iter().copied())
        .collect();
    let mut missing = BTreeSet::new();
    for file in api_sources() {
        let src = std::fs::read_to_string(&file).unwrap();
        for line in src.lines() {
            let Some(rest) = line.trim_start().strip_prefix("pub fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // `$name` in macro bodies: the expansions are listed by hand.
            if !name.is_empty() && !listed.contains(name.as_str()) {
                missing.insert(format!("{name} ({})", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "public ops missing from the GPU guard table: {missing:?}"
    );
}
