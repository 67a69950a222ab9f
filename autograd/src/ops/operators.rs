//! `std::ops` operators on `Var`s: `&a + &b`, `&a * 2.0`, `1.0 - &a`, `-&a`.
//!
//! A convenience over the `Result`-returning methods ([`Var::add`],
//! [`Var::mul_scalar`], ...), with the same broadcasting and recording; they
//! **panic** with the method's error message (naming the op and the shapes)
//! where the method would return an error, as tessera-tensor's operators do.

use std::ops::{Add, Div, Mul, Neg, Sub};

use tessera_tensor::Result;

use crate::Var;

/// The value of `r`, or a panic with the error's message.
#[track_caller]
fn expect_op(r: Result<Var>) -> Var {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// Implements `$Trait` for `Var` ∘ `Var` (owned or borrowed), `Var` ∘ f64
/// (`$scalar`) and f64 ∘ `Var` (`$rscalar`).
macro_rules! binary_operator {
    ($Trait:ident, $fn:ident, $method:ident, $scalar:ident, $rscalar:ident) => {
        impl $Trait<&Var> for &Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: &Var) -> Var {
                expect_op(Var::$method(self, rhs))
            }
        }
        impl $Trait<Var> for &Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: Var) -> Var {
                expect_op(Var::$method(self, &rhs))
            }
        }
        impl $Trait<&Var> for Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: &Var) -> Var {
                expect_op(Var::$method(&self, rhs))
            }
        }
        impl $Trait<Var> for Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: Var) -> Var {
                expect_op(Var::$method(&self, &rhs))
            }
        }
        impl $Trait<f64> for &Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: f64) -> Var {
                expect_op(Var::$scalar(self, rhs))
            }
        }
        impl $Trait<f64> for Var {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: f64) -> Var {
                expect_op(Var::$scalar(&self, rhs))
            }
        }
        impl $Trait<&Var> for f64 {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: &Var) -> Var {
                expect_op(Var::$rscalar(rhs, self))
            }
        }
        impl $Trait<Var> for f64 {
            type Output = Var;
            #[track_caller]
            fn $fn(self, rhs: Var) -> Var {
                expect_op(Var::$rscalar(&rhs, self))
            }
        }
    };
}

binary_operator!(Add, add, add, add_scalar, add_scalar);
binary_operator!(Sub, sub, sub, sub_scalar, rsub_scalar);
binary_operator!(Mul, mul, mul, mul_scalar, mul_scalar);
binary_operator!(Div, div, div, div_scalar, rdiv_scalar);

impl Neg for &Var {
    type Output = Var;
    #[track_caller]
    fn neg(self) -> Var {
        expect_op(Var::neg(self))
    }
}

impl Neg for Var {
    type Output = Var;
    #[track_caller]
    fn neg(self) -> Var {
        expect_op(Var::neg(&self))
    }
}
