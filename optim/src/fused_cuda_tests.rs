//! The fused GPU steps (the emulated device under `cuda-emu`) against the
//! CPU optimizers, step for step: the kernels do the CPU's f32 arithmetic
//! in its order, so parameters and state agree to the last bit on the
//! emulator; a GPU may fuse multiply-adds, hence the 1e-6 relative
//! tolerance.

use tessera_autograd::{Gradients, Parameter, Var};
use tessera_tensor::{DType, Device, Generator, Tensor};

use crate::{
    Adam, AdamOptions, AdamW, AdamWOptions, Lamb, LambOptions, LambRule, Optimizer, ParamGroup, Sgd,
    SgdOptions,
};

const DEV: Device = Device::Cuda(0);

fn gpu() -> bool {
    DEV.available()
        .map_err(|e| println!("skipped: no CUDA device ({e})"))
        .is_ok()
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.cpu().unwrap().to_vec::<f32>().unwrap()
}

/// Gradients of `sum(p·w)` for fixed random `w`, so `grad(p) = w`.
fn grads(params: &[Parameter], step: u64) -> Gradients {
    let mut loss: Option<Var> = None;
    for (i, p) in params.iter().enumerate() {
        let w = randn(&p.shape(), 100 * step + i as u64)
            .to_device(p.tensor().unwrap().device())
            .unwrap();
        let term = p
            .var()
            .unwrap()
            .mul(&Var::constant(w))
            .unwrap()
            .sum(&[], false)
            .unwrap();
        loss = Some(match loss {
            Some(l) => l.add(&term).unwrap(),
            None => term,
        });
    }
    loss.unwrap().backward().unwrap()
}

fn params(device: Device) -> Vec<Parameter> {
    // One tensor longer than a kernel chunk (4096), so a group spans blocks.
    [vec![3, 5], vec![7], vec![4100]]
        .iter()
        .enumerate()
        .map(|(i, s)| Parameter::new(randn(s, i as u64).to_device(device).unwrap()))
        .collect()
}

fn check(name: &str, make: impl Fn(Vec<Parameter>) -> Box<dyn Optimizer>) {
    let (cpu, dev) = (params(Device::Cpu), params(DEV));
    let (mut oc, mut od) = (make(cpu.clone()), make(dev.clone()));
    for step in 1..=3 {
        oc.step(&grads(&cpu, step)).unwrap();
        od.step(&grads(&dev, step)).unwrap();
        for (i, (c, d)) in cpu.iter().zip(&dev).enumerate() {
            assert_eq!(
                d.tensor().unwrap().device(),
                DEV,
                "{name}: parameter {i} left the device"
            );
            for (k, (a, b)) in values(&c.tensor().unwrap())
                .iter()
                .zip(values(&d.tensor().unwrap()))
                .enumerate()
            {
                assert!(
                    a == &b || (a - b).abs() <= 1e-6 * a.abs().max(1e-3),
                    "{name} step {step} parameter {i} element {k}: cpu {a} vs gpu {b}"
                );
            }
        }
    }
    let (sc, sd) = (oc.state_dict(), od.state_dict());
    for (key, t) in sc.iter() {
        let g = sd
            .tensor(key)
            .unwrap_or_else(|| panic!("{name}: no state {key} on the device"));
        for (a, b) in values(t).iter().zip(values(g)) {
            assert!(
                a == &b || (a - b).abs() <= 1e-6 * a.abs().max(1e-3),
                "{name} state {key}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn fused_sgd_steps_equal_the_cpu_optimizer() {
    if !gpu() {
        return;
    }
    let configs = [
        (
            "sgd",
            SgdOptions {
                lr: 0.1,
                ..Default::default()
            },
        ),
        (
            "sgd nesterov wd",
            SgdOptions {
                lr: 0.05,
                momentum: 0.9,
                nesterov: true,
                weight_decay: 5e-4,
                ..Default::default()
            },
        ),
        (
            "sgd dampening maximize",
            SgdOptions {
                lr: 0.03,
                momentum: 0.8,
                dampening: 0.1,
                maximize: true,
                ..Default::default()
            },
        ),
    ];
    for (name, o) in configs {
        check(name, |p| Box::new(Sgd::new(p, o).unwrap()));
    }
}

#[test]
fn fused_adam_steps_equal_the_cpu_optimizer() {
    if !gpu() {
        return;
    }
    check("adamw", |p| {
        Box::new(
            AdamW::new(
                p,
                AdamWOptions {
                    lr: 1e-2,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    });
    check("adamw maximize", |p| {
        Box::new(
            AdamW::new(
                p,
                AdamWOptions {
                    lr: 3e-3,
                    beta1: 0.6,
                    maximize: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    });
    check("adam wd", |p| {
        Box::new(
            Adam::new(
                p,
                AdamOptions {
                    lr: 1e-2,
                    weight_decay: 0.1,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    });
    // AMSGrad has no fused kernel: a named error, nothing stepped silently.
    let dev = params(DEV);
    let mut o = Adam::new(
        dev.clone(),
        AdamOptions {
            amsgrad: true,
            ..Default::default()
        },
    )
    .unwrap();
    let e = o.step(&grads(&dev, 1)).unwrap_err();
    assert!(e.to_string().contains("Adam has no fused GPU kernel"), "{e}");
}

#[test]
fn fused_lamb_steps_equal_the_cpu_optimizer() {
    if !gpu() {
        return;
    }
    // The default: weight decay, trust ratio, global clipping at 1 (the
    // random gradients' norm is far above, so clipping is active).
    check("lamb", |p| {
        Box::new(Lamb::new(p, LambOptions::default()).unwrap())
    });
    check("lamb decoupled trust_clip no clipping", |p| {
        Box::new(
            Lamb::from_rule(
                LambRule::new(f64::INFINITY),
                vec![ParamGroup::new(
                    p,
                    LambOptions {
                        lr: 1e-2,
                        decoupled_decay: true,
                        trust_clip: true,
                        ..Default::default()
                    },
                )],
            )
            .unwrap(),
        )
    });
    check("lamb no decay, no bias correction, no averaging", |p| {
        Box::new(
            Lamb::new(
                p,
                LambOptions {
                    weight_decay: 0.0,
                    bias_correction: false,
                    grad_averaging: false,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    });
    check("lamb always_adapt without decay", |p| {
        Box::new(
            Lamb::new(
                p,
                LambOptions {
                    weight_decay: 0.0,
                    always_adapt: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    });
}
