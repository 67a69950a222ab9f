//! Backend-neutral description of a kernel launch.
//!
//! Every typed wrapper in [`crate::ops`] checks its arguments and returns a
//! [`Launch`]: the kernel, its grid and block, and its parameters packed the
//! way `cuLaunchKernel` expects them. The same `Launch` runs on a GPU
//! ([`crate::Gpu::launch`]) or, in this crate's tests, on the CPU emulator,
//! so both execute exactly the same parameters.

use std::marker::PhantomData;

use crate::module::Module;

/// Element types the kernels are instantiated for; `NAME` is the suffix of
/// the kernel names (`softmax_f32`, `softmax_bf16`, …).
pub trait KernelType: Copy + Default + Send + Sync + 'static {
    /// Kernel name suffix.
    const NAME: &'static str;
}
impl KernelType for f32 {
    const NAME: &'static str = "f32";
}
impl KernelType for half::f16 {
    const NAME: &'static str = "f16";
}
impl KernelType for half::bf16 {
    const NAME: &'static str = "bf16";
}
impl KernelType for i64 {
    const NAME: &'static str = "i64";
}
impl KernelType for i32 {
    const NAME: &'static str = "i32";
}
impl KernelType for u64 {
    const NAME: &'static str = "u64";
}
impl KernelType for u8 {
    const NAME: &'static str = "u8";
}

/// A device address with the number of `T` elements behind it, so launch
/// wrappers can check lengths. It does not own or borrow the memory: whoever
/// launches must keep the buffer alive until the kernel has finished.
#[derive(Debug)]
pub struct DevPtr<T> {
    addr: u64,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}
impl<T> PartialEq for DevPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.addr == o.addr && self.len == o.len
    }
}

impl<T> DevPtr<T> {
    /// Wraps a raw device address of `len` elements. Never fails; the
    /// address is only dereferenced by a launch, which is `unsafe`.
    pub fn from_raw(addr: u64, len: usize) -> Self {
        DevPtr {
            addr,
            len,
            _t: PhantomData,
        }
    }
    /// The null pointer with length 0, for optional parameters.
    pub fn null() -> Self {
        Self::from_raw(0, 0)
    }
    /// The address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One kernel parameter, as raw bytes in the parameter's C layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg(pub Vec<u8>);

impl Arg {
    /// A device pointer parameter.
    pub fn ptr<T>(p: DevPtr<T>) -> Self {
        Arg(p.addr.to_ne_bytes().to_vec())
    }
    /// An `int` parameter.
    pub fn i32(v: i32) -> Self {
        Arg(v.to_ne_bytes().to_vec())
    }
    /// A `long long` parameter.
    pub fn i64(v: i64) -> Self {
        Arg(v.to_ne_bytes().to_vec())
    }
    /// An `unsigned long long` parameter.
    pub fn u64(v: u64) -> Self {
        Arg(v.to_ne_bytes().to_vec())
    }
    /// A `float` parameter.
    pub fn f32(v: f32) -> Self {
        Arg(v.to_ne_bytes().to_vec())
    }
    /// A `double` parameter.
    pub fn f64(v: f64) -> Self {
        Arg(v.to_ne_bytes().to_vec())
    }
    /// A struct passed by value, given as its fields of 4 or 8 bytes each in
    /// declaration order (the structs of this crate have no padding).
    pub fn fields(fields: &[Arg]) -> Self {
        Arg(fields.iter().flat_map(|a| a.0.iter().copied()).collect())
    }
}

/// A fully checked kernel launch, ready for any backend. A grid with a zero
/// dimension means there is nothing to do (empty tensors): backends skip it.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Kernel family (source file) that holds the kernel.
    pub module: Module,
    /// `extern "C"` name of the kernel.
    pub kernel: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_mem: u32,
    /// Parameters in order.
    pub args: Vec<Arg>,
}

/// Grid size for a grid-stride loop over `n` items with `block` threads per
/// block: enough blocks to fill a large GPU, at least one.
pub(crate) fn grid_for(n: u64, block: u32) -> u32 {
    n.div_ceil(block as u64).clamp(1, 65_535 * 4) as u32
}

/// `usize` → `i64` for kernel parameters, with an error past `i64::MAX`.
pub(crate) fn to_i64(op: &'static str, what: &str, v: usize) -> crate::Result<i64> {
    i64::try_from(v).map_err(|_| crate::Error::arg(op, format!("{what} = {v} does not fit in i64")))
}

/// `usize` → `i32` for kernel parameters, with an error past `i32::MAX`.
pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> crate::Result<i32> {
    i32::try_from(v).map_err(|_| crate::Error::arg(op, format!("{what} = {v} does not fit in i32")))
}

/// Checks that `p` holds at least `need` elements.
pub(crate) fn check_len<T>(op: &'static str, what: &str, p: &DevPtr<T>, need: usize) -> crate::Result<()> {
    if p.len < need {
        return Err(crate::Error::arg(
            op,
            format!("{what} has {} elements, needs {need}", p.len),
        ));
    }
    Ok(())
}

/// `a * b` with an error on overflow.
pub(crate) fn mul(op: &'static str, a: usize, b: usize) -> crate::Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| crate::Error::arg(op, format!("size {a} x {b} overflows")))
}
