//! A timm-style training run of any model of `tessera::nn::models` on
//! MNIST-layout IDX data (MNIST, Fashion-MNIST), CIFAR-10 binaries or
//! tessera shards: AdamW, LAMB or LARS with timm's weight decay groups,
//! cosine schedule with linear warm-up (per step) or OneCycle, label
//! smoothing, MixUp/CutMix, RandAugment, progressive resizing, gradient
//! accumulation, global-norm gradient clipping, a weight EMA (timm's
//! `ModelEmaV2`), checkpoint/resume, JSONL metrics and an HTML report.
//!
//! ```text
//! cargo run --release --example train -- --model vit_tiny_patch16_224 \
//!     --img-size 28 --patch-size 4 --depth 6 \
//!     --data /usr/share/datasets/fashion-mnist --epochs 10 --out runs/vit
//! ```
//!
//! Models: `resnet18/34/50/101`, `vit_{tiny,small,base}_patch16_224`,
//! `coatnet_{0,1,2,3}_224`, resized by `--img-size` (28 by default; 32 for
//! CoAtNet, whose five halvings need a multiple of 32: the 28×28 images are
//! padded with background), `--patch-size`, `--depth`, `--embed-dim`,
//! `--num-heads` and `--drop-path`. Input channels and classes come from
//! the data. ResNets at 64×64 or less use the small (CIFAR) stem.
//!
//! Each epoch replaces `OUT/checkpoint.safetensors` (model, optimizer,
//! schedule, random state; the EMA weights beside it in
//! `OUT/ema.safetensors`) and appends an `"epoch"` line to
//! `OUT/metrics.jsonl`, which also gets a `"step"` line every `--log-every`
//! optimizer steps, and rewrites `OUT/report.html` from it; `--resume` continues from the checkpoint. The final weights go to
//! `OUT/model.safetensors` (a timm/PyTorch-loadable state dict).
//!
//! `--ddp` trains with `DistributedDataParallel` over `--world N` threads
//! (`--backend local`) or the processes of `tessera-run --nproc-per-node N
//! -- train --ddp --backend tcp`: each batch is split into N equal row
//! blocks, so the run is the single-process one up to the reduction order
//! (without drop path, which each rank draws for itself). Under `--ddp`,
//! `--opt onebit-adam|onebit-lamb|zero-one-adam` selects DeepSpeed's
//! communication-compressed optimizers (`--freeze-step`,
//! `--local-step-scaler`, `--variance-mask`).

#[path = "train/cli.rs"]
mod cli;
#[path = "common/mod.rs"]
mod common;
#[path = "train/data.rs"]
mod data;
#[path = "train_mnist/progress.rs"]
mod progress;
#[path = "train/run.rs"]
mod run;
#[path = "common/threads.rs"]
mod threads;
#[path = "train/zoo.rs"]
mod zoo;

fn main() {
    let args = match cli::Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) if msg == "help" => {
            println!("{}", cli::USAGE);
            return;
        }
        Err(msg) => {
            eprintln!("{msg}\n\n{}", cli::USAGE);
            std::process::exit(2);
        }
    };
    // `--ddp` on the local backend runs its ranks on threads that wait.
    let caller_trains = !args.ddp || args.backend == "tcp";
    if let Err(e) = threads::init(args.threads, caller_trains).and_then(|()| run::train(&args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
