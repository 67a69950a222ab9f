//! [`Op`]: one collective call in progress, and the send/receive
//! primitives the algorithms talk through.

use std::ops::Range;

use crate::element::CommElement;
use crate::error::{CommError, Result};
use crate::frame::{dtype_of_code, AlignedBuf, Frame, Header, Kind, LoanFail, LoanHandle};
use crate::group::{CommConfig, CpuComm, OpKind};
use crate::mailbox::Channel;

/// One collective call in progress: what every message of it carries, and
/// the send/receive primitives the algorithms use (group ranks throughout).
pub(crate) struct Op<'c> {
    pub(crate) comm: &'c CpuComm,
    pub(crate) name: &'static str,
    pub(crate) kind: OpKind,
    pub(crate) seq: u64,
    pub(crate) dtype: u8,
    pub(crate) redop: u8,
    pub(crate) total: u64,
    pub(crate) aux: u64,
    /// The group size.
    pub(crate) n: usize,
    /// This rank in the group.
    pub(crate) r: usize,
}

impl Op<'_> {
    /// The configuration of the communicator.
    pub fn cfg(&self) -> &CommConfig {
        &self.comm.cfg
    }

    /// Segments of at most `max_segment_bytes` covering `range`; an empty
    /// range gives one empty segment, so that every step still exchanges a
    /// (tag-checked) message.
    pub fn segments<T>(&self, range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
        let step = (self.cfg().max_segment_bytes / size_of::<T>().max(1)).max(1);
        let (lo, hi) = (range.start, range.end);
        let count = (hi - lo).div_ceil(step).max(1);
        (0..count).map(move |i| (lo + i * step).min(hi)..(lo + (i + 1) * step).min(hi))
    }

    /// The header of this call's piece at `offset`.
    pub(crate) fn header(&self, offset: usize) -> Header {
        let kind = self.kind as u8;
        self.comm.header(
            Kind::Coll,
            kind,
            self.dtype,
            self.redop,
            self.seq,
            self.total,
            offset as u64,
            self.aux,
        )
    }

    /// Sends `data` (elements at `offset` of this rank's buffer) to rank `to`.
    ///
    /// # Safety
    /// On an in-process transport the receiver reads `data` where it lies:
    /// it must stay valid and unwritten until the returned handle is waited
    /// on or dropped.
    pub unsafe fn send<T: CommElement>(&self, to: usize, offset: usize, data: &[T]) -> Result<LoanHandle> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let (frame, handle) = if self.comm.transport.lends() {
            // SAFETY: forwarded to the caller.
            unsafe { Frame::loan(self.header(offset), bytes) }
        } else {
            (
                Frame::owned(self.header(offset), AlignedBuf::copy_of(bytes)),
                LoanHandle::settled(),
            )
        };
        self.comm
            .transport
            .send(self.comm.members[to], frame)
            .map_err(|msg| CommError::PeerClosed {
                op: self.name,
                rank: self.r,
                peer: to,
                msg,
            })?;
        Ok(handle)
    }

    /// Sends an empty message to rank `to` (barriers, zero-length steps).
    pub fn send_empty(&self, to: usize, offset: usize) -> Result<()> {
        let frame = Frame::owned(self.header(offset), AlignedBuf::default());
        self.comm
            .transport
            .send(self.comm.members[to], frame)
            .map_err(|msg| CommError::PeerClosed {
                op: self.name,
                rank: self.r,
                peer: to,
                msg,
            })
    }

    /// Receives the next message of this collective from rank `from` and
    /// checks that it is the piece `offset .. offset + len` of the same
    /// call (same collective, sequence number, dtype, operator, total
    /// length and root) that this rank expects.
    pub fn recv<T: tessera_tensor::Element>(&self, from: usize, offset: usize, len: usize) -> Result<Frame> {
        let deadline = crate::group::deadline_after(self.cfg().timeout);
        let what = || {
            format!(
                "{len} {} elements at offset {offset} of {} (collective #{})",
                T::DTYPE,
                self.total,
                self.seq
            )
        };
        let frame = self
            .comm
            .transport
            .mailbox()
            .recv(
                self.comm.members[from],
                self.comm.group,
                Channel::Coll,
                deadline,
                Some((self.seq, &|g, h| {
                    let k = self.comm.members.iter().position(|&m| m == g)?;
                    self.header_diff(k, h, None)
                })),
            )
            .map_err(|f| self.comm.recv_error(self.name, from, f, what()))?;
        let diff = self.header_diff(from, &frame.hdr, Some((offset, len * size_of::<T>())));
        match diff {
            Some(msg) => Err(CommError::Mismatch {
                op: self.name,
                rank: self.r,
                peer: from,
                msg,
            }),
            None => Ok(frame),
        }
    }

    /// What differs between the header `h` that rank `from` sent and this
    /// call's own (collective, sequence number, dtype, total length,
    /// operator, root; with `piece = Some((offset, bytes))` also the piece),
    /// or `None` when they agree.
    pub(crate) fn header_diff(
        &self,
        from: usize,
        h: &Header,
        piece: Option<(usize, usize)>,
    ) -> Option<String> {
        let mine = self.header(piece.map_or(0, |p| p.0));
        let dt = |c: u8| dtype_of_code(c).map_or("?".into(), |d| d.to_string());
        if OpKind::name(h.op) != self.name || h.seq != mine.seq {
            Some(format!(
                "rank {from} is in {} #{} while rank {} is in {} #{}",
                OpKind::name(h.op),
                h.seq,
                self.r,
                self.name,
                self.seq
            ))
        } else if h.dtype != mine.dtype {
            Some(format!(
                "dtype {} on rank {from} vs {} on rank {}",
                dt(h.dtype),
                dt(mine.dtype),
                self.r
            ))
        } else if h.total != mine.total {
            Some(format!(
                "{} elements on rank {from} vs {} on rank {}",
                h.total, mine.total, self.r
            ))
        } else if h.redop != mine.redop {
            Some(format!(
                "operator code {} on rank {from} vs {} on rank {}",
                h.redop, mine.redop, self.r
            ))
        } else if h.aux != mine.aux {
            Some(format!(
                "root {} on rank {from} vs root {} on rank {}",
                h.aux, mine.aux, self.r
            ))
        } else if h.op != mine.op {
            Some(format!(
                "rank {from} runs {} through another algorithm than rank {} (kind {} vs {}: different CommConfig?)",
                self.name, self.r, h.op, mine.op
            ))
        } else {
            let (offset, bytes) = piece?;
            (h.offset != mine.offset || h.len != bytes as u64).then(|| {
                format!(
                    "piece of {} bytes at offset {} from rank {from}, expected {bytes} bytes at offset {offset} \
                     (different max_segment_bytes?)",
                    h.len, h.offset
                )
            })
        }
    }

    /// Runs `f` on a received frame's elements.
    pub fn read<T: CommElement, R>(
        &self,
        from: usize,
        frame: &Frame,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        let lost = || CommError::Aborted {
            op: self.name,
            rank: self.r,
            peer: from,
            msg: "the sender withdrew its message (it failed or timed out)".into(),
        };
        let data = frame.acquire().ok_or_else(lost)?;
        let typed = data.typed::<T>().ok_or_else(lost)?;
        Ok(f(typed))
    }

    /// Waits until rank `to` has read the loan `h` of `len` elements.
    pub fn settle(&self, to: usize, len: usize, h: &mut LoanHandle) -> Result<()> {
        h.wait(crate::group::deadline_after(self.cfg().timeout))
            .map_err(|fail| match fail {
                LoanFail::Timeout => CommError::Timeout {
                    op: self.name,
                    rank: self.r,
                    peer: to,
                    timeout: self.cfg().timeout,
                    msg: format!("rank {to} to read {len} elements (collective #{})", self.seq),
                },
                LoanFail::Dropped => CommError::Aborted {
                    op: self.name,
                    rank: self.r,
                    peer: to,
                    msg: format!("rank {to} discarded {len} elements unread"),
                },
            })
    }
}
