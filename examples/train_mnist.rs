//! Trains the MNIST CNN (conv 1→32 – pool – conv 32→64 – pool – 3136→128
//! – 10) with SGD (Nesterov momentum, weight decay) under a one-cycle
//! schedule, and reports test accuracy after every epoch.
//!
//! ```text
//! cargo run --release --example train_mnist -- [--epochs 10] [--batch-size 128]
//!     [--lr 0.1] [--seed 0] [--threads N] [--data datasets/mnist]
//!     [--out runs/mnist] [--resume] [--target 98.0]
//! ```
//!
//! `--data /usr/share/datasets/fashion-mnist` trains on Fashion-MNIST
//! (target 90%). Each epoch replaces `OUT/checkpoint.safetensors` (a
//! `Checkpoint`: model, optimizer, schedule, random state, epoch; written
//! atomically and durably, CRC-checked on load), then appends a line to
//! `OUT/metrics.jsonl`; `--resume` continues from it to the same final
//! weights as an uninterrupted run, with every epoch logged once. The final weights are also saved
//! as `OUT/model.safetensors`, a PyTorch-loadable state dict.
//!
//! `--pipeline-stages P --micro-batches M --schedule gpipe|1f1b|interleaved`
//! trains the same model as a P-stage pipeline on P threads (the
//! `tessera-parallel` pipeline engine), or one stage per process under
//! `tessera-run --nproc-per-node P train_mnist --pipeline-stages P ...`
//! (same bits); see `train_mnist/pipeline.rs`.
//!
//! `--ddp` or `--zero 1|2|3` trains with data parallelism over `--world N`
//! threads (`--backend local`) or over the processes of `tessera-run
//! --nproc-per-node N -- train_mnist --zero 2 --backend tcp`; see
//! `train_mnist/data_parallel.rs`.

#[path = "train_mnist/cli.rs"]
mod cli;
#[path = "common/mod.rs"]
mod common;
#[path = "train_mnist/data_parallel.rs"]
mod data_parallel;
#[path = "train_mnist/pipeline.rs"]
mod pipeline;
#[path = "train_mnist/progress.rs"]
mod progress;
#[path = "train_mnist/run.rs"]
mod run;
#[path = "common/threads.rs"]
mod threads;

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
    // Rank threads of the local backend wait for their ranks; a rank
    // process (tcp, started by a launcher) trains on its main thread.
    let caller_trains = match (args.data_parallel(), args.pipeline_stages > 1) {
        (false, false) => true,
        (true, _) => args.backend == "tcp",
        (false, true) => pipeline::launched(),
    };
    if let Err(e) = threads::init(args.threads, caller_trains) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let trained = if args.data_parallel() {
        data_parallel::train(&args)
    } else if args.pipeline_stages > 1 {
        pipeline::train(&args)
    } else {
        run::train(&args)
    };
    if let Err(e) = trained.map(drop) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
