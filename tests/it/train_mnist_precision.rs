//! `train_mnist --precision bf16|f16`: a few CI-sized steps of mixed
//! precision training lower the loss, and under f16 a forced overflow
//! (`--overflow-at`) is skipped, logged in `metrics.jsonl`, and halves the
//! loss scale; f32 runs are unaffected by the flag's machinery; a 2-stage
//! pipeline trains under both as one process does.

use std::path::{Path, PathBuf};

use crate::train_mnist_example::{cli, pipeline, run};

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
        "5",
        "--train-limit",
        "384",
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
    let d = std::env::temp_dir().join(format!("tessera-precision-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn logged(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn bf16_and_f16_train_and_a_forced_f16_overflow_is_skipped_and_logged() {
    let f32_dir = tmp("f32");
    let f32_run = run::train(&args(&f32_dir, &[])).unwrap();
    for (precision, extra) in [("bf16", &[][..]), ("f16", &["--overflow-at", "7"][..])] {
        let dir = tmp(precision);
        let mut flags = vec!["--precision", precision];
        flags.extend_from_slice(extra);
        let r = run::train(&args(&dir, &flags)).unwrap();
        assert_eq!(r.len(), 2);
        // The loss falls from ln 10 and the second epoch is better than the
        // first, close to the f32 run of the same seed.
        assert!(
            r[0].train_loss < 2.3 && r[1].train_loss < r[0].train_loss,
            "{precision}: {r:?}"
        );
        assert!(r[1].test_acc > 30.0, "{precision}: {r:?}");
        assert!(
            (r[1].train_loss - f32_run[1].train_loss).abs() < 0.15,
            "{precision}: {r:?} vs f32 {f32_run:?}"
        );
        let log = logged(&dir);
        if precision == "f16" {
            // Step 7 (of 6 per epoch: epoch 2's second) overflowed on
            // purpose. Any other skipped step is the scaler's own start-up.
            assert!(r[1].skipped_steps >= 1, "{r:?}");
            let scale = log[1]["loss_scale"].as_f64().unwrap();
            assert!(scale <= 32768.0, "the scale backed off: {scale}");
        } else {
            assert_eq!(r[0].skipped_steps + r[1].skipped_steps, 0);
            assert_eq!(
                log[1]["loss_scale"].as_f64(),
                Some(1.0),
                "bf16 needs no loss scaling"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
    assert_eq!(f32_run[0].skipped_steps + f32_run[1].skipped_steps, 0);
    std::fs::remove_dir_all(f32_dir).unwrap();
}

#[test]
fn bad_precision_values_and_unsupported_modes_are_errors() {
    let parse = |v: &[&str]| cli::Args::parse(v.iter().map(|s| s.to_string()));
    let err = parse(&["--precision", "f8"]).unwrap_err();
    assert!(err.contains("--precision") && err.contains("f8"), "{err}");
    let err = parse(&["--precision", "f16", "--optim", "onebit-adam"]).unwrap_err();
    assert!(err.contains("--precision f16"), "{err}");
    assert!(parse(&["--precision", "bf16", "--pipeline-stages", "2"]).is_ok());
    for precision in ["f32", "bf16"] {
        let err = parse(&["--precision", precision, "--overflow-at", "3"]).unwrap_err();
        assert!(err.contains("--overflow-at") && err.contains("f16"), "{err}");
    }
    assert!(parse(&["--precision", "bf16", "--ddp"]).is_ok());
    assert_eq!(
        parse(&["--precision", "f16"]).unwrap().precision.autocast_dtype(),
        Some(tessera::tensor::DType::F16)
    );
}

/// `--pipeline-stages 2` (1F1B, 4 micro-batches) under bf16 and f16: every
/// stage autocasts, and the run's losses follow the single-process run of
/// the same precision (the micro-batches sum the same gradients in another
/// order); the log records the precision and the loss scale.
#[test]
fn a_pipeline_trains_under_bf16_and_f16_as_one_process_does() {
    for precision in ["bf16", "f16"] {
        let one = tmp(&format!("one-{precision}"));
        let single = run::train(&args(&one, &["--precision", precision])).unwrap();
        let dir = tmp(&format!("pipe-{precision}"));
        let pipe_flags = [
            "--precision",
            precision,
            "--pipeline-stages",
            "2",
            "--micro-batches",
            "4",
            "--schedule",
            "1f1b",
        ];
        let r = pipeline::train(&args(&dir, &pipe_flags)).unwrap();
        assert_eq!(r.len(), 2);
        assert!(
            r[0].train_loss < 2.3 && r[1].train_loss < r[0].train_loss,
            "{precision}: {r:?}"
        );
        for (p, s) in r.iter().zip(&single) {
            assert!(
                (p.train_loss - s.train_loss).abs() < 0.05,
                "{precision}: pipeline {r:?} vs one process {single:?}"
            );
        }
        let log = logged(&dir);
        assert_eq!(log[1]["precision"].as_str(), Some(precision));
        let scale = log[1]["loss_scale"].as_f64().unwrap();
        match precision {
            "bf16" => assert_eq!(scale, 1.0, "bf16 needs no loss scaling"),
            _ => assert!(scale > 1.0, "f16 scales the loss: {scale}"),
        }
        std::fs::remove_dir_all(one).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
