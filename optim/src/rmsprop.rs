//! RMSprop (`torch.optim.RMSprop`), centered or not, with momentum and
//! `maximize`.

use tessera_tensor::{FloatElement, FloatMath, Result};

use crate::adam::lerp;
use crate::engine::{Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{update, Bufs};
use crate::sgd::{check_nonneg, coupled};
use crate::GroupOptimizer;

hyper_struct! {
    /// `torch.optim.RMSprop`'s hyperparameters and defaults.
    pub struct RmsPropOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-2,
        /// Smoothing constant α of the squared-gradient average.
        pub alpha: f64 = 0.99,
        /// ε, added to the denominator (outside the square root).
        pub eps: f64 = 1e-8,
        /// Coupled L2 weight decay λ (added to the gradient).
        pub weight_decay: f64 = 0.0,
        /// Momentum μ (0: none).
        pub momentum: f64 = 0.0,
        /// Normalize by the variance estimate v − ḡ² instead of v.
        pub centered: bool = false,
        /// Ascend instead of descend.
        pub maximize: bool = false,
    }
    momentum: momentum
}

/// RMSprop (`torch.optim.RMSprop`):
///
/// ```text
/// g ← ±g + λθ ;  v ← αv + (1−α)g² ;  centered: ḡ ← lerp(ḡ, g, 1−α), v' = v − ḡ² (else v' = v)
/// μ>0: b ← μb + g/(√v' + ε), θ ← θ − γb ;  else θ ← θ − γ g/(√v' + ε)
/// ```
pub type RmsProp = GroupOptimizer<RmsPropRule>;

/// The [`RmsProp`] update rule.
#[derive(Debug, Default, Clone, Copy)]
pub struct RmsPropRule;

const ALL: &[&str] = &["square_avg", "grad_avg", "momentum_buffer"];

impl Rule for RmsPropRule {
    type Hyper = RmsPropOptions;
    const NAME: &'static str = "RMSprop";
    const BUFFERS: &'static [&'static str] = ALL;

    fn validate(h: &RmsPropOptions) -> Result<()> {
        check_nonneg(
            "RMSprop",
            &[
                ("lr", h.lr),
                ("alpha", h.alpha),
                ("eps", h.eps),
                ("weight_decay", h.weight_decay),
                ("momentum", h.momentum),
            ],
        )
    }

    fn buffers(h: &RmsPropOptions) -> &'static [&'static str] {
        match (h.centered, h.momentum > 0.0) {
            (false, false) => &ALL[..1],
            (true, false) => &ALL[..2],
            (false, true) => &["square_avg", "momentum_buffer"],
            (true, true) => ALL,
        }
    }

    fn update<T: FloatElement>(
        &self,
        h: &RmsPropOptions,
        _ctx: StepCtx,
        p: &mut [T],
        g: &[T],
        b: Bufs<'_, T>,
    ) {
        let m = |v: f64| T::Math::of(v);
        let (lr, alpha, w, eps, wd, mu) = (
            m(h.lr),
            m(h.alpha),
            m(1.0 - h.alpha),
            m(h.eps),
            m(h.weight_decay),
            m(h.momentum),
        );
        let (use_wd, maximize, centered, use_mom) =
            (h.weight_decay != 0.0, h.maximize, h.centered, h.momentum > 0.0);
        update(p, g, b, &|p, g, [sq, b1, b2]| {
            let (gavg, mbuf) = if centered { (b1, b2) } else { (b2, b1) };
            let n = p.len();
            let (g, sq) = (&g[..n], &mut sq[..n]);
            for i in 0..n {
                let x = p[i].to_math();
                let d = coupled(g[i].to_math(), x, wd, use_wd, maximize);
                let v = T::from_math(T::from_math(sq[i].to_math() * alpha).to_math() + w * d * d);
                sq[i] = v;
                let avg = if centered {
                    let ga = T::from_math(lerp(gavg[i].to_math(), d, w));
                    gavg[i] = ga;
                    let ga = ga.to_math();
                    (v.to_math() - ga * ga).sqrt() + eps
                } else {
                    v.to_math().sqrt() + eps
                };
                if use_mom {
                    let bv = T::from_math(T::from_math(mbuf[i].to_math() * mu).to_math() + d / avg);
                    mbuf[i] = bv;
                    p[i] = T::from_math(x - lr * bv.to_math());
                } else {
                    p[i] = T::from_math(x - lr * d / avg);
                }
            }
        });
    }
}

#[cfg(test)]
#[path = "rmsprop_tests.rs"]
mod tests;
