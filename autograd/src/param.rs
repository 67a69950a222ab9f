//! [`Parameter`]: a shared handle to a trainable leaf, so the module that
//! reads it and the optimizer that updates it see one value.
//!
//! A parameter can also be *released* (its value freed, its shape kept)
//! and fetched back on demand: ZeRO stage 3 keeps only a shard of each
//! parameter between uses. The ops that save such a parameter for backward
//! keep a reference to it instead of its value ([`crate::Saved`]), so
//! releasing it after forward really frees the memory, and the fetch hook
//! brings the value back when a node reads it during backward (what
//! DeepSpeed gets from PyTorch by swapping `param.data`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tessera_tensor::{DType, Element, Error, Result, Tensor};

use crate::node::NodeKind;
use crate::{Gradients, Var, VarId};

/// Called whenever a parameter's value is read (by [`Parameter::var`],
/// [`Parameter::tensor`], or a backward node that saved it by reference),
/// so its owner sees the order of use (ZeRO-3 records it to prefetch): a
/// released value must be put back with [`Parameter::set`] (or the hook
/// fails, leaving it released). The error it returns is what a backward
/// node reading the parameter reports.
pub type FetchHook = Arc<dyn Fn() -> Result<()> + Send + Sync + 'static>;

/// What every handle of one parameter shares.
pub(crate) struct Slot {
    var: RwLock<Var>,
    /// The value's shape, also while it is released.
    shape: Vec<usize>,
    released: AtomicBool,
    fetch: RwLock<Option<FetchHook>>,
}

impl Slot {
    fn read(&self) -> RwLockReadGuard<'_, Var> {
        // A panic while the lock was held cannot leave a Var half-updated
        // (its fields are replaced whole), so a poisoned lock is still usable.
        self.var.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Var> {
        self.var.write().unwrap_or_else(|e| e.into_inner())
    }

    fn hook(&self) -> Option<FetchHook> {
        self.fetch.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs the fetch hook, if any, before a read; errors when the hook
    /// fails or leaves the value released.
    fn ensure_available(&self) -> Result<()> {
        let Some(hook) = self.hook() else {
            return Ok(());
        };
        hook()?;
        if self.released.load(Ordering::Acquire) {
            return Err(Error::arg(
                "Parameter",
                format!(
                    "the fetch hook of the released parameter of shape {:?} did not restore it",
                    self.shape
                ),
            ));
        }
        Ok(())
    }

    /// The current value as it is, without fetching (empty while released).
    pub(crate) fn current(&self) -> Tensor {
        self.read().tensor().clone()
    }

    /// The current value for a backward node that saved it by reference.
    pub(crate) fn value_for_backward(&self) -> Result<Tensor> {
        self.ensure_available().map_err(|e| {
            Error::arg(
                "backward",
                format!(
                    "a node reads the parameter of shape {:?}, which is released: {e}",
                    self.shape
                ),
            )
        })?;
        Ok(self.read().tensor().clone())
    }

    /// Points the current leaf at this slot when a fetch hook is set (its
    /// ops then save it by reference), or clears the pointer.
    fn link(self: &Arc<Self>) {
        let by_ref = self.hook().is_some().then(|| Arc::downgrade(self));
        if let Some(e) = self.read().edge() {
            if let NodeKind::Leaf { by_ref: slot, .. } = &e.node.kind {
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = by_ref;
            }
        }
    }
}

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
    slot: Arc<Slot>,
}

impl Parameter {
    /// A parameter holding `tensor`, requiring a gradient.
    pub fn new(tensor: Tensor) -> Parameter {
        Parameter::wrap(Var::leaf(tensor))
    }

    fn wrap(var: Var) -> Parameter {
        Parameter {
            slot: Arc::new(Slot {
                shape: var.shape().to_vec(),
                var: RwLock::new(var),
                released: AtomicBool::new(false),
                fetch: RwLock::new(None),
            }),
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
        Ok(Parameter::wrap(var))
    }

    /// The current value as a leaf `Var` to compute with (a cheap clone
    /// sharing the tensor and the gradient key). The fetch hook, if any,
    /// runs first (a released parameter is fetched). Errors with the hook's
    /// error when it fails or leaves the value released.
    pub fn var(&self) -> Result<Var> {
        self.slot.ensure_available()?;
        Ok(self.read().clone())
    }

    /// The current value (a cheap clone sharing the storage), fetched
    /// first when released; errors as [`Parameter::var`].
    pub fn tensor(&self) -> Result<Tensor> {
        Ok(self.var()?.into_tensor())
    }

    /// The value as it is now, without running the fetch hook: empty
    /// (shape `[0]`) while released.
    pub fn current(&self) -> Tensor {
        self.slot.current()
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
        self.write().requires_grad_(requires)?;
        self.slot.link();
        Ok(())
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

    /// Replaces the value (PyTorch's `p.data = t`), keeping the id; a
    /// released parameter becomes available again. Errors, changing
    /// nothing, when the shape or dtype differ.
    pub fn set(&self, tensor: Tensor) -> Result<()> {
        let mut var = self.write();
        if tensor.shape() != self.slot.shape.as_slice() || tensor.dtype() != var.dtype() {
            return Err(Error::shape(
                "Parameter::set",
                format!(
                    "cannot replace a value of shape {:?} ({}) by one of shape {:?} ({})",
                    self.slot.shape,
                    var.dtype(),
                    tensor.shape(),
                    tensor.dtype()
                ),
            ));
        }
        *var.tensor_mut() = tensor;
        self.slot.released.store(false, Ordering::Release);
        Ok(())
    }

    /// Installs (`Some`) or removes (`None`) the hook run before every read
    /// of the value, which must fetch it back when released ([`FetchHook`]).
    /// While a hook is installed,
    /// ops that save this parameter for backward keep a reference to it
    /// instead of its value and read it when their backward runs, so
    /// releasing it frees the memory. Such a node reads the value current
    /// at backward time: the parameter must not be updated between a
    /// forward and its backward (PyTorch reports that as an error too).
    pub fn set_fetch_hook(&self, hook: Option<FetchHook>) {
        *self.slot.fetch.write().unwrap_or_else(|e| e.into_inner()) = hook;
        self.slot.link();
    }

    /// Frees the value, keeping shape, dtype, id and hooks (DeepSpeed's
    /// `param.data = empty` of ZeRO-3): the next read runs the fetch hook.
    /// Errors, changing nothing, when no fetch hook is installed (nothing
    /// could bring the value back).
    pub fn release_(&self) -> Result<()> {
        if self.slot.hook().is_none() {
            return Err(Error::arg(
                "Parameter::release_",
                format!(
                    "the parameter of shape {:?} has no fetch hook: its value could not be brought back",
                    self.slot.shape
                ),
            ));
        }
        let mut var = self.write();
        let empty = Tensor::zeros(&[0], var.dtype())?.to_device(var.device())?;
        *var.tensor_mut() = empty;
        self.slot.released.store(true, Ordering::Release);
        Ok(())
    }

    /// True while the value is released (see [`Parameter::release_`]).
    pub fn is_released(&self) -> bool {
        self.slot.released.load(Ordering::Acquire)
    }

    /// The value's shape (also while released).
    pub fn shape(&self) -> Vec<usize> {
        self.slot.shape.clone()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.slot.shape.len()
    }

    /// The number of elements (also while released).
    pub fn numel(&self) -> usize {
        self.slot.shape.iter().product()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.read().dtype()
    }

    /// True when `self` and `other` are handles to the same parameter.
    pub fn same(&self, other: &Parameter) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }

    fn read(&self) -> RwLockReadGuard<'_, Var> {
        self.slot.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Var> {
        self.slot.write()
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
        let before = p.tensor().unwrap().storage().as_bytes().as_ptr();
        p.update_::<f64, _>(|x| x.iter_mut().for_each(|v| *v *= 10.0))
            .unwrap();
        assert_eq!(
            p.tensor().unwrap().storage().as_bytes().as_ptr(),
            before,
            "updated in place"
        );
        assert_eq!(
            held_by_module.tensor().unwrap().to_vec::<f64>().unwrap(),
            vec![10.0, 20.0, 30.0]
        );
        assert_eq!(held_by_module.var().unwrap().id(), Some(id));

        // A value someone still holds is never changed by an update.
        let snapshot = p.tensor().unwrap();
        p.update_::<f64, _>(|x| x[0] = -1.0).unwrap();
        assert_eq!(snapshot.to_vec::<f64>().unwrap(), vec![10.0, 20.0, 30.0]);
        assert_eq!(
            p.tensor().unwrap().to_vec::<f64>().unwrap(),
            vec![-1.0, 20.0, 30.0]
        );
        assert!(p.update_::<f32, _>(|_| ()).is_err());

        p.set(snapshot).unwrap();
        assert_eq!(
            held_by_module.tensor().unwrap().to_vec::<f64>().unwrap(),
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

    /// The gradients of the input and of the parameter in `got` equal
    /// those in `want`.
    fn assert_same_grads(got: (&Gradients, &Var, &Parameter), want: (&Gradients, &Var, &Parameter)) {
        let values = |t: Option<&Tensor>| t.unwrap().to_vec::<f64>().unwrap();
        assert_eq!(values(got.0.get(got.1)), values(want.0.get(want.1)));
        assert_eq!(values(got.2.grad(got.0)), values(want.2.grad(want.0)));
    }

    /// The graph keeps a parameter with a fetch hook by reference: releasing
    /// it after forward frees its storage, and backward fetches it back and
    /// gives the same gradients as a parameter saved by value.
    #[test]
    fn a_released_parameter_is_freed_and_fetched_back_for_backward() {
        use std::sync::atomic::AtomicUsize;
        let values = vec![1.0f64, 2.0, -3.0, 0.5];
        let fresh = {
            let v = values.clone();
            move || Tensor::from_vec(v.clone(), &[2, 2]).unwrap()
        };
        let x = || Var::leaf(Tensor::from_vec(vec![1.0f64, -2.0, 0.25, 4.0], &[2, 2]).unwrap());
        let plain = Parameter::new(fresh());
        let (x0, p0) = (x(), plain.var().unwrap());
        let want = x0
            .linear(&p0, None)
            .unwrap()
            .square()
            .unwrap()
            .sum(&[], false)
            .unwrap()
            .backward()
            .unwrap();

        let p = Parameter::new(fresh());
        assert!(p.release_().is_err(), "no hook: the value could not come back");
        let fetches = Arc::new(AtomicUsize::new(0));
        let (q, n, make) = (p.clone(), fetches.clone(), fresh.clone());
        p.set_fetch_hook(Some(Arc::new(move || {
            if !q.is_released() {
                return Ok(());
            }
            n.fetch_add(1, Ordering::SeqCst);
            q.set(make())
        })));
        let x1 = x();
        let loss = x1
            .linear(&p.var().unwrap(), None)
            .unwrap()
            .square()
            .unwrap()
            .sum(&[], false)
            .unwrap();
        let storage = Arc::downgrade(p.tensor().unwrap().storage());
        p.release_().unwrap();
        assert!(p.is_released());
        assert_eq!(p.shape(), vec![2, 2]);
        assert!(
            storage.upgrade().is_none(),
            "the graph kept the released value alive"
        );
        let got = loss.backward().unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert!(!p.is_released());
        assert_same_grads((&got, &x1, &p), (&want, &x0, &plain));

        // A hook that fails makes the backward that needs the value fail.
        let x2 = x();
        let loss = x2
            .linear(&p.var().unwrap(), None)
            .unwrap()
            .sum(&[], false)
            .unwrap();
        p.set_fetch_hook(Some(Arc::new(|| Err(Error::io("fetch", "peer gone")))));
        p.release_().unwrap();
        let err = loss
            .backward()
            .err()
            .expect("the value cannot be fetched")
            .to_string();
        assert!(err.contains("peer gone") && err.contains("[2, 2]"), "{err}");

        // Without a hook the parameter is saved by value again.
        p.set_fetch_hook(Some(Arc::new({
            let (q, make) = (p.clone(), fresh.clone());
            move || q.set(make())
        })));
        p.set_fetch_hook(None);
        assert!(!p.var().unwrap().saved().is_reference());
    }

    /// Views of a parameter with a fetch hook (`t`, `narrow`, `reshape`,
    /// chains of them) are saved by reference too: releasing the parameter
    /// frees its storage, backward fetches it and rebuilds each view, and
    /// the gradients equal those of the same graph saved by value. Values
    /// computed from the parameter are still saved by value.
    #[test]
    fn views_of_a_released_parameter_are_rebuilt_for_backward() {
        let values: Vec<f64> = (0..12).map(|i| 0.25 * i as f64 - 1.0).collect();
        let fresh = {
            let v = values.clone();
            move || Tensor::from_vec(v.clone(), &[4, 3]).unwrap()
        };
        let x = || Var::leaf(Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 1.5, 0.25, -0.75], &[2, 3]).unwrap());
        let graph = |x: &Var, w: &Var| -> Var {
            let a = x.matmul(&w.t().unwrap()).unwrap();
            let b = x.linear(&w.narrow(0, 1, 2).unwrap(), None).unwrap();
            let c = x
                .matmul(&w.reshape([3, 4]).unwrap().narrow(1, 1, 2).unwrap())
                .unwrap();
            let d = x.matmul(&w.exp().unwrap().t().unwrap()).unwrap();
            [a, b, c, d]
                .iter()
                .map(|v| v.square().unwrap().sum(&[], false).unwrap())
                .reduce(|l, r| l.add(&r).unwrap())
                .unwrap()
        };
        let plain = Parameter::new(fresh());
        let x0 = x();
        let want = graph(&x0, &plain.var().unwrap()).backward().unwrap();

        let p = Parameter::new(fresh());
        let (q, make) = (p.clone(), fresh.clone());
        p.set_fetch_hook(Some(Arc::new(move || {
            if q.is_released() {
                q.set(make())
            } else {
                Ok(())
            }
        })));
        let w = p.var().unwrap();
        assert!(w.t().unwrap().saved().is_reference());
        assert!(w.narrow(0, 1, 2).unwrap().t().unwrap().saved().is_reference());
        assert!(
            !w.exp().unwrap().saved().is_reference(),
            "a computed value is not a view"
        );
        let x1 = x();
        let loss = graph(&x1, &w);
        drop(w);
        let storage = Arc::downgrade(p.tensor().unwrap().storage());
        p.release_().unwrap();
        assert!(
            storage.upgrade().is_none(),
            "the graph kept the released value alive through a view"
        );
        let got = loss.backward().unwrap();
        assert_same_grads((&got, &x1, &p), (&want, &x0, &plain));
    }
}
