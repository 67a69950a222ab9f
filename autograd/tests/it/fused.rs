//! The ops backed by the tensor crate's fused kernels (softmax,
//! log_softmax, cross-entropy with class indices, layer_norm, batch_norm in
//! training and eval, group_norm) agree with the same functions composed
//! from differentiable primitives, in output and in every gradient, on
//! random shapes, dims and non-contiguous inputs, in f32 and f64.
//!
//! Tolerances, relative to `1 + |composed|`: 2e-5 in f32 (the fused
//! kernels accumulate in f32 with SIMD lanes, the compositions in another
//! order; the normalizations 1e-4, their gradients scale with 1/σ), 1e-11
//! in f64.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tessera_autograd::{CrossEntropyOptions, Reduction, Target, Var};
use tessera_tensor::{manual_seed, DType, Result, Tensor};

type TestResult = std::result::Result<(), TestCaseError>;

/// How the op sees its input: the leaf is stored in another layout and
/// viewed back, so the fused kernels read strided data.
#[derive(Debug, Clone, Copy)]
enum Arrange {
    Contiguous,
    /// Stored with the dims reversed, then permuted back.
    Transposed,
    /// Stored flipped along every dim (negative strides).
    Flipped,
    /// Stored with the last dim doubled, every second element taken.
    Strided,
}

impl Arrange {
    fn stored(self, shape: &[usize]) -> Vec<usize> {
        match self {
            Arrange::Contiguous | Arrange::Flipped => shape.to_vec(),
            Arrange::Transposed => shape.iter().rev().copied().collect(),
            Arrange::Strided => {
                let mut s = shape.to_vec();
                *s.last_mut().expect("rank ≥ 1") *= 2;
                s
            }
        }
    }

    fn apply(self, x: &Var) -> Result<Var> {
        let nd = x.ndim() as isize;
        match self {
            Arrange::Contiguous => Ok(x.clone()),
            Arrange::Transposed => x.permute(&(0..nd).rev().collect::<Vec<_>>()),
            Arrange::Flipped => x.flip(&(0..nd).collect::<Vec<_>>()),
            Arrange::Strided => {
                let n = x.shape()[nd as usize - 1];
                x.slice(-1, 0, n, 2)
            }
        }
    }
}

fn arrange() -> impl Strategy<Value = Arrange> {
    prop_oneof![
        Just(Arrange::Contiguous),
        Just(Arrange::Transposed),
        Just(Arrange::Flipped),
        Just(Arrange::Strided),
    ]
}

/// A random input: its shape as the op sees it, layout, dtype and a seed
/// for its values (uniform in ±3) and the upstream gradient.
#[derive(Debug, Clone)]
struct Input {
    shape: Vec<usize>,
    arrange: Arrange,
    dtype: DType,
    seed: u64,
}

impl Input {
    /// Two independent leaves holding the same stored values (one for the
    /// fused graph, one for the composed), and the views the ops see.
    fn leaves(&self) -> Result<([Var; 2], [Var; 2])> {
        manual_seed(self.seed);
        let stored = Tensor::rand(&self.arrange.stored(&self.shape), DType::F64)?
            .mul_scalar(6.0)?
            .sub_scalar(3.0)?
            .to_dtype(self.dtype)
            .unwrap();
        let leaves = [Var::leaf(stored.clone()), Var::leaf(stored)];
        let views = [self.arrange.apply(&leaves[0])?, self.arrange.apply(&leaves[1])?];
        Ok((leaves, views))
    }

    fn tol(&self, f32_tol: f64) -> f64 {
        if self.dtype == DType::F32 {
            f32_tol
        } else {
            1e-11
        }
    }
}

fn input(ranks: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Input> {
    (
        prop::collection::vec(1usize..=7, ranks),
        arrange(),
        prop_oneof![Just(DType::F32), Just(DType::F64)],
        any::<u64>(),
    )
        .prop_map(|(shape, arrange, dtype, seed)| Input {
            shape,
            arrange,
            dtype,
            seed,
        })
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

fn fail(e: tessera_tensor::Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .expect("f64")
}

/// Asserts `got` equals `want` elementwise within `tol·(1 + |want|)`.
fn close(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> TestResult {
    prop_assert_eq!(got.shape(), want.shape(), "{} shape", what);
    prop_assert_eq!(got.dtype(), want.dtype(), "{} dtype", what);
    for (i, (g, w)) in values(got).iter().zip(values(want)).enumerate() {
        prop_assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{} element {}: fused {} vs composed {}",
            what,
            i,
            g,
            w
        );
    }
    Ok(())
}

/// Backpropagates the same random gradient through the fused and the
/// composed result and compares outputs and the gradients of each pair of
/// leaves.
fn compare(fused: &Var, composed: &Var, pairs: &[(&Var, &Var)], seed: u64, tol: f64) -> TestResult {
    close("output", fused.tensor(), composed.tensor(), tol)?;
    manual_seed(seed ^ 0x9e37_79b9);
    let g = Tensor::randn(fused.shape(), DType::F64)
        .map_err(fail)?
        .to_dtype(fused.dtype())
        .unwrap();
    let gf = fused.backward_with(&g).map_err(fail)?;
    let gc = composed.backward_with(&g).map_err(fail)?;
    for (k, (a, b)) in pairs.iter().enumerate() {
        let (Some(ga), Some(gb)) = (gf.get(a), gc.get(b)) else {
            return Err(TestCaseError::fail(format!("leaf {k} got no gradient")));
        };
        close(&format!("gradient {k}"), ga, gb, tol)?;
    }
    Ok(())
}

/// softmax composed from exp, sum and div (inputs stay within ±3, so no
/// shift is needed).
fn softmax_composed(x: &Var, d: isize) -> Result<Var> {
    let e = x.exp()?;
    e.div(&e.sum(&[d], true)?)
}

/// log_softmax composed as x − log Σ exp x.
fn log_softmax_composed(x: &Var, d: isize) -> Result<Var> {
    x.sub(&x.exp()?.sum(&[d], true)?.log()?)
}

#[test]
fn softmax_and_log_softmax_match_their_compositions() {
    let s = input(1..=4).prop_flat_map(|inp| {
        let nd = inp.shape.len() as isize;
        (Just(inp), -nd..nd, any::<bool>())
    });
    runner(48)
        .run(&s, |(inp, d, log)| {
            let ([lf, lc], [xf, xc]) = inp.leaves().map_err(fail)?;
            let (fused, composed) = if log {
                (xf.log_softmax(d), log_softmax_composed(&xc, d))
            } else {
                (xf.softmax(d), softmax_composed(&xc, d))
            };
            compare(
                &fused.map_err(fail)?,
                &composed.map_err(fail)?,
                &[(&lf, &lc)],
                inp.seed,
                inp.tol(2e-5),
            )
        })
        .unwrap();
}

/// Cross-entropy with class-index targets composed from log_softmax (itself
/// composed), a constant weight tensor and a sum: per sample
/// −Σ_c w_c·logp_c with w = (1−ε)·onehot + ε/C, zero for ignored targets.
fn cross_entropy_composed(x: &Var, targets: &[i64], opts: &CrossEntropyOptions) -> Result<Var> {
    let cdim = if x.ndim() == 1 { 0 } else { 1 };
    let c = x.shape()[cdim];
    // Targets enumerate [N, d1, ...] row-major; classes sit at dim 1.
    let inner: usize = x.shape()[cdim + 1..].iter().product();
    let mut w = vec![0.0f64; x.numel()];
    let eps = opts.label_smoothing;
    for (r, &t) in targets.iter().enumerate() {
        if t == opts.ignore_index {
            continue;
        }
        let (n, i) = (r / inner, r % inner);
        for k in 0..c {
            let at = (n * c + k) * inner + i;
            w[at] = eps / c as f64 + if k as i64 == t { 1.0 - eps } else { 0.0 };
        }
    }
    let w = Var::constant(Tensor::from_vec(w, x.shape())?.to_dtype(x.dtype()).unwrap());
    let logp = log_softmax_composed(x, cdim as isize)?;
    let per = logp.mul(&w)?.sum(&[cdim as isize], false)?.neg()?;
    match opts.reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => per.sum(&[], false),
        Reduction::Mean => {
            let count = targets.iter().filter(|&&t| t != opts.ignore_index).count();
            per.sum(&[], false)?.div_scalar(count as f64)
        }
    }
}

#[test]
fn cross_entropy_matches_its_composition() {
    let s = input(1..=4).prop_flat_map(|inp| {
        let c = if inp.shape.len() == 1 {
            inp.shape[0]
        } else {
            inp.shape[1]
        };
        let rows = inp.numel_without_classes();
        (
            Just(inp),
            prop::collection::vec(-1i64..c as i64, rows),
            0usize..3,
            prop_oneof![Just(0.0), Just(0.1), Just(0.35)],
            any::<bool>(),
        )
    });
    runner(64)
        .run(&s, |(inp, raw, red, eps, ignore_one)| {
            let ignore_index = if ignore_one { 1 } else { -100 };
            let targets: Vec<i64> = raw
                .iter()
                .map(|&t| if t < 0 { ignore_index } else { t })
                .collect();
            prop_assume!(targets.iter().any(|&t| t != ignore_index));
            let mut tshape = inp.shape.clone();
            if tshape.len() == 1 {
                tshape.clear();
            } else {
                tshape.remove(1);
            }
            let t = Tensor::from_vec(targets.clone(), &tshape).map_err(fail)?;
            let opts = CrossEntropyOptions {
                ignore_index,
                label_smoothing: eps,
                reduction: [Reduction::None, Reduction::Mean, Reduction::Sum][red],
            };
            let ([lf, lc], [xf, xc]) = inp.leaves().map_err(fail)?;
            let fused = xf.cross_entropy(Target::Indices(&t), &opts).map_err(fail)?;
            let composed = cross_entropy_composed(&xc, &targets, &opts).map_err(fail)?;
            compare(&fused, &composed, &[(&lf, &lc)], inp.seed, inp.tol(2e-5))
        })
        .unwrap();
}

impl Input {
    /// The number of class-index targets for logits of this shape.
    fn numel_without_classes(&self) -> usize {
        match self.shape.len() {
            1 => 1,
            _ => self.shape.iter().product::<usize>() / self.shape[1],
        }
    }
}

/// layer_norm over the last `m` dims composed from mean, sub, square,
/// rsqrt, mul and add.
fn layer_norm_composed(x: &Var, m: usize, w: Option<&Var>, b: Option<&Var>, eps: f64) -> Result<Var> {
    let nd = x.ndim() as isize;
    let dims: Vec<isize> = (nd - m as isize..nd).collect();
    let mut y = normalize_composed(x, &dims, eps)?;
    if let Some(w) = w {
        y = y.mul(w)?;
    }
    if let Some(b) = b {
        y = y.add(b)?;
    }
    Ok(y)
}

#[test]
fn layer_norm_matches_its_composition() {
    let s = input(1..=4).prop_flat_map(|inp| {
        let nd = inp.shape.len();
        (Just(inp), 1..=nd.min(2), any::<bool>(), any::<bool>())
    });
    runner(48)
        .run(&s, |(inp, m, with_w, with_b)| {
            let ns = inp.shape[inp.shape.len() - m..].to_vec();
            // Rows of one element have zero variance: their gradient is
            // all rounding.
            prop_assume!(ns.iter().product::<usize>() >= 3);
            let ([lf, lc], [xf, xc]) = inp.leaves().map_err(fail)?;
            manual_seed(inp.seed.wrapping_add(1));
            let param = |on: bool, shift: f64| -> Result<Option<[Var; 2]>> {
                if !on {
                    return Ok(None);
                }
                let t = Tensor::randn(&ns, DType::F64)?
                    .add_scalar(shift)?
                    .to_dtype(inp.dtype)
                    .unwrap();
                Ok(Some([Var::leaf(t.clone()), Var::leaf(t)]))
            };
            let w = param(with_w, 1.0).map_err(fail)?;
            let b = param(with_b, 0.0).map_err(fail)?;
            let eps = 1e-5;
            let fused = xf
                .layer_norm(&ns, w.as_ref().map(|p| &p[0]), b.as_ref().map(|p| &p[0]), eps)
                .map_err(fail)?;
            let composed =
                layer_norm_composed(&xc, m, w.as_ref().map(|p| &p[1]), b.as_ref().map(|p| &p[1]), eps)
                    .map_err(fail)?;
            let mut pairs = vec![(&lf, &lc)];
            pairs.extend(w.iter().chain(&b).map(|p| (&p[0], &p[1])));
            compare(&fused, &composed, &pairs, inp.seed, inp.tol(1e-4))
        })
        .unwrap();
}

/// `t` (`[C]`) shaped to broadcast along dim 1 of a rank-`nd` value.
fn per_channel(t: &Var, nd: usize) -> Result<Var> {
    let mut shape = vec![Some(1); nd];
    shape[1] = None;
    t.reshape(shape)
}

/// Optional weight and bias `[c]` as two pairs of identical leaves (fused,
/// composed), weight around 1.
fn affine(c: usize, dtype: DType, seed: u64, with_w: bool, with_b: bool) -> Result<[Option<[Var; 2]>; 2]> {
    manual_seed(seed.wrapping_add(1));
    let param = |on: bool, shift: f64| -> Result<Option<[Var; 2]>> {
        if !on {
            return Ok(None);
        }
        let t = Tensor::randn(&[c], DType::F64)?
            .add_scalar(shift)?
            .to_dtype(dtype)
            .unwrap();
        Ok(Some([Var::leaf(t.clone()), Var::leaf(t)]))
    };
    Ok([param(with_w, 1.0)?, param(with_b, 0.0)?])
}

/// y·w + b with per-channel w and b (when given).
fn scale_shift(mut y: Var, w: Option<&Var>, b: Option<&Var>) -> Result<Var> {
    let nd = y.ndim();
    if let Some(w) = w {
        y = y.mul(&per_channel(w, nd)?)?;
    }
    if let Some(b) = b {
        y = y.add(&per_channel(b, nd)?)?;
    }
    Ok(y)
}

/// (x − mean)/√(var + eps) over `dims` (biased variance), composed.
fn normalize_composed(x: &Var, dims: &[isize], eps: f64) -> Result<Var> {
    let xc = x.sub(&x.mean(dims, true)?)?;
    let var = xc.square()?.mean(dims, true)?;
    xc.mul(&var.add_scalar(eps)?.rsqrt()?)
}

#[test]
fn batch_norm_matches_its_composition_in_training_and_eval() {
    let s = input(2..=4).prop_flat_map(|inp| (Just(inp), any::<bool>(), any::<bool>(), any::<bool>()));
    runner(48)
        .run(&s, |(inp, training, with_w, with_b)| {
            let c = inp.shape[1];
            prop_assume!(!training || inp.shape.iter().product::<usize>() / c >= 3);
            let ([lf, lc], [xf, xc]) = inp.leaves().map_err(fail)?;
            let [w, b] = affine(c, inp.dtype, inp.seed, with_w, with_b).map_err(fail)?;
            let (wf, bf) = (w.as_ref().map(|p| &p[0]), b.as_ref().map(|p| &p[0]));
            let (wc, bc) = (w.as_ref().map(|p| &p[1]), b.as_ref().map(|p| &p[1]));
            let rm = Tensor::randn(&[c], DType::F64)
                .map_err(fail)?
                .to_dtype(inp.dtype)
                .unwrap();
            let rv = Tensor::rand(&[c], DType::F64)
                .and_then(|t| t.add_scalar(0.5))
                .map_err(fail)?
                .to_dtype(inp.dtype)
                .unwrap();
            let eps = 1e-5;
            let fused = xf
                .batch_norm(Some(&rm), Some(&rv), wf, bf, training, 0.1, eps)
                .map_err(fail)?
                .y;
            let nd = inp.shape.len();
            let normalized = if training {
                let dims: Vec<isize> = (0..nd as isize).filter(|&d| d != 1).collect();
                normalize_composed(&xc, &dims, eps)
            } else {
                let mean = per_channel(&Var::constant(rm.clone()), nd).map_err(fail)?;
                let rstd = Var::constant(rv.add_scalar(eps).and_then(|v| v.rsqrt()).map_err(fail)?);
                xc.sub(&mean).and_then(|y| y.mul(&per_channel(&rstd, nd)?))
            }
            .map_err(fail)?;
            let composed = scale_shift(normalized, wc, bc).map_err(fail)?;
            let mut pairs = vec![(&lf, &lc)];
            pairs.extend(w.iter().chain(&b).map(|p| (&p[0], &p[1])));
            compare(&fused, &composed, &pairs, inp.seed, inp.tol(1e-4))
        })
        .unwrap();
}

#[test]
fn group_norm_matches_its_composition() {
    let s = input(2..=4).prop_flat_map(|inp| {
        let c = inp.shape[1];
        let groups: Vec<usize> = (1..=c).filter(|g| c % g == 0).collect();
        (
            Just(inp),
            prop::sample::select(groups),
            any::<bool>(),
            any::<bool>(),
        )
    });
    runner(48)
        .run(&s, |(inp, groups, with_w, with_b)| {
            let c = inp.shape[1];
            prop_assume!(inp.shape.iter().product::<usize>() / inp.shape[0] / groups >= 3);
            let ([lf, lc], [xf, xc]) = inp.leaves().map_err(fail)?;
            let [w, b] = affine(c, inp.dtype, inp.seed, with_w, with_b).map_err(fail)?;
            let eps = 1e-5;
            let fused = xf
                .group_norm(groups, w.as_ref().map(|p| &p[0]), b.as_ref().map(|p| &p[0]), eps)
                .map_err(fail)?;
            let normalized = xc
                .reshape((inp.shape[0], groups, ()))
                .and_then(|g| normalize_composed(&g, &[-1], eps))
                .and_then(|y| y.reshape(&inp.shape))
                .map_err(fail)?;
            let composed = scale_shift(normalized, w.as_ref().map(|p| &p[1]), b.as_ref().map(|p| &p[1]))
                .map_err(fail)?;
            let mut pairs = vec![(&lf, &lc)];
            pairs.extend(w.iter().chain(&b).map(|p| (&p[0], &p[1])));
            compare(&fused, &composed, &pairs, inp.seed, inp.tol(1e-4))
        })
        .unwrap();
}
