//! `topk`, `sort` and `argsort` along one dim. Order is total: NaN counts as
//! larger than every number (as in PyTorch), and equal values are ordered
//! by position, so results are unique and independent of the thread count.

#[cfg(feature = "cuda")]
#[path = "topk_cuda.rs"]
pub(crate) mod cuda;

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
        let be = crate::backend::dispatch(OP, &[self])?;
        let _ = sorted;
        let d = dim_index(OP, dim, self.ndim())?;
        let n = self.shape()[d];
        if k > n {
            return Err(Error::arg(
                OP,
                format!(
                    "k = {k} is larger than size {n} of dimension {d} (shape {:?})",
                    self.shape()
                ),
            ));
        }
        be.topk(self, d, k, largest)
    }

    /// The elements sorted along `dim` and their I64 original positions
    /// (PyTorch's `sort` with `stable=True`: equal elements keep their
    /// order). NaN sorts as the largest value. Errors when `dim` is out of
    /// range.
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let be = crate::backend::dispatch("sort", &[self])?;
        let d = dim_index("sort", dim, self.ndim())?;
        be.topk(self, d, self.shape()[d], descending)
    }

    /// The I64 positions that sort `self` along `dim` (stable; see
    /// [`Tensor::sort`]). Errors when `dim` is out of range.
    pub fn argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        let be = crate::backend::dispatch("argsort", &[self])?;
        let d = dim_index("argsort", dim, self.ndim())?;
        Ok(be.topk(self, d, self.shape()[d], descending)?.1)
    }

    /// The first `k` elements along `d` in the order (value descending when
    /// `largest`, else ascending; then position ascending), and their
    /// positions. Each line along `d` is made contiguous (moved last) so
    /// lines are independent rows that run in parallel.
    pub(crate) fn select_along(&self, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
        let last = self.ndim() as isize - 1;
        let lines = self.transpose(d as isize, last)?.contiguous()?;
        let n = self.shape()[d];
        let mut shape = lines.shape().to_vec();
        shape[last as usize] = k;
        let (values, indices) = crate::with_dtype!(self.dtype(), T => {
            let src = lines.as_slice::<T>()?;
            let indices = Tensor::build::<i64>("topk", &shape, |out| {
                for_each_row(out, k, |r, row| select_row(&src[r * n..r * n + n], row, largest))
            })?;
            let ix = indices.as_slice::<i64>()?;
            let values = Tensor::build::<T>("topk", &shape, |out| {
                for_each_row(out, k, |r, row| {
                    let line = &src[r * n..r * n + n];
                    for (y, &i) in row.iter_mut().zip(&ix[r * k..r * k + k]) {
                        *y = line[i as usize];
                    }
                })
            })?;
            (values, indices)
        });
        let back = |t: Tensor| -> Result<Tensor> { t.transpose(d as isize, last)?.contiguous() };
        Ok((back(values)?, back(indices)?))
    }
}

/// Writes into `out` the positions of the first `out.len()` elements of
/// `line` in the total order (value, then position). A small `k` keeps a
/// sorted buffer of the best `k` in one pass (most elements cost one
/// comparison); otherwise (value, position) pairs are partially selected
/// and sorted.
fn select_row<T: Element>(line: &[T], out: &mut [i64], largest: bool) {
    let k = out.len();
    let cmp = |a: &(T, usize), b: &(T, usize)| {
        let by_value = if largest {
            total_cmp(b.0, a.0)
        } else {
            total_cmp(a.0, b.0)
        };
        by_value.then(a.1.cmp(&b.1))
    };
    if k == 0 {
        return;
    }
    let mut best: Vec<(T, usize)>;
    if k.saturating_mul(SMALL_K_RATIO) <= line.len() {
        best = Vec::with_capacity(k + 1);
        for (i, &x) in line.iter().enumerate() {
            let e = (x, i);
            if best.len() == k {
                if cmp(&e, &best[k - 1]) != Ordering::Less {
                    continue;
                }
                best.pop();
            }
            let at = best.partition_point(|b| cmp(b, &e) == Ordering::Less);
            best.insert(at, e);
        }
    } else {
        best = line.iter().copied().zip(0..).collect();
        if k < best.len() {
            best.select_nth_unstable_by(k - 1, cmp);
            best.truncate(k);
        }
        best.sort_unstable_by(cmp);
    }
    for (y, &(_, i)) in out.iter_mut().zip(&best) {
        *y = i as i64;
    }
}

/// Below `line.len() / SMALL_K_RATIO`, `k` is small enough for the
/// one-pass insertion buffer of [`select_row`].
const SMALL_K_RATIO: usize = 16;

/// A total order on elements: the usual one, with NaN above everything.
fn total_cmp<T: Element>(a: T, b: T) -> Ordering {
    a.partial_cmp(&b).unwrap_or_else(|| {
        #[allow(clippy::eq_op)]
        let (a_nan, b_nan) = (a != a, b != b);
        a_nan.cmp(&b_nan)
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::ops::naive::{ravel, unravel};
    use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
    use crate::{bf16, DType, Element, Error, Tensor};

    /// The reference: each line along `d` fully sorted by a stable sort
    /// (NaN largest), then cut to `k`. Returns (values, indices, shape).
    fn naive(
        vals: &[f64],
        shape: &[usize],
        d: usize,
        k: usize,
        largest: bool,
    ) -> (Vec<f64>, Vec<i64>, Vec<usize>) {
        let mut out_shape = shape.to_vec();
        out_shape[d] = k;
        let n_out: usize = out_shape.iter().product();
        let (mut ov, mut oi) = (vec![0.0; n_out], vec![0i64; n_out]);
        let key = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
        let rank = |x: f64| (x.is_nan() as u8, key(x));
        for lin in 0..n_out {
            let mut i = unravel(lin, &out_shape);
            let j = i[d];
            let mut line: Vec<(usize, f64)> = (0..shape[d])
                .map(|p| {
                    i[d] = p;
                    (p, vals[ravel(&i, shape)])
                })
                .collect();
            line.sort_by(|a, b| {
                let o = rank(a.1).partial_cmp(&rank(b.1)).unwrap();
                if largest {
                    o.reverse()
                } else {
                    o
                }
            });
            ov[lin] = line[j].1;
            oi[lin] = line[j].0 as i64;
        }
        (ov, oi, out_shape)
    }

    fn same(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
    }

    /// Values with many ties (and NaN for floats).
    fn tie_values(seed: u64, n: usize, nan: bool) -> Vec<f64> {
        rand_f64(seed, n)
            .iter()
            .enumerate()
            .map(|(i, x)| {
                if nan && i % 7 == 3 {
                    f64::NAN
                } else {
                    (x * 3.0).round()
                }
            })
            .collect()
    }

    fn topk_matches<T: Element>() {
        let nan = T::DTYPE.is_float();
        for shape in [&[7usize][..], &[3, 5], &[2, 4, 3], &[3, 0, 2], &[2, 40]] {
            let v = tie_values(shape.len() as u64, shape.iter().product(), nan);
            let vals = values_f64(&tensor_of::<T>(&v, shape));
            for d in 0..shape.len() {
                for k in [0, 1.min(shape[d]), shape[d] / 2, shape[d]] {
                    for largest in [true, false] {
                        let (wv, wi, ws) = naive(&vals, shape, d, k, largest);
                        for t in layouts_of::<T>(&v, shape) {
                            let dim = d as isize - shape.len() as isize;
                            let (gv, gi) = t.topk(k, dim, largest, true).unwrap();
                            assert_eq!(gv.shape(), &ws[..]);
                            assert_eq!(gi.dtype(), DType::I64);
                            assert!(same(&values_f64(&gv), &wv), "{t:?} d={d} k={k} largest={largest}");
                            assert_eq!(gi.to_vec::<i64>().unwrap(), wi, "{t:?} d={d} k={k}");
                        }
                    }
                }
                let (wv, wi, _) = naive(&vals, shape, d, shape[d], true);
                let (sv, si) = layouts_of::<T>(&v, shape)[2].sort(d as isize, true).unwrap();
                assert!(same(&values_f64(&sv), &wv));
                assert_eq!(si.to_vec::<i64>().unwrap(), wi);
                let (_, wi, _) = naive(&vals, shape, d, shape[d], false);
                let ai = layouts_of::<T>(&v, shape)[1].argsort(d as isize, false).unwrap();
                assert_eq!(ai.to_vec::<i64>().unwrap(), wi);
            }
        }
    }

    #[test]
    fn topk_and_sort_match_a_stable_full_sort() {
        topk_matches::<f32>();
        topk_matches::<f64>();
        topk_matches::<bf16>();
        topk_matches::<i64>();
        topk_matches::<u8>();
        topk_matches::<bool>();
    }

    #[test]
    fn large_topk_along_first_dim() {
        let shape = [3000, 24];
        let v = tie_values(5, shape.iter().product(), true);
        let (wv, wi, _) = naive(&v, &shape, 0, 5, true);
        let (gv, gi) = tensor_of::<f64>(&v, &shape).topk(5, 0, true, false).unwrap();
        assert!(same(&values_f64(&gv), &wv));
        assert_eq!(gi.to_vec::<i64>().unwrap(), wi);
    }

    #[test]
    fn topk_errors() {
        let t = tensor_of::<f32>(&rand_f64(1, 6), &[2, 3]);
        let e = t.topk(4, 1, true, true).unwrap_err();
        assert!(matches!(e, Error::Arg { op: "topk", .. }), "{e}");
        assert!(
            e.to_string().contains("k = 4") && e.to_string().contains("size 3"),
            "{e}"
        );
        assert!(t.topk(1, 2, true, true).is_err());
        assert!(t.sort(-3, false).is_err());
        assert!(t.argsort(2, false).is_err());
        assert!(Tensor::scalar(1.0f32).topk(1, 0, true, true).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// topk equals the first k of a full descending sort, along any dim.
        #[test]
        fn topk_is_a_prefix_of_sort(
            shape in proptest::collection::vec(1usize..7, 1..4),
            dim_pick in 0usize..3,
            k_pick in 0usize..7,
            largest in any::<bool>(),
            seed in 0u64..1000,
        ) {
            let d = dim_pick % shape.len();
            let k = k_pick % (shape[d] + 1);
            let v = tie_values(seed, shape.iter().product(), true);
            let t = tensor_of::<f32>(&v, &shape);
            let (tv, ti) = t.topk(k, d as isize, largest, true).unwrap();
            let (sv, si) = t.sort(d as isize, largest).unwrap();
            let sv = sv.narrow(d as isize, 0, k).unwrap();
            let si = si.narrow(d as isize, 0, k).unwrap();
            prop_assert!(same(&values_f64(&tv), &values_f64(&sv)));
            prop_assert_eq!(ti.to_vec::<i64>().unwrap(), si.to_vec::<i64>().unwrap());
            // The indices point at the values.
            prop_assert!(same(&values_f64(&t.gather(d as isize, &ti).unwrap()), &values_f64(&tv)));
        }
    }
}
