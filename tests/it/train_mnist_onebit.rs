//! `train_mnist --ddp --optim onebit-adam|onebit-lamb|zero-one-adam`: each
//! compressed optimizer trains the CNN on two thread ranks past its
//! warm-up (a 512-image slice, 16 steps, freeze at step 4), and the flags
//! are checked.

use crate::train_mnist_example::{cli, data_parallel};

fn args(optim: &str, extra: &[&str]) -> Result<cli::Args, String> {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let out = std::env::temp_dir().join(format!("tessera-onebit-{}-{optim}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let base = [
        "--ddp",
        "--world",
        "2",
        "--optim",
        optim,
        "--freeze-step",
        "4",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--lr",
        "0.002",
        "--train-limit",
        "512",
        "--test-limit",
        "500",
        "--data",
        data,
        "--out",
    ];
    let all = base
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string()])
        .chain(extra.iter().map(|s| s.to_string()));
    cli::Args::parse(all)
}

#[test]
fn each_compressed_optimizer_trains_past_its_warm_up() {
    for optim in ["onebit-adam", "onebit-lamb", "zero-one-adam"] {
        let records = data_parallel::train(&args(optim, &["--local-step-scaler", "2"]).unwrap()).unwrap();
        assert_eq!(records.len(), 2, "{optim}");
        let (first, last) = (&records[0], &records[1]);
        assert!(
            last.train_loss.is_finite() && last.train_loss < first.train_loss && last.train_loss < 2.0,
            "{optim}: {records:?}"
        );
        assert!(last.test_acc > 30.0, "{optim}: {records:?}");
    }
}

#[test]
fn compressed_optimizer_flags_are_checked() {
    assert!(args("zero-one-adam", &["--local-step-scaler", "0"]).is_err());
    assert!(args("zero-two-adam", &[]).is_err());
    let single = cli::Args::parse(["--optim", "zero-one-adam"].iter().map(|s| s.to_string()));
    assert!(single.unwrap_err().contains("needs --ddp"));
}
