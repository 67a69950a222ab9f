//! The [`Module`] trait: forward, PyTorch-named parameters and buffers,
//! train/eval mode.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{Device, Error, Result, StateDict, Tensor};

use crate::state_dict::LoadReport;
use crate::visit::{walk, Entry};
use crate::{Buffer, Visit};

/// A neural-network layer or model, as `torch.nn.Module`.
///
/// A module is a struct with `#[derive(Module)]` and an `impl Module` with
/// its [`Module::forward`]. The derive reads the module's state from its
/// fields — [`Parameter`]s, [`Buffer`]s, a [`crate::Training`] flag, child
/// modules, and `Option`s, `Vec`s and arrays of these — so there is no list
/// of children to keep in step with the fields: every child is in the state
/// dict and every flag follows [`Module::train`] by construction. A field
/// that is none of these must be marked `#[module(skip)]`, or the struct
/// does not compile.
///
/// ```
/// use tessera_nn::{Dropout, LayerNorm, Linear, Module, Training, Var};
/// use tessera_tensor::Result;
///
/// #[derive(Module)]
/// struct Block {
///     norm: LayerNorm,
///     layers: Vec<Linear>,
///     drop: Option<Dropout>,
///     #[module(skip)]
///     width: usize,
/// }
///
/// impl Module for Block {
///     fn forward(&self, x: &Var) -> Result<Var> {
///         let mut h = self.norm.forward(x)?;
///         for l in &self.layers {
///             h = l.forward(&h)?.relu()?;
///         }
///         match &self.drop {
///             Some(d) => d.forward(&h),
///             None => Ok(h),
///         }
///     }
/// }
///
/// let mut block = Block {
///     norm: LayerNorm::new(&[4], 1e-5, true, true)?,
///     layers: vec![Linear::new(4, 4, true)?, Linear::new(4, 4, false)?],
///     drop: Some(Dropout::new(0.1)?),
///     width: 4,
/// };
/// let names: Vec<String> = block.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["norm.weight", "norm.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight"]);
/// block.eval(); // reaches the Dropout: no list of children was written
/// assert!(!block.is_training());
/// # Ok::<(), tessera_tensor::Error>(())
/// ```
///
/// A forgotten child is impossible: every field is visited, and a field
/// that is not module state must say so. Without the `#[module(skip)]`,
/// this does not compile (`usize` is not a module, parameter, buffer or
/// training flag):
///
/// ```compile_fail,E0277
/// use tessera_nn::{Linear, Module, Var};
///
/// #[derive(Module)]
/// struct Head {
///     fc: Linear,
///     width: usize,
/// }
///
/// impl Module for Head {
///     fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
///         self.fc.forward(x)
///     }
/// }
/// ```
///
/// Names and order are PyTorch's: [`Module::named_parameters`] gives
/// `features.0.weight`, and [`Module::state_dict`] lists each module's
/// parameters, then its buffers, then its children's entries
/// (`bn1.weight, bn1.bias, bn1.running_mean, ...`). Where PyTorch's name
/// differs from the field's, `#[module(rename = "...")]` sets it, and
/// `#[module(flatten)]` drops the field's name (a `Vec` field of a
/// `Sequential`-like container gives `0.weight`, `1.weight`, ...).
///
/// Parameters and buffers are shared handles, so `forward(&self)` reads the
/// values the optimizer last wrote, and BatchNorm updates its running
/// statistics through `&self`.
pub trait Module: Visit + Send + Sync {
    /// Applies the module to `input`. Errors when the input's shape or
    /// dtype do not fit the module (the message names the op and shapes).
    fn forward(&self, input: &Var) -> Result<Var>;

    /// Puts this module and every descendant in training mode (`true`) or
    /// evaluation mode (`false`), PyTorch's `train(mode)`: every
    /// [`crate::Training`] flag in the tree is set.
    fn train(&mut self, training: bool) {
        walk(self, &mut |_, e| {
            if let Entry::Training(flag) = e {
                flag.set(training);
            }
        });
    }

    /// Evaluation mode: `train(false)`.
    fn eval(&mut self) {
        self.train(false);
    }

    /// The mode of the module's own training flag or, lacking one, of the
    /// first descendant's; true when no module in the tree has a flag, as
    /// new PyTorch modules start in training mode.
    fn is_training(&self) -> bool {
        let mut found = None;
        walk(self, &mut |_, e| {
            if let (None, Entry::Training(flag)) = (found, e) {
                found = Some(flag.get());
            }
        });
        found.unwrap_or(true)
    }

    /// Every parameter with its dotted PyTorch name, parents before
    /// children, each shared parameter once (under its first name), as
    /// `named_parameters()`.
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out: Vec<(String, Parameter)> = Vec::new();
        walk(self, &mut |name, e| {
            if let Entry::Parameter(p) = e {
                if !out.iter().any(|(_, q)| q.same(p)) {
                    out.push((name.to_string(), p.clone()));
                }
            }
        });
        out
    }

    /// Every parameter, in the order of [`Module::named_parameters`].
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }

    /// Every buffer (persistent or not) with its dotted name, each shared
    /// buffer once, as `named_buffers()`.
    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        let mut out: Vec<(String, Buffer)> = Vec::new();
        walk(self, &mut |name, e| {
            if let Entry::Buffer(b) = e {
                if !out.iter().any(|(_, c)| c.same(b)) {
                    out.push((name.to_string(), b.clone()));
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
    /// then its persistent buffers, then its children's entries. Tensors
    /// are shared, not copied (later updates copy-on-write, so these values
    /// never change). A parameter reachable under two names is listed under
    /// both, as in PyTorch. A released parameter (ZeRO-3) is fetched, which
    /// is a collective; if that fails it is listed empty (shape `[0]`), as
    /// DeepSpeed's partitioned parameters are in PyTorch's `state_dict` —
    /// `Zero3::consolidated_model_state_dict` gathers them and reports
    /// errors.
    fn state_dict(&self) -> StateDict {
        let mut out = StateDict::new();
        walk(self, &mut |name, e| match e {
            Entry::Parameter(p) => {
                out.insert(name, p.tensor().unwrap_or_else(|_| p.current()));
            }
            Entry::Buffer(b) if b.is_persistent() => {
                out.insert(name, b.tensor());
            }
            _ => {}
        });
        out
    }

    /// Moves every parameter and buffer of the tree to `device` (PyTorch's
    /// `module.to(device)`), each shared one once; a gradient key and a
    /// `requires_grad` flag stay as they were. All values are copied first
    /// and swapped in only when every copy succeeded, so on an error
    /// nothing changes.
    ///
    /// Errors: a copy that fails (no such device, out of memory); the
    /// message names the parameter or buffer by its dotted name.
    fn to(&mut self, device: Device) -> Result<()> {
        let copy = |name: &str, t: Tensor| {
            t.to_device(device)
                .map_err(|e| Error::device("Module::to", format!("{name}: {e}")))
        };
        let params = self
            .named_parameters()
            .into_iter()
            .map(|(name, p)| Ok((copy(&name, p.tensor()?)?, p)))
            .collect::<Result<Vec<_>>>()?;
        let buffers = self
            .named_buffers()
            .into_iter()
            .map(|(name, b)| Ok((copy(&name, b.tensor())?, b)))
            .collect::<Result<Vec<_>>>()?;
        for (t, p) in params {
            p.set(t)?;
        }
        for (t, b) in buffers {
            b.set(t)?;
        }
        Ok(())
    }

    /// Copies the tensors of `sd` into the parameters and buffers by name,
    /// as PyTorch's `load_state_dict(sd, strict)`; see
    /// [`crate::state_dict::load_state_dict`]. With `strict`, a missing,
    /// unexpected or wrongly shaped key is an error naming each (with both
    /// shapes) and nothing changes.
    fn load_state_dict(&self, sd: &StateDict, strict: bool) -> Result<LoadReport> {
        crate::state_dict::load_state_dict(self, sd, strict)
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, input: &Var) -> Result<Var> {
        (**self).forward(input)
    }
}
