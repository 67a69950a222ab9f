//! [`TrafficMeter`]: a communicator that counts the bytes this rank sends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::comm::Communicator;
use crate::element::{Buf, BufMut, ReduceOp};
use crate::error::Result;
use crate::ring::ring_chunk;

/// Wraps a communicator and counts the payload bytes this rank puts on the
/// wire, call by call, under the ring algorithms of spec §1.2: an
/// all-reduce of `S` elements sends every ring chunk but one in the
/// reduce-scatter phase and again in the all-gather phase
/// (`2(n−1)/n · S` when `n` divides `S`), a reduce-scatter or all-gather
/// sends `(n−1)` blocks, an all-to-all `(n−1)/n · S`, a broadcast `S` from
/// its root, a point-to-point send its payload. The count is at the
/// communicator's interface (what the ring moves), the same on every
/// backend; sub-groups made by `split` add to the same counter.
#[derive(Clone)]
pub struct TrafficMeter {
    inner: Arc<dyn Communicator>,
    sent: Arc<AtomicU64>,
    collectives: Arc<AtomicU64>,
}

impl TrafficMeter {
    /// Wraps `inner` with counters at zero.
    pub fn new(inner: Arc<dyn Communicator>) -> Self {
        TrafficMeter {
            inner,
            sent: Arc::new(AtomicU64::new(0)),
            collectives: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes this rank has sent since the last [`TrafficMeter::reset`].
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Collective calls (not point-to-point) issued since the last reset.
    pub fn collectives(&self) -> u64 {
        self.collectives.load(Ordering::Relaxed)
    }

    /// Sets the counters to zero.
    pub fn reset(&self) {
        self.sent.store(0, Ordering::Relaxed);
        self.collectives.store(0, Ordering::Relaxed);
    }

    fn count(&self, elems: usize, elem_bytes: usize, collective: bool) {
        self.sent
            .fetch_add((elems * elem_bytes) as u64, Ordering::Relaxed);
        if collective {
            self.collectives.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn elem_size(b: &Buf<'_>) -> usize {
    b.dtype().size_in_bytes()
}

impl Communicator for TrafficMeter {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn send_buf(&self, data: Buf<'_>, dst: usize, tag: u64) -> Result<()> {
        self.count(data.len(), elem_size(&data), false);
        self.inner.send_buf(data, dst, tag)
    }
    fn recv_buf(&self, out: BufMut<'_>, src: usize, tag: u64) -> Result<()> {
        self.inner.recv_buf(out, src, tag)
    }
    fn send_bytes(&self, data: &[u8], dst: usize, tag: u64) -> Result<()> {
        self.count(data.len(), 1, false);
        self.inner.send_bytes(data, dst, tag)
    }
    fn recv_bytes(&self, src: usize, tag: u64) -> Result<Vec<u8>> {
        self.inner.recv_bytes(src, tag)
    }
    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (n, r, s) = (self.world_size(), self.rank(), buf.len());
        let elems = match n {
            1 => 0,
            _ => 2 * s - ring_chunk(s, n, (r + 1) % n).len() - ring_chunk(s, n, (r + 2) % n).len(),
        };
        self.count(elems, buf.dtype().size_in_bytes(), true);
        self.inner.all_reduce_buf(buf, op)
    }
    fn reduce_scatter_buf(&self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.count((self.world_size() - 1) * output.len(), elem_size(&input), true);
        self.inner.reduce_scatter_buf(input, output, op)
    }
    fn all_gather_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        self.count((self.world_size() - 1) * input.len(), elem_size(&input), true);
        self.inner.all_gather_buf(input, output)
    }
    fn broadcast_buf(&self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let elems = if self.rank() == root && self.world_size() > 1 {
            buf.len()
        } else {
            0
        };
        self.count(elems, buf.dtype().size_in_bytes(), true);
        self.inner.broadcast_buf(buf, root)
    }
    fn reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp, root: usize) -> Result<()> {
        let elems = if self.rank() == root { 0 } else { buf.len() };
        self.count(elems, buf.dtype().size_in_bytes(), true);
        self.inner.reduce_buf(buf, op, root)
    }
    fn all_to_all_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let n = self.world_size();
        self.count(input.len() / n * (n - 1), elem_size(&input), true);
        self.inner.all_to_all_buf(input, output)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Box<dyn Communicator>>> {
        Ok(self.inner.split(color, key)?.map(|c| {
            Box::new(TrafficMeter {
                inner: Arc::from(c),
                sent: self.sent.clone(),
                collectives: self.collectives.clone(),
            }) as Box<dyn Communicator>
        }))
    }
}
