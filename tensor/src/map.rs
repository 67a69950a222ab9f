//! Elementwise mapping over one, two or three tensors with broadcasting: the
//! shared engine of unary, binary, comparison, `where` and cast kernels.

use crate::layout::broadcast_shapes;
use crate::strided::{fill_rows, map_run};
use crate::tensor::convert_scalar;
use crate::{DType, Element, Result, Tensor};

impl Tensor {
    /// A new tensor of the same shape with `f` applied to every element.
    /// `T` must be the tensor's dtype: callers dispatch with
    /// [`crate::with_dtype!`] first.
    ///
    /// # Panics
    /// When `T` is not the dtype, the tensor is on a GPU (a closure cannot
    /// run there: move it with `.to_device(Device::Cpu)` first), or memory
    /// for the result is out ([`Tensor::try_map`] returns that as an error).
    pub fn map<T: Element, U: Element>(&self, f: impl Fn(T) -> U + Sync) -> Tensor {
        self.try_map("map", f).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Tensor::map`], but memory for the result being out is an
    /// [`crate::Error::OutOfMemory`] naming `op`.
    ///
    /// # Panics
    /// When `T` is not the dtype or the tensor is on a GPU.
    pub fn try_map<T: Element, U: Element>(
        &self,
        op: &'static str,
        f: impl Fn(T) -> U + Sync,
    ) -> Result<Tensor> {
        let src = self.storage().as_slice::<T>();
        Tensor::build_overwrite::<U>(op, self.shape(), |out| {
            fill_rows(out, [self.layout()], |o, [off], [st]| {
                if st == 1 {
                    let n = o.len();
                    for (y, &x) in o.iter_mut().zip(&src[off..off + n]) {
                        *y = f(x);
                    }
                } else {
                    let mut p = off as isize;
                    for y in o.iter_mut() {
                        *y = f(src[p as usize]);
                        p += st;
                    }
                }
            })
        })
    }

    /// `f(a, b)` elementwise over the broadcast shape of `self` and `other`.
    /// `A` and `B` must be the dtypes of `self` and `other`. Errors, naming
    /// `op`, when the shapes do not broadcast or the devices differ.
    pub fn zip_map<A: Element, B: Element, U: Element>(
        &self,
        other: &Tensor,
        op: &'static str,
        f: impl Fn(A, B) -> U + Sync,
    ) -> Result<Tensor> {
        self.device().same_as(other.device(), op)?;
        #[cfg(feature = "cuda")]
        self.cpu_only(op)?;
        let shape = broadcast_shapes(op, self.shape(), other.shape())?;
        let la = self.layout().broadcast_to(&shape)?;
        let lb = other.layout().broadcast_to(&shape)?;
        let (sa, sb) = (self.storage().as_slice::<A>(), other.storage().as_slice::<B>());
        Tensor::build_overwrite::<U>(op, &shape, |out| {
            fill_rows(out, [&la, &lb], |o, [oa, ob], [ta, tb]| {
                if ta == 1 && tb == 1 {
                    let n = o.len();
                    let (xa, xb) = (&sa[oa..oa + n], &sb[ob..ob + n]);
                    for ((y, &a), &b) in o.iter_mut().zip(xa).zip(xb) {
                        *y = f(a, b);
                    }
                } else if ta == 1 && tb == 0 {
                    // One operand broadcast along the row (bias, scalar):
                    // hoisting it keeps the loop vectorisable.
                    let (b, n) = (sb[ob], o.len());
                    for (y, &a) in o.iter_mut().zip(&sa[oa..oa + n]) {
                        *y = f(a, b);
                    }
                } else if ta == 0 && tb == 1 {
                    let (a, n) = (sa[oa], o.len());
                    for (y, &b) in o.iter_mut().zip(&sb[ob..ob + n]) {
                        *y = f(a, b);
                    }
                } else {
                    let (mut pa, mut pb) = (oa as isize, ob as isize);
                    for y in o.iter_mut() {
                        *y = f(sa[pa as usize], sb[pb as usize]);
                        pa += ta;
                        pb += tb;
                    }
                }
            })
        })
    }

    /// `f(a, b, c)` elementwise over the broadcast shape of three tensors
    /// (used by `where`, `clamp` with tensor bounds, `lerp`). Errors, naming
    /// `op`, when the shapes do not broadcast or the devices differ.
    pub fn zip3_map<A: Element, B: Element, C: Element, U: Element>(
        &self,
        b: &Tensor,
        c: &Tensor,
        op: &'static str,
        f: impl Fn(A, B, C) -> U + Sync,
    ) -> Result<Tensor> {
        self.device().same_as(b.device(), op)?;
        self.device().same_as(c.device(), op)?;
        #[cfg(feature = "cuda")]
        self.cpu_only(op)?;
        let shape = broadcast_shapes(op, &broadcast_shapes(op, self.shape(), b.shape())?, c.shape())?;
        let (la, lb, lc) = (
            self.layout().broadcast_to(&shape)?,
            b.layout().broadcast_to(&shape)?,
            c.layout().broadcast_to(&shape)?,
        );
        let (sa, sb, sc) = (
            self.storage().as_slice::<A>(),
            b.storage().as_slice::<B>(),
            c.storage().as_slice::<C>(),
        );
        Tensor::build_overwrite::<U>(op, &shape, |out| {
            fill_rows(out, [&la, &lb, &lc], |o, [oa, ob, oc], [ta, tb, tc]| {
                let (mut pa, mut pb, mut pc) = (oa as isize, ob as isize, oc as isize);
                for y in o.iter_mut() {
                    *y = f(sa[pa as usize], sb[pb as usize], sc[pc as usize]);
                    pa += ta;
                    pb += tb;
                    pc += tc;
                }
            })
        })
    }

    /// In-place `self[i] = f(self[i], other[i])`, with `other` broadcast to
    /// `self`'s shape. Mutates the storage when this tensor is its only
    /// owner, contiguous and covers all of it (so an optimizer step or a
    /// gradient accumulation allocates nothing); otherwise `self` becomes a
    /// fresh tensor holding the result. `T` and `B` must be the dtypes of
    /// `self` and `other`. Errors, naming `op`, when `other` does not
    /// broadcast to `self`'s shape or the devices differ.
    pub fn zip_map_<T: Element, B: Element>(
        &mut self,
        other: &Tensor,
        op: &'static str,
        f: impl Fn(T, B) -> T + Sync,
    ) -> Result<()> {
        self.device().same_as(other.device(), op)?;
        #[cfg(feature = "cuda")]
        self.cpu_only(op)?;
        let lb = other.layout().broadcast_to(self.shape()).map_err(|_| {
            crate::Error::shape(
                op,
                format!(
                    "cannot update a tensor of shape {:?} in place from shape {:?}",
                    self.shape(),
                    other.shape()
                ),
            )
        })?;
        let whole =
            self.is_contiguous() && self.layout().offset() == 0 && self.numel() == self.storage().len();
        let shape = self.shape().to_vec();
        match (whole, self.storage_mut()) {
            (true, Some(storage)) if !std::ptr::eq(storage as *const _, other.storage().as_ref()) => {
                let dst = storage.as_mut_slice::<T>(op)?;
                let src = other.storage().as_slice::<B>();
                fill_rows(dst, [&lb], |o, [ob], [tb]| {
                    let mut p = ob as isize;
                    for y in o.iter_mut() {
                        *y = f(*y, src[p as usize]);
                        p += tb;
                    }
                });
            }
            _ => {
                let fresh = self.zip_map::<T, B, T>(&other.broadcast_to(&shape)?, op, f)?;
                *self = fresh;
            }
        }
        Ok(())
    }

    /// The elements as one mutable row-major slice, for in-place kernels
    /// that update several buffers in one pass (optimizer steps, gradient
    /// unscaling). Mutates the storage when this tensor is its only owner,
    /// contiguous and covers all of it; otherwise `self` first becomes a
    /// contiguous copy of its value (copy-on-write: tensors sharing the old
    /// storage never see the change). Errors when `T` is not the dtype.
    pub fn make_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype() {
            return Err(crate::Error::dtype(
                "make_mut",
                format!("tensor is {} but &mut [{}] was requested", self.dtype(), T::DTYPE),
            ));
        }
        #[cfg(feature = "cuda")]
        self.cpu_only("make_mut")?;
        let whole =
            self.is_contiguous() && self.layout().offset() == 0 && self.numel() == self.storage().len();
        if !whole || self.storage_mut().is_none() {
            *self = Tensor::build_overwrite::<T>("make_mut", self.shape(), |out| self.copy_into(out))?;
        }
        let storage = self.storage_mut().expect("a fresh copy has one owner");
        storage.as_mut_slice::<T>("make_mut")
    }

    /// The tensor converted to `dtype`: floats round to nearest even (f16,
    /// bf16), floats to integers truncate toward zero and saturate (NaN → 0),
    /// anything non-zero becomes `true`. Returns `self` (no copy) when the
    /// dtype already matches. A GPU tensor is converted on its device.
    /// Errors when the device fails (a driver error, out of memory), naming
    /// `to_dtype`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        if self.is_cuda() {
            return crate::cuda::cast(self, dtype);
        }
        crate::with_dtype!(self.dtype(), S => crate::with_dtype!(dtype, T =>
            self.convert::<S, T>()))
    }

    /// [`Tensor::to_dtype`] on the CPU: runs of the fast float pairs
    /// (f32 ↔ bf16/f16) through the SIMD slice conversions (strided rows
    /// gathered first, so every element rounds the same way), everything
    /// else element by element.
    fn convert<S: Element, T: Element>(&self) -> Result<Tensor> {
        if !crate::simd::cast::fast_pair::<S, T>() {
            return self.try_map::<S, T>("to_dtype", convert_scalar::<S, T>);
        }
        let src = self.storage().as_slice::<S>();
        Tensor::build_overwrite::<T>("to_dtype", self.shape(), |out| {
            fill_rows(out, [self.layout()], |o, [off], [st]| {
                map_run(src, off, st, o, crate::simd::cast::convert_run)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;

    #[test]
    fn zip_map_broadcasts_strided_operands() {
        let a = Tensor::from_vec((0..6).map(|x| x as f32).collect(), &[2, 3]).unwrap();
        let b = Tensor::from_vec(vec![10.0f32, 20.0], &[2, 1]).unwrap();
        let at = a.t().unwrap(); // [3,2]
        let s = at
            .zip_map::<f32, f32, f32>(&b.t().unwrap(), "add", |x, y| x + y)
            .unwrap();
        assert_eq!(s.shape(), &[3, 2]);
        assert_eq!(
            s.to_vec::<f32>().unwrap(),
            vec![10.0, 23.0, 11.0, 24.0, 12.0, 25.0]
        );
        assert!(a.zip_map::<f32, f32, f32>(&at, "add", |x, y| x + y).is_err());
    }

    #[test]
    fn casts_round_and_saturate() {
        let a = Tensor::from_vec(vec![1.5f32, -2.7, 300.0, f32::NAN], &[4]).unwrap();
        assert_eq!(
            a.to_dtype(crate::DType::U8).unwrap().to_vec::<u8>().unwrap(),
            vec![1, 0, 255, 0]
        );
        assert_eq!(
            a.to_dtype(crate::DType::I64).unwrap().to_vec::<i64>().unwrap()[..3],
            [1, -2, 300]
        );
        let b = a.to_dtype(crate::DType::Bool).unwrap().to_vec::<bool>().unwrap();
        assert_eq!(b, vec![true, true, true, true]);
    }

    #[test]
    fn make_mut_is_in_place_when_unique_and_copy_on_write_otherwise() {
        let mut a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let before = a.storage().as_bytes().as_ptr();
        a.make_mut::<f32>().unwrap()[1] = 20.0;
        assert_eq!(a.storage().as_bytes().as_ptr(), before);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 20.0, 3.0, 4.0]);

        let shared = a.clone();
        a.make_mut::<f32>().unwrap()[0] = 10.0;
        assert!(!a.shares_storage(&shared));
        assert_eq!(shared.to_vec::<f32>().unwrap(), vec![1.0, 20.0, 3.0, 4.0]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![10.0, 20.0, 3.0, 4.0]);

        // A transposed view becomes a row-major copy of its value.
        let mut t = a.t().unwrap();
        assert_eq!(t.make_mut::<f32>().unwrap(), &[10.0, 3.0, 20.0, 4.0]);
        assert!(t.is_contiguous());
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![10.0, 20.0, 3.0, 4.0]);
        assert!(a.make_mut::<f64>().is_err());
        let mut empty = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
        assert!(empty.make_mut::<f32>().unwrap().is_empty());
    }

    #[test]
    fn zip_map_in_place_mutates_unique_storage_and_copies_shared() {
        let mut a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let before = a.storage().as_bytes().as_ptr();
        let row = Tensor::from_vec(vec![10.0f32, 20.0], &[2]).unwrap();
        a.zip_map_::<f32, f32>(&row, "add_", |x, y| x + y).unwrap();
        assert_eq!(
            a.storage().as_bytes().as_ptr(),
            before,
            "unique storage is updated in place"
        );
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![11.0, 22.0, 13.0, 24.0]);

        let shared = a.clone();
        a.zip_map_::<f32, f32>(&row, "add_", |x, y| x + y).unwrap();
        assert_eq!(
            shared.to_vec::<f32>().unwrap(),
            vec![11.0, 22.0, 13.0, 24.0],
            "a shared value never changes"
        );
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![21.0, 42.0, 23.0, 44.0]);

        let mut t = a.t().unwrap();
        t.zip_map_::<f32, f32>(&row, "add_", |x, y| x + y).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![31.0, 43.0, 52.0, 64.0]);
        assert!(a
            .zip_map_::<f32, f32>(
                &Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap(),
                "add_",
                |x, y| x + y
            )
            .is_err());
    }
}
