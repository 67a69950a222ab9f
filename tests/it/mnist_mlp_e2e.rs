//! End to end: the MNIST MLP (784-128-10) trained for one epoch on the
//! 8,000 digits of `datasets/mnist` reaches ≥ 90% accuracy on its 2,000
//! test digits. nn layers, autograd, the SGD optimizer and the data crate's
//! IDX reader and sampler all take part.

use tessera::autograd::{no_grad, CrossEntropyOptions, Target, Var};
use tessera::data::formats::Mnist;
use tessera::data::DataLoader;
use tessera::nn::{models::mnist_mlp, Module};
use tessera::optim::{Optimizer, Sgd, SgdOptions};
use tessera::tensor::{manual_seed, DType, Tensor};

fn normalized(m: &Mnist) -> Tensor {
    m.images_tensor()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .mul_scalar(1.0 / (255.0 * 0.3081))
        .unwrap()
        .add_scalar(-0.1307 / 0.3081)
        .unwrap()
}

#[test]
fn mlp_reaches_90_percent_in_one_epoch() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/mnist");
    let train = Mnist::open(dir, true).unwrap();
    let test = Mnist::open(dir, false).unwrap();
    let (x_train, y_train) = (normalized(&train), train.labels_tensor().unwrap());
    let (x_test, y_test) = (normalized(&test), test.labels_tensor().unwrap());
    let loader = DataLoader::builder(train)
        .batch_size(64)
        .shuffle(true)
        .seed(7)
        .build()
        .unwrap();

    manual_seed(7);
    let model = mnist_mlp(&[128]).unwrap();
    let opts = SgdOptions {
        lr: 0.05,
        momentum: 0.9,
        ..Default::default()
    };
    let mut opt = Sgd::new(model.parameters(), opts).unwrap();
    let ce = CrossEntropyOptions::default();
    for idx in loader.batch_indices(0) {
        let idx = Tensor::from_vec(idx.iter().map(|&i| i as i64).collect(), &[idx.len()]).unwrap();
        let x = Var::constant(x_train.index_select(0, &idx).unwrap());
        let y = y_train.index_select(0, &idx).unwrap();
        let loss = model
            .forward(&x)
            .unwrap()
            .cross_entropy(Target::Indices(&y), &ce)
            .unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    }

    let logits = no_grad(|| model.forward(&Var::constant(x_test))).unwrap();
    let pred = logits
        .tensor()
        .argmax(Some(1), false)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let y = y_test.to_vec::<i64>().unwrap();
    let acc = pred.iter().zip(&y).filter(|(a, b)| a == b).count() as f64 / y.len() as f64;
    assert_eq!(y.len(), 2000);
    assert!(acc >= 0.90, "test accuracy {acc}");
}
