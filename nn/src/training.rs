//! [`Training`]: a module's train/eval flag, reached by `train()`/`eval()`
//! through the module tree.

use std::sync::atomic::{AtomicBool, Ordering};

/// The training-mode flag of a module (PyTorch's `self.training`). A
/// `#[derive(Module)]` struct with a `Training` field is switched by
/// [`crate::Module::train`] and [`crate::Module::eval`] on it or on any
/// ancestor: the derive visits the flag like a parameter, so no hand-written
/// list can leave it out.
///
/// New flags are on (training mode), as new PyTorch modules are. Clones
/// copy the current value; they do not share it.
#[derive(Debug)]
pub struct Training(AtomicBool);

impl Training {
    /// A flag set to `on`.
    pub fn new(on: bool) -> Training {
        Training(AtomicBool::new(on))
    }

    /// True in training mode.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the mode. It takes `&self` so that a walk over shared
    /// references reaches every flag; [`crate::Module::train`] itself takes
    /// `&mut self`, so the mode does not change under a running forward.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

impl Default for Training {
    /// Training mode.
    fn default() -> Self {
        Training::new(true)
    }
}

impl Clone for Training {
    fn clone(&self) -> Self {
        Training::new(self.get())
    }
}
