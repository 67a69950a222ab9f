//! Conversions between f32 and the 16-bit floats over contiguous slices, the
//! casts of mixed precision (autocast's weight and activation casts, the
//! bf16 GEMM's output): f32 ↔ bf16 at every SIMD level, f32 ↔ f16 through
//! the `half` crate's F16C conversion.
//!
//! The bf16 loops are branch-free scalar code that the wrappers of
//! [`simd_fn!`] compile with the level's target features, so the
//! auto-vectoriser turns them into full-width integer vector code (no
//! intrinsics to inline). Rounding is bit-for-bit that of `half::bf16`
//! (nearest even; a NaN stays a NaN with its sign and top payload bits, made
//! quiet), not `vcvtneps2bf16`'s, which flushes subnormals to zero.

use half::{bf16, f16};

use super::vector::Vf32;
use super::{simd_fn, Level};

simd_fn! {
    /// `dst[i] = bf16(src[i])`, rounded to nearest even. `dst` and `src`
    /// have the same length.
    pub(crate) fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) => f32_to_bf16_loop
}

simd_fn! {
    /// `dst[i] = f32(src[i])` (exact). `dst` and `src` have the same length.
    pub(crate) fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) => bf16_to_f32_loop
}

/// Whether [`convert_run`] converts `S` to `T`: f32 → bf16/f16 and back.
pub(crate) fn fast_pair<S: 'static, T: 'static>() -> bool {
    pair::<S, T>().is_some()
}

/// Converts a contiguous run of one of the [`fast_pair`]s (`src` and `dst`
/// of the same length); does nothing for any other pair.
pub(crate) fn convert_run<S: 'static, T: 'static>(src: &[S], dst: &mut [T]) {
    use half::slice::HalfFloatSliceExt;
    debug_assert_eq!(src.len(), dst.len());
    // SAFETY (each arm): `pair` compared the TypeIds, so the slices hold
    // exactly the types they are reinterpreted as.
    unsafe {
        match pair::<S, T>() {
            Some(Pair::F32ToBf16) => f32_to_bf16(Level::best(), retype(src), retype_mut(dst)),
            Some(Pair::Bf16ToF32) => bf16_to_f32(Level::best(), retype(src), retype_mut(dst)),
            Some(Pair::F32ToF16) => retype_mut::<T, f16>(dst).convert_from_f32_slice(retype(src)),
            Some(Pair::F16ToF32) => retype::<S, f16>(src).convert_to_f32_slice(retype_mut(dst)),
            None => {}
        }
    }
}

/// The conversions [`convert_run`] has a slice kernel for.
enum Pair {
    F32ToBf16,
    Bf16ToF32,
    F32ToF16,
    F16ToF32,
}

fn pair<S: 'static, T: 'static>() -> Option<Pair> {
    use std::any::TypeId;
    let (s, t) = (TypeId::of::<S>(), TypeId::of::<T>());
    let is = |a: TypeId, b: TypeId| s == a && t == b;
    let (f32_, bf16_, f16_) = (TypeId::of::<f32>(), TypeId::of::<bf16>(), TypeId::of::<f16>());
    if is(f32_, bf16_) {
        Some(Pair::F32ToBf16)
    } else if is(bf16_, f32_) {
        Some(Pair::Bf16ToF32)
    } else if is(f32_, f16_) {
        Some(Pair::F32ToF16)
    } else if is(f16_, f32_) {
        Some(Pair::F16ToF32)
    } else {
        None
    }
}

/// The bf16 bits of `x` as `half::bf16::from_f32` rounds it.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x40) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }
}

#[inline(always)]
fn f32_to_bf16_loop<V: Vf32>(src: &[f32], dst: &mut [bf16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(bf16_bits(x));
    }
}

#[inline(always)]
fn bf16_to_f32_loop<V: Vf32>(src: &[bf16], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(x.to_bits()) << 16);
    }
}

/// # Safety
/// `A` and `B` are the same type.
unsafe fn retype<A, B>(s: &[A]) -> &[B] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

/// # Safety
/// `A` and `B` are the same type.
unsafe fn retype_mut<A, B>(s: &mut [A]) -> &mut [B] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bit pattern class: signed zeros, subnormals (kept, unlike
    /// `vcvtneps2bf16`), ties to even both ways, overflow to infinity,
    /// infinities, signalling and quiet NaNs with payloads.
    fn specials() -> Vec<f32> {
        let bits = [
            0x0000_0000u32,
            0x8000_0000,
            0x0000_0001,
            0x8000_8000,
            0x0001_8000,
            0x007f_ffff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x3f80_7fff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xffc1_2345,
            0x7fbf_ffff,
        ];
        let mut v: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut state = 0x9e37_79b9u32;
        v.extend((0..4099).map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f32::from_bits(state)
        }));
        v
    }

    #[test]
    fn bf16_casts_match_half_at_every_level_and_length() {
        let src = specials();
        for level in Level::available() {
            for len in [0, 1, 15, 16, 17, 33, src.len()] {
                let mut out = vec![bf16::ZERO; len];
                f32_to_bf16(level, &src[..len], &mut out);
                for (x, y) in src.iter().zip(&out) {
                    assert_eq!(
                        y.to_bits(),
                        bf16::from_f32(*x).to_bits(),
                        "{x:e} at {}",
                        level.name()
                    );
                }
                let mut back = vec![0.0f32; len];
                bf16_to_f32(level, &out, &mut back);
                for (y, z) in out.iter().zip(&back) {
                    assert_eq!(z.to_bits(), y.to_f32().to_bits(), "{y} at {}", level.name());
                }
            }
        }
    }

    #[test]
    fn f16_runs_match_half_and_other_pairs_are_not_fast() {
        let src = specials();
        let mut h = vec![f16::ZERO; src.len()];
        assert!(fast_pair::<f32, f16>() && fast_pair::<f16, f32>());
        convert_run(&src, &mut h);
        for (x, y) in src.iter().zip(&h) {
            assert_eq!(y.to_bits(), f16::from_f32(*x).to_bits(), "{x:e}");
        }
        let mut back = vec![0.0f32; src.len()];
        convert_run(&h, &mut back);
        for (y, z) in h.iter().zip(&back) {
            assert_eq!(z.to_bits(), y.to_f32().to_bits());
        }
        assert!(!fast_pair::<f32, f64>() && !fast_pair::<bf16, f16>());
    }
}
