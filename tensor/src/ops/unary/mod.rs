//! Elementwise unary ops.
//!
//! Dtype rules follow PyTorch:
//! - float-valued functions (exp, log, sqrt, sin, sigmoid, gelu, erf, ...)
//!   keep a float dtype and compute integer and bool inputs in f32;
//! - neg, abs, sign, square, relu, clamp, floor/ceil/round keep the input
//!   dtype (integer arithmetic wraps on overflow, as PyTorch's does);
//! - f16 and bf16 compute in f32 and round once.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use crate::backend::UnaryOp;
use crate::{Error, FloatMath, Result, Tensor};
use cpu::keep_dtype_unary;

/// Which form of GELU to compute (PyTorch's `approximate` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GeluApprox {
    /// The exact form x/2 · (1 + erf(x/√2)).
    #[default]
    None,
    /// The tanh approximation x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
    Tanh,
}

impl Tensor {
    /// −x. Integers wrap (−i64::MIN = i64::MIN; unsigned negation wraps
    /// modulo 2^bits, like PyTorch). Errors for bool tensors.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Neg)
    }

    /// |x|, in the input dtype (i64::MIN stays i64::MIN). Errors for bool.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Abs)
    }

    /// −1, 0 or 1 by the sign of x, in the input dtype (0 for NaN and ±0,
    /// like PyTorch; bool is returned as it is).
    pub fn sign(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sign)
    }

    /// x², in the input dtype (integers wrap); bool becomes i64 like
    /// PyTorch's `square`.
    pub fn square(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Square)
    }

    /// max(x, 0) in the input dtype; NaN stays NaN. Errors for bool.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Relu)
    }

    /// The largest integer ≤ x; integer and bool tensors are returned as they are.
    pub fn floor(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Floor)
    }

    /// The smallest integer ≥ x; integer and bool tensors are returned as they are.
    pub fn ceil(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Ceil)
    }

    /// x rounded to the nearest integer, halves to even (PyTorch's `round`);
    /// integer and bool tensors are returned as they are.
    pub fn round(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Round)
    }

    /// x clamped to `[min, max]` (either bound may be absent), in the input
    /// dtype: NaN stays NaN, and `min > max` gives `max` everywhere, like
    /// PyTorch. Integer tensors use the integers inside the bounds (min
    /// rounded up, max rounded down, saturating). Errors when both bounds are
    /// absent, a bound is NaN, or the tensor is bool.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let be = crate::backend::dispatch("clamp", &[self])?;
        if min.is_none() && max.is_none() {
            return Err(Error::arg("clamp", "at least one of min and max must be given"));
        }
        if min.is_some_and(f64::is_nan) || max.is_some_and(f64::is_nan) {
            return Err(Error::arg(
                "clamp",
                format!("bounds must not be NaN, got min {min:?}, max {max:?}"),
            ));
        }
        be.clamp(
            self,
            min.unwrap_or(f64::NEG_INFINITY),
            max.unwrap_or(f64::INFINITY),
        )
    }

    /// The CPU kernel of [`Tensor::clamp`] with checked bounds `lo`, `hi`.
    pub(crate) fn clamp_cpu(&self, lo: f64, hi: f64) -> Result<Tensor> {
        keep_dtype_unary!(self, "clamp",
            float |x: M| cpu::clamp_to(x, M::of(lo), M::of(hi)),
            int |x| cpu::clamp_to(x, crate::Element::from_f64(lo.ceil()), crate::Element::from_f64(hi.floor())),
            bool None)
    }

    /// x clamped elementwise to the tensors `min` and `max` (either may be
    /// absent), broadcasting all three; the result dtype is the promotion of
    /// all operands. NaN in any operand gives NaN. Errors when both bounds are
    /// absent or the shapes do not broadcast.
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        same_device!("clamp", self, min, max);
        let lower = match min {
            Some(lo) => self.maximum(lo).map_err(|e| rename(e, "clamp"))?,
            None => self.clone(),
        };
        match max {
            Some(hi) => lower.minimum(hi).map_err(|e| rename(e, "clamp")),
            None if min.is_some() => Ok(lower),
            None => Err(Error::arg("clamp", "at least one of min and max must be given")),
        }
    }

    /// e^x (float result; integers and bool compute in f32).
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Exp)
    }

    /// ln x (NaN below 0, −inf at 0; float result).
    pub fn log(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Log)
    }

    /// ln(1 + x), accurate near 0 (float result).
    pub fn log1p(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Log1p)
    }

    /// e^x − 1, accurate near 0 (float result).
    pub fn expm1(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Expm1)
    }

    /// √x (NaN below 0; float result).
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sqrt)
    }

    /// 1/√x (float result).
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Rsqrt)
    }

    /// 1/x (float result; PyTorch's `reciprocal`).
    pub fn recip(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Recip)
    }

    /// sin x (float result).
    pub fn sin(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sin)
    }

    /// cos x (float result).
    pub fn cos(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Cos)
    }

    /// tanh x (float result).
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Tanh)
    }

    /// The logistic function 1/(1 + e^−x), computed without overflow for
    /// any x (float result).
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sigmoid)
    }

    /// GELU in the exact (erf) or tanh-approximated form (float result).
    pub fn gelu(&self, approx: GeluApprox) -> Result<Tensor> {
        self.unary_op(match approx {
            GeluApprox::None => UnaryOp::GeluErf,
            GeluApprox::Tanh => UnaryOp::GeluTanh,
        })
    }

    /// SiLU (swish): x · sigmoid(x) (float result).
    pub fn silu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Silu)
    }

    /// The Gauss error function (float result).
    pub fn erf(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Erf)
    }
}

/// The same error reported under `op` (for ops built from other ops).
fn rename(e: Error, op: &'static str) -> Error {
    match e {
        Error::Shape { msg, .. } => Error::shape(op, msg),
        Error::DType { msg, .. } => Error::dtype(op, msg),
        Error::Device { msg, .. } => Error::device(op, msg),
        Error::Index { msg, .. } => Error::index(op, msg),
        Error::Arg { msg, .. } => Error::arg(op, msg),
        Error::OutOfMemory { msg, .. } => Error::out_of_memory(op, msg),
        Error::Io { msg, .. } => Error::io(op, msg),
    }
}

#[cfg(test)]
pub(crate) mod tests;
