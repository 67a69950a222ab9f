//! A rank's inbox: incoming frames queued per (source, group, channel),
//! with blocking, deadline-bounded receives that also fail fast when the
//! source is gone or the group was aborted.
//!
//! A receive that finds nothing first spins for at most [`SPIN`] watching
//! an arrival counter, and only then parks on the condition variable. A
//! parked thread takes tens of microseconds to wake; in a balanced
//! pipeline the next message usually arrives within microseconds of the
//! receive (the neighbour stage finishes its pass at about the same time),
//! so the spin removes that latency from every hop of the critical path.
//! The spin is bounded per receive, so a receiver that waits long costs at
//! most [`SPIN`] of CPU before it sleeps.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::frame::{Frame, Header, Kind};

/// Which stream of messages from one source within one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    /// The group's collectives (strictly ordered).
    Coll,
    /// Point-to-point messages with this tag.
    P2p(u64),
}

/// Why a receive failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecvFail {
    /// Nothing arrived before the deadline.
    Timeout,
    /// The source is gone; the reason.
    Closed(String),
    /// A rank aborted the group: that rank (global) and its reason.
    Aborted(usize, String),
    /// Another source (global rank) sent a piece of the same call whose
    /// header disagrees with this rank's; what differs.
    Mismatch(usize, String),
}

/// Checks the headers of frames that other sources sent for the call being
/// received: `(sequence number, f)` where `f(global source, header)` says
/// what differs from the receiver's own call, if anything.
pub(crate) type Peek<'a> = (u64, &'a dyn Fn(usize, &Header) -> Option<String>);

#[derive(Default)]
struct State {
    queues: HashMap<(usize, u64, Channel), VecDeque<Frame>>,
    closed: HashMap<usize, String>,
    /// Sources whose every frame has been delivered (their stream ended).
    drained: std::collections::HashSet<usize>,
    aborted: HashMap<u64, (usize, String)>,
    /// The owner is gone: frames pushed from now on are refused.
    shut: bool,
}

/// The most time one receive spins before it parks.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// The inbox of one rank.
#[derive(Default)]
pub(crate) struct Mailbox {
    state: Mutex<State>,
    cv: Condvar,
    /// Bumped after every change a receiver may be waiting for (a frame, a
    /// closed peer, an abort), so a spinning receiver sees it without the
    /// lock.
    arrivals: AtomicU64,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells spinning and parked receivers that the state changed.
    fn wake(&self) {
        self.arrivals.fetch_add(1, Ordering::Release);
        self.cv.notify_all();
    }

    /// Spins until the arrival counter moves past `seen` or `until`
    /// passes; true when it moved. Yields now and then, so that on a
    /// loaded machine the spinning thread does not keep the sender (or
    /// anyone else) off the core.
    fn spin(&self, seen: u64, until: Instant) -> bool {
        let mut k = 0u32;
        loop {
            if self.arrivals.load(Ordering::Acquire) != seen {
                return true;
            }
            k = k.wrapping_add(1);
            if k.is_multiple_of(64) {
                if Instant::now() >= until {
                    return false;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Delivers a frame from global rank `src`; false (the frame dropped,
    /// which settles a loan as unread) when the owner has shut the mailbox.
    pub fn push(&self, src: usize, frame: Frame) -> bool {
        let mut st = self.lock();
        if st.shut {
            drop(st);
            drop(frame);
            return false;
        }
        match frame.hdr.kind {
            Kind::Abort => {
                // `aux` names the rank whose failure started the abort; `src`
                // may only be relaying it.
                let (group, origin) = (frame.hdr.group, frame.hdr.aux as usize);
                let reason = frame
                    .into_owned()
                    .map(|b| String::from_utf8_lossy(b.as_bytes()).into_owned())
                    .unwrap_or_default();
                st.aborted.entry(group).or_insert((origin, reason));
            }
            Kind::Coll => {
                st.queues
                    .entry((src, frame.hdr.group, Channel::Coll))
                    .or_default()
                    .push_back(frame);
            }
            Kind::P2p => {
                let key = (src, frame.hdr.group, Channel::P2p(frame.hdr.seq));
                st.queues.entry(key).or_default().push_back(frame);
            }
        }
        drop(st);
        self.wake();
        true
    }

    /// Marks global rank `src` as gone: receives from it that find no
    /// queued frame fail with `reason`.
    pub fn close_peer(&self, src: usize, reason: &str) {
        self.lock()
            .closed
            .entry(src)
            .or_insert_with(|| reason.to_string());
        self.wake();
    }

    /// Marks global rank `src` as gone after its last frame was delivered
    /// (its stream ended): [`Mailbox::wait_drained`] returns from then on.
    pub fn end_of_stream(&self, src: usize, reason: &str) {
        let mut st = self.lock();
        st.closed.entry(src).or_insert_with(|| reason.to_string());
        st.drained.insert(src);
        drop(st);
        self.wake();
    }

    /// Waits until every frame global rank `src` sent has been delivered
    /// (its stream ended) or `deadline` passes; true in the first case. A
    /// send that failed because the peer hung up may race the peer's last
    /// frames (an abort notice saying why), still unread in the socket.
    pub fn wait_drained(&self, src: usize, deadline: Instant) -> bool {
        let mut st = self.lock();
        loop {
            if st.drained.contains(&src) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits for the next frame from global rank `src` on `(group, channel)`.
    /// With `peek`, a frame of the same call queued from another source
    /// that disagrees with it ends the wait at once (ranks that disagree
    /// about a broadcast's root may never send to each other).
    pub fn recv(
        &self,
        src: usize,
        group: u64,
        channel: Channel,
        deadline: Instant,
        peek: Option<Peek<'_>>,
    ) -> Result<Frame, RecvFail> {
        let key = (src, group, channel);
        let spin_until = Instant::now() + SPIN;
        let mut st = self.lock();
        loop {
            if let Some(f) = st.queues.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(f);
            }
            if channel == Channel::Coll {
                if let Some((who, why)) = st.aborted.get(&group) {
                    return Err(RecvFail::Aborted(*who, why.clone()));
                }
            }
            if let Some(why) = st.closed.get(&src) {
                return Err(RecvFail::Closed(why.clone()));
            }
            if let Some((seq, differs)) = peek {
                let other = st
                    .queues
                    .iter()
                    .filter(|(k, _)| k.0 != src && k.1 == group && k.2 == Channel::Coll)
                    .flat_map(|(k, q)| q.iter().map(move |f| (k.0, &f.hdr)))
                    .filter(|(_, h)| h.seq == seq)
                    .find_map(|(from, h)| differs(from, h).map(|msg| (from, msg)));
                if let Some((from, msg)) = other {
                    return Err(RecvFail::Mismatch(from, msg));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RecvFail::Timeout);
            }
            if now < spin_until {
                // Read under the lock: any later change bumps the counter.
                let seen = self.arrivals.load(Ordering::Acquire);
                drop(st);
                self.spin(seen, spin_until.min(deadline));
                st = self.lock();
                continue;
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The rank (global) that aborted `group` and its reason, if one did.
    pub fn aborted(&self, group: u64) -> Option<(usize, String)> {
        self.lock().aborted.get(&group).cloned()
    }

    /// Why global rank `src` is gone, if it is.
    pub fn closed(&self, src: usize) -> Option<String> {
        self.lock().closed.get(&src).cloned()
    }

    /// Drops every queued collective frame of `group` (after a failure, so
    /// that loans go back to their senders at once).
    pub fn discard_group(&self, group: u64) {
        let dropped: Vec<VecDeque<Frame>> = {
            let mut st = self.lock();
            let keys: Vec<_> = st
                .queues
                .keys()
                .filter(|k| k.1 == group && k.2 == Channel::Coll)
                .copied()
                .collect();
            keys.into_iter().filter_map(|k| st.queues.remove(&k)).collect()
        };
        drop(dropped);
    }

    /// Drops every queued frame and refuses later ones (the rank is going
    /// away: loans go back to their senders at once, and a sender racing
    /// the shutdown learns that its frame was refused instead of leaving a
    /// loan nobody will read).
    pub fn shut(&self) {
        let queues = {
            let mut st = self.lock();
            st.shut = true;
            std::mem::take(&mut st.queues)
        };
        drop(queues);
    }
}
