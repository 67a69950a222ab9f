//! Reductions, softmax and cumsum over random dims of random shapes, on
//! every arrangement; forwards of sum and prod against naive f64.

use proptest::prelude::*;
use tessera_autograd::{GradcheckReport, Var};
use tessera_tensor::Result;

use crate::gradcheck::common::{check, close, fail, input_of, prop, shape_in, Checked, Domain, Input};

/// An input with sizes in `sizes`, a random list of dims to reduce (empty =
/// all; some given negative) and keepdim.
fn reduce_input(
    sizes: std::ops::RangeInclusive<usize>,
    domain: Domain,
) -> impl Strategy<Value = (Input, Vec<isize>, bool)> {
    shape_in(0..=4, sizes).prop_flat_map(move |s| {
        let nd = s.len();
        (
            input_of(s, domain),
            prop::collection::vec(any::<bool>(), nd),
            prop::collection::vec(any::<bool>(), nd),
            any::<bool>(),
        )
            .prop_map(move |(i, pick, negative, keepdim)| {
                let dims = (0..nd)
                    .filter(|&d| pick[d])
                    .map(|d| {
                        if negative[d] {
                            d as isize - nd as isize
                        } else {
                            d as isize
                        }
                    })
                    .collect();
                (i, dims, keepdim)
            })
    })
}

type Reduce = fn(&Var, &[isize], bool) -> Result<Var>;

fn reduction(n: u32, sizes: std::ops::RangeInclusive<usize>, domain: Domain, f: Reduce) -> Checked {
    prop(n, reduce_input(sizes, domain), |(inp, dims, keepdim)| {
        check(&[inp.leaf()], |xs| f(&inp.arrange.apply(&xs[0])?, &dims, keepdim))
    })
}

/// The naive reduction of `inp`'s seen values over `dims` with `fold`.
fn naive(inp: &Input, dims: &[isize], init: f64, fold: fn(f64, f64) -> f64) -> Vec<f64> {
    let nd = inp.shape.len();
    let red: Vec<bool> = (0..nd)
        .map(|d| dims.is_empty() || dims.iter().any(|&r| (r + nd as isize) as usize % nd.max(1) == d))
        .collect();
    let out_n: usize = (0..nd).filter(|&d| !red[d]).map(|d| inp.shape[d]).product();
    let mut out = vec![init; out_n];
    for (k, v) in inp.seen().into_iter().enumerate() {
        let (mut rem, mut o, mut stride) = (k, 0, 1);
        for d in (0..nd).rev() {
            let i = rem % inp.shape[d];
            rem /= inp.shape[d];
            if !red[d] {
                o += i * stride;
                stride *= inp.shape[d];
            }
        }
        out[o] = fold(out[o], v);
    }
    out
}

fn with_forward(
    n: u32,
    min_size: usize,
    f: Reduce,
    init: f64,
    fold: fn(f64, f64) -> f64,
    zeros: bool,
) -> Checked {
    let s = (
        reduce_input(min_size..=4, Domain::Any),
        prop::collection::vec(any::<u8>(), 0..64),
    );
    prop(n, s, |((mut inp, dims, keepdim), zero_at)| {
        if zeros {
            // Exact zeros, to check prod's gradient where others vanish.
            for z in zero_at {
                let len = inp.values.len();
                if len > 0 && z % 3 == 0 {
                    inp.values[z as usize % len] = 0.0;
                }
            }
        }
        let report: GradcheckReport =
            check(&[inp.leaf()], |xs| f(&inp.arrange.apply(&xs[0])?, &dims, keepdim))?;
        let x = inp.arrange.apply(&Var::constant(inp.leaf())).map_err(fail)?;
        close(
            f(&x, &dims, keepdim).map_err(fail)?.tensor(),
            &naive(&inp, &dims, init, fold),
            1e-12,
        )?;
        Ok(report)
    })
}

fn sum(n: u32) -> Checked {
    with_forward(n, 0, Var::sum, 0.0, |a, b| a + b, false)
}
fn prod(n: u32) -> Checked {
    with_forward(n, 0, Var::prod, 1.0, |a, b| a * b, true)
}
fn mean(n: u32) -> Checked {
    reduction(n, 0..=4, Domain::Any, Var::mean)
}
/// Max errors on an empty reduction: sizes start at 1.
fn max(n: u32) -> Checked {
    with_forward(n, 1, Var::max, f64::NEG_INFINITY, f64::max, false)
}
fn min(n: u32) -> Checked {
    reduction(n, 1..=4, Domain::Any, Var::min)
}

fn var_std(n: u32, std: bool) -> Checked {
    prop(
        n,
        (reduce_input(0..=4, Domain::Any), any::<bool>()),
        |((inp, dims, keepdim), unbiased)| {
            let nd = inp.shape.len();
            let count: usize = (0..nd)
                .filter(|&d| {
                    dims.is_empty() || dims.iter().any(|&r| (r + nd as isize) as usize % nd.max(1) == d)
                })
                .map(|d| inp.shape[d])
                .product();
            // N ≤ correction gives inf/NaN, which no finite difference checks.
            let correction = if unbiased && count > 1 { 1.0 } else { 0.0 };
            check(&[inp.leaf()], |xs| {
                let x = inp.arrange.apply(&xs[0])?;
                if std {
                    x.std(&dims, correction, keepdim)
                } else {
                    x.var(&dims, correction, keepdim)
                }
            })
        },
    )
}
fn var(n: u32) -> Checked {
    var_std(n, false)
}
fn std(n: u32) -> Checked {
    var_std(n, true)
}
fn logsumexp(n: u32) -> Checked {
    reduction(n, 0..=4, Domain::Any, Var::logsumexp)
}

fn norm(n: u32) -> Checked {
    let ps = prop_oneof![
        Just(1.0),
        Just(2.0),
        Just(3.0),
        Just(0.5),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0)
    ];
    prop(
        n,
        (reduce_input(1..=4, Domain::AwayFromZero), ps),
        |((inp, dims, keepdim), p)| {
            check(&[inp.leaf()], |xs| {
                inp.arrange.apply(&xs[0])?.norm(p, &dims, keepdim)
            })
        },
    )
}

/// An input and one of its dims (any dim for rank 0 is 0).
fn along_dim() -> impl Strategy<Value = (Input, isize)> {
    shape_in(0..=4, 0..=5).prop_flat_map(|s| {
        let nd = s.len().max(1) as isize;
        (input_of(s, Domain::Any), -nd..nd)
    })
}

fn softmax(n: u32) -> Checked {
    prop(n, along_dim(), |(inp, d)| {
        check(&[inp.leaf()], |xs| inp.arrange.apply(&xs[0])?.softmax(d))
    })
}
fn log_softmax(n: u32) -> Checked {
    prop(n, along_dim(), |(inp, d)| {
        check(&[inp.leaf()], |xs| inp.arrange.apply(&xs[0])?.log_softmax(d))
    })
}
fn cumsum(n: u32) -> Checked {
    prop(n, along_dim(), |(inp, d)| {
        check(&[inp.leaf()], |xs| inp.arrange.apply(&xs[0])?.cumsum(d))
    })
}

cases! {
    sum: ["sum"] => sum;
    prod: ["prod"] => prod;
    mean: ["mean"] => mean;
    max: ["max"] => max;
    min: ["min"] => min;
    var: ["var"] => var;
    std: ["std"] => std;
    logsumexp: ["logsumexp"] => logsumexp;
    norm: ["norm"] => norm;
    softmax: ["softmax"] => softmax;
    log_softmax: ["log_softmax"] => log_softmax;
    cumsum: ["cumsum"] => cumsum;
}
