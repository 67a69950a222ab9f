//! Bilinear interpolation against a naive f64 formula, PyTorch's known
//! outputs, and the adjoint identity for the backward.

use proptest::prelude::*;

use super::upsample_bilinear2d_backward;
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{DType, Tensor};

/// One axis: source index pairs and weights, straight from PyTorch's formulas in f64.
fn axis(input: usize, output: usize, align: bool, scale: Option<f64>) -> Vec<(usize, usize, f64)> {
    (0..output)
        .map(|d| {
            let real = if align {
                if output > 1 {
                    d as f64 * (input - 1) as f64 / (output - 1) as f64
                } else {
                    0.0
                }
            } else {
                let s = scale.map_or(input as f64 / output as f64, |f| 1.0 / f);
                (s * (d as f64 + 0.5) - 0.5).max(0.0)
            };
            let i0 = (real.floor() as usize).min(input - 1);
            let i1 = (i0 + 1).min(input - 1);
            (i0, i1, (real - i0 as f64).clamp(0.0, 1.0))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn naive(
    x: &[f64],
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    align: bool,
    scales: [Option<f64>; 2],
) -> Vec<f64> {
    let (ys, xs) = (axis(h, oh, align, scales[0]), axis(w, ow, align, scales[1]));
    let mut out = Vec::new();
    for p in 0..planes {
        for &(y0, y1, ly) in &ys {
            for &(x0, x1, lx) in &xs {
                let v = |y: usize, xx: usize| x[p * h * w + y * w + xx];
                out.push(
                    (1.0 - ly) * ((1.0 - lx) * v(y0, x0) + lx * v(y0, x1))
                        + ly * ((1.0 - lx) * v(y1, x0) + lx * v(y1, x1)),
                );
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bilinear_matches_naive_and_backward_is_adjoint(
        n in 1usize..3, c in 1usize..3, h in 1usize..8, w in 1usize..8,
        size in prop::option::of((1usize..12, 1usize..12)), fh in 0.3f64..3.0, fw in 0.3f64..3.0,
        align in any::<bool>(), seed in 0u64..1000, sel in 0usize..5, f32_path in any::<bool>(),
    ) {
        let shape = [n, c, h, w];
        let xv = rand_f64(seed, n * c * h * w);
        let (dtype, tol) = if f32_path { (DType::F32, 1e-5) } else { (DType::F64, 1e-12) };
        let x = crate::with_float_dtype!(dtype, T => { let l = layouts_of::<T>(&xv, &shape); l[sel % l.len()].clone() }, else unreachable!());
        let (out, scales) = match size {
            Some((oh, ow)) => ([oh, ow], [None, None]),
            None => ([(h as f64 * fh).floor() as usize, (w as f64 * fw).floor() as usize], [Some(fh), Some(fw)]),
        };
        let y = match size {
            Some(s) => x.interpolate_bilinear(Some([s.0, s.1]), None, align),
            None => x.interpolate_bilinear(None, Some([fh, fw]), align),
        };
        if out.contains(&0) {
            prop_assert!(y.is_err());
            return Ok(());
        }
        let y = y.unwrap();
        prop_assert_eq!(y.shape(), &[n, c, out[0], out[1]]);
        let want = naive(&xv, n * c, h, w, out[0], out[1], align, scales);
        for (i, (g, e)) in values_f64(&y).iter().zip(&want).enumerate() {
            prop_assert!((g - e).abs() <= tol, "element {}: got {}, want {}", i, g, e);
        }
        // <up(x), g> == <x, up_backward(g)> (the op is linear in x).
        let gv = rand_f64(seed + 1, n * c * out[0] * out[1]);
        let gi = upsample_bilinear2d_backward(&tensor_of::<f64>(&gv, y.shape()), &shape, align, scales).unwrap();
        let y64 = tensor_of::<f64>(&xv, &shape).upsample_bilinear2d(out, align, scales).unwrap();
        let lhs: f64 = values_f64(&y64).iter().zip(&gv).map(|(a, b)| a * b).sum();
        let rhs: f64 = xv.iter().zip(values_f64(&gi)).map(|(a, b)| a * b).sum();
        prop_assert!((lhs - rhs).abs() < 1e-12, "adjoint {} vs {}", lhs, rhs);
    }
}

#[test]
fn known_pytorch_outputs() {
    let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[1, 1, 2, 2]).unwrap();
    // F.interpolate(x, size=(3, 3), mode="bilinear", align_corners=True)
    let y = x.interpolate_bilinear(Some([3, 3]), None, true).unwrap();
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0]
    );
    // F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    let y = x.interpolate_bilinear(None, Some([2.0, 2.0]), false).unwrap();
    let want = [
        0.0, 0.25, 0.75, 1.0, 0.5, 0.75, 1.25, 1.5, 1.5, 1.75, 2.25, 2.5, 2.0, 2.25, 2.75, 3.0,
    ];
    assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec());
    // A scale factor that is not out/in sets the coordinate scale: 3 → floor(3·1.7) = 5 with
    // s = 1/1.7, so output 1 reads source max(1.5/1.7 − 0.5, 0) = 0.38235…
    let r = Tensor::from_vec(vec![0.0f64, 1.0, 2.0], &[1, 1, 1, 3]).unwrap();
    let y = r.interpolate_bilinear(None, Some([1.0, 1.7]), false).unwrap();
    assert_eq!(y.shape(), &[1, 1, 1, 5]);
    assert!((values_f64(&y)[1] - (1.5 / 1.7 - 0.5)).abs() < 1e-15);
    let y = r.interpolate_bilinear(Some([1, 5]), None, false).unwrap();
    assert!((values_f64(&y)[1] - (1.5 * 0.6 - 0.5)).abs() < 1e-15);
}

#[test]
fn invalid_arguments_are_errors() {
    let x = tensor_of::<f32>(&rand_f64(1, 16), &[1, 1, 4, 4]);
    assert!(x.interpolate_bilinear(None, None, false).is_err());
    assert!(x
        .interpolate_bilinear(Some([2, 2]), Some([2.0, 2.0]), false)
        .is_err());
    assert!(x
        .interpolate_bilinear(None, Some([f64::NAN, 2.0]), false)
        .is_err());
    assert!(x.interpolate_bilinear(None, Some([-1.0, 2.0]), false).is_err());
    assert!(x.interpolate_bilinear(None, Some([1e300, 2.0]), false).is_err());
    assert!(x.interpolate_bilinear(Some([0, 2]), None, false).is_err());
    assert!(x
        .reshape([4, 4])
        .unwrap()
        .interpolate_bilinear(Some([2, 2]), None, false)
        .is_err());
    assert!(x
        .to_dtype(DType::U8)
        .unwrap()
        .interpolate_bilinear(Some([2, 2]), None, false)
        .is_err());
    let g = tensor_of::<f32>(&rand_f64(2, 4), &[1, 1, 2, 2]);
    assert!(upsample_bilinear2d_backward(&g, &[1, 2, 4, 4], false, [None, None]).is_err());
    assert!(upsample_bilinear2d_backward(&g, &[1, 1, 0, 4], false, [None, None]).is_err());
    assert_eq!(
        upsample_bilinear2d_backward(&g, &[1, 1, 4, 4], true, [None, None])
            .unwrap()
            .shape(),
        &[1, 1, 4, 4]
    );
}
