//! layer_norm, batch_norm (training and eval) and group_norm with and
//! without affine parameters, on every arrangement of the input; the
//! layer_norm forward and the running-statistics update against naive f64.

use proptest::prelude::*;
use tessera_autograd::Var;
use tessera_tensor::Tensor;

use crate::gradcheck::common::{
    check, close, fail, input_of, prop, shape_in, tensor, values, Checked, Domain, Input,
};

/// An input, optional weight and bias values of `param_len(shape)` each.
fn with_params(
    shapes: impl Strategy<Value = Vec<usize>>,
    param_len: fn(&[usize]) -> usize,
) -> impl Strategy<Value = (Input, Option<Vec<f64>>, Option<Vec<f64>>)> {
    shapes.prop_flat_map(move |s| {
        let k = param_len(&s);
        (
            input_of(s, Domain::Any),
            prop::option::of(values(k, Domain::Any)),
            prop::option::of(values(k, Domain::Any)),
        )
    })
}

/// Leaves: the input, then weight and bias where given.
fn leaves(inp: &Input, w: &Option<Vec<f64>>, b: &Option<Vec<f64>>, pshape: &[usize]) -> Vec<Tensor> {
    let mut v = vec![inp.leaf()];
    v.extend([w, b].into_iter().flatten().map(|p| tensor(p, pshape)));
    v
}

/// Splits the gradcheck leaves back into (x, weight, bias).
fn split(xs: &[Var], w: bool, b: bool) -> (&Var, Option<&Var>, Option<&Var>) {
    let weight = w.then(|| &xs[1]);
    let bias = b.then(|| &xs[1 + usize::from(w)]);
    (&xs[0], weight, bias)
}

fn layer_norm(n: u32) -> Checked {
    let s = shape_in(1..=4, 1..=4).prop_flat_map(|s| {
        let nd = s.len();
        (Just(s), 1..=nd)
    });
    let s = s.prop_flat_map(|(shape, k)| {
        let ns = shape[shape.len() - k..].to_vec();
        let len = ns.iter().product();
        (
            input_of(shape, Domain::Any),
            Just(ns),
            prop::option::of(values(len, Domain::Any)),
            prop::option::of(values(len, Domain::Any)),
        )
    });
    prop(n, s, |(inp, ns, w, b)| {
        let eps = 1e-5;
        let report = check(&leaves(&inp, &w, &b, &ns), |xs| {
            let (x, wv, bv) = split(xs, w.is_some(), b.is_some());
            inp.arrange.apply(x)?.layer_norm(&ns, wv, bv, eps)
        })?;
        // Forward: per row (x − mean)/sqrt(var + eps)·w + b.
        let k: usize = ns.iter().product();
        let want: Vec<f64> = inp
            .seen()
            .chunks(k)
            .flat_map(|row| {
                let m = row.iter().sum::<f64>() / k as f64;
                let v = row.iter().map(|x| (x - m).powi(2)).sum::<f64>() / k as f64;
                let (w, b) = (w.clone(), b.clone());
                row.iter()
                    .enumerate()
                    .map(move |(i, x)| {
                        (x - m) / (v + eps).sqrt() * w.as_ref().map_or(1.0, |w| w[i])
                            + b.as_ref().map_or(0.0, |b| b[i])
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let x = inp.arrange.apply(&Var::constant(inp.leaf())).map_err(fail)?;
        let wc = w.as_ref().map(|w| Var::constant(tensor(w, &ns)));
        let bc = b.as_ref().map(|b| Var::constant(tensor(b, &ns)));
        close(
            x.layer_norm(&ns, wc.as_ref(), bc.as_ref(), eps)
                .map_err(fail)?
                .tensor(),
            &want,
            1e-10,
        )?;
        Ok(report)
    })
}

fn channels(s: &[usize]) -> usize {
    s[1]
}

fn batch_norm(n: u32) -> Checked {
    // Training needs more than one value per channel: N·S ≥ 2.
    let shapes = shape_in(2..=4, 1..=3).prop_map(|mut s| {
        s[0] = s[0].max(2);
        s
    });
    let s = (
        with_params(shapes, channels),
        any::<bool>(),
        values(3, Domain::Any),
        values(3, Domain::Positive),
    );
    prop(n, s, |((inp, w, b), training, rm, rv)| {
        let c = inp.shape[1];
        // Sizes are at most 3, so C ≤ 3.
        let (rm, rv) = (tensor(&rm[..c], &[c]), tensor(&rv[..c], &[c]));
        let momentum = 0.1;
        let report = check(&leaves(&inp, &w, &b, &[c]), |xs| {
            let (x, wv, bv) = split(xs, w.is_some(), b.is_some());
            let out =
                inp.arrange
                    .apply(x)?
                    .batch_norm(Some(&rm), Some(&rv), wv, bv, training, momentum, 1e-5)?;
            Ok(out.y)
        })?;
        // The running mean comes back updated in training only.
        let x = inp.arrange.apply(&Var::constant(inp.leaf())).map_err(fail)?;
        let out = x
            .batch_norm(Some(&rm), Some(&rv), None, None, training, momentum, 1e-5)
            .map_err(fail)?;
        prop_assert_eq!(out.running_mean.is_some(), training);
        if training {
            let seen = inp.seen();
            let s: usize = inp.shape[2..].iter().product();
            let rm0 = rm.to_vec::<f64>().map_err(fail)?;
            let want: Vec<f64> = (0..c)
                .map(|ci| {
                    let vals: Vec<f64> = (0..inp.shape[0])
                        .flat_map(|ni| seen[(ni * c + ci) * s..(ni * c + ci + 1) * s].to_vec())
                        .collect();
                    let m = vals.iter().sum::<f64>() / vals.len() as f64;
                    (1.0 - momentum) * rm0[ci] + momentum * m
                })
                .collect();
            close(out.running_mean.as_ref().expect("training"), &want, 1e-12)?;
        }
        Ok(report)
    })
}

fn group_norm(n: u32) -> Checked {
    let s = (shape_in(2..=4, 1..=3), 1usize..=3, 1usize..=2).prop_map(|(mut s, groups, per)| {
        s[1] = groups * per;
        (s, groups)
    });
    let s = s.prop_flat_map(|(shape, groups)| (with_params(Just(shape), channels), Just(groups)));
    prop(n, s, |((inp, w, b), groups)| {
        let c = inp.shape[1];
        check(&leaves(&inp, &w, &b, &[c]), |xs| {
            let (x, wv, bv) = split(xs, w.is_some(), b.is_some());
            inp.arrange.apply(x)?.group_norm(groups, wv, bv, 1e-5)
        })
    })
}

cases! {
    layer_norm: ["layer_norm"] => layer_norm;
    batch_norm: ["batch_norm"] => batch_norm;
    group_norm: ["group_norm"] => group_norm;
}
