//! The real-device backend of the shared test bodies.

use std::cell::RefCell;

use cudarc::driver::CudaSlice;
use tessera_cuda_kernels::{DevPtr, Gpu, Launch};

use super::Exec;

pub struct GpuExec {
    pub gpu: Gpu,
    bufs: RefCell<Vec<CudaSlice<u8>>>,
}

impl GpuExec {
    /// Opens device 0, or says why not.
    pub fn open() -> Result<Self, String> {
        Gpu::new(0)
            .map(|gpu| GpuExec {
                gpu,
                bufs: RefCell::new(Vec::new()),
            })
            .map_err(|e| e.to_string())
    }
}

impl Exec for GpuExec {
    fn name(&self) -> String {
        format!("gpu({})", self.gpu.arch())
    }

    fn upload<T: Copy>(&self, data: &[T]) -> DevPtr<T> {
        // SAFETY: viewing plain-old-data elements as bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().max(16), 0);
        let s = self.gpu.upload(&padded).expect("upload");
        let addr = self.gpu.ptr(&s).addr();
        self.bufs.borrow_mut().push(s);
        DevPtr::from_raw(addr, data.len())
    }

    fn download<T: Copy>(&self, p: DevPtr<T>) -> Vec<T> {
        let bufs = self.bufs.borrow();
        let s = bufs
            .iter()
            .find(|s| self.gpu.ptr(*s).addr() == p.addr())
            .expect("download of a pointer not uploaded here");
        let bytes = self.gpu.download(s).expect("download");
        let n = p.len();
        let mut out: Vec<T> = Vec::with_capacity(n);
        // SAFETY: `bytes` holds at least n * size_of::<T>() bytes of T values.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr() as *mut u8,
                n * std::mem::size_of::<T>(),
            );
            out.set_len(n);
        }
        out
    }

    fn run(&self, l: &Launch) -> Result<(), String> {
        if l.grid.contains(&0) {
            return Ok(());
        }
        // SAFETY: the test bodies only pass buffers uploaded here, which
        // live as long as `self`, with the lengths the wrappers checked.
        unsafe { self.gpu.launch(l) }.map_err(|e| e.to_string())?;
        self.gpu.synchronize().map_err(|e| e.to_string())
    }
}
