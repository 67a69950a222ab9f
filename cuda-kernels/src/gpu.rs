//! The device handle: a CUDA context and stream, the per-architecture module
//! cache, and the launch of a [`Launch`] through the driver API.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
};

use crate::launch::{DevPtr, Launch};
use crate::module::Module;
use crate::nvrtc::compile_cubin;
use crate::{Error, Result};

/// Shared memory a block may use without opting in.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// A CUDA device ready to run this crate's kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

/// Whether libcuda can be loaded. cudarc panics on first use when it cannot.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn driver_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver {
        op,
        msg: e.to_string(),
    }
}

impl Gpu {
    /// Opens device `ordinal`.
    ///
    /// Errors: [`Error::NoDriver`] ("no CUDA driver found") when libcuda is
    /// absent, [`Error::NoDevice`] when the driver finds no such device,
    /// [`Error::NoNvrtc`] when NVRTC (needed to compile kernels) is absent.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_available() {
            return Err(Error::NoDriver("libcuda.so could not be loaded".into()));
        }
        if !crate::nvrtc::nvrtc_available() {
            return Err(Error::NoNvrtc("libnvrtc.so.12 is not on the library path".into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::NoDevice(e.to_string()))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("compute_capability"))?;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The device architecture, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device address and length of `s` for a [`Launch`].
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> DevPtr<T> {
        let (addr, _sync) = s.device_ptr(&self.stream);
        DevPtr::from_raw(addr, s.len())
    }

    /// Copies host data to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(data).map_err(driver_err("upload"))
    }

    /// Copies a device buffer back to the host (waits for the stream).
    pub fn download<T: DeviceRepr>(&self, s: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(s).map_err(driver_err("download"))
    }

    /// Waits for every launch so far.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("synchronize"))
    }

    /// Loads (compiling if needed) the module of `m` for this device: cached
    /// in memory, and on disk by architecture and source hash under
    /// `$TESSERA_CUDA_CACHE` (default `$HOME/.cache/tessera/cuda`).
    pub fn module(&self, m: Module) -> Result<Arc<CudaModule>> {
        if let Some(module) = self.modules.lock().map_err(|_| poisoned())?.get(&m) {
            return Ok(module.clone());
        }
        let cubin = self.cubin(m)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(driver_err("load_module"))?;
        self.modules
            .lock()
            .map_err(|_| poisoned())?
            .insert(m, module.clone());
        Ok(module)
    }

    fn cubin(&self, m: Module) -> Result<Vec<u8>> {
        let path = cache_dir().map(|d| {
            d.join(format!(
                "{}-{:016x}-{}.cubin",
                m.file_name(),
                m.source_hash(),
                self.arch
            ))
        });
        if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            return Ok(bytes);
        }
        let compiled = compile_cubin(m, &self.arch, false)?;
        if let Some(p) = path {
            // The disk cache is an optimisation: failing to write it is not an error.
            let _ = p.parent().map(std::fs::create_dir_all);
            let _ = std::fs::write(&p, &compiled.cubin);
        }
        Ok(compiled.cubin)
    }

    fn function(&self, l: &Launch) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(&l.kernel) {
            return Ok(f.clone());
        }
        let f = self
            .module(l.module)?
            .load_function(&l.kernel)
            .map_err(driver_err("load_function"))?;
        self.functions
            .lock()
            .map_err(|_| poisoned())?
            .insert(l.kernel.clone(), f.clone());
        Ok(f)
    }

    /// Launches `l` on the stream (asynchronously).
    ///
    /// Errors: compilation or driver failures.
    ///
    /// # Safety
    /// Every pointer in `l` must address live device memory of this context
    /// with at least the length given to the wrapper that built `l`, until the
    /// kernel finishes; buffers the kernel writes must not be read or written
    /// by anything else meanwhile.
    pub unsafe fn launch(&self, l: &Launch) -> Result<()> {
        let f = self.function(l)?;
        if l.shared_mem > DEFAULT_SMEM_LIMIT {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                l.shared_mem as i32,
            )
            .map_err(driver_err("set_attribute"))?;
        }
        let mut bufs: Vec<Vec<u8>> = l.args.iter().map(|a| a.0.clone()).collect();
        let mut params: Vec<*mut c_void> = bufs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect();
        self.ctx.bind_to_thread().map_err(driver_err("bind_to_thread"))?;
        cudarc::driver::result::launch_kernel(
            f.cu_function(),
            (l.grid[0], l.grid[1], l.grid[2]),
            (l.block[0], l.block[1], l.block[2]),
            l.shared_mem,
            self.stream.cu_stream(),
            &mut params,
        )
        .map_err(driver_err("launch_kernel"))
    }
}

fn poisoned() -> Error {
    Error::Driver {
        op: "module cache",
        msg: "a thread panicked while holding the cache lock".into(),
    }
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TESSERA_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera/cuda"))
}
