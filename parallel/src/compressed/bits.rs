//! Sign bits packed eight to a byte, most significant bit first (cupy's
//! `packbits` order, spec §4.1's decision): element `8k + j` is bit `7 − j`
//! of byte `k`.

/// Packs `bits` (length a multiple of 8) into bytes, MSB first. Returns
/// `None` when the length is not a multiple of 8.
pub fn packbits(bits: &[bool]) -> Option<Vec<u8>> {
    if !bits.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bits.chunks_exact(8)
            .map(|c| c.iter().fold(0u8, |b, &bit| (b << 1) | u8::from(bit)))
            .collect(),
    )
}

/// The bits of `bytes`, MSB first (`8 × bytes.len()` of them).
pub fn unpackbits(bytes: &[u8]) -> Vec<bool> {
    bytes
        .iter()
        .flat_map(|&b| (0..8).map(move |j| b & (0x80 >> j) != 0))
        .collect()
}

/// Packs the signs of `x` (`x ≥ 0` is a set bit, so `sign(0) = +1` as in
/// DeepSpeed) into `out`, which holds `x.len() / 8` bytes.
pub(crate) fn pack_signs(x: &[f32], out: &mut [u8]) {
    for (byte, c) in out.iter_mut().zip(x.chunks_exact(8)) {
        *byte = c.iter().fold(0u8, |b, &v| (b << 1) | u8::from(v >= 0.0));
    }
}

/// `±1` for bit `k` of `bytes`.
#[inline(always)]
pub(crate) fn sign_of(bytes: &[u8], k: usize) -> f32 {
    if bytes[k / 8] & (0x80 >> (k % 8)) != 0 {
        1.0
    } else {
        -1.0
    }
}
