//! Own test binary: it reads the process-wide live-byte counter, which any other test would move.
//!
//! After the first step (which creates the optimizer state), a step
//! allocates no tensor memory and updates parameters and state in place:
//! checked with `tessera_tensor::live_bytes()` in a process of its own, so
//! no other test allocates meanwhile, on gradients from a real backward
//! pass through a module-held parameter.

use tessera_autograd::{record, Parameter, Var};
use tessera_optim::*;
use tessera_tensor::{live_bytes, DType, Tensor};

/// loss = Σ w ⊙ x, recorded so that backward yields dloss/dw = x.
fn loss(w: &Var, x: &Tensor) -> Var {
    let v: f32 = w
        .tensor()
        .zip_map::<f32, f32, f32>(x, "mul", |a, b| a * b)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .sum();
    let saved = x.clone();
    record("dot", Tensor::scalar(v), &[w], move |g, _| {
        let s = g.to_scalar::<f32>()?;
        Ok(vec![Some(saved.map::<f32, f32>(|y| y * s))])
    })
}

type Maker = Box<dyn Fn(Vec<Parameter>) -> Box<dyn Optimizer>>;

fn ptr(t: &Tensor) -> *const u8 {
    t.storage().as_bytes().as_ptr()
}

#[test]
fn steps_after_the_first_allocate_nothing() {
    // Big enough that the fused kernels split across threads.
    let n = 100_000;
    let makers: Vec<(&str, Maker)> = vec![
        (
            "sgd",
            Box::new(|p| {
                Box::new(
                    Sgd::new(
                        p,
                        SgdOptions {
                            momentum: 0.9,
                            nesterov: true,
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                )
            }),
        ),
        (
            "adamw",
            Box::new(|p| {
                Box::new(
                    AdamW::new(
                        p,
                        AdamWOptions {
                            amsgrad: true,
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                )
            }),
        ),
        (
            "adagrad",
            Box::new(|p| Box::new(Adagrad::new(p, AdagradOptions::default()).unwrap())),
        ),
        (
            "rmsprop",
            Box::new(|p| {
                Box::new(
                    RmsProp::new(
                        p,
                        RmsPropOptions {
                            centered: true,
                            momentum: 0.9,
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                )
            }),
        ),
        (
            "lamb",
            Box::new(|p| Box::new(Lamb::new(p, LambOptions::default()).unwrap())),
        ),
        (
            "lars",
            Box::new(|p| {
                Box::new(
                    Lars::new(
                        p,
                        LarsOptions {
                            momentum: 0.9,
                            weight_decay: 1e-4,
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                )
            }),
        ),
    ];
    for (name, make) in makers {
        let w = Parameter::new(Tensor::ones(&[n], DType::F32).unwrap());
        let module_copy = w.clone();
        let x = Tensor::rand(&[n], DType::F32).unwrap();
        let mut opt = make(vec![w.clone()]);
        let mut first = true;
        let mut state_ptrs = Vec::new();
        let w_ptr = ptr(&w.tensor().unwrap());
        for _ in 0..4 {
            // The module's forward reads the parameter through its handle.
            let grads = loss(&module_copy.var().unwrap(), &x).backward().unwrap();
            let before = live_bytes();
            opt.step(&grads).unwrap();
            let sd = opt.state_dict();
            let now: Vec<*const u8> = sd.iter().map(|(_, t)| ptr(t)).collect();
            drop(sd);
            if first {
                first = false;
                assert!(live_bytes() > before, "{name}: the first step creates the state");
                state_ptrs = now;
            } else {
                assert_eq!(live_bytes(), before, "{name}: a step allocated tensor memory");
                assert_eq!(now, state_ptrs, "{name}: state buffers moved");
            }
            assert_eq!(
                ptr(&module_copy.tensor().unwrap()),
                w_ptr,
                "{name}: parameter updated in place"
            );
        }
        assert_ne!(
            module_copy.tensor().unwrap().to_vec::<f32>().unwrap()[0],
            1.0,
            "{name}: the module sees the steps"
        );
    }
}
