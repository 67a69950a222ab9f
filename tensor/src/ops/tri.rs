//! `tril` / `triu`: the lower / upper triangle of (batches of) matrices.

#[cfg(feature = "cuda")]
#[path = "tri_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::rows::for_each_row;
use crate::{Element, Error, Result, Tensor};

impl Tensor {
    /// The lower triangle of the last two dims: element `(i, j)` is kept when
    /// `j - i <= diagonal`, else zero (PyTorch's `tril`; leading dims are a
    /// batch). Errors when `self` has fewer than 2 dims.
    pub fn tril(&self, diagonal: isize) -> Result<Tensor> {
        crate::backend::dispatch("tril", &[self])?.tri("tril", self, diagonal, true)
    }

    /// The upper triangle of the last two dims: element `(i, j)` is kept when
    /// `j - i >= diagonal`, else zero (PyTorch's `triu`; leading dims are a
    /// batch). Errors when `self` has fewer than 2 dims.
    pub fn triu(&self, diagonal: isize) -> Result<Tensor> {
        crate::backend::dispatch("triu", &[self])?.tri("triu", self, diagonal, false)
    }

    /// The CPU kernel of [`Tensor::tril`] (`lower`) and [`Tensor::triu`],
    /// reported as `op`.
    pub(crate) fn triangle(&self, op: &'static str, diagonal: isize, lower: bool) -> Result<Tensor> {
        let (rows, cols) = matrix_dims(op, self)?;
        crate::with_dtype!(self.dtype(), T => Tensor::build::<T>(op, self.shape(), |out| {
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
        }))
    }
}

/// The (rows, cols) of the last two dims. Errors, naming `op`, for fewer
/// than 2 dims.
pub(crate) fn matrix_dims(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    let nd = x.ndim();
    if nd < 2 {
        return Err(Error::shape(
            op,
            format!("expects at least 2 dims, got shape {:?}", x.shape()),
        ));
    }
    Ok((x.shape()[nd - 2], x.shape()[nd - 1]))
}

#[cfg(test)]
mod tests {
    use crate::ops::naive::unravel;
    use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
    use crate::{bf16, Element};

    fn tri_matches<T: Element>() {
        for shape in [&[3usize, 5][..], &[5, 3], &[2, 3, 4], &[2, 1, 0, 4], &[4, 4]] {
            let v = rand_f64(shape.len() as u64, shape.iter().product());
            let vals = values_f64(&tensor_of::<T>(&v, shape));
            let nd = shape.len();
            for diag in -6isize..=6 {
                let keep = |lin: usize, lower: bool| {
                    let i = unravel(lin, shape);
                    let off = i[nd - 1] as isize - i[nd - 2] as isize;
                    if lower {
                        off <= diag
                    } else {
                        off >= diag
                    }
                };
                let want = |lower| -> Vec<f64> {
                    (0..vals.len())
                        .map(|l| if keep(l, lower) { vals[l] } else { 0.0 })
                        .collect()
                };
                let (lo, up) = (want(true), want(false));
                for t in layouts_of::<T>(&v, shape) {
                    assert_eq!(values_f64(&t.tril(diag).unwrap()), lo, "{t:?} tril {diag}");
                    assert_eq!(values_f64(&t.triu(diag).unwrap()), up, "{t:?} triu {diag}");
                }
            }
        }
    }

    #[test]
    fn tril_triu_match_naive() {
        tri_matches::<f32>();
        tri_matches::<f64>();
        tri_matches::<bf16>();
        tri_matches::<i64>();
        tri_matches::<bool>();
    }

    #[test]
    fn tri_needs_a_matrix() {
        let e = tensor_of::<f32>(&[1.0, 2.0], &[2])
            .tril(0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tril") && e.contains("[2]"), "{e}");
        assert!(crate::Tensor::scalar(1.0f32).triu(0).is_err());
        let big = tensor_of::<f32>(&rand_f64(1, 200 * 300), &[200, 300]);
        let l = big.tril(isize::MAX).unwrap();
        assert_eq!(values_f64(&l), values_f64(&big));
        assert!(values_f64(&big.triu(isize::MAX).unwrap())
            .iter()
            .all(|&x| x == 0.0));
        assert!(values_f64(&big.tril(isize::MIN).unwrap())
            .iter()
            .all(|&x| x == 0.0));
    }
}
