//! `examples/train --ddp`: two local ranks train the ViT of
//! `train_example` to the weights of one process on the whole batch, and
//! each communication-compressed optimizer trains past its freeze step
//! with finite losses.

use tessera::tensor::StateDict;

use crate::train_example::{args, cli, epochs, run, tmp};

/// The final weights of a 1-epoch run (4 steps of 64 images) with `flags`,
/// without drop path (each rank would draw its own) and EMA.
fn weights(name: &str, flags: &[&str]) -> StateDict {
    let out = tmp(name);
    let mut a = args(&out, flags);
    (a.drop_path, a.ema_decay, a.epochs) = (0.0, None, 1);
    run::train(&a).unwrap();
    let sd = StateDict::load(out.join("model.safetensors")).unwrap();
    std::fs::remove_dir_all(out).unwrap();
    sd
}

#[test]
fn two_ranks_train_to_the_weights_of_one_process_on_the_whole_batch() {
    let single = weights("single", &[]);
    let ddp = weights("ddp", &["--ddp", "--world", "2"]);
    assert!(single.keys().eq(ddp.keys()), "the same, unprefixed, names");
    let mut moved = 0f32;
    for ((name, x), (_, y)) in single.iter().zip(ddp.iter()) {
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{name}: max |one process - two ranks| = {worst}");
        moved = moved.max(x.iter().map(|v| v.abs()).fold(0f32, f32::max));
    }
    assert!(moved > 0.0);
}

/// Under bf16 autocast two ranks still train to the weights of one process
/// on the whole batch, within what bf16 GEMMs over half the rows may round
/// differently (worst seen 5.3e-4, on a bias); f16 with loss scaling too.
/// Both differ from the f32 run (autocast took effect).
#[test]
fn mixed_precision_ranks_train_to_the_weights_of_one_process() {
    let f32_run = weights("single-f32", &[]);
    for precision in ["bf16", "f16"] {
        let single = weights(&format!("single-{precision}"), &["--precision", precision]);
        assert!(
            single
                .iter()
                .zip(f32_run.iter())
                .any(|((_, a), (_, b))| a.to_vec::<f32>().unwrap() != b.to_vec::<f32>().unwrap()),
            "{precision} trained as f32"
        );
        let ddp = weights(
            &format!("ddp-{precision}"),
            &["--ddp", "--world", "2", "--precision", precision],
        );
        for ((name, x), (_, y)) in single.iter().zip(ddp.iter()) {
            let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
            let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                worst < 1e-3,
                "{precision} {name}: max |one process - two ranks| = {worst}"
            );
        }
    }
}

#[test]
fn compressed_optimizers_train_past_their_freeze_step() {
    // 2 epochs of 4 steps; the variance freezes after step 3.
    for opt in ["onebit-adam", "onebit-lamb", "zero-one-adam"] {
        let out = tmp(opt);
        let mut a = args(
            &out,
            &["--ddp", "--opt", opt, "--freeze-step", "3", "--lr", "1e-3"],
        );
        a.drop_path = 0.0;
        run::train(&a).unwrap();
        let lines = epochs(&out);
        assert_eq!(lines.len(), 2, "{opt}");
        for l in &lines {
            let loss = l["train_loss"].as_f64().unwrap();
            assert!(loss.is_finite() && loss < 3.0, "{opt}: epoch loss {loss}");
        }
        let config = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        assert!(
            config.contains(r#""optimizer":""#) && config.contains(opt),
            "{opt} logged"
        );
        std::fs::remove_dir_all(out).unwrap();
    }
}

#[test]
fn data_parallel_flags_are_checked() {
    let parse = |flags: &[&str]| cli::Args::parse(flags.iter().map(|s| s.to_string())).map(drop);
    let e = parse(&["--opt", "onebit-adam"]).unwrap_err();
    assert!(e.contains("needs --ddp"), "{e}");
    let e = parse(&["--ddp", "--accum-steps", "2"]).unwrap_err();
    assert!(e.contains("--accum-steps"), "{e}");
    let e = parse(&["--ddp", "--backend", "mpi"]).unwrap_err();
    assert!(e.contains("local or tcp"), "{e}");
    let e = parse(&["--ddp", "--variance-mask", "-1"]).unwrap_err();
    assert!(e.contains("--variance-mask"), "{e}");
    assert!(parse(&["--ddp", "--opt", "zero-one-adam", "--variance-mask", "off"]).is_ok());
    let e = parse(&["--ddp", "--opt", "onebit-adam", "--precision", "f16"]).unwrap_err();
    assert!(e.contains("compressed"), "{e}");
    assert!(parse(&["--ddp", "--precision", "f16"]).is_ok());
}
