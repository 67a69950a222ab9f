//! Compile and assemble: every kernel family is compiled by NVRTC to CUBIN
//! for sm_80 and sm_90 with ptxas' resource report, and every kernel must
//! compile, spill nothing, and stay within the register, shared-memory and
//! stack budgets of `kernel-budgets.txt`. Without libnvrtc the test says why
//! it skipped, unless TESSERA_REQUIRE_NVRTC=1 (set by CI) makes that a failure.

use std::collections::BTreeSet;

use tessera_cuda_kernels::nvrtc::{compile_cubin, nvrtc_available, parse_ptxas_report, KernelResources};
use tessera_cuda_kernels::Module;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

struct Budget {
    pattern: String,
    registers: u32,
    shared_bytes: u32,
    stack_bytes: u32,
}

fn budgets() -> Vec<Budget> {
    let text = include_str!("../../kernel-budgets.txt");
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                f.len(),
                4,
                "kernel-budgets.txt: `{l}` needs pattern, registers, smem, stack"
            );
            let n = |s: &str| {
                s.parse::<u32>()
                    .unwrap_or_else(|_| panic!("kernel-budgets.txt: `{s}` is not a number"))
            };
            Budget {
                pattern: f[0].to_string(),
                registers: n(f[1]),
                shared_bytes: n(f[2]),
                stack_bytes: n(f[3]),
            }
        })
        .collect()
}

/// `*` matches any run of characters.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head) && (head.len()..=name.len()).any(|i| glob(rest, &name[i..]))
        }
    }
}

fn nvrtc_or_skip() -> bool {
    if nvrtc_available() {
        return true;
    }
    let why = "libnvrtc.so.12 not found (run cuda-kernels/ci-setup.sh and export its LD_LIBRARY_PATH)";
    if std::env::var("TESSERA_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("TESSERA_REQUIRE_NVRTC=1 but {why}");
    }
    println!("skipped: {why}");
    false
}

/// Compiles every (family, arch) pair, two at a time.
type Report = (Module, &'static str, Result<Vec<KernelResources>, String>);

fn compile_all() -> Vec<Report> {
    let jobs: Vec<(Module, &str)> = Module::ALL.iter().flat_map(|&m| ARCHS.map(|a| (m, a))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(m, a)) = jobs.get(i) else { break };
                let r = compile_cubin(m, a, true)
                    .map(|c| parse_ptxas_report(&c.log))
                    .map_err(|e| e.to_string());
                results.lock().unwrap().push((m, a, r));
            });
        }
    });
    let mut r = results.into_inner().unwrap();
    r.sort_by_key(|(m, a, _)| (*m, *a));
    r
}

#[test]
fn every_kernel_compiles_and_fits_its_budget() {
    if !nvrtc_or_skip() {
        return;
    }
    let budgets = budgets();
    let mut failures = Vec::new();
    let mut report = String::new();
    for (m, arch, r) in compile_all() {
        let kernels = match r {
            Ok(k) => k,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let found: BTreeSet<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        let listed = m.kernels();
        let expected: BTreeSet<&str> = listed.iter().map(|s| s.as_str()).collect();
        if found != expected {
            failures.push(format!(
                "{} for {arch}: ptxas saw {found:?}, Module::kernels lists {expected:?}",
                m.file_name()
            ));
        }
        for k in &kernels {
            report += &format!(
                "{:<28} {arch} regs {:>3} smem {:>6} stack {:>4} spills {}/{}\n",
                k.name, k.registers, k.shared_bytes, k.stack_bytes, k.spill_stores, k.spill_loads
            );
            if k.spill_stores > 0 || k.spill_loads > 0 {
                failures.push(format!(
                    "{} ({arch}) spills {} bytes stored, {} loaded",
                    k.name, k.spill_stores, k.spill_loads
                ));
            }
            match budgets.iter().find(|b| glob(&b.pattern, &k.name)) {
                None => failures.push(format!("{} has no entry in kernel-budgets.txt", k.name)),
                Some(b) => {
                    if k.registers > b.registers
                        || k.shared_bytes > b.shared_bytes
                        || k.stack_bytes > b.stack_bytes
                    {
                        failures.push(format!(
                            "{} ({arch}) uses {} registers, {} B smem, {} B stack; budget `{}` allows {}, {}, {}",
                            k.name, k.registers, k.shared_bytes, k.stack_bytes, b.pattern, b.registers, b.shared_bytes, b.stack_bytes
                        ));
                    }
                }
            }
        }
    }
    println!("{report}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn compile_errors_carry_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    // An architecture NVRTC does not know must fail with its message, not panic.
    let err = compile_cubin(Module::Elementwise, "sm_1", false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sm_1"), "{err}");
}

#[test]
fn glob_matches() {
    assert!(glob("gemm_*", "gemm_f16_nn"));
    assert!(glob("attn_fwd_*_d64", "attn_fwd_bf16_d64"));
    assert!(!glob("attn_fwd_*_d64", "attn_fwd_bf16_d128"));
    assert!(glob("fill_f32", "fill_f32"));
    assert!(!glob("fill_f32", "fill_f16"));
}
