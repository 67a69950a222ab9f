//! Losses: cross-entropy (class indices with ignore_index and label
//! smoothing, probability targets), nll, mse and bce-with-logits, each
//! against a naive f64 reference and published values.

use proptest::prelude::*;
use tessera_autograd::{CrossEntropyOptions, Reduction, Target, Var};
use tessera_tensor::Tensor;

use super::{seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, tensor, Checked, Domain};

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

/// Naive cross-entropy of logits `x` `[rows, c]` (classes last) with
/// per-row class weights `w(row)`, zero-weight rows excluded from the
/// mean's `count`.
fn naive_ce(
    x: &[f64],
    c: usize,
    w: impl Fn(usize) -> Vec<f64>,
    reduction: Reduction,
    count: usize,
) -> Vec<f64> {
    let per: Vec<f64> = x
        .chunks(c)
        .enumerate()
        .map(|(r, row)| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            -row.iter().zip(w(r)).map(|(v, wc)| (v - lse) * wc).sum::<f64>()
        })
        .collect();
    match reduction {
        Reduction::None => per,
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / count as f64],
    }
}

/// `[N, C]` or `[N, C, D]` logits with classes at dim 1, as rows with
/// classes last.
fn rows_classes_last(x: &[f64], shape: &[usize]) -> Vec<f64> {
    if shape.len() == 2 {
        return x.to_vec();
    }
    let (nb, c, d) = (shape[0], shape[1], shape[2]);
    (0..nb * d)
        .flat_map(|r| (0..c).map(move |k| x[((r / d) * c + k) * d + r % d]))
        .collect()
}

pub fn cross_entropy_indices_case(n: u32) -> Checked {
    let s = (
        1usize..=3,
        2usize..=4,
        prop::option::of(1usize..=2),
        0usize..3,
        0usize..3,
    )
        .prop_flat_map(|(nb, c, d, red, smooth)| {
            let shape: Vec<usize> = [vec![nb, c], d.into_iter().collect()].concat();
            let rows = nb * d.unwrap_or(1);
            // -1 marks an ignored target (ignore_index = 1 or -100 below).
            (
                input_of(shape, Domain::Any),
                prop::collection::vec(-1i64..c as i64, rows),
                Just(red),
                Just(smooth),
                any::<bool>(),
            )
        });
    prop(n, s, |(x, raw, red, smooth, ignore_one)| {
        prop_assume!(raw.iter().any(|&t| t >= 0 && !(ignore_one && t == 1)));
        let ignore_index = if ignore_one { 1 } else { -100 };
        let targets: Vec<i64> = raw
            .iter()
            .map(|&t| if t < 0 { ignore_index } else { t })
            .collect();
        let mut tshape = vec![x.shape[0]];
        tshape.extend(x.shape.get(2));
        let t = Tensor::from_vec(targets.clone(), &tshape).map_err(fail)?;
        let opts = CrossEntropyOptions {
            ignore_index,
            label_smoothing: [0.0, 0.1, 0.3][smooth],
            reduction: REDUCTIONS[red],
        };
        let report = check(&[x.leaf()], |xs| {
            view(&x, &xs[0])?.cross_entropy(Target::Indices(&t), &opts)
        })?;
        let c = x.shape[1];
        let eps = opts.label_smoothing;
        let weights = |r: usize| -> Vec<f64> {
            let k = targets[r];
            if k == ignore_index {
                return vec![0.0; c];
            }
            (0..c)
                .map(|j| eps / c as f64 + if j as i64 == k { 1.0 - eps } else { 0.0 })
                .collect()
        };
        let count = targets.iter().filter(|&&k| k != ignore_index).count();
        let want = naive_ce(
            &rows_classes_last(&x.seen(), &x.shape),
            c,
            weights,
            opts.reduction,
            count,
        );
        close(
            seen_var(&x)?
                .cross_entropy(Target::Indices(&t), &opts)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-12,
        )?;
        Ok(report)
    })
}

pub fn cross_entropy_probs_case(n: u32) -> Checked {
    let s = (
        1usize..=3,
        2usize..=4,
        prop::option::of(1usize..=2),
        0usize..3,
        0usize..2,
    )
        .prop_flat_map(|(nb, c, d, red, smooth)| {
            let shape: Vec<usize> = [vec![nb, c], d.into_iter().collect()].concat();
            let count: usize = shape.iter().product();
            (
                input_of(shape, Domain::Any),
                prop::collection::vec(0.05..1.0f64, count),
                Just(red),
                Just(smooth),
            )
        });
    prop(n, s, |(x, raw, red, smooth)| {
        // Normalise the raw weights over the class dim into probabilities.
        let c = x.shape[1];
        let rows = rows_classes_last(&raw, &x.shape);
        let probs: Vec<Vec<f64>> = rows
            .chunks(c)
            .map(|r| r.iter().map(|v| v / r.iter().sum::<f64>()).collect())
            .collect();
        let d = x.shape.get(2).copied().unwrap_or(1);
        let mut flat = vec![0.0; raw.len()];
        for (r, p) in probs.iter().enumerate() {
            for (k, &v) in p.iter().enumerate() {
                flat[((r / d) * c + k) * d + r % d] = v;
            }
        }
        let t = tensor(&flat, &x.shape);
        let opts = CrossEntropyOptions {
            label_smoothing: [0.0, 0.2][smooth],
            reduction: REDUCTIONS[red],
            ..CrossEntropyOptions::default()
        };
        let report = check(&[x.leaf()], |xs| {
            view(&x, &xs[0])?.cross_entropy(Target::Probs(&t), &opts)
        })?;
        let eps = opts.label_smoothing;
        let weights = |r: usize| {
            probs[r]
                .iter()
                .map(|p| (1.0 - eps) * p + eps / c as f64)
                .collect()
        };
        let want = naive_ce(
            &rows_classes_last(&x.seen(), &x.shape),
            c,
            weights,
            opts.reduction,
            probs.len(),
        );
        close(
            seen_var(&x)?
                .cross_entropy(Target::Probs(&t), &opts)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-12,
        )?;
        Ok(report)
    })
}

pub fn nll_loss_case(n: u32) -> Checked {
    let s = (1usize..=4, 2usize..=4, 0usize..3).prop_flat_map(|(nb, c, red)| {
        (
            input_of(vec![nb, c], Domain::Any),
            prop::collection::vec(-1i64..c as i64, nb),
            Just(red),
        )
    });
    prop(n, s, |(x, raw, red)| {
        prop_assume!(raw.iter().any(|&t| t >= 0));
        let targets: Vec<i64> = raw.iter().map(|&t| if t < 0 { -100 } else { t }).collect();
        let t = Tensor::from_vec(targets.clone(), &[targets.len()]).map_err(fail)?;
        let reduction = REDUCTIONS[red];
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.nll_loss(&t, -100, reduction))?;
        let (seen, c) = (x.seen(), x.shape[1]);
        let per: Vec<f64> = targets
            .iter()
            .enumerate()
            .map(|(r, &k)| if k < 0 { 0.0 } else { -seen[r * c + k as usize] })
            .collect();
        let count = targets.iter().filter(|&&k| k >= 0).count();
        let want = match reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean => vec![per.iter().sum::<f64>() / count as f64],
        };
        close(
            seen_var(&x)?
                .nll_loss(&t, -100, reduction)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-12,
        )?;
        Ok(report)
    })
}

pub fn mse_loss_case(n: u32) -> Checked {
    let s = (prop::collection::vec(1usize..=3, 0..=3), 0usize..3).prop_flat_map(|(shape, red)| {
        (
            input_of(shape.clone(), Domain::Any),
            input_of(shape, Domain::Any),
            Just(red),
        )
    });
    prop(n, s, |(a, b, red)| {
        let reduction = REDUCTIONS[red];
        let report = check(&[a.leaf(), b.leaf()], |xs| {
            view(&a, &xs[0])?.mse_loss(&view(&b, &xs[1])?, reduction)
        })?;
        let per: Vec<f64> = a
            .seen()
            .iter()
            .zip(b.seen())
            .map(|(x, y)| (x - y) * (x - y))
            .collect();
        let want = match reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean => vec![per.iter().sum::<f64>() / per.len() as f64],
        };
        close(
            seen_var(&a)?
                .mse_loss(&seen_var(&b)?, reduction)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-12,
        )?;
        Ok(report)
    })
}

pub fn bce_case(n: u32) -> Checked {
    let s = (1usize..=3, 1usize..=3, 0usize..3, any::<bool>()).prop_flat_map(|(r, c, red, pw)| {
        (
            input_of(vec![r, c], Domain::Any),
            prop::collection::vec(0.0..=1.0f64, r * c),
            prop::collection::vec(0.5..3.0f64, c),
            Just(red),
            Just(pw),
        )
    });
    prop(n, s, |(x, y, pw, red, use_pw)| {
        let target = tensor(&y, &x.shape);
        let pos_weight = tensor(&pw, &[pw.len()]);
        let pwt = use_pw.then_some(&pos_weight);
        let reduction = REDUCTIONS[red];
        let report = check(&[x.leaf()], |xs| {
            view(&x, &xs[0])?.bce_with_logits(&target, pwt, reduction)
        })?;
        let c = x.shape[1];
        let per: Vec<f64> = x
            .seen()
            .iter()
            .zip(&y)
            .enumerate()
            .map(|(i, (&v, &t))| {
                let p = if use_pw { pw[i % c] } else { 1.0 };
                let sig = 1.0 / (1.0 + (-v).exp());
                -(p * t * sig.ln() + (1.0 - t) * (1.0 - sig).ln())
            })
            .collect();
        let want = match reduction {
            Reduction::None => per,
            Reduction::Sum => vec![per.iter().sum()],
            Reduction::Mean => vec![per.iter().sum::<f64>() / per.len() as f64],
        };
        close(
            seen_var(&x)?
                .bce_with_logits(&target, pwt, reduction)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-10,
        )?;
        Ok(report)
    })
}

fn value(v: tessera_tensor::Result<Var>) -> f64 {
    v.unwrap().tensor().to_scalar::<f64>().unwrap()
}

/// Values PyTorch 2.x prints for the same calls.
#[test]
fn losses_match_published_values() {
    let x = Var::constant(tensor(&[1.0, 2.0, 3.0], &[1, 3]));
    let t = Tensor::from_vec(vec![2i64], &[1]).unwrap();
    let ce = |eps: f64| {
        let opts = CrossEntropyOptions {
            label_smoothing: eps,
            ..CrossEntropyOptions::default()
        };
        value(x.cross_entropy(Target::Indices(&t), &opts))
    };
    // F.cross_entropy(tensor([[1., 2., 3.]]), tensor([2])) = 0.4076
    assert!((ce(0.0) - 0.407_605_964_444_380_1).abs() < 1e-12);
    // ... with label_smoothing=0.1: 0.5076
    assert!((ce(0.1) - 0.507_605_964_444_380_1).abs() < 1e-12);
    // Two logits at 0: ln 2; a 1-D input with a 0-d target.
    let z = Var::constant(tensor(&[0.0, 0.0], &[2]));
    let t0 = Tensor::from_vec(vec![0i64], &[]).unwrap();
    assert!(
        (value(z.cross_entropy(Target::Indices(&t0), &CrossEntropyOptions::default())) - 2f64.ln()).abs()
            < 1e-15
    );
    // All targets ignored: the mean is NaN (0 / 0), the sum 0.
    let ign = Tensor::from_vec(vec![-100i64], &[1]).unwrap();
    assert!(value(x.cross_entropy(Target::Indices(&ign), &CrossEntropyOptions::default())).is_nan());
    // F.binary_cross_entropy_with_logits(tensor([0.]), tensor([1.])) = ln 2,
    // and stays finite and exact for large logits.
    let b = Var::constant(tensor(&[0.0, 800.0, -800.0], &[3]));
    let y = tensor(&[1.0, 1.0, 1.0], &[3]);
    let per = b
        .bce_with_logits(&y, None, Reduction::None)
        .unwrap()
        .into_tensor()
        .to_vec::<f64>()
        .unwrap();
    assert!((per[0] - 2f64.ln()).abs() < 1e-15 && per[1] == 0.0 && per[2] == 800.0);
    // F.mse_loss(tensor([1., 2., 3.]), tensor([1., 1., 1.])) = 5/3.
    let a = Var::constant(tensor(&[1.0, 2.0, 3.0], &[3]));
    assert!((value(a.mse_loss(&Var::constant(y.clone()), Reduction::Mean)) - 5.0 / 3.0).abs() < 1e-15);
    // Out-of-range classes and bad shapes are errors.
    let bad = Tensor::from_vec(vec![3i64], &[1]).unwrap();
    assert!(x
        .cross_entropy(Target::Indices(&bad), &CrossEntropyOptions::default())
        .is_err());
    assert!(x
        .cross_entropy(Target::Indices(&t0), &CrossEntropyOptions::default())
        .is_err());
    assert!(b
        .bce_with_logits(&tensor(&[1.0], &[1]), None, Reduction::Mean)
        .is_err());
    let lp = x.log_softmax(-1).unwrap();
    for (target, names) in [(&bad, "3"), (&Tensor::from_vec(vec![-5i64], &[1]).unwrap(), "-5")] {
        let msg = lp
            .nll_loss(target, -100, Reduction::Mean)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("nll_loss") && msg.contains(names), "{msg}");
    }
    assert!(lp.nll_loss(&t0, -100, Reduction::Mean).is_err());
    // Every target ignored: the mean is 0/0, as in PyTorch.
    let ignored = Tensor::from_vec(vec![-100i64], &[1]).unwrap();
    assert!(value(lp.nll_loss(&ignored, -100, Reduction::Mean)).is_nan());
}

/// The gradient of mean cross-entropy at the logits is
/// `(softmax − onehot) / count`, ignored rows zero.
#[test]
fn cross_entropy_gradient_is_softmax_minus_onehot() {
    let x = Var::leaf(tensor(&[1.0, 2.0, 3.0, 0.5, 0.5, 0.5], &[2, 3]));
    let t = Tensor::from_vec(vec![0i64, -100], &[2]).unwrap();
    let g = x
        .cross_entropy(Target::Indices(&t), &CrossEntropyOptions::default())
        .unwrap()
        .backward()
        .unwrap();
    let g = g.get(&x).unwrap().to_vec::<f64>().unwrap();
    let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let s: f64 = e.iter().sum();
    let want = [e[0] / s - 1.0, e[1] / s, e[2] / s, 0.0, 0.0, 0.0];
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{g:?}");
    }
}
