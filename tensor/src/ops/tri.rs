//! `tril` / `triu`: the lower / upper triangle of (batches of) matrices.

use crate::ops::rows::for_each_row;
use crate::{Element, Error, Result, Tensor};

impl Tensor {
    /// The lower triangle of the last two dims: element `(i, j)` is kept when
    /// `j - i <= diagonal`, else zero (PyTorch's `tril`; leading dims are a
    /// batch). Errors when `self` has fewer than 2 dims.
    pub fn tril(&self, diagonal: isize) -> Result<Tensor> {
        self.triangle("tril", diagonal, true)
    }

    /// The upper triangle of the last two dims: element `(i, j)` is kept when
    /// `j - i >= diagonal`, else zero (PyTorch's `triu`; leading dims are a
    /// batch). Errors when `self` has fewer than 2 dims.
    pub fn triu(&self, diagonal: isize) -> Result<Tensor> {
        self.triangle("triu", diagonal, false)
    }

    fn triangle(&self, op: &'static str, diagonal: isize, lower: bool) -> Result<Tensor> {
        let nd = self.ndim();
        if nd < 2 {
            return Err(Error::shape(
                op,
                format!("expects at least 2 dims, got shape {:?}", self.shape()),
            ));
        }
        let (rows, cols) = (self.shape()[nd - 2], self.shape()[nd - 1]);
        Ok(crate::with_dtype!(self.dtype(), T => Tensor::build::<T>(self.shape(), |out| {
            self.copy_into(out);
            for_each_row(out, cols, |r, row| {
                let i = (r % rows) as isize;
                // Kept columns: j <= i + diagonal (lower) or j >= i + diagonal (upper).
                let edge = (i.saturating_add(diagonal)).clamp(-1, cols as isize);
                let zero = if lower {
                    &mut row[(edge + 1).min(cols as isize) as usize..]
                } else {
                    &mut row[..edge.max(0) as usize]
                };
                zero.fill(T::ZERO);
            });
        })))
    }
}
