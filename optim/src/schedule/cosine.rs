//! [`CosineLR`]: timm's `CosineLRScheduler`, cosine decay with linear
//! warm-up, warm restarts and per-cycle decay.

use tessera_tensor::{Error, Result};

use super::{Schedule, Scheduler};
use crate::Optimizer;

/// timm `CosineLRScheduler`'s settings and defaults (`t_initial` has no
/// default: it is the cycle length in steps).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CosineOptions {
    /// Length of the first cycle, in steps.
    pub t_initial: u64,
    /// The lr at the end of each cycle.
    pub lr_min: f64,
    /// Warm-up steps (linear from `warmup_lr_init` to the base lr).
    pub warmup_t: u64,
    /// The lr warm-up starts from.
    pub warmup_lr_init: f64,
    /// Start the cosine after the warm-up (else warm-up eats into it).
    pub warmup_prefix: bool,
    /// Each cycle is this many times longer than the previous one.
    pub cycle_mul: f64,
    /// Each cycle's peak lr is this many times the previous one's.
    pub cycle_decay: f64,
    /// Cycles run before the lr stays at `lr_min`.
    pub cycle_limit: u64,
    /// The cosine runs on t^k / T^k.
    pub k_decay: f64,
}

impl CosineOptions {
    /// timm's defaults with a first cycle of `t_initial` steps.
    pub fn new(t_initial: u64) -> CosineOptions {
        CosineOptions {
            t_initial,
            lr_min: 0.0,
            warmup_t: 0,
            warmup_lr_init: 0.0,
            warmup_prefix: false,
            cycle_mul: 1.0,
            cycle_decay: 1.0,
            cycle_limit: 1,
            k_decay: 1.0,
        }
    }
}

/// Cosine decay with linear warm-up (timm `CosineLRScheduler`, stepped per
/// update):
///
/// ```text
/// t < warmup_t:  lr = warmup_lr_init + t·(base − warmup_lr_init)/warmup_t
/// else (t ← t − warmup_t if warmup_prefix): cycle i, position t_cur of length T_i,
///     lr = lr_min + ½(base·decayⁱ − lr_min)(1 + cos(π t_cur^k / T_i^k)) ;  lr_min after cycle_limit cycles
/// ```
pub type CosineLR = Scheduler<CosineOptions>;

impl Scheduler<CosineOptions> {
    /// A cosine schedule over every group's current lr. Errors unless
    /// `t_initial > 0`, `lr_min ≥ 0`, `cycle_mul > 0` and `cycle_limit > 0`.
    pub fn new(opt: &mut dyn Optimizer, opts: CosineOptions) -> Result<CosineLR> {
        if opts.t_initial == 0 {
            return Err(Error::arg("CosineLR", "t_initial must be > 0"));
        }
        if opts.lr_min.is_nan() || opts.lr_min < 0.0 {
            return Err(Error::arg(
                "CosineLR",
                format!("lr_min must be ≥ 0, got {}", opts.lr_min),
            ));
        }
        if opts.cycle_mul.is_nan() || opts.cycle_mul <= 0.0 || opts.cycle_limit == 0 {
            return Err(Error::arg(
                "CosineLR",
                format!(
                    "cycle_mul must be > 0 and cycle_limit > 0, got {} and {}",
                    opts.cycle_mul, opts.cycle_limit
                ),
            ));
        }
        let bases = opt.lrs();
        Scheduler::start(opts, opt, bases)
    }
}

impl Schedule for CosineOptions {
    const NAME: &'static str = "CosineLR";

    fn lr(&self, t: u64, base: f64) -> Result<f64> {
        if t < self.warmup_t {
            let step = (base - self.warmup_lr_init) / self.warmup_t as f64;
            return Ok(self.warmup_lr_init + t as f64 * step);
        }
        let t = if self.warmup_prefix { t - self.warmup_t } else { t } as f64;
        let t0 = self.t_initial as f64;
        let (i, t_i, t_cur) = if self.cycle_mul != 1.0 {
            let m = self.cycle_mul;
            let arg = 1.0 - t / t0 * (1.0 - m);
            if arg <= 0.0 {
                // Shrinking cycles (m < 1) all end before t.
                return Ok(self.lr_min);
            }
            let i = (arg.ln() / m.ln()).floor();
            let t_i = m.powf(i) * t0;
            (i, t_i, t - (1.0 - m.powf(i)) / (1.0 - m) * t0)
        } else {
            let i = (t / t0).floor();
            (i, t0, t - t0 * i)
        };
        if i >= self.cycle_limit as f64 {
            return Ok(self.lr_min);
        }
        let peak = base * self.cycle_decay.powf(i);
        let k = self.k_decay;
        let cos = (std::f64::consts::PI * t_cur.powf(k) / t_i.powf(k)).cos();
        Ok(self.lr_min + 0.5 * (peak - self.lr_min) * (1.0 + cos))
    }
}
