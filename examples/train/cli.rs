//! Command-line flags of `train`.

use std::path::PathBuf;

use super::common::ddp::{parse_variance_mask, CompressedSettings, COMPRESSED};
use super::common::precision::Precision;

/// The usage text printed on a bad flag or `--help`.
pub const USAGE: &str = "usage: train --model NAME [--data DIR] [--out DIR] [--epochs N] \
[--batch-size N] [--lr F] [--weight-decay F] [--warmup-epochs N] [--min-lr F] [--smoothing F] \
[--clip-grad F] [--ema-decay F] [--img-size N] [--patch-size N] [--depth N] [--embed-dim N] \
[--num-heads N] [--widths S,W1,W2,W3,W4] [--blocks B1,B2,B3,B4] [--drop-path F]
[--opt adamw|lamb|lars|onebit-adam|onebit-lamb|zero-one-adam]
[--momentum F] [--sched cosine|onecycle] [--ddp [--world N] [--backend local|tcp]]
[--freeze-step N] [--local-step-scaler N] [--variance-mask R|off]
[--accum-steps N] [--mixup F] [--cutmix F] [--mixup-prob F] [--mixup-switch-prob F]
[--randaugment N,M] [--progressive MIN,START,END] [--seed N] [--threads N] [--log-every N]
[--resume] [--train-limit N] [--test-limit N] [--stop-after N] [--precision f32|bf16|f16]

  --model         resnet18|resnet34|resnet50|resnet101|vit_tiny_patch16_224|
                  vit_small_patch16_224|vit_base_patch16_224|coatnet_0_224 .. coatnet_3_224
  --data          an MNIST-layout IDX directory (/usr/share/datasets/fashion-mnist;
                  also datasets/mnist), a CIFAR-10 binary directory, or a directory
                  of tessera shards train-*.tshard / test-*.tshard (fields image, label)
  --out           directory for metrics.jsonl, report.html, checkpoint.safetensors,
                  ema.safetensors and model.safetensors (runs/train)
  --epochs        epochs (10)
  --batch-size    samples per step (128)
  --opt           optimizer: adamw, lamb (timm's), lars (timm's), or under --ddp
                  DeepSpeed's onebit-adam, onebit-lamb (exact for --freeze-step
                  steps, then the momentum is exchanged as signs and scales
                  instead of DDP's gradient all-reduce) and zero-one-adam (0/1
                  Adam) (adamw)
  --ddp           data parallelism: DistributedDataParallel over --world ranks;
                  every batch is split into equal row blocks, one per rank
                  (batches the world size does not divide are skipped); no
                  --accum-steps, --resume or --stop-after
  --world N       ranks of the local backend (2)
  --backend B     local: --world ranks as threads of this process (default);
                  tcp: one rank per process, from tessera-run's environment
  --freeze-step N warm-up steps of onebit-adam/onebit-lamb, the last variance
                  step of zero-one-adam (100)
  --local-step-scaler N
                  zero-one-adam: local steps between doublings of the sync
                  interval (DeepSpeed's 32678)
  --variance-mask R
                  the compressed optimizers zero the exchanged momentum where
                  the variance is at most R^2 times its parameter's mean (units
                  that never fired in the warm-up); off: DeepSpeed's (0.01)
  --momentum      LARS momentum (0.9)
  --lr            peak learning rate (1e-3)
  --weight-decay  weight decay, not applied to biases, norms and
                  embeddings (0.05)
  --sched         cosine (linear warm-up from 1e-6, then cosine to --min-lr) or
                  onecycle (PyTorch's OneCycleLR, peak --lr) (cosine)
  --warmup-epochs cosine warm-up in epochs (1)
  --min-lr        lr at the end of the cosine (1e-5)
  --accum-steps   micro-batches per optimizer step; gradients are averaged (1)
  --mixup / --cutmix
                  MixUp / CutMix alpha, timm's batch mode (0: off)
  --mixup-prob / --mixup-switch-prob
                  probability of mixing a batch (1) / of CutMix when both are on (0.5)
  --randaugment N,M
                  timm's RandAugment rand-mM-n N (mstd 0.5, p 0.5 per op) (off)
  --progressive MIN,START,END
                  progressive resizing (ResNets): side MIN up to epoch START,
                  ramping (FFCV's rule, multiples of 32) to the model's side at END
  --smoothing     label smoothing (0.1)
  --clip-grad     global 2-norm gradient clipping (off)
  --ema-decay     weight EMA decay, e.g. 0.999 (off)
  --img-size      model input side (28; 32 for CoAtNet); images are padded
  --patch-size    ViT patch side (4)
  --depth         ViT depth (the model's)
  --embed-dim / --num-heads
                  ViT width and heads (the model's)
  --widths S,W1,W2,W3,W4
                  ResNet / CoAtNet stem width and stage widths (the model's)
  --blocks B1,B2,B3,B4
                  ResNet / CoAtNet blocks per stage (the model's)
  --drop-path     stochastic depth rate (0.1)
  --seed          seed of the init and the shuffling (0)
  --threads       worker threads (all cores)
  --log-every     steps between \"step\" lines in metrics.jsonl (50)
  --resume        continue from OUT/checkpoint.safetensors
  --train-limit / --test-limit N
                  use only the first N images of a split (quick checks)
  --stop-after N  stop after N epochs as if interrupted (tests --resume)
  --precision P   f32 (default), or bf16/f16 mixed precision: forward and loss
                  under autocast, f32 parameters as master weights, and for f16
                  a GradScaler that skips overflowing steps (logged; under --ddp
                  every rank skips the same steps, not with a compressed --opt)";

/// The parsed flags.
#[derive(Debug, Clone)]
pub struct Args {
    pub model: String,
    pub data: PathBuf,
    pub out: PathBuf,
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub weight_decay: f64,
    pub warmup_epochs: usize,
    pub min_lr: f64,
    pub smoothing: f64,
    pub clip_grad: Option<f64>,
    pub ema_decay: Option<f64>,
    pub img_size: Option<usize>,
    pub patch_size: usize,
    pub depth: Option<usize>,
    pub embed_dim: Option<usize>,
    pub num_heads: Option<usize>,
    pub widths: Option<(usize, [usize; 4])>,
    pub blocks: Option<[usize; 4]>,
    pub drop_path: f64,
    pub opt: String,
    pub momentum: f64,
    pub sched: String,
    pub accum_steps: usize,
    pub mixup: f64,
    pub cutmix: f64,
    pub mixup_prob: f64,
    pub mixup_switch_prob: f64,
    pub randaugment: Option<(usize, f64)>,
    pub progressive: Option<(usize, u64, u64)>,
    pub seed: u64,
    pub threads: Option<usize>,
    pub log_every: usize,
    pub resume: bool,
    pub train_limit: Option<usize>,
    pub test_limit: Option<usize>,
    pub stop_after: Option<usize>,
    pub precision: Precision,
    pub ddp: bool,
    pub world: usize,
    pub backend: String,
    pub compressed: CompressedSettings,
}

impl Args {
    /// Parses `--flag value` pairs (and `--flag=value`). Errors with a
    /// message naming the bad flag or value.
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            model: "resnet18".into(),
            data: PathBuf::from("/usr/share/datasets/fashion-mnist"),
            out: PathBuf::from("runs/train"),
            epochs: 10,
            batch_size: 128,
            lr: 1e-3,
            weight_decay: 0.05,
            warmup_epochs: 1,
            min_lr: 1e-5,
            smoothing: 0.1,
            clip_grad: None,
            ema_decay: None,
            img_size: None,
            patch_size: 4,
            depth: None,
            embed_dim: None,
            num_heads: None,
            widths: None,
            blocks: None,
            drop_path: 0.1,
            opt: "adamw".into(),
            momentum: 0.9,
            sched: "cosine".into(),
            accum_steps: 1,
            mixup: 0.0,
            cutmix: 0.0,
            mixup_prob: 1.0,
            mixup_switch_prob: 0.5,
            randaugment: None,
            progressive: None,
            seed: 0,
            threads: None,
            log_every: 50,
            resume: false,
            train_limit: None,
            test_limit: None,
            stop_after: None,
            precision: Precision::F32,
            ddp: false,
            world: 2,
            backend: "local".into(),
            compressed: CompressedSettings::default(),
        };
        let mut it = args.flat_map(|s| match s.split_once('=') {
            Some((k, v)) if s.starts_with("--") => vec![k.to_string(), v.to_string()],
            _ => vec![s],
        });
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--resume" => {
                    a.resume = true;
                    continue;
                }
                "--ddp" => {
                    a.ddp = true;
                    continue;
                }
                "--help" | "-h" => return Err("help".into()),
                _ => {}
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = |e: &dyn std::fmt::Display| format!("bad value {value:?} for {flag}: {e}");
            macro_rules! parse {
                () => {
                    value.parse().map_err(|e| bad(&e))?
                };
            }
            match flag.as_str() {
                "--model" => a.model = value,
                "--data" => a.data = PathBuf::from(value),
                "--out" => a.out = PathBuf::from(value),
                "--epochs" => a.epochs = parse!(),
                "--batch-size" => a.batch_size = parse!(),
                "--lr" => a.lr = parse!(),
                "--weight-decay" => a.weight_decay = parse!(),
                "--warmup-epochs" => a.warmup_epochs = parse!(),
                "--min-lr" => a.min_lr = parse!(),
                "--smoothing" => a.smoothing = parse!(),
                "--clip-grad" => a.clip_grad = Some(parse!()),
                "--ema-decay" => a.ema_decay = Some(parse!()),
                "--img-size" => a.img_size = Some(parse!()),
                "--patch-size" => a.patch_size = parse!(),
                "--depth" => a.depth = Some(parse!()),
                "--embed-dim" => a.embed_dim = Some(parse!()),
                "--num-heads" => a.num_heads = Some(parse!()),
                "--drop-path" => a.drop_path = parse!(),
                "--opt" => a.opt = value,
                "--momentum" => a.momentum = parse!(),
                "--sched" => a.sched = value,
                "--accum-steps" => a.accum_steps = parse!(),
                "--mixup" => a.mixup = parse!(),
                "--cutmix" => a.cutmix = parse!(),
                "--mixup-prob" => a.mixup_prob = parse!(),
                "--mixup-switch-prob" => a.mixup_switch_prob = parse!(),
                "--widths" => {
                    let [stem, w @ ..] = list::<5>(&value).map_err(|e| bad(&e))?;
                    a.widths = Some((stem, w));
                }
                "--blocks" => a.blocks = Some(list::<4>(&value).map_err(|e| bad(&e))?),
                "--randaugment" => {
                    let (n, m) = value.split_once(',').ok_or_else(|| bad(&"expected N,M"))?;
                    a.randaugment = Some((n.parse().map_err(|e| bad(&e))?, m.parse().map_err(|e| bad(&e))?));
                }
                "--progressive" => {
                    let parts: Vec<&str> = value.split(',').collect();
                    let [min, start, end] = parts[..] else {
                        return Err(bad(&"expected MIN,START,END"));
                    };
                    a.progressive = Some((
                        min.parse().map_err(|e| bad(&e))?,
                        start.parse().map_err(|e| bad(&e))?,
                        end.parse().map_err(|e| bad(&e))?,
                    ));
                }
                "--seed" => a.seed = parse!(),
                "--threads" => a.threads = Some(parse!()),
                "--log-every" => a.log_every = parse!(),
                "--train-limit" => a.train_limit = Some(parse!()),
                "--test-limit" => a.test_limit = Some(parse!()),
                "--stop-after" => a.stop_after = Some(parse!()),
                "--precision" => a.precision = value.parse().map_err(|e: String| bad(&e))?,
                "--world" => a.world = parse!(),
                "--backend" => a.backend = value,
                "--freeze-step" => a.compressed.freeze_step = parse!(),
                "--local-step-scaler" => a.compressed.local_step_scaler = parse!(),
                "--variance-mask" => a.compressed.variance_mask = parse_variance_mask(&value)?,
                _ => return Err(format!("unknown flag {flag}")),
            }
        }
        if a.epochs == 0 || a.batch_size == 0 || a.threads == Some(0) || a.log_every == 0 {
            return Err("--epochs, --batch-size, --threads and --log-every must be positive".into());
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        let nonneg = |x: f64| x.is_finite() && x >= 0.0;
        if !positive(a.lr) || !nonneg(a.min_lr) || !nonneg(a.weight_decay) {
            return Err("--lr must be positive, --min-lr and --weight-decay non-negative".into());
        }
        if !(0.0..1.0).contains(&a.smoothing) || a.clip_grad.is_some_and(|c| !positive(c)) {
            return Err("--smoothing must be in [0, 1) and --clip-grad positive".into());
        }
        if a.ema_decay.is_some_and(|d| !(0.0..1.0).contains(&d)) {
            return Err("--ema-decay must be in [0, 1)".into());
        }
        let compressed = COMPRESSED.contains(&a.opt.as_str());
        if !["adamw", "lamb", "lars"].contains(&a.opt.as_str()) && !compressed {
            return Err(format!(
                "--opt {:?}: expected adamw, lamb, lars, onebit-adam, onebit-lamb or zero-one-adam",
                a.opt
            ));
        }
        if compressed && !a.ddp {
            return Err(format!("--opt {} needs --ddp", a.opt));
        }
        if a.compressed.local_step_scaler == 0 {
            return Err("--local-step-scaler must be positive".into());
        }
        if a.ddp {
            if !["local", "tcp"].contains(&a.backend.as_str()) || a.world == 0 {
                return Err(format!(
                    "--backend must be local or tcp and --world positive, got {} and {}",
                    a.backend, a.world
                ));
            }
            if a.accum_steps > 1 || a.resume || a.stop_after.is_some() {
                return Err("--ddp trains without --accum-steps, --resume and --stop-after".into());
            }
            if a.precision == Precision::F16 && COMPRESSED.contains(&a.opt.as_str()) {
                return Err(format!(
                    "--precision f16 with --opt {}: loss scaling needs the all-reduced gradients the compressed optimizers do without",
                    a.opt
                ));
            }
        }
        if !["cosine", "onecycle"].contains(&a.sched.as_str()) {
            return Err(format!("--sched {:?}: expected cosine or onecycle", a.sched));
        }
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        if a.accum_steps == 0 || !nonneg(a.mixup) || !nonneg(a.cutmix) || !nonneg(a.momentum) {
            return Err(
                "--accum-steps must be positive, --mixup, --cutmix and --momentum non-negative".into(),
            );
        }
        if !unit(a.mixup_prob) || !unit(a.mixup_switch_prob) {
            return Err("--mixup-prob and --mixup-switch-prob must be in [0, 1]".into());
        }
        if a.randaugment.is_some_and(|(_, m)| !(0.0..=10.0).contains(&m)) {
            return Err("--randaugment N,M needs M in [0, 10]".into());
        }
        Ok(a)
    }
}

/// `N` comma-separated positive integers.
fn list<const N: usize>(value: &str) -> Result<[usize; N], String> {
    let parts: Vec<usize> = value
        .split(',')
        .map(|v| v.trim().parse::<usize>().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    match <[usize; N]>::try_from(parts) {
        Ok(a) if a.iter().all(|&v| v > 0) => Ok(a),
        _ => Err(format!("expected {N} comma-separated positive integers")),
    }
}
