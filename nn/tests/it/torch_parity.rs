//! PyTorch parity: state dicts written by PyTorch
//! (`fixtures/make_torch_fixtures.py`, torch 2.x) load strictly into the
//! equivalent tessera modules, and the outputs match PyTorch's to f32
//! rounding (tolerance 1e-4 absolute on values of order 1).

use std::collections::HashMap;

use tessera_autograd::{no_grad, Var};
use tessera_nn::models::mnist_cnn;
use tessera_nn::*;
use tessera_tensor::{safetensors, DType, GeluApprox, StateDict, Tensor};

const TOL: f32 = 1e-4;

fn fixture() -> HashMap<String, Tensor> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/torch_modules.safetensors"
    );
    safetensors::load(path).expect("fixture present")
}

/// The entries under `prefix.`, with the prefix removed.
fn group(all: &HashMap<String, Tensor>, prefix: &str) -> StateDict {
    StateDict::from(all.clone()).prefixed(prefix)
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let g = got
        .to_dtype(DType::F32)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let w = want
        .to_dtype(DType::F32)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= TOL, "{what}: max |tessera − torch| = {worst}");
}

fn run(m: &dyn Module, x: &Tensor) -> Tensor {
    no_grad(|| m.forward(&Var::constant(x.clone())))
        .unwrap()
        .into_tensor()
}

#[test]
fn mnist_cnn_loads_strictly_and_matches_torch() {
    let all = fixture();
    let mut net = mnist_cnn().unwrap();
    net.eval();
    let report = state_dict::load_state_dict(&net, &group(&all, "cnn"), true).unwrap();
    assert!(report.is_clean(), "{report}");
    let io = group(&all, "cnn_io");
    assert_close(&run(&net, &io["x"]), &io["y"], "cnn logits");
    assert_eq!(net.num_parameters(), 421_642);
}

fn zoo() -> Sequential {
    let c = Conv2dOptions::default();
    Sequential::new()
        .with(Conv2d::new(4, 8, 3, c.padding(1).bias(false)).unwrap())
        .with(BatchNorm::new_2d(8, BatchNormOptions::default()).unwrap())
        .with(ReLU)
        .with(Conv2d::new(8, 8, 3, c.padding(1).groups(8)).unwrap())
        .with(GroupNorm::new(2, 8, 1e-5, true).unwrap())
        .with(GELU {
            approximate: GeluApprox::None,
        })
        .with(Conv2d::new(8, 6, 1, c.groups(2)).unwrap())
        .with(AvgPool2d::new(2))
        .with(AdaptiveAvgPool2d::new([2, 2]))
        .with(Flatten::default())
        .with(LayerNorm::new(&[24], 1e-5, true, true).unwrap())
        .with(Linear::new(24, 5, true).unwrap())
        .with(
            BatchNorm::new_1d(
                5,
                BatchNormOptions {
                    momentum: Some(0.3),
                    ..Default::default()
                },
            )
            .unwrap(),
        )
        .with(SiLU)
        .with(Tanh)
        .with(Sigmoid)
}

#[test]
fn layer_zoo_matches_torch_in_train_and_eval_mode() {
    let all = fixture();
    let mut net = zoo();
    state_dict::load_state_dict(&net, &group(&all, "zoo"), true).unwrap();
    let io = group(&all, "zoo_io");

    net.train(true);
    assert_close(&run(&net, &io["x"]), &io["y_train"], "zoo train output");
    // The running statistics and batch counts after one training step.
    let after = group(&all, "zoo_after");
    let sd: HashMap<String, Tensor> = net.state_dict().into_iter().collect();
    assert_eq!(sd.len(), after.len());
    for (k, want) in after.iter() {
        let got = &sd[k];
        assert_eq!(got.dtype(), want.dtype(), "{k} dtype");
        assert_close(got, want, k);
    }
    assert_eq!(sd["1.num_batches_tracked"].to_scalar::<i64>().unwrap(), 4);

    net.eval();
    assert!(!net.is_training());
    assert_close(&run(&net, &io["x"]), &io["y_eval"], "zoo eval output");
}

#[test]
fn state_dict_order_is_pytorchs() {
    let keys: Vec<String> = zoo().state_dict().into_iter().map(|(k, _)| k).collect();
    let want = [
        "0.weight",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "3.weight",
        "3.bias",
        "4.weight",
        "4.bias",
        "6.weight",
        "6.bias",
        "10.weight",
        "10.bias",
        "11.weight",
        "11.bias",
        "12.weight",
        "12.bias",
        "12.running_mean",
        "12.running_var",
        "12.num_batches_tracked",
    ];
    assert_eq!(keys, want);
    let n: Vec<String> = zoo().named_buffers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        n[..3],
        ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    );
}

#[test]
fn embedding_matches_torch() {
    let all = fixture();
    let emb = Embedding::new(7, 3, Some(2)).unwrap();
    state_dict::load_state_dict(&emb, &group(&all, "emb"), true).unwrap();
    let io = group(&all, "emb_io");
    assert_close(&run(&emb, &io["idx"]), &io["y"], "embedding");
}

#[test]
fn multihead_attention_matches_torch() {
    let all = fixture();
    let mut mha = MultiheadAttention::new(8, 2, 0.0, true).unwrap();
    mha.eval();
    let report = state_dict::load_state_dict(&mha, &group(&all, "mha"), true).unwrap();
    assert!(report.is_clean());
    let io = group(&all, "mha_io");
    let kpm = io["kpm"].to_dtype(DType::Bool).unwrap();
    let [q, k, v] = ["q", "k", "v"].map(|n| Var::constant(io[n].clone()));
    let masks = MhaMasks {
        key_padding_mask: Some(&kpm),
        ..Default::default()
    };
    let y = no_grad(|| mha.attend(&q, &k, &v, masks)).unwrap();
    assert_close(y.tensor(), &io["y"], "mha");
}

#[test]
fn transformer_encoder_layers_match_torch() {
    let all = fixture();
    for (name, norm_first) in [("tel_post", false), ("tel_pre", true)] {
        let opts = TransformerOptions {
            dim_feedforward: 16,
            activation: Activation::Gelu,
            norm_first,
            ..Default::default()
        };
        let mut tel = TransformerEncoderLayer::new(8, 2, opts).unwrap();
        tel.eval();
        let report = state_dict::load_state_dict(&tel, &group(&all, name), true).unwrap();
        assert!(report.is_clean(), "{name}: {report}");
        let io = group(&all, &format!("{name}_io"));
        assert_close(&run(&tel, &io["x"]), &io["y"], name);
    }
}
