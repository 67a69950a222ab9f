//! Every SIMD kernel at every level this CPU has: accuracy sweeps of the
//! elementwise functions against f64 over a dense sample of all f32 values
//! (subnormals, ±0, ±∞, NaN included), exact arithmetic, and reductions
//! that are bitwise the same at every level.

use super::kernels;
use super::{norm, Level};
use crate::backend::{BinaryOp, UnaryOp};
use crate::test_util::rand_f64;

/// The distance from `got` to the f64 `want` in units of the f32 spacing at
/// `want`; 0 for matching NaN or ∞. Subnormal results (whose products of a
/// subnormal probability with x lose relative accuracy, in PyTorch too) count
/// as exact within 2^-140 and as infinitely wrong beyond.
fn ulps(got: f32, want: f64) -> f64 {
    if want.abs() < f32::MIN_POSITIVE as f64 && !got.is_nan() {
        return if (got as f64 - want).abs() <= 2f64.powi(-140) {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if want.is_infinite() || (want.abs() > f32::MAX as f64 && got.is_infinite()) {
        return if got as f64 == want || (got.is_infinite() && got.signum() as f64 == want.signum()) {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let w = want as f32;
    let spacing = if w.is_infinite() {
        f32::MAX as f64 * f32::EPSILON as f64
    } else {
        let b = w.abs().to_bits();
        (f32::from_bits(b + 1) as f64 - f32::from_bits(b) as f64).max(f32::from_bits(1) as f64)
    };
    (got as f64 - want).abs() / spacing
}

fn sigmoid64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn reference(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sigmoid => sigmoid64(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Silu => x * sigmoid64(x),
        UnaryOp::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x * sigmoid64(2.0 * u)
        }
        UnaryOp::GeluErf => x * 0.5 * crate::special::erfc(-x * std::f64::consts::FRAC_1_SQRT_2),
        other => panic!("{other:?} has no SIMD kernel"),
    }
}

/// A dense sample of f32 bit patterns plus the special values.
fn sweep() -> Vec<f32> {
    let mut v: Vec<f32> = (0..=u32::MAX / 2039).map(|k| f32::from_bits(k * 2039)).collect();
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MAX,
        f32::MIN,
        88.72,
        88.73,
        -87.3,
        -103.9,
        -104.0,
        0.625,
        -0.625,
        0.5,
        -0.7,
        4.0 * std::f32::consts::SQRT_2,
    ]);
    v.extend((-4000..4000).map(|i| i as f32 * 0.005));
    v
}

#[test]
fn elementwise_functions_are_accurate_at_every_level() {
    let xs = sweep();
    // Max error in f32 ulps allowed per op (the worst case measured at any
    // level is below these; the portable level has no FMA).
    let limits = [
        (UnaryOp::Relu, 0.0),
        (UnaryOp::Exp, 1.5),
        (UnaryOp::Sigmoid, 2.5),
        (UnaryOp::Tanh, 2.5),
        (UnaryOp::Silu, 3.0),
        (UnaryOp::GeluTanh, 3.5),
        (UnaryOp::GeluErf, 7.0),
    ];
    for level in Level::available() {
        for (op, limit) in limits {
            let mut ys = vec![0.0f32; xs.len()];
            kernels::unary(level, op, &xs, &mut ys);
            let (mut worst, mut at) = (0.0f64, 0.0f32);
            for (&x, &y) in xs.iter().zip(&ys) {
                let mut e = ulps(y, reference(op, x as f64));
                if op == UnaryOp::GeluTanh {
                    // The inner argument 2u is rounded in f32 (as in every
                    // f32 implementation) and e^{2u} scales that error by |2u|.
                    let u2 = (8.0 / std::f64::consts::PI).sqrt() * (x as f64 + 0.044715 * (x as f64).powi(3));
                    e -= 3.0 * u2.abs().min(1e6);
                }
                if e > worst {
                    (worst, at) = (e, x);
                }
            }
            assert!(
                worst <= limit,
                "{op:?} at {}: {worst:.2} ulp at x = {at:e} (got {}, want {})",
                level.name(),
                {
                    let mut y = [0.0f32];
                    kernels::unary(level, op, &[at], &mut y);
                    y[0]
                },
                reference(op, at as f64)
            );
        }
    }
}

/// d/dx of `op` at x (at y = op(x) for the ops whose rule takes the output).
fn derivative(op: BinaryOp, x: f64) -> f64 {
    let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    match op {
        BinaryOp::GeluErfBackward => {
            0.5 * crate::special::erfc(-x * std::f64::consts::FRAC_1_SQRT_2) + x * phi
        }
        BinaryOp::GeluTanhBackward => {
            let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let s = sigmoid64(2.0 * k * (x + c * x * x * x));
            s + 2.0 * x * s * (1.0 - s) * k * (1.0 + 3.0 * c * x * x)
        }
        BinaryOp::SiluBackward => sigmoid64(x) * (1.0 + x * (1.0 - sigmoid64(x))),
        BinaryOp::ReluBackward => f64::from(x > 0.0),
        BinaryOp::SigmoidBackward => x * (1.0 - x),
        BinaryOp::TanhBackward => 1.0 - x * x,
        other => panic!("{other:?} is not a derivative rule"),
    }
}

#[test]
fn fused_activation_derivatives_match_f64_at_every_level() {
    // Finite inputs over the range where the derivatives are not flat, the
    // flat tails, and every slice-tail length.
    let mut xs: Vec<f32> = (-12000..12000).map(|i| i as f32 * 0.001).collect();
    xs.extend([-30.0, -15.0, -9.5, 9.5, 15.0, 30.0, 0.0, -0.0, 1e-30, -1e-30]);
    let gs: Vec<f32> = rand_f64(7, xs.len())
        .iter()
        .map(|&g| (g * 4.0 - 2.0) as f32)
        .collect();
    let ops = [
        BinaryOp::GeluErfBackward,
        BinaryOp::GeluTanhBackward,
        BinaryOp::SiluBackward,
        BinaryOp::ReluBackward,
        BinaryOp::SigmoidBackward,
        BinaryOp::TanhBackward,
    ];
    for level in Level::available() {
        for op in ops {
            for n in [xs.len(), 1, 7, 17, 33] {
                let mut dx = vec![0.0f32; n];
                kernels::binary(level, op, &gs[..n], &xs[..n], &mut dx);
                for i in 0..n {
                    let d = derivative(op, xs[i] as f64);
                    let want = gs[i] as f64 * d;
                    // f32 rounds x, u and the products: a few ulps of the
                    // terms, which may cancel where the derivative crosses 0
                    // (the output-based rules grow as y² off their range).
                    let tol =
                        1e-6 * (1.0 + (xs[i] as f64).abs()) * (1.0 + d.abs()) * (gs[i] as f64).abs() + 1e-30;
                    assert!(
                        (dx[i] as f64 - want).abs() <= tol,
                        "{op:?} at {}: g {} x {} got {} want {want}",
                        level.name(),
                        gs[i],
                        xs[i],
                        dx[i]
                    );
                }
                let mut s = vec![0.0f32; n];
                kernels::binary_scalar(level, op, &xs[..n], 1.5, true, &mut s);
                kernels::binary(level, op, &vec![1.5; n], &xs[..n], &mut dx);
                assert_eq!(s, dx, "{op:?} scalar g at {}", level.name());
            }
        }
    }
}

#[test]
fn every_slice_length_and_position_gives_the_same_bits() {
    let xs: Vec<f32> = rand_f64(3, 100).iter().map(|&x| (x * 8.0) as f32).collect();
    for level in Level::available() {
        let mut whole = vec![0.0f32; xs.len()];
        kernels::unary(level, UnaryOp::GeluErf, &xs, &mut whole);
        for start in 0..20 {
            for len in 0..40 {
                let mut part = vec![0.0f32; len];
                kernels::unary(level, UnaryOp::GeluErf, &xs[start..start + len], &mut part);
                assert_eq!(part, whole[start..start + len], "{} {start} {len}", level.name());
            }
        }
    }
}

#[test]
fn binary_ops_are_exact_at_every_level() {
    let a: Vec<f32> = rand_f64(1, 1000).iter().map(|&x| (x * 100.0) as f32).collect();
    let b: Vec<f32> = rand_f64(2, 1000).iter().map(|&x| (x * 3.0) as f32).collect();
    for level in Level::available() {
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            for n in [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 1000] {
                let mut y = vec![0.0f32; n];
                kernels::binary(level, op, &a[..n], &b[..n], &mut y);
                let want: Vec<f32> = (0..n)
                    .map(|i| kernels::binary_scalar_op(op, a[i], b[i]))
                    .collect();
                assert_eq!(y, want, "{op:?} {}", level.name());
                for first in [false, true] {
                    kernels::binary_scalar(level, op, &a[..n], 2.5, first, &mut y);
                    let want: Vec<f32> = (0..n)
                        .map(|i| {
                            if first {
                                kernels::binary_scalar_op(op, 2.5, a[i])
                            } else {
                                kernels::binary_scalar_op(op, a[i], 2.5)
                            }
                        })
                        .collect();
                    assert_eq!(y, want, "{op:?} {} scalar first {first}", level.name());
                }
            }
        }
    }
}

#[test]
fn sums_and_maxima_are_bitwise_equal_across_levels_and_accurate() {
    let levels = Level::available();
    for n in [0usize, 1, 5, 63, 64, 65, 200, 1000, 8192, 10_001] {
        let x: Vec<f32> = rand_f64(n as u64, n).iter().map(|&v| (v * 10.0) as f32).collect();
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        let abs: f64 = x.iter().map(|&v| (v as f64).abs()).sum();
        let s0 = kernels::sum(levels[0], &x);
        assert!(
            (s0 as f64 - exact).abs() <= 1e-6 * abs + 1e-30,
            "n {n}: {s0} vs {exact}"
        );
        let m0 = kernels::max(levels[0], &x);
        assert_eq!(m0, x.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
        let ssd = kernels::sum_sq_dev(levels[0], &x, 0.5);
        let want: f64 = x.iter().map(|&v| (v as f64 - 0.5).powi(2)).sum();
        assert!((ssd as f64 - want).abs() <= 1e-5 * want + 1e-30);
        for &l in &levels[1..] {
            assert_eq!(kernels::sum(l, &x).to_bits(), s0.to_bits(), "{} n {n}", l.name());
            assert_eq!(kernels::max(l, &x), m0, "{} n {n}", l.name());
        }
    }
    for level in levels {
        let mut x = vec![1.0f32; 100];
        x[77] = f32::NAN;
        assert!(kernels::max(level, &x).is_nan());
        x[77] = f32::INFINITY;
        assert_eq!(kernels::max(level, &x), f32::INFINITY);
        assert!(kernels::sum(level, &[f32::INFINITY, f32::NEG_INFINITY]).is_nan());
    }
}

#[test]
fn attention_row_kernels_match_f64_at_every_level() {
    let close = |got: f32, want: f64, tol: f64| (got as f64 - want).abs() <= tol * (1.0 + want.abs());
    for level in Level::available() {
        for n in [1usize, 5, 16, 37, 128] {
            let v = |seed: u64, s: f64| -> Vec<f32> {
                rand_f64(seed, n).iter().map(|&x| (x * s) as f32).collect()
            };
            let (x, m, p, delta, g) = (v(n as u64, 20.0), v(3, 20.0), v(4, 1.0), v(5, 2.0), v(6, 2.0));
            let mut y = vec![0.0f32; n];
            kernels::exp_sub(level, &x, &m, &mut y);
            for i in 0..n {
                let mut one = [0.0f32];
                kernels::exp_shift(level, &x[i..=i], m[i], &mut one);
                assert_eq!(
                    y[i].to_bits(),
                    one[0].to_bits(),
                    "{} exp_sub {n} at {i}",
                    level.name()
                );
                let want = (x[i] as f64 - m[i] as f64).exp();
                assert!(
                    close(y[i], want, 2e-6),
                    "{} exp_sub {n}: {} vs {want}",
                    level.name(),
                    y[i]
                );
            }
            let mut ds = g.clone();
            kernels::attention_grad(level, &p, &delta, 0.125, &mut ds);
            for i in 0..n {
                let want = p[i] as f64 * (g[i] as f64 - delta[i] as f64) * 0.125;
                assert!(
                    close(ds[i], want, 1e-6),
                    "{} attention_grad {n}: {} vs {want}",
                    level.name(),
                    ds[i]
                );
            }
            let want: f64 = p.iter().zip(&g).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!(
                close(kernels::dot(level, &p, &g), want, 1e-5),
                "{} dot {n}",
                level.name()
            );
        }
    }
}

#[test]
fn softmax_rows_match_f64_at_every_level() {
    for level in Level::available() {
        for n in [1usize, 3, 16, 100, 1024] {
            let x: Vec<f32> = rand_f64(n as u64 + 9, n)
                .iter()
                .map(|&v| (v * 30.0) as f32)
                .collect();
            let m = x.iter().map(|&v| v as f64).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
            for log in [false, true] {
                let mut y = vec![0.0f32; n];
                kernels::softmax(level, &x, &mut y, log);
                for (&xi, &yi) in x.iter().zip(&y) {
                    let w = if log {
                        xi as f64 - m - s.ln()
                    } else {
                        (xi as f64 - m).exp() / s
                    };
                    assert!(
                        (yi as f64 - w).abs() <= 2e-6 * (1.0 + w.abs()),
                        "{} {n} {log}",
                        level.name()
                    );
                }
                // Backward against the closed forms in f64.
                let dy: Vec<f32> = rand_f64(n as u64, n).iter().map(|&v| v as f32).collect();
                let mut dx = vec![0.0f32; n];
                kernels::softmax_backward(level, &y, &dy, &mut dx, log);
                let sum_dy: f64 = dy.iter().map(|&v| v as f64).sum();
                let dot: f64 = y.iter().zip(&dy).map(|(&a, &b)| a as f64 * b as f64).sum();
                for i in 0..n {
                    let (yi, gi) = (y[i] as f64, dy[i] as f64);
                    let w = if log {
                        gi - yi.exp() * sum_dy
                    } else {
                        yi * (gi - dot)
                    };
                    assert!(
                        (dx[i] as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{} {n} {log}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn layer_norm_rows_match_f64_at_every_level() {
    for level in Level::available() {
        for n in [1usize, 5, 64, 77, 768] {
            let x: Vec<f32> = rand_f64(n as u64, n)
                .iter()
                .map(|&v| (v * 4.0 + 1.0) as f32)
                .collect();
            let w: Vec<f32> = rand_f64(n as u64 + 1, n).iter().map(|&v| v as f32).collect();
            let b: Vec<f32> = rand_f64(n as u64 + 2, n).iter().map(|&v| v as f32).collect();
            let dy: Vec<f32> = rand_f64(n as u64 + 3, n).iter().map(|&v| v as f32).collect();
            let xf: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let mean = xf.iter().sum::<f64>() / n as f64;
            let var = xf.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            let mut y = vec![0.0f32; n];
            norm::layer_norm_row(level, &x, mean as f32, rstd as f32, &w, &b, &mut y);
            let xh: Vec<f64> = xf.iter().map(|v| (v - mean) * rstd).collect();
            for i in 0..n {
                let want = xh[i] * w[i] as f64 + b[i] as f64;
                assert!((y[i] as f64 - want).abs() < 1e-5, "{} {n}", level.name());
            }
            let (mut dx, mut dw, mut db) = (vec![0.0f32; n], vec![1.0f32; n], vec![2.0f32; n]);
            norm::layer_norm_backward_row(
                level,
                &x,
                &dy,
                &w,
                mean as f32,
                rstd as f32,
                &mut dx,
                &mut dw,
                &mut db,
            );
            let g: Vec<f64> = (0..n).map(|i| dy[i] as f64 * w[i] as f64).collect();
            let a = g.iter().sum::<f64>() / n as f64;
            let bb = g.iter().zip(&xh).map(|(g, h)| g * h).sum::<f64>() / n as f64;
            for i in 0..n {
                let want = rstd * (g[i] - a - xh[i] * bb);
                assert!(
                    (dx[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                    "{} {n}",
                    level.name()
                );
                assert!((dw[i] as f64 - (1.0 + dy[i] as f64 * xh[i])).abs() < 1e-5);
                assert!((db[i] as f64 - (2.0 + dy[i] as f64)).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn batch_norm_planes_equal_the_scalar_formula_at_every_level() {
    for level in Level::available() {
        for n in [1usize, 5, 16, 37, 128] {
            let v = |seed: u64, s: f64| -> Vec<f32> {
                rand_f64(seed, n).iter().map(|&x| (x * s) as f32).collect()
            };
            let (x, dy) = (v(n as u64 + 40, 5.0), v(41, 2.0));
            let mut y = vec![0.0f32; n];
            norm::batch_norm_plane(level, &x, 1.7, -0.3, &mut y);
            for i in 0..n {
                let want = x[i] * 1.7 + -0.3;
                assert_eq!(
                    y[i].to_bits(),
                    want.to_bits(),
                    "{} batch_norm_plane {n} at {i}",
                    level.name()
                );
            }
            let coef = norm::BatchNormGrad {
                k: 0.9,
                a: -0.2,
                b: 0.05,
                mean: 0.4,
                invstd: 1.3,
            };
            norm::batch_norm_backward_plane(level, &x, &dy, coef, &mut y);
            for i in 0..n {
                let want = coef.k * dy[i] + coef.a * (x[i] - coef.mean) * coef.invstd + coef.b;
                assert_eq!(
                    y[i].to_bits(),
                    want.to_bits(),
                    "{} batch_norm_backward_plane {n} at {i}",
                    level.name()
                );
            }
            let want: f64 = dy
                .iter()
                .zip(&x)
                .map(|(&a, &b)| a as f64 * (b as f64 - 0.75))
                .sum();
            let got = kernels::dot_dev(level, &dy, &x, 0.75) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{} dot_dev {n}: {got} vs {want}",
                level.name()
            );
            assert_eq!(
                kernels::dot_dev(level, &dy, &x, 0.0).to_bits(),
                kernels::dot(level, &dy, &x).to_bits()
            );
        }
    }
}

#[test]
fn add_into_is_exact_at_every_level() {
    for level in Level::available() {
        for n in [1usize, 15, 16, 33, 130] {
            let x: Vec<f32> = rand_f64(n as u64 + 60, n).iter().map(|&v| v as f32).collect();
            let y0: Vec<f32> = rand_f64(61, n).iter().map(|&v| (v * 3.0) as f32).collect();
            let mut y = y0.clone();
            kernels::add_into(level, &x, &mut y);
            for i in 0..n {
                assert_eq!(
                    y[i].to_bits(),
                    (y0[i] + x[i]).to_bits(),
                    "{} add_into {n} at {i}",
                    level.name()
                );
            }
        }
    }
}
