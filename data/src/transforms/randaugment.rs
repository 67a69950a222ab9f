//! RandAugment (Cubuk et al. 2019) on [`Image`]: `n` operations drawn
//! uniformly from a list, each at magnitude `m` out of 10.
//!
//! The default list is the paper's / torchvision's 14 operations (Identity,
//! ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color,
//! Contrast, Sharpness, Posterize, Solarize, AutoContrast, Equalize);
//! [`RandAugment::timm`] gives timm's `rand-m{m}-mstd0.5-inc1` list of 15
//! (Invert and SolarizeAdd instead of Identity, each op applied with p = 0.5,
//! Gaussian magnitude noise). With `level = m/10` the maximum strengths are
//! those of both libraries: shear 0.3, translate 0.45 of the side, rotate
//! 30°, enhance factor 1 ± 0.9·level, posterize to `8 − round(4·level)`
//! bits, solarize above `255·(1 − level)`, solarize-add `110·level`.
//! Geometric ops use nearest sampling about the image centre and `fill`
//! outside; colour ops follow PIL's `ImageOps` / `ImageEnhance`.

use crate::{Error, Image, Result, Rng};

/// One RandAugment operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AugOp {
    /// No change.
    Identity,
    /// Horizontal shear by up to 0.3.
    ShearX,
    /// Vertical shear by up to 0.3.
    ShearY,
    /// Horizontal shift by up to 0.45 of the width.
    TranslateX,
    /// Vertical shift by up to 0.45 of the height.
    TranslateY,
    /// Rotation by up to 30° (positive = counter-clockwise).
    Rotate,
    /// Brightness factor 1 ± 0.9·level.
    Brightness,
    /// Saturation factor 1 ± 0.9·level (identity on grey images).
    Color,
    /// Contrast factor 1 ± 0.9·level.
    Contrast,
    /// Sharpness factor 1 ± 0.9·level.
    Sharpness,
    /// Keep the top `8 − round(4·level)` bits.
    Posterize,
    /// Invert the values at or above `255·(1 − level)`.
    Solarize,
    /// Stretch each channel to the full range.
    AutoContrast,
    /// Equalize each channel's histogram.
    Equalize,
    /// Invert every value (timm).
    Invert,
    /// Add `110·level` to values below 128 (timm).
    SolarizeAdd,
}

impl AugOp {
    /// The 14 operations of the paper and torchvision.
    pub const STANDARD: [AugOp; 14] = [
        AugOp::Identity,
        AugOp::ShearX,
        AugOp::ShearY,
        AugOp::TranslateX,
        AugOp::TranslateY,
        AugOp::Rotate,
        AugOp::Brightness,
        AugOp::Color,
        AugOp::Contrast,
        AugOp::Sharpness,
        AugOp::Posterize,
        AugOp::Solarize,
        AugOp::AutoContrast,
        AugOp::Equalize,
    ];

    /// timm's 15 RandAugment operations.
    pub const TIMM: [AugOp; 15] = [
        AugOp::AutoContrast,
        AugOp::Equalize,
        AugOp::Invert,
        AugOp::Rotate,
        AugOp::Posterize,
        AugOp::Solarize,
        AugOp::SolarizeAdd,
        AugOp::Color,
        AugOp::Contrast,
        AugOp::Brightness,
        AugOp::Sharpness,
        AugOp::ShearX,
        AugOp::ShearY,
        AugOp::TranslateX,
        AugOp::TranslateY,
    ];

    /// Applies the op at `level ∈ [0, 1]`; `negate` flips the direction of
    /// signed ops (shear, translate, rotate, enhance factors).
    pub fn apply(self, img: &Image, level: f64, negate: bool, fill: u8) -> Image {
        let s = if negate { -1.0 } else { 1.0 };
        let (h, w) = (img.height() as f64, img.width() as f64);
        match self {
            AugOp::Identity => img.clone(),
            AugOp::ShearX => affine(img, [1.0, s * 0.3 * level, 0.0, 0.0, 1.0, 0.0], fill),
            AugOp::ShearY => affine(img, [1.0, 0.0, 0.0, s * 0.3 * level, 1.0, 0.0], fill),
            AugOp::TranslateX => affine(img, [1.0, 0.0, -s * 0.45 * level * w, 0.0, 1.0, 0.0], fill),
            AugOp::TranslateY => affine(img, [1.0, 0.0, 0.0, 0.0, 1.0, -s * 0.45 * level * h], fill),
            AugOp::Rotate => {
                let t = (s * 30.0 * level).to_radians();
                affine(img, [t.cos(), -t.sin(), 0.0, t.sin(), t.cos(), 0.0], fill)
            }
            AugOp::Brightness => blend(
                &Image::filled(img.height(), img.width(), img.channels(), 0),
                img,
                1.0 + s * 0.9 * level,
            ),
            AugOp::Color => blend(&grey(img), img, 1.0 + s * 0.9 * level),
            AugOp::Contrast => {
                let g = grey(img);
                let mean = if g.data().is_empty() {
                    0
                } else {
                    let chans = img.channels().max(1);
                    let sum: u64 = g.data().iter().step_by(chans).map(|&v| v as u64).sum();
                    ((sum as f64 / (g.data().len() / chans) as f64) + 0.5) as u8
                };
                blend(
                    &Image::filled(img.height(), img.width(), img.channels(), mean),
                    img,
                    1.0 + s * 0.9 * level,
                )
            }
            AugOp::Sharpness => blend(&smooth(img), img, 1.0 + s * 0.9 * level),
            AugOp::Posterize => {
                let bits = 8 - (4.0 * level).round() as u32;
                let mask = if bits == 0 { 0 } else { 0xFFu8 << (8 - bits) };
                lut(img, |v| v & mask)
            }
            AugOp::Solarize => {
                let thr = 255.0 * (1.0 - level);
                lut(img, |v| if v as f64 >= thr { 255 - v } else { v })
            }
            AugOp::SolarizeAdd => {
                let add = (110.0 * level) as u16;
                lut(img, |v| {
                    if v < 128 {
                        (v as u16 + add).min(255) as u8
                    } else {
                        v
                    }
                })
            }
            AugOp::Invert => lut(img, |v| 255 - v),
            AugOp::AutoContrast => per_channel(img, autocontrast_lut),
            AugOp::Equalize => per_channel(img, equalize_lut),
        }
    }
}

/// RandAugment settings; see the module documentation.
#[derive(Debug, Clone)]
pub struct RandAugment {
    /// Operations applied per image (N).
    pub num_ops: usize,
    /// Magnitude M in `[0, 10]`.
    pub magnitude: f64,
    /// Std of Gaussian noise added to M per op (0 = fixed).
    pub magnitude_std: f64,
    /// Probability that each chosen op is applied.
    pub prob: f64,
    /// The operations to choose from.
    pub ops: Vec<AugOp>,
    /// The value of pixels moved in from outside by geometric ops.
    pub fill: u8,
}

impl RandAugment {
    /// The paper's / torchvision's RandAugment: `n` of the 14 standard ops,
    /// magnitude `m ∈ [0, 10]`, always applied, fill 0. Errors when `m` is
    /// outside `[0, 10]`.
    pub fn new(n: usize, m: f64) -> Result<Self> {
        if !(0.0..=10.0).contains(&m) {
            return Err(Error::arg(
                "RandAugment::new",
                format!("magnitude {m} is not in [0, 10]"),
            ));
        }
        Ok(RandAugment {
            num_ops: n,
            magnitude: m,
            magnitude_std: 0.0,
            prob: 1.0,
            ops: AugOp::STANDARD.to_vec(),
            fill: 0,
        })
    }

    /// timm's `rand-m{m}-mstd0.5-inc1`: `n` of timm's 15 ops, each with
    /// p = 0.5, magnitude noise std 0.5, fill 128.
    pub fn timm(n: usize, m: f64) -> Result<Self> {
        Ok(RandAugment {
            magnitude_std: 0.5,
            prob: 0.5,
            ops: AugOp::TIMM.to_vec(),
            fill: 128,
            ..Self::new(n, m)?
        })
    }

    /// Applies `num_ops` ops drawn uniformly (with replacement) from `ops`.
    pub fn apply(&self, img: &Image, rng: &mut Rng) -> Image {
        let mut out = img.clone();
        for _ in 0..self.num_ops {
            let Some(&op) = self.ops.get(rng.below(self.ops.len() as u64) as usize) else {
                break;
            };
            if !rng.bernoulli(self.prob) {
                continue;
            }
            let mut m = self.magnitude;
            if self.magnitude_std > 0.0 {
                m = (m + self.magnitude_std * rng.normal()).clamp(0.0, 10.0);
            }
            let negate = rng.bernoulli(0.5);
            out = op.apply(&out, m / 10.0, negate, self.fill);
        }
        out
    }
}

/// Samples the image through the affine map `src = A·(dst − c) + c` (A as
/// `[a, b, tx, d, e, ty]`, c = centre), nearest neighbour, `fill` outside.
fn affine(img: &Image, m: [f64; 6], fill: u8) -> Image {
    let (h, w, ch) = (img.height(), img.width(), img.channels());
    let (cx, cy) = (w as f64 * 0.5, h as f64 * 0.5);
    let mut out = Image::filled(h, w, ch, fill);
    for y in 0..h {
        for x in 0..w {
            let (dx, dy) = (x as f64 + 0.5 - cx, y as f64 + 0.5 - cy);
            let sx = (m[0] * dx + m[1] * dy + m[2] + cx).floor();
            let sy = (m[3] * dx + m[4] * dy + m[5] + cy).floor();
            if sx >= 0.0 && sy >= 0.0 && (sx as usize) < w && (sy as usize) < h {
                let (s, d) = (((sy as usize) * w + sx as usize) * ch, (y * w + x) * ch);
                out.data_mut()[d..d + ch].copy_from_slice(&img.data()[s..s + ch]);
            }
        }
    }
    out
}

/// `degenerate + f·(img − degenerate)`, rounded and clamped (PIL's blend).
fn blend(degenerate: &Image, img: &Image, f: f64) -> Image {
    let mut out = img.clone();
    for (o, (&d, &v)) in out
        .data_mut()
        .iter_mut()
        .zip(degenerate.data().iter().zip(img.data()))
    {
        *o = (d as f64 + f * (v as f64 - d as f64)).round().clamp(0.0, 255.0) as u8;
    }
    out
}

/// The ITU-R 601 luma `(299R + 587G + 114B)/1000` in every channel (the
/// image itself when it is not RGB).
fn grey(img: &Image) -> Image {
    if img.channels() != 3 {
        return img.clone();
    }
    let mut out = img.clone();
    for px in out.data_mut().chunks_exact_mut(3) {
        let l = ((px[0] as u32 * 299 + px[1] as u32 * 587 + px[2] as u32 * 114 + 500) / 1000) as u8;
        px.fill(l);
    }
    out
}

/// PIL's SMOOTH filter `[[1,1,1],[1,5,1],[1,1,1]]/13` inside, border unchanged.
fn smooth(img: &Image) -> Image {
    let (h, w, c) = (img.height(), img.width(), img.channels());
    let mut out = img.clone();
    for y in 1..h.saturating_sub(1) {
        for x in 1..w.saturating_sub(1) {
            for k in 0..c {
                let mut acc = 0u32;
                for dy in 0..3 {
                    for dx in 0..3 {
                        let wgt = if dy == 1 && dx == 1 { 5 } else { 1 };
                        acc += wgt * img.at(y + dy - 1, x + dx - 1, k) as u32;
                    }
                }
                out.data_mut()[(y * w + x) * c + k] = ((acc + 6) / 13) as u8;
            }
        }
    }
    out
}

fn lut(img: &Image, f: impl Fn(u8) -> u8) -> Image {
    let table: Vec<u8> = (0..=255u8).map(f).collect();
    let mut out = img.clone();
    for v in out.data_mut() {
        *v = table[*v as usize];
    }
    out
}

/// Applies a per-channel lookup table built from that channel's histogram.
fn per_channel(img: &Image, make: fn(&[u64; 256]) -> [u8; 256]) -> Image {
    let c = img.channels();
    let mut out = img.clone();
    for k in 0..c {
        let mut hist = [0u64; 256];
        for px in img.data().chunks_exact(c) {
            hist[px[k] as usize] += 1;
        }
        let table = make(&hist);
        for px in out.data_mut().chunks_exact_mut(c) {
            px[k] = table[px[k] as usize];
        }
    }
    out
}

/// PIL `autocontrast(cutoff=0)`: map [lo, hi] linearly onto [0, 255].
fn autocontrast_lut(hist: &[u64; 256]) -> [u8; 256] {
    let mut t = [0u8; 256];
    let lo = hist.iter().position(|&n| n > 0).unwrap_or(0);
    let hi = hist.iter().rposition(|&n| n > 0).unwrap_or(255);
    for (i, v) in t.iter_mut().enumerate() {
        *v = if hi <= lo {
            i as u8
        } else {
            let scale = 255.0 / (hi - lo) as f64;
            ((i as f64 - lo as f64) * scale).round().clamp(0.0, 255.0) as u8
        };
    }
    t
}

/// PIL `equalize`: step = (total − count of the last non-empty bin) // 255;
/// value i maps to (step//2 + Σ_{j<i} hist[j]) // step.
fn equalize_lut(hist: &[u64; 256]) -> [u8; 256] {
    let mut t = [0u8; 256];
    for (i, v) in t.iter_mut().enumerate() {
        *v = i as u8;
    }
    let nonzero: Vec<u64> = hist.iter().copied().filter(|&n| n > 0).collect();
    if nonzero.len() <= 1 {
        return t;
    }
    let step = (nonzero.iter().sum::<u64>() - nonzero[nonzero.len() - 1]) / 255;
    if step == 0 {
        return t;
    }
    let mut n = step / 2;
    for (i, v) in t.iter_mut().enumerate() {
        *v = (n / step).min(255) as u8;
        n += hist[i];
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgb(h: usize, w: usize) -> Image {
        Image::new(
            h,
            w,
            3,
            (0..h * w * 3).map(|i| ((i * 37 + 11) % 200 + 20) as u8).collect(),
        )
        .unwrap()
    }

    #[test]
    fn geometric_ops_against_index_formulas() {
        let img = rgb(5, 5);
        // 90° counter-clockwise about the centre of an odd square: out[y][x] = in[x][W-1-y].
        let r = affine(&img, [0.0, -1.0, 0.0, 1.0, 0.0, 0.0], 0);
        for y in 0..5 {
            for x in 0..5 {
                assert_eq!(r.at(y, x, 1), img.at(x, 4 - y, 1));
            }
        }
        let t = AugOp::TranslateX.apply(&img, 1.0 / 0.45 * 2.0 / 5.0, false, 7); // shift right by 2
        for y in 0..5 {
            assert_eq!((t.at(y, 0, 0), t.at(y, 1, 2)), (7, 7));
            assert_eq!(t.at(y, 4, 0), img.at(y, 2, 0));
        }
        assert_eq!(AugOp::Rotate.apply(&img, 0.0, false, 0), img);
        assert_eq!(AugOp::ShearY.apply(&img, 0.0, true, 0), img);
    }

    #[test]
    fn colour_ops_match_pil_definitions() {
        let img = rgb(4, 6);
        assert_eq!(
            AugOp::Invert.apply(&AugOp::Invert.apply(&img, 0.0, false, 0), 0.0, false, 0),
            img
        );
        assert_eq!(AugOp::Brightness.apply(&img, 0.0, false, 0), img);
        assert_eq!(AugOp::Color.apply(&img, 0.0, false, 0), img);
        assert_eq!(AugOp::Sharpness.apply(&img, 0.0, false, 0), img);
        // Full negative brightness: factor 0.1.
        let b = AugOp::Brightness.apply(&img, 1.0, true, 0);
        assert_eq!(b.at(1, 1, 0), (img.at(1, 1, 0) as f64 * 0.1).round() as u8);
        let p = AugOp::Posterize.apply(&img, 1.0, false, 0);
        assert!(p.data().iter().zip(img.data()).all(|(&a, &b)| a == b & 0xF0));
        let s = AugOp::Solarize.apply(&img, 0.5, false, 0);
        assert!(s
            .data()
            .iter()
            .zip(img.data())
            .all(|(&a, &b)| a == if b as f64 >= 127.5 { 255 - b } else { b }));
        let ac = AugOp::AutoContrast.apply(&img, 0.0, false, 0);
        for k in 0..3 {
            let ch: Vec<u8> = ac.data().iter().skip(k).step_by(3).copied().collect();
            assert_eq!((*ch.iter().min().unwrap(), *ch.iter().max().unwrap()), (0, 255));
        }
        // Equalize of a two-level image (PIL): step = 6 // 255 = 0 → unchanged.
        let two = Image::new(2, 3, 1, vec![10, 10, 10, 200, 200, 200]).unwrap();
        assert_eq!(AugOp::Equalize.apply(&two, 0.0, false, 0), two);
        // A ramp with 256·4 pixels equalizes to itself (uniform histogram).
        let ramp = Image::new(32, 32, 1, (0..1024).map(|i| (i / 4) as u8).collect()).unwrap();
        let eq = AugOp::Equalize.apply(&ramp, 0.0, false, 0);
        assert!(eq
            .data()
            .iter()
            .zip(ramp.data())
            .all(|(&a, &b)| (a as i32 - b as i32).abs() <= 1));
    }

    #[test]
    fn rand_augment_is_seeded_and_keeps_shape() {
        let img = rgb(12, 10);
        let ra = RandAugment::new(2, 9.0).unwrap();
        let a = ra.apply(&img, &mut Rng::new(5));
        assert_eq!(a, ra.apply(&img, &mut Rng::new(5)));
        assert_eq!(a.shape(), img.shape());
        let distinct = (0..20)
            .map(|s| ra.apply(&img, &mut Rng::new(s)))
            .filter(|o| o != &img)
            .count();
        assert!(distinct > 10);
        assert!(RandAugment::new(2, 11.0).is_err());
        let t = RandAugment::timm(2, 9.0).unwrap();
        assert_eq!((t.ops.len(), t.prob, t.fill), (15, 0.5, 128));
        assert_eq!(
            RandAugment::new(0, 9.0).unwrap().apply(&img, &mut Rng::new(1)),
            img
        );
        for op in AugOp::STANDARD.iter().chain(&AugOp::TIMM) {
            let grey = Image::new(3, 4, 1, (0..12).map(|v| v * 20).collect()).unwrap();
            assert_eq!(op.apply(&grey, 0.7, true, 0).shape(), [3, 4, 1]);
        }
    }
}
