//! Comparisons (→ bool), logical ops and `where`, with NumPy broadcasting.
//!
//! Tensor–tensor comparisons convert both operands to their promoted dtype
//! ([`crate::DType::promote`], as the arithmetic ops do) and compare there,
//! so `f16 == f32` compares in f32 and NaN compares unequal to everything.
//! Tensor–scalar comparisons compare a float tensor in its own dtype (the
//! scalar rounded to it, like PyTorch) and an integer or bool tensor in f64
//! (exact for integers up to 2^53; PyTorch would round both to f32).
//! Logical ops treat every non-zero value (NaN included) as true.

#[cfg(feature = "cuda")]
#[path = "compare_cuda.rs"]
pub(crate) mod cuda;

use crate::backend::CompareOp;
use crate::ops::binary::promoted;
use crate::{DType, Element, Error, Result, Tensor};

/// Defines a tensor–tensor comparison and its scalar form.
macro_rules! comparison {
    ($(#[$doc:meta])* $name:ident, $scalar:ident, $code:ident) => {
        $(#[$doc])*
        ///
        /// Broadcasts, returns a bool tensor, and errors when the shapes do
        /// not broadcast.
        pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
            let be = crate::backend::dispatch(stringify!($name), &[self, other])?;
            let (a, b) = promoted(self, other, None)?;
            be.compare(CompareOp::$code, &a, &b)
        }

        $(#[$doc])*
        ///
        /// The scalar form: compares every element with `s` (see the module
        /// docs for the precision), returning a bool tensor.
        pub fn $scalar(&self, s: f64) -> Result<Tensor> {
            crate::backend::dispatch(stringify!($scalar), &[self])?.compare_scalar(stringify!($scalar), CompareOp::$code, self, s)
        }
    };
}

/// The CPU kernel of the comparisons: `op` of `a` and `b` (one dtype),
/// broadcast, as bool.
// Bool is one of the dtypes: its `<` is the generic one, on purpose.
#[allow(clippy::bool_comparison)]
pub(crate) fn cpu_compare(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    crate::with_dtype!(a.dtype(), T => match op {
        CompareOp::Eq => a.zip_map::<T, T, bool>(b, name, |x, y| x == y),
        CompareOp::Ne => a.zip_map::<T, T, bool>(b, name, |x, y| x != y),
        CompareOp::Lt => a.zip_map::<T, T, bool>(b, name, |x, y| x < y),
        CompareOp::Le => a.zip_map::<T, T, bool>(b, name, |x, y| x <= y),
        CompareOp::Gt => a.zip_map::<T, T, bool>(b, name, |x, y| x > y),
        CompareOp::Ge => a.zip_map::<T, T, bool>(b, name, |x, y| x >= y),
        CompareOp::And | CompareOp::Or | CompareOp::Xor => cpu_logical(op, a, b),
    })
}

/// The CPU kernel of the scalar comparisons, reported as `name`: a float
/// tensor compared in its dtype with `s` rounded to it, others in f64.
pub(crate) fn cpu_compare_scalar(name: &'static str, op: CompareOp, x: &Tensor, s: f64) -> Result<Tensor> {
    fn by<T: Copy + crate::Element, U: PartialOrd + Copy + Send + Sync>(
        name: &'static str,
        op: CompareOp,
        x: &Tensor,
        s: U,
        f: impl Fn(T) -> U + Sync + Send + Copy,
    ) -> Result<Tensor> {
        match op {
            CompareOp::Eq => x.try_map::<T, bool>(name, move |v| f(v) == s),
            CompareOp::Ne => x.try_map::<T, bool>(name, move |v| f(v) != s),
            CompareOp::Lt => x.try_map::<T, bool>(name, move |v| f(v) < s),
            CompareOp::Le => x.try_map::<T, bool>(name, move |v| f(v) <= s),
            CompareOp::Gt => x.try_map::<T, bool>(name, move |v| f(v) > s),
            CompareOp::Ge => x.try_map::<T, bool>(name, move |v| f(v) >= s),
            CompareOp::And | CompareOp::Or | CompareOp::Xor => {
                Err(Error::arg(name, format!("{} has no scalar form", op.name())))
            }
        }
    }
    crate::with_float_dtype!(x.dtype(), T => by::<T, T>(name, op, x, T::from_f64(s), |v| v),
        else crate::with_dtype!(x.dtype(), T => by::<T, f64>(name, op, x, s, |v| v.to_f64())))
}

/// The CPU kernel of the logical ops on the truth values of `a` and `b`.
pub(crate) fn cpu_logical(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b, name) = (truth(a)?, truth(b)?, op.name());
    match op {
        CompareOp::And => a.zip_map::<bool, bool, bool>(&b, name, |x, y| x & y),
        CompareOp::Or => a.zip_map::<bool, bool, bool>(&b, name, |x, y| x | y),
        CompareOp::Xor => a.zip_map::<bool, bool, bool>(&b, name, |x, y| x ^ y),
        _ => cpu_compare(op, &a, &b),
    }
}

/// The CPU kernel of [`Tensor::where_`] (`cond` checked to be bool).
pub(crate) fn cpu_where(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = promoted(a, b, None)?;
    crate::with_dtype!(a.dtype(), T => cond.zip3_map::<bool, T, T, T>(&a, &b, "where", |c, x, y| if c { x } else { y }))
}

impl Tensor {
    comparison!(
        /// `self == other` elementwise.
        eq, eq_scalar, Eq);
    comparison!(
        /// `self != other` elementwise (true where either is NaN).
        ne, ne_scalar, Ne);
    comparison!(
        /// `self < other` elementwise.
        lt, lt_scalar, Lt);
    comparison!(
        /// `self <= other` elementwise.
        le, le_scalar, Le);
    comparison!(
        /// `self > other` elementwise.
        gt, gt_scalar, Gt);
    comparison!(
        /// `self >= other` elementwise.
        ge, ge_scalar, Ge);

    /// Elementwise logical and of the truth values (non-zero is true),
    /// broadcasting; a bool tensor. Errors when the shapes do not broadcast.
    pub fn logical_and(&self, other: &Tensor) -> Result<Tensor> {
        crate::backend::dispatch("logical_and", &[self, other])?.logical(CompareOp::And, self, other)
    }

    /// Elementwise logical or (non-zero is true), broadcasting; a bool
    /// tensor. Errors when the shapes do not broadcast.
    pub fn logical_or(&self, other: &Tensor) -> Result<Tensor> {
        crate::backend::dispatch("logical_or", &[self, other])?.logical(CompareOp::Or, self, other)
    }

    /// Elementwise logical exclusive or (non-zero is true), broadcasting; a
    /// bool tensor. Errors when the shapes do not broadcast.
    pub fn logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        crate::backend::dispatch("logical_xor", &[self, other])?.logical(CompareOp::Xor, self, other)
    }

    /// Elementwise logical not: true where the element is zero; a bool tensor.
    pub fn logical_not(&self) -> Result<Tensor> {
        // x == 0 is the negated truth value in every dtype (NaN != 0).
        crate::backend::dispatch("logical_not", &[self])?.compare_scalar(
            "logical_not",
            CompareOp::Eq,
            self,
            0.0,
        )
    }

    /// `a` where `cond` is true, else `b`, broadcasting all three
    /// (PyTorch's `torch.where`); `a` and `b` are converted to their promoted
    /// dtype. Errors when `cond` is not bool or the shapes do not broadcast.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let be = crate::backend::dispatch("where_", &[cond, a, b])?;
        if cond.dtype() != DType::Bool {
            return Err(Error::dtype(
                "where",
                format!(
                    "condition must be bool, got {} (shape {:?})",
                    cond.dtype(),
                    cond.shape()
                ),
            ));
        }
        be.where_(cond, a, b)
    }
}

/// The truth values of `t`: non-zero (and NaN) is true. Errors when the
/// conversion fails.
fn truth(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::Bool)
}

#[cfg(test)]
#[path = "compare_tests.rs"]
mod tests;
