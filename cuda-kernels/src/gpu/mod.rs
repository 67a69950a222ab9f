//! The device handle of a real GPU: a CUDA context and stream, the
//! per-architecture module cache, the launch of a [`Launch`] through the
//! driver API, and the [`Runtime`] over them (memory in `memory.rs`, the
//! cuBLAS GEMM in `blas.rs`).

mod blas;
mod memory;

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, PinnedHostSlice,
};

use crate::launch::{DevPtr, Launch};
use crate::module::Module;
use crate::nvrtc::compile_cubin;
use crate::ops::gemm::GemmShape;
use crate::runtime::{DeviceInfo, Runtime, RuntimeKind};
use crate::{Error, Result};

/// Shared memory a block may use without opting in.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// A CUDA device ready to run this crate's kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Pinned host memory small copies go through (see `memory.rs`).
    staging: Mutex<Option<PinnedHostSlice<u8>>>,
    /// The cuBLAS handle, created on the first f32 GEMM.
    blas: Mutex<Option<Arc<CudaBlas>>>,
}

/// Whether libcuda can be loaded. cudarc panics on first use when it cannot.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The number of GPUs the driver reports (0 without a driver).
pub fn device_count() -> usize {
    if !driver_available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
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
        let attr = |a| {
            ctx.attribute(a)
                .map(|v| v.max(0) as u32)
                .map_err(driver_err("device attribute"))
        };
        use sys::CUdevice_attribute as A;
        let info = DeviceInfo {
            ordinal,
            kind: RuntimeKind::Driver,
            name: ctx.name().map_err(driver_err("device name"))?,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            total_memory: ctx.total_mem().map_err(driver_err("total memory"))?,
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_shared_memory_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        };
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
            blas: Mutex::new(None),
        })
    }

    /// The device architecture, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        self.info.arch()
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
                self.arch()
            ))
        });
        if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            return Ok(bytes);
        }
        let compiled = compile_cubin(m, &self.arch(), false)?;
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

    /// Launches `l` on the stream (asynchronously); a grid with a zero
    /// dimension does nothing.
    ///
    /// Errors: compilation or driver failures.
    ///
    /// # Safety
    /// Every pointer in `l` must address live device memory of this context
    /// with at least the length given to the wrapper that built `l`, until the
    /// kernel finishes; buffers the kernel writes must not be read or written
    /// by anything else meanwhile.
    pub unsafe fn launch(&self, l: &Launch) -> Result<()> {
        if l.grid.contains(&0) {
            return Ok(());
        }
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

impl Runtime for Gpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.alloc_bytes(bytes)
    }

    unsafe fn free(&self, addr: u64) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_bytes(addr) }
    }

    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.htod(dst, src) }
    }

    unsafe fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.dtoh(src, dst) }
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.dtod(dst, src, bytes) }
    }

    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.fill(dst, value, bytes) }
    }

    unsafe fn launch(&self, l: &Launch) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { Gpu::launch(self, l) }
    }

    unsafe fn sgemm(&self, g: &GemmShape, a: DevPtr<f32>, b: DevPtr<f32>, c: DevPtr<f32>) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.cublas_sgemm(g, a, b, c) }
    }

    fn synchronize(&self) -> Result<()> {
        Gpu::synchronize(self)
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
