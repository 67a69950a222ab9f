//! [`MemoryMeter`]: the tensor memory allocated by chosen threads, live and
//! at its peak, for measurements the process-wide [`crate::live_bytes`]
//! cannot make (one pipeline stage among several in one process).
//!
//! A thread that [`MemoryMeter::enter`]s a meter charges it with every CPU
//! storage buffer it allocates until the guard drops; the buffer gives its
//! bytes back to that meter when it is freed, on whatever thread. Buffers
//! allocated outside the scope are not counted, even when freed inside it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Live and peak bytes of the storage charged to one meter.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl Meter {
    /// Gives back `bytes` charged earlier.
    pub(crate) fn release(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Meter>>> = const { RefCell::new(None) };
}

/// Charges `bytes` to the meter this thread has entered, if any; the meter
/// to release them to when the buffer is freed.
pub(crate) fn charge(bytes: usize) -> Option<Arc<Meter>> {
    CURRENT.with(|c| {
        let m = c.borrow().clone()?;
        let live = m.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        m.peak.fetch_max(live, Ordering::Relaxed);
        Some(m)
    })
}

/// Counts the tensor memory allocated by the threads that enter it (see the
/// module docs). Cloning gives another handle to the same meter.
#[derive(Debug, Clone, Default)]
pub struct MemoryMeter(Arc<Meter>);

impl MemoryMeter {
    /// A meter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Charges this meter with the storage the current thread allocates
    /// until the guard drops (which restores the meter entered before, so
    /// scopes nest).
    pub fn enter(&self) -> MeterGuard {
        let previous = CURRENT.with(|c| c.replace(Some(self.0.clone())));
        MeterGuard {
            previous,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Bytes charged to this meter and not yet freed.
    pub fn live_bytes(&self) -> usize {
        self.0.live.load(Ordering::Relaxed)
    }

    /// The most bytes live at once since the meter was made or
    /// [`MemoryMeter::reset_peak`] was called.
    pub fn peak_bytes(&self) -> usize {
        self.0.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from the bytes live now.
    pub fn reset_peak(&self) {
        self.0.peak.store(self.live_bytes(), Ordering::Relaxed);
    }
}

/// The scope of [`MemoryMeter::enter`] on one thread.
#[must_use = "the meter counts only while the guard lives"]
pub struct MeterGuard {
    previous: Option<Arc<Meter>>,
    /// The scope belongs to the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for MeterGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    #[test]
    fn counts_what_its_threads_allocate_while_entered() {
        let m = MemoryMeter::new();
        let before = Tensor::zeros(&[1000], DType::F32).unwrap();
        let (a, b);
        {
            let _g = m.enter();
            a = Tensor::zeros(&[100], DType::F32).unwrap();
            b = Tensor::zeros(&[50], DType::F64).unwrap();
            // Another thread's allocations are not this scope's.
            std::thread::scope(|s| {
                s.spawn(|| Tensor::zeros(&[4096], DType::F32).unwrap());
            });
            drop(before);
        }
        assert_eq!(m.live_bytes(), 800);
        let c = Tensor::zeros(&[10], DType::F32).unwrap();
        assert_eq!(m.live_bytes(), 800, "allocated after the scope");
        drop(a);
        assert_eq!((m.live_bytes(), m.peak_bytes()), (400, 800));
        m.reset_peak();
        drop((b, c));
        assert_eq!((m.live_bytes(), m.peak_bytes()), (0, 400));
    }

    #[test]
    fn scopes_nest() {
        let (outer, inner) = (MemoryMeter::new(), MemoryMeter::new());
        let _o = outer.enter();
        let x = {
            let _i = inner.enter();
            Tensor::zeros(&[8], DType::F32).unwrap()
        };
        let y = Tensor::zeros(&[4], DType::F32).unwrap();
        assert_eq!((inner.live_bytes(), outer.live_bytes()), (32, 16));
        drop((x, y));
    }
}
