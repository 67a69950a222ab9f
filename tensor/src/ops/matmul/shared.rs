//! The packed-operand buffers the tasks of one GEMM parallel region
//! share: each block (a row block of A, a panel of B) is packed by the
//! first task that claims it and read by every task after it is ready.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

/// A packed-operand buffer shared by the tasks of one parallel region,
/// split into blocks (fixed, disjoint element ranges): the first task that
/// needs a block packs it, and a task needing a block that another is
/// packing waits for it (a short wait: packing a block never blocks).
pub(super) struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    state: Vec<AtomicU8>,
    _buf: std::marker::PhantomData<&'a mut [T]>,
}

const EMPTY: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

// SAFETY: a block is written by the one task that moved its state from
// EMPTY to BUSY, and read only after its state is READY (release/acquire).
unsafe impl<T: Send + Sync> Sync for Shared<'_, T> {}

impl<'a, T> Shared<'a, T> {
    pub(super) fn new(buf: &'a mut [T], blocks: usize) -> Self {
        Shared {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            state: (0..blocks).map(|_| AtomicU8::new(EMPTY)).collect(),
            _buf: std::marker::PhantomData,
        }
    }

    /// Whether a task has claimed block `b` (to fill it, or filled it).
    pub(super) fn claimed(&self, b: usize) -> bool {
        self.state[b].load(Ordering::Relaxed) != EMPTY
    }

    /// Block `b`, the elements `range` of the buffer (the same range at
    /// every call for `b`), filled by `fill` unless another task did.
    pub(super) fn get(&self, b: usize, range: Range<usize>, fill: impl FnOnce(&mut [T])) -> &[T] {
        match self.claim(b, range) {
            Claim::Mine(mut packer) => {
                fill(packer.dst());
                packer.ready()
            }
            Claim::Ready(block) => block,
        }
    }

    /// The run of blocks from `blocks.start` that no other task has
    /// claimed, up to `blocks.end`, for the calling task to fill as one
    /// (`None` when the first is claimed already). Block `b` is the
    /// elements `range(b)`, which must follow each other in the buffer.
    pub(super) fn claim_run(
        &self,
        blocks: Range<usize>,
        range: impl Fn(usize) -> Range<usize>,
    ) -> Option<Packer<'_, 'a, T>> {
        let mut end = blocks.start;
        while end < blocks.end
            && self.state[end]
                .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Acquire)
                .is_ok()
        {
            end += 1;
        }
        // Built only when some block was won: a dropped `Packer` marks its
        // blocks failed.
        if end == blocks.start {
            return None;
        }
        let elems = range(blocks.start).start..range(end - 1).end;
        assert!(
            elems.start <= elems.end && elems.end <= self.len,
            "gemm: packed block outside its buffer"
        );
        Some(Packer {
            shared: self,
            blocks: blocks.start..end,
            range: elems,
        })
    }

    /// Block `b` as [`Shared::claim`] hands it out, without waiting:
    /// `None` while another task fills it.
    pub(super) fn try_claim(&self, b: usize, range: Range<usize>) -> Option<Claim<'_, 'a, T>> {
        if let Some(packer) = self.claim_run(b..b + 1, |_| range.clone()) {
            return Some(Claim::Mine(packer));
        }
        self.filled(b, range).map(Claim::Ready)
    }

    /// Block `b` when a task has filled it, `None` before (the block stays
    /// unclaimed).
    pub(super) fn filled(&self, b: usize, range: Range<usize>) -> Option<&[T]> {
        match self.state[b].load(Ordering::Acquire) {
            READY => {
                assert!(range.end <= self.len, "gemm: packed block outside its buffer");
                // SAFETY: in bounds, and READY: written once, never again
                // in this region.
                Some(unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) })
            }
            FAILED => panic!("gemm: packing a shared block panicked on another thread"),
            _ => None,
        }
    }

    /// Block `b`, the elements `range` of the buffer (the same range at
    /// every call for `b`): for the calling task to fill when no other task
    /// has claimed it, else once the task that did has filled it.
    pub(super) fn claim(&self, b: usize, range: Range<usize>) -> Claim<'_, 'a, T> {
        if let Some(packer) = self.claim_run(b..b + 1, |_| range.clone()) {
            return Claim::Mine(packer);
        }
        let mut spins = 0u32;
        loop {
            if let Some(block) = self.filled(b, range.clone()) {
                return Claim::Ready(block);
            }
            if spins < 256 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                // The packer may have been preempted on a busy machine.
                std::thread::yield_now();
            }
        }
    }
}

/// A block of a [`Shared`] buffer as [`Shared::claim`] hands it out.
pub(super) enum Claim<'s, 'a, T> {
    /// The calling task fills it.
    Mine(Packer<'s, 'a, T>),
    /// Filled by another task.
    Ready(&'s [T]),
}

/// The claim on a run of blocks to fill: dropped without [`Packer::ready`]
/// (the filling panicked), it marks them failed so that tasks waiting for
/// them panic instead of spinning forever.
pub(super) struct Packer<'s, 'a, T> {
    shared: &'s Shared<'a, T>,
    blocks: Range<usize>,
    range: Range<usize>,
}

impl<'s, T> Packer<'s, '_, T> {
    /// The blocks claimed.
    pub(super) fn blocks(&self) -> Range<usize> {
        self.blocks.clone()
    }

    /// The blocks' elements, to write.
    pub(super) fn dst(&mut self) -> &mut [T] {
        // SAFETY: in bounds (asserted by the claim); this task owns the
        // blocks while BUSY and nobody reads them before READY.
        unsafe { std::slice::from_raw_parts_mut(self.shared.ptr.add(self.range.start), self.range.len()) }
    }

    /// Marks the blocks filled and returns them.
    pub(super) fn ready(self) -> &'s [T] {
        let (shared, blocks, range) = (self.shared, self.blocks.clone(), self.range.clone());
        std::mem::forget(self);
        for b in blocks {
            shared.state[b].store(READY, Ordering::Release);
        }
        // SAFETY: in bounds; READY: written once, never again in this region.
        unsafe { std::slice::from_raw_parts(shared.ptr.add(range.start), range.len()) }
    }
}

impl<T> Drop for Packer<'_, '_, T> {
    fn drop(&mut self) {
        for b in self.blocks.clone() {
            self.shared.state[b].store(FAILED, Ordering::Release);
        }
    }
}
