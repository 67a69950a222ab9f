//! [`GroupOptimizer`]: the parameter-group machinery every optimizer here
//! shares (gradient lookup and checks, lazily created state buffers, step
//! counts, state dicts), around a [`Rule`] that says how one parameter's
//! flat buffer is updated.

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{with_float_dtype, Error, FloatElement, Result, Tensor};

use crate::kernel::Bufs;
use crate::master;
use crate::{Hyper, Optimizer, ParamGroup, StateDict};

#[path = "device_step.rs"]
mod device_step;
#[cfg(feature = "cuda")]
#[path = "fused_cuda.rs"]
pub(crate) mod fused_cuda;
pub use device_step::DeviceStep;

/// How one optimizer updates a parameter: its hyperparameters, its state
/// buffers, and a fused kernel over flat buffers. Implement it (and use
/// [`GroupOptimizer`]) to add an optimizer.
pub trait Rule: Send + Sync + Clone + 'static {
    /// The per-group hyperparameters (the optimizer's options struct).
    type Hyper: Hyper + Clone + 'static;

    /// The optimizer's name, as saved in state dicts.
    const NAME: &'static str;

    /// Every state buffer name the rule may use.
    const BUFFERS: &'static [&'static str];

    /// Errors when a hyperparameter is out of its domain.
    fn validate(h: &Self::Hyper) -> Result<()>;

    /// The buffers (a subset of [`Rule::BUFFERS`], at most three) a step
    /// with `h` uses, in the order [`Rule::update`] receives them.
    fn buffers(h: &Self::Hyper) -> &'static [&'static str];

    /// The value a new buffer is filled with (0 unless the rule says).
    fn init_value(_h: &Self::Hyper, _buffer: &str) -> f64 {
        0.0
    }

    /// Runs once per step before any parameter is updated (LAMB computes
    /// its global gradient norm here).
    fn prepare(&mut self, _groups: &[ParamGroup<Self::Hyper>], _grads: &Gradients) -> Result<()> {
        Ok(())
    }

    /// Updates one parameter `p` from its gradient `g` and its buffers `b`
    /// (named as [`Rule::buffers`] says; unused ones empty), all flat and of
    /// one length.
    fn update<T: FloatElement>(&self, h: &Self::Hyper, ctx: StepCtx, p: &mut [T], g: &[T], b: Bufs<'_, T>);

    /// The fused GPU kernel a step with `h` is, for parameters on a GPU
    /// (feature `cuda`); `None` (the default) when the rule has none, and
    /// stepping such parameters is an error naming the optimizer.
    fn device_step(&self, _h: &Self::Hyper) -> Option<DeviceStep> {
        None
    }

    /// Saves optimizer-wide settings (not per group) into `sd`.
    fn save_config(&self, _sd: &mut StateDict) {}

    /// Restores what [`Rule::save_config`] saved. Errors, changing nothing,
    /// when an entry is missing or malformed.
    fn load_config(&mut self, _sd: &StateDict) -> Result<()> {
        Ok(())
    }
}

/// Where a parameter is in its optimization.
#[derive(Debug, Clone, Copy)]
pub struct StepCtx {
    /// The step being taken, from 1 (PyTorch's per-parameter `step`).
    pub step: u64,
    /// True when this step created the parameter's buffers (SGD then
    /// starts its momentum buffer from the gradient).
    pub fresh: bool,
}

/// An optimizer made of parameter groups and a [`Rule`]. [`crate::Sgd`],
/// [`crate::Adam`], ... are this type with their rules.
pub struct GroupOptimizer<R: Rule> {
    rule: R,
    groups: Vec<ParamGroup<R::Hyper>>,
    state: Vec<Vec<ParamState>>,
}

#[derive(Default, Clone)]
struct ParamState {
    step: u64,
    bufs: Vec<(&'static str, Tensor)>,
    /// The f32 master copy of an f16/bf16 parameter ([`crate::master`]),
    /// made at its first step.
    master: Option<Tensor>,
}

impl<R: Rule + Default> GroupOptimizer<R> {
    /// An optimizer over one group of `params` with `hyper`. Errors when a
    /// hyperparameter is invalid or a parameter is listed twice.
    pub fn new(params: Vec<Parameter>, hyper: R::Hyper) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// An optimizer over `groups`. Errors as [`GroupOptimizer::new`].
    pub fn with_groups(groups: Vec<ParamGroup<R::Hyper>>) -> Result<Self> {
        Self::from_rule(R::default(), groups)
    }
}

impl<R: Rule> GroupOptimizer<R> {
    /// An optimizer over `groups` with a configured `rule`. Errors as
    /// [`GroupOptimizer::new`].
    pub fn from_rule(rule: R, groups: Vec<ParamGroup<R::Hyper>>) -> Result<Self> {
        let mut opt = GroupOptimizer {
            rule,
            groups: Vec::new(),
            state: Vec::new(),
        };
        for g in groups {
            opt.add_param_group(g)?;
        }
        Ok(opt)
    }

    /// Adds a parameter group (PyTorch's `add_param_group`). Errors when its
    /// hyperparameters are invalid or one of its parameters is already in a
    /// group.
    pub fn add_param_group(&mut self, group: ParamGroup<R::Hyper>) -> Result<()> {
        R::validate(&group.hyper)?;
        for (i, p) in group.params.iter().enumerate() {
            let seen = group.params[..i]
                .iter()
                .chain(self.groups.iter().flat_map(|g| &g.params));
            if seen.into_iter().any(|q| q.same(p)) {
                return Err(Error::arg(
                    "add_param_group",
                    format!(
                        "{}: a parameter of shape {:?} appears in more than one place",
                        R::NAME,
                        p.shape()
                    ),
                ));
            }
        }
        self.state.push(vec![ParamState::default(); group.params.len()]);
        self.groups.push(group);
        Ok(())
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup<R::Hyper>] {
        &self.groups
    }

    /// The typed hyperparameters of group `group`, mutable.
    pub fn group_hyper_mut(&mut self, group: usize) -> Option<&mut R::Hyper> {
        self.groups.get_mut(group).map(|g| &mut g.hyper)
    }

    /// The rule (its optimizer-wide settings).
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// The rule, mutable.
    pub fn rule_mut(&mut self) -> &mut R {
        &mut self.rule
    }

    /// How many steps parameter `index` of group `group` has taken.
    pub fn param_step(&self, group: usize, index: usize) -> Option<u64> {
        self.state.get(group)?.get(index).map(|s| s.step)
    }

    /// The f32 master copy of parameter `index` of group `group`: present
    /// for f16/bf16 parameters once they have been stepped, `None`
    /// otherwise (an f32 or f64 parameter is its own master).
    pub fn master_weight(&self, group: usize, index: usize) -> Option<&Tensor> {
        self.state.get(group)?.get(index)?.master.as_ref()
    }

    /// The state buffer `name` of parameter `index` of group `group`.
    pub fn state_buffer(&self, group: usize, index: usize, name: &str) -> Option<&Tensor> {
        let st = self.state.get(group)?.get(index)?;
        st.bufs.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    fn check_grads(&self, grads: &Gradients) -> Result<()> {
        for grp in &self.groups {
            R::validate(&grp.hyper)?;
            for p in &grp.params {
                let Some(g) = p.grad(grads) else { continue };
                if !p.dtype().is_float() {
                    return Err(Error::dtype(
                        "step",
                        format!(
                            "{}: parameters must be floating point, got {}",
                            R::NAME,
                            p.dtype()
                        ),
                    ));
                }
                if g.shape() != p.shape().as_slice() || g.dtype() != p.dtype() {
                    return Err(Error::shape(
                        "step",
                        format!(
                            "{}: gradient of shape {:?} ({}) for a parameter of shape {:?} ({})",
                            R::NAME,
                            g.shape(),
                            g.dtype(),
                            p.shape(),
                            p.dtype()
                        ),
                    ));
                }
                p.tensor()?.device().same_as(g.device(), "step")?;
            }
        }
        Ok(())
    }
}

impl ParamState {
    /// Creates the buffers in `names` the state lacks, in
    /// [`master::state_dtype`] of the parameter; true if any was made.
    fn ensure<H>(
        &mut self,
        names: &[&'static str],
        h: &H,
        p: &Parameter,
        init: impl Fn(&H, &str) -> f64,
    ) -> Result<bool> {
        let mut fresh = false;
        for &name in names {
            if !self.bufs.iter().any(|(n, _)| *n == name) {
                let dtype = master::state_dtype(p.dtype());
                self.bufs
                    .push((name, p.tensor()?.full_like(init(h, name), dtype)?));
                fresh = true;
            }
        }
        Ok(fresh)
    }

    /// Steps a f16/bf16 parameter `p` through its f32 master copy (made
    /// from `p` at the first step): the rule updates the master with `g`
    /// cast to f32 and the f32 buffers, then `p` becomes the master rounded.
    fn step_through_master<R: Rule>(
        &mut self,
        rule: &R,
        h: &R::Hyper,
        ctx: StepCtx,
        p: &Parameter,
        g: &Tensor,
    ) -> Result<()> {
        let g = g.to_dtype(tessera_tensor::DType::F32)?;
        if self.master.is_none() {
            self.master = Some(p.tensor()?.to_dtype(tessera_tensor::DType::F32)?);
        }
        let ParamState { bufs, master, .. } = self;
        let master = master.as_mut().expect("made above");
        rule.update(
            h,
            ctx,
            master.make_mut::<f32>()?,
            g.as_slice::<f32>()?,
            slices(bufs, R::buffers(h))?,
        );
        master::write_back(p, master)
    }
}

/// The buffers in `names` as flat mutable slices, in that order.
fn slices<'a, T: FloatElement>(
    bufs: &'a mut [(&'static str, Tensor)],
    names: &[&'static str],
) -> Result<Bufs<'a, T>> {
    let mut out: Bufs<'a, T> = Default::default();
    for (name, t) in bufs.iter_mut() {
        if let Some(i) = names.iter().position(|n| n == name) {
            out[i] = t.make_mut::<T>()?;
        }
    }
    Ok(out)
}

impl<R: Rule> Optimizer for GroupOptimizer<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }

    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    fn group_params(&self, group: usize) -> &[Parameter] {
        self.groups.get(group).map_or(&[], |g| &g.params)
    }

    fn hyper(&self, group: usize) -> Option<&dyn Hyper> {
        self.groups.get(group).map(|g| &g.hyper as &dyn Hyper)
    }

    fn hyper_mut(&mut self, group: usize) -> Option<&mut dyn Hyper> {
        self.groups.get_mut(group).map(|g| &mut g.hyper as &mut dyn Hyper)
    }

    fn with_params(&self, groups: Vec<Vec<Parameter>>) -> Result<Box<dyn Optimizer>> {
        if groups.len() != self.groups.len() {
            return Err(Error::arg(
                "with_params",
                format!(
                    "{}: {} parameter lists given for {} groups",
                    R::NAME,
                    groups.len(),
                    self.groups.len()
                ),
            ));
        }
        let groups = groups
            .into_iter()
            .zip(&self.groups)
            .map(|(params, g)| ParamGroup::new(params, g.hyper.clone()))
            .collect();
        Ok(Box::new(GroupOptimizer::from_rule(self.rule.clone(), groups)?))
    }

    fn step(&mut self, grads: &Gradients) -> Result<()> {
        self.check_grads(grads)?;
        self.rule.prepare(&self.groups, grads)?;
        let GroupOptimizer { rule, groups, state } = self;
        for (grp, states) in groups.iter().zip(state.iter_mut()) {
            let h = &grp.hyper;
            let names = R::buffers(h);
            #[cfg(feature = "cuda")]
            fused_cuda::step(rule, h, &grp.params, states, grads)?;
            for (p, st) in grp.params.iter().zip(states.iter_mut()) {
                let Some(g) = p.grad(grads) else { continue };
                #[cfg(feature = "cuda")]
                if !g.device().is_cpu() {
                    // Stepped on its device above.
                    continue;
                }
                // Gradients from backward are contiguous: this is a clone.
                let g = g.contiguous()?;
                let fresh = st.ensure(names, h, p, R::init_value)?;
                st.step += 1;
                let ctx = StepCtx { step: st.step, fresh };
                let dtype = p.dtype();
                if master::needs_master(dtype) {
                    st.step_through_master(rule, h, ctx, p, &g)?;
                    continue;
                }
                with_float_dtype!(dtype, T => {
                    let gs = g.as_slice::<T>()?;
                    let bufs = slices::<T>(&mut st.bufs, names)?;
                    p.update_::<T, _>(|x| rule.update(h, ctx, x, gs, bufs))?;
                }, else return Err(Error::dtype("step", format!("{}: parameter dtype {dtype}", R::NAME))));
            }
        }
        Ok(())
    }

    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        sd.set("kind", R::NAME);
        sd.set("groups", self.groups.len());
        let mut k = 0usize;
        for (g, (grp, states)) in self.groups.iter().zip(&self.state).enumerate() {
            sd.set(format!("group.{g}.params"), grp.params.len());
            for (name, v) in grp.hyper.fields() {
                sd.set(format!("group.{g}.{name}"), v);
            }
            for st in states {
                if st.step > 0 || !st.bufs.is_empty() {
                    sd.set(format!("state.{k}.step"), st.step);
                }
                for (name, t) in &st.bufs {
                    sd.insert(format!("state.{k}.{name}"), t.clone());
                }
                if let Some(m) = &st.master {
                    sd.insert(format!("state.{k}.{MASTER}"), m.clone());
                }
                k += 1;
            }
        }
        self.rule.save_config(&mut sd);
        sd
    }

    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "Optimizer::load_state_dict";
        sd.check_kind(OP, R::NAME)?;
        let n: usize = sd.get(OP, "groups")?;
        if n != self.groups.len() {
            return Err(Error::arg(
                OP,
                format!(
                    "the state dict has {n} parameter groups, the optimizer {}",
                    self.groups.len()
                ),
            ));
        }
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
            let mut h = grp.hyper.clone();
            for (name, _) in grp.hyper.fields() {
                h.set_field(name, sd.get(OP, &format!("group.{g}.{name}"))?)?;
            }
            R::validate(&h)?;
            hypers.push(h);
            let mut group_states = Vec::with_capacity(count);
            for p in &grp.params {
                group_states.push(load_param_state::<R>(sd, k, p)?);
                k += 1;
            }
            states.push(group_states);
        }
        if let Some(extra) = sd.keys().find(|key| {
            key.strip_prefix("state.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_none_or(|i| i >= k)
        }) {
            return Err(Error::arg(
                OP,
                format!("unexpected tensor {extra:?} in the state dict"),
            ));
        }
        self.rule.load_config(sd)?;
        for (grp, h) in self.groups.iter_mut().zip(hypers) {
            grp.hyper = h;
        }
        self.state = states;
        Ok(())
    }
}

/// The state-dict name of a parameter's f32 master copy.
const MASTER: &str = "master";

/// The saved state of flat parameter `k` (`p`), its buffers cast to `p`'s
/// state dtype ([`master::state_dtype`]); a saved master copy is kept only
/// for an f16/bf16 parameter.
fn load_param_state<R: Rule>(sd: &StateDict, k: usize, p: &Parameter) -> Result<ParamState> {
    const OP: &str = "Optimizer::load_state_dict";
    let step_key = format!("state.{k}.step");
    let mut st = ParamState {
        step: if sd.metadata().contains_key(&step_key) {
            sd.get(OP, &step_key)?
        } else {
            0
        },
        bufs: Vec::new(),
        master: None,
    };
    let prefix = format!("state.{k}.");
    for (key, t) in sd.iter() {
        let Some(name) = key.strip_prefix(&prefix) else {
            continue;
        };
        if name == MASTER && master::needs_master(p.dtype()) {
            check_state_shape(key, t, p)?;
            st.master = Some(t.to_dtype(tessera_tensor::DType::F32)?);
            continue;
        }
        let name = R::BUFFERS.iter().find(|b| **b == name).ok_or_else(|| {
            Error::arg(
                OP,
                format!("{} has no state buffer {name:?} (tensor {key:?})", R::NAME),
            )
        })?;
        check_state_shape(key, t, p)?;
        st.bufs.push((name, t.to_dtype(master::state_dtype(p.dtype()))?));
    }
    Ok(st)
}

/// Errors unless the saved state tensor `key` is floating point and shaped
/// like its parameter `p`.
fn check_state_shape(key: &str, t: &Tensor, p: &Parameter) -> Result<()> {
    if t.shape() != p.shape().as_slice() || !t.dtype().is_float() {
        return Err(Error::shape(
            "Optimizer::load_state_dict",
            format!(
                "tensor {key:?} has shape {:?} ({}) but its parameter has shape {:?} ({})",
                t.shape(),
                t.dtype(),
                p.shape(),
                p.dtype()
            ),
        ));
    }
    Ok(())
}
