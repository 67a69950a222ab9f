//! Reductions over any set of dims: sum, mean, prod, max/min, argmax/argmin,
//! var/std, logsumexp, norm, all/any.
//!
//! Conventions (PyTorch's): `dims` empty means every dim; negative dims count
//! from the end; `keepdim` keeps reduced dims as size 1. f16/bf16/f32
//! accumulate in f32 (pairwise), f64 in f64; integer and bool sums and
//! products are i64. Results do not depend on the thread count (see
//! [`cpu`]'s fixed chunking).

mod columns;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod simd;
#[cfg(feature = "cuda")]
pub(crate) mod stats_cuda;
#[cfg(test)]
mod tests;

use cpu::{reduce, AbsExtreme, Extreme, FloatProd, FloatSum, IntFold, LogSumExp, Moments, Plan, Truth};

use crate::backend::ReduceOp;
use crate::simd::Level;
use crate::{DType, Element, Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// The sum over `dims`. Floats keep their dtype; integers and bool give
    /// i64 (wrapping on overflow). An empty reduction is 0. Errors on an
    /// out-of-range or repeated dim.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("sum", &[self])?.reduce(ReduceOp::Sum, self, dims, keepdim)
    }

    /// The mean over `dims` (NaN for an empty reduction). Errors for
    /// non-float dtypes (cast first, as PyTorch requires) and on bad dims.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("mean", &[self])?.mean(self, dims, keepdim)
    }

    /// The product over `dims`. Floats keep their dtype; integers and bool
    /// give i64 (wrapping). An empty reduction is 1. Errors on bad dims.
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("prod", &[self])?.reduce(ReduceOp::Prod, self, dims, keepdim)
    }

    /// The maximum over `dims` (PyTorch's `amax`), in the input dtype; NaN
    /// propagates. Errors when the reduction is empty or on bad dims.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("max", &[self])?.reduce(ReduceOp::Max, self, dims, keepdim)
    }

    /// The minimum over `dims` (PyTorch's `amin`), in the input dtype; NaN
    /// propagates. Errors when the reduction is empty or on bad dims.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("min", &[self])?.reduce(ReduceOp::Min, self, dims, keepdim)
    }

    /// The maximum along `dim` and the (i64) index of its first occurrence
    /// (PyTorch's `max(dim)`); a NaN counts as the maximum. Errors when the
    /// dim is empty or out of range.
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        crate::backend::dispatch("max_dim", &[self])?.reduce_index(true, self, dim, keepdim)
    }

    /// The minimum along `dim` and the (i64) index of its first occurrence
    /// (PyTorch's `min(dim)`). Errors when the dim is empty or out of range.
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        crate::backend::dispatch("min_dim", &[self])?.reduce_index(false, self, dim, keepdim)
    }

    /// The (i64) index of the first maximum along `dim`, or in the flattened
    /// tensor when `dim` is `None` (then `keepdim` keeps every dim as 1).
    /// A NaN counts as the maximum. Errors when the reduction is empty.
    pub fn argmax(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("argmax", &[self])?.arg_reduce(true, self, dim, keepdim)
    }

    /// The (i64) index of the first minimum along `dim`, or in the flattened
    /// tensor when `dim` is `None`. Errors when the reduction is empty.
    pub fn argmin(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("argmin", &[self])?.arg_reduce(false, self, dim, keepdim)
    }

    /// The variance over `dims` with `correction` (1 = unbiased, PyTorch's
    /// default; 0 = biased): Σ(x − mean)² / max(0, N − correction), which is
    /// inf or NaN when N ≤ correction, like PyTorch. Computed in f64. Errors
    /// for non-float dtypes and on bad dims.
    pub fn var(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Tensor> {
        Ok(crate::backend::dispatch("var", &[self])?
            .var_mean("var", self, dims, correction, keepdim, false)?
            .0)
    }

    /// The standard deviation: the square root of [`Tensor::var`].
    pub fn std(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Tensor> {
        Ok(crate::backend::dispatch("std", &[self])?
            .var_mean("std", self, dims, correction, keepdim, true)?
            .0)
    }

    /// The variance (as [`Tensor::var`]) and the mean over `dims`, in one
    /// pass. Errors for non-float dtypes and on bad dims.
    pub fn var_mean(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        crate::backend::dispatch("var_mean", &[self])?
            .var_mean("var_mean", self, dims, correction, keepdim, false)
    }

    /// log Σ exp(x) over `dims`, stable for large |x| (−inf for an empty
    /// reduction). Errors for non-float dtypes and on bad dims.
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("logsumexp", &[self])?.logsumexp(self, dims, keepdim)
    }

    /// The CPU kernel of [`Tensor::logsumexp`].
    pub(crate) fn logsumexp_cpu(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let plan = Plan::new("logsumexp", self.layout(), dims, keepdim)?;
        crate::with_float_dtype!(self.dtype(), T => {
            self.float_reduce::<T, _>(&plan, &LogSumExp, |a, _| LogSumExp::finish(a))
        }, else Err(float_only("logsumexp", self.dtype())))
    }

    /// The vector p-norm over `dims` (PyTorch's `linalg.vector_norm`):
    /// (Σ|x|^p)^(1/p); p = ∞ is max|x|, −∞ min|x|, 0 the count of non-zeros.
    /// Errors for non-float dtypes, NaN p, bad dims, and an empty reduction
    /// with p = ±∞.
    pub fn norm(&self, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let be = crate::backend::dispatch("norm", &[self])?;
        if p.is_nan() {
            return Err(Error::arg("norm", "p must not be NaN"));
        }
        be.norm(self, p, dims, keepdim)
    }

    /// The CPU kernel of [`Tensor::norm`] (p not NaN).
    pub(crate) fn norm_cpu(&self, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        const OP: &str = "norm";
        let plan = Plan::new(OP, self.layout(), dims, keepdim)?;
        crate::with_float_dtype!(self.dtype(), T => {
            type M = <T as FloatElement>::Math;
            if p.is_infinite() {
                if plan.n_red == 0 {
                    return Err(empty_error(OP, self.shape(), dims));
                }
                return self.float_reduce::<T, _>(&plan, &AbsExtreme { max: p > 0.0 }, |m, _| m);
            }
            Ok(if p == 0.0 {
                let (zero, one) = (<M as FloatMath>::ZERO, <M as FloatMath>::ONE);
                let nz = move |x: M| if x == zero { zero } else { one };
                self.float_reduce::<T, _>(&plan, &FloatSum(nz), |s, _| s)?
            } else if p == 1.0 {
                self.float_reduce::<T, _>(&plan, &FloatSum(|x: M| x.abs()), |s, _| s)?
            } else if p == 2.0 {
                self.float_reduce::<T, _>(&plan, &FloatSum(|x: M| x * x), |s, _| s.sqrt())?
            } else {
                let (pm, inv) = (M::of(p), M::of(1.0 / p));
                self.float_reduce::<T, _>(&plan, &FloatSum(move |x: M| x.abs().powf(pm)), move |s, _| s.powf(inv))?
            })
        }, else Err(float_only(OP, self.dtype())))
    }

    /// True (bool) where every element over `dims` is non-zero (NaN counts
    /// as non-zero); true for an empty reduction. Errors on bad dims.
    pub fn all(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("all", &[self])?.truth_reduce("all", self, dims, keepdim, true)
    }

    /// True (bool) where some element over `dims` is non-zero; false for an
    /// empty reduction. Errors on bad dims.
    pub fn any(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        crate::backend::dispatch("any", &[self])?.truth_reduce("any", self, dims, keepdim, false)
    }
}

/// Helpers shared by the public reductions above.
impl Tensor {
    /// The CPU kernels of [`ReduceOp`]: `op` over `dims`.
    pub(crate) fn reduce_cpu(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        match op {
            ReduceOp::Sum => {
                let plan = Plan::new("sum", self.layout(), dims, keepdim)?;
                if self.dtype() == DType::F32 {
                    return self.sum_f32(&plan, 1.0);
                }
                Ok(crate::with_float_dtype!(self.dtype(), T => {
                    self.float_sum::<T>(&plan, |s| s)?
                }, else self.int_reduce(&plan, false)?))
            }
            ReduceOp::Prod => {
                let plan = Plan::new("prod", self.layout(), dims, keepdim)?;
                Ok(crate::with_float_dtype!(self.dtype(), T => {
                    self.float_reduce::<T, _>(&plan, &FloatProd, |p, _| p)?
                }, else self.int_reduce(&plan, true)?))
            }
            ReduceOp::Max => Ok(self.extreme("max", dims, keepdim, true, false)?.0),
            ReduceOp::Min => Ok(self.extreme("min", dims, keepdim, false, false)?.0),
        }
    }

    /// The CPU kernel of [`Tensor::mean`].
    pub(crate) fn mean_cpu(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let plan = Plan::new("mean", self.layout(), dims, keepdim)?;
        if self.dtype() == DType::F32 {
            return self.sum_f32(&plan, plan.n_red as f32);
        }
        crate::with_float_dtype!(self.dtype(), T => {
            let n = <T as FloatElement>::Math::of(plan.n_red as f64);
            self.float_sum::<T>(&plan, |s| s / n)
        }, else Err(float_only("mean", self.dtype())))
    }

    /// The CPU kernel of `max_dim` (`max`) and `min_dim`.
    pub(crate) fn reduce_index_cpu(&self, max: bool, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let op = if max { "max_dim" } else { "min_dim" };
        let (v, i) = self.extreme(op, &[dim], keepdim, max, true)?;
        Ok((v, i.expect("indices requested")))
    }

    /// The f32 sum over `plan` divided by `div` (1, or n for the mean).
    fn sum_f32(&self, plan: &Plan, div: f32) -> Result<Tensor> {
        let src = self.storage().as_slice::<f32>();
        let accs = columns::column_sums(src, plan)
            .unwrap_or_else(|| reduce(src, plan, &simd::SumF32(Level::best())));
        Tensor::build_overwrite::<f32>("sum", &plan.out_shape, |o| {
            o.iter_mut().zip(accs).for_each(|(o, a)| *o = a / div)
        })
    }

    /// The float sum over `plan`, each sum converted by `finish`: column
    /// sums on their fast path, anything else on the engine.
    fn float_sum<T: FloatElement>(&self, plan: &Plan, finish: impl Fn(T::Math) -> T::Math) -> Result<Tensor> {
        match columns::column_sums(self.storage().as_slice::<T>(), plan) {
            Some(sums) => {
                let out: Vec<T> = sums.into_iter().map(|s| T::from_math(finish(s))).collect();
                from_vec_shaped(out, &plan.out_shape)
            }
            None => self.float_reduce::<T, _>(plan, &FloatSum(|x| x), |s, _| finish(s)),
        }
    }

    /// Runs a float reducer and converts each final state with `finish(acc,
    /// output index)`, returning a tensor in the input dtype.
    fn float_reduce<T: FloatElement, R: cpu::Reducer<T>>(
        &self,
        plan: &Plan,
        r: &R,
        finish: impl Fn(R::Acc, usize) -> T::Math,
    ) -> Result<Tensor> {
        let accs = reduce(self.storage().as_slice::<T>(), plan, r);
        let out: Vec<T> = accs
            .into_iter()
            .enumerate()
            .map(|(o, a)| T::from_math(finish(a, o)))
            .collect();
        from_vec_shaped(out, &plan.out_shape)
    }

    /// Integer/bool sum or product in i64.
    fn int_reduce(&self, plan: &Plan, prod: bool) -> Result<Tensor> {
        let out = crate::with_dtype!(self.dtype(), T => reduce(self.storage().as_slice::<T>(), plan, &IntFold { prod }));
        from_vec_shaped(out, &plan.out_shape)
    }

    pub(crate) fn truth(&self, op: &'static str, dims: &[isize], keepdim: bool, all: bool) -> Result<Tensor> {
        let plan = Plan::new(op, self.layout(), dims, keepdim)?;
        let out = crate::with_dtype!(self.dtype(), T => reduce(self.storage().as_slice::<T>(), &plan, &Truth { all }));
        from_vec_shaped(out, &plan.out_shape)
    }

    /// Values (and, with `indices`, i64 positions within the reduced index
    /// space) of the max or min over `dims`.
    fn extreme(
        &self,
        op: &'static str,
        dims: &[isize],
        keepdim: bool,
        max: bool,
        indices: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let plan = Plan::new(op, self.layout(), dims, keepdim)?;
        if plan.n_red == 0 {
            return Err(empty_error(op, self.shape(), dims));
        }
        if self.dtype() == DType::F32 && !indices {
            let r = simd::ExtremeF32 {
                level: Level::best(),
                max,
            };
            let vals = reduce(self.storage().as_slice::<f32>(), &plan, &r);
            return Ok((from_vec_shaped(vals, &plan.out_shape)?, None));
        }
        Ok(crate::with_dtype!(self.dtype(), T => {
            let accs = reduce(self.storage().as_slice::<T>(), &plan, &Extreme { max });
            // A non-empty reduction always produced a value.
            let vals: Vec<T> = accs.iter().map(|a| a.map_or(<T as Element>::ZERO, |(v, _)| v)).collect();
            let idx = indices.then(|| {
                let i: Vec<i64> = accs.iter().map(|a| a.map_or(0, |(_, i)| i as i64)).collect();
                from_vec_shaped(i, &plan.out_shape)
            }).transpose()?;
            (from_vec_shaped(vals, &plan.out_shape)?, idx)
        }))
    }

    pub(crate) fn arg_extreme(
        &self,
        op: &'static str,
        dim: Option<isize>,
        keepdim: bool,
        max: bool,
    ) -> Result<Tensor> {
        let dims: Vec<isize> = dim.into_iter().collect();
        Ok(self
            .extreme(op, &dims, keepdim, max, true)?
            .1
            .expect("indices requested"))
    }

    pub(crate) fn var_mean_impl(
        &self,
        op: &'static str,
        dims: &[isize],
        correction: f64,
        keepdim: bool,
        sqrt: bool,
    ) -> Result<(Tensor, Tensor)> {
        if !correction.is_finite() || correction < 0.0 {
            return Err(Error::arg(
                op,
                format!("correction must be finite and ≥ 0, got {correction}"),
            ));
        }
        let plan = Plan::new(op, self.layout(), dims, keepdim)?;
        crate::with_float_dtype!(self.dtype(), T => {
            let accs = reduce(self.storage().as_slice::<T>(), &plan, &Moments);
            let dof = (plan.n_red as f64 - correction).max(0.0);
            let var: Vec<T> = accs
                .iter()
                .map(|a| {
                    let v = a.2 / dof;
                    T::from_f64(if sqrt { v.sqrt() } else { v })
                })
                .collect();
            let mean: Vec<T> = accs
                .iter()
                .map(|a| T::from_f64(if a.0 == 0.0 { f64::NAN } else { a.1 }))
                .collect();
            Ok((from_vec_shaped(var, &plan.out_shape)?, from_vec_shaped(mean, &plan.out_shape)?))
        }, else Err(float_only(op, self.dtype())))
    }
}

/// Per-output (count, mean, m2) moments in f64 over `dims` (empty = all),
/// for the normalization layers. Errors on bad dims.
pub(crate) fn moments(x: &Tensor, op: &'static str, dims: &[isize]) -> Result<Vec<cpu::MomentsAcc>> {
    let plan = Plan::new(op, x.layout(), dims, false)?;
    Ok(crate::with_dtype!(x.dtype(), T => reduce(x.storage().as_slice::<T>(), &plan, &Moments)))
}

/// A contiguous tensor of `shape` from a vector the engine sized to match;
/// errors when memory is out.
fn from_vec_shaped<T: Element>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
    Tensor::build_overwrite::<T>("reduce", shape, |out| out.copy_from_slice(&v))
}

fn float_only(op: &'static str, dtype: DType) -> Error {
    Error::dtype(
        op,
        format!("expects a float tensor, got {dtype}; cast with to_dtype first"),
    )
}

fn empty_error(op: &'static str, shape: &[usize], dims: &[isize]) -> Error {
    Error::shape(
        op,
        format!("cannot reduce over an empty set of elements (shape {shape:?}, dims {dims:?}); the reduction has no identity"),
    )
}
