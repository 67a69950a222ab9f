//! `--pipeline-stages P`: the same training as [`super::run::train`] (same
//! model, init, optimizer, schedule and batches), with the CNN's layers split
//! evenly into P stages (P·V chunks for the interleaved schedule) under the
//! chosen pipeline schedule: on P threads of the `local` backend, or, when
//! started by `tessera-run --nproc-per-node P` (or torchrun, or srun), one
//! stage per process over `tcp`. Each batch is split into M micro-batches
//! whose gradients are summed, so the arithmetic is single-process training
//! with gradient accumulation, and threads and processes give the same
//! bits. After every epoch the stages send their parameters to stage 0,
//! which assembles one model to measure test accuracy. `--precision
//! bf16|f16` runs every stage's forward and the loss under autocast
//! (activations cross the stages in the low dtype), f16 with a loss scaler
//! whose inf/NaN verdict all stages share.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tessera::autograd::{CrossEntropyOptions, Target};
use tessera::nn::{models::mnist_cnn, state_dict, Module};
use tessera::optim::{LrScheduler, OneCycleLR, OneCycleOptions};
use tessera::parallel::pipeline::{
    LossFn, Partition, PipelineEngine, PipelineModule, Schedule, ScheduleKind,
};
use tessera::parallel::{tcp, CommExt, Communicator, LocalGroup};
use tessera::tensor::{rng, DType, StateDict, Tensor};

use super::cli::Args;
use super::common::ddp::rank_0_result;
use super::common::precision::Precision;
use super::common::{count_correct, evaluate, BoxResult, Split};
use super::run::{load_data, optimizer, EpochRecord};

/// Message tags of the per-epoch reports to stage 0.
const TAG_NAMES: u64 = 1 << 40;
const TAG_PARAMS: u64 = TAG_NAMES + 1;
const TAG_EPOCH: u64 = TAG_NAMES + 2;

/// Whether a launcher (tessera-run, torchrun, srun) started this process
/// as one rank of a job.
pub(crate) fn launched() -> bool {
    std::env::var_os("WORLD_SIZE").is_some() || std::env::var_os("SLURM_NTASKS").is_some()
}

/// Trains as `args` says with pipeline parallelism; returns the epoch
/// records (printed and logged as in single-process mode) on the process
/// that holds stage 0, none on the other processes.
pub fn train(args: &Args) -> BoxResult<Vec<EpochRecord>> {
    let clock = Instant::now();
    let data = load_data(args)?;
    let kind = ScheduleKind::parse(&args.schedule)?;
    if !kind.trains() {
        return Err("--schedule inference does not train".into());
    }
    let chunks = if kind == ScheduleKind::Interleaved {
        args.chunks
    } else {
        1
    };
    let schedule = Schedule::new(kind, args.pipeline_stages, args.micro_batches, chunks)?;
    let processes = launched();
    eprintln!(
        "pipeline: {} stages on {}, schedule {}, {} micro-batches of {}, {} chunk(s) per stage",
        args.pipeline_stages,
        if processes { "tcp processes" } else { "threads" },
        kind.name(),
        args.micro_batches,
        args.batch_size / args.micro_batches,
        chunks
    );
    std::fs::create_dir_all(&args.out)?;
    // The loader is not shared with the stage threads, its batches are.
    let batches: Vec<Vec<Vec<usize>>> = (0..args.epochs)
        .map(|e| data.loader.batch_indices(e as u64))
        .collect();
    let (train, test) = (&data.train, &data.test);
    let data = StageData {
        train,
        test,
        batches: &batches,
    };
    if processes {
        let comm = tcp::init_from_env()?;
        if comm.world_size() != args.pipeline_stages {
            return Err(format!(
                "--pipeline-stages {} but the launcher started {} processes",
                args.pipeline_stages,
                comm.world_size()
            )
            .into());
        }
        return run_stage(&comm, args, &data, &schedule, clock);
    }
    let outs = LocalGroup::run(args.pipeline_stages, |comm| {
        run_stage(comm, args, &data, &schedule, clock).map_err(|e| e.to_string())
    })?;
    rank_0_result(outs, "stage")
}

/// The data every stage reads.
struct StageData<'d> {
    train: &'d Split,
    test: &'d Split,
    /// The batches (positions into `train`) of every epoch.
    batches: &'d [Vec<Vec<usize>>],
}

/// One stage's training loop; rank 0 also evaluates, prints and logs.
fn run_stage(
    comm: &dyn Communicator,
    args: &Args,
    data: &StageData<'_>,
    schedule: &Schedule,
    clock: Instant,
) -> BoxResult<Vec<EpochRecord>> {
    let (rank, p) = (comm.rank(), comm.world_size());
    let (first, last) = (rank == 0, rank + 1 == p);
    rng::manual_seed(args.seed);
    let layers = mnist_cnn()?.layers;
    let module = PipelineModule::new(layers, p, schedule.chunks(), &Partition::Layers)?;
    let stage = module.into_stage(rank)?;
    let mut opt = optimizer(stage.parameters(), args.lr)?;
    let total_steps = data.batches.iter().map(Vec::len).sum::<usize>() as u64;
    let mut sched = OneCycleLR::new(&mut opt, OneCycleOptions::new(args.lr, total_steps))?;
    let correct = Arc::new(AtomicUsize::new(0));
    let counter = correct.clone();
    let ce = CrossEntropyOptions::default();
    let loss: LossFn = Box::new(move |logits, labels| {
        counter.fetch_add(count_correct(logits.tensor(), labels)?, Ordering::Relaxed);
        logits.cross_entropy(Target::Indices(labels), &ce)
    });
    let mut engine = PipelineEngine::new(comm, schedule.clone(), stage, loss)?;
    if let Some(dtype) = args.precision.autocast_dtype() {
        engine = engine.with_autocast(dtype)?;
    }
    let mut scaler = args.precision.scaler()?;
    // Rank 0 evaluates a whole model assembled from the stages' parameters.
    let eval_model = if first { Some(mnist_cnn()?) } else { None };
    let fashion = args.data.to_string_lossy().contains("fashion");
    let target = args.target.unwrap_or(if fashion { 90.0 } else { 98.0 });
    let mut log = match first {
        true => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(args.out.join("metrics.jsonl"))?,
        ),
        false => None,
    };
    let unused = Tensor::zeros(&[0], DType::F32)?;
    let mut reached = None;
    let mut records = Vec::new();
    for epoch in 0..args.epochs {
        let (mut loss_sum, mut seen, mut skipped_steps) = (0.0, 0usize, 0usize);
        let epoch_start = Instant::now();
        for idx in &data.batches[epoch] {
            let idx = Tensor::from_vec(idx.iter().map(|&j| j as i64).collect(), &[idx.len()])?;
            let x = if first {
                data.train.images.index_select(0, &idx)?
            } else {
                unused.clone()
            };
            let y = if last {
                data.train.labels.index_select(0, &idx)?
            } else {
                unused.clone()
            };
            let scale = scaler.scale();
            let report = engine.train_batch_scaled(&x, &y, &mut opt, &mut scaler)?;
            if !report.stepped {
                skipped_steps += 1;
                if first {
                    eprintln!(
                        "inf/NaN gradients under loss scale {scale}; step skipped, scale now {}",
                        scale * scaler.options().backoff_factor
                    );
                }
            }
            scaler.update()?;
            sched.step(&mut opt)?;
            loss_sum += report.loss.unwrap_or(0.0) * idx.numel() as f64;
            seen += idx.numel();
        }
        let train_secs = epoch_start.elapsed().as_secs_f64();
        let params = gather_params(comm, engine.stage().named_parameters())?;
        // The last stage saw the labels: its figures go to stage 0.
        let mut figures = [loss_sum, correct.swap(0, Ordering::Relaxed) as f64, seen as f64];
        if last && !first {
            comm.send_slice(&figures, 0, TAG_EPOCH)?;
        } else if first && !last {
            comm.recv_slice(&mut figures, p - 1, TAG_EPOCH)?;
        }
        if let (Some(model), Some(log), Some(params)) = (&eval_model, &mut log, params) {
            model.load_state_dict(&StateDict::from(params), true)?;
            let test_acc = 100.0 * evaluate(model, data.test, 1000, Precision::F32)?;
            let [loss_sum, correct, seen] = figures;
            let (seen, correct) = (seen as usize, correct as usize);
            let (train_loss, train_acc) = (loss_sum / seen as f64, 100.0 * correct as f64 / seen as f64);
            let elapsed = clock.elapsed().as_secs_f64();
            if reached.is_none() && test_acc >= target {
                reached = Some((epoch + 1, elapsed));
            }
            println!(
                "epoch {:>2}: train loss {train_loss:.4} acc {train_acc:.2}% | test acc {test_acc:.2}% | {:.0} samples/s | {elapsed:.1}s",
                epoch + 1,
                seen as f64 / train_secs
            );
            writeln!(
                log,
                "{{\"epoch\":{},\"train_loss\":{train_loss:.6},\"train_acc\":{train_acc:.4},\"test_acc\":{test_acc:.4},\"lr\":{:e},\"samples_per_s\":{:.1},\"elapsed_s\":{elapsed:.3},\"pipeline\":\"{}_p{p}_m{}\",\"precision\":\"{}\",\"skipped_steps\":{skipped_steps},\"loss_scale\":{}}}",
                epoch + 1,
                sched.get_lr()[0],
                seen as f64 / train_secs,
                schedule.kind().name(),
                schedule.micro_batches(),
                format!("{:?}", args.precision).to_lowercase(),
                scaler.scale()
            )?;
            records.push(EpochRecord {
                epoch: epoch + 1,
                train_loss,
                train_acc,
                test_acc,
                skipped_steps,
            });
        }
    }
    if let Some(model) = &eval_model {
        state_dict::save(model, args.out.join("model.safetensors"))?;
        match reached {
            Some((epoch, secs)) => println!(
                "reached {target:.1}% test accuracy after epoch {epoch} in {secs:.1}s wall time ({} p{p} m{})",
                schedule.kind().name(),
                schedule.micro_batches()
            ),
            None => println!("did not reach {target:.1}% test accuracy in {} epochs", args.epochs),
        }
    }
    Ok(records)
}

/// Every stage's named parameters, gathered on stage 0 (`None` elsewhere):
/// each other stage sends its names (one line each) and then its tensors.
fn gather_params(
    comm: &dyn Communicator,
    mine: Vec<(String, tessera::autograd::Parameter)>,
) -> BoxResult<Option<HashMap<String, Tensor>>> {
    if comm.rank() != 0 {
        let names: Vec<&str> = mine.iter().map(|(n, _)| n.as_str()).collect();
        comm.send_bytes(names.join("\n").as_bytes(), 0, TAG_NAMES)?;
        for (_, p) in &mine {
            comm.send_tensor(&p.tensor()?, 0, TAG_PARAMS)?;
        }
        return Ok(None);
    }
    let mut all: HashMap<String, Tensor> = mine
        .into_iter()
        .map(|(n, p)| Ok((n, p.tensor()?)))
        .collect::<tessera::tensor::Result<_>>()?;
    for stage in 1..comm.world_size() {
        let names = String::from_utf8(comm.recv_bytes(stage, TAG_NAMES)?)?;
        for name in names.lines() {
            all.insert(name.to_string(), comm.recv_tensor(stage, TAG_PARAMS)?);
        }
    }
    Ok(Some(all))
}
