//! timm parity: small timm models (random init, fixed seed, randomised
//! BatchNorm statistics) written by `fixtures/make_timm_fixtures.py` load
//! strictly by name into the same tessera configurations, and the
//! eval-mode logits match timm's within 1e-4 relative to the largest
//! logit.

use tessera_autograd::{no_grad, Var};
use tessera_nn::models::*;
use tessera_nn::{init, state_dict, Module};
use tessera_tensor::StateDict;

/// Loads `timm_<name>.safetensors` strictly into `model` and checks its
/// eval-mode logits on the stored input.
fn check(name: &str, mut model: impl Module) {
    let path = format!(
        "{}/tests/fixtures/timm_{name}.safetensors",
        env!("CARGO_MANIFEST_DIR")
    );
    let all = StateDict::load(&path).expect("fixture present");
    let report = state_dict::load_state_dict(&model, &all.prefixed("model"), true)
        .unwrap_or_else(|e| panic!("{name}: strict load: {e}"));
    assert!(report.is_clean(), "{name}: {report}");
    model.eval();
    let x = all.tensor("input").expect("input").clone();
    let want = all.tensor("logits").expect("logits").to_vec::<f32>().unwrap();
    let got = no_grad(|| model.forward(&Var::constant(x)))
        .unwrap()
        .into_tensor();
    assert_eq!(got.shape(), [2, 10], "{name}: logits shape");
    let got = got.contiguous().unwrap().to_vec::<f32>().unwrap();
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-4 * scale,
        "{name}: max |tessera − timm| = {worst} for logits up to {scale}"
    );
}

fn built<M>(f: impl FnOnce() -> tessera_tensor::Result<M>) -> M {
    init::skip_init(f).expect("the configuration builds")
}

#[test]
fn resnet_basic_small_stem_matches_timm() {
    let cfg = ResNetConfig {
        layers: [1, 1, 1, 1],
        ..ResNetConfig::resnet18()
            .small_input()
            .widths(64, [8, 16, 32, 64])
            .num_classes(10)
    };
    check("resnet_basic_small", built(|| ResNet::new(&cfg)));
}

#[test]
fn resnet_bottleneck_imagenet_stem_matches_timm() {
    let cfg = ResNetConfig {
        layers: [1, 1, 1, 1],
        ..ResNetConfig::resnet50()
            .widths(64, [4, 8, 16, 32])
            .num_classes(10)
    };
    check("resnet_bottleneck_imagenet", built(|| ResNet::new(&cfg)));
}

#[test]
fn vit_matches_timm() {
    let cfg = VitConfig::vit_tiny_patch16_224()
        .img_size(32)
        .patch_size(8)
        .width(48, 3)
        .depth(2)
        .num_classes(10);
    check("vit_tiny_depth2", built(|| VisionTransformer::new(&cfg)));
}

#[test]
fn coatnet_matches_timm() {
    let cfg = CoAtNetConfig::coatnet_0_224()
        .img_size(64)
        .widths(8, [16, 32, 32, 64], [1, 2, 2, 1])
        .dim_head(16)
        .num_classes(10);
    check("coatnet_tiny", built(|| CoAtNet::new(&cfg)));
    let cfg = CoAtNetConfig {
        head_hidden_size: None,
        ..cfg.widths(8, [16, 32, 32, 64], [1, 1, 1, 1])
    };
    check("coatnet_tiny_nohidden", built(|| CoAtNet::new(&cfg)));
}
