//! Default and explicit initialisations against PyTorch's formulas,
//! statistically: bounds exactly, mean and variance within a few standard
//! errors of the formula (n ≥ 10⁵ samples, so 3% relative on variances).

use tessera_autograd::Parameter;
use tessera_nn::init::{self, FanMode, Nonlinearity};
use tessera_nn::*;
use tessera_tensor::{DType, Tensor};

fn values(p: &Parameter) -> Vec<f64> {
    p.tensor()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n)
}

/// Checks U(−b, b): every value inside, mean ≈ 0, variance ≈ b²/3.
fn check_uniform(v: &[f64], b: f64, what: &str) {
    assert!(v.iter().all(|x| x.abs() <= b), "{what}: a value outside ±{b}");
    let (m, var) = mean_var(v);
    let se = b / (3.0 * v.len() as f64).sqrt();
    assert!(m.abs() < 5.0 * se, "{what}: mean {m}");
    let want = b * b / 3.0;
    assert!((var / want - 1.0).abs() < 0.03, "{what}: var {var} vs {want}");
    // Uses the whole range (not a narrower distribution).
    let max = v.iter().cloned().fold(0.0, f64::max);
    assert!(max > 0.99 * b, "{what}: max {max}");
}

fn check_normal(v: &[f64], std: f64, what: &str) {
    let (m, var) = mean_var(v);
    assert!(m.abs() < 5.0 * std / (v.len() as f64).sqrt(), "{what}: mean {m}");
    assert!(
        (var / (std * std) - 1.0).abs() < 0.03,
        "{what}: var {var} vs {}",
        std * std
    );
}

#[test]
fn linear_and_conv_defaults_are_kaiming_uniform_a_sqrt5() {
    tessera_tensor::manual_seed(3);
    let l = Linear::new(400, 300, true).unwrap();
    check_uniform(&values(&l.weight), 1.0 / 400f64.sqrt(), "Linear.weight");
    let c = Conv2d::new(16, 800, 3, Conv2dOptions::default().groups(4)).unwrap();
    assert_eq!(c.weight.shape(), [800, 4, 3, 3]);
    // fan_in = in/groups · k² = 36.
    check_uniform(&values(&c.weight), 1.0 / 6.0, "Conv2d.weight");
    // Biases: U(±1/√fan_in); few samples, so only the bound and spread.
    let b = values(c.bias.as_ref().unwrap());
    assert!(b.iter().all(|x| x.abs() <= 1.0 / 6.0));
    assert!(b.iter().cloned().fold(0.0, f64::max) > 0.15);
    let lb = values(l.bias.as_ref().unwrap());
    assert!(lb.iter().all(|x| x.abs() <= 0.05) && lb.iter().any(|x| x.abs() > 0.045));
}

#[test]
fn norms_embedding_and_attention_defaults() {
    let bn = BatchNorm::new_2d(5, BatchNormOptions::default()).unwrap();
    assert_eq!(values(bn.weight.as_ref().unwrap()), vec![1.0; 5]);
    assert_eq!(values(bn.bias.as_ref().unwrap()), vec![0.0; 5]);
    let ln = LayerNorm::new(&[2, 3], 1e-5, true, true).unwrap();
    assert_eq!(values(ln.weight.as_ref().unwrap()), vec![1.0; 6]);
    tessera_tensor::manual_seed(4);
    let e = Embedding::new(1000, 200, Some(7)).unwrap();
    let v = values(&e.weight);
    assert!(v[7 * 200..8 * 200].iter().all(|&x| x == 0.0));
    check_normal(&v, 1.0, "Embedding.weight");
    let mha = MultiheadAttention::new(256, 4, 0.0, true).unwrap();
    // xavier_uniform on [768, 256]: bound √(6 / 1024).
    check_uniform(
        &values(&mha.in_proj_weight),
        (6.0f64 / 1024.0).sqrt(),
        "in_proj_weight",
    );
    assert!(values(mha.in_proj_bias.as_ref().unwrap())
        .iter()
        .all(|&x| x == 0.0));
    assert!(values(mha.out_proj.bias.as_ref().unwrap())
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn init_functions_follow_torch_formulas() {
    tessera_tensor::manual_seed(5);
    let p = Parameter::new(Tensor::zeros(&[300, 200, 2], DType::F32).unwrap());
    let (fi, fo) = init::fan_in_and_fan_out(&p.shape()).unwrap();
    assert_eq!((fi, fo), (400, 600));

    init::xavier_uniform_(&p, 2.0).unwrap();
    check_uniform(&values(&p), 2.0 * (6.0f64 / 1000.0).sqrt(), "xavier_uniform");
    init::xavier_normal_(&p, 1.0).unwrap();
    check_normal(&values(&p), (2.0f64 / 1000.0).sqrt(), "xavier_normal");
    init::kaiming_uniform_(&p, FanMode::FanOut, Nonlinearity::Relu).unwrap();
    check_uniform(
        &values(&p),
        (6.0f64 / 600.0).sqrt(),
        "kaiming_uniform fan_out relu",
    );
    init::kaiming_normal_(&p, FanMode::FanIn, Nonlinearity::Tanh).unwrap();
    check_normal(&values(&p), 5.0 / 3.0 / 20.0, "kaiming_normal fan_in tanh");

    // trunc_normal(std 1, [-2, 2]): variance 1 − 2·φ(2)·2 / (Φ(2) − Φ(−2)).
    init::trunc_normal_(&p, 0.0, 1.0, -2.0, 2.0).unwrap();
    let v = values(&p);
    assert!(v.iter().all(|x| x.abs() <= 2.0));
    let phi2 = (-2.0f64).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mass = 0.954_499_736_103_641_6; // Φ(2) − Φ(−2)
    check_normal(&v, (1.0 - 4.0 * phi2 / mass).sqrt(), "trunc_normal");

    assert!(
        (init::calculate_gain(Nonlinearity::LeakyRelu(5f64.sqrt())) - (1.0f64 / 3.0).sqrt()).abs() < 1e-12
    );
    let vec1 = Parameter::new(Tensor::zeros(&[4], DType::F32).unwrap());
    assert!(init::xavier_uniform_(&vec1, 1.0).is_err());
}
