//! SGD with momentum, dampening, Nesterov, coupled weight decay and
//! `maximize`: `torch.optim.SGD`'s update, element by element.

use tessera_tensor::{Error, FloatElement, FloatMath, Result};

use crate::engine::{Rule, StepCtx};
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

    fn update<T: FloatElement>(&self, h: &SgdOptions, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
        let m = |v: f64| T::Math::of(v);
        let (lr, wd, mu, damp) = (m(h.lr), m(h.weight_decay), m(h.momentum), m(1.0 - h.dampening));
        let (use_wd, nesterov, maximize) = (h.weight_decay != 0.0, h.nesterov, h.maximize);
        if h.momentum == 0.0 {
            update(p, g, b, &|p, g, _| {
                for (p, &g) in p.iter_mut().zip(g) {
                    let x = p.to_math();
                    let d = coupled(g.to_math(), x, wd, use_wd, maximize);
                    *p = T::from_math(x - lr * d);
                }
            });
            return;
        }
        update(p, g, b, &|p, g, [buf, _, _]| {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                let x = p.to_math();
                let d = coupled(g.to_math(), x, wd, use_wd, maximize);
                let nb = if ctx.fresh { d } else { mu * b.to_math() + damp * d };
                let nb_stored = T::from_math(nb);
                *b = nb_stored;
                let nb = nb_stored.to_math();
                let d = if nesterov { d + mu * nb } else { nb };
                *p = T::from_math(x - lr * d);
            }
        });
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
