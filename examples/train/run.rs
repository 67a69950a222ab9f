//! The training loop: data, model, AdamW, cosine schedule, EMA, evaluation,
//! metrics log and checkpoints.

use std::time::Instant;

use serde_json::json;

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::data::formats::Mnist;
use tessera::data::{DataLoader, VecDataset};
use tessera::nn::{state_dict, Module};
use tessera::optim::{
    clip_grad_norm, param_groups_weight_decay, AdamW, AdamWOptions, CosineLR, CosineOptions, LrScheduler,
    Optimizer,
};
use tessera::tensor::{rng, Checkpoint, DType, PadMode, StateDict, Tensor};

use super::cli::Args;
use super::common::{
    append_line, count_correct, cpu_model, evaluate, pixel_stats, write_report, BoxResult, Split,
};
use super::progress::Bar;
use super::zoo::{self, Ema};

/// Trains as `args` says, printing progress and per-epoch results.
pub fn train(args: &Args) -> BoxResult<()> {
    let clock = Instant::now();
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    }
    let img_size = args
        .img_size
        .unwrap_or_else(|| zoo::default_img_size(&args.model));
    let (train, test) = load_data(args, img_size)?;
    let n_train = train.labels.shape()[0];
    let loader = DataLoader::builder(VecDataset::new((0..n_train as i64).collect::<Vec<_>>()))
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(args.seed)
        .build()?;
    let steps_per_epoch = loader.len();
    let classes = 10;

    rng::manual_seed(args.seed);
    let mut model = zoo::build(args, img_size, 1, classes)?;
    let ema = match args.ema_decay {
        Some(d) => Some(Ema::new(
            zoo::build(args, img_size, 1, classes)?,
            model.as_ref(),
            d,
        )?),
        None => None,
    };
    let hyper = AdamWOptions {
        lr: args.lr,
        weight_decay: args.weight_decay,
        ..Default::default()
    };
    let groups = param_groups_weight_decay(&model.named_parameters(), &hyper, &["pos_embed", "cls_token"]);
    let mut opt = AdamW::with_groups(groups)?;
    let total_steps = (args.epochs * steps_per_epoch) as u64;
    let warmup = (args.warmup_epochs * steps_per_epoch) as u64;
    let sched_opts = CosineOptions {
        lr_min: args.min_lr,
        warmup_t: warmup,
        warmup_lr_init: 1e-6,
        ..CosineOptions::new(total_steps.saturating_sub(warmup).max(1))
    };
    let mut sched = CosineLR::new(
        &mut opt,
        CosineOptions {
            warmup_prefix: true,
            ..sched_opts
        },
    )?;

    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create the output directory {}: {e}", args.out.display()))?;
    let ckpt_path = args.out.join("checkpoint.safetensors");
    let ema_path = args.out.join("ema.safetensors");
    let log_path = args.out.join("metrics.jsonl");
    let mut start_epoch = 0;
    let mut elapsed_before = 0.0;
    if args.resume {
        let ck = Checkpoint::load(&ckpt_path)?;
        model.load_state_dict(&ck.model, true)?;
        opt.load_state_dict(ck.optimizer()?)?;
        sched.load_state_dict(ck.scheduler()?)?;
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
        "params": model.num_parameters(),
        "img_size": img_size,
        "data": args.data.display().to_string(),
        "train_samples": n_train,
        "test_samples": test.labels.shape()[0],
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "optimizer": "AdamW",
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "schedule": "cosine",
        "warmup_steps": warmup,
        "min_lr": args.min_lr,
        "label_smoothing": args.smoothing,
        "clip_grad": args.clip_grad,
        "ema_decay": args.ema_decay,
        "drop_path": args.drop_path,
        "seed": args.seed,
        "threads": rayon::current_num_threads(),
        "cpu": cpu_model(),
    });
    eprintln!("{config}");
    if start_epoch == 0 {
        append_line(&log_path, &config.to_string())?;
    }

    let ce = CrossEntropyOptions {
        label_smoothing: args.smoothing,
        ..Default::default()
    };
    let end_epoch = args.stop_after.map_or(args.epochs, |s| s.min(args.epochs));
    for epoch in start_epoch..end_epoch {
        model.train(true);
        let batches = loader.batch_indices(epoch as u64);
        let mut bar = Bar::new(format!("epoch {}/{}", epoch + 1, args.epochs), batches.len());
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0usize, 0usize);
        let epoch_start = Instant::now();
        for (i, idx) in batches.iter().enumerate() {
            let step = epoch * steps_per_epoch + i;
            let idx = Tensor::from_vec(idx.iter().map(|&j| j as i64).collect(), &[idx.len()])?;
            let x = Var::constant(train.images.index_select(0, &idx)?);
            let y = train.labels.index_select(0, &idx)?;
            let logits = model.forward(&x)?;
            let loss = logits.cross_entropy(Target::Indices(&y), &ce)?;
            let mut grads = loss.backward()?;
            let grad_norm = match args.clip_grad {
                Some(max) => Some(clip_grad_norm(&mut grads, max, 2.0)?),
                None => None,
            };
            let lr = sched.get_lr()[0];
            opt.step(&grads)?;
            sched.step(&mut opt)?;
            if let Some(e) = &ema {
                e.update(model.as_ref())?;
            }
            let n = idx.numel();
            let step_loss = loss.tensor().to_scalar::<f32>()? as f64;
            loss_sum += step_loss * n as f64;
            correct += count_correct(logits.tensor(), &y)?;
            seen += n;
            bar.update(i + 1, seen, loss_sum / seen as f64, correct as f64 / seen as f64);
            if (step + 1) % args.log_every == 0 {
                let line = json!({
                    "kind": "step",
                    "step": step + 1,
                    "epoch": epoch as f64 + (i + 1) as f64 / steps_per_epoch as f64,
                    "loss": step_loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "samples_per_s": seen as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9),
                });
                append_line(&log_path, &line.to_string())?;
            }
        }
        bar.finish();
        let train_secs = epoch_start.elapsed().as_secs_f64();
        model.eval();
        let test_acc = 100.0 * evaluate(model.as_ref(), &test, 500)?;
        let ema_acc = match &ema {
            Some(e) => Some(100.0 * evaluate(e.model.as_ref(), &test, 500)?),
            None => None,
        };
        let elapsed = elapsed_before + clock.elapsed().as_secs_f64();
        let train_acc = 100.0 * correct as f64 / seen.max(1) as f64;
        println!(
            "epoch {:>2}: train loss {:.4} acc {train_acc:.2}% | test acc {test_acc:.2}%{} | {:.0} samples/s | {elapsed:.1}s",
            epoch + 1,
            loss_sum / seen.max(1) as f64,
            ema_acc.map_or(String::new(), |a| format!(" (EMA {a:.2}%)")),
            seen as f64 / train_secs
        );
        let metrics = json!({
            "kind": "epoch",
            "epoch": epoch + 1,
            "train_loss": loss_sum / seen.max(1) as f64,
            "train_acc": train_acc,
            "test_acc": test_acc,
            "ema_test_acc": ema_acc,
            "lr": sched.get_lr()[0],
            "samples_per_s": seen as f64 / train_secs,
            "elapsed_s": elapsed,
        });
        // The EMA weights, then the checkpoint, then the log line: a kill
        // in between leaves a state --resume can continue from.
        if let Some(e) = &ema {
            e.model.state_dict().save(&ema_path)?;
        }
        Checkpoint::new(model.state_dict())
            .at((epoch + 1) as u64, sched.last_epoch())
            .with_optimizer(opt.state_dict())
            .with_scheduler(sched.state_dict())
            .with_meta("elapsed", elapsed)
            .save(&ckpt_path)?;
        append_line(&log_path, &metrics.to_string())?;
        write_report(&log_path, &args.out.join("report.html"))?;
    }
    if end_epoch < args.epochs {
        eprintln!("stopped after epoch {end_epoch} (--stop-after); continue with --resume");
        return Ok(());
    }
    state_dict::save(model.as_ref(), args.out.join("model.safetensors"))?;
    Ok(())
}

/// Loads the splits of `args.data`, normalized with the training set's
/// mean and std and padded with background to `img_size`.
fn load_data(args: &Args, img_size: usize) -> BoxResult<(Split, Split)> {
    let train_raw = Mnist::open(&args.data, true)?;
    let test_raw = Mnist::open(&args.data, false)?;
    let side = train_raw.images_tensor()?.shape()[2];
    if img_size < side {
        return Err(format!("--img-size {img_size} is smaller than the images' {side}").into());
    }
    let (mean, std) = pixel_stats(train_raw.pixels());
    let load = |raw: &Mnist, limit: Option<usize>| -> BoxResult<Split> {
        let n = limit.map_or(raw.labels().len(), |l| l.min(raw.labels().len()));
        let images = raw
            .images_tensor()?
            .narrow(0, 0, n)?
            .to_dtype(DType::F32)?
            .mul_scalar(1.0 / (255.0 * std))?
            .add_scalar(-mean / std)?;
        let (lo, hi) = ((img_size - side) / 2, (img_size - side).div_ceil(2));
        let images = images.pad(&[lo, hi, lo, hi], PadMode::Constant(-mean / std))?;
        Ok(Split {
            images,
            labels: raw.labels_tensor()?.narrow(0, 0, n)?,
        })
    };
    let train = load(&train_raw, args.train_limit)?;
    let test = load(&test_raw, args.test_limit)?;
    eprintln!(
        "data {}: {} train / {} test images at {img_size}×{img_size}, {} threads",
        args.data.display(),
        train.labels.shape()[0],
        test.labels.shape()[0],
        rayon::current_num_threads()
    );
    Ok((train, test))
}
