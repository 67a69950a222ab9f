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
    let r = refs.get(name).unwrap_or_else(|| panic!("{name} in the reference file"));
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
    assert_eq!(model.parameters().len(), r.param_tensors, "{name}: parameter tensors");
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
