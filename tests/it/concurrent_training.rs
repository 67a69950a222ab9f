//! `Var` is `Send + Sync`, and graphs on different threads are independent:
//! two threads each training their own small model (nn layers with dropout,
//! cross-entropy, SGD with momentum) at the same time end with bitwise the
//! same weights and losses as the same two runs one after the other.

use std::sync::Barrier;

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::{Dropout, Linear, Module, ReLU, Sequential};
use tessera::optim::{Optimizer, Sgd, SgdOptions};
use tessera::tensor::{manual_seed, DType, Tensor};

/// What one training run ends with: the loss of every step and the final
/// parameters, as raw bits.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    losses: Vec<u32>,
    params: Vec<Vec<u32>>,
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Trains a 32-64-64-5 MLP with dropout for `steps` SGD steps on random
/// data, everything drawn from this thread's generator seeded with `seed`.
/// `start` is waited on after the model is built, so concurrent runs
/// overlap in their training steps.
fn train(seed: u64, steps: usize, start: Option<&Barrier>) -> Run {
    manual_seed(seed);
    let model = Sequential::new()
        .with(Linear::new(32, 64, true).unwrap())
        .with(ReLU)
        .with(Dropout::new(0.2).unwrap())
        .with(Linear::new(64, 64, true).unwrap())
        .with(ReLU)
        .with(Linear::new(64, 5, true).unwrap());
    let x = Var::constant(Tensor::randn(&[48, 32], DType::F32).unwrap());
    let y = Tensor::randint(0, 5, &[48], DType::I64).unwrap();
    let opts = SgdOptions {
        lr: 0.05,
        momentum: 0.9,
        ..Default::default()
    };
    let mut opt = Sgd::new(model.parameters(), opts).unwrap();
    if let Some(b) = start {
        b.wait();
    }
    let mut losses = Vec::new();
    for _ in 0..steps {
        let loss = model
            .forward(&x)
            .unwrap()
            .cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())
            .unwrap();
        losses.push(loss.tensor().to_scalar::<f32>().unwrap().to_bits());
        opt.step(&loss.backward().unwrap()).unwrap();
    }
    let params = model
        .parameters()
        .iter()
        .map(|p| bits(&p.tensor().unwrap()))
        .collect();
    Run { losses, params }
}

#[test]
fn two_threads_training_concurrently_match_sequential_runs_bitwise() {
    const STEPS: usize = 25;
    let sequential = [train(11, STEPS, None), train(12, STEPS, None)];
    assert_ne!(
        sequential[0], sequential[1],
        "the two runs must differ to be told apart"
    );
    let losses = &sequential[0].losses;
    let (l0, l1) = (f32::from_bits(losses[0]), f32::from_bits(losses[STEPS - 1]));
    assert!(l1 < l0, "training must make progress: loss {l0} -> {l1}");
    let start = Barrier::new(2);
    let concurrent: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = [11, 12]
            .map(|seed| {
                let start = &start;
                s.spawn(move || train(seed, STEPS, Some(start)))
            })
            .into_iter()
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(concurrent[0], sequential[0]);
    assert_eq!(concurrent[1], sequential[1]);
}

#[test]
fn var_and_modules_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Var>();
    assert_send_sync::<Sequential>();
    assert_send_sync::<Sgd>();
}
