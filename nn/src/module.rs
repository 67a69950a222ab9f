//! The [`Module`] trait: forward, PyTorch-named parameters and buffers,
//! train/eval mode.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{Result, Tensor};

use crate::Buffer;

/// A neural-network layer or model, as `torch.nn.Module`.
///
/// A module implements [`Module::forward`] and describes its state: its own
/// parameters and buffers (with their local names, in registration order)
/// and its children (with their attribute names, or indices in containers).
/// From that description the provided methods derive everything else with
/// PyTorch's naming: [`Module::named_parameters`] gives `features.0.weight`,
/// [`Module::state_dict`] gives parameters then buffers of each module
/// before its children's (`bn1.weight, bn1.bias, bn1.running_mean, ...`).
///
/// Parameters and buffers are shared handles, so `forward(&self)` reads the
/// values the optimizer last wrote, and BatchNorm updates its running
/// statistics through `&self`.
pub trait Module: Send + Sync {
    /// Applies the module to `input`. Errors when the input's shape or
    /// dtype do not fit the module (the message names the op and shapes).
    fn forward(&self, input: &Var) -> Result<Var>;

    /// The module's type name, as PyTorch prints it (`"Linear"`).
    fn type_name(&self) -> &'static str;

    /// This module's own parameters (not its children's), in registration
    /// order, with their local names. An absent bias is simply not listed.
    fn own_parameters(&self) -> Vec<(&'static str, Parameter)> {
        Vec::new()
    }

    /// This module's own persistent buffers, in registration order.
    fn own_buffers(&self) -> Vec<(&'static str, Buffer)> {
        Vec::new()
    }

    /// The direct children with their names, in registration order.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    /// The direct children, mutably (for [`Module::train`]).
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        Vec::new()
    }

    /// Sets this module's own training flag (children are visited by
    /// [`Module::train`]). Modules that behave the same in both modes
    /// ignore it.
    fn set_own_training(&mut self, _training: bool) {}

    /// This module's own training flag, `None` for modules without one.
    fn own_training(&self) -> Option<bool> {
        None
    }

    /// Puts this module and every descendant in training mode (`true`) or
    /// evaluation mode (`false`), PyTorch's `train(mode)`.
    fn train(&mut self, training: bool) {
        self.set_own_training(training);
        for (_, c) in self.children_mut() {
            c.train(training);
        }
    }

    /// Evaluation mode: `train(false)`.
    fn eval(&mut self) {
        self.train(false);
    }

    /// True when the module (or, lacking a flag of its own, its first
    /// descendant with one) is in training mode; true when none has a flag,
    /// as new PyTorch modules start in training mode.
    fn is_training(&self) -> bool {
        self.own_training()
            .or_else(|| {
                let mut found = None;
                walk(self.as_dyn_ref(), "", &mut |_, m| {
                    if found.is_none() {
                        found = m.own_training();
                    }
                });
                found
            })
            .unwrap_or(true)
    }

    /// `self` as a trait object (written by [`crate::module_boilerplate!`]).
    fn as_dyn_ref(&self) -> &dyn Module;

    /// Every parameter with its dotted PyTorch name, parents before
    /// children, each shared parameter once (under its first name), as
    /// `named_parameters()`.
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out: Vec<(String, Parameter)> = Vec::new();
        walk(self.as_dyn_ref(), "", &mut |prefix, m| {
            for (name, p) in m.own_parameters() {
                if !out.iter().any(|(_, q)| q.same(&p)) {
                    out.push((join(prefix, name), p));
                }
            }
        });
        out
    }

    /// Every parameter, in the order of [`Module::named_parameters`].
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }

    /// Every persistent buffer with its dotted name, as `named_buffers()`.
    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        let mut out: Vec<(String, Buffer)> = Vec::new();
        walk(self.as_dyn_ref(), "", &mut |prefix, m| {
            for (name, b) in m.own_buffers() {
                if !out.iter().any(|(_, c)| c.same(&b)) {
                    out.push((join(prefix, name), b));
                }
            }
        });
        out
    }

    /// The number of parameter elements (each shared parameter once), as
    /// `sum(p.numel() for p in m.parameters())`.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Parameter::numel).sum()
    }

    /// The number of elements of parameters that require a gradient.
    fn num_trainable_parameters(&self) -> usize {
        self.parameters()
            .iter()
            .filter(|p| p.requires_grad())
            .map(Parameter::numel)
            .sum()
    }

    /// The state dict in PyTorch's order: for each module, its parameters,
    /// then its buffers, then its children's entries. Tensors are shared,
    /// not copied (later updates copy-on-write, so these values never
    /// change). A parameter reachable under two names is listed under both,
    /// as in PyTorch.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        walk(self.as_dyn_ref(), "", &mut |prefix, m| {
            for (name, p) in m.own_parameters() {
                out.push((join(prefix, name), p.tensor()));
            }
            for (name, b) in m.own_buffers() {
                out.push((join(prefix, name), b.tensor()));
            }
        });
        out
    }
}

/// Calls `f(prefix, module)` for `m` and every descendant, parents before
/// children, with the dotted prefix of each (`""` for `m` itself).
pub fn walk(m: &dyn Module, prefix: &str, f: &mut dyn FnMut(&str, &dyn Module)) {
    f(prefix, m);
    for (name, c) in m.children() {
        walk(c, &join(prefix, &name), f);
    }
}

/// `prefix.name`, or `name` at the root.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Implements [`Module::as_dyn_ref`] and [`Module::type_name`] inside an
/// `impl Module for T` block.
#[macro_export]
macro_rules! module_boilerplate {
    ($name:literal) => {
        fn type_name(&self) -> &'static str {
            $name
        }
        fn as_dyn_ref(&self) -> &dyn $crate::Module {
            self
        }
    };
}
