//! The model zoo's structure against the reference: every state-dict key,
//! its shape and order, and the parameter totals of torchvision's ResNets
//! and timm's ViTs and CoAtNets, read from
//! `fixtures/model-state-dict-keys.txt` (a copy of
//! `shared/specs/model-state-dict-keys.txt`, generated from the torchvision
//! and timm sources). Models are built inside `init::skip_init`, so the
//! 167-million-parameter CoAtNet-3 costs allocations, not random draws.

use std::collections::HashMap;

use tessera_nn::models::*;
use tessera_nn::{init, Module};

/// One reference model: its keys with shapes, in order, and totals.
struct Reference {
    keys: Vec<(String, Vec<usize>)>,
    params: usize,
    param_tensors: usize,
    state_dict_keys: usize,
}

fn references() -> HashMap<String, Reference> {
    let text = include_str!("../fixtures/model-state-dict-keys.txt");
    let mut out = HashMap::new();
    let mut current: Option<(String, Reference)> = None;
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("## ") {
            out.extend(current.take());
            let mut words = header.split_whitespace();
            let name = words.nth(1).expect("model name").to_string();
            let field = |key: &str| -> usize {
                header
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .expect("total in header")
                    .parse()
                    .expect("a number")
            };
            let reference = Reference {
                keys: Vec::new(),
                params: field("params="),
                param_tensors: field("param_tensors="),
                state_dict_keys: field("state_dict_keys="),
            };
            current = Some((name, reference));
        } else if let (Some((_, r)), Some((key, rest))) = (current.as_mut(), line.split_once(' ')) {
            if line.starts_with('#') {
                continue;
            }
            let dims = rest.trim_start_matches('[').split(']').next().expect("shape");
            let shape = dims
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| d.parse().expect("dimension"))
                .collect();
            r.keys.push((key.to_string(), shape));
        }
    }
    out.extend(current);
    out
}

fn check(name: &str, model: &dyn Module, refs: &HashMap<String, Reference>) {
    let r = refs
        .get(name)
        .unwrap_or_else(|| panic!("{name} in the reference file"));
    let got: Vec<(String, Vec<usize>)> = model
        .state_dict()
        .iter()
        .map(|(k, t)| (k.to_string(), t.shape().to_vec()))
        .collect();
    for (i, (g, w)) in got.iter().zip(&r.keys).enumerate() {
        assert_eq!(g, w, "{name}: state-dict entry {i}");
    }
    assert_eq!(r.keys.len(), r.state_dict_keys, "{name}: the reference is whole");
    assert_eq!(got.len(), r.keys.len(), "{name}: number of state-dict keys");
    assert_eq!(
        model.parameters().len(),
        r.param_tensors,
        "{name}: parameter tensors"
    );
    assert_eq!(model.num_parameters(), r.params, "{name}: parameters");
}

#[test]
fn resnets_match_torchvision_keys_shapes_and_counts() {
    let refs = references();
    init::skip_init(|| {
        check("resnet18", &resnet18().unwrap(), &refs);
        check("resnet50", &resnet50().unwrap(), &refs);
        // Not in the reference file: torchvision's published totals.
        assert_eq!(resnet34().unwrap().num_parameters(), 21_797_672);
        assert_eq!(resnet101().unwrap().num_parameters(), 44_549_160);
    });
}

#[test]
fn vits_match_timm_keys_shapes_and_counts() {
    let refs = references();
    init::skip_init(|| {
        check("vit_tiny_patch16_224", &vit_tiny_patch16_224().unwrap(), &refs);
        check("vit_small_patch16_224", &vit_small_patch16_224().unwrap(), &refs);
        check("vit_base_patch16_224", &vit_base_patch16_224().unwrap(), &refs);
    });
}

#[test]
fn coatnets_match_timm_keys_shapes_and_counts() {
    let refs = references();
    init::skip_init(|| {
        check("coatnet_0_224", &coatnet_0_224().unwrap(), &refs);
        check("coatnet_1_224", &coatnet_1_224().unwrap(), &refs);
        check("coatnet_2_224", &coatnet_2_224().unwrap(), &refs);
        check("coatnet_3_224", &coatnet_3_224().unwrap(), &refs);
    });
}

/// Small configurations of each family, as the training examples use them.
/// Each with its input side (the CoAtNet at 64, so that its last stage
/// attends over 2×2 positions rather than one).
pub(crate) fn small_models(drop_path: f64) -> Vec<(&'static str, Box<dyn Module>, usize)> {
    let resnet = ResNetConfig {
        layers: [1, 1, 1, 1],
        ..ResNetConfig::resnet50()
            .small_input()
            .widths(8, [4, 8, 8, 8])
            .num_classes(10)
            .drop_path_rate(drop_path)
    };
    let vit = VitConfig::vit_tiny_patch16_224()
        .img_size(32)
        .patch_size(8)
        .width(24, 3)
        .depth(2)
        .num_classes(10)
        .drop_path_rate(drop_path);
    let coatnet = CoAtNetConfig::coatnet_0_224()
        .img_size(64)
        .widths(8, [8, 16, 16, 32], [1, 1, 1, 1])
        .dim_head(8)
        .num_classes(10)
        .drop_path_rate(drop_path);
    vec![
        ("resnet", Box::new(ResNet::new(&resnet).unwrap()), 32),
        ("vit", Box::new(VisionTransformer::new(&vit).unwrap()), 32),
        ("coatnet", Box::new(CoAtNet::new(&coatnet).unwrap()), 64),
    ]
}

pub(crate) fn randn(shape: &[usize], seed: u64) -> tessera_tensor::Tensor {
    tessera_tensor::rng::manual_seed(seed);
    tessera_tensor::Tensor::normal(shape, 0.0, 1.0, tessera_tensor::DType::F32).unwrap()
}

#[test]
fn small_models_backpropagate_to_every_parameter() {
    use tessera_autograd::Var;
    for (name, model, side) in small_models(0.0) {
        let x = Var::constant(randn(&[2, 3, side, side], 1));
        let logits = model.forward(&x).unwrap();
        assert_eq!(logits.shape(), [2, 10], "{name}");
        let w = Var::constant(randn(&[2, 10], 2));
        let grads = logits
            .mul(&w)
            .unwrap()
            .sum(&[0, 1], false)
            .unwrap()
            .backward()
            .unwrap();
        for (pname, p) in model.named_parameters() {
            let g = p
                .grad(&grads)
                .unwrap_or_else(|| panic!("{name}: no gradient for {pname}"));
            let g = g.contiguous().unwrap().to_vec::<f32>().unwrap();
            assert!(g.iter().all(|v| v.is_finite()), "{name}: {pname}");
            assert!(g.iter().any(|v| *v != 0.0), "{name}: zero gradient for {pname}");
        }
    }
}

#[test]
fn drop_path_acts_in_training_only() {
    use tessera_autograd::{no_grad, Var};
    use tessera_nn::{walk, Entry};
    for ((name, mut plain, side), (_, mut dropped, _)) in small_models(0.0).into_iter().zip(small_models(0.3))
    {
        let x = Var::constant(randn(&[2, 3, side, side], 3));
        assert!(
            plain.state_dict().keys().eq(dropped.state_dict().keys()),
            "{name}: same keys"
        );
        dropped.load_state_dict(&plain.state_dict(), true).unwrap();
        let mut count = 0;
        walk(dropped.as_ref(), &mut |_, e| {
            if let Entry::Module(m) = e {
                count += usize::from(m.type_name() == "DropPath");
            }
        });
        assert!(count > 0, "{name}: DropPath modules present");
        plain.eval();
        dropped.eval();
        let a = no_grad(|| plain.forward(&x))
            .unwrap()
            .into_tensor()
            .to_vec::<f32>()
            .unwrap();
        let b = no_grad(|| dropped.forward(&x))
            .unwrap()
            .into_tensor()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(a, b, "{name}: DropPath is the identity in eval mode");
        dropped.train(true);
        plain.train(true);
        tessera_tensor::rng::manual_seed(5);
        let c = no_grad(|| dropped.forward(&x))
            .unwrap()
            .into_tensor()
            .to_vec::<f32>()
            .unwrap();
        tessera_tensor::rng::manual_seed(5);
        let d = no_grad(|| plain.forward(&x))
            .unwrap()
            .into_tensor()
            .to_vec::<f32>()
            .unwrap();
        assert_ne!(c, d, "{name}: DropPath acts in training mode");
    }
}

#[test]
fn drop_path_rates_rise_linearly_over_the_blocks() {
    let cfg = VitConfig::vit_tiny_patch16_224()
        .img_size(32)
        .patch_size(8)
        .width(24, 3)
        .depth(5)
        .drop_path_rate(0.2);
    let vit = VisionTransformer::new(&cfg).unwrap();
    let rates: Vec<f64> = vit
        .blocks
        .iter()
        .map(|b| b.drop_path1.as_ref().map_or(0.0, |d| d.p))
        .collect();
    let want = [0.0, 0.05, 0.1, 0.15, 0.2];
    for (r, w) in rates.iter().zip(want) {
        assert!((r - w).abs() < 1e-12, "{rates:?}");
    }
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    use tessera_autograd::Var;
    assert!(VisionTransformer::new(&VitConfig::vit_tiny_patch16_224().patch_size(15)).is_err());
    assert!(VisionTransformer::new(&VitConfig::vit_tiny_patch16_224().width(100, 3)).is_err());
    assert!(CoAtNet::new(&CoAtNetConfig::coatnet_0_224().img_size(28)).is_err());
    assert!(CoAtNet::new(&CoAtNetConfig::coatnet_0_224().dim_head(0)).is_err());
    assert!(ResNet::new(&ResNetConfig::resnet18().num_classes(0)).is_err());
    assert!(ResNet::new(&ResNetConfig::resnet18().drop_path_rate(2.0)).is_err());
    for (name, model, side) in small_models(0.0) {
        let wrong = Var::constant(randn(&[1, 3, side + 8, side], 4));
        let channels = Var::constant(randn(&[1, 2, side, side], 4));
        assert!(model.forward(&channels).is_err(), "{name}: wrong channel count");
        if name != "resnet" {
            // ResNets pool globally and take any size; the others have
            // position embeddings or biases fixed to the configured size.
            assert!(model.forward(&wrong).is_err(), "{name}: wrong image size");
        }
    }
}
