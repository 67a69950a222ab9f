//! softmax and log_softmax over one dim, numerically stable: one online pass
//! per lane finds the maximum and Σ exp(x − max) together, a second writes.

#[cfg(feature = "cuda")]
#[path = "softmax_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::lanes::map_lanes;
use crate::simd::{kernels, Level};
use crate::{dim_index, DType, Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// exp(x) / Σ exp(x) along `dim`, computed stably in f32 (f64 for f64)
    /// so ±1000 neither overflows nor gives NaN. A lane containing NaN, or
    /// only −∞, is NaN (as in PyTorch). Errors for non-float dtypes and an
    /// out-of-range dim.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("softmax", dim, false)
    }

    /// log(softmax(x)) along `dim`, computed as x − max − log Σ exp(x − max)
    /// (no log of a rounded probability). Errors as [`Tensor::softmax`].
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("log_softmax", dim, true)
    }

    fn softmax_impl(&self, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
        crate::backend::dispatch(op, &[self])?.softmax(op, self, dim, log)
    }

    /// The CPU kernel of [`Tensor::softmax`].
    pub(crate) fn softmax_cpu(&self, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
        if self.ndim() == 0 {
            dim_index(op, dim, 1)?;
            return self.reshape([1])?.softmax_impl(op, 0, log)?.reshape([]);
        }
        let d = dim_index(op, dim, self.ndim())?;
        if self.dtype() == DType::F32 {
            let level = Level::best();
            return map_lanes::<f32, f32>(op, self, d, |src, off, stride, out| {
                with_lane(src, off, stride, out.len(), |x| {
                    kernels::softmax(level, x, out, log)
                })
            });
        }
        crate::with_float_dtype!(self.dtype(), T => {
            map_lanes::<T, T>(op, self, d, |src, off, stride, out| softmax_lane(src, off, stride, out, log))
        }, else Err(Error::dtype(op, format!("expects a float tensor, got {}", self.dtype()))))
    }
}

/// Calls `f` with the lane `src[off + i·stride]`, `i < n`, as a contiguous
/// slice: borrowed when the stride is 1, else gathered into a buffer.
fn with_lane<R>(src: &[f32], off: usize, stride: isize, n: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    if stride == 1 {
        f(&src[off..off + n])
    } else {
        let lane: Vec<f32> = (0..n)
            .map(|i| src[(off as isize + i as isize * stride) as usize])
            .collect();
        f(&lane)
    }
}

/// One lane of softmax (or log_softmax) from `src[off + i·stride]` into `out`.
fn softmax_lane<T: FloatElement>(src: &[T], off: usize, stride: isize, out: &mut [T], log: bool) {
    let at = |i: usize| src[(off as isize + i as isize * stride) as usize].to_math();
    let (mut m, mut s) = (T::Math::NEG_INFINITY, T::Math::ZERO);
    for i in 0..out.len() {
        let x = at(i);
        if x > m {
            s = s * (m - x).exp() + T::Math::ONE;
            m = x;
        } else if x != T::Math::NEG_INFINITY {
            // NaN lands here too and poisons the lane, as it should.
            s += (x - m).exp();
        }
    }
    if log {
        let shift = m + s.ln();
        for (i, y) in out.iter_mut().enumerate() {
            *y = T::from_math(at(i) - shift);
        }
    } else {
        let inv = T::Math::ONE / s;
        for (i, y) in out.iter_mut().enumerate() {
            *y = T::from_math((at(i) - m).exp() * inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{layouts_of, rand_f64, values_f64};
    use crate::{bf16, f16, Element, Tensor};

    /// Naive f64 softmax of every lane along `dim` of a row-major array.
    fn naive(values: &[f64], shape: &[usize], dim: usize, log: bool) -> Vec<f64> {
        let n = shape[dim];
        let inner: usize = shape[dim + 1..].iter().product();
        let mut out = vec![0.0; values.len()];
        for lane0 in 0..values.len() / n.max(1) {
            let base = lane0 / inner * inner * n + lane0 % inner;
            let xs: Vec<f64> = (0..n).map(|i| values[base + i * inner]).collect();
            let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = xs.iter().map(|x| (x - m).exp()).sum();
            for i in 0..n {
                out[base + i * inner] = if log {
                    xs[i] - m - s.ln()
                } else {
                    (xs[i] - m).exp() / s
                };
            }
        }
        out
    }

    fn check<T: Element>(tol: f64, scale: f64) {
        let shapes: &[&[usize]] = &[&[6], &[3, 5], &[2, 3, 4], &[2, 0, 3], &[1, 4, 1]];
        for (si, &shape) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let raw: Vec<f64> = rand_f64(si as u64, n).iter().map(|x| x * scale).collect();
            let values = values_f64(&crate::test_util::tensor_of::<T>(&raw, shape));
            for t in layouts_of::<T>(&values, shape) {
                for d in 0..shape.len() {
                    for log in [false, true] {
                        let want = naive(&values, shape, d, log);
                        let dim = if d % 2 == 0 {
                            d as isize
                        } else {
                            d as isize - shape.len() as isize
                        };
                        let r = if log { t.log_softmax(dim) } else { t.softmax(dim) }.unwrap();
                        assert_eq!((r.shape(), r.dtype()), (shape, T::DTYPE));
                        for (g, w) in values_f64(&r).iter().zip(&want) {
                            assert!(g.is_finite(), "{:?} {shape:?} dim {d}", T::DTYPE);
                            assert!(
                                (g - w).abs() <= tol * (1.0 + w.abs()),
                                "{:?} {shape:?} dim {d} log {log}: {g} vs {w}",
                                T::DTYPE
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_matches_naive_for_every_layout_and_dtype() {
        check::<f64>(1e-13, 3.0);
        check::<f32>(1e-6, 3.0);
        check::<f16>(2e-3, 3.0);
        check::<bf16>(1e-2, 3.0);
        // Huge magnitudes: no overflow, no NaN.
        check::<f64>(1e-12, 1000.0);
        check::<f32>(1e-4, 1000.0);
    }

    #[test]
    fn rows_sum_to_one_and_edge_cases() {
        let v: Vec<f32> = rand_f64(4, 300 * 200)
            .iter()
            .map(|&x| (x * 1000.0) as f32)
            .collect();
        let t = Tensor::from_vec(v, &[300, 200]).unwrap();
        for dim in [0, 1] {
            let s = t.softmax(dim).unwrap().sum(&[dim], false).unwrap();
            assert!(s.to_vec::<f32>().unwrap().iter().all(|x| (x - 1.0).abs() < 1e-5));
        }
        let x = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, f32::NAN], &[2, 2]).unwrap();
        let s = x.softmax(1).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&s[..2], &[0.0, 1.0]);
        assert!(s[2].is_nan() && s[3].is_nan());
        assert_eq!(
            x.log_softmax(1).unwrap().to_vec::<f32>().unwrap()[..2],
            [f32::NEG_INFINITY, 0.0]
        );
        assert_eq!(
            Tensor::scalar(3.0f64)
                .softmax(-1)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap(),
            1.0
        );
        assert!(t.softmax(2).is_err());
        assert!(Tensor::from_vec(vec![1i64], &[1]).unwrap().softmax(0).is_err());
    }
}
