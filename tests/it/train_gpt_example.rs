//! `examples/train_gpt` end to end at CI size: a tiny GPT trained for a
//! few dozen steps on the repository's README (real English text) on a
//! tp 2 × dp 2 grid of threads with sequence parallelism and dropout; the
//! loss falls, the model is saved, and the binary's generate path loads it
//! and samples the requested number of bytes. The example's modules are
//! compiled into this test.

#[allow(dead_code)]
#[path = "../../examples/train_gpt/cli.rs"]
mod cli;
#[path = "../../examples/train_gpt/run.rs"]
mod run;

use tessera::tensor::StateDict;

fn args(extra: &[&str]) -> cli::Args {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let base = [
        "--data",
        data,
        "--steps",
        "40",
        "--batch-size",
        "8",
        "--seq",
        "16",
        "--layers",
        "1",
        "--width",
        "32",
        "--heads",
        "2",
        "--lr",
        "1e-2",
        "--seed",
        "3",
        "--log-every",
        "20",
    ];
    cli::Args::parse(base.iter().chain(extra).map(|s| s.to_string())).unwrap()
}

#[test]
fn train_gpt_trains_saves_and_generates() {
    let path = std::env::temp_dir().join(format!("tessera-train-gpt-{}.safetensors", std::process::id()));
    let path_s = path.display().to_string();
    let a = args(&["--tp", "2", "--dp", "2", "--sp", "--dropout", "0.1"]);
    let trained = run::train(&a)
        .unwrap()
        .expect("world rank 0 runs in this process");
    assert_eq!(trained.losses.len(), 40);
    let first = trained.losses[0];
    let tail: f64 = trained.losses[35..].iter().sum::<f64>() / 5.0;
    // ln 256 = 5.55 for the near-uniform initial model.
    assert!(first > 5.0, "first loss {first}");
    assert!(
        tail < first - 1.0,
        "loss fell from {first:.3} to {tail:.3} (last five steps)"
    );
    trained.state_dict.save(&path).unwrap();

    let g = cli::Args::parse(
        [
            "generate", "--load", &path_s, "--seq", "16", "--layers", "1", "--width", "32", "--heads", "2",
        ]
        .iter()
        .chain(&["--generate", "25", "--prompt", "The "])
        .map(|s| s.to_string()),
    )
    .unwrap();
    let text = run::sample(&StateDict::load(&path).unwrap(), &g).unwrap();
    assert_eq!(text.len(), 4 + 25, "the prompt and 25 sampled bytes");
    assert_eq!(&text[..4], b"The ");
    run::main(&g).unwrap();
    let _ = std::fs::remove_file(&path);
}
