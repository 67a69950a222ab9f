//! RMSprop by hand (PyTorch comparisons are in `torch_reference_tests.rs`).

use super::*;
use crate::test_util::{param, run_steps, values};

/// Centered with momentum, θ₀ = 1, g = 2 each step, lr 0.01, α 0.9, μ 0.5,
/// ε 0 would divide by 0 at t = 1 (v − ḡ² = 0.4 − 0.04 = 0.36: fine):
/// t1: v = 0.1·4 = 0.4, ḡ = 0.1·2 = 0.2, √(v − ḡ²) = 0.6,
///     b = 2/(0.6 + ε), θ = 1 − 0.01·b.
#[test]
fn centered_momentum_first_step_by_hand() {
    let p = param(&[1.0], &[1]);
    let h = RmsPropOptions {
        lr: 0.01,
        alpha: 0.9,
        momentum: 0.5,
        centered: true,
        ..Default::default()
    };
    let mut opt = RmsProp::new(vec![p.clone()], h).unwrap();
    run_steps(&mut opt, &[(&p, &[2.0])], 1);
    let b1 = 2.0 / ((0.4f64 - 0.2 * 0.2).sqrt() + 1e-8);
    assert!((values(&p)[0] - (1.0 - 0.01 * b1)).abs() < 1e-15);
    // t2: v = 0.9·0.4 + 0.4 = 0.76, ḡ = 0.2 + 0.1·(2 − 0.2) = 0.38,
    //     b = 0.5·b1 + 2/(√(0.76 − 0.1444) + ε).
    run_steps(&mut opt, &[(&p, &[2.0])], 1);
    let b2 = 0.5 * b1 + 2.0 / ((0.76f64 - 0.38 * 0.38).sqrt() + 1e-8);
    assert!((values(&p)[0] - (1.0 - 0.01 * b1 - 0.01 * b2)).abs() < 1e-14);
    assert!(opt.state_buffer(0, 0, "grad_avg").is_some());
    assert!(opt.state_buffer(0, 0, "momentum_buffer").is_some());

    // Momentum without centering keeps no gradient average.
    let q = param(&[1.0], &[1]);
    let h = RmsPropOptions {
        momentum: 0.5,
        ..Default::default()
    };
    let mut opt = RmsProp::new(vec![q.clone()], h).unwrap();
    run_steps(&mut opt, &[(&q, &[2.0])], 1);
    assert!(opt.state_buffer(0, 0, "grad_avg").is_none());
    assert!(opt.state_buffer(0, 0, "momentum_buffer").is_some());
}
