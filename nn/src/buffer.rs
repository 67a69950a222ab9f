//! [`Buffer`]: non-trainable module state shared by handle (BatchNorm's
//! running statistics), PyTorch's `register_buffer`, persistent or not.

use std::sync::{Arc, RwLock};

use tessera_tensor::{Error, Result, Tensor};

/// A named piece of module state that is saved in the state dict but is not
/// trained (BatchNorm's `running_mean`, `running_var`,
/// `num_batches_tracked`). Clones share one value, so a module can update
/// it during `forward(&self)` and a checkpoint sees the update.
///
/// A non-persistent buffer (PyTorch's `register_buffer(...,
/// persistent=False)`, e.g. a relative-position index computed at
/// construction) belongs to the module but is left out of its state dict.
#[derive(Clone)]
pub struct Buffer {
    value: Arc<RwLock<Tensor>>,
    persistent: bool,
}

impl Buffer {
    /// A persistent buffer holding `tensor`.
    pub fn new(tensor: Tensor) -> Buffer {
        Buffer {
            value: Arc::new(RwLock::new(tensor)),
            persistent: true,
        }
    }

    /// A buffer holding `tensor` that is not saved in the state dict.
    pub fn non_persistent(tensor: Tensor) -> Buffer {
        Buffer {
            persistent: false,
            ..Buffer::new(tensor)
        }
    }

    /// True when the buffer is part of the state dict.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// The current value (a cheap clone sharing the storage).
    pub fn tensor(&self) -> Tensor {
        // A panic while the lock was held cannot leave the tensor half
        // replaced (it is replaced whole), so a poisoned lock is usable.
        self.value.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value. Errors, changing nothing, when the shape or dtype
    /// differ from the current value's.
    pub fn set(&self, tensor: Tensor) -> Result<()> {
        let mut v = self.value.write().unwrap_or_else(|e| e.into_inner());
        if v.shape() != tensor.shape() || v.dtype() != tensor.dtype() {
            return Err(Error::shape(
                "Buffer::set",
                format!(
                    "cannot replace a buffer of shape {:?} ({}) by one of shape {:?} ({})",
                    v.shape(),
                    v.dtype(),
                    tensor.shape(),
                    tensor.dtype()
                ),
            ));
        }
        *v = tensor;
        Ok(())
    }

    /// The value's shape.
    pub fn shape(&self) -> Vec<usize> {
        self.tensor().shape().to_vec()
    }

    /// True when `self` and `other` are handles to the same buffer.
    pub fn same(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.value, &other.value)
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?})", self.tensor())
    }
}
