//! The backend of the shared test bodies: any [`Runtime`], the CPU emulator
//! under a chosen thread order or a real GPU. Buffers live as long as the
//! backend.

use std::cell::RefCell;

use tessera_cuda_kernels::emu::{Emu, ThreadOrder};
use tessera_cuda_kernels::{DevPtr, Gpu, Launch, Runtime};

use super::Exec;

pub struct RtExec {
    rt: Box<dyn Runtime>,
    name: String,
    bufs: RefCell<Vec<u64>>,
}

impl RtExec {
    /// An emulated device of its own whose threads run in `order`.
    pub fn emu(order: ThreadOrder) -> Self {
        let name = match order {
            ThreadOrder::Forward => "emu(forward)".into(),
            ThreadOrder::Reverse => "emu(reverse)".into(),
            ThreadOrder::Random(s) => format!("emu(random {s})"),
        };
        RtExec::new(Box::new(Emu::with_order(0, order, 1 << 30)), name)
    }

    /// GPU 0, or why there is none.
    pub fn gpu() -> Result<Self, String> {
        let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
        let name = format!("gpu({})", gpu.arch());
        Ok(RtExec::new(Box::new(gpu), name))
    }

    fn new(rt: Box<dyn Runtime>, name: String) -> Self {
        RtExec {
            rt,
            name,
            bufs: RefCell::new(Vec::new()),
        }
    }
}

impl Exec for RtExec {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn upload<T: Copy>(&self, data: &[T]) -> DevPtr<T> {
        // SAFETY: viewing plain-old-data elements as bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        let addr = self.rt.alloc(bytes.len()).expect("alloc");
        self.bufs.borrow_mut().push(addr);
        // SAFETY: `addr` holds `bytes.len()` bytes.
        unsafe { self.rt.copy_htod(addr, bytes) }.expect("upload");
        DevPtr::from_raw(addr, data.len())
    }

    fn download<T: Copy>(&self, p: DevPtr<T>) -> Vec<T> {
        let mut bytes = vec![0u8; p.len() * std::mem::size_of::<T>()];
        // SAFETY: `p` comes from `upload` (the emulator checks the range).
        unsafe { self.rt.copy_dtoh(p.addr(), &mut bytes) }.expect("download");
        // SAFETY: `bytes` holds `p.len()` values of `T`, possibly unaligned.
        (0..p.len())
            .map(|i| unsafe { std::ptr::read_unaligned((bytes.as_ptr() as *const T).add(i)) })
            .collect()
    }

    fn run(&self, l: &Launch) -> Result<(), String> {
        // SAFETY: the test bodies only pass buffers uploaded here, which
        // live as long as `self`, with the lengths the wrappers checked.
        unsafe { self.rt.launch(l) }.map_err(|e| e.to_string())?;
        self.rt.synchronize().map_err(|e| e.to_string())
    }
}

impl Drop for RtExec {
    fn drop(&mut self) {
        for &addr in self.bufs.borrow().iter() {
            // SAFETY: allocated in `upload`; nothing uses it any more.
            let _ = unsafe { self.rt.free(addr) };
        }
    }
}
