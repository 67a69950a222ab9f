//! Gradient values at the points finite differences cannot check (ties,
//! zeros, bounds, kinks), gradient dtypes, and the batch-norm running stats.

use tessera_autograd::Var;
use tessera_tensor::{DType, Result, Tensor};

fn leaf(v: &[f64], shape: &[usize]) -> Var {
    Var::leaf(Tensor::from_vec(v.to_vec(), shape).unwrap())
}

/// The gradient of `Σ f(x)` at `x`.
fn grad_of(x: &Var, f: impl Fn(&Var) -> Result<Var>) -> Vec<f64> {
    let g = f(x).unwrap().sum(&[], false).unwrap().backward().unwrap();
    g.get(x).unwrap().contiguous().unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn maximum_and_minimum_split_ties_evenly() {
    let (a, b) = (leaf(&[1.0, 2.0, 5.0], &[3]), leaf(&[1.0, 3.0, 4.0], &[3]));
    let g = a
        .maximum(&b)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(g.get(&a).unwrap().to_vec::<f64>().unwrap(), vec![0.5, 0.0, 1.0]);
    assert_eq!(g.get(&b).unwrap().to_vec::<f64>().unwrap(), vec![0.5, 1.0, 0.0]);
    let g = a
        .minimum(&b)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(g.get(&a).unwrap().to_vec::<f64>().unwrap(), vec![0.5, 1.0, 0.0]);
}

#[test]
fn amax_and_amin_split_ties_evenly() {
    let x = leaf(&[3.0, 1.0, 3.0, 2.0, 2.0, 0.0], &[2, 3]);
    assert_eq!(
        grad_of(&x, |x| x.max(&[], false)),
        vec![0.5, 0.0, 0.5, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        grad_of(&x, |x| x.max(&[1], false)),
        vec![0.5, 0.0, 0.5, 0.5, 0.5, 0.0]
    );
    assert_eq!(
        grad_of(&x, |x| x.min(&[0], true)),
        vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    );
    let y = leaf(&[-3.0, 3.0, 1.0], &[3]);
    assert_eq!(
        grad_of(&y, |y| y.norm(f64::INFINITY, &[], false)),
        vec![-0.5, 0.5, 0.0]
    );
}

#[test]
fn prod_gradient_with_zeros() {
    let x = leaf(&[2.0, 0.0, 3.0, 0.0, 0.0, 4.0], &[2, 3]);
    assert_eq!(
        grad_of(&x, |x| x.prod(&[1], false)),
        vec![0.0, 6.0, 0.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        grad_of(&x, |x| x.prod(&[0], true)),
        vec![0.0, 0.0, 4.0, 2.0, 0.0, 3.0]
    );
    assert_eq!(grad_of(&x, |x| x.prod(&[], false)), vec![0.0; 6]);
}

#[test]
fn kinks_follow_pytorch() {
    let x = leaf(&[-1.0, 0.0, 0.5, 1.0, 2.0], &[5]);
    // clamp passes the gradient on the bounds.
    assert_eq!(
        grad_of(&x, |x| x.clamp(Some(0.0), Some(1.0))),
        vec![0.0, 1.0, 1.0, 1.0, 0.0]
    );
    assert_eq!(grad_of(&x, |x| x.relu()), vec![0.0, 0.0, 1.0, 1.0, 1.0]);
    assert_eq!(grad_of(&x, |x| x.abs()), vec![-1.0, 0.0, 1.0, 1.0, 1.0]);
    // ‖0‖₂ has gradient 0, not NaN.
    let z = leaf(&[0.0, 0.0], &[2]);
    assert_eq!(grad_of(&z, |z| z.norm(2.0, &[], false)), vec![0.0, 0.0]);
    assert_eq!(grad_of(&z, |z| z.std(&[], 1.0, false)), vec![0.0, 0.0]);
}

#[test]
fn gradients_come_back_in_the_input_dtype() {
    let x = Var::leaf(Tensor::from_vec(vec![0.5f32, 1.5, -2.0], &[3]).unwrap());
    let loss = x
        .to_dtype(DType::F64)
        .unwrap()
        .exp()
        .unwrap()
        .sum(&[], false)
        .unwrap();
    let g = loss.backward().unwrap();
    let gx = g.get(&x).unwrap();
    assert_eq!(gx.dtype(), DType::F32);
    let want: Vec<f32> = [0.5f64, 1.5, -2.0].iter().map(|v| v.exp() as f32).collect();
    assert_eq!(gx.to_vec::<f32>().unwrap(), want);
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let x = Var::leaf(
            Tensor::from_vec(vec![0.5f64, 1.5, -2.0, 3.0], &[2, 2])
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        );
        let y = x
            .softmax(-1)
            .unwrap()
            .mul(&x)
            .unwrap()
            .layer_norm(&[2], None, None, 1e-5)
            .unwrap();
        let loss = y
            .sum(&[], false)
            .unwrap()
            .add(&x.norm(2.0, &[], false).unwrap())
            .unwrap();
        assert_eq!(loss.backward().unwrap().get(&x).unwrap().dtype(), dtype);
    }
}

#[test]
fn batch_norm_returns_running_stats_in_training_only() {
    let x = Var::leaf(Tensor::from_vec((0..12).map(|i| i as f64).collect(), &[3, 2, 2]).unwrap());
    let rm = Tensor::zeros(&[2], DType::F64).unwrap();
    let rv = Tensor::ones(&[2], DType::F64).unwrap();
    let out = x
        .batch_norm(Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5)
        .unwrap();
    // Channel 0 holds 0,1,4,5,8,9 (mean 4.5); channel 1 holds 2,3,6,7,10,11.
    let m = out.running_mean.unwrap().to_vec::<f64>().unwrap();
    assert!(
        (m[0] - 0.45).abs() < 1e-12 && (m[1] - 0.65).abs() < 1e-12,
        "{m:?}"
    );
    assert!(out.running_var.is_some());
    let eval = x
        .batch_norm(Some(&rm), Some(&rv), None, None, false, 0.1, 0.0)
        .unwrap();
    assert!(eval.running_mean.is_none() && eval.running_var.is_none());
    // In eval with mean 0 and var 1 the op is the identity.
    let g = eval.y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f64>().unwrap(), vec![1.0; 12]);
}

#[test]
fn no_grad_records_nothing() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = tessera_autograd::no_grad(|| x.exp().unwrap().mul(&x).unwrap());
    assert!(!y.requires_grad());
    let y = x.exp().unwrap();
    assert!(y.requires_grad() && !y.is_leaf());
}
