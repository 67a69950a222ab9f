//! `tessera_tensor::profile` over a small pre-norm attention block's
//! training step on `Var`s: the table lists the step's ops in the forward
//! and in the backward pass (the autograd nodes and the kernels their rules
//! run), with operand shapes and bytes, and the trace marks the phases.

use tessera_autograd::{scaled_dot_product_attention, AttnOptions, CrossEntropyOptions, Target, Var};
use tessera_tensor::profile::{profile, Phase};
use tessera_tensor::{manual_seed, DType, GeluApprox, Result, Tensor};

fn leaf(shape: &[usize]) -> Var {
    Var::leaf(Tensor::randn(shape, DType::F32).unwrap())
}

#[test]
fn a_training_step_is_profiled_forward_and_backward() {
    manual_seed(0);
    let (b, l, e, heads, ff) = (2, 5, 16, 2, 32);
    let x = leaf(&[b, l, e]);
    let (ln_w, ln_b) = (leaf(&[e]), leaf(&[e]));
    let (w_qkv, w1, w2) = (leaf(&[3 * e, e]), leaf(&[ff, e]), leaf(&[e, ff]));
    let y = Tensor::randint(0, e as i64, &[b * l], DType::I64).unwrap();
    let step = || -> Result<()> {
        let h = x.layer_norm(&[e], Some(&ln_w), Some(&ln_b), 1e-5)?;
        let qkv = h.linear(&w_qkv, None)?.reshape([b, l, 3, heads, e / heads])?;
        let part = |k: isize| qkv.select(2, k)?.transpose(1, 2);
        let o = scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, &AttnOptions::default())?;
        let h = x.add(&o.transpose(1, 2)?.reshape([b, l, e])?)?;
        let h = h.add(&h.linear(&w1, None)?.gelu(GeluApprox::None)?.linear(&w2, None)?)?;
        let loss = h
            .reshape([b * l, e])?
            .cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())?;
        loss.backward().map(drop)
    };
    let (out, prof) = profile(step);
    out.unwrap();
    let rows = prof.summary();
    let expected = [
        (
            Phase::Forward,
            &[
                "layer_norm",
                "linear",
                "scaled_dot_product_attention",
                "gelu",
                "cross_entropy",
            ][..],
        ),
        (
            Phase::Backward,
            &[
                "gelu",
                "gelu_backward",
                "layer_norm_backward",
                "matmul",
                "scaled_dot_product_attention_backward",
            ][..],
        ),
    ];
    for (phase, names) in expected {
        for &name in names {
            let found = rows.iter().any(|r| r.name == name && r.phase == phase);
            assert!(found, "{phase:?} {name} missing:\n{}", prof.table(100));
        }
    }
    let fc1 = rows
        .iter()
        .find(|r| r.name == "linear" && r.phase == Phase::Forward && r.shapes[1] == [ff, e])
        .expect("the feed-forward expansion");
    assert_eq!((fc1.shapes[0].as_slice(), fc1.calls), (&[b, l, e][..], 1));
    assert!(fc1.bytes >= (b * l * ff * 4) as u64, "{fc1:?}");
    let recorded: u64 = prof.events.iter().map(|e| e.self_ns).sum();
    assert!(recorded > 0 && recorded <= prof.wall_ns);
    let trace = prof.chrome_trace();
    assert!(trace.contains("\"cat\":\"backward\"") && trace.contains("\"cat\":\"forward\""));
}
