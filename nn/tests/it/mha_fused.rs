//! MultiheadAttention on the fused attention kernel (heads split and merged
//! as strided views) gives the output and gradients of the same layer
//! written out with copies and the composed attention, for every mask, and
//! its merge of the heads is a view, not a copy.

use tessera_autograd::{scaled_dot_product_attention_composite, AttnMask, AttnOptions, Gradients, Var};
use tessera_nn::*;
use tessera_tensor::{manual_seed, DType, Result, Tensor};

/// The layer written as before the fused kernel: heads split and merged
/// with `contiguous()` copies, attention composed of matmul and softmax.
fn reference(m: &MultiheadAttention, x: &Var, kpm: Option<&Tensor>, causal: bool) -> Result<Var> {
    let (b, l, e) = (x.shape()[0], x.shape()[1], m.embed_dim());
    let h = m.num_heads;
    let w = m.in_proj_weight.var()?;
    let bias = m.in_proj_bias.as_ref().expect("built with biases").var()?;
    let proj = |k: usize| -> Result<Var> {
        let y = x.linear(&w.narrow(0, k * e, e)?, Some(&bias.narrow(0, k * e, e)?))?;
        y.reshape([b, l, h, e / h])?.transpose(1, 2)?.contiguous()
    };
    let mask = kpm
        .map(|k| -> Result<Var> {
            let zeros = Tensor::zeros(k.shape(), DType::F32)?;
            let neg = Tensor::full(k.shape(), f64::NEG_INFINITY, DType::F32)?;
            Ok(Var::constant(
                Tensor::where_(k, &neg, &zeros)?.reshape([b, 1, 1, l])?,
            ))
        })
        .transpose()?;
    let opts = AttnOptions {
        mask: mask.as_ref().map(AttnMask::Additive),
        is_causal: causal,
        ..AttnOptions::default()
    };
    let o = scaled_dot_product_attention_composite(&proj(0)?, &proj(1)?, &proj(2)?, &opts)?;
    m.out_proj
        .forward(&o.transpose(1, 2)?.contiguous()?.reshape([b, l, e])?)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn grads_of(g: &Gradients, m: &MultiheadAttention, x: &Var) -> Vec<Vec<f32>> {
    let mut out = vec![values(g.get(x).unwrap())];
    for (_, p) in m.named_parameters() {
        out.push(values(g.get(&p.var().unwrap()).unwrap()));
    }
    out
}

#[test]
fn fused_mha_matches_the_composed_layer() {
    manual_seed(3);
    let (b, l, e, h) = (2, 70, 24, 3);
    let mha = MultiheadAttention::new(e, h, 0.0, true).unwrap();
    // Nonzero biases, so their gradients are exercised too.
    for (_, p) in mha.named_parameters() {
        p.set(
            Tensor::randn(&p.shape(), DType::F32)
                .unwrap()
                .mul_scalar(0.3)
                .unwrap(),
        )
        .unwrap();
    }
    let x = Var::leaf(Tensor::randn(&[b, l, e], DType::F32).unwrap());
    let w = Var::constant(Tensor::randn(&[b, l, e], DType::F32).unwrap());
    let kpm_v: Vec<bool> = (0..b * l).map(|i| i % l > l - 5 - i / l).collect();
    let kpm = Tensor::from_vec(kpm_v, &[b, l]).unwrap();
    for (kpm, causal) in [(None, false), (None, true), (Some(&kpm), false)] {
        let masks = MhaMasks {
            key_padding_mask: kpm,
            is_causal: causal,
            ..MhaMasks::default()
        };
        let y = mha.attend(&x, &x, &x, masks).unwrap();
        let gy = y.mul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let r = reference(&mha, &x, kpm, causal).unwrap();
        let gr = r.mul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let got = [vec![values(y.tensor())], grads_of(&gy, &mha, &x)].concat();
        let want = [vec![values(r.tensor())], grads_of(&gr, &mha, &x)].concat();
        for (n, (a, c)) in got.iter().zip(&want).enumerate() {
            for (i, (p, q)) in a.iter().zip(c).enumerate() {
                assert!(
                    (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                    "mask {kpm:?} causal {causal}: tensor {n}[{i}]: fused {p} vs composed {q}"
                );
            }
        }
    }
}

#[test]
fn heads_merge_without_a_copy() {
    manual_seed(4);
    let (b, l, e, h) = (2, 9, 12, 3);
    let x = Var::leaf(Tensor::randn(&[b, l, e], DType::F32).unwrap());
    let split = x.reshape([b, l, h, e / h]).unwrap().transpose(1, 2).unwrap();
    let o = tessera_autograd::scaled_dot_product_attention(&split, &split, &split, &AttnOptions::default())
        .unwrap();
    // Stored [b, l, h, d]: the merged view is contiguous, so reshape is free.
    assert!(o.transpose(1, 2).unwrap().tensor().is_contiguous());
    let g = o.sum(&[], false).unwrap().backward().unwrap();
    assert!(g.get(&x).unwrap().is_contiguous());
}
