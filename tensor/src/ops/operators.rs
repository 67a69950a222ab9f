//! `std::ops` operators on tensors: `&a + &b`, `a * 2.0`, `1.0 - &a`, `-&a`.
//!
//! They are a convenience over the `Result`-returning methods
//! ([`Tensor::add`], [`Tensor::mul_scalar`], ...) with the same broadcasting
//! and dtype rules, and they **panic** when the method would return an error,
//! with that error's message (which names the op and the shapes), as Rust's
//! own indexing panics. Call the methods to handle errors instead.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::{Result, Tensor};

/// The value of `r`, or a panic with the error's message.
#[track_caller]
fn expect_op(r: Result<Tensor>) -> Tensor {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// Implements `$Trait` for every owned/borrowed combination of tensors and
/// f64 scalars: `$method` for tensor ∘ tensor, `$scalar` for tensor ∘ f64 and
/// `$rscalar` for f64 ∘ tensor.
macro_rules! binary_operator {
    ($Trait:ident, $fn:ident, $method:ident, $scalar:ident, $rscalar:ident) => {
        impl $Trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: &Tensor) -> Tensor {
                expect_op(Tensor::$method(self, rhs))
            }
        }
        impl $Trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: Tensor) -> Tensor {
                expect_op(Tensor::$method(self, &rhs))
            }
        }
        impl $Trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: &Tensor) -> Tensor {
                expect_op(Tensor::$method(&self, rhs))
            }
        }
        impl $Trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: Tensor) -> Tensor {
                expect_op(Tensor::$method(&self, &rhs))
            }
        }
        impl $Trait<f64> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: f64) -> Tensor {
                expect_op(Tensor::$scalar(self, rhs))
            }
        }
        impl $Trait<f64> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: f64) -> Tensor {
                expect_op(Tensor::$scalar(&self, rhs))
            }
        }
        impl $Trait<&Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: &Tensor) -> Tensor {
                expect_op(Tensor::$rscalar(rhs, self))
            }
        }
        impl $Trait<Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $fn(self, rhs: Tensor) -> Tensor {
                expect_op(Tensor::$rscalar(&rhs, self))
            }
        }
    };
}

binary_operator!(Add, add, add, add_scalar, add_scalar);
binary_operator!(Sub, sub, sub, sub_scalar, rsub_scalar);
binary_operator!(Mul, mul, mul, mul_scalar, mul_scalar);
binary_operator!(Div, div, div, div_scalar, rdiv_scalar);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        expect_op(Tensor::neg(self))
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        expect_op(Tensor::neg(&self))
    }
}

#[cfg(test)]
#[path = "operators_tests.rs"]
mod tests;
