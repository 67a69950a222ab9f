//! Sequential and ModuleList.

use tessera_autograd::Var;
use tessera_tensor::{Error, Result};

use crate::Module;

/// Modules applied in order, named `0`, `1`, ... in the state dict
/// (`torch.nn.Sequential`).
#[derive(Default, Module)]
pub struct Sequential {
    /// The layers, in order.
    #[module(flatten)]
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty sequence (the identity).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// The same sequence with `m` appended.
    pub fn with(mut self, m: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }

    /// Appends `m`.
    pub fn push(&mut self, m: Box<dyn Module>) {
        self.layers.push(m);
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    /// Errors with the first layer's error, prefixed by nothing: the
    /// layer's own message names its op and shapes.
    fn forward(&self, input: &Var) -> Result<Var> {
        let mut x = input.clone();
        for l in &self.layers {
            x = l.forward(&x)?;
        }
        Ok(x)
    }
}

/// A list of modules, named `0`, `1`, ..., that the owner applies itself
/// (`torch.nn.ModuleList`).
#[derive(Default, Module)]
pub struct ModuleList {
    /// The modules.
    #[module(flatten)]
    pub modules: Vec<Box<dyn Module>>,
}

impl ModuleList {
    /// An empty list.
    pub fn new() -> ModuleList {
        ModuleList::default()
    }

    /// Appends `m`.
    pub fn push(&mut self, m: Box<dyn Module>) {
        self.modules.push(m);
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// True when the list is empty.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The modules, in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.modules.iter().map(|m| m.as_ref() as &dyn Module)
    }
}

impl Module for ModuleList {
    /// Always an error: a ModuleList has no forward of its own (as in
    /// PyTorch); apply its modules with [`ModuleList::iter`].
    fn forward(&self, _input: &Var) -> Result<Var> {
        Err(Error::arg(
            "ModuleList::forward",
            "a ModuleList has no forward; iterate over its modules",
        ))
    }
}
