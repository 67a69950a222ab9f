//! Training-step throughput: `train_step_mlp` (784-512-512-10, ReLU) and
//! `train_step_cnn` (the MNIST CNN of `examples/train_mnist.rs`) with SGD
//! and momentum, and `train_step_vit` (a CIFAR-sized pre-norm ViT built from
//! nn layers, see [`Vit`]) with AdamW; batch 128, f32, cross-entropy, all
//! cores. Prints samples/s and the peak resident memory of each workload as
//! bench lines, and, when `TESSERA_TORCH_PYTHON` names a Python with torch,
//! the same figures for PyTorch eager (`benches/train_step_torch.py`) and
//! the ratio. The ViT is also run on one thread, for its thread scaling.
//! `train_step_{mlp,cnn}_bf16` are the MLP and CNN steps under bf16
//! autocast (f32 parameters, matmul/linear/conv in bf16, the loss in f32),
//! beside PyTorch's `torch.autocast("cpu", torch.bfloat16)` step.
//! `train_step_resnet18_cifar` is torchvision's ResNet-18 with the CIFAR
//! stem (3×3 stride-1 convolution, no max-pool) on 3×32×32 inputs, 10
//! classes, SGD with momentum, in train mode (batch statistics).
//!
//! Each figure is the best of 3 rounds of N steps, each after 3 warm-up steps:
//! the machines we measure on are shared, and the best round is the one
//! least disturbed by other load. The two implementations' rounds of a
//! workload alternate (ours, then PyTorch's, three times), so a spell of
//! the machine running slow or fast falls on both sides alike.
//!
//! `cargo bench --bench train_step [-- --steps N] [--only WORKLOAD] [--profile DIR]`
//!
//! `--profile DIR` also profiles one step of each workload with
//! [`tessera::profile`], prints its op table (as `#` lines) and writes
//! `DIR/<workload>.trace.json` (Chrome trace format).

use std::time::Instant;

use tessera::autograd::{autocast, CrossEntropyOptions, Parameter, Target, Var};
use tessera::nn::models::{mnist_cnn, mnist_mlp, ResNet, ResNetConfig};
use tessera::nn::{
    init, Activation, Conv2d, Conv2dOptions, LayerNorm, Linear, Module, TransformerEncoderLayer,
    TransformerOptions,
};
use tessera::optim::{AdamW, AdamWOptions, Optimizer, Sgd, SgdOptions};
use tessera::tensor::{manual_seed, DType, Result, Tensor};

#[path = "../tensor/benches/peak/twin.rs"]
mod twin;

use twin::Twin;

const BATCH: usize = 128;
const ROUNDS: usize = 3;

/// The ViT of `train_step_vit`: 3×32×32 inputs cut into 4×4 patches (64
/// tokens and a class token), width 192, 6 pre-norm blocks of 3-head
/// `MultiheadAttention` and a GELU MLP of 768, a final LayerNorm and a
/// 10-class head on the class token; 2,693,578 parameters, as its PyTorch
/// twin (`nn.TransformerEncoderLayer(norm_first=True)` blocks).
#[derive(Module)]
struct Vit {
    patch: Conv2d,
    cls_token: Parameter,
    pos_embed: Parameter,
    blocks: Vec<TransformerEncoderLayer>,
    norm: LayerNorm,
    head: Linear,
}

/// The parameter count of the ViT of the issue (and of the PyTorch twin).
const VIT_PARAMETERS: usize = 2_693_578;

/// The parameter count of torchvision's `resnet18(num_classes=10)` with the
/// CIFAR stem (and of the PyTorch twin).
const RESNET18_CIFAR_PARAMETERS: usize = 11_173_962;

impl Vit {
    fn new() -> Result<Vit> {
        let (dim, tokens) = (192, 65);
        let block = TransformerOptions {
            dim_feedforward: 768,
            dropout: 0.0,
            activation: Activation::Gelu,
            norm_first: true,
            ..Default::default()
        };
        let vit = Vit {
            patch: Conv2d::new(3, dim, 4, Conv2dOptions::default().stride(4))?,
            cls_token: Parameter::new(Tensor::zeros(&[1, 1, dim], DType::F32)?),
            pos_embed: Parameter::new(Tensor::zeros(&[1, tokens, dim], DType::F32)?),
            blocks: (0..6)
                .map(|_| TransformerEncoderLayer::new(dim, 3, block))
                .collect::<Result<_>>()?,
            norm: LayerNorm::new(&[dim], 1e-5, true, true)?,
            head: Linear::new(dim, 10, true)?,
        };
        init::normal_(&vit.cls_token, 0.0, 0.02)?;
        init::normal_(&vit.pos_embed, 0.0, 0.02)?;
        Ok(vit)
    }
}

impl Module for Vit {
    fn forward(&self, x: &Var) -> Result<Var> {
        let p = self.patch.forward(x)?; // [B, D, 8, 8]
        let (b, d) = (p.shape()[0], p.shape()[1]);
        let p = p.reshape([b, d, 64])?.transpose(1, 2)?;
        let cls = self.cls_token.var()?.expand([b, 1, d])?;
        let mut h = Var::cat(&[cls, p], 1)?.add(&self.pos_embed.var()?)?;
        for blk in &self.blocks {
            h = blk.forward(&h)?;
        }
        self.head.forward(&self.norm.forward(&h)?.select(1, 0)?)
    }
}

fn main() {
    // The steps run on this thread as worker 0 of the pool, as PyTorch's
    // run on its OpenMP thread 0.
    tessera::tensor::init_thread_pool(None).expect("no pool before main");
    let steps: usize = std::env::args()
        .skip_while(|a| a != "--steps")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# {} threads, batch {BATCH}, {steps} timed steps; load average at start: {}",
        rayon::current_num_threads(),
        load.trim()
    );
    let torch_python = std::env::var("TESSERA_TORCH_PYTHON").ok();
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let profile_dir = std::env::args().skip_while(|a| a != "--profile").nth(1);
    let workloads: [(&str, &[usize]); 6] = [
        ("train_step_mlp", &[BATCH, 784]),
        ("train_step_cnn", &[BATCH, 1, 28, 28]),
        ("train_step_vit", &[BATCH, 3, 32, 32]),
        ("train_step_mlp_bf16", &[BATCH, 784]),
        ("train_step_cnn_bf16", &[BATCH, 1, 28, 28]),
        ("train_step_resnet18_cifar", &[BATCH, 3, 32, 32]),
    ];
    for (name, input) in workloads {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let mut twin = match &torch_python {
            Some(py) => TorchTwin::start(py, name, steps),
            None => {
                println!("# TESSERA_TORCH_PYTHON not set: skipped PyTorch eager for {name}");
                None
            }
        };
        reset_peak_rss();
        let mut their_round = || {
            if let Some(t) = twin.as_mut() {
                t.round();
            }
        };
        let (rate, phases) = run_workload(name, input, steps, profile_dir.as_deref(), &mut their_round);
        let rss = peak_rss_mib();
        println!("bench\t{name}\ttessera\tthroughput\t{rate:.1}\tsamples/s");
        println!("bench\t{name}\ttessera\tpeak_rss\t{rss:.1}\tMiB");
        println!(
            "# {name} tessera phases (ms per step, best round): forward {:.2}, loss {:.2}, backward {:.2}, optimizer {:.2}, drop {:.2}",
            phases[0], phases[1], phases[2], phases[3], phases[4]
        );
        if let Some(t) = twin {
            t.report(name, rate);
        }
        if name == "train_step_vit" {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("a 1-thread pool");
            let (one, _) = pool.install(|| run_workload(name, input, steps, None, &mut || ()));
            println!("bench\t{name}\ttessera_1thread\tthroughput\t{one:.1}\tsamples/s");
            println!("bench\t{name}\ttessera\tthread_scaling\t{:.3}\tx", rate / one);
        }
    }
}

/// Builds workload `name`'s model and optimizer (fresh, seeded) and
/// measures it as [`measure`] does, calling `between` after each timed
/// round; a `_bf16` suffix runs the model's forward and loss under bf16
/// autocast.
fn run_workload(
    name: &str,
    input: &[usize],
    steps: usize,
    profile_dir: Option<&str>,
    between: &mut dyn FnMut(),
) -> (f64, [f64; 5]) {
    manual_seed(0);
    let (model_name, low) = match name.strip_suffix("_bf16") {
        Some(base) => (base, Some(DType::BF16)),
        None => (name, None),
    };
    let sgd = SgdOptions {
        lr: 0.01,
        momentum: 0.9,
        ..Default::default()
    };
    match model_name {
        "train_step_mlp" => {
            let model = mnist_mlp(&[512, 512]).expect("model builds");
            let mut opt = Sgd::new(model.parameters(), sgd).expect("optimizer");
            measure(name, &model, &mut opt, input, steps, low, profile_dir, between)
        }
        "train_step_cnn" => {
            let model = mnist_cnn().expect("model builds");
            let mut opt = Sgd::new(model.parameters(), sgd).expect("optimizer");
            measure(name, &model, &mut opt, input, steps, low, profile_dir, between)
        }
        "train_step_resnet18_cifar" => {
            let cfg = ResNetConfig::resnet18().small_input().num_classes(10);
            let model = ResNet::new(&cfg).expect("model builds");
            assert_eq!(model.num_parameters(), RESNET18_CIFAR_PARAMETERS);
            let mut opt = Sgd::new(model.parameters(), sgd).expect("optimizer");
            measure(name, &model, &mut opt, input, steps, low, profile_dir, between)
        }
        _ => {
            let model = Vit::new().expect("model builds");
            assert_eq!(model.num_parameters(), VIT_PARAMETERS, "the issue's ViT");
            let hyper = AdamWOptions {
                lr: 1e-3,
                weight_decay: 0.05,
                ..Default::default()
            };
            let mut opt = AdamW::new(model.parameters(), hyper).expect("optimizer");
            measure(name, &model, &mut opt, input, steps, low, profile_dir, between)
        }
    }
}

/// Samples per second of the best of [`ROUNDS`] rounds of `steps` training
/// steps on random inputs of `shape`, each after 3 warm-up steps, `between`
/// called after each (PyTorch's round of the workload); and the time
/// per step of its phases (forward, loss, backward, optimizer step, freeing
/// the graph and gradients) in ms, from the best of [`ROUNDS`] further
/// rounds timed phase by phase. With `low`, the forward pass and the loss
/// run under autocast to that dtype. With `profile_dir`, then profiles one
/// step (see the module docs).
#[allow(clippy::too_many_arguments)]
fn measure(
    name: &str,
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    shape: &[usize],
    steps: usize,
    low: Option<DType>,
    profile_dir: Option<&str>,
    between: &mut dyn FnMut(),
) -> (f64, [f64; 5]) {
    let amp = |f: &mut dyn FnMut() -> Result<Var>| match low {
        Some(d) => autocast(d, f).unwrap(),
        None => f().unwrap(),
    };
    let x = Var::constant(Tensor::randn(shape, DType::F32).unwrap());
    let y = Tensor::randint(0, 10, &[BATCH], DType::I64).unwrap();
    let ce = CrossEntropyOptions::default();
    let mut step = || {
        let loss = amp(&mut || model.forward(&x)?.cross_entropy(Target::Indices(&y), &ce));
        opt.step(&loss.backward().unwrap()).unwrap();
    };
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        // Warm-up steps first: after an idle spell (the other side's round)
        // the first steps run slow (PyTorch's MLP step at 18k samples/s
        // against 28k after 1.5 s idle on the 2-core VM).
        for _ in 0..3 {
            step();
        }
        let t = Instant::now();
        for _ in 0..steps {
            step();
        }
        best = best.min(t.elapsed().as_secs_f64());
        between();
    }
    if let Some(dir) = profile_dir {
        let ((), prof) = tessera::profile(&mut step);
        for l in prof.table(40).lines() {
            println!("# {name} profile: {l}");
        }
        let path = format!("{dir}/{name}.trace.json");
        match prof.write_chrome_trace(&path) {
            Ok(()) => println!("# {name} profile: Chrome trace written to {path}"),
            Err(e) => println!("# {name} profile: {e}"),
        }
    }
    let mut phases = [f64::INFINITY; 5];
    for _ in 0..ROUNDS {
        let mut round = [0.0f64; 5];
        for _ in 0..steps {
            let mut t = Instant::now();
            let mut lap = |k: usize| {
                round[k] += t.elapsed().as_secs_f64();
                t = Instant::now();
            };
            let out = amp(&mut || model.forward(&x));
            lap(0);
            let loss = amp(&mut || out.cross_entropy(Target::Indices(&y), &ce));
            lap(1);
            let grads = loss.backward().unwrap();
            lap(2);
            opt.step(&grads).unwrap();
            lap(3);
            drop((out, loss, grads));
            lap(4);
        }
        if round.iter().sum::<f64>() < phases.iter().sum::<f64>() {
            phases = round;
        }
    }
    let per_step = |s: f64| s * 1e3 / steps as f64;
    ((steps * BATCH) as f64 / best, phases.map(per_step))
}

/// Resets VmHWM (Linux ≥ 4.0), so each workload reports its own peak.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// VmHWM, the peak resident set size, in MiB (0 where unavailable).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The PyTorch twin of one workload (`benches/train_step_torch.py` in
/// `serve` mode), in a process of its own, timing a round when asked.
struct TorchTwin {
    twin: Twin,
    rounds: usize,
}

impl TorchTwin {
    /// Starts the twin of `name` under `py` and waits until it has built
    /// its model and warmed up; `None`, saying why, when it does not start.
    fn start(py: &str, name: &str, steps: usize) -> Option<TorchTwin> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/train_step_torch.py");
        let twin = Twin::start(py, &[script, name, &steps.to_string(), "serve"])?;
        Some(TorchTwin { twin, rounds: 0 })
    }

    /// Has the twin time one round (its figure is reported at the end);
    /// a twin that has stopped is left alone.
    fn round(&mut self) {
        if self.twin.ask("round").is_some() {
            self.rounds += 1;
        }
    }

    /// Ends the twin's rounds (it then times its phases) and prints its
    /// lines and our ratio to its best round (`rate` is ours).
    fn report(self, name: &str, rate: f64) {
        let out = match self.twin.finish() {
            Some(out) if self.rounds > 0 => out,
            _ => {
                println!("# torch {name} ran no round");
                return;
            }
        };
        print!("{out}");
        let theirs = out
            .lines()
            .filter(|l| l.contains("\tthroughput\t"))
            .find_map(|l| l.split('\t').nth(4).and_then(|v| v.parse::<f64>().ok()));
        if let Some(t) = theirs {
            println!("bench\t{name}\ttessera/torch\tratio\t{:.3}\tx", rate / t);
        }
    }
}
