//! The error type every communicator call returns.

use std::time::Duration;

/// An error from a communicator. Every variant names the operation (`op`:
/// the collective or point-to-point call) and the ranks involved, and the
/// message carries the sizes, so that a failure on one rank of many still
/// says what went wrong where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The ranks disagree about the call: a different collective, dtype,
    /// length or root, or a point-to-point pair whose counts differ.
    #[error("{op}: rank {rank} and rank {peer} disagree: {msg}")]
    Mismatch {
        /// The operation that failed.
        op: &'static str,
        /// The rank (in the group) that detected the mismatch.
        rank: usize,
        /// The peer whose message did not match.
        peer: usize,
        /// What differed, with both values.
        msg: String,
    },
    /// A wait (connect, receive, send completion) ran past the timeout.
    #[error("{op}: rank {rank} timed out after {timeout:?} waiting for rank {peer}: {msg}")]
    Timeout {
        /// The operation that failed.
        op: &'static str,
        /// The rank that waited.
        rank: usize,
        /// The peer it waited for.
        peer: usize,
        /// The configured timeout.
        timeout: Duration,
        /// What was awaited, with its size.
        msg: String,
    },
    /// A peer closed its connection (exited or dropped its communicator).
    #[error("{op}: rank {rank}: peer rank {peer} is gone: {msg}")]
    PeerClosed {
        /// The operation that failed.
        op: &'static str,
        /// The rank that noticed.
        rank: usize,
        /// The peer that is gone.
        peer: usize,
        /// How it was noticed.
        msg: String,
    },
    /// Another rank of the group failed and aborted the group, or this
    /// communicator failed earlier and is no longer usable.
    #[error("{op}: rank {rank}: group aborted by rank {peer}: {msg}")]
    Aborted {
        /// The operation that failed.
        op: &'static str,
        /// The rank that noticed.
        rank: usize,
        /// The rank whose failure aborted the group.
        peer: usize,
        /// The original failure.
        msg: String,
    },
    /// An argument outside its domain: a rank outside the group, a length
    /// that does not divide, a dtype no collective carries.
    #[error("{op}: invalid argument: {msg}")]
    Arg {
        /// The operation that failed.
        op: &'static str,
        /// The argument and why it is invalid.
        msg: String,
    },
    /// Setting up the group failed: bad environment, rendezvous timeout,
    /// ranks that did not arrive.
    #[error("{op}: rendezvous failed: {msg}")]
    Rendezvous {
        /// The step that failed.
        op: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// The backend is not available here (no NCCL library, no driver, no GPU).
    #[error("{op}: backend unavailable: {msg}")]
    Unavailable {
        /// The operation that failed.
        op: &'static str,
        /// Why the backend cannot run.
        msg: String,
    },
    /// An operating-system I/O error (sockets, processes).
    #[error("{op}: io error: {msg}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The underlying error.
        msg: String,
    },
    /// A tensor operation failed (building or reading a payload tensor).
    #[error(transparent)]
    Tensor(#[from] tessera_tensor::Error),
    /// An instruction of a pipeline schedule failed on a stage: a layer's
    /// forward or backward (a shape mismatch between stages shows here), or
    /// the transfer of an activation or a gradient (a dead peer).
    #[error("pipeline stage {stage}: {instr}: {source}")]
    Pipeline {
        /// The pipeline stage (rank in the pipeline group) that failed.
        stage: usize,
        /// The instruction, with its micro-batch and model chunk.
        instr: String,
        /// The underlying failure.
        source: Box<CommError>,
    },
}

/// `Result` with [`CommError`].
pub type Result<T> = std::result::Result<T, CommError>;

impl CommError {
    /// A [`CommError::Arg`] for `op`.
    pub fn arg(op: &'static str, msg: impl Into<String>) -> Self {
        CommError::Arg { op, msg: msg.into() }
    }

    /// A [`CommError::Io`] for `op` from an OS error.
    pub fn io(op: &'static str, err: impl std::fmt::Display) -> Self {
        CommError::Io {
            op,
            msg: err.to_string(),
        }
    }

    /// A [`CommError::Rendezvous`] for `op`.
    pub fn rendezvous(op: &'static str, msg: impl Into<String>) -> Self {
        CommError::Rendezvous { op, msg: msg.into() }
    }

    /// True for failures of the group itself (timeout, closed peer, abort,
    /// mismatch, I/O), as opposed to invalid arguments and setup errors.
    pub fn is_fatal(&self) -> bool {
        if let CommError::Pipeline { source, .. } = self {
            return source.is_fatal();
        }
        matches!(
            self,
            CommError::Mismatch { .. }
                | CommError::Timeout { .. }
                | CommError::PeerClosed { .. }
                | CommError::Aborted { .. }
                | CommError::Io { .. }
        )
    }

    /// The same error reported under another operation name (a collective
    /// built from another one names itself, not its building block).
    pub(crate) fn in_op(mut self, name: &'static str) -> Self {
        match &mut self {
            CommError::Mismatch { op, .. }
            | CommError::Timeout { op, .. }
            | CommError::PeerClosed { op, .. }
            | CommError::Aborted { op, .. }
            | CommError::Arg { op, .. }
            | CommError::Rendezvous { op, .. }
            | CommError::Unavailable { op, .. }
            | CommError::Io { op, .. } => *op = name,
            CommError::Tensor(_) => {}
            CommError::Pipeline { source, .. } => {
                let inner = std::mem::replace(source.as_mut(), CommError::arg("", ""));
                **source = inner.in_op(name);
            }
        }
        self
    }
}
