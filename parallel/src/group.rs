//! [`CpuComm`]: a communicator over a CPU transport (threads or TCP) that
//! runs tessera's own collective algorithms, and the per-call context the
//! algorithms talk through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_tensor::DType;

use crate::comm::Communicator;
use crate::element::{Buf, BufMut, CommElement, ReduceOp};
use crate::error::{CommError, Result};
use crate::frame::{dtype_code, dtype_of_code, AlignedBuf, Frame, Header, Kind};
use crate::mailbox::{Channel, Mailbox, RecvFail};
use crate::op::Op;
use crate::shm::{self, Registry};
use crate::{collectives, ring, with_buf};

/// Moves frames between the ranks of one world (all groups share it).
pub(crate) trait Transport: Send + Sync {
    /// The backend's name.
    fn backend(&self) -> &'static str;
    /// Delivers `frame` to global rank `to`; `Err(reason)` when it is gone.
    fn send(&self, to: usize, frame: Frame) -> std::result::Result<(), String>;
    /// True when collective pieces may be sent as loans of the sender's
    /// memory (read in place by the receiver or by a writer thread).
    fn lends(&self) -> bool;
    /// The shared-memory rounds of an in-process world (`None` elsewhere).
    fn shm(&self) -> Option<&Registry> {
        None
    }
    /// This rank's inbox.
    fn mailbox(&self) -> &Mailbox;
}

/// Tuning and fault-tolerance settings of a CPU communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct CommConfig {
    /// The longest any single wait may take (a receive, a peer reading a
    /// send); past it the call fails with [`CommError::Timeout`] and the
    /// group is aborted. Default 300 s.
    pub timeout: Duration,
    /// Ring chunks travel in segments of at most this many bytes, so that
    /// the next rank reduces one segment while the following one is on the
    /// wire. Default 1 MiB (gloo's `kMaxSegmentSize`).
    pub max_segment_bytes: usize,
    /// All-reduces and broadcasts of at most this many bytes take the
    /// latency-bound path (direct exchange / binomial tree) instead of the
    /// ring; both give the same bits. Default 32 KiB. (Does not apply to
    /// the shared-memory all-reduce, which serves every size.)
    pub small_message_bytes: usize,
    /// On an in-process transport ([`crate::LocalGroup`]), all-reduce
    /// reduces the ranks' buffers where they lie (no messages, each byte
    /// read and written once); `false` takes the message-passing
    /// algorithms instead, as over TCP. Both give the same bits. Default true.
    pub shared_memory: bool,
}

/// The instant `timeout` from now, saturating far in the future (a century
/// on) for timeouts such as `Duration::MAX` that no `Instant` can reach.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    Instant::now() + timeout.min(CENTURY)
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: Duration::from_secs(300),
            max_segment_bytes: 1 << 20,
            small_message_bytes: 32 << 10,
            shared_memory: true,
        }
    }
}

/// A communicator whose collectives are tessera's own algorithms (ring
/// reduce-scatter + all-gather with a fixed fold order, spec §1.2) over an
/// in-process ([`crate::LocalGroup`]) or TCP ([`crate::tcp`]) transport.
pub struct CpuComm {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) group: u64,
    pub(crate) members: Arc<[usize]>,
    pub(crate) rank: usize,
    pub(crate) cfg: CommConfig,
    seq: AtomicU64,
    splits: AtomicU64,
    failure: Mutex<Option<(usize, String)>>,
}

/// The collectives, as they travel in headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce = 1,
    AllReduceSmall = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    Reduce = 6,
    AllToAll = 7,
    Barrier = 8,
    /// All-reduce in shared memory (in-process ranks).
    AllReduceShm = 9,
}

impl OpKind {
    pub(crate) fn name(code: u8) -> &'static str {
        match code {
            1 | 2 | 9 => "all_reduce",
            3 => "reduce_scatter",
            4 => "all_gather",
            5 => "broadcast",
            6 => "reduce",
            7 => "all_to_all",
            8 => "barrier",
            _ => "an unknown collective",
        }
    }
}

/// What every message of one collective call carries.
struct Call {
    name: &'static str,
    kind: OpKind,
    dtype: DType,
    redop: Option<ReduceOp>,
    total: usize,
    aux: u64,
}

/// Point-to-point flavours, as they travel in headers.
/// How long a rank that lost a peer waits for the rest of that peer's
/// stream (an abort notice naming the real failure) before reporting the
/// lost connection itself.
const ROOT_CAUSE_GRACE: Duration = Duration::from_secs(2);

const P2P_BYTES: u8 = 0;
const P2P_SLICE: u8 = 1;

impl CpuComm {
    /// The world group of `transport`: global rank `rank` of `size`.
    pub(crate) fn world(transport: Arc<dyn Transport>, rank: usize, size: usize, cfg: CommConfig) -> CpuComm {
        CpuComm {
            transport,
            group: 0,
            members: (0..size).collect(),
            rank,
            cfg,
            seq: AtomicU64::new(0),
            splits: AtomicU64::new(0),
            failure: Mutex::new(None),
        }
    }

    /// The settings this communicator runs with.
    pub fn config(&self) -> &CommConfig {
        &self.cfg
    }

    /// The global ranks of this group's members, in group-rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// [`Communicator::split`] returning the concrete type.
    pub fn split_group(&self, color: Option<u32>, key: i64) -> Result<Option<CpuComm>> {
        let n = self.members.len();
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * n];
        self.all_gather_buf(Buf::I64(&mine), BufMut::I64(&mut all))
            .map_err(|e| e.in_op("split"))?;
        let split_no = self.splits.fetch_add(1, Ordering::Relaxed);
        let Some(color) = color else { return Ok(None) };
        let mut ranks: Vec<usize> = (0..n).filter(|&k| all[2 * k] == i64::from(color)).collect();
        ranks.sort_by_key(|&k| (all[2 * k + 1], k));
        let rank = ranks.iter().position(|&k| k == self.rank).unwrap_or(0);
        Ok(Some(CpuComm {
            transport: self.transport.clone(),
            group: mix(&[self.group, split_no, u64::from(color)]),
            members: ranks.iter().map(|&k| self.members[k]).collect(),
            rank,
            cfg: self.cfg.clone(),
            seq: AtomicU64::new(0),
            splits: AtomicU64::new(0),
            failure: Mutex::new(None),
        }))
    }

    /// Runs one collective: refuses when the group already failed, numbers
    /// the call, and aborts the group when the body fails.
    fn collective(&self, call: Call, body: impl FnOnce(&Op<'_>) -> Result<()>) -> Result<()> {
        let Call {
            name,
            kind,
            dtype,
            redop,
            total,
            aux,
        } = call;
        if let Some((peer, msg)) = self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(CommError::Aborted {
                op: name,
                rank: self.rank,
                peer,
                msg,
            });
        }
        let op = Op {
            comm: self,
            name,
            kind,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            dtype: dtype_code(dtype),
            redop: redop.map_or(0xff, ReduceOp::code),
            total: total as u64,
            aux,
            n: self.members.len(),
            r: self.rank,
        };
        // In-process ranks check that they agree on the call before any
        // data moves (the shared-memory all-reduce checks as it joins).
        let agreed = match self.transport.shm() {
            Some(reg) if kind != OpKind::AllReduceShm => reg.announce(&op),
            _ => Ok(()),
        };
        let res = agreed.and_then(|_| body(&op)).map_err(|e| self.root_cause(e));
        if let Err(e) = &res {
            self.fail(e);
        }
        res
    }

    /// A peer that closed its connection after another rank aborted the
    /// group left because of that abort: report the abort, which says what
    /// went wrong, rather than the closed connection. The abort notice may
    /// still be in flight behind the hang-up (a failed send notices first),
    /// so the peer's stream is read to its end, for at most
    /// [`ROOT_CAUSE_GRACE`], before deciding.
    fn root_cause(&self, e: CommError) -> CommError {
        let CommError::PeerClosed { op, rank, peer, .. } = e else {
            return e;
        };
        let mailbox = self.transport.mailbox();
        if let Some(&g) = self.members.get(peer) {
            mailbox.wait_drained(g, Instant::now() + ROOT_CAUSE_GRACE);
        }
        match mailbox.aborted(self.group) {
            Some((g, msg)) => CommError::Aborted {
                op,
                rank,
                peer: self.members.iter().position(|&m| m == g).unwrap_or(rank),
                msg,
            },
            None => e,
        }
    }

    /// Marks the group failed and tells every other member, so that their
    /// pending and later calls fail at once rather than at their timeout.
    fn fail(&self, e: &CommError) {
        let (peer, msg) = match e {
            CommError::Aborted { peer, msg, .. } => (*peer, msg.clone()),
            e => (self.rank, e.to_string()),
        };
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.is_some() {
            return;
        }
        *failure = Some((peer, msg.clone()));
        drop(failure);
        // The notice names the rank whose failure started the abort (global
        // rank in `aux`), so a relayed notice still points at its origin.
        let origin = self.members.get(peer).copied().unwrap_or(self.members[self.rank]);
        for (k, &g) in self.members.iter().enumerate() {
            if k != self.rank {
                let hdr = self.header(Kind::Abort, 0, 0, 0, 0, 0, 0, origin as u64);
                // Best effort: a peer that is gone needs no notice.
                let _ = self
                    .transport
                    .send(g, Frame::owned(hdr, AlignedBuf::copy_of(msg.as_bytes())));
            }
        }
        self.transport.mailbox().discard_group(self.group);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn header(
        &self,
        kind: Kind,
        op: u8,
        dtype: u8,
        redop: u8,
        seq: u64,
        total: u64,
        offset: u64,
        aux: u64,
    ) -> Header {
        Header {
            kind,
            op,
            dtype,
            redop,
            group: self.group,
            seq,
            total,
            offset,
            aux,
            len: 0,
        }
    }

    /// The global rank of group rank `peer`, or an error naming `op`.
    fn peer(&self, op: &'static str, peer: usize) -> Result<usize> {
        if peer == self.rank {
            return Err(CommError::arg(
                op,
                format!("rank {peer} cannot exchange messages with itself"),
            ));
        }
        self.members.get(peer).copied().ok_or_else(|| {
            CommError::arg(
                op,
                format!("rank {peer} is outside the group of {} ranks", self.members.len()),
            )
        })
    }

    /// Sends `bytes` (elements of `dtype`) to `dst` with a user tag.
    fn p2p_send(
        &self,
        op: &'static str,
        flavour: u8,
        dtype: DType,
        bytes: &[u8],
        dst: usize,
        tag: u64,
    ) -> Result<()> {
        let count = bytes.len() / dtype.size_in_bytes();
        let g = self.peer(op, dst)?;
        let hdr = self.header(Kind::P2p, flavour, dtype_code(dtype), 0, tag, count as u64, 0, 0);
        self.transport
            .send(g, Frame::owned(hdr, AlignedBuf::copy_of(bytes)))
            .map_err(|msg| CommError::PeerClosed {
                op,
                rank: self.rank,
                peer: dst,
                msg,
            })
    }

    fn p2p_recv(&self, op: &'static str, src: usize, tag: u64) -> Result<Frame> {
        let g = self.peer(op, src)?;
        let deadline = deadline_after(self.cfg.timeout);
        self.transport
            .mailbox()
            .recv(g, self.group, Channel::P2p(tag), deadline, None)
            .map_err(|f| self.recv_error(op, src, f, format!("message with tag {tag}")))
    }

    pub(crate) fn recv_error(
        &self,
        op: &'static str,
        peer: usize,
        fail: RecvFail,
        what: String,
    ) -> CommError {
        let rank = self.rank;
        match fail {
            RecvFail::Timeout => CommError::Timeout {
                op,
                rank,
                peer,
                timeout: self.cfg.timeout,
                msg: what,
            },
            RecvFail::Closed(msg) => CommError::PeerClosed {
                op,
                rank,
                peer,
                msg: format!("{msg} (awaiting {what})"),
            },
            RecvFail::Aborted(g, msg) => {
                let peer = self.members.iter().position(|&m| m == g).unwrap_or(peer);
                CommError::Aborted { op, rank, peer, msg }
            }
            RecvFail::Mismatch(g, msg) => {
                let peer = self.members.iter().position(|&m| m == g).unwrap_or(peer);
                CommError::Mismatch { op, rank, peer, msg }
            }
        }
    }
}

/// Splitmix-style mixing: the id of a sub-group, the same on all its members.
fn mix(words: &[u64]) -> u64 {
    words.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &w| {
        let mut z = (h ^ w).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.members.len()
    }

    fn backend(&self) -> &'static str {
        self.transport.backend()
    }

    fn send_buf(&self, data: Buf<'_>, dst: usize, tag: u64) -> Result<()> {
        let dtype = data.dtype();
        with_buf!(data, Buf, s, T => self.p2p_send("send", P2P_SLICE, dtype, bytemuck::cast_slice(s), dst, tag))
    }

    fn recv_buf(&self, out: BufMut<'_>, src: usize, tag: u64) -> Result<()> {
        let (dtype, len) = (out.dtype(), out.len());
        let frame = self.p2p_recv("recv", src, tag)?;
        let h = frame.hdr;
        if h.op != P2P_SLICE || h.dtype != dtype_code(dtype) || h.total != len as u64 {
            let sent = dtype_of_code(h.dtype).map_or("?".into(), |d| d.to_string());
            let kind = if h.op == P2P_BYTES {
                "raw bytes"
            } else {
                "elements"
            };
            return Err(CommError::Mismatch {
                op: "recv",
                rank: self.rank,
                peer: src,
                msg: format!(
                    "rank {src} sent {} {kind} of {sent} with tag {tag}, rank {} expects {len} {dtype}",
                    h.total, self.rank
                ),
            });
        }
        let data = frame
            .acquire()
            .ok_or_else(|| CommError::arg("recv", "message withdrawn"))?;
        with_buf!(out, BufMut, s, T => s.copy_from_slice(
            data.typed::<T>().ok_or_else(|| CommError::arg("recv", "misaligned payload"))?
        ));
        Ok(())
    }

    fn send_bytes(&self, data: &[u8], dst: usize, tag: u64) -> Result<()> {
        self.p2p_send("send_bytes", P2P_BYTES, DType::U8, data, dst, tag)
    }

    fn recv_bytes(&self, src: usize, tag: u64) -> Result<Vec<u8>> {
        let frame = self.p2p_recv("recv_bytes", src, tag)?;
        if frame.hdr.op != P2P_BYTES {
            return Err(CommError::Mismatch {
                op: "recv_bytes",
                rank: self.rank,
                peer: src,
                msg: format!(
                    "rank {src} sent {} typed elements with tag {tag}, rank {} expects raw bytes",
                    frame.hdr.total, self.rank
                ),
            });
        }
        let data = frame
            .acquire()
            .ok_or_else(|| CommError::arg("recv_bytes", "message withdrawn"))?;
        Ok(data.bytes().to_vec())
    }

    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (dtype, len) = (buf.dtype(), buf.len());
        let shm = self.transport.shm().filter(|_| self.cfg.shared_memory);
        let small = len * dtype.size_in_bytes() <= self.cfg.small_message_bytes;
        let kind = if shm.is_some() {
            OpKind::AllReduceShm
        } else if small {
            OpKind::AllReduceSmall
        } else {
            OpKind::AllReduce
        };
        self.collective(
            Call {
                name: "all_reduce",
                kind,
                dtype,
                redop: Some(op),
                total: len,
                aux: 0,
            },
            |c| {
                with_buf!(buf, BufMut, s, T => if let Some(reg) = shm {
                    shm::all_reduce(reg, c, s, op)
                } else if small {
                    ring::all_reduce_direct(c, s, op)
                } else {
                    ring::all_reduce(c, s, op)
                })
            },
        )
    }

    fn reduce_scatter_buf(&self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (dtype, len) = (input.dtype(), input.len());
        check_same_dtype("reduce_scatter", dtype, output.dtype())?;
        self.collective(
            Call {
                name: "reduce_scatter",
                kind: OpKind::ReduceScatter,
                dtype,
                redop: Some(op),
                total: len,
                aux: 0,
            },
            |c| {
                with_buf!(output, BufMut, out, T => {
                    let input = T::unbuf(input).ok_or_else(|| dtype_mismatch(c.name, dtype))?;
                    ring::reduce_scatter(c, input, out, op)
                })
            },
        )
    }

    fn all_gather_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let (dtype, len) = (input.dtype(), input.len());
        check_same_dtype("all_gather", dtype, output.dtype())?;
        self.collective(
            Call {
                name: "all_gather",
                kind: OpKind::AllGather,
                dtype,
                redop: None,
                total: len,
                aux: 0,
            },
            |c| {
                with_buf!(output, BufMut, out, T => {
                    let input = T::unbuf(input).ok_or_else(|| dtype_mismatch(c.name, dtype))?;
                    ring::all_gather(c, input, out)
                })
            },
        )
    }

    fn broadcast_buf(&self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let (dtype, len) = (buf.dtype(), buf.len());
        self.collective(
            Call {
                name: "broadcast",
                kind: OpKind::Broadcast,
                dtype,
                redop: None,
                total: len,
                aux: root as u64,
            },
            |c| with_buf!(buf, BufMut, s, T => collectives::broadcast(c, s, root)),
        )
    }

    fn reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp, root: usize) -> Result<()> {
        let (dtype, len) = (buf.dtype(), buf.len());
        self.collective(
            Call {
                name: "reduce",
                kind: OpKind::Reduce,
                dtype,
                redop: Some(op),
                total: len,
                aux: root as u64,
            },
            |c| with_buf!(buf, BufMut, s, T => collectives::reduce(c, s, op, root)),
        )
    }

    fn all_to_all_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let (dtype, len) = (input.dtype(), input.len());
        check_same_dtype("all_to_all", dtype, output.dtype())?;
        self.collective(
            Call {
                name: "all_to_all",
                kind: OpKind::AllToAll,
                dtype,
                redop: None,
                total: len,
                aux: 0,
            },
            |c| {
                with_buf!(output, BufMut, out, T => {
                    let input = T::unbuf(input).ok_or_else(|| dtype_mismatch(c.name, dtype))?;
                    collectives::all_to_all(c, input, out)
                })
            },
        )
    }

    fn barrier(&self) -> Result<()> {
        self.collective(
            Call {
                name: "barrier",
                kind: OpKind::Barrier,
                dtype: DType::U8,
                redop: None,
                total: 0,
                aux: 0,
            },
            collectives::barrier,
        )
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Box<dyn Communicator>>> {
        Ok(self
            .split_group(color, key)?
            .map(|c| Box::new(c) as Box<dyn Communicator>))
    }
}

fn check_same_dtype(op: &'static str, input: DType, output: DType) -> Result<()> {
    if input != output {
        return Err(CommError::arg(
            op,
            format!("input is {input} but output is {output}"),
        ));
    }
    Ok(())
}

fn dtype_mismatch(op: &'static str, dtype: DType) -> CommError {
    CommError::arg(op, format!("input and output dtypes differ (input {dtype})"))
}
