//! `onebit_bytes_per_step`: the bytes a rank sends per optimizer step under
//! 1-bit Adam and 1-bit LAMB after their warm-up, against Adam's, for the
//! MNIST CNN and a small transformer (2 encoder layers, d_model 128,
//! feed-forward 512, dropout 0) on `local` ranks, N = 2 and 4.
//!
//! Both sides are counted from the step's own traffic: Adam's from DDP's
//! per-step statistics (the payload bytes its buckets all-reduced, sent as
//! a ring all-reduce: `2(N−1)/N` of them per rank), 1-bit's from the
//! compressed all-reduce's counters (`WireStats`: sign bits with their word
//! padding, worker and server scales). Warm-up steps run exact all-reduces;
//! the lines are the mean over the compressed steps after it. The bar is
//! `bytes_over_adam ≤ 1/32 + scales`, i.e. a reduction of at least 95%.
//! Lines: `bench\tonebit_{adam,lamb}_{cnn,transformer}_n{2,4}\ttessera\tbytes_over_adam\t<x>\tratio`
//! and `...\tbytes_per_step\t<b>\tbytes` for each optimizer and Adam.

use tessera_autograd::{CrossEntropyOptions, Reduction, Target, Var};
use tessera_nn::models::mnist_cnn;
use tessera_nn::{Linear, Module, Sequential, TransformerEncoderLayer, TransformerOptions};
use tessera_optim::{OnebitAdam, OnebitLamb, OnebitLambConfig, OnebitOptions, Optimizer};
use tessera_parallel::compressed::ring_all_reduce_bytes;
use tessera_parallel::{Communicator, CompressedAllReduce, DdpConfig, DistributedDataParallel, LocalGroup};
use tessera_tensor::Tensor;

const FREEZE: u64 = 2;
const MEASURED: usize = 3;
const ROWS: usize = 8;

#[derive(Clone, Copy)]
enum Model {
    Cnn,
    Transformer,
}

fn build(model: Model) -> Sequential {
    match model {
        Model::Cnn => mnist_cnn().unwrap(),
        Model::Transformer => {
            let o = TransformerOptions {
                dim_feedforward: 512,
                dropout: 0.0,
                ..Default::default()
            };
            Sequential::new()
                .with(TransformerEncoderLayer::new(128, 4, o).unwrap())
                .with(TransformerEncoderLayer::new(128, 4, o).unwrap())
                .with(Linear::new(128, 128, true).unwrap())
        }
    }
}

fn loss(model: Model, net: &dyn Module, seed: usize) -> Var {
    let det = |n: usize, k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 31 + k * 17) % 255) as f32 / 255.0 - 0.5)
            .collect()
    };
    match model {
        Model::Cnn => {
            let x = Tensor::from_vec(det(ROWS * 784, seed), &[ROWS, 1, 28, 28]).unwrap();
            let y = Tensor::from_vec(
                (0..ROWS).map(|i| ((i + seed) % 10) as i64).collect::<Vec<_>>(),
                &[ROWS],
            )
            .unwrap();
            let logits = net.forward(&Var::constant(x)).unwrap();
            logits
                .cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())
                .unwrap()
        }
        Model::Transformer => {
            let x = Tensor::from_vec(det(ROWS * 16 * 128, seed), &[ROWS, 16, 128]).unwrap();
            let t =
                Var::constant(Tensor::from_vec(det(ROWS * 16 * 128, seed + 7), &[ROWS, 16, 128]).unwrap());
            net.forward(&Var::constant(x))
                .unwrap()
                .mse_loss(&t, Reduction::Mean)
                .unwrap()
        }
    }
}

enum Onebit<'c> {
    Adam(OnebitAdam<'c>),
    Lamb(OnebitLamb<'c>),
}

impl<'c> Onebit<'c> {
    fn optimizer(&mut self) -> &mut (dyn Optimizer + 'c) {
        match self {
            Onebit::Adam(o) => o,
            Onebit::Lamb(o) => o,
        }
    }

    fn take_bytes(&mut self) -> u64 {
        match self {
            Onebit::Adam(o) => o.take_wire_stats().total(),
            Onebit::Lamb(o) => o.take_wire_stats().total(),
        }
    }
}

/// (Adam's bytes per step, the 1-bit optimizer's bytes per compressed step).
fn measure(model: Model, lamb: bool, n: usize) -> (f64, f64) {
    let per_rank = LocalGroup::run(n, |comm| {
        let ddp = DistributedDataParallel::new(build(model), comm, DdpConfig::default()).unwrap();
        let hyper = OnebitOptions::default();
        let mut opt = if lamb {
            let cfg = OnebitLambConfig {
                freeze_step: FREEZE,
                ..Default::default()
            };
            Onebit::Lamb(
                OnebitLamb::new(ddp.parameters(), hyper, cfg)
                    .unwrap()
                    .with_reducer(CompressedAllReduce::new(comm)),
            )
        } else {
            Onebit::Adam(
                OnebitAdam::new(ddp.parameters(), hyper, FREEZE)
                    .unwrap()
                    .with_reducer(CompressedAllReduce::new(comm)),
            )
        };
        let (mut adam, mut onebit) = (0u64, 0u64);
        for s in 0..FREEZE as usize + MEASURED {
            let grads = ddp
                .backward_for(&loss(model, &ddp, s * n + comm.rank()), opt.optimizer())
                .unwrap();
            if (s as u64) < FREEZE {
                adam = ring_all_reduce_bytes(ddp.last_step_stats().bytes_reduced as u64, n);
            }
            opt.optimizer().step(&grads).unwrap();
            let sent = opt.take_bytes();
            if s as u64 >= FREEZE {
                onebit += sent;
            }
        }
        Ok::<_, tessera_parallel::CommError>((adam as f64, onebit as f64 / MEASURED as f64))
    })
    .unwrap();
    per_rank[0].clone().unwrap()
}

fn main() {
    for (model, name) in [(Model::Cnn, "cnn"), (Model::Transformer, "transformer")] {
        for n in [2, 4] {
            for (lamb, opt) in [(false, "adam"), (true, "lamb")] {
                let (adam, onebit) = measure(model, lamb, n);
                let w = format!("onebit_{opt}_{name}_n{n}");
                println!(
                    "bench\t{w}\ttessera\tbytes_over_adam\t{:.5}\tratio",
                    onebit / adam
                );
                println!("bench\t{w}\ttessera\tbytes_per_step\t{onebit:.0}\tbytes");
                println!("bench\t{w}\tadam\tbytes_per_step\t{adam:.0}\tbytes");
            }
        }
    }
}
