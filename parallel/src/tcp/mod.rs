//! The `tcp` backend: ranks as processes on one or many hosts, a full mesh
//! of TCP connections after a rendezvous at `MASTER_ADDR:MASTER_PORT`.
//!
//! Each connection has a writer thread (sends never block the caller, so a
//! ring whose ranks all send first cannot deadlock on full socket buffers,
//! spec §1.2; it writes collective pieces straight from the caller's
//! buffer) and a reader thread that files incoming frames in the mailbox
//! (into recycled buffers). Receives wait with the communicator's timeout; a peer whose
//! connection closes fails every receive from it at once.
//!
//! Drop the communicator before the process exits: dropping flushes the
//! queued sends.
//!
//! ```no_run
//! use tessera_parallel::{tcp, CommExt, ReduceOp};
//! let comm = tcp::init_from_env()?; // under tessera-run, torchrun or srun
//! let mut grads = vec![1.0f32; 1024];
//! comm.all_reduce_slice(&mut grads, ReduceOp::Avg)?;
//! # Ok::<(), tessera_parallel::CommError>(())
//! ```

mod rendezvous;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::env::{detect, DistEnv};
use crate::error::{CommError, Result};
use crate::frame::{AlignedBuf, Frame, Header, HEADER_BYTES};
use crate::group::{CommConfig, CpuComm, Transport};
use crate::mailbox::Mailbox;

/// The environment variable that sets the timeout (seconds, may be
/// fractional) of communicators made by [`TcpConfig::from_env`].
pub const TIMEOUT_VAR: &str = "TESSERA_COMM_TIMEOUT";

/// Largest payload a frame may announce; a larger one means a corrupt stream.
const MAX_FRAME_BYTES: u64 = 1 << 40;

/// Where and how to rendezvous.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpConfig {
    /// Host of rank 0's store.
    pub master_addr: String,
    /// Port of rank 0's store.
    pub master_port: u16,
    /// This process's rank.
    pub rank: usize,
    /// Number of processes.
    pub world_size: usize,
    /// How long the rendezvous may take (every rank must arrive within it).
    pub connect_timeout: Duration,
    /// The communicator's settings (its `timeout` bounds every later wait).
    pub comm: CommConfig,
}

impl TcpConfig {
    /// The configuration of this process from [`crate::env::detect`], with
    /// the timeout from `TESSERA_COMM_TIMEOUT` (seconds) when set. Errors as
    /// `detect` does, or when the timeout is not a positive number.
    pub fn from_env() -> Result<TcpConfig> {
        let DistEnv {
            rank,
            world_size,
            master_addr,
            master_port,
            ..
        } = detect()?;
        let mut comm = CommConfig::default();
        if let Ok(v) = std::env::var(TIMEOUT_VAR) {
            comm.timeout = parse_timeout(&v)?;
        }
        Ok(TcpConfig {
            master_addr,
            master_port,
            rank,
            world_size,
            connect_timeout: comm.timeout,
            comm,
        })
    }
}

/// The value of [`TIMEOUT_VAR`]: positive seconds; values past what a
/// `Duration` holds (1e30, inf) mean "wait forever" (`Duration::MAX`).
fn parse_timeout(v: &str) -> Result<Duration> {
    let secs: f64 = v
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| !s.is_nan() && *s > 0.0)
        .ok_or_else(|| {
            CommError::rendezvous(
                "env",
                format!("{TIMEOUT_VAR}={v:?} is not a positive number of seconds"),
            )
        })?;
    Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// Joins the job described by the environment ([`TcpConfig::from_env`]).
pub fn init_from_env() -> Result<CpuComm> {
    connect(&TcpConfig::from_env()?)
}

/// Rendezvous and connect every rank to every other. Errors when the
/// master cannot be reached, when a rank does not arrive within
/// `connect_timeout` (on every rank that did), or when the ranks disagree
/// about the world size.
pub fn connect(cfg: &TcpConfig) -> Result<CpuComm> {
    crate::env::check_world("connect", cfg.rank, cfg.world_size)?;
    let master = rendezvous::resolve(&cfg.master_addr, cfg.master_port)?;
    let streams = if cfg.world_size == 1 {
        vec![None]
    } else {
        rendezvous::rendezvous(master, cfg.rank, cfg.world_size, cfg.connect_timeout)?
    };
    let t = TcpTransport::start(cfg.rank, streams, cfg.comm.timeout)?;
    Ok(CpuComm::world(
        Arc::new(t),
        cfg.rank,
        cfg.world_size,
        cfg.comm.clone(),
    ))
}

struct Peer {
    stream: TcpStream,
    tx: Mutex<Option<Sender<Frame>>>,
    dead: Arc<AtomicBool>,
    writer: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
}

struct TcpTransport {
    mailbox: Arc<Mailbox>,
    peers: Vec<Option<Peer>>,
}

impl TcpTransport {
    fn start(rank: usize, streams: Vec<Option<TcpStream>>, timeout: Duration) -> Result<TcpTransport> {
        let mailbox = Arc::new(Mailbox::default());
        let mut peers = Vec::with_capacity(streams.len());
        for (k, s) in streams.into_iter().enumerate() {
            let Some(stream) = s else {
                peers.push(None);
                continue;
            };
            let io = |e| CommError::io("tcp: start", e);
            stream.set_write_timeout(Some(timeout)).map_err(io)?;
            let (tx, rx) = channel::<Frame>();
            let dead = Arc::new(AtomicBool::new(false));
            let mut w = stream.try_clone().map_err(io)?;
            let (mb, dead_w) = (mailbox.clone(), dead.clone());
            let writer = std::thread::Builder::new()
                .name(format!("tessera-tx-{rank}-{k}"))
                .spawn(move || {
                    for frame in rx {
                        if dead_w.load(Ordering::Acquire) {
                            continue;
                        }
                        if let Err(e) = write_frame(&mut w, &frame) {
                            dead_w.store(true, Ordering::Release);
                            mb.close_peer(k, &format!("sending to rank {k} failed: {e}"));
                        }
                    }
                })
                .map_err(io)?;
            let mut r = stream.try_clone().map_err(io)?;
            let mb = mailbox.clone();
            let reader = std::thread::Builder::new()
                .name(format!("tessera-rx-{rank}-{k}"))
                .spawn(move || {
                    let why = loop {
                        match read_frame(&mut r) {
                            // Refused only after the transport's drop, which
                            // joins this thread after closing the stream.
                            Ok(f) => {
                                mb.push(k, f);
                            }
                            Err(e) => break e,
                        }
                    };
                    mb.end_of_stream(k, &format!("connection to rank {k} closed: {why}"));
                })
                .map_err(io)?;
            peers.push(Some(Peer {
                stream,
                tx: Mutex::new(Some(tx)),
                dead,
                writer: Some(writer),
                reader: Some(reader),
            }));
        }
        Ok(TcpTransport { mailbox, peers })
    }
}

/// Writes one frame. A loan its sender withdrew (it failed meanwhile) is
/// skipped: the sender's abort notice follows it in the queue.
fn write_frame(w: &mut TcpStream, frame: &Frame) -> std::io::Result<()> {
    let Some(data) = frame.acquire() else {
        return Ok(());
    };
    w.write_all(&frame.hdr.encode())?;
    w.write_all(data.bytes())
}

fn read_frame(r: &mut TcpStream) -> std::result::Result<Frame, String> {
    let mut hb = [0u8; HEADER_BYTES];
    r.read_exact(&mut hb).map_err(|e| e.to_string())?;
    let hdr = Header::decode(&hb).ok_or("corrupt message header")?;
    if hdr.len > MAX_FRAME_BYTES {
        return Err(format!("message header announces {} bytes", hdr.len));
    }
    let mut buf = AlignedBuf::scratch(hdr.len as usize);
    r.read_exact(buf.as_bytes_mut()).map_err(|e| e.to_string())?;
    Ok(Frame::owned(hdr, buf))
}

impl Transport for TcpTransport {
    fn backend(&self) -> &'static str {
        "tcp"
    }

    fn send(&self, to: usize, frame: Frame) -> std::result::Result<(), String> {
        let peer = self
            .peers
            .get(to)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("no connection to rank {to}"))?;
        if peer.dead.load(Ordering::Acquire) {
            return Err(format!("the connection to rank {to} failed"));
        }
        let tx = peer.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.as_ref()
            .ok_or_else(|| "the transport is shutting down".to_string())?
            .send(frame)
            .map_err(|_| format!("the sender to rank {to} stopped"))
    }

    fn lends(&self) -> bool {
        // The writer thread sends straight from the loaned memory.
        true
    }

    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // Flush: closing the queues lets each writer drain and stop (bounded
        // by the write timeout), then the sockets close and the readers end.
        for p in self.peers.iter().flatten() {
            p.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        for p in self.peers.iter_mut().flatten() {
            if let Some(w) = p.writer.take() {
                let _ = w.join();
            }
            let _ = p.stream.shutdown(Shutdown::Both);
        }
        for p in self.peers.iter_mut().flatten() {
            if let Some(r) = p.reader.take() {
                let _ = r.join();
            }
        }
        self.mailbox.shut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_too_large_for_a_duration_saturate() {
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(
            parse_timeout("1e19").unwrap(),
            Duration::from_secs(10_000_000_000_000_000_000)
        );
        for huge in ["1e30", "inf"] {
            assert_eq!(parse_timeout(huge).unwrap(), Duration::MAX, "{huge}");
        }
        // Deadlines from such timeouts saturate instead of panicking.
        for t in ["1e19", "1e30"] {
            assert!(crate::group::deadline_after(parse_timeout(t).unwrap()) > std::time::Instant::now());
        }
        for bad in ["0", "-1", "nan", "soon", ""] {
            let e = parse_timeout(bad).unwrap_err().to_string();
            assert!(e.contains(TIMEOUT_VAR), "{bad}: {e}");
        }
    }
}
