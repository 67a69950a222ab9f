//! Pipeline training against single-process training (spec §5.6 item 7):
//! every schedule on 2 and 4 stages and 1–8 micro-batches, an MLP and a
//! small transformer stack, tied weights, a pipeline × data-parallel grid,
//! the `tcp` backend; activation stashes against the schedule's bound; and
//! failing stages that must give errors, not hangs.
//!
//! Two oracles: the same model in one process accumulating the gradients of
//! the same micro-batches in order (the pipeline does the same arithmetic,
//! so parameters must agree bitwise), and the same model on the full batch
//! in one step (different summation order: within 2e-6 absolute on values of
//! order 0.1–1 after two SGD steps).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tessera_autograd::{autocast, Var};
use tessera_nn::{
    CrossEntropyLoss, Linear, Module, Sequential, Tanh, TransformerEncoderLayer, TransformerOptions,
};
use tessera_optim::{GradAccumulator, GradScaler, GradScalerOptions, Optimizer, Sgd, SgdOptions};
use tessera_parallel::pipeline::{
    LossFn, Partition, PipelineEngine, PipelineGrid, PipelineModule, Schedule, ScheduleKind,
};
use tessera_parallel::{
    tcp, CommConfig, CommError, Communicator, DdpConfig, DistributedDataParallel, LocalGroup,
};
use tessera_tensor::{manual_seed, DType, Tensor};

const STEPS: usize = 2;
const BATCH: usize = 840; // divisible by every micro-batch count 1..=8

/// A model as a builder, so every rank (thread) can build the same one.
type Build = fn() -> Sequential;

fn mlp() -> Sequential {
    manual_seed(7);
    let mut s = Sequential::new()
        .with(Linear::new(6, 16, true).unwrap())
        .with(Tanh);
    for _ in 0..3 {
        s = s.with(Linear::new(16, 16, true).unwrap()).with(Tanh);
    }
    s.with(Linear::new(16, 3, true).unwrap())
}

/// Mean over the token dimension of `[B, T, d]`.
#[derive(Module)]
struct MeanTokens;

impl Module for MeanTokens {
    fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
        x.mean(&[1], false)
    }
}

fn transformer() -> Sequential {
    manual_seed(11);
    let o = TransformerOptions {
        dim_feedforward: 32,
        dropout: 0.0,
        ..TransformerOptions::default()
    };
    Sequential::new()
        .with(Linear::new(6, 16, true).unwrap())
        .with(TransformerEncoderLayer::new(16, 2, o).unwrap())
        .with(TransformerEncoderLayer::new(16, 2, o).unwrap())
        .with(TransformerEncoderLayer::new(16, 2, o).unwrap())
        .with(MeanTokens)
        .with(Linear::new(16, 16, true).unwrap())
        .with(Tanh)
        .with(Linear::new(16, 3, true).unwrap())
}

/// Deterministic inputs (`[rows, 6]`, or `[rows, 4, 6]` for sequences) and
/// class targets.
fn data(rows: usize, seq: bool) -> (Tensor, Tensor) {
    let per = if seq { 4 * 6 } else { 6 };
    let x: Vec<f32> = (0..rows * per).map(|i| ((i as f32) * 0.371).sin()).collect();
    let y: Vec<i64> = (0..rows as i64).map(|i| (i * 7 + i / 3) % 3).collect();
    let shape: Vec<usize> = if seq { vec![rows, 4, 6] } else { vec![rows, 6] };
    (
        Tensor::from_vec(x, &shape).unwrap(),
        Tensor::from_vec(y, &[rows]).unwrap(),
    )
}

fn loss_fn() -> LossFn {
    Box::new(|y, t| CrossEntropyLoss::new().forward(y, t))
}

fn sgd(params: Vec<tessera_autograd::Parameter>) -> Sgd {
    let o = SgdOptions {
        lr: 0.05,
        momentum: 0.9,
        ..SgdOptions::default()
    };
    Sgd::new(params, o).unwrap()
}

type Params = HashMap<String, Vec<f32>>;

fn values(named: Vec<(String, tessera_autograd::Parameter)>) -> Params {
    named
        .into_iter()
        .map(|(n, p)| (n, p.tensor().unwrap().to_vec::<f32>().unwrap()))
        .collect()
}

/// Single process, `m` micro-batches per step with the gradients summed in
/// order (`m = 1`: the full batch in one pass). Returns the parameters and
/// the per-step losses.
fn reference(build: Build, x: &Tensor, y: &Tensor, m: usize) -> (Params, Vec<f64>) {
    let model = build();
    let mut opt = sgd(model.parameters());
    let rows = x.shape()[0] / m;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let mut acc = GradAccumulator::new(m, false).unwrap();
        let mut total = 0.0;
        for mb in 0..m {
            let xb = Var::constant(x.narrow(0, mb * rows, rows).unwrap());
            let yb = y.narrow(0, mb * rows, rows).unwrap();
            let loss = loss_fn()(&model.forward(&xb).unwrap(), &yb).unwrap();
            let loss = loss.mul_scalar(1.0 / m as f64).unwrap();
            total += loss.tensor().to_vec::<f32>().unwrap()[0] as f64;
            if let Some(g) = acc.add(loss.backward().unwrap()).unwrap() {
                opt.step(&g).unwrap();
            }
        }
        losses.push(total);
    }
    (values(model.named_parameters()), losses)
}

/// What one stage reports after training.
struct StageOut {
    params: Params,
    losses: Vec<Option<f64>>,
    peaks: Vec<usize>,
    /// Bytes the data-parallel reduction all-reduced in the last step.
    reduced_bytes: usize,
}

/// Trains `build`'s model as a pipeline over `comm` for [`STEPS`] steps.
fn train_stage(
    comm: &dyn Communicator,
    dp: Option<&dyn Communicator>,
    build: Build,
    schedule: &Schedule,
    x: &Tensor,
    y: &Tensor,
) -> Result<StageOut, CommError> {
    let layers = build().layers;
    let module = PipelineModule::new(layers, schedule.stages(), schedule.chunks(), &Partition::Layers)?;
    let stage = module.into_stage(comm.rank())?;
    let mut opt = sgd(stage.parameters());
    let mut engine = PipelineEngine::new(comm, schedule.clone(), stage, loss_fn())?;
    if let Some(dp) = dp {
        engine = engine.with_data_parallel(dp);
    }
    let mut out = StageOut {
        params: Params::new(),
        losses: Vec::new(),
        peaks: Vec::new(),
        reduced_bytes: 0,
    };
    for _ in 0..STEPS {
        let r = engine.train_batch(x, y, &mut opt)?;
        out.losses.push(r.loss);
        out.peaks.push(r.peak_stashed);
        assert_eq!(r.data_parallel.is_some(), dp.is_some());
        out.reduced_bytes = r.data_parallel.map_or(0, |d| d.bytes_reduced);
    }
    out.params = values(engine.stage().named_parameters());
    Ok(out)
}

fn schedules(p: usize, m: usize) -> Vec<Schedule> {
    let mut v = vec![
        Schedule::gpipe(p, m).unwrap(),
        Schedule::deepspeed(p, m).unwrap(),
        Schedule::one_f_one_b(p, m).unwrap(),
    ];
    if m.is_multiple_of(p) {
        v.push(Schedule::interleaved(p, m, 2).unwrap());
    }
    v
}

fn assert_bitwise(got: &Params, want: &Params, what: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: parameter names {:?}",
        got.keys().collect::<Vec<_>>()
    );
    for (name, g) in got {
        let w = &want[name];
        let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{what}: {name} differs bitwise from the accumulating reference"
        );
    }
}

fn assert_close(got: &Params, want: &Params, tol: f32, what: &str) {
    for (name, g) in got {
        let w = &want[name];
        let err = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= tol, "{what}: {name} off the full-batch reference by {err}");
    }
}

/// Every schedule, p ∈ {2, 4}, m ∈ 1..=8: bitwise the accumulating
/// reference, close to the full batch, and each stage's stash peaks where
/// the schedule says (GPipe m, 1F1B min(p − s, m)).
fn check_model(build: Build, rows: usize, seq: bool, ms: &[usize]) {
    let (x, y) = data(rows, seq);
    let (full, _) = reference(build, &x, &y, 1);
    for &m in ms {
        let (acc, losses) = reference(build, &x, &y, m);
        assert_close(&acc, &full, 2e-6, &format!("reference m {m}"));
        for p in [2, 4] {
            for s in schedules(p, m) {
                let what = format!("{} p {p} m {m}", s.kind().name());
                let outs = LocalGroup::run(p, |c| train_stage(c, None, build, &s, &x, &y)).unwrap();
                let mut merged = Params::new();
                for (st, o) in outs.into_iter().enumerate() {
                    let o = o.unwrap_or_else(|e| panic!("{what}: {e}"));
                    merged.extend(o.params);
                    for &peak in &o.peaks {
                        assert_eq!(peak, s.peak_in_flight(st), "{what} stage {st}");
                        assert!(peak <= s.in_flight_bound(st), "{what} stage {st}");
                    }
                    match s.kind() {
                        ScheduleKind::GPipe => assert_eq!(o.peaks[0], m),
                        ScheduleKind::OneFOneB => assert_eq!(o.peaks[0], (p - st).min(m)),
                        _ => {}
                    }
                    if st == p - 1 {
                        let got: Vec<f64> = o.losses.iter().map(|l| l.expect("last stage loss")).collect();
                        for (g, w) in got.iter().zip(&losses) {
                            assert!((g - w).abs() <= 1e-6 * w.abs(), "{what}: loss {g} vs {w}");
                        }
                    } else {
                        assert!(o.losses.iter().all(Option::is_none));
                    }
                }
                assert_bitwise(&merged, &acc, &what);
                assert_close(&merged, &full, 2e-6, &what);
            }
        }
    }
}

#[test]
fn mlp_pipeline_equals_single_process_for_every_schedule() {
    check_model(mlp, BATCH, false, &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn transformer_pipeline_equals_single_process_for_every_schedule() {
    check_model(transformer, 24, true, &[1, 2, 3, 4, 8]);
}

/// Parameter-count partition on a model with a heavy first layer, and the
/// interleaved assignment of layers to chunks.
#[test]
fn partitions_place_layers_where_the_spec_says() {
    let module = PipelineModule::new(mlp().layers, 4, 2, &Partition::Layers).unwrap();
    // 9 layers over 8 virtual stages: the first part takes the extra layer;
    // stage 0 holds virtual stages 0 and 4.
    assert_eq!(module.bounds(), [0, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(module.layers_of(1, 1), 6..7);
    let stage = module.into_stage(1).unwrap();
    let names: Vec<String> = stage.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["2.weight", "2.bias", "6.weight", "6.bias"]);
    let by_params = PipelineModule::new(mlp().layers, 3, 1, &Partition::Parameters).unwrap();
    // Linear(6,16) = 112, Linear(16,16) = 272 ×3, Linear(16,3) = 51
    // parameters: the best split's largest part holds 384.
    assert_eq!(by_params.bounds(), [0, 3, 5, 9]);
}

/// A model whose first and last linear layers share one weight: the
/// pipeline holds a copy on each end stage and sums their gradients.
#[test]
fn tied_weights_are_reduced_over_their_stages() {
    fn tied() -> Sequential {
        manual_seed(5);
        let shared = Linear::new(6, 6, false).unwrap();
        let mut head = Linear::new(6, 6, false).unwrap();
        head.weight = shared.weight.clone();
        Sequential::new()
            .with(shared)
            .with(Tanh)
            .with(Linear::new(6, 6, true).unwrap())
            .with(Tanh)
            .with(head)
            .with(Linear::new(6, 3, true).unwrap())
    }
    let (x, y) = data(48, false);
    let (want, _) = reference(tied, &x, &y, 1);
    for s in [
        Schedule::one_f_one_b(3, 4).unwrap(),
        Schedule::gpipe(2, 3).unwrap(),
    ] {
        let p = s.stages();
        let outs = LocalGroup::run(p, |comm| -> Result<Params, CommError> {
            let module = PipelineModule::new(
                tied().layers,
                p,
                1,
                &Partition::Explicit(match p {
                    3 => vec![0, 2, 4, 6],
                    _ => vec![0, 3, 6],
                }),
            )?;
            let stage = module.into_stage(comm.rank())?;
            let copy = stage
                .named_parameters()
                .into_iter()
                .find(|(n, _)| n == "0.weight" || n == "4.weight")
                .map(|(_, p)| p);
            let mut opt = sgd(stage.parameters());
            let mut engine = PipelineEngine::new(comm, s.clone(), stage, loss_fn())?;
            engine.tie(&[0, p - 1], copy)?;
            for _ in 0..STEPS {
                engine.train_batch(&x, &y, &mut opt)?;
            }
            Ok(values(engine.stage().named_parameters()))
        })
        .unwrap();
        let outs: Vec<Params> = outs.into_iter().map(Result::unwrap).collect();
        let (first, last) = (&outs[0]["0.weight"], &outs[p - 1]["4.weight"]);
        assert_eq!(first, last, "the two copies of the tied weight stay identical");
        let mut merged = Params::new();
        for o in outs {
            merged.extend(o.into_iter().filter(|(n, _)| n != "4.weight"));
        }
        assert_close(&merged, &want, 2e-6, s.kind().name());
    }
}

/// DDP over `world` ranks on the MLP, each rank on its share of the batch,
/// accumulating `m` micro-batches under `no_sync` before the synchronising
/// backward: the arithmetic a `pp × dp` grid must reproduce.
fn ddp_accumulating(world: usize, x: &Tensor, y: &Tensor, m: usize) -> Params {
    let outs = LocalGroup::run(world, |comm| -> Result<Params, CommError> {
        let ddp = DistributedDataParallel::new(mlp(), comm, DdpConfig::default())?;
        let mut opt = sgd(ddp.parameters());
        let share = x.shape()[0] / world;
        let rows = share / m;
        for _ in 0..STEPS {
            for mb in 0..m {
                let at = comm.rank() * share + mb * rows;
                let xb = Var::constant(x.narrow(0, at, rows)?);
                let loss = loss_fn()(&ddp.forward(&xb)?, &y.narrow(0, at, rows)?)?;
                let loss = loss.mul_scalar(1.0 / m as f64)?;
                if mb + 1 < m {
                    let _local = ddp.no_sync();
                    ddp.backward(&loss)?;
                } else {
                    opt.step(&ddp.backward(&loss)?)?;
                }
            }
        }
        Ok(values(ddp.module().named_parameters()))
    })
    .unwrap();
    outs.into_iter().next().unwrap().unwrap()
}

/// 2 stages × 2 replicas on 4 threads, every schedule: each replica trains
/// on its half of the batch through DDP's reducer (which the step report
/// shows), the replicas agree bitwise, the result is bitwise DDP with
/// `no_sync` accumulation over the same micro-batches, and close to one
/// process on the full batch.
#[test]
fn pipeline_by_data_parallel_grid_equals_the_full_batch() {
    let (x, y) = data(BATCH, false);
    let (want, _) = reference(mlp, &x, &y, 1);
    let m = 4;
    let ddp = ddp_accumulating(2, &x, &y, m);
    assert_close(&ddp, &want, 2e-6, "ddp reference");
    for s in schedules(2, m) {
        let what = format!("pp 2 x dp 2 {}", s.kind().name());
        let outs = LocalGroup::run(4, |world| -> Result<(usize, Params, usize), CommError> {
            let grid = PipelineGrid::new(world, 2)?;
            let half = BATCH / 2;
            let xs = x.narrow(0, grid.dp_rank * half, half)?;
            let ys = y.narrow(0, grid.dp_rank * half, half)?;
            let o = train_stage(grid.pipe.as_ref(), Some(grid.data.as_ref()), mlp, &s, &xs, &ys)?;
            Ok((grid.stage, o.params, o.reduced_bytes))
        })
        .unwrap();
        let mut by_replica: Vec<Params> = vec![Params::new(), Params::new()];
        for (rank, o) in outs.into_iter().enumerate() {
            let (stage, params, reduced) = o.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(stage, rank / 2, "Megatron order: rank = dp_rank + 2·stage");
            let bytes: usize = params.values().map(|v| v.len() * 4).sum();
            assert_eq!(
                reduced, bytes,
                "{what}: the reducer all-reduced every gradient of stage {stage}"
            );
            by_replica[rank % 2].extend(params);
        }
        assert_eq!(by_replica[0], by_replica[1], "{what}: replicas agree bitwise");
        assert_bitwise(&by_replica[0], &ddp, &what);
        assert_close(&by_replica[0], &want, 2e-6, &what);
    }
}

/// Set (to the schedule's name) in the rank processes of
/// [`pipeline_over_tcp_processes_equals_single_process`].
const TCP_CHILD: &str = "TESSERA_PIPELINE_TCP_CHILD";

/// One rank of the tcp-process test: joins the job from the torchrun-style
/// environment, trains its stage and prints its parameters' bits. A no-op
/// in the ordinary test run.
#[test]
fn tcp_rank_child() {
    let Ok(name) = std::env::var(TCP_CHILD) else {
        return;
    };
    let s = Schedule::new(ScheduleKind::parse(&name).unwrap(), 2, 4, 2).unwrap();
    let (x, y) = data(BATCH, false);
    let comm = tcp::init_from_env().unwrap();
    let out = train_stage(&comm, None, mlp, &s, &x, &y).unwrap();
    for (name, v) in out.params {
        let bits: Vec<String> = v.iter().map(|f| f.to_bits().to_string()).collect();
        println!("param {name} {}", bits.join(","));
    }
}

/// 1F1B and interleaved over `tcp` between two processes (this test binary
/// spawned as the ranks, torchrun's environment variables): the same bits
/// as single-process gradient accumulation.
#[test]
fn pipeline_over_tcp_processes_equals_single_process() {
    let (x, y) = data(BATCH, false);
    let (want, _) = reference(mlp, &x, &y, 4);
    for name in ["gpipe", "deepspeed", "1f1b", "interleaved"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let children: Vec<_> = (0..2)
            .map(|rank| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "pipeline::tcp_rank_child",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(TCP_CHILD, name)
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env(tcp::TIMEOUT_VAR, "30")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut got = Params::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{name}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The harness may print its "test ... " prefix on the first line.
            for line in text.lines().filter_map(|l| l.split_once("param ").map(|x| x.1)) {
                let (pname, bits) = line.split_once(' ').unwrap();
                let v = bits
                    .split(',')
                    .map(|b| f32::from_bits(b.parse().unwrap()))
                    .collect();
                got.insert(pname.to_string(), v);
            }
        }
        assert_bitwise(&got, &want, &format!("{name} over tcp processes"));
    }
}

/// The inference schedule gives the full model's outputs.
#[test]
fn inference_schedule_gives_the_models_outputs() {
    let (x, _) = data(24, false);
    let want = mlp()
        .forward(&Var::constant(x.clone()))
        .unwrap()
        .into_tensor()
        .to_vec::<f32>()
        .unwrap();
    let s = Schedule::inference(3, 4).unwrap();
    let outs = LocalGroup::run(3, |comm| -> Result<Option<Tensor>, CommError> {
        let stage = PipelineModule::new(mlp().layers, 3, 1, &Partition::Layers)?.into_stage(comm.rank())?;
        PipelineEngine::new(comm, s.clone(), stage, loss_fn())?.infer_batch(&x)
    })
    .unwrap();
    let outs: Vec<Option<Tensor>> = outs.into_iter().map(Result::unwrap).collect();
    assert!(outs[0].is_none() && outs[1].is_none());
    let got = outs[2].as_ref().unwrap().to_vec::<f32>().unwrap();
    let err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(got.len() == want.len() && err < 1e-6, "{err}");
}

fn fast_config() -> CommConfig {
    CommConfig {
        timeout: Duration::from_millis(500),
        ..CommConfig::default()
    }
}

/// A stage whose layers do not fit the activation it receives fails with
/// an error naming it and the micro-batch, and its peers fail too, fast.
#[test]
fn shape_mismatch_between_stages_is_an_error_naming_the_stage() {
    let (x, y) = data(8, false);
    for s in [
        Schedule::gpipe(3, 2).unwrap(),
        Schedule::one_f_one_b(3, 2).unwrap(),
    ] {
        let t = Instant::now();
        let outs = LocalGroup::run_with(3, fast_config(), |comm| -> Result<(), CommError> {
            let mut layers = mlp().layers;
            if comm.rank() == 1 {
                // Stage 1 expects 7 features, stage 0 sends 16.
                layers[2] = Box::new(Linear::new(7, 16, true).unwrap());
            }
            let stage = PipelineModule::new(layers, 3, 1, &Partition::Explicit(vec![0, 2, 4, 9]))?
                .into_stage(comm.rank())?;
            let mut opt = sgd(stage.parameters());
            PipelineEngine::new(comm, s.clone(), stage, loss_fn())?
                .train_batch(&x, &y, &mut opt)
                .map(drop)
        })
        .unwrap();
        let e1 = outs[1].as_ref().unwrap_err().to_string();
        assert!(
            e1.contains("pipeline stage 1") && e1.contains("micro-batch 0"),
            "{e1}"
        );
        assert!(outs[0].is_err() && outs[2].is_err(), "{outs:?}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}

/// A stage that dies (returns before its first instruction) or stalls past
/// the timeout: the others return errors naming their stage, never hang.
#[test]
fn dead_or_stalled_stage_fails_the_others_within_the_timeout() {
    let (x, y) = data(8, false);
    for stall in [false, true] {
        let t = Instant::now();
        let s = Schedule::one_f_one_b(3, 4).unwrap();
        let outs = LocalGroup::run_with(3, fast_config(), |comm| -> Result<(), CommError> {
            let stage =
                PipelineModule::new(mlp().layers, 3, 1, &Partition::Layers)?.into_stage(comm.rank())?;
            let mut opt = sgd(stage.parameters());
            let mut engine = PipelineEngine::new(comm, s.clone(), stage, loss_fn())?;
            if comm.rank() == 1 {
                if stall {
                    std::thread::sleep(Duration::from_secs(1));
                }
                return Err(CommError::arg("test", "stage 1 died"));
            }
            engine.train_batch(&x, &y, &mut opt).map(drop)
        })
        .unwrap();
        for st in [0, 2] {
            let e = outs[st].as_ref().unwrap_err();
            assert!(e.is_fatal(), "stage {st}: {e}");
            assert!(e.to_string().contains(&format!("pipeline stage {st}")), "{e}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "stall {stall}: {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn engine_rejects_a_group_that_does_not_fit_the_schedule() {
    let outs = LocalGroup::run(2, |comm| {
        let stage = PipelineModule::new(mlp().layers, 3, 1, &Partition::Layers)?.into_stage(comm.rank())?;
        PipelineEngine::new(comm, Schedule::gpipe(3, 2)?, stage, loss_fn()).map(drop)
    })
    .unwrap();
    assert!(outs.iter().all(|o| o
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("schedule has 3 stages")));
    let (x, y) = data(9, false);
    let outs = LocalGroup::run(2, |comm| -> Result<(), CommError> {
        let stage = PipelineModule::new(mlp().layers, 2, 1, &Partition::Layers)?.into_stage(comm.rank())?;
        let mut opt = sgd(stage.parameters());
        PipelineEngine::new(comm, Schedule::gpipe(2, 2)?, stage, loss_fn())?
            .train_batch(&x, &y, &mut opt)
            .map(drop)
    })
    .unwrap();
    let e = outs[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("do not split into 2 equal micro-batches"), "{e}");
}

/// Peak activation memory per stage, measured through the allocator (each
/// stage's own meter, although the stages are threads of one process):
/// GPipe's grows linearly with the micro-batch count, 1F1B's is bounded by
/// the p micro-batches a stage holds at most, whatever m.
#[test]
fn activation_memory_per_stage_follows_the_schedule() {
    fn wide() -> Sequential {
        manual_seed(3);
        Sequential::new()
            .with(Linear::new(6, 1024, true).unwrap())
            .with(Tanh)
            .with(Linear::new(1024, 16, true).unwrap())
            .with(Linear::new(16, 1024, true).unwrap())
            .with(Tanh)
            .with(Linear::new(1024, 3, true).unwrap())
    }
    // Per stage, the peak of one batch of 64 rows per micro-batch.
    let peaks = |s: Schedule| -> Vec<usize> {
        let (x, y) = data(64 * s.micro_batches(), false);
        LocalGroup::run(2, |comm| -> Result<usize, CommError> {
            let stage =
                PipelineModule::new(wide().layers, 2, 1, &Partition::Layers)?.into_stage(comm.rank())?;
            let mut opt = sgd(stage.parameters());
            let mut engine = PipelineEngine::new(comm, s.clone(), stage, loss_fn())?;
            Ok(engine.train_batch(&x, &y, &mut opt)?.peak_activation_bytes)
        })
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect()
    };
    let ms = [2, 4, 8];
    let g: Vec<Vec<usize>> = ms
        .iter()
        .map(|&m| peaks(Schedule::gpipe(2, m).unwrap()))
        .collect();
    let f: Vec<Vec<usize>> = ms
        .iter()
        .map(|&m| peaks(Schedule::one_f_one_b(2, m).unwrap()))
        .collect();
    println!("peak activation bytes [stage 0, stage 1] for m = {ms:?}: gpipe {g:?}, 1f1b {f:?}");
    for stage in 0..2 {
        let (g2, g4, g8) = (g[0][stage] as f64, g[1][stage] as f64, g[2][stage] as f64);
        // GPipe stashes all m micro-batches: each 2 more cost the same again.
        assert!(
            g4 > g2 && ((g8 - g4) / (g4 - g2) - 2.0).abs() < 0.1,
            "stage {stage}: gpipe {g:?}"
        );
        // 1F1B holds at most p = 2 micro-batches (stage 1 one): past m = p
        // the peak does not grow (m = 4 and 8 give the same bytes), and it
        // exceeds m = 2's by less than half a micro-batch's activations
        // (a gradient received while both micro-batches are stashed).
        let per_micro_batch = (g4 - g2) / 2.0;
        let (f2, f4, f8) = (f[0][stage] as f64, f[1][stage] as f64, f[2][stage] as f64);
        assert!(
            f4 == f8 && f8 - f2 < 0.5 * per_micro_batch,
            "stage {stage}: 1f1b {f:?}"
        );
        assert!(f8 < 0.5 * g8, "stage {stage}: 1f1b {f:?} against gpipe {g:?}");
    }
    // With m = 2 = p both schedules hold every micro-batch on stage 0.
    assert!(f[0][0] as f64 >= 0.9 * g[0][0] as f64, "gpipe {g:?}, 1f1b {f:?}");
}

/// One process under autocast to `dtype`, `m` micro-batches per step with
/// their gradients summed in order, the loss scaled by `scaler` (disabled
/// for bf16): what a mixed-precision pipeline must reproduce bitwise.
fn reference_autocast(x: &Tensor, y: &Tensor, m: usize, dtype: DType, scaler: &mut GradScaler) -> Params {
    let model = mlp();
    let mut opt = sgd(model.parameters());
    let rows = x.shape()[0] / m;
    for _ in 0..STEPS {
        let mut acc = GradAccumulator::new(m, false).unwrap();
        for mb in 0..m {
            let xb = Var::constant(x.narrow(0, mb * rows, rows).unwrap());
            let yb = y.narrow(0, mb * rows, rows).unwrap();
            let loss = autocast(dtype, || loss_fn()(&model.forward(&xb)?, &yb)).unwrap();
            let loss = loss.mul_scalar(1.0 / m as f64).unwrap();
            if let Some(mut g) = acc.add(scaler.backward(&loss).unwrap()).unwrap() {
                assert!(
                    scaler.step(&mut opt, &mut g).unwrap(),
                    "the reference skipped a step"
                );
            }
        }
        scaler.update().unwrap();
    }
    values(model.named_parameters())
}

fn scaler_for(dtype: DType) -> GradScaler {
    GradScaler::new(GradScalerOptions {
        enabled: dtype == DType::F16,
        ..GradScalerOptions::default()
    })
    .unwrap()
}

/// bf16 and f16 (with loss scaling) pipelines, every schedule on 2 stages:
/// activations and their gradients cross the stages in the low dtype, and
/// the parameters equal one process's autocast training with the same
/// micro-batches bitwise — and differ from f32 training.
#[test]
fn mixed_precision_pipeline_equals_single_process_autocast() {
    let (x, y) = data(BATCH, false);
    let m = 4;
    let (f32_run, _) = reference(mlp, &x, &y, m);
    for dtype in [DType::BF16, DType::F16] {
        let want = reference_autocast(&x, &y, m, dtype, &mut scaler_for(dtype));
        assert_ne!(want, f32_run, "{dtype}: autocast changed nothing");
        for s in schedules(2, m) {
            let what = format!("{dtype} {}", s.kind().name());
            let outs = LocalGroup::run(2, |comm| -> Result<Params, CommError> {
                let module = PipelineModule::new(mlp().layers, 2, s.chunks(), &Partition::Layers)?;
                let stage = module.into_stage(comm.rank())?;
                let mut opt = sgd(stage.parameters());
                let mut engine =
                    PipelineEngine::new(comm, s.clone(), stage, loss_fn())?.with_autocast(dtype)?;
                let mut scaler = scaler_for(dtype);
                for _ in 0..STEPS {
                    let r = engine.train_batch_scaled(&x, &y, &mut opt, &mut scaler)?;
                    assert!(r.stepped);
                    scaler.update()?;
                }
                Ok(values(engine.stage().named_parameters()))
            })
            .unwrap();
            let mut merged = Params::new();
            for o in outs {
                merged.extend(o.unwrap_or_else(|e| panic!("{what}: {e}")));
            }
            assert_bitwise(&merged, &want, &what);
        }
    }
    let err = LocalGroup::run(1, |comm| {
        let stage = PipelineModule::new(mlp().layers, 1, 1, &Partition::Layers)?.into_stage(0)?;
        PipelineEngine::new(comm, Schedule::gpipe(1, 1)?, stage, loss_fn())?
            .with_autocast(DType::F64)
            .map(|_| ())
    })
    .unwrap()
    .remove(0)
    .expect_err("f64 is no autocast dtype");
    assert!(err.to_string().contains("bf16 or f16"), "{err}");
}

/// Passes its input on with no path back: the stages before it get zero
/// gradients.
#[derive(Module)]
struct Detach;

impl Module for Detach {
    fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
        Ok(Var::constant(x.tensor().clone()))
    }
}

/// An f16 scale so large that only the last stage's gradients overflow
/// (the first stage gets zeros through `Detach`): every stage must skip
/// the step, report it, leave its parameters as they were and back the
/// scale off alike — the inf/NaN verdict is the pipeline's, not a stage's.
#[test]
fn an_overflow_on_one_stage_skips_the_step_on_every_stage() {
    fn model() -> Sequential {
        manual_seed(3);
        Sequential::new()
            .with(Linear::new(6, 16, true).unwrap())
            .with(Tanh)
            .with(Detach)
            .with(Linear::new(16, 3, true).unwrap())
    }
    let (x, y) = data(48, false);
    let before = values(model().named_parameters());
    let outs = LocalGroup::run(2, |comm| -> Result<(bool, f64, Params), CommError> {
        let module = PipelineModule::new(model().layers, 2, 1, &Partition::Layers)?;
        let stage = module.into_stage(comm.rank())?;
        let mut opt = sgd(stage.parameters());
        let mut engine = PipelineEngine::new(comm, Schedule::one_f_one_b(2, 2)?, stage, loss_fn())?
            .with_autocast(DType::F16)?;
        let mut scaler = GradScaler::new(GradScalerOptions {
            init_scale: 1e30,
            ..GradScalerOptions::default()
        })?;
        let r = engine.train_batch_scaled(&x, &y, &mut opt, &mut scaler)?;
        scaler.update()?;
        Ok((
            r.stepped,
            scaler.scale(),
            values(engine.stage().named_parameters()),
        ))
    })
    .unwrap();
    for (st, o) in outs.into_iter().enumerate() {
        let (stepped, scale, params) = o.unwrap();
        assert!(!stepped, "stage {st} stepped past an overflow");
        assert_eq!(scale, 1e30f32 as f64 * 0.5, "stage {st} backed the scale off");
        for (name, v) in params {
            assert_eq!(v, before[&name], "stage {st}: {name} changed in a skipped step");
        }
    }
}
