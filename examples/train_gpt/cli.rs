//! Command-line flags of `train_gpt`.

/// The usage text printed on a bad flag or `--help`.
pub const USAGE: &str = "usage: train_gpt [generate] [--tp T] [--pp P] [--dp D] [--sp] [--micro-batches M]
[--steps N] [--batch-size B] [--seq S] [--layers L] [--width H] [--heads N] [--lr F] [--dropout P]
[--seed N] [--data PATH] [--backend local|tcp] [--log-every N] [--save FILE]
[--load FILE] [--generate N] [--prompt TEXT] [--temperature F]

  generate         sample from the model saved at --load instead of training
  --tp/--pp/--dp   tensor-parallel, pipeline and data-parallel sizes (1 each);
                   T·P·D threads, or the processes of tessera-run with --backend tcp
  --sp             sequence parallelism inside each tensor-parallel group
  --micro-batches  micro-batches of the 1F1B pipeline (P); B/D must divide by it
  --steps          optimizer steps (200)
  --batch-size     windows of text per step, over all replicas (16)
  --seq            bytes per window = the model's context (64)
  --layers/--width/--heads  model size (4, 128, 4); heads and the vocabulary (256)
                   must divide by T
  --lr             AdamW learning rate (3e-3)
  --dropout P      dropout after the embeddings, on the attention probabilities
                   and after each projection (0); with --tp, Megatron's
                   model-parallel RNG (seed + 2718 + TP rank) inside the TP region
  --seed           seed of the init and the batches (0)
  --data           a text file or a directory of them (/usr/share/common-licenses)
  --log-every      steps between loss lines (10)
  --save FILE      write the consolidated model (safetensors, serial names)
  --load FILE      the model to sample from in generate mode
  --generate N     bytes to sample after training or in generate mode (0 after
                   training, 200 in generate mode)
  --prompt TEXT    the text to continue (\"The \")
  --temperature F  sampling temperature, 0 = argmax (0.8)";

/// Parsed flags.
#[derive(Debug, Clone)]
pub struct Args {
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    pub sp: bool,
    pub micro_batches: usize,
    pub steps: usize,
    pub batch_size: usize,
    pub seq: usize,
    pub layers: usize,
    pub width: usize,
    pub heads: usize,
    pub lr: f64,
    pub dropout: f64,
    pub seed: u64,
    pub data: String,
    pub backend: String,
    pub log_every: usize,
    pub save: Option<String>,
    pub load: Option<String>,
    pub generate: usize,
    pub prompt: String,
    pub temperature: f64,
}

impl Args {
    /// Parses the flags; `Err("help")` for `--help`, else a message naming
    /// the bad flag or value.
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            tp: 1,
            pp: 1,
            dp: 1,
            sp: false,
            micro_batches: 0,
            steps: 200,
            batch_size: 16,
            seq: 64,
            layers: 4,
            width: 128,
            heads: 4,
            lr: 3e-3,
            dropout: 0.0,
            seed: 0,
            data: "/usr/share/common-licenses".into(),
            backend: "local".into(),
            log_every: 10,
            save: None,
            load: None,
            generate: 0,
            prompt: "The ".into(),
            temperature: 0.8,
        };
        let mut generate_mode = false;
        let mut it = args.flat_map(|s| match s.split_once('=') {
            Some((k, v)) if s.starts_with("--") => vec![k.to_string(), v.to_string()],
            _ => vec![s],
        });
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--help" | "-h" => return Err("help".into()),
                "--sp" => a.sp = true,
                "generate" => generate_mode = true,
                _ => {
                    let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
                    let bad = |e: &dyn std::fmt::Display| format!("{flag} {v}: {e}");
                    let n = || v.parse::<usize>().map_err(|e| bad(&e));
                    let f = || v.parse::<f64>().map_err(|e| bad(&e));
                    match flag.as_str() {
                        "--tp" => a.tp = n()?,
                        "--pp" => a.pp = n()?,
                        "--dp" => a.dp = n()?,
                        "--micro-batches" => a.micro_batches = n()?,
                        "--steps" => a.steps = n()?,
                        "--batch-size" => a.batch_size = n()?,
                        "--seq" => a.seq = n()?,
                        "--layers" => a.layers = n()?,
                        "--width" => a.width = n()?,
                        "--heads" => a.heads = n()?,
                        "--lr" => a.lr = f()?,
                        "--dropout" => a.dropout = f()?,
                        "--seed" => a.seed = v.parse().map_err(|e| bad(&e))?,
                        "--data" => a.data = v,
                        "--backend" if v == "local" || v == "tcp" => a.backend = v,
                        "--log-every" => a.log_every = n()?.max(1),
                        "--save" => a.save = Some(v),
                        "--load" => a.load = Some(v),
                        "--generate" => a.generate = n()?,
                        "--prompt" => a.prompt = v,
                        "--temperature" => a.temperature = f()?,
                        _ => return Err(format!("unknown flag or value: {flag} {v}")),
                    }
                }
            }
        }
        if a.micro_batches == 0 {
            a.micro_batches = a.pp;
        }
        if [a.tp, a.pp, a.dp, a.steps, a.batch_size, a.seq].contains(&0) {
            return Err("--tp, --pp, --dp, --steps, --batch-size and --seq must be positive".into());
        }
        if !a.batch_size.is_multiple_of(a.dp * a.micro_batches) {
            return Err(format!(
                "--batch-size {} must divide into {} replicas × {} micro-batches",
                a.batch_size, a.dp, a.micro_batches
            ));
        }
        if !(0.0..1.0).contains(&a.dropout) {
            return Err(format!("--dropout {} must be in [0, 1)", a.dropout));
        }
        if a.prompt.is_empty() || a.temperature < 0.0 {
            return Err("--prompt must not be empty and --temperature must be ≥ 0".into());
        }
        if generate_mode {
            if a.load.is_none() {
                return Err("generate needs --load FILE".into());
            }
            if a.generate == 0 {
                a.generate = 200;
            }
        }
        Ok(a)
    }
}
