//! Comparisons (→ bool), logical ops and `where`, with NumPy broadcasting.
//!
//! Tensor–tensor comparisons convert both operands to their promoted dtype
//! ([`crate::DType::promote`], as the arithmetic ops do) and compare there,
//! so `f16 == f32` compares in f32 and NaN compares unequal to everything.
//! Tensor–scalar comparisons compare a float tensor in its own dtype (the
//! scalar rounded to it, like PyTorch) and an integer or bool tensor in f64
//! (exact for integers up to 2^53; PyTorch would round both to f32).
//! Logical ops treat every non-zero value (NaN included) as true.

use crate::ops::binary::promoted;
use crate::{DType, Element, Error, Result, Tensor};

/// Defines a tensor–tensor comparison and its scalar form.
macro_rules! comparison {
    ($(#[$doc:meta])* $name:ident, $scalar:ident, $op:tt) => {
        $(#[$doc])*
        ///
        /// Broadcasts, returns a bool tensor, and errors when the shapes do
        /// not broadcast.
        pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
            host_kernel!(stringify!($name), self, other);
            let (a, b) = promoted(self, other, None)?;
            crate::with_dtype!(a.dtype(), T => a.zip_map::<T, T, bool>(&b, stringify!($name), |x, y| x $op y))
        }

        $(#[$doc])*
        ///
        /// The scalar form: compares every element with `s` (see the module
        /// docs for the precision), returning a bool tensor.
        pub fn $scalar(&self, s: f64) -> Result<Tensor> {
            host_kernel!(stringify!($scalar), self);
            crate::with_float_dtype!(self.dtype(), T => {
                let s = T::from_f64(s);
                self.try_map::<T, bool>(stringify!($scalar), |x| x $op s)
            }, else crate::with_dtype!(self.dtype(), T => self.try_map::<T, bool>(stringify!($scalar), |x| x.to_f64() $op s)))
        }
    };
}

impl Tensor {
    comparison!(
        /// `self == other` elementwise.
        eq, eq_scalar, ==);
    comparison!(
        /// `self != other` elementwise (true where either is NaN).
        ne, ne_scalar, !=);
    comparison!(
        /// `self < other` elementwise.
        lt, lt_scalar, <);
    comparison!(
        /// `self <= other` elementwise.
        le, le_scalar, <=);
    comparison!(
        /// `self > other` elementwise.
        gt, gt_scalar, >);
    comparison!(
        /// `self >= other` elementwise.
        ge, ge_scalar, >=);

    /// Elementwise logical and of the truth values (non-zero is true),
    /// broadcasting; a bool tensor. Errors when the shapes do not broadcast.
    pub fn logical_and(&self, other: &Tensor) -> Result<Tensor> {
        host_kernel!("logical_and", self, other);
        truth(self)?.zip_map::<bool, bool, bool>(&truth(other)?, "logical_and", |x, y| x & y)
    }

    /// Elementwise logical or (non-zero is true), broadcasting; a bool
    /// tensor. Errors when the shapes do not broadcast.
    pub fn logical_or(&self, other: &Tensor) -> Result<Tensor> {
        host_kernel!("logical_or", self, other);
        truth(self)?.zip_map::<bool, bool, bool>(&truth(other)?, "logical_or", |x, y| x | y)
    }

    /// Elementwise logical exclusive or (non-zero is true), broadcasting; a
    /// bool tensor. Errors when the shapes do not broadcast.
    pub fn logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        host_kernel!("logical_xor", self, other);
        truth(self)?.zip_map::<bool, bool, bool>(&truth(other)?, "logical_xor", |x, y| x ^ y)
    }

    /// Elementwise logical not: true where the element is zero; a bool tensor.
    pub fn logical_not(&self) -> Result<Tensor> {
        host_kernel!("logical_not", self);
        truth(self)?.try_map::<bool, bool>("logical_not", |x| !x)
    }

    /// `a` where `cond` is true, else `b`, broadcasting all three
    /// (PyTorch's `torch.where`); `a` and `b` are converted to their promoted
    /// dtype. Errors when `cond` is not bool or the shapes do not broadcast.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        host_kernel!("where_", cond, a, b);
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
        let (a, b) = promoted(a, b, None)?;
        crate::with_dtype!(a.dtype(), T => cond.zip3_map::<bool, T, T, T>(&a, &b, "where", |c, x, y| if c { x } else { y }))
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
