//! LAMB against an independent f64 re-implementation of the spec's
//! equations (training-and-data.md §3.4), written naively here.

use super::*;
use crate::test_util::{assert_close, fixed_grads, param, values};
use crate::{Adam, AdamOptions, Optimizer, ParamGroup};

/// The spec's LAMB, one parameter list at a time, in plain f64.
struct Reference {
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    t: i32,
}

impl Reference {
    fn step(
        &mut self,
        params: &mut [Vec<f64>],
        grads: &[Vec<f64>],
        wds: &[f64],
        h: &LambOptions,
        max_norm: f64,
    ) {
        self.t += 1;
        let g_norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
        let c = (g_norm / max_norm).max(1.0);
        let (bc1, bc2) = if h.bias_correction {
            (1.0 - h.beta1.powi(self.t), 1.0 - h.beta2.powi(self.t))
        } else {
            (1.0, 1.0)
        };
        let beta3 = if h.grad_averaging { 1.0 - h.beta1 } else { 1.0 };
        for (k, p) in params.iter_mut().enumerate() {
            let wd = wds[k];
            if h.decoupled_decay {
                p.iter_mut().for_each(|x| *x -= h.lr * wd * *x);
            }
            let mut u = vec![0.0; p.len()];
            for i in 0..p.len() {
                let g = grads[k][i] / c;
                self.m[k][i] = h.beta1 * self.m[k][i] + beta3 * g;
                self.v[k][i] = h.beta2 * self.v[k][i] + (1.0 - h.beta2) * g * g;
                u[i] = (self.m[k][i] / bc1) / ((self.v[k][i] / bc2).sqrt() + h.eps);
                if !h.decoupled_decay {
                    u[i] += wd * p[i];
                }
            }
            let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
            let mut r = 1.0;
            if wd != 0.0 || h.always_adapt {
                let (wn, un) = (norm(p), norm(&u));
                if wn > 0.0 && un > 0.0 {
                    r = wn / un;
                }
                if h.trust_clip {
                    r = r.min(1.0);
                }
            }
            for i in 0..p.len() {
                p[i] -= h.lr * r * u[i];
            }
        }
    }
}

fn run(h: LambOptions, max_norm: f64, steps: usize) {
    let w0 = vec![0.5, -1.5, 2.0, 0.25, -0.75, 1.0];
    let b0 = vec![0.1, -0.2, 0.0];
    let w = param(&w0, &[2, 3]);
    let b = param(&b0, &[3]);
    let no_decay = LambOptions {
        weight_decay: 0.0,
        ..h
    };
    let groups = vec![
        ParamGroup::new(vec![w.clone()], h),
        ParamGroup::new(vec![b.clone()], no_decay),
    ];
    let mut opt = Lamb::from_rule(LambRule::new(max_norm), groups).unwrap();
    let mut reference = Reference {
        m: vec![vec![0.0; 6], vec![0.0; 3]],
        v: vec![vec![0.0; 6], vec![0.0; 3]],
        t: 0,
    };
    let mut expected = vec![w0, b0];
    for t in 0..steps {
        let s = t as f64 + 1.0;
        let gw: Vec<f64> = (0..6).map(|i| (i as f64 - 2.5) * s * 0.7).collect();
        let gb: Vec<f64> = (0..3).map(|i| (1.0 - i as f64) * 0.3 / s).collect();
        opt.step(&fixed_grads(&[(&w, &gw), (&b, &gb)])).unwrap();
        reference.step(&mut expected, &[gw, gb], &[h.weight_decay, 0.0], &h, max_norm);
        assert_close(&values(&w), &expected[0], 1e-13, &format!("{h:?} w step {t}"));
        assert_close(&values(&b), &expected[1], 1e-13, &format!("{h:?} b step {t}"));
    }
}

#[test]
fn matches_the_spec_equations() {
    let h = LambOptions {
        lr: 0.01,
        ..Default::default()
    };
    // Gradients of norm ≈ 2–9 against max_grad_norm 1: clipping is active.
    run(h, 1.0, 4);
    run(h, f64::INFINITY, 4);
    run(
        LambOptions {
            trust_clip: true,
            always_adapt: true,
            ..h
        },
        1.0,
        4,
    );
    run(
        LambOptions {
            decoupled_decay: true,
            weight_decay: 0.1,
            ..h
        },
        2.0,
        4,
    );
    run(
        LambOptions {
            bias_correction: false,
            grad_averaging: false,
            ..h
        },
        5.0,
        3,
    );
}

/// The spec's oracle: LAMB with λ = 0 (no trust ratio) and no clipping is
/// Adam with the same ε.
#[test]
fn without_weight_decay_or_clipping_it_is_adam() {
    let p = param(&[0.3, -0.7, 1.1], &[3]);
    let q = param(&[0.3, -0.7, 1.1], &[3]);
    let h = LambOptions {
        lr: 0.05,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut lamb = Lamb::from_rule(
        LambRule::new(f64::INFINITY),
        vec![ParamGroup::new(vec![p.clone()], h)],
    )
    .unwrap();
    let a = AdamOptions {
        lr: 0.05,
        eps: 1e-6,
        ..Default::default()
    };
    let mut adam = Adam::new(vec![q.clone()], a).unwrap();
    for t in 0..5 {
        let g = [0.4 * t as f64 - 0.5, 1.5, -0.25 * t as f64];
        lamb.step(&fixed_grads(&[(&p, &g)])).unwrap();
        adam.step(&fixed_grads(&[(&q, &g)])).unwrap();
    }
    assert_close(&values(&p), &values(&q), 1e-14, "lamb vs adam");
}

#[test]
fn max_grad_norm_is_saved_and_validated() {
    let p = param(&[1.0], &[1]);
    let mut opt = Lamb::from_rule(
        LambRule::new(3.5),
        vec![ParamGroup::new(vec![p.clone()], LambOptions::default())],
    )
    .unwrap();
    let sd = opt.state_dict();
    let mut other = Lamb::new(vec![p.clone()], LambOptions::default()).unwrap();
    assert_eq!(other.rule().max_grad_norm, 1.0);
    other.load_state_dict(&sd).unwrap();
    assert_eq!(other.rule().max_grad_norm, 3.5);
    opt.rule_mut().max_grad_norm = 0.0;
    assert!(opt.step(&fixed_grads(&[(&p, &[1.0])])).is_err());
}
