//! `onebit_bytes_per_step`: the bytes a rank sends per optimizer step under
//! 1-bit Adam and 1-bit LAMB after their warm-up, and under 0/1 Adam,
//! against Adam's, for the MNIST CNN and a small transformer (2 encoder
//! layers, d_model 128, feed-forward 512, dropout 0) on `local` ranks,
//! N = 2 and 4.
//!
//! Both sides are counted from the step's own traffic: Adam's from DDP's
//! per-step statistics (the payload bytes its buckets all-reduced, sent as
//! a ring all-reduce: `2(N−1)/N` of them per rank), 1-bit's from the
//! compressed all-reduce's counters (`WireStats`: sign bits with their word
//! padding, worker and server scales). Warm-up steps run exact all-reduces;
//! the 1-bit lines are the mean over the compressed steps after it. The bar
//! is `bytes_over_adam ≤ 1/32 + scales`, i.e. a reduction of at least 95%.
//! Lines: `bench\tonebit_{adam,lamb}_{cnn,transformer}_n{2,4}\ttessera\tbytes_over_adam\t<x>\tratio`
//! and `...\tbytes_per_step\t<b>\tbytes` for each optimizer and Adam.
//!
//! 0/1 Adam (`zero_one_adam_*`) runs DeepSpeed's synchronisation cap
//! (`local_step_clipper` 16) with the schedules shortened to fit a
//! benchmark: variance steps until step 8 (`var_update_scaler` 2: exact at
//! 1, 2, 4, 6, 8, compressed at 3, 5, 7), then the synchronisation
//! interval doubles every local step (`local_step_scaler` 1) and is 16
//! from step 13. `bytes_over_adam` is the mean over steps 17–48 (two
//! synchronisations in 32 steps: the steady state, 1/16 of a compressed
//! all-reduce per step), `bytes_over_adam_variance_phase` over steps 1–8
//! (DDP's exact all-reduces counted as Adam's).

use tessera_autograd::{CrossEntropyOptions, Reduction, Target, Var};
use tessera_nn::models::mnist_cnn;
use tessera_nn::{Linear, Module, Sequential, TransformerEncoderLayer, TransformerOptions};
use tessera_optim::{
    OnebitAdam, OnebitLamb, OnebitLambConfig, OnebitOptions, Optimizer, ZeroOneAdam, ZeroOneAdamConfig,
};
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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Adam,
    Lamb,
    ZeroOne,
}

enum Onebit<'c> {
    Adam(OnebitAdam<'c>),
    Lamb(OnebitLamb<'c>),
    ZeroOne(ZeroOneAdam<'c>),
}

impl<'c> Onebit<'c> {
    fn optimizer(&mut self) -> &mut (dyn Optimizer + 'c) {
        match self {
            Onebit::Adam(o) => o,
            Onebit::Lamb(o) => o,
            Onebit::ZeroOne(o) => o,
        }
    }

    fn take_bytes(&mut self) -> u64 {
        match self {
            Onebit::Adam(o) => o.take_wire_stats().total(),
            Onebit::Lamb(o) => o.take_wire_stats().total(),
            Onebit::ZeroOne(o) => o.take_wire_stats().total(),
        }
    }
}

const ZERO_ONE: ZeroOneAdamConfig = ZeroOneAdamConfig {
    var_freeze_step: 8,
    var_update_scaler: 2,
    local_step_scaler: 1,
    local_step_clipper: 16,
};

/// Adam's bytes per step, and the bytes of every step under `kind`
/// (DDP's exact all-reduces included), on rank 0.
fn measure(model: Model, kind: Kind, n: usize, steps: usize) -> (u64, Vec<u64>) {
    let per_rank = LocalGroup::run(n, |comm| {
        let ddp = DistributedDataParallel::new(build(model), comm, DdpConfig::default()).unwrap();
        let hyper = OnebitOptions::default();
        let reducer = CompressedAllReduce::new(comm);
        let mut opt = match kind {
            Kind::Lamb => {
                let cfg = OnebitLambConfig {
                    freeze_step: FREEZE,
                    ..Default::default()
                };
                Onebit::Lamb(
                    OnebitLamb::new(ddp.parameters(), hyper, cfg)
                        .unwrap()
                        .with_reducer(reducer),
                )
            }
            Kind::Adam => Onebit::Adam(
                OnebitAdam::new(ddp.parameters(), hyper, FREEZE)
                    .unwrap()
                    .with_reducer(reducer),
            ),
            Kind::ZeroOne => Onebit::ZeroOne(
                ZeroOneAdam::new(ddp.parameters(), hyper, ZERO_ONE)
                    .unwrap()
                    .with_reducer(reducer),
            ),
        };
        let (mut adam, mut sent) = (0u64, Vec::new());
        for s in 0..steps {
            let exact = opt.optimizer().wants_averaged_grads();
            let grads = ddp
                .backward_for(&loss(model, &ddp, s * n + comm.rank()), opt.optimizer())
                .unwrap();
            let mut bytes = 0;
            if exact {
                adam = ring_all_reduce_bytes(ddp.last_step_stats().bytes_reduced as u64, n);
                bytes = adam;
            }
            opt.optimizer().step(&grads).unwrap();
            sent.push(bytes + opt.take_bytes());
        }
        Ok::<_, tessera_parallel::CommError>((adam, sent))
    })
    .unwrap();
    per_rank[0].clone().unwrap()
}

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

fn print(workload: &str, metric: &str, onebit: f64, adam: f64) {
    println!(
        "bench\t{workload}\ttessera\t{metric}\t{:.5}\tratio",
        onebit / adam
    );
}

fn main() {
    for (model, name) in [(Model::Cnn, "cnn"), (Model::Transformer, "transformer")] {
        for n in [2, 4] {
            for (kind, opt) in [(Kind::Adam, "adam"), (Kind::Lamb, "lamb")] {
                let (adam, sent) = measure(model, kind, n, FREEZE as usize + MEASURED);
                let onebit = mean(&sent[FREEZE as usize..]);
                let w = format!("onebit_{opt}_{name}_n{n}");
                print(&w, "bytes_over_adam", onebit, adam as f64);
                println!("bench\t{w}\ttessera\tbytes_per_step\t{onebit:.0}\tbytes");
                println!("bench\t{w}\tadam\tbytes_per_step\t{adam}\tbytes");
            }
            let (adam, sent) = measure(model, Kind::ZeroOne, n, 48);
            let w = format!("zero_one_adam_{name}_n{n}");
            let steady = mean(&sent[16..48]);
            print(&w, "bytes_over_adam", steady, adam as f64);
            print(
                &w,
                "bytes_over_adam_variance_phase",
                mean(&sent[..8]),
                adam as f64,
            );
            println!("bench\t{w}\ttessera\tbytes_per_step\t{steady:.0}\tbytes");
            println!("bench\t{w}\tadam\tbytes_per_step\t{adam}\tbytes");
        }
    }
}
