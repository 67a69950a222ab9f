//! [`OneCycleLR`]: PyTorch's `OneCycleLR` (Smith's 1cycle policy), with
//! momentum (or Adam β1) cycling.

use tessera_tensor::{Error, Result};

use super::{Schedule, Scheduler};
use crate::Optimizer;

/// How a phase moves from its start value to its end value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Anneal {
    /// `end + (start − end)/2·(cos(πp) + 1)` (PyTorch's default).
    Cos,
    /// `start + (end − start)·p`.
    Linear,
}

/// `torch.optim.lr_scheduler.OneCycleLR`'s settings and defaults
/// (`max_lr` and `total_steps` have none).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OneCycleOptions {
    /// The peak lr: one value for every group, or one per group.
    pub max_lr: Vec<f64>,
    /// The number of steps in the cycle (epochs × steps per epoch).
    pub total_steps: u64,
    /// The fraction of the cycle spent increasing the lr.
    pub pct_start: f64,
    /// The shape of each phase.
    pub anneal: Anneal,
    /// Cycle the momentum (SGD momentum, Adam β1) inversely to the lr.
    pub cycle_momentum: bool,
    /// The momentum at the lr's peak.
    pub base_momentum: f64,
    /// The momentum at the start and end.
    pub max_momentum: f64,
    /// initial lr = max_lr / div_factor.
    pub div_factor: f64,
    /// min lr = initial lr / final_div_factor.
    pub final_div_factor: f64,
    /// Three phases (up, down to the initial lr, down to the min lr)
    /// instead of two (up, down to the min lr).
    pub three_phase: bool,
}

impl OneCycleOptions {
    /// PyTorch's defaults for a cycle peaking at `max_lr` over `total_steps`.
    pub fn new(max_lr: f64, total_steps: u64) -> OneCycleOptions {
        OneCycleOptions {
            max_lr: vec![max_lr],
            total_steps,
            pct_start: 0.3,
            anneal: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// The one-cycle policy (`torch.optim.lr_scheduler.OneCycleLR`), stepped
/// once per optimizer step. With T = `total_steps`, initial = max/div and
/// min = initial/final_div, the phases end at steps
///
/// ```text
/// two-phase:   pct·T − 1 : initial → max (momentum max → base) ;  T − 1 : max → min (momentum base → max)
/// three-phase: pct·T − 1 : initial → max ;  2·pct·T − 2 : max → initial ;  T − 1 : initial → min
/// ```
/// and step s lies in the first phase whose end is ≥ s (else the last), at
/// fraction (s − start)/(end − start). Stepping past T is an error.
pub type OneCycleLR = Scheduler<OneCycleSchedule>;

/// [`OneCycleLR`]'s settings with its phases resolved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OneCycleSchedule {
    opts: OneCycleOptions,
    phases: Vec<Phase>,
}

/// One phase: where it ends and which values it moves between, as
/// fractions of (initial, max, min) for the lr.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
struct Phase {
    end: f64,
    lr: (Level, Level),
    momentum: (f64, f64),
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
enum Level {
    Initial,
    Max,
    Min,
}

impl Scheduler<OneCycleSchedule> {
    /// A one-cycle schedule for `opt`; sets every group's lr to the
    /// initial lr and, when cycling, its momentum to `max_momentum`.
    /// Errors when `total_steps` is 0, `pct_start` is outside [0, 1], a
    /// phase would have no length, `max_lr` has neither one value nor one
    /// per group, or momentum cycling is on for an optimizer without a
    /// momentum (Adagrad).
    pub fn new(opt: &mut dyn Optimizer, opts: OneCycleOptions) -> Result<OneCycleLR> {
        const OP: &str = "OneCycleLR";
        if opts.total_steps == 0 {
            return Err(Error::arg(OP, "total_steps must be > 0"));
        }
        if !(0.0..=1.0).contains(&opts.pct_start) {
            return Err(Error::arg(
                OP,
                format!("pct_start must be in [0, 1], got {}", opts.pct_start),
            ));
        }
        let n = opt.num_groups();
        let bases = match opts.max_lr.len() {
            1 => vec![opts.max_lr[0]; n],
            k if k == n => opts.max_lr.clone(),
            k => {
                return Err(Error::arg(
                    OP,
                    format!("max_lr has {k} values for {n} parameter groups"),
                ))
            }
        };
        if opts.cycle_momentum && (0..n).any(|g| opt.hyper(g).is_some_and(|h| h.momentum().is_none())) {
            return Err(Error::arg(
                OP,
                format!(
                    "{} has no momentum or beta1 to cycle; set cycle_momentum to false",
                    opt.name()
                ),
            ));
        }
        let t = opts.total_steps as f64;
        let (lo, hi) = (opts.base_momentum, opts.max_momentum);
        let phases = if opts.three_phase {
            vec![
                Phase {
                    end: opts.pct_start * t - 1.0,
                    lr: (Level::Initial, Level::Max),
                    momentum: (hi, lo),
                },
                Phase {
                    end: 2.0 * opts.pct_start * t - 2.0,
                    lr: (Level::Max, Level::Initial),
                    momentum: (lo, hi),
                },
                Phase {
                    end: t - 1.0,
                    lr: (Level::Initial, Level::Min),
                    momentum: (hi, hi),
                },
            ]
        } else {
            vec![
                Phase {
                    end: opts.pct_start * t - 1.0,
                    lr: (Level::Initial, Level::Max),
                    momentum: (hi, lo),
                },
                Phase {
                    end: t - 1.0,
                    lr: (Level::Max, Level::Min),
                    momentum: (lo, hi),
                },
            ]
        };
        let mut start = 0.0;
        for p in &phases {
            // PyTorch divides by the phase length (a ZeroDivisionError there).
            if p.end <= start {
                return Err(Error::arg(
                    OP,
                    format!(
                        "a phase would end at step {} but starts at {start}: raise total_steps ({}) or pct_start ({})",
                        p.end, opts.total_steps, opts.pct_start
                    ),
                ));
            }
            start = p.end;
        }
        Scheduler::start(OneCycleSchedule { opts, phases }, opt, bases)
    }
}

impl OneCycleSchedule {
    /// The phase holding step `t` and the fraction of it done.
    fn locate(&self, t: u64) -> Result<(&Phase, f64)> {
        if t > self.opts.total_steps {
            return Err(Error::arg(
                "OneCycleLR",
                format!(
                    "tried to step {t} times; the schedule has total_steps = {}",
                    self.opts.total_steps
                ),
            ));
        }
        let s = t as f64;
        let mut start = 0.0;
        let last = self.phases.len() - 1;
        for (i, p) in self.phases.iter().enumerate() {
            if s <= p.end || i == last {
                return Ok((p, (s - start) / (p.end - start)));
            }
            start = p.end;
        }
        unreachable!("the last phase always matches")
    }

    fn anneal(&self, a: f64, b: f64, pct: f64) -> f64 {
        match self.opts.anneal {
            Anneal::Cos => b + (a - b) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0),
            Anneal::Linear => (b - a) * pct + a,
        }
    }
}

impl Schedule for OneCycleSchedule {
    const NAME: &'static str = "OneCycleLR";

    fn lr(&self, t: u64, max_lr: f64) -> Result<f64> {
        let (phase, pct) = self.locate(t)?;
        let initial = max_lr / self.opts.div_factor;
        let level = |l: Level| match l {
            Level::Initial => initial,
            Level::Max => max_lr,
            Level::Min => initial / self.opts.final_div_factor,
        };
        Ok(self.anneal(level(phase.lr.0), level(phase.lr.1), pct))
    }

    fn momentum(&self, t: u64) -> Option<f64> {
        if !self.opts.cycle_momentum {
            return None;
        }
        let (phase, pct) = self.locate(t).ok()?;
        Some(self.anneal(phase.momentum.0, phase.momentum.1, pct))
    }
}
