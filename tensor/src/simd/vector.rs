//! The f32 vector abstraction the SIMD kernels are written against, with one
//! implementation per level: AVX-512 (16 lanes), AVX2+FMA (8 lanes) and a
//! portable array of 8 lanes.
//!
//! The x86 types may only be used inside functions compiled for their
//! features and reached after run-time detection, i.e. inside
//! [`super::simd_fn!`] instantiations; the methods are `#[inline(always)]`
//! so they melt into those functions.

/// A vector of f32 lanes and the operations the kernels need.
pub(crate) trait Vf32: Copy {
    /// Lanes per vector.
    const N: usize;
    /// A per-lane condition.
    type Mask: Copy;
    /// Every lane `x`.
    fn splat(x: f32) -> Self;
    /// Loads `N` lanes from `p`.
    ///
    /// # Safety
    /// `p` is valid for reading `N` f32 (any alignment).
    unsafe fn load(p: *const f32) -> Self;
    /// Stores the lanes at `p`.
    ///
    /// # Safety
    /// `p` is valid for writing `N` f32 (any alignment).
    unsafe fn store(self, p: *mut f32);
    /// Lanewise `self + o`.
    fn add(self, o: Self) -> Self;
    /// Lanewise `self − o`.
    fn sub(self, o: Self) -> Self;
    /// Lanewise `self · o`.
    fn mul(self, o: Self) -> Self;
    /// Lanewise `self / o` (correctly rounded).
    fn div(self, o: Self) -> Self;
    /// `self · b + c`, fused where the level has FMA.
    fn fma(self, b: Self, c: Self) -> Self;
    /// The larger lane; `o` when either is NaN (x86 `max` semantics).
    fn max(self, o: Self) -> Self;
    /// The smaller lane; `o` when either is NaN (x86 `min` semantics).
    fn min(self, o: Self) -> Self;
    /// |self|.
    fn abs(self) -> Self;
    /// `self` with the sign bit of `s`.
    fn copysign(self, s: Self) -> Self;
    /// Rounded to the nearest integer, ties to even.
    fn round(self) -> Self;
    /// 2^self for integral lanes in [−126, 127].
    fn pow2i(self) -> Self;
    /// `self < o` (false when either is NaN).
    fn lt(self, o: Self) -> Self::Mask;
    /// True in NaN lanes.
    fn is_nan(self) -> Self::Mask;
    /// True when `m` holds in every lane.
    fn all(m: Self::Mask) -> bool;
    /// `t` where `m` holds, else `f`.
    fn select(m: Self::Mask, t: Self, f: Self) -> Self;
    /// (hi, lo) with hi = fl(self · o) and hi + lo = self · o exactly.
    fn mul_err(self, o: Self) -> (Self, Self);
}

/// Portable 8-lane vectors: plain arrays the compiler vectorises for the
/// target's baseline (SSE2, NEON).
pub(crate) mod portable {
    use super::Vf32;

    #[derive(Clone, Copy)]
    pub(crate) struct F32x8([f32; 8]);

    #[inline(always)]
    fn lanes(f: impl FnMut(usize) -> f32) -> F32x8 {
        F32x8(std::array::from_fn(f))
    }

    impl Vf32 for F32x8 {
        const N: usize = 8;
        type Mask = [bool; 8];
        #[inline(always)]
        fn splat(x: f32) -> Self {
            F32x8([x; 8])
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: the caller guarantees 8 readable f32.
            F32x8(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: the caller guarantees 8 writable f32.
            unsafe { p.cast::<[f32; 8]>().write_unaligned(self.0) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            lanes(|i| self.0[i] + o.0[i])
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            lanes(|i| self.0[i] - o.0[i])
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            lanes(|i| self.0[i] * o.0[i])
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            lanes(|i| self.0[i] / o.0[i])
        }
        #[inline(always)]
        fn fma(self, b: Self, c: Self) -> Self {
            // Unfused: a software fma would cost more than it buys here.
            lanes(|i| self.0[i] * b.0[i] + c.0[i])
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            lanes(|i| if self.0[i] > o.0[i] { self.0[i] } else { o.0[i] })
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            lanes(|i| if self.0[i] < o.0[i] { self.0[i] } else { o.0[i] })
        }
        #[inline(always)]
        fn abs(self) -> Self {
            lanes(|i| self.0[i].abs())
        }
        #[inline(always)]
        fn copysign(self, s: Self) -> Self {
            lanes(|i| self.0[i].copysign(s.0[i]))
        }
        #[inline(always)]
        fn round(self) -> Self {
            lanes(|i| self.0[i].round_ties_even())
        }
        #[inline(always)]
        fn pow2i(self) -> Self {
            lanes(|i| f32::from_bits(((self.0[i] as i32 + 127) << 23) as u32))
        }
        #[inline(always)]
        fn lt(self, o: Self) -> [bool; 8] {
            std::array::from_fn(|i| self.0[i] < o.0[i])
        }
        #[inline(always)]
        fn is_nan(self) -> [bool; 8] {
            std::array::from_fn(|i| self.0[i].is_nan())
        }
        #[inline(always)]
        fn all(m: [bool; 8]) -> bool {
            m.iter().all(|&b| b)
        }
        #[inline(always)]
        fn select(m: [bool; 8], t: Self, f: Self) -> Self {
            lanes(|i| if m[i] { t.0[i] } else { f.0[i] })
        }
        #[inline(always)]
        fn mul_err(self, o: Self) -> (Self, Self) {
            let hi = self.mul(o);
            // A product of two f32 is exact in f64.
            (
                hi,
                lanes(|i| (self.0[i] as f64 * o.0[i] as f64 - hi.0[i] as f64) as f32),
            )
        }
    }
}

/// AVX-512 and AVX2+FMA vectors.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::Vf32;

    /// 16 lanes in a zmm register.
    #[derive(Clone, Copy)]
    pub(crate) struct F32x16(__m512);

    /// 8 lanes in a ymm register.
    #[derive(Clone, Copy)]
    pub(crate) struct F32x8(__m256);

    // SAFETY (every `unsafe` block below): these types are used only inside
    // functions compiled for their features and called after detection (see
    // the module docs), so the intrinsics are available.

    impl Vf32 for F32x16 {
        const N: usize = 16;
        type Mask = __mmask16;
        #[inline(always)]
        fn splat(x: f32) -> Self {
            F32x16(unsafe { _mm512_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            F32x16(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_div_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn fma(self, b: Self, c: Self) -> Self {
            F32x16(unsafe { _mm512_fmadd_ps(self.0, b.0, c.0) })
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_max_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            F32x16(unsafe { _mm512_min_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn abs(self) -> Self {
            F32x16(unsafe { _mm512_abs_ps(self.0) })
        }
        #[inline(always)]
        fn copysign(self, s: Self) -> Self {
            unsafe {
                let sign = _mm512_set1_ps(-0.0);
                F32x16(_mm512_or_ps(
                    _mm512_andnot_ps(sign, self.0),
                    _mm512_and_ps(sign, s.0),
                ))
            }
        }
        #[inline(always)]
        fn round(self) -> Self {
            F32x16(unsafe {
                _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0)
            })
        }
        #[inline(always)]
        fn pow2i(self) -> Self {
            unsafe {
                let n = _mm512_add_epi32(_mm512_cvtps_epi32(self.0), _mm512_set1_epi32(127));
                F32x16(_mm512_castsi512_ps(_mm512_slli_epi32::<23>(n)))
            }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __mmask16 {
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn is_nan(self) -> __mmask16 {
            unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.0, self.0) }
        }
        #[inline(always)]
        fn all(m: __mmask16) -> bool {
            m == u16::MAX
        }
        #[inline(always)]
        fn select(m: __mmask16, t: Self, f: Self) -> Self {
            F32x16(unsafe { _mm512_mask_blend_ps(m, f.0, t.0) })
        }
        #[inline(always)]
        fn mul_err(self, o: Self) -> (Self, Self) {
            let hi = self.mul(o);
            (hi, F32x16(unsafe { _mm512_fmsub_ps(self.0, o.0, hi.0) }))
        }
    }

    impl Vf32 for F32x8 {
        const N: usize = 8;
        type Mask = __m256;
        #[inline(always)]
        fn splat(x: f32) -> Self {
            F32x8(unsafe { _mm256_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            F32x8(unsafe { _mm256_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_div_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn fma(self, b: Self, c: Self) -> Self {
            F32x8(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_max_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            F32x8(unsafe { _mm256_min_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn abs(self) -> Self {
            F32x8(unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0) })
        }
        #[inline(always)]
        fn copysign(self, s: Self) -> Self {
            unsafe {
                let sign = _mm256_set1_ps(-0.0);
                F32x8(_mm256_or_ps(
                    _mm256_andnot_ps(sign, self.0),
                    _mm256_and_ps(sign, s.0),
                ))
            }
        }
        #[inline(always)]
        fn round(self) -> Self {
            F32x8(unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0) })
        }
        #[inline(always)]
        fn pow2i(self) -> Self {
            unsafe {
                let n = _mm256_add_epi32(_mm256_cvtps_epi32(self.0), _mm256_set1_epi32(127));
                F32x8(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(n)))
            }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __m256 {
            unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn is_nan(self) -> __m256 {
            unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(self.0, self.0) }
        }
        #[inline(always)]
        fn all(m: __m256) -> bool {
            unsafe { _mm256_movemask_ps(m) == 0xff }
        }
        #[inline(always)]
        fn select(m: __m256, t: Self, f: Self) -> Self {
            F32x8(unsafe { _mm256_blendv_ps(f.0, t.0, m) })
        }
        #[inline(always)]
        fn mul_err(self, o: Self) -> (Self, Self) {
            let hi = self.mul(o);
            (hi, F32x8(unsafe { _mm256_fmsub_ps(self.0, o.0, hi.0) }))
        }
    }
}
