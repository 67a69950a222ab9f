//! The pipeline bubble, measured on the pipeline engine against the
//! formula (spec §5.5): `(p − 1)/(m + p − 1)` for GPipe and 1F1B,
//! `(p − 1)/(v·m + p − 1)` for interleaved 1F1B (v = 2).
//!
//! Workload: the real engine (`PipelineEngine::train_batch` on `local`
//! threads, real autograd, real point-to-point messages), with every
//! virtual stage one layer whose forward and whose backward **wait** a
//! fixed time (`stage_ms / v` each, see [`stage_ms`]) instead of computing:
//! they sleep until [`SPIN_MARGIN`] before the end and spin the rest
//! ([`hold`]). Waiting stages make the measurement reflect the schedule
//! rather than how the machine's cores are shared (this machine has 2 cores
//! for up to 4 stage threads and other jobs). The final spin makes every
//! pass last its cost to the microsecond: a plain sleep overshoots by a
//! random 50–150 µs, and the formula assumes equal passes — random ones
//! lengthen the critical path beyond it. Message latency counts as idle
//! time.
//!
//! Measured bubble: with `T` the span from the earliest stage's start to the
//! latest stage's last pass and `busy_s` the time stage s spent in passes,
//! the mean over stages of `(T − busy_s)/T`; the median of [`REPEATS`]
//! batches. Lines: `bench\tpipeline_bubble_<schedule>_p<P>_m<M>\ttessera\t
//! measured|theory\t<x>\tfraction`, plus `rel_error` (measured/theory − 1).

use std::time::{Duration, Instant};

use tessera_autograd::{record, Parameter, Var};
use tessera_nn::Module;
use tessera_optim::{Sgd, SgdOptions};
use tessera_parallel::pipeline::{LossFn, Partition, PipelineEngine, PipelineModule, Schedule, StepReport};
use tessera_parallel::{CommExt, Communicator, LocalGroup};
use tessera_tensor::{DType, Tensor};

/// Forward plus backward time of one stage per micro-batch is `2 ·
/// stage_ms` milliseconds: 100 by default (a ResNet-50 stage at batch 32
/// takes about that), `TESSERA_BENCH_STAGE_MS` to change. The formula
/// counts no communication, but a stage thread parked in a receive wakes
/// some tens of µs after its message arrives, on every hop of the critical
/// path: a batch's span exceeds the formula's by about 2 ms whatever the
/// stage cost (measured on 2 cores; interleaved p = 2, m = 16 has the most
/// hops). At 30 ms stages that is 6.6% of its 3% bubble, at 100 ms 2.3%.
fn stage_ms() -> f64 {
    std::env::var("TESSERA_BENCH_STAGE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&ms: &f64| ms > 0.0)
        .unwrap_or(100.0)
}
const REPEATS: usize = 3;

/// How long before a pass's end [`hold`] stops sleeping and spins: above
/// the timer's usual overshoot (the 50 µs default timer slack plus the
/// wake-up).
const SPIN_MARGIN: Duration = Duration::from_micros(400);

/// Returns `d` after it was called, to within a microsecond or so on an
/// idle machine: sleeps most of it, spins the last [`SPIN_MARGIN`].
fn hold(d: Duration) {
    let end = Instant::now() + d;
    if let Some(nap) = d.checked_sub(SPIN_MARGIN) {
        std::thread::sleep(nap);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// A layer of known cost: the identity, whose forward takes `fwd` and
/// whose backward takes `bwd` ([`hold`]). Its one parameter makes the output require
/// a gradient even on the first stage.
#[derive(Module)]
struct Sleep {
    #[module(skip)]
    fwd: Duration,
    #[module(skip)]
    bwd: Duration,
    w: Parameter,
}

impl Module for Sleep {
    fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
        hold(self.fwd);
        let (bwd, w_shape) = (self.bwd, self.w.shape());
        Ok(record(
            "hold",
            x.tensor().clone(),
            &[x, &self.w.var()?],
            move |g, _| {
                hold(bwd);
                Ok(vec![Some(g.clone()), Some(Tensor::zeros(&w_shape, DType::F32)?)])
            },
        ))
    }
}

fn run(schedule: &Schedule, stage_ms: f64) -> Batch {
    let (p, v) = (schedule.stages(), schedule.chunks());
    let pass = Duration::from_secs_f64(stage_ms / 1e3 / v as f64);
    let x = Tensor::zeros(&[schedule.micro_batches(), 4], DType::F32).unwrap();
    let reports: Vec<Vec<StepReport>> = LocalGroup::run(p, |comm| {
        let layers: Vec<Box<dyn Module>> = (0..p * v)
            .map(|_| {
                Box::new(Sleep {
                    fwd: pass,
                    bwd: pass,
                    w: Parameter::new(Tensor::zeros(&[1], DType::F32).unwrap()),
                }) as Box<dyn Module>
            })
            .collect();
        let stage = PipelineModule::new(layers, p, v, &Partition::Layers)
            .and_then(|m| m.into_stage(comm.rank()))
            .unwrap();
        let mut opt = Sgd::new(stage.parameters(), SgdOptions::default()).unwrap();
        let loss: LossFn = Box::new(|y, _| y.mean(&[0, 1], false));
        let mut engine = PipelineEngine::new(comm, schedule.clone(), stage, loss).unwrap();
        (0..REPEATS)
            .map(|_| {
                comm.barrier().unwrap();
                engine.train_batch(&x, &x, &mut opt).unwrap()
            })
            .collect()
    })
    .unwrap();
    let mut batches: Vec<Batch> = (0..REPEATS)
        .map(|i| {
            let start = reports.iter().map(|r| r[i].started).min().unwrap();
            let end = reports.iter().map(|r| r[i].finished).max().unwrap();
            let span = (end - start).as_secs_f64();
            let busy: Vec<f64> = reports.iter().map(|r| r[i].busy.as_secs_f64()).collect();
            let bubble = busy.iter().map(|b| 1.0 - b / span).sum::<f64>() / p as f64;
            Batch { bubble, span, busy }
        })
        .collect();
    batches.sort_by(|a, b| a.bubble.total_cmp(&b.bubble));
    batches.swap_remove(REPEATS / 2)
}

/// One measured batch: the bubble, the span from the earliest stage's
/// start to the latest stage's last pass, and each stage's time in passes
/// (seconds).
struct Batch {
    bubble: f64,
    span: f64,
    busy: Vec<f64>,
}

/// The one-way time of a micro-batch-sized activation between two stage
/// threads on `local` (`send_tensor` → `recv_tensor`, half the median
/// round trip of a ping-pong), in microseconds: what each message on the
/// schedule's critical path adds to the span, as idle time.
fn p2p_latency_us(x: &Tensor) -> f64 {
    const TRIPS: usize = 200;
    let times = LocalGroup::run(2, |comm| {
        let peer = 1 - comm.rank();
        let mut trips = Vec::with_capacity(TRIPS);
        for _ in 0..TRIPS {
            let t = Instant::now();
            if comm.rank() == 0 {
                comm.send_tensor(x, peer, 0).unwrap();
                comm.recv_tensor(peer, 0).unwrap();
            } else {
                let y = comm.recv_tensor(peer, 0).unwrap();
                comm.send_tensor(&y, peer, 0).unwrap();
            }
            trips.push(t.elapsed().as_secs_f64());
        }
        trips
    })
    .unwrap();
    let mut trips = times[0].clone();
    trips.sort_by(f64::total_cmp);
    trips[TRIPS / 2] / 2.0 * 1e6
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let ms = stage_ms();
    println!(
        "# workload: every virtual stage waits {ms} ms / v in forward and in backward (sleep + spin, not compute: see the file's docs); median of {REPEATS} batches"
    );
    let t = Instant::now();
    let latency = p2p_latency_us(&Tensor::zeros(&[1, 4], DType::F32).unwrap());
    println!("bench\tpipeline_p2p_local\ttessera\tone_way_latency\t{latency:.1}\tus");
    for name in ["gpipe", "1f1b", "interleaved"] {
        for p in [2, 4] {
            for m in [4, 8, 16] {
                let workload = format!("pipeline_bubble_{name}_p{p}_m{m}");
                if filter.as_ref().is_some_and(|f| !workload.contains(f.as_str())) {
                    continue;
                }
                let schedule = match name {
                    "gpipe" => Schedule::gpipe(p, m),
                    "1f1b" => Schedule::one_f_one_b(p, m),
                    _ => Schedule::interleaved(p, m, 2),
                }
                .unwrap();
                let batch = run(&schedule, ms);
                let (measured, theory) = (batch.bubble, schedule.bubble_theory());
                // Where an excess comes from: each stage's busy time, and
                // the span the formula gives for the busiest stage.
                let busiest = batch.busy.iter().copied().fold(0.0, f64::max);
                let busy_ms: Vec<String> = batch.busy.iter().map(|b| format!("{:.2}", b * 1e3)).collect();
                println!(
                    "# {workload}: span {:.2} ms, formula span {:.2} ms, busy per stage [{}] ms",
                    batch.span * 1e3,
                    busiest / (1.0 - theory) * 1e3,
                    busy_ms.join(", ")
                );
                println!("bench\t{workload}\ttessera\tmeasured\t{measured:.4}\tfraction");
                println!("bench\t{workload}\ttessera\ttheory\t{theory:.4}\tfraction");
                println!(
                    "bench\t{workload}\ttessera\trel_error\t{:.4}\tratio",
                    measured / theory - 1.0
                );
            }
        }
    }
    eprintln!("pipeline_bubble: {:.1} s", t.elapsed().as_secs_f64());
}
