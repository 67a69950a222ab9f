//! Run-time compilation of the kernel families with NVRTC, straight to
//! machine code (CUBIN) for one architecture, and the parser of ptxas'
//! resource report (`--ptxas-options=-v`).

use std::ffi::{c_char, CStr, CString};

use cudarc::nvrtc::sys;

use crate::module::Module;
use crate::{Error, Result};

/// A compiled family: the CUBIN and NVRTC's log (with ptxas' report when
/// compiled `verbose`).
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Machine code for the requested architecture.
    pub cubin: Vec<u8>,
    /// The compilation log.
    pub log: String,
}

/// Whether libnvrtc can be loaded. cudarc panics on first use when it
/// cannot, so every entry point asks this first.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Compiles `module` for `arch` (e.g. `"sm_80"`) to CUBIN. `verbose` adds
/// `--ptxas-options=-v` so the log carries the resource report.
///
/// Errors: [`Error::NoNvrtc`] when libnvrtc is missing, [`Error::Compile`]
/// with the log when compilation fails.
pub fn compile_cubin(module: Module, arch: &str, verbose: bool) -> Result<Compiled> {
    if !nvrtc_available() {
        return Err(Error::NoNvrtc(
            "libnvrtc.so.12 is not on the library path (set LD_LIBRARY_PATH, see cuda-kernels/ci-setup.sh)"
                .into(),
        ));
    }
    let src = CString::new(module.full_source()).map_err(|e| Error::arg("compile_cubin", e.to_string()))?;
    let name = CString::new(module.file_name()).map_err(|e| Error::arg("compile_cubin", e.to_string()))?;
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "-lineinfo".to_string(),
    ];
    if verbose {
        opts.push("--ptxas-options=-v".to_string());
    }
    let opts: Vec<CString> = opts
        .into_iter()
        .map(|o| CString::new(o).expect("options have no NUL"))
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let fail = |log: String| Error::Compile {
        module: module.file_name(),
        arch: arch.to_string(),
        log,
    };
    // SAFETY: the program handle is created, used and destroyed here; every
    // pointer passed outlives the calls, and buffers are sized from NVRTC's
    // own size queries.
    unsafe {
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        let r = sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail(format!("nvrtcCreateProgram: {r:?}")));
        }
        let r = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut log_size = 0usize;
        sys::nvrtcGetProgramLogSize(prog, &mut log_size);
        let mut log_buf = vec![0 as c_char; log_size.max(1)];
        sys::nvrtcGetProgramLog(prog, log_buf.as_mut_ptr());
        let log = CStr::from_ptr(log_buf.as_ptr()).to_string_lossy().into_owned();
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            sys::nvrtcDestroyProgram(&mut prog);
            return Err(fail(log));
        }
        let mut size = 0usize;
        sys::nvrtcGetCUBINSize(prog, &mut size);
        let mut cubin = vec![0u8; size];
        let r = sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char);
        sys::nvrtcDestroyProgram(&mut prog);
        if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return Err(fail(format!("nvrtcGetCUBIN: {r:?}\n{log}")));
        }
        Ok(Compiled { cubin, log })
    }
}

/// Resources ptxas reported for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// Kernel name.
    pub name: String,
    /// Target, e.g. `sm_90`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
    /// Stack frame (local memory) in bytes.
    pub stack_bytes: u32,
    /// Bytes of register spill stores.
    pub spill_stores: u32,
    /// Bytes of register spill loads.
    pub spill_loads: u32,
}

/// Parses ptxas' `-v` report out of an NVRTC log, one entry per kernel.
/// Lines that are not part of the report are ignored.
pub fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let name = parts.next().unwrap_or_default().to_string();
            let arch = rest
                .split("for '")
                .nth(1)
                .and_then(|s| s.split('\'').next())
                .unwrap_or_default();
            out.push(KernelResources {
                name,
                arch: arch.to_string(),
                ..Default::default()
            });
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            cur.stack_bytes = number_before(line, "bytes stack frame");
            cur.spill_stores = number_before(line, "bytes spill stores");
            cur.spill_loads = number_before(line, "bytes spill loads");
        } else if line.contains("Used") && line.contains("registers") {
            cur.registers = number_before(line, "registers");
            cur.shared_bytes = number_before(line, "bytes smem");
        }
    }
    out
}

/// The integer right before `label` in `line`, 0 when absent.
fn number_before(line: &str, label: &str) -> u32 {
    line.find(label)
        .and_then(|i| line[..i].split_whitespace().last())
        .and_then(|w| w.trim_start_matches(',').parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_report() {
        let log = "ptxas info    : Compiling entry function 'k1' for 'sm_80'\n\
ptxas info    : Function properties for k1\n\
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 34 registers, used 1 barriers, 1024 bytes smem, 392 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'k2' for 'sm_90'\n\
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 20 registers, used 0 barriers, 384 bytes cmem[0]\n";
        let r = parse_ptxas_report(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                name: "k1".into(),
                arch: "sm_80".into(),
                registers: 34,
                shared_bytes: 1024,
                stack_bytes: 16,
                spill_stores: 8,
                spill_loads: 4
            }
        );
        assert_eq!(
            (r[1].name.as_str(), r[1].registers, r[1].shared_bytes),
            ("k2", 20, 0)
        );
    }
}
