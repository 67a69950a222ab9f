//! Schedules against the spec's one-cycle oracle, PyTorch's values, and
//! timm's cosine formula worked by hand. The PyTorch numbers below were
//! printed by this script (PyTorch 2.15):
//!
//! ```python
//! import torch
//! from torch.optim.lr_scheduler import OneCycleLR, StepLR, MultiStepLR, LinearLR
//! def run(make, n, opt_cls=torch.optim.SGD, **kw):
//!     p = torch.nn.Parameter(torch.zeros(1))
//!     opt = opt_cls([p], lr=0.1, **kw)
//!     s = make(opt)
//!     lrs, moms = [], []
//!     for i in range(n + 1):
//!         g = opt.param_groups[0]
//!         lrs.append(g["lr"]); moms.append(g["momentum"] if "momentum" in g else g["betas"][0])
//!         if i < n:
//!             opt.step(); s.step()
//!     return lrs, moms
//! for name, make, n, kw in [
//!     ("onecycle_3phase_linear", lambda o: OneCycleLR(o, max_lr=2.0, total_steps=20, three_phase=True, anneal_strategy="linear", pct_start=0.25), 20, dict(momentum=0.9)),
//!     ("onecycle_adam", lambda o: OneCycleLR(o, max_lr=0.01, total_steps=10, div_factor=10.0, final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9), 10, None),
//!     ("steplr", lambda o: StepLR(o, step_size=3, gamma=0.5), 8, dict(momentum=0.9)),
//!     ("multisteplr", lambda o: MultiStepLR(o, milestones=[5, 2, 5], gamma=0.1), 8, dict(momentum=0.9)),
//!     ("linearlr", lambda o: LinearLR(o), 7, dict(momentum=0.9)),
//! ]:
//!     if kw is None:
//!         lrs, moms = run(make, n, torch.optim.Adam)
//!     else:
//!         lrs, moms = run(make, n, **kw)
//!     print(name, "lrs", "[" + ", ".join(repr(v) for v in lrs) + "]")
//!     if name.startswith("onecycle"):
//!         print(name, "moms", "[" + ", ".join(repr(v) for v in moms) + "]")
//! ```

use super::*;
use crate::test_util::{assert_close, param};
use crate::{Adagrad, AdagradOptions, Adam, AdamOptions, Sgd, SgdOptions};

const ONECYCLE_3PHASE_LINEAR_LRS: [f64; 21] = [
    0.08,
    0.5599999999999999,
    1.04,
    1.52,
    2.0,
    1.52,
    1.04,
    0.56,
    0.08000000000000007,
    0.072728,
    0.065456,
    0.058184,
    0.050912,
    0.04364,
    0.036368,
    0.029095999999999997,
    0.021823999999999996,
    0.014551999999999995,
    0.007279999999999995,
    7.999999999994123e-06,
    -0.0072640000000000066,
];
const ONECYCLE_3PHASE_LINEAR_MOMS: [f64; 21] = [
    0.95,
    0.9249999999999999,
    0.8999999999999999,
    0.875,
    0.85,
    0.875,
    0.8999999999999999,
    0.9249999999999999,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
    0.95,
];
const ONECYCLE_ADAM_LRS: [f64; 11] = [
    0.0009999999999999992,
    0.0055,
    0.01,
    0.009505339495172583,
    0.008119331560284375,
    0.00611649206511179,
    0.0038935079348882103,
    0.0018906684397156264,
    0.0005046605048274169,
    1e-05,
    0.0005046605048274164,
];
const ONECYCLE_ADAM_MOMS: [f64; 11] = [
    0.9,
    0.8500000000000001,
    0.8,
    0.804951556604879,
    0.8188255099070634,
    0.8388739533021843,
    0.8611260466978158,
    0.8811744900929367,
    0.895048443395121,
    0.9,
    0.895048443395121,
];
const STEPLR_LRS: [f64; 9] = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025];
const MULTISTEPLR_LRS: [f64; 9] = [
    0.1,
    0.1,
    0.010000000000000002,
    0.010000000000000002,
    0.010000000000000002,
    0.00010000000000000005,
    0.00010000000000000005,
    0.00010000000000000005,
    0.00010000000000000005,
];
const LINEARLR_LRS: [f64; 8] = [
    0.03333333333333333,
    0.04666666666666667,
    0.060000000000000005,
    0.07333333333333335,
    0.08666666666666668,
    0.1,
    0.1,
    0.1,
];

fn sgd(groups: usize) -> Sgd {
    let h = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    };
    let groups = (0..groups)
        .map(|_| crate::ParamGroup::new(vec![param(&[0.0], &[1])], h))
        .collect();
    Sgd::with_groups(groups).unwrap()
}

/// The lr and momentum of group 0 at steps 0..=n.
fn trace(s: &mut dyn LrScheduler, opt: &mut dyn Optimizer, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut lrs = vec![opt.lrs()[0]];
    let mut moms = vec![opt.hyper(0).unwrap().momentum().unwrap()];
    for _ in 0..n {
        s.step(opt).unwrap();
        lrs.push(opt.lrs()[0]);
        moms.push(opt.hyper(0).unwrap().momentum().unwrap());
        assert_eq!(s.get_lr()[0], *lrs.last().unwrap());
    }
    (lrs, moms)
}

/// training-and-data.md §9: T = 100, max_lr = 1: lr(0) = 0.04,
/// lr(29) = 1.0 (end of phase 1), lr(99) = 4e-6; momentum(0) = 0.95,
/// momentum(29) = 0.85.
#[test]
fn one_cycle_matches_the_spec_oracle() {
    let mut opt = sgd(1);
    let mut s = OneCycleLR::new(&mut opt, OneCycleOptions::new(1.0, 100)).unwrap();
    let (lrs, moms) = trace(&mut s, &mut opt, 99);
    assert!((lrs[0] - 0.04).abs() < 1e-15);
    assert!((lrs[29] - 1.0).abs() < 1e-15);
    assert!((lrs[99] - 4e-6).abs() < 1e-18);
    assert!((moms[0] - 0.95).abs() < 1e-15 && (moms[29] - 0.85).abs() < 1e-15);
    assert!((moms[99] - 0.95).abs() < 1e-15);
    assert!(lrs[..30].windows(2).all(|w| w[0] < w[1]) && lrs[29..].windows(2).all(|w| w[0] > w[1]));
    s.step(&mut opt).unwrap();
    assert_eq!(s.last_epoch(), 100);
    let before = opt.lrs();
    assert!(s.step(&mut opt).is_err(), "past total_steps");
    assert_eq!(opt.lrs(), before);
}

#[test]
fn one_cycle_matches_pytorch() {
    let mut opt = sgd(1);
    let o = OneCycleOptions {
        three_phase: true,
        anneal: Anneal::Linear,
        pct_start: 0.25,
        ..OneCycleOptions::new(2.0, 20)
    };
    let mut s = OneCycleLR::new(&mut opt, o).unwrap();
    let (lrs, moms) = trace(&mut s, &mut opt, 20);
    assert_close(&lrs, &ONECYCLE_3PHASE_LINEAR_LRS, 1e-12, "three-phase lr");
    assert_close(&moms, &ONECYCLE_3PHASE_LINEAR_MOMS, 1e-12, "three-phase momentum");

    // With Adam the cycle acts on β1.
    let mut adam = Adam::new(
        vec![param(&[0.0], &[1])],
        AdamOptions {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    let o = OneCycleOptions {
        div_factor: 10.0,
        final_div_factor: 100.0,
        base_momentum: 0.8,
        max_momentum: 0.9,
        ..OneCycleOptions::new(0.01, 10)
    };
    let mut s = OneCycleLR::new(&mut adam, o).unwrap();
    let (lrs, moms) = trace(&mut s, &mut adam, 10);
    assert_close(&lrs, &ONECYCLE_ADAM_LRS, 1e-12, "adam lr");
    assert_close(&moms, &ONECYCLE_ADAM_MOMS, 1e-12, "adam beta1");
    assert_eq!(adam.groups()[0].hyper.beta1, moms[10]);
}

#[test]
fn one_cycle_rejects_what_pytorch_rejects() {
    let mut opt = sgd(2);
    assert!(OneCycleLR::new(&mut opt, OneCycleOptions::new(1.0, 0)).is_err());
    assert!(OneCycleLR::new(
        &mut opt,
        OneCycleOptions {
            pct_start: 1.5,
            ..OneCycleOptions::new(1.0, 10)
        }
    )
    .is_err());
    assert!(OneCycleLR::new(
        &mut opt,
        OneCycleOptions {
            pct_start: 0.05,
            ..OneCycleOptions::new(1.0, 10)
        }
    )
    .is_err());
    assert!(OneCycleLR::new(
        &mut opt,
        OneCycleOptions {
            max_lr: vec![1.0, 2.0, 3.0],
            ..OneCycleOptions::new(1.0, 10)
        }
    )
    .is_err());
    let mut s = OneCycleLR::new(
        &mut opt,
        OneCycleOptions {
            max_lr: vec![1.0, 2.0],
            ..OneCycleOptions::new(1.0, 10)
        },
    )
    .unwrap();
    assert_close(s.get_lr(), &[0.04, 0.08], 1e-15, "per-group max_lr");
    s.step(&mut opt).unwrap();
    let mut ada = Adagrad::new(vec![param(&[0.0], &[1])], AdagradOptions::default()).unwrap();
    assert!(OneCycleLR::new(&mut ada, OneCycleOptions::new(1.0, 10)).is_err());
    let o = OneCycleOptions {
        cycle_momentum: false,
        ..OneCycleOptions::new(1.0, 10)
    };
    assert!(OneCycleLR::new(&mut ada, o).is_ok());
    // A scheduler built for two groups refuses an optimizer with one.
    let mut one = sgd(1);
    assert!(s.step(&mut one).is_err());
}

#[test]
fn step_multistep_and_linear_warmup_match_pytorch() {
    let mut opt = sgd(1);
    let mut s = StepLR::new(&mut opt, 3, 0.5).unwrap();
    assert_close(&trace(&mut s, &mut opt, 8).0, &STEPLR_LRS, 1e-15, "StepLR");
    let mut opt = sgd(1);
    let mut s = MultiStepLR::new(&mut opt, &[5, 2, 5], 0.1).unwrap();
    assert_close(
        &trace(&mut s, &mut opt, 8).0,
        &MULTISTEPLR_LRS,
        1e-12,
        "MultiStepLR",
    );
    let mut opt = sgd(1);
    let mut s = LinearWarmup::new(&mut opt, 1.0 / 3.0, 1.0, 5).unwrap();
    assert_close(
        &trace(&mut s, &mut opt, 7).0,
        &LINEARLR_LRS,
        1e-12,
        "LinearWarmup",
    );
    assert!(StepLR::new(&mut opt, 0, 0.1).is_err());
    assert!(LinearWarmup::new(&mut opt, 0.0, 1.0, 5).is_err());
    assert!(LinearWarmup::new(&mut opt, 0.5, 1.5, 5).is_err());
}

/// timm's cosine by hand: base 0.1, warm-up 3 steps from 1e-4, lr_min 1e-5,
/// t_initial 10 (no warm-up prefix: the cosine runs on the absolute t).
#[test]
fn cosine_with_warmup_by_hand() {
    let mut opt = sgd(1);
    let o = CosineOptions {
        warmup_t: 3,
        warmup_lr_init: 1e-4,
        lr_min: 1e-5,
        ..CosineOptions::new(10)
    };
    let mut s = CosineLR::new(&mut opt, o).unwrap();
    let (lrs, _) = trace(&mut s, &mut opt, 12);
    let pi = std::f64::consts::PI;
    let cos = |t: f64| 1e-5 + 0.5 * (0.1 - 1e-5) * (1.0 + (pi * t / 10.0).cos());
    let warm = |t: f64| 1e-4 + t * (0.1 - 1e-4) / 3.0;
    let expected: Vec<f64> = (0..=12)
        .map(|t| match t {
            0..3 => warm(t as f64),
            3..10 => cos(t as f64),
            _ => 1e-5, // cycle_limit 1: after the first cycle, lr_min
        })
        .collect();
    assert_close(&lrs, &expected, 1e-15, "cosine");

    // Warm-up prefix shifts the cosine; cycles of growing length restart it.
    let mut opt = sgd(1);
    let o = CosineOptions {
        warmup_t: 2,
        warmup_prefix: true,
        cycle_mul: 2.0,
        cycle_decay: 0.5,
        cycle_limit: 3,
        ..CosineOptions::new(4)
    };
    let s = CosineLR::new(&mut opt, o).unwrap();
    // t = 2 + 4 starts cycle 1 (length 8, peak 0.05); t = 2 + 12 starts cycle 2
    // (length 16, peak 0.025); t = 2 + 28 is past the third cycle.
    let at = |t: u64| s.lrs_at(t).unwrap()[0];
    assert!((at(2) - 0.1).abs() < 1e-15);
    assert!((at(4) - 0.05).abs() < 1e-15, "{}", at(4));
    assert!((at(6) - 0.05).abs() < 1e-15);
    assert!((at(10) - 0.025).abs() < 1e-15, "{}", at(10));
    assert!((at(14) - 0.025).abs() < 1e-15);
    assert!((at(22) - 0.0125).abs() < 1e-15, "{}", at(22));
    assert_eq!(at(30), 0.0);
    assert!(CosineLR::new(&mut opt, CosineOptions::new(0)).is_err());
}

#[test]
fn scheduler_state_round_trips_and_checks_settings() {
    let mut opt = sgd(2);
    let mut s = OneCycleLR::new(&mut opt, OneCycleOptions::new(1.0, 50)).unwrap();
    for _ in 0..17 {
        s.step(&mut opt).unwrap();
    }
    let path = std::env::temp_dir().join(format!("tessera-sched-{}.safetensors", std::process::id()));
    s.state_dict().save(&path).unwrap();
    let sd = StateDict::load(&path).unwrap();
    std::fs::remove_file(&path).ok();

    let mut opt2 = sgd(2);
    let mut r = OneCycleLR::new(&mut opt2, OneCycleOptions::new(1.0, 50)).unwrap();
    r.load_state_dict(&sd).unwrap();
    assert_eq!(r.last_epoch(), 17);
    assert_eq!(r.get_lr(), s.get_lr());
    for _ in 0..10 {
        s.step(&mut opt).unwrap();
        r.step(&mut opt2).unwrap();
        assert_eq!(opt.lrs(), opt2.lrs());
    }

    let mut other = OneCycleLR::new(&mut opt2, OneCycleOptions::new(2.0, 50)).unwrap();
    assert!(other.load_state_dict(&sd).is_err(), "different settings");
    let mut step = StepLR::new(&mut opt2, 3, 0.1).unwrap();
    assert!(step.load_state_dict(&sd).is_err(), "another schedule");
    assert_eq!(step.last_epoch(), 0);
}
