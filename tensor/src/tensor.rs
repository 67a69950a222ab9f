//! [`Tensor`]: an immutable n-d array value — shared storage plus a layout.

use std::sync::Arc;

use crate::strided::{fill_rows, read_row};
use crate::{DType, Device, Element, Error, Layout, Result, ShapeArg, Storage};

/// An n-dimensional array with a runtime dtype, shape and device.
///
/// A `Tensor` is a value: cloning it is O(1) and shares the storage, and
/// every operation returns a new tensor. View operations (transpose, narrow,
/// flip, expand, ...) only rewrite the [`Layout`]; other operations write a
/// fresh contiguous result.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
}

impl Tensor {
    /// A tensor of `shape` holding `data` in row-major order. Errors when the
    /// element count does not match the shape, or memory is out.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Self::from_slice(&data, shape)
    }

    /// A tensor of `shape` holding a copy of `data` in row-major order. Errors
    /// when the element count does not match the shape, or memory is out.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        let numel = checked_numel("from_slice", shape)?;
        if numel != data.len() {
            return Err(Error::shape(
                "from_slice",
                format!(
                    "{} elements do not fill shape {shape:?} ({numel} elements)",
                    data.len()
                ),
            ));
        }
        Ok(Self::from_parts(
            Storage::from_slice("from_slice", data)?,
            Layout::contiguous(shape),
        ))
    }

    /// A 0-dimensional tensor holding `v`.
    ///
    /// # Panics
    /// When not even one element can be allocated (as `Box::new` would).
    pub fn scalar<T: Element>(v: T) -> Tensor {
        let storage = Storage::from_slice("scalar", &[v]).unwrap_or_else(|e| panic!("{e}"));
        Self::from_parts(storage, Layout::contiguous(&[]))
    }

    /// A tensor over `storage` seen through `layout`. Errors when the
    /// layout reaches an index outside the storage.
    pub fn from_storage(storage: Storage, layout: Layout) -> Result<Tensor> {
        Self::from_shared(Arc::new(storage), layout)
    }

    /// A tensor sharing `storage`, seen through `layout`. Errors when the
    /// layout reaches an index outside the storage.
    pub fn from_shared(storage: Arc<Storage>, layout: Layout) -> Result<Tensor> {
        if let Some((_, hi)) = layout.checked_range()? {
            if hi > storage.len() {
                return Err(Error::index(
                    "from_storage",
                    format!(
                        "layout with shape {:?}, strides {:?}, offset {} reaches index {} of a storage of {} elements",
                        layout.shape(),
                        layout.strides(),
                        layout.offset(),
                        hi - 1,
                        storage.len()
                    ),
                ));
            }
        }
        Ok(Tensor { storage, layout })
    }

    /// A tensor over a storage and a layout known to fit it.
    pub(crate) fn from_parts(storage: Storage, layout: Layout) -> Tensor {
        debug_assert!(layout.storage_range().is_none_or(|(_, hi)| hi <= storage.len()));
        Tensor {
            storage: Arc::new(storage),
            layout,
        }
    }

    /// A new contiguous tensor of `shape` whose elements `fill` writes. The
    /// buffer is passed zeroed; `fill` receives it in row-major order.
    /// Errors, naming `op` (the operation whose result this is), when the
    /// element count overflows ([`Error::Arg`]) or the memory cannot be
    /// allocated ([`Error::OutOfMemory`], with the shape and the bytes).
    pub fn build<T: Element>(
        op: &'static str,
        shape: &[usize],
        fill: impl FnOnce(&mut [T]),
    ) -> Result<Tensor> {
        let mut storage = Self::allocate::<T>(op, shape, true)?;
        fill(storage.as_mut_slice::<T>(op)?);
        Ok(Self::from_parts(storage, Layout::contiguous(shape)))
    }

    /// Like [`Tensor::build`], but the buffer passed to `fill` holds
    /// unspecified values (a reused cached block): for kernels that write
    /// every element, so no time goes into zeroing first. Errors as
    /// [`Tensor::build`].
    pub fn build_overwrite<T: Element>(
        op: &'static str,
        shape: &[usize],
        fill: impl FnOnce(&mut [T]),
    ) -> Result<Tensor> {
        let mut storage = Self::allocate::<T>(op, shape, false)?;
        fill(storage.as_mut_slice::<T>(op)?);
        Ok(Self::from_parts(storage, Layout::contiguous(shape)))
    }

    /// The storage for a contiguous `shape`, zeroed when `zeroed`.
    fn allocate<T: Element>(op: &'static str, shape: &[usize], zeroed: bool) -> Result<Storage> {
        let numel = checked_numel(op, shape)?;
        let storage = if zeroed {
            Storage::zeros::<T>(op, numel)
        } else {
            Storage::for_overwrite::<T>(op, numel)
        };
        storage.map_err(|_| {
            Error::out_of_memory(
                op,
                format!(
                    "cannot allocate {} bytes for shape {shape:?} of {}",
                    numel as u128 * T::DTYPE.size_in_bytes() as u128,
                    T::DTYPE
                ),
            )
        })
    }

    /// The sizes of the dimensions.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The size of dimension `dim` (negative counts from the end).
    pub fn size(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[crate::dim_index("size", dim, self.ndim())?])
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// The device holding the elements.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// The layout (shape, strides, offset) within the storage.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The strides of each dimension, in elements.
    pub fn strides(&self) -> &[isize] {
        self.layout.strides()
    }

    /// The shared storage.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// True when the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// True when `self` and `other` share one storage buffer.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Mutable access to the storage when this tensor is its only owner.
    pub(crate) fn storage_mut(&mut self) -> Option<&mut Storage> {
        Arc::get_mut(&mut self.storage)
    }

    /// The same storage seen through another layout (views are built on this).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
        }
    }

    /// The elements in row-major order as a contiguous slice, when the
    /// tensor is contiguous; errors when `T` is not the dtype or the tensor
    /// is a non-contiguous view (call [`Tensor::contiguous`] first).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        let all = self.storage.try_as_slice::<T>()?;
        if !self.is_contiguous() {
            return Err(Error::shape(
                "as_slice",
                format!(
                    "tensor of shape {:?} with strides {:?} is not contiguous",
                    self.shape(),
                    self.strides()
                ),
            ));
        }
        if self.numel() == 0 {
            // An empty view's offset may lie past the end of its storage.
            return Ok(&[]);
        }
        let start = self.layout.offset();
        Ok(&all[start..start + self.numel()])
    }

    /// The elements in row-major order (copied from the GPU for a GPU
    /// tensor). Errors when `T` is not the dtype (use [`Tensor::to_dtype`]
    /// first) or a GPU copy fails.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        #[cfg(feature = "cuda")]
        if self.is_cuda() {
            return self.cpu()?.to_vec();
        }
        if T::DTYPE != self.dtype() {
            return Err(Error::dtype(
                "to_vec",
                format!("tensor is {} but Vec<{}> was requested", self.dtype(), T::DTYPE),
            ));
        }
        let mut out = try_vec("to_vec", self.shape())?;
        match self.as_slice::<T>() {
            Ok(s) => out.extend_from_slice(s),
            Err(_) => {
                out.resize(self.numel(), T::ZERO);
                self.copy_into(&mut out);
            }
        }
        Ok(out)
    }

    /// The single element of a one-element tensor (any shape), converted to
    /// `T`. Errors when the tensor has more or fewer than one element.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "to_scalar",
                format!(
                    "tensor of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        #[cfg(feature = "cuda")]
        if self.is_cuda() {
            return self.cpu()?.to_scalar();
        }
        let off = self.layout.offset();
        Ok(crate::with_dtype!(self.dtype(), S => convert_scalar::<S, T>(self.storage.as_slice::<S>()[off])))
    }

    /// A contiguous tensor with the same elements: `self` when already
    /// contiguous (no copy), else a row-major copy. Errors when the copy
    /// fails: a GPU copy (a driver error, out of device memory) is an
    /// [`Error::Device`] naming `contiguous`.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        if self.is_cuda() {
            return crate::cuda::contiguous(self);
        }
        crate::with_dtype!(self.dtype(), T => Tensor::build_overwrite::<T>("contiguous", self.shape(), |out| self.copy_into(out)))
    }

    /// Writes the elements in row-major order into `out` (`out.len() ==
    /// numel`, `T` the dtype — callers dispatch first).
    pub(crate) fn copy_into<T: Element>(&self, out: &mut [T]) {
        let src = self.storage.as_slice::<T>();
        fill_rows(out, [&self.layout], |o, [off], [st]| {
            read_row(src, off, st, o.len(), |i, x| o[i] = x)
        });
    }

    /// The elements reshaped to `shape`, which may hold one hole (`()` in a
    /// tuple, PyTorch's `-1`) for the size that keeps the element count; see
    /// [`ShapeArg`]. A view when the strides allow it, else a copy
    /// (PyTorch's `reshape`). Errors when the element counts differ, there
    /// is more than one hole, the product overflows, or a GPU copy fails.
    pub fn reshape(&self, shape: impl Into<ShapeArg>) -> Result<Tensor> {
        let shape = shape.into().resolve_reshape("reshape", self.shape())?;
        Ok(match self.layout.reshaped(&shape) {
            Some(l) => self.with_layout(l),
            None => self.contiguous()?.with_layout(Layout::contiguous(&shape)),
        })
    }

    /// Like [`Tensor::reshape`] but never copies: errors also when the
    /// strides do not allow a view (PyTorch's `view`).
    pub fn view(&self, shape: impl Into<ShapeArg>) -> Result<Tensor> {
        let shape = shape.into().resolve_reshape("view", self.shape())?;
        match self.layout.reshaped(&shape) {
            Some(l) => Ok(self.with_layout(l)),
            None => Err(Error::shape(
                "view",
                format!(
                    "shape {shape:?} is incompatible with the strides {:?} of shape {:?}; use reshape",
                    self.strides(),
                    self.shape()
                ),
            )),
        }
    }

    /// Merges dimensions `start ..= end` into one (PyTorch's `flatten`).
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            return self.reshape([1]);
        }
        let s = crate::dim_index("flatten", start, self.ndim())?;
        let e = crate::dim_index("flatten", end, self.ndim())?;
        if s > e {
            return Err(Error::arg(
                "flatten",
                format!("start dim {start} is after end dim {end}"),
            ));
        }
        let mut shape = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend(&self.shape()[e + 1..]);
        self.reshape(shape)
    }

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.transpose(d0, d1)?))
    }

    /// The transpose of a matrix (a view); 0-d and 1-d tensors are returned
    /// as they are, like PyTorch's `t()`. Errors above 2 dimensions.
    pub fn t(&self) -> Result<Tensor> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            n => Err(Error::shape(
                "t",
                format!("expects at most 2 dimensions, got {n} (shape {:?})", self.shape()),
            )),
        }
    }

    /// Reorders the dimensions (a view).
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.permute(dims)?))
    }

    /// The range `start .. start + len` of dimension `dim` (a view).
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.narrow(dim, start, len)?))
    }

    /// Every `step`-th element of `start .. end` along `dim` (a view; `end`
    /// is clamped to the size like Python slicing).
    pub fn slice(&self, dim: isize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.slice(dim, start, end, step)?))
    }

    /// Index `index` of dimension `dim`, with that dimension removed (a view;
    /// PyTorch's `select`). Negative indices count from the end.
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let d = crate::dim_index("select", dim, self.ndim())?;
        let n = self.shape()[d] as isize;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(Error::index(
                "select",
                format!("index {index} is out of range for dimension {d} of size {n}"),
            ));
        }
        self.narrow(d as isize, i as usize, 1)?.squeeze(d as isize)
    }

    /// Reverses the elements along each of `dims` (a view with negative strides).
    pub fn flip(&self, dims: &[isize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.flip(dims)?))
    }

    /// Broadcasts to `shape` (a view with zero strides; NumPy rules).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.broadcast_to(shape)?))
    }

    /// PyTorch's `expand`: like [`Tensor::broadcast_to`], where a hole
    /// (`()` in a tuple, PyTorch's `-1`; see [`ShapeArg`]) keeps the
    /// existing size. Errors when the shapes do not broadcast, a hole falls
    /// in a new leading dimension, or the element count overflows.
    pub fn expand(&self, shape: impl Into<ShapeArg>) -> Result<Tensor> {
        let target = shape.into().resolve_expand("expand", self.shape())?;
        self.broadcast_to(&target)
    }

    /// Removes dimension `dim`, which must have size 1 (a view).
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.squeeze(dim)?))
    }

    /// Removes every size-1 dimension (a view). Never fails on a tensor;
    /// `Result` as on `Var`, where recording the op may.
    pub fn squeeze_all(&self) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.squeeze_all()))
    }

    /// Inserts a size-1 dimension at `dim` (a view).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.unsqueeze(dim)?))
    }
}

pub(crate) use crate::layout::checked_numel;

/// An empty `Vec` with room for the elements of `shape`, or an
/// [`Error::OutOfMemory`] naming `op`, the shape and the bytes.
pub(crate) fn try_vec<T>(op: &'static str, shape: &[usize]) -> Result<Vec<T>> {
    let n = checked_numel(op, shape)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::out_of_memory(
            op,
            format!(
                "cannot allocate {} bytes for shape {shape:?}",
                n as u128 * std::mem::size_of::<T>() as u128
            ),
        )
    })?;
    Ok(v)
}

/// Converts between element types the way [`crate::Tensor::to_dtype`] does:
/// exactly through i64 between integer types, through f64 otherwise.
#[inline(always)]
pub(crate) fn convert_scalar<S: Element, T: Element>(x: S) -> T {
    if S::DTYPE.is_float() || T::DTYPE.is_float() {
        T::from_f64(x.to_f64())
    } else {
        T::from_i64(x.to_i64())
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor(shape={:?}, strides={:?}, offset={}, dtype={}, device={})",
            self.shape(),
            self.strides(),
            self.layout.offset(),
            self.dtype(),
            self.device()
        )
    }
}
