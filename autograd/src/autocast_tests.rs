use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::profile::{profile, Phase};
use tessera_tensor::{DType, Result, Tensor};

use super::*;
use crate::{
    checkpoint, no_grad, scaled_dot_product_attention, AttnOptions, CrossEntropyOptions, Reduction, Target,
};

/// Deterministic values in (−1, 1) of `shape`, different per `seed`.
fn data(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as f64 * 0.7368 + seed as f64 * 1.913).sin() * 0.9) as f32)
        .collect();
    Tensor::from_vec(v, shape).unwrap().to_dtype(dtype).unwrap()
}

fn leaf(shape: &[usize], seed: u64) -> Var {
    Var::leaf(data(shape, seed, DType::F32))
}

fn constant(shape: &[usize], seed: u64, dtype: DType) -> Var {
    Var::constant(data(shape, seed, dtype))
}

/// The number of `to_dtype` nodes a backward from `loss` runs: the casts the
/// forward recorded.
fn cast_nodes(loss: &Var) -> usize {
    let (grads, prof) = profile(|| loss.backward());
    grads.unwrap();
    prof.events
        .iter()
        .filter(|e| e.name == "to_dtype" && e.phase == Phase::Backward)
        .count()
}

type OpCase = (&'static str, fn(&Var, &Var) -> Result<Var>);

/// Every op with a policy, applied to `a` and `b` (both `[4, 4]`).
fn cases() -> Vec<(CastPolicy, OpCase)> {
    let ce = |a: &Var, _: &Var| {
        let y = Tensor::from_vec(vec![0i64, 1, 2, 3], &[4])?;
        a.cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())
    };
    let conv = |a: &Var, b: &Var| {
        let x = a.reshape([1, 1, 4, 4])?;
        let w = b.narrow(0, 0, 3)?.narrow(1, 0, 3)?.reshape([1, 1, 3, 3])?;
        x.conv2d(&w, None, &Conv2dParams::default())
    };
    let sdpa = |a: &Var, b: &Var| scaled_dot_product_attention(a, b, b, &AttnOptions::default());
    vec![
        (CastPolicy::LowerPrecision, ("matmul", |a, b| a.matmul(b))),
        (
            CastPolicy::LowerPrecision,
            ("linear", |a, b| a.linear(b, Some(&b.select(0, 0)?))),
        ),
        (CastPolicy::LowerPrecision, ("conv2d", conv)),
        (CastPolicy::LowerPrecision, ("scaled_dot_product_attention", sdpa)),
        (CastPolicy::Fp32, ("exp", |a, _| a.exp())),
        (CastPolicy::Fp32, ("log", |a, _| a.abs()?.log())),
        (CastPolicy::Fp32, ("log1p", |a, _| a.abs()?.log1p())),
        (CastPolicy::Fp32, ("expm1", |a, _| a.expm1())),
        (CastPolicy::Fp32, ("rsqrt", |a, _| a.abs()?.rsqrt())),
        (CastPolicy::Fp32, ("recip", |a, _| a.recip())),
        (CastPolicy::Fp32, ("pow", |a, b| a.abs()?.pow(b))),
        (CastPolicy::Fp32, ("pow_scalar", |a, _| a.pow_scalar(3.0))),
        (CastPolicy::Fp32, ("rpow_scalar", |a, _| a.rpow_scalar(2.0))),
        (CastPolicy::Fp32, ("softmax", |a, _| a.softmax(-1))),
        (CastPolicy::Fp32, ("log_softmax", |a, _| a.log_softmax(-1))),
        (CastPolicy::Fp32, ("logsumexp", |a, _| a.logsumexp(&[1], false))),
        (CastPolicy::Fp32, ("sum", |a, _| a.sum(&[], false))),
        (CastPolicy::Fp32, ("mean", |a, _| a.mean(&[0], false))),
        (CastPolicy::Fp32, ("prod", |a, _| a.prod(&[1], false))),
        (CastPolicy::Fp32, ("cumsum", |a, _| a.cumsum(1))),
        (CastPolicy::Fp32, ("norm", |a, _| a.norm(2.0, &[], false))),
        (
            CastPolicy::Fp32,
            ("layer_norm", |a, b| {
                a.layer_norm(&[4], Some(&b.select(0, 0)?), Some(&b.select(0, 1)?), 1e-5)
            }),
        ),
        (
            CastPolicy::Fp32,
            ("batch_norm", |a, b| {
                let w = b.select(0, 0)?;
                a.batch_norm(None, None, Some(&w), None, true, 0.1, 1e-5)
                    .map(|o| o.y)
            }),
        ),
        (
            CastPolicy::Fp32,
            ("group_norm", |a, b| {
                a.group_norm(2, Some(&b.select(0, 0)?), None, 1e-5)
            }),
        ),
        (CastPolicy::Fp32, ("cross_entropy", ce)),
        (
            CastPolicy::Fp32,
            ("nll_loss", |a, _| {
                let y = Tensor::from_vec(vec![3i64, 2, 1, 0], &[4])?;
                a.log_softmax(-1)?.nll_loss(&y, -100, Reduction::Mean)
            }),
        ),
        (
            CastPolicy::Fp32,
            ("mse_loss", |a, b| a.mse_loss(b, Reduction::Mean)),
        ),
        (
            CastPolicy::Fp32,
            ("bce_with_logits", |a, _| {
                a.bce_with_logits(&Tensor::full(&[4, 4], 0.5, DType::F32)?, None, Reduction::Mean)
            }),
        ),
        (CastPolicy::Promote, ("add", |a, b| a.add(b))),
        (CastPolicy::Promote, ("sub", |a, b| a.sub(b))),
        (CastPolicy::Promote, ("mul", |a, b| a.mul(b))),
        (CastPolicy::Promote, ("div", |a, b| a.div(b))),
        (CastPolicy::Promote, ("maximum", |a, b| a.maximum(b))),
        (CastPolicy::Promote, ("minimum", |a, b| a.minimum(b))),
        (
            CastPolicy::Promote,
            ("where", |a, b| Var::where_(&a.tensor().gt_scalar(0.0)?, a, b)),
        ),
        (CastPolicy::Promote, ("cat", |a, b| Var::cat(&[a, b], 0))),
        (CastPolicy::Promote, ("stack", |a, b| Var::stack(&[a, b], 0))),
        (
            CastPolicy::Promote,
            ("scatter_add", |a, b| {
                a.scatter_add(0, &Tensor::zeros(&[4, 4], DType::I64)?, b)
            }),
        ),
        (CastPolicy::Unchanged, ("relu", |a, _| a.relu())),
        (
            CastPolicy::Unchanged,
            ("gelu", |a, _| a.gelu(tessera_tensor::GeluApprox::None)),
        ),
        (CastPolicy::Unchanged, ("transpose", |a, _| a.t())),
    ]
}

/// The dtype `policy` gives an op whose first input is `a` and second `b`
/// under autocast to `low`.
fn expected(policy: CastPolicy, low: DType, a: DType, b: DType) -> DType {
    match policy {
        CastPolicy::LowerPrecision => low,
        CastPolicy::Fp32 => DType::F32,
        CastPolicy::Promote => a.promote(b),
        CastPolicy::Unchanged => a,
    }
}

#[test]
fn the_table_gives_each_op_its_policy_and_output_dtype() {
    for (_, (name, _)) in cases() {
        let op = crate::ops::registry::DIFFERENTIABLE_OPS
            .iter()
            .chain(&[
                "scaled_dot_product_attention",
                "nll_loss",
                "mse_loss",
                "bce_with_logits",
            ])
            .find(|n| **n == name);
        assert!(op.is_some(), "{name} is not an op name");
    }
    for low in [DType::BF16, DType::F16] {
        for (policy, (name, f)) in cases() {
            // f32 inputs, low-precision inputs, and one of each (the second
            // a parameter, so gradients are checked to come back in f32).
            for (da, db) in [(DType::F32, DType::F32), (low, low), (low, DType::F32)] {
                let a = constant(&[4, 4], 1, da);
                let b = Var::leaf(data(&[4, 4], 2, db));
                let y = autocast(low, || f(&a, &b)).unwrap();
                assert_eq!(
                    y.dtype(),
                    expected(policy, low, da, db),
                    "{name} under autocast({low}) on ({da}, {db})"
                );
                // Ops that read only `a` leave nothing to differentiate.
                if y.requires_grad() {
                    let grads = y.sum(&[], false).unwrap().backward().unwrap();
                    let g = grads.get(&b).unwrap();
                    assert_eq!(g.dtype(), db, "{name}: gradient of a {db} input");
                }
            }
            // Outside autocast an f32 op stays f32, and mixing dtypes is an
            // error for two-input ops (no silent promotion on Vars).
            let (a, b) = (constant(&[4, 4], 1, DType::F32), leaf(&[4, 4], 2));
            assert_eq!(f(&a, &b).unwrap().dtype(), DType::F32, "{name} outside autocast");
        }
    }
    let (a, b) = (constant(&[4, 4], 1, DType::BF16), leaf(&[4, 4], 2));
    let err = a.add(&b).unwrap_err().to_string();
    assert!(err.contains("add") && err.contains("bfloat16"), "{err}");
}

#[test]
fn autocast_rejects_dtypes_other_than_f16_and_bf16() {
    for d in [DType::F32, DType::F64, DType::I64] {
        let err = autocast(d, || Ok(())).unwrap_err().to_string();
        assert!(err.contains("autocast") && err.contains(&d.to_string()), "{err}");
    }
    assert_eq!(autocast_dtype(), None);
}

#[test]
fn scopes_nest_and_an_inner_disabled_scope_turns_autocast_off() {
    let (a, b) = (leaf(&[3, 3], 1), leaf(&[3, 3], 2));
    autocast(DType::BF16, || {
        assert_eq!(a.matmul(&b)?.dtype(), DType::BF16);
        no_autocast(|| -> Result<()> {
            assert_eq!(autocast_dtype(), None);
            assert_eq!(a.matmul(&b)?.dtype(), DType::F32);
            // A scope inside the disabled one turns it on again.
            autocast(DType::F16, || {
                assert_eq!(a.matmul(&b)?.dtype(), DType::F16);
                Ok(())
            })
        })?;
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        assert_eq!(a.matmul(&b)?.dtype(), DType::BF16);
        Ok(())
    })
    .unwrap();
    assert_eq!(autocast_dtype(), None);
    assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F32);
    // An error inside the scope still restores the state and the cache.
    let err = autocast(DType::BF16, || -> Result<()> {
        a.matmul(&b)?;
        a.matmul(&leaf(&[2, 2], 3))?;
        Ok(())
    });
    assert!(err.is_err());
    assert_eq!(autocast_dtype(), None);
    assert_eq!(CACHE.with(|c| c.borrow().len()), 0);
}

#[test]
fn a_weight_is_cast_once_per_forward() {
    let (x, w) = (constant(&[2, 4], 1, DType::F32), leaf(&[4, 4], 2));
    // The weight is read by three ops and cast once; the bf16 result is
    // cast up to f32 for the sum. (x is a constant: its cast is no node.)
    let loss = autocast(DType::BF16, || {
        let h = x.linear(&w, None)?.relu()?.linear(&w, None)?.linear(&w, None)?;
        assert_eq!(CACHE.with(|c| c.borrow().len()), 1);
        h.sum(&[], false)
    })
    .unwrap();
    assert_eq!(
        CACHE.with(|c| c.borrow().len()),
        0,
        "emptied when the scope exits"
    );
    assert_eq!(cast_nodes(&loss), 2, "one cast of w, one for the sum");
    // A view of the weight is not a leaf: it is cast where it is used.
    let viewed = autocast(DType::BF16, || {
        x.linear(&w, None)?.matmul(&w.t()?)?.sum(&[], false)
    })
    .unwrap();
    assert_eq!(cast_nodes(&viewed), 3);
    // The cache is per scope: a second forward casts the weight again.
    let again = autocast(DType::BF16, || {
        x.linear(&w, None)?.linear(&w, None)?.sum(&[], false)
    })
    .unwrap();
    assert_eq!(cast_nodes(&again), 2);
    // Nested scopes share the cache; another dtype is another entry.
    let nested = autocast(DType::BF16, || {
        let h = x.linear(&w, None)?;
        let h = autocast(DType::BF16, || h.linear(&w, None))?;
        let h = autocast(DType::F16, || h.linear(&w, None))?;
        assert_eq!(CACHE.with(|c| c.borrow().len()), 2);
        h.sum(&[], false)
    })
    .unwrap();
    // w→bf16 once, then bf16 h→f16 and w→f16, and the sum's f16→f32.
    assert_eq!(cast_nodes(&nested), 4);
    // Without recording nothing is cached.
    autocast(DType::BF16, || {
        no_grad(|| x.linear(&w, None))?;
        assert_eq!(CACHE.with(|c| c.borrow().len()), 0);
        Ok(())
    })
    .unwrap();
}

/// The loss and the gradients of a two-layer MLP with a conv front end,
/// optionally under autocast.
fn mlp_grads(low: Option<DType>) -> (f32, Vec<(DType, Vec<f32>)>) {
    let x = constant(&[4, 1, 6, 6], 3, DType::F32);
    let conv_w = Var::leaf(data(&[3, 1, 3, 3], 4, DType::F32).mul_scalar(0.5).unwrap());
    let w1 = Var::leaf(data(&[8, 48], 5, DType::F32).mul_scalar(0.3).unwrap());
    let b1 = leaf(&[8], 6);
    let w2 = leaf(&[5, 8], 7);
    let y = Tensor::from_vec(vec![0i64, 4, 2, 1], &[4]).unwrap();
    let forward = || -> Result<Var> {
        let h = x.conv2d(&conv_w, None, &Conv2dParams::default())?.relu()?;
        let h = h
            .reshape([4, 48])?
            .linear(&w1, Some(&b1))?
            .gelu(tessera_tensor::GeluApprox::None)?;
        let logits = h.linear(&w2, None)?;
        let loss = logits.cross_entropy(Target::Indices(&y), &CrossEntropyOptions::default())?;
        Ok(loss)
    };
    let loss = match low {
        Some(d) => autocast(d, forward).unwrap(),
        None => forward().unwrap(),
    };
    assert_eq!(loss.dtype(), DType::F32, "the loss is computed in f32");
    let grads = loss.backward().unwrap();
    let gs = [&conv_w, &w1, &b1, &w2]
        .iter()
        .map(|p| {
            let g = grads.get(p).unwrap();
            (
                g.dtype(),
                g.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
            )
        })
        .collect();
    (loss.tensor().to_scalar::<f32>().unwrap(), gs)
}

#[test]
fn gradients_reach_f32_parameters_in_f32_and_match_the_f32_run() {
    let (loss32, g32) = mlp_grads(None);
    // Each gradient's error relative to its norm, in units of the low
    // dtype's rounding error u (bf16 2⁻⁸, f16 2⁻¹¹): every activation and
    // gradient on the way is rounded, and the conv weight's gradient, a sum
    // with cancellation over 4 samples, compounds them most (measured: 14u
    // in bf16, 8u in f16; the others 1–2u).
    for (low, u) in [(DType::BF16, 2f32.powi(-8)), (DType::F16, 2f32.powi(-11))] {
        let tol = 20.0 * u;
        let (loss, g) = mlp_grads(Some(low));
        assert!(
            (loss - loss32).abs() <= tol * loss32.abs(),
            "{low}: loss {loss} vs {loss32}"
        );
        for ((d, a), (_, b)) in g.iter().zip(&g32) {
            assert_eq!(*d, DType::F32, "{low}: gradients of f32 parameters are f32");
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
            let rel = norm(&diff) / norm(b);
            assert!(rel <= tol, "{low}: relative error {rel} > {tol}");
            assert!(rel > 0.0, "{low}: the run must actually compute in low precision");
        }
    }
}

#[test]
fn checkpointed_segments_recompute_under_the_forward_autocast_state() {
    let x = constant(&[3, 4], 1, DType::F32);
    let (w1, w2) = (leaf(&[4, 4], 2), leaf(&[4, 4], 3));
    let run = |ckpt: bool| {
        let loss = autocast(DType::BF16, || {
            let h = if ckpt {
                let (w1, w2) = (w1.clone(), w2.clone());
                checkpoint(
                    move |xs: &[Var]| Ok(vec![xs[0].linear(&w1, None)?.relu()?.linear(&w2, None)?]),
                    std::slice::from_ref(&x),
                )?
                .remove(0)
            } else {
                x.linear(&w1, None)?.relu()?.linear(&w2, None)?
            };
            assert_eq!(h.dtype(), DType::BF16);
            h.sum(&[], false)
        })
        .unwrap();
        // Backward outside the autocast region.
        let g = loss.backward().unwrap();
        [&w1, &w2].map(|w| g.get(w).unwrap().to_vec::<f32>().unwrap())
    };
    assert_eq!(run(true), run(false));
}
