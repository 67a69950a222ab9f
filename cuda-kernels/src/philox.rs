//! CPU Philox4x32-10, the reference the GPU generator (`philox.cu`) matches.
//!
//! Stream convention: word `w` of the stream for `seed` is lane `w % 4` of
//! `philox4x32_10([w/4 low, w/4 high, 0, 0], [seed low, seed high])`. A
//! uniform is the top 24 bits of a word scaled to [0, 1); a pair of normals
//! comes from words (2p, 2p+1) by Box-Muller (cos for the even word, sin for
//! the odd one). Uniforms match the GPU bit for bit; normals go through
//! `log`/`cos`/`sin`, whose last bits differ between libm and CUDA's.

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

/// Word `w` of the stream for `seed`.
pub fn word(seed: u64, w: u64) -> u32 {
    let b = w / 4;
    philox4x32_10(
        [b as u32, (b >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )[(w % 4) as usize]
}

/// Top 24 bits of a word as a float in [0, 1).
pub fn unit_f32(x: u32) -> f32 {
    (x >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// `n` uniforms in [low, high) starting at stream word `offset`, computed
/// as `low + (high - low) * u` in f32 like the kernel.
pub fn uniform_f32(seed: u64, offset: u64, n: usize, low: f32, high: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| low + (high - low) * unit_f32(word(seed, offset + i)))
        .collect()
}

/// `n` normals with `mean` and `std` starting at stream word `offset`.
pub fn normal_f32(seed: u64, offset: u64, n: usize, mean: f32, std: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let w = offset + i;
            let (a, b) = (word(seed, w & !1), word(seed, w | 1));
            let u1 = ((a >> 8) + 1) as f32 * (1.0 / 16_777_216.0);
            let u2 = unit_f32(b);
            let rad = (-2.0 * u1.ln()).sqrt();
            let th = std::f32::consts::TAU * u2;
            mean + std
                * if w.is_multiple_of(2) {
                    rad * th.cos()
                } else {
                    rad * th.sin()
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
        let all = uniform_f32(7, 0, 23, 0.0, 1.0);
        assert_eq!(&all[5..], &uniform_f32(7, 5, 18, 0.0, 1.0)[..]);
        assert!(all.iter().all(|&u| (0.0..1.0).contains(&u)));
        let n = normal_f32(7, 0, 10, 0.0, 1.0);
        assert_eq!(&n[3..], &normal_f32(7, 3, 7, 0.0, 1.0)[..]);
    }
}
