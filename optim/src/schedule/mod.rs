//! Learning-rate schedules: the [`LrScheduler`] trait, the generic
//! [`Scheduler`] driving any closed-form [`Schedule`], and the schedules
//! themselves.

mod cosine;
mod onecycle;
mod step;
mod warmup;

pub use cosine::{CosineLR, CosineOptions};
pub use onecycle::{Anneal, OneCycleLR, OneCycleOptions, OneCycleSchedule};
pub use step::{MultiStepLR, MultiStepSchedule, StepLR, StepSchedule};
pub use warmup::{LinearSchedule, LinearWarmup};

use tessera_tensor::{Error, Result};

use crate::{Optimizer, StateDict};

/// A learning-rate schedule driving an optimizer: call [`LrScheduler::step`]
/// once per optimizer step (or per epoch, for epoch-based schedules).
/// Construction sets the step-0 values, as PyTorch's schedulers do.
pub trait LrScheduler: Send {
    /// Advances one step and writes the new learning rate (and momentum,
    /// for schedules that cycle it) into every group of `opt`. Errors when
    /// `opt` has a different number of groups than at construction, or
    /// past the end of a schedule with a fixed length (one-cycle); nothing
    /// changes then.
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()>;

    /// The learning rates the last step (or construction) set, per group
    /// (PyTorch's `get_last_lr`).
    fn get_lr(&self) -> &[f64];

    /// How many steps have been taken (PyTorch's `last_epoch`).
    fn last_epoch(&self) -> u64;

    /// The schedule's state: its step count, base learning rates and
    /// settings.
    fn state_dict(&self) -> StateDict;

    /// Restores [`LrScheduler::state_dict`] into a scheduler built with the
    /// same settings (the optimizer's learning rates come back with the
    /// optimizer's own state dict). Errors, changing nothing, when the
    /// settings or the number of groups differ.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()>;
}

/// A closed-form schedule: the learning rate at step `t` of a group whose
/// base value is `base` (the optimizer's initial lr, or one-cycle's max lr).
pub trait Schedule: Send + std::fmt::Debug + serde::Serialize {
    /// The schedule's name, as saved in state dicts.
    const NAME: &'static str;

    /// The learning rate at step `t`. Errors past a fixed schedule's end.
    fn lr(&self, t: u64, base: f64) -> Result<f64>;

    /// The momentum (or Adam β1) at step `t`, for schedules that cycle it.
    fn momentum(&self, _t: u64) -> Option<f64> {
        None
    }
}

/// Drives a [`Schedule`]: holds the step count and per-group base values
/// and writes each step's values into the optimizer. [`StepLR`],
/// [`OneCycleLR`], ... are this type with their schedules.
#[derive(Debug, Clone)]
pub struct Scheduler<S> {
    schedule: S,
    base_lrs: Vec<f64>,
    last_epoch: u64,
    last_lrs: Vec<f64>,
}

impl<S: Schedule> Scheduler<S> {
    /// The schedule's settings as JSON, saved so that a state dict is only
    /// loaded into a scheduler configured the same way. The settings are
    /// plain numbers, lists and enums, which serde always represents (a
    /// non-finite float becomes `null`), so the fallback is never taken.
    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(&self.schedule).unwrap_or_default()
    }

    /// A scheduler for `opt` whose groups' base values are `base_lrs`,
    /// already applied at step 0.
    pub(crate) fn start(schedule: S, opt: &mut dyn Optimizer, base_lrs: Vec<f64>) -> Result<Self> {
        let mut s = Scheduler {
            schedule,
            base_lrs,
            last_epoch: 0,
            last_lrs: Vec::new(),
        };
        s.apply(opt, 0)?;
        Ok(s)
    }

    /// The schedule and its settings.
    pub fn schedule(&self) -> &S {
        &self.schedule
    }

    /// The base value of each group.
    pub fn base_lrs(&self) -> &[f64] {
        &self.base_lrs
    }

    /// The learning rate of each group at step `t`, without stepping.
    pub fn lrs_at(&self, t: u64) -> Result<Vec<f64>> {
        self.base_lrs.iter().map(|&b| self.schedule.lr(t, b)).collect()
    }

    fn apply(&mut self, opt: &mut dyn Optimizer, t: u64) -> Result<()> {
        if opt.num_groups() != self.base_lrs.len() {
            return Err(Error::arg(
                "LrScheduler::step",
                format!(
                    "{}: the optimizer has {} parameter groups, the schedule {}",
                    S::NAME,
                    opt.num_groups(),
                    self.base_lrs.len()
                ),
            ));
        }
        let lrs = self.lrs_at(t)?;
        let momentum = self.schedule.momentum(t);
        if let Some(m) = momentum {
            for g in 0..lrs.len() {
                let h = opt.hyper(g).expect("group count checked");
                if h.momentum().is_none() {
                    return Err(no_momentum(S::NAME, opt.name()));
                }
            }
            for g in 0..lrs.len() {
                opt.hyper_mut(g).expect("group count checked").set_momentum(m)?;
            }
        }
        for (g, &lr) in lrs.iter().enumerate() {
            opt.hyper_mut(g).expect("group count checked").set_lr(lr);
        }
        self.last_epoch = t;
        self.last_lrs = lrs;
        Ok(())
    }
}

impl<S: Schedule> LrScheduler for Scheduler<S> {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.apply(opt, self.last_epoch + 1)
    }

    fn get_lr(&self) -> &[f64] {
        &self.last_lrs
    }

    fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        sd.set("kind", S::NAME);
        sd.set("settings", self.settings());
        sd.set("last_epoch", self.last_epoch);
        sd.set("base_lrs", self.base_lrs.clone());
        sd
    }

    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "LrScheduler::load_state_dict";
        sd.check_kind(OP, S::NAME)?;
        let settings = self.settings();
        let saved = sd.meta(OP, "settings")?;
        if *saved != settings {
            return Err(Error::arg(
                OP,
                format!("the state dict was saved with settings {saved}, this scheduler has {settings}"),
            ));
        }
        let bases: Vec<f64> = sd.get(OP, "base_lrs")?;
        if bases.len() != self.base_lrs.len() {
            return Err(Error::arg(
                OP,
                format!(
                    "the state dict has {} groups, the scheduler {}",
                    bases.len(),
                    self.base_lrs.len()
                ),
            ));
        }
        let last_epoch: u64 = sd.get(OP, "last_epoch")?;
        let lrs = bases
            .iter()
            .map(|&b| self.schedule.lr(last_epoch, b))
            .collect::<Result<Vec<_>>>()?;
        self.base_lrs = bases;
        self.last_epoch = last_epoch;
        self.last_lrs = lrs;
        Ok(())
    }
}

fn no_momentum(schedule: &str, opt: &str) -> Error {
    Error::arg(
        "LrScheduler",
        format!("{schedule} cycles the momentum but {opt} has none; set cycle_momentum to false"),
    )
}

#[cfg(test)]
mod tests;
