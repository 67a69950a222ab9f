//! The weight gradient of convolutions with few taps per output channel
//! (`cg·kh·kw` small, as in the 1-channel input layer of an image model).
//!
//! There the GEMM `grad_out[og, N·L] · colsᵀ[N·L, cg·kh·kw]` has a tiny
//! output and a depth of `N·OH·OW`: the packed GEMM would pad the taps to a
//! register tile and repack every element it uses once. Here the depth is
//! the vector dimension instead: each output channel's gradient row is
//! multiplied lane-wise with every unfolded tap row and accumulated in
//! `LANES` partial sums per weight, which are added across lanes only at
//! the end. Separate multiplies and adds in a fixed order, so the result is
//! the same on every instruction-set level and thread count.

use rayon::prelude::*;

use super::im2col::im2col_strided;
use super::Geom;
use crate::ops::math_view::math_slice;
use crate::ops::matmul::kernel::{GemmScalar, Isa};
use crate::FloatElement;

/// Taps (`cg·kh·kw`) up to which the weight gradient takes this path.
pub const MAX_TAPS: usize = 27;

/// Logical vector lanes of the partial sums (one AVX-512 register of f32).
pub(super) const LANES: usize = 16;

/// Taps accumulated together per pass over a gradient row (the register
/// tile: `TAP_BLOCK` vectors of partial sums).
const TAP_BLOCK: usize = 9;

/// Samples one task sums before the fixed-order reduction across tasks (a
/// constant, so the sum order never depends on the thread count).
const SAMPLES_PER_TASK: usize = 4;

/// The weight gradient `[O, cg·kh·kw]` (row-major) of a convolution with
/// geometry `g` from `go` (`grad_out`, `[N, O, OH·OW]` in the math type)
/// and the input `xs` (`[N, C, H, W]`), both in the storage type.
pub(super) fn weight_grad<S: FloatElement>(go: &[S], xs: &[S], g: &Geom) -> Vec<S::Math>
where
    S::Math: GemmScalar,
{
    let (kk, l) = (g.kk(), g.l());
    let lp = l.div_ceil(LANES) * LANES;
    let zero = <S::Math as crate::FloatMath>::ZERO;
    let isa = Isa::best();
    let task = |t: usize| -> Vec<[S::Math; LANES]> {
        let mut part = vec![[zero; LANES]; g.o * kk];
        // Unfolded taps with rows padded to whole vectors: the padding stays 0.
        let mut cols = vec![zero; kk * lp];
        let mut widened = Vec::new();
        for n in t * SAMPLES_PER_TASK..((t + 1) * SAMPLES_PER_TASK).min(g.n) {
            for grp in 0..g.groups {
                let xg = &xs[(n * g.c + grp * g.cg) * g.h * g.w..][..g.cg * g.h * g.w];
                im2col_strided(xg, g, 0..g.oh, &mut cols, lp, S::to_math);
                for oc in grp * g.og..(grp + 1) * g.og {
                    let row = math_slice(&go[(n * g.o + oc) * l..][..l], &mut widened);
                    for t0 in (0..kk).step_by(TAP_BLOCK) {
                        let taps = TAP_BLOCK.min(kk - t0);
                        let acc = &mut part[oc * kk + t0..oc * kk + t0 + taps];
                        row_dot(isa, row, &cols[t0 * lp..(t0 + taps) * lp], lp, acc);
                    }
                }
            }
        }
        part
    };
    let tasks = g.n.div_ceil(SAMPLES_PER_TASK);
    let parts: Vec<Vec<[S::Math; LANES]>> = (0..tasks).into_par_iter().map(task).collect();
    let mut sums = vec![[zero; LANES]; g.o * kk];
    for part in &parts {
        for (s, p) in sums.iter_mut().zip(part) {
            for (a, &b) in s.iter_mut().zip(p) {
                *a += b;
            }
        }
    }
    sums.iter().map(|s| s.iter().fold(zero, |a, &b| a + b)).collect()
}

/// `acc[t][w] += Σ_v row[v·LANES + w] · cols[t·lp + v·LANES + w]` for the
/// `acc.len()` (≤ [`TAP_BLOCK`]) tap rows of `cols`, whose rows are `lp ≥
/// row.len()` long and zero past `row.len()`.
pub(super) fn row_dot<T: GemmScalar>(isa: Isa, row: &[T], cols: &[T], lp: usize, acc: &mut [[T; LANES]]) {
    macro_rules! by_taps {
        ($acc:expr, $a:ident => $call:expr) => {
            match $acc.len() {
                1 => {
                    let $a: &mut [_; 1] = $acc.try_into().expect("1 tap");
                    $call
                }
                2 => {
                    let $a: &mut [_; 2] = $acc.try_into().expect("2 taps");
                    $call
                }
                3 => {
                    let $a: &mut [_; 3] = $acc.try_into().expect("3 taps");
                    $call
                }
                4 => {
                    let $a: &mut [_; 4] = $acc.try_into().expect("4 taps");
                    $call
                }
                5 => {
                    let $a: &mut [_; 5] = $acc.try_into().expect("5 taps");
                    $call
                }
                6 => {
                    let $a: &mut [_; 6] = $acc.try_into().expect("6 taps");
                    $call
                }
                7 => {
                    let $a: &mut [_; 7] = $acc.try_into().expect("7 taps");
                    $call
                }
                8 => {
                    let $a: &mut [_; 8] = $acc.try_into().expect("8 taps");
                    $call
                }
                9 => {
                    let $a: &mut [_; 9] = $acc.try_into().expect("9 taps");
                    $call
                }
                _ => unreachable!("tap blocks hold 1 to TAP_BLOCK taps"),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        let (row, cols) = (
            bytemuck::cast_slice::<T, f32>(row),
            bytemuck::cast_slice::<T, f32>(cols),
        );
        let acc = bytemuck::cast_slice_mut::<[T; LANES], [f32; LANES]>(acc);
        // SAFETY: `isa` is supported (it came from `Isa::best`).
        by_taps!(acc, a => unsafe { x86::f32_avx512(row, cols, lp, a) });
        return;
    }
    let _ = isa;
    by_taps!(acc, a => taps(row, cols, lp, a));
}

/// The body of [`row_dot`] for `N` taps, kept in `N` vector registers.
#[inline(always)]
fn taps<T: GemmScalar, const N: usize>(row: &[T], cols: &[T], lp: usize, acc: &mut [[T; LANES]; N]) {
    assert!(cols.len() >= N * lp && lp >= row.len() && lp.is_multiple_of(LANES));
    let mut a = *acc;
    let step = |a: &mut [[T; LANES]; N], g: &[T; LANES], off: usize| {
        for (t, at) in a.iter_mut().enumerate() {
            let c: &[T; LANES] = cols[t * lp + off..t * lp + off + LANES]
                .try_into()
                .expect("LANES elements");
            for w in 0..LANES {
                at[w] += g[w] * c[w];
            }
        }
    };
    let mut chunks = row.chunks_exact(LANES);
    let mut off = 0;
    for g in &mut chunks {
        step(&mut a, g.try_into().expect("LANES elements"), off);
        off += LANES;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut g = [<T as crate::FloatMath>::ZERO; LANES];
        g[..rest.len()].copy_from_slice(rest);
        step(&mut a, &g, off);
    }
    *acc = a;
}

/// [`taps`] for f32 in AVX-512 registers (the same operations in the same
/// order — a multiply, then an add — so the same bits).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::LANES;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn f32_avx512<const N: usize>(
        row: &[f32],
        cols: &[f32],
        lp: usize,
        acc: &mut [[f32; LANES]; N],
    ) {
        assert!(cols.len() >= N * lp && lp >= row.len() && lp.is_multiple_of(LANES) && LANES == 16);
        let full = row.len() / LANES;
        // SAFETY (all loads and stores): every vector read lies in `row`
        // (the tail through a mask) or in tap row t of `cols` (`lp` long,
        // a multiple of 16, at least `row.len()`); `acc` rows are 16 long.
        unsafe {
            let mut a: [__m512; N] = std::array::from_fn(|t| _mm512_loadu_ps(acc[t].as_ptr()));
            let (r, c) = (row.as_ptr(), cols.as_ptr());
            for v in 0..full {
                let g = _mm512_loadu_ps(r.add(v * LANES));
                for (t, at) in a.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(c.add(t * lp + v * LANES));
                    *at = _mm512_add_ps(*at, _mm512_mul_ps(g, x));
                }
            }
            let rest = row.len() - full * LANES;
            if rest > 0 {
                // Lanes past the row read 0, as the portable body's zero padding.
                let g = _mm512_maskz_loadu_ps(((1u32 << rest) - 1) as u16, r.add(full * LANES));
                for (t, at) in a.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(c.add(t * lp + full * LANES));
                    *at = _mm512_add_ps(*at, _mm512_mul_ps(g, x));
                }
            }
            for (t, at) in a.iter().enumerate() {
                _mm512_storeu_ps(acc[t].as_mut_ptr(), *at);
            }
        }
    }
}
