//! `examples/train` (the timm-style trainer): a small ViT with drop path,
//! EMA and gradient clipping interrupted after an epoch and continued with
//! `--resume` ends with bit-identical weights and EMA weights, and the
//! same epoch metrics, as an uninterrupted run. The example's modules are
//! compiled into this test; it trains on 256 Fashion-MNIST-layout images
//! of `datasets/mnist` to stay short.

#[allow(dead_code)]
#[path = "../../examples/train/cli.rs"]
pub(crate) mod cli;
#[path = "../../examples/train/data.rs"]
mod data;
#[path = "../../examples/train/run.rs"]
pub(crate) mod run;
#[path = "../../examples/train/zoo.rs"]
mod zoo;

use std::path::{Path, PathBuf};

// The progress bar is train_mnist's, compiled once for the test binary.
use super::train_mnist_example::{common, progress};

use tessera::tensor::StateDict;

/// The flags of a 2-epoch ViT run on 256 images of `datasets/mnist`, then
/// `extra`, writing to `out`.
pub(crate) fn args(out: &Path, extra: &[&str]) -> cli::Args {
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

/// A fresh temporary directory path for run `name` of this process.
pub(crate) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The `"epoch"` lines of the metrics log, without their timings.
pub(crate) fn epochs(dir: &Path) -> Vec<serde_json::Value> {
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
    for bad in [
        &["--opt", "sgdx"][..],
        &["--sched", "step"],
        &["--accum-steps", "0"],
        &["--mixup-prob", "1.5"],
        &["--randaugment", "2"],
        &["--randaugment", "2,11"],
        &["--progressive", "16,0"],
    ] {
        let err = cli::Args::parse(bad.iter().map(|s| s.to_string())).unwrap_err();
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
    let mut a = args(&out, &[]);
    a.data = out.join("nowhere");
    let err = run::train(&a).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("nowhere"), "{err}");
    let _ = std::fs::remove_dir_all(out);
}

/// The `"config"` record and the `"step"` records of a run's log.
fn log_records(dir: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let records: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let config = records.iter().find(|r| r["kind"] == "config").unwrap().clone();
    let steps = records.into_iter().filter(|r| r["kind"] == "step").collect();
    (config, steps)
}

#[test]
fn the_recipe_flags_train_and_are_logged() {
    let out = tmp("recipe");
    let flags = [
        "--opt",
        "lamb",
        "--sched",
        "onecycle",
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--randaugment",
        "2,9",
        "--accum-steps",
        "3",
        "--log-every",
        "1",
        "--stop-after",
        "1",
    ];
    run::train(&args(&out, &flags)).unwrap();
    let (config, steps) = log_records(&out);
    assert_eq!(config["optimizer"], "lamb");
    assert_eq!(config["schedule"], "onecycle");
    assert_eq!(config["accum_steps"], 3);
    assert_eq!(config["randaugment"], serde_json::json!({"n": 2, "m": 9.0}));
    // 256 images in batches of 64 are 4 micro-batches: a step after 3 and
    // one for the last micro-batch of the epoch.
    let epochs: Vec<f64> = steps.iter().map(|s| s["epoch"].as_f64().unwrap()).collect();
    assert_eq!(epochs, [0.75, 1.0]);
    assert!(steps.iter().all(|s| s["loss"].as_f64().unwrap().is_finite()));
    std::fs::remove_dir_all(out).unwrap();
}

#[test]
fn accumulating_two_half_batches_equals_one_full_batch() {
    let weights = |name: &str, flags: &[&str]| {
        let out = tmp(name);
        let mut a = args(&out, flags);
        (a.drop_path, a.ema_decay, a.clip_grad, a.epochs) = (0.0, None, None, 1);
        run::train(&a).unwrap();
        let sd = StateDict::load(out.join("model.safetensors")).unwrap();
        std::fs::remove_dir_all(out).unwrap();
        sd
    };
    let full = weights("full", &["--batch-size", "64"]);
    let halves = weights("halves", &["--batch-size", "32", "--accum-steps", "2"]);
    for ((name, x), (_, y)) in full.iter().zip(halves.iter()) {
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let worst = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{name}: max |full - accumulated| = {worst}");
    }
}

#[test]
fn cifar_binaries_and_shards_train_a_resnet_with_progressive_resizing() {
    use tessera::data::formats::{Field, FieldKind, ShardWriter, Value};
    use tessera::data::Image;

    // Two 32×32×3 images per CIFAR file, six per shard, pixels from a hash.
    let pixel = |i: usize, k: usize| ((i * 7919 + k * 104_729) % 251) as u8;
    let cifar = tmp("cifar");
    std::fs::create_dir_all(&cifar).unwrap();
    for (f, file) in [
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ]
    .iter()
    .enumerate()
    {
        let mut bytes = Vec::new();
        for i in 0..2 {
            bytes.push(((f + i) % 3) as u8);
            bytes.extend((0..3072).map(|k| pixel(f * 2 + i, k)));
        }
        std::fs::write(cifar.join(format!("{file}.bin")), bytes).unwrap();
    }
    let shards = tmp("shards");
    std::fs::create_dir_all(&shards).unwrap();
    let fields = [
        Field::new("image", FieldKind::ImageU8),
        Field::new("label", FieldKind::I64),
    ];
    for split in ["train", "test"] {
        let mut w = ShardWriter::create(shards.join(format!("{split}-00000.tshard")), &fields).unwrap();
        for i in 0..6 {
            let img = Image::new(32, 32, 3, (0..3072).map(|k| pixel(i, k)).collect()).unwrap();
            w.append(&[Value::Image(img), Value::I64((i % 3) as i64)])
                .unwrap();
        }
        w.finish().unwrap();
    }
    for (data, name) in [(&cifar, "cifar-run"), (&shards, "shard-run")] {
        let out = tmp(name);
        let mut a = args(
            &out,
            &["--progressive", "16,0,2", "--batch-size", "8", "--log-every", "1"],
        );
        (a.model, a.data, a.epochs, a.ema_decay) = ("resnet18".into(), data.clone(), 2, None);
        (a.depth, a.embed_dim, a.num_heads) = (None, None, None);
        (a.train_limit, a.test_limit) = (None, None);
        run::train(&a).unwrap();
        let (config, steps) = log_records(&out);
        assert_eq!(
            (config["in_chans"].clone(), config["classes"].clone()),
            (3.into(), 3.into())
        );
        assert_eq!(config["train_samples"], if name == "cifar-run" { 10 } else { 6 });
        assert!(steps.iter().all(|s| s["loss"].as_f64().unwrap().is_finite()));
        std::fs::remove_dir_all(out).unwrap();
    }
    let err = run::train(&args(&tmp("vit-prog"), &["--progressive", "16,0,2"]))
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("--progressive needs"), "{err}");
    for d in [cifar, shards] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn widths_and_blocks_size_resnets_and_coatnets() {
    use tessera::nn::models::{CoAtNet, CoAtNetConfig, ResNet, ResNetConfig};
    use tessera::nn::Module;
    let sized = |model: &str, widths: &str, blocks: &str| {
        let out = tmp(&format!("sized-{model}"));
        let mut a = args(
            &out,
            &["--widths", widths, "--blocks", blocks, "--batch-size", "8"],
        );
        (a.model, a.epochs, a.ema_decay) = (model.into(), 1, None);
        (a.depth, a.embed_dim, a.num_heads) = (None, None, None);
        (a.train_limit, a.test_limit) = (Some(16), Some(8));
        run::train(&a).unwrap();
        let (config, steps) = log_records(&out);
        assert!(steps.iter().all(|s| s["loss"].as_f64().unwrap().is_finite()));
        std::fs::remove_dir_all(out).unwrap();
        config["params"].as_u64().unwrap() as usize
    };
    let resnet = ResNetConfig::resnet18()
        .widths(8, [8, 16, 32, 64])
        .small_input()
        .in_chans(1)
        .num_classes(10);
    let resnet = ResNet::new(&ResNetConfig {
        layers: [1, 2, 1, 1],
        ..resnet
    })
    .unwrap();
    assert_eq!(
        sized("resnet18", "8,8,16,32,64", "1,2,1,1"),
        resnet.num_parameters()
    );
    let coatnet = CoAtNetConfig::coatnet_0_224()
        .widths(32, [32, 32, 64, 64], [1, 1, 1, 1])
        .img_size(32)
        .in_chans(1)
        .num_classes(10);
    assert_eq!(
        sized("coatnet_0_224", "32,32,32,64,64", "1,1,1,1"),
        CoAtNet::new(&coatnet).unwrap().num_parameters()
    );
    // Each family's own size flags only.
    let err = run::train(&args(&tmp("vit-widths"), &["--widths", "8,8,16,32,64"]))
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("--widths"), "{err}");
    let mut a = args(&tmp("resnet-depth"), &[]);
    a.model = "resnet18".into();
    let err = run::train(&a).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("--depth"), "{err}");
    for bad in [&["--widths", "8,8,16"][..], &["--blocks", "1,0,1,1"]] {
        let err = cli::Args::parse(bad.iter().map(|s| s.to_string())).unwrap_err();
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

/// A WebDataset directory (`train-*.tar`, one of them gzipped, and
/// `test-*.tar`, samples of a `png` and a `cls` file) loads the same
/// images and labels as the IDX files they were written from, pixel for
/// pixel and in order, also when `--train-limit` stops inside the second
/// shard; a corrupt image is an error naming its shard and sample.
#[test]
fn webdataset_shards_load_the_images_they_were_written_from() {
    use std::io::Write;
    use tessera::data::formats::{encode_png, TarWriter};
    let mnist = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist"));
    let dir = tmp("webdataset");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, samples: std::ops::Range<usize>, from: &data::Images, gzip: bool| {
        let mut tar = TarWriter::new(Vec::new(), 0);
        for i in samples {
            tar.append(&format!("s/{i:06}.png"), &encode_png(&from.images[i]).unwrap())
                .unwrap();
            tar.append(&format!("s/{i:06}.cls"), from.labels[i].to_string().as_bytes())
                .unwrap();
        }
        let bytes = tar.finish().unwrap();
        let mut f = std::fs::File::create(dir.join(name)).unwrap();
        if gzip {
            let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            gz.write_all(&bytes).unwrap();
            gz.finish().unwrap();
        } else {
            f.write_all(&bytes).unwrap();
        }
    };
    let train = data::Images::load(mnist, true, Some(50)).unwrap();
    let test = data::Images::load(mnist, false, Some(20)).unwrap();
    write("train-000.tar", 0..30, &train, false);
    write("train-001.tar.gz", 30..50, &train, true);
    write("test-000.tar", 0..20, &test, false);
    for (split, want, limit) in [
        (true, &train, None),
        (false, &test, None),
        (true, &train, Some(41)),
    ] {
        let got = data::Images::load(&dir, split, limit).unwrap();
        let n = limit.unwrap_or(want.len());
        assert_eq!(got.len(), n, "train {split}");
        assert_eq!(got.labels, want.labels[..n]);
        assert!(
            got.images.iter().zip(&want.images).all(|(a, b)| a == b),
            "train {split}"
        );
    }
    std::fs::write(dir.join("test-001.tar"), {
        let mut tar = TarWriter::new(Vec::new(), 0);
        tar.append("bad.png", b"\x89PNG\r\n\x1a\n truncated").unwrap();
        tar.append("bad.cls", b"1").unwrap();
        tar.finish().unwrap()
    })
    .unwrap();
    let err = data::Images::load(&dir, false, None).err().unwrap().to_string();
    assert!(err.contains("test-001.tar") && err.contains("bad"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
