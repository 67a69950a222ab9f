//! Step decay: [`StepLR`] and [`MultiStepLR`] (PyTorch's closed forms).

use tessera_tensor::{Error, Result};

use super::{Schedule, Scheduler};
use crate::Optimizer;

/// `torch.optim.lr_scheduler.StepLR`: lr = base·γ^⌊t/step_size⌋.
pub type StepLR = Scheduler<StepSchedule>;

/// `torch.optim.lr_scheduler.MultiStepLR`: lr = base·γ^(number of
/// milestones ≤ t); a milestone listed twice counts twice, as in PyTorch.
pub type MultiStepLR = Scheduler<MultiStepSchedule>;

/// [`StepLR`]'s settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepSchedule {
    step_size: u64,
    gamma: f64,
}

/// [`MultiStepLR`]'s settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MultiStepSchedule {
    milestones: Vec<u64>,
    gamma: f64,
}

impl Scheduler<StepSchedule> {
    /// Decays every group's current lr by `gamma` (PyTorch default 0.1)
    /// every `step_size` steps. Errors when `step_size` is 0.
    pub fn new(opt: &mut dyn Optimizer, step_size: u64, gamma: f64) -> Result<StepLR> {
        if step_size == 0 {
            return Err(Error::arg("StepLR", "step_size must be > 0"));
        }
        let bases = opt.lrs();
        Scheduler::start(StepSchedule { step_size, gamma }, opt, bases)
    }
}

impl Scheduler<MultiStepSchedule> {
    /// Decays every group's current lr by `gamma` (PyTorch default 0.1) at
    /// each of `milestones` (in any order).
    pub fn new(opt: &mut dyn Optimizer, milestones: &[u64], gamma: f64) -> Result<MultiStepLR> {
        let mut milestones = milestones.to_vec();
        milestones.sort_unstable();
        let bases = opt.lrs();
        Scheduler::start(MultiStepSchedule { milestones, gamma }, opt, bases)
    }
}

impl Schedule for StepSchedule {
    const NAME: &'static str = "StepLR";

    fn lr(&self, t: u64, base: f64) -> Result<f64> {
        Ok(base * self.gamma.powf((t / self.step_size) as f64))
    }
}

impl Schedule for MultiStepSchedule {
    const NAME: &'static str = "MultiStepLR";

    fn lr(&self, t: u64, base: f64) -> Result<f64> {
        let passed = self.milestones.partition_point(|&m| m <= t);
        Ok(base * self.gamma.powf(passed as f64))
    }
}
