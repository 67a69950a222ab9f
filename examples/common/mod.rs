//! What the training examples (`train_mnist`, `train`) share: the in-memory
//! split, its normalisation statistics, accuracy, the metrics log, and data
//! parallelism.

pub(crate) mod ddp;
pub(crate) mod precision;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use tessera::autograd::{no_grad, Var};
use tessera::nn::Module;
use tessera::tensor::{Device, Tensor};

use precision::Precision;

pub(crate) type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A split held in memory: normalized f32 images `[N, C, H, W]` and i64
/// labels `[N]`.
pub(crate) struct Split {
    pub images: Tensor,
    pub labels: Tensor,
}

/// The mean and standard deviation of the pixels scaled to [0, 1].
pub(crate) fn pixel_stats(pixels: &[u8]) -> (f64, f64) {
    let mut hist = [0u64; 256];
    pixels.iter().for_each(|&p| hist[p as usize] += 1);
    let n = pixels.len().max(1) as f64;
    let mean = hist
        .iter()
        .enumerate()
        .map(|(v, &c)| v as f64 / 255.0 * c as f64)
        .sum::<f64>()
        / n;
    let var = hist
        .iter()
        .enumerate()
        .map(|(v, &c)| (v as f64 / 255.0 - mean).powi(2) * c as f64)
        .sum::<f64>()
        / n;
    (mean, var.sqrt().max(1e-6))
}

/// How many rows of `logits` have their argmax at the label.
pub(crate) fn count_correct(logits: &Tensor, labels: &Tensor) -> tessera::tensor::Result<usize> {
    let pred = logits.argmax(Some(1), false)?.to_vec::<i64>()?;
    let y = labels.to_vec::<i64>()?;
    Ok(pred.iter().zip(&y).filter(|(a, b)| a == b).count())
}

/// Accuracy of `model` (already in eval mode, run at `precision`) on `split`, in batches of
/// `batch` moved to the model's device.
pub(crate) fn evaluate(
    model: &dyn Module,
    split: &Split,
    batch: usize,
    precision: Precision,
) -> BoxResult<f64> {
    let n = split.labels.shape()[0];
    let device = match model.parameters().first() {
        Some(p) => p.tensor()?.device(),
        None => Device::Cpu,
    };
    let mut correct = 0;
    for start in (0..n).step_by(batch) {
        let len = batch.min(n - start);
        let x = Var::constant(split.images.narrow(0, start, len)?.to_device(device)?);
        let logits = no_grad(|| precision.run(|| model.forward(&x)))?;
        correct += count_correct(logits.tensor(), &split.labels.narrow(0, start, len)?)?;
    }
    Ok(correct as f64 / n.max(1) as f64)
}

/// Appends `line` and a newline to the file at `path`, creating it.
pub(crate) fn append_line(path: &Path, line: &str) -> BoxResult<()> {
    let mut log = OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(log, "{line}")?;
    Ok(())
}

/// The CPU's model name as `/proc/cpuinfo` gives it, else the architecture.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split_once(':')?.1.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// Writes the HTML report of the metrics log at `log` to `out`, so a run
/// has its plots after every epoch, interrupted or not.
pub(crate) fn write_report(log: &Path, out: &Path) -> BoxResult<()> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    let run = tessera_report::Run::parse(&text)?;
    let html = tessera_report::render(&run, &log.display().to_string())?;
    std::fs::write(out, html).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok(())
}
