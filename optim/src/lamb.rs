//! LAMB (timm `Lamb` = apex `FusedLAMB`/NVLAMB): Adam moments on globally
//! clipped gradients, with a per-layer trust ratio ‖θ‖/‖u‖.

use tessera_autograd::Gradients;
use tessera_tensor::{with_float_dtype, DType, Error, FloatElement, FloatMath, Result, Tensor};

use crate::engine::{DeviceStep, Rule, StepCtx};
use crate::hyper::hyper_struct;
use crate::kernel::{fused, update, Bufs};
use crate::sgd::check_nonneg;
use crate::StateDict;
use crate::{GroupOptimizer, ParamGroup};

hyper_struct! {
    /// timm `Lamb`'s (and apex `FusedLAMB`'s) hyperparameters and defaults.
    pub struct LambOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-3,
        /// β1, the first-moment decay (what a one-cycle schedule cycles).
        pub beta1: f64 = 0.9,
        /// β2, the second-moment decay.
        pub beta2: f64 = 0.999,
        /// ε, added to the denominator.
        pub eps: f64 = 1e-6,
        /// Weight decay λ, added to the update (or decoupled, below).
        pub weight_decay: f64 = 0.01,
        /// Divide the moments by 1 − βᵗ.
        pub bias_correction: bool = true,
        /// Scale the gradient by 1 − β1 in the first moment (else 1).
        pub grad_averaging: bool = true,
        /// Clip the trust ratio at 1 (LAMBC).
        pub trust_clip: bool = false,
        /// Adapt parameters without weight decay too (apex `use_nvlamb`).
        pub always_adapt: bool = false,
        /// Apply θ ← θ − γλθ outside the trust ratio instead of adding λθ
        /// to the update.
        pub decoupled_decay: bool = false,
    }
    momentum: beta1
}

/// LAMB (timm `Lamb`; apex `FusedLAMB` with `adam_w_mode`):
///
/// ```text
/// c = max(1, ‖all grads‖₂ / max_grad_norm) ;  ĝ = g/c
/// m ← β1m + β3ĝ (β3 = 1−β1 if grad_averaging else 1) ;  v ← β2v + (1−β2)ĝ²
/// u = (m/(1−β1ᵗ)) / (√v/√(1−β2ᵗ) + ε) + λθ
/// r = ‖θ‖/‖u‖ (1 if either is 0; min(r, 1) with trust_clip) when λ≠0 or always_adapt, else 1
/// θ ← θ − γ r u
/// ```
/// Parameters without weight decay get no trust ratio, as in timm and apex.
pub type Lamb = GroupOptimizer<LambRule>;

/// The [`Lamb`] rule, holding the optimizer-wide gradient clipping.
#[derive(Debug, Clone, Copy)]
pub struct LambRule {
    /// The global gradient norm above which gradients are scaled down
    /// (infinite: no clipping). Default 1.0.
    pub max_grad_norm: f64,
    clip: f64,
}

impl Default for LambRule {
    fn default() -> Self {
        LambRule::new(1.0)
    }
}

impl LambRule {
    /// A rule clipping the global gradient norm at `max_grad_norm`
    /// (`f64::INFINITY` turns clipping off).
    pub fn new(max_grad_norm: f64) -> LambRule {
        LambRule {
            max_grad_norm,
            clip: 1.0,
        }
    }
}

impl Rule for LambRule {
    type Hyper = LambOptions;
    const NAME: &'static str = "Lamb";
    const BUFFERS: &'static [&'static str] = &["exp_avg", "exp_avg_sq"];

    fn validate(h: &LambOptions) -> Result<()> {
        check_nonneg(
            "Lamb",
            &[("lr", h.lr), ("eps", h.eps), ("weight_decay", h.weight_decay)],
        )?;
        for (name, b) in [("beta1", h.beta1), ("beta2", h.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::arg(
                    "Lamb",
                    format!("invalid {name}: {b} (must be in [0, 1))"),
                ));
            }
        }
        Ok(())
    }

    fn buffers(_h: &LambOptions) -> &'static [&'static str] {
        Self::BUFFERS
    }

    fn prepare(&mut self, groups: &[ParamGroup<LambOptions>], grads: &Gradients) -> Result<()> {
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return Err(Error::arg(
                "Lamb",
                format!("invalid max_grad_norm: {} (must be > 0)", self.max_grad_norm),
            ));
        }
        self.clip = 1.0;
        if self.max_grad_norm.is_finite() {
            let mut sq = 0.0;
            for g in groups
                .iter()
                .flat_map(|grp| &grp.params)
                .filter_map(|p| p.grad(grads))
            {
                sq += if g.device().is_cpu() {
                    let g = g.contiguous()?;
                    with_float_dtype!(g.dtype(), T => crate::kernel::sum_sq(g.as_slice::<T>()?), else 0.0)
                } else {
                    device_sum_sq(g)?
                };
            }
            self.clip = (sq.sqrt() / self.max_grad_norm).max(1.0);
        }
        Ok(())
    }

    fn device_step(&self, h: &LambOptions) -> Option<DeviceStep> {
        Some(DeviceStep::Lamb {
            lr: h.lr,
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            weight_decay: h.weight_decay,
            bias_correction: h.bias_correction,
            grad_averaging: h.grad_averaging,
            trust_clip: h.trust_clip,
            always_adapt: h.always_adapt,
            decoupled_decay: h.decoupled_decay,
            clip: self.clip,
        })
    }

    fn update<T: FloatElement>(&self, h: &LambOptions, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>) {
        let k = Kernel::<T::Math>::new(h, ctx.step, self.clip);
        let [m, v, e] = b;
        if !(h.weight_decay != 0.0 || h.always_adapt) {
            update(p, g, [m, v, e], &|p, g, [m, v, _]| {
                for i in 0..p.len() {
                    k.moments(g[i], &mut m[i], &mut v[i]);
                    let x = k.param(p[i]);
                    p[i] = T::from_math(x - k.lr * k.update(x, m[i], v[i]));
                }
            });
            return;
        }
        // Pass 1: moments, and the squared norms of θ and of the update.
        let (w2, u2) = fused(
            p,
            g,
            [&mut *m, &mut *v, &mut *e],
            &|p, g, [m, v, _]| {
                let (mut w2, mut u2) = (0.0f64, 0.0f64);
                for i in 0..p.len() {
                    k.moments(g[i], &mut m[i], &mut v[i]);
                    let x = k.param(p[i]);
                    let u = k.update(x, m[i], v[i]).f64();
                    w2 += x.f64() * x.f64();
                    u2 += u * u;
                }
                (w2, u2)
            },
            &|a, b| (a.0 + b.0, a.1 + b.1),
        );
        let (wn, un) = (w2.sqrt(), u2.sqrt());
        let mut r = if wn > 0.0 && un > 0.0 { wn / un } else { 1.0 };
        if h.trust_clip {
            r = r.min(1.0);
        }
        let r = T::Math::of(r);
        // Pass 2: the same update, recomputed from the stored moments, times r.
        update(p, g, [m, v, e], &|p, _, [m, v, _]| {
            for i in 0..p.len() {
                let x = k.param(p[i]);
                p[i] = T::from_math(x - k.lr * (k.update(x, m[i], v[i]) * r));
            }
        });
    }

    fn save_config(&self, sd: &mut StateDict) {
        sd.set("max_grad_norm", self.max_grad_norm);
    }

    fn load_config(&mut self, sd: &StateDict) -> Result<()> {
        self.max_grad_norm = sd.get("Optimizer::load_state_dict", "max_grad_norm")?;
        Ok(())
    }
}

/// Σ g² of a gradient on a GPU: f32 sums of rows of 256 squares on the
/// device (short sums, so f32 loses little), read back and added in f64
/// like the CPU's `sum_sq`.
fn device_sum_sq(g: &Tensor) -> Result<f64> {
    const ROW: usize = 256;
    let n = g.numel();
    let flat = g.to_dtype(DType::F32)?.reshape([n])?;
    let rows = n / ROW;
    let mut parts = flat
        .narrow(0, 0, rows * ROW)?
        .reshape([rows, ROW])?
        .square()?
        .sum(&[1], false)?
        .cpu()?
        .to_vec::<f32>()?;
    parts.push(
        flat.narrow(0, rows * ROW, n - rows * ROW)?
            .square()?
            .sum(&[], false)?
            .cpu()?
            .to_scalar::<f32>()?,
    );
    Ok(parts.iter().map(|&p| p as f64).sum())
}

/// One step's constants, in the parameter's math type.
struct Kernel<M> {
    lr: M,
    beta1: M,
    beta2: M,
    beta3: M,
    one_minus_beta2: M,
    bc1: M,
    bc2_sqrt: M,
    eps: M,
    wd: M,
    neg_lr_wd: M,
    clip: M,
    coupled: bool,
    decoupled: bool,
}

impl<M: FloatMath> Kernel<M> {
    fn new(h: &LambOptions, step: u64, clip: f64) -> Self {
        let t = step.min(i32::MAX as u64) as i32;
        let (bc1, bc2) = if h.bias_correction {
            (1.0 - h.beta1.powi(t), 1.0 - h.beta2.powi(t))
        } else {
            (1.0, 1.0)
        };
        let use_wd = h.weight_decay != 0.0;
        Kernel {
            lr: M::of(h.lr),
            beta1: M::of(h.beta1),
            beta2: M::of(h.beta2),
            beta3: M::of(if h.grad_averaging { 1.0 - h.beta1 } else { 1.0 }),
            one_minus_beta2: M::of(1.0 - h.beta2),
            bc1: M::of(bc1),
            bc2_sqrt: M::of(bc2.sqrt()),
            eps: M::of(h.eps),
            wd: M::of(h.weight_decay),
            neg_lr_wd: M::of(-h.lr * h.weight_decay),
            clip: M::of(clip),
            coupled: use_wd && !h.decoupled_decay,
            decoupled: use_wd && h.decoupled_decay,
        }
    }

    /// m ← β1m + β3ĝ ; v ← β2v + (1−β2)ĝ², with ĝ = g/c (timm's rounding).
    #[inline(always)]
    fn moments<T: FloatElement<Math = M>>(&self, g: T, m: &mut T, v: &mut T) {
        let g = g.to_math() / self.clip;
        *m = T::from_math(T::from_math(m.to_math() * self.beta1).to_math() + self.beta3 * g);
        *v = T::from_math(T::from_math(v.to_math() * self.beta2).to_math() + self.one_minus_beta2 * g * g);
    }

    /// θ, after the decoupled decay θ ← θ − γλθ when that is on.
    #[inline(always)]
    fn param<T: FloatElement<Math = M>>(&self, p: T) -> M {
        let x = p.to_math();
        if self.decoupled {
            T::from_math(x + self.neg_lr_wd * x).to_math()
        } else {
            x
        }
    }

    /// u = (m/bc1)/(√v/√bc2 + ε) (+ λθ when coupled).
    #[inline(always)]
    fn update<T: FloatElement<Math = M>>(&self, x: M, m: T, v: T) -> M {
        let denom = v.to_math().sqrt() / self.bc2_sqrt + self.eps;
        let u = (m.to_math() / self.bc1) / denom;
        if self.coupled {
            u + self.wd * x
        } else {
            u
        }
    }
}

#[cfg(test)]
#[path = "lamb_tests.rs"]
mod tests;
