//! DDP's overlap of the gradient all-reduce with backward, on `local`
//! ranks with one compute thread each: the step time of forward +
//! backward + all-reduce with the buckets launched from the gradient hooks
//! (overlap) and with every all-reduce after backward (no overlap), for the
//! MNIST MLP (784–1024–1024–10) and the MNIST CNN, and the fraction of the
//! communication hidden behind backward (`1 − exposed / communication`,
//! measured per step by the reducer; the communication time includes the
//! wait for the slower rank). With the default 25 MiB cap the MLP's
//! gradients form two buckets, so `_cap1mb` lines repeat the overlap run
//! with 1 MiB buckets. Then scaling: N = 2 ranks × 1 thread
//! against 1 rank × 2 threads on the same global batch, in samples/s.
//! Lines: `bench\tddp_overlap_<model>_n2\ttessera\t<metric>\t<v>\t<unit>`
//! and `bench\tddp_scaling_<model>\ttessera\t...`.

use std::time::{Duration, Instant};

use tessera_autograd::{CrossEntropyOptions, Target, Var};
use tessera_nn::models::{mnist_cnn, mnist_mlp};
use tessera_nn::{Module, Sequential};
use tessera_parallel::{Communicator, DdpConfig, DistributedDataParallel, LocalGroup};
use tessera_tensor::Tensor;

const STEPS: usize = 12;
const WARMUP: usize = 2;

struct Measured {
    step: Duration,
    hidden: f64,
    exposed: Duration,
    communication: Duration,
}

fn line(name: &str, metric: &str, v: f64, unit: &str) {
    println!("bench\t{name}\ttessera\t{metric}\t{v:.4}\t{unit}");
}

fn batch(n: usize, conv: bool, seed: usize) -> (Var, Tensor) {
    let shape: Vec<usize> = if conv { vec![n, 1, 28, 28] } else { vec![n, 784] };
    let numel: usize = shape.iter().product();
    let x: Vec<f32> = (0..numel)
        .map(|i| ((i * 31 + seed * 17) % 255) as f32 / 255.0)
        .collect();
    let y: Vec<i64> = (0..n).map(|i| ((i + seed) % 10) as i64).collect();
    (
        Var::constant(Tensor::from_vec(x, &shape).unwrap()),
        Tensor::from_vec(y, &[n]).unwrap(),
    )
}

/// Mean step time (forward + backward + reduction) of `world` ranks with
/// `threads` compute threads each, `rows` rows per rank, buckets of at
/// most `cap` bytes.
fn run(
    model: fn() -> Sequential,
    conv: bool,
    world: usize,
    threads: usize,
    rows: usize,
    overlap: bool,
    cap: usize,
) -> Measured {
    let per_rank = LocalGroup::run(world, |comm| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let config = DdpConfig {
                overlap,
                bucket_cap_bytes: cap,
                ..DdpConfig::default()
            };
            let ddp = DistributedDataParallel::new(model(), comm, config).unwrap();
            let ce = CrossEntropyOptions::default();
            let (mut total, mut hidden, mut exposed, mut communication) =
                (Duration::ZERO, 0.0, Duration::ZERO, Duration::ZERO);
            for s in 0..WARMUP + STEPS {
                let (x, y) = batch(rows, conv, s * world + comm.rank());
                let t0 = Instant::now();
                let loss = ddp
                    .forward(&x)
                    .unwrap()
                    .cross_entropy(Target::Indices(&y), &ce)
                    .unwrap();
                ddp.backward(&loss).unwrap();
                if s >= WARMUP {
                    total += t0.elapsed();
                    let st = ddp.last_step_stats();
                    hidden += st.hidden_fraction();
                    exposed += st.exposed;
                    communication += st.communication;
                }
            }
            Measured {
                step: total / STEPS as u32,
                hidden: hidden / STEPS as f64,
                exposed: exposed / STEPS as u32,
                communication: communication / STEPS as u32,
            }
        })
    })
    .unwrap();
    per_rank.into_iter().max_by_key(|m| m.step).unwrap()
}

fn main() {
    let mlp = || mnist_mlp(&[1024, 1024]).unwrap();
    let cnn = || mnist_cnn().unwrap();
    for (name, model, conv, rows) in [
        ("mlp", mlp as fn() -> Sequential, false, 64),
        ("cnn", cnn, true, 32),
    ] {
        let cap = DdpConfig::default().bucket_cap_bytes;
        let on = run(model, conv, 2, 1, rows, true, cap);
        let off = run(model, conv, 2, 1, rows, false, cap);
        let w = format!("ddp_overlap_{name}_n2");
        line(&w, "step_time_overlap", on.step.as_secs_f64() * 1e3, "ms");
        line(&w, "step_time_no_overlap", off.step.as_secs_f64() * 1e3, "ms");
        line(&w, "comm_time", on.communication.as_secs_f64() * 1e3, "ms");
        line(&w, "exposed_comm_time", on.exposed.as_secs_f64() * 1e3, "ms");
        line(
            &w,
            "exposed_comm_time_no_overlap",
            off.exposed.as_secs_f64() * 1e3,
            "ms",
        );
        line(&w, "hidden_fraction", on.hidden, "ratio");
        let saved = off.step.as_secs_f64() - on.step.as_secs_f64();
        line(
            &w,
            "step_time_saved_over_comm",
            saved / off.exposed.as_secs_f64().max(1e-9),
            "ratio",
        );
        // Buckets of 1 MiB: more, smaller all-reduces, started earlier.
        let small = run(model, conv, 2, 1, rows, true, 1 << 20);
        line(
            &w,
            "step_time_overlap_cap1mb",
            small.step.as_secs_f64() * 1e3,
            "ms",
        );
        line(&w, "hidden_fraction_cap1mb", small.hidden, "ratio");

        let ranks = run(model, conv, 2, 1, rows, true, cap);
        let threads = run(model, conv, 1, 2, 2 * rows, true, cap);
        let s = format!("ddp_scaling_{name}");
        line(
            &s,
            "samples_per_s_2ranks_x_1thread",
            (2 * rows) as f64 / ranks.step.as_secs_f64(),
            "samples/s",
        );
        line(
            &s,
            "samples_per_s_1rank_x_2threads",
            (2 * rows) as f64 / threads.step.as_secs_f64(),
            "samples/s",
        );
    }
}
