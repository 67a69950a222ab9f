//! The parameter-group machinery shared by every optimizer: state dicts,
//! groups, skipped parameters, shared parameter handles, errors.

use std::path::PathBuf;

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{DType, Tensor};

use crate::test_util::{fixed_grads, param, values};
use crate::*;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tessera-optim-{name}-{}.safetensors", std::process::id()))
}

fn grads_at(t: usize, w: &Parameter, b: &Parameter) -> Gradients {
    let s = t as f64;
    fixed_grads(&[(w, &[0.5 - s, 1.0, -0.25 * s, 2.0]), (b, &[s - 1.5, 0.75])])
}

/// Trains 2 steps, saves to a file, restores into a fresh optimizer over
/// parameters holding the same values, and checks 3 more steps agree
/// bitwise with the uninterrupted run (and that the changed lr came back).
fn round_trip(make: impl Fn(Vec<Parameter>) -> Box<dyn Optimizer>, name: &str) {
    let (w, b) = (param(&[1.0, -2.0, 0.5, 0.25], &[2, 2]), param(&[0.1, -0.3], &[2]));
    let mut opt = make(vec![w.clone(), b.clone()]);
    for t in 0..2 {
        opt.step(&grads_at(t, &w, &b)).unwrap();
    }
    opt.hyper_mut(0).unwrap().set_lr(0.0123);
    let path = temp(name);
    opt.save(&path).unwrap();

    let (w2, b2) = (param(&values(&w), &[2, 2]), param(&values(&b), &[2]));
    let mut restored = make(vec![w2.clone(), b2.clone()]);
    restored.load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(restored.lrs(), vec![0.0123], "{name}: hyperparameters restored");
    for t in 2..5 {
        opt.step(&grads_at(t, &w, &b)).unwrap();
        restored.step(&grads_at(t, &w2, &b2)).unwrap();
    }
    assert_eq!(values(&w), values(&w2), "{name}");
    assert_eq!(values(&b), values(&b2), "{name}");
}

#[test]
fn every_optimizer_state_round_trips_through_safetensors() {
    round_trip(
        |p| {
            Box::new(
                Sgd::new(
                    p,
                    SgdOptions {
                        lr: 0.1,
                        momentum: 0.9,
                        nesterov: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        },
        "sgd",
    );
    round_trip(
        |p| {
            Box::new(
                Adam::new(
                    p,
                    AdamOptions {
                        amsgrad: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        },
        "adam",
    );
    round_trip(
        |p| Box::new(AdamW::new(p, AdamWOptions::default()).unwrap()),
        "adamw",
    );
    round_trip(
        |p| {
            Box::new(
                Adagrad::new(
                    p,
                    AdagradOptions {
                        lr_decay: 0.1,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        },
        "adagrad",
    );
    round_trip(
        |p| {
            Box::new(
                RmsProp::new(
                    p,
                    RmsPropOptions {
                        centered: true,
                        momentum: 0.5,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        },
        "rmsprop",
    );
    round_trip(
        |p| Box::new(Lamb::new(p, LambOptions::default()).unwrap()),
        "lamb",
    );
    round_trip(
        |p| {
            Box::new(
                Lars::new(
                    p,
                    LarsOptions {
                        momentum: 0.9,
                        weight_decay: 1e-3,
                        ..Default::default()
                    },
                )
                .unwrap(),
            )
        },
        "lars",
    );
}

#[test]
fn state_dict_names_follow_pytorch_indices() {
    let (w, b) = (param(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), param(&[0.0, 0.0], &[2]));
    let groups = vec![
        ParamGroup::new(vec![w.clone()], AdamOptions::default()),
        ParamGroup::new(
            vec![b.clone()],
            AdamOptions {
                lr: 0.5,
                ..Default::default()
            },
        ),
    ];
    let mut opt = Adam::with_groups(groups).unwrap();
    opt.step(&fixed_grads(&[(&b, &[1.0, 1.0])])).unwrap();
    let sd = opt.state_dict();
    let keys: Vec<&str> = sd.keys().collect();
    assert_eq!(
        keys,
        ["state.1.exp_avg", "state.1.exp_avg_sq"],
        "w had no gradient: no state"
    );
    assert_eq!(sd.metadata()["kind"], "Adam");
    assert_eq!(sd.metadata()["group.1.lr"], 0.5);
    assert_eq!(sd.metadata()["state.1.step"], 1);
    assert!(!sd.metadata().contains_key("state.0.step"));
}

#[test]
fn mismatched_state_dicts_are_errors_that_change_nothing() {
    let (w, b) = (param(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), param(&[0.0, 0.0], &[2]));
    let mut opt = Adam::new(vec![w.clone(), b.clone()], AdamOptions::default()).unwrap();
    opt.step(&grads_at(0, &w, &b)).unwrap();
    let good = opt.state_dict();

    let mut sgd = Sgd::new(vec![w.clone(), b.clone()], SgdOptions::default()).unwrap();
    assert!(sgd.load_state_dict(&good).is_err(), "another optimizer's state");

    let mut one = Adam::new(
        vec![w.clone()],
        AdamOptions {
            lr: 0.7,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(one.load_state_dict(&good).is_err(), "different parameter count");
    assert_eq!(one.lrs(), vec![0.7]);

    let mut bad = good.clone();
    bad.insert("state.0.exp_avg", Tensor::zeros(&[3], DType::F64).unwrap());
    let mut fresh = Adam::new(
        vec![w.clone(), b.clone()],
        AdamOptions {
            lr: 0.7,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(fresh.load_state_dict(&bad).is_err(), "wrong buffer shape");
    let mut bad = good.clone();
    bad.insert("state.0.nonsense", Tensor::zeros(&[2, 2], DType::F64).unwrap());
    assert!(fresh.load_state_dict(&bad).is_err(), "unknown buffer");
    let mut bad = good.clone();
    bad.insert("state.7.exp_avg", Tensor::zeros(&[2], DType::F64).unwrap());
    assert!(
        fresh.load_state_dict(&bad).is_err(),
        "parameter index out of range"
    );
    let mut bad = good.clone();
    bad.set("group.0.beta1", 1.5);
    assert!(fresh.load_state_dict(&bad).is_err(), "invalid hyperparameter");
    bad.set("group.0.beta1", "0.9");
    assert!(
        fresh.load_state_dict(&bad).is_err(),
        "hyperparameter of the wrong type"
    );
    bad.remove_meta("group.0.beta1");
    assert!(fresh.load_state_dict(&bad).is_err(), "missing hyperparameter");
    assert_eq!(fresh.lrs(), vec![0.7]);
    assert_eq!(fresh.param_step(0, 0), Some(0));

    // f32 state loads into f64 parameters by casting, like PyTorch.
    let cast: StateDict = good
        .iter()
        .map(|(k, t)| (k.to_string(), t.to_dtype(DType::F32).unwrap()))
        .collect();
    let mut cast = cast;
    for (k, v) in good.metadata() {
        cast.set(k.clone(), v.clone());
    }
    fresh.load_state_dict(&cast).unwrap();
    assert_eq!(fresh.state_buffer(0, 0, "exp_avg").unwrap().dtype(), DType::F64);
    assert_eq!(fresh.param_step(1, 0), None);
    assert_eq!(fresh.param_step(0, 1), Some(1));
}

#[test]
fn a_module_holding_a_clone_sees_every_step() {
    let w = param(&[1.0, 2.0], &[2]);
    let held_by_module = w.clone();
    let id = w.id().unwrap();
    let mut opt = Sgd::new(
        vec![w.clone()],
        SgdOptions {
            lr: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    let ptr = w.tensor().unwrap().storage().as_bytes().as_ptr();
    opt.step(&fixed_grads(&[(&w, &[1.0, 1.0])])).unwrap();
    assert_eq!(
        held_by_module.tensor().unwrap().to_vec::<f64>().unwrap(),
        vec![0.5, 1.5]
    );
    assert_eq!(
        held_by_module.var().unwrap().id(),
        Some(id),
        "the gradient key survives"
    );
    assert_eq!(
        held_by_module.tensor().unwrap().storage().as_bytes().as_ptr(),
        ptr,
        "updated in place"
    );
    // A value captured before the step (e.g. a snapshot) is not changed.
    let snapshot = w.tensor().unwrap();
    opt.step(&fixed_grads(&[(&w, &[1.0, 1.0])])).unwrap();
    assert_eq!(snapshot.to_vec::<f64>().unwrap(), vec![0.5, 1.5]);
    assert_eq!(values(&held_by_module), vec![0.0, 1.0]);
}

#[test]
fn groups_have_their_own_hyperparameters_and_untouched_parameters_stay() {
    let named: Vec<(String, Parameter)> = vec![
        ("fc.weight".into(), param(&[1.0, 1.0, 1.0, 1.0], &[2, 2])),
        ("fc.bias".into(), param(&[1.0, 1.0], &[2])),
        ("norm.weight".into(), param(&[1.0, 1.0], &[2])),
        ("pos_embed".into(), param(&[1.0, 1.0, 1.0, 1.0], &[1, 4])),
        ("conv.bias".into(), param(&[1.0, 1.0, 1.0, 1.0], &[2, 2])),
        ("frozen.weight".into(), param(&[1.0, 1.0, 1.0, 1.0], &[2, 2])),
    ];
    named[5].1.requires_grad_(false).unwrap();
    let base = SgdOptions {
        lr: 0.1,
        weight_decay: 0.5,
        ..Default::default()
    };
    let groups = param_groups_weight_decay(&named, &base, &["pos_embed"]);
    assert_eq!(groups.len(), 2);
    let in_group = |g: usize, i: usize| groups[g].params.iter().any(|p| p.same(&named[i].1));
    assert!(in_group(0, 1) && in_group(0, 2) && in_group(0, 3) && in_group(0, 4));
    assert!(in_group(1, 0) && groups[1].params.len() == 1);
    assert!(!in_group(0, 5) && !in_group(1, 5));
    assert_eq!(
        (groups[0].hyper.weight_decay, groups[1].hyper.weight_decay),
        (0.0, 0.5)
    );

    let mut opt = Sgd::with_groups(groups).unwrap();
    opt.hyper_mut(0).unwrap().set_lr(1.0);
    let zero = [0.0; 4];
    let grads = fixed_grads(&[(&named[0].1, &zero), (&named[1].1, &[0.0, 0.0])]);
    opt.step(&grads).unwrap();
    // Decayed weight: θ − 0.1·0.5·θ; bias (no decay, lr 1): unchanged by a zero gradient.
    assert_eq!(values(&named[0].1), vec![0.95; 4]);
    assert_eq!(values(&named[1].1), vec![1.0; 2]);
    assert_eq!(values(&named[2].1), vec![1.0; 2], "no gradient: untouched");
    assert_eq!(opt.param_step(0, 1), Some(0));
}

#[test]
fn bad_gradients_and_duplicates_are_errors_before_any_update() {
    let (w, b) = (param(&[1.0, 2.0], &[2]), param(&[3.0], &[1]));
    assert!(Sgd::new(vec![w.clone(), w.clone()], SgdOptions::default()).is_err());
    let groups = vec![
        ParamGroup::new(vec![w.clone()], SgdOptions::default()),
        ParamGroup::new(vec![w.clone()], SgdOptions::default()),
    ];
    assert!(Sgd::with_groups(groups).is_err());

    let mut opt = Sgd::new(
        vec![w.clone(), b.clone()],
        SgdOptions {
            lr: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    let mut grads = fixed_grads(&[(&w, &[1.0, 1.0])]);
    grads.insert(
        b.id().unwrap(),
        Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap(),
    );
    assert!(opt.step(&grads).is_err());
    grads.insert(b.id().unwrap(), Tensor::from_vec(vec![1.0f32], &[1]).unwrap());
    assert!(opt.step(&grads).is_err(), "dtype mismatch");
    assert_eq!(values(&w), vec![1.0, 2.0], "nothing was updated");

    let ints = Parameter::new(Tensor::from_vec(vec![1i64], &[1]).unwrap());
    let mut opt = Sgd::new(vec![ints.clone()], SgdOptions::default()).unwrap();
    let mut grads = Gradients::default();
    grads.insert(ints.id().unwrap(), Tensor::from_vec(vec![1i64], &[1]).unwrap());
    assert!(opt.step(&grads).is_err());
}

#[test]
fn momentum_is_exposed_for_schedules() {
    let p = param(&[1.0], &[1]);
    let mut adam = Adam::new(vec![p.clone()], AdamOptions::default()).unwrap();
    assert_eq!(adam.hyper(0).unwrap().momentum(), Some(0.9));
    adam.hyper_mut(0).unwrap().set_momentum(0.85).unwrap();
    assert_eq!(adam.groups()[0].hyper.beta1, 0.85);
    let mut ada = Adagrad::new(vec![p.clone()], AdagradOptions::default()).unwrap();
    assert!(ada.hyper_mut(0).unwrap().set_momentum(0.9).is_err());
    assert!(ada.hyper(1).is_none());
    assert!(ada.group_params(3).is_empty());
    let fields = AdamOptions::default().fields();
    assert!(fields.contains(&("amsgrad", 0.0)) && fields.contains(&("beta2", 0.999)));
}

/// The fused kernels and norms split work at fixed points: one thread and
/// four give bitwise the same parameters (LAMB's trust-ratio norms, LARS's,
/// and the global clipping norm included).
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let n = 3 * crate::kernel::CHUNK + 5;
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let x0: Vec<f64> = (0..n).map(|i| ((i * 37) % 101) as f64 / 50.0 - 1.0).collect();
            let g: Vec<f64> = (0..n).map(|i| ((i * 53) % 97) as f64 / 40.0 - 1.2).collect();
            let (a, b) = (param(&x0, &[n]), param(&x0, &[n]));
            let mut lamb = Lamb::new(vec![a.clone()], LambOptions::default()).unwrap();
            let mut lars = Lars::new(
                vec![b.clone()],
                LarsOptions {
                    weight_decay: 1e-3,
                    ..Default::default()
                },
            )
            .unwrap();
            for _ in 0..3 {
                let mut grads = fixed_grads(&[(&a, &g), (&b, &g)]);
                let total = clip_grad_norm(&mut grads, 50.0, 2.0).unwrap();
                lamb.step(&grads).unwrap();
                lars.step(&grads).unwrap();
                assert!(total > 50.0, "clipping is active");
            }
            (values(&a), values(&b))
        })
    };
    assert_eq!(run(1), run(4));
}

/// `with_params` keeps the kind and every group's hyperparameters, with
/// fresh state over the new parameters.
#[test]
fn with_params_rebuilds_the_same_optimizer_over_other_parameters() {
    use crate::{Optimizer, ParamGroup, Sgd, SgdOptions};
    let p =
        |v: f32| tessera_autograd::Parameter::new(tessera_tensor::Tensor::from_vec(vec![v], &[1]).unwrap());
    let h = |lr| SgdOptions {
        lr,
        momentum: 0.5,
        ..Default::default()
    };
    let opt = Sgd::with_groups(vec![
        ParamGroup::new(vec![p(1.0)], h(0.1)),
        ParamGroup::new(vec![p(2.0)], h(0.2)),
    ])
    .unwrap();
    let (a, b) = (p(3.0), p(4.0));
    let mut other = opt.with_params(vec![vec![a.clone()], vec![b.clone()]]).unwrap();
    assert_eq!(other.name(), "SGD");
    assert_eq!(other.lrs(), vec![0.1, 0.2]);
    let mut grads = tessera_autograd::Gradients::default();
    grads.insert(a.id().unwrap(), a.tensor().unwrap());
    other.step(&grads).unwrap();
    assert_eq!(
        a.tensor().unwrap().to_vec::<f32>().unwrap(),
        vec![3.0 - 0.1 * 3.0]
    );
    assert!(opt.with_params(vec![vec![a]]).is_err());
}
