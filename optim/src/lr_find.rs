//! The LR range test (fastai's `lr_find`): an exponential learning-rate
//! sweep over a few training steps, with the smoothed loss it gives and
//! fastai's suggestions, restoring the model and optimizer afterwards.

use tessera_autograd::Parameter;
use tessera_tensor::{Error, Result};

use crate::{Optimizer, StateDict};

/// fastai `lr_find`'s settings and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct LrFindOptions {
    /// The first learning rate.
    pub start_lr: f64,
    /// The learning rate the sweep would reach at step `num_it`.
    pub end_lr: f64,
    /// The number of steps (at least 6, as fastai forces).
    pub num_it: usize,
    /// Stop once the smoothed loss exceeds 4× the best one.
    pub stop_div: bool,
    /// The smoothing factor of the loss average.
    pub beta: f64,
}

impl Default for LrFindOptions {
    fn default() -> Self {
        LrFindOptions {
            start_lr: 1e-7,
            end_lr: 10.0,
            num_it: 100,
            stop_div: true,
            beta: 0.98,
        }
    }
}

/// What a sweep recorded, and fastai's suggestions read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct LrFindResult {
    /// The learning rate of each step taken.
    pub lrs: Vec<f64>,
    /// The smoothed loss after each step (what fastai plots).
    pub losses: Vec<f64>,
    /// The raw loss of each step.
    pub raw_losses: Vec<f64>,
    /// fastai `valley` (its default): the lr about two thirds down the
    /// longest run of decreasing losses.
    pub valley: Option<f64>,
    /// fastai `minimum`: a tenth of the lr at the lowest loss.
    pub minimum: Option<f64>,
    /// fastai `steep`: the lr where the loss falls fastest per log-lr.
    pub steep: Option<f64>,
}

impl LrFindResult {
    /// The suggested learning rate: `valley`, fastai's default. `None` when
    /// the sweep stopped too early to suggest anything.
    pub fn suggestion(&self) -> Option<f64> {
        self.valley
    }
}

/// A model and optimizer an LR range test can train and then put back.
pub trait LrFindTarget {
    /// Runs one training step at learning rate `lr` (forward, backward,
    /// optimizer step) and returns its loss.
    fn train_step(&mut self, lr: f64) -> Result<f64>;
    /// Saves everything a training step changes (parameters, buffers,
    /// optimizer state).
    fn snapshot(&mut self) -> Result<StateDict>;
    /// Puts back what [`LrFindTarget::snapshot`] saved.
    fn restore(&mut self, saved: StateDict) -> Result<()>;
}

/// Runs the LR range test on `target`: before step i (from 0) the lr is
/// `start·(end/start)^(i/num_it)`; the loss is smoothed as
/// `avg ← β·avg + (1−β)·loss`, `smooth = avg/(1−β^count)`; the sweep stops
/// after `num_it` steps or, with `stop_div`, once `smooth > 4·best` (that
/// step is recorded). The suggestions use the points left after dropping
/// the first `num_it/10` and the last 5, cut at the first NaN. `target` is
/// restored afterwards, also when a step fails. Errors when `start_lr` or
/// `end_lr` is not positive and finite, or as `target` does.
pub fn lr_find(target: &mut dyn LrFindTarget, opts: &LrFindOptions) -> Result<LrFindResult> {
    if !(opts.start_lr > 0.0 && opts.start_lr.is_finite() && opts.end_lr > 0.0 && opts.end_lr.is_finite()) {
        return Err(Error::arg(
            "lr_find",
            format!(
                "start_lr and end_lr must be positive and finite, got {} and {}",
                opts.start_lr, opts.end_lr
            ),
        ));
    }
    if !(0.0..1.0).contains(&opts.beta) {
        return Err(Error::arg(
            "lr_find",
            format!("beta must be in [0, 1), got {}", opts.beta),
        ));
    }
    let saved = target.snapshot()?;
    let swept = sweep(target, opts);
    target.restore(saved)?;
    let (lrs, losses, raw_losses) = swept?;
    let num_it = opts.num_it.max(6);
    let (l, s) = suggestion_window(&lrs, &losses, num_it);
    Ok(LrFindResult {
        valley: valley(l, s),
        minimum: minimum(l, s),
        steep: steep(l, s),
        lrs,
        losses,
        raw_losses,
    })
}

/// [`lr_find`] for parameters and an optimizer: `step` runs one training
/// step with `opt` (whose every group's lr the sweep has set) and returns
/// the loss. The parameters' values and the optimizer's state (its
/// learning rates included) are restored afterwards. Buffers outside
/// `params` (batch-norm statistics) are not: implement [`LrFindTarget`]
/// for those.
pub fn lr_find_with(
    params: &[Parameter],
    opt: &mut dyn Optimizer,
    opts: &LrFindOptions,
    step: impl FnMut(&mut dyn Optimizer) -> Result<f64>,
) -> Result<LrFindResult> {
    struct Target<'a, F> {
        params: &'a [Parameter],
        opt: &'a mut dyn Optimizer,
        step: F,
    }
    impl<F: FnMut(&mut dyn Optimizer) -> Result<f64>> LrFindTarget for Target<'_, F> {
        fn train_step(&mut self, lr: f64) -> Result<f64> {
            self.opt.set_lr(lr);
            (self.step)(&mut *self.opt)
        }
        fn snapshot(&mut self) -> Result<StateDict> {
            let mut sd = StateDict::new();
            for (i, p) in self.params.iter().enumerate() {
                sd.insert(format!("{i}"), p.tensor()?);
            }
            let mut out = StateDict::new();
            out.merge_prefixed("param", sd);
            out.merge_prefixed("optim", self.opt.state_dict());
            Ok(out)
        }
        fn restore(&mut self, saved: StateDict) -> Result<()> {
            let params = saved.prefixed("param");
            for (i, p) in self.params.iter().enumerate() {
                p.set(params.require("lr_find", &format!("{i}"))?.clone())?;
            }
            self.opt.load_state_dict(&saved.prefixed("optim"))
        }
    }
    lr_find(&mut Target { params, opt, step }, opts)
}

type Sweep = (Vec<f64>, Vec<f64>, Vec<f64>);

fn sweep(target: &mut dyn LrFindTarget, opts: &LrFindOptions) -> Result<Sweep> {
    let num_it = opts.num_it.max(6);
    let (mut lrs, mut losses, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    let (mut avg, mut best) = (0.0f64, f64::INFINITY);
    for i in 0..num_it {
        let lr = opts.start_lr * (opts.end_lr / opts.start_lr).powf(i as f64 / num_it as f64);
        let loss = target.train_step(lr)?;
        avg = opts.beta * avg + (1.0 - opts.beta) * loss;
        let smooth = avg / (1.0 - opts.beta.powi(i as i32 + 1));
        lrs.push(lr);
        losses.push(smooth);
        raw.push(loss);
        // fastai compares only (a NaN never stops it); a NaN average stays NaN, so stop.
        if opts.stop_div && (smooth > 4.0 * best || smooth.is_nan()) {
            break;
        }
        best = best.min(smooth);
    }
    Ok((lrs, losses, raw))
}

/// The points fastai suggests from: `[num_it/10 .. len−5]`, cut at the first NaN.
fn suggestion_window<'a>(lrs: &'a [f64], losses: &'a [f64], num_it: usize) -> (&'a [f64], &'a [f64]) {
    let lo = num_it / 10;
    let hi = losses.len().saturating_sub(5);
    if lo >= hi {
        return (&[], &[]);
    }
    let (l, s) = (&lrs[lo..hi], &losses[lo..hi]);
    let end = s.iter().position(|v| v.is_nan()).unwrap_or(s.len());
    (&l[..end], &s[..end])
}

/// fastai `valley`: the longest strictly decreasing subsequence (O(n²)),
/// then the point a third plus a sixth of the way along it.
fn valley(lrs: &[f64], losses: &[f64]) -> Option<f64> {
    let n = losses.len();
    if n == 0 {
        return None;
    }
    let mut lds = vec![1isize; n];
    let (mut max_start, mut max_end) = (0isize, 0usize);
    for i in 1..n {
        for j in 0..i {
            if losses[i] < losses[j] && lds[i] < lds[j] + 1 {
                lds[i] = lds[j] + 1;
            }
            if lds[max_end] < lds[i] {
                max_end = i;
                max_start = max_end as isize - lds[max_end];
            }
        }
    }
    let sections = (max_end as isize - max_start) as f64 / 3.0;
    let idx = max_start + sections as isize + (sections / 2.0) as isize;
    // fastai's start can be one before the list: Python then indexes from the end.
    let idx = if idx < 0 { idx + n as isize } else { idx };
    lrs.get(usize::try_from(idx).ok()?).copied()
}

/// fastai `minimum`: the lr at the lowest loss, divided by 10.
fn minimum(lrs: &[f64], losses: &[f64]) -> Option<f64> {
    let i = (0..losses.len()).min_by(|&a, &b| losses[a].total_cmp(&losses[b]))?;
    Some(lrs[i] / 10.0)
}

/// fastai `steep`: the lr at the most negative Δloss/Δlog(lr).
fn steep(lrs: &[f64], losses: &[f64]) -> Option<f64> {
    let slope = |i: usize| (losses[i + 1] - losses[i]) / (lrs[i + 1].ln() - lrs[i].ln());
    let i = (0..losses.len().checked_sub(1)?).min_by(|&a, &b| slope(a).total_cmp(&slope(b)))?;
    Some(lrs[i])
}

#[cfg(test)]
#[path = "lr_find_tests.rs"]
mod tests;
