//! Elementwise binary ops with broadcasting pairs and strided operands,
//! their scalar forms, and where. Forward against a naive f64 broadcast.

use proptest::prelude::*;
use tessera_autograd::Var;
use tessera_tensor::{broadcast_shapes, Result, Tensor};

use crate::gradcheck::common::{check, close, fail, input, input_pair, prop, Checked, Domain, Input};

/// The flat index in a tensor of `shape` that broadcasts to element `flat`
/// of `out`.
fn source_index(out: &[usize], flat: usize, shape: &[usize]) -> usize {
    let lead = out.len() - shape.len();
    let (mut rem, mut idx, mut stride) = (flat, 0, 1);
    for d in (0..out.len()).rev() {
        let i = rem % out[d].max(1);
        rem /= out[d].max(1);
        if d >= lead {
            let s = shape[d - lead];
            idx += if s == 1 { 0 } else { i * stride };
            stride *= s;
        }
    }
    idx
}

/// Gradchecks `f(a, b)` on broadcasting pairs (also with `b` constant, so
/// the no-gradient path runs) and checks the forward against `reference`.
fn binary(
    n: u32,
    da: Domain,
    db: Domain,
    f: fn(&Var, &Var) -> Result<Var>,
    reference: fn(f64, f64) -> f64,
) -> Checked {
    prop(n, (input_pair(da, db), any::<bool>()), |((a, b), b_const)| {
        let report = if b_const {
            let bt = b.leaf();
            check(&[a.leaf()], |xs| {
                f(
                    &a.arrange.apply(&xs[0])?,
                    &b.arrange.apply(&Var::constant(bt.clone()))?,
                )
            })?
        } else {
            check(&[a.leaf(), b.leaf()], |xs| {
                f(&a.arrange.apply(&xs[0])?, &b.arrange.apply(&xs[1])?)
            })?
        };
        let out = broadcast_shapes("test", &a.shape, &b.shape).map_err(fail)?;
        let (av, bv) = (a.seen(), b.seen());
        let want: Vec<f64> = (0..out.iter().product())
            .map(|k| {
                reference(
                    av[source_index(&out, k, &a.shape)],
                    bv[source_index(&out, k, &b.shape)],
                )
            })
            .collect();
        let x = a.arrange.apply(&Var::constant(a.leaf())).map_err(fail)?;
        let y = b.arrange.apply(&Var::constant(b.leaf())).map_err(fail)?;
        close(f(&x, &y).map_err(fail)?.tensor(), &want, 1e-12)?;
        Ok(report)
    })
}

fn add(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::Any, Var::add, |a, b| a + b)
}
fn sub(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::Any, Var::sub, |a, b| a - b)
}
fn mul(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::Any, Var::mul, |a, b| a * b)
}
fn div(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::AwayFromZero, Var::div, |a, b| a / b)
}
fn maximum(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::Any, Var::maximum, f64::max)
}
fn minimum(n: u32) -> Checked {
    binary(n, Domain::Any, Domain::Any, Var::minimum, f64::min)
}
fn pow(n: u32) -> Checked {
    binary(n, Domain::Positive, Domain::Any, Var::pow, f64::powf)
}

fn where_(n: u32) -> Checked {
    let s = input_pair(Domain::Any, Domain::Any).prop_flat_map(|(a, b)| {
        let out = broadcast_shapes("test", &a.shape, &b.shape).expect("broadcastable");
        let k = out.len();
        // The condition takes a suffix of the output shape.
        (Just(a), Just(b), Just(out), 0..=k).prop_flat_map(|(a, b, out, r)| {
            let cshape = out[out.len() - r..].to_vec();
            let n: usize = cshape.iter().product();
            (
                Just(a),
                Just(b),
                Just(cshape),
                prop::collection::vec(any::<bool>(), n),
            )
        })
    });
    prop(
        n,
        s,
        |(a, b, cshape, c): (Input, Input, Vec<usize>, Vec<bool>)| {
            let cond = Tensor::from_vec(c, &cshape).map_err(fail)?;
            check(&[a.leaf(), b.leaf()], |xs| {
                Var::where_(&cond, &a.arrange.apply(&xs[0])?, &b.arrange.apply(&xs[1])?)
            })
        },
    )
}

/// Gradchecks a scalar form and compares its forward.
fn scalar(
    n: u32,
    domain: Domain,
    f: fn(&Var, f64) -> Result<Var>,
    reference: fn(f64, f64) -> f64,
) -> Checked {
    prop(n, (input(domain), -2.0..2.0f64), |(inp, s)| {
        let report = check(&[inp.leaf()], |xs| f(&inp.arrange.apply(&xs[0])?, s))?;
        let x = inp.arrange.apply(&Var::constant(inp.leaf())).map_err(fail)?;
        let want: Vec<f64> = inp.seen().into_iter().map(|v| reference(v, s)).collect();
        close(f(&x, s).map_err(fail)?.tensor(), &want, 1e-12)?;
        Ok(report)
    })
}

fn add_scalar(n: u32) -> Checked {
    scalar(n, Domain::Any, Var::add_scalar, |x, s| x + s)
}
fn sub_scalar(n: u32) -> Checked {
    scalar(n, Domain::Any, Var::sub_scalar, |x, s| x - s)
}
fn rsub_scalar(n: u32) -> Checked {
    scalar(n, Domain::Any, Var::rsub_scalar, |x, s| s - x)
}
fn mul_scalar(n: u32) -> Checked {
    scalar(n, Domain::Any, Var::mul_scalar, |x, s| x * s)
}
fn div_scalar(n: u32) -> Checked {
    scalar(n, Domain::Any, |x, s| x.div_scalar(s + 3.0), |x, s| x / (s + 3.0))
}
fn rdiv_scalar(n: u32) -> Checked {
    scalar(n, Domain::AwayFromZero, Var::rdiv_scalar, |x, s| s / x)
}

/// The operators record the same ops as the methods.
fn operators(n: u32) -> Checked {
    prop(n, input_pair(Domain::Any, Domain::AwayFromZero), |(a, b)| {
        check(&[a.leaf(), b.leaf()], |xs| {
            let (x, y) = (a.arrange.apply(&xs[0])?, b.arrange.apply(&xs[1])?);
            let z = &(&(&x + &y) * &x) - &(&x / &y);
            Ok(-(2.0 - &(&(&z * 0.5) + 1.0) / 3.0))
        })
    })
}

cases! {
    add: ["add"] => add;
    sub: ["sub"] => sub;
    mul: ["mul"] => mul;
    div: ["div"] => div;
    maximum: ["maximum"] => maximum;
    minimum: ["minimum"] => minimum;
    pow: ["pow"] => pow;
    where_: ["where"] => where_;
    add_scalar: ["add_scalar"] => add_scalar;
    sub_scalar: ["sub_scalar"] => sub_scalar;
    rsub_scalar: ["rsub_scalar"] => rsub_scalar;
    mul_scalar: ["mul_scalar"] => mul_scalar;
    div_scalar: ["div_scalar"] => div_scalar;
    rdiv_scalar: ["rdiv_scalar"] => rdiv_scalar;
    operators: ["add", "sub", "mul", "div", "neg", "rsub_scalar", "add_scalar", "mul_scalar", "div_scalar"] => operators;
}
