//! [`Saved`]: a value an op's backward reads, kept by value, or by
//! reference for a parameter with a fetch hook (see
//! [`crate::Parameter::set_fetch_hook`]), so that a released parameter is
//! not kept alive by the graph and is read back when the node runs.

use std::sync::Weak;

use tessera_tensor::{Error, Result, Tensor};

use crate::node::NodeKind;
use crate::param::Slot;
use crate::Var;

/// A value saved for backward by [`Var::saved`]; [`Saved::get`] gives it
/// back when the node runs.
pub struct Saved(Kind);

enum Kind {
    Value(Tensor),
    Param(Weak<Slot>),
}

impl Saved {
    /// The value: the saved tensor, or the referenced parameter's current
    /// value (fetched first when released). Errors when the parameter was
    /// dropped, or is released and its fetch hook fails.
    pub fn get(&self) -> Result<Tensor> {
        match &self.0 {
            Kind::Value(t) => Ok(t.clone()),
            Kind::Param(slot) => slot
                .upgrade()
                .ok_or_else(|| {
                    Error::arg(
                        "backward",
                        "a parameter saved by reference for this backward was dropped",
                    )
                })?
                .value_for_backward(),
        }
    }

    /// True when the value is a reference to a parameter.
    pub fn is_reference(&self) -> bool {
        matches!(self.0, Kind::Param(_))
    }
}

impl Var {
    /// What an op's backward should keep of this input: a reference when it
    /// is the leaf of a [`crate::Parameter`] with a fetch hook, the value
    /// otherwise. Ops read it back with [`Saved::get`].
    pub fn saved(&self) -> Saved {
        if let Some(NodeKind::Leaf { by_ref, .. }) = self.edge().map(|e| &e.node.kind) {
            if let Some(slot) = by_ref.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                return Saved(Kind::Param(slot));
            }
        }
        Saved(Kind::Value(self.tensor().clone()))
    }
}
