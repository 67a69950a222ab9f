//! `tessera::profile` over a small transformer training step: the table
//! lists the step's ops in the forward and the backward pass, and the
//! Chrome trace parses with the trace-event fields.

use tessera::autograd::{CrossEntropyOptions, Target, Var};
use tessera::nn::{Activation, Module, TransformerEncoderLayer, TransformerOptions};
use tessera::optim::{AdamW, AdamWOptions, Optimizer};
use tessera::tensor::profile::Phase;
use tessera::tensor::{manual_seed, DType, Tensor};

#[test]
fn a_training_step_is_profiled_forward_and_backward() {
    manual_seed(0);
    let opts = TransformerOptions {
        dim_feedforward: 32,
        dropout: 0.0,
        activation: Activation::Gelu,
        norm_first: true,
        ..Default::default()
    };
    let layer = TransformerEncoderLayer::new(16, 2, opts).unwrap();
    let mut opt = AdamW::new(layer.parameters(), AdamWOptions::default()).unwrap();
    let x = Var::constant(Tensor::randn(&[2, 5, 16], DType::F32).unwrap());
    let y = Tensor::randint(0, 16, &[10], DType::I64).unwrap();
    let ((), prof) = tessera::profile(|| {
        let logits = layer.forward(&x).unwrap().reshape([10, 16]).unwrap();
        let loss = logits
            .cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())
            .unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    });
    let rows = prof.summary();
    let has = |name: &str, phase: Phase| rows.iter().any(|r| r.name == name && r.phase == phase);
    for name in ["layer_norm", "linear", "matmul", "softmax", "gelu", "cross_entropy"] {
        assert!(has(name, Phase::Forward), "forward {name} missing:\n{}", prof.table(100));
    }
    // Backward rows: the autograd nodes and the kernels their rules run.
    for name in ["gelu", "gelu_backward", "layer_norm_backward", "matmul", "softmax_backward"] {
        assert!(has(name, Phase::Backward), "backward {name} missing:\n{}", prof.table(100));
    }
    let linear = rows
        .iter()
        .find(|r| r.name == "linear" && r.phase == Phase::Forward && r.shapes[1] == [32, 16])
        .expect("the feed-forward expansion");
    assert_eq!(linear.shapes[0], [2, 5, 16]);
    assert!(linear.bytes >= 2 * 5 * 32 * 4, "{linear:?}");
    let recorded: u64 = prof.events.iter().map(|e| e.self_ns).sum();
    assert!(recorded <= prof.wall_ns);
    let json: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert_eq!(events.len(), prof.events.len());
    assert!(events.iter().any(|e| e["cat"] == "backward" && e["ph"] == "X"));
}
