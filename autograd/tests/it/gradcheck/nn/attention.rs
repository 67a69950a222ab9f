//! scaled_dot_product_attention with an additive (learnable) mask, a bool
//! mask, the causal mask and dropout: the fused op and its composition.

use proptest::prelude::*;
use tessera_autograd::{
    scaled_dot_product_attention, scaled_dot_product_attention_composite, AttnMask, AttnOptions,
    GradcheckReport, Var,
};
use tessera_tensor::{manual_seed, Tensor};

use super::{seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, Checked, Domain, Input};

/// Naive attention for one batch of `q` `[l, e]`, `k` `[s, e]`, `v`
/// `[s, ev]` with an additive bias `[l, s]` (−∞ masks).
fn naive(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: &[f64],
    (l, s, e, ev): (usize, usize, usize, usize),
    scale: f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..l {
        let sc: Vec<f64> = (0..s)
            .map(|j| (0..e).map(|p| q[i * e + p] * k[j * e + p]).sum::<f64>() * scale + bias[i * s + j])
            .collect();
        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for c in 0..ev {
            out.push((0..s).map(|j| w[j] / z * v[j * ev + c]).sum());
        }
    }
    out
}

/// The options of attention case `kind`: 0 additive `bias`, 1 bool `keep`
/// mask, 2 causal, 3 unmasked with the given `scale`.
fn options<'a>(kind: usize, bias: Option<&'a Var>, keep: &'a Tensor, scale: Option<f64>) -> AttnOptions<'a> {
    AttnOptions {
        mask: match kind {
            0 => bias.map(AttnMask::Additive),
            1 => Some(AttnMask::Keep(keep)),
            _ => None,
        },
        is_causal: kind == 2,
        scale,
        ..AttnOptions::default()
    }
}

/// q, k, v with batch `b` and sizes `l`, `s`, `e`, `ev`.
fn qkv() -> impl Strategy<Value = (Input, Input, Input, (usize, usize, usize, usize))> {
    (1usize..=2, 1usize..=3, 1usize..=3, 1usize..=3, 1usize..=2).prop_flat_map(|(b, l, s, e, ev)| {
        (
            input_of(vec![b, l, e], Domain::Any),
            input_of(vec![b, s, e], Domain::Any),
            input_of(vec![b, s, ev], Domain::Any),
            Just((l, s, e, ev)),
        )
    })
}

/// An attention entry point: the fused op or its composition.
type Sdpa = fn(&Var, &Var, &Var, &AttnOptions<'_>) -> tessera_tensor::Result<Var>;

pub fn attention_case(n: u32) -> Checked {
    attention_case_of(n, scaled_dot_product_attention)
}

pub fn attention_composite_case(n: u32) -> Checked {
    attention_case_of(n, scaled_dot_product_attention_composite)
}

fn attention_case_of(n: u32, sdpa: Sdpa) -> Checked {
    let s = qkv().prop_flat_map(|qkv| {
        let (l, s) = (qkv.3 .0, qkv.3 .1);
        (
            Just(qkv),
            input_of(vec![l, s], Domain::Any),
            prop::collection::vec(any::<bool>(), l * s),
        )
    });
    prop(n, s, |((q, k, v, dims), bias, mut keep)| {
        let (l, s, _, _) = dims;
        // Every query keeps at least one key (else its row is NaN).
        for i in 0..l {
            keep[i * s] = true;
        }
        let keep_t = Tensor::from_vec(keep.clone(), &[l, s]).map_err(fail)?;
        // Every mask kind on the same inputs.
        let mut report: Option<GradcheckReport> = None;
        for kind in 0..4 {
            let r = attention_kind(sdpa, kind, (&q, &k, &v, &bias), dims, &keep, &keep_t)?;
            match &mut report {
                Some(acc) => acc.ops.extend(r.ops),
                None => report = Some(r),
            }
        }
        Ok(report.expect("four kinds ran"))
    })
}

/// Gradchecks attention case `kind` (see [`options`]) and compares its
/// forward with [`naive`].
fn attention_kind(
    sdpa: Sdpa,
    kind: usize,
    (q, k, v, bias): (&Input, &Input, &Input, &Input),
    dims: (usize, usize, usize, usize),
    keep: &[bool],
    keep_t: &Tensor,
) -> Result<GradcheckReport, TestCaseError> {
    let (l, s, e, ev) = dims;
    let scale = if kind == 3 { Some(0.7) } else { None };
    let leaves = [q.leaf(), k.leaf(), v.leaf(), bias.leaf()];
    let report = check(&leaves, |xs| {
        let b = view(bias, &xs[3])?;
        // Kinds other than 0 leave the bias unused: its gradient is 0.
        let opts = options(kind, Some(&b), keep_t, scale);
        sdpa(&view(q, &xs[0])?, &view(k, &xs[1])?, &view(v, &xs[2])?, &opts)
    })?;
    let add: Vec<f64> = match kind {
        0 => bias.seen(),
        1 => keep
            .iter()
            .map(|&k| if k { 0.0 } else { f64::NEG_INFINITY })
            .collect(),
        2 => (0..l * s)
            .map(|f| if f % s > f / s { f64::NEG_INFINITY } else { 0.0 })
            .collect(),
        _ => vec![0.0; l * s],
    };
    let (qs, ks, vs) = (q.seen(), k.seen(), v.seen());
    let sc = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let want: Vec<f64> = (0..q.shape[0])
        .flat_map(|bi| {
            naive(
                &qs[bi * l * e..],
                &ks[bi * s * e..],
                &vs[bi * s * ev..],
                &add,
                dims,
                sc,
            )
        })
        .collect();
    let bv = seen_var(bias)?;
    let opts = options(kind, Some(&bv), keep_t, scale);
    let y = sdpa(&seen_var(q)?, &seen_var(k)?, &seen_var(v)?, &opts).map_err(fail)?;
    close(y.tensor(), &want, 1e-12)?;
    Ok(report)
}

pub fn attention_dropout_case(n: u32) -> Checked {
    attention_dropout_case_of(n, scaled_dot_product_attention)
}

pub fn attention_composite_dropout_case(n: u32) -> Checked {
    attention_dropout_case_of(n, scaled_dot_product_attention_composite)
}

fn attention_dropout_case_of(n: u32, sdpa: Sdpa) -> Checked {
    prop(n, (qkv(), any::<u64>()), |((q, k, v, _), seed)| {
        let opts = AttnOptions {
            dropout_p: 0.3,
            is_causal: true,
            ..AttnOptions::default()
        };
        check(&[q.leaf(), k.leaf(), v.leaf()], |xs| {
            // Reseeding replays the same dropout mask on every evaluation.
            manual_seed(seed);
            sdpa(&view(&q, &xs[0])?, &view(&k, &xs[1])?, &view(&v, &xs[2])?, &opts)
        })
    })
}

/// Causal attention with dropout under `checkpoint` gives bitwise the same
/// gradients as without (the mask replays from the restored generator).
#[test]
fn checkpointed_attention_with_dropout_is_bitwise_equal() {
    let t = |seed: u64, shape: &[usize]| {
        manual_seed(seed);
        Tensor::randn(shape, tessera_tensor::DType::F64).unwrap()
    };
    let (q, k, v) = (
        Var::leaf(t(1, &[2, 4, 3])),
        Var::leaf(t(2, &[2, 4, 3])),
        Var::leaf(t(3, &[2, 4, 3])),
    );
    let opts = AttnOptions {
        dropout_p: 0.25,
        is_causal: true,
        ..AttnOptions::default()
    };
    manual_seed(9);
    let plain = scaled_dot_product_attention(&q, &k, &v, &opts)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    manual_seed(9);
    let ckpt = tessera_autograd::checkpoint(
        move |xs: &[Var]| Ok(vec![scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], &opts)?]),
        &[q.clone(), k.clone(), v.clone()],
    )
    .unwrap();
    let ckpt = ckpt[0].sum(&[], false).unwrap().backward().unwrap();
    for x in [&q, &k, &v] {
        let (a, b) = (
            plain.get(x).unwrap().to_vec::<f64>().unwrap(),
            ckpt.get(x).unwrap().to_vec::<f64>().unwrap(),
        );
        assert_eq!(a, b);
    }
    // Both a mask and is_causal is an error.
    let keep = Tensor::from_vec(vec![true; 16], &[4, 4]).unwrap();
    let bad = AttnOptions {
        mask: Some(AttnMask::Keep(&keep)),
        is_causal: true,
        ..AttnOptions::default()
    };
    assert!(scaled_dot_product_attention(&q, &k, &v, &bad).is_err());
}
