//! Comparisons, logical ops and `where` against naive references under
//! broadcasting and every layout.

use crate::ops::binary::tests::{zip_ref, PAIRS};
use crate::ops::unary::tests::{layouts_any, FLOATS};
use crate::test_util::{rand_f64, values_f64};
use crate::{f16, DType, Result, Tensor};

type Cmp = fn(&Tensor, &Tensor) -> Result<Tensor>;
type CmpScalar = fn(&Tensor, f64) -> Result<Tensor>;

type Case = (&'static str, Cmp, CmpScalar, fn(f64, f64) -> bool);

fn cases() -> Vec<Case> {
    vec![
        ("eq", Tensor::eq, Tensor::eq_scalar, |x, y| x == y),
        ("ne", Tensor::ne, Tensor::ne_scalar, |x, y| x != y),
        ("lt", Tensor::lt, Tensor::lt_scalar, |x, y| x < y),
        ("le", Tensor::le, Tensor::le_scalar, |x, y| x <= y),
        ("gt", Tensor::gt, Tensor::gt_scalar, |x, y| x > y),
        ("ge", Tensor::ge, Tensor::ge_scalar, |x, y| x >= y),
    ]
}

/// Values on a coarse grid so that ties (and so `eq`) actually occur.
fn grid(seed: u64, n: usize) -> Vec<f64> {
    rand_f64(seed, n)
        .into_iter()
        .map(|u| (u * 4.0).round() / 2.0)
        .collect()
}

fn bools(t: &Tensor) -> Vec<f64> {
    assert_eq!(t.dtype(), DType::Bool);
    values_f64(t)
}

#[test]
fn comparisons_match_reference() {
    let int_dtypes = [DType::I64, DType::U8];
    for (name, op, scalar_op, f) in cases() {
        for &dtype in FLOATS.iter().chain(&int_dtypes) {
            for (sa, sb) in PAIRS {
                let vals = |seed, s: &[usize]| -> Vec<f64> {
                    let g = grid(seed, s.iter().product());
                    if dtype == DType::U8 {
                        g.into_iter().map(|v| (v * 2.0).abs()).collect()
                    } else {
                        g
                    }
                };
                let (av, bv) = (vals(1, sa), vals(2, sb));
                let (la, lb) = (layouts_any(dtype, &av, sa), layouts_any(dtype, &bv, sb));
                let (ra, rb) = (values_f64(&la[0]), values_f64(&lb[0]));
                let (shape, want) = zip_ref(&ra, sa, &rb, sb, |x, y| f(x, y) as u8 as f64);
                for a in &la {
                    for b in &lb {
                        let r = op(a, b).unwrap();
                        assert_eq!(r.shape(), &shape[..]);
                        assert_eq!(bools(&r), want, "{name} {dtype} {sa:?} {sb:?}");
                    }
                    let want_s: Vec<f64> = ra.iter().map(|&x| f(x, 0.5) as u8 as f64).collect();
                    assert_eq!(
                        bools(&scalar_op(a, 0.5).unwrap()),
                        want_s,
                        "{name}_scalar {dtype}"
                    );
                }
            }
        }
    }
}

#[test]
fn nan_and_mixed_dtype_comparisons() {
    let a = Tensor::from_vec(vec![f32::NAN, 1.0, -0.0], &[3]).unwrap();
    let b = Tensor::from_vec(vec![f32::NAN, f32::NAN, 0.0], &[3]).unwrap();
    assert_eq!(bools(&a.eq(&b).unwrap()), vec![0.0, 0.0, 1.0]);
    assert_eq!(bools(&a.ne(&b).unwrap()), vec![1.0, 1.0, 0.0]);
    assert_eq!(bools(&a.le(&b).unwrap()), vec![0.0, 0.0, 1.0]);
    assert_eq!(bools(&a.ne_scalar(f64::NAN).unwrap()), vec![1.0, 1.0, 1.0]);
    // f16 vs f32 compares in f32: f16(0.1) is not f32(0.1)...
    let h = Tensor::from_vec(vec![f16::from_f64(0.1)], &[1]).unwrap();
    let f = Tensor::from_vec(vec![0.1f32], &[1]).unwrap();
    assert_eq!(bools(&h.eq(&f).unwrap()), vec![0.0]);
    assert_eq!(bools(&h.lt(&f).unwrap()), vec![1.0]);
    // ...but against a scalar the scalar is rounded to f16, like PyTorch.
    assert_eq!(bools(&h.eq_scalar(0.1).unwrap()), vec![1.0]);
    let i = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    assert_eq!(bools(&i.lt_scalar(1.5).unwrap()), vec![1.0, 0.0]);
    assert_eq!(bools(&i.eq(&Tensor::scalar(2.0f32)).unwrap()), vec![0.0, 1.0]);
    let bad = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    let e = i.ge(&bad).unwrap_err();
    assert_eq!(e.op(), "ge");
}

#[test]
fn logical_ops_use_truthiness() {
    let av = [0.0, 1.0, -0.0, 2.5, f64::NAN, 0.0];
    let bv = [1.0, 0.0, 3.0];
    let truth = |v: f64| v != 0.0;
    for a in layouts_any(DType::F32, &av, &[2, 3]) {
        for b in layouts_any(DType::I64, &bv, &[3]) {
            for (name, r, f) in [
                (
                    "and",
                    a.logical_and(&b),
                    (|x, y| x && y) as fn(bool, bool) -> bool,
                ),
                ("or", a.logical_or(&b), |x, y| x || y),
                ("xor", a.logical_xor(&b), |x, y| x != y),
            ] {
                let (_, want) = zip_ref(&av, &[2, 3], &bv, &[3], |x, y| f(truth(x), truth(y)) as u8 as f64);
                assert_eq!(bools(&r.unwrap()), want, "logical_{name}");
            }
        }
        let not: Vec<f64> = av.iter().map(|&x| (!truth(x)) as u8 as f64).collect();
        assert_eq!(bools(&a.logical_not().unwrap()), not);
    }
    let e = Tensor::from_vec(vec![true; 2], &[2]).unwrap();
    assert_eq!(
        e.logical_or(&Tensor::from_vec(vec![true; 3], &[3]).unwrap())
            .unwrap_err()
            .op(),
        "logical_or"
    );
}

#[test]
fn where_selects_broadcasts_and_promotes() {
    let cv = [1.0, 0.0, 1.0];
    let av = rand_f64(3, 4);
    for c in layouts_any(DType::Bool, &cv, &[3, 1]) {
        for a in layouts_any(DType::F32, &av, &[1, 4]) {
            let b = Tensor::scalar(-5i64);
            let r = Tensor::where_(&c, &a, &b).unwrap();
            assert_eq!(r.shape(), &[3, 4]);
            assert_eq!(r.dtype(), DType::F32);
            let ra = values_f64(&a);
            let want: Vec<f64> = (0..12)
                .map(|k| if cv[k / 4] != 0.0 { ra[k % 4] } else { -5.0 })
                .collect();
            assert_eq!(values_f64(&r), want);
        }
    }
    let nb = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
    let e = Tensor::where_(&nb, &nb, &nb).unwrap_err();
    assert_eq!(e.op(), "where");
    assert!(e.to_string().contains("bool"), "{e}");
    let c = Tensor::from_vec(vec![true; 2], &[2]).unwrap();
    assert!(Tensor::where_(&c, &nb, &nb).is_err());
    let empty = Tensor::from_vec(Vec::<bool>::new(), &[0, 3]).unwrap();
    assert_eq!(
        Tensor::where_(&empty, &nb, &Tensor::scalar(0.0f64))
            .unwrap()
            .shape(),
        &[0, 3]
    );
}
