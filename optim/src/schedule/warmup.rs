//! [`LinearWarmup`]: PyTorch's `LinearLR`, a linear ramp of the lr factor.

use tessera_tensor::{Error, Result};

use super::{Schedule, Scheduler};
use crate::Optimizer;

/// `torch.optim.lr_scheduler.LinearLR`: lr = base·(s + (e − s)·min(t, n)/n),
/// a linear warm-up from `start_factor`·base to `end_factor`·base over `n`
/// steps, constant after (PyTorch defaults s = 1/3, e = 1, n = 5).
pub type LinearWarmup = Scheduler<LinearSchedule>;

/// [`LinearWarmup`]'s settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LinearSchedule {
    start_factor: f64,
    end_factor: f64,
    total_iters: u64,
}

impl Scheduler<LinearSchedule> {
    /// A ramp of every group's current lr. Errors unless
    /// `0 < start_factor ≤ 1`, `0 ≤ end_factor ≤ 1` and `total_iters > 0`.
    pub fn new(
        opt: &mut dyn Optimizer,
        start_factor: f64,
        end_factor: f64,
        total_iters: u64,
    ) -> Result<LinearWarmup> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::arg(
                "LinearWarmup",
                format!("start_factor must be in (0, 1], got {start_factor}"),
            ));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::arg(
                "LinearWarmup",
                format!("end_factor must be in [0, 1], got {end_factor}"),
            ));
        }
        if total_iters == 0 {
            return Err(Error::arg("LinearWarmup", "total_iters must be > 0"));
        }
        let bases = opt.lrs();
        Scheduler::start(
            LinearSchedule {
                start_factor,
                end_factor,
                total_iters,
            },
            opt,
            bases,
        )
    }
}

impl Schedule for LinearSchedule {
    const NAME: &'static str = "LinearWarmup";

    fn lr(&self, t: u64, base: f64) -> Result<f64> {
        let frac = t.min(self.total_iters) as f64 / self.total_iters as f64;
        Ok(base * (self.start_factor + (self.end_factor - self.start_factor) * frac))
    }
}
