//! Training and sampling of `train_gpt`, as functions the binary and the
//! end-to-end test call.

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

use super::cli::Args;

/// Any error of a run, as the binary prints it.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// What a training run leaves on the process that holds world rank 0.
pub struct Trained {
    /// The mean loss of every step (over the data-parallel replicas).
    pub losses: Vec<f64>,
    /// The consolidated model, with the serial `Gpt`'s names.
    pub state_dict: StateDict,
}

/// The binary: samples from `--load` in generate mode; otherwise trains,
/// then on world rank 0 saves (`--save`) and samples (`--generate`).
pub fn main(args: &Args) -> BoxResult<()> {
    if let Some(path) = &args.load {
        let text = sample(&StateDict::load(path)?, args)?;
        println!("--- sample ---\n{}", String::from_utf8_lossy(&text));
        return Ok(());
    }
    let Some(trained) = train(args)? else {
        return Ok(());
    };
    if let (Some(first), Some(last)) = (trained.losses.first(), trained.losses.last()) {
        println!("loss {first:.4} at the first step, {last:.4} at the last");
    }
    if let Some(path) = &args.save {
        trained.state_dict.save(path)?;
        println!("saved {path}");
    }
    if args.generate > 0 {
        let text = sample(&trained.state_dict, args)?;
        println!("--- sample ---\n{}", String::from_utf8_lossy(&text));
    }
    Ok(())
}

/// The model the flags describe.
pub fn config(args: &Args) -> GptConfig {
    GptConfig::new(256)
        .block_size(args.seq)
        .n_layer(args.layers)
        .n_embd(args.width)
        .n_head(args.heads)
        .dropout(args.dropout)
}

/// Trains on the grid the flags describe: `--tp·--pp·--dp` threads, or
/// this process's rank of a `tcp` world. Returns the losses and the model
/// on the process holding world rank 0, `None` on the others. Errors for
/// unreadable or too little text, a model that does not split over the
/// grid, or a failed rank.
pub fn train(args: &Args) -> BoxResult<Option<Trained>> {
    let config = config(args);
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
    if args.backend == "tcp" {
        let comm = tcp::init_from_env()?;
        return train_rank(&comm, &config, &text, args);
    }
    let world = args.tp * args.pp * args.dp;
    let outs = LocalGroup::run(world, |comm| {
        train_rank(comm, &config, &text, args).map_err(|e| e.to_string())
    })?;
    let mut first = None;
    for out in outs {
        if let Some(t) = out? {
            first = Some(t);
        }
    }
    Ok(first)
}

/// The model of `sd` in eval mode extending `--prompt` by `--generate`
/// bytes (the prompt included in the result).
pub fn sample(sd: &StateDict, args: &Args) -> BoxResult<Vec<u8>> {
    let mut model = Gpt::new(&config(args), args.seed)?;
    model.load_state_dict(sd, true)?;
    model.eval();
    let prompt: Vec<i64> = args.prompt.bytes().map(i64::from).collect();
    let mut gen = Generator::new(args.seed);
    let out = model.generate(&prompt, args.generate, args.temperature, &mut gen)?;
    Ok(out.iter().map(|&t| t as u8).collect())
}

/// One rank's training; world rank 0 returns the losses and the model.
fn train_rank(
    world: &dyn Communicator,
    config: &GptConfig,
    text: &[u8],
    args: &Args,
) -> BoxResult<Option<Trained>> {
    let master = Gpt::new(config, args.seed)?;
    if world.rank() == 0 {
        println!(
            "GPT {} layers, width {}, {} heads, context {}, dropout {}: {} parameters; {} bytes of text; tp {} pp {} dp {}{} on {} ranks ({})",
            config.n_layer,
            config.n_embd,
            config.n_head,
            config.block_size,
            config.dropout,
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
        seed: args.seed,
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
    let mut losses = Vec::new();
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
            let loss = acc[0] / acc[1].max(1.0);
            losses.push(loss);
            let last = step + 1 == args.steps;
            if world.rank() == 0 && (step % args.log_every == 0 || last) {
                let secs = clock.elapsed().as_secs_f64();
                let steps = if step == 0 {
                    1
                } else {
                    args.log_every.min(step + 1)
                };
                println!(
                    "step {step:>5}  loss {loss:.4}  {:.0} tokens/s",
                    tokens_per_step * steps as f64 / secs
                );
                clock = Instant::now();
            }
        },
    )?;
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e.into());
    }
    Ok(outcome
        .state_dict
        .map(|state_dict| Trained { losses, state_dict }))
}

/// `--batch-size` random windows of the text for step `step` (the same on
/// every rank): tokens and the next bytes.
fn batch(text: &[u8], step: usize, args: &Args) -> tessera::tensor::Result<(Tensor, Tensor)> {
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
