//! LARS / LARC (timm `Lars`): SGD whose gradient is scaled per layer by the
//! trust ratio η‖θ‖/(‖g‖ + λ‖θ‖ + ε).

use tessera_tensor::{Error, FloatElement, FloatMath, Result};

use crate::engine::{Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{sum_sq, update, Bufs};
use crate::sgd::check_nonneg;
use crate::GroupOptimizer;

hyper_struct! {
    /// timm `Lars`'s hyperparameters and defaults.
    pub struct LarsOptions {
        /// Learning rate γ.
        pub lr: f64 = 1.0,
        /// Momentum μ (0: none).
        pub momentum: f64 = 0.0,
        /// Dampening τ of the momentum.
        pub dampening: f64 = 0.0,
        /// Weight decay λ (added to the gradient before the trust ratio).
        pub weight_decay: f64 = 0.0,
        /// Nesterov momentum (needs μ > 0 and τ = 0).
        pub nesterov: bool = false,
        /// Trust coefficient η.
        pub trust_coeff: f64 = 1e-3,
        /// ε, added to the trust ratio's denominator.
        pub eps: f64 = 1e-8,
        /// LARC: clip the ratio to min(r/γ, 1).
        pub trust_clip: bool = false,
        /// Adapt parameters without weight decay too.
        pub always_adapt: bool = false,
    }
    momentum: momentum
}

/// LARS (timm `Lars`; LARC with `trust_clip`):
///
/// ```text
/// if λ≠0 or always_adapt:
///     r = η‖θ‖/(‖g‖ + λ‖θ‖ + ε)  (1 if ‖θ‖ or ‖g‖ is 0; LARC: min(r/γ, 1))
///     g ← (g + λθ)·r
/// SGD momentum (b ← g on the first step, else μb + (1−τ)g; nesterov: g + μb) ;  θ ← θ − γg
/// ```
pub type Lars = GroupOptimizer<LarsRule>;

/// The [`Lars`] update rule.
#[derive(Debug, Default, Clone, Copy)]
pub struct LarsRule;

impl Rule for LarsRule {
    type Hyper = LarsOptions;
    const NAME: &'static str = "Lars";
    const BUFFERS: &'static [&'static str] = &["momentum_buffer"];

    fn validate(h: &LarsOptions) -> Result<()> {
        check_nonneg(
            "Lars",
            &[
                ("lr", h.lr),
                ("momentum", h.momentum),
                ("weight_decay", h.weight_decay),
                ("trust_coeff", h.trust_coeff),
                ("eps", h.eps),
            ],
        )?;
        if h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0) {
            return Err(Error::arg(
                "Lars",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }

    fn buffers(h: &LarsOptions) -> &'static [&'static str] {
        if h.momentum != 0.0 {
            Self::BUFFERS
        } else {
            &[]
        }
    }

    fn update<T: FloatElement>(&self, h: &LarsOptions, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
        let m = |v: f64| T::Math::of(v);
        let adapt = h.weight_decay != 0.0 || h.always_adapt;
        let ratio = if adapt {
            let (w, gn) = (sum_sq(p).sqrt(), sum_sq(g).sqrt());
            let mut r = if w > 0.0 && gn > 0.0 {
                h.trust_coeff * w / (gn + w * h.weight_decay + h.eps)
            } else {
                1.0
            };
            if h.trust_clip {
                r = (r / h.lr).min(1.0);
            }
            r
        } else {
            1.0
        };
        let (r, wd, lr, mu, damp) = (
            m(ratio),
            m(h.weight_decay),
            m(h.lr),
            m(h.momentum),
            m(1.0 - h.dampening),
        );
        let (use_mom, nesterov) = (h.momentum != 0.0, h.nesterov);
        update(p, g, b, &|p, g, [buf, _, _]| {
            for i in 0..p.len() {
                let x = p[i].to_math();
                let mut d = g[i].to_math();
                if adapt {
                    d = T::from_math(d + wd * x).to_math() * r;
                }
                if use_mom {
                    let nb = T::from_math(if ctx.fresh {
                        d
                    } else {
                        mu * buf[i].to_math() + damp * d
                    });
                    buf[i] = nb;
                    d = if nesterov {
                        d + mu * nb.to_math()
                    } else {
                        nb.to_math()
                    };
                }
                p[i] = T::from_math(x - lr * d);
            }
        });
    }
}

#[cfg(test)]
#[path = "lars_tests.rs"]
mod tests;
