//! Trains a GPT-style byte-level language model on the tensor × pipeline ×
//! data-parallel grid, and samples text from it.
//!
//! ```text
//! cargo run --release --example train_gpt -- [--tp T] [--pp P] [--dp D] [--sp]
//!     [--micro-batches M] [--steps 200] [--batch-size 16] [--seq 64]
//!     [--layers 4] [--width 128] [--heads 4] [--lr 3e-3] [--seed 0]
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

#[path = "train_gpt/cli.rs"]
mod cli;

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use tessera::nn::models::{Gpt, GptConfig};
use tessera::nn::Module;
use tessera::optim::{AdamW, AdamWOptions, Optimizer, Parameter};
use tessera::parallel::pipeline::Schedule;
use tessera::parallel::tensor_parallel::{train_gpt_3d, Gpt3dOptions};
use tessera::parallel::{tcp, CommExt, Communicator, LocalGroup, ReduceOp};
use tessera::tensor::{DType, Generator, StateDict, Tensor};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

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
    if let Err(e) = run(&args) {
        eprintln!("train_gpt: {e}");
        std::process::exit(1);
    }
}

fn run(args: &cli::Args) -> BoxResult<()> {
    let config = GptConfig::new(256)
        .block_size(args.seq)
        .n_layer(args.layers)
        .n_embd(args.width)
        .n_head(args.heads);
    if let Some(path) = &args.load {
        let model = Gpt::new(&config, args.seed)?;
        model.load_state_dict(&StateDict::load(path)?, true)?;
        return generate(&model, args);
    }
    let text = read_text(&args.data)?;
    if text.len() <= args.seq + 1 {
        return Err(format!(
            "{}: {} bytes is too little text for --seq {}",
            args.data,
            text.len(),
            args.seq
        )
        .into());
    }
    let trained = if args.backend == "tcp" {
        let comm = tcp::init_from_env()?;
        train_rank(&comm, &config, &text, args)?
    } else {
        let world = args.tp * args.pp * args.dp;
        let outs = LocalGroup::run(world, |comm| {
            train_rank(comm, &config, &text, args).map_err(|e| e.to_string())
        })?;
        let mut first = None;
        for out in outs {
            if let Some(sd) = out? {
                first = Some(sd);
            }
        }
        first
    };
    let Some(sd) = trained else { return Ok(()) };
    if let Some(path) = &args.save {
        sd.save(path)?;
        println!("saved {path}");
    }
    if args.generate > 0 {
        let model = Gpt::new(&config, args.seed)?;
        model.load_state_dict(&sd, true)?;
        generate(&model, args)?;
    }
    Ok(())
}

/// One rank's training; world rank 0 returns the consolidated model.
fn train_rank(
    world: &dyn Communicator,
    config: &GptConfig,
    text: &[u8],
    args: &cli::Args,
) -> BoxResult<Option<StateDict>> {
    let master = Gpt::new(config, args.seed)?;
    if world.rank() == 0 {
        println!(
            "GPT {} layers, width {}, {} heads, context {}: {} parameters; {} bytes of text; tp {} pp {} dp {}{} on {} ranks ({})",
            config.n_layer,
            config.n_embd,
            config.n_head,
            config.block_size,
            master.num_parameters(),
            text.len(),
            args.tp,
            args.pp,
            args.dp,
            if args.sp { " with sequence parallelism" } else { "" },
            world.world_size(),
            world.backend(),
        );
    }
    let opts = Gpt3dOptions {
        tp: args.tp,
        dp: args.dp,
        schedule: Schedule::one_f_one_b(args.pp, args.micro_batches)?,
        sequence_parallel: args.sp,
    };
    let lr = args.lr;
    let make_opt = |params: Vec<Parameter>| -> tessera::tensor::Result<Box<dyn Optimizer>> {
        let o = AdamWOptions {
            lr,
            weight_decay: 0.0,
            ..AdamWOptions::default()
        };
        Ok(Box::new(AdamW::new(params, o)?))
    };
    let mut clock = Instant::now();
    let failure = Mutex::new(None);
    let tokens_per_step = (args.batch_size * args.seq) as f64;
    let outcome = train_gpt_3d(
        world,
        &master,
        &opts,
        &make_opt,
        args.steps,
        &mut |step| Ok(batch(text, step, args)?),
        &mut |step, report| {
            // The mean loss over the replicas' last stages (TP rank 0 of
            // each), gathered with one world all-reduce.
            let tp0 = world.rank().is_multiple_of(args.tp);
            let mut acc = [report.loss.filter(|_| tp0).unwrap_or(0.0), 0.0];
            acc[1] = if tp0 && report.loss.is_some() { 1.0 } else { 0.0 };
            if let Err(e) = world.all_reduce_slice(&mut acc, ReduceOp::Sum) {
                failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                return;
            }
            let last = step + 1 == args.steps;
            if world.rank() == 0 && (step % args.log_every == 0 || last) {
                let secs = clock.elapsed().as_secs_f64();
                let steps = if step == 0 {
                    1
                } else {
                    args.log_every.min(step + 1)
                };
                println!(
                    "step {step:>5}  loss {:.4}  {:.0} tokens/s",
                    acc[0] / acc[1].max(1.0),
                    tokens_per_step * steps as f64 / secs
                );
                clock = Instant::now();
            }
        },
    )?;
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e.into());
    }
    Ok(outcome.state_dict)
}

/// `--batch-size` random windows of the text for step `step` (the same on
/// every rank): tokens and the next bytes.
fn batch(text: &[u8], step: usize, args: &cli::Args) -> tessera::tensor::Result<(Tensor, Tensor)> {
    let (b, s) = (args.batch_size, args.seq);
    let mut gen = Generator::new(args.seed.wrapping_mul(1_000_003).wrapping_add(step as u64));
    let starts = Tensor::rand_with(&[b], DType::F64, &mut gen)?.to_vec::<f64>()?;
    let span = (text.len() - s - 1) as f64;
    let (mut x, mut y) = (Vec::with_capacity(b * s), Vec::with_capacity(b * s));
    for u in starts {
        let at = (u * span) as usize;
        x.extend(text[at..at + s].iter().map(|&c| c as i64));
        y.extend(text[at + 1..at + s + 1].iter().map(|&c| c as i64));
    }
    Ok((Tensor::from_vec(x, &[b, s])?, Tensor::from_vec(y, &[b, s])?))
}

/// Samples `--generate` bytes after `--prompt` and prints them.
fn generate(model: &Gpt, args: &cli::Args) -> BoxResult<()> {
    let prompt: Vec<i64> = args.prompt.bytes().map(i64::from).collect();
    let mut gen = Generator::new(args.seed);
    let out = model.generate(&prompt, args.generate, args.temperature, &mut gen)?;
    let bytes: Vec<u8> = out.iter().map(|&t| t as u8).collect();
    println!("--- sample ---\n{}", String::from_utf8_lossy(&bytes));
    Ok(())
}

/// The bytes of `path`, or of every regular file under it in name order.
fn read_text(path: &str) -> BoxResult<Vec<u8>> {
    let p = Path::new(path);
    if p.is_file() {
        return Ok(std::fs::read(p)?);
    }
    let mut files: Vec<_> = std::fs::read_dir(p)
        .map_err(|e| format!("{path}: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut text = Vec::new();
    for f in files {
        text.extend(std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    Ok(text)
}
