//! Per-thread autograd mode: whether ops record, and the collector that
//! gradient checkpointing uses to find what a segment reads from outside.

use std::cell::{Cell, RefCell};

use crate::node::Edge;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static COLLECTOR: RefCell<Option<Vec<Edge>>> = const { RefCell::new(None) };
}

/// True when ops on this thread record themselves for backward.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with recording off on this thread (PyTorch's `torch.no_grad()`):
/// every `Var` it makes is a constant. The previous mode is restored even if
/// `f` panics.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = GradModeGuard::set(false);
    f()
}

/// Runs `f` with recording on (inside a `no_grad` scope, for example).
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = GradModeGuard::set(true);
    f()
}

/// Sets the grad mode of this thread until dropped, then restores the
/// previous one.
pub struct GradModeGuard {
    prev: bool,
}

impl GradModeGuard {
    /// Sets the mode to `enabled` and remembers the previous one.
    pub fn set(enabled: bool) -> Self {
        GradModeGuard {
            prev: GRAD_ENABLED.with(|g| g.replace(enabled)),
        }
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Runs `f` while collecting the graph edges of every op input that carries
/// one, and returns them with `f`'s result. Checkpointing runs a segment with
/// recording off inside this, to learn which outside values (parameters,
/// earlier activations) the segment reads.
pub(crate) fn collect_edges<R>(f: impl FnOnce() -> R) -> (R, Vec<Edge>) {
    /// Puts the enclosing collector back, also when `f` panics.
    struct Restore(Option<Vec<Edge>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            COLLECTOR.with(|c| *c.borrow_mut() = prev);
        }
    }
    let _restore = Restore(COLLECTOR.with(|c| c.replace(Some(Vec::new()))));
    let r = f();
    let edges = COLLECTOR.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, edges)
}

/// Notes `edge` if a collector is active on this thread.
pub(crate) fn note_edge(edge: &Edge) {
    COLLECTOR.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            if !v.iter().any(|e| e.same(edge)) {
                v.push(edge.clone());
            }
        }
    });
}
