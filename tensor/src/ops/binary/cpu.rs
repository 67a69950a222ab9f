//! CPU kernels of the binary ops. Each op is one generic loop over
//! [`Tensor::zip_map`] (or [`Tensor::map`] for a scalar operand) with the
//! element function inlined, so the f32/f64 loops carry no dtype dispatch and
//! auto-vectorise; f16/bf16 widen to f32 per element and round once.

use super::promoted;
use crate::backend::BinaryOp;
use crate::{DType, FloatElement, FloatMath, Result, Tensor};

/// `f(a, b)` over the broadcast shape of two float tensors of dtype `T`,
/// computed in `T::Math`.
#[inline]
pub(crate) fn float_zip<T: FloatElement>(
    a: &Tensor,
    b: &Tensor,
    op: &'static str,
    f: impl Fn(T::Math, T::Math) -> T::Math + Sync,
) -> Result<Tensor> {
    a.zip_map::<T, T, T>(b, op, |x, y| T::from_math(f(x.to_math(), y.to_math())))
}

/// `f(x, s)` for every element `x` of the float tensor `a` (dtype `T`).
#[inline]
pub(crate) fn float_scalar<T: FloatElement>(
    a: &Tensor,
    s: T::Math,
    f: impl Fn(T::Math, T::Math) -> T::Math + Sync,
) -> Result<Tensor> {
    a.try_map::<T, T>("elementwise", |x| T::from_math(f(x.to_math(), s)))
}

/// Evaluates a binary op on two tensors of the same dtype: `$f` on floats
/// (in the math type `$M`), `$g` on i64/u32/u8 and `$h` on bool (`None`
/// rejects bool).
macro_rules! zip_same {
    ($a:expr, $b:expr, $op:expr,
     float |$x:ident, $y:ident: $M:ident| $f:expr,
     int |$i:ident, $j:ident| $g:expr,
     bool $h:expr) => {{
        let (a, b): (&$crate::Tensor, &$crate::Tensor) = ($a, $b);
        $crate::with_float_dtype!(a.dtype(), T => {
            type $M = <T as $crate::FloatElement>::Math;
            $crate::ops::binary::cpu::float_zip::<T>(a, b, $op, |$x: $M, $y: $M| $f)
        }, else $crate::dtype::with_int_dtype!(a.dtype(), T => {
            a.zip_map::<T, T, T>(b, $op, |$i: T, $j: T| $g)
        }, else {
            let h: Option<fn(bool, bool) -> bool> = $h;
            match h {
                Some(h) => a.zip_map::<bool, bool, bool>(b, $op, h),
                None => Err($crate::ops::unary::cpu::unsupported($op, a.dtype())),
            }
        }))
    }};
}

/// Evaluates a binary op defined on floats only: `$f` over two tensors of
/// the same float dtype in its math type `$M`; an error naming `$op` for
/// other dtypes.
macro_rules! float_only {
    ($a:expr, $b:expr, $op:expr, |$x:ident, $y:ident: $M:ident| $f:expr) => {{
        let (a, b): (&$crate::Tensor, &$crate::Tensor) = ($a, $b);
        $crate::with_float_dtype!(a.dtype(), T => {
            type $M = <T as $crate::FloatElement>::Math;
            $crate::ops::binary::cpu::float_zip::<T>(a, b, $op, |$x: $M, $y: $M| $f)
        }, else Err($crate::ops::unary::cpu::unsupported($op, a.dtype())))
    }};
}

/// Applies `x ∘ s` for an f64 scalar `s`: float tensors keep their dtype
/// (the scalar is converted to the math type, as PyTorch's does not promote
/// a float tensor), integer and bool tensors compute in f32.
macro_rules! scalar_op {
    ($t:expr, $s:expr, |$x:ident, $y:ident: $M:ident| $f:expr) => {{
        let t = $crate::ops::unary::cpu::float_input($t)?;
        let s: f64 = $s;
        $crate::with_float_dtype!(t.dtype(), T => {
            type $M = <T as $crate::FloatElement>::Math;
            $crate::ops::binary::cpu::float_scalar::<T>(&t, <$M as $crate::FloatMath>::of(s), |$x: $M, $y: $M| $f)
        }, else Err($crate::ops::unary::cpu::unsupported("scalar_op", t.dtype())))
    }};
}

/// Integer power with wrapping overflow, like PyTorch's integer `pow`. A
/// negative exponent gives the truncated exact value: 0 unless |x| = 1.
pub(crate) trait IntPow: Copy {
    /// `self` to the power `e`.
    fn ipow(self, e: Self) -> Self;
}

/// `base^e` by repeated squaring, wrapping (`mul` is a wrapping multiply).
#[inline(always)]
fn pow_by_squaring<T: Copy>(mut base: T, mut e: u64, one: T, mul: impl Fn(T, T) -> T) -> T {
    let mut acc = one;
    while e > 0 {
        if e & 1 == 1 {
            acc = mul(acc, base);
        }
        base = mul(base, base);
        e >>= 1;
    }
    acc
}

impl IntPow for i64 {
    #[inline(always)]
    fn ipow(self, e: i64) -> i64 {
        if e >= 0 {
            return pow_by_squaring(self, e as u64, 1, i64::wrapping_mul);
        }
        match self {
            1 => 1,
            -1 if e % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        }
    }
}

macro_rules! unsigned_pow {
    ($t:ty) => {
        impl IntPow for $t {
            #[inline(always)]
            fn ipow(self, e: $t) -> $t {
                pow_by_squaring(self, e as u64, 1, <$t>::wrapping_mul)
            }
        }
    };
}
unsigned_pow!(u32);
unsigned_pow!(u8);

/// `op` of `a` and `b` with broadcasting on the CPU, in the promoted dtype:
/// the SIMD engine for f32 arithmetic, else one monomorphised loop per op
/// and dtype (the match runs once per call). The fused derivative rules
/// take float operands only.
pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let non_float = (op == BinaryOp::Div || op.is_backward()).then_some(DType::F32);
    let (a, b) = promoted(a, b, non_float)?;
    let (a, b) = (&a, &b);
    if a.dtype() == DType::F32 && crate::simd::kernels::has_binary(op) {
        return crate::map_simd::binary_f32(a, b, name, op);
    }
    match op {
        BinaryOp::Add => {
            zip_same!(a, b, name, float |x, y: M| x + y, int |x, y| x.wrapping_add(y), bool Some(|x, y| x | y))
        }
        BinaryOp::Sub => {
            zip_same!(a, b, name, float |x, y: M| x - y, int |x, y| x.wrapping_sub(y), bool None)
        }
        BinaryOp::Mul => {
            zip_same!(a, b, name, float |x, y: M| x * y, int |x, y| x.wrapping_mul(y), bool Some(|x, y| x & y))
        }
        BinaryOp::Div => float_only!(a, b, name, |x, y: M| x / y),
        BinaryOp::Maximum => {
            zip_same!(a, b, name, float |x, y: M| FloatMath::max_nan(x, y), int |x, y| x.max(y), bool Some(|x, y| x | y))
        }
        BinaryOp::Minimum => {
            zip_same!(a, b, name, float |x, y: M| FloatMath::min_nan(x, y), int |x, y| x.min(y), bool Some(|x, y| x & y))
        }
        BinaryOp::Pow => zip_same!(a, b, name, float |x, y: M| x.powf(y), int |x, y| x.ipow(y), bool None),
        BinaryOp::GeluErfBackward => float_only!(a, b, name, |g, x: M| {
            // Φ(x) + x·φ(x).
            let cdf = M::of(0.5) * (M::ONE + FloatMath::erf(x * M::of(std::f64::consts::FRAC_1_SQRT_2)));
            let pdf = (M::of(-0.5) * x * x).exp() * M::of(1.0 / (2.0 * std::f64::consts::PI).sqrt());
            g * (cdf + x * pdf)
        }),
        BinaryOp::GeluTanhBackward => float_only!(a, b, name, |g, x: M| {
            let k = M::of((2.0 / std::f64::consts::PI).sqrt());
            let c = M::of(0.044715);
            let t = (k * (x + c * x * x * x)).tanh();
            let dinner = k * (M::ONE + M::of(3.0) * c * x * x);
            g * (M::of(0.5) * (M::ONE + t) + M::of(0.5) * x * (M::ONE - t * t) * dinner)
        }),
        BinaryOp::SiluBackward => float_only!(a, b, name, |g, x: M| {
            // σ(x) directly: e^(−x) overflowing to ∞ gives σ = 0, and x·0
            // stays finite.
            let s = M::ONE / (M::ONE + (-x).exp());
            g * (s * (M::ONE + x * (M::ONE - s)))
        }),
        BinaryOp::SigmoidBackward => float_only!(a, b, name, |g, y: M| g * (y * (M::ONE - y))),
        BinaryOp::TanhBackward => float_only!(a, b, name, |g, y: M| g * (M::ONE - y * y)),
        BinaryOp::ReluBackward => float_only!(a, b, name, |g, y: M| if y > M::ZERO { g } else { M::ZERO }),
        BinaryOp::AbsBackward => float_only!(a, b, name, |g, x: M| {
            if x > M::ZERO {
                g
            } else if x < M::ZERO {
                -g
            } else {
                M::ZERO
            }
        }),
    }
}

/// `x op s` (`s op x` when `reversed`) on the CPU for a scalar `s`,
/// reported as `name` (see the module docs of `ops/binary` for the dtype).
pub(crate) fn scalar(name: &'static str, op: BinaryOp, x: &Tensor, s: f64, reversed: bool) -> Result<Tensor> {
    if x.dtype() == DType::F32 && crate::simd::kernels::has_binary(op) {
        return crate::map_simd::scalar_f32(name, x, s as f32, op, reversed);
    }
    match (op, reversed) {
        // The exponents 0.5, 1, 2, 3 and −1 take PyTorch's exact shortcuts.
        (BinaryOp::Pow, false) if s == 0.5 => x.sqrt(),
        (BinaryOp::Pow, false) if s == 1.0 => scalar_op!(x, s, |v, _e: M| v),
        (BinaryOp::Pow, false) if s == 2.0 => scalar_op!(x, s, |v, _e: M| v * v),
        (BinaryOp::Pow, false) if s == 3.0 => scalar_op!(x, s, |v, _e: M| v * v * v),
        (BinaryOp::Pow, false) if s == -1.0 => x.recip(),
        (BinaryOp::Pow, false) => scalar_op!(x, s, |v, e: M| v.powf(e)),
        (BinaryOp::Pow, true) => scalar_op!(x, s, |v, s: M| s.powf(v)),
        (BinaryOp::Add, _) => scalar_op!(x, s, |v, s: M| v + s),
        (BinaryOp::Sub, false) => scalar_op!(x, s, |v, s: M| v - s),
        (BinaryOp::Sub, true) => scalar_op!(x, s, |v, s: M| s - v),
        (BinaryOp::Mul, _) => scalar_op!(x, s, |v, s: M| v * s),
        (BinaryOp::Div, false) => scalar_op!(x, s, |v, s: M| v / s),
        (BinaryOp::Div, true) => scalar_op!(x, s, |v, s: M| s / v),
        // The other ops have no scalar form: the scalar becomes a 0-d tensor.
        _ => {
            let s = Tensor::scalar(s).to_dtype(crate::ops::unary::cpu::float_input(x)?.dtype())?;
            if reversed {
                binary(op, &s, x)
            } else {
                binary(op, x, &s)
            }
        }
    }
}
