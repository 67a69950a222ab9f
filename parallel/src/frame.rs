//! Messages between ranks: a fixed header plus a payload that is either an
//! owned buffer (point-to-point, aborts, everything a TCP reader receives)
//! or a *loan* of the sender's memory: collective pieces, which the
//! receiving rank (in-process) or the TCP writer thread reads where they
//! lie, so that no send copies into a staging buffer.
//!
//! A loan is safe because the sender keeps a [`LoanHandle`] for every loan
//! and never lets the loaned memory go (return from the collective, or
//! write the region) before the handle is settled: the reader reads the
//! bytes inside [`Frame::acquire`] only after moving the loan from
//! `Pending` to `Reading`, and a sender that gives up moves it from
//! `Pending` to `Revoked` (and waits out a `Reading` one, which is bounded
//! by a memcpy, or by the socket write timeout).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tessera_tensor::DType;

/// The kind of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A piece of a collective.
    Coll = 1,
    /// A point-to-point message.
    P2p = 2,
    /// "This group failed": the payload is the reason.
    Abort = 3,
}

/// Identifies every message; receivers check it field by field against
/// what they expect, so that ranks calling different collectives, dtypes
/// or lengths fail loudly instead of exchanging garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    /// The collective (`OpKind` code) or the point-to-point flavour.
    pub op: u8,
    /// The payload dtype code ([`dtype_code`]).
    pub dtype: u8,
    /// The reduce operator code, or 0.
    pub redop: u8,
    /// The group the message belongs to.
    pub group: u64,
    /// The collective's sequence number in its group, or the p2p tag.
    pub seq: u64,
    /// The element count of the whole call on the sender.
    pub total: u64,
    /// The element offset of this piece in the sender's buffer.
    pub offset: u64,
    /// A per-collective extra (root, round).
    pub aux: u64,
    /// The payload length in bytes.
    pub len: u64,
}

/// Bytes of an encoded header.
pub(crate) const HEADER_BYTES: usize = 56;
const MAGIC: u32 = 0x7E55_E2A0;

impl Header {
    /// The wire form (little-endian).
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.op;
        b[6] = self.dtype;
        b[7] = self.redop;
        for (i, v) in [self.group, self.seq, self.total, self.offset, self.aux, self.len]
            .into_iter()
            .enumerate()
        {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the wire form; `None` when the magic or the kind is wrong.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Option<Header> {
        let word = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
        if u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) != MAGIC {
            return None;
        }
        let kind = match b[4] {
            1 => Kind::Coll,
            2 => Kind::P2p,
            3 => Kind::Abort,
            _ => return None,
        };
        Some(Header {
            kind,
            op: b[5],
            dtype: b[6],
            redop: b[7],
            group: word(0),
            seq: word(1),
            total: word(2),
            offset: word(3),
            aux: word(4),
            len: word(5),
        })
    }
}

/// The wire code of a dtype.
pub(crate) fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// The dtype of a wire code (for messages), or `None` when invalid.
pub(crate) fn dtype_of_code(c: u8) -> Option<DType> {
    DType::ALL.get(c as usize).copied()
}

/// An owned payload, 8-byte aligned so that it can be viewed as any
/// payload element type. Buffers up to [`POOL_MAX_BYTES`] are recycled
/// through a small pool: a TCP receive of a ring segment then neither
/// allocates nor zeroes (fresh pages would fault on first touch).
#[derive(Default)]
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

/// Largest buffer the pool keeps.
const POOL_MAX_BYTES: usize = 16 << 20;
/// Most buffers the pool keeps.
const POOL_MAX_COUNT: usize = 64;
static POOL: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

impl AlignedBuf {
    /// A buffer of `len` bytes with unspecified (initialised) contents:
    /// callers overwrite all of it.
    pub fn scratch(len: usize) -> Self {
        let words = len.div_ceil(8);
        let pooled = if len <= POOL_MAX_BYTES {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            let best = (0..pool.len())
                .filter(|&i| pool[i].len() >= words)
                .min_by_key(|&i| pool[i].len());
            best.map(|i| pool.swap_remove(i))
        } else {
            None
        };
        let v = match pooled {
            Some(mut v) => {
                // Shrinking keeps the old (initialised) contents: no zeroing.
                v.truncate(words);
                v
            }
            // `vec!` of zeros allocates zeroed memory (fresh pages need no memset).
            None => vec![0; words],
        };
        AlignedBuf { words: v, len }
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Self {
        let mut b = Self::scratch(bytes.len());
        b.as_bytes_mut().copy_from_slice(bytes);
        b
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let words = self.words.len();
        if words == 0 || words * 8 > POOL_MAX_BYTES {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let v = std::mem::take(&mut self.words);
        if pool.len() < POOL_MAX_COUNT {
            pool.push(v);
        } else if let Some(i) = (0..pool.len()).min_by_key(|&i| pool[i].len()) {
            // A full pool keeps the largest buffers.
            if pool[i].len() < words {
                pool[i] = v;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoanStatus {
    Pending,
    Reading,
    Done,
    Revoked,
    Dropped,
}

pub(crate) struct LoanState {
    status: Mutex<LoanStatus>,
    cv: Condvar,
}

impl LoanState {
    fn lock(&self) -> MutexGuard<'_, LoanStatus> {
        // A poisoned lock only means a reader panicked; the status is still valid.
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn set(&self, s: LoanStatus) {
        *self.lock() = s;
        self.cv.notify_all();
    }
}

/// How a loan ended when it did not end well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoanFail {
    /// The receiver did not read it before the deadline (now revoked).
    Timeout,
    /// The receiver discarded it unread.
    Dropped,
}

/// The sender's side of a loan. Dropping it revokes an unread loan and
/// waits out a read in progress, so that the memory is free afterwards.
pub(crate) struct LoanHandle {
    state: Option<Arc<LoanState>>,
}

impl LoanHandle {
    /// A handle for a send that copied its payload (nothing to wait for).
    pub fn settled() -> Self {
        LoanHandle { state: None }
    }

    /// True when there is nothing left to wait for.
    pub fn is_settled(&self) -> bool {
        self.state.is_none()
    }

    /// Waits until the receiver has read the loan, or revokes it at `deadline`.
    pub fn wait(&mut self, deadline: Instant) -> Result<(), LoanFail> {
        let Some(state) = &self.state else { return Ok(()) };
        let mut st = state.lock();
        loop {
            match *st {
                LoanStatus::Done => break,
                LoanStatus::Dropped | LoanStatus::Revoked => return Err(LoanFail::Dropped),
                LoanStatus::Reading => {
                    st = state.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                LoanStatus::Pending => {
                    let now = Instant::now();
                    if now >= deadline {
                        *st = LoanStatus::Revoked;
                        return Err(LoanFail::Timeout);
                    }
                    st = state
                        .cv
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        drop(st);
        self.state = None;
        Ok(())
    }
}

impl Drop for LoanHandle {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            let mut st = state.lock();
            while *st == LoanStatus::Reading {
                st = state.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if *st == LoanStatus::Pending {
                *st = LoanStatus::Revoked;
            }
        }
    }
}

/// A message payload.
pub(crate) enum Payload {
    /// Bytes owned by the message.
    Owned(AlignedBuf),
    /// Bytes in the sender's memory, valid while the loan is `Pending` or `Reading`.
    Loan {
        ptr: *const u8,
        len: usize,
        state: Arc<LoanState>,
    },
}

// SAFETY: a loan's pointer is only dereferenced under the `Reading` status,
// which the sender waits out before the memory can go away (module docs).
unsafe impl Send for Payload {}

/// A header and its payload.
pub(crate) struct Frame {
    pub hdr: Header,
    pub payload: Payload,
}

impl Frame {
    /// A frame owning a copy of `bytes`.
    pub fn owned(mut hdr: Header, buf: AlignedBuf) -> Frame {
        hdr.len = buf.len as u64;
        Frame {
            hdr,
            payload: Payload::Owned(buf),
        }
    }

    /// A frame lending `bytes` to its receiver, and the handle the sender
    /// must keep while `bytes` stays borrowed.
    ///
    /// # Safety
    /// The memory behind `bytes` must stay valid and unwritten until the
    /// returned handle is waited on successfully or dropped.
    pub unsafe fn loan(mut hdr: Header, bytes: &[u8]) -> (Frame, LoanHandle) {
        hdr.len = bytes.len() as u64;
        let state = Arc::new(LoanState {
            status: Mutex::new(LoanStatus::Pending),
            cv: Condvar::new(),
        });
        let frame = Frame {
            hdr,
            payload: Payload::Loan {
                ptr: bytes.as_ptr(),
                len: bytes.len(),
                state: state.clone(),
            },
        };
        (frame, LoanHandle { state: Some(state) })
    }

    /// The payload bytes, held until the guard drops (which marks a loan
    /// read). `None` when the sender revoked the loan.
    pub fn acquire(&self) -> Option<FrameData<'_>> {
        match &self.payload {
            Payload::Owned(b) => Some(FrameData {
                bytes: b.as_bytes(),
                state: None,
            }),
            Payload::Loan { ptr, len, state, .. } => {
                let mut st = state.lock();
                if *st != LoanStatus::Pending {
                    return None;
                }
                *st = LoanStatus::Reading;
                // SAFETY: status `Reading` keeps the sender from releasing the memory.
                let bytes = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                Some(FrameData {
                    bytes,
                    state: Some(state),
                })
            }
        }
    }

    /// The payload as an owned buffer (copying a loan). `None` when revoked.
    pub fn into_owned(mut self) -> Option<AlignedBuf> {
        if let Payload::Owned(b) = &mut self.payload {
            return Some(std::mem::take(b));
        }
        let copy = self.acquire().map(|d| AlignedBuf::copy_of(d.bytes()));
        copy
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        if let Payload::Loan { state, .. } = &self.payload {
            let mut st = state.lock();
            if *st == LoanStatus::Pending {
                *st = LoanStatus::Dropped;
                state.cv.notify_all();
            }
        }
    }
}

/// Read access to a frame's payload; a loan counts as read when this drops.
pub(crate) struct FrameData<'f> {
    bytes: &'f [u8],
    state: Option<&'f Arc<LoanState>>,
}

impl FrameData<'_> {
    /// The payload bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// The payload as elements of `T`; `None` when the byte length is not a
    /// multiple of the element size or the bytes are misaligned for `T`.
    pub fn typed<T: bytemuck::Pod>(&self) -> Option<&[T]> {
        bytemuck::try_cast_slice(self.bytes).ok()
    }
}

impl Drop for FrameData<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.state {
            state.set(LoanStatus::Done);
        }
    }
}
