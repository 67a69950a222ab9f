//! A `Checkpoint` holds everything training depends on: a run interrupted,
//! restored into freshly built (differently initialised) objects and
//! continued ends with bit-identical weights to an uninterrupted run. The
//! run uses dropout and random data (the default generator), AdamW over
//! two parameter groups, a cosine schedule with warm-up, clipping, and a
//! loss scaler whose scale overflows (skipped steps depend on its state).

use std::ops::Range;

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::{Dropout, Linear, Module};
use tessera::optim::{
    clip_grad_norm, param_groups_weight_decay, AdamW, AdamWOptions, CosineLR, CosineOptions,
};
use tessera::optim::{GradScaler, GradScalerOptions, LrScheduler, Optimizer};
use tessera::tensor::{manual_seed, Checkpoint, DType, Result, Tensor};

#[derive(Module)]
struct Net {
    layers: Vec<Linear>,
    drop: Option<Dropout>,
}

impl Module for Net {
    fn forward(&self, x: &Var) -> Result<Var> {
        let h = self.layers[0].forward(x)?.relu()?;
        let h = self.drop.as_ref().map_or(Ok(h.clone()), |d| d.forward(&h))?;
        self.layers[1].forward(&h)
    }
}

struct Trainer {
    model: Net,
    opt: AdamW,
    sched: CosineLR,
    scaler: GradScaler,
    skipped: usize,
}

fn trainer(init_seed: u64) -> Trainer {
    manual_seed(init_seed);
    let model = Net {
        layers: vec![
            Linear::new(6, 16, true).unwrap(),
            Linear::new(16, 3, true).unwrap(),
        ],
        drop: Some(Dropout::new(0.3).unwrap()),
    };
    let hyper = AdamWOptions {
        lr: 1e-2,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut opt =
        AdamW::with_groups(param_groups_weight_decay(&model.named_parameters(), &hyper, &[])).unwrap();
    let sched = CosineLR::new(
        &mut opt,
        CosineOptions {
            warmup_t: 4,
            ..CosineOptions::new(20)
        },
    )
    .unwrap();
    // A scale near f32's limit that grows every step: the scaled gradients
    // overflow now and then, and those steps are skipped.
    let scaler = GradScaler::new(GradScalerOptions {
        init_scale: 2f64.powi(120),
        growth_interval: 1,
        ..Default::default()
    })
    .unwrap();
    Trainer {
        model,
        opt,
        sched,
        scaler,
        skipped: 0,
    }
}

fn train(t: &mut Trainer, steps: Range<u64>) {
    for _ in steps {
        let x = Var::constant(Tensor::randn(&[8, 6], DType::F32).unwrap());
        let y = Tensor::randint(0, 3, &[8], DType::I64).unwrap();
        let loss = t
            .model
            .forward(&x)
            .unwrap()
            .cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())
            .unwrap()
            // Large gradients: S·g overflows f32 for S near 2^120 (clipping
            // after unscaling keeps the steps sane).
            .mul_scalar(4096.0)
            .unwrap();
        let mut grads = t.scaler.backward(&loss).unwrap();
        if !t.scaler.unscale_(&mut grads).unwrap() {
            clip_grad_norm(&mut grads, 1.0, 2.0).unwrap();
        }
        if !t.scaler.step(&mut t.opt, &mut grads).unwrap() {
            t.skipped += 1;
        }
        t.scaler.update().unwrap();
        t.sched.step(&mut t.opt).unwrap();
    }
}

fn weights(m: &Net) -> Vec<(String, Vec<u32>)> {
    m.state_dict()
        .iter()
        .map(|(k, t)| {
            (
                k.to_string(),
                t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect(),
            )
        })
        .collect()
}

#[test]
fn resumed_training_is_bit_identical() {
    let mut full = trainer(1);
    manual_seed(7);
    train(&mut full, 0..12);
    assert!(full.skipped > 0 && full.skipped < 12, "skipped {}", full.skipped);

    let mut first = trainer(1);
    manual_seed(7);
    train(&mut first, 0..5);
    let dir = std::env::temp_dir().join(format!("tessera-resume-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.safetensors");
    Checkpoint::new(first.model.state_dict())
        .at(0, 5)
        .with_optimizer(first.opt.state_dict())
        .with_scheduler(first.sched.state_dict())
        .with_scaler(first.scaler.state_dict())
        .with_meta("skipped", first.skipped as u64)
        .save(&path)
        .unwrap();

    // Everything built afresh from another seed, the generator elsewhere.
    let mut second = trainer(99);
    assert_ne!(weights(&second.model), weights(&first.model));
    let ck = Checkpoint::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(second.model.load_state_dict(&ck.model, true).unwrap().is_clean());
    second.opt.load_state_dict(ck.optimizer().unwrap()).unwrap();
    second.sched.load_state_dict(ck.scheduler().unwrap()).unwrap();
    second.scaler.load_state_dict(ck.scaler().unwrap()).unwrap();
    ck.restore_default_rng().unwrap();
    second.skipped = ck.meta::<u64>("skipped").unwrap() as usize;
    assert_eq!(ck.step, 5);
    train(&mut second, 5..12);

    assert_eq!(second.skipped, full.skipped);
    assert_eq!(second.scaler.scale(), full.scaler.scale());
    assert_eq!(second.sched.get_lr(), full.sched.get_lr());
    assert!(
        weights(&second.model) == weights(&full.model),
        "resumed weights differ"
    );
}
