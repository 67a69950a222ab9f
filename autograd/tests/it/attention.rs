//! The fused `scaled_dot_product_attention` against its composition from
//! matmul, masking, softmax and dropout
//! (`scaled_dot_product_attention_composite`): output and every gradient
//! (q, k, v, a learnable additive mask), on random shapes with L ≠ S,
//! E ≠ Ev, sizes across the 64-wide tiles, broadcast batch dims and
//! non-contiguous q/k/v views, for every mask kind and dropout (the same
//! seed draws the same mask on both paths).
//!
//! Tolerances, relative to `1 + |composed|`: 1e-5 in f32 (both sum in f32,
//! in different orders), 1e-11 in f64; f16 within 4e-3 and bf16 within
//! 3e-2 of the f32 composition on the same rounded inputs (one rounding of
//! the output and of each gradient: 2^-11 and 2^-8 relative, plus the
//! composition's own roundings of its f16/bf16 intermediates).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tessera_autograd::{
    scaled_dot_product_attention, scaled_dot_product_attention_composite, AttnMask, AttnOptions, Var,
};
use tessera_tensor::{manual_seed, DType, Result, Tensor};

type TestResult = std::result::Result<(), TestCaseError>;

/// One case: sizes, broadcasting, layout, mask kind and dtype.
#[derive(Debug, Clone)]
struct Case {
    b: usize,
    h: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    /// k and v have batch 1 (broadcast over q's batch).
    kv_broadcast: bool,
    /// q, k, v are `[b, T, h, D]` storage viewed as `[b, h, T, D]`
    /// (MultiheadAttention's head split), else contiguous.
    heads_view: bool,
    /// 0 none, 1 causal, 2 bool keep mask, 3 learnable additive `[h, L,
    /// S]`, 4 dropout, 5 causal + dropout + custom scale.
    kind: usize,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        (1usize..=2, 1usize..=3),
        (1usize..=80, 1usize..=80),
        (1usize..=20, 1usize..=20),
        (any::<bool>(), any::<bool>()),
        (0usize..6, any::<u64>()),
    )
        .prop_map(
            |((b, h), (l, s), (e, ev), (kv_broadcast, heads_view), (kind, seed))| Case {
                b,
                h,
                l,
                s,
                e,
                ev,
                kv_broadcast,
                heads_view,
                kind,
                seed,
            },
        )
}

/// A leaf of `[b, h, t, d]` values in `dtype` and the view the op sees.
fn operand(c: &Case, b: usize, t: usize, d: usize, n: u64, dtype: DType) -> Result<(Var, Var)> {
    manual_seed(c.seed ^ n);
    let shape = if c.heads_view {
        [b, t, c.h, d]
    } else {
        [b, c.h, t, d]
    };
    let leaf = Var::leaf(Tensor::randn(&shape, DType::F64)?.to_dtype(dtype)?);
    let seen = if c.heads_view {
        leaf.transpose(1, 2)?
    } else {
        leaf.clone()
    };
    Ok((leaf, seen))
}

/// The output and the gradients of (q, k, v, bias) of `f` on case `c`.
fn run(
    c: &Case,
    dtype: DType,
    f: fn(&Var, &Var, &Var, &AttnOptions<'_>) -> Result<Var>,
) -> Result<Vec<Vec<f64>>> {
    let kb = if c.kv_broadcast { 1 } else { c.b };
    let (ql, q) = operand(c, c.b, c.l, c.e, 1, dtype)?;
    let (kl, k) = operand(c, kb, c.s, c.e, 2, dtype)?;
    let (vl, v) = operand(c, kb, c.s, c.ev, 3, dtype)?;
    manual_seed(c.seed ^ 4);
    let bias = Var::leaf(Tensor::randn(&[c.h, c.l, c.s], DType::F64)?.to_dtype(dtype)?);
    let keep_v: Vec<bool> = Tensor::rand(&[c.l, c.s], DType::F64)?
        .to_vec::<f64>()?
        .iter()
        .enumerate()
        .map(|(f, x)| f % c.s == c.l.min(c.s) / 2 % c.s || *x > 0.4)
        .collect();
    let keep = Tensor::from_vec(keep_v, &[c.l, c.s])?;
    let w = Tensor::randn(&[c.b, c.h, c.l, c.ev], DType::F64)?.to_dtype(dtype)?;
    let opts = AttnOptions {
        mask: match c.kind {
            2 => Some(AttnMask::Keep(&keep)),
            3 => Some(AttnMask::Additive(&bias)),
            _ => None,
        },
        dropout_p: if c.kind >= 4 { 0.25 } else { 0.0 },
        is_causal: c.kind == 1 || c.kind == 5,
        scale: (c.kind == 5).then_some(0.3),
    };
    manual_seed(c.seed ^ 5);
    let y = f(&q, &k, &v, &opts)?;
    let grads = y.mul(&Var::constant(w))?.sum(&[], false)?.backward()?;
    let mut out = vec![y.tensor().to_dtype(DType::F64)?.to_vec::<f64>()?];
    for x in [&ql, &kl, &vl, &bias] {
        out.push(match grads.get(x) {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>()?,
            None => Vec::new(),
        });
    }
    Ok(out)
}

fn compare(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tol: f64) -> TestResult {
    let names = ["out", "dq", "dk", "dv", "dbias"];
    for (n, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert_eq!(g.len(), w.len(), "{} {}: lengths", what, names[n]);
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let ok = (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
            prop_assert!(ok, "{} {}[{}]: fused {} vs composed {}", what, names[n], i, a, b);
        }
    }
    Ok(())
}

fn check(c: Case) -> TestResult {
    let err = |e: tessera_tensor::Error| TestCaseError::fail(e.to_string());
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-11)] {
        let fused = run(&c, dtype, scaled_dot_product_attention).map_err(err)?;
        let composed = run(&c, dtype, scaled_dot_product_attention_composite).map_err(err)?;
        compare(&format!("{dtype}"), &fused, &composed, tol)?;
    }
    Ok(())
}

#[test]
fn fused_equals_composed_forward_and_gradients() {
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&cases(), check).unwrap();
}

/// Every size from one key to three tiles on both sides, each mask kind.
#[test]
fn fused_equals_composed_across_tile_edges() {
    for (l, s) in [(1, 1), (63, 65), (64, 64), (65, 129), (130, 7)] {
        for kind in 0..6 {
            let c = Case {
                b: 1,
                h: 2,
                l,
                s,
                e: 8,
                ev: 5,
                kv_broadcast: false,
                heads_view: true,
                kind,
                seed: (l * 1000 + s + kind) as u64,
            };
            check(c.clone()).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        }
    }
}

#[test]
fn half_precision_is_close_to_the_f32_composition() {
    for (dtype, tol) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
        for kind in 0..6 {
            let c = Case {
                b: 2,
                h: 2,
                l: 70,
                s: 67,
                e: 16,
                ev: 16,
                kv_broadcast: kind % 2 == 0,
                heads_view: true,
                kind,
                seed: 11 + kind as u64,
            };
            let fused = run(&c, dtype, scaled_dot_product_attention).unwrap();
            // The same rounded inputs, composed in f32.
            let composed = run_rounded(&c, dtype).unwrap();
            compare(&format!("{dtype} {c:?}"), &fused, &composed, tol).unwrap();
        }
    }
}

/// [`run`] of the composition in f32 on inputs rounded to `dtype`.
fn run_rounded(c: &Case, dtype: DType) -> Result<Vec<Vec<f64>>> {
    run(c, dtype, |q, k, v, o| {
        let f = |x: &Var| x.to_dtype(DType::F32);
        let bias = match o.mask {
            Some(AttnMask::Additive(b)) => Some(f(b)?),
            _ => None,
        };
        let opts = AttnOptions {
            mask: match (o.mask, &bias) {
                (Some(AttnMask::Additive(_)), Some(b)) => Some(AttnMask::Additive(b)),
                (m, _) => m,
            },
            ..*o
        };
        scaled_dot_product_attention_composite(&f(q)?, &f(k)?, &f(v)?, &opts)?.to_dtype(q.dtype())
    })
}

#[test]
fn a_query_with_every_key_masked_is_nan_on_both_paths() {
    let q = Var::leaf(Tensor::randn(&[1, 3, 4], DType::F32).unwrap());
    let keep = Tensor::from_vec(vec![true, false, false, false, true, true], &[3, 2]).unwrap();
    let opts = AttnOptions {
        mask: Some(AttnMask::Keep(&keep)),
        ..AttnOptions::default()
    };
    for f in [
        scaled_dot_product_attention,
        scaled_dot_product_attention_composite,
    ] {
        let y = f(
            &q,
            &q.narrow(1, 0, 2).unwrap(),
            &q.narrow(1, 0, 2).unwrap(),
            &opts,
        )
        .unwrap()
        .tensor()
        .to_vec::<f32>()
        .unwrap();
        assert!(y[..4].iter().chain(&y[8..]).all(|x| x.is_finite()), "{y:?}");
        assert!(y[4..8].iter().all(|x| x.is_nan()), "{y:?}");
    }
}
