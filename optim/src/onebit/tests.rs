//! Single-process oracles of the compressed optimizers (spec §4.5 items 6
//! and 8); the multi-rank ones are in `tessera-parallel`'s `it::onebit`.

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::Tensor;

use super::*;
use crate::Optimizer;

/// Deterministic values in [-0.5, 0.5).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32) / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn param(seed: u64, shape: &[usize]) -> Parameter {
    Parameter::new(Tensor::from_vec(values(seed, shape.iter().product()), shape).unwrap())
}

fn grads_for(params: &[Parameter], seed: u64) -> Gradients {
    let mut g = Gradients::default();
    for (i, p) in params.iter().enumerate() {
        let v = values(seed * 31 + i as u64, p.numel());
        g.insert(p.id().unwrap(), Tensor::from_vec(v, &p.shape()).unwrap());
    }
    g
}

fn hyper() -> OnebitOptions {
    OnebitOptions {
        lr: 1e-2,
        weight_decay: 0.01,
        ..Default::default()
    }
}

#[test]
fn padded_len_is_a_multiple_of_n_lcm_n_8() {
    assert_eq!(padded_len(1, 1).unwrap(), 8);
    assert_eq!(padded_len(9, 1).unwrap(), 16);
    assert_eq!(padded_len(1, 2).unwrap(), 16);
    assert_eq!(padded_len(1, 3).unwrap(), 72);
    assert_eq!(padded_len(1000, 4).unwrap(), 1024);
    assert_eq!(padded_len(1, 6).unwrap(), 144);
    assert_eq!(padded_len(144, 6).unwrap(), 144);
    for n in 1..=9 {
        for numel in [1, 7, 9, 1000] {
            let p = padded_len(numel, n).unwrap();
            assert!(
                p >= numel && (p / n).is_multiple_of(8) && p.is_multiple_of(n),
                "n {n} numel {numel}: {p}"
            );
        }
    }
    assert!(padded_len(1, 0).is_err());
    assert!(padded_len(usize::MAX, 3).is_err());
}

/// Spec §4.5 item 8: with `freeze_step = ∞`, 1-bit Adam is the
/// non-bias-corrected Adam formula, bitwise.
#[test]
fn never_frozen_is_non_bias_corrected_adam_bitwise() {
    let shapes: [&[usize]; 2] = [&[3, 5], &[7]];
    let params: Vec<Parameter> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| param(i as u64, s))
        .collect();
    let mut opt = OnebitAdam::new(params.clone(), hyper(), u64::MAX).unwrap();
    let h = hyper();
    let (b1, w1, b2, w2) = (
        h.beta1 as f32,
        (1.0 - h.beta1) as f32,
        h.beta2 as f32,
        (1.0 - h.beta2) as f32,
    );
    let (eps, wd, neg_lr) = (h.eps as f32, h.weight_decay as f32, -h.lr as f32);
    let mut reference: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = params
        .iter()
        .map(|p| {
            (
                p.tensor().unwrap().to_vec::<f32>().unwrap(),
                vec![0.0; p.numel()],
                vec![0.0; p.numel()],
            )
        })
        .collect();
    for step in 0..6 {
        let grads = grads_for(&params, step);
        assert!(opt.wants_averaged_grads());
        opt.step(&grads).unwrap();
        for (p, (x, m, v)) in params.iter().zip(reference.iter_mut()) {
            let g = p.grad(&grads).unwrap().to_vec::<f32>().unwrap();
            for i in 0..x.len() {
                m[i] = m[i] * b1 + w1 * g[i];
                v[i] = v[i] * b2 + w2 * g[i] * g[i];
                let u = m[i] / (v[i].sqrt() + eps) + wd * x[i];
                x[i] += neg_lr * u;
            }
            let got = p.tensor().unwrap().to_vec::<f32>().unwrap();
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "step {step}"
            );
        }
    }
    assert!(!opt.frozen());
}

/// Spec §4.5 item 8: on one process the freeze skips the exchange, so the
/// update is Adam with the variance frozen at the warm-up's last value.
#[test]
fn single_process_freeze_keeps_the_variance() {
    let p = param(3, &[4, 4]);
    let mut opt = OnebitAdam::new(vec![p.clone()], hyper(), 3).unwrap();
    for step in 0..3 {
        opt.step(&grads_for(std::slice::from_ref(&p), step)).unwrap();
    }
    assert!(opt.frozen() && !opt.wants_averaged_grads());
    let v = opt.state_buffer(0, 0, "exp_avg_sq").unwrap().to_vec();
    let m0 = opt.state_buffer(0, 0, "exp_avg").unwrap().to_vec();
    let grads = grads_for(std::slice::from_ref(&p), 9);
    opt.step(&grads).unwrap();
    assert_eq!(opt.state_buffer(0, 0, "exp_avg_sq").unwrap(), v.as_slice());
    let g = p.grad(&grads).unwrap().to_vec::<f32>().unwrap();
    let m1 = opt.state_buffer(0, 0, "exp_avg").unwrap();
    for i in 0..g.len() {
        assert_eq!(m1[i], m0[i] * 0.9 + (1.0 - 0.9f64) as f32 * g[i]);
    }
    assert!(
        opt.error_feedback(0, 0).unwrap().is_empty(),
        "no exchange on one process"
    );
    assert_eq!(opt.take_wire_stats(), WireStats::default());
}

/// Spec §4.5 item 8 (DS `TestOneBitAdamCheckpointing`): the freeze follows
/// the saved step, the masks stay with the optimizer, and no error buffer
/// is saved.
#[test]
fn adam_reload_sets_the_freeze_from_the_step() {
    let p = param(5, &[8]);
    let run = |steps: u64| {
        let mut opt = OnebitAdam::new(vec![p.clone()], hyper(), 3).unwrap();
        for s in 0..steps {
            opt.step(&grads_for(std::slice::from_ref(&p), s)).unwrap();
        }
        opt.state_dict()
    };
    for (steps, frozen) in [(2, false), (3, true), (5, true)] {
        let sd = run(steps);
        assert!(
            sd.keys().all(|k| !k.contains("error")),
            "{:?}",
            sd.keys().collect::<Vec<_>>()
        );
        let mut fresh = OnebitAdam::new(vec![p.clone()], hyper(), 3).unwrap();
        let mask = Tensor::from_vec(vec![1.0f32; 8], &[8]).unwrap();
        fresh.set_exp_avg_mask(&p, &mask).unwrap();
        fresh.load_state_dict(&sd).unwrap();
        assert_eq!(fresh.frozen(), frozen, "after {steps} steps");
        assert_eq!(fresh.step_count(), steps);
        assert_eq!(
            fresh
                .state_dict()
                .tensor("state.0.exp_avg")
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            sd.tensor("state.0.exp_avg").unwrap().to_vec::<f32>().unwrap()
        );
        // The same saved state under a later freeze is back in the warm-up.
        let mut later = OnebitAdam::new(vec![p.clone()], hyper(), 100).unwrap();
        later.load_state_dict(&sd).unwrap();
        assert!(!later.frozen());
    }
    let mut lamb = OnebitLamb::new(vec![p.clone()], hyper(), OnebitLambConfig::default()).unwrap();
    assert!(
        lamb.load_state_dict(&run(2)).is_err(),
        "another optimizer's state"
    );
}

#[test]
fn bad_inputs_are_errors() {
    let p = param(1, &[2, 3]);
    let bad = OnebitOptions {
        beta1: 1.0,
        ..hyper()
    };
    assert!(OnebitAdam::new(vec![p.clone()], bad, 3).is_err());
    assert!(OnebitAdam::new(vec![p.clone(), p.clone()], hyper(), 3).is_err());
    let f64p = Parameter::new(Tensor::from_vec(vec![1.0f64; 3], &[3]).unwrap());
    assert!(OnebitAdam::new(vec![f64p], hyper(), 3).is_err());
    let mut opt = OnebitAdam::new(vec![p.clone()], hyper(), 3).unwrap();
    let wrong = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
    assert!(opt.set_exp_avg_mask(&p, &wrong).is_err());
    let mut g = Gradients::default();
    g.insert(p.id().unwrap(), wrong);
    assert!(opt.step(&g).is_err());
    assert!(opt.with_params(vec![vec![p.clone()]]).is_err());
    let cfg = OnebitLambConfig {
        min_coeff: 0.0,
        ..Default::default()
    };
    assert!(OnebitLamb::new(vec![p.clone()], hyper(), cfg).is_err());
    for r in [-1.0, f64::NAN, f64::INFINITY] {
        let e = OnebitAdam::new(vec![p.clone()], hyper(), 3)
            .unwrap()
            .with_variance_mask(Some(r))
            .err()
            .expect("a bad ratio is an error");
        assert!(e.to_string().contains("variance mask ratio"), "{e}");
    }
}

/// The automatic mask zeroes exactly the coordinates whose variance is at
/// most `r²·mean(v)`: with `r = 0` only exact zeros, with `None` nothing.
#[test]
fn low_variance_mask_follows_the_ratio() {
    use super::slots::mask_low_variance;
    let v = [0.0f32, 1e-9, 1.0, 2.0, 3.0, 1.2e-4];
    let run = |ratio| {
        let mut buf = [5.0f32; 6];
        mask_low_variance(&mut buf, &v, ratio);
        buf.map(|b| b == 0.0)
    };
    // mean(v) = 6.0001/6, so the floor of r = 0.01 is 1.00002e-4.
    assert_eq!(run(Some(0.01)), [true, true, false, false, false, false]);
    assert_eq!(run(Some(0.011)), [true, true, false, false, false, true]);
    assert_eq!(run(Some(0.0)), [true, false, false, false, false, false]);
    assert_eq!(run(None), [false; 6]);
    let mut all_zero = [1.0f32; 3];
    mask_low_variance(&mut all_zero, &[0.0; 3], Some(DEFAULT_VARIANCE_MASK));
    assert_eq!(all_zero, [0.0; 3], "a parameter that never had a gradient");
}

/// DeepSpeed's warm-up trust ratio and its running average, against an
/// f64 reference of the formula.
#[test]
fn lamb_warmup_trust_ratio() {
    let p = param(7, &[6]);
    let cfg = OnebitLambConfig {
        freeze_step: 10,
        ..Default::default()
    };
    let mut opt = OnebitLamb::new(vec![p.clone()], hyper(), cfg).unwrap();
    let x0 = p.tensor().unwrap().to_vec::<f32>().unwrap();
    let grads = grads_for(std::slice::from_ref(&p), 1);
    opt.step(&grads).unwrap();
    let g = p.grad(&grads).unwrap().to_vec::<f32>().unwrap();
    let h = hyper();
    let u: Vec<f64> = (0..6)
        .map(|i| {
            let m = (1.0 - h.beta1) * g[i] as f64;
            let v = (1.0 - h.beta2) * (g[i] as f64).powi(2);
            m / (v.sqrt() + h.eps) + h.weight_decay * x0[i] as f64
        })
        .collect();
    let nx = x0.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    let nu = u.iter().map(|v| v * v).sum::<f64>().sqrt();
    let coeff = (nx / nu).clamp(cfg.min_coeff, cfg.max_coeff);
    assert!((opt.lamb_coeffs()[0] - coeff).abs() < 1e-5 * coeff);
    let avg = opt.state_scalar(0, 0, "lamb_coeff_freeze").unwrap();
    assert!((avg - 0.1 * coeff).abs() < 1e-5 * coeff);
    let x1 = p.tensor().unwrap().to_vec::<f32>().unwrap();
    for i in 0..6 {
        let want = x0[i] as f64 - h.lr * coeff * u[i];
        assert!((x1[i] as f64 - want).abs() < 1e-5, "{i}: {} vs {want}", x1[i]);
    }
}

/// 1-bit LAMB's compression stage on one process: the factor stays within
/// its bounds and moves at most `factor_threshold` per step, and a reload
/// keeps the frozen state in the compression stage and drops it in the
/// warm-up (spec §4.5 item 8).
#[test]
fn lamb_compression_factor_and_reload() {
    let params = vec![param(11, &[4, 3]), param(12, &[5])];
    let cfg = OnebitLambConfig {
        freeze_step: 3,
        ..Default::default()
    };
    let mut opt = OnebitLamb::new(params.clone(), hyper(), cfg).unwrap();
    let mut saved_warm = None;
    let mut last = [1.0f64; 2];
    for s in 0..8 {
        if s == 2 {
            saved_warm = Some(opt.state_dict());
        }
        opt.step(&grads_for(&params, s)).unwrap();
        if opt.frozen() && s >= 3 {
            for (k, l) in last.iter_mut().enumerate() {
                let f = opt.state_scalar(0, k, "last_factor").unwrap();
                assert!((cfg.factor_min..=cfg.factor_max).contains(&f));
                assert!(
                    f <= *l * 1.1 + 1e-12 && f >= *l * 0.9 - 1e-12,
                    "factor {f} after {l}"
                );
                *l = f;
            }
        }
    }
    assert!(opt.frozen());
    let sd = opt.state_dict();
    let mut back = OnebitLamb::new(params.clone(), hyper(), cfg).unwrap();
    back.load_state_dict(&sd).unwrap();
    assert!(back.frozen());
    for name in ["scaling_coeff", "lamb_coeff_freeze", "last_factor"] {
        for k in 0..2 {
            assert_eq!(
                back.state_scalar(0, k, name),
                opt.state_scalar(0, k, name),
                "{name}"
            );
            assert!(back.state_scalar(0, k, name).is_some());
        }
    }
    back.load_state_dict(&saved_warm.unwrap()).unwrap();
    assert!(!back.frozen());
    for name in ["scaling_coeff", "lamb_coeff_freeze", "last_factor"] {
        assert_eq!(
            back.state_scalar(0, 0, name),
            None,
            "{name} is reset in the warm-up"
        );
    }
    // Identical continuations: the reloaded optimizer steps like the original.
    let mut twin = OnebitLamb::new(params.clone(), hyper(), cfg).unwrap();
    twin.load_state_dict(&sd).unwrap();
    let before: Vec<Vec<f32>> = params
        .iter()
        .map(|p| p.tensor().unwrap().to_vec().unwrap())
        .collect();
    opt.step(&grads_for(&params, 20)).unwrap();
    let after: Vec<Vec<f32>> = params
        .iter()
        .map(|p| p.tensor().unwrap().to_vec().unwrap())
        .collect();
    for (p, b) in params.iter().zip(&before) {
        p.set(Tensor::from_vec(b.clone(), &p.shape()).unwrap()).unwrap();
    }
    twin.step(&grads_for(&params, 20)).unwrap();
    for (p, a) in params.iter().zip(&after) {
        assert_eq!(&p.tensor().unwrap().to_vec::<f32>().unwrap(), a);
    }
}

fn zero_one_config() -> ZeroOneAdamConfig {
    ZeroOneAdamConfig {
        var_freeze_step: 20,
        var_update_scaler: 2,
        local_step_scaler: 3,
        local_step_clipper: 4,
    }
}

/// Spec §4.4's policies, against the schedule worked out by hand for
/// `var_update_scaler = 2`, `var_freeze_step = 20`, `local_step_scaler = 3`
/// and `local_step_clipper = 4`: variance steps at t = 1, 2 (interval 1),
/// 4, 6 (2), 8, 12 (4), 16 (8); local steps from t = 21, synchronising
/// at 21, 22, 23 (interval 1), 24, 26 (2), then every 4th step (4 = the
/// clipper, reached after t = 26).
#[test]
fn zero_one_policies_follow_the_hand_computed_schedule() {
    use ZeroOneStep::*;
    let p = param(21, &[5]);
    let mut opt = ZeroOneAdam::new(vec![p.clone()], hyper(), zero_one_config()).unwrap();
    let variance = [1, 2, 4, 6, 8, 12, 16];
    let syncs = [21, 22, 23, 24, 26, 28, 32, 36, 40];
    for t in 1..=40u64 {
        let want = if t <= 20 {
            if variance.contains(&t) {
                Variance
            } else {
                Compressed
            }
        } else if syncs.contains(&t) {
            Sync
        } else {
            Local
        };
        assert_eq!(opt.wants_averaged_grads(), want == Variance, "before step {t}");
        opt.step(&grads_for(std::slice::from_ref(&p), t)).unwrap();
        assert_eq!(opt.last_step(), Some(want), "step {t}");
        assert_eq!(opt.frozen(), t >= 20, "step {t}");
    }
    assert_eq!(opt.intervals(), (8, 4));
}

/// One process, f64 reference of spec §4.4's formulas: the variance only
/// moves on variance steps, the compressed steps update the momentum with
/// the gradient (no exchange on one rank), and a synchronisation undoes
/// the local updates and reapplies their average, leaving the momentum at
/// `−u/Σγ` (here `u` is this rank's own sum, so the parameters come back
/// to the local trajectory).
#[test]
fn zero_one_single_process_matches_the_formulas() {
    let p = param(22, &[3, 4]);
    let cfg = zero_one_config();
    let mut opt = ZeroOneAdam::new(vec![p.clone()], hyper(), cfg).unwrap();
    let h = hyper();
    let mut x: Vec<f64> = p
        .tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    let (mut m, mut v, mut u) = (vec![0f64; 12], vec![0f64; 12], vec![0f64; 12]);
    let mut lrs = 0f64;
    for t in 1..=30u64 {
        let lr = h.lr * (1.0 + t as f64 / 30.0);
        opt.set_lr(lr);
        let grads = grads_for(std::slice::from_ref(&p), t);
        let g: Vec<f64> = p
            .grad(&grads)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        let variance = opt.wants_averaged_grads();
        let frozen = opt.frozen();
        opt.step(&grads).unwrap();
        for i in 0..12 {
            if variance {
                v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
            }
            m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
            let d = lr * (m[i] / (v[i].sqrt() + h.eps) + h.weight_decay * x[i]);
            x[i] -= d;
            if frozen {
                u[i] -= d;
            }
        }
        if frozen {
            lrs += lr;
            if opt.last_step() == Some(ZeroOneStep::Sync) {
                for i in 0..12 {
                    let denom = v[i].sqrt() + h.eps;
                    m[i] = -u[i] * denom / lrs;
                }
                u.fill(0.0);
                lrs = 0.0;
            }
        }
        let got = p.tensor().unwrap().to_vec::<f32>().unwrap();
        let mg = opt.state_buffer(0, 0, "exp_avg").unwrap();
        let vg = opt.state_buffer(0, 0, "exp_avg_sq").unwrap();
        for i in 0..12 {
            assert!(
                (got[i] as f64 - x[i]).abs() < 1e-5,
                "step {t} param [{i}]: {} vs {}",
                got[i],
                x[i]
            );
            assert!(
                (mg[i] as f64 - m[i]).abs() < 1e-5 * m[i].abs().max(1e-2),
                "step {t} exp_avg [{i}]"
            );
            assert!(
                (vg[i] as f64 - v[i]).abs() < 1e-6 * v[i].abs().max(1e-3),
                "step {t} exp_avg_sq [{i}]"
            );
        }
    }
    assert_eq!(
        opt.take_wire_stats(),
        WireStats::default(),
        "no exchange on one process"
    );
}

/// A reload mid-way through a local interval continues bitwise as the
/// uninterrupted run (schedule, accumulated update and Σγ are kept), the
/// freeze follows the saved step, and no error buffer is saved.
#[test]
fn zero_one_reload_continues_the_schedule() {
    let params = vec![param(23, &[2, 3]), param(24, &[4])];
    let cfg = zero_one_config();
    for save_at in [5u64, 25, 29] {
        let mut opt = ZeroOneAdam::new(params.clone(), hyper(), cfg).unwrap();
        for t in 1..=save_at {
            opt.step(&grads_for(&params, t)).unwrap();
        }
        let sd = opt.state_dict();
        assert!(sd.keys().all(|k| !k.contains("error")));
        let mut back = ZeroOneAdam::new(params.clone(), hyper(), cfg).unwrap();
        back.load_state_dict(&sd).unwrap();
        assert_eq!(back.frozen(), save_at >= cfg.var_freeze_step);
        assert_eq!(back.intervals(), opt.intervals());
        assert_eq!(back.wants_averaged_grads(), opt.wants_averaged_grads());
        let start: Vec<Vec<f32>> = params
            .iter()
            .map(|p| p.tensor().unwrap().to_vec().unwrap())
            .collect();
        let run = |o: &mut ZeroOneAdam| {
            for (p, s) in params.iter().zip(&start) {
                p.set(Tensor::from_vec(s.clone(), &p.shape()).unwrap()).unwrap();
            }
            let mut kinds = Vec::new();
            for t in save_at + 1..=save_at + 12 {
                o.step(&grads_for(&params, t)).unwrap();
                kinds.push(o.last_step());
            }
            let x: Vec<Vec<f32>> = params
                .iter()
                .map(|p| p.tensor().unwrap().to_vec().unwrap())
                .collect();
            (kinds, x)
        };
        assert_eq!(run(&mut back), run(&mut opt), "saved after step {save_at}");
    }
    let mut bad = ZeroOneAdam::new(params.clone(), hyper(), cfg).unwrap();
    let adam = OnebitAdam::new(params.clone(), hyper(), 3).unwrap();
    assert!(bad.load_state_dict(&adam.state_dict()).is_err());
    for field in 0..3 {
        let mut c = cfg;
        match field {
            0 => c.var_update_scaler = 0,
            1 => c.local_step_scaler = 0,
            _ => c.local_step_clipper = 0,
        }
        assert!(ZeroOneAdam::new(params.clone(), hyper(), c).is_err(), "{c:?}");
    }
}
