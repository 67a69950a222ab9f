//! `examples/train` (the timm-style trainer): a small ViT with drop path,
//! EMA and gradient clipping interrupted after an epoch and continued with
//! `--resume` ends with bit-identical weights and EMA weights, and the
//! same epoch metrics, as an uninterrupted run. The example's modules are
//! compiled into this test; it trains on 256 Fashion-MNIST-layout images
//! of `datasets/mnist` to stay short.

#[allow(dead_code)]
#[path = "../../examples/train/cli.rs"]
mod cli;
#[path = "../../examples/train/run.rs"]
mod run;
#[path = "../../examples/train/zoo.rs"]
mod zoo;

use std::path::{Path, PathBuf};

// The progress bar is train_mnist's, compiled once for the test binary.
use super::train_mnist_example::{common, progress};

use tessera::tensor::StateDict;

fn args(out: &Path, extra: &[&str]) -> cli::Args {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let base = [
        "--model",
        "vit_tiny_patch16_224",
        "--depth",
        "1",
        "--embed-dim",
        "24",
        "--num-heads",
        "3",
        "--patch-size",
        "7",
        "--drop-path",
        "0.2",
        "--ema-decay",
        "0.9",
        "--clip-grad",
        "1.0",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--log-every",
        "2",
        "--train-limit",
        "256",
        "--test-limit",
        "200",
        "--data",
        data,
    ];
    let out = ["--out".to_string(), out.display().to_string()];
    let all = base.iter().chain(extra).map(|s| s.to_string()).chain(out);
    cli::Args::parse(all).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The `"epoch"` lines of the metrics log, without their timings.
fn epochs(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "epoch")
        .map(|mut v| {
            let o = v.as_object_mut().unwrap();
            o.remove("elapsed_s");
            o.remove("samples_per_s");
            v
        })
        .collect()
}

#[test]
fn resume_gives_identical_weights_ema_and_metrics() {
    let (a, b) = (tmp("a"), tmp("b"));
    run::train(&args(&a, &[])).unwrap();
    run::train(&args(&b, &["--stop-after", "1"])).unwrap();
    assert!(!b.join("model.safetensors").exists());
    run::train(&args(&b, &["--resume"])).unwrap();

    let (ea, eb) = (epochs(&a), epochs(&b));
    assert_eq!(ea.len(), 2);
    assert_eq!(ea, eb, "epoch metrics");
    assert!(ea[1]["ema_test_acc"].is_number());
    let steps = std::fs::read_to_string(a.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .count();
    assert_eq!(steps, 4, "a step line every 2 of 8 steps");
    for dir in [&a, &b] {
        let report = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(
            report.contains(r#"data-plot="Loss" data-series-points="4,2""#),
            "the report plots the 4 logged steps and 2 epochs of the run"
        );
    }
    // Values, not file bytes: the safetensors header's metadata map has no
    // fixed order.
    for file in ["model.safetensors", "ema.safetensors"] {
        let wa = StateDict::load(a.join(file)).unwrap();
        let wb = StateDict::load(b.join(file)).unwrap();
        assert!(wa.keys().eq(wb.keys()), "{file}: keys");
        for ((name, x), (_, y)) in wa.iter().zip(wb.iter()) {
            let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
            assert!(
                x == y,
                "{file}: {name} differs between the resumed and the uninterrupted run"
            );
        }
    }
    for d in [a, b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn unknown_models_and_bad_flags_are_errors() {
    let out = tmp("c");
    let mut a = args(&out, &[]);
    a.model = "resnet7".into();
    let err = run::train(&a).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("resnet7"), "{err}");
    assert!(cli::Args::parse(["--smoothing", "1.5"].iter().map(|s| s.to_string())).is_err());
    assert!(cli::Args::parse(["--bogus", "1"].iter().map(|s| s.to_string())).is_err());
    let _ = std::fs::remove_dir_all(out);
}
