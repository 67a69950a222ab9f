//! One GPT training step, serial against tensor parallelism on `local`
//! threads (one thread per rank), with the bytes each rank sends per step
//! against the formula of spec §6.3.
//!
//! Workload: `tessera_nn::models::Gpt` (V 256, context s 64, width h 128,
//! 4 heads, L 4 layers), batch b 8, AdamW. `gpt_tp1`: the serial model.
//! `gpt_tp2`: `GptParallel` over 2 threads (rayon pool of 1 thread, so each
//! rank computes on one thread); `gpt_tp2_sp`: the same with sequence
//! parallelism. Throughput = b·s tokens per step over the median step time
//! of [`STEPS`] steps after 2 warm-up steps.
//!
//! Bytes: every rank's sends are counted by a `TrafficMeter` around its TP
//! group (ring volumes per call). The formula, with `B = b·s·h·4` bytes
//! and `a(t) = 2(t−1)/t`: without SP, each layer all-reduces 2 activations
//! forward and 2 backward (`4L·a·B`), the vocabulary-parallel embedding
//! one forward and the tied head's input one backward (`2·a·B`), and the
//! cross-entropy 3 per-token scalars (`3·a·b·s·4`). With SP, each all-reduce
//! becomes an all-gather plus a reduce-scatter of the same volume (the
//! embedding reduce-scatters its lookups along the sequence, Megatron's
//! `reduce_scatter_embeddings`), and the gradients of the replicated
//! parameters that see only `s/t` tokens are all-reduced once per step:
//! LayerNorm weights and biases, row-parallel biases and the position
//! table (`a·((4L + 2)·h + 2L·h + s·h)·4`). Lines:
//! `bench\tgpt_tp2\ttessera\tbytes_measured_over_formula\t<x>\tratio`,
//! `bench\tgpt_tp{1,2}\ttessera\tthroughput\t<x>\ttokens/s`, and the same for
//! `gpt_tp2_sp`.

use std::sync::Arc;
use std::time::Instant;

use tessera_nn::models::{Gpt, GptConfig};
use tessera_nn::Module;
use tessera_optim::{AdamW, AdamWOptions, Optimizer};
use tessera_parallel::tensor_parallel::{
    allreduce_sequence_parallel_grads, GptParallel, TensorParallel, TpComm, TrafficMeter,
};
use tessera_parallel::{Communicator, LocalGroup};
use tessera_tensor::{DType, Generator, Tensor};

const STEPS: usize = 10;
const B: usize = 8;

fn config() -> GptConfig {
    GptConfig::new(256)
        .block_size(64)
        .n_layer(4)
        .n_head(4)
        .n_embd(128)
}

fn batch(step: usize) -> (Tensor, Tensor) {
    let s = config().block_size;
    let mut g = Generator::new(step as u64);
    let u = Tensor::rand_with(&[B * (s + 1)], DType::F64, &mut g)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let ids: Vec<i64> = u.iter().map(|v| (v * 256.0) as i64 % 256).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for row in ids.chunks(s + 1) {
        x.extend_from_slice(&row[..s]);
        y.extend_from_slice(&row[1..]);
    }
    (
        Tensor::from_vec(x, &[B, s]).unwrap(),
        Tensor::from_vec(y, &[B, s]).unwrap(),
    )
}

fn adamw(model: &dyn Module) -> AdamW {
    AdamW::new(model.parameters(), AdamWOptions::default()).unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median step time of the serial model.
fn serial() -> f64 {
    let model = Gpt::new(&config(), 0).unwrap();
    let mut opt = adamw(&model);
    let mut times = Vec::new();
    for step in 0..STEPS + 2 {
        let (x, y) = batch(step);
        let t0 = Instant::now();
        let g = model.loss(&x, &y).unwrap().backward().unwrap();
        opt.step(&g).unwrap();
        if step >= 2 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    median(times)
}

/// Median step time and bytes rank 0 sent per step, TP = 2.
fn tensor_parallel(sp: bool) -> (f64, f64) {
    let out = LocalGroup::run(2, |comm| {
        let inner: TpComm = Arc::from(comm.split(Some(0), comm.rank() as i64).unwrap().unwrap());
        let meter = TrafficMeter::new(inner);
        let tp: TpComm = Arc::new(meter.clone());
        let model = GptParallel::from_master(&Gpt::new(&config(), 0).unwrap(), &tp, sp).unwrap();
        let roles = model.tp_params();
        let mut opt = adamw(&model);
        let (mut times, mut bytes) = (Vec::new(), Vec::new());
        for step in 0..STEPS + 2 {
            let (x, y) = batch(step);
            comm.barrier().unwrap();
            meter.reset();
            let t0 = Instant::now();
            let mut g = model.loss(&x, &y).unwrap().backward().unwrap();
            allreduce_sequence_parallel_grads(&roles, &mut g, &tp).unwrap();
            opt.step(&g).unwrap();
            if step >= 2 {
                times.push(t0.elapsed().as_secs_f64());
                bytes.push(meter.bytes_sent() as f64);
            }
        }
        (median(times), bytes[0])
    })
    .unwrap();
    out[0]
}

/// The bytes one rank sends per step by the formula (see the module docs).
fn formula(t: usize, sp: bool) -> f64 {
    let c = config();
    let (s, h, l) = (c.block_size as f64, c.n_embd as f64, c.n_layer as f64);
    let a = 2.0 * (t as f64 - 1.0) / t as f64;
    let act = B as f64 * s * h * 4.0;
    let mut bytes = 4.0 * l * a * act + 2.0 * a * act + 3.0 * a * B as f64 * s * 4.0;
    if sp {
        bytes += a * ((4.0 * l + 2.0) * h + 2.0 * l * h + s * h) * 4.0;
    }
    bytes
}

fn main() {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    let tokens = (B * config().block_size) as f64;
    let t1 = serial();
    println!(
        "bench\tgpt_tp1\ttessera\tthroughput\t{:.0}\ttokens/s",
        tokens / t1
    );
    for (name, sp) in [("gpt_tp2", false), ("gpt_tp2_sp", true)] {
        let (t2, bytes) = tensor_parallel(sp);
        let want = formula(2, sp);
        println!("bench\t{name}\ttessera\tthroughput\t{:.0}\ttokens/s", tokens / t2);
        println!("bench\t{name}\ttessera\tbytes_per_step\t{bytes:.0}\tbytes");
        println!("bench\t{name}\ttessera\tbytes_formula\t{want:.0}\tbytes");
        println!(
            "bench\t{name}\ttessera\tbytes_measured_over_formula\t{:.6}\tratio",
            bytes / want
        );
    }
}
