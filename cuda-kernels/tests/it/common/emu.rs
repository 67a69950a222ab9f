//! The CPU emulator backend: compiles `src/kernels/*.cu` as C++ with
//! `emu/cuda_emu.h` into a shared library (cached by a hash of the sources
//! and flags) and runs [`Launch`]es on it.
//!
//! The C++ is compiled here, by the test harness, rather than by a build
//! script: the library itself never needs a C++ compiler, no feature flag
//! has to be remembered for the emulator tests to run, and the harness can
//! hash exactly what it compiles.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tessera_cuda_kernels::{DevPtr, Launch, Module};

use super::Exec;

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    *const u32,
    *const u32,
    usize,
    *mut *mut c_void,
    u64,
) -> *const c_char;

/// Deliberately broken kernels of `emu/faults.cu`, for the emulator's own tests.
pub const FAULT_KERNELS: [&str; 8] = [
    "fault_missing_barrier",
    "fault_fixed_barrier",
    "fault_divergent_barrier",
    "fault_early_exit",
    "fault_shfl_exited_lane",
    "fault_deadlock",
    "fault_cp_async_no_wait",
    "fault_out_of_bounds",
];

// No _FORTIFY_SOURCE: its longjmp check rejects the jumps between fiber stacks.
const FLAGS: &[&str] = &["-std=c++17", "-O1", "-fPIC", "-w", "-U_FORTIFY_SOURCE"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Builds (or reuses) the emulator library and returns its path.
fn build() -> Result<PathBuf, String> {
    let dir = crate_dir();
    let shim = dir.join("emu/cuda_emu.h");
    let runtime = dir.join("emu/runtime.cpp");
    let common = dir.join("src/kernels/common.cuh");
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in [&shim, &runtime, &common] {
        h = fnv(h, &std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    for m in Module::ALL {
        h = fnv(h, m.source().as_bytes());
        h = fnv(h, m.kernels().join(",").as_bytes());
    }
    let faults = dir.join("emu/faults.cu");
    h = fnv(
        h,
        &std::fs::read(&faults).map_err(|e| format!("{}: {e}", faults.display()))?,
    );
    h = fnv(h, FLAGS.join(" ").as_bytes());
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda-emu-{h:016x}"));
    let lib = out.join("libkernels_emu.so");
    if lib.exists() {
        return Ok(lib);
    }
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let mut units = vec![runtime.clone()];
    for m in Module::ALL {
        let mut src = format!(
            "#include \"{}\"\n#include \"{}\"\n",
            common.display(),
            dir.join("src/kernels").join(m.file_name()).display()
        );
        for k in m.kernels() {
            src += &format!("EMU_REGISTER({k})\n");
        }
        let p = out.join(format!("{}.cpp", m.file_name()));
        std::fs::write(&p, src).map_err(|e| e.to_string())?;
        units.push(p);
    }
    let mut src = format!(
        "#include \"{}\"\n#include \"{}\"\n",
        common.display(),
        faults.display()
    );
    for k in FAULT_KERNELS {
        src += &format!("EMU_REGISTER({k})\n");
    }
    let p = out.join("faults.cu.cpp");
    std::fs::write(&p, src).map_err(|e| e.to_string())?;
    units.push(p);
    let children: Vec<_> = units
        .iter()
        .map(|u| {
            let obj = out.join(format!(
                "{}.o",
                u.file_name().unwrap_or_default().to_string_lossy()
            ));
            let child = Command::new("g++")
                .args(FLAGS)
                .arg("-include")
                .arg(&shim)
                .arg("-c")
                .arg(u)
                .arg("-o")
                .arg(&obj)
                .spawn()
                .map_err(|e| format!("g++ not runnable: {e}"));
            (child, obj)
        })
        .collect();
    let mut objs = Vec::new();
    for (child, obj) in children {
        let status = child?.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("g++ failed on {}", obj.display()));
        }
        objs.push(obj);
    }
    let tmp = out.join("libkernels_emu.so.tmp");
    let status = Command::new("g++")
        .arg("-shared")
        .arg("-o")
        .arg(&tmp)
        .args(&objs)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("linking the emulator failed".into());
    }
    std::fs::rename(&tmp, &lib).map_err(|e| e.to_string())?;
    Ok(lib)
}

struct Lib {
    _lib: libloading::Library,
    launch: LaunchFn,
}

fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = build().unwrap_or_else(|e| panic!("building the CUDA emulator: {e}"));
        load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
    })
}

fn load(path: &Path) -> Result<Lib, String> {
    // SAFETY: the library is ours, built above; `emu_launch` has the
    // signature of `LaunchFn` (runtime.cpp).
    unsafe {
        let lib = libloading::Library::new(path).map_err(|e| e.to_string())?;
        let f: libloading::Symbol<LaunchFn> = lib.get(b"emu_launch").map_err(|e| e.to_string())?;
        let launch = *f;
        Ok(Lib { _lib: lib, launch })
    }
}

/// Bytes of canary around every buffer: a kernel writing past either end
/// changes them, and every launch checks them.
const CANARY: usize = 64;
const CANARY_BYTE: u8 = 0xA5;

/// The emulator with one thread order: 0 forward, 1 reverse, else random
/// with this seed.
pub struct Emu {
    pub mode: u64,
    bufs: RefCell<Vec<(Box<[u128]>, usize)>>,
}

impl Emu {
    pub fn new(mode: u64) -> Self {
        lib();
        Emu {
            mode,
            bufs: RefCell::new(Vec::new()),
        }
    }

    fn check_canaries(&self) -> Result<(), String> {
        for (i, (b, len)) in self.bufs.borrow().iter().enumerate() {
            // SAFETY: the box holds CANARY + len + CANARY bytes (rounded up).
            let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, 2 * CANARY + len) };
            if bytes[..CANARY]
                .iter()
                .chain(&bytes[CANARY + len..])
                .any(|&c| c != CANARY_BYTE)
            {
                return Err(format!("a kernel wrote outside buffer {i} ({len} bytes)"));
            }
        }
        Ok(())
    }
}

impl Exec for Emu {
    fn name(&self) -> String {
        match self.mode {
            0 => "emu(forward)".into(),
            1 => "emu(reverse)".into(),
            s => format!("emu(random {s})"),
        }
    }

    fn upload<T: Copy>(&self, data: &[T]) -> DevPtr<T> {
        let len = std::mem::size_of_val(data);
        let mut b = vec![0u128; (2 * CANARY + len).div_ceil(16)].into_boxed_slice();
        // SAFETY: `b` has room for CANARY + len + CANARY bytes.
        unsafe {
            let p = b.as_mut_ptr() as *mut u8;
            std::ptr::write_bytes(p, CANARY_BYTE, b.len() * 16);
            std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, p.add(CANARY), len);
        }
        let addr = b.as_ptr() as u64 + CANARY as u64;
        self.bufs.borrow_mut().push((b, len));
        DevPtr::from_raw(addr, data.len())
    }

    fn download<T: Copy>(&self, p: DevPtr<T>) -> Vec<T> {
        let bufs = self.bufs.borrow();
        let known = bufs.iter().any(|(b, len)| {
            b.as_ptr() as u64 + CANARY as u64 == p.addr() && *len == p.len() * std::mem::size_of::<T>()
        });
        assert!(known, "download of a pointer this emulator did not upload");
        // SAFETY: `p` is one of our live buffers with `p.len()` elements.
        unsafe { std::slice::from_raw_parts(p.addr() as *const T, p.len()).to_vec() }
    }

    fn run(&self, l: &Launch) -> Result<(), String> {
        if l.grid.contains(&0) {
            return Ok(());
        }
        let name = CString::new(l.kernel.clone()).map_err(|e| e.to_string())?;
        let mut args: Vec<Vec<u8>> = l.args.iter().map(|a| a.0.clone()).collect();
        let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(|a| a.as_mut_ptr() as *mut c_void).collect();
        // SAFETY: every pointer argument of `l` addresses one of our buffers,
        // checked for length by the wrapper that built `l`.
        let err = unsafe {
            (lib().launch)(
                name.as_ptr(),
                l.grid.as_ptr(),
                l.block.as_ptr(),
                l.shared_mem as usize,
                ptrs.as_mut_ptr(),
                self.mode,
            )
        };
        if !err.is_null() {
            // SAFETY: a NUL-terminated message owned by the emulator thread.
            return Err(format!(
                "{}: {}",
                l.kernel,
                unsafe { CStr::from_ptr(err) }.to_string_lossy()
            ));
        }
        self.check_canaries().map_err(|e| format!("{}: {e}", l.kernel))
    }
}
