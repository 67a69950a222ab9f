//! [`Layout`]: how a tensor's shape maps onto its storage (shape, signed
//! strides, offset), and the view transformations that only rewrite it.

use crate::{Error, Result};

/// Shape, signed strides (in elements) and offset of a tensor within its
/// storage. Element `[i0, i1, ...]` lives at `offset + Σ ik·stride[k]`.
/// Negative strides come from `flip`; zero strides from broadcasting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

impl Layout {
    /// The row-major contiguous layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts, unchecked: tessera's own kernels build
    /// layouts they know to be valid.
    pub(crate) fn new(shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// A layout from its parts. Errors when `shape` and `strides` differ in
    /// length, the element count overflows or the reachable offsets do;
    /// whether they fit a storage is checked by
    /// [`crate::Tensor::from_storage`].
    pub fn try_new(shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::shape(
                "Layout::try_new",
                format!("shape {shape:?} and strides {strides:?} differ in length"),
            ));
        }
        let l = Layout {
            shape,
            strides,
            offset,
        };
        l.checked_range()?;
        Ok(l)
    }

    /// Like [`Layout::storage_range`], with overflow checks: an error when
    /// the element count exceeds `isize::MAX` or some reachable offset is
    /// negative or does not fit in `isize`.
    pub fn checked_range(&self) -> Result<Option<(usize, usize)>> {
        if checked_numel("layout", &self.shape)? == 0 {
            return Ok(None);
        }
        let overflow = || {
            Error::index(
                "layout",
                format!(
                    "shape {:?}, strides {:?}, offset {} reach offsets outside 0..isize::MAX",
                    self.shape, self.strides, self.offset
                ),
            )
        };
        let base = isize::try_from(self.offset).map_err(|_| overflow())?;
        let (mut lo, mut hi) = (base, base);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let span = isize::try_from(n - 1)
                .ok()
                .and_then(|m| m.checked_mul(s))
                .ok_or_else(overflow)?;
            if span < 0 {
                lo = lo.checked_add(span).ok_or_else(overflow)?;
            } else {
                hi = hi.checked_add(span).ok_or_else(overflow)?;
            }
        }
        if lo < 0 || hi == isize::MAX {
            return Err(overflow());
        }
        Ok(Some((lo as usize, hi as usize + 1)))
    }

    /// The sizes of the dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The storage index of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements (1 for a 0-d tensor, 0 if any size is 0).
    /// Saturates at `usize::MAX` for a shape no checked constructor accepts
    /// (a [`Layout::contiguous`] of an absurd shape), so it never wraps.
    pub fn numel(&self) -> usize {
        numel_saturating(&self.shape)
    }

    /// True when the elements are laid out row-major without gaps, so the
    /// tensor is the storage slice `offset .. offset + numel`.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n as isize;
        }
        true
    }

    /// The smallest and one-past-largest storage index this layout touches,
    /// or `None` when it has no elements.
    pub fn storage_range(&self) -> Option<(usize, usize)> {
        if self.numel() == 0 {
            return None;
        }
        let (mut lo, mut hi) = (self.offset as isize, self.offset as isize);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let span = (n as isize - 1) * s;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        Some((lo as usize, hi as usize + 1))
    }

    /// Swaps dimensions `d0` and `d1` (negative dims count from the end).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Layout> {
        let a = dim_index("transpose", d0, self.ndim())?;
        let b = dim_index("transpose", d1, self.ndim())?;
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// Reorders the dimensions: dimension `k` of the result is `dims[k]` of `self`.
    pub fn permute(&self, dims: &[isize]) -> Result<Layout> {
        let n = self.ndim();
        if dims.len() != n {
            return Err(Error::shape(
                "permute",
                format!(
                    "got {} dims {dims:?} for a tensor of shape {:?}",
                    dims.len(),
                    self.shape
                ),
            ));
        }
        let mut seen = vec![false; n];
        let mut l = self.clone();
        for (k, &d) in dims.iter().enumerate() {
            let d = dim_index("permute", d, n)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::arg(
                    "permute",
                    format!("dimension {d} repeats in {dims:?}"),
                ));
            }
            l.shape[k] = self.shape[d];
            l.strides[k] = self.strides[d];
        }
        Ok(l)
    }

    /// The sub-range `start .. start + len` of dimension `dim`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Layout> {
        let d = dim_index("narrow", dim, self.ndim())?;
        let size = self.shape[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::index(
                "narrow",
                format!(
                    "range {start}..{} is outside dimension {d} of size {size} (shape {:?})",
                    start.saturating_add(len),
                    self.shape
                ),
            ));
        }
        let mut l = self.clone();
        if len > 0 {
            l.offset = offset_add(l.offset, start as isize * l.strides[d]);
        }
        l.shape[d] = len;
        Ok(l)
    }

    /// Every `step`-th element of `start .. end` along `dim` (PyTorch's
    /// `t[start:end:step]`; `end` is clamped to the size, `step` must be > 0).
    pub fn slice(&self, dim: isize, start: usize, end: usize, step: usize) -> Result<Layout> {
        let d = dim_index("slice", dim, self.ndim())?;
        if step == 0 {
            return Err(Error::arg("slice", "step must be positive, got 0"));
        }
        let size = self.shape[d];
        let end = end.min(size);
        let start = start.min(end);
        let len = (end - start).div_ceil(step);
        let mut l = self.clone();
        if len > 0 {
            l.offset = offset_add(l.offset, start as isize * l.strides[d]);
        }
        l.shape[d] = len;
        // With two or more elements the stepped stride is a reachable span,
        // so it fits; with fewer it is never used and may stay as it is.
        if len > 1 {
            l.strides[d] *= step as isize;
        }
        Ok(l)
    }

    /// Reverses the order of elements along each of `dims`.
    pub fn flip(&self, dims: &[isize]) -> Result<Layout> {
        let mut l = self.clone();
        let mut seen = vec![false; self.ndim()];
        for &dim in dims {
            let d = dim_index("flip", dim, self.ndim())?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::arg("flip", format!("dimension {d} repeats in {dims:?}")));
            }
            if l.shape[d] > 1 {
                l.offset = offset_add(l.offset, (l.shape[d] as isize - 1) * l.strides[d]);
            }
            l.strides[d] = -l.strides[d];
        }
        Ok(l)
    }

    /// Broadcasts to `shape` with NumPy rules: leading dimensions are added,
    /// size-1 dimensions are stretched (stride 0). Errors when the shapes do
    /// not broadcast or `shape` has more than `isize::MAX` elements.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        checked_numel("broadcast_to", shape)?;
        let err = || {
            Error::shape(
                "broadcast_to",
                format!("cannot broadcast shape {:?} to {shape:?}", self.shape),
            )
        };
        if shape.len() < self.ndim() {
            return Err(err());
        }
        let lead = shape.len() - self.ndim();
        let mut strides = vec![0isize; shape.len()];
        for (k, (&n, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            let target = shape[lead + k];
            if n == target {
                strides[lead + k] = if n == 1 { 0 } else { s };
            } else if n != 1 {
                return Err(err());
            }
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Layout> {
        let d = dim_index("squeeze", dim, self.ndim())?;
        if self.shape[d] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!(
                    "dimension {d} of shape {:?} has size {}, not 1",
                    self.shape, self.shape[d]
                ),
            ));
        }
        let mut l = self.clone();
        l.shape.remove(d);
        l.strides.remove(d);
        Ok(l)
    }

    /// Removes every size-1 dimension.
    pub fn squeeze_all(&self) -> Layout {
        let (shape, strides) = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n != 1)
            .map(|(&n, &s)| (n, s))
            .unzip();
        Layout {
            shape,
            strides,
            offset: self.offset,
        }
    }

    /// Inserts a size-1 dimension at `dim` (which may be `ndim`; negative
    /// counts from `ndim + 1`).
    pub fn unsqueeze(&self, dim: isize) -> Result<Layout> {
        let d = dim_index("unsqueeze", dim, self.ndim() + 1)?;
        let mut l = self.clone();
        let stride = if d < self.ndim() {
            self.strides[d] * self.shape[d] as isize
        } else {
            1
        };
        l.shape.insert(d, 1);
        l.strides.insert(d, stride);
        Ok(l)
    }

    /// The same elements seen with shape `shape` without copying, when the
    /// strides allow it (PyTorch's `view` rule); `None` when a copy is needed.
    /// The element counts must already agree.
    pub fn reshaped(&self, shape: &[usize]) -> Option<Layout> {
        debug_assert_eq!(self.numel(), numel_saturating(shape));
        if self.is_contiguous() {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        if self.numel() == 0 {
            return Some(Layout::contiguous(shape));
        }
        // Walk chunks of old dimensions that are contiguous among themselves
        // and match them to runs of new dimensions with the same element count.
        let old: Vec<(usize, isize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n != 1)
            .map(|(&n, &s)| (n, s))
            .collect();
        let mut strides = vec![0isize; shape.len()];
        let mut oi = 0;
        let mut ni = 0;
        while ni < shape.len() || oi < old.len() {
            while ni < shape.len() && shape[ni] == 1 {
                strides[ni] = 1;
                ni += 1;
            }
            if oi == old.len() {
                break;
            }
            // Gather one contiguous chunk of old dims.
            let mut chunk = old[oi].0;
            let mut oe = oi;
            while oe + 1 < old.len() && old[oe].1 == old[oe + 1].1 * old[oe + 1].0 as isize {
                oe += 1;
                chunk *= old[oe].0;
            }
            let inner_stride = old[oe].1;
            // Take new dims until their product is the chunk size.
            let start = ni;
            let mut prod = 1usize;
            while ni < shape.len() && prod < chunk {
                prod *= shape[ni];
                ni += 1;
            }
            if prod != chunk {
                return None;
            }
            let mut s = inner_stride;
            for k in (start..ni).rev() {
                strides[k] = s;
                s *= shape[k] as isize;
            }
            oi = oe + 1;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }
}

/// Row-major strides of `shape`. They saturate at `isize::MAX` rather than
/// wrap for a shape whose element count overflows (a checked constructor
/// rejects it) or that is empty (its strides are never followed).
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut s = 1isize;
    for (st, &n) in strides.iter_mut().zip(shape).rev() {
        *st = s;
        s = s.saturating_mul(isize::try_from(n.max(1)).unwrap_or(isize::MAX));
    }
    strides
}

/// The element count of `shape`, or an error naming `op` when it exceeds
/// `isize::MAX` (the most any allocation or view can address). A shape
/// with a zero size has 0 elements whatever its other sizes.
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::arg(
                op,
                format!("shape {shape:?} has more elements than memory can hold (over isize::MAX)"),
            )
        })
}

/// The element count of `shape`, saturating at `usize::MAX`.
fn numel_saturating(shape: &[usize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .unwrap_or(usize::MAX)
}

/// Resolves a possibly negative dimension index against `ndim` dimensions
/// (PyTorch convention: -1 is the last). Errors name `op`.
pub fn dim_index(op: &'static str, dim: isize, ndim: usize) -> Result<usize> {
    let n = ndim as isize;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n {
        return Err(Error::index(
            op,
            format!("dimension {dim} is out of range for a tensor with {ndim} dimensions"),
        ));
    }
    Ok(d as usize)
}

/// Resolves a list of dimensions, rejecting repeats. Errors name `op`.
pub fn dim_indices(op: &'static str, dims: &[isize], ndim: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let d = dim_index(op, d, ndim)?;
        if out.contains(&d) {
            return Err(Error::arg(op, format!("dimension {d} repeats in {dims:?}")));
        }
        out.push(d);
    }
    Ok(out)
}

/// The shape two shapes broadcast to under NumPy rules, or an error naming `op`.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for k in 0..n {
        let x = if k + a.len() >= n { a[k + a.len() - n] } else { 1 };
        let y = if k + b.len() >= n { b[k + b.len() - n] } else { 1 };
        out[k] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("shapes {a:?} and {b:?} cannot be broadcast together"),
                ))
            }
        };
    }
    Ok(out)
}

fn offset_add(offset: usize, delta: isize) -> usize {
    (offset as isize + delta) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_views_follow_pytorch_rule() {
        let l = Layout::contiguous(&[2, 3, 4]);
        let t = l.transpose(0, 1).unwrap(); // [3,2,4] strides [4,12,1]
        assert!(t.reshaped(&[3, 8]).is_none());
        let v = t.reshaped(&[3, 2, 2, 2]).unwrap();
        assert_eq!(v.strides(), &[4, 12, 2, 1]);
        let s = l.slice(2, 0, 4, 2).unwrap(); // [2,3,2] strides [12,4,2]
        assert_eq!(s.reshaped(&[6, 2]).unwrap().strides(), &[4, 2]);
        assert_eq!(s.reshaped(&[12]).unwrap().strides(), &[2]);
        assert!(s.narrow(1, 0, 2).unwrap().reshaped(&[8]).is_none());
    }

    #[test]
    fn flip_and_range() {
        let l = Layout::contiguous(&[2, 3]).flip(&[1]).unwrap();
        assert_eq!(l.offset(), 2);
        assert_eq!(l.strides(), &[3, -1]);
        assert_eq!(l.storage_range(), Some((0, 6)));
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
        let b = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
    }

    #[test]
    fn overflowing_shapes_are_errors() {
        let l = Layout::contiguous(&[1, 4]);
        for shape in [[1 << 62, 4], [usize::MAX, 2], [1 << 32, 1 << 31]] {
            let e = l.broadcast_to(&shape).unwrap_err().to_string();
            assert!(
                e.contains("broadcast_to") && e.contains(&format!("{shape:?}")),
                "{e}"
            );
            let strides = contiguous_strides(&shape);
            assert!(Layout::try_new(shape.to_vec(), strides, 0).is_err(), "{shape:?}");
            assert!(
                Layout::try_new(shape.to_vec(), vec![0, 0], 0).is_err(),
                "{shape:?}"
            );
        }
        assert_eq!(Layout::contiguous(&[1 << 62, 4]).numel(), usize::MAX, "saturates");
        assert_eq!(
            Layout::contiguous(&[1 << 32, 1 << 31]).numel(),
            1 << 63,
            "fits usize, not isize"
        );
        // A zero size makes any other size harmless.
        let empty = Layout::try_new(vec![usize::MAX, 0, usize::MAX], vec![1, 1, 1], 0).unwrap();
        assert_eq!(empty.numel(), 0);
        assert_eq!(Layout::contiguous(&[1 << 40, 1 << 40, 0]).numel(), 0);
        // A step past isize::MAX over one element is no overflow.
        let s = Layout::contiguous(&[5, 3]).slice(0, 1, 5, usize::MAX).unwrap();
        assert_eq!((s.shape(), s.offset()), (&[1, 3][..], 3));
    }
}
