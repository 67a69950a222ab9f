//! SGD against steps worked by hand from the update equations.

use super::*;
use crate::test_util::{param, run_steps, values};
use crate::Optimizer;

/// θ₀ = 1, g = 1 every step, lr 0.1, μ 0.9, τ 0.5 (by hand):
/// t1: b = g = 1 (first step: no dampening), θ = 1 − 0.1 = 0.9
/// t2: b = 0.9·1 + 0.5·1 = 1.4, θ = 0.9 − 0.14 = 0.76
/// t3: b = 0.9·1.4 + 0.5 = 1.76, θ = 0.76 − 0.176 = 0.584
#[test]
fn momentum_with_dampening_by_hand() {
    let p = param(&[1.0], &[1]);
    let h = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        ..Default::default()
    };
    let mut opt = Sgd::new(vec![p.clone()], h).unwrap();
    for expected in [0.9, 0.76, 0.584] {
        run_steps(&mut opt, &[(&p, &[1.0])], 1);
        assert!(
            (values(&p)[0] - expected).abs() < 1e-15,
            "{:?} vs {expected}",
            values(&p)
        );
    }
    let buf = opt.state_buffer(0, 0, "momentum_buffer").unwrap();
    assert!((buf.to_vec::<f64>().unwrap()[0] - 1.76).abs() < 1e-15);
    assert_eq!(opt.param_step(0, 0), Some(3));
}

/// Nesterov, θ₀ = 1, g = 1, lr 0.1, μ 0.9 (by hand):
/// t1: b = 1, d = 1 + 0.9·1 = 1.9, θ = 0.81
/// t2: b = 0.9 + 1 = 1.9, d = 1 + 0.9·1.9 = 2.71, θ = 0.539
/// With weight decay 0.1 and maximize, t1: d = −1 + 0.1·1 = −0.9, b = −0.9,
/// d = −0.9 − 0.81 = −1.71, θ = 1.171.
#[test]
fn nesterov_weight_decay_and_maximize_by_hand() {
    let p = param(&[1.0], &[1]);
    let h = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    };
    let mut opt = Sgd::new(vec![p.clone()], h).unwrap();
    run_steps(&mut opt, &[(&p, &[1.0])], 1);
    assert!((values(&p)[0] - 0.81).abs() < 1e-15);
    run_steps(&mut opt, &[(&p, &[1.0])], 1);
    assert!((values(&p)[0] - 0.539).abs() < 1e-15);

    let q = param(&[1.0], &[1]);
    let h = SgdOptions {
        weight_decay: 0.1,
        maximize: true,
        ..h
    };
    let mut opt = Sgd::new(vec![q.clone()], h).unwrap();
    run_steps(&mut opt, &[(&q, &[1.0])], 1);
    assert!((values(&q)[0] - 1.171).abs() < 1e-15);
}

/// A momentum turned on after some steps starts its buffer from the
/// gradient (PyTorch: `momentum_buffer` is None until momentum is used).
#[test]
fn momentum_switched_on_later_starts_from_the_gradient() {
    let p = param(&[1.0], &[1]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    run_steps(&mut opt, &[(&p, &[1.0])], 1);
    assert!(opt.state_buffer(0, 0, "momentum_buffer").is_none());
    opt.hyper_mut(0).unwrap().set_momentum(0.9).unwrap();
    run_steps(&mut opt, &[(&p, &[2.0])], 1);
    // b = g = 2 (fresh), θ = 0.9 − 0.2.
    assert!((values(&p)[0] - 0.7).abs() < 1e-15);
    run_steps(&mut opt, &[(&p, &[2.0])], 1);
    // b = 0.9·2 + 2 = 3.8, θ = 0.7 − 0.38.
    assert!((values(&p)[0] - 0.32).abs() < 1e-15);
}

#[test]
fn invalid_hyperparameters_are_errors() {
    let p = param(&[1.0], &[1]);
    for h in [
        SgdOptions {
            lr: -1.0,
            ..Default::default()
        },
        SgdOptions {
            momentum: -0.1,
            ..Default::default()
        },
        SgdOptions {
            nesterov: true,
            ..Default::default()
        },
        SgdOptions {
            nesterov: true,
            momentum: 0.9,
            dampening: 0.1,
            ..Default::default()
        },
        SgdOptions {
            weight_decay: f64::NAN,
            ..Default::default()
        },
    ] {
        assert!(Sgd::new(vec![p.clone()], h).is_err(), "{h:?}");
    }
    let mut opt = Sgd::new(vec![p.clone()], SgdOptions::default()).unwrap();
    opt.hyper_mut(0).unwrap().set_lr(-0.5);
    let grads = crate::test_util::fixed_grads(&[(&p, &[1.0])]);
    assert!(opt.step(&grads).is_err(), "checked again at each step");
    assert_eq!(values(&p), vec![1.0]);
}
