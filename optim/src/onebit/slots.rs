//! What the compressed optimizers share: parameter groups with their
//! per-parameter f32 state, the optional [`CompressedReducer`], gradient
//! checks, and the state-dict form of named buffers and scalars.

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{DType, Error, Result, StateDict, Tensor};

use super::{CompressedReducer, ErrorFeedback, WireStats};
use crate::hyper::hyper_struct;
use crate::{Hyper, ParamGroup};

hyper_struct! {
    /// The per-group hyperparameters of the compressed optimizers, with
    /// DeepSpeed's defaults (`onebit/{adam,lamb,zoadam}.py`).
    pub struct OnebitOptions {
        /// Learning rate γ.
        pub lr: f64 = 1e-3,
        /// β1, the momentum decay (what a one-cycle schedule cycles).
        pub beta1: f64 = 0.9,
        /// β2, the variance decay.
        pub beta2: f64 = 0.999,
        /// ε, added to √v (outside the square root).
        pub eps: f64 = 1e-8,
        /// λ: λθ is added to the update (not to the gradient).
        pub weight_decay: f64 = 0.0,
    }
    momentum: beta1
}

/// A group's hyperparameters as the f32 factors of the element math
/// (Python floats become f32 scalars in DeepSpeed's torch code).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Factors {
    pub b1: f32,
    pub w1: f32,
    pub b2: f32,
    pub w2: f32,
    pub eps: f32,
    pub wd: f32,
}

impl OnebitOptions {
    /// β1, 1 − β1, β2, 1 − β2, ε and λ in f32.
    pub(crate) fn factors(&self) -> Factors {
        Factors {
            b1: self.beta1 as f32,
            w1: (1.0 - self.beta1) as f32,
            b2: self.beta2 as f32,
            w2: (1.0 - self.beta2) as f32,
            eps: self.eps as f32,
            wd: self.weight_decay as f32,
        }
    }
}

/// The state of one parameter: named f32 buffers of its length (created
/// as zeros on first use), named scalars, and its error feedback.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slot {
    pub bufs: Vec<(&'static str, Vec<f32>)>,
    pub scalars: Vec<(&'static str, f64)>,
    pub errors: ErrorFeedback,
}

impl Slot {
    /// Buffer `name`, created as `numel` zeros when missing.
    pub fn buf(&mut self, name: &'static str, numel: usize) -> &mut Vec<f32> {
        let i = match self.bufs.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                self.bufs.push((name, vec![0.0; numel]));
                self.bufs.len() - 1
            }
        };
        &mut self.bufs[i].1
    }

    /// Buffers `names` (created as zeros when missing) and the error
    /// feedback, borrowed together.
    pub fn split<const K: usize>(
        &mut self,
        names: [&'static str; K],
        numel: usize,
    ) -> ([&mut [f32]; K], &mut ErrorFeedback) {
        for n in names {
            self.buf(n, numel);
        }
        let mut out: [Option<&mut [f32]>; K] = std::array::from_fn(|_| None);
        for (name, b) in self.bufs.iter_mut() {
            if let Some(i) = names.iter().position(|n| n == name) {
                out[i] = Some(b.as_mut_slice());
            }
        }
        (out.map(|o| o.expect("created above")), &mut self.errors)
    }

    /// Scalar `name`, or `default` when never set.
    pub fn scalar(&self, name: &str, default: f64) -> f64 {
        self.scalars
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(default, |&(_, v)| v)
    }

    /// Sets scalar `name`.
    pub fn set_scalar(&mut self, name: &'static str, value: f64) {
        match self.scalars.iter_mut().find(|(n, _)| *n == name) {
            Some(s) => s.1 = value,
            None => self.scalars.push((name, value)),
        }
    }
}

/// Parameter groups, their slots, the step count and the reducer.
pub(crate) struct Slots<'r> {
    pub name: &'static str,
    pub groups: Vec<ParamGroup<OnebitOptions>>,
    pub state: Vec<Vec<Slot>>,
    /// Optimizer steps taken (DeepSpeed keeps one per parameter; they are
    /// always equal there too).
    pub step: u64,
    pub reducer: Option<Box<dyn CompressedReducer + 'r>>,
    /// Exp-avg masks by parameter (set by the caller, never saved).
    pub masks: Vec<(Parameter, Vec<f32>)>,
    /// The ratio of [`mask_low_variance`] (`None`: DeepSpeed's behaviour,
    /// no automatic mask).
    pub variance_mask: Option<f64>,
}

impl<'r> Slots<'r> {
    /// Groups for optimizer `name`. Errors when a hyperparameter is out of
    /// its domain, a parameter is listed twice, or a parameter is not f32.
    pub fn new(name: &'static str, groups: Vec<ParamGroup<OnebitOptions>>) -> Result<Self> {
        let mut seen: Vec<&Parameter> = Vec::new();
        for g in &groups {
            validate(name, &g.hyper)?;
            for p in &g.params {
                if seen.iter().any(|q| q.same(p)) {
                    return Err(Error::arg(
                        name,
                        format!(
                            "a parameter of shape {:?} appears in more than one place",
                            p.shape()
                        ),
                    ));
                }
                if p.dtype() != DType::F32 {
                    return Err(Error::dtype(
                        name,
                        format!(
                            "parameters must be f32 (keep f32 master weights for mixed precision), got {} of shape {:?}",
                            p.dtype(),
                            p.shape()
                        ),
                    ));
                }
                seen.push(p);
            }
        }
        let state = groups
            .iter()
            .map(|g| vec![Slot::default(); g.params.len()])
            .collect();
        Ok(Slots {
            name,
            groups,
            state,
            step: 0,
            reducer: None,
            masks: Vec::new(),
            variance_mask: Some(DEFAULT_VARIANCE_MASK),
        })
    }

    /// The number of ranks momentum is averaged over (1 without a reducer).
    pub fn world_size(&self) -> usize {
        self.reducer.as_ref().map_or(1, |r| r.world_size())
    }

    /// Multiplies `param`'s exchanged buffers by `mask` from now on
    /// (DeepSpeed's `exp_avg_mask`). Errors when `param` is not optimized
    /// here or `mask`'s shape differs from it.
    pub fn set_exp_avg_mask(&mut self, param: &Parameter, mask: &Tensor) -> Result<()> {
        if !self.groups.iter().flat_map(|g| &g.params).any(|p| p.same(param)) {
            return Err(Error::arg(
                "set_exp_avg_mask",
                format!(
                    "the parameter of shape {:?} is not optimized by {}",
                    param.shape(),
                    self.name
                ),
            ));
        }
        if mask.shape() != param.shape().as_slice() {
            return Err(Error::shape(
                "set_exp_avg_mask",
                format!(
                    "mask of shape {:?} for a parameter of shape {:?}",
                    mask.shape(),
                    param.shape()
                ),
            ));
        }
        let values = mask.to_dtype(DType::F32)?.to_vec::<f32>()?;
        self.masks.retain(|(p, _)| !p.same(param));
        self.masks.push((param.clone(), values));
        Ok(())
    }

    /// Sets the ratio of the automatic low-variance mask (see
    /// [`mask_low_variance`]; `None` turns it off). Errors when the ratio
    /// is negative or not finite.
    pub fn set_variance_mask(&mut self, ratio: Option<f64>) -> Result<()> {
        if let Some(r) = ratio {
            if !(r.is_finite() && r >= 0.0) {
                return Err(Error::arg(
                    self.name,
                    format!("invalid variance mask ratio {r} (must be finite and >= 0)"),
                ));
            }
        }
        self.variance_mask = ratio;
        Ok(())
    }

    /// Takes the reducer's byte counters (zeros without one).
    pub fn take_wire_stats(&mut self) -> WireStats {
        self.reducer
            .as_mut()
            .map_or_else(WireStats::default, |r| r.take_wire_stats())
    }

    /// Checks every gradient in `grads` against its parameter (shape, f32)
    /// and the hyperparameters, before anything changes.
    pub fn check(&self, grads: &Gradients) -> Result<()> {
        for grp in &self.groups {
            validate(self.name, &grp.hyper)?;
            for p in &grp.params {
                let Some(g) = p.grad(grads) else { continue };
                if g.shape() != p.shape().as_slice() || g.dtype() != DType::F32 {
                    return Err(Error::shape(
                        "step",
                        format!(
                            "{}: gradient of shape {:?} ({}) for an f32 parameter of shape {:?}",
                            self.name,
                            g.shape(),
                            g.dtype(),
                            p.shape()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The state dict: kind, step, every group's hyperparameters and every
    /// parameter's buffers and scalars (`state.{k}.{name}`); never the
    /// error buffers, which are rank-local.
    pub fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        sd.set("kind", self.name);
        sd.set("step", self.step);
        sd.set("groups", self.groups.len());
        let mut k = 0usize;
        for (g, (grp, slots)) in self.groups.iter().zip(&self.state).enumerate() {
            sd.set(format!("group.{g}.params"), grp.params.len());
            for (name, v) in grp.hyper.fields() {
                sd.set(format!("group.{g}.{name}"), v);
            }
            for (p, slot) in grp.params.iter().zip(slots) {
                for (name, b) in &slot.bufs {
                    let t =
                        Tensor::from_vec(b.clone(), &p.shape()).expect("a buffer has its parameter's length");
                    sd.insert(format!("state.{k}.{name}"), t);
                }
                for (name, v) in &slot.scalars {
                    sd.set(format!("state.{k}.{name}"), *v);
                }
                k += 1;
            }
        }
        sd
    }

    /// Restores what [`Slots::state_dict`] saved: buffers among `buffers`,
    /// scalars among `scalars`; error buffers are zeroed. Returns the saved
    /// step. Errors, changing nothing, on a different kind, group layout,
    /// shape, or an unknown tensor.
    pub fn load_state_dict(
        &mut self,
        sd: &StateDict,
        buffers: &[&'static str],
        scalars: &[&'static str],
    ) -> Result<u64> {
        const OP: &str = "Optimizer::load_state_dict";
        sd.check_kind(OP, self.name)?;
        let n: usize = sd.get(OP, "groups")?;
        if n != self.groups.len() {
            return Err(Error::arg(
                OP,
                format!(
                    "the state dict has {n} parameter groups, {} has {}",
                    self.name,
                    self.groups.len()
                ),
            ));
        }
        let step: u64 = sd.get(OP, "step")?;
        let mut hypers = Vec::with_capacity(n);
        let mut states = Vec::with_capacity(n);
        let mut k = 0usize;
        for (g, grp) in self.groups.iter().enumerate() {
            let count: usize = sd.get(OP, &format!("group.{g}.params"))?;
            if count != grp.params.len() {
                return Err(Error::arg(
                    OP,
                    format!(
                        "group {g} has {count} parameters in the state dict but {} in the optimizer",
                        grp.params.len()
                    ),
                ));
            }
            let mut h = grp.hyper;
            for (name, _) in grp.hyper.fields() {
                h.set_field(name, sd.get(OP, &format!("group.{g}.{name}"))?)?;
            }
            validate(self.name, &h)?;
            hypers.push(h);
            let mut slots = Vec::with_capacity(count);
            for p in &grp.params {
                let mut slot = Slot::default();
                for &name in buffers {
                    if let Some(t) = sd.tensor(&format!("state.{k}.{name}")) {
                        let t = sd
                            .require_shape(OP, &format!("state.{k}.{name}"), &p.shape())
                            .map(|_| t)?;
                        slot.bufs.push((name, t.to_dtype(DType::F32)?.to_vec::<f32>()?));
                    }
                }
                for &name in scalars {
                    let key = format!("state.{k}.{name}");
                    if sd.metadata().contains_key(&key) {
                        slot.scalars.push((name, sd.get(OP, &key)?));
                    }
                }
                slots.push(slot);
                k += 1;
            }
            states.push(slots);
        }
        if let Some(extra) = sd.keys().find(|key| {
            key.strip_prefix("state.")
                .and_then(|r| r.split_once('.'))
                .is_none_or(|(i, name)| {
                    i.parse::<usize>().map_or(true, |i| i >= k) || !buffers.contains(&name)
                })
        }) {
            return Err(Error::arg(
                OP,
                format!("unexpected tensor {extra:?} in the state dict of {}", self.name),
            ));
        }
        for (grp, h) in self.groups.iter_mut().zip(hypers) {
            grp.hyper = h;
        }
        self.state = states;
        self.step = step;
        Ok(step)
    }
}

/// Errors when a hyperparameter is out of its domain.
fn validate(op: &'static str, h: &OnebitOptions) -> Result<()> {
    for (name, v) in [("lr", h.lr), ("eps", h.eps), ("weight_decay", h.weight_decay)] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(Error::arg(
                op,
                format!("invalid {name}: {v} (must be finite and >= 0)"),
            ));
        }
    }
    for (name, b) in [("beta1", h.beta1), ("beta2", h.beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::arg(op, format!("invalid {name}: {b} (must be in [0, 1))")));
        }
    }
    Ok(())
}

/// Multiplies `buf` by `param`'s mask among `masks`, if it has one.
pub(crate) fn apply_mask(masks: &[(Parameter, Vec<f32>)], param: &Parameter, buf: &mut [f32]) {
    if let Some((_, mask)) = masks.iter().find(|(q, _)| q.same(param)) {
        buf.iter_mut().zip(mask).for_each(|(b, &k)| *b *= k);
    }
}

/// The default ratio of the automatic low-variance mask of the compressed
/// optimizers: after a compressed exchange a coordinate's buffer is zeroed
/// when its variance is at most `0.01²` times its parameter's mean variance
/// (`√v ≤ 0.01·√mean(v)`; see [`crate::OnebitAdam::with_variance_mask`]).
pub const DEFAULT_VARIANCE_MASK: f64 = 1e-2;

/// The largest variance a coordinate of a parameter with variances `v` may
/// have and still be masked: `ratio²·mean(v)`, or `None` without a ratio.
pub(crate) fn variance_floor(v: &[f32], ratio: Option<f64>) -> Option<f64> {
    let ratio = ratio?;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64;
    Some(ratio * ratio * mean)
}

/// Zeroes the elements of the exchanged buffer `buf` whose variance in `v`
/// (same length) is at most [`variance_floor`]: the automatic exp-avg mask.
///
/// 1-bit compression cannot send 0: every element comes back as `±s`,
/// `s` about the root mean square of the parameter's buffer. Divided by a
/// variance that is (nearly) 0 — a weight of a ReLU unit that never fired
/// during the warm-up — that is a step of about `γ·s/ε`, which throws the
/// unit far away and makes training diverge a few steps later. Exact Adam
/// leaves such a coordinate where it is (its momentum is 0 with its
/// gradient), and so does the mask. The variance is the same on every rank
/// (it was built from averaged gradients), so is the mask, and the ranks'
/// parameters stay bitwise equal.
pub(crate) fn mask_low_variance(buf: &mut [f32], v: &[f32], ratio: Option<f64>) {
    if let Some(floor) = variance_floor(v, ratio) {
        for (b, &vi) in buf.iter_mut().zip(v) {
            if f64::from(vi) <= floor {
                *b = 0.0;
            }
        }
    }
}

/// The L2 norm of `x`, accumulated in f64.
pub(crate) fn norm(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt()
}

/// Implements the [`crate::Optimizer`] methods that only read the groups
/// (`name`, `num_groups`, `group_params`, `hyper`, `hyper_mut`) for a type
/// with a `slots: Slots` field.
macro_rules! group_accessors {
    () => {
        fn name(&self) -> &'static str {
            self.slots.name
        }
        fn num_groups(&self) -> usize {
            self.slots.groups.len()
        }
        fn group_params(&self, group: usize) -> &[tessera_autograd::Parameter] {
            self.slots.groups.get(group).map_or(&[], |g| &g.params)
        }
        fn hyper(&self, group: usize) -> Option<&dyn $crate::Hyper> {
            self.slots.groups.get(group).map(|g| &g.hyper as &dyn $crate::Hyper)
        }
        fn hyper_mut(&mut self, group: usize) -> Option<&mut dyn $crate::Hyper> {
            self.slots.groups.get_mut(group).map(|g| &mut g.hyper as &mut dyn $crate::Hyper)
        }
        fn with_params(
            &self,
            _groups: Vec<Vec<tessera_autograd::Parameter>>,
        ) -> tessera_tensor::Result<Box<dyn $crate::Optimizer>> {
            Err(tessera_tensor::Error::arg(
                "with_params",
                format!(
                    "{} exchanges whole momentum buffers between ranks and cannot be partitioned (ZeRO); use it with DDP",
                    self.slots.name
                ),
            ))
        }
    };
}

pub(crate) use group_accessors;
