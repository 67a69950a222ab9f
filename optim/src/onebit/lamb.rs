//! 1-bit LAMB (Li et al. 2021; DeepSpeed `onebit/lamb.py`, spec §4.3).

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{Error, Result, StateDict, Tensor};

use super::slots::{
    apply_mask, group_accessors, mask_low_variance, norm, variance_floor, Factors, OnebitOptions, Slots,
};
use super::{CompressedReducer, ErrorFeedback, WireStats};
use crate::{Optimizer, ParamGroup};

/// The optimizer-wide settings of [`OnebitLamb`], with DeepSpeed's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnebitLambConfig {
    /// Warm-up steps of exact LAMB before compression (default 100000).
    pub freeze_step: u64,
    /// Upper bound of the warm-up trust ratio (default 10).
    pub max_coeff: f64,
    /// Lower bound of the warm-up trust ratio (default 0.01).
    pub min_coeff: f64,
    /// Decay of the running trust ratio frozen at the end of the warm-up
    /// (default 0.9).
    pub coeff_beta: f64,
    /// Upper bound of the compression-stage factor (default 4).
    pub factor_max: f64,
    /// Lower bound of the compression-stage factor (default 0.5).
    pub factor_min: f64,
    /// The most the factor may change from one step to the next, relative
    /// (default 0.1).
    pub factor_threshold: f64,
}

impl Default for OnebitLambConfig {
    fn default() -> Self {
        OnebitLambConfig {
            freeze_step: 100_000,
            max_coeff: 10.0,
            min_coeff: 0.01,
            coeff_beta: 0.9,
            factor_max: 4.0,
            factor_min: 0.5,
            factor_threshold: 0.1,
        }
    }
}

/// 1-bit LAMB: exact LAMB without bias correction during the warm-up,
/// keeping a running average of each layer's trust ratio; then that ratio
/// is frozen, the momenta of all parameters are scaled to one magnitude,
/// fused into one buffer and exchanged compressed, and a fresh variance
/// rebuilt from the reconstructed gradients adjusts the frozen ratio by a
/// bounded factor:
///
/// ```text
/// warm-up:  u = m/(√v+ε) + λθ ;  c = clamp(‖θ‖/‖u‖, min_coeff, max_coeff) (1 if a norm is 0)
///           c ≠ 1 ⇒ c̄ ← coeff_beta·c̄ + (1−coeff_beta)·c ;  θ ← θ − γcu
/// compress: m ← all_reduce₁(s·(β1m + (1−β1)g))/s      (s: per-layer scaling, fixed once)
///           ĝ = (m − β1m_last)/(1−β1) ;  v_f ← β2v_f + (1−β2)ĝ²
///           f = max((√v+ε)/(√v_f+ε)), mixed with 1 by ‖u_pre‖/‖u‖ under decay,
///           clamped to [factor_min, factor_max] and to ±threshold of the last f
///           θ ← θ − γ·c̄·f·u
/// ```
///
/// In the compression stage every parameter needs a gradient (the fused
/// buffer must have the same layout on every rank). A checkpoint load
/// zeroes the error buffers; in the compression stage it keeps each
/// layer's frozen ratio, last factor and scaling, in the warm-up it resets
/// them (DeepSpeed's rules). DeepSpeed's first-call dry run is not
/// reproduced.
pub struct OnebitLamb<'r> {
    slots: Slots<'r>,
    config: OnebitLambConfig,
    frozen: bool,
    errors: ErrorFeedback,
    last_coeffs: Vec<f64>,
}

const BUFFERS: &[&str] = &["exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"];
const SCALARS: &[&str] = &["lamb_coeff_freeze", "last_factor", "scaling_coeff"];

impl<'r> OnebitLamb<'r> {
    /// 1-bit LAMB over one group of f32 `params`. Errors when a setting is
    /// out of its domain, a parameter is listed twice or is not f32.
    pub fn new(params: Vec<Parameter>, hyper: OnebitOptions, config: OnebitLambConfig) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::new(params, hyper)], config)
    }

    /// 1-bit LAMB over parameter groups. Errors as [`OnebitLamb::new`].
    pub fn with_groups(groups: Vec<ParamGroup<OnebitOptions>>, config: OnebitLambConfig) -> Result<Self> {
        let c = &config;
        let ok = 0.0 < c.min_coeff
            && c.min_coeff <= c.max_coeff
            && (0.0..1.0).contains(&c.coeff_beta)
            && 0.0 < c.factor_min
            && c.factor_min <= c.factor_max
            && (0.0..1.0).contains(&c.factor_threshold)
            && c.max_coeff.is_finite()
            && c.factor_max.is_finite();
        if !ok {
            return Err(Error::arg(
                "OnebitLamb",
                format!("invalid configuration {config:?}: need 0 < min_coeff <= max_coeff, 0 < factor_min <= factor_max (finite), coeff_beta and factor_threshold in [0, 1)"),
            ));
        }
        Ok(OnebitLamb {
            slots: Slots::new("OnebitLamb", groups)?,
            config,
            frozen: false,
            errors: ErrorFeedback::default(),
            last_coeffs: Vec::new(),
        })
    }

    /// Exchanges the fused momentum through `reducer` after the warm-up.
    pub fn with_reducer(mut self, reducer: impl CompressedReducer + 'r) -> Self {
        self.slots.reducer = Some(Box::new(reducer));
        self
    }

    /// Multiplies `param`'s momentum by `mask` after every compressed
    /// exchange (DeepSpeed's `exp_avg_mask`: 1-bit compression cannot
    /// encode 0). Errors when `param` is not optimized here or `mask`'s
    /// shape differs from it.
    pub fn set_exp_avg_mask(&mut self, param: &Parameter, mask: &Tensor) -> Result<()> {
        self.slots.set_exp_avg_mask(param, mask)
    }

    /// Sets the automatic exp-avg mask, as [`crate::OnebitAdam::with_variance_mask`]
    /// (on by default): after each compressed exchange the momentum of a
    /// coordinate whose frozen variance is at most `ratio²` times its
    /// parameter's mean is zeroed, and the coordinate is left out of the
    /// factor's maximum (its fresh variance only decays, which would drive
    /// the factor up). Errors when the ratio is negative or not finite.
    pub fn with_variance_mask(mut self, ratio: Option<f64>) -> Result<Self> {
        self.slots.set_variance_mask(ratio)?;
        Ok(self)
    }

    /// True once the trust ratios are frozen (the compression stage).
    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.slots.step
    }

    /// The effective trust ratio each parameter got in the last step, in
    /// group order (DeepSpeed's `get_lamb_coeffs`).
    pub fn lamb_coeffs(&self) -> &[f64] {
        &self.last_coeffs
    }

    /// Scalar state `name` (`lamb_coeff_freeze`, `last_factor`,
    /// `scaling_coeff`) of parameter `index` of group `group`, once set.
    pub fn state_scalar(&self, group: usize, index: usize, name: &str) -> Option<f64> {
        let slot = self.slots.state.get(group)?.get(index)?;
        slot.scalars.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    /// The error feedback of the fused momentum buffer (empty before the
    /// first compressed exchange and after a checkpoint load).
    pub fn error_feedback(&self) -> &ErrorFeedback {
        &self.errors
    }

    /// The bytes this rank sent since the last call (zeros on one process).
    pub fn take_wire_stats(&mut self) -> WireStats {
        self.slots.take_wire_stats()
    }

    fn warmup_step(&mut self, grads: &Gradients) -> Result<()> {
        let cfg = self.config;
        let step = self.slots.step + 1;
        let Slots { groups, state, .. } = &mut self.slots;
        for (gi, grp) in groups.iter().enumerate() {
            let h = grp.hyper;
            let Factors {
                b1,
                w1,
                b2,
                w2,
                eps,
                wd,
            } = h.factors();
            for (p, slot) in grp.params.iter().zip(state[gi].iter_mut()) {
                let Some(g) = p.grad(grads) else { continue };
                let g = g.contiguous()?;
                let g = g.as_slice::<f32>()?;
                let ([m, v, fresh], _) = slot.split(["exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"], g.len());
                for i in 0..g.len() {
                    m[i] = m[i] * b1 + w1 * g[i];
                    v[i] = v[i] * b2 + w2 * g[i] * g[i];
                }
                if step == cfg.freeze_step {
                    fresh.copy_from_slice(v);
                }
                let (m, v) = (&*m, &*v);
                let weight = p.tensor()?.to_vec::<f32>()?;
                let u: Vec<f32> = (0..g.len())
                    .map(|i| {
                        let u = m[i] / (v[i].sqrt() + eps);
                        if wd > 0.0 {
                            u + wd * weight[i]
                        } else {
                            u
                        }
                    })
                    .collect();
                let (wn, un) = (norm(&weight), norm(&u));
                let coeff = if wn != 0.0 && un != 0.0 {
                    (wn / un).clamp(cfg.min_coeff, cfg.max_coeff)
                } else {
                    1.0
                };
                if coeff != 1.0 {
                    let avg = slot.scalar("lamb_coeff_freeze", 0.0);
                    slot.set_scalar(
                        "lamb_coeff_freeze",
                        cfg.coeff_beta * avg + (1.0 - cfg.coeff_beta) * coeff,
                    );
                }
                self.last_coeffs.push(coeff);
                let scale = (-h.lr * coeff) as f32;
                p.update_::<f32, _>(|x| x.iter_mut().zip(&u).for_each(|(x, &u)| *x += scale * u))?;
            }
        }
        Ok(())
    }

    fn compressed_step(&mut self, grads: &Gradients) -> Result<()> {
        let cfg = self.config;
        let n = self.slots.world_size();
        let Slots {
            groups,
            state,
            reducer,
            name,
            masks,
            variance_mask,
            ..
        } = &mut self.slots;
        // DeepSpeed fixes each layer's momentum scaling once, at the first
        // compressed step, so that one scale suits the fused buffer.
        if state
            .iter()
            .flatten()
            .any(|s| s.scalars.iter().all(|(n, _)| *n != "scaling_coeff"))
        {
            let mut scales = Vec::new();
            for (grp, slots) in groups.iter().zip(state.iter_mut()) {
                for (p, slot) in grp.params.iter().zip(slots.iter_mut()) {
                    let m = slot.buf("exp_avg", p.numel());
                    scales.push(norm(m) / (m.len().max(1) as f64).sqrt());
                }
            }
            let united = scales.iter().sum::<f64>() / scales.len().max(1) as f64;
            for (slot, s) in state.iter_mut().flatten().zip(scales) {
                slot.set_scalar("scaling_coeff", if s > 0.0 { united / s } else { 1.0 });
            }
        }
        let mut flat = Vec::new();
        let mut lasts = Vec::new();
        for (grp, slots) in groups.iter().zip(state.iter_mut()) {
            let Factors { b1, w1, .. } = grp.hyper.factors();
            for (p, slot) in grp.params.iter().zip(slots.iter_mut()) {
                let g = p.grad(grads).ok_or_else(|| {
                    Error::arg(
                        "step",
                        format!("{name}: in the compression stage every parameter needs a gradient; the one of shape {:?} has none", p.shape()),
                    )
                })?;
                let g = g.contiguous()?;
                let s = slot.scalar("scaling_coeff", 1.0) as f32;
                let m = slot.buf("exp_avg", g.numel());
                lasts.push(m.clone());
                flat.extend(
                    m.iter()
                        .zip(g.as_slice::<f32>()?)
                        .map(|(&m, &g)| (m * b1 + w1 * g) * s),
                );
            }
        }
        if n > 1 {
            let r = reducer.as_mut().expect("world size > 1 implies a reducer");
            r.compressed_all_reduce(&mut flat, &mut self.errors)?;
        }
        let mut offset = 0;
        let mut k = 0;
        for (grp, slots) in groups.iter().zip(state.iter_mut()) {
            let h = grp.hyper;
            let Factors {
                b1,
                w1,
                b2,
                w2,
                eps,
                wd,
            } = h.factors();
            for (p, slot) in grp.params.iter().zip(slots.iter_mut()) {
                let numel = p.numel();
                let s = slot.scalar("scaling_coeff", 1.0) as f32;
                let ([m, v, fresh], _) = slot.split(["exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"], numel);
                let last = &lasts[k];
                for i in 0..numel {
                    m[i] = flat[offset + i] / s;
                }
                let floor = if n > 1 {
                    mask_low_variance(m, v, *variance_mask);
                    variance_floor(v, *variance_mask)
                } else {
                    None
                };
                apply_mask(masks, p, m);
                for i in 0..numel {
                    let rec = (m[i] - last[i] * b1) / w1;
                    fresh[i] = fresh[i] * b2 + w2 * rec * rec;
                }
                let weight = p.tensor()?.to_vec::<f32>()?;
                let mut factor = f64::NEG_INFINITY;
                let mut pre = Vec::with_capacity(numel);
                let mut u = Vec::with_capacity(numel);
                for i in 0..numel {
                    let denom = v[i].sqrt() + eps;
                    if floor.is_none_or(|f| f64::from(v[i]) > f) {
                        factor = factor.max(f64::from(denom / (fresh[i].sqrt() + eps)));
                    }
                    let up = m[i] / denom;
                    pre.push(up);
                    u.push(if wd > 0.0 { up + wd * weight[i] } else { up });
                }
                if wd > 0.0 {
                    let un = norm(&u);
                    let ratio = if un > 0.0 { (norm(&pre) / un).min(1.0) } else { 1.0 };
                    factor = factor * ratio + (1.0 - ratio);
                }
                let last_factor = slot.scalar("last_factor", 1.0);
                let factor = factor.clamp(cfg.factor_min, cfg.factor_max).clamp(
                    last_factor * (1.0 - cfg.factor_threshold),
                    last_factor * (1.0 + cfg.factor_threshold),
                );
                slot.set_scalar("last_factor", factor);
                let coeff = slot.scalar("lamb_coeff_freeze", 0.0) * factor;
                self.last_coeffs.push(coeff);
                let scale = (-h.lr * coeff) as f32;
                p.update_::<f32, _>(|x| x.iter_mut().zip(&u).for_each(|(x, &u)| *x += scale * u))?;
                offset += numel;
                k += 1;
            }
        }
        Ok(())
    }
}

impl Optimizer for OnebitLamb<'_> {
    group_accessors!();

    fn wants_averaged_grads(&self) -> bool {
        !self.frozen
    }

    fn step(&mut self, grads: &Gradients) -> Result<()> {
        self.slots.check(grads)?;
        self.last_coeffs.clear();
        if self.frozen {
            self.compressed_step(grads)?;
        } else {
            self.warmup_step(grads)?;
        }
        self.slots.step += 1;
        if !self.frozen && self.slots.step >= self.config.freeze_step {
            self.frozen = true;
        }
        Ok(())
    }

    fn state_dict(&self) -> StateDict {
        let mut sd = self.slots.state_dict();
        sd.set("freeze_step", self.config.freeze_step);
        sd
    }

    /// DeepSpeed's reload rules: the error buffers are zeroed and the
    /// freeze follows the saved step; in the warm-up each layer's frozen
    /// ratio restarts at 0, its last factor at 1, and its momentum scaling
    /// is dropped, while in the compression stage all three are kept.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let step = self.slots.load_state_dict(sd, BUFFERS, SCALARS)?;
        self.errors.reset();
        self.frozen = step >= self.config.freeze_step;
        if !self.frozen {
            for slot in self.slots.state.iter_mut().flatten() {
                slot.scalars.clear();
            }
        }
        Ok(())
    }
}
