//! Binary arithmetic against naive f64 references with broadcasting, under
//! every pair of layouts, every float dtype (tolerances as in the unary
//! tests: f32 2e-6, f64 1e-12, f16 1e-3, bf16 1e-2), integer wrapping,
//! the promotion table and proptest over random broadcastable shapes.

use proptest::prelude::*;

use crate::ops::unary::tests::{assert_close, layouts_any, FLOATS};
use crate::test_util::{rand_f64, tensor_of, values_f64};
use crate::{DType, Result, Tensor};

/// NumPy broadcasting of two shapes, written independently of the crate's.
pub(crate) fn broadcast_ref(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, n - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (pa, pb) = (pad(a), pad(b));
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// `f` over the broadcast of (`av`, `a`) and (`bv`, `b`), row-major.
pub(crate) fn zip_ref(
    av: &[f64],
    a: &[usize],
    bv: &[f64],
    b: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let out = broadcast_ref(a, b).expect("broadcastable");
    let n: usize = out.iter().product();
    let index = |lin: usize, s: &[usize]| -> usize {
        // Row-major index into `s` (right-aligned with `out`, size-1 dims pinned).
        let (mut rem, mut idx, mut mul) = (lin, 0, 1);
        for d in (0..out.len()).rev() {
            let i = rem % out[d];
            rem /= out[d];
            if let Some(k) = (d + s.len()).checked_sub(out.len()) {
                if s[k] != 1 {
                    idx += i * mul;
                }
                mul *= s[k];
            }
        }
        idx
    };
    let vals = (0..n)
        .map(|lin| f(av[index(lin, a)], bv[index(lin, b)]))
        .collect();
    (out, vals)
}

/// Shape pairs: equal, broadcast both ways, scalars, zero-size dims.
pub(crate) const PAIRS: &[(&[usize], &[usize])] = &[
    (&[3, 1, 4], &[5, 4]),
    (&[2, 3], &[2, 3]),
    (&[], &[4, 3]),
    (&[5, 4], &[]),
    (&[0, 3], &[1, 3]),
    (&[4, 1], &[1, 6]),
    (&[2, 0], &[2, 1]),
];

type BinOp = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// Checks `op` against `reference` for every float dtype, shape pair and
/// pair of layouts; `db` maps the second operand's inputs into its domain.
fn check_float(
    name: &str,
    op: BinOp,
    reference: fn(f64, f64) -> f64,
    da: fn(f64) -> f64,
    db: fn(f64) -> f64,
) {
    for (seed, &dtype) in FLOATS.iter().enumerate() {
        for (sa, sb) in PAIRS {
            let na: usize = sa.iter().product();
            let nb: usize = sb.iter().product();
            let av: Vec<f64> = rand_f64(seed as u64 + 1, na).into_iter().map(da).collect();
            let bv: Vec<f64> = rand_f64(seed as u64 + 100, nb).into_iter().map(db).collect();
            let (la, lb) = (layouts_any(dtype, &av, sa), layouts_any(dtype, &bv, sb));
            let (shape, want) = zip_ref(&values_f64(&la[0]), sa, &values_f64(&lb[0]), sb, reference);
            for (i, a) in la.iter().enumerate() {
                for (j, b) in lb.iter().enumerate() {
                    let r = op(a, b).unwrap();
                    assert_eq!(r.shape(), &shape[..], "{name} {sa:?} {sb:?}");
                    assert_eq!(r.dtype(), dtype, "{name}");
                    assert_close(
                        &values_f64(&r),
                        &want,
                        dtype,
                        &format!("{name} {sa:?}×{sb:?} layouts {i},{j}"),
                    );
                }
            }
        }
    }
    // Above the parallel threshold: a row-broadcast bias and a transposed operand.
    let (sa, sb) = ([300usize, 128], [128usize]);
    let av = rand_f64(3, 300 * 128);
    let bv: Vec<f64> = rand_f64(4, 128).into_iter().map(db).collect();
    let (la, lb) = (
        layouts_any(DType::F32, &av, &sa),
        layouts_any(DType::F32, &bv, &sb),
    );
    let (_, want) = zip_ref(&values_f64(&la[0]), &sa, &values_f64(&lb[0]), &sb, reference);
    for a in [&la[0], &la[3]] {
        assert_close(
            &values_f64(&op(a, &lb[0]).unwrap()),
            &want,
            DType::F32,
            &format!("{name} large"),
        );
    }
}

fn id(u: f64) -> f64 {
    2.0 * u
}
fn positive(u: f64) -> f64 {
    2.0 * u.abs() + 0.05
}
fn nonzero(u: f64) -> f64 {
    if u < 0.0 {
        2.0 * u - 0.1
    } else {
        2.0 * u + 0.1
    }
}

#[test]
fn float_ops_match_reference() {
    type Case = (
        &'static str,
        BinOp,
        fn(f64, f64) -> f64,
        fn(f64) -> f64,
        fn(f64) -> f64,
    );
    let cases: Vec<Case> = vec![
        ("add", Tensor::add, |x, y| x + y, id, id),
        ("sub", Tensor::sub, |x, y| x - y, id, id),
        ("mul", Tensor::mul, |x, y| x * y, id, id),
        ("div", Tensor::div, |x, y| x / y, id, nonzero),
        ("maximum", Tensor::maximum, f64::max, id, id),
        ("minimum", Tensor::minimum, f64::min, id, id),
        ("pow", Tensor::pow, f64::powf, positive, id),
    ];
    for (name, op, reference, da, db) in cases {
        check_float(name, op, reference, da, db);
    }
}

#[test]
fn maximum_minimum_propagate_nan() {
    let a = Tensor::from_vec(vec![f32::NAN, 1.0, 2.0], &[3]).unwrap();
    let b = Tensor::from_vec(vec![0.0f32, f32::NAN, 1.0], &[3]).unwrap();
    for r in [a.maximum(&b).unwrap(), a.minimum(&b).unwrap()] {
        let v = r.to_vec::<f32>().unwrap();
        assert!(v[0].is_nan() && v[1].is_nan() && !v[2].is_nan(), "{v:?}");
    }
}

#[test]
fn integer_ops_wrap_and_divide_to_float() {
    let av: Vec<f64> = rand_f64(1, 12).into_iter().map(|u| (u * 100.0).trunc()).collect();
    let bv: Vec<f64> = rand_f64(2, 4).into_iter().map(|u| (u * 9.0).trunc()).collect();
    let (sa, sb) = ([3usize, 4], [4usize]);
    for a in layouts_any(DType::I64, &av, &sa) {
        for b in layouts_any(DType::I64, &bv, &sb) {
            for (name, r, f) in [
                ("add", a.add(&b), (|x, y| x + y) as fn(f64, f64) -> f64),
                ("sub", a.sub(&b), |x, y| x - y),
                ("mul", a.mul(&b), |x, y| x * y),
                ("maximum", a.maximum(&b), f64::max),
                ("minimum", a.minimum(&b), f64::min),
            ] {
                let r = r.unwrap();
                assert_eq!(r.dtype(), DType::I64, "{name}");
                assert_eq!(values_f64(&r), zip_ref(&av, &sa, &bv, &sb, f).1, "{name}");
            }
            let d = a.div(&b).unwrap();
            assert_eq!(d.dtype(), DType::F32);
            let (_, want) = zip_ref(&av, &sa, &bv, &sb, |x, y| (x as f32 / y as f32) as f64);
            assert_close(&values_f64(&d), &want, DType::F32, "int div");
        }
    }
    let u = Tensor::from_vec(vec![200u8, 3, 0], &[3]).unwrap();
    let v = Tensor::from_vec(vec![100u8, 5, 1], &[3]).unwrap();
    assert_eq!(u.add(&v).unwrap().to_vec::<u8>().unwrap(), vec![44, 8, 1]);
    assert_eq!(u.sub(&v).unwrap().to_vec::<u8>().unwrap(), vec![100, 254, 255]);
    assert_eq!(u.mul(&v).unwrap().to_vec::<u8>().unwrap(), vec![32, 15, 0]);
    let m = Tensor::from_vec(vec![i64::MAX], &[1]).unwrap();
    assert_eq!(
        m.add(&Tensor::scalar(1i64)).unwrap().to_vec::<i64>().unwrap(),
        vec![i64::MIN]
    );
}

#[test]
fn integer_pow() {
    let base = Tensor::from_vec(vec![2i64, -2, 2, 1, -1, -1, 0, 3, 7], &[9]).unwrap();
    let exp = Tensor::from_vec(vec![10i64, 3, -1, -5, -3, -4, 0, 40, 1], &[9]).unwrap();
    let want = vec![1024, -8, 0, 1, -1, 1, 1, 3i64.wrapping_pow(40), 7];
    assert_eq!(base.pow(&exp).unwrap().to_vec::<i64>().unwrap(), want);
    let u = Tensor::from_vec(vec![2u8, 3, 0], &[3]).unwrap();
    let e = Tensor::from_vec(vec![8u8, 5, 0], &[3]).unwrap();
    assert_eq!(u.pow(&e).unwrap().to_vec::<u8>().unwrap(), vec![0, 243, 1]);
    let f = Tensor::from_vec(vec![2.0f32], &[1]).unwrap();
    let r = f.pow(&Tensor::from_vec(vec![3i64, -1], &[2]).unwrap()).unwrap();
    assert_eq!(r.dtype(), DType::F32);
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![8.0, 0.5]);
}

#[test]
fn bool_arithmetic() {
    let a = Tensor::from_vec(vec![true, true, false, false], &[4]).unwrap();
    let b = Tensor::from_vec(vec![true, false, true, false], &[4]).unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        a.mul(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    assert_eq!(
        a.maximum(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        a.minimum(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    let e = a.sub(&b).unwrap_err();
    assert_eq!(e.op(), "sub");
    assert!(e.to_string().contains("bool"));
    assert!(a.pow(&b).is_err());
    let d = a.div(&b).unwrap();
    assert_eq!(d.dtype(), DType::F32);
    let v = d.to_vec::<f32>().unwrap();
    assert_eq!((v[0], v[1], v[2]), (1.0, f32::INFINITY, 0.0));
    assert!(v[3].is_nan());
}

#[test]
fn promotion_table() {
    use DType::*;
    let order = [F32, F64, F16, BF16, I64, U32, U8, Bool];
    #[rustfmt::skip]
    let table = [
        [F32, F64, F32, F32, F32, F32, F32, F32],
        [F64, F64, F64, F64, F64, F64, F64, F64],
        [F32, F64, F16, F32, F16, F16, F16, F16],
        [F32, F64, F32, BF16, BF16, BF16, BF16, BF16],
        [F32, F64, F16, BF16, I64, I64, I64, I64],
        [F32, F64, F16, BF16, I64, U32, U32, U32],
        [F32, F64, F16, BF16, I64, U32, U8, U8],
        [F32, F64, F16, BF16, I64, U32, U8, Bool],
    ];
    let vals = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0];
    for (i, &da) in order.iter().enumerate() {
        for (j, &db) in order.iter().enumerate() {
            let a = layouts_any(da, &vals, &[2, 3]).remove(2);
            let b = layouts_any(db, &vals[..3], &[3]).remove(0);
            let want = table[i][j];
            let sum = a.add(&b).unwrap();
            assert_eq!(sum.dtype(), want, "{da} + {db}");
            let expect: Vec<f64> = zip_ref(&vals, &[2, 3], &vals[..3], &[3], |x, y| x + y).1;
            let expect: Vec<f64> = if want == Bool {
                expect.iter().map(|&v| (v != 0.0) as u8 as f64).collect()
            } else {
                expect
            };
            assert_eq!(values_f64(&sum), expect, "{da} + {db}");
            assert_eq!(a.maximum(&b).unwrap().dtype(), want, "maximum {da} {db}");
            let div = a.div(&b).unwrap().dtype();
            assert_eq!(div, if want.is_float() { want } else { F32 }, "{da} / {db}");
        }
    }
    // Values survive promotion: f16 + f32 adds the f16 value exactly in f32.
    let h = tensor_of::<crate::f16>(&[0.1], &[1]);
    let f = tensor_of::<f32>(&[0.1], &[1]);
    let s = h.add(&f).unwrap();
    assert_eq!(
        s.to_vec::<f32>().unwrap()[0],
        crate::f16::from_f64(0.1).to_f32() + 0.1f32
    );
}

#[test]
fn scalar_forms_match_reference() {
    type ScalarOp = fn(&Tensor, f64) -> Result<Tensor>;
    type Case = (&'static str, ScalarOp, f64, fn(f64, f64) -> f64);
    let cases: Vec<Case> = vec![
        ("add_scalar", Tensor::add_scalar, 0.3, |x, s| x + s),
        ("sub_scalar", Tensor::sub_scalar, 0.3, |x, s| x - s),
        ("rsub_scalar", Tensor::rsub_scalar, 2.0, |x, s| s - x),
        ("mul_scalar", Tensor::mul_scalar, -1.7, |x, s| x * s),
        ("div_scalar", Tensor::div_scalar, 3.0, |x, s| x / s),
        ("rdiv_scalar", Tensor::rdiv_scalar, 3.0, |x, s| s / x),
        ("pow_scalar 2", Tensor::pow_scalar, 2.0, f64::powf),
        ("pow_scalar 3", Tensor::pow_scalar, 3.0, f64::powf),
        ("pow_scalar 1", Tensor::pow_scalar, 1.0, f64::powf),
        ("pow_scalar 0.5", Tensor::pow_scalar, 0.5, f64::powf),
        ("pow_scalar -1", Tensor::pow_scalar, -1.0, f64::powf),
        ("pow_scalar 1.7", Tensor::pow_scalar, 1.7, f64::powf),
        ("rpow_scalar", Tensor::rpow_scalar, 2.5, |x, s| s.powf(x)),
    ];
    for (name, op, s, reference) in cases {
        for &dtype in FLOATS.iter() {
            let shape = [3, 5];
            let vals: Vec<f64> = rand_f64(11, 15)
                .into_iter()
                .map(|u| 2.0 * u.abs() + 0.1)
                .collect();
            let views = layouts_any(dtype, &vals, &shape);
            // The scalar is rounded to the math type (f32 for f16/bf16), as PyTorch does.
            let sm = if dtype == DType::F64 { s } else { s as f32 as f64 };
            let want: Vec<f64> = values_f64(&views[0])
                .into_iter()
                .map(|x| reference(x, sm))
                .collect();
            for t in &views {
                let r = op(t, s).unwrap();
                assert_eq!(r.dtype(), dtype, "{name} keeps {dtype}");
                assert_close(&values_f64(&r), &want, dtype, name);
            }
        }
        for dtype in [DType::I64, DType::U8, DType::Bool] {
            let t = layouts_any(dtype, &[1.0, 2.0, 0.0, 3.0], &[2, 2]).remove(3);
            assert_eq!(
                op(&t, s).unwrap().dtype(),
                DType::F32,
                "{name} of {dtype} becomes f32"
            );
        }
    }
    let big = Tensor::from_vec(vec![16_777_217i64], &[1]).unwrap();
    assert_eq!(
        big.add_scalar(0.0).unwrap().to_vec::<f32>().unwrap(),
        vec![16_777_216.0]
    );
}

#[test]
fn mismatched_shapes_are_errors_naming_op_and_shapes() {
    let a = Tensor::from_vec(vec![0.0f32; 6], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![0.0f32; 4], &[4]).unwrap();
    for (name, r) in [
        ("add", a.add(&b)),
        ("div", a.div(&b)),
        ("pow", a.pow(&b)),
        ("minimum", a.minimum(&b)),
    ] {
        let e = r.unwrap_err();
        assert_eq!(e.op(), name);
        assert!(
            e.to_string().contains("[2, 3]") && e.to_string().contains("[4]"),
            "{e}"
        );
    }
}

/// A random output shape, and two shapes that broadcast to it: each drops
/// some leading dims and pins some others to 1.
fn broadcastable() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(0usize..5, 0..5).prop_flat_map(|out| {
        let n = out.len();
        let mask = (0..=n, prop::collection::vec(any::<bool>(), n));
        (Just(out), mask.clone(), mask).prop_map(|(out, (da, ma), (db, mb))| {
            let shrink = |drop: usize, m: &[bool]| -> Vec<usize> {
                (drop..out.len()).map(|d| if m[d] { 1 } else { out[d] }).collect()
            };
            (shrink(da, &ma), shrink(db, &mb))
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn broadcast_pairs_match_reference((sa, sb) in broadcastable(), seed in 0u64..1000, la in 0usize..5, lb in 0usize..5) {
        let av = rand_f64(seed, sa.iter().product());
        let bv = rand_f64(seed + 1, sb.iter().product());
        let views_a = layouts_any(DType::F32, &av, &sa);
        let views_b = layouts_any(DType::F64, &bv, &sb);
        let (a, b) = (&views_a[la % views_a.len()], &views_b[lb % views_b.len()]);
        let a_vals = values_f64(a);
        for (op, f) in [(Tensor::add as BinOp, (|x, y| x + y) as fn(f64, f64) -> f64), (Tensor::mul, |x, y| x * y), (Tensor::maximum, f64::max)] {
            let (shape, want) = zip_ref(&a_vals, &sa, &bv, &sb, f);
            let r = op(a, b).unwrap();
            prop_assert_eq!(r.shape(), &shape[..]);
            prop_assert_eq!(r.dtype(), DType::F64);
            prop_assert_eq!(values_f64(&r), want);
        }
    }

    #[test]
    fn any_dtypes_shapes_and_values_never_panic(
        sa in prop::collection::vec(0usize..4, 0..4),
        sb in prop::collection::vec(0usize..4, 0..4),
        (da, db, la, lb) in (0usize..8, 0usize..8, 0usize..5, 0usize..5),
        s in -40.0f64..40.0,
    ) {
        let vals = |seed, shape: &[usize]| -> Vec<f64> { rand_f64(seed, shape.iter().product()).into_iter().map(|u| (u * 70.0).round()).collect() };
        let va = layouts_any(DType::ALL[da], &vals(1, &sa), &sa);
        let vb = layouts_any(DType::ALL[db], &vals(2, &sb), &sb);
        let (a, b) = (&va[la % va.len()], &vb[lb % vb.len()]);
        let binary: [BinOp; 16] = [
            Tensor::add, Tensor::sub, Tensor::mul, Tensor::div, Tensor::maximum, Tensor::minimum, Tensor::pow,
            Tensor::eq, Tensor::ne, Tensor::lt, Tensor::le, Tensor::gt, Tensor::ge,
            Tensor::logical_and, Tensor::logical_or, Tensor::logical_xor,
        ];
        let ok = broadcast_ref(&sa, &sb).is_some();
        for op in binary {
            let r = op(a, b);
            prop_assert!(r.is_ok() || !ok || a.dtype() == DType::Bool || b.dtype() == DType::Bool);
        }
        let _ = Tensor::where_(a, a, b);
        let _ = a.clamp_tensor(Some(b), Some(a));
        let _ = a.clamp(Some(s), Some(-s));
        let unary: [fn(&Tensor) -> Result<Tensor>; 20] = [
            Tensor::neg, Tensor::abs, Tensor::exp, Tensor::log, Tensor::log1p, Tensor::expm1, Tensor::sqrt,
            Tensor::rsqrt, Tensor::recip, Tensor::square, Tensor::sin, Tensor::tanh, Tensor::sigmoid,
            Tensor::relu, Tensor::silu, Tensor::erf, Tensor::sign, Tensor::round, Tensor::logical_not, Tensor::floor,
        ];
        for op in unary {
            let _ = op(a);
        }
        let scalar: [fn(&Tensor, f64) -> Result<Tensor>; 8] = [
            Tensor::add_scalar, Tensor::rsub_scalar, Tensor::rdiv_scalar, Tensor::pow_scalar,
            Tensor::rpow_scalar, Tensor::lt_scalar, Tensor::eq_scalar, Tensor::div_scalar,
        ];
        for op in scalar {
            prop_assert!(op(a, s).is_ok());
        }
    }

    #[test]
    fn arbitrary_shape_pairs_are_ok_or_err(sa in prop::collection::vec(0usize..4, 0..4), sb in prop::collection::vec(0usize..4, 0..4)) {
        let a = tensor_of::<f32>(&rand_f64(1, sa.iter().product()), &sa);
        let b = tensor_of::<i64>(&vec![1.0; sb.iter().product()], &sb);
        let r = a.sub(&b);
        prop_assert_eq!(r.is_ok(), broadcast_ref(&sa, &sb).is_some());
        if let Ok(r) = r {
            prop_assert_eq!(r.shape(), &broadcast_ref(&sa, &sb).unwrap()[..]);
        }
    }
}
