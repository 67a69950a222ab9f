//! Batched MixUp and CutMix (timm's `Mixup`, batch mode) on a whole batch
//! tensor `[B, ..., H, W]`, returning soft targets `[B, K]`.

use tessera_tensor::{with_float_dtype, Element, Tensor};

use crate::{Error, Result, Rng};

/// timm's `Mixup(mode='batch')` settings. One λ per batch: with probability
/// `prob` a mix is applied — CutMix with probability `switch_prob` when both
/// alphas are positive, else whichever is enabled — with λ ~ Beta(α, α).
/// Sample `i` is mixed with sample `B−1−i` (`x.flip(0)`).
#[derive(Debug, Clone)]
pub struct Mixup {
    /// MixUp's α (0 disables MixUp).
    pub mixup_alpha: f64,
    /// CutMix's α (0 disables CutMix).
    pub cutmix_alpha: f64,
    /// Probability of mixing a batch at all.
    pub prob: f64,
    /// Probability of CutMix rather than MixUp when both are enabled.
    pub switch_prob: f64,
    /// Label smoothing ε of the targets.
    pub label_smoothing: f64,
    /// Number of classes K.
    pub num_classes: usize,
    /// Recompute λ from the clipped CutMix box (`1 − area/(H·W)`).
    pub correct_lam: bool,
}

impl Default for Mixup {
    /// timm's defaults: MixUp α 1, no CutMix, prob 1, switch 0.5, ε 0.1,
    /// 1000 classes, λ corrected.
    fn default() -> Self {
        Mixup {
            mixup_alpha: 1.0,
            cutmix_alpha: 0.0,
            prob: 1.0,
            switch_prob: 0.5,
            label_smoothing: 0.1,
            num_classes: 1000,
            correct_lam: true,
        }
    }
}

/// What [`Mixup::apply`] did.
#[derive(Debug, Clone)]
pub struct MixOutput {
    /// The mixed images (same shape and dtype as the input).
    pub images: Tensor,
    /// Soft targets `[B, K]` (f32); each row sums to 1.
    pub targets: Tensor,
    /// The λ used for the targets (1 when nothing was mixed).
    pub lam: f64,
    /// The CutMix box `(y0, y1, x0, x1)`, half-open, when CutMix was applied.
    pub cut_box: Option<(usize, usize, usize, usize)>,
}

impl Mixup {
    /// Mixes `images` (`[B, ..., H, W]`, float for MixUp, any dtype for
    /// CutMix) and builds targets from `labels` (`[B]` i64). Errors when the
    /// shapes disagree, a label is outside `[0, K)`, MixUp meets a non-float
    /// dtype, or an α is negative.
    pub fn apply(&self, images: &Tensor, labels: &Tensor, rng: &mut Rng) -> Result<MixOutput> {
        const OP: &str = "Mixup::apply";
        if self.mixup_alpha < 0.0 || self.cutmix_alpha < 0.0 {
            return Err(Error::arg(OP, "alphas must be non-negative"));
        }
        let shape = images.shape().to_vec();
        if shape.len() < 3 || labels.shape() != [shape[0]] {
            return Err(Error::arg(
                OP,
                format!(
                    "images {shape:?} need [B, ..., H, W] and labels [B], got labels {:?}",
                    labels.shape()
                ),
            ));
        }
        let (b, h, w) = (shape[0], shape[shape.len() - 2], shape[shape.len() - 1]);
        let lab = labels.to_vec::<i64>()?;
        if let Some(&bad) = lab.iter().find(|&&l| l < 0 || l as usize >= self.num_classes) {
            return Err(Error::arg(
                OP,
                format!("label {bad} is outside [0, {})", self.num_classes),
            ));
        }

        let mut lam = 1.0;
        let mut cutmix = false;
        if rng.bernoulli(self.prob) && (self.mixup_alpha > 0.0 || self.cutmix_alpha > 0.0) {
            cutmix = if self.mixup_alpha > 0.0 && self.cutmix_alpha > 0.0 {
                rng.bernoulli(self.switch_prob)
            } else {
                self.cutmix_alpha > 0.0
            };
            let alpha = if cutmix {
                self.cutmix_alpha
            } else {
                self.mixup_alpha
            };
            lam = rng.beta(alpha, alpha);
        }
        let x = images.contiguous()?;
        let per = x.numel() / b.max(1);
        let (out, cut_box) = if lam >= 1.0 {
            (x, None)
        } else if cutmix {
            let bx = cut_box(h, w, lam, rng);
            if self.correct_lam {
                lam = 1.0 - ((bx.1 - bx.0) * (bx.3 - bx.2)) as f64 / (h * w) as f64;
            }
            let y = tessera_tensor::with_dtype!(x.dtype(), T => paste::<T>(&x, per, h, w, bx)?);
            (y, Some(bx))
        } else {
            let y = with_float_dtype!(x.dtype(), T => blend_flip::<T>(&x, per, lam)?,
                else return Err(Error::arg(OP, format!("MixUp needs a float tensor, got {}", x.dtype()))));
            (y, None)
        };
        let targets = soft_targets(&lab, self.num_classes, self.label_smoothing, lam)?;
        Ok(MixOutput {
            images: out,
            targets,
            lam,
            cut_box,
        })
    }
}

/// timm's `rand_bbox`: side ratio √(1−λ), centre uniform, clipped.
fn cut_box(h: usize, w: usize, lam: f64, rng: &mut Rng) -> (usize, usize, usize, usize) {
    let r = (1.0 - lam).sqrt();
    let (ch, cw) = ((h as f64 * r) as isize, (w as f64 * r) as isize);
    let cy = rng.below(h as u64) as isize;
    let cx = rng.below(w as u64) as isize;
    let clip = |v: isize, n: usize| v.clamp(0, n as isize) as usize;
    (
        clip(cy - ch / 2, h),
        clip(cy + ch / 2, h),
        clip(cx - cw / 2, w),
        clip(cx + cw / 2, w),
    )
}

/// `λ·x + (1−λ)·x.flip(0)`.
fn blend_flip<T: Element>(x: &Tensor, per: usize, lam: f64) -> Result<Tensor> {
    let src = x.as_slice::<T>()?;
    let b = x.shape()[0];
    Ok(Tensor::build::<T>("mixup", x.shape(), |out| {
        for i in 0..b {
            let (a, f) = (
                &src[i * per..(i + 1) * per],
                &src[(b - 1 - i) * per..(b - i) * per],
            );
            for (o, (&u, &v)) in out[i * per..(i + 1) * per].iter_mut().zip(a.iter().zip(f)) {
                *o = T::from_f64(lam * u.to_f64() + (1.0 - lam) * v.to_f64());
            }
        }
    })?)
}

/// `x` with box `(y0, y1, x0, x1)` of every plane replaced by `x.flip(0)`'s.
fn paste<T: Element>(
    x: &Tensor,
    per: usize,
    h: usize,
    w: usize,
    bx: (usize, usize, usize, usize),
) -> Result<Tensor> {
    let src = x.as_slice::<T>()?;
    let b = x.shape()[0];
    let plane = h * w;
    Ok(Tensor::build::<T>("cutmix", x.shape(), |out| {
        out.copy_from_slice(src);
        if plane == 0 {
            return;
        }
        for i in 0..b {
            let j = b - 1 - i;
            for p in 0..per / plane {
                for y in bx.0..bx.1 {
                    let (d, s) = (i * per + p * plane + y * w, j * per + p * plane + y * w);
                    out[d + bx.2..d + bx.3].copy_from_slice(&src[s + bx.2..s + bx.3]);
                }
            }
        }
    })?)
}

/// `λ·smooth(onehot(t)) + (1−λ)·smooth(onehot(t.flip(0)))` with
/// `off = ε/K`, `on = 1 − ε + off`.
fn soft_targets(labels: &[i64], k: usize, eps: f64, lam: f64) -> Result<Tensor> {
    let b = labels.len();
    let off = eps / k as f64;
    let on = 1.0 - eps + off;
    let mut t = vec![off as f32; b * k];
    for (i, &l) in labels.iter().enumerate() {
        let m = labels[b - 1 - i] as usize;
        let row = &mut t[i * k..(i + 1) * k];
        row[l as usize] += (lam * (on - off)) as f32;
        row[m] += ((1.0 - lam) * (on - off)) as f32;
    }
    Ok(Tensor::from_vec(t, &[b, k])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(b: usize, c: usize, h: usize, w: usize) -> (Tensor, Tensor) {
        // Sample i is constant i+1: pasted pixels are exactly the changed ones.
        let x: Vec<f32> = (0..b).flat_map(|i| vec![(i + 1) as f32; c * h * w]).collect();
        let y: Vec<i64> = (0..b as i64).map(|i| i % 5).collect();
        (
            Tensor::from_vec(x, &[b, c, h, w]).unwrap(),
            Tensor::from_vec(y, &[b]).unwrap(),
        )
    }

    #[test]
    fn mixup_blends_with_the_flipped_batch_and_targets_sum_to_one() {
        let (x, y) = batch(6, 2, 3, 4);
        let m = Mixup {
            num_classes: 5,
            ..Mixup::default()
        };
        for seed in 0..10 {
            let out = m.apply(&x, &y, &mut Rng::new(seed)).unwrap();
            let v = out.images.to_vec::<f32>().unwrap();
            for i in 0..6 {
                let want = out.lam * (i + 1) as f64 + (1.0 - out.lam) * (6 - i) as f64;
                assert!((v[i * 24] as f64 - want).abs() < 1e-5);
            }
            let t = out.targets.to_vec::<f32>().unwrap();
            for row in t.chunks(5) {
                assert!((row.iter().map(|&p| p as f64).sum::<f64>() - 1.0).abs() < 1e-6);
                assert!(row.iter().all(|&p| p >= 0.02 - 1e-7));
            }
            // Label of sample 0 (class 0) gets λ·0.9 + 0.02 (+ (1−λ)·0.9 if its partner shares it).
            let partner = 5 % 5;
            let expect0 = 0.02 + out.lam * 0.9 + if partner == 0 { (1.0 - out.lam) * 0.9 } else { 0.0 };
            assert!((t[0] as f64 - expect0).abs() < 1e-6);
        }
    }

    #[test]
    fn cutmix_pasted_area_matches_lambda() {
        let (x, y) = batch(4, 3, 16, 20);
        let m = Mixup {
            mixup_alpha: 0.0,
            cutmix_alpha: 1.0,
            num_classes: 5,
            label_smoothing: 0.0,
            ..Mixup::default()
        };
        let mut seen_box = 0;
        for seed in 0..30 {
            let out = m.apply(&x, &y, &mut Rng::new(seed)).unwrap();
            let v = out.images.to_vec::<f32>().unwrap();
            let orig = x.to_vec::<f32>().unwrap();
            for i in 0..4 {
                let plane = &v[i * 960..i * 960 + 320];
                let changed = plane.iter().zip(&orig[i * 960..]).filter(|(a, b)| a != b).count();
                assert!(plane.iter().all(|&p| p == (i + 1) as f32 || p == (4 - i) as f32));
                assert!(
                    (changed as f64 / 320.0 - (1.0 - out.lam)).abs() < 1e-12,
                    "seed {seed}"
                );
            }
            if let Some((y0, y1, x0, x1)) = out.cut_box {
                seen_box += 1;
                assert!((1.0 - out.lam - ((y1 - y0) * (x1 - x0)) as f64 / 320.0).abs() < 1e-12);
            }
            let t = out.targets.to_vec::<f32>().unwrap();
            assert!((t[0] as f64 - out.lam).abs() < 1e-6); // sample 0 (class 0) vs partner 3 (class 3)
        }
        assert!(seen_box > 20);
    }

    #[test]
    fn errors_and_no_op() {
        let (x, y) = batch(2, 1, 2, 2);
        let m = Mixup {
            num_classes: 2,
            prob: 0.0,
            ..Mixup::default()
        };
        let out = m.apply(&x, &y, &mut Rng::new(0)).unwrap();
        assert_eq!(out.lam, 1.0);
        assert_eq!(out.images.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        let bad = Tensor::from_vec(vec![0i64, 7], &[2]).unwrap();
        assert!(m.apply(&x, &bad, &mut Rng::new(0)).is_err());
        let u8x = Tensor::from_vec(vec![1u8; 8], &[2, 1, 2, 2]).unwrap();
        let mu = Mixup {
            num_classes: 2,
            ..Mixup::default()
        };
        assert!(mu.apply(&u8x, &y, &mut Rng::new(0)).is_err());
        assert!(mu
            .apply(&x, &Tensor::from_vec(vec![0i64], &[1]).unwrap(), &mut Rng::new(0))
            .is_err());
    }
}
