//! Trains a GPT-style byte-level language model on the tensor × pipeline ×
//! data-parallel grid, and samples text from it.
//!
//! ```text
//! cargo run --release --example train_gpt -- [--tp T] [--pp P] [--dp D] [--sp]
//!     [--micro-batches M] [--steps 200] [--batch-size 16] [--seq 64]
//!     [--layers 4] [--width 128] [--heads 4] [--lr 3e-3] [--dropout 0] [--seed 0]
//!     [--data /usr/share/common-licenses] [--backend local|tcp]
//!     [--save model.safetensors] [--generate 200] [--prompt "The "]
//! cargo run --release --example train_gpt -- generate --load model.safetensors
//!     [--generate 200] [--prompt "The "] [--temperature 0.8]
//! ```
//!
//! The text is every regular file of `--data` (a file or a directory,
//! symlinks skipped, in name order) read as bytes: by default the licence
//! texts of Debian's `base-files` package in `/usr/share/common-licenses`
//! (about 300 KB of English; present on every Debian and Ubuntu system,
//! CI included). The vocabulary is the 256 byte values.
//!
//! `--tp T --pp P --dp D` trains on `T·P·D` ranks: threads of this process
//! (`--backend local`), or the processes of
//! `tessera-run --nproc-per-node N train_gpt --backend tcp --tp ...`. The
//! grid is Megatron's (tp fastest); each step takes `--batch-size` random
//! windows of `--seq` bytes, replica d trains on its `B/D` rows through a
//! 1F1B pipeline of `M` micro-batches, with the TP layers of
//! `tessera_parallel::tensor_parallel` inside each stage. Rank 0 prints the
//! loss (mean next-byte cross-entropy, nats) and the tokens per second.
//! Afterwards rank 0 holds the consolidated model: `--save` writes it as a
//! safetensors state dict with the serial `Gpt`'s names, and `--generate N`
//! samples N bytes after `--prompt`.
//!
//! `--dropout P` drops with probability P after the embeddings, on the
//! attention probabilities and after each projection, with Megatron's RNG
//! scheme: inside the tensor-parallel region (each rank's heads) a stream
//! seeded `seed + 2718 + tp_rank`, outside it the stream `seed + 100 ·
//! pp_rank` shared by the TP ranks (under `--sp` the model-parallel one,
//! each rank dropping its own tokens).

#[path = "train_gpt/cli.rs"]
mod cli;
#[path = "train_gpt/run.rs"]
mod run;

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
    if let Err(e) = run::main(&args) {
        eprintln!("train_gpt: {e}");
        std::process::exit(1);
    }
}
