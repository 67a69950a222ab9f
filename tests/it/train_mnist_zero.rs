//! `examples/train_mnist --zero S --backend local --world 2`: ZeRO-3 trains
//! to the same bits as ZeRO-2 (with two ranks every reduction is one
//! commutative sum of pre-divided halves, so the stages must agree
//! exactly), and the flag is validated.

use crate::train_mnist_example::{cli, data_parallel};
use std::path::{Path, PathBuf};

/// Four steps of the MNIST CNN over 2 local ranks with ZeRO stage `stage`.
fn args(out: &Path, stage: &str) -> Result<cli::Args, String> {
    args_with(out, &["--zero", stage])
}

/// Four steps of the MNIST CNN over 2 local ranks, then `extra`.
fn args_with(out: &Path, extra: &[&str]) -> Result<cli::Args, String> {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let flags = [
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--seed",
        "5",
        "--train-limit",
        "256",
        "--test-limit",
        "100",
        "--backend",
        "local",
        "--world",
        "2",
        "--data",
        data,
        "--out",
    ];
    let all = flags
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string()])
        .chain(extra.iter().map(|s| s.to_string()));
    cli::Args::parse(all)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-zero-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn zero_3_trains_to_the_bits_of_zero_2_and_saves_a_loadable_model() {
    let mut records = Vec::new();
    for stage in ["2", "3"] {
        let out = tmp(stage);
        let got = data_parallel::train(&args(&out, stage).unwrap()).unwrap();
        let model = tessera::nn::models::mnist_cnn().unwrap();
        let sd = tessera::tensor::StateDict::load(out.join("model.safetensors")).unwrap();
        tessera::nn::Module::load_state_dict(&model, &sd, true).unwrap();
        records.push((got, sd));
        std::fs::remove_dir_all(&out).unwrap();
    }
    let (two, three) = (&records[0], &records[1]);
    assert_eq!(two.0.len(), 1);
    assert_eq!(two.0[0].train_loss.to_bits(), three.0[0].train_loss.to_bits());
    assert_eq!(two.0[0].test_acc, three.0[0].test_acc);
    for (k, t) in two.1.iter() {
        assert_eq!(
            three.1.tensor(k).unwrap().to_vec::<f32>().unwrap(),
            t.to_vec::<f32>().unwrap(),
            "{k}"
        );
    }
}

#[test]
fn zero_stages_beyond_3_are_refused() {
    let e = args(&tmp("bad"), "4").unwrap_err();
    assert!(e.contains("1, 2 or 3"), "{e}");
}

/// Mixed precision under data parallelism: with f16 autocast and loss
/// scaling (and with bf16), DDP, ZeRO-2 and ZeRO-3 train to the same bits
/// (two ranks: every reduction is one exact sum of halves, and the scaler
/// judges the reduced gradients, so it decides alike everywhere), with
/// finite losses and weights that differ from the f32 run's; f16 with a
/// compressed optimizer and --overflow-at beyond one process are refused.
#[test]
fn mixed_precision_trains_alike_under_ddp_and_every_zero_stage() {
    let f32_run = {
        let out = tmp("f32");
        data_parallel::train(&args(&out, "2").unwrap()).unwrap();
        let sd = tessera::tensor::StateDict::load(out.join("model.safetensors")).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        sd
    };
    for precision in ["f16", "bf16"] {
        let mut runs = Vec::new();
        for mode in [&["--zero", "2"][..], &["--zero", "3"], &["--ddp"]] {
            let out = tmp(&format!("{precision}-{}", mode.join("")));
            let flags: Vec<&str> = mode.iter().copied().chain(["--precision", precision]).collect();
            let got = data_parallel::train(&args_with(&out, &flags).unwrap()).unwrap();
            assert!(got[0].train_loss.is_finite(), "{precision} {mode:?}");
            let sd = tessera::tensor::StateDict::load(out.join("model.safetensors")).unwrap();
            std::fs::remove_dir_all(&out).unwrap();
            runs.push((mode, got, sd));
        }
        let (_, want, want_sd) = &runs[0];
        for (mode, got, sd) in &runs[1..] {
            assert_eq!(
                got[0].train_loss.to_bits(),
                want[0].train_loss.to_bits(),
                "{precision} {mode:?}"
            );
            for (k, t) in want_sd.iter() {
                assert_eq!(
                    sd.tensor(k).unwrap().to_vec::<f32>().unwrap(),
                    t.to_vec::<f32>().unwrap(),
                    "{precision} {mode:?}: {k}"
                );
            }
        }
        let w = want_sd.tensor("0.weight").unwrap().to_vec::<f32>().unwrap();
        assert_ne!(
            w,
            f32_run.tensor("0.weight").unwrap().to_vec::<f32>().unwrap(),
            "{precision} ran in f32"
        );
    }
    let e = args_with(
        &tmp("bad"),
        &["--ddp", "--optim", "onebit-adam", "--precision", "f16"],
    )
    .unwrap_err();
    assert!(e.contains("compressed"), "{e}");
    let e = args_with(&tmp("bad"), &["--zero", "2", "--overflow-at", "1"]).unwrap_err();
    assert!(e.contains("--overflow-at"), "{e}");
    assert!(args_with(
        &tmp("ok"),
        &["--ddp", "--optim", "onebit-adam", "--precision", "bf16"]
    )
    .is_ok());
}
