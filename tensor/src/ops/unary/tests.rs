//! Unary ops against naive f64 references, on every float dtype and under
//! every layout of `test_util::layouts_of`.
//!
//! Tolerances (|got − want| ≤ tol · (1 + |want|)): f32 2e-6, f64 1e-12,
//! f16 1e-3, bf16 1e-2 — a few ulps of the result dtype; the reference is
//! evaluated on the input after rounding to the dtype.

use super::GeluApprox;
use crate::test_util::{layouts_of, rand_f64, values_f64};
use crate::{DType, Result, Tensor};

/// The float dtypes every float kernel is tested on.
pub(crate) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Shapes covering 0-d, 1-d, size-1 and zero-size dims, and a row count
/// that splits unevenly.
pub(crate) const SHAPES: &[&[usize]] = &[&[2, 3, 4], &[7], &[], &[0, 3], &[3, 1, 5], &[17, 9]];

/// The tolerance of `dtype` (see the module docs).
pub(crate) fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-6,
        DType::F64 => 1e-12,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// Asserts `got` matches `want` within `tol(dtype)`; NaN must match NaN and
/// infinities must match exactly.
pub(crate) fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol(dtype) * (1.0 + w.abs())
        };
        assert!(ok, "{what} ({dtype}) element {i}: got {g}, want {w}");
    }
}

/// The same values under every layout, for any dtype.
pub(crate) fn layouts_any(dtype: DType, vals: &[f64], shape: &[usize]) -> Vec<Tensor> {
    crate::with_dtype!(dtype, T => layouts_of::<T>(vals, shape))
}

type Op = fn(&Tensor) -> Result<Tensor>;

/// Checks `op` against `reference` on inputs `domain(u)`, u uniform in
/// [-1, 1), for every float dtype, shape and layout.
fn check_float(name: &str, op: Op, reference: fn(f64) -> f64, domain: fn(f64) -> f64) {
    for (seed, &dtype) in FLOATS.iter().enumerate() {
        for shape in SHAPES {
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = rand_f64(seed as u64 * 31 + n as u64, n)
                .into_iter()
                .map(domain)
                .collect();
            let views = layouts_any(dtype, &vals, shape);
            let want: Vec<f64> = values_f64(&views[0]).into_iter().map(reference).collect();
            for (k, t) in views.iter().enumerate() {
                let r = op(t).unwrap();
                assert_eq!(r.shape(), *shape, "{name} shape");
                assert_eq!(r.dtype(), dtype, "{name} dtype");
                assert_close(
                    &values_f64(&r),
                    &want,
                    dtype,
                    &format!("{name} {shape:?} layout {k}"),
                );
            }
        }
    }
    // Above the parallel threshold, contiguous and transposed.
    let vals: Vec<f64> = rand_f64(99, 256 * 160).into_iter().map(domain).collect();
    let views = layouts_of::<f32>(&vals, &[256, 160]);
    let want: Vec<f64> = values_f64(&views[0]).into_iter().map(reference).collect();
    for t in [&views[0], &views[3]] {
        assert_close(
            &values_f64(&op(t).unwrap()),
            &want,
            DType::F32,
            &format!("{name} large"),
        );
    }
}

fn wide(u: f64) -> f64 {
    3.0 * u
}
fn positive(u: f64) -> f64 {
    3.0 * u.abs() + 0.01
}
fn nonzero(u: f64) -> f64 {
    if u < 0.0 {
        3.0 * u - 0.1
    } else {
        3.0 * u + 0.1
    }
}
fn huge(u: f64) -> f64 {
    60.0 * u
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn float_functions_match_reference() {
    type Case = (&'static str, Op, fn(f64) -> f64, fn(f64) -> f64);
    let cases: Vec<Case> = vec![
        ("neg", Tensor::neg, |x| -x, wide),
        ("abs", Tensor::abs, f64::abs, wide),
        ("exp", Tensor::exp, f64::exp, wide),
        ("log", Tensor::log, f64::ln, positive),
        ("log1p", Tensor::log1p, f64::ln_1p, |u| 0.99 * u),
        ("expm1", Tensor::expm1, f64::exp_m1, wide),
        ("sqrt", Tensor::sqrt, f64::sqrt, positive),
        ("rsqrt", Tensor::rsqrt, |x| 1.0 / x.sqrt(), positive),
        ("recip", Tensor::recip, |x| 1.0 / x, nonzero),
        ("square", Tensor::square, |x| x * x, wide),
        ("sin", Tensor::sin, f64::sin, wide),
        ("cos", Tensor::cos, f64::cos, wide),
        ("tanh", Tensor::tanh, f64::tanh, wide),
        ("sigmoid", Tensor::sigmoid, sigmoid_ref, huge),
        ("relu", Tensor::relu, |x| x.max(0.0), wide),
        ("silu", Tensor::silu, |x| x * sigmoid_ref(x), huge),
        ("erf", Tensor::erf, crate::erf, wide),
        (
            "sign",
            Tensor::sign,
            |x| if x == 0.0 { 0.0 } else { x.signum() },
            wide,
        ),
        ("floor", Tensor::floor, f64::floor, wide),
        ("ceil", Tensor::ceil, f64::ceil, wide),
        ("round", Tensor::round, f64::round_ties_even, wide),
        (
            "gelu",
            |t| t.gelu(GeluApprox::None),
            |x| 0.5 * x * (1.0 + crate::erf(x / 2f64.sqrt())),
            wide,
        ),
        ("gelu_tanh", |t| t.gelu(GeluApprox::Tanh), gelu_tanh_ref, wide),
        (
            "clamp",
            |t| t.clamp(Some(-0.5), Some(1.25)),
            |x| x.clamp(-0.5, 1.25),
            wide,
        ),
        ("clamp_min", |t| t.clamp(Some(-0.5), None), |x| x.max(-0.5), wide),
        ("clamp_max", |t| t.clamp(None, Some(0.25)), |x| x.min(0.25), wide),
    ];
    for (name, op, reference, domain) in cases {
        check_float(name, op, reference, domain);
    }
}

fn gelu_tanh_ref(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn known_values() {
    let x = Tensor::from_vec(vec![1.0f64, -1.0, 0.0], &[3]).unwrap();
    let g = x.gelu(GeluApprox::None).unwrap().to_vec::<f64>().unwrap();
    assert!(
        (g[0] - 0.841_344_746_068_542_9).abs() < 1e-15 && (g[1] + 0.158_655_253_931_457_05).abs() < 1e-15
    );
    let g = x.gelu(GeluApprox::Tanh).unwrap().to_vec::<f64>().unwrap();
    assert!((g[0] - 0.841_191_990_608_276_8).abs() < 1e-14, "{g:?}");
    let r = Tensor::from_vec(vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999], &[7]).unwrap();
    assert_eq!(
        r.round().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 2.0]
    );
}

#[test]
fn sigmoid_and_silu_are_stable_at_extremes() {
    let x = Tensor::from_vec(vec![-1000.0f32, 1000.0, -110.0, f32::NAN], &[4]).unwrap();
    assert_eq!(
        x.sigmoid().unwrap().to_vec::<f32>().unwrap()[..3],
        [0.0, 1.0, 0.0]
    );
    let s = x.silu().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(s[..3], [0.0, 1000.0, 0.0]);
    assert!(s[3].is_nan());
    let relu = x.relu().unwrap().to_vec::<f32>().unwrap();
    assert!(relu[3].is_nan(), "relu keeps NaN");
}

#[test]
fn integer_inputs_of_float_functions_become_f32() {
    for dtype in [DType::I64, DType::U32, DType::U8, DType::Bool] {
        let vals = [0.0, 1.0, 2.0, 1.0, 0.0, 5.0];
        for t in layouts_any(dtype, &vals, &[2, 3]) {
            let input = values_f64(&t);
            for (name, op, reference) in [
                ("exp", Tensor::exp as Op, f64::exp as fn(f64) -> f64),
                ("sqrt", Tensor::sqrt, f64::sqrt),
                ("sigmoid", Tensor::sigmoid, sigmoid_ref),
                ("recip", Tensor::recip, |x| 1.0 / x),
            ] {
                let r = op(&t).unwrap();
                assert_eq!(r.dtype(), DType::F32, "{name} of {dtype}");
                let want: Vec<f64> = input.iter().map(|&x| reference(x)).collect();
                assert_close(&values_f64(&r), &want, DType::F32, name);
            }
        }
    }
}

#[test]
fn integer_ops_keep_dtype_and_wrap() {
    let vals: Vec<f64> = rand_f64(5, 24).into_iter().map(|u| (u * 60.0).trunc()).collect();
    for t in layouts_of::<i64>(&vals, &[2, 3, 4]) {
        let x: Vec<i64> = t.to_vec().unwrap();
        let check = |r: Tensor, f: fn(i64) -> i64, name: &str| {
            assert_eq!(r.dtype(), DType::I64, "{name}");
            assert_eq!(
                r.to_vec::<i64>().unwrap(),
                x.iter().map(|&v| f(v)).collect::<Vec<_>>(),
                "{name}"
            );
        };
        check(t.neg().unwrap(), |v| -v, "neg");
        check(t.abs().unwrap(), i64::abs, "abs");
        check(t.sign().unwrap(), i64::signum, "sign");
        check(t.square().unwrap(), |v| v * v, "square");
        check(t.relu().unwrap(), |v| v.max(0), "relu");
        check(t.floor().unwrap(), |v| v, "floor");
        check(t.round().unwrap(), |v| v, "round");
        check(
            t.clamp(Some(-3.5), Some(20.7)).unwrap(),
            |v| v.clamp(-3, 20),
            "clamp",
        );
    }
    let u: Vec<f64> = (0..12).map(|i| (i * 23) as f64).collect();
    for t in layouts_of::<u8>(&u, &[3, 4]) {
        let x: Vec<u8> = t.to_vec().unwrap();
        let neg: Vec<u8> = x.iter().map(|v| v.wrapping_neg()).collect();
        assert_eq!(t.neg().unwrap().to_vec::<u8>().unwrap(), neg);
        let sq: Vec<u8> = x.iter().map(|v| v.wrapping_mul(*v)).collect();
        assert_eq!(t.square().unwrap().to_vec::<u8>().unwrap(), sq);
        let sign: Vec<u8> = x.iter().map(|&v| v.min(1)).collect();
        assert_eq!(t.sign().unwrap().to_vec::<u8>().unwrap(), sign);
        assert_eq!(t.abs().unwrap().to_vec::<u8>().unwrap(), x);
        assert_eq!(
            t.clamp(Some(-4.0), Some(300.0)).unwrap().to_vec::<u8>().unwrap(),
            x
        );
    }
    let big = Tensor::from_vec(vec![i64::MIN, 1 << 40, -7], &[3]).unwrap();
    assert_eq!(
        big.abs().unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MIN, 1 << 40, 7]
    );
    assert_eq!(
        big.neg().unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MIN, -(1 << 40), 7]
    );
    assert_eq!(big.square().unwrap().to_vec::<i64>().unwrap(), vec![0, 0, 49]);
    let u32s = Tensor::from_vec(vec![3u32, 0], &[2]).unwrap();
    assert_eq!(
        u32s.neg().unwrap().to_vec::<u32>().unwrap(),
        vec![u32::MAX - 2, 0]
    );
}

#[test]
fn bool_rules() {
    let b = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    for (name, r) in [
        ("neg", b.neg()),
        ("abs", b.abs()),
        ("relu", b.relu()),
        ("clamp", b.clamp(Some(0.0), None)),
    ] {
        let e = r.unwrap_err();
        assert_eq!(e.op(), name);
        assert!(e.to_string().contains("bool"), "{e}");
    }
    assert_eq!(
        b.sign().unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    let sq = b.square().unwrap();
    assert_eq!(sq.dtype(), DType::I64);
    assert_eq!(sq.to_vec::<i64>().unwrap(), vec![1, 0, 1]);
    assert_eq!(b.floor().unwrap().dtype(), DType::Bool);
}

#[test]
fn clamp_edge_cases() {
    let x = Tensor::from_vec(vec![-2.0f32, 0.5, 3.0, f32::NAN], &[4]).unwrap();
    let inverted = x.clamp(Some(2.0), Some(1.0)).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(inverted[..3], [1.0, 1.0, 1.0], "min > max gives max");
    assert!(inverted[3].is_nan());
    assert_eq!(x.clamp(None, None).unwrap_err().op(), "clamp");
    assert!(x.clamp(Some(f64::NAN), None).is_err());
    let h = Tensor::from_vec(vec![crate::f16::from_f32(0.0)], &[1]).unwrap();
    let c = h.clamp(Some(0.1), None).unwrap();
    assert_eq!(c.dtype(), DType::F16);
    assert_eq!(c.to_vec::<crate::f16>().unwrap()[0], crate::f16::from_f64(0.1));
}

#[test]
fn clamp_tensor_broadcasts_and_promotes() {
    let xv = rand_f64(7, 12);
    let lov: Vec<f64> = rand_f64(8, 4).into_iter().map(|u| u * 0.5 - 0.3).collect();
    let hiv: Vec<f64> = rand_f64(9, 5).into_iter().map(|u| u * 0.5 + 0.3).collect();
    for x in layouts_of::<f32>(&xv, &[3, 1, 4]) {
        for lo in layouts_of::<f64>(&lov, &[4]) {
            let hi = Tensor::from_vec(hiv.clone(), &[5, 1, 1, 1])
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let r = x.clamp_tensor(Some(&lo), Some(&hi)).unwrap();
            assert_eq!(r.shape(), &[5, 3, 1, 4]);
            assert_eq!(r.dtype(), DType::F64);
            let (xs, los, his) = (values_f64(&x), values_f64(&lo), values_f64(&hi));
            let mut want = Vec::new();
            for &h in &his {
                for j in 0..3 {
                    for k in 0..4 {
                        let v = xs[j * 4 + k].max(los[k]);
                        want.push(if v > h { h } else { v });
                    }
                }
            }
            assert_close(&values_f64(&r), &want, DType::F64, "clamp_tensor");
        }
    }
    let x = Tensor::from_vec(vec![1i64, 5, 9], &[3]).unwrap();
    let lo = Tensor::scalar(4i64);
    assert_eq!(
        x.clamp_tensor(Some(&lo), None).unwrap().to_vec::<i64>().unwrap(),
        vec![4, 5, 9]
    );
    assert_eq!(
        x.clamp_tensor(None, Some(&lo)).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 4, 4]
    );
    let e = x
        .clamp_tensor(Some(&Tensor::from_vec(vec![0i64, 1], &[2]).unwrap()), None)
        .unwrap_err();
    assert_eq!(e.op(), "clamp");
    assert!(
        e.to_string().contains("[3]") && e.to_string().contains("[2]"),
        "{e}"
    );
    assert!(x.clamp_tensor(None, None).is_err());
}
