//! `examples/train_mnist`: the same seed gives the same metrics, and a run
//! interrupted after an epoch and continued with `--resume` ends with
//! bit-identical weights and the same metrics as an uninterrupted run. The
//! example's modules are compiled into this test; it trains on a 512-image
//! slice of `datasets/mnist` to stay short.

#[allow(dead_code)]
#[path = "../../examples/train_mnist/cli.rs"]
mod cli;
#[path = "../../examples/train_mnist/progress.rs"]
pub(crate) mod progress;
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

    // Every epoch logged once, also across the interruption.
    let epochs = |d: &Path| -> Vec<u64> {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["epoch"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(epochs(&a), [1, 2]);
    assert_eq!(epochs(&b), [1, 2]);

    let wa = std::fs::read(a.join("model.safetensors")).unwrap();
    let wb = std::fs::read(b.join("model.safetensors")).unwrap();
    assert!(wa == wb, "resumed weights differ from the uninterrupted run's");
    for d in [a, a2, b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_kill_between_checkpoint_and_log_still_logs_each_epoch_once() {
    let (a, c) = (tmp("full-log"), tmp("killed"));
    let full = run::train(&args(&a, &[])).unwrap();
    run::train(&args(&c, &["--stop-after", "1"])).unwrap();
    // The checkpoint of epoch 1 was saved but the process died before its
    // log line was written.
    std::fs::write(c.join("metrics.jsonl"), "").unwrap();
    let rest = run::train(&args(&c, &["--resume"])).unwrap();
    assert_eq!(rest, full[1..]);
    let log = std::fs::read_to_string(c.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{log}");
    for (line, record) in lines.iter().zip(&full) {
        assert_eq!(line["epoch"], record.epoch, "{log}");
        assert_eq!(line["test_acc"], record.test_acc, "{log}");
    }
    // A corrupted checkpoint is refused, naming the file.
    let ck = c.join("checkpoint.safetensors");
    let mut bytes = std::fs::read(&ck).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&ck, bytes).unwrap();
    let err = run::train(&args(&c, &["--resume"])).unwrap_err().to_string();
    assert!(err.contains("checkpoint.safetensors"), "{err}");
    for d in [a, c] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn bad_arguments_are_named() {
    let parse = |a: &[&str]| cli::Args::parse(a.iter().map(|s| s.to_string())).unwrap_err();
    assert_eq!(parse(&["--frobnicate"]), "unknown flag --frobnicate");
    assert_eq!(parse(&["--frobnicate", "3"]), "unknown flag --frobnicate");
    assert_eq!(parse(&["--epochs"]), "--epochs needs a value");
    // An output path that is a file: the error names it.
    let file = tmp("out-is-a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = run::train(&args(&file, &[])).unwrap_err().to_string();
    assert!(e.contains(&file.display().to_string()), "{e}");
    let _ = std::fs::remove_file(&file);
}
