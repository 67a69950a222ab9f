//! [`Var`]: a tensor with its place in the autograd graph.

use std::sync::Arc;

use tessera_tensor::{DType, Device, Element, Error, Result, Tensor};

use crate::node::{Edge, Hook, Meta, Node, NodeKind};

/// A tensor plus, when it needs a gradient, the graph edge its gradient flows
/// along. Cloning is cheap (the tensor and the edge are shared). `Var` is
/// `Send + Sync`: replicas and pipeline stages on other threads each build
/// their own graphs.
#[derive(Clone)]
pub struct Var {
    tensor: Tensor,
    edge: Option<Edge>,
}

/// The identity of a leaf that requires a gradient: the key of its entry in
/// [`crate::Gradients`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub(crate) u64);

impl Var {
    /// A leaf that requires a gradient (a parameter, or an input you want
    /// the gradient of).
    pub fn leaf(tensor: Tensor) -> Var {
        let node = Node::leaf(Meta::of(&tensor));
        Var {
            tensor,
            edge: Some(Edge { node, output: 0 }),
        }
    }

    /// A value that needs no gradient: gradients stop here.
    pub fn constant(tensor: Tensor) -> Var {
        Var { tensor, edge: None }
    }

    pub(crate) fn from_edge(tensor: Tensor, edge: Option<Edge>) -> Var {
        Var { tensor, edge }
    }

    pub(crate) fn edge(&self) -> Option<&Edge> {
        self.edge.as_ref()
    }

    /// The value.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The value, consuming the `Var`.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }

    /// True when gradients flow into this value (a leaf that requires grad,
    /// or the result of an op recorded on such inputs).
    pub fn requires_grad(&self) -> bool {
        self.edge.is_some()
    }

    /// True for leaves and constants; false for results of recorded ops.
    pub fn is_leaf(&self) -> bool {
        match &self.edge {
            None => true,
            Some(e) => matches!(e.node.kind, NodeKind::Leaf { .. }),
        }
    }

    /// The id under which [`crate::Gradients`] holds this leaf's gradient;
    /// `None` for constants and op results.
    pub fn id(&self) -> Option<VarId> {
        match &self.edge {
            Some(e) if matches!(e.node.kind, NodeKind::Leaf { .. }) => Some(VarId(e.node.id)),
            _ => None,
        }
    }

    /// The same value cut from the graph: gradients do not flow through it.
    pub fn detach(&self) -> Var {
        Var::constant(self.tensor.clone())
    }

    /// Turns gradient tracking of a leaf on or off (freezing a parameter).
    /// Turning it on gives the leaf a new id. Errors on an op result, which
    /// cannot stop requiring a gradient without `detach`.
    pub fn requires_grad_(&mut self, requires: bool) -> Result<()> {
        if !self.is_leaf() {
            return Err(Error::arg(
                "requires_grad_",
                "can only change requires_grad of a leaf; use detach() on an op result",
            ));
        }
        match (requires, self.edge.is_some()) {
            (true, false) => *self = Var::leaf(self.tensor.clone()),
            (false, true) => self.edge = None,
            _ => {}
        }
        Ok(())
    }

    /// Registers `hook` to run once with this leaf's final gradient during
    /// each backward, as soon as no later op can add to it (gradients become
    /// final in reverse order of use). Errors unless this is a leaf that
    /// requires a gradient.
    pub fn register_hook(&self, hook: impl Fn(&Tensor) + Send + Sync + 'static) -> Result<()> {
        match self.edge.as_ref().map(|e| &e.node.kind) {
            Some(NodeKind::Leaf { hooks, .. }) => {
                hooks.lock().expect("hook list lock").push(Arc::new(hook) as Hook);
                Ok(())
            }
            _ => Err(Error::arg(
                "register_hook",
                "hooks can only be registered on a leaf that requires grad",
            )),
        }
    }

    /// Runs `f` on the value's elements as one mutable row-major slice and
    /// returns its result: the in-place update an optimizer step makes. The
    /// leaf keeps its id (its gradient key) and hooks. The storage is
    /// mutated when this `Var` is its only owner; otherwise the value is
    /// copied first, so clones of the old value never change. Errors when
    /// `T` is not the dtype, or on an op result (its value belongs to the
    /// graph).
    pub fn update_<T: Element, R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        if !self.is_leaf() {
            return Err(Error::arg(
                "update_",
                "only a leaf's value can be updated in place; use detach() on an op result",
            ));
        }
        Ok(f(self.tensor.make_mut::<T>()?))
    }

    /// The value, mutable: for [`crate::ValueMut`], whose users keep
    /// its shape and dtype.
    pub(crate) fn tensor_mut(&mut self) -> &mut Tensor {
        &mut self.tensor
    }

    /// Replaces a leaf's value, keeping its id and hooks (PyTorch's
    /// `p.data = t`). Errors, leaving the value unchanged, when `tensor`'s
    /// shape or dtype differ from the current value's, or on an op result.
    pub fn set_tensor_(&mut self, tensor: Tensor) -> Result<()> {
        if !self.is_leaf() {
            return Err(Error::arg("set_tensor_", "only a leaf's value can be replaced"));
        }
        if tensor.shape() != self.shape() || tensor.dtype() != self.dtype() {
            return Err(Error::shape(
                "set_tensor_",
                format!(
                    "cannot replace a value of shape {:?} ({}) by one of shape {:?} ({})",
                    self.shape(),
                    self.dtype(),
                    tensor.shape(),
                    tensor.dtype()
                ),
            ));
        }
        self.tensor = tensor;
        Ok(())
    }

    /// The value's shape.
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// The value's device.
    pub fn device(&self) -> Device {
        self.tensor.device()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.tensor.ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.tensor.numel()
    }
}

impl From<Tensor> for Var {
    fn from(t: Tensor) -> Var {
        Var::constant(t)
    }
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let origin = match self.edge.as_ref().map(|e| &e.node.kind) {
            None => "constant".to_string(),
            Some(NodeKind::Leaf { .. }) => "leaf".to_string(),
            Some(NodeKind::Op { name, .. }) => format!("grad_fn={name}"),
        };
        write!(f, "Var({:?}, {origin})", self.tensor)
    }
}
