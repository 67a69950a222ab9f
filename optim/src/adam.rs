//! Adam and AdamW (`torch.optim.Adam` / `torch.optim.AdamW`), with AMSGrad
//! and `maximize`, in PyTorch's rounding form.

use tessera_tensor::{Error, FloatElement, FloatMath, Result};

use crate::engine::{DeviceStep, Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{update, Bufs};
use crate::sgd::check_nonneg;
use crate::GroupOptimizer;

hyper_struct! {
    /// `torch.optim.Adam`'s hyperparameters and defaults.
    pub struct AdamOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-3,
        /// β1, the first-moment decay (what a one-cycle schedule cycles).
        pub beta1: f64 = 0.9,
        /// β2, the second-moment decay.
        pub beta2: f64 = 0.999,
        /// ε, added to the denominator.
        pub eps: f64 = 1e-8,
        /// Coupled L2 weight decay λ (added to the gradient).
        pub weight_decay: f64 = 0.0,
        /// Use the running maximum of the second moment (AMSGrad).
        pub amsgrad: bool = false,
        /// Ascend instead of descend.
        pub maximize: bool = false,
    }
    momentum: beta1
}

hyper_struct! {
    /// `torch.optim.AdamW`'s hyperparameters and defaults.
    pub struct AdamWOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-3,
        /// β1, the first-moment decay (what a one-cycle schedule cycles).
        pub beta1: f64 = 0.9,
        /// β2, the second-moment decay.
        pub beta2: f64 = 0.999,
        /// ε, added to the denominator.
        pub eps: f64 = 1e-8,
        /// Decoupled weight decay λ (θ ← θ(1 − γλ) before the update).
        pub weight_decay: f64 = 1e-2,
        /// Use the running maximum of the second moment (AMSGrad).
        pub amsgrad: bool = false,
        /// Ascend instead of descend.
        pub maximize: bool = false,
    }
    momentum: beta1
}

/// Adam (`torch.optim.Adam`), with coupled L2 weight decay:
///
/// ```text
/// g ← ±g + λθ ;  m ← β1m + (1−β1)g ;  v ← β2v + (1−β2)g²   (amsgrad: v̂ ← max(v̂, v))
/// θ ← θ − (γ/(1−β1ᵗ)) · m / (√v/√(1−β2ᵗ) + ε)
/// ```
pub type Adam = GroupOptimizer<AdamRule>;

/// AdamW (`torch.optim.AdamW`): Adam with decoupled weight decay,
/// θ ← θ(1 − γλ) before the moment update.
pub type AdamW = GroupOptimizer<AdamWRule>;

/// How Adam's weight decay λ enters the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WeightDecay {
    /// L2 (Adam): λθ is added to the gradient.
    Coupled,
    /// Decoupled (AdamW): θ ← θ(1 − γλ) before the moment update.
    Decoupled,
}

/// Defines an Adam-family rule: a unit struct and its [`Rule`], the same for
/// every variant but for the options type, the name and the decay mode.
macro_rules! adam_rule {
    ($(#[$doc:meta])* $rule:ident, $options:ty, $name:literal, $decay:expr) => {
        $(#[$doc])*
        #[derive(Debug, Default, Clone, Copy)]
        pub struct $rule;

        impl Rule for $rule {
            type Hyper = $options;
            const NAME: &'static str = $name;
            const BUFFERS: &'static [&'static str] = BUFFERS;

            fn validate(h: &$options) -> Result<()> {
                validate($name, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay)
            }

            fn buffers(h: &$options) -> &'static [&'static str] {
                buffers(h.amsgrad)
            }

            fn update<T: FloatElement>(&self, h: &$options, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
                let s = Settings {
                    lr: h.lr,
                    beta1: h.beta1,
                    beta2: h.beta2,
                    eps: h.eps,
                    weight_decay: h.weight_decay,
                    decay: $decay,
                    amsgrad: h.amsgrad,
                    maximize: h.maximize,
                };
                adam_update(&s, ctx.step, p, g, b);
            }

            fn device_step(&self, h: &$options) -> Option<DeviceStep> {
                (!h.amsgrad).then_some(DeviceStep::Adam {
                    lr: h.lr,
                    beta1: h.beta1,
                    beta2: h.beta2,
                    eps: h.eps,
                    weight_decay: h.weight_decay,
                    decoupled: $decay == WeightDecay::Decoupled,
                    maximize: h.maximize,
                })
            }
        }
    };
}

adam_rule!(
    /// The [`Adam`] update rule (coupled L2 decay).
    AdamRule, AdamOptions, "Adam", WeightDecay::Coupled
);
adam_rule!(
    /// The [`AdamW`] update rule (decoupled decay).
    AdamWRule, AdamWOptions, "AdamW", WeightDecay::Decoupled
);

const BUFFERS: &[&str] = &["exp_avg", "exp_avg_sq", "max_exp_avg_sq"];

fn buffers(amsgrad: bool) -> &'static [&'static str] {
    if amsgrad {
        BUFFERS
    } else {
        &BUFFERS[..2]
    }
}

fn validate(op: &'static str, lr: f64, beta1: f64, beta2: f64, eps: f64, wd: f64) -> Result<()> {
    check_nonneg(op, &[("lr", lr), ("eps", eps), ("weight_decay", wd)])?;
    for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::arg(op, format!("invalid {name}: {b} (must be in [0, 1))")));
        }
    }
    Ok(())
}

/// The hyperparameters of one Adam step, whichever variant.
struct Settings {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    decay: WeightDecay,
    amsgrad: bool,
    maximize: bool,
}

/// `torch.optim.adam._single_tensor_adam`: the bias corrections are
/// computed in f64 (Python floats), the element math in the parameter's
/// math type.
fn adam_update<T: FloatElement>(s: &Settings, step: u64, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
    let m = |v: f64| T::Math::of(v);
    let t = step.min(i32::MAX as u64) as i32;
    let bc1 = 1.0 - s.beta1.powi(t);
    let bc2_sqrt = (1.0 - s.beta2.powi(t)).sqrt();
    let step_size = m(s.lr / bc1);
    let bc2_sqrt = m(bc2_sqrt);
    let (w1, beta2, w2, eps) = (m(1.0 - s.beta1), m(s.beta2), m(1.0 - s.beta2), m(s.eps));
    let decay = m(1.0 - s.lr * s.weight_decay);
    let wd = m(s.weight_decay);
    let (use_wd, decoupled, amsgrad, maximize) = (
        s.weight_decay != 0.0,
        s.decay == WeightDecay::Decoupled,
        s.amsgrad,
        s.maximize,
    );
    update(p, g, b, &|p, g, [ea, eas, vmax]| {
        let n = p.len();
        let (g, ea, eas) = (&g[..n], &mut ea[..n], &mut eas[..n]);
        for i in 0..n {
            let mut x = p[i].to_math();
            let mut gi = g[i].to_math();
            if maximize {
                gi = -gi;
            }
            if use_wd {
                if decoupled {
                    x = T::from_math(x * decay).to_math();
                } else {
                    gi += wd * x;
                }
            }
            let mi = T::from_math(lerp(ea[i].to_math(), gi, w1));
            ea[i] = mi;
            let vi = T::from_math(T::from_math(eas[i].to_math() * beta2).to_math() + w2 * gi * gi);
            eas[i] = vi;
            let v = if amsgrad {
                let vm = max(vmax[i], vi);
                vmax[i] = vm;
                vm
            } else {
                vi
            };
            let denom = v.to_math().sqrt() / bc2_sqrt + eps;
            p[i] = T::from_math(x - step_size * mi.to_math() / denom);
        }
    });
}

/// ATen's `lerp`: `a + w(b − a)` for w < ½, else `b − (b − a)(1 − w)`.
#[inline(always)]
pub(crate) fn lerp<M: FloatMath>(a: M, b: M, w: M) -> M {
    if w < M::of(0.5) {
        a + w * (b - a)
    } else {
        b - (b - a) * (M::ONE - w)
    }
}

/// The larger of two stored values, NaN-propagating like `torch.maximum`.
#[inline(always)]
fn max<T: FloatElement>(a: T, b: T) -> T {
    T::from_math(a.to_math().max_nan(b.to_math()))
}

#[cfg(test)]
#[path = "adam_tests.rs"]
mod tests;
