//! Elementwise unary ops on [`Var`] and their gradients.
//!
//! Each backward reads only what its formula needs: the input `x` or the
//! result `y` (whichever is cheaper to use), never both unless the formula
//! does. Formulas follow PyTorch's `derivatives.yaml`.

use std::f64::consts::PI;

use tessera_tensor::{BinaryOp, DType, GeluApprox, Result, Tensor};

use super::record_op;
use super::registry::{self as reg, Op};
use crate::autocast::autocast_entry;
use crate::Var;

/// Records a one-input op whose gradient is `grad(g)`.
fn unary(
    op: Op,
    y: Tensor,
    x: &Var,
    grad: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
) -> Result<Var> {
    record_op(op, y, &[x], move |g, _| Ok(vec![Some(grad(g)?)]))
}

impl Var {
    /// −x. Errors as [`Tensor::neg`].
    pub fn neg(&self) -> Result<Var> {
        unary(reg::NEG, self.tensor().neg()?, self, |g| g.neg())
    }

    /// |x|; the gradient is sign(x)·g (0 at 0, as PyTorch). Errors as
    /// [`Tensor::abs`].
    pub fn abs(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::ABS, self.tensor().abs()?, self, move |g| {
            g.binary_op(BinaryOp::AbsBackward, &x)
        })
    }

    /// eˣ. Errors as [`Tensor::exp`].
    pub fn exp(&self) -> Result<Var> {
        autocast_entry!(reg::EXP, [self], |c| c[0].exp());
        let y = self.tensor().exp()?;
        let saved = y.clone();
        unary(reg::EXP, y, self, move |g| g.mul(&saved))
    }

    /// ln x. Errors as [`Tensor::log`].
    pub fn log(&self) -> Result<Var> {
        autocast_entry!(reg::LOG, [self], |c| c[0].log());
        let x = self.tensor().clone();
        unary(reg::LOG, self.tensor().log()?, self, move |g| g.div(&x))
    }

    /// ln(1 + x). Errors as [`Tensor::log1p`].
    pub fn log1p(&self) -> Result<Var> {
        autocast_entry!(reg::LOG1P, [self], |c| c[0].log1p());
        let x = self.tensor().clone();
        unary(reg::LOG1P, self.tensor().log1p()?, self, move |g| {
            g.div(&x.add_scalar(1.0)?)
        })
    }

    /// eˣ − 1. Errors as [`Tensor::expm1`].
    pub fn expm1(&self) -> Result<Var> {
        autocast_entry!(reg::EXPM1, [self], |c| c[0].expm1());
        let y = self.tensor().expm1()?;
        let saved = y.clone();
        unary(reg::EXPM1, y, self, move |g| g.mul(&saved.add_scalar(1.0)?))
    }

    /// √x; the gradient is g/(2√x). Errors as [`Tensor::sqrt`].
    pub fn sqrt(&self) -> Result<Var> {
        let y = self.tensor().sqrt()?;
        let saved = y.clone();
        unary(reg::SQRT, y, self, move |g| g.div(&saved.add(&saved)?))
    }

    /// 1/√x; the gradient is −g·y³/2. Errors as [`Tensor::rsqrt`].
    pub fn rsqrt(&self) -> Result<Var> {
        autocast_entry!(reg::RSQRT, [self], |c| c[0].rsqrt());
        let y = self.tensor().rsqrt()?;
        let saved = y.clone();
        unary(reg::RSQRT, y, self, move |g| {
            g.mul_scalar(-0.5)?.mul(&saved)?.mul(&saved)?.mul(&saved)
        })
    }

    /// 1/x; the gradient is −g·y². Errors as [`Tensor::recip`].
    pub fn recip(&self) -> Result<Var> {
        autocast_entry!(reg::RECIP, [self], |c| c[0].recip());
        let y = self.tensor().recip()?;
        let saved = y.clone();
        unary(reg::RECIP, y, self, move |g| g.neg()?.mul(&saved)?.mul(&saved))
    }

    /// x². Errors as [`Tensor::square`].
    pub fn square(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::SQUARE, self.tensor().square()?, self, move |g| {
            g.mul(&x.add(&x)?)
        })
    }

    /// xᵉ for a scalar exponent; the gradient is e·xᵉ⁻¹·g (0 for e = 0).
    /// Errors as [`Tensor::pow_scalar`].
    pub fn pow_scalar(&self, e: f64) -> Result<Var> {
        autocast_entry!(reg::POW_SCALAR, [self], |c| c[0].pow_scalar(e));
        let x = self.tensor().clone();
        unary(reg::POW_SCALAR, self.tensor().pow_scalar(e)?, self, move |g| {
            if e == 0.0 {
                return g.zeros_like(None);
            }
            g.mul_scalar(e)?.mul(&x.pow_scalar(e - 1.0)?)
        })
    }

    /// sˣ for a scalar base; the gradient is ln(s)·sˣ·g (0 for s = 0, as
    /// PyTorch for x ≥ 0). Errors as [`Tensor::rpow_scalar`].
    pub fn rpow_scalar(&self, s: f64) -> Result<Var> {
        autocast_entry!(reg::RPOW_SCALAR, [self], |c| c[0].rpow_scalar(s));
        let y = self.tensor().rpow_scalar(s)?;
        let saved = y.clone();
        unary(reg::RPOW_SCALAR, y, self, move |g| {
            if s == 0.0 {
                return g.zeros_like(None);
            }
            g.mul(&saved)?.mul_scalar(s.ln())
        })
    }

    /// sin x. Errors as [`Tensor::sin`].
    pub fn sin(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::SIN, self.tensor().sin()?, self, move |g| g.mul(&x.cos()?))
    }

    /// cos x. Errors as [`Tensor::cos`].
    pub fn cos(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::COS, self.tensor().cos()?, self, move |g| {
            g.neg()?.mul(&x.sin()?)
        })
    }

    /// tanh x; the gradient is g·(1 − y²). Errors as [`Tensor::tanh`].
    pub fn tanh(&self) -> Result<Var> {
        let y = self.tensor().tanh()?;
        let saved = y.clone();
        unary(reg::TANH, y, self, move |g| {
            g.binary_op(BinaryOp::TanhBackward, &saved)
        })
    }

    /// The logistic function; the gradient is g·y·(1 − y). Errors as
    /// [`Tensor::sigmoid`].
    pub fn sigmoid(&self) -> Result<Var> {
        let y = self.tensor().sigmoid()?;
        let saved = y.clone();
        unary(reg::SIGMOID, y, self, move |g| {
            g.binary_op(BinaryOp::SigmoidBackward, &saved)
        })
    }

    /// max(x, 0); the gradient passes where the result is positive (0 at
    /// x = 0, as PyTorch). Errors as [`Tensor::relu`].
    pub fn relu(&self) -> Result<Var> {
        let y = self.tensor().relu()?;
        let saved = y.clone();
        unary(reg::RELU, y, self, move |g| {
            g.binary_op(BinaryOp::ReluBackward, &saved)
        })
    }

    /// GELU, exact (erf) or tanh-approximated, with the matching exact
    /// derivative of the chosen form. Errors as [`Tensor::gelu`].
    pub fn gelu(&self, approx: GeluApprox) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::GELU, self.tensor().gelu(approx)?, self, move |g| {
            let op = match approx {
                GeluApprox::None => BinaryOp::GeluErfBackward,
                GeluApprox::Tanh => BinaryOp::GeluTanhBackward,
            };
            g.binary_op(op, &x)
        })
    }

    /// SiLU x·σ(x); the gradient is g·σ(x)·(1 + x·(1 − σ(x))). Errors as
    /// [`Tensor::silu`].
    pub fn silu(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::SILU, self.tensor().silu()?, self, move |g| {
            g.binary_op(BinaryOp::SiluBackward, &x)
        })
    }

    /// The Gauss error function; the gradient is g·2/√π·e^(−x²). Errors as
    /// [`Tensor::erf`].
    pub fn erf(&self) -> Result<Var> {
        let x = self.tensor().clone();
        unary(reg::ERF, self.tensor().erf()?, self, move |g| {
            g.mul_scalar(2.0 / PI.sqrt())?.mul(&x.square()?.neg()?.exp()?)
        })
    }

    /// x clamped to `[min, max]` (either may be absent); the gradient passes
    /// where min ≤ x ≤ max, bounds included, as PyTorch's. Errors as
    /// [`Tensor::clamp`].
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Var> {
        let x = self.tensor().clone();
        let (lo, hi) = (min.unwrap_or(f64::NEG_INFINITY), max.unwrap_or(f64::INFINITY));
        unary(reg::CLAMP, self.tensor().clamp(min, max)?, self, move |g| {
            // Bounds included, NaN excluded (a NaN x compares false).
            let inside = x.ge_scalar(lo)?.logical_and(&x.le_scalar(hi)?)?;
            Tensor::where_(&inside, g, &g.zeros_like(None)?)
        })
    }

    /// The value converted to `dtype`; the gradient is cast back to the
    /// input's dtype. Converting to the same dtype returns `self` unrecorded
    /// (as PyTorch's `to`). Errors when the value requires a gradient and
    /// `dtype` is not floating point.
    pub fn to_dtype(&self, dtype: DType) -> Result<Var> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let from = self.dtype();
        let y = self.tensor().to_dtype(dtype)?;
        if self.requires_grad() && !dtype.is_float() {
            return Err(tessera_tensor::Error::dtype(
                reg::TO_DTYPE.name(),
                format!(
                    "cannot convert a value that requires grad (shape {:?}, {from}) to {dtype}; detach it first",
                    self.shape()
                ),
            ));
        }
        unary(reg::TO_DTYPE, y, self, move |g| g.to_dtype(from))
    }
}
