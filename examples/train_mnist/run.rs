//! The training loop: data, model, optimizer, schedule, evaluation,
//! metrics log and checkpoints.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use tessera::autograd::{CrossEntropyOptions, Parameter, Target, Var};
use tessera::data::formats::Mnist;
use tessera::data::{DataLoader, VecDataset};
use tessera::nn::{models::mnist_cnn, state_dict, Module};
use tessera::optim::{LrScheduler, OneCycleLR, OneCycleOptions, Optimizer, Sgd, SgdOptions};
use tessera::tensor::{rng, Checkpoint, DType, Device, Tensor};

use super::cli::Args;
use super::common::{
    append_line, count_correct, cpu_model, evaluate, pixel_stats, write_report, BoxResult, Split,
};
use super::progress::Bar;

pub(crate) const WEIGHT_DECAY: f64 = 5e-4;

/// The figures of one epoch that do not depend on timing.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochRecord {
    pub epoch: usize,
    pub train_loss: f64,
    /// Training accuracy of the epoch, in percent.
    pub train_acc: f64,
    /// Test accuracy after the epoch, in percent.
    pub test_acc: f64,
    /// Steps skipped for inf/NaN gradients (f16 loss scaling).
    pub skipped_steps: usize,
}

/// Trains as `args` says, printing progress and the time to the target;
/// returns the records of the epochs this call ran.
pub fn train(args: &Args) -> BoxResult<Vec<EpochRecord>> {
    let clock = Instant::now();
    let fashion = args.data.to_string_lossy().contains("fashion");
    let target = args.target.unwrap_or(if fashion { 90.0 } else { 98.0 });

    let Data { train, test, loader } = load_data(args)?;
    let steps_per_epoch = loader.len();

    rng::manual_seed(args.seed);
    let mut model = mnist_cnn()?;
    let mut opt = optimizer(model.parameters(), args.lr)?;
    let total_steps = (args.epochs * steps_per_epoch) as u64;
    let mut sched = OneCycleLR::new(&mut opt, OneCycleOptions::new(args.lr, total_steps))?;

    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create the output directory {}: {e}", args.out.display()))?;
    let ckpt_path = args.out.join("checkpoint.safetensors");
    let log_path = args.out.join("metrics.jsonl");
    let mut start_epoch = 0;
    let mut elapsed_before = 0.0;
    let mut reached: Option<(usize, f64)> = None;
    let mut scaler = args.precision.scaler()?;
    if args.resume {
        let ck = Checkpoint::load(&ckpt_path)?;
        model.load_state_dict(&ck.model, true)?;
        opt.load_state_dict(&ck.optimizer()?.to_device(args.device)?)?;
        sched.load_state_dict(ck.scheduler()?)?;
        if let Ok(sd) = ck.scaler() {
            scaler.load_state_dict(sd)?;
        }
        ck.restore_default_rng()?;
        start_epoch = ck.epoch as usize;
        elapsed_before = ck.meta("elapsed")?;
        reached = ck.meta("reached")?;
        complete_log(&log_path, &ck)?;
        eprintln!("resumed from {} at epoch {start_epoch}", ckpt_path.display());
    }
    // The optimizer holds the same parameters: it steps them where they are.
    model.to(args.device)?;
    eprintln!(
        "model: MNIST CNN, {} parameters, precision {:?}; SGD nesterov momentum 0.9 wd {WEIGHT_DECAY}, one-cycle max lr {}, batch {}, {} epochs",
        model.num_parameters(),
        args.precision,
        args.lr,
        args.batch_size,
        args.epochs
    );

    let ce = CrossEntropyOptions::default();
    let mut records = Vec::new();
    let end_epoch = args.stop_after.map_or(args.epochs, |s| s.min(args.epochs));
    for epoch in start_epoch..end_epoch {
        model.train(true);
        let batches = loader.batch_indices(epoch as u64);
        let mut bar = Bar::new(format!("epoch {}/{}", epoch + 1, args.epochs), batches.len());
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0usize, 0usize);
        let mut skipped_steps = 0;
        let epoch_start = Instant::now();
        for (i, idx) in batches.iter().enumerate() {
            let idx = Tensor::from_vec(idx.iter().map(|&j| j as i64).collect(), &[idx.len()])?;
            let x = Var::constant(train.images.index_select(0, &idx)?.to_device(args.device)?);
            let y = train.labels.index_select(0, &idx)?.to_device(args.device)?;
            let (logits, loss) = args.precision.run(|| {
                let logits = model.forward(&x)?;
                let loss = logits.cross_entropy(Target::Indices(&y), &ce)?;
                Ok((logits, loss))
            })?;
            let step = epoch * steps_per_epoch + i;
            let backward_loss = match args.overflow_at {
                Some(s) if s == step => loss.mul_scalar(16_777_216.0)?,
                _ => loss.clone(),
            };
            // PyTorch's loop: scale → backward → unscale/check → step → update
            // (a disabled scaler, f32 and bf16, is a plain backward and step).
            let mut grads = scaler.backward(&backward_loss)?;
            let scale = scaler.scale();
            if !scaler.step(&mut opt, &mut grads)? {
                skipped_steps += 1;
                eprintln!(
                    "step {step}: inf/NaN gradients under loss scale {scale}; step skipped, scale now {}",
                    scale * scaler.options().backoff_factor
                );
            }
            scaler.update()?;
            sched.step(&mut opt)?;
            let n = idx.numel();
            loss_sum += loss.tensor().to_scalar::<f32>()? as f64 * n as f64;
            correct += count_correct(logits.tensor(), &y)?;
            seen += n;
            bar.update(i + 1, seen, loss_sum / seen as f64, correct as f64 / seen as f64);
        }
        bar.finish();
        let train_secs = epoch_start.elapsed().as_secs_f64();
        model.eval();
        let test_acc = 100.0 * evaluate(&model, &test, 1000, args.precision)?;
        let train_acc = 100.0 * correct as f64 / seen as f64;
        let elapsed = elapsed_before + clock.elapsed().as_secs_f64();
        if reached.is_none() && test_acc >= target {
            reached = Some((epoch + 1, elapsed));
        }
        println!(
            "epoch {:>2}: train loss {:.4} acc {:.2}% | test acc {test_acc:.2}% | {:.0} samples/s | {elapsed:.1}s",
            epoch + 1,
            loss_sum / seen as f64,
            train_acc,
            seen as f64 / train_secs
        );
        let metrics = json!({
            "epoch": epoch + 1,
            "train_loss": loss_sum / seen as f64,
            "train_acc": train_acc,
            "test_acc": test_acc,
            "lr": sched.get_lr()[0],
            "samples_per_s": seen as f64 / train_secs,
            "skipped_steps": skipped_steps,
            "loss_scale": scaler.scale(),
            "elapsed_s": elapsed,
        })
        .to_string();
        // The checkpoint first, then the log: a kill while saving leaves
        // the previous checkpoint and no line for this epoch, which the
        // resumed run then trains and logs once; a kill between the two
        // leaves a checkpoint carrying the line, which --resume appends.
        Checkpoint::new(model.state_dict().to_device(Device::Cpu)?)
            .at((epoch + 1) as u64, sched.last_epoch())
            .with_optimizer(opt.state_dict().to_device(Device::Cpu)?)
            .with_scheduler(sched.state_dict())
            .with_scaler(scaler.state_dict())
            .with_meta("elapsed", elapsed)
            .with_meta("reached", json!(reached))
            .with_meta("metrics", metrics.clone())
            .save(&ckpt_path)?;
        append_line(&log_path, &metrics)?;
        write_report(&log_path, &args.out.join("report.html"))?;
        records.push(EpochRecord {
            epoch: epoch + 1,
            train_loss: loss_sum / seen as f64,
            train_acc,
            test_acc,
            skipped_steps,
        });
    }
    if end_epoch < args.epochs {
        eprintln!("stopped after epoch {end_epoch} (--stop-after); continue with --resume");
        return Ok(records);
    }
    model.to(Device::Cpu)?;
    state_dict::save(&model, args.out.join("model.safetensors"))?;
    match reached {
        Some((epoch, secs)) => {
            println!("reached {target:.1}% test accuracy after epoch {epoch} in {secs:.1}s wall time");
            let set = if fashion { "fashion_mnist" } else { "mnist" };
            println!("bench\t{set}_time_to_{target:.0}\ttessera\ttime\t{secs:.2}\ts");
        }
        None => println!(
            "did not reach {target:.1}% test accuracy in {} epochs",
            args.epochs
        ),
    }
    Ok(records)
}

/// SGD with Nesterov momentum 0.9 and weight decay over `params`.
pub(crate) fn optimizer(params: Vec<Parameter>, lr: f64) -> BoxResult<Sgd> {
    let o = SgdOptions {
        lr,
        momentum: 0.9,
        nesterov: true,
        weight_decay: WEIGHT_DECAY,
        ..Default::default()
    };
    Ok(Sgd::new(params, o)?)
}

/// The training and test splits in memory and the loader of training
/// batches (positions into the training split).
pub(crate) struct Data {
    pub train: Split,
    pub test: Split,
    pub loader: DataLoader<VecDataset<i64>>,
}

/// Loads and normalizes the data `args` names (with the training set's own
/// mean and std) and builds the shuffling loader. Pipeline mode drops the
/// last partial batch when it does not split into the micro-batches.
pub(crate) fn load_data(args: &Args) -> BoxResult<Data> {
    let train_raw = Mnist::open(&args.data, true)?;
    let test_raw = Mnist::open(&args.data, false)?;
    // Normalize with the training set's own mean and std.
    let (mean, std) = pixel_stats(train_raw.pixels());
    let train = load_split(&train_raw, mean, std, args.train_limit)?;
    let test = load_split(&test_raw, mean, std, args.test_limit)?;
    // The loader batches and shuffles sample positions; the pixels are
    // already in one normalized tensor.
    let n = train.labels.shape()[0];
    let ragged = args.pipeline_stages > 1 && !(n % args.batch_size).is_multiple_of(args.micro_batches);
    let loader = DataLoader::builder(VecDataset::new((0..n as i64).collect::<Vec<_>>()))
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(args.seed)
        .drop_last(ragged)
        .build()?;
    eprintln!(
        "data {}: {} train / {} test images, {} threads on {}",
        args.data.display(),
        train.labels.shape()[0],
        test.labels.shape()[0],
        rayon::current_num_threads(),
        cpu_model()
    );
    Ok(Data { train, test, loader })
}

/// The split's first `limit` images (all without one), normalized.
fn load_split(raw: &Mnist, mean: f64, std: f64, limit: Option<usize>) -> BoxResult<Split> {
    let n = raw.labels().len();
    let n = limit.map_or(n, |l| l.min(n));
    let images = raw
        .images_tensor()?
        .narrow(0, 0, n)?
        .to_dtype(DType::F32)?
        .mul_scalar(1.0 / (255.0 * std))?
        .add_scalar(-mean / std)?;
    Ok(Split {
        images,
        labels: raw.labels_tensor()?.narrow(0, 0, n)?,
    })
}

/// Appends the checkpoint's metrics line when the log stops one epoch
/// short of it (the run was killed after saving the checkpoint but before
/// logging the epoch), so every epoch is logged exactly once.
fn complete_log(path: &Path, ck: &Checkpoint) -> BoxResult<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let last_logged = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["epoch"].as_u64())
        .max()
        .unwrap_or(0);
    if last_logged + 1 == ck.epoch {
        append_line(path, &ck.meta::<String>("metrics")?)?;
    }
    Ok(())
}
