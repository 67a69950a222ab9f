//! `--pipeline-stages P`: the same training as [`crate::run::train`] (same
//! model, init, optimizer, schedule and batches), with the CNN's layers split
//! evenly into P stages (P·V chunks for the interleaved schedule) that run
//! on P threads of the `local` backend under the chosen pipeline schedule.
//! Each batch is split into M micro-batches whose gradients are summed, so
//! the arithmetic is single-process training with gradient accumulation.
//! After every epoch the stages' parameters are gathered into one model to
//! measure test accuracy.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera::autograd::{CrossEntropyOptions, Target};
use tessera::nn::{models::mnist_cnn, state_dict, Module};
use tessera::optim::{LrScheduler, OneCycleLR, OneCycleOptions};
use tessera::parallel::pipeline::{
    LossFn, Partition, PipelineEngine, PipelineModule, Schedule, ScheduleKind,
};
use tessera::parallel::{Communicator, LocalGroup};
use tessera::tensor::{rng, DType, StateDict, Tensor};

use crate::cli::Args;
use crate::data_parallel::rank_0_records;
use crate::run::{count_correct, evaluate, load_data, optimizer, BoxResult, EpochRecord, Split};

/// What the stages share in this process: the parameters gathered for
/// evaluation and the last stage's training figures of the epoch.
#[derive(Default)]
struct Shared {
    params: Mutex<HashMap<String, Tensor>>,
    /// (loss sum, correct, seen) of the epoch, written by the last stage.
    epoch: Mutex<(f64, usize, usize)>,
}

/// Trains as `args` says with pipeline parallelism; returns the epoch
/// records (printed and logged as in single-process mode).
pub fn train(args: &Args) -> BoxResult<Vec<EpochRecord>> {
    let clock = Instant::now();
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    }
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
    eprintln!(
        "pipeline: {} stages on threads, schedule {}, {} micro-batches of {}, {} chunk(s) per stage",
        args.pipeline_stages,
        kind.name(),
        args.micro_batches,
        args.batch_size / args.micro_batches,
        chunks
    );
    std::fs::create_dir_all(&args.out)?;
    let shared = Shared::default();
    // The loader is not shared with the stage threads, its batches are.
    let batches: Vec<Vec<Vec<usize>>> = (0..args.epochs)
        .map(|e| data.loader.batch_indices(e as u64))
        .collect();
    let (train, test) = (&data.train, &data.test);
    let outs = LocalGroup::run(args.pipeline_stages, |comm| {
        let data = StageData {
            train,
            test,
            batches: &batches,
        };
        run_stage(comm, args, &data, &schedule, &shared, clock).map_err(|e| e.to_string())
    })?;
    rank_0_records(outs, "stage")
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
    shared: &Shared,
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
        let (mut loss_sum, mut seen) = (0.0, 0usize);
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
            let report = engine.train_batch(&x, &y, &mut opt)?;
            sched.step(&mut opt)?;
            loss_sum += report.loss.unwrap_or(0.0) * idx.numel() as f64;
            seen += idx.numel();
        }
        let train_secs = epoch_start.elapsed().as_secs_f64();
        {
            let mut params = shared.params.lock().map_err(|_| "a stage panicked")?;
            for (name, p) in engine.stage().named_parameters() {
                params.insert(name, p.tensor());
            }
        }
        if last {
            *shared.epoch.lock().map_err(|_| "a stage panicked")? =
                (loss_sum, correct.swap(0, Ordering::Relaxed), seen);
        }
        comm.barrier()?;
        if let (Some(model), Some(log)) = (&eval_model, &mut log) {
            let params = std::mem::take(&mut *shared.params.lock().map_err(|_| "a stage panicked")?);
            model.load_state_dict(&StateDict::from(params), true)?;
            let test_acc = 100.0 * evaluate(model, data.test, 1000)?;
            let (loss_sum, correct, seen) = *shared.epoch.lock().map_err(|_| "a stage panicked")?;
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
                "{{\"epoch\":{},\"train_loss\":{train_loss:.6},\"train_acc\":{train_acc:.4},\"test_acc\":{test_acc:.4},\"lr\":{:e},\"samples_per_s\":{:.1},\"elapsed_s\":{elapsed:.3},\"pipeline\":\"{}_p{p}_m{}\"}}",
                epoch + 1,
                sched.get_lr()[0],
                seen as f64 / train_secs,
                schedule.kind().name(),
                schedule.micro_batches()
            )?;
            records.push(EpochRecord {
                epoch: epoch + 1,
                train_loss,
                train_acc,
                test_acc,
            });
        }
        comm.barrier()?;
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
