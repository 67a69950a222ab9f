//! [`Storage`]: the flat, typed, 64-byte-aligned buffer behind tensors, either
//! owned heap memory, a read-only window into a memory-mapped file, or (with
//! the feature `cuda`) memory on a GPU.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::alloc::{self, ALIGN};
use crate::{DType, Device, Element, Error, Result};

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes held right now by owned tensor storage in this process (memory-mapped
/// storage is not counted). Tests use it to check what autograd keeps alive.
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// A tensor's elements: `len` values of one dtype on one device.
pub struct Storage {
    buf: Buffer,
    dtype: DType,
    len: usize,
    device: Device,
}

enum Buffer {
    Owned {
        ptr: NonNull<u8>,
        bytes: usize,
        /// The meter charged with the buffer, if its thread had entered one.
        meter: Option<Arc<crate::meter::Meter>>,
    },
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
    },
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::DeviceBuffer),
}

// SAFETY: the buffer is plain bytes owned by this value (or shared read-only
// through the Arc'd mapping); mutation needs `&mut Storage`.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// `len` zero-valued elements of type `T` on the CPU. Errors with
    /// [`Error::OutOfMemory`] naming `op` and the bytes when the memory
    /// cannot be allocated (the process does not abort).
    pub fn zeros<T: Element>(op: &'static str, len: usize) -> Result<Self> {
        let (mut s, zeroed) = Self::allocate::<T>(op, len)?;
        if !zeroed {
            s.raw_bytes_mut().fill(0);
        }
        Ok(s)
    }

    /// `len` elements of type `T` on the CPU whose values are unspecified
    /// (zeros or values of an earlier tensor, never uninitialised memory):
    /// for kernels that overwrite every element. Errors as [`Storage::zeros`].
    pub fn for_overwrite<T: Element>(op: &'static str, len: usize) -> Result<Self> {
        Ok(Self::allocate::<T>(op, len)?.0)
    }

    fn allocate<T: Element>(op: &'static str, len: usize) -> Result<(Self, bool)> {
        let oom = |bytes: Option<usize>| {
            let bytes = bytes.map_or_else(|| "more than usize::MAX".into(), |b| b.to_string());
            Error::out_of_memory(
                op,
                format!("cannot allocate {bytes} bytes for {len} elements of {}", T::DTYPE),
            )
        };
        let bytes = len
            .checked_mul(T::DTYPE.size_in_bytes())
            .ok_or_else(|| oom(None))?;
        let (ptr, zeroed) = if bytes == 0 {
            // A dangling but aligned pointer: never dereferenced for 0 bytes.
            (NonNull::new(ALIGN as *mut u8).expect("ALIGN is non-zero"), true)
        } else {
            alloc::allocate(bytes).ok_or_else(|| oom(Some(bytes)))?
        };
        LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
        crate::profile::note_alloc(bytes);
        let s = Storage {
            buf: Buffer::Owned {
                ptr,
                bytes,
                meter: crate::meter::charge(bytes),
            },
            dtype: T::DTYPE,
            len,
            device: Device::Cpu,
        };
        Ok((s, zeroed))
    }

    /// A copy of `data` in a fresh aligned buffer. Errors as
    /// [`Storage::zeros`].
    pub fn from_slice<T: Element>(op: &'static str, data: &[T]) -> Result<Self> {
        let mut s = Self::for_overwrite::<T>(op, data.len())?;
        s.as_mut_slice::<T>(op)?.copy_from_slice(data);
        Ok(s)
    }

    /// `len` elements of `dtype` read in place from `map[start ..]`. Returns
    /// `None` when the window is out of bounds, misaligned for the dtype, or
    /// (for bool) holds a byte other than 0 or 1; callers then copy instead.
    pub(crate) fn mapped(map: Arc<memmap2::Mmap>, start: usize, dtype: DType, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(dtype.size_in_bytes())?;
        let window = map.get(start..start.checked_add(bytes)?)?;
        if !(window.as_ptr() as usize).is_multiple_of(dtype.size_in_bytes()) {
            return None;
        }
        if dtype == DType::Bool && window.iter().any(|&b| b > 1) {
            return None;
        }
        Some(Storage {
            buf: Buffer::Mapped { map, start },
            dtype,
            len,
            device: Device::Cpu,
        })
    }

    /// `len` elements of `dtype` held by `buf` on its GPU.
    #[cfg(feature = "cuda")]
    pub(crate) fn from_device(buf: crate::cuda::DeviceBuffer, dtype: DType, len: usize) -> Self {
        debug_assert_eq!(buf.bytes(), len * dtype.size_in_bytes());
        let device = buf.state().device();
        Storage {
            buf: Buffer::Cuda(buf),
            dtype,
            len,
            device,
        }
    }

    /// `bytes.len() / size` elements of `dtype` copied from host bytes laid
    /// out as in memory (a download from a GPU). Errors, naming `op`, when
    /// the host memory is out.
    #[cfg(feature = "cuda")]
    pub(crate) fn from_raw_bytes(op: &'static str, dtype: DType, bytes: &[u8]) -> Result<Self> {
        crate::with_dtype!(dtype, T => Storage::from_bytes::<T>(op, bytes))
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn device_buffer(&self) -> Option<&crate::cuda::DeviceBuffer> {
        match &self.buf {
            Buffer::Cuda(b) => Some(b),
            _ => None,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the storage holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the elements are read in place from a memory-mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.buf, Buffer::Mapped { .. })
    }

    /// The device the elements live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The raw bytes, little-endian as in memory.
    ///
    /// # Panics
    /// When the storage is on a GPU (copy it with [`crate::Tensor::cpu`]
    /// first, or use [`Storage::try_as_slice`], which returns an error).
    pub fn as_bytes(&self) -> &[u8] {
        let bytes = self.len * self.dtype.size_in_bytes();
        match &self.buf {
            // SAFETY: the allocation holds `bytes` initialised bytes.
            Buffer::Owned { ptr, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), bytes) },
            Buffer::Mapped { map, start } => &map[*start..*start + bytes],
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => panic!("{}", on_device("as_bytes", self.device)),
        }
    }

    /// The elements as a typed slice, or an error when `T` is not the dtype
    /// or the storage is on a GPU.
    pub fn try_as_slice<T: Element>(&self) -> Result<&[T]> {
        if !self.device.is_cpu() {
            return Err(on_device("as_slice", self.device));
        }
        if T::DTYPE != self.dtype {
            return Err(Error::dtype(
                "as_slice",
                format!("storage holds {} but {} was requested", self.dtype, T::DTYPE),
            ));
        }
        let bytes = self.as_bytes();
        // SAFETY: dtype matches T; the pointer is aligned (owned buffers are
        // 64-aligned, mapped ones are checked at creation); bool bytes are
        // kept 0/1 by every writer and checked when mapped.
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, self.len) })
    }

    /// The elements as a typed slice. CPU kernels call this after
    /// dispatching on the dtype, so a mismatch is a bug in tessera; GPU
    /// storage reaching it means an op without a CUDA path let a GPU tensor
    /// through, and the panic says so.
    pub(crate) fn as_slice<T: Element>(&self) -> &[T] {
        match self.try_as_slice() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// A copy on the same device (a mapped storage becomes owned memory).
    /// Errors, naming `op`, when the copy cannot be allocated
    /// ([`Error::OutOfMemory`] with the elements and bytes on the host) or
    /// the GPU driver reports an error.
    pub fn try_clone(&self, op: &'static str) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if let Buffer::Cuda(b) = &self.buf {
            return Ok(Storage::from_device(b.try_clone(op)?, self.dtype, self.len));
        }
        crate::with_dtype!(self.dtype, T => Storage::from_bytes::<T>(op, self.as_bytes()))
    }

    /// The elements as a mutable typed slice. A mapped storage is first
    /// copied into owned memory (copy-on-write); that copy failing for lack
    /// of memory is an [`Error::OutOfMemory`] naming `op`, the elements and
    /// the bytes.
    pub(crate) fn as_mut_slice<T: Element>(&mut self, op: &'static str) -> Result<&mut [T]> {
        assert!(self.device.is_cpu(), "{}", on_device("as_mut_slice", self.device));
        assert_eq!(T::DTYPE, self.dtype, "kernel dispatched on the wrong dtype");
        if let Buffer::Mapped { .. } = self.buf {
            *self = Storage::from_bytes::<T>(op, self.as_bytes())?;
        }
        let len = self.len;
        let bytes = self.raw_bytes_mut();
        // SAFETY: as in `try_as_slice`; the buffer is owned and borrowed mutably.
        Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, len) })
    }

    /// An owned copy of `bytes` laid out as `T`s in memory
    /// (`bytes.len()` a multiple of `T`'s size).
    fn from_bytes<T: Element>(op: &'static str, bytes: &[u8]) -> Result<Self> {
        let mut s = Storage::for_overwrite::<T>(op, bytes.len() / T::DTYPE.size_in_bytes())?;
        s.raw_bytes_mut().copy_from_slice(bytes);
        Ok(s)
    }

    fn raw_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            // SAFETY: the allocation holds `bytes` initialised bytes, uniquely borrowed.
            Buffer::Owned { ptr, bytes, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *bytes)
            },
            Buffer::Mapped { .. } => unreachable!("mapped storage is copied before mutation"),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => unreachable!("GPU storage is rejected before mutation"),
        }
    }
}

/// The error for host access to GPU storage.
fn on_device(op: &'static str, device: Device) -> Error {
    Error::device(
        op,
        format!(
            "not implemented on {device} (host access to device memory); call .to_device(Device::Cpu) first"
        ),
    )
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Buffer::Owned {
            ptr,
            bytes,
            ref meter,
        } = self.buf
        {
            LIVE_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            if let Some(m) = meter {
                m.release(bytes);
            }
            if bytes > 0 {
                // SAFETY: allocated by `alloc::allocate(bytes)` in `allocate`.
                unsafe { alloc::free(ptr, bytes) };
            }
        }
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({} x {} on {})", self.len, self.dtype, self.device)
    }
}
