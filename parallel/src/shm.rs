//! The shared-memory all-reduce of ranks that live in one process
//! ([`crate::LocalGroup`]): every rank publishes its buffer, and the ranks
//! then reduce the buffers where they lie, tile by tile, writing each
//! reduced tile straight back into every rank's buffer. Each byte of every
//! buffer is read once and written once (the least any all-reduce can do),
//! there are no messages, no staging copies and no per-piece allocation.
//!
//! **Same bits as the ring.** Element `i` of chunk `c` (the ring's chunking,
//! [`ring_chunk`]) is folded `((x_{c+1} ⊕ x_{c+2}) ⊕ …) ⊕ x_c` over ranks
//! mod n, `Avg` dividing once at the end: exactly the ring's order, so the
//! result equals [`crate::fold_reference`] whichever thread computes a tile.
//!
//! **Work sharing.** Rank r first claims the tiles of chunk r, then helps
//! with the chunks of r+1, r+2, … (a claim is one atomic increment), so a
//! rank that the OS schedules late delays the call by at most the tile it
//! holds, not by its whole share.
//!
//! **Safety protocol.** Every collective call of a group (not only
//! all-reduce) *joins* a round keyed by (group, sequence number) with its
//! header, so ranks that disagree about the call find out at once. An
//! all-reduce round starts only when all n ranks joined with equal headers;
//! the last one to join marks it started, under the round's lock. Until
//! then any rank may cancel it (timeout, a peer gone, the group aborted),
//! after which nobody touches any buffer. Once started, no rank returns
//! before every tile is done (a tile takes microseconds and waits for
//! nothing), so no rank's buffer is reached after its call returns.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::element::{accumulate, divide_all, fold_into_both, CommElement, ReduceOp};
use crate::error::{CommError, Result};
use crate::frame::Header;
use crate::mailbox::RecvFail;
use crate::op::Op;
use crate::ring::ring_chunk;

/// Bytes of one tile of one buffer: the n tiles of a step stay in L2, so
/// the write-back of the result hits cache lines just read.
const TILE_BYTES: usize = 32 << 10;
/// How often a rank waiting for its peers checks for gone peers and aborts.
const POLL: Duration = Duration::from_millis(5);
/// How many times a waiting rank yields before it sleeps.
const SPINS: usize = 64;

/// The rounds of every group of one in-process world.
#[derive(Default)]
pub(crate) struct Registry {
    rounds: Mutex<HashMap<(u64, u64), Arc<Round>>>,
}

impl Registry {
    /// Records that this rank entered the collective `op` (which is not a
    /// shared-memory all-reduce): an `Err` when a peer already entered a
    /// different call with the same sequence number, and a peer waiting in
    /// a shared-memory all-reduce sees this rank's header and fails too.
    pub fn announce(&self, op: &Op<'_>) -> Result<()> {
        self.join(op, None).map(drop)
    }

    /// Joins the round of `op` with this rank's header and, for an
    /// all-reduce, the address of its buffer.
    fn join(&self, op: &Op<'_>, ptr: Option<usize>) -> Result<Arc<Round>> {
        let key = (op.comm.group, op.seq);
        let round = lock(&self.rounds)
            .entry(key)
            .or_insert_with(|| Arc::new(Round::new(op.n)))
            .clone();
        let mut st = round.lock();
        st.hdrs[op.r] = Some(op.header(0));
        st.ptrs[op.r] = ptr.unwrap_or(0);
        st.joined += 1;
        let all_here = st.joined == op.n;
        if all_here {
            // Every member holds the round now; nobody looks it up again.
            // (Lock order: a round's state, then the map; the map's holder
            // never takes a round's lock.)
            lock(&self.rounds).remove(&key);
        }
        if let Some(e) = mismatch(&st, op) {
            st.cancel(op.r, &e);
            drop(st);
            round.cv.notify_all();
            return Err(e);
        }
        if let Phase::Cancelled(who, why) = &st.phase {
            return Err(aborted(op, *who, why.clone()));
        }
        if all_here && ptr.is_some() {
            st.phase = Phase::Started;
            round.started.store(true, Ordering::Release);
        }
        drop(st);
        round.cv.notify_all();
        Ok(round)
    }
}

/// All-reduce in place through shared memory (module docs); bitwise equal
/// to the ring's result on every rank.
pub(crate) fn all_reduce<T: CommElement>(
    reg: &Registry,
    op: &Op<'_>,
    buf: &mut [T],
    rop: ReduceOp,
) -> Result<()> {
    let (n, s) = (op.n, buf.len());
    if n == 1 {
        return Ok(());
    }
    // From here on `buf` itself is not used: the peers and this rank reach
    // the memory through this address until the round is done.
    let ptr = buf.as_mut_ptr() as usize;
    let round = reg.join(op, Some(ptr))?;
    let ptrs = round.wait_start(op)?;
    let te = (TILE_BYTES / size_of::<T>()).max(1);
    let per_chunk = s.div_ceil(n).div_ceil(te);
    let total = n * per_chunk;
    for i in 0..n {
        let c = (op.r + i) % n;
        loop {
            let j = round.next[c].0.fetch_add(1, Ordering::Relaxed);
            if j >= per_chunk {
                break;
            }
            let chunk = ring_chunk(s, n, c);
            let lo = (chunk.start + j * te).min(chunk.end);
            let tile = lo..(lo + te).min(chunk.end);
            let guard = TileGuard { round: &round, total };
            if !round.poisoned.load(Ordering::Relaxed) {
                // SAFETY: the round started, so every `ptrs[k]` is the start
                // of rank k's live buffer of `s` elements (equal headers),
                // whose owner is inside this call and will not return before
                // every tile is done; tile `j` of chunk `c` was claimed by
                // this thread alone, and tiles are disjoint.
                unsafe { reduce_tile::<T>(&ptrs, c, tile, rop) };
            }
            drop(guard);
        }
    }
    round.wait_done(total);
    if round.poisoned.load(Ordering::Relaxed) {
        return Err(aborted(op, op.r, "a rank panicked while reducing".into()));
    }
    Ok(())
}

/// Reduces `tile` of chunk `c` of every rank's buffer in the ring's fold
/// order and stores the result into every buffer.
///
/// # Safety
/// `ptrs[k]` must point to rank k's buffer of `T`, valid for `tile`, and no
/// other thread may access `tile` of any of the buffers meanwhile.
unsafe fn reduce_tile<T: CommElement>(ptrs: &[usize], c: usize, tile: Range<usize>, rop: ReduceOp) {
    let n = ptrs.len();
    // SAFETY: as the caller guarantees; distinct ranks have distinct
    // buffers (each was a `&mut` borrow), so these slices never overlap.
    let part = |k: usize| unsafe {
        std::slice::from_raw_parts_mut((ptrs[k % n] as *mut T).add(tile.start), tile.len())
    };
    if n == 2 {
        fold_into_both(part(c + 1), part(c), rop, 2);
        return;
    }
    // The partial lives in rank c+1's tile: its input is only ever needed
    // as the fold's first operand.
    let acc = part(c + 1);
    for k in 2..=n {
        accumulate(acc, part(c + k), rop);
    }
    if rop == ReduceOp::Avg {
        divide_all(acc, n);
    }
    for k in 2..=n {
        part(c + k).copy_from_slice(acc);
    }
}

/// Counts a claimed tile as done when dropped. When the tile's reduction
/// panicked it poisons the round (the other ranks skip the remaining work)
/// and waits for the peers to finish theirs before unwinding goes on, so
/// that this rank's buffer is free when its call is left.
struct TileGuard<'a> {
    round: &'a Round,
    total: usize,
}

impl Drop for TileGuard<'_> {
    fn drop(&mut self) {
        let round = self.round;
        if std::thread::panicking() {
            round.poisoned.store(true, Ordering::Relaxed);
        }
        // Release: the tile's writes happen before whatever waits for done.
        if round.done.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
            let _st = round.lock();
            round.cv.notify_all();
        }
        if std::thread::panicking() {
            // The other ranks claim (and skip) every remaining tile, so
            // done reaches total.
            round.wait_done(self.total);
        }
    }
}

enum Phase {
    Gathering,
    Started,
    /// Rank (in the group) that cancelled, and why.
    Cancelled(usize, String),
}

struct State {
    hdrs: Vec<Option<Header>>,
    ptrs: Vec<usize>,
    joined: usize,
    phase: Phase,
}

impl State {
    /// Cancels a round that has not started (a started one runs to its end).
    fn cancel(&mut self, rank: usize, e: &CommError) {
        if matches!(self.phase, Phase::Gathering) {
            self.phase = Phase::Cancelled(rank, e.to_string());
        }
    }
}

/// A counter alone on its cache line (the claims of different chunks do
/// not contend).
#[repr(align(128))]
struct Padded(AtomicUsize);

/// One collective call of one group.
struct Round {
    state: Mutex<State>,
    cv: Condvar,
    /// Per chunk, the next tile to claim.
    next: Box<[Padded]>,
    /// Tiles done (or skipped after a panic).
    done: AtomicUsize,
    poisoned: AtomicBool,
    /// Mirrors `Phase::Started`, for waiting without the lock.
    started: AtomicBool,
}

impl Round {
    fn new(n: usize) -> Round {
        Round {
            state: Mutex::new(State {
                hdrs: vec![None; n],
                ptrs: vec![0; n],
                joined: 0,
                phase: Phase::Gathering,
            }),
            cv: Condvar::new(),
            next: (0..n).map(|_| Padded(AtomicUsize::new(0))).collect(),
            done: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
            started: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Waits until every rank joined (then returns their buffer addresses
    /// in rank order), or fails, cancelling the round, on a mismatch, a
    /// cancellation, a gone peer, an aborted group or the timeout.
    fn wait_start(&self, op: &Op<'_>) -> Result<Vec<usize>> {
        let deadline = crate::group::deadline_after(op.cfg().timeout);
        let mailbox = op.comm.transport.mailbox();
        // Peers usually arrive within microseconds: yield a few times
        // before sleeping (a wake-up costs more than the wait).
        for _ in 0..SPINS {
            if self.started.load(Ordering::Acquire) {
                break;
            }
            std::thread::yield_now();
        }
        let mut st = self.lock();
        loop {
            let fail = match &st.phase {
                Phase::Started => return Ok(st.ptrs.clone()),
                Phase::Cancelled(who, why) => return Err(aborted(op, *who, why.clone())),
                Phase::Gathering => mismatch(&st, op),
            };
            let missing = || (0..op.n).filter(|&k| st.hdrs[k].is_none());
            let fail = fail
                .or_else(|| {
                    mailbox
                        .aborted(op.comm.group)
                        .map(|(g, why)| (op.r, RecvFail::Aborted(g, why)))
                        .or_else(|| {
                            missing().find_map(|k| {
                                mailbox
                                    .closed(op.comm.members[k])
                                    .map(|why| (k, RecvFail::Closed(why)))
                            })
                        })
                        .map(|(k, f)| op.comm.recv_error(op.name, k, f, joining(op)))
                })
                .or_else(|| {
                    let k = missing().next().unwrap_or(op.r);
                    (Instant::now() >= deadline)
                        .then(|| op.comm.recv_error(op.name, k, RecvFail::Timeout, joining(op)))
                });
            if let Some(e) = fail {
                st.cancel(op.r, &e);
                drop(st);
                self.cv.notify_all();
                return Err(e);
            }
            let wait = POLL.min(deadline.saturating_duration_since(Instant::now()));
            st = self
                .cv
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until `total` tiles are done. Bounded without a deadline: the
    /// tiles still out are being reduced by running ranks.
    fn wait_done(&self, total: usize) {
        for _ in 0..SPINS {
            if self.done.load(Ordering::Acquire) >= total {
                return;
            }
            std::thread::yield_now();
        }
        let mut st = self.lock();
        while self.done.load(Ordering::Acquire) < total {
            st = self
                .cv
                .wait_timeout(st, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The first peer whose header differs from this rank's, as an error.
fn mismatch(st: &State, op: &Op<'_>) -> Option<CommError> {
    st.hdrs.iter().enumerate().find_map(|(k, h)| {
        let h = h.as_ref()?;
        op.header_diff(k, h, None).map(|msg| CommError::Mismatch {
            op: op.name,
            rank: op.r,
            peer: k,
            msg,
        })
    })
}

fn aborted(op: &Op<'_>, peer: usize, msg: String) -> CommError {
    CommError::Aborted {
        op: op.name,
        rank: op.r,
        peer,
        msg,
    }
}

fn joining(op: &Op<'_>) -> String {
    format!(
        "the ranks to join {} #{} of {} elements",
        op.name, op.seq, op.total
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a holder panicked; the data stays valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
