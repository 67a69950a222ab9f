//! CPU Philox4x32-10, the reference the GPU generator (`philox.cu`) matches.
//! It is tessera-tensor's stream (its `Generator` and `rand`/`randn`), so a
//! seed gives the same numbers on the CPU and on any GPU.
//!
//! Stream convention: block `b` of the stream for `seed` is
//! `philox4x32_10([b low, b high, 0, 0], [seed low, seed high])`, and word
//! `w` is lane `w % 4` of block `w / 4`.
//! - A uniform reads one word: its top `digits` bits (the significand bits
//!   of the output type: 24 for f32, 11 for f16, 8 for bf16) scaled to
//!   [0, 1), exactly representable in the output type.
//! - Normals come in pairs, one counter block per pair: 53-bit uniforms
//!   `u1 = 1 - unit(words 0, 1)` and `u2 = unit(words 2, 3)`, Box-Muller in
//!   f64 (`r = sqrt(-2 ln u1)`, `θ = 2π u2`; `r cos θ` for the even element,
//!   `r sin θ` for the odd one), then `mean + std * z` in f64 rounded once
//!   to the output type. The kernel's `log`/`cos`/`sin` are CUDA's, whose
//!   last f64 bit may differ from libm's: after rounding to f32 or below
//!   the results agree except within an ulp of a rounding boundary.

/// One Philox4x32 block with 10 rounds (Salmon et al., SC'11).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for r in 0..10 {
        if r > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// Block `b` of the stream for `seed`.
pub fn block(seed: u64, b: u64) -> [u32; 4] {
    philox4x32_10(
        [b as u32, (b >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Word `w` of the stream for `seed`.
pub fn word(seed: u64, w: u64) -> u32 {
    block(seed, w / 4)[(w % 4) as usize]
}

/// The top `digits` bits (1 to 24) of a word as a float in [0, 1).
pub fn unit_f32(x: u32, digits: u32) -> f32 {
    (x >> (32 - digits)) as f32 * (-(digits as f32)).exp2()
}

/// `n` uniforms in [low, high) starting at stream word `offset`, each
/// `low + (high - low) * u` in f32 like the kernel, `u` with `digits` bits
/// (round the results to the output type: exact for [0, 1)).
pub fn uniform_f32(seed: u64, offset: u64, n: usize, low: f32, high: f32, digits: u32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| low + (high - low) * unit_f32(word(seed, offset + i), digits))
        .collect()
}

/// A 53-bit uniform in [0, 1) from two words, `hi` first.
fn unit_f64(hi: u32, lo: u32) -> f64 {
    ((((hi as u64) << 32) | lo as u64) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// `n` normals with `mean` and `std` from counter block `first` on, before
/// the final rounding to the output type (round each with `from_f64`).
pub fn normal(seed: u64, first: u64, n: usize, mean: f64, std: f64) -> Vec<f64> {
    (0..n as u64)
        .map(|i| {
            let b = block(seed, first.wrapping_add(i / 2));
            let u1 = 1.0 - unit_f64(b[0], b[1]);
            let u2 = unit_f64(b[2], b[3]);
            let r = (-2.0 * u1.ln()).sqrt();
            let theta = std::f64::consts::TAU * u2;
            mean + std
                * if i % 2 == 0 {
                    r * theta.cos()
                } else {
                    r * theta.sin()
                }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn offsets_continue_the_stream() {
        let all = uniform_f32(7, 0, 23, 0.0, 1.0, 24);
        assert_eq!(&all[5..], &uniform_f32(7, 5, 18, 0.0, 1.0, 24)[..]);
        assert!(all.iter().all(|&u| (0.0..1.0).contains(&u)));
        let n = normal(7, 0, 10, 0.0, 1.0);
        assert_eq!(&n[4..], &normal(7, 2, 6, 0.0, 1.0)[..]);
        let w = word(7, 9);
        assert_eq!(unit_f32(w, 8), (w >> 24) as f32 / 256.0);
        assert!(uniform_f32(7, 0, 100, 0.0, 1.0, 8).iter().all(|&u| u < 1.0));
    }

    #[test]
    fn normals_have_unit_moments() {
        let z = normal(11, 0, 20_000, 0.0, 1.0);
        let m = z.iter().sum::<f64>() / z.len() as f64;
        let v = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / z.len() as f64;
        assert!(m.abs() < 0.03 && (v - 1.0).abs() < 0.04, "mean {m} var {v}");
    }
}
