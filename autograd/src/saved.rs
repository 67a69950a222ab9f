//! [`Saved`]: a value an op's backward reads, kept by value, or by
//! reference for a parameter with a fetch hook (see
//! [`crate::Parameter::set_fetch_hook`]) and for views of one (`w.t()`,
//! `w.narrow(..)`, `w.reshape(..)`), so that a released parameter is not
//! kept alive by the graph and is read back when the node runs.

use std::sync::{Arc, Weak};

use tessera_tensor::{Error, Layout, Result, Tensor};

use crate::node::{Edge, NodeKind};
use crate::param::Slot;
use crate::Var;

/// A value saved for backward by [`Var::saved`]; [`Saved::get`] gives it
/// back when the node runs.
pub struct Saved(Kind);

enum Kind {
    Value(Tensor),
    Param(Weak<Slot>),
    /// A view of a parameter's value: its layout, with the offset taken
    /// from the start of the value (a fetched value is a new buffer).
    View {
        slot: Weak<Slot>,
        layout: Layout,
    },
}

/// The most single-input ops between a parameter and a view of it that
/// [`Var::saved`] looks through (`w.t().reshape(..)` is two).
const MAX_VIEW_DEPTH: usize = 8;

impl Saved {
    /// The value: the saved tensor, or the referenced parameter's current
    /// value (fetched first when released), or the saved view of it.
    /// Errors when the parameter was dropped, or is released and its fetch
    /// hook fails, or its fetched value no longer holds the view.
    pub fn get(&self) -> Result<Tensor> {
        match &self.0 {
            Kind::Value(t) => Ok(t.clone()),
            Kind::Param(slot) => upgrade(slot)?.value_for_backward(),
            Kind::View { slot, layout } => {
                let value = upgrade(slot)?.value_for_backward()?;
                if !value.is_contiguous() {
                    return Err(Error::arg(
                        "backward",
                        format!(
                            "the parameter of shape {:?} a view of shape {:?} was saved from came back with strides {:?}; a view needs a row-major value",
                            value.shape(),
                            layout.shape(),
                            value.strides()
                        ),
                    ));
                }
                let offset = value.layout().offset() + layout.offset();
                let layout = Layout::try_new(layout.shape().to_vec(), layout.strides().to_vec(), offset)?;
                Tensor::from_shared(value.storage().clone(), layout)
            }
        }
    }

    /// True when the value is a reference to a parameter (or a view of one).
    pub fn is_reference(&self) -> bool {
        !matches!(self.0, Kind::Value(_))
    }
}

fn upgrade(slot: &Weak<Slot>) -> Result<Arc<Slot>> {
    slot.upgrade().ok_or_else(|| {
        Error::arg(
            "backward",
            "a parameter saved by reference for this backward was dropped",
        )
    })
}

impl Var {
    /// What an op's backward should keep of this input: a reference when it
    /// is the leaf of a [`crate::Parameter`] with a fetch hook, or a view
    /// of such a leaf's current value (the view's layout and a reference);
    /// the value otherwise. Ops read it back with [`Saved::get`].
    pub fn saved(&self) -> Saved {
        let Some(edge) = self.edge() else {
            return Saved(Kind::Value(self.tensor().clone()));
        };
        if let NodeKind::Leaf { by_ref, .. } = &edge.node.kind {
            if let Some(slot) = by_ref.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                return Saved(Kind::Param(slot));
            }
        }
        match self.view_of_param(edge) {
            Some(kind) => Saved(kind),
            None => Saved(Kind::Value(self.tensor().clone())),
        }
    }

    /// `Kind::View` when this value shares its storage with the current
    /// value of a by-reference parameter reached through a chain of
    /// single-input ops. Sharing storage is what makes it a view, whatever
    /// ops made it; an op that computed new values has its own buffer.
    fn view_of_param(&self, edge: &Edge) -> Option<Kind> {
        let mut edge = edge.clone();
        for _ in 0..MAX_VIEW_DEPTH {
            let next = match &edge.node.kind {
                NodeKind::Leaf { by_ref, .. } => {
                    let weak = by_ref.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
                    let value = weak.upgrade()?.current();
                    let view = self.tensor();
                    if !value.shares_storage(view) || !value.is_contiguous() {
                        return None;
                    }
                    let offset = view.layout().offset().checked_sub(value.layout().offset())?;
                    let layout =
                        Layout::try_new(view.shape().to_vec(), view.strides().to_vec(), offset).ok()?;
                    return Some(Kind::View { slot: weak, layout });
                }
                NodeKind::Op { inputs, .. } => {
                    let mut grads = inputs.iter().flatten();
                    match (grads.next(), grads.next()) {
                        (Some(only), None) => only.clone(),
                        _ => return None,
                    }
                }
            };
            edge = next;
        }
        None
    }
}
