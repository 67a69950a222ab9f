//! Whole training steps on the CUDA path (the emulated device under
//! `cuda-emu`) against the same steps on the CPU: the MNIST CNN, a
//! 2-layer transformer encoder, a BN/average-pooling CNN and a tiny
//! ResNet, same seed, same batch, 3 AdamW steps, under the emulator's
//! forward, reverse and random thread orders. The losses, every parameter
//! and every buffer (BN running statistics) must agree within the stated
//! tolerances: the device
//! sums convolutions and GEMMs in another order than the CPU, so values
//! differ by f32 rounding (relative 1e-5 in the losses), which Adam's
//! normalised step can turn into at most a few learning rates' worth of
//! difference in a parameter whose gradient is near zero.
#![cfg(feature = "cuda")]

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::models::{mnist_cnn, ResNet, ResNetConfig};
use tessera::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm, BatchNormOptions, Conv2d, Conv2dOptions, Linear, Module, ReLU,
    Sequential, TransformerEncoderLayer, TransformerOptions,
};
use tessera::optim::{AdamW, AdamWOptions, Optimizer};
use tessera::tensor::{rng, with_thread_order, DType, Device, Generator, Result, Tensor, ThreadOrder};

const DEV: Device = Device::Cuda(0);
const STEPS: usize = 3;
const LR: f64 = 1e-3;

fn gpu() -> bool {
    DEV.available()
        .map_err(|e| println!("skipped: no CUDA device ({e})"))
        .is_ok()
}

/// The losses of `STEPS` AdamW steps on `device`, and the parameters and
/// buffers (as f32) after.
struct Run {
    losses: Vec<f32>,
    params: Vec<(String, Vec<f32>)>,
    buffers: Vec<(String, Vec<f32>)>,
}

fn train(
    build: &dyn Fn() -> Result<Box<dyn Module>>,
    device: Device,
    x: &Tensor,
    y: &Tensor,
    logits: &dyn Fn(&dyn Module, &Var) -> Result<Var>,
) -> Result<Run> {
    rng::manual_seed(7);
    let mut model = build()?;
    model.to(device)?;
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWOptions {
            lr: LR,
            ..Default::default()
        },
    )?;
    let (x, y) = (Var::constant(x.to_device(device)?), y.to_device(device)?);
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let loss =
            logits(&*model, &x)?.cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())?;
        let grads = loss.backward()?;
        opt.step(&grads)?;
        losses.push(loss.tensor().cpu()?.to_scalar::<f32>()?);
    }
    let params = model
        .named_parameters()
        .into_iter()
        .map(|(name, p)| {
            assert_eq!(p.tensor()?.device(), device, "{name} left {device}");
            Ok((name, p.tensor()?.cpu()?.to_vec::<f32>()?))
        })
        .collect::<Result<_>>()?;
    let buffers = model
        .named_buffers()
        .into_iter()
        .map(|(name, b)| {
            let t = b.tensor();
            assert_eq!(t.device(), device, "buffer {name} left {device}");
            Ok((name, t.cpu()?.to_dtype(DType::F32)?.to_vec::<f32>()?))
        })
        .collect::<Result<_>>()?;
    Ok(Run {
        losses,
        params,
        buffers,
    })
}

/// Asserts the device run equals the CPU run: losses within `loss_rtol`,
/// each parameter element within `param_atol` (at most `LR`-sized steps
/// apart, see the module doc) and the largest difference reported.
fn assert_same(what: &str, cpu: &Run, dev: &Run, loss_rtol: f32, param_atol: f32) {
    for (i, (a, b)) in cpu.losses.iter().zip(&dev.losses).enumerate() {
        assert!(
            (a - b).abs() <= loss_rtol * a.abs(),
            "{what}: loss {i}: cpu {a} vs device {b}"
        );
    }
    assert_eq!(cpu.params.len(), dev.params.len());
    for ((name, a), (_, b)) in cpu.params.iter().zip(&dev.params) {
        let worst = a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(
            worst <= param_atol,
            "{what}: {name} differs by up to {worst} (allowed {param_atol})"
        );
    }
    // Running statistics are averages of batch statistics: f32 rounding only.
    assert_eq!(cpu.buffers.len(), dev.buffers.len());
    for ((name, a), (_, b)) in cpu.buffers.iter().zip(&dev.buffers) {
        for (p, q) in a.iter().zip(b) {
            assert!(
                (p - q).abs() <= 1e-4 * (1.0 + p.abs()),
                "{what}: buffer {name}: cpu {p} vs device {q}"
            );
        }
    }
}

fn orders() -> [ThreadOrder; 3] {
    [
        ThreadOrder::Forward,
        ThreadOrder::Reverse,
        ThreadOrder::Random(11),
    ]
}

#[test]
fn mnist_cnn_adamw_steps_on_the_device_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let mut g = Generator::new(3);
    let x = Tensor::randn_with(&[2, 1, 28, 28], DType::F32, &mut g).unwrap();
    let y = Tensor::from_vec(vec![3i64, 9], &[2]).unwrap();
    let build = || -> Result<Box<dyn Module>> { Ok(Box::new(mnist_cnn()?)) };
    let logits = |m: &dyn Module, x: &Var| m.forward(x);
    let cpu = train(&build, Device::Cpu, &x, &y, &logits).unwrap();
    assert!(
        cpu.losses[STEPS - 1] < cpu.losses[0],
        "the CPU run learns: {:?}",
        cpu.losses
    );
    for order in orders() {
        let dev = with_thread_order(order, || train(&build, DEV, &x, &y, &logits)).unwrap();
        assert_same(&format!("mnist cnn {order:?}"), &cpu, &dev, 1e-5, 2.0 * LR as f32);
    }
}

#[test]
fn transformer_encoder_adamw_steps_on_the_device_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let (b, l, d, classes) = (2, 5, 16, 4);
    let mut g = Generator::new(5);
    let x = Tensor::randn_with(&[b, l, d], DType::F32, &mut g).unwrap();
    let y = Tensor::from_vec(
        (0..(b * l) as i64)
            .map(|i| (i * 7 + 1) % classes as i64)
            .collect(),
        &[b * l],
    )
    .unwrap();
    let build = || -> Result<Box<dyn Module>> {
        let o = TransformerOptions {
            dim_feedforward: 32,
            dropout: 0.0,
            ..Default::default()
        };
        Ok(Box::new(
            Sequential::new()
                .with(TransformerEncoderLayer::new(d, 2, o)?)
                .with(TransformerEncoderLayer::new(
                    d,
                    2,
                    TransformerOptions {
                        norm_first: true,
                        ..o
                    },
                )?)
                .with(Linear::new(d, classes, true)?),
        ))
    };
    let logits = |m: &dyn Module, x: &Var| m.forward(x)?.reshape([b * l, classes]);
    let cpu = train(&build, Device::Cpu, &x, &y, &logits).unwrap();
    assert!(
        cpu.losses[STEPS - 1] < cpu.losses[0],
        "the CPU run learns: {:?}",
        cpu.losses
    );
    for order in orders() {
        let dev = with_thread_order(order, || train(&build, DEV, &x, &y, &logits)).unwrap();
        assert_same(
            &format!("transformer {order:?}"),
            &cpu,
            &dev,
            1e-5,
            2.0 * LR as f32,
        );
    }
}

/// Trains `build` on `x`, `y` on the CPU and on the device under each
/// thread order, and asserts the runs agree (the CPU run must learn).
fn cpu_and_device_agree(
    what: &str,
    build: &dyn Fn() -> Result<Box<dyn Module>>,
    x: &Tensor,
    y: &Tensor,
    logits: &dyn Fn(&dyn Module, &Var) -> Result<Var>,
) {
    let cpu = train(build, Device::Cpu, x, y, logits).unwrap();
    assert!(
        cpu.losses[STEPS - 1] < cpu.losses[0],
        "{what}: the CPU run learns: {:?}",
        cpu.losses
    );
    for order in orders() {
        let dev = with_thread_order(order, || train(build, DEV, x, y, logits)).unwrap();
        assert_same(&format!("{what} {order:?}"), &cpu, &dev, 1e-5, 2.0 * LR as f32);
    }
}

#[test]
fn batch_norm_and_average_pooling_cnn_adamw_steps_on_the_device_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let mut g = Generator::new(11);
    let x = Tensor::randn_with(&[4, 1, 8, 8], DType::F32, &mut g).unwrap();
    let y = Tensor::from_vec(vec![0i64, 2, 1, 2], &[4]).unwrap();
    let build = || -> Result<Box<dyn Module>> {
        let conv = |i, o, k, p| Conv2d::new(i, o, k, Conv2dOptions::default().padding(p).bias(false));
        let bn = |c| BatchNorm::new_2d(c, BatchNormOptions::default());
        Ok(Box::new(
            Sequential::new()
                .with(conv(1, 4, 3, 1)?)
                .with(bn(4)?)
                .with(ReLU)
                .with(AvgPool2d::new(2))
                .with(conv(4, 6, 3, 1)?)
                .with(bn(6)?)
                .with(ReLU)
                .with(AdaptiveAvgPool2d::new([2, 2]))
                .with(Conv2d::new(6, 3, 2, Conv2dOptions::default())?),
        ))
    };
    let logits = |m: &dyn Module, x: &Var| m.forward(x)?.reshape([4, 3]);
    cpu_and_device_agree("bn/avg-pool cnn", &build, &x, &y, &logits);
}

#[test]
fn tiny_resnet_adamw_steps_on_the_device_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let mut g = Generator::new(13);
    let x = Tensor::randn_with(&[2, 1, 16, 16], DType::F32, &mut g).unwrap();
    let y = Tensor::from_vec(vec![1i64, 0], &[2]).unwrap();
    let build = || -> Result<Box<dyn Module>> {
        let mut cfg = ResNetConfig::resnet18()
            .small_input()
            .in_chans(1)
            .num_classes(3)
            .widths(4, [4, 4, 8, 8]);
        cfg.layers = [1, 1, 1, 1];
        Ok(Box::new(ResNet::new(&cfg)?))
    };
    let logits = |m: &dyn Module, x: &Var| m.forward(x);
    cpu_and_device_agree("tiny resnet", &build, &x, &y, &logits);
}

/// `train_mnist --device cuda` on a slice of MNIST: the records equal the
/// CPU run's (SGD differs only by f32 rounding here), and a run stopped
/// after one epoch and resumed on the device (its checkpoint written from
/// device tensors, its optimizer state loaded back onto the device) ends
/// with the uninterrupted run's records.
#[test]
fn train_mnist_runs_on_the_device() {
    use crate::train_mnist_example::{cli, run};
    if !gpu() {
        return;
    }
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let tmp = |name: &str| {
        let d = std::env::temp_dir().join(format!("tessera-cuda-mnist-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    let args = |out: &std::path::Path, extra: &[&str]| {
        let base = [
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--lr",
            "0.05",
            "--seed",
            "3",
            "--train-limit",
            "8",
            "--test-limit",
            "8",
            "--data",
            data,
        ];
        let out = ["--out".to_string(), out.display().to_string()];
        cli::Args::parse(base.iter().chain(extra).map(|s| s.to_string()).chain(out)).unwrap()
    };
    let (c, d, r) = (tmp("cpu"), tmp("dev"), tmp("resumed"));
    let cpu = run::train(&args(&c, &[])).unwrap();
    let dev = run::train(&args(&d, &["--device", "cuda"])).unwrap();
    assert_eq!(dev.len(), 2);
    for (a, b) in cpu.iter().zip(&dev) {
        assert!(
            (a.train_loss - b.train_loss).abs() <= 1e-4 * a.train_loss,
            "{cpu:?} vs {dev:?}"
        );
        assert!(
            (a.test_acc - b.test_acc).abs() <= 100.0 / 8.0 + 1e-9,
            "{cpu:?} vs {dev:?}"
        );
    }
    assert!(d.join("model.safetensors").exists());
    let mut resumed = run::train(&args(&r, &["--device", "cuda", "--stop-after", "1"])).unwrap();
    resumed.extend(run::train(&args(&r, &["--device", "cuda", "--resume"])).unwrap());
    assert_eq!(resumed, dev, "a resumed device run ends as the uninterrupted one");
    for dir in [c, d, r] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `train_mnist --device cuda --precision bf16|f16` against the same flags
/// on the CPU: autocast's casts, the bf16/f16 GEMMs and convolutions, the
/// f32 master weights and, for f16, the loss scaler run on the device — a
/// forced overflow (`--overflow-at 1`) is skipped on both (4 steps of 2
/// digits each). Both round every
/// product's output to bf16/f16 but sum in their own orders, so the losses
/// agree within 1e-3 relative.
#[test]
fn train_mnist_mixed_precision_on_the_device_matches_the_cpu() {
    use crate::train_mnist_example::{cli, run};
    if !gpu() {
        return;
    }
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let train = |name: &str, extra: &[&str]| {
        let out = std::env::temp_dir().join(format!("tessera-cuda-amp-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let base = [
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--lr",
            "0.05",
            "--seed",
            "3",
            "--train-limit",
            "8",
            "--test-limit",
            "4",
            "--data",
            data,
        ];
        let outs = ["--out".to_string(), out.display().to_string()];
        let args = cli::Args::parse(base.iter().chain(extra).map(|s| s.to_string()).chain(outs)).unwrap();
        let records = run::train(&args).unwrap();
        let _ = std::fs::remove_dir_all(&out);
        records
    };
    for (precision, extra) in [("bf16", &[][..]), ("f16", &["--overflow-at", "1"][..])] {
        let mut flags = vec!["--precision", precision];
        flags.extend_from_slice(extra);
        let cpu = train(&format!("cpu-{precision}"), &flags);
        flags.extend_from_slice(&["--device", "cuda"]);
        let dev = train(&format!("dev-{precision}"), &flags);
        for (c, d) in cpu.iter().zip(&dev) {
            assert!(
                (c.train_loss - d.train_loss).abs() <= 1e-3 * c.train_loss,
                "{precision}: {cpu:?} vs {dev:?}"
            );
            assert_eq!(
                c.skipped_steps, d.skipped_steps,
                "{precision}: {cpu:?} vs {dev:?}"
            );
        }
        let skipped: usize = dev.iter().map(|r| r.skipped_steps).sum();
        assert_eq!(skipped, usize::from(precision == "f16"), "{precision}: {dev:?}");
    }
}

/// Some two hundred optimizer steps of `train_mnist --device cuda` (192
/// real digits, batch 2, 2 epochs = 192 SGD steps; the emulator's cost follows
/// the elements each kernel touches, so the small batch halves the test's
/// time without fewer steps): the model learns on the
/// emulated device — the loss falls epoch over epoch and the test accuracy
/// is far above chance — and ends within a few points of the CPU run.
#[test]
fn train_mnist_trains_for_two_hundred_steps_on_the_device() {
    use crate::train_mnist_example::{cli, run};
    if !gpu() {
        return;
    }
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let run_on = |device: &str| {
        let out =
            std::env::temp_dir().join(format!("tessera-cuda-mnist-long-{}-{device}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let flags = [
            "--device",
            device,
            "--epochs",
            "2",
            "--batch-size",
            "2",
            "--lr",
            "0.02",
            "--seed",
            "1",
            "--train-limit",
            "192",
            "--test-limit",
            "100",
            "--data",
            data,
        ];
        let out_flag = ["--out".to_string(), out.display().to_string()];
        let args = cli::Args::parse(flags.iter().map(|s| s.to_string()).chain(out_flag)).unwrap();
        let records = run::train(&args).unwrap();
        let _ = std::fs::remove_dir_all(out);
        records
    };
    let (dev, cpu) = (run_on("cuda"), run_on("cpu"));
    assert_eq!(dev.len(), 2);
    assert!(dev[1].train_loss < 0.8 * dev[0].train_loss, "{dev:?}");
    // Chance is 10%; this run ends at 76% on the device (as on the CPU).
    assert!(dev[1].test_acc >= 60.0, "{dev:?}");
    assert!(
        (dev[1].test_acc - cpu[1].test_acc).abs() <= 5.0,
        "{dev:?} vs {cpu:?}"
    );
}
