//! The register transpose that packs 8 contiguous rows into a row-interleaved
//! panel: unit `(p, i)` — element `p` of row `i` — at `out[p*ld + i]`, in
//! 32-bit units (an f32, or a pair of bf16). The f32 packers (8-row panels
//! of a row-major A, 8-column groups of a transposed B) and the bf16 pair
//! packer use it: where scalar code spends a load and a strided store per
//! unit, it spends one load per row and one store per 8 units.

/// Transposes the first `units / 16 * 16` units of each of the 8 `rows`
/// into `out` (unit `(p, i)` at `out[p*ld + i]`, `ld ≥ 8`) when the CPU has
/// AVX-512F, and returns how many units per row it wrote (0 without
/// AVX-512F): the caller packs the rest.
///
/// # Safety
/// Each row points to at least `units` readable 32-bit units (no alignment
/// needed), and `out` to writable units that no row overlaps, at least
/// `(units - 1) * ld + 8` of them (the units `(p, i)` reach) when `units > 0`.
pub(super) unsafe fn transpose_rows_8(
    rows: [*const u32; 8],
    units: usize,
    out: *mut u32,
    ld: usize,
) -> usize {
    debug_assert!(ld >= 8);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        let done = units / 16 * 16;
        // SAFETY: the caller's contract, and the CPU has AVX-512F.
        unsafe { x86::transpose_8x16(rows, done, out, ld) };
        return done;
    }
    let _ = (rows, units, out, ld);
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::transpose_rows_8`] for `units` a multiple of 16: per block
    /// of 16 units, one load per row and an 8×16 transpose in registers
    /// (32-bit then 64-bit interleaves, then a two-source permute of
    /// 128-bit lanes).
    ///
    /// # Safety
    /// As `transpose_rows_8`, with `units` a multiple of 16, on a CPU with
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn transpose_8x16(rows: [*const u32; 8], units: usize, out: *mut u32, ld: usize) {
        // Qwords [a.l0, b.l0, a.l1, b.l1] and [a.l2, b.l2, a.l3, b.l3] of
        // two vectors a, b (128-bit lanes l).
        let lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        let hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        for q0 in (0..units).step_by(16) {
            // SAFETY (loads and stores): in bounds by the caller's contract.
            let r: [__m512i; 8] =
                std::array::from_fn(|i| unsafe { _mm512_loadu_si512(rows[i].add(q0).cast()) });
            // t[2k], t[2k+1]: rows 2k, 2k+1 interleaved, units 4l.. and 4l+2..
            let t: [__m512i; 8] = std::array::from_fn(|j| {
                let (a, b) = (r[j / 2 * 2], r[j / 2 * 2 + 1]);
                if j % 2 == 0 {
                    _mm512_unpacklo_epi32(a, b)
                } else {
                    _mm512_unpackhi_epi32(a, b)
                }
            });
            // u[o] (u[4 + o]): rows 0–3 (4–7) of unit 4l + o in lane l.
            let u: [__m512i; 8] = std::array::from_fn(|j| {
                let (half, o) = (j / 4, j % 4);
                let (a, b) = (t[4 * half + o / 2], t[4 * half + 2 + o / 2]);
                if o % 2 == 0 {
                    _mm512_unpacklo_epi64(a, b)
                } else {
                    _mm512_unpackhi_epi64(a, b)
                }
            });
            for o in 0..4 {
                let x = _mm512_permutex2var_epi64(u[o], lo, u[4 + o]);
                let y = _mm512_permutex2var_epi64(u[o], hi, u[4 + o]);
                let dst = |q: usize| unsafe { out.add((q0 + q) * ld).cast::<__m256i>() };
                unsafe {
                    _mm256_storeu_si256(dst(o), _mm512_castsi512_si256(x));
                    _mm256_storeu_si256(dst(4 + o), _mm512_extracti64x4_epi64::<1>(x));
                    _mm256_storeu_si256(dst(8 + o), _mm512_castsi512_si256(y));
                    _mm256_storeu_si256(dst(12 + o), _mm512_extracti64x4_epi64::<1>(y));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transpose_rows_8;

    #[test]
    fn transpose_matches_the_scalar_scatter() {
        for (units, ld) in [
            (0, 8),
            (1, 8),
            (15, 8),
            (16, 8),
            (17, 8),
            (31, 8),
            (32, 8),
            (48, 8),
            (100, 8),
            (33, 32),
            (64, 13),
        ] {
            let rows: Vec<Vec<u32>> = (0..8u32)
                .map(|i| (0..units as u32).map(|p| i << 16 | p).collect())
                .collect();
            let mut out = vec![u32::MAX; units * ld];
            let ptrs = std::array::from_fn(|i| rows[i].as_ptr());
            // SAFETY: every row holds `units` units and `out` ld·units.
            let done = unsafe { transpose_rows_8(ptrs, units, out.as_mut_ptr(), ld) };
            assert!(done <= units && done % 16 == 0, "units {units}: done {done}");
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512f") {
                assert_eq!(done, units / 16 * 16, "units {units}");
            }
            for (e, &got) in out.iter().enumerate() {
                let (p, i) = (e / ld, e % ld);
                let want = if p < done && i < 8 { rows[i][p] } else { u32::MAX };
                assert_eq!(got, want, "units {units}, ld {ld}, unit {p}, row {i}");
            }
        }
    }
}
