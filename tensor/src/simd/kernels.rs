//! f32 row kernels at every SIMD level: elementwise maps over contiguous
//! slices, reductions with a fixed accumulation order, and the row passes of
//! the fused softmax, layer-norm and cross-entropy kernels.
//!
//! A slice's tail (fewer than a vector's lanes) goes through the same vector
//! code via a padded stack buffer, so every element is computed by the same
//! instructions wherever it sits in a row.
//!
//! The element math reaches the generic loops as [`Lane1`]/[`Lane2`] types,
//! never as closures: a closure (or a function passed as `impl Fn`) is a
//! function of its own, compiled without the caller's target features, so
//! the intrinsics in it become out-of-line calls. A trait method marked
//! `#[inline(always)]` is inlined into the `#[target_feature]` wrapper of
//! [`simd_fn!`] before anything else happens, and its intrinsics with it
//! (`scripts/check_inlined_intrinsics.sh` checks a release build for the
//! symbols that would betray a call).

use super::math;
use super::vector::Vf32;
use super::{simd_fn, ACC_LANES};
use crate::backend::{BinaryOp, UnaryOp};

/// An elementwise function of one vector.
pub(crate) trait Lane1: Copy {
    /// The function of `x`.
    fn call<V: Vf32>(self, x: V) -> V;
}

/// An elementwise function of two vectors.
pub(crate) trait Lane2: Copy {
    /// The function of `a` and `b`.
    fn call<V: Vf32>(self, a: V, b: V) -> V;
}

/// Unit types calling one vector function each, of one (`Lane1(x)`) or two
/// (`Lane2(a, b)`) vectors.
macro_rules! lane_fns {
    (Lane1($x:ident) { $($name:ident => $f:expr;)* }) => {$(
        #[derive(Clone, Copy)]
        pub(crate) struct $name;
        impl Lane1 for $name {
            #[inline(always)]
            fn call<V: Vf32>(self, $x: V) -> V {
                $f
            }
        }
    )*};
    (Lane2($a:ident, $b:ident) { $($name:ident => $f:expr;)* }) => {$(
        #[derive(Clone, Copy)]
        pub(crate) struct $name;
        impl Lane2 for $name {
            #[inline(always)]
            fn call<V: Vf32>(self, $a: V, $b: V) -> V {
                $f
            }
        }
    )*};
}

lane_fns!(Lane1(x) {
    Relu => math::relu(x);
    Exp => math::exp(x);
    Sigmoid => math::sigmoid(x);
    Tanh => math::tanh(x);
    GeluErf => math::gelu_erf(x);
    GeluTanh => math::gelu_tanh(x);
    Silu => math::silu(x);
});

lane_fns!(Lane2(a, b) {
    Add => a.add(b);
    Sub => a.sub(b);
    Mul => a.mul(b);
    Div => a.div(b);
    Max => b.max(a);
    KeepNan => V::select(b.is_nan(), b, a);
    GeluErfBackward => math::gelu_erf_backward(a, b);
    GeluTanhBackward => math::gelu_tanh_backward(a, b);
    SiluBackward => math::silu_backward(a, b);
    ReluBackward => math::relu_backward(a, b);
    SigmoidBackward => math::sigmoid_backward(a, b);
    TanhBackward => math::tanh_backward(a, b);
    ExpSub => math::exp(a.sub(b));
});

/// `f(x, s)` for a fixed scalar `s`.
#[derive(Clone, Copy)]
struct ScalarRight<F>(F, f32);

impl<F: Lane2> Lane1 for ScalarRight<F> {
    #[inline(always)]
    fn call<V: Vf32>(self, x: V) -> V {
        self.0.call(x, V::splat(self.1))
    }
}

/// `f(s, x)` for a fixed scalar `s`.
#[derive(Clone, Copy)]
struct ScalarLeft<F>(F, f32);

impl<F: Lane2> Lane1 for ScalarLeft<F> {
    #[inline(always)]
    fn call<V: Vf32>(self, x: V) -> V {
        self.0.call(V::splat(self.1), x)
    }
}

/// The step `acc + (v − c)²` of [`sum_sq_dev`].
#[derive(Clone, Copy)]
struct SqDev(f32);

impl Lane2 for SqDev {
    #[inline(always)]
    fn call<V: Vf32>(self, acc: V, v: V) -> V {
        let d = v.sub(V::splat(self.0));
        d.fma(d, acc)
    }
}

/// The softmax backward step `y·(g − s)`.
#[derive(Clone, Copy)]
struct SoftmaxGrad(f32);

impl Lane2 for SoftmaxGrad {
    #[inline(always)]
    fn call<V: Vf32>(self, y: V, g: V) -> V {
        y.mul(g.sub(V::splat(self.0)))
    }
}

/// Runs `$body` with `$f` bound to the [`Lane2`] value of the binary op
/// `$op` (one of [`has_binary`]).
macro_rules! with_binary {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = Add;
                $body
            }
            BinaryOp::Sub => {
                let $f = Sub;
                $body
            }
            BinaryOp::Mul => {
                let $f = Mul;
                $body
            }
            BinaryOp::Div => {
                let $f = Div;
                $body
            }
            BinaryOp::GeluErfBackward => {
                let $f = GeluErfBackward;
                $body
            }
            BinaryOp::GeluTanhBackward => {
                let $f = GeluTanhBackward;
                $body
            }
            BinaryOp::SiluBackward => {
                let $f = SiluBackward;
                $body
            }
            BinaryOp::ReluBackward => {
                let $f = ReluBackward;
                $body
            }
            BinaryOp::SigmoidBackward => {
                let $f = SigmoidBackward;
                $body
            }
            BinaryOp::TanhBackward => {
                let $f = TanhBackward;
                $body
            }
            other => unreachable!("{other:?} has no SIMD kernel; callers check has_binary"),
        }
    };
}

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

/// True when `op` has a SIMD kernel: the arithmetic ops and the fused
/// activation derivatives `(g, x)` / `(g, y)`.
pub(crate) fn has_binary(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::GeluErfBackward
            | BinaryOp::GeluTanhBackward
            | BinaryOp::SiluBackward
            | BinaryOp::ReluBackward
            | BinaryOp::SigmoidBackward
            | BinaryOp::TanhBackward
    )
}

/// `op` (one of the arithmetic ops of [`has_binary`]) on one pair of
/// scalars, bitwise what the kernels compute.
#[cfg(test)]
pub(crate) fn binary_scalar_op(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        other => unreachable!("{other:?} is not an arithmetic op"),
    }
}

/// `y[i] = f(x[i])` over equal-length slices.
#[inline(always)]
pub(super) fn map1<V: Vf32>(x: &[f32], y: &mut [f32], f: impl Lane1) {
    assert_eq!(x.len(), y.len(), "kernel slices differ in length");
    let n = x.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for both slices.
        unsafe { f.call(V::load(x.as_ptr().add(i))).store(y.as_mut_ptr().add(i)) };
        i += V::N;
    }
    if i < n {
        let mut buf = [0.0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..]);
        // SAFETY: the buffer holds 16 ≥ N lanes.
        unsafe { f.call(V::load(buf.as_ptr())).store(buf.as_mut_ptr()) };
        y[i..].copy_from_slice(&buf[..n - i]);
    }
}

/// `y[i] = f(a[i], b[i])` over equal-length slices.
#[inline(always)]
pub(super) fn map2<V: Vf32>(a: &[f32], b: &[f32], y: &mut [f32], f: impl Lane2) {
    assert!(
        a.len() == y.len() && b.len() == y.len(),
        "kernel slices differ in length"
    );
    let n = y.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for all three slices.
        unsafe {
            f.call(V::load(a.as_ptr().add(i)), V::load(b.as_ptr().add(i)))
                .store(y.as_mut_ptr().add(i))
        };
        i += V::N;
    }
    if i < n {
        // Padding with 1 keeps a division's padding lanes finite.
        let (mut ba, mut bb) = ([1.0f32; 16], [1.0f32; 16]);
        ba[..n - i].copy_from_slice(&a[i..]);
        bb[..n - i].copy_from_slice(&b[i..]);
        // SAFETY: the buffers hold 16 ≥ N lanes.
        unsafe {
            f.call(V::load(ba.as_ptr()), V::load(bb.as_ptr()))
                .store(ba.as_mut_ptr())
        };
        y[i..].copy_from_slice(&ba[..n - i]);
    }
}

#[inline(always)]
fn unary_g<V: Vf32>(op: UnaryOp, x: &[f32], y: &mut [f32]) {
    match op {
        UnaryOp::Relu => map1::<V>(x, y, Relu),
        UnaryOp::Exp => map1::<V>(x, y, Exp),
        UnaryOp::Sigmoid => map1::<V>(x, y, Sigmoid),
        UnaryOp::Tanh => map1::<V>(x, y, Tanh),
        UnaryOp::GeluErf => map1::<V>(x, y, GeluErf),
        UnaryOp::GeluTanh => map1::<V>(x, y, GeluTanh),
        UnaryOp::Silu => map1::<V>(x, y, Silu),
        other => unreachable!("{other:?} has no SIMD kernel; callers check has_unary"),
    }
}

simd_fn!(
    /// `y = op(x)` elementwise over equal-length slices.
    pub(crate) fn unary(op: UnaryOp, x: &[f32], y: &mut [f32]) => unary_g
);

#[inline(always)]
fn binary_g<V: Vf32>(op: BinaryOp, a: &[f32], b: &[f32], y: &mut [f32]) {
    with_binary!(op, f => map2::<V>(a, b, y, f))
}

simd_fn!(
    /// `y = a op b` elementwise over equal-length slices.
    pub(crate) fn binary(op: BinaryOp, a: &[f32], b: &[f32], y: &mut [f32]) => binary_g
);

#[inline(always)]
fn binary_scalar_g<V: Vf32>(op: BinaryOp, a: &[f32], s: f32, scalar_first: bool, y: &mut [f32]) {
    with_binary!(op, f => if scalar_first {
        map1::<V>(a, y, ScalarLeft(f, s))
    } else {
        map1::<V>(a, y, ScalarRight(f, s))
    })
}

simd_fn!(
    /// `y = a op s` (or `s op a` with `scalar_first`) for a scalar `s`.
    pub(crate) fn binary_scalar(op: BinaryOp, a: &[f32], s: f32, scalar_first: bool, y: &mut [f32]) => binary_scalar_g
);

/// Folds `x` into [`ACC_LANES`] partial states, element `e` of each block
/// of `ACC_LANES` going to partial `e % ACC_LANES` at every level; the tail
/// is padded with `pad`. Returns the partials in lane order.
#[inline(always)]
fn fold_lanes<V: Vf32>(x: &[f32], pad: f32, init: f32, step: impl Lane2) -> [f32; ACC_LANES] {
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let mut acc = [V::splat(init); MAX_VECS];
    let n = x.len();
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: i + ACC_LANES ≤ n.
            *a = step.call(*a, unsafe { V::load(x.as_ptr().add(i + j * V::N)) });
        }
        i += ACC_LANES;
    }
    if i < n {
        let mut buf = [pad; ACC_LANES];
        buf[..n - i].copy_from_slice(&x[i..]);
        for (j, a) in acc.iter_mut().enumerate().take(k) {
            // SAFETY: the buffer holds ACC_LANES lanes.
            *a = step.call(*a, unsafe { V::load(buf.as_ptr().add(j * V::N)) });
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
    tree_sum(fold_lanes::<V>(x, 0.0, 0.0, Add))
}

simd_fn!(
    /// Σ x, in an order that depends only on `x.len()` (bitwise the same at
    /// every level).
    pub(crate) fn sum(x: &[f32]) -> f32 => sum_g
);

#[inline(always)]
fn max_g<V: Vf32>(x: &[f32]) -> f32 {
    // NaN lanes are tracked apart: x86 max drops a NaN first operand.
    let nan = fold_lanes::<V>(x, 0.0, 0.0, KeepNan);
    if nan.iter().any(|v| v.is_nan()) {
        return f32::NAN;
    }
    let m = fold_lanes::<V>(x, f32::NEG_INFINITY, f32::NEG_INFINITY, Max);
    m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

simd_fn!(
    /// max x, NaN if any element is NaN, −∞ for an empty slice.
    pub(crate) fn max(x: &[f32]) -> f32 => max_g
);

/// Σ (x − c)²: the second pass of a two-pass variance.
#[inline(always)]
fn sum_sq_dev_g<V: Vf32>(x: &[f32], c: f32) -> f32 {
    // Padding with c contributes exactly 0.
    tree_sum(fold_lanes::<V>(x, c, 0.0, SqDev(c)))
}

simd_fn!(
    /// Σ (x − c)² in a fixed order.
    pub(crate) fn sum_sq_dev(x: &[f32], c: f32) -> f32 => sum_sq_dev_g
);

/// Σ exp(x − m) in the fixed lane structure of [`fold_lanes`] (whose step
/// sees only the accumulator and the element).
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

/// `y = exp(x − m)·scale`.
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
        map1::<V>(x, y, ScalarRight(Sub, m + s.ln()));
    } else {
        exp_shift_scale::<V>(x, m, 1.0 / s, y);
    }
}

simd_fn!(
    /// One row of softmax (or log_softmax) of `x` into `y`.
    pub(crate) fn softmax(x: &[f32], y: &mut [f32], log: bool) => softmax_g
);

#[inline(always)]
fn exp_shift_g<V: Vf32>(x: &[f32], m: f32, y: &mut [f32]) {
    exp_shift_scale::<V>(x, m, 1.0, y)
}

simd_fn!(
    /// `y = exp(x − m)` elementwise: the numerators of an online softmax.
    pub(crate) fn exp_shift(x: &[f32], m: f32, y: &mut [f32]) => exp_shift_g
);

simd_fn!(
    /// `y = exp(x − m)` elementwise with a shift per element: the weights
    /// of a transposed score tile, whose columns each have their own
    /// log-sum-exp. Bitwise [`exp_shift`]'s result wherever `m` is that
    /// call's scalar.
    pub(crate) fn exp_sub(x: &[f32], m: &[f32], y: &mut [f32]) => exp_sub_g
);

#[inline(always)]
fn exp_sub_g<V: Vf32>(x: &[f32], m: &[f32], y: &mut [f32]) {
    map2::<V>(x, m, y, ExpSub)
}

simd_fn!(
    /// `ds = p·(ds − δ)·scale` elementwise, in place: attention's score
    /// gradient from the weights `p`, the weight gradient in `ds` and each
    /// element's `δ` (Σ dO·O of its query).
    pub(crate) fn attention_grad(p: &[f32], delta: &[f32], scale: f32, ds: &mut [f32]) => attention_grad_g
);

#[inline(always)]
fn attention_grad_g<V: Vf32>(p: &[f32], delta: &[f32], scale: f32, ds: &mut [f32]) {
    assert!(
        p.len() == ds.len() && delta.len() == ds.len(),
        "kernel slices differ in length"
    );
    let sv = V::splat(scale);
    let n = ds.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for all three slices.
        unsafe {
            let (pv, dv) = (V::load(p.as_ptr().add(i)), V::load(delta.as_ptr().add(i)));
            let o = ds.as_mut_ptr().add(i);
            attention_grad_step(pv, dv, V::load(o), sv).store(o)
        };
        i += V::N;
    }
    if i < n {
        let (mut bp, mut bd, mut bg) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
        bp[..n - i].copy_from_slice(&p[i..]);
        bd[..n - i].copy_from_slice(&delta[i..]);
        bg[..n - i].copy_from_slice(&ds[i..]);
        // SAFETY: the buffers hold 16 ≥ N lanes.
        unsafe {
            let (pv, dv) = (V::load(bp.as_ptr()), V::load(bd.as_ptr()));
            attention_grad_step(pv, dv, V::load(bg.as_ptr()), sv).store(bg.as_mut_ptr())
        };
        ds[i..].copy_from_slice(&bg[..n - i]);
    }
}

/// `p·(g − d)·s`, one vector of [`attention_grad`].
#[inline(always)]
fn attention_grad_step<V: Vf32>(p: V, d: V, g: V, s: V) -> V {
    p.mul(g.sub(d)).mul(s)
}

simd_fn!(
    /// `y += x` elementwise over equal-length slices (col2im's scatter).
    pub(crate) fn add_into(x: &[f32], y: &mut [f32]) => add_into_g
);

#[inline(always)]
fn add_into_g<V: Vf32>(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "kernel slices differ in length");
    let n = y.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for both slices.
        unsafe {
            let o = y.as_mut_ptr().add(i);
            V::load(o).add(V::load(x.as_ptr().add(i))).store(o)
        };
        i += V::N;
    }
    for (o, &v) in y[full..].iter_mut().zip(&x[full..]) {
        *o += v;
    }
}

simd_fn!(
    /// Σ a·b over equal-length slices, in a fixed order.
    pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 => dot_g
);

/// Σ a·b in a fixed order: [`dot_dev_g`] about 0 (b − 0 is b, bit for bit).
#[inline(always)]
fn dot_g<V: Vf32>(a: &[f32], b: &[f32]) -> f32 {
    dot_dev_g::<V>(a, b, 0.0)
}

simd_fn!(
    /// Σ a·(b − c) over equal-length slices, in a fixed order: a gradient's
    /// dot product with centred values (batch norm's Σ dy·(x − mean)).
    pub(crate) fn dot_dev(a: &[f32], b: &[f32], c: f32) -> f32 => dot_dev_g
);

/// Σ a·(b − c) in a fixed order.
#[inline(always)]
fn dot_dev_g<V: Vf32>(a: &[f32], b: &[f32], c: f32) -> f32 {
    assert_eq!(a.len(), b.len(), "kernel slices differ in length");
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let cv = V::splat(c);
    let mut acc = [V::splat(0.0); MAX_VECS];
    let n = a.len();
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for (j, s) in acc.iter_mut().enumerate().take(k) {
            let o = i + j * V::N;
            // SAFETY: o + N ≤ n for both slices.
            *s = unsafe { V::load(a.as_ptr().add(o)).fma(V::load(b.as_ptr().add(o)).sub(cv), *s) };
        }
        i += ACC_LANES;
    }
    let mut out = [0.0f32; ACC_LANES];
    for (j, s) in acc.iter().enumerate().take(k) {
        // SAFETY: j·N + N ≤ ACC_LANES.
        unsafe { s.store(out.as_mut_ptr().add(j * V::N)) };
    }
    for (o, (x, y)) in out.iter_mut().zip(a[full..].iter().zip(&b[full..])) {
        *o = x.mul_add(*y - c, *o);
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
        map2::<V>(y, dy, dx, SoftmaxGrad(dot_g::<V>(y, dy)));
    }
}

simd_fn!(
    /// One row of the softmax (or log_softmax) backward from the output `y`.
    pub(crate) fn softmax_backward(y: &[f32], dy: &[f32], dx: &mut [f32], log: bool) => softmax_backward_g
);
