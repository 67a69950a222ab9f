//! CPU kernels of the unary ops: one generic loop per element kind, the
//! element function inlined into it, so the f32/f64 loops carry no dtype
//! dispatch and auto-vectorise where the function allows.

use crate::backend::UnaryOp;
use crate::{DType, Error, FloatElement, FloatMath, Result, Tensor};

/// `f` applied to every element of the float tensor `t` (dtype `T`), computed
/// in `T::Math` and rounded once back to `T`.
#[inline]
pub(crate) fn float_map<T: FloatElement>(
    t: &Tensor,
    f: impl Fn(T::Math) -> T::Math + Sync,
) -> Result<Tensor> {
    t.try_map::<T, T>("elementwise", |x| T::from_math(f(x.to_math())))
}

/// `t` itself when it has a float dtype, else `t` cast to f32: PyTorch gives
/// float-valued functions of integer and bool tensors the default float dtype.
/// Errors when the conversion fails.
pub(crate) fn float_input(t: &Tensor) -> Result<Tensor> {
    if t.dtype().is_float() {
        Ok(t.clone())
    } else {
        t.to_dtype(DType::F32)
    }
}

/// The error for an op that does not accept `dtype`.
pub(crate) fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::dtype(op, format!("not supported for {dtype} tensors"))
}

/// Applies a float-valued function: float tensors keep their dtype, integer
/// and bool tensors are computed in f32. `$x` is bound to the element in the
/// math type (f32, or f64 for f64 tensors), which `$M` names.
macro_rules! float_unary {
    ($t:expr, |$x:ident: $M:ident| $body:expr) => {{
        let t = $crate::ops::unary::cpu::float_input($t)?;
        $crate::with_float_dtype!(t.dtype(), T => {
            type $M = <T as $crate::FloatElement>::Math;
            $crate::ops::unary::cpu::float_map::<T>(&t, |$x: $M| $body)
        }, else Err($crate::ops::unary::cpu::unsupported("float_unary", t.dtype())))
    }};
}

/// Applies an op that keeps integer dtypes: `$f` on floats (in the math type
/// `$M`), `$i` on i64/u32/u8, and `$b` on bool (`None` rejects bool).
macro_rules! keep_dtype_unary {
    ($t:expr, $op:expr, float |$x:ident: $M:ident| $f:expr, int |$y:ident| $i:expr, bool $b:expr) => {{
        let t: &$crate::Tensor = $t;
        $crate::with_float_dtype!(t.dtype(), T => {
            type $M = <T as $crate::FloatElement>::Math;
            $crate::ops::unary::cpu::float_map::<T>(t, |$x: $M| $f)
        }, else $crate::dtype::with_int_dtype!(t.dtype(), T => {
            t.try_map::<T, T>($op, |$y: T| $i)
        }, else {
            let b: Option<fn(bool) -> bool> = $b;
            match b {
                Some(g) => t.try_map::<bool, bool>($op, g),
                None => Err($crate::ops::unary::cpu::unsupported($op, t.dtype())),
            }
        }))
    }};
}
pub(crate) use keep_dtype_unary;

/// `op` of every element of `t` on the CPU: the SIMD engine for f32 where
/// the op has a vector kernel, else one monomorphised loop per op and
/// dtype (the match runs once per call). Dtype rules in the module docs of
/// `ops/unary`.
pub(crate) fn unary(op: UnaryOp, t: &Tensor) -> Result<Tensor> {
    let name = op.name();
    if t.dtype() == DType::F32 && crate::simd::kernels::has_unary(op) {
        return crate::map_simd::unary_f32(name, t, op);
    }
    match op {
        UnaryOp::Identity => keep_dtype_unary!(t, name, float |x: M| x, int |x| x, bool Some(|b| b)),
        UnaryOp::Neg => keep_dtype_unary!(t, name, float |x: M| -x, int |x| x.wrapping_neg(), bool None),
        UnaryOp::Abs => keep_dtype_unary!(t, name, float |x: M| x.abs(), int |x| x.abs_int(), bool None),
        UnaryOp::Sign => keep_dtype_unary!(t, name, float |x: M| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }, int |x| x.sign_int(), bool Some(|b| b)),
        UnaryOp::Square if t.dtype() == DType::Bool => unary(op, &t.to_dtype(DType::I64)?),
        UnaryOp::Square => {
            keep_dtype_unary!(t, name, float |x: M| x * x, int |x| x.wrapping_mul(x), bool None)
        }
        UnaryOp::Relu => {
            keep_dtype_unary!(t, name, float |x: M| if x < 0.0 { 0.0 } else { x }, int |x| x.relu_int(), bool None)
        }
        UnaryOp::Floor => keep_dtype_unary!(t, name, float |x: M| x.floor(), int |x| x, bool Some(|b| b)),
        UnaryOp::Ceil => keep_dtype_unary!(t, name, float |x: M| x.ceil(), int |x| x, bool Some(|b| b)),
        UnaryOp::Round => {
            keep_dtype_unary!(t, name, float |x: M| FloatMath::round_even(x), int |x| x, bool Some(|b| b))
        }
        UnaryOp::Exp => float_unary!(t, |x: M| x.exp()),
        UnaryOp::Log => float_unary!(t, |x: M| x.ln()),
        UnaryOp::Log1p => float_unary!(t, |x: M| x.ln_1p()),
        UnaryOp::Expm1 => float_unary!(t, |x: M| x.exp_m1()),
        UnaryOp::Sqrt => float_unary!(t, |x: M| x.sqrt()),
        UnaryOp::Rsqrt => float_unary!(t, |x: M| 1.0 / x.sqrt()),
        UnaryOp::Recip => float_unary!(t, |x: M| 1.0 / x),
        UnaryOp::Sin => float_unary!(t, |x: M| x.sin()),
        UnaryOp::Cos => float_unary!(t, |x: M| x.cos()),
        UnaryOp::Tanh => float_unary!(t, |x: M| x.tanh()),
        UnaryOp::Sigmoid => float_unary!(t, |x: M| sigmoid(x)),
        UnaryOp::GeluErf => float_unary!(t, |x: M| gelu_erf(x)),
        UnaryOp::GeluTanh => float_unary!(t, |x: M| gelu_tanh(x)),
        UnaryOp::Silu => float_unary!(t, |x: M| x * sigmoid(x)),
        UnaryOp::Erf => float_unary!(t, |x: M| FloatMath::erf(x)),
    }
}

/// The logistic function 1 / (1 + e^−x), from e = e^−|x| ≤ 1 so nothing
/// overflows: 1/(1 + e) for x ≥ 0 and e/(1 + e) for x < 0. One exp and a
/// select, no branch around the exp.
#[inline(always)]
pub(crate) fn sigmoid<M: FloatMath>(x: M) -> M {
    let e = (-x.abs()).exp();
    let r = M::ONE / (M::ONE + e);
    if x >= M::ZERO {
        r
    } else {
        e * r
    }
}

/// GELU, exact form: x/2 · (1 + erf(x/√2)).
#[inline(always)]
pub(crate) fn gelu_erf<M: FloatMath>(x: M) -> M {
    M::of(0.5) * x * (M::ONE + (x * M::of(std::f64::consts::FRAC_1_SQRT_2)).erf())
}

/// GELU, tanh approximation: x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
#[inline(always)]
pub(crate) fn gelu_tanh<M: FloatMath>(x: M) -> M {
    let k = M::of((2.0 / std::f64::consts::PI).sqrt());
    let inner = k * (x + M::of(0.044715) * x * x * x);
    M::of(0.5) * x * (M::ONE + inner.tanh())
}

/// `x` clamped to `[lo, hi]`; NaN stays NaN, and `lo > hi` gives `hi`
/// (PyTorch's `clamp`).
#[inline(always)]
pub(crate) fn clamp_to<T: PartialOrd>(x: T, lo: T, hi: T) -> T {
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
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
