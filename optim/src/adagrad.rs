//! Adagrad (`torch.optim.Adagrad`), with learning-rate decay and `maximize`.

use tessera_tensor::{FloatElement, FloatMath, Result};

use crate::engine::{Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{update, Bufs};
use crate::sgd::{check_nonneg, coupled};
use crate::GroupOptimizer;

hyper_struct! {
    /// `torch.optim.Adagrad`'s hyperparameters and defaults.
    pub struct AdagradOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-2,
        /// Learning-rate decay: γₜ = γ/(1 + (t−1)·lr_decay).
        pub lr_decay: f64 = 0.0,
        /// Coupled L2 weight decay λ (added to the gradient).
        pub weight_decay: f64 = 0.0,
        /// The value the sum of squares starts from.
        pub initial_accumulator_value: f64 = 0.0,
        /// ε, added to the denominator.
        pub eps: f64 = 1e-10,
        /// Ascend instead of descend.
        pub maximize: bool = false,
    }
    momentum: none
}

/// Adagrad (`torch.optim.Adagrad`):
///
/// ```text
/// γₜ = γ/(1+(t−1)·lr_decay) ;  g ← ±g + λθ ;  s ← s + g² ;  θ ← θ − γₜ g/(√s + ε)
/// ```
pub type Adagrad = GroupOptimizer<AdagradRule>;

/// The [`Adagrad`] update rule.
#[derive(Debug, Default, Clone, Copy)]
pub struct AdagradRule;

impl Rule for AdagradRule {
    type Hyper = AdagradOptions;
    const NAME: &'static str = "Adagrad";
    const BUFFERS: &'static [&'static str] = &["sum"];

    fn validate(h: &AdagradOptions) -> Result<()> {
        check_nonneg(
            "Adagrad",
            &[
                ("lr", h.lr),
                ("lr_decay", h.lr_decay),
                ("weight_decay", h.weight_decay),
                ("initial_accumulator_value", h.initial_accumulator_value),
                ("eps", h.eps),
            ],
        )
    }

    fn buffers(_h: &AdagradOptions) -> &'static [&'static str] {
        Self::BUFFERS
    }

    fn init_value(h: &AdagradOptions, _buffer: &str) -> f64 {
        h.initial_accumulator_value
    }

    fn update<T: FloatElement>(
        &self,
        h: &AdagradOptions,
        ctx: StepCtx,
        p: &mut [T],
        g: &[T],
        b: Bufs<'_, T>,
    ) {
        let m = |v: f64| T::Math::of(v);
        let clr = m(h.lr / (1.0 + (ctx.step - 1) as f64 * h.lr_decay));
        let (wd, eps) = (m(h.weight_decay), m(h.eps));
        let (use_wd, maximize) = (h.weight_decay != 0.0, h.maximize);
        update(p, g, b, &|p, g, [sum, _, _]| {
            for ((p, &g), s) in p.iter_mut().zip(g).zip(sum.iter_mut()) {
                let x = p.to_math();
                let d = coupled(g.to_math(), x, wd, use_wd, maximize);
                let sv = T::from_math(s.to_math() + d * d);
                *s = sv;
                let std = sv.to_math().sqrt() + eps;
                *p = T::from_math(x - clr * d / std);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{param, run_steps};
    use crate::Optimizer;

    /// Expected values worked by hand from the equations (f64 parameters,
    /// lr 0.1, lr_decay 0.5, initial accumulator 0.5, weight decay 0.1):
    /// θ₀ = 1, g = 2 each step.
    /// t=1: d = 2 + 0.1 = 2.1, s = 0.5 + 4.41 = 4.91, γ₁ = 0.1,
    ///      θ₁ = 1 − 0.1·2.1/(√4.91 + 1e-10) = 0.9052283267...
    /// t=2: d = 2 + 0.0905229 = 2.0905229, s = 4.91 + d², γ₂ = 0.1/1.5, ...
    #[test]
    fn matches_hand_worked_steps() {
        let p = param(&[1.0], &[1]);
        let h = AdagradOptions {
            lr: 0.1,
            lr_decay: 0.5,
            initial_accumulator_value: 0.5,
            weight_decay: 0.1,
            ..Default::default()
        };
        let mut opt = Adagrad::new(vec![p.clone()], h).unwrap();
        let mut theta = 1.0f64;
        let mut s = 0.5f64;
        let t1 = 1.0 - 0.1 * 2.1 / (4.91f64.sqrt() + 1e-10);
        for t in 1..=3u64 {
            let d = 2.0 + 0.1 * theta;
            s += d * d;
            theta -= 0.1 / (1.0 + (t - 1) as f64 * 0.5) * d / (s.sqrt() + 1e-10);
            run_steps(&mut opt, &[(&p, &[2.0])], 1);
            let got = p.tensor().unwrap().to_vec::<f64>().unwrap()[0];
            assert!((got - theta).abs() < 1e-14, "step {t}: {got} vs {theta}");
            if t == 1 {
                assert!((got - t1).abs() < 1e-15 && (got - 0.905_228_326_7).abs() < 1e-9);
            }
        }
        assert_eq!(opt.name(), "Adagrad");
        assert!(opt.hyper(0).unwrap().momentum().is_none());
    }
}
