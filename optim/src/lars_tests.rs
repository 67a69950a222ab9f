//! LARS against an independent f64 re-implementation of the spec's
//! equations (training-and-data.md §3.5).

use super::*;
use crate::test_util::{assert_close, fixed_grads, param, values};
use crate::Optimizer;

fn reference(p: &mut [f64], g: &[f64], buf: &mut Option<Vec<f64>>, h: &LarsOptions) {
    let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    let mut d = g.to_vec();
    if h.weight_decay != 0.0 || h.always_adapt {
        let (w, gn) = (norm(p), norm(g));
        let mut r = if w > 0.0 && gn > 0.0 {
            h.trust_coeff * w / (gn + h.weight_decay * w + h.eps)
        } else {
            1.0
        };
        if h.trust_clip {
            r = (r / h.lr).min(1.0);
        }
        for i in 0..d.len() {
            d[i] = (g[i] + h.weight_decay * p[i]) * r;
        }
    }
    if h.momentum != 0.0 {
        let b = match buf {
            None => buf.insert(d.clone()),
            Some(b) => {
                for i in 0..b.len() {
                    b[i] = h.momentum * b[i] + (1.0 - h.dampening) * d[i];
                }
                b
            }
        };
        for i in 0..d.len() {
            d[i] = if h.nesterov {
                d[i] + h.momentum * b[i]
            } else {
                b[i]
            };
        }
    }
    for i in 0..p.len() {
        p[i] -= h.lr * d[i];
    }
}

#[test]
fn matches_the_spec_equations() {
    let cases = [
        LarsOptions {
            lr: 0.5,
            weight_decay: 1e-2,
            momentum: 0.9,
            ..Default::default()
        },
        LarsOptions {
            lr: 0.5,
            weight_decay: 1e-2,
            momentum: 0.9,
            nesterov: true,
            ..Default::default()
        },
        LarsOptions {
            lr: 2.0,
            weight_decay: 5e-4,
            trust_clip: true,
            trust_coeff: 0.02,
            ..Default::default()
        },
        LarsOptions {
            lr: 0.1,
            always_adapt: true,
            momentum: 0.8,
            dampening: 0.2,
            ..Default::default()
        },
        LarsOptions {
            lr: 0.1,
            ..Default::default()
        },
    ];
    for h in cases {
        let x0 = vec![0.5, -1.5, 2.0, 0.0, -0.75, 1.0];
        let p = param(&x0, &[2, 3]);
        let mut opt = Lars::new(vec![p.clone()], h).unwrap();
        let (mut expected, mut buf) = (x0, None);
        for t in 0..4 {
            let g: Vec<f64> = (0..6)
                .map(|i| (i as f64 - 2.0) * (t as f64 + 1.0) * 0.3)
                .collect();
            opt.step(&fixed_grads(&[(&p, &g)])).unwrap();
            reference(&mut expected, &g, &mut buf, &h);
            assert_close(&values(&p), &expected, 1e-14, &format!("{h:?} step {t}"));
        }
    }
}

/// A zero parameter gets ratio 1 (timm's `torch.where`), not 0.
#[test]
fn zero_norms_give_ratio_one() {
    let p = param(&[0.0, 0.0], &[2]);
    let h = LarsOptions {
        lr: 0.1,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut opt = Lars::new(vec![p.clone()], h).unwrap();
    opt.step(&fixed_grads(&[(&p, &[1.0, -2.0])])).unwrap();
    assert_eq!(values(&p), vec![-0.1, 0.2]);
}
