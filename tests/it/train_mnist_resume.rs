//! `examples/train_mnist`: the same seed gives the same metrics, and a run
//! interrupted after an epoch and continued with `--resume` ends with
//! bit-identical weights and the same metrics as an uninterrupted run. The
//! example's modules are compiled into this test; it trains on a 512-image
//! slice of `datasets/mnist` to stay short.

#[allow(dead_code)]
#[path = "../../examples/train_mnist/cli.rs"]
mod cli;
#[path = "../../examples/train_mnist/progress.rs"]
mod progress;
#[path = "../../examples/train_mnist/run.rs"]
mod run;

use std::path::{Path, PathBuf};

fn args(out: &Path, extra: &[&str]) -> cli::Args {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let base = [
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--seed",
        "3",
        "--train-limit",
        "512",
        "--test-limit",
        "500",
        "--data",
        data,
    ];
    let out = ["--out".to_string(), out.display().to_string()];
    let all = base.iter().chain(extra).map(|s| s.to_string()).chain(out);
    cli::Args::parse(all).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-resume-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn same_seed_same_metrics_and_resume_gives_identical_weights() {
    let (a, a2, b) = (tmp("a"), tmp("a2"), tmp("b"));
    let full = run::train(&args(&a, &[])).unwrap();
    assert_eq!(full.len(), 2);
    assert!(full[1].test_acc > 50.0, "{full:?}");
    let again = run::train(&args(&a2, &[])).unwrap();
    assert_eq!(full, again, "same seed, same metrics");

    let mut resumed = run::train(&args(&b, &["--stop-after", "1"])).unwrap();
    assert_eq!(resumed.len(), 1);
    assert!(!b.join("model.safetensors").exists());
    resumed.extend(run::train(&args(&b, &["--resume"])).unwrap());
    assert_eq!(resumed, full, "resumed metrics");

    let wa = std::fs::read(a.join("model.safetensors")).unwrap();
    let wb = std::fs::read(b.join("model.safetensors")).unwrap();
    assert!(wa == wb, "resumed weights differ from the uninterrupted run's");
    for d in [a, a2, b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
