//! `attention_b8h6s256d64`: scaled dot-product attention forward + backward
//! on q, k, v of `[8, 6, 256, 64]` f32 (loss = sum of the output), for the
//! fused kernel and the composed one (matmul, softmax, matmul: the path
//! before the fused kernel), and, when `TESSERA_TORCH_PYTHON` names a
//! Python with torch, `torch.nn.functional.scaled_dot_product_attention`
//! (`autograd/benches/attention_torch.py`) with the throughput ratio
//! `tessera/torch` (torch's ms over ours: above 1 is faster than PyTorch).
//!
//! Each figure is the best of 3 rounds of N iterations after 3 warm-up
//! ones, all cores; both implementations are measured back to back.
//!
//! `cargo bench -p tessera-autograd --bench attention [-- --iters N]`

use std::process::Command;
use std::time::Instant;

use tessera_autograd::{
    scaled_dot_product_attention, scaled_dot_product_attention_composite, AttnOptions, Var,
};
use tessera_tensor::{manual_seed, DType, Result, Tensor};

const NAME: &str = "attention_b8h6s256d64";
const SHAPE: [usize; 4] = [8, 6, 256, 64];

type Sdpa = fn(&Var, &Var, &Var, &AttnOptions<'_>) -> Result<Var>;

/// The best ms per forward + backward of `f` over 3 rounds of `iters`.
fn measure(f: Sdpa, iters: usize) -> f64 {
    manual_seed(0);
    let leaf = || Var::leaf(Tensor::randn(&SHAPE, DType::F32).expect("randn"));
    let (q, k, v) = (leaf(), leaf(), leaf());
    let step = || {
        let y = f(&q, &k, &v, &AttnOptions::default()).expect("attention");
        y.sum(&[], false).and_then(|s| s.backward()).expect("backward");
    };
    for _ in 0..3 {
        step();
    }
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                step();
            }
            t.elapsed().as_secs_f64() * 1e3 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let iters: usize = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# {} threads, {iters} iterations a round; load average at start: {}",
        rayon::current_num_threads(),
        load.trim()
    );
    let fused = measure(scaled_dot_product_attention, iters);
    println!("bench\t{NAME}\ttessera\tfwd_bwd\t{fused:.3}\tms");
    let composed = measure(scaled_dot_product_attention_composite, iters);
    println!("bench\t{NAME}\ttessera_composite\tfwd_bwd\t{composed:.3}\tms");
    let Ok(py) = std::env::var("TESSERA_TORCH_PYTHON") else {
        println!("# TESSERA_TORCH_PYTHON not set: skipped PyTorch");
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/attention_torch.py");
    match Command::new(&py).args([script, &iters.to_string()]).output() {
        Ok(o) if o.status.success() => {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            print!("{out}");
            let theirs = out
                .lines()
                .find(|l| l.contains("\tfwd_bwd\t"))
                .and_then(|l| l.split('\t').nth(4)?.parse::<f64>().ok());
            if let Some(t) = theirs {
                println!("bench\t{NAME}\ttessera/torch\tratio\t{:.3}\tx", t / fused);
            }
        }
        Ok(o) => println!("# torch failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => println!("# could not run {py}: {e}"),
    }
}
