//! User mistakes are `Err`s naming the op and the shapes, not panics.

use tessera_autograd::Var;
use tessera_tensor::{DType, Error, Tensor};

fn leaf(shape: &[usize], dtype: DType) -> Var {
    let n = shape.iter().product();
    Var::leaf(
        Tensor::from_vec((0..n).map(|i| i as f64 * 0.1 + 0.5).collect(), shape)
            .unwrap()
            .to_dtype(dtype)
            .unwrap(),
    )
}

fn message(e: Error) -> String {
    e.to_string()
}

#[test]
fn backward_on_a_non_scalar_without_gradient() {
    let y = leaf(&[2, 3], DType::F64).exp().unwrap();
    let m = message(y.backward().err().expect("non-scalar backward must fail"));
    assert!(m.contains("backward") && m.contains("[2, 3]"), "{m}");
}

#[test]
fn second_backward_over_freed_nodes() {
    let y = leaf(&[4], DType::F32).exp().unwrap().sum(&[], false).unwrap();
    y.backward().unwrap();
    let m = message(y.backward().err().expect("second backward must fail"));
    assert!(
        m.contains("`sum`") && m.contains("[]") && m.contains("already used"),
        "{m}"
    );
}

#[test]
fn gradient_of_the_wrong_shape_or_dtype() {
    let y = leaf(&[2, 3], DType::F64).tanh().unwrap();
    let wrong = Tensor::ones(&[3, 2], DType::F64).unwrap();
    let m = message(y.backward_with(&wrong).err().expect("wrong shape must fail"));
    assert!(
        m.contains("backward") && m.contains("[3, 2]") && m.contains("[2, 3]"),
        "{m}"
    );
    let wrong = Tensor::ones(&[2, 3], DType::F32).unwrap();
    let m = message(y.backward_with(&wrong).err().expect("wrong dtype must fail"));
    assert!(m.contains("float32") && m.contains("float64"), "{m}");
}

#[test]
fn ops_mixing_dtypes() {
    let (a, b) = (leaf(&[2, 3], DType::F64), leaf(&[3], DType::F32));
    for (name, r) in [
        ("add", a.add(&b)),
        ("mul", a.mul(&b)),
        ("maximum", a.maximum(&b)),
        ("pow", a.pow(&b)),
        (
            "where",
            Var::where_(&Tensor::ones(&[3], DType::Bool).unwrap(), &a, &b),
        ),
    ] {
        let m = message(r.expect_err("mixed dtypes must fail"));
        assert!(
            m.contains(name) && m.contains("[2, 3]") && m.contains("[3]") && m.contains("float32"),
            "{m}"
        );
    }
    let w = leaf(&[3], DType::F32);
    let m = message(
        a.layer_norm(&[3], Some(&w), None, 1e-5)
            .expect_err("mixed dtypes must fail"),
    );
    assert!(m.contains("layer_norm") && m.contains("[2, 3]"), "{m}");
}

#[test]
fn ops_on_shapes_that_do_not_fit() {
    let (a, b) = (leaf(&[2, 3], DType::F64), leaf(&[4], DType::F64));
    let m = message(a.add(&b).expect_err("non-broadcasting shapes must fail"));
    assert!(
        m.contains("add") && m.contains("[2, 3]") && m.contains("[4]"),
        "{m}"
    );
    let m = message(a.reshape([5]).expect_err("bad reshape must fail"));
    assert!(m.contains("reshape"), "{m}");
    assert!(a.sum(&[2], false).is_err());
    assert!(a.narrow(1, 2, 5).is_err());
    assert!(a.select(0, 2).is_err());
    assert!(a.softmax(3).is_err());
    assert!(a.layer_norm(&[2], None, None, 1e-5).is_err());
    assert!(a.group_norm(2, None, None, 1e-5).is_err());
}

#[test]
fn integer_values_cannot_require_grad_through_an_op() {
    let i = Var::leaf(Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap());
    let m = message(i.neg().expect_err("an integer op needing a gradient must fail"));
    assert!(
        m.contains("neg") && m.contains("[3]") && m.contains("int64"),
        "{m}"
    );
    // Without a gradient the same op is fine.
    assert!(Var::constant(Tensor::from_vec(vec![1i64], &[1]).unwrap())
        .neg()
        .is_ok());
    let x = leaf(&[2], DType::F32);
    assert!(x.to_dtype(DType::I64).is_err());
}

#[test]
fn operators_panic_with_the_method_message() {
    let (a, b) = (leaf(&[2, 3], DType::F64), leaf(&[4], DType::F64));
    let panic = std::panic::catch_unwind(|| &a + &b).expect_err("operator must panic");
    let m = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        m.contains("add") && m.contains("[2, 3]") && m.contains("[4]"),
        "{m}"
    );
}
