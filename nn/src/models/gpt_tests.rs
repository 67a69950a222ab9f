use tessera_autograd::Var;
use tessera_tensor::{Generator, Tensor};

use super::*;

fn tiny() -> GptConfig {
    GptConfig::new(20).block_size(6).n_layer(2).n_head(2).n_embd(8)
}

fn tokens(ids: &[i64]) -> Var {
    Var::constant(Tensor::from_slice(ids, &[1, ids.len()]).unwrap())
}

#[test]
fn parameter_count_follows_the_config_and_the_head_is_tied() {
    let model = Gpt::new(&tiny(), 0).unwrap();
    assert_eq!(model.num_parameters(), tiny().num_parameters());
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[..3], ["wte.weight", "wpe.weight", "h.0.ln_1.weight"]);
    assert!(names.contains(&"h.1.attn.c_attn.weight".to_string()));
    assert!(
        !names.iter().any(|n| n.contains("lm_head")),
        "the head is the token embedding"
    );
}

#[test]
fn logits_are_causal_and_seeded() {
    let a = Gpt::new(&tiny(), 3).unwrap();
    let b = Gpt::new(&tiny(), 3).unwrap();
    let x = a.forward(&tokens(&[1, 2, 3, 4])).unwrap();
    assert_eq!(x.shape(), &[1, 4, 20]);
    let y = b.forward(&tokens(&[1, 2, 3, 9])).unwrap();
    let first = |v: &Var| {
        v.tensor()
            .narrow(1, 0, 3)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(
        first(&x),
        first(&y),
        "a later token does not change earlier logits"
    );
    let last = |v: &Var| {
        v.tensor()
            .narrow(1, 3, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_ne!(last(&x), last(&y));
}

#[test]
fn bad_inputs_are_errors() {
    let model = Gpt::new(&tiny(), 0).unwrap();
    assert!(
        model.forward(&tokens(&[1; 7])).is_err(),
        "longer than the context"
    );
    assert!(
        model.forward(&tokens(&[25])).is_err(),
        "id outside the vocabulary"
    );
    assert!(
        Gpt::new(&tiny().n_head(3), 0).is_err(),
        "heads must divide the width"
    );
    assert!(model.generate(&[], 3, 1.0, &mut Generator::new(0)).is_err());
}

#[test]
fn generate_extends_the_prompt_past_the_context() {
    let model = Gpt::new(&tiny(), 0).unwrap();
    let a = model.generate(&[1, 2], 10, 0.8, &mut Generator::new(5)).unwrap();
    let b = model.generate(&[1, 2], 10, 0.8, &mut Generator::new(5)).unwrap();
    assert_eq!(a.len(), 12);
    assert_eq!(a, b, "the same generator draws the same text");
    assert!(a.iter().all(|&t| (0..20).contains(&t)));
    let greedy = model.generate(&[1, 2], 1, 0.0, &mut Generator::new(0)).unwrap();
    let logits = model.forward(&tokens(&[1, 2])).unwrap();
    let last = logits
        .tensor()
        .narrow(1, 1, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let argmax = (0..20).max_by(|&i, &j| last[i].total_cmp(&last[j])).unwrap() as i64;
    assert_eq!(greedy[2], argmax);
}
