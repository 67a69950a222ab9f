//! f32 row kernels at every SIMD level: elementwise maps over contiguous
//! slices, reductions with a fixed accumulation order, and the row passes of
//! the fused softmax, layer-norm and cross-entropy kernels.
//!
//! A slice's tail (fewer than a vector's lanes) goes through the same vector
//! code via a padded stack buffer, so every element is computed by the same
//! instructions wherever it sits in a row.

use super::math;
use super::vector::Vf32;
use super::{simd_fn, ACC_LANES};
use crate::backend::{BinaryOp, UnaryOp};

/// True when `op` has a SIMD kernel (the others run the scalar CPU loops).
pub(crate) fn has_unary(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Relu
            | UnaryOp::Exp
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::GeluErf
            | UnaryOp::GeluTanh
            | UnaryOp::Silu
    )
}

/// True when `op` has a SIMD kernel.
pub(crate) fn has_binary(op: BinaryOp) -> bool {
    matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)
}

/// `op` (one of [`has_binary`]) on one pair of scalars (bitwise what the
/// kernels compute).
#[inline(always)]
pub(crate) fn binary_scalar_op(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        other => unreachable!("{other:?} has no SIMD kernel; callers check has_binary"),
    }
}

#[inline(always)]
fn apply<V: Vf32>(op: BinaryOp, a: V, b: V) -> V {
    match op {
        BinaryOp::Add => a.add(b),
        BinaryOp::Sub => a.sub(b),
        BinaryOp::Mul => a.mul(b),
        BinaryOp::Div => a.div(b),
        other => unreachable!("{other:?} has no SIMD kernel; callers check has_binary"),
    }
}

/// `y[i] = f(x[i])` over equal-length slices.
#[inline(always)]
fn map1<V: Vf32>(x: &[f32], y: &mut [f32], f: impl Fn(V) -> V) {
    assert_eq!(x.len(), y.len(), "kernel slices differ in length");
    let n = x.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for both slices.
        unsafe { f(V::load(x.as_ptr().add(i))).store(y.as_mut_ptr().add(i)) };
        i += V::N;
    }
    if i < n {
        let mut buf = [0.0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..]);
        // SAFETY: the buffer holds 16 ≥ N lanes.
        unsafe { f(V::load(buf.as_ptr())).store(buf.as_mut_ptr()) };
        y[i..].copy_from_slice(&buf[..n - i]);
    }
}

/// `y[i] = f(a[i], b[i])` over equal-length slices.
#[inline(always)]
fn map2<V: Vf32>(a: &[f32], b: &[f32], y: &mut [f32], f: impl Fn(V, V) -> V) {
    assert!(
        a.len() == y.len() && b.len() == y.len(),
        "kernel slices differ in length"
    );
    let n = y.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for all three slices.
        unsafe { f(V::load(a.as_ptr().add(i)), V::load(b.as_ptr().add(i))).store(y.as_mut_ptr().add(i)) };
        i += V::N;
    }
    if i < n {
        let (mut ba, mut bb) = ([0.0f32; 16], [0.0f32; 16]);
        ba[..n - i].copy_from_slice(&a[i..]);
        bb[..n - i].copy_from_slice(&b[i..]);
        // SAFETY: the buffers hold 16 ≥ N lanes.
        unsafe { f(V::load(ba.as_ptr()), V::load(bb.as_ptr())).store(ba.as_mut_ptr()) };
        y[i..].copy_from_slice(&ba[..n - i]);
    }
}

#[inline(always)]
fn unary_g<V: Vf32>(op: UnaryOp, x: &[f32], y: &mut [f32]) {
    match op {
        UnaryOp::Relu => map1::<V>(x, y, math::relu),
        UnaryOp::Exp => map1::<V>(x, y, math::exp),
        UnaryOp::Sigmoid => map1::<V>(x, y, math::sigmoid),
        UnaryOp::Tanh => map1::<V>(x, y, math::tanh),
        UnaryOp::GeluErf => map1::<V>(x, y, math::gelu_erf),
        UnaryOp::GeluTanh => map1::<V>(x, y, math::gelu_tanh),
        UnaryOp::Silu => map1::<V>(x, y, math::silu),
        other => unreachable!("{other:?} has no SIMD kernel; callers check has_unary"),
    }
}

simd_fn!(
    /// `y = op(x)` elementwise over equal-length slices.
    pub(crate) fn unary(op: UnaryOp, x: &[f32], y: &mut [f32]) => unary_g
);

#[inline(always)]
fn binary_g<V: Vf32>(op: BinaryOp, a: &[f32], b: &[f32], y: &mut [f32]) {
    match op {
        BinaryOp::Add => map2::<V>(a, b, y, |a, b| a.add(b)),
        BinaryOp::Sub => map2::<V>(a, b, y, |a, b| a.sub(b)),
        BinaryOp::Mul => map2::<V>(a, b, y, |a, b| a.mul(b)),
        BinaryOp::Div => map2::<V>(a, b, y, |a, b| a.div(b)),
        other => unreachable!("{other:?} has no SIMD kernel; callers check has_binary"),
    }
}

simd_fn!(
    /// `y = a op b` elementwise over equal-length slices.
    pub(crate) fn binary(op: BinaryOp, a: &[f32], b: &[f32], y: &mut [f32]) => binary_g
);

#[inline(always)]
fn binary_scalar_g<V: Vf32>(op: BinaryOp, a: &[f32], s: f32, scalar_first: bool, y: &mut [f32]) {
    let sv = V::splat(s);
    if scalar_first {
        map1::<V>(a, y, |x| apply(op, sv, x))
    } else {
        map1::<V>(a, y, |x| apply(op, x, sv))
    }
}

simd_fn!(
    /// `y = a op s` (or `s op a` with `scalar_first`) for a scalar `s`.
    pub(crate) fn binary_scalar(op: BinaryOp, a: &[f32], s: f32, scalar_first: bool, y: &mut [f32]) => binary_scalar_g
);

/// Folds `x` into [`ACC_LANES`] partial states, element `e` of each block
/// of `ACC_LANES` going to partial `e % ACC_LANES` at every level; the tail
/// is padded with `pad`. Returns the partials in lane order.
#[inline(always)]
fn fold_lanes<V: Vf32>(x: &[f32], pad: f32, init: f32, step: impl Fn(V, V) -> V) -> [f32; ACC_LANES] {
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let mut acc = [V::splat(init); MAX_VECS];
    let n = x.len();
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: i + ACC_LANES ≤ n.
            *a = step(*a, unsafe { V::load(x.as_ptr().add(i + j * V::N)) });
        }
        i += ACC_LANES;
    }
    if i < n {
        let mut buf = [pad; ACC_LANES];
        buf[..n - i].copy_from_slice(&x[i..]);
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: the buffer holds ACC_LANES lanes.
            *a = step(*a, unsafe { V::load(buf.as_ptr().add(j * V::N)) });
        }
    }
    let mut out = [0.0f32; ACC_LANES];
    for (j, a) in acc.iter().enumerate().take(k) {
        // SAFETY: j·N + N ≤ ACC_LANES.
        unsafe { a.store(out.as_mut_ptr().add(j * V::N)) };
    }
    out
}

/// The sum of the partials by a fixed halving tree.
#[inline(always)]
pub(super) fn tree_sum(mut p: [f32; ACC_LANES]) -> f32 {
    let mut h = ACC_LANES / 2;
    while h > 0 {
        for i in 0..h {
            p[i] += p[i + h];
        }
        h /= 2;
    }
    p[0]
}

#[inline(always)]
fn sum_g<V: Vf32>(x: &[f32]) -> f32 {
    tree_sum(fold_lanes::<V>(x, 0.0, 0.0, |a, v| a.add(v)))
}

simd_fn!(
    /// Σ x, in an order that depends only on `x.len()` (bitwise the same at
    /// every level).
    pub(crate) fn sum(x: &[f32]) -> f32 => sum_g
);

#[inline(always)]
fn max_g<V: Vf32>(x: &[f32]) -> f32 {
    // NaN lanes are tracked apart: x86 max drops a NaN first operand.
    let nan = fold_lanes::<V>(x, 0.0, 0.0, |a, v| V::select(v.is_nan(), v, a));
    if nan.iter().any(|v| v.is_nan()) {
        return f32::NAN;
    }
    let m = fold_lanes::<V>(x, f32::NEG_INFINITY, f32::NEG_INFINITY, |a, v| v.max(a));
    m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

simd_fn!(
    /// max x, NaN if any element is NaN, −∞ for an empty slice.
    pub(crate) fn max(x: &[f32]) -> f32 => max_g
);

/// Σ (x − c)²: the second pass of a two-pass variance.
#[inline(always)]
fn sum_sq_dev_g<V: Vf32>(x: &[f32], c: f32) -> f32 {
    let cv = V::splat(c);
    // Padding with c contributes exactly 0.
    tree_sum(fold_lanes::<V>(x, c, 0.0, |a, v| {
        let d = v.sub(cv);
        d.fma(d, a)
    }))
}

simd_fn!(
    /// Σ (x − c)² in a fixed order.
    pub(crate) fn sum_sq_dev(x: &[f32], c: f32) -> f32 => sum_sq_dev_g
);

/// Σ exp(x − m) in the fixed lane structure of [`fold_lanes`], written out
/// by hand: a closure holding exp would not inherit the target features, and
/// its intrinsics would become calls.
#[inline(always)]
fn sum_exp_shifted<V: Vf32>(x: &[f32], m: f32) -> f32 {
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let mv = V::splat(m);
    let mut acc = [V::splat(0.0); MAX_VECS];
    let n = x.len();
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: i + ACC_LANES ≤ n.
            let v = unsafe { V::load(x.as_ptr().add(i + j * V::N)) };
            *a = a.add(math::exp(v.sub(mv)));
        }
        i += ACC_LANES;
    }
    if i < n {
        // Padding with −∞ contributes exp(−∞) = 0.
        let mut buf = [f32::NEG_INFINITY; ACC_LANES];
        buf[..n - i].copy_from_slice(&x[i..]);
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: the buffer holds ACC_LANES lanes.
            let v = unsafe { V::load(buf.as_ptr().add(j * V::N)) };
            *a = a.add(math::exp(v.sub(mv)));
        }
    }
    let mut out = [0.0f32; ACC_LANES];
    for (j, a) in acc.iter().enumerate().take(k) {
        // SAFETY: j·N + N ≤ ACC_LANES.
        unsafe { a.store(out.as_mut_ptr().add(j * V::N)) };
    }
    tree_sum(out)
}

/// The row max and Σ exp(x − max), the state of a stable softmax. The sum
/// is NaN when the max is NaN or +∞, and 0 when every element is −∞.
#[inline(always)]
fn max_sumexp_g<V: Vf32>(x: &[f32]) -> (f32, f32) {
    let m = max_g::<V>(x);
    if m == f32::NEG_INFINITY {
        return (m, 0.0);
    }
    (m, sum_exp_shifted::<V>(x, m))
}

simd_fn!(
    /// (max x, Σ exp(x − max x)) of one row.
    pub(crate) fn max_sumexp(x: &[f32]) -> (f32, f32) => max_sumexp_g
);

/// `y = exp(x − m)·scale` by hand (see [`sum_exp_shifted`] on closures).
#[inline(always)]
fn exp_shift_scale<V: Vf32>(x: &[f32], m: f32, scale: f32, y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "kernel slices differ in length");
    let (mv, sv) = (V::splat(m), V::splat(scale));
    let n = x.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for both slices.
        unsafe {
            math::exp(V::load(x.as_ptr().add(i)).sub(mv))
                .mul(sv)
                .store(y.as_mut_ptr().add(i))
        };
        i += V::N;
    }
    if i < n {
        let mut buf = [0.0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..]);
        // SAFETY: the buffer holds 16 ≥ N lanes.
        unsafe {
            math::exp(V::load(buf.as_ptr()).sub(mv))
                .mul(sv)
                .store(buf.as_mut_ptr())
        };
        y[i..].copy_from_slice(&buf[..n - i]);
    }
}

#[inline(always)]
fn softmax_g<V: Vf32>(x: &[f32], y: &mut [f32], log: bool) {
    let (m, s) = max_sumexp_g::<V>(x);
    if log {
        let shift = V::splat(m + s.ln());
        map1::<V>(x, y, |v| v.sub(shift));
    } else {
        exp_shift_scale::<V>(x, m, 1.0 / s, y);
    }
}

simd_fn!(
    /// One row of softmax (or log_softmax) of `x` into `y`.
    pub(crate) fn softmax(x: &[f32], y: &mut [f32], log: bool) => softmax_g
);

/// Σ a·b in a fixed order.
#[inline(always)]
fn dot_g<V: Vf32>(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "kernel slices differ in length");
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let mut acc = [V::splat(0.0); MAX_VECS];
    let n = a.len();
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for (j, s) in acc.iter_mut().enumerate().take(k) {
            let o = i + j * V::N;
            // SAFETY: o + N ≤ n for both slices.
            *s = unsafe { V::load(a.as_ptr().add(o)).fma(V::load(b.as_ptr().add(o)), *s) };
        }
        i += ACC_LANES;
    }
    let mut out = [0.0f32; ACC_LANES];
    for (j, s) in acc.iter().enumerate().take(k) {
        // SAFETY: j·N + N ≤ ACC_LANES.
        unsafe { s.store(out.as_mut_ptr().add(j * V::N)) };
    }
    for (o, (x, y)) in out.iter_mut().zip(a[full..].iter().zip(&b[full..])) {
        *o = x.mul_add(*y, *o);
    }
    tree_sum(out)
}

#[inline(always)]
fn softmax_backward_g<V: Vf32>(y: &[f32], dy: &[f32], dx: &mut [f32], log: bool) {
    if log {
        // dx = dy − exp(y)·Σ dy
        let s = sum_g::<V>(dy);
        exp_shift_scale::<V>(y, 0.0, s, dx);
        for (o, &g) in dx.iter_mut().zip(dy) {
            *o = g - *o;
        }
    } else {
        // dx = y·(dy − Σ dy·y)
        let s = V::splat(dot_g::<V>(y, dy));
        map2::<V>(y, dy, dx, |y, g| y.mul(g.sub(s)));
    }
}

simd_fn!(
    /// One row of the softmax (or log_softmax) backward from the output `y`.
    pub(crate) fn softmax_backward(y: &[f32], dy: &[f32], dx: &mut [f32], log: bool) => softmax_backward_g
);
