//! `topk`, `sort` and `argsort` along one dim. Order is total: NaN counts as
//! larger than every number (as in PyTorch), and equal values are ordered
//! by position, so results are unique and independent of the thread count.

use std::cmp::Ordering;

use crate::ops::rows::for_each_row;
use crate::{dim_index, Element, Error, Result, Tensor};

impl Tensor {
    /// The `k` largest (or smallest, when `largest` is false) elements along
    /// `dim` and their I64 positions, each of shape `self` with `dim`
    /// resized to `k` (PyTorch's `topk`). Ties go to the lowest position.
    /// The results come sorted (largest first, or smallest first) whether or
    /// not `sorted` is set, as an unsorted order is unspecified. Errors when
    /// `dim` is out of range or `k` exceeds the size of `dim`.
    pub fn topk(&self, k: usize, dim: isize, largest: bool, sorted: bool) -> Result<(Tensor, Tensor)> {
        const OP: &str = "topk";
        let _ = sorted;
        let d = dim_index(OP, dim, self.ndim())?;
        let n = self.shape()[d];
        if k > n {
            return Err(Error::arg(
                OP,
                format!("k = {k} is larger than size {n} of dimension {d} (shape {:?})", self.shape()),
            ));
        }
        self.select_along(d, k, largest)
    }

    /// The elements sorted along `dim` and their I64 original positions
    /// (PyTorch's `sort` with `stable=True`: equal elements keep their
    /// order). NaN sorts as the largest value. Errors when `dim` is out of
    /// range.
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let d = dim_index("sort", dim, self.ndim())?;
        self.select_along(d, self.shape()[d], descending)
    }

    /// The I64 positions that sort `self` along `dim` (stable; see
    /// [`Tensor::sort`]). Errors when `dim` is out of range.
    pub fn argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        let d = dim_index("argsort", dim, self.ndim())?;
        Ok(self.select_along(d, self.shape()[d], descending)?.1)
    }

    /// The first `k` elements along `d` in the order (value descending when
    /// `largest`, else ascending; then position ascending), and their
    /// positions. Each line along `d` is made contiguous (moved last) so
    /// lines are independent rows that run in parallel.
    fn select_along(&self, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
        let last = self.ndim() as isize - 1;
        let lines = self.transpose(d as isize, last)?.contiguous();
        let n = self.shape()[d];
        let mut shape = lines.shape().to_vec();
        shape[last as usize] = k;
        let (values, indices) = crate::with_dtype!(self.dtype(), T => {
            let src = lines.as_slice::<T>()?;
            let indices = Tensor::build::<i64>(&shape, |out| {
                for_each_row(out, k, |r, row| select_row(&src[r * n..r * n + n], row, largest))
            });
            let ix = indices.as_slice::<i64>()?;
            let values = Tensor::build::<T>(&shape, |out| {
                for_each_row(out, k, |r, row| {
                    let line = &src[r * n..r * n + n];
                    for (y, &i) in row.iter_mut().zip(&ix[r * k..r * k + k]) {
                        *y = line[i as usize];
                    }
                })
            });
            (values, indices)
        });
        let back = |t: Tensor| -> Result<Tensor> { Ok(t.transpose(d as isize, last)?.contiguous()) };
        Ok((back(values)?, back(indices)?))
    }
}

/// Writes into `out` the positions of the first `out.len()` elements of
/// `line` in the total order (value, then position).
fn select_row<T: Element>(line: &[T], out: &mut [i64], largest: bool) {
    let k = out.len();
    let cmp = |&a: &usize, &b: &usize| {
        let by_value = if largest { total_cmp(line[b], line[a]) } else { total_cmp(line[a], line[b]) };
        by_value.then(a.cmp(&b))
    };
    let mut order: Vec<usize> = (0..line.len()).collect();
    if k < line.len() && k > 0 {
        order.select_nth_unstable_by(k - 1, cmp);
    }
    let top = &mut order[..k];
    top.sort_unstable_by(cmp);
    for (y, &i) in out.iter_mut().zip(top.iter()) {
        *y = i as i64;
    }
}

/// A total order on elements: the usual one, with NaN above everything.
fn total_cmp<T: Element>(a: T, b: T) -> Ordering {
    a.partial_cmp(&b).unwrap_or_else(|| {
        #[allow(clippy::eq_op)]
        let (a_nan, b_nan) = (a != a, b != b);
        a_nan.cmp(&b_nan)
    })
}
