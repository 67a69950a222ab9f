//! The collectives that are not ring all-reduce pieces (spec §1.3):
//! broadcast (binomial tree for small messages, pipelined chain above),
//! reduce (ring reduce-scatter, then the chunks gathered at the root),
//! all-to-all (direct exchange) and the dissemination barrier.

use crate::element::{divide_all, CommElement, ReduceOp};
use crate::error::{CommError, Result};
use crate::op::Op;
use crate::ring::{lend, recv_into, ring_chunk, rs_phase, Loans, Shared};

fn check_root(op: &Op<'_>, root: usize) -> Result<()> {
    if root >= op.n {
        return Err(CommError::arg(
            op.name,
            format!("root {root} is outside the group of {} ranks", op.n),
        ));
    }
    Ok(())
}

/// Broadcast in place from `root`.
pub(crate) fn broadcast<T: CommElement>(op: &Op<'_>, buf: &mut [T], root: usize) -> Result<()> {
    check_root(op, root)?;
    let (n, r) = (op.n, op.r);
    if n == 1 {
        return Ok(());
    }
    let s = buf.len();
    let small = std::mem::size_of_val(buf) <= op.cfg().small_message_bytes;
    let sh = Shared::new(buf);
    let mut loans = Loans::default();
    // Virtual ranks put the root at 0.
    let vr = (r + n - root) % n;
    let real = |v: usize| (v + root) % n;
    if small {
        // Binomial tree (gloo `broadcast.cc`): in round i the ranks below
        // 2^i send to vr + 2^i, the next 2^i ranks receive.
        let mut mask = 1;
        while mask < n {
            if vr < mask {
                if vr + mask < n {
                    lend(op, &sh, &mut loans, real(vr + mask), 0..s)?;
                }
            } else if vr < 2 * mask {
                recv_into(op, &sh, &mut loans, real(vr - mask), 0..s, |d, inc| {
                    d.copy_from_slice(inc)
                })?;
            }
            mask <<= 1;
        }
    } else {
        // A chain root → root+1 → …, pipelined by segments.
        for seg in op.segments::<T>(0..s) {
            if vr != 0 {
                recv_into(op, &sh, &mut loans, real(vr - 1), seg.clone(), |d, inc| {
                    d.copy_from_slice(inc)
                })?;
            }
            if vr != n - 1 {
                lend(op, &sh, &mut loans, real(vr + 1), seg)?;
            }
        }
    }
    loans.settle_all(op)
}

/// Reduce to `root` in place; the other ranks' buffers are unchanged. The
/// ring reduce-scatter leaves chunk k reduced on rank k, which sends it to
/// the root, so the bits equal the all-reduce's.
pub(crate) fn reduce<T: CommElement>(op: &Op<'_>, buf: &mut [T], rop: ReduceOp, root: usize) -> Result<()> {
    check_root(op, root)?;
    let (n, r) = (op.n, op.r);
    if n == 1 {
        return Ok(());
    }
    let s = buf.len();
    let chunk = |c| ring_chunk(s, n, c);
    let mut scratch = if r == root { Vec::new() } else { buf.to_vec() };
    let target: &mut [T] = if r == root { buf } else { &mut scratch };
    let sh = Shared::new(target);
    let mut loans = Loans::default();
    rs_phase(op, &sh, &mut loans, &chunk, rop)?;
    if rop == ReduceOp::Avg {
        // SAFETY: the own chunk is never loaned during the reduce-scatter.
        divide_all(unsafe { sh.get_mut(chunk(r)) }, n);
    }
    if r == root {
        for k in (0..n).filter(|&k| k != root) {
            for seg in op.segments::<T>(chunk(k)) {
                recv_into(op, &sh, &mut loans, k, seg, |d, inc| d.copy_from_slice(inc))?;
            }
        }
    } else {
        for seg in op.segments::<T>(chunk(r)) {
            lend(op, &sh, &mut loans, root, seg)?;
        }
    }
    loans.settle_all(op)
}

/// All-to-all with equal blocks: block j of `input` goes to rank j, and
/// block k of `out` comes from rank k.
pub(crate) fn all_to_all<T: CommElement>(op: &Op<'_>, input: &[T], out: &mut [T]) -> Result<()> {
    let (n, r) = (op.n, op.r);
    if input.len() != out.len() || !input.len().is_multiple_of(n) {
        return Err(CommError::arg(
            op.name,
            format!(
                "input ({}) and output ({}) must have the same length, divisible by the group size {n}",
                input.len(),
                out.len()
            ),
        ));
    }
    let b = input.len() / n;
    out[r * b..(r + 1) * b].copy_from_slice(&input[r * b..(r + 1) * b]);
    if n == 1 {
        return Ok(());
    }
    // The input is only read, by us and by the peers, until the loans settle.
    let mut loans = Loans::default();
    for i in 1..n {
        let to = (r + i) % n;
        // SAFETY: `input` is borrowed immutably for the whole call and `loans`
        // settles or revokes every loan before returning.
        let h = unsafe { op.send(to, to * b, &input[to * b..(to + 1) * b])? };
        loans.push(to * b..(to + 1) * b, to, h);
    }
    for i in 1..n {
        let from = (r + n - i) % n;
        let frame = op.recv::<T>(from, r * b, b)?;
        op.read(from, &frame, |inc: &[T]| {
            out[from * b..(from + 1) * b].copy_from_slice(inc)
        })?;
    }
    loans.settle_all(op)
}

/// Dissemination barrier (gloo `barrier.cc`): ⌈log2 n⌉ rounds, in round d
/// an empty message to r+d and one from r-d.
pub(crate) fn barrier(op: &Op<'_>) -> Result<()> {
    let (n, r) = (op.n, op.r);
    let mut d = 1;
    while d < n {
        op.send_empty((r + d) % n, d)?;
        let frame = op.recv::<u8>((r + n - d) % n, d, 0)?;
        drop(frame);
        d <<= 1;
    }
    Ok(())
}
