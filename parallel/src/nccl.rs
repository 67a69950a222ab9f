//! The `nccl` backend (feature `cuda`): NCCL collectives through cudarc.
//!
//! cudarc's `Comm` is bound to the thread that made it, so each
//! [`NcclComm`] owns one worker thread per GPU that creates the context,
//! the stream and the NCCL communicator and runs every call; the handle
//! itself is `Send + Sync`. The NCCL unique id travels over a CPU
//! communicator (spec §7), which also carries point-to-point messages and
//! builds the sub-groups of [`Communicator::split`] (cudarc has no safe
//! `comm_split`: each group gets its own id).
//!
//! Payloads are host slices, as on the CPU backends: each call uploads,
//! runs the NCCL collective on the stream, and copies the result back.
//! cudarc panics when a CUDA library is missing, so [`NcclComm::new`]
//! first checks that libcuda and libnccl load and a GPU exists, and
//! returns [`CommError::Unavailable`] ("no NCCL/driver") otherwise.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::{group_end, group_start, Comm, Id, NcclType};

use crate::comm::{CommExt, Communicator};
use crate::element::{Buf, BufMut, CommElement, ReduceOp};
use crate::error::{CommError, Result};
use crate::with_buf;

/// A payload element NCCL carries.
trait NcclElem: CommElement + NcclType + DeviceRepr + ValidAsZeroBits {}
impl<T: CommElement + NcclType + DeviceRepr + ValidAsZeroBits> NcclElem for T {}

type Job = Box<dyn FnOnce(&Comm) + Send>;

/// A communicator running NCCL on one GPU.
pub struct NcclComm {
    cpu: Arc<dyn Communicator>,
    device: usize,
    jobs: Mutex<Sender<Job>>,
    timeout: Duration,
}

/// Checks that the CUDA driver and NCCL libraries load and that GPU
/// `device` exists; the reason otherwise.
pub fn check_available(device: usize) -> std::result::Result<(), String> {
    // SAFETY: these only try to dlopen the libraries.
    let libs = unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present() };
    if !libs {
        return Err("no NCCL/driver: libcuda or libnccl cannot be loaded".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("no NCCL/driver: {e:?}"))?;
    if device >= count.max(0) as usize {
        return Err(format!("no GPU {device}: {count} visible"));
    }
    Ok(())
}

impl NcclComm {
    /// Joins the NCCL communicator of `cpu`'s group on GPU `device` (a
    /// collective over `cpu`). Errors on every rank with
    /// [`CommError::Unavailable`] when any rank lacks the driver, NCCL or
    /// its GPU, and with the NCCL error when initialisation fails.
    pub fn new(cpu: Arc<dyn Communicator>, device: usize, timeout: Duration) -> Result<NcclComm> {
        let op = "NcclComm::new";
        let local = check_available(device);
        let mut all_ok = [i64::from(local.is_ok())];
        cpu.all_reduce_slice(&mut all_ok, ReduceOp::Min)?;
        if all_ok[0] == 0 {
            let msg = local
                .err()
                .unwrap_or_else(|| "another rank has no NCCL/driver or GPU".into());
            return Err(CommError::Unavailable { op, msg });
        }
        // The unique id: 128 bytes made on rank 0, broadcast as 16 words.
        let mut words = [0i64; 16];
        if cpu.rank() == 0 {
            let id = Id::new().map_err(|e| nccl_err(op, e))?;
            for (w, c) in words.iter_mut().zip(id.internal().chunks(8)) {
                *w = i64::from_le_bytes(std::array::from_fn(|i| c[i] as u8));
            }
        }
        cpu.broadcast_slice(&mut words, 0)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (c, b) in internal
            .iter_mut()
            .zip(words.iter().flat_map(|w| w.to_le_bytes()))
        {
            *c = b as std::ffi::c_char;
        }
        let (rank, world) = (cpu.rank(), cpu.world_size());
        let (tx, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<std::result::Result<(), String>>();
        std::thread::Builder::new()
            .name(format!("tessera-nccl-{device}"))
            .spawn(move || {
                let setup = CudaContext::new(device)
                    .map_err(|e| format!("{e:?}"))
                    .and_then(|ctx| {
                        Comm::from_rank(ctx.default_stream(), rank, world, Id::uninit(internal))
                            .map_err(|e| format!("ncclCommInitRank: {:?}", e.0))
                    });
                match setup {
                    Ok(comm) => {
                        let _ = ready_tx.send(Ok(()));
                        for job in rx {
                            job(&comm);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| CommError::io(op, e))?;
        match ready_rx.recv_timeout(timeout) {
            Ok(Ok(())) => Ok(NcclComm {
                cpu,
                device,
                jobs: Mutex::new(tx),
                timeout,
            }),
            Ok(Err(msg)) => Err(CommError::Unavailable { op, msg }),
            Err(_) => Err(CommError::Timeout {
                op,
                rank,
                peer: 0,
                timeout,
                msg: "NCCL initialisation".into(),
            }),
        }
    }

    /// Runs `f` on the GPU thread and waits (at most the timeout) for its result.
    fn call<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Comm) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| CommError::Unavailable {
                op,
                msg: "the NCCL thread has stopped".into(),
            })?;
        rx.recv_timeout(self.timeout).map_err(|_| CommError::Timeout {
            op,
            rank: self.rank(),
            peer: self.rank(),
            timeout: self.timeout,
            msg: "the NCCL call did not complete".into(),
        })?
    }
}

fn nccl_err(op: &'static str, e: cudarc::nccl::result::NcclError) -> CommError {
    CommError::Io {
        op,
        msg: format!("NCCL error {:?}", e.0),
    }
}

fn driver_err(op: &'static str, e: cudarc::driver::DriverError) -> CommError {
    CommError::Io {
        op,
        msg: format!("CUDA error {e:?}"),
    }
}

fn nccl_op(op: ReduceOp) -> cudarc::nccl::ReduceOp {
    match op {
        ReduceOp::Sum => cudarc::nccl::ReduceOp::Sum,
        ReduceOp::Prod => cudarc::nccl::ReduceOp::Prod,
        ReduceOp::Max => cudarc::nccl::ReduceOp::Max,
        ReduceOp::Min => cudarc::nccl::ReduceOp::Min,
        ReduceOp::Avg => cudarc::nccl::ReduceOp::Avg,
    }
}

/// Uploads `host`, runs `f` on the device copy (and an output of
/// `out_len`), synchronises and returns the output on the host.
fn on_device<T: NcclElem>(
    op: &'static str,
    comm: &Comm,
    host: Vec<T>,
    out_len: Option<usize>,
    f: impl FnOnce(
        &Comm,
        &mut cudarc::driver::CudaSlice<T>,
        Option<&mut cudarc::driver::CudaSlice<T>>,
    ) -> std::result::Result<(), cudarc::nccl::result::NcclError>,
) -> Result<Vec<T>> {
    let stream = comm.stream();
    let mut d = stream.clone_htod(&host).map_err(|e| driver_err(op, e))?;
    let mut out = match out_len {
        Some(n) => Some(stream.alloc_zeros::<T>(n).map_err(|e| driver_err(op, e))?),
        None => None,
    };
    f(comm, &mut d, out.as_mut()).map_err(|e| nccl_err(op, e))?;
    let v = stream
        .clone_dtoh(out.as_ref().unwrap_or(&d))
        .map_err(|e| driver_err(op, e))?;
    stream.synchronize().map_err(|e| driver_err(op, e))?;
    Ok(v)
}

fn length_check(op: &'static str, big: usize, n: usize, small: usize) -> Result<()> {
    if big != n * small {
        return Err(CommError::arg(
            op,
            format!("{big} elements are not {n} ranks × {small}"),
        ));
    }
    Ok(())
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.cpu.rank()
    }

    fn world_size(&self) -> usize {
        self.cpu.world_size()
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn send_buf(&self, data: Buf<'_>, dst: usize, tag: u64) -> Result<()> {
        self.cpu.send_buf(data, dst, tag)
    }

    fn recv_buf(&self, out: BufMut<'_>, src: usize, tag: u64) -> Result<()> {
        self.cpu.recv_buf(out, src, tag)
    }

    fn send_bytes(&self, data: &[u8], dst: usize, tag: u64) -> Result<()> {
        self.cpu.send_bytes(data, dst, tag)
    }

    fn recv_bytes(&self, src: usize, tag: u64) -> Result<Vec<u8>> {
        self.cpu.recv_bytes(src, tag)
    }

    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        with_buf!(buf, BufMut, s, T => {
            let host = s.to_vec();
            let v = self.call("all_reduce", move |c| {
                on_device::<T>("all_reduce", c, host, None, |c, d, _| c.all_reduce_in_place(d, &nccl_op(op)).map(drop))
            })?;
            s.copy_from_slice(&v);
            Ok(())
        })
    }

    fn reduce_scatter_buf(&self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let n = self.world_size();
        with_buf!(output, BufMut, out, T => {
            let input = T::unbuf(input).ok_or_else(|| CommError::arg("reduce_scatter", "input and output dtypes differ"))?;
            length_check("reduce_scatter", input.len(), n, out.len())?;
            let (host, m) = (input.to_vec(), out.len());
            let v = self.call("reduce_scatter", move |c| {
                on_device::<T>("reduce_scatter", c, host, Some(m), |c, d, o| match o {
                    Some(o) => c.reduce_scatter(d, o, &nccl_op(op)).map(drop),
                    None => Ok(()),
                })
            })?;
            out.copy_from_slice(&v);
            Ok(())
        })
    }

    fn all_gather_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let n = self.world_size();
        with_buf!(output, BufMut, out, T => {
            let input = T::unbuf(input).ok_or_else(|| CommError::arg("all_gather", "input and output dtypes differ"))?;
            length_check("all_gather", out.len(), n, input.len())?;
            let (host, m) = (input.to_vec(), out.len());
            let v = self.call("all_gather", move |c| {
                on_device::<T>("all_gather", c, host, Some(m), |c, d, o| match o {
                    Some(o) => c.all_gather(d, o).map(drop),
                    None => Ok(()),
                })
            })?;
            out.copy_from_slice(&v);
            Ok(())
        })
    }

    fn broadcast_buf(&self, buf: BufMut<'_>, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(CommError::arg(
                "broadcast",
                format!("root {root} is outside the group of {}", self.world_size()),
            ));
        }
        with_buf!(buf, BufMut, s, T => {
            let host = s.to_vec();
            let v = self.call("broadcast", move |c| {
                on_device::<T>("broadcast", c, host, None, |c, d, _| c.broadcast_in_place(d, root as i32).map(drop))
            })?;
            s.copy_from_slice(&v);
            Ok(())
        })
    }

    fn reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(CommError::arg(
                "reduce",
                format!("root {root} is outside the group of {}", self.world_size()),
            ));
        }
        let is_root = self.rank() == root;
        with_buf!(buf, BufMut, s, T => {
            let host = s.to_vec();
            let v = self.call("reduce", move |c| {
                on_device::<T>("reduce", c, host, None, |c, d, _| c.reduce_in_place(d, &nccl_op(op), root as i32).map(drop))
            })?;
            if is_root {
                s.copy_from_slice(&v);
            }
            Ok(())
        })
    }

    fn all_to_all_buf(&self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let n = self.world_size();
        with_buf!(output, BufMut, out, T => {
            let input = T::unbuf(input).ok_or_else(|| CommError::arg("all_to_all", "input and output dtypes differ"))?;
            if input.len() != out.len() || input.len() % n != 0 {
                return Err(CommError::arg("all_to_all", format!("{} and {} elements: equal, divisible by {n}", input.len(), out.len())));
            }
            let (host, m, b) = (input.to_vec(), out.len(), input.len() / n);
            let v = self.call("all_to_all", move |c| {
                on_device::<T>("all_to_all", c, host, Some(m), |c, d, o| {
                    let Some(o) = o else { return Ok(()) };
                    group_start()?;
                    for j in 0..n {
                        c.send(&d.slice(j * b..(j + 1) * b), j as i32)?;
                        c.recv(&mut o.slice_mut(j * b..(j + 1) * b), j as i32)?;
                    }
                    group_end().map(drop)
                })
            })?;
            out.copy_from_slice(&v);
            Ok(())
        })
    }

    fn barrier(&self) -> Result<()> {
        self.all_reduce_slice(&mut [0f32], ReduceOp::Sum)
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Box<dyn Communicator>>> {
        let Some(sub) = self.cpu.split(color, key)? else {
            return Ok(None);
        };
        let sub = NcclComm::new(Arc::from(sub), self.device, self.timeout)?;
        Ok(Some(Box::new(sub)))
    }
}
