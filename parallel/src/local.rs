//! The `local` backend: N ranks as threads of one process. All-reduce
//! works on the ranks' buffers in place (the `shm` module); the other
//! collectives send loans of the sender's memory, so a ring step copies
//! each byte once.

use std::sync::Arc;

use crate::error::{CommError, Result};
use crate::frame::Frame;
use crate::group::{CommConfig, CpuComm, Transport};
use crate::mailbox::Mailbox;
use crate::shm::Registry;

/// Runs N ranks as threads of this process (for tests and single-machine
/// CPU data parallelism).
pub struct LocalGroup;

impl LocalGroup {
    /// Runs `f` on `n` threads, each with the communicator of its rank, and
    /// returns their results in rank order. Errors when `n` is 0 or when a
    /// rank panicked (its peers' pending calls fail as "peer gone").
    pub fn run<R: Send, F: Fn(&CpuComm) -> R + Sync>(n: usize, f: F) -> Result<Vec<R>> {
        Self::run_with(n, CommConfig::default(), f)
    }

    /// [`LocalGroup::run`] with explicit settings (timeout, segment size).
    pub fn run_with<R: Send, F: Fn(&CpuComm) -> R + Sync>(n: usize, cfg: CommConfig, f: F) -> Result<Vec<R>> {
        let comms = Self::comms(n, cfg)?;
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(k, comm)| {
                    std::thread::Builder::new()
                        .name(format!("tessera-rank-{k}"))
                        .spawn_scoped(scope, move || f(&comm))
                        .map_err(|e| CommError::io("LocalGroup::run", e))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(k, h)| {
                    h?.join().map_err(|p| CommError::Aborted {
                        op: "LocalGroup::run",
                        rank: k,
                        peer: k,
                        msg: format!("rank {k} panicked: {}", panic_text(&p)),
                    })
                })
                .collect()
        })
    }

    /// The communicators of `n` in-process ranks, for callers that drive
    /// them from their own threads. A rank counts as gone (its peers' calls
    /// fail) once its communicator and every sub-group of it are dropped.
    /// Errors when `n` is 0.
    pub fn comms(n: usize, cfg: CommConfig) -> Result<Vec<CpuComm>> {
        if n == 0 {
            return Err(CommError::arg("LocalGroup", "a group needs at least one rank"));
        }
        let world = Arc::new(World {
            boxes: (0..n).map(|_| Mailbox::default()).collect(),
            shm: Registry::default(),
        });
        Ok((0..n)
            .map(|rank| {
                let t = Arc::new(LocalTransport {
                    rank,
                    world: world.clone(),
                });
                CpuComm::world(t, rank, n, cfg.clone())
            })
            .collect())
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

struct World {
    boxes: Vec<Mailbox>,
    shm: Registry,
}

struct LocalTransport {
    rank: usize,
    world: Arc<World>,
}

impl Transport for LocalTransport {
    fn backend(&self) -> &'static str {
        "local"
    }

    fn send(&self, to: usize, frame: Frame) -> std::result::Result<(), String> {
        // Refused atomically with the receiver's shutdown: a check of a
        // "gone" flag before pushing could pass just before the receiver
        // emptied its mailbox for good, stranding a loan until the timeout.
        if self.world.boxes[to].push(self.rank, frame) {
            Ok(())
        } else {
            Err(format!("rank {to} has exited"))
        }
    }

    fn lends(&self) -> bool {
        true
    }

    fn shm(&self) -> Option<&Registry> {
        Some(&self.world.shm)
    }

    fn mailbox(&self) -> &Mailbox {
        &self.world.boxes[self.rank]
    }
}

impl Drop for LocalTransport {
    fn drop(&mut self) {
        self.world.boxes[self.rank].shut();
        let why = format!("rank {} exited (its communicator was dropped)", self.rank);
        for (k, b) in self.world.boxes.iter().enumerate() {
            if k != self.rank {
                b.end_of_stream(self.rank, &why);
            }
        }
    }
}
