//! CPU kernels of the unary ops: one generic loop per element kind, the
//! element function inlined into it, so the f32/f64 loops carry no dtype
//! dispatch and auto-vectorise where the function allows.

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
pub(crate) use float_unary;

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
