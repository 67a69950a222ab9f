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
mod cuda;

use crate::simd::kernels::UnaryOp;
use crate::{DType, Error, FloatMath, Result, Tensor};
use cpu::{float_unary, keep_dtype_unary};

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
        on_cuda!(self.is_cuda() => cuda::unary(self, "neg", cuda::UnaryOp::Neg));
        keep_dtype_unary!(self, "neg", float |x: M| -x, int |x| x.wrapping_neg(), bool None)
    }

    /// |x|, in the input dtype (i64::MIN stays i64::MIN). Errors for bool.
    pub fn abs(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "abs", cuda::UnaryOp::Abs));
        keep_dtype_unary!(self, "abs", float |x: M| x.abs(), int |x| x.abs_int(), bool None)
    }

    /// −1, 0 or 1 by the sign of x, in the input dtype (0 for NaN and ±0,
    /// like PyTorch; bool is returned as it is).
    pub fn sign(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "sign"));
        keep_dtype_unary!(self, "sign", float |x: M| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }, int |x| x.sign_int(), bool Some(|b| b))
    }

    /// x², in the input dtype (integers wrap); bool becomes i64 like
    /// PyTorch's `square`.
    pub fn square(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "square", cuda::UnaryOp::Square));
        if self.dtype() == DType::Bool {
            return self.to_dtype(DType::I64)?.square();
        }
        keep_dtype_unary!(self, "square", float |x: M| x * x, int |x| x.wrapping_mul(x), bool None)
    }

    /// max(x, 0) in the input dtype; NaN stays NaN. Errors for bool.
    pub fn relu(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "relu", cuda::UnaryOp::Relu));
        if let Some(t) = simd_f32("relu", self, UnaryOp::Relu) {
            return t;
        }
        keep_dtype_unary!(self, "relu", float |x: M| if x < 0.0 { 0.0 } else { x }, int |x| x.relu_int(), bool None)
    }

    /// The largest integer ≤ x; integer and bool tensors are returned as they are.
    pub fn floor(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "floor"));
        keep_dtype_unary!(self, "floor", float |x: M| x.floor(), int |x| x, bool Some(|b| b))
    }

    /// The smallest integer ≥ x; integer and bool tensors are returned as they are.
    pub fn ceil(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "ceil"));
        keep_dtype_unary!(self, "ceil", float |x: M| x.ceil(), int |x| x, bool Some(|b| b))
    }

    /// x rounded to the nearest integer, halves to even (PyTorch's `round`);
    /// integer and bool tensors are returned as they are.
    pub fn round(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "round"));
        keep_dtype_unary!(self, "round", float |x: M| FloatMath::round_even(x), int |x| x, bool Some(|b| b))
    }

    /// x clamped to `[min, max]` (either bound may be absent), in the input
    /// dtype: NaN stays NaN, and `min > max` gives `max` everywhere, like
    /// PyTorch. Integer tensors use the integers inside the bounds (min
    /// rounded up, max rounded down, saturating). Errors when both bounds are
    /// absent, a bound is NaN, or the tensor is bool.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "clamp"));
        if min.is_none() && max.is_none() {
            return Err(Error::arg("clamp", "at least one of min and max must be given"));
        }
        if min.is_some_and(f64::is_nan) || max.is_some_and(f64::is_nan) {
            return Err(Error::arg(
                "clamp",
                format!("bounds must not be NaN, got min {min:?}, max {max:?}"),
            ));
        }
        let lo = min.unwrap_or(f64::NEG_INFINITY);
        let hi = max.unwrap_or(f64::INFINITY);
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
        on_cuda!(self.is_cuda() => cuda::unary(self, "exp", cuda::UnaryOp::Exp));
        if let Some(t) = simd_f32("exp", self, UnaryOp::Exp) {
            return t;
        }
        float_unary!(self, |x: M| x.exp())
    }

    /// ln x (NaN below 0, −inf at 0; float result).
    pub fn log(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "log", cuda::UnaryOp::Log));
        float_unary!(self, |x: M| x.ln())
    }

    /// ln(1 + x), accurate near 0 (float result).
    pub fn log1p(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "log1p"));
        float_unary!(self, |x: M| x.ln_1p())
    }

    /// e^x − 1, accurate near 0 (float result).
    pub fn expm1(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "expm1"));
        float_unary!(self, |x: M| x.exp_m1())
    }

    /// √x (NaN below 0; float result).
    pub fn sqrt(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "sqrt", cuda::UnaryOp::Sqrt));
        float_unary!(self, |x: M| x.sqrt())
    }

    /// 1/√x (float result).
    pub fn rsqrt(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "rsqrt", cuda::UnaryOp::Rsqrt));
        float_unary!(self, |x: M| 1.0 / x.sqrt())
    }

    /// 1/x (float result; PyTorch's `reciprocal`).
    pub fn recip(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "recip", cuda::UnaryOp::Recip));
        float_unary!(self, |x: M| 1.0 / x)
    }

    /// sin x (float result).
    pub fn sin(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "sin", cuda::UnaryOp::Sin));
        float_unary!(self, |x: M| x.sin())
    }

    /// cos x (float result).
    pub fn cos(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "cos", cuda::UnaryOp::Cos));
        float_unary!(self, |x: M| x.cos())
    }

    /// tanh x (float result).
    pub fn tanh(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "tanh", cuda::UnaryOp::Tanh));
        if let Some(t) = simd_f32("tanh", self, UnaryOp::Tanh) {
            return t;
        }
        float_unary!(self, |x: M| x.tanh())
    }

    /// The logistic function 1/(1 + e^−x), computed without overflow for
    /// any x (float result).
    pub fn sigmoid(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "sigmoid", cuda::UnaryOp::Sigmoid));
        if let Some(t) = simd_f32("sigmoid", self, UnaryOp::Sigmoid) {
            return t;
        }
        float_unary!(self, |x: M| cpu::sigmoid(x))
    }

    /// GELU in the exact (erf) or tanh-approximated form (float result).
    pub fn gelu(&self, approx: GeluApprox) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "gelu", match approx { GeluApprox::None => cuda::UnaryOp::GeluErf, GeluApprox::Tanh => cuda::UnaryOp::GeluTanh }));
        let op = match approx {
            GeluApprox::None => UnaryOp::GeluErf,
            GeluApprox::Tanh => UnaryOp::GeluTanh,
        };
        if let Some(t) = simd_f32("gelu", self, op) {
            return t;
        }
        match approx {
            GeluApprox::None => float_unary!(self, |x: M| cpu::gelu_erf(x)),
            GeluApprox::Tanh => float_unary!(self, |x: M| cpu::gelu_tanh(x)),
        }
    }

    /// SiLU (swish): x · sigmoid(x) (float result).
    pub fn silu(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unary(self, "silu", cuda::UnaryOp::Silu));
        if let Some(t) = simd_f32("silu", self, UnaryOp::Silu) {
            return t;
        }
        float_unary!(self, |x: M| x * cpu::sigmoid(x))
    }

    /// The Gauss error function (float result).
    pub fn erf(&self) -> Result<Tensor> {
        on_cuda!(self.is_cuda() => cuda::unsupported(self, "erf"));
        float_unary!(self, |x: M| FloatMath::erf(x))
    }
}

/// `op` through the SIMD engine when `t` is f32 (None otherwise).
fn simd_f32(name: &'static str, t: &Tensor, op: UnaryOp) -> Option<Result<Tensor>> {
    (t.dtype() == DType::F32).then(|| crate::map_simd::unary_f32(name, t, op))
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

/// Integer helpers written once for i64, u32 and u8 (unsigned types have
/// no negative values, so abs/relu are the identity and sign is 0 or 1).
trait IntUnary: Copy {
    fn abs_int(self) -> Self;
    fn sign_int(self) -> Self;
    fn relu_int(self) -> Self;
}

impl IntUnary for i64 {
    #[inline(always)]
    fn abs_int(self) -> Self {
        self.wrapping_abs()
    }
    #[inline(always)]
    fn sign_int(self) -> Self {
        self.signum()
    }
    #[inline(always)]
    fn relu_int(self) -> Self {
        self.max(0)
    }
}

macro_rules! unsigned_unary {
    ($t:ty) => {
        impl IntUnary for $t {
            #[inline(always)]
            fn abs_int(self) -> Self {
                self
            }
            #[inline(always)]
            fn sign_int(self) -> Self {
                self.min(1)
            }
            #[inline(always)]
            fn relu_int(self) -> Self {
                self
            }
        }
    };
}
unsigned_unary!(u32);
unsigned_unary!(u8);

#[cfg(test)]
pub(crate) mod tests;
