//! Command-line flags of `train_mnist`.

use std::path::PathBuf;

use tessera::tensor::Device;

use super::common::ddp::{parse_variance_mask, CompressedSettings, COMPRESSED};
use super::common::precision::Precision;

/// The usage text printed on a bad flag or `--help`.
pub const USAGE: &str = "usage: train_mnist [--epochs N] [--batch-size N] [--lr F] [--seed N] \
[--threads N] [--data DIR] [--out DIR] [--resume] [--target PERCENT]
[--pipeline-stages P --micro-batches M --schedule gpipe|1f1b|deepspeed|interleaved [--chunks V]]
[--ddp | --zero 1|2|3] [--backend local|tcp] [--world N]
[--optim sgd|adam|onebit-adam|onebit-lamb|zero-one-adam] [--freeze-step N]
[--local-step-scaler N] [--variance-mask R|off] [--device cpu|cuda[:N]] [--precision f32|bf16|f16] [--overflow-at STEP]

  --epochs      epochs to train (10)
  --batch-size  samples per step (128)
  --lr          one-cycle peak learning rate of SGD (0.1)
  --seed        seed of the init and the shuffling (0)
  --threads     worker threads (all cores)
  --data        MNIST-layout directory (datasets/mnist; also
                /usr/share/datasets/fashion-mnist)
  --out         directory for metrics.jsonl, checkpoint.safetensors and
                model.safetensors (runs/mnist)
  --resume      continue from OUT/checkpoint.safetensors
  --target      test accuracy (%) whose time to reach is reported
                (98 for MNIST, 90 for Fashion-MNIST)
  --train-limit / --test-limit N
                use only the first N images of a split (quick checks)
  --stop-after N
                stop after N epochs as if interrupted (tests --resume)
  --pipeline-stages P
                train as a P-stage pipeline on P threads, or one stage
                per process under tessera-run (1: off). The
                layers are split evenly by count; stage 0 reads the images,
                the last stage the labels. Drops the last partial batch.
  --micro-batches M
                micro-batches per batch in pipeline mode (4); the batch
                size must be divisible by M
  --schedule S  pipeline schedule: gpipe, 1f1b (default), deepspeed,
                interleaved (M divisible by P)
  --chunks V    model chunks per stage of the interleaved schedule (2)
  --ddp         data parallelism: DistributedDataParallel over the ranks;
                each batch is split into equal row blocks, one per rank
  --zero S      data parallelism with ZeRO stage S (1: optimizer state,
                2: also gradients, 3: also parameters, gathered per
                module for its forward and backward, partitioned over
                the ranks)
  --backend B   local: --world ranks as threads of this process (default);
                tcp: one rank per process, from tessera-run's environment
  --world N     ranks of the local backend (2)
  --optim O     the optimizer under --ddp: sgd (Nesterov, the default),
                adam (torch's), onebit-adam, onebit-lamb (DeepSpeed's 1-bit optimizers: exact for --freeze-step
                steps, then the momentum is exchanged as signs and scales
                instead of DDP's gradient all-reduce), zero-one-adam (0/1
                Adam: exact variance steps ever sparser until --freeze-step,
                1-bit gradients between them, then local steps synchronised
                1-bit)
  --freeze-step N
                warm-up steps of onebit-adam / onebit-lamb, the last
                variance step of zero-one-adam (100)
  --local-step-scaler N
                zero-one-adam: local steps between doublings of the
                synchronisation interval (DeepSpeed's 32678; at most 16)
  --variance-mask R
                the compressed optimizers zero the exchanged momentum of
                coordinates whose variance is at most R^2 times their
                parameter's mean (ReLU units that never fired in the
                warm-up: 1-bit compression cannot send 0, and divided by a
                ~0 variance it throws them away); off: DeepSpeed's
                behaviour (0.01)
  --device D    where the model trains: cpu (default) or cuda[:N] (a GPU,
                or the CPU emulator of one in a `cuda-emu` build); the
                single-process mode only
  --precision P f32 (default), or bf16/f16 mixed precision: forward and
                loss under autocast (matmul/conv in P, softmax and the loss
                in f32), f32 parameters as master weights, and for f16 a
                GradScaler (init scale 2^16) that skips a step whose
                gradients overflowed and halves the scale; also under
                --ddp and --zero (every rank skips the same steps: the
                overflow check follows the reduced gradients) and
                --pipeline-stages (every stage autocasts, activations
                cross stages in P, all stages share the overflow verdict)
                and --device cuda; not f16 with a compressed --optim
  --overflow-at STEP
                multiply the loss of 0-based step STEP by 2^24 (a test of
                the f16 loss-scaling path: that step overflows, is skipped
                and logged; --precision f16 only)";

/// The parsed flags.
#[derive(Debug, Clone)]
pub struct Args {
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub seed: u64,
    pub threads: Option<usize>,
    pub data: PathBuf,
    pub out: PathBuf,
    pub resume: bool,
    pub target: Option<f64>,
    pub train_limit: Option<usize>,
    pub test_limit: Option<usize>,
    pub stop_after: Option<usize>,
    pub pipeline_stages: usize,
    pub micro_batches: usize,
    pub schedule: String,
    pub chunks: usize,
    pub ddp: bool,
    pub zero: Option<u8>,
    pub backend: String,
    pub world: usize,
    pub device: Device,
    pub optim: String,
    pub compressed: CompressedSettings,
    pub precision: Precision,
    pub overflow_at: Option<usize>,
}

impl Args {
    /// True with `--ddp` or `--zero`.
    pub fn data_parallel(&self) -> bool {
        self.ddp || self.zero.is_some()
    }

    /// Parses `--flag value` pairs (and `--flag=value`). Errors with a
    /// message naming the bad flag or value.
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            epochs: 10,
            batch_size: 128,
            lr: 0.1,
            seed: 0,
            threads: None,
            data: PathBuf::from("datasets/mnist"),
            out: PathBuf::from("runs/mnist"),
            resume: false,
            target: None,
            train_limit: None,
            test_limit: None,
            stop_after: None,
            pipeline_stages: 1,
            micro_batches: 4,
            schedule: "1f1b".into(),
            chunks: 2,
            ddp: false,
            zero: None,
            backend: "local".into(),
            world: 2,
            device: Device::Cpu,
            optim: "sgd".into(),
            compressed: CompressedSettings::default(),
            precision: Precision::F32,
            overflow_at: None,
        };
        let mut it = args.flat_map(|s| match s.split_once('=') {
            Some((k, v)) if s.starts_with("--") => vec![k.to_string(), v.to_string()],
            _ => vec![s],
        });
        while let Some(flag) = it.next() {
            if flag == "--resume" {
                a.resume = true;
                continue;
            }
            if flag == "--ddp" {
                a.ddp = true;
                continue;
            }
            if flag == "--help" || flag == "-h" {
                return Err("help".into());
            }
            const VALUED: [&str; 25] = [
                "--variance-mask",
                "--precision",
                "--overflow-at",
                "--device",
                "--optim",
                "--freeze-step",
                "--local-step-scaler",
                "--zero",
                "--backend",
                "--world",
                "--epochs",
                "--batch-size",
                "--lr",
                "--seed",
                "--threads",
                "--data",
                "--out",
                "--target",
                "--train-limit",
                "--test-limit",
                "--stop-after",
                "--pipeline-stages",
                "--micro-batches",
                "--schedule",
                "--chunks",
            ];
            if !VALUED.contains(&flag.as_str()) {
                return Err(format!("unknown flag {flag}"));
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = |e: String| format!("bad value {value:?} for {flag}: {e}");
            match flag.as_str() {
                "--epochs" => a.epochs = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--batch-size" => a.batch_size = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--lr" => a.lr = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--seed" => a.seed = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--threads" => a.threads = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--data" => a.data = PathBuf::from(value),
                "--out" => a.out = PathBuf::from(value),
                "--target" => a.target = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--train-limit" => a.train_limit = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--test-limit" => a.test_limit = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--stop-after" => a.stop_after = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--pipeline-stages" => a.pipeline_stages = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--micro-batches" => a.micro_batches = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--schedule" => a.schedule = value,
                "--chunks" => a.chunks = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--zero" => a.zero = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--backend" => a.backend = value,
                "--world" => a.world = value.parse().map_err(|e| bad(format!("{e}")))?,
                "--device" => {
                    a.device = value
                        .parse()
                        .map_err(|e: tessera::tensor::Error| bad(format!("{e}")))?
                }
                "--optim" => a.optim = value,
                "--precision" => a.precision = value.parse().map_err(bad)?,
                "--overflow-at" => a.overflow_at = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "--freeze-step" => {
                    a.compressed.freeze_step = value.parse().map_err(|e| bad(format!("{e}")))?
                }
                "--variance-mask" => a.compressed.variance_mask = parse_variance_mask(&value)?,
                "--local-step-scaler" => {
                    a.compressed.local_step_scaler = value.parse().map_err(|e| bad(format!("{e}")))?;
                    if a.compressed.local_step_scaler == 0 {
                        return Err(bad("must be positive".into()));
                    }
                }
                _ => unreachable!("every flag of VALUED has an arm"),
            }
        }
        if a.epochs == 0 || a.batch_size == 0 || a.threads == Some(0) {
            return Err("--epochs, --batch-size and --threads must be positive".into());
        }
        if a.pipeline_stages == 0 || a.micro_batches == 0 || a.chunks == 0 {
            return Err("--pipeline-stages, --micro-batches and --chunks must be positive".into());
        }
        if a.pipeline_stages > 1 {
            if !a.batch_size.is_multiple_of(a.micro_batches) {
                return Err(format!(
                    "--batch-size {} is not divisible by --micro-batches {}",
                    a.batch_size, a.micro_batches
                ));
            }
            if a.resume || a.stop_after.is_some() {
                return Err("--resume and --stop-after are not supported with --pipeline-stages".into());
            }
        }
        if a.data_parallel() {
            if !matches!(a.zero, None | Some(1) | Some(2) | Some(3)) || (a.ddp && a.zero.is_some()) {
                return Err("--zero takes 1, 2 or 3, and excludes --ddp".into());
            }
            if !matches!(a.backend.as_str(), "local" | "tcp") || a.world == 0 {
                return Err(format!(
                    "--backend must be local or tcp and --world positive, got {} and {}",
                    a.backend, a.world
                ));
            }
            if a.pipeline_stages > 1 || a.resume || a.stop_after.is_some() {
                return Err("--ddp and --zero exclude --pipeline-stages, --resume and --stop-after".into());
            }
        }
        if !a.device.is_cpu() && (a.pipeline_stages > 1 || a.data_parallel()) {
            return Err(
                "--device cuda trains in the single-process mode only (no --pipeline-stages, --ddp, --zero)"
                    .into(),
            );
        }
        if a.overflow_at.is_some() && (a.pipeline_stages > 1 || a.data_parallel()) {
            return Err(
                "--overflow-at tests the single-process mode only (no --pipeline-stages, --ddp, --zero)"
                    .into(),
            );
        }
        if a.overflow_at.is_some() && a.precision != Precision::F16 {
            // Without a loss scaler nothing skips the step: the weights
            // would just turn to inf/NaN.
            return Err("--overflow-at tests f16 loss scaling: it needs --precision f16".into());
        }
        if a.precision == Precision::F16 && COMPRESSED.contains(&a.optim.as_str()) {
            return Err(format!(
                "--precision f16 with --optim {}: loss scaling needs the all-reduced gradients the compressed optimizers do without",
                a.optim
            ));
        }
        if !["sgd", "adam"].contains(&a.optim.as_str()) && !COMPRESSED.contains(&a.optim.as_str()) {
            return Err(format!(
                "--optim takes sgd, adam, onebit-adam, onebit-lamb or zero-one-adam, got {}",
                a.optim
            ));
        }
        if a.optim != "sgd" && !a.ddp {
            return Err(format!("--optim {} needs --ddp", a.optim));
        }
        if !(a.lr.is_finite() && a.lr > 0.0) {
            return Err(format!("--lr must be a positive number, got {}", a.lr));
        }
        Ok(a)
    }
}
