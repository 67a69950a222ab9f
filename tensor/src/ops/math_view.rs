//! A float tensor's elements in their math type (f32 for f16/bf16), for
//! the CPU kernels that compute in it: borrowed when the tensor already is
//! a contiguous f32/f64 tensor, else converted once by the SIMD casts of
//! `to_dtype` into a tensor from the caching allocator (no zero fill of a
//! fresh vector first); or one row at a time into a reused buffer
//! ([`math_slice`]).

use std::any::TypeId;
use std::marker::PhantomData;
use std::ops::Deref;

use crate::{Element, FloatElement, Result, Tensor};

/// The elements of a tensor in the math type `M`, row-major.
pub(crate) enum MathView<'a, M> {
    /// The tensor's own contiguous elements.
    Borrowed(&'a [M]),
    /// A contiguous `M` copy.
    Converted(Tensor, PhantomData<M>),
}

impl<M: Element> Deref for MathView<'_, M> {
    type Target = [M];

    fn deref(&self) -> &[M] {
        match self {
            MathView::Borrowed(s) => s,
            MathView::Converted(t, _) => t.as_slice::<M>().expect("converted to a contiguous M tensor"),
        }
    }
}

/// The elements of `t` (a float tensor of element type `S`) in `S`'s math
/// type. Errors when the conversion's allocation fails.
pub(crate) fn math_view<S: FloatElement>(t: &Tensor) -> Result<MathView<'_, S::Math>>
where
    S::Math: Element,
{
    let m = <S::Math as Element>::DTYPE;
    if t.dtype() == m {
        if let Ok(s) = t.as_slice::<S::Math>() {
            return Ok(MathView::Borrowed(s));
        }
    }
    Ok(MathView::Converted(t.to_dtype(m)?.contiguous()?, PhantomData))
}

/// `src` in its math type: `src` itself when `S` is its own math type
/// (f32, f64), else widened into `scratch`, which a caller reuses row after
/// row so no fresh memory is touched per row.
pub(crate) fn math_slice<'a, S: FloatElement>(src: &'a [S], scratch: &'a mut Vec<S::Math>) -> &'a [S::Math] {
    if TypeId::of::<S>() == TypeId::of::<S::Math>() {
        // SAFETY: `S` and `S::Math` are the same type (TypeId).
        return unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) };
    }
    scratch.clear();
    scratch.resize(src.len(), <S::Math as crate::FloatMath>::ZERO);
    if crate::simd::cast::fast_pair::<S, S::Math>() {
        crate::simd::cast::convert_run(src, scratch);
    } else {
        for (d, &s) in scratch.iter_mut().zip(src) {
            *d = s.to_math();
        }
    }
    scratch
}

/// Runs `f` on `out` seen in its math type and zeroed: `out` itself when
/// `S` is its own math type, else `scratch` (reused by the caller), which
/// is then rounded into `out` once.
pub(crate) fn zeroed_math_mut<S: FloatElement>(
    out: &mut [S],
    scratch: &mut Vec<S::Math>,
    f: impl FnOnce(&mut [S::Math]),
) {
    let zero = <S::Math as crate::FloatMath>::ZERO;
    if TypeId::of::<S>() == TypeId::of::<S::Math>() {
        // SAFETY: `S` and `S::Math` are the same type (TypeId).
        let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<S::Math>(), out.len()) };
        out.fill(zero);
        return f(out);
    }
    scratch.clear();
    scratch.resize(out.len(), zero);
    f(scratch);
    if crate::simd::cast::fast_pair::<S::Math, S>() {
        crate::simd::cast::convert_run(scratch, out);
    } else {
        for (d, &v) in out.iter_mut().zip(scratch.iter()) {
            *d = S::from_math(v);
        }
    }
}
