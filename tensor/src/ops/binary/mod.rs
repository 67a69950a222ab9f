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
mod cuda;

use crate::ops::unary::cpu::unsupported;
use crate::simd::kernels::BinaryOp;
use crate::{DType, Result, Tensor};
use cpu::{scalar_op, zip_same, IntPow};

impl Tensor {
    /// `self + other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "add", cuda::BinaryOp::Add));
        let (a, b) = promoted(self, other, None)?;
        if a.dtype() == DType::F32 {
            return crate::map_simd::binary_f32(&a, &b, "add", BinaryOp::Add);
        }
        zip_same!(&a, &b, "add", float |x, y: M| x + y, int |x, y| x.wrapping_add(y), bool Some(|x, y| x | y))
    }

    /// `self − other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast or both operands are bool.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "sub", cuda::BinaryOp::Sub));
        let (a, b) = promoted(self, other, None)?;
        if a.dtype() == DType::F32 {
            return crate::map_simd::binary_f32(&a, &b, "sub", BinaryOp::Sub);
        }
        zip_same!(&a, &b, "sub", float |x, y: M| x - y, int |x, y| x.wrapping_sub(y), bool None)
    }

    /// `self · other`, broadcasting, in the promoted dtype. Errors when the
    /// shapes do not broadcast.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "mul", cuda::BinaryOp::Mul));
        let (a, b) = promoted(self, other, None)?;
        if a.dtype() == DType::F32 {
            return crate::map_simd::binary_f32(&a, &b, "mul", BinaryOp::Mul);
        }
        zip_same!(&a, &b, "mul", float |x, y: M| x * y, int |x, y| x.wrapping_mul(y), bool Some(|x, y| x & y))
    }

    /// `self / other`, true division, broadcasting: the promoted dtype when
    /// it is a float, else f32 (PyTorch's `div`). Errors when the shapes do
    /// not broadcast.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "div", cuda::BinaryOp::Div));
        let (a, b) = promoted(self, other, Some(DType::F32))?;
        if a.dtype() == DType::F32 {
            return crate::map_simd::binary_f32(&a, &b, "div", BinaryOp::Div);
        }
        crate::with_float_dtype!(a.dtype(), T => cpu::float_zip::<T>(&a, &b, "div", |x, y| x / y),
            else Err(unsupported("div", a.dtype())))
    }

    /// The elementwise larger value, broadcasting, in the promoted dtype; NaN
    /// if either is NaN (PyTorch's `maximum`). Errors when the shapes do not
    /// broadcast.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "maximum", cuda::BinaryOp::Maximum));
        let (a, b) = promoted(self, other, None)?;
        zip_same!(&a, &b, "maximum", float |x, y: M| crate::FloatMath::max_nan(x, y), int |x, y| x.max(y), bool Some(|x, y| x | y))
    }

    /// The elementwise smaller value, broadcasting, in the promoted dtype;
    /// NaN if either is NaN (PyTorch's `minimum`). Errors when the shapes do
    /// not broadcast.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || other.is_cuda() => cuda::binary(self, other, "minimum", cuda::BinaryOp::Minimum));
        let (a, b) = promoted(self, other, None)?;
        zip_same!(&a, &b, "minimum", float |x, y: M| crate::FloatMath::min_nan(x, y), int |x, y| x.min(y), bool Some(|x, y| x & y))
    }

    /// `self` to the power `exponent` elementwise, broadcasting, in the
    /// promoted dtype. Integer powers wrap on overflow; an integer raised to
    /// a negative integer is the truncated exact value (0 unless |x| = 1).
    /// Errors when the shapes do not broadcast or both operands are bool.
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        on_cuda!(self.is_cuda() || exponent.is_cuda() => cuda::binary(self, exponent, "pow", cuda::BinaryOp::Pow));
        let (a, b) = promoted(self, exponent, None)?;
        zip_same!(&a, &b, "pow", float |x, y: M| x.powf(y), int |x, y| x.ipow(y), bool None)
    }

    /// `self + s` (see the module docs for the result dtype).
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "add_scalar", cuda::BinaryOp::Add, false));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("add_scalar", self, s as f32, BinaryOp::Add, false);
        }
        scalar_op!(self, s, |x, s: M| x + s)
    }

    /// `self − s`.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "sub_scalar", cuda::BinaryOp::Sub, false));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("sub_scalar", self, s as f32, BinaryOp::Sub, false);
        }
        scalar_op!(self, s, |x, s: M| x - s)
    }

    /// `s − self`.
    pub fn rsub_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "rsub_scalar", cuda::BinaryOp::Sub, true));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("rsub_scalar", self, s as f32, BinaryOp::Sub, true);
        }
        scalar_op!(self, s, |x, s: M| s - x)
    }

    /// `self · s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "mul_scalar", cuda::BinaryOp::Mul, false));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("mul_scalar", self, s as f32, BinaryOp::Mul, false);
        }
        scalar_op!(self, s, |x, s: M| x * s)
    }

    /// `self / s`.
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "div_scalar", cuda::BinaryOp::Div, false));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("div_scalar", self, s as f32, BinaryOp::Div, false);
        }
        scalar_op!(self, s, |x, s: M| x / s)
    }

    /// `s / self`.
    pub fn rdiv_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "rdiv_scalar", cuda::BinaryOp::Div, true));
        if self.dtype() == DType::F32 {
            return crate::map_simd::scalar_f32("rdiv_scalar", self, s as f32, BinaryOp::Div, true);
        }
        scalar_op!(self, s, |x, s: M| s / x)
    }

    /// `self` to the power `e`. The exponents 0.5, 1, 2, 3 and −1 take exact
    /// shortcuts (sqrt, copy, products, reciprocal), as PyTorch's do.
    pub fn pow_scalar(&self, e: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, e, "pow_scalar", cuda::BinaryOp::Pow, false));
        if e == 0.5 {
            self.sqrt()
        } else if e == 1.0 {
            scalar_op!(self, e, |x, _e: M| x)
        } else if e == 2.0 {
            scalar_op!(self, e, |x, _e: M| x * x)
        } else if e == 3.0 {
            scalar_op!(self, e, |x, _e: M| x * x * x)
        } else if e == -1.0 {
            self.recip()
        } else {
            scalar_op!(self, e, |x, e: M| x.powf(e))
        }
    }

    /// `s` to the power `self`, elementwise.
    pub fn rpow_scalar(&self, s: f64) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::scalar(self, s, "rpow_scalar", cuda::BinaryOp::Pow, true));
        scalar_op!(self, s, |x, s: M| s.powf(x))
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
