//! Pooling against naive window loops, adjoint identities and finite differences.

use proptest::prelude::*;

use super::{adaptive_avg_pool2d_backward, avg_pool2d_backward, max_pool2d_backward, Pool2dParams};
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{DType, Tensor};

/// Output size by enumeration: windows that fit the padded input (floor
/// mode), or that start before its end and inside input-or-left-padding (ceil mode).
fn naive_out(size: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let padded = size + 2 * p;
    let span = d * (k - 1) + 1;
    (0..padded + s)
        .filter(|&o| {
            let start = o * s;
            if ceil {
                start + span < padded + s && start < size + p
            } else {
                start + span <= padded
            }
        })
        .count()
}

struct Naive {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    p: Pool2dParams,
}

impl Naive {
    /// The input positions of the taps of window (oy, ox), with whether each is in the input.
    fn taps(&self, oy: usize, ox: usize, dil: bool) -> Vec<(isize, isize)> {
        let mut v = Vec::new();
        let d = if dil { self.p.dilation } else { [1, 1] };
        for ki in 0..self.p.kernel[0] {
            for kj in 0..self.p.kernel[1] {
                v.push((
                    (oy * self.p.stride[0] + ki * d[0]) as isize - self.p.padding[0] as isize,
                    (ox * self.p.stride[1] + kj * d[1]) as isize - self.p.padding[1] as isize,
                ));
            }
        }
        v
    }

    fn inside(&self, (y, x): (isize, isize)) -> bool {
        y >= 0 && x >= 0 && (y as usize) < self.h && (x as usize) < self.w
    }

    /// Maxima and their plane indices; `None` when a window meets no input element.
    fn max(&self, x: &[f64]) -> Option<(Vec<f64>, Vec<i64>)> {
        let (mut vals, mut idx) = (Vec::new(), Vec::new());
        for pl in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let mut best: Option<(f64, usize)> = None;
                    for t in self.taps(oy, ox, true).into_iter().filter(|&t| self.inside(t)) {
                        let i = t.0 as usize * self.w + t.1 as usize;
                        let v = x[pl * self.h * self.w + i];
                        if best.is_none_or(|(b, _)| v > b) {
                            best = Some((v, i));
                        }
                    }
                    let (v, i) = best?;
                    vals.push(v);
                    idx.push(i as i64);
                }
            }
        }
        Some((vals, idx))
    }

    fn avg(&self, x: &[f64]) -> Vec<f64> {
        let mut out = Vec::new();
        for pl in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let taps = self.taps(oy, ox, false);
                    let (ph, pw) = (self.p.padding[0] as isize, self.p.padding[1] as isize);
                    let in_padded =
                        |&(y, xx): &(isize, isize)| y < self.h as isize + ph && xx < self.w as isize + pw;
                    let total = taps.iter().filter(|t| in_padded(t)).count();
                    let valid: Vec<_> = taps.iter().copied().filter(|&t| self.inside(t)).collect();
                    let sum: f64 = valid
                        .iter()
                        .map(|&(y, xx)| x[pl * self.h * self.w + y as usize * self.w + xx as usize])
                        .sum();
                    let div = match self.p.divisor_override {
                        Some(d) => d,
                        None if self.p.count_include_pad => total,
                        None => valid.len(),
                    };
                    out.push(if valid.is_empty() { 0.0 } else { sum / div as f64 });
                }
            }
        }
        out
    }
}

fn close(got: &[f64], want: &[f64], tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {}: got {}, want {}",
            i,
            g,
            w
        );
    }
    Ok(())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn params() -> impl Strategy<Value = Pool2dParams> {
    (
        1usize..4,
        1usize..4,
        1usize..4,
        1usize..4,
        0usize..2,
        0usize..2,
        1usize..3,
        1usize..3,
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..5),
    )
        .prop_map(
            |(kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode, count_include_pad, divisor_override)| Pool2dParams {
                kernel: [kh, kw],
                stride: [sh, sw],
                padding: [ph.min(kh / 2), pw.min(kw / 2)],
                dilation: [dh, dw],
                ceil_mode,
                count_include_pad,
                divisor_override,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn pooling_matches_naive(p in params(), n in 1usize..3, c in 1usize..3, h in 1usize..9, w in 1usize..9,
                             seed in 0u64..1000, sel in 0usize..5, f32_path in any::<bool>()) {
        let shape = [n, c, h, w];
        let xv = rand_f64(seed, n * c * h * w);
        let (dtype, tol) = if f32_path { (DType::F32, 1e-6) } else { (DType::F64, 1e-13) };
        let x = crate::with_float_dtype!(dtype, T => { let l = layouts_of::<T>(&xv, &shape); l[sel % l.len()].clone() }, else unreachable!());
        let xr = values_f64(&x);
        let oh = naive_out(h, p.kernel[0], p.stride[0], p.padding[0], p.dilation[0], p.ceil_mode);
        let ow = naive_out(w, p.kernel[1], p.stride[1], p.padding[1], p.dilation[1], p.ceil_mode);
        let nv = Naive { planes: n * c, h, w, oh, ow, p };
        let out = x.max_pool2d_with_indices(&p);
        let naive = if oh == 0 || ow == 0 { None } else { nv.max(&xr) };
        let Some((wv, wi)) = naive else {
            prop_assert!(out.is_err());
            return Ok(());
        };
        let (vals, idx) = out.unwrap();
        prop_assert_eq!(vals.shape(), &[n, c, oh, ow]);
        close(&values_f64(&vals), &wv, 0.0)?;
        prop_assert_eq!(idx.to_vec::<i64>().unwrap(), wi.clone());
        // Backward scatters through the indices.
        let gv = rand_f64(seed + 1, n * c * oh * ow);
        let go = tensor_of::<f64>(&gv, &[n, c, oh, ow]);
        let gi = max_pool2d_backward(&go, &idx, &shape).unwrap();
        let mut want = vec![0.0; xv.len()];
        for (k, (&g, &i)) in gv.iter().zip(&wi).enumerate() {
            want[k / (oh * ow) * h * w + i as usize] += g;
        }
        close(&values_f64(&gi), &want, 1e-13)?;

        // Average pooling: dilation must be 1.
        let pa = Pool2dParams { dilation: [1, 1], ..p };
        let oh = naive_out(h, p.kernel[0], p.stride[0], p.padding[0], 1, p.ceil_mode);
        let ow = naive_out(w, p.kernel[1], p.stride[1], p.padding[1], 1, p.ceil_mode);
        prop_assert!(p.dilation == [1, 1] || x.avg_pool2d(&p).is_err());
        let nv = Naive { oh, ow, p: pa, ..nv };
        let y = x.avg_pool2d(&pa).unwrap();
        close(&values_f64(&y), &nv.avg(&xr), tol)?;
        // The backward is the adjoint of the (linear) forward.
        let gv = rand_f64(seed + 2, n * c * oh * ow);
        let gi = avg_pool2d_backward(&tensor_of::<f64>(&gv, &[n, c, oh, ow]), &shape, &pa).unwrap();
        let y64 = tensor_of::<f64>(&xr, &shape).avg_pool2d(&pa).unwrap();
        let (lhs, rhs) = (dot(&values_f64(&y64), &gv), dot(&xr, &values_f64(&gi)));
        prop_assert!((lhs - rhs).abs() < 1e-12, "adjoint: {} vs {}", lhs, rhs);
    }

    #[test]
    fn adaptive_matches_naive(c in 1usize..4, h in 1usize..12, w in 1usize..12, oh in 1usize..8, ow in 1usize..8,
                              seed in 0u64..1000, sel in 0usize..5) {
        let shape = [c, h, w];
        let xv = rand_f64(seed, c * h * w);
        let l = layouts_of::<f64>(&xv, &shape);
        let y = l[sel % l.len()].adaptive_avg_pool2d([oh, ow]).unwrap();
        prop_assert_eq!(y.shape(), &[c, oh, ow]);
        let win = |o: usize, out: usize, size: usize| {
            ((o * size) as f64 / out as f64).floor() as usize..(((o + 1) * size) as f64 / out as f64).ceil() as usize
        };
        let mut want = Vec::new();
        for pl in 0..c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (ys, xs) = (win(oy, oh, h), win(ox, ow, w));
                    let cnt = (ys.len() * xs.len()) as f64;
                    want.push(ys.flat_map(|y| xs.clone().map(move |x| (y, x))).map(|(y, x)| xv[pl * h * w + y * w + x]).sum::<f64>() / cnt);
                }
            }
        }
        close(&values_f64(&y), &want, 1e-13)?;
        let gv = rand_f64(seed + 1, c * oh * ow);
        let gi = adaptive_avg_pool2d_backward(&tensor_of::<f64>(&gv, &[c, oh, ow]), &shape).unwrap();
        let (lhs, rhs) = (dot(&values_f64(&y), &gv), dot(&xv, &values_f64(&gi)));
        prop_assert!((lhs - rhs).abs() < 1e-12, "adjoint: {} vs {}", lhs, rhs);
    }
}

#[test]
fn max_pool_finite_differences_and_nan() {
    let shape = [1, 2, 6, 5];
    let xv = rand_f64(5, 60);
    let p = Pool2dParams::new(3).stride(2).padding(1).ceil_mode(true);
    let (y, idx) = tensor_of::<f64>(&xv, &shape).max_pool2d_with_indices(&p).unwrap();
    assert_eq!(y.shape(), &[1, 2, 4, 3]);
    let gv = rand_f64(6, 24);
    let gi = values_f64(&max_pool2d_backward(&tensor_of::<f64>(&gv, y.shape()), &idx, &shape).unwrap());
    let loss = |v: &[f64]| {
        dot(
            &values_f64(&tensor_of::<f64>(v, &shape).max_pool2d(&p).unwrap()),
            &gv,
        )
    };
    for i in 0..xv.len() {
        let (mut a, mut b) = (xv.clone(), xv.clone());
        a[i] += 1e-6;
        b[i] -= 1e-6;
        let fd = (loss(&a) - loss(&b)) / 2e-6;
        assert!((fd - gi[i]).abs() < 1e-6, "x[{i}]: fd {fd} vs {}", gi[i]);
    }
    // A NaN wins its window.
    let mut xn = xv.clone();
    xn[7] = f64::NAN;
    let (yn, idn) = tensor_of::<f64>(&xn, &shape).max_pool2d_with_indices(&p).unwrap();
    let k = idn
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .position(|&i| i == 7)
        .expect("NaN selected");
    assert!(values_f64(&yn)[k].is_nan());
}

#[test]
fn known_pytorch_shapes_and_values() {
    // torch.nn.functional.max_pool2d(torch.arange(16.).view(1,1,4,4), 2) == [[5, 7], [13, 15]]
    let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 1, 4, 4]).unwrap();
    let (y, i) = x.max_pool2d_with_indices(&Pool2dParams::new(2)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 7.0, 13.0, 15.0]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![5, 7, 13, 15]);
    // ceil_mode on 5x5 with k=2: 3x3 (floor: 2x2).
    let x5 = Tensor::from_vec(vec![1.0f32; 25], &[1, 5, 5]).unwrap();
    assert_eq!(
        x5.max_pool2d(&Pool2dParams::new(2).ceil_mode(true))
            .unwrap()
            .shape(),
        &[1, 3, 3]
    );
    assert_eq!(x5.max_pool2d(&Pool2dParams::new(2)).unwrap().shape(), &[1, 2, 2]);
    // avg_pool2d(ones(1,1,3,3), 2, 1, padding=1): corner 1/4 with count_include_pad, 1 without.
    let x3 = Tensor::from_vec(vec![1.0f64; 9], &[1, 1, 3, 3]).unwrap();
    let p = Pool2dParams::new(2).stride(1).padding(1);
    assert_eq!(values_f64(&x3.avg_pool2d(&p).unwrap())[0], 0.25);
    let p = Pool2dParams {
        count_include_pad: false,
        ..p
    };
    assert_eq!(values_f64(&x3.avg_pool2d(&p).unwrap())[0], 1.0);
    // adaptive 5 -> 3 windows: [0,2), [1,4), [3,5).
    let x = Tensor::from_vec((0..5).map(|v| v as f64).collect(), &[1, 1, 5]).unwrap();
    assert_eq!(
        values_f64(&x.adaptive_avg_pool2d([1, 3]).unwrap()),
        vec![0.5, 2.0, 3.5]
    );
}

#[test]
fn invalid_arguments_are_errors() {
    let x = tensor_of::<f32>(&rand_f64(1, 32), &[2, 4, 4]);
    assert!(x.max_pool2d(&Pool2dParams::new(0)).is_err());
    assert!(x.max_pool2d(&Pool2dParams::new(2).padding(2)).is_err());
    assert!(x.max_pool2d(&Pool2dParams::new(5)).is_err());
    assert!(x
        .reshape([32])
        .unwrap()
        .max_pool2d(&Pool2dParams::new(2))
        .is_err());
    assert!(x
        .to_dtype(DType::I64)
        .unwrap()
        .avg_pool2d(&Pool2dParams::new(2))
        .is_err());
    assert!(x.avg_pool2d(&Pool2dParams::new(2).dilation(2)).is_err());
    let (y, i) = x.max_pool2d_with_indices(&Pool2dParams::new(2)).unwrap();
    assert!(max_pool2d_backward(&y, &i, &[2, 5, 5]).is_ok_and(|t| t.shape() == [2, 5, 5]));
    assert!(max_pool2d_backward(&y, &i, &[3, 4, 4]).is_err());
    assert!(max_pool2d_backward(&y, &i.to_dtype(DType::F32).unwrap(), &[2, 4, 4]).is_err());
    let bad = Tensor::from_vec(vec![99i64; 8], &[2, 2, 2]).unwrap();
    assert!(max_pool2d_backward(&y, &bad, &[2, 4, 4]).is_err());
    assert!(avg_pool2d_backward(&y, &[2, 4, 4], &Pool2dParams::new(3)).is_err());
    assert!(adaptive_avg_pool2d_backward(&y, &[2, 0, 4]).is_err());
    assert!(adaptive_avg_pool2d_backward(&y, &[3, 4, 4]).is_err());
    assert!(tensor_of::<f32>(&[], &[2, 0, 4])
        .adaptive_avg_pool2d([2, 2])
        .is_err());
}

/// The 2×2 stride-2 fast path on values full of ties, infinities and NaNs,
/// odd and even sizes, against a scan of each window in order (ties keep
/// the earlier element, a NaN beats everything, the last NaN wins); and its
/// backward.
#[test]
fn max_pool_2x2_matches_window_scan() {
    let pick = [f64::NEG_INFINITY, -1.0, 0.0, 1.0, f64::INFINITY, f64::NAN];
    for (h, w, seed) in [(4, 4, 1), (7, 9, 2), (28, 28, 3), (2, 3, 4), (5, 2, 5)] {
        let r = rand_f64(seed, 3 * h * w);
        let xv: Vec<f64> = r
            .iter()
            .map(|&v| pick[((v + 1.0) * 3.0) as usize % pick.len()])
            .collect();
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let x =
                crate::with_float_dtype!(dtype, T => tensor_of::<T>(&xv, &[3, h, w]), else unreachable!());
            let (y, idx) = x.max_pool2d_with_indices(&Pool2dParams::new(2)).unwrap();
            let (oh, ow) = (h / 2, w / 2);
            assert_eq!(y.shape(), &[3, oh, ow]);
            let (got, got_i) = (values_f64(&y), idx.to_vec::<i64>().unwrap());
            for pl in 0..3 {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let (mut best, mut bi) = (f64::NEG_INFINITY, 2 * oy * w + 2 * ox);
                        for i in [0, 1, w, w + 1].map(|d| 2 * oy * w + 2 * ox + d) {
                            let v = xv[pl * h * w + i];
                            if v > best || v.is_nan() {
                                (best, bi) = (v, i);
                            }
                        }
                        let k = (pl * oh + oy) * ow + ox;
                        assert_eq!(got_i[k], bi as i64, "{dtype} {h}x{w} plane {pl} ({oy}, {ox})");
                        assert!(
                            got[k] == best || got[k].is_nan() && best.is_nan(),
                            "{} vs {best}",
                            got[k]
                        );
                    }
                }
            }
            let go = tensor_of::<f64>(&rand_f64(seed + 9, 3 * oh * ow), &[3, oh, ow]);
            let gi = values_f64(&max_pool2d_backward(&go, &idx, &[3, h, w]).unwrap());
            let mut want = vec![0.0; 3 * h * w];
            for (k, (&g, &i)) in values_f64(&go).iter().zip(&got_i).enumerate() {
                want[k / (oh * ow) * h * w + i as usize] += g;
            }
            assert_eq!(gi, want);
        }
    }
}

/// The 2×2 kernel at every SIMD level this CPU has, for f32 and bf16 rows
/// of 1 to 40 outputs (whole and partial vectors): the indices equal the
/// portable scan's, and every output is bit for bit the input element at
/// its index (NaN payloads, signalling ones too, and signed zeros kept).
#[test]
fn max_pool_2x2_kernels_agree_at_every_level() {
    use super::max_2x2::max_plane_2x2;
    use crate::simd::Level;
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];
    for ow in 1..=40usize {
        let (w, rows) = (2 * ow + ow % 3, 2 + ow % 3);
        let n = 2 * rows * w;
        let r = rand_f64(ow as u64, n);
        let vals: Vec<f32> = r
            .iter()
            .map(|&v| match ((v + 1.0) * 8.0) as usize {
                k @ 0..=5 => specials[k],
                // A signalling NaN with a payload.
                6 => f32::from_bits(0x7fa0_0001),
                _ => (v * 4.0).round() as f32,
            })
            .collect();
        let halves: Vec<crate::bf16> = vals.iter().map(|&v| crate::bf16::from_f32(v)).collect();
        let run = |level: Level| {
            let (mut o32, mut i32_) = (vec![0f32; rows * ow], vec![0i64; rows * ow]);
            max_plane_2x2(level, &vals, w, ow, &mut o32, &mut i32_);
            let (mut o16, mut i16_) = (vec![crate::bf16::ZERO; rows * ow], vec![0i64; rows * ow]);
            max_plane_2x2(level, &halves, w, ow, &mut o16, &mut i16_);
            (o32, i32_, o16, i16_)
        };
        let portable = run(*Level::available().last().unwrap());
        for level in Level::available() {
            let (o32, i32_, o16, i16_) = run(level);
            assert_eq!(i32_, portable.1, "f32 {level:?} ow {ow}");
            assert_eq!(i16_, portable.3, "bf16 {level:?} ow {ow}");
            for (k, (&i, &j)) in i32_.iter().zip(&i16_).enumerate() {
                assert_eq!(
                    o32[k].to_bits(),
                    vals[i as usize].to_bits(),
                    "f32 {level:?} ow {ow} at {k}"
                );
                assert_eq!(
                    o16[k].to_bits(),
                    halves[j as usize].to_bits(),
                    "bf16 {level:?} ow {ow} at {k}"
                );
            }
        }
    }
}
