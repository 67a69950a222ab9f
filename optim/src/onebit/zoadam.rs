//! 0/1 Adam (Lu et al. 2022; DeepSpeed `onebit/zoadam.py`, spec §4.4).

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{Error, Result, StateDict, Tensor};

use super::slots::{apply_mask, group_accessors, mask_low_variance, Factors, OnebitOptions, Slots};
use super::{CompressedReducer, ErrorFeedback, WireStats};
use crate::{Optimizer, ParamGroup};

/// The optimizer-wide policies of [`ZeroOneAdam`], with DeepSpeed's
/// defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroOneAdamConfig {
    /// The last step that may update the variance (the paper's
    /// `max T_v`); local steps start after it (default 100000).
    pub var_freeze_step: u64,
    /// Variance updates between doublings of the variance interval (the
    /// paper's κ; default 16).
    pub var_update_scaler: u64,
    /// Local steps between doublings of the synchronisation interval
    /// (default 32678).
    pub local_step_scaler: u64,
    /// The largest synchronisation interval (the paper's H; default 16).
    pub local_step_clipper: u64,
}

impl Default for ZeroOneAdamConfig {
    fn default() -> Self {
        ZeroOneAdamConfig {
            var_freeze_step: 100_000,
            var_update_scaler: 16,
            local_step_scaler: 32_678,
            local_step_clipper: 16,
        }
    }
}

/// What a [`ZeroOneAdam`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroOneStep {
    /// Exact averaged gradients: momentum and variance updated.
    Variance,
    /// The gradients exchanged 1-bit compressed; momentum updated.
    Compressed,
    /// A local step on this rank's gradients, no communication.
    Local,
    /// A local step followed by the synchronisation of the accumulated
    /// updates (1-bit compressed); parameters and momentum are then the
    /// same on every rank.
    Sync,
}

/// The schedule state: when the variance is updated and when ranks
/// synchronise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Policy {
    var_interval: u64,
    var_counter: u64,
    local_step_interval: u64,
    local_step_counter: u64,
}

impl Policy {
    const START: Policy = Policy {
        var_interval: 1,
        var_counter: 0,
        local_step_interval: 1,
        local_step_counter: 0,
    };
    const KEYS: [&'static str; 4] = [
        "var_interval",
        "var_counter",
        "local_step_interval",
        "local_step_counter",
    ];

    fn values(&self) -> [u64; 4] {
        [
            self.var_interval,
            self.var_counter,
            self.local_step_interval,
            self.local_step_counter,
        ]
    }
}

/// 0/1 Adam: Adam without bias correction whose variance is updated on
/// exponentially sparser steps and then frozen, with the gradients of the
/// other steps exchanged 1-bit compressed, and after the freeze local
/// steps whose accumulated updates are synchronised 1-bit compressed on
/// exponentially sparser steps.
///
/// With `t` the 1-based step:
///
/// ```text
/// t ≤ var_freeze_step, t % var_interval == 0 (g averaged over the ranks):
///     m ← β1m + (1−β1)g ;  v ← β2v + (1−β2)g²
/// t ≤ var_freeze_step, otherwise (g local):
///     m ← β1m + (1−β1)·all_reduce₁(g)⊙mask
/// both:  θ ← θ − γ(m/(√v+ε) + λθ)
///        var_interval doubles after every var_update_scaler variance updates
/// t > var_freeze_step (g local, v frozen):
///     m ← β1m + (1−β1)g ;  Σγ += γ ;  θ ← θ − γ(m/(√v+ε) + λθ)
///     if t % local_step_interval == 0:   (θ₀: the parameters at the last sync)
///         u ← all_reduce₁((θ − θ₀)·(√v+ε))⊙mask ;  m ← −u/Σγ ;  θ, θ₀ ← θ₀ + u/(√v+ε) ;  Σγ ← 0
///     local_step_interval doubles every local_step_scaler steps, up to local_step_clipper
/// ```
///
/// [`Optimizer::wants_averaged_grads`] is true exactly before the variance
/// steps, so DDP's `backward_for` all-reduces only those. All ranks hold
/// the same parameters and momentum before the freeze and right after
/// every synchronisation; between synchronisations each rank's parameters
/// follow its own gradients. Each parameter has its own error feedback,
/// zeroed once at the freeze (it then compensates updates, not
/// gradients). Without a reducer (one process) the exchanges are skipped
/// and the compressed steps update the momentum with the local gradient
/// (DeepSpeed leaves the momentum unchanged there).
///
/// Coordinates whose gradient is 0 on the variance steps (a ReLU unit that
/// has not fired) keep `v ≈ 0`, but the 1-bit exchanges never send 0, so
/// their momentum becomes `±s` and they move by about `γ·s/ε`: the same
/// hazard as [`crate::OnebitAdam`]'s short warm-up, here from the first
/// compressed step (after `var_update_scaler` variance steps). DeepSpeed
/// leaves it to a user-supplied mask ([`ZeroOneAdam::set_exp_avg_mask`]);
/// here the automatic mask of [`crate::OnebitAdam`] also applies (on by
/// default, [`ZeroOneAdam::with_variance_mask`]), built from the variance
/// as it stands at each exchange, so a unit that starts firing on a later
/// variance step is unmasked from then on.
///
/// Differences from DeepSpeed, all deliberate: no first-call dry run (as
/// [`crate::OnebitAdam`]); the variance freezes after step
/// `var_freeze_step` of this count; DeepSpeed accumulates the local
/// updates in a buffer `u` and recovers θ₀ as `θ − u`, which differs from
/// θ₀ by rounding, differently on each rank, so its ranks drift apart;
/// here θ₀ is kept instead (the same memory) and `θ − θ₀` is exchanged,
/// so the ranks are bitwise equal after every synchronisation; and a
/// checkpoint keeps the schedule (intervals and counters), θ₀ and `Σγ`,
/// so a resumed run continues as the uninterrupted one would, where
/// DeepSpeed restarts both intervals at 1 and drops its accumulator. As in
/// DeepSpeed a load zeroes the error buffers and the freeze follows the
/// saved step.
pub struct ZeroOneAdam<'r> {
    slots: Slots<'r>,
    config: ZeroOneAdamConfig,
    policy: Policy,
    frozen: bool,
    last: Option<ZeroOneStep>,
}

const BUFFERS: &[&str] = &["exp_avg", "exp_avg_sq", "sync_params"];
const SCALARS: &[&str] = &["lrs"];

impl<'r> ZeroOneAdam<'r> {
    /// 0/1 Adam over one group of f32 `params`. Errors when a setting is
    /// out of its domain (a scaler or the clipper of 0), a parameter is
    /// listed twice or is not f32.
    pub fn new(params: Vec<Parameter>, hyper: OnebitOptions, config: ZeroOneAdamConfig) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::new(params, hyper)], config)
    }

    /// 0/1 Adam over parameter groups. Errors as [`ZeroOneAdam::new`].
    pub fn with_groups(groups: Vec<ParamGroup<OnebitOptions>>, config: ZeroOneAdamConfig) -> Result<Self> {
        if config.var_update_scaler == 0 || config.local_step_scaler == 0 || config.local_step_clipper == 0 {
            return Err(Error::arg(
                "ZeroOneAdam",
                format!("invalid configuration {config:?}: var_update_scaler, local_step_scaler and local_step_clipper must be at least 1"),
            ));
        }
        Ok(ZeroOneAdam {
            slots: Slots::new("ZeroOneAdam", groups)?,
            config,
            policy: Policy::START,
            frozen: false,
            last: None,
        })
    }

    /// Exchanges gradients and updates through `reducer` (every
    /// data-parallel rank builds its optimizer with a reducer of one group).
    pub fn with_reducer(mut self, reducer: impl CompressedReducer + 'r) -> Self {
        self.slots.reducer = Some(Box::new(reducer));
        self
    }

    /// Multiplies `param`'s exchanged gradient (before the freeze) and
    /// synchronised update (after it) by `mask` (DeepSpeed's
    /// `exp_avg_mask`: 1-bit compression cannot encode 0). Errors when
    /// `param` is not optimized here or `mask`'s shape differs from it.
    pub fn set_exp_avg_mask(&mut self, param: &Parameter, mask: &Tensor) -> Result<()> {
        self.slots.set_exp_avg_mask(param, mask)
    }

    /// Sets the automatic exp-avg mask, as [`crate::OnebitAdam::with_variance_mask`]
    /// (on by default): the compressed gradient (before the freeze) and
    /// the synchronised update (after it) are zeroed where the variance,
    /// as it stands, is at most `ratio²` times its parameter's mean.
    /// Errors when the ratio is negative or not finite.
    pub fn with_variance_mask(mut self, ratio: Option<f64>) -> Result<Self> {
        self.slots.set_variance_mask(ratio)?;
        Ok(self)
    }

    /// True once the variance is frozen (the local-step stage).
    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.slots.step
    }

    /// What the last step did (`None` before the first).
    pub fn last_step(&self) -> Option<ZeroOneStep> {
        self.last
    }

    /// The current variance interval and synchronisation interval.
    pub fn intervals(&self) -> (u64, u64) {
        (self.policy.var_interval, self.policy.local_step_interval)
    }

    /// The error feedback of parameter `index` of group `group` (empty
    /// before its first compressed exchange and after a checkpoint load).
    pub fn error_feedback(&self, group: usize, index: usize) -> Option<&ErrorFeedback> {
        Some(&self.slots.state.get(group)?.get(index)?.errors)
    }

    /// The buffer `name` (`exp_avg`, `exp_avg_sq`, `sync_params`: the
    /// parameters at the last synchronisation) of parameter `index` of
    /// group `group`, once created.
    pub fn state_buffer(&self, group: usize, index: usize, name: &str) -> Option<&[f32]> {
        let slot = self.slots.state.get(group)?.get(index)?;
        slot.bufs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| b.as_slice())
    }

    /// The bytes this rank sent since the last call (zeros on one process;
    /// the variance steps' exact all-reduces are DDP's).
    pub fn take_wire_stats(&mut self) -> WireStats {
        self.slots.take_wire_stats()
    }

    /// The kind of step `t` (1-based) is under the current policy.
    fn kind_of(&self, t: u64) -> ZeroOneStep {
        if !self.frozen {
            if t.is_multiple_of(self.policy.var_interval) {
                ZeroOneStep::Variance
            } else {
                ZeroOneStep::Compressed
            }
        } else if t.is_multiple_of(self.policy.local_step_interval) {
            ZeroOneStep::Sync
        } else {
            ZeroOneStep::Local
        }
    }

    /// Advances the schedule after step `t` of kind `kind`.
    fn advance(&mut self, t: u64, kind: ZeroOneStep) {
        let (cfg, p) = (self.config, &mut self.policy);
        if self.frozen {
            p.local_step_counter += 1;
            if p.local_step_counter == cfg.local_step_scaler {
                p.local_step_counter = 0;
                p.local_step_interval = cfg
                    .local_step_clipper
                    .min(p.local_step_interval.saturating_mul(2));
            }
            return;
        }
        if kind == ZeroOneStep::Variance {
            p.var_counter += 1;
            if p.var_counter == cfg.var_update_scaler {
                p.var_counter = 0;
                p.var_interval = p.var_interval.saturating_mul(2);
            }
        }
        if t >= cfg.var_freeze_step {
            self.frozen = true;
            // From now on the errors compensate accumulated updates, not
            // gradients: they restart from zero (DeepSpeed does the same).
            for slot in self.slots.state.iter_mut().flatten() {
                slot.errors.reset();
            }
        }
    }
}

impl Optimizer for ZeroOneAdam<'_> {
    group_accessors!();

    fn wants_averaged_grads(&self) -> bool {
        self.kind_of(self.slots.step + 1) == ZeroOneStep::Variance
    }

    fn step(&mut self, grads: &Gradients) -> Result<()> {
        self.slots.check(grads)?;
        let t = self.slots.step + 1;
        let kind = self.kind_of(t);
        let compress = self.slots.world_size() > 1;
        let Slots {
            groups,
            state,
            reducer,
            masks,
            variance_mask,
            ..
        } = &mut self.slots;
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
            let lr = h.lr as f32;
            for (p, slot) in grp.params.iter().zip(state[gi].iter_mut()) {
                let Some(g) = p.grad(grads) else { continue };
                let g = g.contiguous()?;
                let mut g = g.as_slice::<f32>()?.to_vec();
                let numel = g.len();
                let local = matches!(kind, ZeroOneStep::Local | ZeroOneStep::Sync);
                let lrs = slot.scalar("lrs", 0.0) + if local { h.lr } else { 0.0 };
                if local && !slot.bufs.iter().any(|(n, _)| *n == "sync_params") {
                    // The first local step: the parameters are the same on
                    // every rank here.
                    slot.bufs
                        .push(("sync_params", p.tensor()?.contiguous()?.to_vec::<f32>()?));
                }
                let ([m, v], errors) = slot.split(["exp_avg", "exp_avg_sq"], numel);
                if kind == ZeroOneStep::Variance {
                    for (vi, &gi) in v.iter_mut().zip(&g) {
                        *vi = *vi * b2 + w2 * gi * gi;
                    }
                } else if kind == ZeroOneStep::Compressed && compress {
                    let r = reducer.as_mut().expect("compress implies a reducer");
                    r.compressed_all_reduce(&mut g, errors)?;
                    mask_low_variance(&mut g, v, *variance_mask);
                    apply_mask(masks, p, &mut g);
                }
                for (mi, &gi) in m.iter_mut().zip(&g) {
                    *mi = *mi * b1 + w1 * gi;
                }
                let (mr, vr) = (&*m, &*v);
                p.update_::<f32, _>(|x| {
                    for i in 0..x.len() {
                        let mut d = mr[i] / (vr[i].sqrt() + eps);
                        if wd > 0.0 {
                            d += wd * x[i];
                        }
                        x[i] -= lr * d;
                    }
                })?;
                if kind == ZeroOneStep::Sync {
                    let ([m, v, base], errors) = slot.split(["exp_avg", "exp_avg_sq", "sync_params"], numel);
                    // The local updates since the last sync, scaled by the
                    // frozen denominator so that what is exchanged is
                    // momentum-like, averaged compressed and applied to the
                    // parameters of the last sync instead.
                    let x = p.tensor()?.contiguous()?.to_vec::<f32>()?;
                    let mut u: Vec<f32> = (0..numel)
                        .map(|i| (x[i] - base[i]) * (v[i].sqrt() + eps))
                        .collect();
                    if compress {
                        let r = reducer.as_mut().expect("compress implies a reducer");
                        r.compressed_all_reduce(&mut u, errors)?;
                        mask_low_variance(&mut u, v, *variance_mask);
                        apply_mask(masks, p, &mut u);
                    }
                    let lrs = lrs as f32;
                    for i in 0..numel {
                        m[i] = -u[i] / lrs;
                        base[i] += u[i] / (v[i].sqrt() + eps);
                    }
                    p.update_::<f32, _>(|x| x.copy_from_slice(base))?;
                }
                if local {
                    slot.set_scalar("lrs", if kind == ZeroOneStep::Sync { 0.0 } else { lrs });
                }
            }
        }
        self.slots.step = t;
        self.last = Some(kind);
        self.advance(t, kind);
        Ok(())
    }

    fn state_dict(&self) -> StateDict {
        let mut sd = self.slots.state_dict();
        sd.set("var_freeze_step", self.config.var_freeze_step);
        for (key, v) in Policy::KEYS.iter().zip(self.policy.values()) {
            sd.set(*key, v);
        }
        sd
    }

    /// Restores buffers, `Σγ` and the schedule; zeroes the error buffers;
    /// the freeze follows the saved step against this optimizer's
    /// `var_freeze_step`. Errors, changing nothing, on another optimizer's
    /// state or other shapes.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "Optimizer::load_state_dict";
        let mut values = [0u64; 4];
        for (v, key) in values.iter_mut().zip(Policy::KEYS) {
            *v = sd.get(OP, key)?;
        }
        let [var_interval, var_counter, local_step_interval, local_step_counter] = values;
        if var_interval == 0 || local_step_interval == 0 {
            return Err(Error::arg(
                OP,
                format!(
                    "ZeroOneAdam: intervals must be at least 1, got {var_interval} and {local_step_interval}"
                ),
            ));
        }
        let step = self.slots.load_state_dict(sd, BUFFERS, SCALARS)?;
        self.policy = Policy {
            var_interval,
            var_counter,
            local_step_interval,
            local_step_counter,
        };
        self.frozen = step >= self.config.var_freeze_step;
        self.last = None;
        Ok(())
    }
}
