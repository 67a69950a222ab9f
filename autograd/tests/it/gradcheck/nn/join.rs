//! cat, stack, split, chunk (multi-output nodes), pad, repeat, tril/triu and
//! dropout.

use proptest::prelude::*;
use tessera_autograd::Var;
use tessera_tensor::{manual_seed, PadMode, Tensor};

use super::{seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, Checked, Domain, Input};

/// Three inputs that agree outside dim `d` (of rank 1–3), with their own
/// sizes along it.
fn joinable(same: bool) -> impl Strategy<Value = (Vec<Input>, usize)> {
    (
        prop::collection::vec(1usize..=3, 1..=3),
        prop::collection::vec(0usize..=3, 3),
    )
        .prop_flat_map(move |(shape, sizes)| {
            let nd = shape.len();
            (0..nd).prop_flat_map(move |d| {
                let inputs: Vec<_> = sizes
                    .iter()
                    .map(|&s| {
                        let mut sh = shape.clone();
                        if !same {
                            sh[d] = s;
                        }
                        input_of(sh, Domain::Any)
                    })
                    .collect();
                (inputs, Just(d))
            })
        })
}

/// The arranged views of `inputs` over the leaves `xs`.
fn views(inputs: &[Input], xs: &[Var]) -> tessera_tensor::Result<Vec<Var>> {
    inputs.iter().zip(xs).map(|(i, x)| view(i, x)).collect()
}

pub fn cat_case(n: u32) -> Checked {
    prop(n, joinable(false), |(inputs, d)| {
        let leaves: Vec<Tensor> = inputs.iter().map(Input::leaf).collect();
        let report = check(&leaves, |xs| Var::cat(&views(&inputs, xs)?, d as isize))?;
        let seen: Vec<Var> = inputs.iter().map(seen_var).collect::<Result<_, _>>()?;
        let want = Tensor::cat(
            &seen.iter().map(|v| v.tensor().clone()).collect::<Vec<_>>(),
            d as isize,
        )
        .map_err(fail)?
        .to_vec::<f64>()
        .map_err(fail)?;
        close(Var::cat(&seen, d as isize).map_err(fail)?.tensor(), &want, 0.0)?;
        Ok(report)
    })
}

pub fn stack_case(n: u32) -> Checked {
    prop(n, joinable(true), |(inputs, d)| {
        let leaves: Vec<Tensor> = inputs.iter().map(Input::leaf).collect();
        let report = check(&leaves, |xs| Var::stack(&views(&inputs, xs)?, d as isize + 1))?;
        // Forward: stacking along the last dim interleaves the elements.
        let seen: Vec<Var> = inputs.iter().map(seen_var).collect::<Result<_, _>>()?;
        let vals: Vec<Vec<f64>> = inputs.iter().map(Input::seen).collect();
        let want: Vec<f64> = (0..vals[0].len())
            .flat_map(|i| vals.iter().map(move |v| v[i]))
            .collect();
        close(Var::stack(&seen, -1).map_err(fail)?.tensor(), &want, 0.0)?;
        Ok(report)
    })
}

/// Weights the pieces differently (and leaves the middle one unused when
/// there are three or more) so each piece's gradient is checked.
fn combine(pieces: Vec<Var>) -> tessera_tensor::Result<Var> {
    let mut acc: Option<Var> = None;
    for (i, p) in pieces.iter().enumerate() {
        if i == 1 && pieces.len() >= 3 {
            continue;
        }
        let t = p.mul_scalar(i as f64 + 1.0)?.sum(&[], false)?;
        acc = Some(match acc {
            Some(a) => a.add(&t)?,
            None => t,
        });
    }
    acc.ok_or_else(|| tessera_tensor::Error::arg("combine", "no pieces"))
}

pub fn split_case(n: u32) -> Checked {
    let s = (prop::collection::vec(1usize..=5, 1..=3), 1usize..=3).prop_flat_map(|(shape, size)| {
        let nd = shape.len();
        (input_of(shape, Domain::Any), 0..nd, Just(size))
    });
    prop(n, s, |(x, d, size)| {
        let report = check(&[x.leaf()], |xs| {
            combine(view(&x, &xs[0])?.split(size, d as isize)?)
        })?;
        // split_with_sizes with the same sizes gives the same pieces.
        let len = x.shape[d];
        let sizes: Vec<usize> = (0..len).step_by(size).map(|s| size.min(len - s)).collect();
        let xv = seen_var(&x)?;
        let a = xv.split(size, d as isize).map_err(fail)?;
        let b = xv.split_with_sizes(&sizes, d as isize).map_err(fail)?;
        prop_assert_eq!(a.len(), b.len());
        for (p, q) in a.iter().zip(&b) {
            close(
                p.tensor(),
                &q.tensor().contiguous().unwrap().to_vec::<f64>().map_err(fail)?,
                0.0,
            )?;
        }
        Ok(report)
    })
}

pub fn chunk_case(n: u32) -> Checked {
    let s = (prop::collection::vec(1usize..=5, 1..=3), 1usize..=4).prop_flat_map(|(shape, chunks)| {
        let nd = shape.len();
        (input_of(shape, Domain::Any), 0..nd, Just(chunks))
    });
    prop(n, s, |(x, d, chunks)| {
        let report = check(&[x.leaf()], |xs| {
            combine(view(&x, &xs[0])?.chunk(chunks, d as isize)?)
        })?;
        // Forward: the pieces are ceil(len / chunks) long and join back to x.
        let pieces = seen_var(&x)?.chunk(chunks, d as isize).map_err(fail)?;
        let len = x.shape[d];
        prop_assert!(pieces.iter().all(|p| p.shape()[d] <= len.div_ceil(chunks)));
        close(
            Var::cat(&pieces, d as isize).map_err(fail)?.tensor(),
            &x.seen(),
            0.0,
        )?;
        Ok(report)
    })
}

pub fn pad_case(n: u32) -> Checked {
    let s = (
        prop::collection::vec(2usize..=4, 1..=3),
        0usize..3,
        prop::collection::vec(0usize..=1, 1..=2),
    )
        .prop_flat_map(|(shape, mode, pads)| (input_of(shape, Domain::Any), Just(mode), Just(pads)));
    prop(n, s, |(x, mode, pairs)| {
        // (left, right) pairs for at most every dim, some one-sided.
        let pads: Vec<usize> = pairs
            .iter()
            .take(x.shape.len())
            .enumerate()
            .flat_map(|(i, &p)| [p, (p + i) % 2])
            .collect();
        let mode = [PadMode::Constant(0.5), PadMode::Reflect, PadMode::Replicate][mode];
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.pad(&pads, mode))?;
        let want = seen_var(&x)?
            .tensor()
            .pad(&pads, mode)
            .map_err(fail)?
            .to_vec::<f64>()
            .map_err(fail)?;
        close(seen_var(&x)?.pad(&pads, mode).map_err(fail)?.tensor(), &want, 0.0)?;
        Ok(report)
    })
}

pub fn repeat_case(n: u32) -> Checked {
    let s = prop::collection::vec(0usize..=3, 0..=2).prop_flat_map(|shape| {
        let nd = shape.len();
        (
            input_of(shape, Domain::Any),
            prop::collection::vec(1usize..=3, nd..=nd + 1),
        )
    });
    prop(n, s, |(x, reps)| {
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.repeat(&reps))?;
        // Forward: out[i] = x[i mod shape] over the padded shape.
        let mut shape = vec![1; reps.len() - x.shape.len()];
        shape.extend(&x.shape);
        let out: Vec<usize> = shape.iter().zip(&reps).map(|(s, r)| s * r).collect();
        let seen = x.seen();
        let want: Vec<f64> = super::indices(&out)
            .iter()
            .map(|idx| {
                let i: Vec<usize> = idx.iter().zip(&shape).map(|(i, s)| i % s).collect();
                seen[super::bcast_offset(&i, &shape)]
            })
            .collect();
        close(seen_var(&x)?.repeat(&reps).map_err(fail)?.tensor(), &want, 0.0)?;
        Ok(report)
    })
}

pub fn tri_case(n: u32) -> Checked {
    let s = (prop::collection::vec(0usize..=4, 2..=3), -2isize..=2)
        .prop_flat_map(|(shape, diag)| (input_of(shape, Domain::Any), Just(diag)));
    prop(n, s, |(x, diag)| {
        let report = check(&[x.leaf()], |xs| {
            let v = view(&x, &xs[0])?;
            v.tril(diag)?.add(&v.triu(diag + 1)?.mul_scalar(2.0)?)
        })?;
        // Forward: tril(d) + triu(d + 1) = x.
        let v = seen_var(&x)?;
        let sum = v
            .tril(diag)
            .map_err(fail)?
            .add(&v.triu(diag + 1).map_err(fail)?)
            .map_err(fail)?;
        close(sum.tensor(), &x.seen(), 0.0)?;
        Ok(report)
    })
}

pub fn dropout_case(n: u32) -> Checked {
    let s = (
        prop::collection::vec(1usize..=4, 1..=3),
        0.0..0.9f64,
        any::<u64>(),
    )
        .prop_flat_map(|(shape, p, seed)| (input_of(shape, Domain::Any), Just(p), Just(seed)));
    prop(n, s, |(x, p, seed)| {
        // Reseeding inside the checked function replays one mask.
        let report = check(&[x.leaf()], |xs| {
            manual_seed(seed);
            view(&x, &xs[0])?.dropout(p, true)
        })?;
        manual_seed(seed);
        let y = seen_var(&x)?
            .dropout(p, true)
            .map_err(fail)?
            .into_tensor()
            .to_vec::<f64>()
            .map_err(fail)?;
        // Every element is dropped (0) or scaled by 1/(1-p).
        for (yi, xi) in y.iter().zip(x.seen()) {
            prop_assert!(*yi == 0.0 || (yi - xi / (1.0 - p)).abs() <= 1e-12 * (1.0 + yi.abs()));
        }
        // Eval mode is the identity.
        close(
            seen_var(&x)?.dropout(p, false).map_err(fail)?.tensor(),
            &x.seen(),
            0.0,
        )?;
        Ok(report)
    })
}

/// Dropout keeps about 1 − p of the elements and preserves the mean.
#[test]
fn dropout_keeps_the_expected_fraction() {
    manual_seed(7);
    let x = Var::constant(Tensor::ones(&[100_000], tessera_tensor::DType::F32).unwrap());
    let y = x
        .dropout(0.3, true)
        .unwrap()
        .into_tensor()
        .to_vec::<f32>()
        .unwrap();
    let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / y.len() as f64;
    assert!((kept - 0.7).abs() < 0.01, "kept {kept}");
    let mean = y.iter().map(|&v| v as f64).sum::<f64>() / y.len() as f64;
    assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
    assert!(x.dropout(1.5, true).is_err());
    let all = x
        .dropout(1.0, true)
        .unwrap()
        .into_tensor()
        .to_vec::<f32>()
        .unwrap();
    assert!(all.iter().all(|&v| v == 0.0));
}
