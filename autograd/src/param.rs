//! [`Parameter`]: a shared handle to a trainable leaf, so the module that
//! reads it and the optimizer that updates it see one value.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tessera_tensor::{DType, Element, Error, Result, Tensor};

use crate::{Gradients, Var, VarId};

/// A trainable value shared by handle: every clone of a `Parameter` refers
/// to the same leaf [`Var`], so an optimizer step made through one clone is
/// what the next forward pass reads through another (like a `torch.nn.
/// Parameter` held by a module and by an optimizer).
///
/// A forward pass takes the current value with [`Parameter::var`]; an
/// optimizer updates it with [`Parameter::update_`], in place when nothing
/// else holds the old value. The leaf's id (the key of its gradient in
/// [`Gradients`]) survives updates.
#[derive(Clone)]
pub struct Parameter {
    leaf: Arc<RwLock<Var>>,
}

impl Parameter {
    /// A parameter holding `tensor`, requiring a gradient.
    pub fn new(tensor: Tensor) -> Parameter {
        Parameter {
            leaf: Arc::new(RwLock::new(Var::leaf(tensor))),
        }
    }

    /// A parameter wrapping an existing leaf (one that requires grad or a
    /// frozen one). Errors on an op result.
    pub fn from_var(var: Var) -> Result<Parameter> {
        if !var.is_leaf() {
            return Err(Error::arg(
                "Parameter::from_var",
                "a parameter must be a leaf; detach() the op result first",
            ));
        }
        Ok(Parameter {
            leaf: Arc::new(RwLock::new(var)),
        })
    }

    /// The current value as a leaf `Var` to compute with (a cheap clone
    /// sharing the tensor and the gradient key).
    pub fn var(&self) -> Var {
        self.read().clone()
    }

    /// The current value (a cheap clone sharing the storage).
    pub fn tensor(&self) -> Tensor {
        self.read().tensor().clone()
    }

    /// The key of this parameter's gradient in [`Gradients`]; `None` while
    /// it is frozen.
    pub fn id(&self) -> Option<VarId> {
        self.read().id()
    }

    /// This parameter's gradient in `grads`, if backward reached it.
    pub fn grad<'g>(&self, grads: &'g Gradients) -> Option<&'g Tensor> {
        self.id().and_then(|id| grads.get_id(id))
    }

    /// True unless the parameter is frozen.
    pub fn requires_grad(&self) -> bool {
        self.read().requires_grad()
    }

    /// Freezes (`false`) or unfreezes (`true`) the parameter for every
    /// holder. Unfreezing gives it a new id, as [`Var::requires_grad_`] does.
    pub fn requires_grad_(&self, requires: bool) -> Result<()> {
        self.write().requires_grad_(requires)
    }

    /// Runs `f` on the elements as one mutable row-major slice, in place when
    /// no other tensor shares the storage (see [`Var::update_`]), and returns
    /// its result. `f` must not read this parameter through another handle
    /// (the value is locked while `f` runs). Errors when `T` is not the dtype.
    pub fn update_<T: Element, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.write().update_(f)
    }

    /// The value locked for writing in place until the guard drops, for
    /// updates that need several parameters at once (a fused multi-tensor
    /// optimizer step holds one guard per parameter). The guard derefs to
    /// the value's [`Tensor`]; whoever writes through it must keep its shape
    /// and dtype (the gradient key and the graph's metadata assume them).
    /// Reading or writing this parameter through another handle while the
    /// guard lives blocks.
    pub fn value_mut(&self) -> ValueMut<'_> {
        ValueMut(self.write())
    }

    /// Replaces the value (PyTorch's `p.data = t`), keeping the id. Errors,
    /// changing nothing, when the shape or dtype differ.
    pub fn set(&self, tensor: Tensor) -> Result<()> {
        self.write().set_tensor_(tensor)
    }

    /// The value's shape.
    pub fn shape(&self) -> Vec<usize> {
        self.read().shape().to_vec()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.read().ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.read().numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.read().dtype()
    }

    /// True when `self` and `other` are handles to the same parameter.
    pub fn same(&self, other: &Parameter) -> bool {
        Arc::ptr_eq(&self.leaf, &other.leaf)
    }

    // A panic while the lock was held cannot leave a Var half-updated (its
    // fields are replaced whole), so a poisoned lock is still usable.
    fn read(&self) -> RwLockReadGuard<'_, Var> {
        self.leaf.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Var> {
        self.leaf.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for Parameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Parameter({:?})", *self.read())
    }
}

/// A [`Parameter`]'s value locked for writing ([`Parameter::value_mut`]).
pub struct ValueMut<'a>(RwLockWriteGuard<'a, Var>);

impl std::ops::Deref for ValueMut<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        self.0.tensor()
    }
}

impl std::ops::DerefMut for ValueMut<'_> {
    fn deref_mut(&mut self) -> &mut Tensor {
        self.0.tensor_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_updates_and_keep_the_gradient_key() {
        let p = Parameter::new(Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]).unwrap());
        let held_by_module = p.clone();
        let id = p.id().unwrap();
        let before = p.tensor().storage().as_bytes().as_ptr();
        p.update_::<f64, _>(|x| x.iter_mut().for_each(|v| *v *= 10.0))
            .unwrap();
        assert_eq!(
            p.tensor().storage().as_bytes().as_ptr(),
            before,
            "updated in place"
        );
        assert_eq!(
            held_by_module.tensor().to_vec::<f64>().unwrap(),
            vec![10.0, 20.0, 30.0]
        );
        assert_eq!(held_by_module.var().id(), Some(id));

        // A value someone still holds is never changed by an update.
        let snapshot = p.tensor();
        p.update_::<f64, _>(|x| x[0] = -1.0).unwrap();
        assert_eq!(snapshot.to_vec::<f64>().unwrap(), vec![10.0, 20.0, 30.0]);
        assert_eq!(p.tensor().to_vec::<f64>().unwrap(), vec![-1.0, 20.0, 30.0]);
        assert!(p.update_::<f32, _>(|_| ()).is_err());

        p.set(snapshot).unwrap();
        assert_eq!(
            held_by_module.tensor().to_vec::<f64>().unwrap(),
            vec![10.0, 20.0, 30.0]
        );
        assert!(p.set(Tensor::from_vec(vec![1.0f64], &[1]).unwrap()).is_err());
        assert!(p.same(&held_by_module));
        assert_eq!(p.id(), Some(id));
    }

    #[test]
    fn freezing_is_seen_by_every_handle() {
        let p = Parameter::new(Tensor::from_vec(vec![1.0f32], &[1]).unwrap());
        let q = p.clone();
        q.requires_grad_(false).unwrap();
        assert!(!p.requires_grad());
        assert_eq!(p.id(), None);
        p.requires_grad_(true).unwrap();
        assert!(q.id().is_some());
    }
}
