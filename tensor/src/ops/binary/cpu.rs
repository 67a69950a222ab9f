//! CPU kernels of the binary ops. Each op is one generic loop over
//! [`Tensor::zip_map`] (or [`Tensor::map`] for a scalar operand) with the
//! element function inlined, so the f32/f64 loops carry no dtype dispatch and
//! auto-vectorise; f16/bf16 widen to f32 per element and round once.

use crate::{FloatElement, Result, Tensor};

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
pub(crate) use zip_same;

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
pub(crate) use scalar_op;

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
