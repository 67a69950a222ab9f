//! Elementwise binary arithmetic with NumPy broadcasting, and its scalar
//! forms.
//!
//! # Dtype promotion
//!
//! Mixed dtypes follow PyTorch's promotion rules ([`DType::promote`]): both
//! operands are converted to the promoted dtype before the op, where
//! categories rank bool < integers < floats and, within a category, the wider
//! type wins (`u8 + i64 → i64`, `i64 + f16 → f16`, `f16 + bf16 → f32`,
//! `f32 + f64 → f64`). Unlike PyTorch, a 0-d tensor promotes like any other
//! tensor; use the `*_scalar` forms for PyTorch's Python-scalar behaviour.
//!
//! - [`Tensor::div`] is true division: integer and bool results become f32.
//! - Scalar forms take an `f64`, which never promotes a float tensor (an f16
//!   tensor plus 2.0 stays f16; the scalar is converted to f16's math type
//!   f32), while integer and bool tensors become f32, as PyTorch does for a
//!   float Python scalar.
//! - Integer arithmetic wraps on overflow. On bool, `add` is logical or,
//!   `mul` logical and, `maximum`/`minimum` or/and; `sub` and `pow` reject
//!   bool.
//! - f16 and bf16 compute in f32 and round once.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use crate::backend::BinaryOp;
use crate::{DType, Result, Tensor};

impl Tensor {
    /// `self + other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Add, other)
    }

    /// `self − other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast or both operands are bool.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Sub, other)
    }

    /// `self · other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Mul, other)
    }

    /// `self / other`, true division, broadcasting: the promoted dtype when
    /// it is a float, else f32 (PyTorch's `div`). Errors when the shapes do
    /// not broadcast.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Div, other)
    }

    /// The elementwise larger value, broadcasting, in the promoted dtype; NaN
    /// if either is NaN (PyTorch's `maximum`). Errors when the shapes do not
    /// broadcast.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Maximum, other)
    }

    /// The elementwise smaller value, broadcasting, in the promoted dtype;
    /// NaN if either is NaN (PyTorch's `minimum`). Errors when the shapes do
    /// not broadcast.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Minimum, other)
    }

    /// `self` to the power `exponent` elementwise, broadcasting, in the
    /// promoted dtype. Integer powers wrap on overflow; an integer raised to
    /// a negative integer is the truncated exact value (0 unless |x| = 1).
    /// Errors when the shapes do not broadcast or both operands are bool.
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Pow, exponent)
    }

    /// `self + s` (see the module docs for the result dtype).
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("add_scalar", BinaryOp::Add, s, false)
    }

    /// `self − s`.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("sub_scalar", BinaryOp::Sub, s, false)
    }

    /// `s − self`.
    pub fn rsub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("rsub_scalar", BinaryOp::Sub, s, true)
    }

    /// `self · s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("mul_scalar", BinaryOp::Mul, s, false)
    }

    /// `self / s`.
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("div_scalar", BinaryOp::Div, s, false)
    }

    /// `s / self`.
    pub fn rdiv_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("rdiv_scalar", BinaryOp::Div, s, true)
    }

    /// `self` to the power `e`. The exponents 0.5, 1, 2, 3 and −1 take exact
    /// shortcuts (sqrt, copy, products, reciprocal), as PyTorch's do.
    pub fn pow_scalar(&self, e: f64) -> Result<Tensor> {
        self.scalar_op("pow_scalar", BinaryOp::Pow, e, false)
    }

    /// `s` to the power `self`, elementwise.
    pub fn rpow_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op("rpow_scalar", BinaryOp::Pow, s, true)
    }
}

/// `a` and `b` converted to their promoted dtype, or to `non_float` when
/// that is given and the promoted dtype is not a float (true division).
/// Errors when a conversion fails.
pub(crate) fn promoted(a: &Tensor, b: &Tensor, non_float: Option<DType>) -> Result<(Tensor, Tensor)> {
    let mut dtype = a.dtype().promote(b.dtype());
    if let Some(f) = non_float {
        if !dtype.is_float() {
            dtype = f;
        }
    }
    Ok((a.to_dtype(dtype)?, b.to_dtype(dtype)?))
}

#[cfg(test)]
pub(crate) mod tests;
