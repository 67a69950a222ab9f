//! The training loop: data, model, optimizer and schedule, EMA,
//! gradient accumulation, evaluation, metrics log, report and checkpoints;
//! under `--ddp` the same loop on every rank of a data-parallel group.

use std::time::Instant;

use serde_json::json;

use tessera::autograd::{CrossEntropyOptions, Gradients, Target, Var};
use tessera::data::transforms::{Mixup, ProgressiveResize, RandAugment};
use tessera::data::{DataLoader, VecDataset};
use tessera::nn::{state_dict, Module};
use tessera::optim::{
    clip_grad_norm, param_groups_weight_decay, AdamWOptions, AdamWRule, CosineLR, CosineOptions,
    GradAccumulator, GradScaler, GroupOptimizer, LambOptions, LambRule, LarsOptions, LarsRule, LrScheduler,
    OneCycleLR, OneCycleOptions, OnebitOptions, Optimizer, Parameter, Rule,
};
use tessera::parallel::{CommExt, Communicator, DdpConfig, DistributedDataParallel, ReduceOp};
use tessera::tensor::{rng, Checkpoint, StateDict};

use super::cli::Args;
use super::common::ddp::{compressed_optimizer, launch, rank_rows, COMPRESSED};
use super::common::{append_line, count_correct, cpu_model, evaluate, write_report, BoxResult, Split};
use super::data::{channel_stats, Batcher, Images};
use super::progress::Bar;
use super::zoo::{self, Ema};

/// What every rank reads: the decoded splits and how batches are made.
struct Setup {
    train: Images,
    test: Split,
    test_len: usize,
    batcher: Batcher,
    classes: usize,
    in_chans: usize,
    img_size: usize,
}

/// Trains as `args` says, printing progress and per-epoch results; under
/// `--ddp` on every rank of the group, rank 0 printing, logging and saving.
pub fn train(args: &Args) -> BoxResult<()> {
    let clock = Instant::now();
    let train = Images::load(&args.data, true, args.train_limit)?;
    let test_raw = Images::load(&args.data, false, args.test_limit)?;
    let (classes, in_chans) = (train.classes().max(test_raw.classes()), train.channels());
    if classes < 2 || train.len() == 0 {
        return Err(format!(
            "--data {}: no training images or fewer than 2 classes",
            args.data.display()
        )
        .into());
    }
    let side = train.images[0].height();
    let img_size = args
        .img_size
        .unwrap_or_else(|| zoo::default_img_size(&args.model).max(side));
    let batcher = batcher(args, &train, img_size, classes)?;
    let test = batcher.eval_split(&test_raw)?;
    eprintln!(
        "data {}: {} train / {} test images of {side}×{side}×{in_chans}, {classes} classes, \
         model input {img_size}×{img_size}, {} threads on {}",
        args.data.display(),
        train.len(),
        test_raw.len(),
        rayon::current_num_threads(),
        cpu_model()
    );
    let setup = Setup {
        train,
        test,
        test_len: test_raw.len(),
        batcher,
        classes,
        in_chans,
        img_size,
    };
    if args.ddp {
        return launch(&args.backend, args.world, "rank", |comm| {
            run(args, &setup, Some(comm), clock)
        });
    }
    run(args, &setup, None, clock)
}

/// The model, wrapped in `DistributedDataParallel` under `--ddp`.
enum Net<'c> {
    Single(Box<dyn Module>),
    Ddp(DistributedDataParallel<'c, Box<dyn Module>>),
}

impl Net<'_> {
    /// The model itself (parameter names without DDP's `module.` prefix).
    fn model(&self) -> &dyn Module {
        match self {
            Net::Single(m) => m.as_ref(),
            Net::Ddp(ddp) => ddp.module().as_ref(),
        }
    }

    fn train(&mut self, training: bool) {
        match self {
            Net::Single(m) => m.train(training),
            Net::Ddp(ddp) => ddp.train(training),
        }
    }

    fn forward(&self, x: &Var) -> tessera::tensor::Result<Var> {
        match self {
            Net::Single(m) => m.forward(x),
            Net::Ddp(ddp) => ddp.forward(x),
        }
    }

    /// The (scaled) gradients of `loss` for `opt`'s next step: averaged
    /// over the ranks under DDP unless `opt` exchanges them itself (a
    /// compressed optimizer after its warm-up).
    fn backward(&self, loss: &Var, scaler: &GradScaler, opt: &dyn Optimizer) -> BoxResult<Gradients> {
        Ok(match self {
            Net::Ddp(ddp) if opt.wants_averaged_grads() => ddp.backward_with(|| scaler.backward(loss))?,
            _ => scaler.backward(loss)?,
        })
    }
}

/// Sums `values` over the ranks of `comm` (unchanged without one).
fn sum_over_ranks<const K: usize>(
    comm: Option<&dyn Communicator>,
    mut values: [f64; K],
) -> BoxResult<[f64; K]> {
    if let Some(c) = comm {
        c.all_reduce_slice(&mut values, ReduceOp::Sum)?;
    }
    Ok(values)
}

/// One rank's training (the only one without `comm`): every rank trains on
/// its equal share of each batch (batches the world size does not divide
/// are skipped); rank 0 evaluates, logs and saves.
fn run(args: &Args, setup: &Setup, comm: Option<&dyn Communicator>, clock: Instant) -> BoxResult<()> {
    let Setup {
        train,
        test,
        test_len,
        batcher,
        classes,
        in_chans,
        img_size,
    } = setup;
    let (classes, in_chans, img_size) = (*classes, *in_chans, *img_size);
    let (rank, world) = comm.map_or((0, 1), |c| (c.rank(), c.world_size()));
    let lead = rank == 0;
    let n_train = train.len();
    let loader = DataLoader::builder(VecDataset::new((0..n_train as i64).collect::<Vec<_>>()))
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(args.seed)
        .build()?;
    let usable = |b: &Vec<usize>| b.len().is_multiple_of(world);
    // Every epoch has the same batch sizes, so epoch 0 counts them all.
    let batches_per_epoch = loader.batch_indices(0).iter().filter(|b| usable(b)).count();
    if batches_per_epoch == 0 {
        return Err(format!(
            "no batch of --batch-size {} over {n_train} images divides into {world} ranks",
            args.batch_size
        )
        .into());
    }
    let steps_per_epoch = batches_per_epoch.div_ceil(args.accum_steps);

    rng::manual_seed(args.seed);
    let model = zoo::build(args, img_size, in_chans, classes)?;
    let ema = match args.ema_decay {
        Some(d) => Some(Ema::new(
            zoo::build(args, img_size, in_chans, classes)?,
            model.as_ref(),
            d,
        )?),
        None => None,
    };
    let mut opt = optimizer(args, model.as_ref(), comm)?;
    let total_steps = (args.epochs * steps_per_epoch) as u64;
    let warmup = (args.warmup_epochs * steps_per_epoch) as u64;
    let mut sched = scheduler(args, opt.as_mut(), total_steps, warmup)?;
    let mut net = match comm {
        Some(c) => Net::Ddp(DistributedDataParallel::new(model, c, DdpConfig::default())?),
        None => Net::Single(model),
    };
    if lead {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create the output directory {}: {e}", args.out.display()))?;
    }
    let ckpt_path = args.out.join("checkpoint.safetensors");
    let ema_path = args.out.join("ema.safetensors");
    let log_path = args.out.join("metrics.jsonl");
    let mut start_epoch = 0;
    let mut elapsed_before = 0.0;
    let mut scaler = args.precision.scaler()?;
    if args.resume {
        let ck = Checkpoint::load(&ckpt_path)?;
        net.model().load_state_dict(&ck.model, true)?;
        opt.load_state_dict(ck.optimizer()?)?;
        sched.load_state_dict(ck.scheduler()?)?;
        if let Ok(sd) = ck.scaler() {
            scaler.load_state_dict(sd)?;
        }
        ck.restore_default_rng()?;
        if let Some(e) = &ema {
            e.model.load_state_dict(&StateDict::load(&ema_path)?, true)?;
        }
        start_epoch = ck.epoch as usize;
        elapsed_before = ck.meta("elapsed")?;
        eprintln!("resumed from {} at epoch {start_epoch}", ckpt_path.display());
    }
    let config = json!({
        "kind": "config",
        "model": args.model,
        "params": net.model().num_parameters(),
        "img_size": img_size,
        "in_chans": in_chans,
        "classes": classes,
        "data": args.data.display().to_string(),
        "train_samples": n_train,
        "test_samples": test_len,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "optimizer": args.opt,
        "momentum": args.momentum,
        "accum_steps": args.accum_steps,
        "data_parallel": comm.map(|c| json!({"world": world, "backend": c.backend()})),
        "freeze_step": COMPRESSED
            .contains(&args.opt.as_str())
            .then_some(args.compressed.freeze_step),
        "precision": format!("{:?}", args.precision).to_lowercase(),
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "schedule": args.sched,
        "warmup_steps": warmup,
        "min_lr": args.min_lr,
        "label_smoothing": args.smoothing,
        "clip_grad": args.clip_grad,
        "ema_decay": args.ema_decay,
        "drop_path": args.drop_path,
        "mixup": args.mixup,
        "cutmix": args.cutmix,
        "mixup_prob": args.mixup_prob,
        "mixup_switch_prob": args.mixup_switch_prob,
        "randaugment": args.randaugment.map(|(n, m)| json!({"n": n, "m": m})),
        "progressive": args.progressive.map(|(min, a, b)| json!({"min": min, "start": a, "end": b})),
        "seed": args.seed,
        "threads": rayon::current_num_threads(),
        "cpu": cpu_model(),
    });
    if lead {
        eprintln!("{config}");
        if start_epoch == 0 {
            append_line(&log_path, &config.to_string())?;
        }
    }

    // MixUp/CutMix targets carry the smoothing themselves (timm's
    // SoftTargetCrossEntropy).
    let ce = CrossEntropyOptions {
        label_smoothing: if batcher.mixup.is_some() {
            0.0
        } else {
            args.smoothing
        },
        ..Default::default()
    };
    let mut accumulator = GradAccumulator::new(args.accum_steps, true)?;
    let end_epoch = args.stop_after.map_or(args.epochs, |s| s.min(args.epochs));
    for epoch in start_epoch..end_epoch {
        net.train(true);
        let mut batches = loader.batch_indices(epoch as u64);
        batches.retain(|b| usable(b));
        let mut bar = lead.then(|| Bar::new(format!("epoch {}/{}", epoch + 1, args.epochs), batches.len()));
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0usize, 0usize);
        let (mut group_loss, mut group_len) = (0.0, 0usize);
        let epoch_start = Instant::now();
        for (i, idx) in batches.iter().enumerate() {
            let idx = rank_rows(idx, rank, world);
            let batch = batcher.train_batch(train, idx, epoch, epoch * batches_per_epoch + i)?;
            let target = match &batch.soft_targets {
                Some(probs) => Target::Probs(probs),
                None => Target::Indices(&batch.labels),
            };
            let (logits, loss) = args.precision.run(|| {
                let logits = net.forward(&Var::constant(batch.images.clone()))?;
                let loss = logits.cross_entropy(target, &ce)?;
                Ok((logits, loss))
            })?;
            let micro_loss = loss.tensor().to_scalar::<f32>()? as f64;
            // Scaled gradients are summed over the micro-batches and
            // unscaled once, at the step (PyTorch's accumulation under AMP).
            let grads = match accumulator.add(net.backward(&loss, &scaler, opt.as_ref())?)? {
                None if i + 1 == batches.len() => accumulator.flush()?,
                ready => ready,
            };
            let n = idx.len();
            loss_sum += micro_loss * n as f64;
            correct += count_correct(logits.tensor(), &batch.labels)?;
            seen += n;
            group_loss += micro_loss;
            group_len += 1;
            if let Some(bar) = &mut bar {
                bar.update(i + 1, seen, loss_sum / seen as f64, correct as f64 / seen as f64);
            }
            let Some(mut grads) = grads else { continue };
            let scale = scaler.scale();
            scaler.unscale_(&mut grads)?;
            let grad_norm = match args.clip_grad {
                Some(max) => Some(clip_grad_norm(&mut grads, max, 2.0)?),
                None => None,
            };
            let lr = sched.get_lr()[0];
            if !scaler.step(opt.as_mut(), &mut grads)? {
                eprintln!(
                    "step {}: inf/NaN gradients under loss scale {scale}; step skipped, scale now {}",
                    epoch * steps_per_epoch + i / args.accum_steps,
                    scale * scaler.options().backoff_factor
                );
            }
            scaler.update()?;
            sched.step(opt.as_mut())?;
            if let Some(e) = &ema {
                e.update(net.model())?;
            }
            let step = epoch * steps_per_epoch + i / args.accum_steps;
            if (step + 1).is_multiple_of(args.log_every) {
                // The mean over the ranks' shares: the loss of the whole batch.
                let [group_loss, group_len] = sum_over_ranks(comm, [group_loss, group_len as f64])?;
                let line = json!({
                    "kind": "step",
                    "step": step + 1,
                    "epoch": epoch as f64 + (i + 1) as f64 / batches_per_epoch as f64,
                    "loss": group_loss / group_len,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "samples_per_s": (seen * world) as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9),
                });
                if lead {
                    append_line(&log_path, &line.to_string())?;
                }
            }
            (group_loss, group_len) = (0.0, 0);
        }
        if let Some(bar) = &bar {
            bar.finish();
        }
        let train_secs = epoch_start.elapsed().as_secs_f64();
        let [loss_sum, correct, seen] = sum_over_ranks(comm, [loss_sum, correct as f64, seen as f64])?;
        net.train(false);
        if !lead {
            continue;
        }
        let test_acc = 100.0 * evaluate(net.model(), test, 500, args.precision)?;
        let ema_acc = match &ema {
            Some(e) => Some(100.0 * evaluate(e.model.as_ref(), test, 500, args.precision)?),
            None => None,
        };
        let elapsed = elapsed_before + clock.elapsed().as_secs_f64();
        let seen = seen.max(1.0);
        let train_acc = 100.0 * correct / seen;
        println!(
            "epoch {:>2}: train loss {:.4} acc {train_acc:.2}% | test acc {test_acc:.2}%{} | {:.0} samples/s | {elapsed:.1}s",
            epoch + 1,
            loss_sum / seen,
            ema_acc.map_or(String::new(), |a| format!(" (EMA {a:.2}%)")),
            seen / train_secs
        );
        let metrics = json!({
            "kind": "epoch",
            "epoch": epoch + 1,
            "train_loss": loss_sum / seen,
            "train_acc": train_acc,
            "test_acc": test_acc,
            "ema_test_acc": ema_acc,
            "lr": sched.get_lr()[0],
            "samples_per_s": seen / train_secs,
            "elapsed_s": elapsed,
        });
        // The EMA weights, then the checkpoint, then the log line: a kill
        // in between leaves a state --resume can continue from.
        if let Some(e) = &ema {
            e.model.state_dict().save(&ema_path)?;
        }
        Checkpoint::new(net.model().state_dict())
            .at((epoch + 1) as u64, sched.last_epoch())
            .with_optimizer(opt.state_dict())
            .with_scheduler(sched.state_dict())
            .with_scaler(scaler.state_dict())
            .with_meta("elapsed", elapsed)
            .save(&ckpt_path)?;
        append_line(&log_path, &metrics.to_string())?;
        write_report(&log_path, &args.out.join("report.html"))?;
    }
    if end_epoch < args.epochs {
        eprintln!("stopped after epoch {end_epoch} (--stop-after); continue with --resume");
        return Ok(());
    }
    if lead {
        state_dict::save(net.model(), args.out.join("model.safetensors"))?;
    }
    Ok(())
}

/// The optimizer of `--opt` over `model`'s parameters, without weight
/// decay on biases, norms, `pos_embed` and `cls_token` (timm's groups); the
/// compressed ones exchange their momentum over `comm`.
fn optimizer<'c>(
    args: &Args,
    model: &dyn Module,
    comm: Option<&'c dyn Communicator>,
) -> BoxResult<Box<dyn Optimizer + 'c>> {
    let named = model.named_parameters();
    if let Some(c) = comm {
        let hyper = OnebitOptions {
            lr: args.lr,
            weight_decay: args.weight_decay,
            ..Default::default()
        };
        let groups = param_groups_weight_decay(&named, &hyper, NO_WEIGHT_DECAY);
        if let Some(opt) = compressed_optimizer(&args.opt, groups, args.compressed, c)? {
            return Ok(opt);
        }
    }
    match args.opt.as_str() {
        "lamb" => grouped::<LambRule>(
            &named,
            LambOptions {
                lr: args.lr,
                weight_decay: args.weight_decay,
                ..Default::default()
            },
        ),
        "lars" => grouped::<LarsRule>(
            &named,
            LarsOptions {
                lr: args.lr,
                momentum: args.momentum,
                weight_decay: args.weight_decay,
                ..Default::default()
            },
        ),
        _ => grouped::<AdamWRule>(
            &named,
            AdamWOptions {
                lr: args.lr,
                weight_decay: args.weight_decay,
                ..Default::default()
            },
        ),
    }
}

/// Parameters besides biases and norms that timm's ViT excludes from decay.
const NO_WEIGHT_DECAY: &[&str] = &["pos_embed", "cls_token"];

/// The optimizer of rule `R` with `hyper`, in timm's two weight-decay groups.
fn grouped<'c, R: Rule + Default + 'c>(
    named: &[(String, Parameter)],
    hyper: R::Hyper,
) -> BoxResult<Box<dyn Optimizer + 'c>> {
    let groups = param_groups_weight_decay(named, &hyper, NO_WEIGHT_DECAY);
    Ok(Box::new(GroupOptimizer::<R>::with_groups(groups)?))
}

/// The schedule of `--sched` over `total` optimizer steps: timm's cosine
/// with `warmup` linear warm-up steps, or PyTorch's OneCycleLR peaking at
/// `--lr`.
fn scheduler(
    args: &Args,
    opt: &mut dyn Optimizer,
    total: u64,
    warmup: u64,
) -> BoxResult<Box<dyn LrScheduler>> {
    if args.sched == "onecycle" {
        return Ok(Box::new(OneCycleLR::new(
            opt,
            OneCycleOptions::new(args.lr, total.max(1)),
        )?));
    }
    let opts = CosineOptions {
        lr_min: args.min_lr,
        warmup_t: warmup,
        warmup_lr_init: 1e-6,
        warmup_prefix: true,
        ..CosineOptions::new(total.saturating_sub(warmup).max(1))
    };
    Ok(Box::new(CosineLR::new(opt, opts)?))
}

/// How training batches are made from `train`: statistics, RandAugment,
/// progressive resizing and MixUp/CutMix as `args` says.
fn batcher(args: &Args, train: &Images, img_size: usize, classes: usize) -> BoxResult<Batcher> {
    let randaugment = match args.randaugment {
        Some((n, m)) => Some(RandAugment::timm(n, m)?),
        None => None,
    };
    let progressive = match args.progressive {
        Some((min, start, end)) => {
            if !args.model.starts_with("resnet") {
                return Err(format!(
                    "--progressive needs a model without fixed-size position tables (a resnet), not {}",
                    args.model
                )
                .into());
            }
            if min == 0 || min > img_size {
                return Err(format!("--progressive: MIN {min} must be in 1..={img_size}").into());
            }
            Some(ProgressiveResize::new(min, img_size, start, end)?)
        }
        None => None,
    };
    let mixup = (args.mixup > 0.0 || args.cutmix > 0.0).then_some(Mixup {
        mixup_alpha: args.mixup,
        cutmix_alpha: args.cutmix,
        prob: args.mixup_prob,
        switch_prob: args.mixup_switch_prob,
        label_smoothing: args.smoothing,
        num_classes: classes,
        correct_lam: true,
    });
    Ok(Batcher {
        img_size,
        stats: channel_stats(train),
        randaugment,
        progressive,
        mixup,
        seed: args.seed,
    })
}
