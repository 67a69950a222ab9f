//! SGD with momentum, dampening, Nesterov, coupled weight decay and
//! `maximize`: `torch.optim.SGD`'s update, element by element.

use tessera_tensor::{Error, FloatElement, FloatMath, Result};

use crate::engine::{DeviceStep, Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{update, Bufs};
use crate::GroupOptimizer;

hyper_struct! {
    /// `torch.optim.SGD`'s hyperparameters and defaults (lr: PyTorch's
    /// newer default 1e-3).
    pub struct SgdOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-3,
        /// Momentum μ (0: plain SGD).
        pub momentum: f64 = 0.0,
        /// Dampening τ of the momentum.
        pub dampening: f64 = 0.0,
        /// Coupled L2 weight decay λ (added to the gradient).
        pub weight_decay: f64 = 0.0,
        /// Nesterov momentum (needs μ > 0 and τ = 0).
        pub nesterov: bool = false,
        /// Ascend instead of descend.
        pub maximize: bool = false,
    }
    momentum: momentum
}

/// Stochastic gradient descent (`torch.optim.SGD`):
///
/// ```text
/// d ← ±g + λθ
/// if μ≠0: b ← d on the first step, else μb + (1−τ)d;  d ← d + μb (nesterov) or b
/// θ ← θ − γd
/// ```
pub type Sgd = GroupOptimizer<SgdRule>;

/// The [`Sgd`] update rule.
#[derive(Debug, Default, Clone, Copy)]
pub struct SgdRule;

impl Rule for SgdRule {
    type Hyper = SgdOptions;
    const NAME: &'static str = "SGD";
    const BUFFERS: &'static [&'static str] = &["momentum_buffer"];

    fn validate(h: &SgdOptions) -> Result<()> {
        check_nonneg(
            "SGD",
            &[
                ("lr", h.lr),
                ("momentum", h.momentum),
                ("weight_decay", h.weight_decay),
            ],
        )?;
        if h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0) {
            return Err(Error::arg(
                "SGD",
                format!(
                    "Nesterov momentum requires a momentum and zero dampening (momentum {}, dampening {})",
                    h.momentum, h.dampening
                ),
            ));
        }
        Ok(())
    }

    fn buffers(h: &SgdOptions) -> &'static [&'static str] {
        if h.momentum != 0.0 {
            Self::BUFFERS
        } else {
            &[]
        }
    }

    fn device_step(&self, h: &SgdOptions) -> Option<DeviceStep> {
        Some(DeviceStep::Sgd {
            lr: h.lr,
            momentum: h.momentum,
            dampening: h.dampening,
            weight_decay: h.weight_decay,
            nesterov: h.nesterov,
            maximize: h.maximize,
        })
    }

    fn update<T: FloatElement>(&self, h: &SgdOptions, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
        let m = |v: f64| T::Math::of(v);
        let c = Coeffs {
            lr: m(h.lr),
            wd: m(h.weight_decay),
            mu: m(h.momentum),
            damp: m(1.0 - h.dampening),
        };
        // One monomorphic loop per flag combination: with the flags constant
        // inside the loop it vectorizes, and the arithmetic (so the result)
        // is the same as with the flags tested per element.
        let flags = (h.weight_decay != 0.0, h.maximize, h.nesterov);
        macro_rules! dispatch {
            ($run:ident) => {
                match flags {
                    (false, false, false) => $run::<T, false, false, false>(c, ctx, p, g, b),
                    (false, false, true) => $run::<T, false, false, true>(c, ctx, p, g, b),
                    (false, true, false) => $run::<T, false, true, false>(c, ctx, p, g, b),
                    (false, true, true) => $run::<T, false, true, true>(c, ctx, p, g, b),
                    (true, false, false) => $run::<T, true, false, false>(c, ctx, p, g, b),
                    (true, false, true) => $run::<T, true, false, true>(c, ctx, p, g, b),
                    (true, true, false) => $run::<T, true, true, false>(c, ctx, p, g, b),
                    (true, true, true) => $run::<T, true, true, true>(c, ctx, p, g, b),
                }
            };
        }
        if h.momentum == 0.0 {
            dispatch!(plain_step);
        } else {
            dispatch!(momentum_step);
        }
    }
}

/// SGD's coefficients in the parameter's math type.
#[derive(Clone, Copy)]
struct Coeffs<M> {
    lr: M,
    wd: M,
    mu: M,
    damp: M,
}

/// θ ← θ − γd without momentum (`NESTEROV` is unused: it needs momentum).
fn plain_step<T: FloatElement, const WD: bool, const MAX: bool, const NESTEROV: bool>(
    c: Coeffs<T::Math>,
    _ctx: StepCtx,
    p: &mut [T],
    g: &[T],
    b: Bufs<'_, T>,
) {
    update(p, g, b, &|p, g, _| {
        for (p, &g) in p.iter_mut().zip(g) {
            let x = p.to_math();
            let d = coupled(g.to_math(), x, c.wd, WD, MAX);
            *p = T::from_math(x - c.lr * d);
        }
    });
}

/// The momentum step; the buffer is rounded to `T` before θ reads it, as
/// PyTorch stores it.
fn momentum_step<T: FloatElement, const WD: bool, const MAX: bool, const NESTEROV: bool>(
    c: Coeffs<T::Math>,
    ctx: StepCtx,
    p: &mut [T],
    g: &[T],
    b: Bufs<'_, T>,
) {
    update(p, g, b, &|p, g, [buf, _, _]| {
        if ctx.fresh {
            momentum_loop::<T, true, WD, MAX, NESTEROV>(c, p, g, buf)
        } else {
            momentum_loop::<T, false, WD, MAX, NESTEROV>(c, p, g, buf)
        }
    });
}

/// One piece of [`momentum_step`]; `FRESH`: the buffer starts from d.
#[inline(always)]
fn momentum_loop<
    T: FloatElement,
    const FRESH: bool,
    const WD: bool,
    const MAX: bool,
    const NESTEROV: bool,
>(
    c: Coeffs<T::Math>,
    p: &mut [T],
    g: &[T],
    buf: &mut [T],
) {
    let n = p.len();
    let (g, buf) = (&g[..n], &mut buf[..n]);
    for i in 0..n {
        let x = p[i].to_math();
        let d = coupled(g[i].to_math(), x, c.wd, WD, MAX);
        let nb = if FRESH {
            d
        } else {
            c.mu * buf[i].to_math() + c.damp * d
        };
        let nb_stored = T::from_math(nb);
        buf[i] = nb_stored;
        let nb = nb_stored.to_math();
        let d = if NESTEROV { d + c.mu * nb } else { nb };
        p[i] = T::from_math(x - c.lr * d);
    }
}

/// The gradient, negated when maximizing, plus coupled weight decay λθ.
#[inline(always)]
pub(crate) fn coupled<M: FloatMath>(g: M, x: M, wd: M, use_wd: bool, maximize: bool) -> M {
    let g = if maximize { -g } else { g };
    if use_wd {
        g + wd * x
    } else {
        g
    }
}

/// Errors, naming `op`, for any negative (or NaN) value.
pub(crate) fn check_nonneg(op: &'static str, values: &[(&str, f64)]) -> Result<()> {
    for &(name, v) in values {
        if v.is_nan() || v < 0.0 {
            return Err(Error::arg(op, format!("invalid {name}: {v} (must be ≥ 0)")));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "sgd_tests.rs"]
mod tests;
