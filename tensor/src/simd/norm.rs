//! f32 row kernels of the fused layer-norm, batch-norm and cross-entropy
//! passes, at every SIMD level (see [`super::kernels`] for the conventions).

use super::kernels::{map1, map2, tree_sum, Lane1, Lane2};
use super::vector::Vf32;
use super::{math, simd_fn, ACC_LANES};

#[inline(always)]
fn layer_norm_row_g<V: Vf32>(x: &[f32], mean: f32, rstd: f32, w: &[f32], b: &[f32], y: &mut [f32]) {
    let n = x.len();
    assert!(y.len() == n && (w.is_empty() || w.len() == n) && (b.is_empty() || b.len() == n));
    let (mv, rv) = (V::splat(mean), V::splat(rstd));
    let one = |i: usize| {
        let h = (x[i] - mean) * rstd;
        let h = if w.is_empty() { h } else { h * w[i] };
        if b.is_empty() {
            h
        } else {
            h + b[i]
        }
    };
    let full = n - n % V::N;
    let mut i = 0;
    // SAFETY (loads and stores): i + N ≤ n for every slice used.
    while i < full {
        unsafe {
            let h = V::load(x.as_ptr().add(i)).sub(mv).mul(rv);
            let h = if w.is_empty() {
                h
            } else {
                h.mul(V::load(w.as_ptr().add(i)))
            };
            let h = if b.is_empty() {
                h
            } else {
                h.add(V::load(b.as_ptr().add(i)))
            };
            h.store(y.as_mut_ptr().add(i));
        }
        i += V::N;
    }
    for (k, o) in y.iter_mut().enumerate().skip(full) {
        *o = one(k);
    }
}

simd_fn!(
    /// One row of layer norm: y = (x − mean)·rstd·w + b, where an empty `w`
    /// or `b` means 1 or 0.
    pub(crate) fn layer_norm_row(x: &[f32], mean: f32, rstd: f32, w: &[f32], b: &[f32], y: &mut [f32]) => layer_norm_row_g
);

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_row_g<V: Vf32>(
    x: &[f32],
    dy: &[f32],
    w: &[f32],
    mean: f32,
    rstd: f32,
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
) {
    let n = x.len();
    assert!(
        dy.len() == n && dx.len() == n && dw.len() == n && db.len() == n && (w.is_empty() || w.len() == n)
    );
    const MAX_VECS: usize = ACC_LANES / 8;
    let k = ACC_LANES / V::N;
    let (mv, rv) = (V::splat(mean), V::splat(rstd));
    // Plain functions, not closures: a closure would not inherit the target
    // features and its intrinsics would become calls (see `kernels`).
    // SAFETY (every load and store below): offsets stay below n.
    #[inline(always)]
    unsafe fn g_at<V: Vf32>(dy: &[f32], w: &[f32], o: usize) -> V {
        let g = unsafe { V::load(dy.as_ptr().add(o)) };
        if w.is_empty() {
            g
        } else {
            g.mul(unsafe { V::load(w.as_ptr().add(o)) })
        }
    }
    #[inline(always)]
    unsafe fn xhat_at<V: Vf32>(x: &[f32], mv: V, rv: V, o: usize) -> V {
        unsafe { V::load(x.as_ptr().add(o)) }.sub(mv).mul(rv)
    }
    // Pass 1: Σ g and Σ g·x̂ in the fixed lane structure.
    let (mut sg, mut sgx) = ([V::splat(0.0); MAX_VECS], [V::splat(0.0); MAX_VECS]);
    let full = n - n % ACC_LANES;
    let mut i = 0;
    while i < full {
        for j in 0..k {
            let o = i + j * V::N;
            let (g, xh) = unsafe { (g_at::<V>(dy, w, o), xhat_at(x, mv, rv, o)) };
            sg[j] = sg[j].add(g);
            sgx[j] = g.fma(xh, sgx[j]);
        }
        i += ACC_LANES;
    }
    let (mut pg, mut pgx) = ([0.0f32; ACC_LANES], [0.0f32; ACC_LANES]);
    for j in 0..k {
        unsafe {
            sg[j].store(pg.as_mut_ptr().add(j * V::N));
            sgx[j].store(pgx.as_mut_ptr().add(j * V::N));
        }
    }
    let g1 = |o: usize| dy[o] * if w.is_empty() { 1.0 } else { w[o] };
    let xh1 = |o: usize| (x[o] - mean) * rstd;
    for o in full..n {
        pg[o - full] += g1(o);
        pgx[o - full] = g1(o).mul_add(xh1(o), pgx[o - full]);
    }
    let inv_n = 1.0 / n as f32;
    let (a, b) = (tree_sum(pg) * inv_n, tree_sum(pgx) * inv_n);
    // Pass 2: dx = rstd·(g − a − x̂·b), dw += dy·x̂, db += dy.
    let (av, bv) = (V::splat(a), V::splat(b));
    let full = n - n % V::N;
    let mut o = 0;
    while o < full {
        unsafe {
            let xh = xhat_at(x, mv, rv, o);
            let d = V::load(dy.as_ptr().add(o));
            g_at::<V>(dy, w, o)
                .sub(av)
                .sub(xh.mul(bv))
                .mul(rv)
                .store(dx.as_mut_ptr().add(o));
            d.fma(xh, V::load(dw.as_ptr().add(o)))
                .store(dw.as_mut_ptr().add(o));
            V::load(db.as_ptr().add(o)).add(d).store(db.as_mut_ptr().add(o));
        }
        o += V::N;
    }
    for o in full..n {
        let xh = xh1(o);
        dx[o] = (g1(o) - a - xh * b) * rstd;
        dw[o] = dy[o].mul_add(xh, dw[o]);
        db[o] += dy[o];
    }
}

simd_fn!(
    /// One row of the layer-norm backward: writes dx and adds the row's
    /// dy·x̂ and dy into `dw` and `db`. An empty `w` means 1.
    pub(crate) fn layer_norm_backward_row(
        x: &[f32],
        dy: &[f32],
        w: &[f32],
        mean: f32,
        rstd: f32,
        dx: &mut [f32],
        dw: &mut [f32],
        db: &mut [f32],
    ) => layer_norm_backward_row_g
);

#[inline(always)]
fn cross_entropy_backward_row_g<V: Vf32>(x: &[f32], lse: f32, scale: f32, smooth: f32, dx: &mut [f32]) {
    assert_eq!(x.len(), dx.len(), "kernel slices differ in length");
    let (l, s, c) = (V::splat(lse), V::splat(scale), V::splat(smooth));
    let n = x.len();
    let full = n - n % V::N;
    let mut i = 0;
    while i < full {
        // SAFETY: i + N ≤ n for both slices.
        unsafe {
            let p = math::exp(V::load(x.as_ptr().add(i)).sub(l));
            p.sub(c).mul(s).store(dx.as_mut_ptr().add(i));
        }
        i += V::N;
    }
    if i < n {
        let mut buf = [0.0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..]);
        // SAFETY: the buffer holds 16 ≥ N lanes.
        unsafe {
            let p = math::exp(V::load(buf.as_ptr()).sub(l));
            p.sub(c).mul(s).store(buf.as_mut_ptr());
        }
        dx[i..].copy_from_slice(&buf[..n - i]);
    }
}

simd_fn!(
    /// One row of the cross-entropy backward before the target's own term:
    /// dx = scale·(exp(x − lse) − smooth).
    pub(crate) fn cross_entropy_backward_row(x: &[f32], lse: f32, scale: f32, smooth: f32, dx: &mut [f32]) => cross_entropy_backward_row_g
);

/// The batch-norm step `x·scale + shift`: a multiply, then an add, as the
/// generic path rounds it.
#[derive(Clone, Copy)]
struct ScaleShift(f32, f32);

impl Lane1 for ScaleShift {
    #[inline(always)]
    fn call<V: Vf32>(self, x: V) -> V {
        x.mul(V::splat(self.0)).add(V::splat(self.1))
    }
}

#[inline(always)]
fn batch_norm_plane_g<V: Vf32>(x: &[f32], scale: f32, shift: f32, y: &mut [f32]) {
    map1::<V>(x, y, ScaleShift(scale, shift))
}

simd_fn!(
    /// One plane (a sample's channel) of batch norm: y = x·scale + shift.
    pub(crate) fn batch_norm_plane(x: &[f32], scale: f32, shift: f32, y: &mut [f32]) => batch_norm_plane_g
);

/// The per-channel coefficients of the batch-norm input gradient
/// dx = k·dy + a·(x − mean)·invstd + b (a = b = 0 in eval mode).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchNormGrad {
    /// weight·invstd.
    pub k: f32,
    /// The coefficient of x̂ (−k·Σdy·x̂ / count in training).
    pub a: f32,
    /// The constant term (−k·Σdy / count in training).
    pub b: f32,
    /// The channel's mean.
    pub mean: f32,
    /// The channel's 1/sqrt(var + eps).
    pub invstd: f32,
}

impl Lane2 for BatchNormGrad {
    /// The generic path's order of operations, without fused multiply-adds.
    #[inline(always)]
    fn call<V: Vf32>(self, x: V, dy: V) -> V {
        let xhat_term = V::splat(self.a)
            .mul(x.sub(V::splat(self.mean)))
            .mul(V::splat(self.invstd));
        V::splat(self.k).mul(dy).add(xhat_term).add(V::splat(self.b))
    }
}

#[inline(always)]
fn batch_norm_backward_plane_g<V: Vf32>(x: &[f32], dy: &[f32], coef: BatchNormGrad, dx: &mut [f32]) {
    map2::<V>(x, dy, dx, coef)
}

simd_fn!(
    /// One plane of the batch-norm input gradient (see [`BatchNormGrad`]).
    pub(crate) fn batch_norm_backward_plane(x: &[f32], dy: &[f32], coef: BatchNormGrad, dx: &mut [f32]) => batch_norm_backward_plane_g
);
