//! `examples/train_mnist --zero S --backend local --world 2`: ZeRO-3 trains
//! to the same bits as ZeRO-2 (with two ranks every reduction is one
//! commutative sum of pre-divided halves, so the stages must agree
//! exactly), and the flag is validated.

use crate::train_mnist_example::{cli, data_parallel};
use std::path::{Path, PathBuf};

/// Four steps of the MNIST CNN over 2 local ranks with ZeRO stage `stage`.
fn args(out: &Path, stage: &str) -> Result<cli::Args, String> {
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
        "--zero",
        stage,
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
        .chain([out.display().to_string()]);
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
