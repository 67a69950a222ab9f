//! The model zoo under autocast: every family (ResNet with batch norm, ViT
//! with attention and layer norm, CoAtNet, the MNIST CNN, the GPT with its
//! tied embedding) runs forward and backward inside `autocast(bf16|f16)`
//! without a dtype error, gives every f32 parameter a finite f32 gradient,
//! and computes logits close to the f32 forward.

use tessera_autograd::{autocast, Var};
use tessera_nn::models::{mnist_cnn, Gpt, GptConfig};
use tessera_nn::Module;
use tessera_tensor::{DType, Tensor};

use crate::models::{randn, small_models};

/// ‖a − b‖ / ‖b‖ of two tensors of one shape, in f32.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.to_dtype(DType::F32)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        b.contiguous().unwrap().to_vec::<f32>().unwrap(),
    );
    let d: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    (d / b.iter().map(|y| y * y).sum::<f32>()).sqrt()
}

fn check_grads(name: &str, model: &dyn Module, grads: &tessera_autograd::Gradients) {
    for (pname, p) in model.named_parameters() {
        let g = p
            .grad(grads)
            .unwrap_or_else(|| panic!("{name}: no gradient for {pname}"));
        assert_eq!(g.dtype(), DType::F32, "{name}: {pname}");
        let v = g.contiguous().unwrap().to_vec::<f32>().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{name}: {pname} not finite");
    }
}

#[test]
fn every_model_family_trains_under_autocast_with_f32_gradients() {
    for low in [DType::BF16, DType::F16] {
        // The low dtype's rounding error u: logits of a few layers stay
        // within some tens of u of the f32 forward.
        let tol = 64.0
            * if low == DType::BF16 {
                2f32.powi(-8)
            } else {
                2f32.powi(-11)
            };
        let mut models = small_models(0.0);
        models.push(("mnist_cnn", Box::new(mnist_cnn().unwrap()), 28));
        for (name, model, side) in models {
            let c = if name == "mnist_cnn" { 1 } else { 3 };
            let x = Var::constant(randn(&[2, c, side, side], 1));
            let reference = model.forward(&x).unwrap();
            let logits = autocast(low, || model.forward(&x)).unwrap();
            // The head is a linear layer: its output is in the low dtype.
            assert_eq!(logits.dtype(), low, "{name}");
            let err = rel_err(logits.tensor(), reference.tensor());
            assert!(
                err < tol,
                "{name} under {low}: logits differ by {err} (tolerance {tol})"
            );
            let w = Var::constant(randn(&[2, 10], 2));
            let loss = autocast(low, || logits.mul(&w)?.sum(&[0, 1], false)).unwrap();
            assert_eq!(loss.dtype(), DType::F32, "{name}: sums run in f32");
            check_grads(name, model.as_ref(), &loss.backward().unwrap());
        }
        let gpt = Gpt::new(&GptConfig::new(50).block_size(8).n_layer(2), 3).unwrap();
        let tokens = Tensor::from_vec((0..16).map(|i| i * 7 % 50).collect::<Vec<i64>>(), &[2, 8]).unwrap();
        let targets = Tensor::from_vec((0..16).map(|i| i * 3 % 50).collect::<Vec<i64>>(), &[2, 8]).unwrap();
        let reference = gpt.loss(&tokens, &targets).unwrap();
        let loss = autocast(low, || gpt.loss(&tokens, &targets)).unwrap();
        assert_eq!(loss.dtype(), DType::F32);
        let err = rel_err(loss.tensor(), reference.tensor());
        assert!(err < tol, "gpt under {low}: loss differs by {err}");
        check_grads("gpt", &gpt, &loss.backward().unwrap());
    }
}
