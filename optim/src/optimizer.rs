//! The [`Optimizer`] trait, parameter groups, and the split of parameters
//! into decayed and non-decayed groups.

use std::path::Path;

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::Result;

use crate::{Hyper, StateDict};

/// An optimizer over parameter groups, each with its own hyperparameters.
///
/// There is no `zero_grad`: gradients are the value [`Gradients`] that
/// `backward` returns, handed to [`Optimizer::step`]. Parameters without a
/// gradient there (frozen, or not reached by backward) are left untouched,
/// as PyTorch skips parameters whose `.grad` is `None`.
///
/// The trait is object safe: schedules, loss scalers and wrappers (ZeRO,
/// gradient accumulation) take `&mut dyn Optimizer`.
pub trait Optimizer: Send {
    /// The optimizer's name as PyTorch spells it (`"SGD"`, `"AdamW"`, ...).
    fn name(&self) -> &'static str;

    /// The number of parameter groups.
    fn num_groups(&self) -> usize;

    /// The parameters of group `group` (empty when out of range).
    fn group_params(&self, group: usize) -> &[Parameter];

    /// The hyperparameters of group `group`, `None` when out of range.
    fn hyper(&self, group: usize) -> Option<&dyn Hyper>;

    /// Mutable hyperparameters of group `group`, `None` when out of range.
    fn hyper_mut(&mut self, group: usize) -> Option<&mut dyn Hyper>;

    /// The same optimizer (kind, configuration and every group's
    /// hyperparameters) over other parameters, with fresh state: group g
    /// gets `groups[g]`. ZeRO builds the optimizer of a rank's shard this
    /// way. Errors when the number of lists is not the number of groups, or
    /// as the optimizer's constructor does (a parameter listed twice).
    fn with_params(&self, groups: Vec<Vec<Parameter>>) -> Result<Box<dyn Optimizer>>;

    /// Updates every parameter that has a gradient in `grads`. Errors,
    /// before changing anything, when a gradient's shape or dtype differ
    /// from its parameter's or a hyperparameter is out of its domain.
    fn step(&mut self, grads: &Gradients) -> Result<()>;

    /// The optimizer state (per-parameter buffers and step counts, every
    /// group's hyperparameters). Tensors are shared, not copied: later steps
    /// copy-on-write, so the returned value never changes.
    fn state_dict(&self) -> StateDict;

    /// Restores a state saved by [`Optimizer::state_dict`] of the same kind
    /// of optimizer over the same parameter shapes (hyperparameters
    /// included, as PyTorch does). Errors, changing nothing, on a mismatch.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()>;

    /// Whether the next [`Optimizer::step`] expects gradients averaged over
    /// the data-parallel ranks: true for every optimizer but the
    /// communication-compressed ones ([`crate::OnebitAdam`], ...) once
    /// their warm-up is over, which exchange compressed momentum inside
    /// `step` and take each rank's local gradients. DDP's `backward_for`
    /// asks this before each backward pass and skips its all-reduce when
    /// false.
    fn wants_averaged_grads(&self) -> bool {
        true
    }

    /// The learning rate of every group.
    fn lrs(&self) -> Vec<f64> {
        (0..self.num_groups())
            .filter_map(|g| self.hyper(g).map(|h| h.lr()))
            .collect()
    }

    /// Sets the learning rate of every group to `lr`.
    fn set_lr(&mut self, lr: f64) {
        for g in 0..self.num_groups() {
            if let Some(h) = self.hyper_mut(g) {
                h.set_lr(lr);
            }
        }
    }

    /// Every parameter of every group, in group order.
    fn params(&self) -> Vec<Parameter> {
        (0..self.num_groups())
            .flat_map(|g| self.group_params(g).iter().cloned())
            .collect()
    }

    /// Saves [`Optimizer::state_dict`] to a safetensors file (hyperparameters
    /// in its metadata). Errors on I/O failure.
    fn save(&self, path: &Path) -> Result<()> {
        self.state_dict().save(path)
    }

    /// Loads a file written by [`Optimizer::save`]. Errors as
    /// [`Optimizer::load_state_dict`] or on I/O failure.
    fn load(&mut self, path: &Path) -> Result<()> {
        self.load_state_dict(&StateDict::load(path)?)
    }
}

/// Parameters that share hyperparameters `H` (an optimizer's options type).
#[derive(Debug, Clone)]
pub struct ParamGroup<H> {
    /// The parameters, in the order their state is saved.
    pub params: Vec<Parameter>,
    /// Their hyperparameters.
    pub hyper: H,
}

impl<H> ParamGroup<H> {
    /// A group of `params` with `hyper`.
    pub fn new(params: Vec<Parameter>, hyper: H) -> ParamGroup<H> {
        ParamGroup { params, hyper }
    }
}

/// timm's `param_groups_weight_decay`: splits named parameters into a group
/// without weight decay — every parameter with at most one dimension (biases,
/// norm weights), every name ending in `.bias`, and every name in
/// `no_weight_decay` (e.g. ViT's `pos_embed`, `cls_token`) — and a group
/// with `hyper`'s weight decay. Frozen parameters are left out. Returns
/// `[no_decay, decay]` in that order (both present even when empty), each
/// with a copy of `hyper`, the first with weight decay 0.
pub fn param_groups_weight_decay<H: Hyper + Clone>(
    named: &[(String, Parameter)],
    hyper: &H,
    no_weight_decay: &[&str],
) -> Vec<ParamGroup<H>> {
    let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
    for (name, p) in named {
        if !p.requires_grad() {
            continue;
        }
        if p.ndim() <= 1 || name.ends_with(".bias") || no_weight_decay.contains(&name.as_str()) {
            no_decay.push(p.clone());
        } else {
            decay.push(p.clone());
        }
    }
    let mut off = hyper.clone();
    off.set_weight_decay(0.0);
    vec![
        ParamGroup::new(no_decay, off),
        ParamGroup::new(decay, hyper.clone()),
    ]
}
