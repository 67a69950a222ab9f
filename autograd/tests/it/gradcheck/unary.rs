//! Elementwise unary ops: gradcheck on every arrangement, forward against
//! the f64 formula.

use proptest::prelude::*;
use tessera_autograd::{GradcheckOptions, Var};
use tessera_tensor::{erf, DType, GeluApprox, Result};

use crate::gradcheck::common::{check, check_with, close, input, prop, Checked, Domain, Input};

/// Gradchecks `f` on random inputs from `domain` and compares its forward
/// with `reference` applied to each element.
fn unary(
    n: u32,
    domain: Domain,
    f: impl Fn(&Var) -> Result<Var> + Copy,
    reference: impl Fn(f64) -> f64,
) -> Checked {
    prop(n, input(domain), |inp: Input| {
        let report = check(&[inp.leaf()], |xs| f(&inp.arrange.apply(&xs[0])?))?;
        let x = inp
            .arrange
            .apply(&Var::constant(inp.leaf()))
            .map_err(crate::gradcheck::common::fail)?;
        let want: Vec<f64> = inp.seen().into_iter().map(&reference).collect();
        close(
            f(&x).map_err(crate::gradcheck::common::fail)?.tensor(),
            &want,
            1e-12,
        )?;
        Ok(report)
    })
}

fn neg(n: u32) -> Checked {
    unary(n, Domain::Any, Var::neg, |x| -x)
}
fn abs(n: u32) -> Checked {
    unary(n, Domain::AwayFromZero, Var::abs, f64::abs)
}
fn exp(n: u32) -> Checked {
    unary(n, Domain::Any, Var::exp, f64::exp)
}
fn log(n: u32) -> Checked {
    unary(n, Domain::Positive, Var::log, f64::ln)
}
fn log1p(n: u32) -> Checked {
    unary(n, Domain::Positive, Var::log1p, f64::ln_1p)
}
fn expm1(n: u32) -> Checked {
    unary(n, Domain::Any, Var::expm1, f64::exp_m1)
}
fn sqrt(n: u32) -> Checked {
    unary(n, Domain::Positive, Var::sqrt, f64::sqrt)
}
fn rsqrt(n: u32) -> Checked {
    unary(n, Domain::Positive, Var::rsqrt, |x| 1.0 / x.sqrt())
}
fn recip(n: u32) -> Checked {
    unary(n, Domain::AwayFromZero, Var::recip, f64::recip)
}
fn square(n: u32) -> Checked {
    unary(n, Domain::Any, Var::square, |x| x * x)
}
fn pow_scalar(n: u32) -> Checked {
    let mut seen = std::collections::BTreeSet::new();
    for e in [2.5, -1.5, 3.0, 0.5, 0.0, 1.0] {
        seen.extend(unary(
            n.div_ceil(4),
            Domain::Positive,
            move |x| x.pow_scalar(e),
            move |x| x.powf(e),
        )?);
    }
    Ok(seen)
}
fn rpow_scalar(n: u32) -> Checked {
    let mut seen = std::collections::BTreeSet::new();
    for s in [2.0, 0.5, 3.7] {
        seen.extend(unary(
            n.div_ceil(2),
            Domain::Any,
            move |x| x.rpow_scalar(s),
            move |x| s.powf(x),
        )?);
    }
    Ok(seen)
}
fn sin(n: u32) -> Checked {
    unary(n, Domain::Any, Var::sin, f64::sin)
}
fn cos(n: u32) -> Checked {
    unary(n, Domain::Any, Var::cos, f64::cos)
}
fn tanh(n: u32) -> Checked {
    unary(n, Domain::Any, Var::tanh, f64::tanh)
}
fn sigmoid(n: u32) -> Checked {
    unary(n, Domain::Any, Var::sigmoid, |x| 1.0 / (1.0 + (-x).exp()))
}
fn relu(n: u32) -> Checked {
    unary(n, Domain::AwayFromZero, Var::relu, |x| x.max(0.0))
}
fn gelu_erf(n: u32) -> Checked {
    unary(
        n,
        Domain::Any,
        |x| x.gelu(GeluApprox::None),
        |x| 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
    )
}
fn gelu_tanh(n: u32) -> Checked {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    unary(
        n,
        Domain::Any,
        |x| x.gelu(GeluApprox::Tanh),
        move |x| 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh()),
    )
}
fn silu(n: u32) -> Checked {
    unary(n, Domain::Any, Var::silu, |x| x / (1.0 + (-x).exp()))
}
fn erf_case(n: u32) -> Checked {
    unary(n, Domain::Any, Var::erf, erf)
}
fn clamp(n: u32) -> Checked {
    let mut seen = std::collections::BTreeSet::new();
    for (lo, hi) in [(Some(-0.5), Some(0.7)), (Some(0.3), None), (None, Some(-0.2))] {
        let f = move |x: &Var| x.clamp(lo, hi);
        let r = move |x: f64| x.max(lo.unwrap_or(f64::MIN)).min(hi.unwrap_or(f64::MAX));
        seen.extend(unary(n.div_ceil(2), Domain::Any, f, r)?);
    }
    Ok(seen)
}

/// f64 → f32 → f64 is linear; the step is large enough that f32 rounding
/// (≈ 2.4e-7 at 2) stays far below the tolerance.
fn to_dtype(n: u32) -> Checked {
    let opts = GradcheckOptions {
        eps: 1e-2,
        atol: 1e-4,
        rtol: 1e-4,
    };
    prop(n, input(Domain::Any), |inp: Input| {
        let report = check_with(&[inp.leaf()], opts, |xs| {
            inp.arrange
                .apply(&xs[0])?
                .to_dtype(DType::F32)?
                .exp()?
                .to_dtype(DType::F64)
        })?;
        prop_assert!(report.ops.contains("to_dtype"));
        Ok(report)
    })
}

cases! {
    neg: ["neg"] => neg;
    abs: ["abs"] => abs;
    exp: ["exp"] => exp;
    log: ["log"] => log;
    log1p: ["log1p"] => log1p;
    expm1: ["expm1"] => expm1;
    sqrt: ["sqrt"] => sqrt;
    rsqrt: ["rsqrt"] => rsqrt;
    recip: ["recip"] => recip;
    square: ["square"] => square;
    pow_scalar: ["pow_scalar"] => pow_scalar;
    rpow_scalar: ["rpow_scalar"] => rpow_scalar;
    sin: ["sin"] => sin;
    cos: ["cos"] => cos;
    tanh: ["tanh"] => tanh;
    sigmoid: ["sigmoid"] => sigmoid;
    relu: ["relu"] => relu;
    gelu_erf: ["gelu"] => gelu_erf;
    gelu_tanh: ["gelu"] => gelu_tanh;
    silu: ["silu"] => silu;
    erf: ["erf"] => erf_case;
    clamp: ["clamp"] => clamp;
    to_dtype: ["to_dtype"] => to_dtype;
}
