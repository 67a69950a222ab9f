//! The operators agree with the methods and panic with their error message.

use crate::test_util::{layouts_of, rand_f64, values_f64};
use crate::Tensor;

fn same(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.dtype(), b.dtype());
    let (x, y) = (values_f64(a), values_f64(b));
    assert!(
        x.iter()
            .zip(&y)
            .all(|(p, q)| p == q || (p.is_nan() && q.is_nan())),
        "{x:?} vs {y:?}"
    );
}

#[test]
fn operators_match_methods_for_every_ownership() {
    let a = layouts_of::<f32>(&rand_f64(1, 12), &[3, 4]).remove(3);
    let b = Tensor::from_vec(rand_f64(2, 4), &[4]).unwrap();
    same(&(&a + &b), &a.add(&b).unwrap());
    same(&(a.clone() + &b), &a.add(&b).unwrap());
    same(&(&a + b.clone()), &a.add(&b).unwrap());
    same(&(a.clone() + b.clone()), &a.add(&b).unwrap());
    same(&(&a - &b), &a.sub(&b).unwrap());
    same(&(a.clone() * b.clone()), &a.mul(&b).unwrap());
    same(&(&a / b.clone()), &a.div(&b).unwrap());
    same(&(&a + 2.0), &a.add_scalar(2.0).unwrap());
    same(&(2.0 + &a), &a.add_scalar(2.0).unwrap());
    same(&(a.clone() - 2.0), &a.sub_scalar(2.0).unwrap());
    same(&(2.0 - &a), &a.rsub_scalar(2.0).unwrap());
    same(&(&a * 3.0), &a.mul_scalar(3.0).unwrap());
    same(&(3.0 * a.clone()), &a.mul_scalar(3.0).unwrap());
    same(&(&a / 4.0), &a.div_scalar(4.0).unwrap());
    same(&(1.0 / &a), &a.rdiv_scalar(1.0).unwrap());
    same(&(-&a), &a.neg().unwrap());
    same(&(-a.clone()), &a.neg().unwrap());
    // A small expression: (a·2 − b)/3 against the naive values.
    let e = (&a * 2.0 - &b) / 3.0;
    let (av, bv) = (values_f64(&a), values_f64(&b));
    for (k, got) in values_f64(&e).into_iter().enumerate() {
        let want = ((av[k] as f32 * 2.0 - bv[k % 4] as f32) / 3.0) as f64;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}

#[test]
#[should_panic(expected = "add: shape error: shapes [2, 3] and [4] cannot be broadcast together")]
fn add_panics_with_the_method_error() {
    let a = Tensor::from_vec(vec![0.0f32; 6], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![0.0f32; 4], &[4]).unwrap();
    let _ = &a + &b;
}

#[test]
#[should_panic(expected = "neg: dtype error: not supported for bool tensors")]
fn neg_of_bool_panics_with_the_method_error() {
    let a = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    let _ = -a;
}

#[test]
#[should_panic(expected = "sub: dtype error")]
fn bool_subtraction_panics() {
    let a = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    let _ = &a - a.clone();
}
