//! 2×2 max pooling at stride 2 over windows inside the plane (the pooling
//! of most CNNs), one output row at a time: AVX-512 for f32 and bf16 rows,
//! a scalar scan otherwise.
//!
//! Both give the result of scanning each window in order (ties keep the
//! earlier element, a NaN beats everything and the last NaN wins): a
//! pairwise scan of `a, b` and of `c, d`, then of the two winners, is the
//! scan of `a, b, c, d`. The winning element is copied as it is, never
//! rounded back from the math type.

use std::any::TypeId;

use crate::simd::{Level, LevelKind};
use crate::{bf16, FloatElement, FloatMath};

/// Output row by output row of a plane `src` (`w` columns): `out` and
/// `idx` hold `rows` rows of `ow` maxima and their plane indices, from
/// input rows `2·oy` and `2·oy + 1` (`2·ow ≤ w`), at `level` where it has
/// a kernel for `S`.
pub(super) fn max_plane_2x2<S: FloatElement>(
    level: Level,
    src: &[S],
    w: usize,
    ow: usize,
    out: &mut [S],
    idx: &mut [i64],
) {
    let rows = out.len() / ow.max(1);
    for oy in 0..rows {
        let r0 = &src[2 * oy * w..2 * oy * w + 2 * ow];
        let r1 = &src[(2 * oy + 1) * w..(2 * oy + 1) * w + 2 * ow];
        let o = &mut out[oy * ow..(oy + 1) * ow];
        let ids = &mut idx[oy * ow..(oy + 1) * ow];
        let base = 2 * oy * w;
        if !simd_row(level, r0, r1, o, ids, base, w) {
            scalar_row(r0, r1, o, ids, base, w);
        }
    }
}

/// One output row by the scan of each window.
fn scalar_row<S: FloatElement>(r0: &[S], r1: &[S], out: &mut [S], ids: &mut [i64], base: usize, w: usize) {
    let (base, w) = (base as i64, w as i64);
    for ((((o, id), p0), p1), x) in out
        .iter_mut()
        .zip(ids.iter_mut())
        .zip(r0.chunks_exact(2))
        .zip(r1.chunks_exact(2))
        .zip((0i64..).step_by(2))
    {
        let (a, b, c, d) = (p0[0].to_math(), p0[1].to_math(), p1[0].to_math(), p1[1].to_math());
        let t0 = b > a || b.is_nan();
        let (m0, e0, i0) = if t0 { (b, p0[1], 1) } else { (a, p0[0], 0) };
        let t1 = d > c || d.is_nan();
        let (m1, e1, i1) = if t1 { (d, p1[1], w + 1) } else { (c, p1[0], w) };
        let t = m1 > m0 || m1.is_nan();
        *o = if t { e1 } else { e0 };
        *id = base + x + if t { i1 } else { i0 };
    }
}

/// One output row by the AVX-512 kernel when `level` has it and `S` is f32
/// or bf16 (returns true), else nothing (false).
fn simd_row<S: 'static>(
    level: Level,
    r0: &[S],
    r1: &[S],
    out: &mut [S],
    ids: &mut [i64],
    base: usize,
    w: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == LevelKind::Avx512 && x86::has_bw() && base + 2 * w < i32::MAX as usize {
        let (base, w) = (base as i32, w as i32);
        if TypeId::of::<S>() == TypeId::of::<f32>() {
            // SAFETY: S is f32 (TypeId), the level proves AVX-512F/DQ and
            // `has_bw` AVX-512BW/VL; every index fits an i32 (checked).
            unsafe { x86::row_f32(retype(r0), retype(r1), retype_mut(out), ids, base, w) };
            return true;
        }
        if TypeId::of::<S>() == TypeId::of::<bf16>() {
            // SAFETY: as above, with S bf16.
            unsafe { x86::row_bf16(retype(r0), retype(r1), retype_mut(out), ids, base, w) };
            return true;
        }
    }
    let _ = (level, r0, r1, out, ids, base, w);
    false
}

/// # Safety
/// `S` is `T`.
#[cfg(target_arch = "x86_64")]
unsafe fn retype<S, T>(s: &[S]) -> &[T] {
    // SAFETY: the same type, by the caller's contract.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

/// # Safety
/// `S` is `T`.
#[cfg(target_arch = "x86_64")]
unsafe fn retype_mut<S, T>(s: &mut [S]) -> &mut [T] {
    // SAFETY: the same type, by the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use half::bf16;

    /// Whether the CPU has AVX-512BW and VL (16-bit masked loads and stores).
    pub fn has_bw() -> bool {
        static BW: OnceLock<bool> = OnceLock::new();
        *BW.get_or_init(|| is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl"))
    }

    /// [`super::scalar_row`] for f32, 16 outputs per step (masked at the end).
    ///
    /// # Safety
    /// AVX-512F/BW/VL; `r0`, `r1` hold `2·out.len()` elements, `ids` `out.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn row_f32(r0: &[f32], r1: &[f32], out: &mut [f32], ids: &mut [i64], base: i32, w: i32) {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        let n = out.len();
        for x0 in (0..n).step_by(16) {
            let k = (n - x0).min(16);
            let (m_lo, m_hi) = pair_masks(2 * k);
            // SAFETY: the masks keep the loads within 2·n elements, the
            // stores within n (the caller's contract).
            unsafe {
                let load = |r: &[f32]| {
                    let p = r.as_ptr().add(2 * x0);
                    let lo = _mm512_maskz_loadu_ps(m_lo, p);
                    let hi = _mm512_maskz_loadu_ps(m_hi, p.add(16));
                    (
                        _mm512_permutex2var_ps(lo, even, hi),
                        _mm512_permutex2var_ps(lo, odd, hi),
                    )
                };
                let ((a, b), (c, d)) = (load(r0), load(r1));
                let (m, id) = select(a, b, c, d, base + 2 * x0 as i32, w);
                let mask = (1u32 << k).wrapping_sub(1) as u16;
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(x0), mask, m);
                store_ids(ids.as_mut_ptr().add(x0), mask, id);
            }
        }
    }

    /// [`super::scalar_row`] for bf16: each 32-bit lane of a load holds an
    /// even element (low half) and an odd one (high half), widened exactly
    /// to f32 by a shift and a mask; the winner narrows back by a shift, so
    /// its bits, NaN payloads included, are the input's.
    ///
    /// # Safety
    /// As [`row_f32`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn row_bf16(r0: &[bf16], r1: &[bf16], out: &mut [bf16], ids: &mut [i64], base: i32, w: i32) {
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        let n = out.len();
        for x0 in (0..n).step_by(16) {
            let k = (n - x0).min(16);
            let pairs = (1u64 << (2 * k)).wrapping_sub(1) as u32;
            // SAFETY: as in `row_f32`, 16-bit lanes.
            unsafe {
                let load = |r: &[bf16]| {
                    let v = _mm512_maskz_loadu_epi16(pairs, r.as_ptr().add(2 * x0).cast());
                    (
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                        _mm512_castsi512_ps(_mm512_and_si512(v, high)),
                    )
                };
                let ((a, b), (c, d)) = (load(r0), load(r1));
                let (m, id) = select(a, b, c, d, base + 2 * x0 as i32, w);
                let mask = (1u32 << k).wrapping_sub(1) as u16;
                let bits = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(m)));
                _mm256_mask_storeu_epi16(out.as_mut_ptr().add(x0).cast(), mask, bits);
                store_ids(ids.as_mut_ptr().add(x0), mask, id);
            }
        }
    }

    /// Masks of the two 16-lane halves of `len ≤ 32` elements.
    fn pair_masks(len: usize) -> (u16, u16) {
        let all = (1u64 << len).wrapping_sub(1);
        (all as u16, (all >> 16) as u16)
    }

    /// The window scan over lanes: the maximum of `a, b` (row 0) and `c, d`
    /// (row 1) and its plane index, for outputs whose window starts at
    /// plane index `start + 2·lane`.
    #[inline(always)]
    unsafe fn select(a: __m512, b: __m512, c: __m512, d: __m512, start: i32, w: i32) -> (__m512, __m512i) {
        // `b > a || b is NaN`: ordered greater-than, or unordered with itself.
        let beats = |x: __m512, y: __m512| {
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, y) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x)
        };
        let t0 = beats(b, a);
        let m0 = _mm512_mask_blend_ps(t0, a, b);
        let t1 = beats(d, c);
        let m1 = _mm512_mask_blend_ps(t1, c, d);
        let t = beats(m1, m0);
        let one = _mm512_set1_epi32(1);
        let i0 = _mm512_maskz_mov_epi32(t0, one);
        let i1 = _mm512_add_epi32(_mm512_set1_epi32(w), _mm512_maskz_mov_epi32(t1, one));
        let lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let at = _mm512_add_epi32(_mm512_set1_epi32(start), lane2);
        (
            _mm512_mask_blend_ps(t, m0, m1),
            _mm512_add_epi32(at, _mm512_mask_blend_epi32(t, i0, i1)),
        )
    }

    /// Stores the first lanes (`mask`) of 16 i32 indices as i64.
    #[inline(always)]
    unsafe fn store_ids(dst: *mut i64, mask: u16, id: __m512i) {
        // SAFETY: the caller's lanes are in bounds.
        unsafe {
            let lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(id));
            let hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(id));
            _mm512_mask_storeu_epi64(dst, mask as u8, lo);
            _mm512_mask_storeu_epi64(dst.add(8), (mask >> 8) as u8, hi);
        }
    }
}
