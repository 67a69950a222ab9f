//! Adam/AdamW oracles worked from the equations (bit-level comparisons
//! against PyTorch are in `torch_reference_tests.rs`).

use super::*;
use crate::test_util::{param, run_steps, values};
use crate::Optimizer;
use tessera_tensor::{DType, Tensor};

/// The spec's oracle: at t = 1, m̂/√v̂ = g/|g|, so every coordinate moves by
/// lr·sign(g) up to ε: θ₁ = θ₀ − lr·g/(|g| + ε).
#[test]
fn first_step_moves_each_coordinate_by_lr() {
    let p = param(&[0.5, -0.25, 2.0, 0.0], &[2, 2]);
    let g = [3.0, -1e-3, 1e4, -7.0];
    let mut opt = Adam::new(
        vec![p.clone()],
        AdamOptions {
            lr: 0.01,
            ..Default::default()
        },
    )
    .unwrap();
    run_steps(&mut opt, &[(&p, &g)], 1);
    let v = values(&p);
    for (i, (&x0, &gi)) in [0.5f64, -0.25, 2.0, 0.0].iter().zip(&g).enumerate() {
        let expected = x0 - 0.01 * gi / (gi.abs() + 1e-8);
        assert!((v[i] - expected).abs() < 1e-15, "{i}: {} vs {expected}", v[i]);
    }
}

/// Second step by hand, θ₀ = 1, g₁ = 1, g₂ = −1, lr 0.1, default betas:
/// m₂ = 0.9·0.1 − 0.1 = −0.01, v₂ = 0.999·0.001 + 0.001 = 0.001999,
/// θ₂ = θ₁ − (0.1/(1 − 0.81))·m₂/(√v₂/√(1 − 0.998001) + 1e-8).
/// AdamW with λ = 0.1 first decays θ by (1 − 0.1·0.1) each step.
#[test]
fn second_step_and_decoupled_decay_by_hand() {
    let theta1 = 1.0 - 0.1 * 1.0 / (1.0 + 1e-8);
    let m2 = 0.9 * 0.1 - 0.1;
    let v2 = 0.999 * 0.001 + 0.001;
    let theta2 = theta1 - (0.1 / (1.0 - 0.81)) * m2 / (v2.sqrt() / (1.0f64 - 0.998001).sqrt() + 1e-8);

    let p = param(&[1.0], &[1]);
    let mut opt = Adam::new(
        vec![p.clone()],
        AdamOptions {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    run_steps(&mut opt, &[(&p, &[1.0])], 1);
    run_steps(&mut opt, &[(&p, &[-1.0])], 1);
    assert!(
        (values(&p)[0] - theta2).abs() < 1e-14,
        "{} vs {theta2}",
        values(&p)[0]
    );

    let q = param(&[1.0], &[1]);
    let h = AdamWOptions {
        lr: 0.1,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut opt = AdamW::new(vec![q.clone()], h).unwrap();
    run_steps(&mut opt, &[(&q, &[1.0])], 1);
    let w1 = 1.0 * (1.0 - 0.01) - 0.1 * 1.0 / (1.0 + 1e-8);
    run_steps(&mut opt, &[(&q, &[-1.0])], 1);
    let w2 = w1 * (1.0 - 0.01) - (0.1 / (1.0 - 0.81)) * m2 / (v2.sqrt() / (1.0f64 - 0.998001).sqrt() + 1e-8);
    assert!((values(&q)[0] - w2).abs() < 1e-14, "{} vs {w2}", values(&q)[0]);
    assert_eq!(opt.name(), "AdamW");
    assert_eq!(AdamWOptions::default().weight_decay, 1e-2);
    assert_eq!(AdamOptions::default().weight_decay, 0.0);
}

/// AMSGrad keeps the running maximum of v: after a large gradient then a
/// small one, max_exp_avg_sq holds the first step's v.
#[test]
fn amsgrad_keeps_the_maximum_second_moment() {
    let p = param(&[0.0], &[1]);
    let h = AdamOptions {
        amsgrad: true,
        ..Default::default()
    };
    let mut opt = Adam::new(vec![p.clone()], h).unwrap();
    run_steps(&mut opt, &[(&p, &[10.0])], 1);
    run_steps(&mut opt, &[(&p, &[0.0])], 1);
    let vmax = opt
        .state_buffer(0, 0, "max_exp_avg_sq")
        .unwrap()
        .to_vec::<f64>()
        .unwrap()[0];
    let v = opt
        .state_buffer(0, 0, "exp_avg_sq")
        .unwrap()
        .to_vec::<f64>()
        .unwrap()[0];
    assert!(
        (vmax - 0.1).abs() < 1e-15 && (v - 0.0999).abs() < 1e-15,
        "{vmax} {v}"
    );
}

/// f16 and bf16 parameters are stepped through f32 master copies with f32
/// state (apex O2 / DeepSpeed, not plain PyTorch, which keeps the state in
/// the parameter's dtype): with gradients exact in both dtypes the master
/// equals the f32 run bit for bit and the parameter is it rounded.
#[test]
fn half_precision_parameters_follow_f32_within_rounding() {
    for dtype in [DType::F16, DType::BF16] {
        let init = Tensor::from_vec(vec![0.5f32, -1.0, 0.25], &[3]).unwrap();
        let p16 = tessera_autograd::Parameter::new(init.to_dtype(dtype).unwrap());
        let p32 = tessera_autograd::Parameter::new(init.clone());
        let h = AdamWOptions {
            lr: 0.05,
            ..Default::default()
        };
        let mut o16 = AdamW::new(vec![p16.clone()], h).unwrap();
        let mut o32 = AdamW::new(vec![p32.clone()], h).unwrap();
        let g = Tensor::from_vec(vec![0.5f32, -0.25, 1.0], &[3]).unwrap();
        for _ in 0..3 {
            let mut g16 = tessera_autograd::Gradients::default();
            g16.insert(p16.id().unwrap(), g.to_dtype(dtype).unwrap());
            o16.step(&g16).unwrap();
            let mut g32 = tessera_autograd::Gradients::default();
            g32.insert(p32.id().unwrap(), g.clone());
            o32.step(&g32).unwrap();
        }
        assert_eq!(o16.state_buffer(0, 0, "exp_avg").unwrap().dtype(), DType::F32);
        let master = o16.master_weight(0, 0).unwrap();
        assert_eq!(
            master.to_vec::<f32>().unwrap(),
            p32.tensor().unwrap().to_vec::<f32>().unwrap()
        );
        let as_f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(
            as_f32(p16.tensor().unwrap()),
            as_f32(master.to_dtype(dtype).unwrap())
        );
        let a = p16
            .tensor()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let b = p32.tensor().unwrap().to_vec::<f32>().unwrap();
        let tol = if dtype == DType::F16 { 4e-3 } else { 3e-2 };
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tol * y.abs().max(1.0), "{dtype}: {a:?} vs {b:?}");
        }
    }
}

#[test]
fn invalid_betas_are_errors() {
    let p = param(&[1.0], &[1]);
    assert!(Adam::new(
        vec![p.clone()],
        AdamOptions {
            beta1: 1.0,
            ..Default::default()
        }
    )
    .is_err());
    assert!(AdamW::new(
        vec![p.clone()],
        AdamWOptions {
            beta2: -0.1,
            ..Default::default()
        }
    )
    .is_err());
    assert!(Adam::new(
        vec![p],
        AdamOptions {
            eps: -1.0,
            ..Default::default()
        }
    )
    .is_err());
}
