//! [`GradScaler`]: dynamic loss scaling for f16 training, with PyTorch's
//! `torch.amp.GradScaler` defaults and update rule.

use tessera_autograd::{Gradients, Var};
use tessera_tensor::{with_float_dtype, DType, Device, Error, FloatElement, FloatMath, Result, Tensor};

use crate::{Optimizer, StateDict};

/// `torch.amp.GradScaler`'s settings and defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerOptions {
    /// The first scale S.
    pub init_scale: f64,
    /// S is multiplied by this after `growth_interval` clean steps (> 1).
    pub growth_factor: f64,
    /// S is multiplied by this after a step with an inf/NaN gradient (< 1).
    pub backoff_factor: f64,
    /// Clean steps before S grows.
    pub growth_interval: u32,
    /// When false the scaler does nothing (scale 1, every step taken).
    pub enabled: bool,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        GradScalerOptions {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// Where the scaler is within an iteration (PyTorch's per-optimizer state).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Ready,
    Unscaled { found_inf: bool },
    Stepped { found_inf: bool },
}

/// Dynamic loss scaling (`torch.amp.GradScaler`): backward runs on
/// `loss · S` so small f16 gradients do not flush to zero; the gradients
/// are divided by S before the step, and a step whose gradients hold an
/// inf or NaN is skipped. [`GradScaler::update`] then halves S after an
/// overflow, or doubles it after `growth_interval` clean steps in a row.
///
/// The iteration is `backward → (unscale_ → clip) → step → update`, as in
/// PyTorch. S is an f32, as PyTorch keeps it; a grown S that is not finite
/// is never adopted. One scaler drives one optimizer.
#[derive(Debug, Clone)]
pub struct GradScaler {
    opts: GradScalerOptions,
    scale: f32,
    growth_tracker: u32,
    stage: Stage,
}

impl GradScaler {
    /// A scaler with `opts`. Errors unless `growth_factor > 1`,
    /// `0 < backoff_factor < 1`, `growth_interval > 0` and `init_scale` is
    /// positive and finite as an f32.
    pub fn new(opts: GradScalerOptions) -> Result<GradScaler> {
        const OP: &str = "GradScaler::new";
        if opts.growth_factor.is_nan() || opts.growth_factor <= 1.0 {
            return Err(Error::arg(
                OP,
                format!("growth_factor must be > 1, got {}", opts.growth_factor),
            ));
        }
        if !(opts.backoff_factor > 0.0 && opts.backoff_factor < 1.0) {
            return Err(Error::arg(
                OP,
                format!("backoff_factor must be in (0, 1), got {}", opts.backoff_factor),
            ));
        }
        if opts.growth_interval == 0 {
            return Err(Error::arg(OP, "growth_interval must be > 0"));
        }
        let scale = opts.init_scale as f32;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::arg(
                OP,
                format!("init_scale must be positive and finite, got {}", opts.init_scale),
            ));
        }
        Ok(GradScaler {
            opts,
            scale,
            growth_tracker: 0,
            stage: Stage::Ready,
        })
    }

    /// The current scale S (1 when disabled).
    pub fn scale(&self) -> f64 {
        if self.opts.enabled {
            self.scale as f64
        } else {
            1.0
        }
    }

    /// Clean steps counted towards the next growth.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// The settings.
    pub fn options(&self) -> &GradScalerOptions {
        &self.opts
    }

    /// Backpropagates `loss · S` from a one-element `loss` (PyTorch's
    /// `scaler.scale(loss).backward()`). Errors as [`Var::backward`].
    pub fn backward(&self, loss: &Var) -> Result<Gradients> {
        if loss.numel() != 1 {
            return Err(Error::shape(
                "GradScaler::backward",
                format!("the loss must have one element, got shape {:?}", loss.shape()),
            ));
        }
        // The seed lives where the loss does (a GPU loss needs a GPU seed).
        let seed = Tensor::scalar(self.scale())
            .to_dtype(loss.dtype())?
            .to_device(loss.tensor().device())?;
        loss.backward_with(&seed.reshape(loss.shape())?)
    }

    /// Divides every gradient by S in place and records whether any element
    /// was inf or NaN (returned). Errors when called twice in one iteration
    /// (before [`GradScaler::update`]) or after the step.
    pub fn unscale_(&mut self, grads: &mut Gradients) -> Result<bool> {
        self.unscale_across(grads, &mut Ok)
    }

    /// [`GradScaler::unscale_`] for gradients sharded over ranks (ZeRO):
    /// `combine` turns this rank's inf/NaN flag into the flag of all ranks
    /// (an all-reduce of it), so that every rank records, returns and acts
    /// on the same verdict. Errors as `unscale_`, or as `combine`.
    pub fn unscale_across(
        &mut self,
        grads: &mut Gradients,
        combine: &mut dyn FnMut(bool) -> Result<bool>,
    ) -> Result<bool> {
        const OP: &str = "GradScaler::unscale_";
        if !self.opts.enabled {
            return Ok(false);
        }
        match self.stage {
            Stage::Unscaled { .. } => {
                return Err(Error::arg(
                    OP,
                    "unscale_() has already been called since the last update()",
                ))
            }
            Stage::Stepped { .. } => return Err(Error::arg(OP, "unscale_() is being called after step()")),
            Stage::Ready => {}
        }
        let inv = (1.0 / self.scale as f64) as f32;
        let mut found_inf = false;
        // Device gradients add their flags up on the device: one read back
        // for all of them, not a synchronisation per tensor.
        let mut device_flags: Option<Tensor> = None;
        for (_, g) in grads.iter_mut() {
            if g.device().is_cpu() {
                found_inf |= unscale_tensor(g, inv)?;
            } else {
                let flag = unscale_on_device(g, inv)?;
                device_flags = Some(match device_flags {
                    Some(sum) => sum.add(&flag)?,
                    None => flag,
                });
            }
        }
        if let Some(sum) = device_flags {
            found_inf |= sum.to_device(Device::Cpu)?.to_scalar::<f32>()? > 0.0;
        }
        let found_inf = combine(found_inf)?;
        self.stage = Stage::Unscaled { found_inf };
        Ok(found_inf)
    }

    /// Unscales (if [`GradScaler::unscale_`] was not called) and steps
    /// `opt` unless a gradient held an inf or NaN. Returns whether the step
    /// was taken. Errors when called twice before [`GradScaler::update`], or
    /// as the optimizer's step.
    pub fn step(&mut self, opt: &mut dyn Optimizer, grads: &mut Gradients) -> Result<bool> {
        if !self.opts.enabled {
            opt.step(grads)?;
            return Ok(true);
        }
        let found_inf = match self.stage {
            Stage::Stepped { .. } => {
                return Err(Error::arg(
                    "GradScaler::step",
                    "step() has already been called since the last update()",
                ))
            }
            Stage::Ready => self.unscale_(grads)?,
            Stage::Unscaled { found_inf } => found_inf,
        };
        if !found_inf {
            opt.step(grads)?;
        }
        self.stage = Stage::Stepped { found_inf };
        Ok(!found_inf)
    }

    /// Adjusts S for the next iteration (`torch._amp_update_scale_`): after
    /// an inf/NaN, S ← S·backoff and the tracker resets; otherwise the
    /// tracker counts up and at `growth_interval` S ← S·growth (only if that
    /// is finite) and the tracker resets. Errors when no unscale or step
    /// happened since the last update.
    pub fn update(&mut self) -> Result<()> {
        if !self.opts.enabled {
            return Ok(());
        }
        let found_inf = match self.stage {
            Stage::Ready => {
                return Err(Error::arg(
                    "GradScaler::update",
                    "no inf checks were recorded prior to update()",
                ))
            }
            Stage::Unscaled { found_inf } | Stage::Stepped { found_inf } => found_inf,
        };
        if found_inf {
            self.scale *= self.opts.backoff_factor as f32;
            self.growth_tracker = 0;
        } else {
            let k = self.growth_tracker + 1;
            if k == self.opts.growth_interval {
                let grown = self.scale * self.opts.growth_factor as f32;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            } else {
                self.growth_tracker = k;
            }
        }
        self.stage = Stage::Ready;
        Ok(())
    }

    /// The scaler's state: PyTorch's keys `scale`, `growth_factor`,
    /// `backoff_factor`, `growth_interval`, `_growth_tracker` (metadata).
    pub fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        sd.set("kind", "GradScaler");
        sd.set("scale", self.scale);
        sd.set("growth_factor", self.opts.growth_factor);
        sd.set("backoff_factor", self.opts.backoff_factor);
        sd.set("growth_interval", self.opts.growth_interval);
        sd.set("_growth_tracker", self.growth_tracker);
        sd
    }

    /// Restores [`GradScaler::state_dict`]. Errors, changing nothing, when
    /// an entry is missing or invalid.
    pub fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "GradScaler::load_state_dict";
        sd.check_kind(OP, "GradScaler")?;
        let opts = GradScalerOptions {
            init_scale: sd.get::<f32>(OP, "scale")? as f64,
            growth_factor: sd.get(OP, "growth_factor")?,
            backoff_factor: sd.get(OP, "backoff_factor")?,
            growth_interval: sd.get(OP, "growth_interval")?,
            enabled: self.opts.enabled,
        };
        let mut fresh = GradScaler::new(opts)?;
        fresh.growth_tracker = sd.get(OP, "_growth_tracker")?;
        *self = fresh;
        Ok(())
    }
}

/// Multiplies `g` by `inv` in place; true when an element was not finite
/// (PyTorch's `_amp_foreach_non_finite_check_and_unscale_`).
fn unscale_tensor(g: &mut Tensor, inv: f32) -> Result<bool> {
    let dtype = g.dtype();
    with_float_dtype!(dtype, T => {
        let inv = <T as FloatElement>::Math::of(inv as f64);
        let mut found = false;
        for x in g.make_mut::<T>()? {
            let v = x.to_math();
            found |= !v.f64().is_finite();
            *x = T::from_math(v * inv);
        }
        Ok(found)
    }, else Err(Error::dtype("GradScaler::unscale_", format!("gradients must be floating point, got {dtype}"))))
}

/// [`unscale_tensor`] for a gradient on a GPU, in the device's own ops:
/// `g ← g·inv`, and a 0-d f32 tensor on the device that is 1 when an
/// element of `g` was not finite (`x − x` is 0 exactly for finite `x`,
/// NaN for ±inf and NaN), else 0.
fn unscale_on_device(g: &mut Tensor, inv: f32) -> Result<Tensor> {
    let dtype = g.dtype();
    if !dtype.is_float() {
        return Err(Error::dtype(
            "GradScaler::unscale_",
            format!("gradients must be floating point, got {dtype}"),
        ));
    }
    let dims: Vec<isize> = (0..g.ndim() as isize).collect();
    let flag = g
        .sub(g)?
        .ne_scalar(0.0)?
        .any(&dims, false)?
        .to_dtype(DType::F32)?;
    *g = g.mul_scalar(f64::from(inv))?;
    Ok(flag)
}

#[cfg(test)]
#[path = "scaler_tests.rs"]
mod tests;
