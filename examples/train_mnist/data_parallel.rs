//! `--ddp` / `--zero S`: the same training as [`super::run::train`] (model,
//! init, optimizer, schedule, batches) with data parallelism: every batch
//! is split into `N` equal row blocks, rank r trains on block r, and the
//! gradients are averaged over the ranks by `DistributedDataParallel` or
//! partitioned by `ZeroOptimizer` (stage 1 or 2) or `Zero3` (stage 3,
//! whose parameters are gathered on every rank for rank 0's evaluation
//! and checkpoint), so the arithmetic is
//! single-process training on the whole batch up to the reduction order.
//! `--backend local --world N` runs N ranks as threads of this process;
//! `--backend tcp` joins the group `tessera-run` (or `srun`) describes in
//! the environment, one rank per process. Batches whose size is not a
//! multiple of N (the last, partial one) are skipped. Rank 0 evaluates and
//! logs.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Instant;

use tessera::autograd::Parameter;
use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::{models::mnist_cnn, state_dict, Module, Sequential};
use tessera::optim::{
    Adam, AdamOptions, GradScaler, LrScheduler, OneCycleLR, OneCycleOptions, OnebitOptions, Optimizer,
    ParamGroup,
};
use tessera::parallel::{
    Communicator, DdpConfig, DistributedDataParallel, Zero3, ZeroConfig, ZeroOptimizer, ZeroStage,
};
use tessera::tensor::{rng, Tensor};

use super::cli::Args;
use super::common::ddp::{compressed_optimizer, launch, rank_rows};
use super::common::precision::Precision;
use super::common::{count_correct, evaluate, BoxResult, Split};
use super::run::{load_data, optimizer, EpochRecord, WEIGHT_DECAY};

/// Trains as `args` says with data parallelism; returns rank 0's epoch
/// records.
pub fn train(args: &Args) -> BoxResult<Vec<EpochRecord>> {
    let clock = Instant::now();
    let data = load_data(args)?;
    std::fs::create_dir_all(&args.out)?;
    let batches: Vec<Vec<Vec<usize>>> = (0..args.epochs)
        .map(|e| data.loader.batch_indices(e as u64))
        .collect();
    let (train, test) = (&data.train, &data.test);
    launch(&args.backend, args.world, "rank", |comm| {
        run_rank(comm, args, train, test, &batches, clock)
    })
}

/// DDP or ZeRO around the model and the optimizer.
enum Engine<'c> {
    Ddp(DistributedDataParallel<'c, Sequential>, Box<dyn Optimizer + 'c>),
    Zero(Sequential, ZeroOptimizer<'c>),
    Zero3(Sequential, Zero3),
}

impl Engine<'_> {
    fn model(&self) -> &Sequential {
        match self {
            Engine::Ddp(ddp, _) => ddp.module(),
            Engine::Zero(m, _) | Engine::Zero3(m, _) => m,
        }
    }

    /// The model with full parameters for rank 0 to evaluate and save: a
    /// copy loaded from the gathered state under ZeRO-3 (a collective:
    /// every rank calls this), the model itself otherwise.
    fn full_model(&self) -> BoxResult<Option<Sequential>> {
        let Engine::Zero3(_, zero) = self else {
            return Ok(None);
        };
        let sd = zero.consolidated_model_state_dict()?;
        let copy = mnist_cnn()?;
        copy.load_state_dict(&sd, true)?;
        Ok(Some(copy))
    }

    fn optimizer(&mut self) -> &mut dyn Optimizer {
        match self {
            Engine::Ddp(_, opt) => opt.as_mut(),
            Engine::Zero(_, zero) => zero.inner(),
            Engine::Zero3(_, zero) => zero.inner(),
        }
    }

    /// Forward and loss at `precision`, backward of the loss scaled by
    /// `scaler` and the averaged (or partitioned) gradients' optimizer
    /// step, skipped on every rank when any rank's gradients overflowed;
    /// returns the logits and whether the step was taken.
    fn step(
        &mut self,
        x: &Var,
        y: &Tensor,
        ce: &CrossEntropyOptions,
        precision: Precision,
        scaler: &mut GradScaler,
    ) -> BoxResult<(Var, bool)> {
        let forward = |model: &dyn Module| {
            precision.run(|| {
                let logits = model.forward(x)?;
                let loss = logits.cross_entropy(Target::Indices(y), ce)?;
                Ok((logits, loss))
            })
        };
        let (logits, stepped) = match self {
            Engine::Ddp(ddp, opt) => {
                let (logits, loss) = forward(ddp)?;
                // After a 1-bit optimizer's warm-up DDP skips its all-reduce
                // (the CLI keeps f16's loss scaling away from those: each
                // rank would judge its own gradients).
                let mut grads = match opt.wants_averaged_grads() {
                    true => ddp.backward_with(|| scaler.backward(&loss))?,
                    false => scaler.backward(&loss)?,
                };
                // Averaged gradients are the same on every rank, so is the
                // inf/NaN verdict.
                scaler.unscale_(&mut grads)?;
                (logits, scaler.step(opt.as_mut(), &mut grads)?)
            }
            Engine::Zero(model, zero) => {
                let (logits, loss) = forward(model)?;
                zero.backward_with(|| scaler.backward(&loss))?;
                (logits, zero.step_scaled(scaler)?)
            }
            Engine::Zero3(model, zero) => {
                let (logits, loss) = forward(model)?;
                zero.backward_with(|| scaler.backward(&loss))?;
                (logits, zero.step_scaled(scaler)?)
            }
        };
        scaler.update()?;
        Ok((logits, stepped))
    }
}

/// The optimizer `--optim` names, over `params`; the 1-bit ones exchange
/// their momentum over `comm` after `--freeze-step` steps (0/1 Adam its
/// gradients between variance steps, then its synchronised updates).
fn ddp_optimizer<'c>(
    args: &Args,
    params: Vec<Parameter>,
    comm: &'c dyn Communicator,
) -> BoxResult<Box<dyn Optimizer + 'c>> {
    if args.optim == "adam" {
        let o = AdamOptions {
            lr: args.lr,
            weight_decay: WEIGHT_DECAY,
            ..Default::default()
        };
        return Ok(Box::new(Adam::new(params, o)?));
    }
    let hyper = OnebitOptions {
        lr: args.lr,
        weight_decay: WEIGHT_DECAY,
        ..Default::default()
    };
    let groups = vec![ParamGroup::new(params.clone(), hyper)];
    match compressed_optimizer(&args.optim, groups, args.compressed, comm)? {
        Some(opt) => Ok(opt),
        None => Ok(Box::new(optimizer(params, args.lr)?)),
    }
}

/// One rank's training loop; rank 0 also evaluates, prints and logs.
fn run_rank(
    comm: &dyn Communicator,
    args: &Args,
    train: &Split,
    test: &Split,
    batches: &[Vec<Vec<usize>>],
    clock: Instant,
) -> BoxResult<Vec<EpochRecord>> {
    let (rank, n) = (comm.rank(), comm.world_size());
    rng::manual_seed(args.seed);
    let model = mnist_cnn()?;
    let (mut engine, mode) = match args.zero {
        None => {
            let ddp = DistributedDataParallel::new(model, comm, DdpConfig::default())?;
            let opt = ddp_optimizer(args, ddp.parameters(), comm)?;
            (Engine::Ddp(ddp, opt), format!("ddp_{}", args.optim))
        }
        Some(3) => {
            let opt = optimizer(model.parameters(), args.lr)?;
            let zero = Zero3::new(&model, &opt, comm)?;
            (Engine::Zero3(model, zero), "zero3".to_string())
        }
        Some(s) => {
            let opt = optimizer(model.parameters(), args.lr)?;
            let stage = if s == 1 { ZeroStage::One } else { ZeroStage::Two };
            let zero = ZeroOptimizer::new(&opt, comm, ZeroConfig::stage(stage))?;
            (Engine::Zero(model, zero), format!("zero{s}"))
        }
    };
    let usable = |b: &Vec<usize>| b.len().is_multiple_of(n);
    let total_steps = batches.iter().flatten().filter(|b| usable(b)).count() as u64;
    let mut sched = OneCycleLR::new(engine.optimizer(), OneCycleOptions::new(args.lr, total_steps))?;
    let ce = CrossEntropyOptions::default();
    let fashion = args.data.to_string_lossy().contains("fashion");
    let target = args.target.unwrap_or(if fashion { 90.0 } else { 98.0 });
    let mut log = match rank {
        0 => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(args.out.join("metrics.jsonl"))?,
        ),
        _ => None,
    };
    if rank == 0 {
        eprintln!(
            "data parallel: {mode} over {n} ranks ({}), global batch {}",
            comm.backend(),
            args.batch_size
        );
    }
    let mut reached = None;
    let mut records = Vec::new();
    let mut scaler = args.precision.scaler()?;
    for (epoch, epoch_batches) in batches.iter().enumerate() {
        let (mut loss_sum, mut correct, mut seen, mut skipped) = (0.0, 0usize, 0usize, 0usize);
        let epoch_start = Instant::now();
        for idx in epoch_batches.iter().filter(|b| usable(b)) {
            let mine = rank_rows(idx, rank, n);
            let rows = mine.len();
            let t = Tensor::from_vec(mine.iter().map(|&j| j as i64).collect(), &[rows])?;
            let x = Var::constant(train.images.index_select(0, &t)?);
            let y = train.labels.index_select(0, &t)?;
            let (logits, stepped) = engine.step(&x, &y, &ce, args.precision, &mut scaler)?;
            skipped += usize::from(!stepped);
            sched.step(engine.optimizer())?;
            let loss = logits.cross_entropy(Target::Indices(&y), &ce)?;
            loss_sum += loss.tensor().to_scalar::<f32>()? as f64 * rows as f64;
            correct += count_correct(logits.tensor(), &y)?;
            seen += rows;
        }
        let train_secs = epoch_start.elapsed().as_secs_f64();
        let full = engine.full_model()?;
        if let Some(log) = &mut log {
            let test_acc = 100.0
                * evaluate(
                    full.as_ref().unwrap_or(engine.model()),
                    test,
                    1000,
                    args.precision,
                )?;
            // Rank 0's share of the batches: the training figures of 1/N
            // of the data.
            let (train_loss, train_acc) = (loss_sum / seen as f64, 100.0 * correct as f64 / seen as f64);
            let elapsed = clock.elapsed().as_secs_f64();
            if reached.is_none() && test_acc >= target {
                reached = Some((epoch + 1, elapsed));
            }
            let samples_per_s = (seen * n) as f64 / train_secs;
            println!(
                "epoch {:>2}: train loss {train_loss:.4} acc {train_acc:.2}% (rank 0) | test acc {test_acc:.2}% | {samples_per_s:.0} samples/s | {elapsed:.1}s",
                epoch + 1
            );
            writeln!(
                log,
                "{{\"epoch\":{},\"train_loss\":{train_loss:.6},\"train_acc\":{train_acc:.4},\"test_acc\":{test_acc:.4},\"samples_per_s\":{samples_per_s:.1},\"elapsed_s\":{elapsed:.3},\"data_parallel\":\"{mode}_n{n}\"}}",
                epoch + 1
            )?;
            records.push(EpochRecord {
                epoch: epoch + 1,
                train_loss,
                train_acc,
                test_acc,
                skipped_steps: skipped,
            });
        }
        comm.barrier()?;
    }
    let full = engine.full_model()?;
    if rank == 0 {
        state_dict::save(
            full.as_ref().unwrap_or(engine.model()),
            args.out.join("model.safetensors"),
        )?;
        match reached {
            Some((epoch, secs)) => {
                println!("reached {target:.1}% test accuracy after epoch {epoch} in {secs:.1}s wall time ({mode} n{n})")
            }
            None => println!(
                "did not reach {target:.1}% test accuracy in {} epochs",
                args.epochs
            ),
        }
    }
    Ok(records)
}
