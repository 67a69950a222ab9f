//! The gradient of an injective view (narrow, slice, select, diagonal, ...):
//! the gradient written into zeros of the viewed tensor's shape at the
//! positions the view reads.

use crate::strided::Coalesced;
use crate::{Error, Layout, Result, Tensor};

impl Tensor {
    /// A zero tensor of shape `base` (contiguous) with `self` written at the
    /// positions that `view` (a layout over a contiguous `base`-shaped
    /// buffer, shaped like `self`) reads, in `self`'s dtype and device.
    /// Errors when `self`'s shape is not `view`'s, or the view reaches
    /// outside `base`.
    pub fn view_backward(&self, base: &[usize], view: &Layout) -> Result<Tensor> {
        const OP: &str = "view_backward";
        if self.shape() != view.shape() {
            return Err(Error::shape(
                OP,
                format!(
                    "gradient of shape {:?} for a view of shape {:?}",
                    self.shape(),
                    view.shape()
                ),
            ));
        }
        let n = crate::checked_numel(OP, base)?;
        if let Some((_, end)) = view.storage_range().filter(|&(_, end)| end > n) {
            return Err(Error::index(
                OP,
                format!("a view reaching element {} of a base of shape {base:?}", end - 1),
            ));
        }
        crate::backend::dispatch(OP, &[self])?.view_backward(self, base, view)
    }
}

/// The CPU kernel of [`Tensor::view_backward`] (arguments checked).
pub(crate) fn cpu(grad: &Tensor, base: &[usize], view: &Layout) -> Result<Tensor> {
    let g = grad.contiguous()?;
    crate::with_dtype!(grad.dtype(), T => {
        let src = g.as_slice::<T>()?;
        Tensor::build::<T>("view_backward", base, |out| {
            let c = Coalesced::new([view]);
            c.for_each_row(0..c.numel(), |dst, [off], [stride], len| {
                let mut p = off as isize;
                for &x in &src[dst..dst + len] {
                    out[p as usize] = x;
                    p += stride;
                }
            });
        })
    })
}
