//! Cumulative sum and product along one dim.

#[cfg(feature = "cuda")]
#[path = "cumsum_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::lanes::map_lanes;
use crate::{dim_index, Element, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// Running sums along `dim`: `out[i] = Σ_{j ≤ i} x[j]`. Floats keep
    /// their dtype (accumulated in f32, f64 for f64); integers and bool give
    /// i64 like PyTorch. Errors on an out-of-range dim.
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        crate::backend::dispatch("cumsum", &[self])?.scan("cumsum", self, dim, false)
    }

    /// Running products along `dim`, with the dtype rules of
    /// [`Tensor::cumsum`]. Errors on an out-of-range dim.
    pub fn cumprod(&self, dim: isize) -> Result<Tensor> {
        crate::backend::dispatch("cumprod", &[self])?.scan("cumprod", self, dim, true)
    }

    /// The CPU kernel of [`Tensor::cumsum`] and (`prod`) [`Tensor::cumprod`],
    /// reported as `op`.
    pub(crate) fn scan(&self, op: &'static str, dim: isize, prod: bool) -> Result<Tensor> {
        if self.ndim() == 0 {
            dim_index(op, dim, 1)?;
            return self.reshape([1])?.scan(op, 0, prod)?.reshape([]);
        }
        let d = dim_index(op, dim, self.ndim())?;
        Ok(crate::with_float_dtype!(self.dtype(), T => {
            map_lanes::<T, T>(op, self, d, |src, off, stride, out| {
                type M = <T as FloatElement>::Math;
                let mut acc = if prod { <M as FloatMath>::ONE } else { <M as FloatMath>::ZERO };
                crate::strided::read_row(src, off, stride, out.len(), |i, x| {
                    acc = if prod { acc * x.to_math() } else { acc + x.to_math() };
                    out[i] = T::from_math(acc);
                });
            })?
        }, else crate::with_dtype!(self.dtype(), T => {
            map_lanes::<T, i64>(op, self, d, |src, off, stride, out| {
                let mut acc = prod as i64;
                crate::strided::read_row(src, off, stride, out.len(), |i, x: T| {
                    let v = x.to_i64();
                    acc = if prod { acc.wrapping_mul(v) } else { acc.wrapping_add(v) };
                    out[i] = acc;
                });
            })?
        })))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
    use crate::{bf16, f16, DType, Element, Tensor};

    fn naive(values: &[f64], shape: &[usize], dim: usize, prod: bool) -> Vec<f64> {
        let n = shape[dim];
        let inner: usize = shape[dim + 1..].iter().product();
        let mut out = values.to_vec();
        for lane in 0..values.len() / n.max(1) {
            let base = lane / inner * inner * n + lane % inner;
            for i in 1..n {
                let (p, c) = (base + (i - 1) * inner, base + i * inner);
                out[c] = if prod {
                    out[p] * values[c]
                } else {
                    out[p] + values[c]
                };
            }
        }
        out
    }

    fn check<T: Element>(tol: f64, out_dtype: DType, int: bool) {
        let shapes: &[&[usize]] = &[&[9], &[3, 5], &[2, 3, 4], &[0, 2], &[2, 1]];
        for (si, &shape) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let raw: Vec<f64> = rand_f64(si as u64 + 3, n)
                .iter()
                .map(|x| if int { (x * 3.0).round().abs() } else { x + 1.0 })
                .collect();
            let values = values_f64(&tensor_of::<T>(&raw, shape));
            for t in layouts_of::<T>(&values, shape) {
                for d in 0..shape.len() {
                    for prod in [false, true] {
                        let want = naive(&values, shape, d, prod);
                        let r = if prod {
                            t.cumprod(d as isize)
                        } else {
                            t.cumsum(d as isize - shape.len() as isize)
                        }
                        .unwrap();
                        assert_eq!((r.shape(), r.dtype()), (shape, out_dtype));
                        for (g, w) in values_f64(&r).iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= tol * (1.0 + w.abs()),
                                "{:?} {shape:?} {d} {prod}: {g} vs {w}",
                                T::DTYPE
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cumsum_and_cumprod_match_naive() {
        check::<f64>(1e-14, DType::F64, false);
        check::<f32>(1e-6, DType::F32, false);
        check::<f16>(2e-3, DType::F16, false);
        check::<bf16>(1e-2, DType::BF16, false);
        check::<i64>(0.0, DType::I64, true);
        check::<u8>(0.0, DType::I64, true);
        check::<bool>(0.0, DType::I64, true);
        let s = Tensor::scalar(4u8);
        assert_eq!(s.cumsum(0).unwrap().to_scalar::<i64>().unwrap(), 4);
        assert!(s.cumsum(1).is_err());
        assert!(Tensor::from_vec(vec![1.0f32; 4], &[2, 2])
            .unwrap()
            .cumsum(-3)
            .is_err());
    }
}
