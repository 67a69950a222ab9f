//! Module naming, train/eval, parameter counting, and state-dict loading
//! errors and round trips through safetensors.

use tessera_nn::models::{mnist_cnn, mnist_mlp};
use tessera_nn::*;
use tessera_tensor::{DType, StateDict, Tensor};

fn bn_net() -> Sequential {
    Sequential::new()
        .with(Conv2d::new(3, 4, 3, Conv2dOptions::default().bias(false)).unwrap())
        .with(BatchNorm::new_2d(4, BatchNormOptions::default()).unwrap())
        .with(Dropout::new(0.5).unwrap())
}

#[test]
fn names_counts_and_modes() {
    let mut outer = Sequential::new()
        .with(bn_net())
        .with(Flatten::default())
        .with(Linear::new(4, 2, false).unwrap());
    let names: Vec<String> = outer.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.0.weight", "0.1.weight", "0.1.bias", "2.weight"]);
    assert_eq!(outer.num_parameters(), 4 * 3 * 9 + 4 + 4 + 8);
    assert!(outer.is_training());
    outer.eval();
    assert!(!outer.is_training());
    outer.train(true);
    assert!(outer.is_training());
    outer.parameters()[0].requires_grad_(false).unwrap();
    assert_eq!(outer.num_trainable_parameters(), 4 + 4 + 8);
}

#[test]
fn shared_parameters_are_listed_once_but_saved_under_each_name() {
    let a = Linear::new(3, 3, true).unwrap();
    let b = a.clone();
    let net = Sequential::new().with(a).with(b);
    assert_eq!(net.parameters().len(), 2);
    assert_eq!(net.state_dict().len(), 4);
}

#[test]
fn load_reports_missing_unexpected_and_mismatched_keys_by_name() {
    let net = bn_net();
    let mut sd: StateDict = net
        .state_dict()
        .into_iter()
        .filter(|(k, _)| k != "1.running_var")
        .collect();
    let before = net.state_dict();
    sd.insert("1.extra", Tensor::zeros(&[1], DType::F32).unwrap());
    sd.insert("1.weight", Tensor::ones(&[5], DType::F32).unwrap());
    sd.insert("0.weight", Tensor::full(&[4, 3, 3, 3], 0.5, DType::F64).unwrap());

    let err = state_dict::load_state_dict(&net, &sd, true)
        .unwrap_err()
        .to_string();
    for name in ["1.running_var", "1.extra", "1.weight"] {
        assert!(err.contains(name), "{err}");
    }
    assert!(err.contains("[4]") && err.contains("[5]"), "both shapes: {err}");
    // Strict failure changes nothing.
    assert_eq!(
        net.state_dict()
            .require("t", "0.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        before.require("t", "0.weight").unwrap().to_vec::<f32>().unwrap()
    );

    let report = net.load_state_dict(&sd, false).unwrap();
    assert_eq!(report.missing, ["1.running_var"]);
    assert_eq!(report.unexpected, ["1.extra"]);
    assert_eq!(report.mismatched, [("1.weight".to_string(), vec![4], vec![5])]);
    // The matching f64 tensor was loaded, cast to the parameter's f32.
    let w = net.state_dict().require("t", "0.weight").unwrap().clone();
    assert_eq!(w.dtype(), DType::F32);
    assert!(w.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.5));
}

#[test]
fn safetensors_round_trip_restores_every_value() {
    let dir = std::env::temp_dir().join(format!("tessera-nn-sd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cnn.safetensors");
    tessera_tensor::manual_seed(1);
    let a = mnist_cnn().unwrap();
    state_dict::save(&a, &path).unwrap();
    tessera_tensor::manual_seed(2);
    let b = mnist_cnn().unwrap();
    assert!(state_dict::load(&b, &path, true).unwrap().is_clean());
    let (sa, sb) = (a.state_dict(), b.state_dict());
    for ((ka, ta), (kb, tb)) in sa.iter().zip(sb.iter()) {
        assert_eq!(ka, kb);
        assert_eq!(ta.to_vec::<f32>().unwrap(), tb.to_vec::<f32>().unwrap(), "{ka}");
    }
    // An MLP's keys are not a CNN's: strict loading fails and names them.
    let mlp = mnist_mlp(&[16]).unwrap();
    let err = state_dict::load(&mlp, &path, true).unwrap_err().to_string();
    assert!(err.contains("1.weight") && err.contains("9.bias"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_configurations_are_errors() {
    assert!(Conv2d::new(3, 4, 3, Conv2dOptions::default().groups(2)).is_err());
    assert!(Conv2d::new(4, 4, 0, Conv2dOptions::default()).is_err());
    assert!(GroupNorm::new(3, 8, 1e-5, true).is_err());
    assert!(MultiheadAttention::new(10, 3, 0.0, true).is_err());
    assert!(Dropout::new(1.5).is_err());
    assert!(Embedding::new(3, 2, Some(3)).is_err());
    let bn = BatchNorm::new_2d(4, BatchNormOptions::default()).unwrap();
    let x = Var::constant(Tensor::zeros(&[2, 4], DType::F32).unwrap());
    assert!(bn.forward(&x).is_err());
    // A failed forward does not count a batch.
    let sd = bn.state_dict();
    assert_eq!(
        sd.require("t", "num_batches_tracked")
            .unwrap()
            .to_scalar::<i64>()
            .unwrap(),
        0
    );
    assert!(ModuleList::new().forward(&x).is_err());
    assert!(Linear::new(3, 2, true).unwrap().forward(&x).is_err());
}
