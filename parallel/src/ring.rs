//! Ring reduce-scatter, ring all-gather, and the all-reduce made of them
//! (spec §1.2, NCCL's ordering: rank r sends to r+1 and receives from r-1),
//! plus the small-message all-reduce that reproduces the ring's bits.
//!
//! **Fold order.** With `S` elements and `n` ranks, chunk `c` is
//! `[c·L, min((c+1)·L, S))` with `L = ceil(S/n)` (trailing chunks may be
//! short or empty). Its reduction is the left fold
//! `((x_{c+1} ⊕ x_{c+2}) ⊕ …) ⊕ x_c` over ranks taken mod n, starting at
//! `c+1`, each step rounded to the payload dtype; `Avg` then divides once.
//! The all-gather copies bits, so every rank holds the same result, and a
//! rerun gives it again: [`fold_reference`] rebuilds it sequentially.

use std::marker::PhantomData;
use std::ops::Range;

use crate::element::{accumulate, divide_all, reduce_into, CommElement, ReduceOp};
use crate::error::{CommError, Result};
use crate::frame::LoanHandle;
use crate::op::Op;

/// Chunk `c` of `s` elements split over `n` ranks (the ring's chunking).
pub fn ring_chunk(s: usize, n: usize, c: usize) -> Range<usize> {
    let l = s.div_ceil(n.max(1));
    let lo = (c * l).min(s);
    lo..(lo + l).min(s)
}

/// The all-reduce result the ring computes, folded sequentially in the
/// documented order from every rank's input (`inputs[k]` is rank k's):
/// a test oracle, bitwise equal to what every rank receives.
pub fn fold_reference<T: CommElement>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let n = inputs.len();
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    if n == 1 {
        return first.clone();
    }
    let xs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out = vec![T::ZERO; first.len()];
    fold_chunks(&xs, &mut out, op);
    out
}

/// Writes into `out` the ring fold of `xs` (one slice per rank).
fn fold_chunks<T: CommElement>(xs: &[&[T]], out: &mut [T], op: ReduceOp) {
    let n = xs.len();
    for c in 0..n {
        let range = ring_chunk(out.len(), n, c);
        let acc = &mut out[range.clone()];
        acc.copy_from_slice(&xs[(c + 1) % n][range.clone()]);
        for k in 2..=n {
            accumulate(acc, &xs[(c + k) % n][range.clone()], op);
        }
        if op == ReduceOp::Avg {
            divide_all(acc, n);
        }
    }
}

/// A buffer that this rank writes by regions while peers read other,
/// loaned regions of it.
pub(crate) struct Shared<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T> Shared<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// Reads `r`.
    ///
    /// # Safety
    /// No mutable slice of an overlapping range may be alive.
    pub unsafe fn get(&self, r: Range<usize>) -> &[T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "region {r:?} outside {} elements",
            self.len
        );
        // SAFETY: in bounds (checked); aliasing as the caller guarantees.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r.start), r.len()) }
    }

    /// Writes `r`.
    ///
    /// # Safety
    /// No other slice of an overlapping range may be alive, and no loan of
    /// an overlapping range may be outstanding.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_mut(&self, r: Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "region {r:?} outside {} elements",
            self.len
        );
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

/// The loans this rank has outstanding in one collective. Dropping the set
/// revokes or waits out every loan, so the memory is free afterwards.
#[derive(Default)]
pub(crate) struct Loans {
    list: Vec<(Range<usize>, usize, LoanHandle)>,
}

impl Loans {
    /// Records the loan of `range` to rank `to`.
    pub fn push(&mut self, range: Range<usize>, to: usize, h: LoanHandle) {
        if !h.is_settled() {
            self.list.push((range, to, h));
        }
    }

    /// Waits for every loan overlapping `range` to be read.
    pub fn settle_overlapping(&mut self, op: &Op<'_>, range: &Range<usize>) -> Result<()> {
        let mut i = 0;
        while i < self.list.len() {
            let (r, to, h) = &mut self.list[i];
            if r.start < range.end && range.start < r.end {
                op.settle(*to, r.len(), h)?;
                self.list.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Waits for every loan to be read.
    pub fn settle_all(&mut self, op: &Op<'_>) -> Result<()> {
        for (r, to, h) in &mut self.list {
            op.settle(*to, r.len(), h)?;
        }
        self.list.clear();
        Ok(())
    }
}

/// Sends region `seg` of `sh` to rank `to` and records the loan.
pub(crate) fn lend<T: CommElement>(
    op: &Op<'_>,
    sh: &Shared<'_, T>,
    loans: &mut Loans,
    to: usize,
    seg: Range<usize>,
) -> Result<()> {
    // SAFETY: the region is not written while loaned: every write below
    // first settles the overlapping loans, and `loans` settles or revokes
    // all of them before the buffer's borrow ends.
    let h = unsafe { op.send(to, seg.start, sh.get(seg.clone()))? };
    loans.push(seg, to, h);
    Ok(())
}

/// Receives piece `seg` from rank `from` and stores `f(dst, incoming)` into
/// region `seg` of `sh`.
pub(crate) fn recv_into<T: CommElement>(
    op: &Op<'_>,
    sh: &Shared<'_, T>,
    loans: &mut Loans,
    from: usize,
    seg: Range<usize>,
    f: impl FnOnce(&mut [T], &[T]),
) -> Result<()> {
    let frame = op.recv::<T>(from, seg.start, seg.len())?;
    loans.settle_overlapping(op, &seg)?;
    // SAFETY: overlapping loans are settled, and no other slice of `seg` is alive.
    op.read(from, &frame, |inc: &[T]| {
        f(unsafe { sh.get_mut(seg.clone()) }, inc)
    })
}

/// The reduce-scatter phase on `sh`, with `chunk(c)` the ranges: afterwards
/// chunk `op.r` holds the full reduction (before any `Avg` division).
pub(crate) fn rs_phase<T: CommElement>(
    op: &Op<'_>,
    sh: &Shared<'_, T>,
    loans: &mut Loans,
    chunk: &dyn Fn(usize) -> Range<usize>,
    rop: ReduceOp,
) -> Result<()> {
    let (n, r) = (op.n, op.r);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for seg in op.segments::<T>(chunk(prev)) {
        lend(op, sh, loans, next, seg)?;
    }
    for t in 1..n {
        let c = (r + 2 * n - 1 - t) % n;
        for seg in op.segments::<T>(chunk(c)) {
            recv_into(op, sh, loans, prev, seg.clone(), |dst, inc| {
                reduce_into(dst, inc, rop)
            })?;
            if t < n - 1 {
                lend(op, sh, loans, next, seg)?;
            }
        }
    }
    Ok(())
}

/// The all-gather phase on `sh`: chunk `op.r` is this rank's; afterwards
/// every chunk holds its owner's bits.
pub(crate) fn ag_phase<T: CommElement>(
    op: &Op<'_>,
    sh: &Shared<'_, T>,
    loans: &mut Loans,
    chunk: &dyn Fn(usize) -> Range<usize>,
) -> Result<()> {
    let (n, r) = (op.n, op.r);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for seg in op.segments::<T>(chunk(r)) {
        lend(op, sh, loans, next, seg)?;
    }
    for t in 1..n {
        let c = (r + n - t) % n;
        for seg in op.segments::<T>(chunk(c)) {
            recv_into(op, sh, loans, prev, seg.clone(), |dst, inc| {
                dst.copy_from_slice(inc)
            })?;
            if t < n - 1 {
                lend(op, sh, loans, next, seg)?;
            }
        }
    }
    Ok(())
}

/// Ring all-reduce in place: reduce-scatter, `Avg` division of the own
/// chunk, all-gather.
pub(crate) fn all_reduce<T: CommElement>(op: &Op<'_>, buf: &mut [T], rop: ReduceOp) -> Result<()> {
    let n = op.n;
    if n == 1 {
        return Ok(());
    }
    let s = buf.len();
    let sh = Shared::new(buf);
    let mut loans = Loans::default();
    let chunk = |c| ring_chunk(s, n, c);
    rs_phase(op, &sh, &mut loans, &chunk, rop)?;
    if rop == ReduceOp::Avg {
        // SAFETY: the own chunk is never loaned during the reduce-scatter.
        divide_all(unsafe { sh.get_mut(chunk(op.r)) }, n);
    }
    ag_phase(op, &sh, &mut loans, &chunk)?;
    loans.settle_all(op)
}

/// Small-message all-reduce: every rank sends its whole buffer to every
/// other rank (one round of latency instead of 2(n-1)) and folds locally in
/// the ring's order, so the bits equal [`all_reduce`]'s.
pub(crate) fn all_reduce_direct<T: CommElement>(op: &Op<'_>, buf: &mut [T], rop: ReduceOp) -> Result<()> {
    let (n, r) = (op.n, op.r);
    if n == 1 {
        return Ok(());
    }
    let s = buf.len();
    let sh = Shared::new(buf);
    let mut loans = Loans::default();
    for k in 1..n {
        lend(op, &sh, &mut loans, (r + k) % n, 0..s)?;
    }
    let mut frames = Vec::with_capacity(n - 1);
    for k in 1..n {
        let from = (r + n - k) % n;
        frames.push((from, op.recv::<T>(from, 0, s)?));
    }
    let mut out = vec![T::ZERO; s];
    {
        let guards = frames
            .iter()
            .map(|(from, f)| {
                f.acquire()
                    .map(|g| (*from, g))
                    .ok_or_else(|| withdrawn(op, *from))
            })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: the buffer is only read (here and by the peers) until the loans settle.
        let mut xs: Vec<&[T]> = vec![unsafe { sh.get(0..s) }; n];
        for (from, g) in &guards {
            xs[*from] = g.typed::<T>().ok_or_else(|| withdrawn(op, *from))?;
        }
        fold_chunks(&xs, &mut out, rop);
    }
    drop(frames);
    loans.settle_all(op)?;
    // SAFETY: all loans are settled.
    unsafe { sh.get_mut(0..s) }.copy_from_slice(&out);
    Ok(())
}

/// Ring reduce-scatter: `out = op over ranks of input_k[r·c .. (r+1)·c)`.
pub(crate) fn reduce_scatter<T: CommElement>(
    op: &Op<'_>,
    input: &[T],
    out: &mut [T],
    rop: ReduceOp,
) -> Result<()> {
    let (n, r, c) = (op.n, op.r, out.len());
    if input.len() != n * c {
        return Err(CommError::arg(
            op.name,
            format!(
                "input of {} elements is not {n} ranks × output of {c}",
                input.len()
            ),
        ));
    }
    if n == 1 {
        out.copy_from_slice(input);
        return Ok(());
    }
    let mut scratch = input.to_vec();
    {
        let sh = Shared::new(&mut scratch);
        let mut loans = Loans::default();
        rs_phase(op, &sh, &mut loans, &|k| k * c..(k + 1) * c, rop)?;
        loans.settle_all(op)?;
    }
    out.copy_from_slice(&scratch[r * c..(r + 1) * c]);
    if rop == ReduceOp::Avg {
        divide_all(out, n);
    }
    Ok(())
}

/// Ring all-gather: `out[k·c .. (k+1)·c) = input_k`.
pub(crate) fn all_gather<T: CommElement>(op: &Op<'_>, input: &[T], out: &mut [T]) -> Result<()> {
    let (n, r, c) = (op.n, op.r, input.len());
    if out.len() != n * c {
        return Err(CommError::arg(
            op.name,
            format!("output of {} elements is not {n} ranks × input of {c}", out.len()),
        ));
    }
    out[r * c..(r + 1) * c].copy_from_slice(input);
    if n == 1 {
        return Ok(());
    }
    let sh = Shared::new(out);
    let mut loans = Loans::default();
    ag_phase(op, &sh, &mut loans, &|k| k * c..(k + 1) * c)?;
    loans.settle_all(op)
}

fn withdrawn(op: &Op<'_>, from: usize) -> CommError {
    CommError::Aborted {
        op: op.name,
        rank: op.r,
        peer: from,
        msg: "the sender withdrew its message (it failed or timed out)".into(),
    }
}
