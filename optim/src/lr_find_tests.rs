//! The LR range test on a toy quadratic, its smoothing and stopping rule,
//! the suggestions, and the restore.

use super::*;
use crate::test_util::{fixed_grads, param, values};
use crate::{Sgd, SgdOptions};

/// A pure sweep: the lr schedule and the smoothing formula by hand.
#[test]
fn sweep_follows_fastais_schedule_and_smoothing() {
    struct Fake(Vec<f64>);
    impl LrFindTarget for Fake {
        fn train_step(&mut self, lr: f64) -> Result<f64> {
            self.0.push(lr);
            Ok(1.0 + self.0.len() as f64)
        }
        fn snapshot(&mut self) -> Result<StateDict> {
            Ok(StateDict::new())
        }
        fn restore(&mut self, _: StateDict) -> Result<()> {
            Ok(())
        }
    }
    let opts = LrFindOptions {
        start_lr: 1e-3,
        end_lr: 1.0,
        num_it: 3,
        stop_div: false,
        beta: 0.5,
    };
    let mut f = Fake(Vec::new());
    let r = lr_find(&mut f, &opts).unwrap();
    // num_it is raised to 6: lr_i = 1e-3·1000^(i/6).
    assert_eq!(r.lrs.len(), 6);
    for (i, lr) in r.lrs.iter().enumerate() {
        assert!((lr - 1e-3 * 1000f64.powf(i as f64 / 6.0)).abs() < 1e-15);
    }
    // losses 2, 3, ...: avg₁ = 1, smooth₁ = 1/(1−0.5) = 2; avg₂ = 0.5 + 1.5 = 2,
    // smooth₂ = 2/0.75 = 8/3.
    assert_eq!(r.raw_losses[..2], [2.0, 3.0]);
    assert!((r.losses[0] - 2.0).abs() < 1e-15 && (r.losses[1] - 8.0 / 3.0).abs() < 1e-15);
}

/// Divergence: the sweep stops at the first smoothed loss above 4× the
/// best, and records it.
#[test]
fn stops_when_the_loss_diverges() {
    struct Diverging(usize);
    impl LrFindTarget for Diverging {
        fn train_step(&mut self, _lr: f64) -> Result<f64> {
            self.0 += 1;
            Ok(if self.0 < 10 { 1.0 } else { 1e6 })
        }
        fn snapshot(&mut self) -> Result<StateDict> {
            Ok(StateDict::new())
        }
        fn restore(&mut self, _: StateDict) -> Result<()> {
            Ok(())
        }
    }
    let mut t = Diverging(0);
    let r = lr_find(&mut t, &LrFindOptions::default()).unwrap();
    // smooth at step 10: (0.98·avg₉ + 0.02e6)/(1 − 0.98¹⁰) ≫ 4.
    assert_eq!(r.lrs.len(), 10);
    assert!(*r.losses.last().unwrap() > 4.0);
    assert_eq!(t.0, 10);
}

/// SGD on f(θ) = ½·a·θ² (a = 4): steps converge for lr < 2/a = 0.5 and
/// diverge above. The loss valley lies below that, the model comes back
/// untouched, and the optimizer's state and lr too.
#[test]
fn finds_a_learning_rate_below_the_divergence_point_of_a_quadratic() {
    let a = 4.0;
    let p = param(&[1.0, -2.0, 0.5], &[3]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.01,
            momentum: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    // One step beforehand so there is optimizer state to restore.
    opt.step(&fixed_grads(&[(&p, &[0.1, 0.1, 0.1])])).unwrap();
    let before = values(&p);
    let opts = LrFindOptions {
        start_lr: 1e-4,
        end_lr: 10.0,
        num_it: 100,
        ..Default::default()
    };
    let q = p.clone();
    let r = lr_find_with(std::slice::from_ref(&p), &mut opt, &opts, |opt| {
        let x = values(&q);
        let loss: f64 = x.iter().map(|v| 0.5 * a * v * v).sum();
        let g: Vec<f64> = x.iter().map(|v| a * v).collect();
        opt.step(&fixed_grads(&[(&q, &g)]))?;
        Ok(loss)
    })
    .unwrap();
    assert!(
        r.lrs.len() < 100,
        "stopped on divergence after {} steps",
        r.lrs.len()
    );
    assert!(*r.lrs.last().unwrap() > 0.5, "divergence needs lr > 2/a");
    let s = r.suggestion().unwrap();
    assert!(s > 1e-3 && s < 0.5, "valley {s}");
    let steep = r.steep.unwrap();
    assert!(steep > 1e-3 && steep < 0.5, "steep {steep}");
    let minimum = r.minimum.unwrap();
    // The smoothed loss lags the raw one, so its minimum lies past the
    // divergence point; a tenth of it still lands in the stable range.
    assert!(minimum > 1e-3 && minimum < 0.5, "minimum {minimum}");
    assert_eq!(values(&p), before, "parameters restored");
    assert_eq!(opt.lrs(), vec![0.01], "lr restored");
    assert_eq!(opt.param_step(0, 0), Some(1), "optimizer state restored");
}

#[test]
fn restores_after_a_failing_step_and_rejects_bad_ranges() {
    let p = param(&[1.0], &[1]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.3,
            ..Default::default()
        },
    )
    .unwrap();
    let q = p.clone();
    let mut n = 0;
    let err = lr_find_with(
        std::slice::from_ref(&p),
        &mut opt,
        &LrFindOptions::default(),
        |opt| {
            n += 1;
            if n == 3 {
                return Err(tessera_tensor::Error::arg("test", "boom"));
            }
            opt.step(&fixed_grads(&[(&q, &[1.0])]))?;
            Ok(1.0)
        },
    );
    assert!(err.is_err());
    assert_eq!(values(&p), vec![1.0]);
    assert_eq!(opt.lrs(), vec![0.3]);
    let bad = LrFindOptions {
        start_lr: 0.0,
        ..Default::default()
    };
    assert!(lr_find_with(std::slice::from_ref(&p), &mut opt, &bad, |_| Ok(1.0)).is_err());
}

/// fastai's suggestion functions on a known curve: losses fall from index
/// 2 to 8, then rise.
#[test]
fn suggestions_follow_fastai() {
    let lrs: Vec<f64> = (0..12).map(|i| 10f64.powi(i - 6)).collect();
    let losses = [5.0, 6.0, 4.0, 3.5, 3.0, 2.0, 1.5, 1.2, 1.0, 1.1, 2.0, 9.0];
    // Longest decreasing run ends at 8 with length 7 (indices 2..=8, plus
    // index 1 (6.0) before 2): lds[8] = 8 (1, 2, ..., 8)?  6 > 4 > ... > 1:
    // indices 1..=8 decrease, so lds[8] = 8, max_start = 0, sections = 8/3,
    // idx = 0 + 2 + 1 = 3.
    assert_eq!(valley(&lrs, &losses), Some(lrs[3]));
    assert_eq!(minimum(&lrs, &losses), Some(lrs[8] / 10.0));
    // Steepest fall per decade: 5 → 6 rises, 6 → 4 falls by 2 (index 1).
    assert_eq!(steep(&lrs, &losses), Some(lrs[1]));
    assert_eq!(valley(&[], &[]), None);
    // The window drops the first num_it/10 and the last 5 points.
    let (l, s) = suggestion_window(&lrs, &losses, 20);
    assert_eq!((l.len(), s[0]), (5, 4.0));
    let nan = [1.0, 2.0, f64::NAN, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
    assert_eq!(suggestion_window(&lrs[..9], &nan, 10).1, &[2.0]);
}
