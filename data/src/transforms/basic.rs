//! Per-image transforms on [`Image`] (u8, HWC): normalize, crops (fixed,
//! centre, random with padding, random resized), horizontal flip and
//! bilinear resize. Random ones take the sample's [`Rng`].

use crate::{Array, Error, Image, Result, Rng};

/// `(x/255 − mean[c]) / std[c]` per channel, as a CHW f32 array
/// (torchvision's `ToTensor` + `Normalize`). Errors when `mean`/`std` do
/// not have one entry per channel or a std is 0.
pub fn normalize(img: &Image, mean: &[f32], std: &[f32]) -> Result<Array<f32>> {
    let c = img.channels();
    if mean.len() != c || std.len() != c || std.contains(&0.0) {
        return Err(Error::arg(
            "normalize",
            format!("{c} channels need {c} means and non-zero stds, got {mean:?} / {std:?}"),
        ));
    }
    let hw = img.height() * img.width();
    let mut data = vec![0f32; hw * c];
    for (p, px) in img.data().chunks_exact(c.max(1)).enumerate() {
        for (k, &v) in px.iter().enumerate() {
            data[k * hw + p] = (v as f32 / 255.0 - mean[k]) / std[k];
        }
    }
    Array::new(vec![c, img.height(), img.width()], data)
}

/// The `h × w` window at `(top, left)`; parts outside the image are `fill`.
/// Errors when the window is empty.
pub fn crop(img: &Image, top: isize, left: isize, h: usize, w: usize, fill: u8) -> Result<Image> {
    if h == 0 || w == 0 {
        return Err(Error::arg("crop", format!("crop size {h}x{w} is empty")));
    }
    let c = img.channels();
    let mut out = Image::filled(h, w, c, fill);
    let (ih, iw) = (img.height() as isize, img.width() as isize);
    let x0 = left.max(0);
    let x1 = (left + w as isize).min(iw);
    if x1 > x0 {
        let run = (x1 - x0) as usize * c;
        for y in 0..h as isize {
            let sy = top + y;
            if sy < 0 || sy >= ih {
                continue;
            }
            let src = ((sy * iw + x0) as usize) * c;
            let dst = ((y * w as isize + (x0 - left)) as usize) * c;
            out.data_mut()[dst..dst + run].copy_from_slice(&img.data()[src..src + run]);
        }
    }
    Ok(out)
}

/// The centre `h × w` window (torchvision's `CenterCrop`: top =
/// round((H − h)/2), zero padding when the window is larger than the image).
pub fn center_crop(img: &Image, h: usize, w: usize) -> Result<Image> {
    let start = |size: usize, want: usize| -> isize {
        if want > size {
            -(((want - size) / 2) as isize)
        } else {
            ((size - want) as f64 / 2.0).round_ties_even() as isize
        }
    };
    crop(img, start(img.height(), h), start(img.width(), w), h, w, 0)
}

/// How [`random_crop`] pads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// A constant value.
    Constant(u8),
    /// Mirror without repeating the edge (`reflect`, as airbench uses).
    Reflect,
}

/// Pads `p` pixels on every side. Errors when reflecting by `p` ≥ a side.
pub fn pad(img: &Image, p: usize, mode: Padding) -> Result<Image> {
    match mode {
        Padding::Constant(v) => crop(
            img,
            -(p as isize),
            -(p as isize),
            img.height() + 2 * p,
            img.width() + 2 * p,
            v,
        ),
        Padding::Reflect => {
            let (h, w, c) = (img.height(), img.width(), img.channels());
            if p >= h || p >= w {
                return Err(Error::arg(
                    "pad",
                    format!("reflect padding {p} needs a side longer than {p}, image is {h}x{w}"),
                ));
            }
            let reflect = |i: isize, n: usize| -> usize {
                let n = n as isize;
                let r = if i < 0 {
                    -i
                } else if i >= n {
                    2 * (n - 1) - i
                } else {
                    i
                };
                r as usize
            };
            let (oh, ow) = (h + 2 * p, w + 2 * p);
            let mut out = Image::filled(oh, ow, c, 0);
            for y in 0..oh {
                let sy = reflect(y as isize - p as isize, h);
                for x in 0..ow {
                    let sx = reflect(x as isize - p as isize, w);
                    let (d, s) = ((y * ow + x) * c, (sy * w + sx) * c);
                    out.data_mut()[d..d + c].copy_from_slice(&img.data()[s..s + c]);
                }
            }
            Ok(out)
        }
    }
}

/// torchvision's `RandomCrop(size, padding)`: pad by `padding`, then take
/// an `h × w` window at a uniform position. Errors when the padded image is
/// smaller than the window.
pub fn random_crop(
    img: &Image,
    h: usize,
    w: usize,
    padding: usize,
    mode: Padding,
    rng: &mut Rng,
) -> Result<Image> {
    let padded = if padding > 0 {
        pad(img, padding, mode)?
    } else {
        img.clone()
    };
    let (ph, pw) = (padded.height(), padded.width());
    if ph < h || pw < w {
        return Err(Error::arg(
            "random_crop",
            format!("crop {h}x{w} is larger than the padded image {ph}x{pw}"),
        ));
    }
    let top = rng.below((ph - h + 1) as u64) as isize;
    let left = rng.below((pw - w + 1) as u64) as isize;
    crop(&padded, top, left, h, w, 0)
}

/// The image mirrored left–right.
pub fn hflip(img: &Image) -> Image {
    let (w, c) = (img.width(), img.channels());
    let mut out = img.clone();
    if w == 0 || c == 0 {
        return out;
    }
    for (src, dst) in img
        .data()
        .chunks_exact(w * c)
        .zip(out.data_mut().chunks_exact_mut(w * c))
    {
        for x in 0..w {
            dst[x * c..(x + 1) * c].copy_from_slice(&src[(w - 1 - x) * c..(w - x) * c]);
        }
    }
    out
}

/// Mirrors left–right with probability `p`.
pub fn random_hflip(img: Image, p: f64, rng: &mut Rng) -> Image {
    if rng.bernoulli(p) {
        hflip(&img)
    } else {
        img
    }
}

/// Bilinear resize to `h × w` with half-pixel centres and edge clamping
/// (PyTorch's `interpolate(mode="bilinear", align_corners=False)`, no
/// antialiasing), rounded to the nearest u8. Errors on an empty image or size.
pub fn resize(img: &Image, h: usize, w: usize) -> Result<Image> {
    let (ih, iw, c) = (img.height(), img.width(), img.channels());
    if h == 0 || w == 0 || ih == 0 || iw == 0 {
        return Err(Error::arg(
            "resize",
            format!("cannot resize {ih}x{iw} to {h}x{w}"),
        ));
    }
    let taps = |out: usize, inp: usize| -> Vec<(usize, usize, f32)> {
        let scale = inp as f64 / out as f64;
        (0..out)
            .map(|o| {
                let s = ((o as f64 + 0.5) * scale - 0.5).max(0.0);
                let i0 = (s.floor() as usize).min(inp - 1);
                let i1 = (i0 + 1).min(inp - 1);
                (i0, i1, (s - i0 as f64) as f32)
            })
            .collect()
    };
    let (ty, tx) = (taps(h, ih), taps(w, iw));
    let src = img.data();
    let mut out = Image::filled(h, w, c, 0);
    let dst = out.data_mut();
    for (y, &(y0, y1, ly)) in ty.iter().enumerate() {
        for (x, &(x0, x1, lx)) in tx.iter().enumerate() {
            for k in 0..c {
                let p = |yy: usize, xx: usize| src[(yy * iw + xx) * c + k] as f32;
                let top = p(y0, x0) + lx * (p(y0, x1) - p(y0, x0));
                let bot = p(y1, x0) + lx * (p(y1, x1) - p(y1, x0));
                dst[(y * w + x) * c + k] = (top + ly * (bot - top)).round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    Ok(out)
}

/// The crop window `(top, left, h, w)` torchvision's `RandomResizedCrop`
/// picks: up to 10 tries of a uniform area fraction in `scale` and a
/// log-uniform aspect ratio in `ratio`, then a centre crop with the ratio
/// clamped.
pub fn random_resized_crop_params(
    height: usize,
    width: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> (usize, usize, usize, usize) {
    let area = (height * width) as f64;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform_range(scale.0, scale.1);
        let aspect = rng.uniform_range(lr0, lr1).exp();
        let w = (target * aspect).sqrt().round() as usize;
        let h = (target / aspect).sqrt().round() as usize;
        if 0 < w && w <= width && 0 < h && h <= height {
            let top = rng.below((height - h + 1) as u64) as usize;
            let left = rng.below((width - w + 1) as u64) as usize;
            return (top, left, h, w);
        }
    }
    let in_ratio = width as f64 / height.max(1) as f64;
    let (h, w) = if in_ratio < ratio.0.min(ratio.1) {
        (((width as f64) / ratio.0.min(ratio.1)).round() as usize, width)
    } else if in_ratio > ratio.0.max(ratio.1) {
        (height, ((height as f64) * ratio.0.max(ratio.1)).round() as usize)
    } else {
        (height, width)
    };
    let (h, w) = (h.clamp(1, height.max(1)), w.clamp(1, width.max(1)));
    ((height - h) / 2, (width - w) / 2, h, w)
}

/// torchvision's `RandomResizedCrop(size, scale, ratio)`: a random window
/// (see [`random_resized_crop_params`]) resized bilinearly to `h × w`.
/// Typical values: `scale = (0.08, 1.0)`, `ratio = (3/4, 4/3)`.
pub fn random_resized_crop(
    img: &Image,
    h: usize,
    w: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> Result<Image> {
    let (top, left, ch, cw) = random_resized_crop_params(img.height(), img.width(), scale, ratio, rng);
    resize(&crop(img, top as isize, left as isize, ch, cw, 0)?, h, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(h: usize, w: usize, c: usize) -> Image {
        Image::new(h, w, c, (0..h * w * c).map(|i| (i * 7 % 251) as u8).collect()).unwrap()
    }

    #[test]
    fn normalize_matches_formula() {
        let img = ramp(2, 3, 3);
        let a = normalize(&img, &[0.5, 0.4, 0.3], &[0.2, 0.25, 0.5]).unwrap();
        assert_eq!(a.shape, vec![3, 2, 3]);
        let got = a.data[2 * 6 + 4];
        let want = (img.at(1, 1, 2) as f32 / 255.0 - 0.3) / 0.5;
        assert!((got - want).abs() < 1e-6);
        assert!(normalize(&img, &[0.5], &[0.2]).is_err());
    }

    #[test]
    fn crops_flip_and_pad_against_naive_indexing() {
        let img = ramp(5, 6, 2);
        let c = crop(&img, -1, 2, 3, 5, 9).unwrap();
        for y in 0..3 {
            for x in 0..5 {
                let (sy, sx) = (y as isize - 1, x as isize + 2);
                let want = if sy < 0 || sx >= 6 {
                    9
                } else {
                    img.at(sy as usize, sx as usize, 1)
                };
                assert_eq!(c.at(y, x, 1), want, "({y},{x})");
            }
        }
        let f = hflip(&img);
        assert_eq!(f.at(3, 0, 1), img.at(3, 5, 1));
        assert_eq!(hflip(&f), img);
        let cc = center_crop(&img, 3, 3).unwrap();
        assert_eq!(cc.at(0, 0, 0), img.at(1, 2, 0)); // round(2/2)=1, round(3/2)=2 (ties to even)
        let r = pad(&img, 2, Padding::Reflect).unwrap();
        assert_eq!(
            (r.at(0, 0, 0), r.at(2, 2, 0), r.at(8, 9, 0)),
            (img.at(2, 2, 0), img.at(0, 0, 0), img.at(2, 3, 0))
        );
        let mut rng = Rng::new(0);
        for _ in 0..20 {
            let rc = random_crop(&img, 5, 6, 2, Padding::Constant(0), &mut rng).unwrap();
            assert_eq!(rc.shape(), [5, 6, 2]);
        }
        assert!(random_crop(&img, 10, 6, 2, Padding::Constant(0), &mut rng).is_err());
    }

    #[test]
    fn resize_against_f64_reference() {
        let img = ramp(7, 5, 3);
        for (h, w) in [(14, 10), (3, 2), (7, 5), (1, 1), (9, 4)] {
            let r = resize(&img, h, w).unwrap();
            for y in 0..h {
                for x in 0..w {
                    for k in 0..3 {
                        let sy = ((y as f64 + 0.5) * 7.0 / h as f64 - 0.5).max(0.0);
                        let sx = ((x as f64 + 0.5) * 5.0 / w as f64 - 0.5).max(0.0);
                        let (y0, x0) = (sy.floor() as usize, sx.floor() as usize);
                        let (y1, x1) = ((y0 + 1).min(6), (x0 + 1).min(4));
                        let (ly, lx) = (sy - y0 as f64, sx - x0 as f64);
                        let p = |a, b| img.at(a, b, k) as f64;
                        let v = (1.0 - ly) * ((1.0 - lx) * p(y0, x0) + lx * p(y0, x1))
                            + ly * ((1.0 - lx) * p(y1, x0) + lx * p(y1, x1));
                        assert!(
                            (r.at(y, x, k) as f64 - v).abs() <= 0.5 + 1e-3,
                            "{h}x{w} ({y},{x},{k})"
                        );
                    }
                }
            }
        }
        assert_eq!(resize(&img, 7, 5).unwrap(), img);
    }

    #[test]
    fn random_resized_crop_window_is_valid() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let (t, l, h, w) = random_resized_crop_params(40, 60, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            assert!(h >= 1 && w >= 1 && t + h <= 40 && l + w <= 60);
        }
        // Impossible ratio → centre fallback with the ratio clamped.
        assert_eq!(
            random_resized_crop_params(10, 100, (1.0, 1.0), (0.5, 2.0), &mut rng),
            (0, 40, 10, 20)
        );
        let out =
            random_resized_crop(&ramp(40, 60, 3), 16, 16, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng).unwrap();
        assert_eq!(out.shape(), [16, 16, 3]);
    }
}
